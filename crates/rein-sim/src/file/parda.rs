//! `[parda]` and `[[hosts]]` as written (parda.txt; validated by [`crate::model::parda`]). The `[parda]`
//! table itself is rein-model's ([`rein_model::parda_settings`]): `rein gateway`'s PARDA hosts read the
//! same one.

use serde::Deserialize;

pub use rein_model::parda_settings::{PardaFile, SizeModelFile};

fn d_one() -> f64 {
    1.0
}
fn d_true() -> bool {
    true
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
