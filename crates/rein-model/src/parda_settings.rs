//! PARDA's `[parda]` table (parda.txt §3-4): the control law every host of a cluster runs, as a
//! scenario file writes it and as `rein gateway` reads it when it runs as a PARDA host. One serde struct,
//! [`PardaFile`], one validator, [`PardaFile::validate`], so a setting tried in the simulator means the
//! same on a real host (as [`crate::sched_settings`] does for `[mclock]`).
//!
//! ```toml
//! [parda]
//! latency_threshold_ms = 30   # script-L (required)
//! alpha = 0.002               # eq. (1): weight of the past, per period
//! gamma = 0.8                 # eq. (2): smoothing
//! period_s = 2                # the control period
//! w_min = 1                   # window bounds (IOs); w_max is also an uncontrolled host's issue queue
//! w_max = 64
//! initial_window = 32         # optional (default w_max)
//! aggregation = "cluster"     # cluster (§4.2: the cluster's average latency) | local (§4.1)
//! aggregation_timeout_s = 6   # hosts silent this long drop out of the average (default 3 periods)
//! aggregation_delay_ms = 0    # the simulator only: the shared board's write-then-read delay
//! period_phase = "staggered"  # where each host's periods tick: staggered (host order) | seed
//! beta_per_share = 1          # K of §3.4: beta = K x the sum of the host's VMs' weights
//! adjust_beta = true          # §3.4 eq. (4)
//! local_scheduler = "sfq"     # sfq | mclock | fifo: the scheduler that divides a host's window
//! batch = 1                   # §3.3 locality batching (1 = off)
//! batch_distance_kb = 4096
//! size_model = { fixed_ms = 5, transfer_mb_s = 60 }   # optional: latency normalised per 8 KiB
//! enabled = true              # false: every host keeps a fixed issue queue (a baseline)
//! ```
//!
//! What is per host (its id, its beta, whether it is controlled, its fixed window, and on a real host
//! the transport of the cluster aggregation) is not here: a scenario's `[[hosts]]` and a gateway's
//! `[parda_host]` say it.

use crate::sched_settings::{parse_scheduler, UnknownSimScheduler};
use rand::Rng;
use rein_core::parda::{PardaConfig, SizeModel};
use rein_core::{Nanos, Num, SchedulerKind};
use serde::Deserialize;

fn d_alpha() -> f64 {
    0.002
}
fn d_gamma() -> f64 {
    0.8
}
fn d_period() -> f64 {
    2.0
}
fn d_w_min() -> f64 {
    1.0
}
fn d_w_max() -> f64 {
    64.0
}
fn d_one() -> f64 {
    1.0
}
fn d_true() -> bool {
    true
}
fn d_cluster() -> String {
    "cluster".into()
}
fn d_sfq() -> String {
    "sfq".into()
}

/// `[parda]`: parameters shared by every host.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PardaFile {
    /// script-L: the cluster latency the hosts' control aims at (ms; positive, at most an hour).
    pub latency_threshold_ms: f64,
    /// eq. (1): weight of the past in the latency estimate, per period (default 0.002, in [0, 1]).
    #[serde(default = "d_alpha")]
    pub alpha: f64,
    /// eq. (2): smoothing of the window's step towards its target (default 0.8, in [0, 1]).
    #[serde(default = "d_gamma")]
    pub gamma: f64,
    /// The control period (s, default 2, in [0.001, 3600]): each PARDA host updates its window once per
    /// period.
    #[serde(default = "d_period")]
    pub period_s: f64,
    /// Smallest window (IOs, default 1).
    #[serde(default = "d_w_min")]
    pub w_min: f64,
    /// Largest window (IOs, default 64): also the default fixed issue queue of uncontrolled hosts.
    #[serde(default = "d_w_max")]
    pub w_max: f64,
    /// Window before the first update (IOs; default w_max).
    pub initial_window: Option<f64>,
    /// "cluster" (§4.2) or "local" (§4.1).
    #[serde(default = "d_cluster")]
    pub aggregation: String,
    /// How long after a host publishes its report the others can read it (ms, default 0): the shared
    /// board's write-then-read latency.
    #[serde(default)]
    pub aggregation_delay_ms: f64,
    /// Hosts silent this long drop out of the average (default 3 periods).
    pub aggregation_timeout_s: Option<f64>,
    /// Where in the period each host's control periods tick, counted from the run's start:
    /// "staggered" (default, also when `None`): host i at i / hosts of a period, in host order; "seed": a
    /// phase per host drawn from the run's seed. `rein cluster` puts its real hosts' periods there too; a
    /// host run on its own ticks from its start (`rein gateway` refuses the key: `None` tells it apart).
    #[serde(default)]
    pub period_phase: Option<String>,
    /// K of §3.4: a host's beta is K times the sum of its VMs' weights unless the host sets `beta`.
    #[serde(default = "d_one")]
    pub beta_per_share: f64,
    /// §3.4 eq. (4): scale under-using VMs' shares.
    #[serde(default = "d_true")]
    pub adjust_beta: bool,
    /// The hosts' local scheduler: sfq (default) or mclock (or fifo).
    #[serde(default = "d_sfq")]
    pub local_scheduler: String,
    /// Local locality batching (§3.3): batch size (default 1 = off, at most 1024).
    pub batch: Option<u32>,
    /// Local locality batching: largest distance from one request of a batch to the next (KiB, default
    /// 4096).
    pub batch_distance_kb: Option<f64>,
    /// Latency normalisation per 8 KiB: cost(size) = fixed_ms + size / transfer_mb_s.
    pub size_model: Option<SizeModelFile>,
    /// false: every host is uncontrolled (the no-PARDA baseline of the same scenario).
    #[serde(default = "d_true")]
    pub enabled: bool,
}

/// `size_model = { .. }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SizeModelFile {
    /// Fixed cost per IO (ms).
    pub fixed_ms: f64,
    /// Transfer rate (MB/s).
    pub transfer_mb_s: f64,
}

/// Which latency signal the hosts use.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Aggregation {
    /// §4.2: the cluster's average latency.
    Cluster,
    /// §4.1: each host's own estimate.
    Local,
}

impl Aggregation {
    /// The name as scenario files write it.
    pub fn name(self) -> &'static str {
        match self {
            Aggregation::Cluster => "cluster",
            Aggregation::Local => "local",
        }
    }
}

/// Where in the control period each host's periods tick, counted from a run's start
/// ([`Parda::first_period_end`]): the simulator's hosts, and `rein cluster`'s real ones.
///
/// Which host ends its first period first decides a run's start when the windows begin far from
/// eq. (3)'s: the first to grow its window fills the shared array ahead of the others and sees the
/// lowest latency at its next tick.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PeriodPhase {
    /// Host i's first period ends at `period * (1 + i / hosts)`: evenly spread, the first host first.
    Staggered,
    /// Host i's first period ends at `period * (1 + u_i)`, `u_i` uniform in [0, 1) drawn from the run's
    /// seed (stream [`crate::seed::host_stream`]): no host order preferred, a different one per seed.
    Seed,
}

impl PeriodPhase {
    /// The name as scenario files write it.
    pub fn name(self) -> &'static str {
        match self {
            PeriodPhase::Seed => "seed",
            PeriodPhase::Staggered => "staggered",
        }
    }
}

/// The validated `[parda]` table.
#[derive(Debug, Clone)]
pub struct Parda {
    /// The control law every PARDA host runs (script-L, alpha, gamma, the period, window bounds, the size
    /// model), validated by rein-core.
    pub config: PardaConfig,
    /// Which latency signal the hosts use.
    pub aggregation: Aggregation,
    /// How long after a host publishes its report the others can read it (cluster aggregation; at most
    /// an hour).
    pub delay: Nanos,
    /// Hosts silent this long drop out of the cluster average (default 3 periods).
    pub timeout: Nanos,
    /// Where in the period each host's periods tick.
    pub phase: PeriodPhase,
    /// K of §3.4: a host's beta is K times the sum of its VMs' weights unless the host sets its own.
    pub beta_per_share: f64,
    /// The scheduler that divides a host's window among its VMs (sfq, mclock or fifo; never a
    /// distributed one).
    pub local_scheduler: SchedulerKind,
    /// Locality batching in the local scheduler (§3.3): batch size, 1..=1024 (1 = off).
    pub batch: u32,
    /// Locality batching: largest distance (bytes) from one request of a batch to the next (default
    /// 4 MiB).
    pub batch_distance: u64,
    /// false: every host keeps a fixed issue queue (the no-PARDA baseline of the same scenario).
    pub enabled: bool,
}

impl Parda {
    /// When host `host` (of `hosts`) ends its first control period in a run started at zero under
    /// `seed`: between one and two periods in ([`PeriodPhase`]).
    pub fn first_period_end(&self, seed: u64, host: usize, hosts: usize) -> Nanos {
        let period = self.config.period.0;
        let phase = match self.phase {
            PeriodPhase::Staggered => period * host as u64 / hosts.max(1) as u64,
            PeriodPhase::Seed => crate::seed::stream_rng(seed, crate::seed::host_stream(host)).gen_range(0..period),
        };
        Nanos(period + phase)
    }
}

/// Whether `v` is finite and in `[lo, hi]`.
fn within(v: f64, lo: f64, hi: f64) -> bool {
    v.is_finite() && v >= lo && v <= hi
}

/// The largest `batch`.
pub const MAX_BATCH: u32 = 1024;

/// Why a `[parda]` key is refused ([`PardaFile::validate`]); every message starts with `parda:` and names
/// the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PardaSettingsError {
    /// `latency_threshold_ms` not positive, or above an hour.
    #[error("parda: latency_threshold_ms (script-L) must be positive and at most an hour, got {got}")]
    LatencyThreshold {
        /// The value given.
        got: f64,
    },
    /// A number outside `[min, max]` or not finite (`period_s`, `aggregation_delay_ms`,
    /// `aggregation_timeout_s`).
    #[error("parda: {key} must be between {min} and {max}, got {}", Num(*got))]
    Range {
        /// The key.
        key: &'static str,
        /// The smallest accepted.
        min: f64,
        /// The largest accepted.
        max: f64,
        /// The value given.
        got: f64,
    },
    /// `size_model.fixed_ms` negative or not finite.
    #[error("parda: size_model.fixed_ms must be non-negative, got {got}")]
    FixedMs {
        /// The value given.
        got: f64,
    },
    /// `size_model.transfer_mb_s` not positive.
    #[error("parda: size_model.transfer_mb_s must be positive, got {got}")]
    TransferMbS {
        /// The value given.
        got: f64,
    },
    /// rein-core refuses the control law's parameters (`alpha`, `gamma`, `w_min`, ...).
    #[error("parda: {0}")]
    Config(rein_core::parda::PardaError),
    /// `aggregation` is neither `cluster` nor `local`.
    #[error("parda: aggregation {got:?}: expected \"cluster\" or \"local\"")]
    Aggregation {
        /// The word given.
        got: String,
    },
    /// `period_phase` is neither `seed` nor `staggered`.
    #[error("parda: period_phase {got:?}: expected \"seed\" or \"staggered\"")]
    PeriodPhase {
        /// The word given.
        got: String,
    },
    /// `beta_per_share` not positive, or above 1e6.
    #[error("parda: beta_per_share must be positive, got {got}")]
    BetaPerShare {
        /// The value given.
        got: f64,
    },
    /// `local_scheduler` names no scheduler.
    #[error("parda: local_scheduler: {0}")]
    LocalScheduler(UnknownSimScheduler),
    /// `local_scheduler` names a distributed scheduler.
    #[error("parda: local_scheduler {name:?} is a distributed scheduler; use sfq, mclock or fifo")]
    DistributedLocalScheduler {
        /// The name given.
        name: String,
    },
    /// `batch` outside `1..=max`.
    #[error("parda: batch must be in 1..={max}, got {got}")]
    Batch {
        /// The value given.
        got: u32,
        /// The largest accepted ([`MAX_BATCH`]).
        max: u32,
    },
    /// `batch_distance_kb` outside `0..=max` KiB or not finite.
    #[error("parda: batch_distance_kb must be in 0..={max} KiB (1 TiB), got {}", Num(*got))]
    BatchDistance {
        /// The value given.
        got: f64,
        /// The largest accepted ([`crate::sched_settings::MAX_BATCH_DISTANCE_KB`]).
        max: f64,
    },
}

impl PardaFile {
    /// Validates the table: rein-core checks the control law; every message starts with `parda:` and
    /// names the key.
    pub fn validate(&self) -> Result<Parda, PardaSettingsError> {
        validate_parda(self)
    }
}

fn validate_parda(p: &PardaFile) -> Result<Parda, PardaSettingsError> {
    type E = PardaSettingsError;
    let range = |key: &'static str, got: f64, min: f64, max: f64| {
        if within(got, min, max) {
            Ok(got)
        } else {
            Err(E::Range { key, min, max, got })
        }
    };
    if !(p.latency_threshold_ms.is_finite() && p.latency_threshold_ms > 0.0 && p.latency_threshold_ms <= 3.6e6) {
        return Err(E::LatencyThreshold { got: p.latency_threshold_ms });
    }
    let period = range("period_s", p.period_s, 0.001, 3600.0)?;
    let size_model = match &p.size_model {
        None => SizeModel::NONE,
        Some(m) => {
            if !(m.fixed_ms.is_finite() && m.fixed_ms >= 0.0) {
                return Err(E::FixedMs { got: m.fixed_ms });
            }
            SizeModel::from_rate(Nanos::from_secs_f64(m.fixed_ms / 1e3), m.transfer_mb_s)
                .map_err(|_| E::TransferMbS { got: m.transfer_mb_s })?
        }
    };
    let config = PardaConfig {
        latency_threshold: Nanos::from_secs_f64(p.latency_threshold_ms / 1e3),
        alpha: p.alpha,
        gamma: p.gamma,
        period: Nanos::from_secs_f64(period),
        w_min: p.w_min,
        w_max: p.w_max,
        initial_window: p.initial_window,
        size_model,
        adjust_beta: p.adjust_beta,
    };
    config.validate().map_err(E::Config)?;
    let aggregation = match p.aggregation.as_str() {
        "cluster" => Aggregation::Cluster,
        "local" => Aggregation::Local,
        o => return Err(E::Aggregation { got: o.to_string() }),
    };
    let phase = match p.period_phase.as_deref().unwrap_or("staggered") {
        "seed" => PeriodPhase::Seed,
        "staggered" => PeriodPhase::Staggered,
        o => return Err(E::PeriodPhase { got: o.to_string() }),
    };
    let delay = range("aggregation_delay_ms", p.aggregation_delay_ms, 0.0, 3.6e6)?;
    let timeout = range("aggregation_timeout_s", p.aggregation_timeout_s.unwrap_or(3.0 * period), 0.001, 86_400.0)?;
    if !(p.beta_per_share.is_finite() && p.beta_per_share > 0.0 && p.beta_per_share <= 1e6) {
        return Err(E::BetaPerShare { got: p.beta_per_share });
    }
    let (local_scheduler, distributed) = parse_scheduler(&p.local_scheduler).map_err(E::LocalScheduler)?;
    if distributed {
        return Err(E::DistributedLocalScheduler { name: p.local_scheduler.clone() });
    }
    let batch = p.batch.unwrap_or(1);
    if batch == 0 || batch > MAX_BATCH {
        return Err(E::Batch { got: batch, max: MAX_BATCH });
    }
    // The bound of [mclock]'s field: 1e300 KiB became u64::MAX bytes by the float-to-integer cast.
    let bd = p.batch_distance_kb.unwrap_or(4096.0);
    if !(bd.is_finite() && (0.0..=crate::sched_settings::MAX_BATCH_DISTANCE_KB).contains(&bd)) {
        return Err(E::BatchDistance { got: bd, max: crate::sched_settings::MAX_BATCH_DISTANCE_KB });
    }
    Ok(Parda {
        config,
        aggregation,
        delay: Nanos::from_secs_f64(delay / 1e3),
        timeout: Nanos::from_secs_f64(timeout),
        phase,
        beta_per_share: p.beta_per_share,
        local_scheduler,
        batch,
        batch_distance: (bd * 1024.0) as u64,
        enabled: p.enabled,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusals are typed: the key, the value and the bound.
    #[test]
    fn refusals_are_typed_with_the_key_value_and_bound() {
        type E = PardaSettingsError;
        let err = |text: &str| toml::from_str::<PardaFile>(text).unwrap().validate().map(|_| ()).expect_err(text);
        let l = "latency_threshold_ms = 30\n";
        let e = err(&format!("{l}aggregation_timeout_s = 86401\n"));
        assert!(
            matches!(e, E::Range { key: "aggregation_timeout_s", min, max, got } if min == 0.001 && max == 86_400.0 && got == 86_401.0),
            "{e:?}"
        );
        let e = err(&format!("{l}period_s = 3601\n"));
        assert!(matches!(e, E::Range { key: "period_s", .. }), "{e:?}");
        let e = err(&format!("{l}gamma = 2\n"));
        assert!(matches!(e, E::Config(_)), "{e:?}");
        let e = err(&format!("{l}local_scheduler = \"WFQ\"\n"));
        assert_eq!(e, E::LocalScheduler(UnknownSimScheduler { name: "wfq".into() }));
        let e = err(&format!("{l}local_scheduler = \"dtfq\"\n"));
        assert_eq!(e, E::DistributedLocalScheduler { name: "dtfq".into() });
        assert_eq!(err(&format!("{l}batch = 0\n")), E::Batch { got: 0, max: MAX_BATCH });
        assert!(parda("batch = 1024").batch == 1024, "at the bound");
        let e = err(&format!("{l}batch_distance_kb = 1e300\n"));
        assert!(matches!(e, E::BatchDistance { got, max } if got == 1e300 && max == (1u64 << 30) as f64), "{e:?}");
        let e = err(&format!("{l}aggregation = \"global\"\n"));
        assert_eq!(e, E::Aggregation { got: "global".into() });
    }

    /// Each refusal's whole message, as the validation returning strings wrote it.
    #[test]
    fn refusals_read_as_before() {
        let err =
            |text: &str| toml::from_str::<PardaFile>(text).unwrap().validate().map(|_| ()).expect_err(text).to_string();
        let l = "latency_threshold_ms = 30\n";
        for (text, want) in [
            ("latency_threshold_ms = -1\n".to_string(), "parda: latency_threshold_ms (script-L) must be positive and at most an hour, got -1".to_string()),
            (format!("{l}period_s = 0\n"), "parda: period_s must be between 0.001 and 3600, got 0".into()),
            (format!("{l}aggregation_delay_ms = 1e7\n"), "parda: aggregation_delay_ms must be between 0 and 3600000, got 10000000".into()),
            (format!("{l}aggregation_timeout_s = 0\n"), "parda: aggregation_timeout_s must be between 0.001 and 86400, got 0".into()),
            (format!("{l}[size_model]\nfixed_ms = -1\ntransfer_mb_s = 100\n"), "parda: size_model.fixed_ms must be non-negative, got -1".into()),
            (format!("{l}[size_model]\nfixed_ms = 1\ntransfer_mb_s = 0\n"), "parda: size_model.transfer_mb_s must be positive, got 0".into()),
            (format!("{l}gamma = 2\n"), "parda: gamma (eq. (2) smoothing) must be in [0, 1], got 2".into()),
            (format!("{l}aggregation = \"global\"\n"), "parda: aggregation \"global\": expected \"cluster\" or \"local\"".into()),
            (format!("{l}period_phase = \"random\"\n"), "parda: period_phase \"random\": expected \"seed\" or \"staggered\"".into()),
            (format!("{l}beta_per_share = 0\n"), "parda: beta_per_share must be positive, got 0".into()),
            (format!("{l}local_scheduler = \"WFQ\"\n"), "parda: local_scheduler: unknown scheduler \"wfq\" (expected one of mclock, dmclock, rbfq, sfq, token, fifo, lfq, dtfq)".into()),
            (format!("{l}local_scheduler = \"dmclock\"\n"), "parda: local_scheduler \"dmclock\" is a distributed scheduler; use sfq, mclock or fifo".into()),
            (format!("{l}batch = 1025\n"), "parda: batch must be in 1..=1024, got 1025".into()),
            (format!("{l}batch_distance_kb = -1\n"), "parda: batch_distance_kb must be in 0..=1073741824 KiB (1 TiB), got -1".into()),
        ] {
            assert_eq!(err(&text), want, "{text}");
        }
    }

    fn parda(extra: &str) -> Parda {
        let text = format!("latency_threshold_ms = 30\nperiod_s = 2\n{extra}");
        toml::from_str::<PardaFile>(&text).unwrap().validate().unwrap()
    }

    #[test]
    fn first_periods_end_between_one_and_two_periods_in() {
        let s = parda("");
        assert_eq!(s.phase, PeriodPhase::Staggered, "the default");
        let ends: Vec<u64> = (0..4).map(|h| s.first_period_end(7, h, 4).0).collect();
        assert_eq!(ends, [2_000_000_000, 2_500_000_000, 3_000_000_000, 3_500_000_000]);
        let s = parda("period_phase = \"seed\"");
        let a: Vec<u64> = (0..64).map(|h| s.first_period_end(7, h, 64).0).collect();
        assert!(a.iter().all(|e| (2_000_000_000..4_000_000_000).contains(e)), "{a:?}");
        assert_eq!(a, (0..64).map(|h| s.first_period_end(7, h, 64).0).collect::<Vec<_>>(), "a function of the seed");
        assert_ne!(a, (0..64).map(|h| s.first_period_end(8, h, 64).0).collect::<Vec<_>>(), "another seed, others");
        // Spread over the period: a quarter of 64 uniform draws in each quarter, give or take.
        for q in 0..4u64 {
            let n = a.iter().filter(|&&e| (e - 2_000_000_000) / 500_000_000 == q).count();
            assert!((6..=28).contains(&n), "quarter {q}: {n} of 64");
        }
        assert_eq!(s.first_period_end(7, 3, 64), s.first_period_end(7, 3, 5), "a host's phase is its own");
        let e = toml::from_str::<PardaFile>("latency_threshold_ms = 30\nperiod_phase = \"random\"").unwrap().validate();
        assert_eq!(e.unwrap_err().to_string(), "parda: period_phase \"random\": expected \"seed\" or \"staggered\"");
    }

    /// `batch_distance_kb` keeps to [mclock]'s bound (1 TiB): it had none, and 1e300 KiB ran as
    /// u64::MAX bytes.
    #[test]
    fn batch_distance_has_the_mclock_fields_bound() {
        let e = |v: &str| {
            toml::from_str::<PardaFile>(&format!("latency_threshold_ms = 30\nbatch_distance_kb = {v}"))
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string()
        };
        assert_eq!(e("1e300"), "parda: batch_distance_kb must be in 0..=1073741824 KiB (1 TiB), got 1e300");
        assert!(e("-1").contains("got -1"));
        assert_eq!(parda(&format!("batch_distance_kb = {}", 1u64 << 30)).batch_distance, 1 << 40);
    }
}
