//! PARDA: latency-driven host flow control (parda.txt; flow-control-position.txt §3).
//!
//! # Model
//! Hosts share a storage array that has no QoS of its own. Each host keeps at most `w(t)` IOs (its
//! *window*, the issue-queue length) outstanding at the array and adjusts `w` once per control period
//! from a latency signal, like FAST TCP adjusts its congestion window from round-trip times (§3.1):
//!
//! ```text
//! L(t)   = (1 - alpha) * l + alpha * L(t-1)                                  eq. (1), per period
//! w(t+1) = (1 - gamma) * w(t) + gamma * (script_L / L(t) * w(t) + beta)       eq. (2), per period
//! ```
//!
//! with `w` clamped to `[w_min, w_max]` and `l` the mean latency of the IOs the host completed in the
//! period. Above the threshold `script_L` the window shrinks, below it grows; `beta`
//! is the host's share of the array, the sum of its VMs' shares (§3.2), lowered for VMs that do not use
//! their part of the window (§3.4, eq. (4)). Inside the host, a local scheduler (SFQ with locality
//! batching, §3.3, or mClock) divides the window among the VMs by their shares (and, with mClock, their
//! reservations and limits). The signal `L(t)` is either the host's own estimate (*local*, §4.1: fragile,
//! hosts diverge when placement makes their latencies differ) or the cluster-wide average over all
//! hosts (*aggregated*, §4.2), computed by [`Aggregator`] from per-host reports.
//!
//! # The pieces (all sans-IO: time and events in, decisions out)
//! - [`LatencyEstimator`]: eq. (1), with latency normalised to an 8 KiB IO by a linear size model (§4 "IO
//!   Size", flow-control-position §3.1: `latency = fixed + per_byte * size`).
//! - [`WindowController`]: eq. (2), bounds, and a fractional window issued without truncation.
//! - [`ShareTracker`]: beta from the VMs' shares with eq. (4)'s scaling of under-using VMs.
//! - [`HostController`]: one host: the three above plus the local scheduler (any [`crate::Scheduler`]).
//! - [`Aggregator`]: cluster-wide average latency from per-host [`HostReport`]s, robust to lost, stale,
//!   duplicate and late reports and to peers whose clocks jump.
//! - [`equilibrium_windows`], [`equilibrium_latency`]: eq. (3), the oracle for tests and `--check`;
//!   [`fixed_point_window`]: eq. (2)'s fixed point for one host at a given signal (`--check`'s
//!   `fixed_point`).
//!
//! A caller (the simulator, a daemon) drives a host like this:
//! ```text
//! VM IO arrives          -> host.enqueue(now, Request{tenant: vm, ..})
//! while let Dispatch(d) = host.poll(now) -> send d.handle to the array
//! IO completes           -> host.on_complete(now, vm, latency, size); poll again
//! now >= host.poll_timeout() ->
//!     report = host.close_period(now); publish it; feed the reports received into an Aggregator;
//!     host.on_period(now, aggregator.cluster(now) or host.local_estimate_ns())
//! ```
//!
//! # Paper symbols -> code
//! | paper | code |
//! |---|---|
//! | l (a latency observation) | the period's mean of the `latency` given to [`HostController::on_complete`] |
//! | L(t) | [`LatencyEstimator::estimate_ns`] (host), [`ClusterLatency::latency_ns`] (aggregated) |
//! | alpha (weight of the past in eq. (1)) | [`PardaConfig::alpha`] |
//! | w(t), w_min, w_max | [`WindowController::window`], [`PardaConfig::w_min`], [`PardaConfig::w_max`] |
//! | gamma | [`PardaConfig::gamma`] (smoothing of eq. (2)) |
//! | script-L (latency threshold) | [`PardaConfig::latency_threshold`] |
//! | beta (per-host share parameter) | [`HostController::beta`]; configured as [`HostConfig::beta`] |
//! | s_i (VM shares), K (beta = K sum s_i) | the VM's [`crate::QosSpec`] weight, [`HostConfig::beta_per_share`] |
//! | n_k, w_k, s'_k (eq. (4)) | [`VmUsage`] `mean_outstanding`, `window_share`, `scaled_share` |
//! | C (array capacity, IOs/s) | `capacity` of [`equilibrium_windows`] |
//! | control period (2 s in §5) | [`PardaConfig::period`] |
//! | latency per 8 KB, linear model | [`SizeModel`] |
//!
//! # Equilibrium (eq. (3)) and why it is exact here
//! At a fixed point of eq. (2) with every host seeing the same `L`: `w_i = script_L / L * w_i + beta_i`,
//! so `w_i = beta_i * L / (L - script_L)`: windows are proportional to beta. When the hosts are
//! backlogged the array holds `N = sum w_i` IOs and completes `C` per second, so by Little's law the
//! IO-weighted average latency over all hosts is exactly `N / C` (for any service discipline: per host
//! `N_h = X_h * L_h`, and `sum X_h L_h / sum X_h = N / C`). That is what the aggregated signal computes
//! (IO-count weighted, [`Aggregator`]). Solving `L = sum w / C` with the fixed point gives
//!
//! ```text
//! L* = script_L + sum_j beta_j / C        w_i* = beta_i + beta_i * C * script_L / sum_j beta_j   (eq. (3))
//! ```
//!
//! So eq. (3) holds exactly with `C` = the array's measured throughput, and the latency settles not at
//! `script_L` but `sum beta / C` above it (the additive `beta` term keeps the windows open). With the §5
//! numbers (4 hosts, beta = 1, C = 3,350 IOPS, script_L = 30 ms) that is 31.2 ms; the paper's Table 3
//! reports an average of 31 ms. [`equilibrium_latency`] gives `L*`; the simulator's checks say which of
//! the two a scenario is held to. Latency here is measured from the host's issue to its completion
//! (queueing at the array plus service), the paper's device latency.
//!
//! # How fast (convergence)
//! Summing eq. (2) over hosts with `L = sum w / C` gives `W' = (1 - gamma) W + gamma (C script_L +
//! sum beta)`: the *total* window settles by a factor `1 - gamma` per period (0.2 with the paper's gamma),
//! so latency returns near `L*` within a few periods of a capacity change. The *split* among hosts
//! settles more slowly: near equilibrium a host's deviation from eq. (3) shrinks by
//! `gamma * sum beta / (C script_L + sum beta)` per period, because only the additive beta term
//! differentiates the hosts. With Fig. 2's numbers (C = 400, script-L = 200 ms, sum beta = 6) that is
//! 5.6% per period (time constant 18 periods); a larger beta converges faster but settles further above
//! script-L. The simulator reports the convergence time of each host's window.
//!
//! # Invariants (asserted where they are made and where they are used)
//! 1. `w_min <= window <= w_max` after every update ([`WindowController`]).
//! 2. The issue limit is `floor(w)` or `floor(w) + 1`, and over any run of completions at a constant `w`
//!    the mean issue limit is `w` within one completion's worth (fractional carry in 2^-32 fixed point).
//! 3. A host issues only while `outstanding < issue limit`; after the window shrinks it issues nothing
//!    until completions bring `outstanding` under the limit (no IO is ever recalled).
//! 4. `0 <= beta <= beta_base`: eq. (4) only ever scales shares down (`s'_k <= s_k`).
//! 5. Time never goes backwards inside a host or an aggregator: an earlier `now` is treated as the latest
//!    seen and counted (as in the schedulers).
//! 6. The aggregator accepts a report only if it is newer (same epoch, higher sequence) or from a higher
//!    epoch (the peer restarted); a lower epoch only once the peer has been silent for `timeout`
//!    (`aggregate`, "Epochs move forward"); a peer is live while its last *new* report was received (by
//!    the local clock) less than `timeout` ago. The peer's own timestamp is never used for liveness.
//!
//! # Units and precision
//! Time is [`Nanos`]. Latencies are nanoseconds in `f64` (`*_ns`): smoothing state, as STYLE allows; the
//! window is an `f64` number of IOs. What reaches the array is an integer issue limit whose long-run mean
//! equals the window exactly (invariant 2), so rounding never drifts.
//!
//! # Deviations from the paper, and why
//! - **Fractional windows are dithered**, not truncated: the issue limit alternates between `floor(w)` and
//!   `ceil(w)` by error diffusion so its mean is `w`. Truncating would cost a host with `w = 4.3` 7% of
//!   its share and skew the ratios eq. (3) promises for small windows (§3.3 mentions fractional windows
//!   as an open problem for per-VM control).
//! - **eq. (1)'s observation `l` is a period's mean latency**, not one IO's: with the paper's
//!   `alpha = 0.002` (weight of the past) a per-IO average would be the last IO's latency alone, which
//!   with random service times swings by 100% from IO to IO and made the windows in our first simulations
//!   jump between w_min and w_max. The paper's "average latency ... measured over a fixed time period"
//!   (§3.2) is this. eq. (1) starts at the first period's mean instead of 0.
//! - **A period without any IO in the cluster holds the window** (no signal, nothing to react to).
//! - **n_k of eq. (4) is time-averaged** over the period: the VM's IOs at the host (queued plus issued),
//!   integrated over time and divided by the period length.
//! - **Reports carry the host's eq. (1) estimate and the period's IO count**; the cluster signal is their
//!   IO-count-weighted mean over live hosts (§4.2 says "average latency and number of IOs").

mod aggregate;
mod estimator;
mod host;
mod shares;
mod window;

pub use aggregate::{Accept, Aggregator, ClusterLatency, HostReport, PastEpochs, PeerState, EPOCHS_KEPT};
pub use estimator::{LatencyEstimator, SizeModel};
pub use host::{check_fixed_window, HostConfig, HostController, HostStats, PeriodOutcome};
pub use shares::{ShareTracker, VmUsage};
pub use window::WindowController;

use crate::units::{Nanos, Num};

/// Largest window (IOs); the paper's windows are at most 64, arrays queue a few thousand at most.
pub const MAX_WINDOW: f64 = 65_536.0;
/// Largest beta; shares are weights (at most [`crate::units::MAX_WEIGHT`]) times a normalisation constant.
pub const MAX_BETA: f64 = 1e6;
/// Largest number of hosts an [`Aggregator`] tracks; host ids are below this.
pub const MAX_HOSTS: u32 = 4096;
/// Largest number of VMs per host.
pub const MAX_VMS_PER_HOST: usize = 65_536;
/// Bytes latency is normalised to (§4: "latency per 8 KB").
pub const NORMALISED_IO_BYTES: u64 = 8192;

/// Why a PARDA parameter or call was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PardaError {
    /// [`PardaConfig::alpha`] is outside [0, 1] or NaN (the value given).
    #[error("alpha (eq. (1) weight of past latency) must be in [0, 1], got {}", Num(*.0))]
    Alpha(f64),
    /// [`PardaConfig::gamma`] is outside [0, 1] or NaN (the value given).
    #[error("gamma (eq. (2) smoothing) must be in [0, 1], got {}", Num(*.0))]
    Gamma(f64),
    /// [`PardaConfig::latency_threshold`] is zero (the value given, ns).
    #[error("latency threshold (script-L) must be positive, got {0} ns")]
    LatencyThreshold(u64),
    /// [`PardaConfig::period`] is zero.
    #[error("control period must be positive")]
    Period,
    /// [`PardaConfig::w_min`] is not a positive finite number at most [`MAX_WINDOW`].
    #[error("w_min must be positive and at most {max}, got {}", Num(*.value))]
    WMin {
        /// The w_min given, IOs.
        value: f64,
        /// [`MAX_WINDOW`].
        max: f64,
    },
    /// [`PardaConfig::w_max`] is not a finite number at most [`MAX_WINDOW`].
    #[error("w_max must be at most {max}, got {}", Num(*.value))]
    WMax {
        /// The w_max given, IOs.
        value: f64,
        /// [`MAX_WINDOW`].
        max: f64,
    },
    /// w_min is above w_max.
    #[error("w_min ({w_min}) must not exceed w_max ({w_max})")]
    WindowBounds {
        /// The w_min given, IOs.
        w_min: f64,
        /// The w_max given, IOs.
        w_max: f64,
    },
    /// [`PardaConfig::initial_window`] lies outside the window bounds.
    #[error("initial window {value} must lie in [w_min, w_max] = [{w_min}, {w_max}]")]
    InitialWindow {
        /// The initial window given, IOs.
        value: f64,
        /// The configured w_min, IOs.
        w_min: f64,
        /// The configured w_max, IOs.
        w_max: f64,
    },
    /// [`HostConfig::beta`] is not a positive finite number at most [`MAX_BETA`].
    #[error("beta must be a positive number at most {max}, got {}", Num(*.value))]
    Beta {
        /// The beta given.
        value: f64,
        /// [`MAX_BETA`].
        max: f64,
    },
    /// [`HostConfig::beta_per_share`] is not a positive finite number (the value given).
    #[error("beta per share must be a positive number, got {}", Num(*.0))]
    BetaPerShare(f64),
    /// A [`SizeModel`] with a negative or non-finite cost, or with both costs zero.
    #[error("size model: fixed and per-byte costs must be finite and non-negative, and not both zero (got {fixed_ns} ns + {per_byte_ns} ns/B)")]
    SizeModel {
        /// The fixed cost given, nanoseconds per IO.
        fixed_ns: f64,
        /// The transfer cost given, nanoseconds per byte.
        per_byte_ns: f64,
    },
    /// [`HostConfig::fixed_window`] is not a finite number in [1, [`MAX_WINDOW`]].
    #[error("fixed window must be in [1, {max}], got {}", Num(*.value))]
    FixedWindow {
        /// The fixed window given, IOs.
        value: f64,
        /// [`MAX_WINDOW`].
        max: f64,
    },
    /// [`HostController::set_fixed_window`] on a host that runs PARDA (its window is eq. (2)'s).
    #[error("only an uncontrolled host's fixed window can be set; a PARDA host's window follows eq. (2)")]
    NotFixed,
    /// [`HostController::set_period_end`] with an end before now or more than two periods after it
    /// (ns from now; negative: in the past).
    #[error(
        "the control period's end must be from now to two periods ahead ({} s), got {} s from now",
        Num(*.max_ns as f64 / 1e9),
        Num(*.ahead_ns as f64 / 1e9)
    )]
    PeriodEnd {
        /// The end asked for, ns after now (negative: before).
        ahead_ns: i128,
        /// Two periods, ns.
        max_ns: u64,
    },
    /// An [`Aggregator`] timeout of zero (no host would ever be live).
    #[error("aggregation timeout must be positive")]
    Timeout,
    /// A host id at or above [`MAX_HOSTS`], in a [`HostConfig`] or a [`HostReport`].
    #[error("host id {id} is out of range (at most {max} hosts)")]
    HostId {
        /// The host id given.
        id: u32,
        /// [`MAX_HOSTS`].
        max: u32,
    },
    /// [`HostController::add_vm`] beyond [`MAX_VMS_PER_HOST`].
    #[error("too many VMs on one host (limit {max})")]
    TooManyVms {
        /// [`MAX_VMS_PER_HOST`].
        max: usize,
    },
    /// A completion or failure reported while the host had no IO outstanding: the caller reported more
    /// completions than the host issued.
    #[error("completion for a host with no IO outstanding (the caller reported more completions than issues)")]
    UnexpectedCompletion,
    /// The host's local scheduler refused the call.
    #[error("scheduler: {0}")]
    Sched(#[from] crate::sched::SchedError),
}

/// Validated PARDA parameters shared by the hosts of a cluster (§5 uses alpha = 0.002, gamma = 0.8,
/// a 2 s period). Build with [`PardaConfig::new`] or adjust the [`Default`] and call
/// [`PardaConfig::validate`].
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PardaConfig {
    /// script-L: the cluster latency the control aims at.
    pub latency_threshold: Nanos,
    /// eq. (1): weight of the past, per period, in [0, 1] (1 = never update, 0 = the last period only).
    pub alpha: f64,
    /// eq. (2): smoothing, in [0, 1] (0 = never move, 1 = jump to the target at once).
    pub gamma: f64,
    /// Control period: the window is updated once per period.
    pub period: Nanos,
    /// Smallest window (IOs): `0 < w_min <= w_max`.
    pub w_min: f64,
    /// Largest window (IOs): `w_max <= MAX_WINDOW`; also the default initial window.
    pub w_max: f64,
    /// Window before the first update (default: `w_max`, an uncontrolled host's issue queue).
    pub initial_window: Option<f64>,
    /// Latency normalisation by IO size (default: none).
    pub size_model: SizeModel,
    /// §3.4: scale the shares of VMs that do not use their part of the window (eq. (4)).
    pub adjust_beta: bool,
}

impl Default for PardaConfig {
    fn default() -> Self {
        PardaConfig {
            latency_threshold: Nanos::from_millis(30),
            alpha: 0.002,
            gamma: 0.8,
            period: Nanos::from_secs(2),
            w_min: 1.0,
            w_max: 64.0,
            initial_window: None,
            size_model: SizeModel::NONE,
            adjust_beta: true,
        }
    }
}

impl PardaConfig {
    /// Validates and builds a config with the given core parameters and defaults for the rest.
    pub fn new(latency_threshold: Nanos, alpha: f64, gamma: f64, w_min: f64, w_max: f64) -> Result<Self, PardaError> {
        let c = PardaConfig { latency_threshold, alpha, gamma, w_min, w_max, ..PardaConfig::default() };
        c.validate()?;
        Ok(c)
    }

    /// Checks every field; returns the first problem found.
    pub fn validate(&self) -> Result<(), PardaError> {
        if !(0.0..=1.0).contains(&self.alpha) {
            return Err(PardaError::Alpha(self.alpha));
        }
        if !(0.0..=1.0).contains(&self.gamma) {
            return Err(PardaError::Gamma(self.gamma));
        }
        if self.latency_threshold == Nanos::ZERO {
            return Err(PardaError::LatencyThreshold(0));
        }
        if self.period == Nanos::ZERO {
            return Err(PardaError::Period);
        }
        if !(self.w_min.is_finite() && self.w_min > 0.0 && self.w_min <= MAX_WINDOW) {
            return Err(PardaError::WMin { value: self.w_min, max: MAX_WINDOW });
        }
        if !(self.w_max.is_finite() && self.w_max <= MAX_WINDOW) {
            return Err(PardaError::WMax { value: self.w_max, max: MAX_WINDOW });
        }
        if self.w_min > self.w_max {
            return Err(PardaError::WindowBounds { w_min: self.w_min, w_max: self.w_max });
        }
        if let Some(w) = self.initial_window {
            if !(w >= self.w_min && w <= self.w_max) {
                return Err(PardaError::InitialWindow { value: w, w_min: self.w_min, w_max: self.w_max });
            }
        }
        self.size_model.validate()?;
        Ok(())
    }

    /// script-L in nanoseconds as `f64`.
    pub fn threshold_ns(&self) -> f64 {
        self.latency_threshold.0 as f64
    }
}

/// eq. (3): the equilibrium windows `w_i = beta_i + beta_i * C * script_L / sum_j beta_j` of hosts with
/// shares `betas` on an array completing `capacity` IOs per second, for a latency threshold of
/// `latency_threshold_s` seconds. Exact for the aggregated signal (module comment). Hosts with beta 0
/// get 0; an empty or all-zero `betas` gives zeros.
pub fn equilibrium_windows(betas: &[f64], capacity: f64, latency_threshold_s: f64) -> Vec<f64> {
    let sum: f64 = betas.iter().filter(|b| **b > 0.0).sum();
    betas
        .iter()
        .map(|&b| if b > 0.0 && sum > 0.0 { b + b * capacity * latency_threshold_s / sum } else { 0.0 })
        .collect()
}

/// eq. (2)'s fixed point for one host: the window `beta L / (L - script_L)` that eq. (2) keeps at a latency
/// signal held at `latency` (module comment), whatever the other hosts do; `latency` and
/// `latency_threshold` in one unit. NaN where the signal is not above script-L (eq. (2) then grows the
/// window without bound, to w_max).
pub fn fixed_point_window(beta: f64, latency: f64, latency_threshold: f64) -> f64 {
    if latency > latency_threshold {
        beta * latency / (latency - latency_threshold)
    } else {
        f64::NAN
    }
}

/// The latency (seconds) at eq. (3)'s equilibrium: `script_L + sum beta / C` (module comment).
pub fn equilibrium_latency(betas: &[f64], capacity: f64, latency_threshold_s: f64) -> f64 {
    let sum: f64 = betas.iter().filter(|b| **b > 0.0).sum();
    if capacity > 0.0 {
        latency_threshold_s + sum / capacity
    } else {
        f64::INFINITY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers_and_valid() {
        let c = PardaConfig::default();
        c.validate().unwrap();
        assert_eq!((c.alpha, c.gamma, c.period), (0.002, 0.8, Nanos::from_secs(2)));
    }

    #[test]
    fn bad_parameters_get_clear_errors() {
        let ms = Nanos::from_millis(30);
        let e = PardaConfig::new(ms, 1.5, 0.8, 1.0, 64.0).unwrap_err();
        assert_eq!(e, PardaError::Alpha(1.5));
        assert!(e.to_string().contains("alpha") && e.to_string().contains("[0, 1]"), "{e}");
        assert_eq!(PardaConfig::new(ms, -0.1, 0.8, 1.0, 64.0).unwrap_err(), PardaError::Alpha(-0.1));
        assert!(matches!(PardaConfig::new(ms, f64::NAN, 0.8, 1.0, 64.0), Err(PardaError::Alpha(_))));
        let e = PardaConfig::new(ms, 0.5, 1.01, 1.0, 64.0).unwrap_err();
        assert!(e.to_string().contains("gamma"), "{e}");
        assert!(matches!(PardaConfig::new(ms, 0.5, -1.0, 1.0, 64.0), Err(PardaError::Gamma(_))));
        let e = PardaConfig::new(ms, 0.5, 0.5, 65.0, 64.0).unwrap_err();
        assert_eq!(e, PardaError::WindowBounds { w_min: 65.0, w_max: 64.0 });
        assert!(e.to_string().contains("w_min (65) must not exceed w_max (64)"), "{e}");
        assert!(matches!(PardaConfig::new(ms, 0.5, 0.5, 0.0, 64.0), Err(PardaError::WMin { .. })));
        assert!(matches!(PardaConfig::new(ms, 0.5, 0.5, 1.0, f64::INFINITY), Err(PardaError::WMax { .. })));
        assert!(matches!(PardaConfig::new(ms, 0.5, 0.5, 1.0, MAX_WINDOW + 1.0), Err(PardaError::WMax { .. })));
        let e = PardaConfig::new(Nanos::ZERO, 0.5, 0.5, 1.0, 64.0).unwrap_err();
        assert!(e.to_string().contains("latency threshold"), "{e}");
        let c = PardaConfig { period: Nanos::ZERO, ..PardaConfig::default() };
        assert_eq!(c.validate(), Err(PardaError::Period));
        let c = PardaConfig { initial_window: Some(100.0), ..PardaConfig::default() };
        assert!(matches!(c.validate(), Err(PardaError::InitialWindow { .. })));
        // The bounds themselves are accepted.
        PardaConfig::new(ms, 0.0, 0.0, 1.0, 1.0).unwrap();
        PardaConfig::new(ms, 1.0, 1.0, MAX_WINDOW, MAX_WINDOW).unwrap();
    }

    #[test]
    fn eq3_numbers() {
        // Fig. 2: shares 1:2:3, script-L = 200 ms, C = 400 req/s: C L = 80 IOs split 1:2:3 plus beta.
        let w = equilibrium_windows(&[1.0, 2.0, 3.0], 400.0, 0.2);
        let want = [1.0 + 80.0 / 6.0, 2.0 + 160.0 / 6.0, 3.0 + 240.0 / 6.0];
        for (a, b) in w.iter().zip(want) {
            assert!((a - b).abs() < 1e-9, "{w:?}");
        }
        // Little's law at the equilibrium: sum w / C equals the equilibrium latency.
        let l = equilibrium_latency(&[1.0, 2.0, 3.0], 400.0, 0.2);
        assert!((w.iter().sum::<f64>() / 400.0 - l).abs() < 1e-12);
        assert!((l - 0.215).abs() < 1e-12);
        assert_eq!(equilibrium_windows(&[0.0, 0.0], 100.0, 0.1), vec![0.0, 0.0]);
        assert_eq!(equilibrium_windows(&[], 100.0, 0.1), Vec::<f64>::new());
    }
}
