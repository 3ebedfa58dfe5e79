//! A token allocation instance (pshift.txt §III-A): servers with a capacity C^j, buckets with a
//! reservation R_i, an optional limit L_i and a sparse demand d_i^j, all in whole tokens (IOs per QoS
//! period or per what is left of it).
//!
//! Two ways in: [`InstanceBuilder`] (integers and indices; what the controller and benchmarks use) and
//! [`Instance::from_raw`] (names and `f64`s as read from a file; every value is checked to be a finite,
//! non-negative whole number within bounds, with an error naming the bucket or server and the field).
//!
//! # Layout
//! Demand is sparse: a bucket is active on few servers. Entries (bucket, server, demand) with demand > 0
//! are stored bucket by bucket in CSR form (`bucket_start[i]..bucket_start[i + 1]`), each bucket's
//! entries sorted by server. Allocations ([`super::Allocation`]) are vectors aligned with these entries.
//!
//! # Bounds (each has a test at the bound)
//! [`MAX_SERVERS`], [`MAX_BUCKETS`], [`MAX_ENTRIES`], [`MAX_TOKENS`] per number, [`MAX_NAME_LEN`]. With
//! them every sum the solver forms fits in a `u64`: a server's load is at most `MAX_ENTRIES * MAX_TOKENS`
//! = 8.4e18 < 1.8e19, and `A_i * d_i^j` is formed in `u128`.

use std::collections::BTreeMap;

/// Most servers in one instance (the token movement sums are a |S| x |S| matrix: 8 MiB at the bound).
pub const MAX_SERVERS: usize = 1024;
/// Most buckets in one instance.
pub const MAX_BUCKETS: usize = 1_000_000;
/// Most (bucket, server) demand entries with demand > 0 in one instance.
pub const MAX_ENTRIES: usize = 1 << 23;
/// Largest capacity, reservation, limit or demand (tokens).
pub const MAX_TOKENS: u64 = 1_000_000_000_000;
/// Longest server or bucket name (bytes).
pub const MAX_NAME_LEN: usize = 256;

/// Why an instance was refused. Messages name the bucket or server and the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InstanceError {
    /// An instance needs at least one server.
    #[error("the instance has no servers")]
    NoServers,
    /// A file's instance needs at least one bucket ([`InstanceBuilder`] allows none).
    #[error("the instance has no buckets")]
    NoBuckets,
    /// More than [`MAX_SERVERS`] servers.
    #[error("too many servers: {count} (at most {max})")]
    TooManyServers {
        /// Servers given (or the count the refused one would have made).
        count: usize,
        /// [`MAX_SERVERS`].
        max: usize,
    },
    /// More than [`MAX_BUCKETS`] buckets.
    #[error("too many buckets: {count} (at most {max})")]
    TooManyBuckets {
        /// Buckets given (or the count the refused one would have made).
        count: usize,
        /// [`MAX_BUCKETS`].
        max: usize,
    },
    /// More than [`MAX_ENTRIES`] (bucket, server) pairs with demand.
    #[error("too many demand entries: more than {max} (bucket, server) pairs with demand")]
    TooManyEntries {
        /// [`MAX_ENTRIES`].
        max: usize,
    },
    /// A number read from a file is not a whole number of tokens in `[0, MAX_TOKENS]` (negative,
    /// fractional, NaN, infinite or too large).
    #[error("{what}: {field} must be a whole number of tokens between 0 and {max}, got {}", crate::Num(*.value))]
    BadNumber {
        /// The server or bucket (and server) it belongs to, as named in the message.
        what: String,
        /// Which number: `"capacity"`, `"reservation"`, `"limit"` or `"demand"`.
        field: &'static str,
        /// The number given.
        value: f64,
        /// [`MAX_TOKENS`].
        max: u64,
    },
    /// A number given to [`InstanceBuilder`] is above [`MAX_TOKENS`].
    #[error("{what}: {field} is {value}, above the bound of {max} tokens")]
    TooLarge {
        /// The server or bucket (and server) it belongs to, as named in the message.
        what: String,
        /// Which number: `"capacity"`, `"reservation"`, `"limit"` or `"demand"`.
        field: &'static str,
        /// The number given, tokens.
        value: u64,
        /// [`MAX_TOKENS`].
        max: u64,
    },
    /// A name that is empty or only whitespace; or names given for some servers (buckets) but not all.
    #[error("a {what} has an empty name")]
    EmptyName {
        /// `"server"` or `"bucket"`.
        what: &'static str,
    },
    /// A name longer than [`MAX_NAME_LEN`] bytes.
    #[error("{what} name {name:?} is longer than {max} bytes")]
    NameTooLong {
        /// `"server"` or `"bucket"`.
        what: &'static str,
        /// The name's first 40 characters and "...".
        name: String,
        /// [`MAX_NAME_LEN`].
        max: usize,
    },
    /// Two servers, or two buckets, with the same name.
    #[error("two {what}s are named {name:?}")]
    DuplicateName {
        /// `"server"` or `"bucket"`.
        what: &'static str,
        /// The name used twice.
        name: String,
    },
    /// A bucket's demand names a server the instance does not have.
    #[error("bucket {bucket:?}: demand names unknown server {server:?}")]
    UnknownServer {
        /// The bucket's name.
        bucket: String,
        /// The unknown server name.
        server: String,
    },
    /// A bucket's demand names one server twice.
    #[error("bucket {bucket:?}: demand names server {server:?} twice")]
    DuplicateDemand {
        /// The bucket's name (or `bucket <index>`).
        bucket: String,
        /// The server's name (or index).
        server: String,
    },
    /// A bucket whose limit is below its reservation.
    #[error("bucket {bucket:?}: limit {limit} is below the reservation {reservation}")]
    LimitBelowReservation {
        /// The bucket's name (or `bucket <index>`).
        bucket: String,
        /// R_i, tokens.
        reservation: u64,
        /// L_i, tokens.
        limit: u64,
    },
    /// A bucket's demand given to [`InstanceBuilder`] names a server index not added yet.
    #[error("bucket {bucket:?}: server index {server} out of range (there are {servers} servers)")]
    ServerIndex {
        /// The bucket's name (or `bucket <index>`).
        bucket: String,
        /// The server index given.
        server: usize,
        /// Servers added so far.
        servers: usize,
    },
}

/// A server as read from a file: a name and a capacity that must be a whole number.
#[derive(Debug, Clone, PartialEq)]
pub struct RawServer {
    /// Unique, non-empty, at most [`MAX_NAME_LEN`] bytes.
    pub name: String,
    /// C^j: a whole number of tokens in `[0, MAX_TOKENS]`.
    pub capacity: f64,
}

/// A bucket as read from a file. `demand` lists (server name, demand) in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct RawBucket {
    /// Unique, non-empty, at most [`MAX_NAME_LEN`] bytes.
    pub name: String,
    /// R_i: a whole number of tokens in `[0, MAX_TOKENS]`.
    pub reservation: f64,
    /// L_i: a whole number of tokens, at least the reservation; `None` for unlimited.
    pub limit: Option<f64>,
    /// d_i^j per server name, whole numbers of tokens; each server at most once, zeros dropped.
    pub demand: Vec<(String, f64)>,
}

/// A validated instance. Immutable; build with [`InstanceBuilder`] or [`Instance::from_raw`].
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub(crate) capacity: Vec<u64>,
    pub(crate) reservation: Vec<u64>,
    pub(crate) limit: Vec<Option<u64>>,
    /// CSR: bucket i's entries are `bucket_start[i]..bucket_start[i + 1]`.
    pub(crate) bucket_start: Vec<usize>,
    pub(crate) entry_server: Vec<u32>,
    pub(crate) entry_demand: Vec<u64>,
    /// Names, when the instance has them (files do; the controller's per-interval instances do not).
    pub(crate) server_names: Vec<String>,
    pub(crate) bucket_names: Vec<String>,
}

impl Instance {
    /// |S|: the number of servers; server indices are `0..servers()`.
    pub fn servers(&self) -> usize {
        self.capacity.len()
    }
    /// |B|: the number of buckets; bucket indices are `0..buckets()`.
    pub fn buckets(&self) -> usize {
        self.reservation.len()
    }
    /// Number of (bucket, server) entries with demand > 0.
    pub fn entries(&self) -> usize {
        self.entry_server.len()
    }
    /// C^j: the tokens server `server` can consume.
    pub fn capacity(&self, server: usize) -> u64 {
        self.capacity[server]
    }
    /// R_i: bucket `bucket`'s reservation, tokens.
    pub fn reservation(&self, bucket: usize) -> u64 {
        self.reservation[bucket]
    }
    /// L_i: bucket `bucket`'s limit, tokens (at least R_i); `None` for unlimited.
    pub fn limit(&self, bucket: usize) -> Option<u64> {
        self.limit[bucket]
    }
    /// The entry indices of a bucket (aligned with [`super::Allocation`]'s vectors).
    pub fn bucket_entries(&self, bucket: usize) -> std::ops::Range<usize> {
        self.bucket_start[bucket]..self.bucket_start[bucket + 1]
    }
    /// The server of an entry.
    pub fn entry_server(&self, entry: usize) -> usize {
        self.entry_server[entry] as usize
    }
    /// The demand d_i^j of an entry.
    pub fn entry_demand(&self, entry: usize) -> u64 {
        self.entry_demand[entry]
    }
    /// d_i^j (0 where the bucket has no demand on the server).
    pub fn demand(&self, bucket: usize, server: usize) -> u64 {
        self.find_entry(bucket, server).map_or(0, |e| self.entry_demand[e])
    }
    /// The entry of (bucket, server), if the bucket has demand there.
    pub fn find_entry(&self, bucket: usize, server: usize) -> Option<usize> {
        let r = self.bucket_entries(bucket);
        let base = r.start;
        self.entry_server[r].binary_search(&(server as u32)).ok().map(|k| base + k)
    }
    /// D_i: the bucket's total demand.
    pub fn total_demand(&self, bucket: usize) -> u64 {
        self.entry_demand[self.bucket_entries(bucket)].iter().sum()
    }
    /// Server name, or `s<index>` for an unnamed instance.
    pub fn server_name(&self, server: usize) -> String {
        self.server_names.get(server).cloned().unwrap_or_else(|| format!("s{server}"))
    }
    /// Bucket name, or `b<index>` for an unnamed instance.
    pub fn bucket_name(&self, bucket: usize) -> String {
        self.bucket_names.get(bucket).cloned().unwrap_or_else(|| format!("b{bucket}"))
    }
    /// The index of the server named `name` (`None` for an unknown name or an unnamed instance).
    pub fn server_index(&self, name: &str) -> Option<usize> {
        self.server_names.iter().position(|n| n == name)
    }
    /// The index of the bucket named `name` (`None` for an unknown name or an unnamed instance).
    pub fn bucket_index(&self, name: &str) -> Option<usize> {
        self.bucket_names.iter().position(|n| n == name)
    }

    /// Validates an instance read from a file: names unique and non-empty, numbers finite, non-negative,
    /// whole and within bounds, demand naming known servers once each, limit >= reservation, at least one
    /// server and one bucket. Demand entries of 0 are dropped (the bucket is not active there).
    pub fn from_raw(servers: &[RawServer], buckets: &[RawBucket]) -> Result<Instance, InstanceError> {
        if servers.is_empty() {
            return Err(InstanceError::NoServers);
        }
        if buckets.is_empty() {
            return Err(InstanceError::NoBuckets);
        }
        if servers.len() > MAX_SERVERS {
            return Err(InstanceError::TooManyServers { count: servers.len(), max: MAX_SERVERS });
        }
        if buckets.len() > MAX_BUCKETS {
            return Err(InstanceError::TooManyBuckets { count: buckets.len(), max: MAX_BUCKETS });
        }
        let mut b = InstanceBuilder::new();
        let mut index = BTreeMap::new();
        for s in servers {
            check_name("server", &s.name)?;
            let cap = whole(&format!("server {:?}", s.name), "capacity", s.capacity)?;
            if index.insert(s.name.as_str(), index.len()).is_some() {
                return Err(InstanceError::DuplicateName { what: "server", name: s.name.clone() });
            }
            b.add_named_server(s.name.clone(), cap)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut demand = Vec::new();
        for k in buckets {
            check_name("bucket", &k.name)?;
            if !seen.insert(k.name.as_str()) {
                return Err(InstanceError::DuplicateName { what: "bucket", name: k.name.clone() });
            }
            let what = format!("bucket {:?}", k.name);
            let r = whole(&what, "reservation", k.reservation)?;
            let l = k.limit.map(|l| whole(&what, "limit", l)).transpose()?;
            demand.clear();
            for (srv, d) in &k.demand {
                let j = *index
                    .get(srv.as_str())
                    .ok_or_else(|| InstanceError::UnknownServer { bucket: k.name.clone(), server: srv.clone() })?;
                let d = whole(&format!("bucket {:?} on server {:?}", k.name, srv), "demand", *d)?;
                if demand.iter().any(|&(x, _)| x == j) {
                    return Err(InstanceError::DuplicateDemand { bucket: k.name.clone(), server: srv.clone() });
                }
                demand.push((j, d));
            }
            b.add_named_bucket(k.name.clone(), r, l, &demand)?;
        }
        b.build()
    }
}

fn check_name(what: &'static str, name: &str) -> Result<(), InstanceError> {
    if name.trim().is_empty() {
        return Err(InstanceError::EmptyName { what });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(InstanceError::NameTooLong {
            what,
            name: name.chars().take(40).collect::<String>() + "...",
            max: MAX_NAME_LEN,
        });
    }
    Ok(())
}

/// A file's number as whole tokens: finite, >= 0, integral, <= MAX_TOKENS.
fn whole(what: &str, field: &'static str, v: f64) -> Result<u64, InstanceError> {
    if !(v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= MAX_TOKENS as f64) {
        return Err(InstanceError::BadNumber { what: what.to_string(), field, value: v, max: MAX_TOKENS });
    }
    Ok(v as u64)
}

/// Builds an [`Instance`] from integers. Errors are those of [`InstanceError`]; nothing panics on input.
#[derive(Debug, Clone)]
pub struct InstanceBuilder {
    inst: InstanceParts,
    scratch: Vec<(u32, u64)>,
}

#[derive(Debug, Default, Clone)]
struct InstanceParts {
    capacity: Vec<u64>,
    reservation: Vec<u64>,
    limit: Vec<Option<u64>>,
    bucket_start: Vec<usize>,
    entry_server: Vec<u32>,
    entry_demand: Vec<u64>,
    server_names: Vec<String>,
    bucket_names: Vec<String>,
}

/// The same as [`InstanceBuilder::new`] (the bucket index starts at 0: a derived default would not).
impl Default for InstanceBuilder {
    fn default() -> Self {
        InstanceBuilder::new()
    }
}

impl InstanceBuilder {
    /// A builder without servers or buckets.
    pub fn new() -> Self {
        let inst = InstanceParts { bucket_start: vec![0], ..InstanceParts::default() };
        InstanceBuilder { inst, scratch: Vec::new() }
    }

    /// Adds an unnamed server; returns its index.
    pub fn add_server(&mut self, capacity: u64) -> Result<usize, InstanceError> {
        let j = self.inst.capacity.len();
        if j >= MAX_SERVERS {
            return Err(InstanceError::TooManyServers { count: j + 1, max: MAX_SERVERS });
        }
        if capacity > MAX_TOKENS {
            return Err(InstanceError::TooLarge {
                what: format!("server {j}"),
                field: "capacity",
                value: capacity,
                max: MAX_TOKENS,
            });
        }
        self.inst.capacity.push(capacity);
        Ok(j)
    }

    /// Adds a named server (names are all or nothing, unique: checked by [`InstanceBuilder::build`]).
    pub fn add_named_server(&mut self, name: impl Into<String>, capacity: u64) -> Result<usize, InstanceError> {
        let name = name.into();
        check_name("server", &name)?;
        let j = self.add_server(capacity)?;
        self.inst.server_names.push(name);
        Ok(j)
    }

    /// Adds an unnamed bucket with demand `(server index, tokens)`; zero demands are dropped. Returns its
    /// index.
    pub fn add_bucket(
        &mut self,
        reservation: u64,
        limit: Option<u64>,
        demand: &[(usize, u64)],
    ) -> Result<usize, InstanceError> {
        let i = self.inst.reservation.len();
        let what = || format!("bucket {i}");
        self.push_bucket(what, reservation, limit, demand)
    }

    /// Adds a named bucket (see [`InstanceBuilder::add_named_server`] for names).
    pub fn add_named_bucket(
        &mut self,
        name: impl Into<String>,
        reservation: u64,
        limit: Option<u64>,
        demand: &[(usize, u64)],
    ) -> Result<usize, InstanceError> {
        let name = name.into();
        check_name("bucket", &name)?;
        let n = name.clone();
        let i = self.push_bucket(move || n.clone(), reservation, limit, demand)?;
        self.inst.bucket_names.push(name);
        Ok(i)
    }

    fn push_bucket(
        &mut self,
        what: impl Fn() -> String,
        reservation: u64,
        limit: Option<u64>,
        demand: &[(usize, u64)],
    ) -> Result<usize, InstanceError> {
        let i = self.inst.reservation.len();
        if i >= MAX_BUCKETS {
            return Err(InstanceError::TooManyBuckets { count: i + 1, max: MAX_BUCKETS });
        }
        for (field, v) in [("reservation", reservation), ("limit", limit.unwrap_or(0))] {
            if v > MAX_TOKENS {
                return Err(InstanceError::TooLarge { what: what(), field, value: v, max: MAX_TOKENS });
            }
        }
        if let Some(l) = limit {
            if l < reservation {
                return Err(InstanceError::LimitBelowReservation { bucket: what(), reservation, limit: l });
            }
        }
        let servers = self.inst.capacity.len();
        self.scratch.clear();
        for &(j, d) in demand {
            if j >= servers {
                return Err(InstanceError::ServerIndex { bucket: what(), server: j, servers });
            }
            if d > MAX_TOKENS {
                return Err(InstanceError::TooLarge {
                    what: format!("{} on server {j}", what()),
                    field: "demand",
                    value: d,
                    max: MAX_TOKENS,
                });
            }
            if d > 0 {
                self.scratch.push((j as u32, d));
            }
        }
        self.scratch.sort_unstable_by_key(|e| e.0);
        if let Some(w) = self.scratch.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(InstanceError::DuplicateDemand { bucket: what(), server: format!("{}", w[0].0) });
        }
        if self.inst.entry_server.len() + self.scratch.len() > MAX_ENTRIES {
            return Err(InstanceError::TooManyEntries { max: MAX_ENTRIES });
        }
        for &(j, d) in &self.scratch {
            self.inst.entry_server.push(j);
            self.inst.entry_demand.push(d);
        }
        self.inst.reservation.push(reservation);
        self.inst.limit.push(limit);
        self.inst.bucket_start.push(self.inst.entry_server.len());
        Ok(i)
    }

    /// Servers added so far (the next server's index).
    pub fn servers(&self) -> usize {
        self.inst.capacity.len()
    }

    /// Finishes the instance (at least one server; zero buckets is allowed here, an idle interval). Names,
    /// if used, must be given for every server (bucket) and be unique.
    pub fn build(self) -> Result<Instance, InstanceError> {
        if self.inst.capacity.is_empty() {
            return Err(InstanceError::NoServers);
        }
        let p = self.inst;
        for (what, names, n) in
            [("server", &p.server_names, p.capacity.len()), ("bucket", &p.bucket_names, p.reservation.len())]
        {
            if !names.is_empty() && names.len() != n {
                return Err(InstanceError::EmptyName { what });
            }
            let mut seen = std::collections::BTreeSet::new();
            for name in names {
                if !seen.insert(name.as_str()) {
                    return Err(InstanceError::DuplicateName { what, name: name.clone() });
                }
            }
        }
        Ok(Instance {
            capacity: p.capacity,
            reservation: p.reservation,
            limit: p.limit,
            bucket_start: p.bucket_start,
            entry_server: p.entry_server,
            entry_demand: p.entry_demand,
            server_names: p.server_names,
            bucket_names: p.bucket_names,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn srv(n: &str, c: f64) -> RawServer {
        RawServer { name: n.into(), capacity: c }
    }
    fn bkt(n: &str, r: f64, l: Option<f64>, d: &[(&str, f64)]) -> RawBucket {
        RawBucket {
            name: n.into(),
            reservation: r,
            limit: l,
            demand: d.iter().map(|(s, v)| (s.to_string(), *v)).collect(),
        }
    }

    /// `InstanceBuilder::default()` builds what `new()` builds (its derived default once lacked the
    /// bucket index's leading 0, so its instances were malformed).
    #[test]
    fn the_default_builder_is_the_new_one() {
        let mut b = InstanceBuilder::default();
        let s = b.add_server(100).unwrap();
        b.add_bucket(10, None, &[(s, 20)]).unwrap();
        let i = b.build().unwrap();
        assert_eq!(i.bucket_entries(0), 0..1);
        assert_eq!((i.entry_server(0), i.entry_demand(0)), (0, 20));
        assert_eq!(i.total_demand(0), 20);
    }

    #[test]
    fn valid_instance_is_sparse_and_sorted() {
        let i = Instance::from_raw(
            &[srv("s0", 100.0), srv("s1", 100.0)],
            &[bkt("b0", 100.0, Some(150.0), &[("s1", 50.0), ("s0", 150.0)]), bkt("b1", 10.0, None, &[("s0", 0.0)])],
        )
        .unwrap();
        assert_eq!(i.entries(), 2, "zero demand dropped");
        assert_eq!(i.bucket_entries(0), 0..2);
        assert_eq!((i.entry_server(0), i.entry_demand(0)), (0, 150));
        assert_eq!(i.demand(0, 1), 50);
        assert_eq!(i.total_demand(1), 0);
        assert_eq!(i.bucket_name(1), "b1");
        assert_eq!(i.limit(0), Some(150));
    }

    #[test]
    fn bad_instances_name_the_problem() {
        let s = [srv("s0", 100.0)];
        let e = |servers: &[RawServer], buckets: &[RawBucket]| {
            Instance::from_raw(servers, buckets).unwrap_err().to_string()
        };
        assert_eq!(e(&[], &[bkt("b", 1.0, None, &[])]), "the instance has no servers");
        assert_eq!(e(&s, &[]), "the instance has no buckets");
        assert!(e(&[srv("s0", -1.0)], &[bkt("b", 1.0, None, &[])])
            .contains("server \"s0\": capacity must be a whole number"));
        assert!(e(&s, &[bkt("b", 1.5, None, &[])]).contains("bucket \"b\": reservation must be a whole number"));
        // A huge number is shown short (it was echoed with all its 301 digits).
        assert!(e(&[srv("s0", 1e300)], &[bkt("b", 1.0, None, &[])]).ends_with("got 1e300"));
        assert!(e(&s, &[bkt("b", f64::NAN, None, &[])]).contains("reservation"));
        assert!(e(&s, &[bkt("b", 1.0, None, &[("s9", 1.0)])]).contains("unknown server \"s9\""));
        assert!(e(&s, &[bkt("b", 1.0, None, &[("s0", 1.0), ("s0", 2.0)])]).contains("names server \"s0\" twice"));
        assert!(e(&s, &[bkt("b", 1.0, None, &[("s0", -3.0)])]).contains("bucket \"b\" on server \"s0\": demand"));
        assert!(e(&s, &[bkt("b", 5.0, Some(4.0), &[])]).contains("limit 4 is below the reservation 5"));
        assert!(
            e(&[srv("s0", 1.0), srv("s0", 1.0)], &[bkt("b", 1.0, None, &[])]).contains("two servers are named \"s0\"")
        );
        assert!(e(&s, &[bkt("b", 1.0, None, &[]), bkt("b", 1.0, None, &[])]).contains("two buckets are named \"b\""));
        assert!(e(&s, &[bkt(" ", 1.0, None, &[])]).contains("empty name"));
        assert!(e(&s, &[bkt(&"x".repeat(MAX_NAME_LEN + 1), 1.0, None, &[])]).contains("longer than 256"));
    }

    #[test]
    fn bounds_hold_at_the_limit() {
        // Tokens: MAX_TOKENS is accepted, one more is not.
        let s = [srv("s0", MAX_TOKENS as f64)];
        assert!(Instance::from_raw(&s, &[bkt("b", MAX_TOKENS as f64, None, &[("s0", MAX_TOKENS as f64)])]).is_ok());
        let err = Instance::from_raw(&s, &[bkt("b", (MAX_TOKENS + 1) as f64, None, &[])]).unwrap_err();
        assert!(matches!(err, InstanceError::BadNumber { field: "reservation", .. }), "{err}");
        let mut b = InstanceBuilder::new();
        assert!(b.add_server(MAX_TOKENS + 1).is_err());
        // Servers: MAX_SERVERS is accepted, one more is not.
        for _ in 0..MAX_SERVERS {
            b.add_server(1).unwrap();
        }
        assert!(matches!(b.add_server(1), Err(InstanceError::TooManyServers { .. })));
        assert!(matches!(b.add_bucket(1, None, &[(MAX_SERVERS, 1)]), Err(InstanceError::ServerIndex { .. })));
        // Buckets: MAX_BUCKETS is accepted, one more is not.
        let mut b = InstanceBuilder::new();
        b.add_server(1).unwrap();
        for _ in 0..MAX_BUCKETS {
            b.add_bucket(0, None, &[]).unwrap();
        }
        assert!(matches!(b.add_bucket(0, None, &[]), Err(InstanceError::TooManyBuckets { .. })));
        // Entries: MAX_ENTRIES is accepted, one more is not (MAX_SERVERS entries per bucket).
        let mut b = InstanceBuilder::new();
        for _ in 0..MAX_SERVERS {
            b.add_server(1).unwrap();
        }
        let row: Vec<(usize, u64)> = (0..MAX_SERVERS).map(|j| (j, 1)).collect();
        for _ in 0..MAX_ENTRIES / MAX_SERVERS {
            b.add_bucket(1, None, &row).unwrap();
        }
        assert!(matches!(b.add_bucket(1, None, &row[..1]), Err(InstanceError::TooManyEntries { .. })));
        assert_eq!(b.build().unwrap().entries(), MAX_ENTRIES);
    }
}
