//! `rein load --job`'s key=value language: one tenant's workload as a command line writes it,
//! parsed into a [`Job`].
//!
//! `name=NAME[,export=E][,tenant=T][,conns=N][,kind=K][,depth=N][,rate=IOPS][,think=MS][,on=S,off=S]
//! [,burst=N,period=MS][,trace=PATH[,format=F][,time_scale=X][,repeat=1]][,size=4k][,read=PCT][,random=PCT]
//! [,span=GIB][,start=S][,stop=S]` (docs/serve.md, `rein load`).
//!
//! The workload's keys fill rein-model's [`WorkloadParams`], the simulator's `[tenants.workload]`, and are
//! validated by its one set of rules ([`WorkloadParams::validate_as`] with [`FieldNames::JOB`]), so a job and
//! a scenario accept the same workloads and an error names the job's key as written (`rate`, `period`),
//! not the scenario field it fills. What only a job has is checked here: its keys (each once, each known),
//! `conns`, and the mapping of `depth` (per connection) times `conns` onto the workload's `outstanding`.
//!
//! Every refusal names the job as written, once: `job "name=a,rate=0": rate must be a positive number,
//! got 0`. A job with `trace=` reads the trace file (relative to the working directory) while it is
//! parsed, as the simulator reads a scenario's.
//!
//! Fuzzed by the `job_spec` target ([`crate::harness::job_spec`]).

use crate::load::Job;
use rein_core::Nanos;
use rein_model::workload::{FieldNames, KindName, TraceParams, WorkloadError, WorkloadParams};
use std::collections::BTreeSet;

/// Most connections one job opens.
pub const MAX_CONNECTIONS: usize = 1024;
/// Requests a closed job keeps outstanding per connection unless `depth=` says otherwise.
pub const DEFAULT_DEPTH: u32 = 16;
/// The GiB a job's offsets range over unless `span=` says: in effect the whole export (`rein load` keeps
/// offsets within the export's size).
pub const DEFAULT_SPAN_GB: f64 = 1024.0;

/// A `--job` value refused: the job as written, then what is wrong with it ([`JobKeyError`]), once.
#[derive(Debug, thiserror::Error)]
#[error("job {spec:?}: {error}")]
pub struct JobError {
    /// The `--job` value as written.
    pub spec: String,
    /// What is wrong with it.
    #[source]
    pub error: JobKeyError,
}

/// What is wrong with a `--job` value: a key or value of the job's own language, or the workload its keys
/// make ([`WorkloadError`], which names the job's key as written).
#[derive(Debug, thiserror::Error)]
pub enum JobKeyError {
    /// A comma-separated part without `=`.
    #[error("{part:?} is not key=value")]
    NotKeyValue {
        /// The part.
        part: String,
    },
    /// A key given twice (the last does not win).
    #[error("{key} is given twice")]
    Repeated {
        /// The key.
        key: String,
    },
    /// A key this language does not have.
    #[error(
        "unknown key {key:?} (name, export, tenant, conns, kind, depth, rate, think, on, off, burst, period, \
         trace, format, time_scale, repeat, size, read, random, span, start, stop)"
    )]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A key that takes a number was given something else.
    #[error("{key}={value}: not a number: {error}")]
    Number {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// The parser's reason.
        #[source]
        error: std::num::ParseFloatError,
    },
    /// A key that takes a whole number (`depth`, `burst`, `conns`) was given something else.
    #[error("{key}={value}: not a whole number: {error}")]
    WholeNumber {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// The parser's reason.
        #[source]
        error: std::num::ParseIntError,
    },
    /// `repeat=` is not a boolean word.
    #[error("repeat={value}: expected true or false")]
    Repeat {
        /// The value given.
        value: String,
    },
    /// `size=` is not a whole number with an optional k or m.
    #[error("size {text:?}: expected bytes, or a number with k or m: {error}")]
    SizeNumber {
        /// The value given, lowercased and trimmed.
        text: String,
        /// The parser's reason.
        #[source]
        error: std::num::ParseIntError,
    },
    /// `size=` in bytes below a sector (`size=8` meant 8 KiB).
    #[error("size {text:?} is {bytes} bytes, below a 512-byte sector: for KiB write {bytes}k")]
    SizeBelowSector {
        /// The value given, lowercased and trimmed.
        text: String,
        /// The bytes it says.
        bytes: u64,
    },
    /// `size=` beyond `u64` bytes.
    #[error("size {text:?} is too large")]
    SizeOverflow {
        /// The value given, lowercased and trimmed.
        text: String,
    },
    /// No `name=`.
    #[error("name= is required")]
    NoName,
    /// A name with a control character (it is the report's tenant: a line break would split its CSV rows).
    #[error("name={name:?} has a control character (a line break, tab or escape)")]
    NameControl {
        /// The name given.
        name: String,
    },
    /// `conns=` outside `1..=`[`MAX_CONNECTIONS`].
    #[error("conns must be in 1..={MAX_CONNECTIONS}, got {got}")]
    Connections {
        /// The value given.
        got: usize,
    },
    /// `depth=` above what one connection has in flight; the message says the `conns=`/`depth=` that
    /// spreads it.
    #[error(
        "depth={depth} is above the {per} requests one connection has in flight: spread it over connections with \
         conns= (conns={},depth={})",
        (*depth as usize).div_ceil(*per) * conns,
        (*depth as usize).div_ceil((*depth as usize).div_ceil(*per))
    )]
    DepthPerConnection {
        /// The depth given.
        depth: u32,
        /// The requests one connection has in flight ([`crate::client::MAX_IN_FLIGHT`]).
        per: usize,
        /// The connections given.
        conns: usize,
    },
    /// `format=`, `time_scale=` or `repeat=` without `trace=`.
    #[error("{key}= is a trace's setting: it needs trace=")]
    TraceSetting {
        /// The key.
        key: &'static str,
    },
    /// The workload the keys make is refused by the simulator's rules (its message names the job's key).
    #[error(transparent)]
    Workload(#[from] WorkloadError),
}

/// Parses one `--job` value into a job; `run` is the run's length (the default stop). The error names the
/// job as written and what is wrong with it (module comment).
pub fn parse(spec: &str, run: Nanos) -> Result<Job, JobError> {
    parse_keys(spec, run).map_err(|error| JobError { spec: spec.to_string(), error })
}

/// A size in bytes, or with k or m (KiB, MiB).
fn parse_size(v: &str) -> Result<u64, JobKeyError> {
    let v = v.trim().to_ascii_lowercase();
    let (num, mul) = if let Some(n) = v.strip_suffix('k') {
        (n, 1024)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 1 << 20)
    } else {
        (v.as_str(), 1)
    };
    let n: u64 = num.parse().map_err(|error| JobKeyError::SizeNumber { text: v.clone(), error })?;
    // `size=8` meant 8 KiB (scenarios say `size_kb = 8`) and ran 8-byte requests: bytes without a unit are
    // at least a sector.
    if mul == 1 && (1..512).contains(&n) {
        return Err(JobKeyError::SizeBelowSector { text: v, bytes: n });
    }
    n.checked_mul(mul).ok_or(JobKeyError::SizeOverflow { text: v })
}

fn parse_keys(spec: &str, run: Nanos) -> Result<Job, JobKeyError> {
    let (mut name, mut export, mut tenant) = (String::new(), String::new(), String::new());
    let mut conns = 1usize;
    let mut depth: Option<u32> = None;
    let mut kind: Option<String> = None;
    let mut size: Option<u64> = None;
    let mut p = WorkloadParams { span_gb: DEFAULT_SPAN_GB, ..WorkloadParams::default() };
    let (mut trace, mut trace_format, mut time_scale, mut repeat) = (None::<String>, None::<String>, 1.0, false);
    let mut seen = BTreeSet::new();
    for kv in spec.split(',') {
        let (k, v) = kv.split_once('=').ok_or_else(|| JobKeyError::NotKeyValue { part: kv.to_string() })?;
        let k = k.trim();
        if !seen.insert(k) {
            return Err(JobKeyError::Repeated { key: k.to_string() });
        }
        let num = |v: &str| {
            v.parse::<f64>().map_err(|error| JobKeyError::Number { key: k.to_string(), value: v.to_string(), error })
        };
        let whole_error = |v: &str, error| JobKeyError::WholeNumber { key: k.to_string(), value: v.to_string(), error };
        let whole = |v: &str| v.parse::<u32>().map_err(|e| whole_error(v, e));
        match k {
            "name" => name = v.to_string(),
            "export" => export = v.to_string(),
            "tenant" => tenant = v.to_string(),
            "kind" => kind = Some(v.to_string()),
            "depth" => depth = Some(whole(v)?),
            "conns" => conns = v.parse().map_err(|e| whole_error(v, e))?,
            "rate" => p.iops = Some(num(v)?),
            "think" => p.think_ms = Some(num(v)?),
            "on" => p.on_s = Some(num(v)?),
            "off" => p.off_s = Some(num(v)?),
            "burst" => p.burst_count = Some(whole(v)?),
            "period" => p.burst_period_ms = Some(num(v)?),
            "trace" => trace = Some(v.to_string()),
            "format" => trace_format = Some(v.to_string()),
            "time_scale" => time_scale = num(v)?,
            "repeat" => {
                repeat = match v {
                    "1" | "true" | "yes" => true,
                    "0" | "false" | "no" => false,
                    _ => return Err(JobKeyError::Repeat { value: v.to_string() }),
                }
            }
            "size" => size = Some(parse_size(v)?),
            "read" => p.read_pct = Some(num(v)?),
            "random" => p.random_pct = Some(num(v)?),
            "span" => p.span_gb = num(v)?,
            "start" => p.start_s = num(v)?,
            "stop" => p.stop_s = Some(num(v)?),
            other => return Err(JobKeyError::UnknownKey { key: other.to_string() }),
        }
    }
    if name.is_empty() {
        return Err(JobKeyError::NoName);
    }
    // The name is the report's tenant: a line break would split its CSV rows, an escape rewrite the table.
    if name.chars().any(char::is_control) {
        return Err(JobKeyError::NameControl { name });
    }
    if export.is_empty() {
        export = name.clone();
    }
    if tenant.is_empty() {
        tenant = export.clone();
    }
    if !(1..=MAX_CONNECTIONS).contains(&conns) {
        return Err(JobKeyError::Connections { got: conns });
    }
    // The kind follows from the keys given unless named.
    p.kind = kind.unwrap_or_else(|| {
        let k = if trace.is_some() {
            KindName::Trace
        } else if p.burst_count.is_some() {
            KindName::Burst
        } else if p.on_s.is_some() || p.off_s.is_some() {
            KindName::OnOff
        } else if p.iops.is_some() {
            KindName::Open
        } else {
            KindName::Closed
        };
        k.name().to_string()
    });
    // A closed loop keeps `depth` requests outstanding per connection (a product beyond u32 is beyond the
    // workload's bound anyway); a depth given to a kind without a window is refused by the workload's
    // rules, as `outstanding` is in a scenario.
    if depth.is_some() || p.keeps_window() {
        let depth = depth.unwrap_or(DEFAULT_DEPTH);
        // One connection has at most MAX_IN_FLIGHT requests in flight: a deeper one would silently wait.
        if depth as usize > crate::client::MAX_IN_FLIGHT {
            return Err(JobKeyError::DepthPerConnection { depth, per: crate::client::MAX_IN_FLIGHT, conns });
        }
        p.outstanding = Some(u32::try_from(u64::from(depth) * conns as u64).unwrap_or(u32::MAX));
    }
    if trace.is_none() {
        if let Some(k) = ["format", "time_scale", "repeat"].into_iter().find(|k| seen.contains(k)) {
            return Err(JobKeyError::TraceSetting { key: k });
        }
    }
    p.size_kb = size.map(|b| b as f64 / 1024.0);
    p.trace =
        trace.map(|path| TraceParams { path, format: trace_format, device: None, devices: None, time_scale, repeat });
    let workload = p.validate_as(run, None, &[], &FieldNames::JOB)?;
    Ok(Job { name, export, tenant, connections: conns, workload, route: None, stream: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_err(spec: &str) -> String {
        parse(spec, Nanos::from_secs(10)).expect_err("should be refused").to_string()
    }

    /// Every error names the job once; a key given twice is an error, not the last one winning.
    #[test]
    fn job_errors_name_the_job_and_refuse_repeated_keys() {
        assert_eq!(
            job_err("name=a,depth=x"),
            "job \"name=a,depth=x\": depth=x: not a whole number: invalid digit found in string"
        );
        assert_eq!(job_err("name=a,rate=5,rate=9"), "job \"name=a,rate=5,rate=9\": rate is given twice");
        assert!(job_err("name=a,bogus=1").starts_with("job \"name=a,bogus=1\": unknown key \"bogus\""));
        assert_eq!(job_err("name=a,rate"), "job \"name=a,rate\": \"rate\" is not key=value");
        assert!(job_err("name=a,trace=x.trace,repeat=maybe").ends_with("repeat=maybe: expected true or false"));
        assert_eq!(job_err("rate=5"), "job \"rate=5\": name= is required");
        assert_eq!(
            job_err("name=a\nb"),
            "job \"name=a\\nb\": name=\"a\\nb\" has a control character (a line break, tab or escape)"
        );
        assert_eq!(
            job_err("name=a,rate=1e9"),
            "job \"name=a,rate=1e9\": rate 1000000000 is above the bound of 10000000 IOPS"
        );
        let ok = parse("name=a,rate=100,read=50", Nanos::from_secs(10)).unwrap();
        assert_eq!((ok.name.as_str(), ok.export.as_str(), ok.tenant.as_str()), ("a", "a", "a"));
        // A value out of range is named by its job key and value as written, not by the scenario field it
        // fills (docs/serve.md, `rein load`): each message after the job's name.
        for (keys, want) in [
            ("depth=0", "depth x conns must be in 1..=65536, got 0"),
            ("depth=1024,conns=65", "depth x conns must be in 1..=65536, got 66560"),
            (
                "depth=2000",
                "depth=2000 is above the 1024 requests one connection has in flight: spread it over connections \
                 with conns= (conns=2,depth=1000)",
            ),
            ("depth=100,conns=1000", "depth x conns must be in 1..=65536, got 100000"),
            ("conns=0", "conns must be in 1..=1024, got 0"),
            ("rate=0", "rate must be a positive number, got 0"),
            ("kind=open", "kind=open needs rate="),
            ("burst=0,period=10", "burst must be in 1..=65536, got 0"),
            ("burst=4", "kind=burst needs period="),
            ("burst=4,period=0", "period must be a positive number, got 0"),
            ("burst=65536,period=0.001", "the rate burst / period 65536000000 is above the bound of 10000000 IOPS"),
            ("read=150", "read must be in [0, 100], got 150"),
            ("random=-1", "random must be in [0, 100], got -1"),
            ("on=0,off=1", "on must be positive"),
            ("on=1", "kind=on_off needs off="),
            ("on=1,off=-1", "off must be between 0 and 604800 s, got -1"),
            ("on=0.0001,off=0.0001", "on + off must be at least 0.001 s (one on/off cycle), got 0.0002 s"),
            ("span=0", "span must be a positive number, got 0"),
            ("think=-1", "think must be between 0 and 604800000 ms, got -1"),
            ("size=0", "size must be a positive number, got 0"),
            ("size=8", "size \"8\" is 8 bytes, below a 512-byte sector: for KiB write 8k"),
            ("size=2048m", "size must be at most 1 GiB, got 2 GiB"),
            ("size=1y", "size \"1y\": expected bytes, or a number with k or m: invalid digit found in string"),
            ("start=-1", "start must be between 0 and 604800 s, got -1"),
            ("start=20", "start must be before the run's end (10 s), got 20"),
            ("start=5,stop=2", "stop must be after start"),
            ("stop=1e9", "stop must be between 0 and 604800 s, got 1000000000"),
            ("trace=x.trace,time_scale=0", "time_scale must be a positive number, got 0"),
            ("kind=trace", "kind=trace needs trace="),
            ("kind=zigzag", "kind=zigzag: expected closed, open, on_off, burst or trace"),
            // A key the kind does not use is refused, not ignored.
            ("rate=100,depth=8", "depth= is not used by kind=open"),
            ("rate=100,think=5", "think= is not used by kind=open"),
            ("burst=4,period=10,rate=5", "rate= is not used by kind=burst"),
            ("kind=closed,rate=5", "rate= is not used by kind=closed"),
            (
                "on=1,off=1,rate=5,depth=2",
                "depth= is not used by kind=on_off (open inside its on periods: it has rate)",
            ),
            ("repeat=1", "repeat= is a trace's setting: it needs trace="),
            ("time_scale=2,rate=5", "time_scale= is a trace's setting: it needs trace="),
        ] {
            let spec = format!("name=a,{keys}");
            assert_eq!(job_err(&spec), format!("job {spec:?}: {want}"));
        }
    }

    /// Each refusal is its [`JobKeyError`] variant, carrying the key and value, inside a [`JobError`] naming
    /// the job; the messages are the `String` error's text (the test above holds those strings), and the
    /// job's message holds its cause's once.
    #[test]
    fn job_refusals_are_typed() {
        let run = Nanos::from_secs(10);
        let e = parse("name=a,depth=x", run).unwrap_err();
        assert_eq!(e.spec, "name=a,depth=x");
        assert!(
            matches!(&e.error, JobKeyError::WholeNumber { key, value, .. } if key == "depth" && value == "x"),
            "{e:?}"
        );
        let cause = std::error::Error::source(&e).expect("the key's error is the source").to_string();
        assert_eq!(cause, "depth=x: not a whole number: invalid digit found in string");
        assert_eq!(e.to_string(), format!("job \"name=a,depth=x\": {cause}"));
        let key = |spec: &str| parse(spec, run).unwrap_err().error;
        assert!(matches!(key("name=a,rate=x"), JobKeyError::Number { key, .. } if key == "rate"));
        assert!(matches!(key("name=a,conns=-1"), JobKeyError::WholeNumber { key, .. } if key == "conns"));
        assert!(matches!(key("name=a,rate=5,rate=9"), JobKeyError::Repeated { key } if key == "rate"));
        assert!(matches!(key("name=a,bogus=1"), JobKeyError::UnknownKey { key } if key == "bogus"));
        assert!(matches!(key("name=a,rate"), JobKeyError::NotKeyValue { part } if part == "rate"));
        assert!(matches!(key("name=a,trace=x,repeat=maybe"), JobKeyError::Repeat { value } if value == "maybe"));
        assert!(matches!(key("rate=5"), JobKeyError::NoName));
        assert!(matches!(key("name=a\tb"), JobKeyError::NameControl { name } if name == "a\tb"));
        assert!(matches!(key("name=a,conns=0"), JobKeyError::Connections { got: 0 }));
        assert!(matches!(
            key("name=a,depth=2000"),
            JobKeyError::DepthPerConnection { depth: 2000, per: crate::client::MAX_IN_FLIGHT, conns: 1 }
        ));
        assert!(matches!(key("name=a,repeat=1"), JobKeyError::TraceSetting { key: "repeat" }));
        assert!(matches!(key("name=a,size=8"), JobKeyError::SizeBelowSector { text, bytes: 8 } if text == "8"));
        assert!(matches!(key("name=a,size=1y"), JobKeyError::SizeNumber { text, .. } if text == "1y"));
        let e = key("name=a,size=99999999999999999m");
        assert!(matches!(&e, JobKeyError::SizeOverflow { text } if text == "99999999999999999m"), "{e:?}");
        assert_eq!(e.to_string(), "size \"99999999999999999m\" is too large");
        let e = key("name=a,rate=0");
        assert!(matches!(e, JobKeyError::Workload(_)), "{e:?}");
        assert_eq!(e.to_string(), "rate must be a positive number, got 0");
    }

    /// The job's keys land in the workload the simulator's rules make of them.
    #[test]
    fn keys_fill_the_workload() {
        use rein_model::workload::WorkloadKind;
        let j = parse(
            "name=a,export=e,conns=2,depth=8,think=5,size=64k,read=30,random=0,span=2,start=1,stop=9",
            Nanos::from_secs(10),
        )
        .unwrap();
        assert_eq!((j.export.as_str(), j.tenant.as_str(), j.connections), ("e", "e", 2));
        let w = &j.workload;
        assert_eq!(w.kind, WorkloadKind::Closed { outstanding: 16, think: Nanos::from_millis(5), per_server: false });
        assert_eq!((w.size_bytes, w.read_frac, w.random_frac, w.span_bytes), (65536, 0.3, 0.0, 2 << 30));
        assert_eq!((w.start, w.stop), (Nanos::from_secs(1), Nanos::from_secs(9)));
        let b = parse("name=b,burst=4,period=10", Nanos::from_secs(10)).unwrap();
        assert_eq!(b.workload.kind, WorkloadKind::Burst { count: 4, period: Nanos::from_millis(10) });
        assert_eq!(b.workload.stop, Nanos::from_secs(10), "the run's end is the default stop");
    }

    /// A trace's errors name the job's keys too (`repeat`, `time_scale`; the scenario's are
    /// `trace.repeat` and `trace.time_scale`), and a relative path is read from the working directory.
    #[test]
    fn a_trace_job_names_its_own_keys() {
        // Removed when dropped, also when an assertion fails.
        let tmp = tempfile::Builder::new().prefix("rein-job-spec-").tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let at_once = dir.join("at-once.trace");
        std::fs::write(&at_once, "0 0 0 8 1\n").unwrap();
        let spec = format!("name=a,trace={},repeat=1", at_once.display());
        let e = job_err(&spec);
        let want = format!(
            "job {spec:?}: repeat: {}'s 1 records are all at one instant (at time_scale 1): a repeated trace",
            at_once.display()
        );
        assert!(e.starts_with(&want), "{e}");
        let spread = dir.join("spread.trace");
        std::fs::write(&spread, "0 0 0 8 1\n1000 0 8 8 1\n").unwrap();
        let e = job_err(&format!("name=a,trace={},repeat=1,time_scale=1e-9", spread.display()));
        assert!(e.contains(": repeat: the replay rate of") && e.contains("at time_scale 1e-9"), "{e}");
        let ok = parse(&format!("name=a,trace={},repeat=1", spread.display()), Nanos::from_secs(10)).unwrap();
        assert!(matches!(ok.workload.kind, rein_model::workload::WorkloadKind::Trace { repeat: true, .. }));
    }
}
