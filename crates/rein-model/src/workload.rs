//! The workload generator: when a tenant issues requests, and which (offset, size, read or write).
//!
//! # Model
//! A tenant's [`WorkloadSpec`] names one of five kinds:
//! - **closed**: keeps `outstanding` requests in flight, replacing each completion (after an optional
//!   think time). With `per_server`, the window is per server (a gateway with a window per storage node,
//!   as the dmClock and RBFQ papers' clients): a completion at a server is replaced at the same server.
//! - **open**: Poisson arrivals at `iops`, whatever the completions.
//! - **on_off**: an open or closed workload that runs for `on`, pauses for `off`, and so on.
//! - **burst**: `count` requests every `period`.
//! - **trace**: replays a block trace's arrival times, offsets, sizes and directions (optionally faster or
//!   slower by `time_scale`, optionally repeated).
//!
//! Generated requests have the workload's size; their offset is random (uniform over `span / size`
//! slots) with probability `random_frac`, else sequential (right after the previous request, wrapping
//! at the span); they are reads with probability `read_frac`.
//!
//! # Driving it (sans-IO)
//! A [`Generator`] holds one tenant's state and never reads a clock; the caller (the simulator's event
//! engine, `rein load`'s tokio loop) owns the timers and the requests:
//! - at `spec.start`: [`Generator::start`] (returns the first on/off toggle, if any), then
//!   [`Generator::begin`] says whether to fill the window now ([`Generator::deficit`] requests, per
//!   server or in one pool) or to wait for an arrival at a time;
//! - at an arrival: [`Generator::arrival`] says what to issue (generated requests or a trace record);
//!   after issuing them, [`Generator::next_arrival`] gives the next arrival time;
//! - at a toggle: [`Generator::toggle`]; at `spec.stop`: [`Generator::stop`];
//! - for every request issued, [`Generator::next_io`] draws its offset and direction (generated
//!   requests) and [`Generator::issued`] counts it; on a completion [`Generator::completed`] says whether
//!   and when to replace it; on a failure [`Generator::failed`] only counts it.
//!
//! The order of those calls is the order of the random draws, so a caller that keeps it gets the same
//! requests from the same seed: the simulator's outputs depend on it.
//!
//! # Randomness
//! One PCG stream per tenant ([`crate::seed`]) for offsets and Poisson gaps; the caller may draw from
//! it too ([`Generator::uniform`], for routing by shares), in a fixed order. The read/write mix comes
//! from a second, independent stream, so a workload's read percentage never shifts its offsets.
//!
//! # Invariants
//! 1. `in_flight` counts requests issued and not yet completed or failed. Per server, the caller counts
//!    (a gateway knows what it has at each server) and passes its count to [`Generator::deficit`].
//! 2. A stopped (or paused) generator asks for no new requests.

use crate::trace::TraceRecord;
use rand::Rng;
use rand_pcg::Pcg64Mcg;
use rein_core::{Nanos, Num};
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

/// Largest window (`outstanding`, per server or in all) and burst.
pub const MAX_OUTSTANDING: u32 = 65_536;
/// Longest time a workload parameter may name (seconds: a week).
pub const MAX_SECONDS: f64 = 7.0 * 86_400.0;
/// Largest request (bytes): 1 GiB (defined beside the trace reader, which applies it to records too).
pub use crate::trace::MAX_SIZE_BYTES;
/// Highest rate a workload may offer by its own timing (IOPS): an open workload's `iops`, a burst's
/// `count / period`, a repeated trace's records per pass. Each arrival is an event for the simulator and a
/// timer for `rein load`; ten million a second is ten times the fastest device scenario here.
pub const MAX_RATE_IOPS: f64 = 1e7;
/// A closed workload's window when its file does not say (`outstanding`).
pub const DEFAULT_OUTSTANDING: u32 = 32;
/// Shortest on/off cycle (`on_s + off_s`): 1 ms, so toggles stay at most two per millisecond.
pub const MIN_CYCLE_S: f64 = 1e-3;

/// When requests are issued.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkloadKind {
    /// A window of `outstanding` requests (per server with `per_server`), each replaced `think` after it
    /// completes.
    Closed {
        /// Requests kept in flight.
        outstanding: u32,
        /// Pause between a completion and its replacement.
        think: Nanos,
        /// The window is per server instead of one pool.
        per_server: bool,
    },
    /// Poisson arrivals.
    Open {
        /// Mean arrival rate (IOPS).
        iops: f64,
    },
    /// An open or closed workload alternating `on` and `off` periods, starting on.
    OnOff {
        /// Length of an on period.
        on: Nanos,
        /// Length of an off period.
        off: Nanos,
        /// What runs during on periods: an open or a closed loop, never another on_off (its type has no
        /// such case).
        inner: OnOffInner,
    },
    /// `count` requests at once every `period`.
    Burst {
        /// Requests per burst.
        count: u32,
        /// Time between bursts.
        period: Nanos,
    },
    /// A block trace replayed.
    Trace {
        /// The records, sorted by time, the first at 0.
        records: Arc<Vec<TraceRecord>>,
        /// Multiplier on inter-arrival times (0.5 = twice as fast).
        time_scale: f64,
        /// Replay again from the start when the trace ends.
        repeat: bool,
    },
}

/// What an on_off workload runs in its on periods: an open or a closed loop. A type of its own, so an
/// on_off inside an on_off (whose periods would mean nothing: the outer one toggles) cannot be built;
/// it was a `Box<WorkloadKind>` that validation kept from holding one, and the generator panicked on it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OnOffInner {
    /// [`WorkloadKind::Closed`].
    Closed {
        /// Requests kept in flight.
        outstanding: u32,
        /// Pause between a completion and its replacement.
        think: Nanos,
        /// The window is per server instead of one pool.
        per_server: bool,
    },
    /// [`WorkloadKind::Open`].
    Open {
        /// Mean arrival rate (IOPS).
        iops: f64,
    },
}

impl OnOffInner {
    /// The same loop as a workload of its own.
    pub fn kind(self) -> WorkloadKind {
        match self {
            OnOffInner::Closed { outstanding, think, per_server } => {
                WorkloadKind::Closed { outstanding, think, per_server }
            }
            OnOffInner::Open { iops } => WorkloadKind::Open { iops },
        }
    }
}

impl WorkloadKind {
    /// The kind's name as configuration files write it.
    pub fn name(&self) -> &'static str {
        match self {
            WorkloadKind::Closed { .. } => KindName::Closed,
            WorkloadKind::Open { .. } => KindName::Open,
            WorkloadKind::OnOff { .. } => KindName::OnOff,
            WorkloadKind::Burst { .. } => KindName::Burst,
            WorkloadKind::Trace { .. } => KindName::Trace,
        }
        .name()
    }

    /// Whether requests arrive whatever the service (open, burst, trace; on_off by its inner kind): what
    /// the workload offers is then its demand. A closed loop's next request waits for a completion.
    pub fn open_loop(&self) -> bool {
        !matches!(self, WorkloadKind::Closed { .. } | WorkloadKind::OnOff { inner: OnOffInner::Closed { .. }, .. })
    }

    /// How many requests an open loop issues within `span` at most, about: what it can have on its way
    /// over a network `span` long one way, whatever the servers do. An open workload's rate times the
    /// span, a burst's count times the bursts that start within it, a trace's mean rate over its records'
    /// span (at most its records, unless repeated); on_off as its inner kind while on. `None` for a closed
    /// loop, whose window bounds it.
    pub fn issued_within(&self, span: Nanos) -> Option<f64> {
        let d = span.as_secs_f64();
        match self {
            WorkloadKind::Closed { .. } | WorkloadKind::OnOff { inner: OnOffInner::Closed { .. }, .. } => None,
            WorkloadKind::Open { iops } | WorkloadKind::OnOff { inner: OnOffInner::Open { iops }, .. } => {
                Some(iops * d)
            }
            WorkloadKind::Burst { count, period } => {
                Some(f64::from(*count) * (d / period.as_secs_f64().max(1e-9)).ceil())
            }
            WorkloadKind::Trace { records, time_scale, repeat } => {
                let n = records.len() as f64;
                let last = records.last().map_or(0.0, |r| r.t_ns as f64 * time_scale / 1e9);
                let within = if last > 0.0 { n / last * d } else { f64::INFINITY };
                Some(if *repeat { within } else { within.min(n) })
            }
        }
    }
}

/// A validated workload (module comment).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    /// When requests are issued.
    pub kind: WorkloadKind,
    /// Size of generated requests (bytes).
    pub size_bytes: u64,
    /// Probability that a generated request is a read.
    pub read_frac: f64,
    /// Probability that a generated request's offset is random (else sequential).
    pub random_frac: f64,
    /// Bytes the offsets range over.
    pub span_bytes: u64,
    /// When the workload starts.
    pub start: Nanos,
    /// When it stops issuing.
    pub stop: Nanos,
}

/// `[tenants.workload.trace]` (the simulator) or `trace=` (`rein load`): the trace to replay, as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceParams {
    /// The trace file; a relative path resolves against the `base` given to [`WorkloadParams::validate`]
    /// (a scenario's directory).
    pub path: String,
    /// disksim | csv (cloudPhysics `version,time,op,size,lbn`) | vscsi (`ts_us,op,size_bytes,lbn`);
    /// default from the extension (.trace = disksim, *.vscsi-us.csv = vscsi, .csv = csv).
    pub format: Option<String>,
    /// Keep only this device number (disksim). The caller resolves `device`, `devices` (and the
    /// simulator's `routing.devices`) into the list it passes to [`WorkloadParams::validate`].
    pub device: Option<u32>,
    /// Keep only these device numbers (disksim).
    pub devices: Option<Vec<u32>>,
    /// Multiply inter-arrival times by this (0.5 = twice as fast; default 1).
    #[serde(default = "default_time_scale")]
    pub time_scale: f64,
    /// Replay the trace again from the start when it ends.
    #[serde(default)]
    pub repeat: bool,
}

fn default_time_scale() -> f64 {
    1.0
}
fn default_kind() -> String {
    KindName::Closed.name().into()
}
fn default_size_kb() -> f64 {
    4.0
}
fn default_pct() -> f64 {
    100.0
}
fn default_span_gb() -> f64 {
    10.0
}

/// A workload as configuration files write it (the simulator's `[tenants.workload]`, `rein load`'s
/// `--job`), validated once into a [`WorkloadSpec`] by [`WorkloadParams::validate`]. One struct for both,
/// so the names, defaults and checks cannot drift apart. A file must name the `kind`; every other field
/// has the default of [`WorkloadParams::default`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadParams {
    /// closed | open | on_off | burst | trace
    pub kind: String,
    /// closed: requests in flight (in all; default [`DEFAULT_OUTSTANDING`]).
    pub outstanding: Option<u32>,
    /// closed: keep this many requests outstanding at *each* of the tenant's servers instead of one pool of
    /// `outstanding` shared by them (a gateway with a per-server window, as in the dmClock and RBFQ papers'
    /// clients); a completion at a server is replaced by a new request to the same server.
    pub outstanding_per_server: Option<u32>,
    /// open / on_off (open inside on periods): Poisson arrival rate.
    pub iops: Option<f64>,
    /// closed: think time (ms).
    pub think_ms: Option<f64>,
    /// on_off: on period (s).
    pub on_s: Option<f64>,
    /// on_off: off period (s).
    pub off_s: Option<f64>,
    /// burst: requests per burst.
    pub burst_count: Option<u32>,
    /// burst: time between bursts (ms).
    pub burst_period_ms: Option<f64>,
    /// trace: the trace to replay.
    pub trace: Option<TraceParams>,
    /// Request size (KiB; default 4). Not for a trace, whose records carry their sizes.
    pub size_kb: Option<f64>,
    /// Percentage of reads (default 100). Not for a trace, whose records carry their operations.
    pub read_pct: Option<f64>,
    /// Percentage of random offsets (default 100). Not for a trace, whose records carry their offsets.
    pub random_pct: Option<f64>,
    /// Span of the offsets (GiB, default 10; at least 1 MiB is used).
    #[serde(default = "default_span_gb")]
    pub span_gb: f64,
    /// When the tenant starts issuing (s from the start of the run, default 0).
    #[serde(default)]
    pub start_s: f64,
    /// Stop (s); default the end of the run.
    pub stop_s: Option<f64>,
}

impl Default for WorkloadParams {
    /// A closed loop of 32 random 4 KiB reads over 10 GiB, from the start to the end.
    fn default() -> Self {
        WorkloadParams {
            kind: default_kind(),
            outstanding: None,
            outstanding_per_server: None,
            iops: None,
            think_ms: None,
            on_s: None,
            off_s: None,
            burst_count: None,
            burst_period_ms: None,
            trace: None,
            size_kb: None,
            read_pct: None,
            random_pct: None,
            span_gb: default_span_gb(),
            start_s: 0.0,
            stop_s: None,
        }
    }
}

/// A workload's kind as [`WorkloadParams::kind`] names it, before the kind's fields are checked: the
/// one place a kind's name is read ([`KindName::parse`]) or written ([`KindName::name`]). Validation
/// parses the name once, first, and decides everything after on this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindName {
    /// [`WorkloadKind::Closed`]: `closed`.
    Closed,
    /// [`WorkloadKind::Open`]: `open`.
    Open,
    /// [`WorkloadKind::OnOff`]: `on_off`.
    OnOff,
    /// [`WorkloadKind::Burst`]: `burst`.
    Burst,
    /// [`WorkloadKind::Trace`]: `trace`.
    Trace,
}

impl KindName {
    /// Every kind, in the order [`WorkloadError::UnknownKind`] lists them.
    pub const ALL: [KindName; 5] =
        [KindName::Closed, KindName::Open, KindName::OnOff, KindName::Burst, KindName::Trace];

    /// The name scenario files and `--job` write.
    pub fn name(self) -> &'static str {
        match self {
            KindName::Closed => "closed",
            KindName::Open => "open",
            KindName::OnOff => "on_off",
            KindName::Burst => "burst",
            KindName::Trace => "trace",
        }
    }

    /// Every kind's name, as [`WorkloadError::UnknownKind`] lists them: "closed, open, on_off, burst or
    /// trace".
    fn listed() -> String {
        let names = KindName::ALL.map(KindName::name);
        let (last, rest) = names.split_last().expect("five kinds");
        format!("{} or {last}", rest.join(", "))
    }

    /// The kind named exactly `name` (case and spelling as [`KindName::name`] writes it), if any.
    pub fn parse(name: &str) -> Option<KindName> {
        KindName::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether a workload of this kind keeps a closed window (`outstanding`): a closed one, or an on/off
    /// one without a rate (closed inside its on periods).
    fn keeps_window(self, has_rate: bool) -> bool {
        match self {
            KindName::Closed => true,
            KindName::OnOff => !has_rate,
            KindName::Open | KindName::Burst | KindName::Trace => false,
        }
    }

    /// The article before the name in a sentence ("an open workload", "a closed workload").
    fn article(self) -> &'static str {
        match self {
            KindName::Open | KindName::OnOff => "an",
            KindName::Closed | KindName::Burst | KindName::Trace => "a",
        }
    }
}

impl std::fmt::Display for KindName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What is wrong with a workload's parameters. Each names the field as its input writes it
/// ([`FieldNames`]: a scenario's `rate` is `iops`, `rein load --job`'s `rate`) and the value given.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A field given that the workload's kind does not use: refused, not ignored.
    #[error("{}", unused_text(.field, *.kind, .inner, *.key_value))]
    Unused {
        /// The field (for `--job`, its key: `depth` of `depth x conns`).
        field: &'static str,
        /// The kind.
        kind: KindName,
        /// What the kind does instead, where the message says it (an on/off workload's inner loop, a
        /// trace's records).
        inner: UnusedInner,
        /// `--job`'s key=value words (`depth= is not used by kind=open`) rather than a scenario's.
        key_value: bool,
    },
    /// A kind without a field it needs.
    #[error("{}", if *.key_value { format!("kind={kind} needs {field}=") } else { format!("{kind} workload needs {field}") })]
    Needs {
        /// The kind.
        kind: KindName,
        /// The field it needs.
        field: &'static str,
        /// `--job`'s key=value words.
        key_value: bool,
    },
    /// A time in seconds outside `[0, MAX_SECONDS]` (or not a number).
    #[error("{field} must be between 0 and {MAX_SECONDS} s, got {}", Num(*.got))]
    Seconds {
        /// The field.
        field: &'static str,
        /// The value given (s).
        got: f64,
    },
    /// A time in milliseconds outside `[0, MAX_SECONDS]` (or not a number).
    #[error("{field} must be between 0 and {} ms, got {}", Num(MAX_SECONDS * 1e3), Num(*.got))]
    Millis {
        /// The field.
        field: &'static str,
        /// The value given (ms).
        got: f64,
    },
    /// A value that must be positive (and finite) is not.
    #[error("{field} must be a positive number, got {}", Num(*.got))]
    NotPositive {
        /// The field.
        field: &'static str,
        /// The value given.
        got: f64,
    },
    /// A request size above [`MAX_SIZE_BYTES`].
    #[error("{field} must be at most 1 GiB, got {} GiB", Num(*.size_kb / (1 << 20) as f64))]
    SizeAboveBound {
        /// The field.
        field: &'static str,
        /// The size given (KiB).
        size_kb: f64,
    },
    /// A request size that rounds to no byte.
    #[error("{field} {} is less than one byte", Num(*.size_kb))]
    SizeBelowByte {
        /// The field.
        field: &'static str,
        /// The size given (KiB).
        size_kb: f64,
    },
    /// A rate the workload's own timing offers is above [`MAX_RATE_IOPS`].
    #[error("{what} {} is above the bound of {} IOPS", Num(*.iops), Num(MAX_RATE_IOPS))]
    RateAboveBound {
        /// What offers it: the field (`iops`), or how it comes about (`the rate burst_count /
        /// burst_period_ms`, a repeated trace's replay rate).
        what: String,
        /// The rate (IOPS).
        iops: f64,
    },
    /// A window or burst outside `1..=MAX_OUTSTANDING`.
    #[error("{field} must be in 1..={MAX_OUTSTANDING}, got {got}")]
    Window {
        /// The field.
        field: &'static str,
        /// The count given.
        got: u32,
    },
    /// Both a pooled window and per-server windows.
    #[error(
        "{outstanding} and {per_server} are both given: {per_server} keeps a window at each server instead of one \
         pool of {outstanding}; give one"
    )]
    BothWindows {
        /// The pooled window's field.
        outstanding: &'static str,
        /// The per-server windows' field.
        per_server: &'static str,
    },
    /// An on/off workload whose on period is no time.
    #[error("{field} must be positive")]
    NoOnTime {
        /// The on period's field.
        field: &'static str,
    },
    /// An on/off cycle shorter than [`MIN_CYCLE_S`].
    #[error("{on} + {off} must be at least {MIN_CYCLE_S} s (one on/off cycle), got {} s", Num(*.cycle_s))]
    CycleTooShort {
        /// The on period's field.
        on: &'static str,
        /// The off period's field.
        off: &'static str,
        /// The cycle given (s).
        cycle_s: f64,
    },
    /// A trace whose records would take the scenario's traces past their bound ([`MAX_SCENARIO_RECORDS`]).
    #[error(
        "trace {}: its {records} records bring the scenario's traces to {total} records, above the bound of {bound} \
         (32 bytes each; tenants naming one trace with the same format and devices share one copy)",
        .path.display()
    )]
    TraceRecordsAboveBound {
        /// The trace file.
        path: std::path::PathBuf,
        /// Its records.
        records: usize,
        /// The scenario's traces' records with it.
        total: usize,
        /// The bound.
        bound: usize,
    },
    /// A trace with no records (kept by the device filter, if any).
    #[error("trace {} has no records{}", .path.display(), no_records_filter(.devices))]
    NoRecords {
        /// The trace file.
        path: std::path::PathBuf,
        /// The devices kept (empty: all).
        devices: Vec<u32>,
    },
    /// A device to keep of which the trace has no record.
    #[error("trace.devices: device {device} has no records in {}", .path.display())]
    DeviceWithoutRecords {
        /// The device.
        device: u32,
        /// The trace file.
        path: std::path::PathBuf,
    },
    /// A repeated trace whose records are all at one instant (it would replay for ever there).
    #[error(
        "{repeat}: {}'s {records} records are all at one instant (at {time_scale_field} {}): a repeated trace needs \
         records that span time, or it replays for ever at that instant",
        .path.display(),
        Num(*.time_scale)
    )]
    RepeatAtOneInstant {
        /// The repeat field.
        repeat: &'static str,
        /// The trace file.
        path: std::path::PathBuf,
        /// Its records.
        records: usize,
        /// The time scale's field.
        time_scale_field: &'static str,
        /// The time scale given.
        time_scale: f64,
    },
    /// A kind that is none of the workload kinds.
    #[error(
        "{}: expected {}",
        if *.key_value { format!("kind={got}") } else { format!("workload kind {got:?}") },
        KindName::listed()
    )]
    UnknownKind {
        /// The kind given.
        got: String,
        /// `--job`'s key=value words.
        key_value: bool,
    },
    /// A percentage outside `[0, 100]`.
    #[error("{field} must be in [0, 100], got {}", Num(*.got))]
    Percent {
        /// The field.
        field: &'static str,
        /// The value given.
        got: f64,
    },
    /// A start at or after the run's end (the workload would issue nothing).
    #[error("{field} must be before the run's end ({} s), got {}", Num(*.duration_s), Num(*.got))]
    StartAfterEnd {
        /// The start's field.
        field: &'static str,
        /// The run's length (s).
        duration_s: f64,
        /// The start given (s).
        got: f64,
    },
    /// A stop at or before the start.
    #[error("{stop} must be after {start}")]
    StopBeforeStart {
        /// The stop's field.
        stop: &'static str,
        /// The start's field.
        start: &'static str,
    },
    /// The trace could not be read or parsed.
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
}

/// What an unused field's message says the kind does instead ([`WorkloadError::Unused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnusedInner {
    /// Nothing more.
    None,
    /// An on/off workload open inside its on periods: it has this rate field.
    OpenOnOff {
        /// The rate's field.
        rate: &'static str,
    },
    /// An on/off workload closed inside its on periods: it has no rate field.
    ClosedOnOff {
        /// The rate's field.
        rate: &'static str,
    },
    /// A trace: its records give each request's size, operation and offset.
    Trace,
}

impl std::fmt::Display for UnusedInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnusedInner::None => Ok(()),
            UnusedInner::OpenOnOff { rate } => write!(f, " (open inside its on periods: it has {rate})"),
            UnusedInner::ClosedOnOff { rate } => write!(f, " (closed inside its on periods: it has no {rate})"),
            UnusedInner::Trace => f.write_str(" (its records give each request's size, operation and offset)"),
        }
    }
}

/// [`WorkloadError::Unused`]'s message.
fn unused_text(field: &str, kind: KindName, inner: &UnusedInner, key_value: bool) -> String {
    if key_value {
        format!("{field}= is not used by kind={kind}{inner}")
    } else {
        let a = kind.article();
        format!("{field} is not used by {a} {kind} workload{inner}: remove it, or change the kind")
    }
}

/// [`WorkloadError::NoRecords`]'s note: the device filter is named only when there is one (`(device
/// filter [])` read as a setting to look for to an operator whose trace file was simply empty).
fn no_records_filter(devices: &[u32]) -> String {
    if devices.is_empty() {
        " (the file holds no request lines)".to_string()
    } else {
        format!(" (device filter {devices:?})")
    }
}

/// How the file or command line a workload came from writes its fields, so that an error names what its
/// user wrote: a scenario's `[tenants.workload]` ([`FieldNames::SCENARIO`]) or `rein load`'s `--job`
/// ([`FieldNames::JOB`]). [`WorkloadParams::validate_as`] checks the one set of rules and words its errors
/// with these names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldNames {
    /// Key=value (`kind=open needs rate=`) rather than TOML (`open workload needs iops`).
    pub key_value: bool,
    /// [`WorkloadParams::outstanding`].
    pub outstanding: &'static str,
    /// [`WorkloadParams::outstanding_per_server`].
    pub outstanding_per_server: &'static str,
    /// [`WorkloadParams::iops`].
    pub iops: &'static str,
    /// [`WorkloadParams::think_ms`].
    pub think_ms: &'static str,
    /// [`WorkloadParams::on_s`].
    pub on_s: &'static str,
    /// [`WorkloadParams::off_s`].
    pub off_s: &'static str,
    /// [`WorkloadParams::burst_count`].
    pub burst_count: &'static str,
    /// [`WorkloadParams::burst_period_ms`].
    pub burst_period_ms: &'static str,
    /// [`WorkloadParams::trace`].
    pub trace: &'static str,
    /// [`TraceParams::time_scale`].
    pub time_scale: &'static str,
    /// [`TraceParams::repeat`].
    pub repeat: &'static str,
    /// [`WorkloadParams::size_kb`].
    pub size: &'static str,
    /// [`WorkloadParams::read_pct`].
    pub read_pct: &'static str,
    /// [`WorkloadParams::random_pct`].
    pub random_pct: &'static str,
    /// [`WorkloadParams::span_gb`].
    pub span_gb: &'static str,
    /// [`WorkloadParams::start_s`].
    pub start_s: &'static str,
    /// [`WorkloadParams::stop_s`].
    pub stop_s: &'static str,
}

impl FieldNames {
    /// A scenario's `[tenants.workload]`: the fields' own names.
    pub const SCENARIO: FieldNames = FieldNames {
        key_value: false,
        outstanding: "outstanding",
        outstanding_per_server: "outstanding_per_server",
        iops: "iops",
        think_ms: "think_ms",
        on_s: "on_s",
        off_s: "off_s",
        burst_count: "burst_count",
        burst_period_ms: "burst_period_ms",
        trace: "[tenants.workload.trace]",
        time_scale: "trace.time_scale",
        repeat: "trace.repeat",
        size: "size_kb",
        read_pct: "read_pct",
        random_pct: "random_pct",
        span_gb: "span_gb",
        start_s: "start_s",
        stop_s: "stop_s",
    };
    /// `rein load --job`'s keys (its `depth` per connection times `conns` fills `outstanding`).
    pub const JOB: FieldNames = FieldNames {
        key_value: true,
        outstanding: "depth x conns",
        outstanding_per_server: "outstanding_per_server",
        iops: "rate",
        think_ms: "think",
        on_s: "on",
        off_s: "off",
        burst_count: "burst",
        burst_period_ms: "period",
        trace: "trace",
        time_scale: "time_scale",
        repeat: "repeat",
        size: "size",
        read_pct: "read",
        random_pct: "random",
        span_gb: "span",
        start_s: "start",
        stop_s: "stop",
    };

    /// A field given that the kind does not use (`open_inner`: an on/off workload with a rate, open
    /// inside its on periods).
    fn unused(&self, kind: KindName, field: &'static str, open_inner: bool) -> WorkloadError {
        let rate = self.iops;
        let inner = match (kind, open_inner) {
            (KindName::OnOff, true) => UnusedInner::OpenOnOff { rate },
            (KindName::OnOff, false) => UnusedInner::ClosedOnOff { rate },
            (KindName::Trace, _) => UnusedInner::Trace,
            (KindName::Closed | KindName::Open | KindName::Burst, _) => UnusedInner::None,
        };
        // For --job, the key itself: `depth`, of the window's `depth x conns`.
        let field = if self.key_value { field.split(' ').next().unwrap_or(field) } else { field };
        WorkloadError::Unused { field, kind, inner, key_value: self.key_value }
    }

    /// A kind that misses a field it needs.
    fn needs(&self, kind: KindName, field: &'static str) -> WorkloadError {
        WorkloadError::Needs { kind, field, key_value: self.key_value }
    }
}

fn secs(field: &'static str, v: f64) -> Result<Nanos, WorkloadError> {
    if !v.is_finite() || !(0.0..=MAX_SECONDS).contains(&v) {
        return Err(WorkloadError::Seconds { field, got: v });
    }
    Ok(Nanos::from_secs_f64(v))
}

/// A time written in milliseconds (`think_ms`, `burst_period_ms`), its error in milliseconds too.
fn millis(field: &'static str, v: f64) -> Result<Nanos, WorkloadError> {
    if !v.is_finite() || !(0.0..=MAX_SECONDS * 1e3).contains(&v) {
        return Err(WorkloadError::Millis { field, got: v });
    }
    Ok(Nanos::from_secs_f64(v / 1e3))
}

fn positive(field: &'static str, v: f64) -> Result<f64, WorkloadError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(WorkloadError::NotPositive { field, got: v })
    }
}

/// A request size of `size_kb` KiB (the key `field`) in bytes: positive, at least one byte once rounded,
/// at most [`MAX_SIZE_BYTES`]. Every way a scenario sizes requests goes through here (a workload's
/// `size_kb`, pShift's generated buckets).
pub fn request_size_bytes(field: &'static str, size_kb: f64) -> Result<u64, WorkloadError> {
    let size = positive(field, size_kb)?;
    if size > (MAX_SIZE_BYTES / 1024) as f64 {
        return Err(WorkloadError::SizeAboveBound { field, size_kb: size });
    }
    let bytes = (size * 1024.0).round();
    if bytes < 1.0 {
        return Err(WorkloadError::SizeBelowByte { field, size_kb: size });
    }
    Ok(bytes as u64)
}

/// A rate a workload's own timing offers (`what` names it) is at most [`MAX_RATE_IOPS`] (an infinite
/// one, from a period that rounds to no time, is over it). Public for workloads made elsewhere (pShift's
/// generated buckets), which keep to the same bound.
pub fn within_rate(what: &str, iops: f64) -> Result<(), WorkloadError> {
    if iops <= MAX_RATE_IOPS {
        return Ok(());
    }
    Err(WorkloadError::RateAboveBound { what: what.to_string(), iops })
}

/// A window or burst of `n` requests: 1..=[`MAX_OUTSTANDING`].
fn window(field: &'static str, n: u32) -> Result<u32, WorkloadError> {
    if n == 0 || n > MAX_OUTSTANDING {
        return Err(WorkloadError::Window { field, got: n });
    }
    Ok(n)
}

/// Most trace records one scenario may hold in all, over its distinct traces (each loaded once:
/// [`TraceCache`]): twenty million [`TraceRecord`]s take 640 MB.
pub const MAX_SCENARIO_RECORDS: usize = 2 * crate::trace::MAX_RECORDS;

/// The traces a scenario's workloads have loaded, so that tenants naming one file with the same format
/// and device filter share one copy of its records (seventy tenants on one 50 MB trace read and held it
/// seventy times, gigabytes), and the records of all its traces together are bounded by
/// [`MAX_SCENARIO_RECORDS`]. One per scenario: [`WorkloadParams::validate_shared`].
#[derive(Debug)]
pub struct TraceCache {
    /// (file, format, devices kept) and its records.
    loaded: Vec<(TraceKey, Arc<Vec<TraceRecord>>)>,
    /// Records over every entry of `loaded`.
    records: usize,
    /// The most `records` may reach ([`MAX_SCENARIO_RECORDS`]).
    bound: usize,
}

impl Default for TraceCache {
    fn default() -> TraceCache {
        TraceCache::with_bound(MAX_SCENARIO_RECORDS)
    }
}

/// What makes two loads of a trace the same: the file (canonical where it can be resolved), its format
/// and the devices kept.
#[derive(Debug, PartialEq, Eq)]
struct TraceKey {
    path: std::path::PathBuf,
    format: crate::trace::TraceFormat,
    devices: Vec<u32>,
}

impl TraceCache {
    /// An empty cache.
    pub fn new() -> TraceCache {
        TraceCache::default()
    }

    /// An empty cache holding at most `bound` records (the tests' smaller bound).
    fn with_bound(bound: usize) -> TraceCache {
        TraceCache { loaded: Vec::new(), records: 0, bound }
    }

    /// Records held, over every distinct trace loaded.
    pub fn records(&self) -> usize {
        self.records
    }

    /// The records of `path` (as `format`, keeping `devices`): loaded once, shared after. A load that
    /// would take the total past [`MAX_SCENARIO_RECORDS`] is an error naming the file and the total.
    fn load(
        &mut self,
        path: &Path,
        format: crate::trace::TraceFormat,
        devices: &[u32],
    ) -> Result<Arc<Vec<TraceRecord>>, WorkloadError> {
        let key = TraceKey {
            path: std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
            format,
            devices: devices.to_vec(),
        };
        if let Some((_, records)) = self.loaded.iter().find(|(k, _)| *k == key) {
            return Ok(Arc::clone(records));
        }
        let records = crate::trace::load(path, format, devices)?;
        let total = self.records.saturating_add(records.len());
        if total > self.bound {
            return Err(WorkloadError::TraceRecordsAboveBound {
                path: path.to_path_buf(),
                records: records.len(),
                total,
                bound: self.bound,
            });
        }
        self.records = total;
        let records = Arc::new(records);
        self.loaded.push((key, Arc::clone(&records)));
        Ok(records)
    }
}

impl WorkloadParams {
    /// Validates into a [`WorkloadSpec`], errors naming a scenario's fields ([`FieldNames::SCENARIO`]);
    /// `duration` is the run's length (the default stop), `base` the directory relative trace paths
    /// resolve against, `devices` the trace device numbers to keep (empty: all), as the caller resolved
    /// them from `trace.device`, `trace.devices` or its routing.
    pub fn validate(
        &self,
        duration: Nanos,
        base: Option<&Path>,
        devices: &[u32],
    ) -> Result<WorkloadSpec, WorkloadError> {
        self.validate_as(duration, base, devices, &FieldNames::SCENARIO)
    }

    /// [`WorkloadParams::validate`] for one of several workloads of a scenario: a trace is loaded through
    /// `traces`, shared with the scenario's other workloads that name it, and bounded with them.
    pub fn validate_shared(
        &self,
        duration: Nanos,
        base: Option<&Path>,
        devices: &[u32],
        traces: &mut TraceCache,
    ) -> Result<WorkloadSpec, WorkloadError> {
        self.validate_in(duration, base, devices, &FieldNames::SCENARIO, traces)
    }

    /// Whether the workload as written keeps a closed window (`outstanding`): a closed one, or an on/off
    /// one without a rate (closed inside its on periods). Its other kinds refuse a window.
    pub fn keeps_window(&self) -> bool {
        KindName::parse(&self.kind).is_some_and(|kind| kind.keeps_window(self.iops.is_some()))
    }

    /// [`WorkloadParams::validate`], errors naming the fields as `names` says their input writes them.
    pub fn validate_as(
        &self,
        duration: Nanos,
        base: Option<&Path>,
        devices: &[u32],
        names: &FieldNames,
    ) -> Result<WorkloadSpec, WorkloadError> {
        self.validate_in(duration, base, devices, names, &mut TraceCache::new())
    }

    /// [`WorkloadParams::validate_as`], loading a trace through `traces`.
    fn validate_in(
        &self,
        duration: Nanos,
        base: Option<&Path>,
        devices: &[u32],
        names: &FieldNames,
        traces: &mut TraceCache,
    ) -> Result<WorkloadSpec, WorkloadError> {
        // The kind, parsed once: every decision below is on it. An unknown one is refused first, with
        // the kind as written.
        let Some(kind_name) = KindName::parse(&self.kind) else {
            return Err(WorkloadError::UnknownKind { got: self.kind.clone(), key_value: names.key_value });
        };
        let closed = || -> Result<OnOffInner, WorkloadError> {
            let outstanding = window(names.outstanding, self.outstanding.unwrap_or(DEFAULT_OUTSTANDING))?;
            let think = millis(names.think_ms, self.think_ms.unwrap_or(0.0))?;
            match self.outstanding_per_server {
                Some(_) if self.outstanding.is_some() => Err(WorkloadError::BothWindows {
                    outstanding: names.outstanding,
                    per_server: names.outstanding_per_server,
                }),
                None => Ok(OnOffInner::Closed { outstanding, think, per_server: false }),
                Some(k) => Ok(OnOffInner::Closed {
                    outstanding: window(names.outstanding_per_server, k)?,
                    think,
                    per_server: true,
                }),
            }
        };
        let open = || -> Result<OnOffInner, WorkloadError> {
            let iops = self.iops.ok_or_else(|| names.needs(kind_name, names.iops))?;
            let iops = positive(names.iops, iops)?;
            within_rate(names.iops, iops)?;
            Ok(OnOffInner::Open { iops })
        };
        // A field the kind does not use is refused, not ignored ("a typo never passes silently").
        let open_inner = self.iops.is_some();
        let used: &[&str] = match kind_name {
            KindName::Closed => &["outstanding", "outstanding_per_server", "think_ms"],
            KindName::Open => &["iops"],
            KindName::OnOff if kind_name.keeps_window(open_inner) => {
                &["on_s", "off_s", "outstanding", "outstanding_per_server", "think_ms"]
            }
            KindName::OnOff => &["on_s", "off_s", "iops"],
            KindName::Burst => &["burst_count", "burst_period_ms"],
            KindName::Trace => &["trace"],
        };
        let given = [
            ("outstanding", names.outstanding, self.outstanding.is_some()),
            ("outstanding_per_server", names.outstanding_per_server, self.outstanding_per_server.is_some()),
            ("think_ms", names.think_ms, self.think_ms.is_some()),
            ("iops", names.iops, self.iops.is_some()),
            ("on_s", names.on_s, self.on_s.is_some()),
            ("off_s", names.off_s, self.off_s.is_some()),
            ("burst_count", names.burst_count, self.burst_count.is_some()),
            ("burst_period_ms", names.burst_period_ms, self.burst_period_ms.is_some()),
            ("trace", names.trace, self.trace.is_some()),
            ("size_kb", names.size, self.size_kb.is_some()),
            ("read_pct", names.read_pct, self.read_pct.is_some()),
            ("random_pct", names.random_pct, self.random_pct.is_some()),
        ];
        // Every kind but a trace generates its requests from these.
        let generated = ["size_kb", "read_pct", "random_pct"];
        let uses = |field: &str| used.contains(&field) || (kind_name != KindName::Trace && generated.contains(&field));
        if let Some((_, name, _)) = given.iter().find(|(field, _, given)| *given && !uses(field)) {
            return Err(names.unused(kind_name, name, open_inner));
        }
        let kind = match kind_name {
            KindName::Closed => closed()?.kind(),
            KindName::Open => open()?.kind(),
            KindName::OnOff => {
                let on = secs(names.on_s, self.on_s.ok_or_else(|| names.needs(kind_name, names.on_s))?)?;
                let off = secs(names.off_s, self.off_s.ok_or_else(|| names.needs(kind_name, names.off_s))?)?;
                if on == Nanos::ZERO {
                    return Err(WorkloadError::NoOnTime { field: names.on_s });
                }
                if on.saturating_add(off) < Nanos::from_secs_f64(MIN_CYCLE_S) {
                    return Err(WorkloadError::CycleTooShort {
                        on: names.on_s,
                        off: names.off_s,
                        cycle_s: on.saturating_add(off).as_secs_f64(),
                    });
                }
                let inner = if self.iops.is_some() { open()? } else { closed()? };
                WorkloadKind::OnOff { on, off, inner }
            }
            KindName::Burst => {
                let count = self.burst_count.ok_or_else(|| names.needs(kind_name, names.burst_count))?;
                let count = window(names.burst_count, count)?;
                let p = self.burst_period_ms.ok_or_else(|| names.needs(kind_name, names.burst_period_ms))?;
                let period = millis(names.burst_period_ms, positive(names.burst_period_ms, p)?)?;
                let what = format!("the rate {} / {}", names.burst_count, names.burst_period_ms);
                within_rate(&what, count as f64 / period.as_secs_f64())?;
                WorkloadKind::Burst { count, period }
            }
            KindName::Trace => {
                let t = self.trace.as_ref().ok_or_else(|| names.needs(kind_name, names.trace))?;
                positive(names.time_scale, t.time_scale)?;
                let mut path = std::path::PathBuf::from(&t.path);
                if path.is_relative() {
                    if let Some(b) = base {
                        path = b.join(path);
                    }
                }
                let fmt = crate::trace::TraceFormat::resolve(t.format.as_deref(), &path)?;
                let records = traces.load(&path, fmt, devices)?;
                if records.is_empty() {
                    return Err(WorkloadError::NoRecords { path, devices: devices.to_vec() });
                }
                if let Some(&device) = devices.iter().find(|&&d| !records.iter().any(|r| r.device == d)) {
                    return Err(WorkloadError::DeviceWithoutRecords { device, path });
                }
                if t.repeat {
                    // A pass lasts the scaled span plus one mean gap (Generator::next_arrival); a pass of
                    // no time would replay for ever at one instant.
                    let n = records.len() as f64;
                    let span = records[records.len() - 1].t_ns as f64 * t.time_scale / 1e9;
                    let pass = span + span / n;
                    if pass <= 0.0 {
                        return Err(WorkloadError::RepeatAtOneInstant {
                            repeat: names.repeat,
                            path,
                            records: records.len(),
                            time_scale_field: names.time_scale,
                            time_scale: t.time_scale,
                        });
                    }
                    let what = format!(
                        "{}: the replay rate of {} ({} records every {} s at {} {})",
                        names.repeat,
                        path.display(),
                        records.len(),
                        Num(pass),
                        names.time_scale,
                        Num(t.time_scale)
                    );
                    within_rate(&what, n / pass)?;
                }
                WorkloadKind::Trace { records, time_scale: t.time_scale, repeat: t.repeat }
            }
        };
        let (size_kb, read_pct, random_pct) = (
            self.size_kb.unwrap_or_else(default_size_kb),
            self.read_pct.unwrap_or_else(default_pct),
            self.random_pct.unwrap_or_else(default_pct),
        );
        let size_bytes = request_size_bytes(names.size, size_kb)?;
        for (f, v) in [(names.read_pct, read_pct), (names.random_pct, random_pct)] {
            if !(0.0..=100.0).contains(&v) {
                return Err(WorkloadError::Percent { field: f, got: v });
            }
        }
        let span = positive(names.span_gb, self.span_gb)?;
        let start = secs(names.start_s, self.start_s)?;
        // A workload that starts when the run is over would issue nothing: a mistake, not a choice.
        if duration <= start {
            return Err(WorkloadError::StartAfterEnd {
                field: names.start_s,
                duration_s: duration.as_secs_f64(),
                got: self.start_s,
            });
        }
        let stop = match self.stop_s {
            None => duration,
            Some(s) => secs(names.stop_s, s)?,
        };
        if stop <= start {
            return Err(WorkloadError::StopBeforeStart { stop: names.stop_s, start: names.start_s });
        }
        Ok(WorkloadSpec {
            kind,
            size_bytes,
            read_frac: read_pct / 100.0,
            random_frac: random_pct / 100.0,
            span_bytes: ((span * (1u64 << 30) as f64) as u64).max(1 << 20),
            start,
            stop,
        })
    }
}

/// What starting (or resuming after an off period) asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// Issue [`Generator::deficit`]`(spec, None)` requests now, routed as the caller routes.
    Fill,
    /// For every server k, issue [`Generator::deficit`]`(spec, Some(k))` requests to server k now.
    FillPerServer,
    /// Call [`Generator::arrival`] at this time.
    ArriveAt(Nanos),
}

/// What an arrival issues.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    /// `n` generated requests (draw each with [`Generator::next_io`]).
    Generated(u32),
    /// One trace record.
    Record(TraceRecord),
}

/// A generated request's offset and direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Io {
    /// Byte offset.
    pub offset: u64,
    /// A read (else a write).
    pub read: bool,
}

/// What a completion asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reissue {
    /// Nothing (not a closed loop, or stopped).
    No,
    /// Issue a replacement now, to this server of the tenant's list (per-server window) or routed.
    Now(Option<usize>),
    /// Issue a replacement at this time (think time), if the generator still runs then.
    At(Nanos, Option<usize>),
}

/// Closed-loop mode, packed in a byte of the hot line.
const OPEN: u8 = 0;
const POOL: u8 = 1;
const PER_SERVER: u8 = 2;
/// Mask of the mode bits, and the bit saying completions wait `think`.
const MODE: u8 = 3;
const THINKS: u8 = 4;
/// The read mix, packed in a byte of the hot line.
const ALL_READS: u8 = 0;
const NO_READS: u8 = 1;
const MIXED: u8 = 2;

/// One tenant's generator state (module comment). Everything a closed-loop completion and its
/// replacement touch is in one 64-byte line: with thousands of tenants every completion lands on a cold
/// tenant, and a simulator keeps tens of thousands of these next to its own per-tenant state. The rest
/// (think time, per-server windows, the read-mix stream, trace position) is behind one pointer, read only
/// by workloads that use it.
#[repr(C, align(64))]
#[derive(Debug, Clone)]
pub struct Generator {
    rng: Pcg64Mcg,
    next_seq_offset: u64,
    /// Request-sized slots in the span (at least 1): where random offsets fall, and where sequential ones
    /// wrap. Computed once; `next_io` would otherwise divide on every request.
    slots: u64,
    random_frac: f64,
    cold: Box<Cold>,
    /// At most [`MAX_SIZE_BYTES`].
    size_bytes: u32,
    in_flight: u32,
    active: bool,
    on: bool,
    /// OPEN, POOL or PER_SERVER; THINKS added when completions wait a think time.
    closed: u8,
    /// ALL_READS, NO_READS or MIXED.
    reads: u8,
}

/// The generator's state that the common path never reads.
#[derive(Debug, Clone)]
struct Cold {
    think: Nanos,
    outstanding: u32,
    read_frac: f64,
    read_state: u64,
    trace_pos: usize,
    trace_base: Nanos,
}

impl Generator {
    /// A stopped generator for `spec`, drawing from the PCG stream seeded by `seed` (see [`crate::seed`]).
    pub fn new(spec: &WorkloadSpec, seed: u128) -> Generator {
        let (closed, outstanding, think) = match &spec.kind {
            WorkloadKind::Closed { outstanding, think, per_server }
            | WorkloadKind::OnOff { inner: OnOffInner::Closed { outstanding, think, per_server }, .. } => {
                (if *per_server { PER_SERVER } else { POOL }, *outstanding, *think)
            }
            _ => (OPEN, 0, Nanos::ZERO),
        };
        assert!(spec.size_bytes <= MAX_SIZE_BYTES, "validated: sizes are at most 1 GiB");
        Generator {
            rng: Pcg64Mcg::new(seed),
            next_seq_offset: 0,
            slots: (spec.span_bytes / spec.size_bytes.max(1)).max(1),
            random_frac: spec.random_frac,
            cold: Box::new(Cold {
                think,
                outstanding,
                read_frac: spec.read_frac,
                // An independent stream for the read mix (module comment).
                read_state: (seed as u64) ^ ((seed >> 64) as u64).rotate_left(17) ^ 0x5E_ED0F_4EAD,
                trace_pos: 0,
                trace_base: Nanos::ZERO,
            }),
            size_bytes: spec.size_bytes as u32,
            in_flight: 0,
            active: false,
            on: false,
            closed: closed | if think > Nanos::ZERO { THINKS } else { 0 },
            reads: if spec.read_frac >= 1.0 {
                ALL_READS
            } else if spec.read_frac <= 0.0 {
                NO_READS
            } else {
                MIXED
            },
        }
    }

    /// The size of generated requests (bytes).
    #[inline]
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes as u64
    }

    /// Requests issued and not yet completed or failed.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Whether the generator issues requests now (started, not stopped, in an on period).
    #[inline]
    pub fn is_running(&self) -> bool {
        self.active && self.on
    }

    /// Starts at `now`; then call [`Generator::begin`]. Returns when an on_off workload first toggles.
    pub fn start(&mut self, now: Nanos, spec: &WorkloadSpec) -> Option<Nanos> {
        self.active = true;
        self.on = true;
        self.cold.trace_base = now;
        match &spec.kind {
            WorkloadKind::OnOff { on, .. } => Some(now.saturating_add(*on)),
            _ => None,
        }
    }

    /// Stops issuing (requests in flight still complete).
    pub fn stop(&mut self) {
        self.active = false;
    }

    /// What to do on starting or resuming at `now`.
    pub fn begin(&self, now: Nanos, spec: &WorkloadSpec) -> Begin {
        match &spec.kind {
            WorkloadKind::Closed { per_server: false, .. }
            | WorkloadKind::OnOff { inner: OnOffInner::Closed { per_server: false, .. }, .. } => Begin::Fill,
            WorkloadKind::Closed { per_server: true, .. }
            | WorkloadKind::OnOff { inner: OnOffInner::Closed { per_server: true, .. }, .. } => Begin::FillPerServer,
            WorkloadKind::Open { .. }
            | WorkloadKind::OnOff { inner: OnOffInner::Open { .. }, .. }
            | WorkloadKind::Burst { .. } => Begin::ArriveAt(now),
            WorkloadKind::Trace { records, .. } => Begin::ArriveAt(now.saturating_add(Nanos(records[0].t_ns))),
        }
    }

    /// Requests missing from a closed window: in the pool (`at_server` None), or at a server where the
    /// caller has `at_server` requests in flight (per-server windows: the gateway counts what it has at
    /// each server, the workload says how many it wants there).
    pub fn deficit(&self, at_server: Option<u32>) -> u32 {
        self.cold.outstanding.saturating_sub(at_server.unwrap_or(self.in_flight))
    }

    /// An on_off toggle fires at `now`: returns when the next one is due and whether the workload is now
    /// on (then call [`Generator::begin`]). `None` if the generator was stopped (no more toggles).
    pub fn toggle(&mut self, now: Nanos, spec: &WorkloadSpec) -> Option<(Nanos, bool)> {
        if !self.active {
            return None;
        }
        let WorkloadKind::OnOff { on, off, .. } = &spec.kind else { return None };
        self.on = !self.on;
        Some((now.saturating_add(if self.on { *on } else { *off }), self.on))
    }

    /// An arrival is due: what to issue, or `None` if the generator does not run now.
    pub fn arrival(&self, spec: &WorkloadSpec) -> Option<Arrival> {
        if !self.is_running() {
            return None;
        }
        match &spec.kind {
            WorkloadKind::Open { .. } | WorkloadKind::OnOff { inner: OnOffInner::Open { .. }, .. } => {
                Some(Arrival::Generated(1))
            }
            WorkloadKind::Burst { count, .. } => Some(Arrival::Generated(*count)),
            WorkloadKind::Trace { records, .. } => records.get(self.cold.trace_pos).map(|r| Arrival::Record(*r)),
            WorkloadKind::Closed { .. } | WorkloadKind::OnOff { inner: OnOffInner::Closed { .. }, .. } => None,
        }
    }

    /// After issuing what [`Generator::arrival`] asked at `now`: when the next arrival is due (`None`: the
    /// trace has ended). Draws the Poisson gap of an open workload.
    pub fn next_arrival(&mut self, now: Nanos, spec: &WorkloadSpec) -> Option<Nanos> {
        match &spec.kind {
            WorkloadKind::Open { iops } | WorkloadKind::OnOff { inner: OnOffInner::Open { iops }, .. } => {
                Some(now.saturating_add(poisson_gap(&mut self.rng, *iops)))
            }
            WorkloadKind::Burst { period, .. } => Some(now.saturating_add(*period)),
            WorkloadKind::Trace { records, time_scale, repeat } => {
                let scale = *time_scale;
                let cold = &mut self.cold;
                let mut next = cold.trace_pos + 1;
                if next >= records.len() {
                    if !repeat {
                        cold.trace_pos = next;
                        return None;
                    }
                    next = 0;
                    // The replay restarts one mean gap after the last record.
                    let span = Nanos::from_secs_f64(records[records.len() - 1].t_ns as f64 * scale / 1e9);
                    // At least 1 ns a pass, so time moves even for a spec validation did not see.
                    let gap = Nanos((span.0 / records.len().max(1) as u64).max(1));
                    cold.trace_base = cold.trace_base.saturating_add(span).saturating_add(gap);
                }
                cold.trace_pos = next;
                let at = cold.trace_base.saturating_add(Nanos::from_secs_f64(records[next].t_ns as f64 * scale / 1e9));
                Some(at.max(now))
            }
            WorkloadKind::Closed { .. } | WorkloadKind::OnOff { inner: OnOffInner::Closed { .. }, .. } => None,
        }
    }

    /// Draws a generated request's offset and direction (its size is [`Generator::size_bytes`]).
    #[inline]
    pub fn next_io(&mut self) -> Io {
        let random = self.random_frac >= 1.0 || (self.random_frac > 0.0 && self.rng.gen::<f64>() < self.random_frac);
        let (size, slots) = (self.size_bytes as u64, self.slots);
        let offset = if random { self.rng.gen_range(0..slots) * size } else { self.next_seq_offset % (slots * size) };
        self.next_seq_offset = offset + size;
        let read = match self.reads {
            ALL_READS => true,
            NO_READS => false,
            _ => self.draw_read(),
        };
        Io { offset, read }
    }

    /// A read with probability `read_frac`, from the read-mix stream (splitmix64).
    fn draw_read(&mut self) -> bool {
        let cold = &mut self.cold;
        let x = crate::seed::splitmix64(&mut cold.read_state);
        ((x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)) < cold.read_frac
    }

    /// A uniform draw in [0, 1) from the tenant's stream (for the caller's routing by shares).
    #[inline]
    pub fn uniform(&mut self) -> f64 {
        self.rng.gen()
    }

    /// A request was issued.
    #[inline]
    pub fn issued(&mut self) {
        self.in_flight += 1;
    }

    #[inline]
    fn retire(&mut self) {
        debug_assert!(self.in_flight > 0, "invariant 1");
        self.in_flight -= 1;
    }

    /// A request issued to server `server` completed at `now`: whether and when to replace it.
    #[inline]
    pub fn completed(&mut self, now: Nanos, server: usize) -> Reissue {
        self.retire();
        if !self.is_running() || self.closed & MODE == OPEN {
            return Reissue::No;
        }
        let k = (self.closed & MODE == PER_SERVER).then_some(server);
        if self.closed & THINKS != 0 {
            Reissue::At(now.saturating_add(self.cold.think), k)
        } else {
            Reissue::Now(k)
        }
    }

    /// A request failed (refused): counted, not replaced.
    pub fn failed(&mut self) {
        self.retire();
    }
}

/// An exponential inter-arrival gap at `rate` per second (at least 1 ns): Poisson arrivals.
#[inline]
pub fn poisson_gap(rng: &mut Pcg64Mcg, rate: f64) -> Nanos {
    let u: f64 = rng.gen();
    Nanos::from_secs_f64(-(1.0 - u).ln() / rate).max(Nanos(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: WorkloadKind) -> WorkloadSpec {
        WorkloadSpec {
            kind,
            size_bytes: 4096,
            read_frac: 1.0,
            random_frac: 1.0,
            span_bytes: 1 << 30,
            start: Nanos::ZERO,
            stop: Nanos::from_secs(10),
        }
    }

    #[test]
    fn the_generator_is_one_cache_line() {
        // rng, seq offset, slots, random fraction, the cold pointer, size, in-flight count and flags.
        assert_eq!(std::mem::size_of::<Generator>(), 64);
        assert_eq!(std::mem::align_of::<Generator>(), 64);
    }

    #[test]
    fn a_closed_pool_refills_and_replaces() {
        let s = spec(WorkloadKind::Closed { outstanding: 3, think: Nanos::ZERO, per_server: false });
        let mut g = Generator::new(&s, 1);
        assert_eq!(g.start(Nanos(0), &s), None);
        assert_eq!(g.begin(Nanos(0), &s), Begin::Fill);
        assert_eq!(g.deficit(None), 3);
        for _ in 0..3 {
            g.next_io();
            g.issued();
        }
        assert_eq!(g.deficit(None), 0);
        assert_eq!(g.completed(Nanos(5), 1), Reissue::Now(None));
        g.issued();
        g.failed();
        assert_eq!(g.in_flight(), 2);
        g.stop();
        assert_eq!(g.completed(Nanos(6), 0), Reissue::No);
    }

    #[test]
    fn per_server_windows_and_think_time() {
        let s = spec(WorkloadKind::Closed { outstanding: 2, think: Nanos(100), per_server: true });
        let mut g = Generator::new(&s, 1);
        g.start(Nanos(0), &s);
        assert_eq!(g.begin(Nanos(0), &s), Begin::FillPerServer);
        // The caller counts per server.
        let mut at = [0u32; 3];
        for (k, n) in at.iter_mut().enumerate() {
            for _ in 0..g.deficit(Some(*n)) {
                g.issued();
                *n += 1;
            }
            assert_eq!(*n, 2, "server {k}");
        }
        assert_eq!(g.in_flight(), 6);
        assert_eq!(g.deficit(Some(at[2])), 0);
        assert_eq!(g.completed(Nanos(7), 2), Reissue::At(Nanos(107), Some(2)));
        at[2] -= 1;
        assert_eq!(g.deficit(Some(at[2])), 1);
    }

    /// While on, an on_off workload is its inner loop: the generator begins, arrives, fills its window and
    /// draws its gaps as for the plain kind ([`OnOffInner::kind`]), for every inner there is. (Its inner
    /// was a `WorkloadKind`, and an on_off there made [`Generator::begin`] panic; the type now has no
    /// such case.)
    #[test]
    fn an_on_off_runs_as_its_inner_loop() {
        let inners = [
            OnOffInner::Open { iops: 250.0 },
            OnOffInner::Closed { outstanding: 5, think: Nanos::ZERO, per_server: false },
            OnOffInner::Closed { outstanding: 3, think: Nanos(7), per_server: true },
        ];
        for inner in inners {
            let on_off = spec(WorkloadKind::OnOff { on: Nanos::from_secs(1), off: Nanos::from_secs(1), inner });
            let plain = spec(inner.kind());
            assert_eq!(on_off.kind.open_loop(), plain.kind.open_loop(), "{inner:?}");
            assert_eq!(on_off.kind.issued_within(Nanos(1000)), plain.kind.issued_within(Nanos(1000)), "{inner:?}");
            let (mut a, mut b) = (Generator::new(&on_off, 5), Generator::new(&plain, 5));
            assert_eq!(a.start(Nanos(3), &on_off), Some(Nanos(3).saturating_add(Nanos::from_secs(1))));
            assert_eq!(b.start(Nanos(3), &plain), None);
            assert_eq!(a.begin(Nanos(3), &on_off), b.begin(Nanos(3), &plain), "{inner:?}");
            assert_eq!(a.deficit(None), b.deficit(None), "{inner:?}");
            let mut t = Nanos(3);
            for _ in 0..10 {
                assert_eq!(a.arrival(&on_off), b.arrival(&plain), "{inner:?}");
                let next = a.next_arrival(t, &on_off);
                assert_eq!(next, b.next_arrival(t, &plain), "{inner:?}");
                t = next.unwrap_or(t);
            }
        }
    }

    #[test]
    fn open_arrivals_average_their_rate_and_on_off_toggles() {
        let s = spec(WorkloadKind::OnOff {
            on: Nanos::from_secs(1),
            off: Nanos::from_secs(2),
            inner: OnOffInner::Open { iops: 1000.0 },
        });
        let mut g = Generator::new(&s, 9);
        assert_eq!(g.start(Nanos(0), &s), Some(Nanos::from_secs(1)));
        assert_eq!(g.begin(Nanos(0), &s), Begin::ArriveAt(Nanos(0)));
        let mut t = Nanos(0);
        let mut n = 0u64;
        while t < Nanos::from_secs(1) {
            assert_eq!(g.arrival(&s), Some(Arrival::Generated(1)));
            n += 1;
            t = g.next_arrival(t, &s).unwrap();
        }
        assert!((900..1100).contains(&n), "{n} arrivals in 1 s at 1000/s");
        assert_eq!(g.toggle(Nanos::from_secs(1), &s), Some((Nanos::from_secs(3), false)));
        assert_eq!(g.arrival(&s), None, "off");
        assert_eq!(g.toggle(Nanos::from_secs(3), &s), Some((Nanos::from_secs(4), true)));
        g.stop();
        assert_eq!(g.toggle(Nanos::from_secs(4), &s), None);
    }

    #[test]
    // `%` rather than `u64::is_multiple_of`, which needs Rust 1.87 (the workspace declares 1.80).
    #[allow(clippy::manual_is_multiple_of)]
    fn offsets_stay_in_the_span_and_sequential_ones_follow_each_other() {
        let mut s = spec(WorkloadKind::Open { iops: 1.0 });
        s.random_frac = 0.0;
        s.span_bytes = 4096 * 4;
        let mut g = Generator::new(&s, 3);
        let offs: Vec<u64> = (0..6).map(|_| g.next_io().offset).collect();
        assert_eq!(offs, vec![0, 4096, 8192, 12288, 0, 4096]);
        s.random_frac = 0.5;
        s.read_frac = 0.7;
        let mut g = Generator::new(&s, 3);
        let mut reads = 0;
        for _ in 0..10_000 {
            let io = g.next_io();
            assert!(io.offset < s.span_bytes && io.offset % 4096 == 0);
            reads += io.read as u32;
        }
        assert!((6700..7300).contains(&reads), "{reads} reads of 10,000 at 70%");
    }

    #[test]
    fn the_read_mix_does_not_move_offsets() {
        let mut a = spec(WorkloadKind::Open { iops: 1.0 });
        a.random_frac = 0.5;
        let mut b = a.clone();
        b.read_frac = 0.3;
        let (mut ga, mut gb) = (Generator::new(&a, 5), Generator::new(&b, 5));
        for _ in 0..1000 {
            assert_eq!(ga.next_io().offset, gb.next_io().offset);
        }
    }

    #[test]
    fn a_trace_replays_its_records_and_repeats() {
        let rec = |t_ns, offset| TraceRecord { t_ns, offset, size: 512, read: true, device: 0 };
        let s = spec(WorkloadKind::Trace {
            records: Arc::new(vec![rec(0, 0), rec(1000, 512), rec(3000, 1024)]),
            time_scale: 1.0,
            repeat: true,
        });
        let mut g = Generator::new(&s, 1);
        g.start(Nanos(10), &s);
        let Begin::ArriveAt(mut t) = g.begin(Nanos(10), &s) else { panic!() };
        let mut seen = Vec::new();
        for _ in 0..5 {
            let Some(Arrival::Record(r)) = g.arrival(&s) else { panic!() };
            seen.push((t.0, r.offset));
            t = g.next_arrival(t, &s).unwrap();
        }
        // The replay restarts one mean gap (3000 / 3 = 1000 ns) after the last record.
        assert_eq!(seen, vec![(10, 0), (1010, 512), (3010, 1024), (4010, 0), (5010, 512)]);
    }

    #[test]
    fn a_table_naming_only_the_kind_is_the_default() {
        let p: WorkloadParams = toml::from_str("kind = \"closed\"").unwrap();
        assert_eq!(p, WorkloadParams::default());
        let t: TraceParams = toml::from_str("path = \"x.trace\"").unwrap();
        assert_eq!((t.time_scale, t.repeat, t.device, t.devices), (1.0, false, None, None));
        assert!(toml::from_str::<WorkloadParams>("outstanding = 4").unwrap_err().to_string().contains("missing field"));
        assert!(toml::from_str::<WorkloadParams>("kind = \"open\"\nrate = 4")
            .unwrap_err()
            .to_string()
            .contains("unknown field"));
    }

    /// The kind table: each kind's name parses to that kind and back to the same name, and is the name
    /// files write and the unknown-kind message lists (in its order); validation reads the name as that
    /// kind. A name spelled or cased otherwise is refused with the unknown-kind message, as written.
    #[test]
    fn kind_names_parse_to_their_kind_and_no_other_spelling_does() {
        let names: Vec<&str> = KindName::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, ["closed", "open", "on_off", "burst", "trace"]);
        let listed = format!("expected {} or {}", names[..names.len() - 1].join(", "), names[names.len() - 1]);
        let check = |p: &WorkloadParams, names: &FieldNames| p.validate_as(Nanos::from_secs(10), None, &[], names);
        for kind in KindName::ALL {
            assert_eq!(KindName::parse(kind.name()), Some(kind), "{kind:?}");
            assert_eq!(kind.to_string(), kind.name());
            // With no other field, a closed loop is valid and every other kind needs one of its own.
            let p = WorkloadParams { kind: kind.name().into(), ..Default::default() };
            match check(&p, &FieldNames::SCENARIO) {
                Ok(spec) => assert_eq!((kind, spec.kind.name()), (KindName::Closed, kind.name())),
                Err(WorkloadError::Needs { kind: needs, .. }) => assert_eq!(needs, kind),
                Err(e) => panic!("{kind:?}: {e}"),
            }
        }
        for got in ["Closed", "OPEN", "on-off", "onoff", "On_Off", " burst", "trace ", "", "sometimes"] {
            assert_eq!(KindName::parse(got), None, "{got:?}");
            let p = WorkloadParams { kind: got.into(), ..Default::default() };
            assert!(!p.keeps_window(), "{got:?}");
            for (names, message) in [
                (FieldNames::SCENARIO, format!("workload kind {got:?}: {listed}")),
                (FieldNames::JOB, format!("kind={got}: {listed}")),
            ] {
                match check(&p, &names) {
                    Err(e @ WorkloadError::UnknownKind { .. }) => {
                        assert!(matches!(&e, WorkloadError::UnknownKind { got: g, .. } if g == got));
                        assert_eq!(e.to_string(), message);
                    }
                    other => panic!("{got:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let err = |p: WorkloadParams| p.validate(Nanos::from_secs(10), None, &[]).unwrap_err().to_string();
        let kind = |k: &str| WorkloadParams { kind: k.into(), ..Default::default() };
        assert!(err(kind("sometimes")).contains("workload kind \"sometimes\""));
        assert!(err(kind("open")).contains("open workload needs iops"));
        assert!(err(WorkloadParams { outstanding: Some(0), ..Default::default() }).contains("outstanding must be in"));
        assert!(err(WorkloadParams { read_pct: Some(120.0), ..Default::default() }).contains("read_pct"));
        assert!(err(WorkloadParams { stop_s: Some(0.0), ..Default::default() }).contains("stop_s"));
        // A start at or after the run's end issues nothing, whatever the stop.
        for stop_s in [None, Some(20.0)] {
            assert_eq!(
                err(WorkloadParams { start_s: 10.0, stop_s, ..Default::default() }),
                "start_s must be before the run's end (10 s), got 10"
            );
        }
        // A field in milliseconds says its bound in milliseconds (it said "604800 s, got -0.001").
        assert_eq!(
            err(WorkloadParams { think_ms: Some(-1.0), ..Default::default() }),
            "think_ms must be between 0 and 604800000 ms, got -1"
        );
        let ok = WorkloadParams::default().validate(Nanos::from_secs(10), None, &[]).unwrap();
        assert_eq!((ok.size_bytes, ok.stop), (4096, Nanos::from_secs(10)));
    }

    /// A field the kind does not use is refused, not ignored (a closed workload with `iops` ran closed,
    /// `outstanding` beside `outstanding_per_server` was dropped).
    #[test]
    fn fields_the_kind_does_not_use_are_refused() {
        let err = |p: WorkloadParams| p.validate(Nanos::from_secs(10), None, &[]).unwrap_err().to_string();
        let closed = WorkloadParams::default();
        assert_eq!(
            err(WorkloadParams { iops: Some(5.0), ..closed.clone() }),
            "iops is not used by a closed workload: remove it, or change the kind"
        );
        assert!(err(WorkloadParams { on_s: Some(1.0), ..closed.clone() }).starts_with("on_s is not used by a closed"));
        let trace = TraceParams {
            path: "nonexistent.trace".into(),
            format: None,
            device: None,
            devices: None,
            time_scale: 1.0,
            repeat: false,
        };
        assert!(err(WorkloadParams { trace: Some(trace.clone()), ..closed.clone() })
            .starts_with("[tenants.workload.trace] is not"));
        let open = WorkloadParams { kind: "open".into(), iops: Some(5.0), ..Default::default() };
        assert!(err(WorkloadParams { outstanding: Some(1), ..open.clone() })
            .starts_with("outstanding is not used by an open"));
        assert!(err(WorkloadParams { think_ms: Some(1.0), ..open.clone() }).starts_with("think_ms is not used"));
        let on_off = WorkloadParams { kind: "on_off".into(), on_s: Some(1.0), off_s: Some(1.0), ..open };
        assert_eq!(
            err(WorkloadParams { outstanding: Some(2), ..on_off.clone() }),
            "outstanding is not used by an on_off workload (open inside its on periods: it has iops): remove it, or \
             change the kind"
        );
        assert!(on_off.validate(Nanos::from_secs(10), None, &[]).is_ok());
        assert_eq!(
            err(WorkloadParams { outstanding: Some(4), outstanding_per_server: Some(30), ..Default::default() }),
            "outstanding and outstanding_per_server are both given: outstanding_per_server keeps a window at each \
             server instead of one pool of outstanding; give one"
        );
        let per_server = WorkloadParams { outstanding_per_server: Some(30), ..Default::default() };
        assert!(per_server.validate(Nanos::from_secs(10), None, &[]).is_ok());
        // A trace's records give each request's size, operation and offset: the generator's fields are
        // refused, named as the input writes them (they were taken and ignored), before the trace is read.
        let replay = WorkloadParams { kind: "trace".into(), trace: Some(trace), ..Default::default() };
        for (p, field) in [
            (WorkloadParams { size_kb: Some(64.0), ..replay.clone() }, "size_kb"),
            (WorkloadParams { read_pct: Some(30.0), ..replay.clone() }, "read_pct"),
            (WorkloadParams { random_pct: Some(0.0), ..replay.clone() }, "random_pct"),
        ] {
            assert_eq!(
                err(p.clone()),
                format!(
                    "{field} is not used by a trace workload (its records give each request's size, operation and \
                     offset): remove it, or change the kind"
                )
            );
            let job = p.validate_as(Nanos::from_secs(10), None, &[], &FieldNames::JOB).unwrap_err().to_string();
            assert!(
                job.ends_with(
                    "= is not used by kind=trace (its records give each request's size, operation and offset)"
                ),
                "{job}"
            );
        }
        assert!(
            err(WorkloadParams { span_gb: 2.0, ..replay }).contains("nonexistent.trace"),
            "span is used: the trace is read"
        );
    }

    #[test]
    fn rates_cycles_and_sizes_beyond_the_bounds_are_refused() {
        let check = |p: WorkloadParams| p.validate(Nanos::from_secs(10), None, &[]).map_err(|e| e.to_string());
        let open = |iops| WorkloadParams { kind: "open".into(), iops: Some(iops), ..Default::default() };
        assert!(check(open(MAX_RATE_IOPS)).is_ok());
        assert!(check(open(1e9)).unwrap_err().contains("iops 1000000000 is above the bound"));
        let burst = |count, ms| WorkloadParams {
            kind: "burst".into(),
            burst_count: Some(count),
            burst_period_ms: Some(ms),
            ..Default::default()
        };
        assert!(check(burst(10_000, 1.0)).is_ok()); // exactly 1e7 IOPS
        assert!(check(burst(10_001, 1.0)).unwrap_err().contains("above the bound"));
        assert!(check(burst(65_536, 0.001)).unwrap_err().contains("burst_count / burst_period_ms"));
        let on_off =
            |on, off| WorkloadParams { kind: "on_off".into(), on_s: Some(on), off_s: Some(off), ..Default::default() };
        assert!(check(on_off(1e-9, 1e-9)).unwrap_err().contains("on_s + off_s must be at least"));
        assert!(check(on_off(5e-4, 5e-4)).is_ok());
        let sized = |kb| WorkloadParams { size_kb: kb, ..Default::default() };
        assert!(check(sized(Some(1e-4))).unwrap_err().contains("size_kb 0.0001 is less than one byte"));
        assert_eq!(check(sized(Some(1.0 / 1024.0))).unwrap().size_bytes, 1);
    }

    /// Workloads naming one trace (same format and devices) share one copy of its records (seventy
    /// tenants on one trace loaded it seventy times); another device filter is another load; the
    /// records of all of a scenario's traces are bounded, with an error naming the file and the total.
    #[test]
    fn a_trace_is_loaded_once_per_scenario_and_bounded_in_all() {
        // Removed when dropped, also when an assertion fails.
        let tmp = tempfile::Builder::new().prefix("rein-model-shared-").tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::write(dir.join("a.trace"), "0 0 0 8 1\n10 1 8 8 1\n20 0 16 8 1\n").unwrap();
        std::fs::write(dir.join("b.trace"), "0 0 0 8 1\n10 0 8 8 1\n20 0 16 8 1\n").unwrap();
        let params = |path: &str| {
            let trace = TraceParams {
                path: path.into(),
                format: None,
                device: None,
                devices: None,
                time_scale: 1.0,
                repeat: false,
            };
            WorkloadParams { kind: "trace".into(), trace: Some(trace), ..Default::default() }
        };
        let records = |s: &WorkloadSpec| match &s.kind {
            WorkloadKind::Trace { records, .. } => Arc::clone(records),
            _ => unreachable!(),
        };
        let mut cache = TraceCache::with_bound(5);
        let mut load = |path: &str, devices: &[u32]| {
            params(path)
                .validate_shared(Nanos::from_secs(10), Some(&dir), devices, &mut cache)
                .map_err(|e| e.to_string())
        };
        let first = records(&load("a.trace", &[]).unwrap());
        let again = records(&load("a.trace", &[]).unwrap());
        assert!(Arc::ptr_eq(&first, &again), "one copy");
        let dev0 = records(&load("a.trace", &[0]).unwrap());
        assert_eq!(dev0.len(), 2, "another filter, another load (3 + 2 records)");
        let e = load("b.trace", &[]).unwrap_err();
        assert!(
            e.contains("b.trace: its 3 records bring the scenario's traces to 8 records, above the bound of 5"),
            "{e}"
        );
        assert_eq!(cache.records(), 5);
    }

    /// A trace workload of the file `t.trace` (in the directory given to `validate`), every device.
    fn trace_of_t(time_scale: f64, repeat: bool) -> WorkloadParams {
        let trace =
            TraceParams { path: "t.trace".into(), format: None, device: None, devices: None, time_scale, repeat };
        WorkloadParams { kind: "trace".into(), trace: Some(trace), ..Default::default() }
    }

    /// A trace without records says why: an empty file, or a device filter that kept none (the filter was
    /// named as `(device filter [])` for an empty file, read as a setting to look for).
    #[test]
    fn an_empty_trace_says_it_has_no_records() {
        // Removed when dropped, also when an assertion fails.
        let tmp = tempfile::Builder::new().prefix("rein-model-empty-").tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::write(dir.join("t.trace"), "# nothing but a comment\n\n").unwrap();
        let p = trace_of_t(1.0, false);
        let e = |devices: &[u32]| p.validate(Nanos::from_secs(10), Some(&dir), devices).unwrap_err().to_string();
        let path = dir.join("t.trace").display().to_string();
        assert_eq!(e(&[]), format!("trace {path} has no records (the file holds no request lines)"));
        std::fs::write(dir.join("t.trace"), "0 0 0 8 1\n").unwrap();
        assert_eq!(e(&[7]), format!("trace {path} has no records (device filter [7])"));
    }

    /// `e` matches `pat`, and says exactly `text`.
    macro_rules! refused {
        ($e:expr, $pat:pat $(if $guard:expr)?, $text:expr) => {{
            let e: WorkloadError = $e;
            assert!(matches!(&e, $pat $(if $guard)?), "{e:?}");
            assert_eq!(e.to_string(), $text);
        }};
    }

    /// Each way a workload's parameters are refused is its own variant, carrying the field and the value,
    /// with the message the `Invalid(String)` it replaced had (these strings passed on that error too).
    #[test]
    fn each_refusal_is_typed_with_its_field_and_value() {
        let ten = Nanos::from_secs(10);
        let err = |p: WorkloadParams| p.validate(ten, None, &[]).unwrap_err();
        let job = |p: WorkloadParams| p.validate_as(ten, None, &[], &FieldNames::JOB).unwrap_err();
        let closed = WorkloadParams::default();
        let open = WorkloadParams { kind: "open".into(), iops: Some(5.0), ..Default::default() };
        let on_off =
            |on, off| WorkloadParams { kind: "on_off".into(), on_s: Some(on), off_s: Some(off), ..closed.clone() };
        refused!(
            err(WorkloadParams { iops: Some(5.0), ..closed.clone() }),
            WorkloadError::Unused { field, kind, inner: UnusedInner::None, key_value: false }
                if *field == "iops" && *kind == KindName::Closed,
            "iops is not used by a closed workload: remove it, or change the kind"
        );
        refused!(
            job(WorkloadParams { outstanding: Some(1), ..open.clone() }),
            WorkloadError::Unused { field, kind, inner: UnusedInner::None, key_value: true }
                if *field == "depth" && *kind == KindName::Open,
            "depth= is not used by kind=open"
        );
        refused!(
            err(WorkloadParams { burst_count: Some(2), ..on_off(1.0, 1.0) }),
            WorkloadError::Unused { field, inner: UnusedInner::ClosedOnOff { rate }, .. }
                if *field == "burst_count" && *rate == "iops",
            "burst_count is not used by an on_off workload (closed inside its on periods: it has no iops): remove \
             it, or change the kind"
        );
        refused!(
            job(WorkloadParams { outstanding: Some(2), iops: Some(5.0), ..on_off(1.0, 1.0) }),
            WorkloadError::Unused { field, inner: UnusedInner::OpenOnOff { rate }, key_value: true, .. }
                if *field == "depth" && *rate == "rate",
            "depth= is not used by kind=on_off (open inside its on periods: it has rate)"
        );
        refused!(
            err(WorkloadParams { kind: "open".into(), ..closed.clone() }),
            WorkloadError::Needs { kind, field, key_value: false } if *kind == KindName::Open && *field == "iops",
            "open workload needs iops"
        );
        refused!(
            job(WorkloadParams { kind: "open".into(), ..closed.clone() }),
            WorkloadError::Needs { kind, field, key_value: true } if *kind == KindName::Open && *field == "rate",
            "kind=open needs rate="
        );
        refused!(
            err(WorkloadParams { start_s: -1.0, ..closed.clone() }),
            WorkloadError::Seconds { field, got } if *field == "start_s" && *got == -1.0,
            "start_s must be between 0 and 604800 s, got -1"
        );
        refused!(
            job(WorkloadParams { think_ms: Some(f64::NAN), ..closed.clone() }),
            WorkloadError::Millis { field, got } if *field == "think" && got.is_nan(),
            "think must be between 0 and 604800000 ms, got NaN"
        );
        refused!(
            err(WorkloadParams { span_gb: 0.0, ..closed.clone() }),
            WorkloadError::NotPositive { field, got } if *field == "span_gb" && *got == 0.0,
            "span_gb must be a positive number, got 0"
        );
        refused!(
            err(WorkloadParams { size_kb: Some(2.0 * 1024.0 * 1024.0), ..closed.clone() }),
            WorkloadError::SizeAboveBound { field, size_kb } if *field == "size_kb" && *size_kb == 2097152.0,
            "size_kb must be at most 1 GiB, got 2 GiB"
        );
        refused!(
            job(WorkloadParams { size_kb: Some(1e-4), ..closed.clone() }),
            WorkloadError::SizeBelowByte { field, size_kb } if *field == "size" && *size_kb == 1e-4,
            "size 0.0001 is less than one byte"
        );
        refused!(
            err(WorkloadParams { iops: Some(1e9), ..open.clone() }),
            WorkloadError::RateAboveBound { what, iops } if what == "iops" && *iops == 1e9,
            "iops 1000000000 is above the bound of 10000000 IOPS"
        );
        refused!(
            err(WorkloadParams { kind: "burst".into(), burst_count: Some(65_536), burst_period_ms: Some(1.0), ..closed.clone() }),
            WorkloadError::RateAboveBound { what, iops } if what == "the rate burst_count / burst_period_ms" && *iops == 65_536_000.0,
            "the rate burst_count / burst_period_ms 65536000 is above the bound of 10000000 IOPS"
        );
        refused!(
            job(WorkloadParams { outstanding: Some(0), ..closed.clone() }),
            WorkloadError::Window { field, got: 0 } if *field == "depth x conns",
            "depth x conns must be in 1..=65536, got 0"
        );
        refused!(
            err(WorkloadParams { outstanding: Some(4), outstanding_per_server: Some(30), ..closed.clone() }),
            WorkloadError::BothWindows { outstanding, per_server }
                if *outstanding == "outstanding" && *per_server == "outstanding_per_server",
            "outstanding and outstanding_per_server are both given: outstanding_per_server keeps a window at each \
             server instead of one pool of outstanding; give one"
        );
        refused!(
            job(on_off(0.0, 1.0)),
            WorkloadError::NoOnTime { field } if *field == "on",
            "on must be positive"
        );
        refused!(
            err(on_off(1e-4, 2e-4)),
            WorkloadError::CycleTooShort { on, off, cycle_s } if *on == "on_s" && *off == "off_s" && (*cycle_s - 3e-4).abs() < 1e-12,
            "on_s + off_s must be at least 0.001 s (one on/off cycle), got 0.0003 s"
        );
        refused!(
            err(WorkloadParams { kind: "sometimes".into(), ..closed.clone() }),
            WorkloadError::UnknownKind { got, key_value: false } if got == "sometimes",
            "workload kind \"sometimes\": expected closed, open, on_off, burst or trace"
        );
        refused!(
            job(WorkloadParams { kind: "sometimes".into(), ..closed.clone() }),
            WorkloadError::UnknownKind { got, key_value: true } if got == "sometimes",
            "kind=sometimes: expected closed, open, on_off, burst or trace"
        );
        refused!(
            job(WorkloadParams { read_pct: Some(120.0), ..closed.clone() }),
            WorkloadError::Percent { field, got } if *field == "read" && *got == 120.0,
            "read must be in [0, 100], got 120"
        );
        refused!(
            err(WorkloadParams { start_s: 12.5, ..closed.clone() }),
            WorkloadError::StartAfterEnd { field, duration_s, got } if *field == "start_s" && *duration_s == 10.0 && *got == 12.5,
            "start_s must be before the run's end (10 s), got 12.5"
        );
        refused!(
            job(WorkloadParams { start_s: 2.0, stop_s: Some(1.0), ..closed.clone() }),
            WorkloadError::StopBeforeStart { stop, start } if *stop == "stop" && *start == "start",
            "stop must be after start"
        );
    }

    /// The refusals of a trace's records: the scenario's bound, no records, a device without records, a
    /// repeated trace at one instant; typed, with the file, as [`each_refusal_is_typed_with_its_field_and_value`].
    #[test]
    fn each_refusal_of_a_trace_is_typed_with_its_file() {
        // Removed when dropped, also when an assertion fails.
        let tmp = tempfile::Builder::new().prefix("rein-model-typed-").tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let path = dir.join("t.trace");
        let ten = Nanos::from_secs(10);
        std::fs::write(&path, "0 0 0 8 1\n10 1 8 8 1\n20 0 16 8 1\n").unwrap();
        let shown = path.display().to_string();
        let mut cache = TraceCache::with_bound(2);
        refused!(
            trace_of_t(1.0, false).validate_shared(ten, Some(&dir), &[], &mut cache).unwrap_err(),
            WorkloadError::TraceRecordsAboveBound { path: p, records: 3, total: 3, bound: 2 } if *p == path,
            format!(
                "trace {shown}: its 3 records bring the scenario's traces to 3 records, above the bound of 2 (32 bytes \
                 each; tenants naming one trace with the same format and devices share one copy)"
            )
        );
        refused!(
            trace_of_t(1.0, false).validate(ten, Some(&dir), &[7]).unwrap_err(),
            WorkloadError::NoRecords { path: p, devices } if *p == path && *devices == [7],
            format!("trace {shown} has no records (device filter [7])")
        );
        refused!(
            trace_of_t(1.0, false).validate(ten, Some(&dir), &[1, 7]).unwrap_err(),
            WorkloadError::DeviceWithoutRecords { device: 7, path: p } if *p == path,
            format!("trace.devices: device 7 has no records in {shown}")
        );
        std::fs::write(&path, "5 0 0 8 1\n5 0 8 8 1\n").unwrap();
        let job = trace_of_t(0.5, true).validate_as(ten, Some(&dir), &[], &FieldNames::JOB).unwrap_err();
        refused!(
            job,
            WorkloadError::RepeatAtOneInstant { repeat, path: p, records: 2, time_scale_field, time_scale }
                if *repeat == "repeat" && *p == path && *time_scale_field == "time_scale" && *time_scale == 0.5,
            format!(
                "repeat: {shown}'s 2 records are all at one instant (at time_scale 0.5): a repeated trace needs \
                 records that span time, or it replays for ever at that instant"
            )
        );
    }

    #[test]
    fn a_repeated_trace_must_span_time() {
        // Removed when dropped, also when an assertion fails.
        let tmp = tempfile::Builder::new().prefix("rein-model-repeat-").tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let run = |text: &str, time_scale: f64| {
            std::fs::write(dir.join("t.trace"), text).unwrap();
            trace_of_t(time_scale, true).validate(Nanos::from_secs(10), Some(&dir), &[]).map_err(|e| e.to_string())
        };
        // One record, or records all at one instant: a pass of no time (it once spun for ever).
        let e = run("0 0 0 8 1\n", 1.0).unwrap_err();
        assert!(e.contains("trace.repeat") && e.contains("records that span time"), "{e}");
        assert!(run("5 0 0 8 1\n5 0 8 8 1\n", 1.0).is_err());
        // Two records 1 ms apart: a pass of 1.5 ms, fine; scaled by 1e-300, refused.
        assert!(run("0 0 0 8 1\n1000000 0 8 8 1\n", 1.0).is_ok());
        let e = run("0 0 0 8 1\n1000000 0 8 8 1\n", 1e-300).unwrap_err();
        assert!(e.contains("above the bound of 10000000 IOPS"), "{e}");
        // Not repeated, a trace at one instant is a finite burst.
        std::fs::write(dir.join("t.trace"), "0 0 0 8 1\n").unwrap();
        let once = trace_of_t(1.0, false);
        assert!(once.validate(Nanos::from_secs(10), Some(&dir), &[]).is_ok());
    }
}
