//! The pShift instance file (docs/pshift.md, "Instance files"): servers with capacities and buckets with a
//! reservation, an optional limit and a demand per server, as JSON. `rein pshift solve` reads it and
//! `rein pshift gen` writes it; one decoder and one encoder serve both, and the fuzz target
//! `pshift_instance` (`rein_sim::harness::pshift_instance`) checks that they agree.
//!
//! # Model
//! The JSON is read into plain records ([`RawServer`], [`RawBucket`]) with every number as `f64`, so that
//! the core ([`Instance::from_raw`]) names a negative, fractional or oversized value in its error instead
//! of serde reporting a type mismatch; the core does all validation (unique names, whole numbers within
//! `MAX_TOKENS`, demands only on named servers, the counts' bounds).
//!
//! # Invariants
//! 1. A demand object keeps its entries in file order, duplicates included, so a server named twice in
//!    one bucket is refused by the core rather than overwritten (serde's maps keep the last value).
//! 2. Unknown keys are refused (`deny_unknown_fields`): a misspelt `limit` is an error, not an unlimited
//!    bucket.
//! 3. [`to_json`] writes what [`parse`] reads back to an equal [`Instance`]: the numbers are whole
//!    numbers of at most `MAX_TOKENS` (1e12), exact in JSON and in `f64`.
//!
//! The caller bounds the text's size ([`MAX_INSTANCE_BYTES`], read with [`crate::input`]).

use rein_core::pshift::{Instance, InstanceError, RawBucket, RawServer};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// Largest instance file read (a 1,000,000-bucket instance on 8 servers each is about 150 MB).
pub const MAX_INSTANCE_BYTES: u64 = 256 << 20;

/// Why an instance text was refused.
#[derive(Debug, thiserror::Error)]
pub enum InstanceFileError {
    /// Not JSON of the instance format (a syntax error, a missing or unknown key, a wrong type).
    #[error("not a valid instance file: {0}")]
    Json(#[from] serde_json::Error),
    /// The core's validation refused it.
    #[error(transparent)]
    Invalid(#[from] InstanceError),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceFile {
    servers: Vec<ServerFile>,
    buckets: Vec<BucketFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    name: String,
    capacity: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketFile {
    name: String,
    reservation: f64,
    #[serde(default)]
    limit: Option<f64>,
    #[serde(default)]
    demand: DemandMap,
}

/// `{"s0": 150, "s1": 50}` kept in file order with duplicates (invariant 1).
#[derive(Debug, Default)]
struct DemandMap(Vec<(String, f64)>);

impl<'de> Deserialize<'de> for DemandMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DemandMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object mapping server names to demands")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<DemandMap, A::Error> {
                let mut v = Vec::new();
                while let Some((k, x)) = m.next_entry::<String, f64>()? {
                    v.push((k, x));
                }
                Ok(DemandMap(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// Parses and validates an instance file's text.
pub fn parse(text: &str) -> Result<Instance, InstanceFileError> {
    let f: InstanceFile = serde_json::from_str(text)?;
    let servers: Vec<RawServer> =
        f.servers.into_iter().map(|s| RawServer { name: s.name, capacity: s.capacity }).collect();
    let buckets: Vec<RawBucket> = f
        .buckets
        .into_iter()
        .map(|b| RawBucket { name: b.name, reservation: b.reservation, limit: b.limit, demand: b.demand.0 })
        .collect();
    Ok(Instance::from_raw(&servers, &buckets)?)
}

/// What [`to_json`] writes: the same format with whole numbers.
#[derive(Debug, Serialize)]
struct InstanceOut {
    servers: Vec<ServerOut>,
    buckets: Vec<BucketOut>,
}

#[derive(Debug, Serialize)]
struct ServerOut {
    name: String,
    capacity: u64,
}

#[derive(Debug, Serialize)]
struct BucketOut {
    name: String,
    reservation: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u64>,
    demand: serde_json::Map<String, serde_json::Value>,
}

/// The instance as an instance file (one line of JSON and a newline).
pub fn to_json(inst: &Instance) -> String {
    let f = InstanceOut {
        servers: (0..inst.servers())
            .map(|j| ServerOut { name: inst.server_name(j), capacity: inst.capacity(j) })
            .collect(),
        buckets: (0..inst.buckets())
            .map(|i| BucketOut {
                name: inst.bucket_name(i),
                reservation: inst.reservation(i),
                limit: inst.limit(i),
                demand: inst
                    .bucket_entries(i)
                    .map(|e| (inst.server_name(inst.entry_server(e)), inst.entry_demand(e).into()))
                    .collect(),
            })
            .collect(),
    };
    serde_json::to_string(&f).expect("an instance serialises (strings and integers only)") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"{"servers": [{"name": "s0", "capacity": 100}, {"name": "s1", "capacity": 50}],
        "buckets": [{"name": "b0", "reservation": 30, "limit": 60, "demand": {"s0": 40, "s1": 10}},
                    {"name": "b1", "reservation": 0, "demand": {"s1": 5}}]}"#;

    #[test]
    fn an_instance_reads_and_writes_back_the_same() {
        let inst = parse(TWO).unwrap();
        assert_eq!((inst.servers(), inst.buckets(), inst.entries()), (2, 2, 3));
        assert_eq!((inst.reservation(0), inst.limit(0), inst.limit(1)), (30, Some(60), None));
        let json = to_json(&inst);
        assert_eq!(parse(&json).unwrap(), inst);
        assert_eq!(to_json(&parse(&json).unwrap()), json);
    }

    /// Invariants 1 and 2: a server named twice in one demand and an unknown key are refused, named.
    #[test]
    fn a_repeated_demand_and_an_unknown_key_are_refused() {
        let twice = TWO.replace(r#""s1": 10"#, r#""s0": 10"#);
        let e = parse(&twice).unwrap_err().to_string();
        assert!(e.contains("s0"), "{e}");
        let misspelt = TWO.replace(r#""limit": 60"#, r#""limt": 60"#);
        let e = parse(&misspelt).unwrap_err().to_string();
        assert!(e.starts_with("not a valid instance file: unknown field `limt`"), "{e}");
        let e = parse(&TWO.replace("30", "-3")).unwrap_err().to_string();
        assert!(e.contains("-3"), "{e}");
    }
}
