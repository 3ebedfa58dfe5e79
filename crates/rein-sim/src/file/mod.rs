//! The file layer: scenario files (TOML) exactly as written.
//!
//! Raw TOML is parsed into these `*File` structs with `deny_unknown_fields`, so a typo is an error naming
//! the field. Nothing here checks values or resolves names: the model layer ([`crate::model`]) validates
//! a [`ScenarioFile`] once into a [`crate::Scenario`]. See `docs/scenarios.md` for every field.

pub mod parda;
pub mod pshift;

use rein_model::device::{ArrayParams, CapacityStep, DiskParams};
use rein_model::sched_settings::SchedSettingsFile;
use rein_model::workload::WorkloadParams;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A scenario file could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("cannot read scenario {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not a scenario (TOML syntax, an unknown field, a missing one, a wrong type).
    #[error("scenario {path}: {source}")]
    Parse {
        /// The file (`<text>` for text given directly).
        path: PathBuf,
        /// Where and what (rein-model's `input::parse_toml`).
        source: rein_model::input::TomlError,
    },
}

fn default_seed() -> u64 {
    1
}
fn default_weight() -> f64 {
    1.0
}
fn default_depth() -> u32 {
    32
}
fn default_service() -> String {
    "exponential".into()
}

/// A whole scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// The scenario's name (reports and plots carry it).
    pub name: String,
    /// Free text: what the scenario reproduces and what the paper says.
    #[serde(default)]
    pub description: String,
    /// Simulated time (s).
    pub duration_s: f64,
    /// Time excluded from totals (s).
    #[serde(default)]
    pub warmup_s: f64,
    /// The run's seed.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Default scheduler for servers: mclock, dmclock, rbfq, sfq, fifo, lfq (= sfq per server), dtfq
    /// (= sfq with distributed delta).
    pub scheduler: Option<String>,
    /// Timeseries interval (s, default 1, at least 0.001): the resolution of timeseries.csv, plots and
    /// windowed expectations.
    pub interval_s: Option<f64>,
    /// Cost model for the schedulers: "io" (default), "bytes", or { tm_ms, bpeak_mb_s }; the same as
    /// `[mclock] cost_model` (give one or the other).
    pub cost_model: Option<CostFile>,
    /// `[mclock]`: scheduler settings for every server (rein-model's [`SchedSettingsFile`]); a server's own
    /// `mclock` table overrides it field by field.
    pub mclock: Option<SchedSettingsFile>,
    /// The network between gateways and servers.
    #[serde(default)]
    pub network: NetworkFile,
    /// `[[servers]]`: at least one.
    pub servers: Vec<ServerFile>,
    /// `[[tenants]]`: at least one, unless `[pshift.generate]` makes them.
    #[serde(default)]
    pub tenants: Vec<TenantFile>,
    /// `[[expect]]`: what `--check` verifies.
    #[serde(default)]
    pub expect: Vec<ExpectFile>,
    /// PARDA flow control for `[[hosts]]`.
    pub parda: Option<parda::PardaFile>,
    /// `[[hosts]]`: PARDA hosts.
    #[serde(default)]
    pub hosts: Vec<parda::HostFile>,
    /// A pShift cluster (token schedulers and a controller).
    pub pshift: Option<pshift::PshiftFile>,
}

/// Largest scenario file (256 MiB: a million tenants written out take about 100 MB).
pub const MAX_SCENARIO_BYTES: u64 = 256 << 20;

impl ScenarioFile {
    /// Reads and parses a scenario file.
    pub fn read(path: &Path) -> Result<ScenarioFile, FileError> {
        let text = rein_model::input::read_text_regular(path, MAX_SCENARIO_BYTES)
            .map_err(|source| FileError::Read { path: path.to_path_buf(), source })?;
        Self::parse_named(&text, path)
    }

    /// Parses scenario text.
    pub fn parse(text: &str) -> Result<ScenarioFile, FileError> {
        Self::parse_named(text, Path::new("<text>"))
    }

    fn parse_named(text: &str, path: &Path) -> Result<ScenarioFile, FileError> {
        rein_model::input::parse_toml(text).map_err(|source| FileError::Parse { path: path.to_path_buf(), source })
    }
}

/// `cost_model`: the same type as `[mclock] cost_model` (rein-model's scheduler settings).
pub use rein_model::sched_settings::CostModelFile as CostFile;

/// `[network]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkFile {
    /// One-way delay between a tenant's gateway and a server.
    #[serde(default)]
    pub delay_ms: f64,
}

/// `[[servers]]`: a scheduler in front of a device.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    /// Its name.
    pub name: String,
    /// Requests per second the device completes (mean service time 1/capacity for 4 KiB random IO).
    pub capacity_iops: f64,
    /// exponential | uniform | deterministic | disk
    #[serde(default = "default_service")]
    pub service: String,
    /// uniform: service times in [(1-spread)/C, (1+spread)/C] (default 0.5).
    pub uniform_spread: Option<f64>,
    /// Optional transfer rate: adds size / rate to each service time (size-dependent cost).
    pub transfer_mb_s: Option<f64>,
    /// The disk model's parameters (service = "disk"): rein-model's [`DiskParams`].
    pub disk: Option<DiskParams>,
    /// D: requests the scheduler keeps outstanding at the device (default 32, at most 65,536).
    #[serde(default = "default_depth")]
    pub queue_depth: u32,
    /// This server's scheduler (default: the scenario's).
    pub scheduler: Option<String>,
    /// Capacity changes over time: rein-model's [`CapacityStep`]s.
    #[serde(default)]
    pub capacity_schedule: Vec<CapacityStep>,
    /// Scheduler settings for this server, over the scenario's `[mclock]` field by field (`mclock = { .. }`
    /// or `[servers.mclock]`).
    pub mclock: Option<SchedSettingsFile>,
    /// Shorthand for `mclock.limit_mode`: strict (default) | break_when_idle.
    pub limit_mode: Option<String>,
    /// Shorthand for `mclock.batch`: locality batching (mClock §3.1), batch size (default 1 = off).
    pub batch: Option<i64>,
    /// Shorthand for `mclock.batch_distance_kb` (KiB, default 4096).
    pub batch_distance_kb: Option<f64>,
    /// The device: "fifo" (default; one request at a time), "ps" (processor sharing) or "array" (a RAID
    /// group of disks).
    pub discipline: Option<String>,
    /// The array's layout (discipline = "array"): rein-model's [`ArrayParams`].
    pub array: Option<ArrayParams>,
}

/// `[[tenants]]`: a QoS spec and a workload.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantFile {
    /// Its name.
    pub name: String,
    /// Reservation (IOPS, or cost units per second under another cost model; default 0 = none).
    #[serde(default)]
    pub reservation: f64,
    /// Limit, in the reservation's units (none by default).
    pub limit: Option<f64>,
    /// Weight: the tenant's share of what is left after reservations (default 1).
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Idle credit (mClock's sigma, in requests).
    #[serde(default)]
    pub idle_credit: u32,
    /// Servers this tenant sends to (default: all).
    pub servers: Option<Vec<String>>,
    /// Per-server reservation overrides (RBFQ's local minimum M_ij).
    #[serde(default)]
    pub server_reservations: BTreeMap<String, f64>,
    /// How requests pick a server: by offset striping (default) or by shares.
    pub routing: Option<RoutingFile>,
    /// `[tenants.workload]`: rein-model's [`WorkloadParams`] (the same table as `rein load`'s jobs); its
    /// `trace.device` / `trace.devices` are resolved with `routing.devices` by the model layer.
    pub workload: WorkloadParams,
    /// A VM on this PARDA host (`[[hosts]]`): its requests go through the host's window to its array.
    pub host: Option<String>,
    /// dmClock: how the tenant's gateway tells each server its part of the reservation: "spread"
    /// (default: the measured share of its requests that go there) or "rho" (the paper's §3.2.1).
    pub reservation_split: Option<String>,
    /// With `reservation_split = "spread"`: requests per measuring window (default 1024).
    pub spread_window_ios: Option<u32>,
}

/// `routing`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RoutingFile {
    /// "stripe".
    Name(String),
    /// `{ devices = { server = [device, ..], .. } }`: a trace record's device picks the server.
    Devices {
        /// Trace device numbers per server name.
        devices: BTreeMap<String, Vec<u32>>,
    },
    /// `{ shares = { server = share, .. } }`.
    Shares {
        /// Share per server name.
        shares: BTreeMap<String, f64>,
    },
    /// `{ stripe_kb = .. }`.
    Stripe {
        /// Stripe size (KiB).
        stripe_kb: f64,
    },
}

/// `[[expect]]`: one expectation `--check` verifies.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectFile {
    /// Tenant the expectation is about ...
    pub tenant: Option<String>,
    /// ... or server ...
    pub server: Option<String>,
    /// iops | mb_s | latency_mean_ms | latency_p50_ms | latency_p95_ms | latency_p99_ms | latency_max_ms |
    /// reservation_fraction (share of IOs served in the reservation phase) | utilisation
    pub metric: String,
    /// [start_s, end_s]; default: warmup to end. Latency metrics use the whole run after warmup.
    pub window: Option<[f64; 2]>,
    /// Compare with a number, within `within_pct` percent...
    pub equals: Option<f64>,
    /// ... or with the fluid oracle (mClock eq. (1)-(2)) for the window's measured total throughput.
    #[serde(default)]
    pub oracle: bool,
    /// ... or with another tenant's value times `ratio`.
    pub ratio_to: Option<String>,
    /// The ratio for `ratio_to` (default 1).
    pub ratio: Option<f64>,
    /// ... or with every other tenant's value of the same metric: `lowest` (below all of them) or
    /// `highest` (above all of them); no `within_pct`.
    pub rank: Option<String>,
    /// Tolerance of a target (percent).
    pub within_pct: Option<f64>,
    /// The value must be below this.
    pub below: Option<f64>,
    /// The value must be above this.
    pub above: Option<f64>,
    /// Free text shown with the result (what the paper says).
    pub note: Option<String>,
    /// PARDA: a host (or "all") instead of a tenant or server.
    pub host: Option<String>,
    /// Host target: eq. (3)'s equilibrium window, or latency `script_L + sum beta / C`.
    #[serde(default)]
    pub equilibrium: bool,
    /// Host target: the latency threshold script-L.
    #[serde(default)]
    pub threshold: bool,
    /// With `ratio_to`: the ratio is this host's beta over the other's (means over the window).
    #[serde(default)]
    pub beta_ratio: bool,
    /// Host target: eq. (2)'s fixed point `w = beta L / (L - script_L)` with the host's own beta and latency
    /// signal (means over the window); for iops `w` over the host's own mean latency (Little's law, for a
    /// host that keeps its window full).
    #[serde(default)]
    pub fixed_point: bool,
    /// Host target: the same metric in the same scenario without PARDA (`[parda] enabled = false`).
    #[serde(default)]
    pub uncontrolled: bool,
    /// convergence_s: the band around the settled window (percent, default 10).
    pub band_pct: Option<f64>,
    /// pShift metrics: a bucket meets its reservation in a QoS period when it does at least this
    /// percentage of it (`reservation_met_fraction`, default 100), and exceeds its limit when it does more
    /// than the limit plus this percentage (`limit_exceeded_fraction`, default 0).
    pub threshold_pct: Option<f64>,
    /// pShift metrics: whose counts judge a period: `load` (default: the completions the clients saw in
    /// each QoS period of the run's clock, with `threshold_pct`) or `servers` (the controller's tally of
    /// the periods it closed, by the servers' own counts: exactly R and L, every closed period, so no
    /// `window` or `threshold_pct`; needs `controller = true`).
    pub count: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_model::input::TomlError;

    /// A scenario that is not TOML of the schema is a [`FileError::Parse`] whose source is the parser's
    /// [`TomlError`], placed; the message says it once, as the `String` it wrapped before did.
    #[test]
    fn a_parse_error_wraps_the_placed_toml_error() {
        let e = ScenarioFile::parse("name = \"t\"\nduration_s = \"long\"\n").unwrap_err();
        assert!(matches!(&e, FileError::Parse { source: TomlError::At { line: 2, column: 14, .. }, .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "scenario <text>: line 2, column 14: invalid type: string \"long\", expected f64 (in `duration_s = \"long\"`)"
        );
        let source = std::error::Error::source(&e).expect("the TOML error is the source");
        assert_eq!(e.to_string().matches(&source.to_string()).count(), 1);
    }
}
