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
    /// script-L.
    pub latency_threshold_ms: f64,
    /// eq. (1): weight of the past, per period.
    #[serde(default = "d_alpha")]
    pub alpha: f64,
    /// eq. (2): smoothing.
    #[serde(default = "d_gamma")]
    pub gamma: f64,
    /// The control period (s).
    #[serde(default = "d_period")]
    pub period_s: f64,
    /// Smallest window.
    #[serde(default = "d_w_min")]
    pub w_min: f64,
    /// Largest window.
    #[serde(default = "d_w_max")]
    pub w_max: f64,
    /// Window before the first update (default w_max).
    pub initial_window: Option<f64>,
    /// "cluster" (§4.2) or "local" (§4.1).
    #[serde(default = "d_cluster")]
    pub aggregation: String,
    /// Visibility delay of a published report (ms).
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
    /// Local locality batching (§3.3): batch size (1 = off).
    pub batch: Option<u32>,
    /// Local locality batching: distance (KiB).
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
    /// Its name.
    pub name: String,
    /// beta; default: `beta_per_share` times the sum of the host's VMs' weights.
    pub beta: Option<f64>,
    /// Runs PARDA (else a fixed issue queue).
    #[serde(default = "d_true")]
    pub controlled: bool,
    /// Uncontrolled hosts: the fixed issue queue (default w_max).
    pub window: Option<f64>,
    /// Multiplier on this host's service times at the array (placement skew).
    #[serde(default = "d_one")]
    pub service_scale: f64,
    /// The array (default: the only server).
    pub server: Option<String>,
}
