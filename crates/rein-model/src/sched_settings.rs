//! Scheduler settings: the `[mclock]` table of scenario files and of `rein serve`'s rein.toml, parsed and
//! validated by one piece of code into a [`rein_core::SchedConfig`].
//!
//! # Why here
//! The simulator (`rein-sim`, scenario files) and the daemon (`rein-runtime`, rein.toml) must accept the same
//! table with the same names, defaults and errors, or a setting tried in a scenario would mean something else
//! on a real server. `rein-model` is the lowest crate both depend on that may use serde (`rein-core` keeps
//! serde optional and has no file formats), and it already holds the other shared piece of configuration,
//! the device model ([`crate::device::DeviceParams`]). So the table is one serde struct,
//! [`SchedSettingsFile`], embedded by both files' schemas, and one validator, [`SchedSettingsFile::resolve`];
//! neither crate has its own copy of a field name or a range.
//!
//! # The table
//! ```toml
//! [mclock]
//! preset = "rein"                 # rein (default) | paper: SchedConfig::paper(), mClock's Algorithm 1 as written
//! weight_lead_ios = 16            # integer, or "none" (the paper: P tags may lead without bound)
//! limit_burst_ios = 8             # integer, or "none" (the paper: L tags clamped at arrival)
//! reservation_lag = "100ms"       # "arrival" (the paper) | "unbounded" | a duration: "100ms", "0.5s", "250us"
//! limited_reenter_at_vnow = true  # false: the paper (a limited tenant keeps its P tags)
//! limit_mode = "strict"           # strict (Algorithm 1) | break_when_idle
//! cost_model = "io"               # io | bytes | { tm_ms = 5, bpeak_mb_s = 60 } (mClock §3.1 eq. (4)-(5))
//! batch = 1                       # locality batching, 1..=1024 (1 = off; the paper: 8)
//! batch_distance_kb = 4096        # largest distance between requests of a batch (the paper: 4 MB)
//! pool_return = "100ms"           # "off" (the paper) | a duration: a distributed tenant back within it, pool busy, keeps its P tag
//! pool_return_lag_ios = 256       # ... up to this many of its IOs behind the others here
//! ```
//! Every field is optional. [`SchedSettingsFile::resolve`] starts from the preset ([`SchedConfig::default`]
//! or [`SchedConfig::paper`]) and applies each field given, so `preset = "paper"` with `batch = 8` is the
//! paper's tag rules with the paper's batching. [`SchedSettingsFile::overlay`] layers one table over another
//! field by field (a scenario's server over the scenario).
//!
//! Errors ([`SettingsError`]) name the field (as `mclock.<field>`) and the value given, and say what is
//! accepted. Nothing here panics on input.

use rein_core::{CostModel, LimitMode, Nanos, PoolReturn, ReservationLag, SchedConfig, SchedulerKind};
use serde::Deserialize;
use std::fmt;

/// Largest `weight_lead_ios` and `limit_burst_ios` accepted (IOs). Far beyond any useful bound: a tenant
/// at 1 IOPS would need 12 days to use it.
pub const MAX_COUNT_IOS: i64 = 1 << 20;
/// Largest `batch` accepted (requests per locality batch).
pub const MAX_BATCH: i64 = 1024;
/// Largest `batch_distance_kb` accepted (KiB: 1 TiB).
pub const MAX_BATCH_DISTANCE_KB: f64 = (1u64 << 30) as f64;
/// Longest `reservation_lag` duration accepted (an hour).
pub const MAX_RESERVATION_LAG: Nanos = Nanos(3_600_000_000_000);
/// Longest `pool_return` window accepted (a minute: a gap that long is idleness, not a pool moving).
pub const MAX_POOL_RETURN: Nanos = Nanos(60_000_000_000);

/// A setting that is an IO count or the word "none".
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum CountOrNone {
    /// A count (checked against its range by [`SchedSettingsFile::resolve`]).
    Count(i64),
    /// A word; only "none" is accepted.
    Word(String),
}

impl fmt::Display for CountOrNone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CountOrNone::Count(n) => write!(f, "{n}"),
            CountOrNone::Word(w) => write!(f, "{w:?}"),
        }
    }
}

/// `cost_model`: a name or mClock §3.1's seek-and-transfer parameters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum CostModelFile {
    /// "io" (one unit per request: rates are IOPS) or "bytes" (rates are bytes/s).
    Name(String),
    /// mClock eq. (4)-(5): a request of S bytes costs `1 + S / (Tm * Bpeak)` IOs.
    SeekTransfer {
        /// Tm, the mechanical delay (seek and rotation), ms.
        tm_ms: f64,
        /// Bpeak, the peak transfer rate, MB/s (10^6 bytes per second).
        bpeak_mb_s: f64,
    },
}

impl CostModelFile {
    /// Validates the cost model. `field` names it in errors (`cost_model` or `mclock.cost_model`).
    pub fn resolve(&self, field: &'static str) -> Result<CostModel, SettingsError> {
        match self {
            CostModelFile::Name(n) if n == "io" => Ok(CostModel::PerIo),
            CostModelFile::Name(n) if n == "bytes" => Ok(CostModel::BYTES),
            CostModelFile::Name(n) => Err(SettingsError::new(
                field,
                format!("{n:?}"),
                "expected \"io\", \"bytes\" or { tm_ms, bpeak_mb_s } (mClock eq. (4)-(5))",
            )),
            CostModelFile::SeekTransfer { tm_ms, bpeak_mb_s } => {
                let value = format!("{{ tm_ms = {tm_ms}, bpeak_mb_s = {bpeak_mb_s} }}");
                let expected = "tm_ms must be in (0, 10000] and bpeak_mb_s in (0, 10^6]";
                let tm_ok = tm_ms.is_finite() && *tm_ms > 0.0 && *tm_ms <= 10_000.0;
                let bpeak_ok = bpeak_mb_s.is_finite() && *bpeak_mb_s > 0.0 && *bpeak_mb_s <= 1e6;
                if !(tm_ok && bpeak_ok) {
                    return Err(SettingsError::new(field, value, expected));
                }
                let tm_ns = (tm_ms * 1e6).round() as u64;
                CostModel::seek_transfer(tm_ns, bpeak_mb_s * 1e6)
                    .map_err(|_| SettingsError::new(field, value, expected))
            }
        }
    }
}

/// A scheduler setting was refused: which field, the value given, and what is accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field} = {value}: {expected}")]
pub struct SettingsError {
    /// The field, as written in the file (`mclock.batch`).
    pub field: &'static str,
    /// The value given, as TOML would write it.
    pub value: String,
    /// What is accepted.
    pub expected: String,
}

impl SettingsError {
    fn new(field: &'static str, value: String, expected: impl Into<String>) -> Self {
        SettingsError { field, value, expected: expected.into() }
    }
}

/// The `[mclock]` table as written: every field optional (module comment for the meaning of each).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedSettingsFile {
    /// "rein" (default: [`SchedConfig::default`]) or "paper" ([`SchedConfig::paper`]).
    pub preset: Option<String>,
    /// [`SchedConfig::weight_lead_ios`]: a count, or "none" for no bound.
    pub weight_lead_ios: Option<CountOrNone>,
    /// [`SchedConfig::limit_burst_ios`]: a count, or "none" for the paper's clamp at arrival.
    pub limit_burst_ios: Option<CountOrNone>,
    /// [`SchedConfig::reservation_lag`]: "arrival", "unbounded" or a duration ("100ms").
    pub reservation_lag: Option<String>,
    /// [`SchedConfig::limited_reenter_at_vnow`].
    pub limited_reenter_at_vnow: Option<bool>,
    /// [`SchedConfig::limit_mode`]: "strict" or "break_when_idle".
    pub limit_mode: Option<String>,
    /// [`SchedConfig::cost_model`].
    pub cost_model: Option<CostModelFile>,
    /// [`SchedConfig::batch`]: 1..=[`MAX_BATCH`].
    pub batch: Option<i64>,
    /// [`SchedConfig::batch_distance`], in KiB.
    pub batch_distance_kb: Option<f64>,
    /// [`PoolReturn::window`] as a duration ("100ms"), or "off" ([`SchedConfig::pool_return`] `None`,
    /// the paper).
    pub pool_return: Option<String>,
    /// [`PoolReturn::lag_ios`].
    pub pool_return_lag_ios: Option<i64>,
}

impl SchedSettingsFile {
    /// This table with every field that `over` gives replaced by `over`'s (a server's table over the
    /// scenario's).
    pub fn overlay(&self, over: &SchedSettingsFile) -> SchedSettingsFile {
        fn pick<T: Clone>(base: &Option<T>, over: &Option<T>) -> Option<T> {
            over.clone().or_else(|| base.clone())
        }
        SchedSettingsFile {
            preset: pick(&self.preset, &over.preset),
            weight_lead_ios: pick(&self.weight_lead_ios, &over.weight_lead_ios),
            limit_burst_ios: pick(&self.limit_burst_ios, &over.limit_burst_ios),
            reservation_lag: pick(&self.reservation_lag, &over.reservation_lag),
            limited_reenter_at_vnow: pick(&self.limited_reenter_at_vnow, &over.limited_reenter_at_vnow),
            limit_mode: pick(&self.limit_mode, &over.limit_mode),
            cost_model: pick(&self.cost_model, &over.cost_model),
            batch: pick(&self.batch, &over.batch),
            batch_distance_kb: pick(&self.batch_distance_kb, &over.batch_distance_kb),
            pool_return: pick(&self.pool_return, &over.pool_return),
            pool_return_lag_ios: pick(&self.pool_return_lag_ios, &over.pool_return_lag_ios),
        }
    }

    /// Validates the table into a [`SchedConfig`]: the preset, then every field given. [`SchedConfig::limits`]
    /// is the preset's (callers set their own bounds).
    pub fn resolve(&self) -> Result<SchedConfig, SettingsError> {
        let mut c = match self.preset.as_deref() {
            None | Some("rein") => SchedConfig::default(),
            Some("paper") => SchedConfig::paper(),
            Some(o) => {
                return Err(SettingsError::new("mclock.preset", format!("{o:?}"), "expected \"rein\" or \"paper\""))
            }
        };
        if let Some(v) = &self.weight_lead_ios {
            c.weight_lead_ios = count_or_none("mclock.weight_lead_ios", v, "no bound on the lead, as in the paper")?;
        }
        if let Some(v) = &self.limit_burst_ios {
            c.limit_burst_ios =
                count_or_none("mclock.limit_burst_ios", v, "L tags clamped at arrival, as in the paper")?;
        }
        if let Some(v) = &self.reservation_lag {
            c.reservation_lag = parse_reservation_lag(v)?;
        }
        if let Some(v) = self.limited_reenter_at_vnow {
            c.limited_reenter_at_vnow = v;
        }
        if let Some(v) = &self.limit_mode {
            c.limit_mode = match v.as_str() {
                "strict" => LimitMode::Strict,
                "break_when_idle" => LimitMode::BreakWhenIdle,
                o => {
                    return Err(SettingsError::new(
                        "mclock.limit_mode",
                        format!("{o:?}"),
                        "expected \"strict\" (Algorithm 1) or \"break_when_idle\"",
                    ))
                }
            };
        }
        if let Some(v) = &self.cost_model {
            c.cost_model = v.resolve("mclock.cost_model")?;
        }
        if let Some(v) = self.batch {
            if !(1..=MAX_BATCH).contains(&v) {
                return Err(SettingsError::new(
                    "mclock.batch",
                    v.to_string(),
                    format!("expected 1..={MAX_BATCH} (1 = no batching; the paper: 8)"),
                ));
            }
            c.batch = v as u32;
        }
        if let Some(v) = self.batch_distance_kb {
            if !(v.is_finite() && (0.0..=MAX_BATCH_DISTANCE_KB).contains(&v)) {
                return Err(SettingsError::new(
                    "mclock.batch_distance_kb",
                    v.to_string(),
                    format!("expected 0..={MAX_BATCH_DISTANCE_KB} KiB (the paper: 4096)"),
                ));
            }
            c.batch_distance = (v * 1024.0) as u64;
        }
        if let Some(v) = &self.pool_return {
            c.pool_return = if v == "off" {
                None
            } else {
                let window = parse_duration(v, MAX_POOL_RETURN).ok_or_else(|| {
                    SettingsError::new(
                        "mclock.pool_return",
                        format!("{v:?}"),
                        "expected \"off\" (the paper: every return re-based) or a duration up to 1 minute such \
                         as \"100ms\", \"0.5s\"",
                    )
                })?;
                Some(PoolReturn { window, ..c.pool_return.unwrap_or_default() })
            };
        }
        if let Some(v) = self.pool_return_lag_ios {
            if !(0..=MAX_COUNT_IOS).contains(&v) {
                return Err(SettingsError::new(
                    "mclock.pool_return_lag_ios",
                    v.to_string(),
                    format!("expected an IO count in 0..={MAX_COUNT_IOS}"),
                ));
            }
            match &mut c.pool_return {
                Some(p) => p.lag_ios = v as u32,
                None => {
                    return Err(SettingsError::new(
                        "mclock.pool_return_lag_ios",
                        v.to_string(),
                        "has no effect with pool_return = \"off\" (the paper preset turns it off; set \
                         pool_return to a duration)",
                    ))
                }
            }
        }
        Ok(c)
    }
}

/// Both `cost_model` and `mclock.cost_model` were given ([`with_cost_model_shorthand`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cost_model is given twice (as cost_model and as mclock.cost_model)")]
pub struct CostModelTwice;

/// The `[mclock]` table (`mclock`, none = empty) with a file's top-level `cost_model` shorthand folded in:
/// scenarios and rein.toml accept `cost_model` at the top as `[mclock] cost_model`, one or the other.
pub fn with_cost_model_shorthand(
    mclock: Option<&SchedSettingsFile>,
    cost_model: Option<&CostModelFile>,
) -> Result<SchedSettingsFile, CostModelTwice> {
    let mut settings = mclock.cloned().unwrap_or_default();
    if let Some(c) = cost_model {
        if settings.cost_model.is_some() {
            return Err(CostModelTwice);
        }
        settings.cost_model = Some(c.clone());
    }
    Ok(settings)
}

fn count_or_none(field: &'static str, v: &CountOrNone, none_means: &str) -> Result<Option<u32>, SettingsError> {
    match v {
        CountOrNone::Count(n) if (0..=MAX_COUNT_IOS).contains(n) => Ok(Some(*n as u32)),
        CountOrNone::Word(w) if w == "none" => Ok(None),
        _ => Err(SettingsError::new(
            field,
            v.to_string(),
            format!("expected an IO count in 0..={MAX_COUNT_IOS}, or \"none\" ({none_means})"),
        )),
    }
}

/// `reservation_lag`: "arrival", "unbounded", or a duration with a unit (ns, us, ms, s).
fn parse_reservation_lag(v: &str) -> Result<ReservationLag, SettingsError> {
    let bad = || {
        SettingsError::new(
            "mclock.reservation_lag",
            format!("{v:?}"),
            "expected \"arrival\" (the paper), \"unbounded\", or a duration up to 1 hour such as \"100ms\", \
             \"0.5s\", \"250us\"",
        )
    };
    match v {
        "arrival" => Ok(ReservationLag::Arrival),
        "unbounded" => Ok(ReservationLag::Unbounded),
        _ => parse_duration(v, MAX_RESERVATION_LAG).map(ReservationLag::Bounded).ok_or_else(bad),
    }
}

/// A duration with a unit (ns, us, ms, s), from 0 to `max`; `None` if it is not one.
fn parse_duration(v: &str, max: Nanos) -> Option<Nanos> {
    let split = v.find(|ch: char| ch.is_ascii_alphabetic())?;
    let (number, unit) = v.split_at(split);
    let ns_per_unit = match unit {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return None,
    };
    let x: f64 = number.trim().parse().ok()?;
    let ns = x * ns_per_unit;
    (ns.is_finite() && ns >= 0.0 && ns <= max.0 as f64).then(|| Nanos(ns.round() as u64))
}

/// A name that is no scheduler of a scenario ([`parse_scheduler`]): the core's kinds and the simulator's
/// `lfq` and `dtfq`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scheduler {name:?} (expected one of mclock, dmclock, rbfq, sfq, token, fifo, lfq, dtfq)")]
pub struct UnknownSimScheduler {
    /// The name given, in lower case as matched.
    pub name: String,
}

/// Parses a scheduler name; returns the kind and whether it is distributed (piggybacks delta/rho).
pub fn parse_scheduler(s: &str) -> Result<(SchedulerKind, bool), UnknownSimScheduler> {
    match s.to_ascii_lowercase().as_str() {
        "lfq" => Ok((SchedulerKind::Sfq, false)),
        "dtfq" => Ok((SchedulerKind::Sfq, true)),
        other => {
            let k: SchedulerKind =
                other.parse().map_err(|e: rein_core::UnknownScheduler| UnknownSimScheduler { name: e.name })?;
            Ok((k, matches!(k, SchedulerKind::Dmclock | SchedulerKind::Rbfq)))
        }
    }
}

/// A scheduler of a scenario as a name parses ([`parse_scheduler`]), with the name as given: the reports
/// name it so (`lfq` runs [`SchedulerKind::Sfq`] and reports `lfq`). `rein sim --scheduler NAME` parses
/// it once, on the command line (its [`FromStr`](std::str::FromStr)), and hands it on typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedScheduler {
    name: String,
    kind: SchedulerKind,
    distributed: bool,
}

impl NamedScheduler {
    /// The name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The core's scheduler it runs.
    pub fn kind(&self) -> SchedulerKind {
        self.kind
    }

    /// Whether it is distributed (piggybacks delta/rho).
    pub fn distributed(&self) -> bool {
        self.distributed
    }
}

impl std::str::FromStr for NamedScheduler {
    type Err = UnknownSimScheduler;

    fn from_str(s: &str) -> Result<NamedScheduler, UnknownSimScheduler> {
        let (kind, distributed) = parse_scheduler(s)?;
        Ok(NamedScheduler { name: s.to_string(), kind, distributed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_core::sched::DEFAULT_RESERVATION_LAG;

    fn parse(text: &str) -> SchedSettingsFile {
        toml::from_str(text).unwrap()
    }

    fn err(text: &str) -> String {
        parse(text).resolve().unwrap_err().to_string()
    }

    /// A name that is no scheduler: the core's list with the simulator's two names, built from the typed
    /// error's name (not by rewriting its text), in lower case as matched.
    #[test]
    fn an_unknown_scheduler_lists_the_simulators_names_too() {
        let e = parse_scheduler("WFQ").unwrap_err();
        assert_eq!(e, UnknownSimScheduler { name: "wfq".into() });
        assert_eq!(
            e.to_string(),
            "unknown scheduler \"wfq\" (expected one of mclock, dmclock, rbfq, sfq, token, fifo, lfq, dtfq)"
        );
        assert_eq!(parse_scheduler("DTFQ").unwrap(), (SchedulerKind::Sfq, true));
        assert_eq!(parse_scheduler("Rbfq").unwrap(), (SchedulerKind::Rbfq, true));
    }

    /// A named scheduler is what [`parse_scheduler`] makes of its name, with the name as given; a name
    /// that is none is refused as [`parse_scheduler`] refuses it.
    #[test]
    fn a_named_scheduler_keeps_its_name_as_given() {
        let s: NamedScheduler = "LFQ".parse().unwrap();
        assert_eq!((s.name(), s.kind(), s.distributed()), ("LFQ", SchedulerKind::Sfq, false));
        let s: NamedScheduler = "dmclock".parse().unwrap();
        assert_eq!((s.name(), s.kind(), s.distributed()), ("dmclock", SchedulerKind::Dmclock, true));
        assert_eq!("Wfq".parse::<NamedScheduler>().unwrap_err(), UnknownSimScheduler { name: "wfq".into() });
    }

    #[test]
    fn empty_table_is_the_default_and_paper_preset_is_paper() {
        assert_eq!(parse("").resolve().unwrap(), SchedConfig::default());
        assert_eq!(parse("preset = \"paper\"").resolve().unwrap(), SchedConfig::paper());
        assert_eq!(parse("preset = \"rein\"").resolve().unwrap(), SchedConfig::default());
    }

    #[test]
    fn every_field_maps_to_its_config_field() {
        let c = parse(
            r#"
            weight_lead_ios = "none"
            limit_burst_ios = 0
            reservation_lag = "unbounded"
            limited_reenter_at_vnow = false
            limit_mode = "break_when_idle"
            cost_model = { tm_ms = 5, bpeak_mb_s = 60 }
            batch = 8
            batch_distance_kb = 4096
            pool_return = "50ms"
            pool_return_lag_ios = 64
            "#,
        )
        .resolve()
        .unwrap();
        assert_eq!(c.weight_lead_ios, None);
        assert_eq!(c.limit_burst_ios, Some(0));
        assert_eq!(c.reservation_lag, ReservationLag::Unbounded);
        assert!(!c.limited_reenter_at_vnow);
        assert_eq!(c.limit_mode, LimitMode::BreakWhenIdle);
        assert_eq!(c.cost_model, CostModel::paper_disk());
        assert_eq!((c.batch, c.batch_distance), (8, 4 << 20));
        assert_eq!(c.pool_return, Some(PoolReturn { window: Nanos(50_000_000), lag_ios: 64 }));
        assert_eq!(parse("pool_return = \"off\"").resolve().unwrap().pool_return, None);
        assert_eq!(
            parse("preset = \"paper\"\npool_return = \"1s\"").resolve().unwrap().pool_return,
            Some(PoolReturn { window: Nanos(1_000_000_000), ..PoolReturn::default() })
        );
        let p = parse("preset = \"paper\"\nweight_lead_ios = 4\nlimit_burst_ios = \"none\"").resolve().unwrap();
        assert_eq!((p.weight_lead_ios, p.limit_burst_ios, p.reservation_lag), (Some(4), None, ReservationLag::Arrival));
    }

    #[test]
    fn durations() {
        let lag = |s: &str| parse_reservation_lag(s).unwrap();
        assert_eq!(lag("100ms"), ReservationLag::Bounded(DEFAULT_RESERVATION_LAG));
        assert_eq!(lag("0.1s"), ReservationLag::Bounded(DEFAULT_RESERVATION_LAG));
        assert_eq!(lag("250us"), ReservationLag::Bounded(Nanos(250_000)));
        assert_eq!(lag("0ns"), ReservationLag::Bounded(Nanos(0)));
        assert_eq!(lag("arrival"), ReservationLag::Arrival);
        for bad in ["100", "ms", "-1ms", "2h", "1e9s", "NaNs", "1 ms s", ""] {
            assert!(parse_reservation_lag(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        assert_eq!(
            err("weight_lead_ios = -3"),
            "mclock.weight_lead_ios = -3: expected an IO count in 0..=1048576, or \"none\" (no bound on the lead, \
             as in the paper)"
        );
        assert!(err("limit_burst_ios = \"never\"").starts_with("mclock.limit_burst_ios = \"never\": "));
        assert!(
            err("reservation_lag = \"soon\"").starts_with("mclock.reservation_lag = \"soon\": expected \"arrival\"")
        );
        assert!(err("limit_mode = \"loose\"").starts_with("mclock.limit_mode = \"loose\": expected \"strict\""));
        assert!(err("preset = \"1999\"").starts_with("mclock.preset = \"1999\""));
        assert!(err("batch = 0").starts_with("mclock.batch = 0: expected 1..=1024"));
        assert!(err("pool_return = \"2min\"").starts_with("mclock.pool_return = \"2min\": expected \"off\""));
        assert!(err("pool_return = \"61s\"").starts_with("mclock.pool_return = \"61s\""));
        assert!(err("pool_return_lag_ios = -1").starts_with("mclock.pool_return_lag_ios = -1: expected an IO count"));
        assert!(err("pool_return = \"off\"\npool_return_lag_ios = 8")
            .starts_with("mclock.pool_return_lag_ios = 8: has no effect with pool_return = \"off\""));
        assert!(err("batch = 5000").starts_with("mclock.batch = 5000"));
        assert!(err("batch_distance_kb = -1.0").starts_with("mclock.batch_distance_kb = -1"));
        assert!(err("cost_model = \"time\"").starts_with("mclock.cost_model = \"time\""));
        assert!(err("cost_model = { tm_ms = 0, bpeak_mb_s = 60 }").starts_with("mclock.cost_model = { tm_ms = 0"));
        assert!(err("cost_model = { tm_ms = 5, bpeak_mb_s = -1 }").contains("bpeak_mb_s in (0, 10^6]"));
        let unknown = toml::from_str::<SchedSettingsFile>("batchh = 8").unwrap_err().to_string();
        assert!(unknown.contains("unknown field `batchh`"), "{unknown}");
    }

    #[test]
    fn overlay_replaces_only_the_fields_given() {
        let scenario = parse("preset = \"paper\"\nbatch = 8");
        let server = parse("batch = 2\nlimit_mode = \"break_when_idle\"");
        let c = scenario.overlay(&server).resolve().unwrap();
        assert_eq!(c.batch, 2);
        assert_eq!(c.limit_mode, LimitMode::BreakWhenIdle);
        assert_eq!(c.reservation_lag, ReservationLag::Arrival);
        assert_eq!(scenario.overlay(&SchedSettingsFile::default()), scenario);
    }
}
