//! `[parda]` and `[[hosts]]` as written (parda.txt; validated by [`crate::model::parda`]).

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

/// `[[hosts]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFile {
    /// Its name (unique; `all` is reserved for expectations about the whole cluster).
    pub name: String,
    /// beta; default: `beta_per_share` times the sum of the host's VMs' weights.
    pub beta: Option<f64>,
    /// Runs PARDA (else a fixed issue queue).
    #[serde(default = "d_true")]
    pub controlled: bool,
    /// Uncontrolled hosts only: the fixed issue queue (IOs, default w_max).
    pub window: Option<f64>,
    /// Multiplier on this host's service times at the array (placement skew; default 1, in [0.001, 1000]).
    #[serde(default = "d_one")]
    pub service_scale: f64,
    /// The array (default: the only server).
    pub server: Option<String>,
    /// Hosts without PARDA only: changes of the fixed issue queue over the run (§5.2's phases).
    #[serde(default)]
    pub window_schedule: Vec<WindowStepFile>,
}

/// One step of `window_schedule = [{ at_s = 100, window = 16 }]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowStepFile {
    /// When the issue queue changes (s from the start).
    pub at_s: f64,
    /// The new fixed issue queue (IOs).
    pub window: f64,
}
