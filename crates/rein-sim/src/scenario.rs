//! Scenario files (TOML) and their validation.
//!
//! A scenario names servers (devices with a scheduler in front), tenants (a QoS spec and a workload) and
//! expectations (what `rein sim --check` verifies). Raw TOML is parsed into `*File` structs with
//! `deny_unknown_fields`, so a typo is an error naming the field, then validated into a [`Scenario`] whose
//! values are in range and whose names are resolved to indices. See `docs/scenarios.md` for every field.

use rein_core::{CostModel, LimitMode, Nanos, QosSpec, SchedulerKind};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bounds on what one scenario may ask for.
pub const MAX_SERVERS: usize = 1024;
pub const MAX_TENANTS: usize = 1_000_000;
pub const MAX_DURATION_S: f64 = 7.0 * 86_400.0;
pub const MAX_OUTSTANDING: u32 = 65_536;
pub const MAX_QUEUE_DEPTH: u32 = 65_536;
/// Largest number of timeseries intervals (duration / interval).
pub const MAX_INTERVALS: usize = 1_000_000;

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read scenario {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("scenario {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("scenario {name:?}: {message}")]
    Invalid { name: String, message: String },
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
fn default_outstanding() -> u32 {
    32
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
fn default_one() -> f64 {
    1.0
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub duration_s: f64,
    #[serde(default)]
    pub warmup_s: f64,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Default scheduler for servers: mclock, dmclock, rbfq, sfq, fifo, lfq (= sfq per server), dtfq
    /// (= sfq with distributed delta).
    pub scheduler: Option<String>,
    /// Timeseries bucket (default 1 s).
    pub interval_s: Option<f64>,
    /// Cost model for the schedulers: "io" (default), "bytes", or { tm_ms, bpeak_mb_s }.
    pub cost_model: Option<CostFile>,
    #[serde(default)]
    pub network: NetworkFile,
    pub servers: Vec<ServerFile>,
    #[serde(default)]
    pub tenants: Vec<TenantFile>,
    #[serde(default)]
    pub expect: Vec<ExpectFile>,
    /// PARDA flow control for `[[hosts]]` (see `hosts.rs`).
    pub parda: Option<crate::hosts::PardaFile>,
    #[serde(default)]
    pub hosts: Vec<crate::hosts::HostFile>,
    /// A pShift cluster (token schedulers and a controller); see `crate::pshift::section`.
    pub pshift: Option<crate::pshift::section::PshiftFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CostFile {
    Name(String),
    SeekTransfer { tm_ms: f64, bpeak_mb_s: f64 },
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkFile {
    /// One-way delay between a tenant's gateway and a server.
    #[serde(default)]
    pub delay_ms: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacityStep {
    pub at_s: f64,
    pub iops: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskFile {
    /// Average seek time for a random access (ms); scaled by sqrt(distance / span).
    #[serde(default = "default_seek_ms")]
    pub seek_ms: f64,
    /// Full rotation time (ms); a random access waits a uniform fraction of it.
    #[serde(default = "default_rotation_ms")]
    pub rotation_ms: f64,
    #[serde(default = "default_transfer")]
    pub transfer_mb_s: f64,
    /// Accesses closer than this to the previous one are sequential: no seek, no rotation (KiB).
    #[serde(default = "default_seq_kb")]
    pub sequential_kb: f64,
}
fn default_seek_ms() -> f64 {
    4.0
}
fn default_rotation_ms() -> f64 {
    4.0
}
fn default_transfer() -> f64 {
    100.0
}
fn default_seq_kb() -> f64 {
    64.0
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
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
    pub disk: Option<DiskFile>,
    #[serde(default = "default_depth")]
    pub queue_depth: u32,
    pub scheduler: Option<String>,
    #[serde(default)]
    pub capacity_schedule: Vec<CapacityStep>,
    /// strict (default) | break_when_idle
    pub limit_mode: Option<String>,
    /// Locality batching: batch size (1 = off) and distance (KiB).
    pub batch: Option<u32>,
    pub batch_distance_kb: Option<f64>,
    /// The device: "fifo" (default; one request at a time) or "ps" (processor sharing, `array.rs`).
    pub discipline: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantFile {
    pub name: String,
    #[serde(default)]
    pub reservation: f64,
    pub limit: Option<f64>,
    #[serde(default = "default_weight")]
    pub weight: f64,
    #[serde(default)]
    pub idle_credit: u32,
    /// Servers this tenant sends to (default: all).
    pub servers: Option<Vec<String>>,
    /// Per-server reservation overrides (RBFQ's local minimum M_ij).
    #[serde(default)]
    pub server_reservations: BTreeMap<String, f64>,
    /// How requests pick a server: by offset striping (default) or by shares.
    pub routing: Option<RoutingFile>,
    pub workload: WorkloadFile,
    /// A VM on this PARDA host (`[[hosts]]`): its requests go through the host's window to its array.
    pub host: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RoutingFile {
    Name(String),
    Shares { shares: BTreeMap<String, f64> },
    Stripe { stripe_kb: f64 },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceFile {
    pub path: String,
    /// disksim | csv (cloudPhysics `version,time,op,size,lbn`) | vscsi (`ts_us,op,size_bytes,lbn`);
    /// default from the extension (.trace = disksim, *.vscsi-us.csv = vscsi, .csv = csv).
    pub format: Option<String>,
    /// Keep only this device number (disksim).
    pub device: Option<u32>,
    /// Multiply inter-arrival times by this (0.5 = twice as fast).
    #[serde(default = "default_one")]
    pub time_scale: f64,
    /// Replay the trace again from the start when it ends.
    #[serde(default)]
    pub repeat: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    /// closed | open | on_off | burst | trace
    pub kind: String,
    #[serde(default = "default_outstanding")]
    pub outstanding: u32,
    /// closed: keep this many requests outstanding at *each* of the tenant's servers instead of one pool of
    /// `outstanding` shared by them (a gateway with a per-server window, as in the dmClock and RBFQ papers'
    /// clients); a completion at a server is replaced by a new request to the same server.
    pub outstanding_per_server: Option<u32>,
    /// open / on_off (open inside on periods): Poisson arrival rate.
    pub iops: Option<f64>,
    pub think_ms: Option<f64>,
    pub on_s: Option<f64>,
    pub off_s: Option<f64>,
    pub burst_count: Option<u32>,
    pub burst_period_ms: Option<f64>,
    pub trace: Option<TraceFile>,
    #[serde(default = "default_size_kb")]
    pub size_kb: f64,
    #[serde(default = "default_pct")]
    pub read_pct: f64,
    #[serde(default = "default_pct")]
    pub random_pct: f64,
    #[serde(default = "default_span_gb")]
    pub span_gb: f64,
    #[serde(default)]
    pub start_s: f64,
    pub stop_s: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectFile {
    /// Tenant (or server, for utilisation/iops of a server) the expectation is about.
    pub tenant: Option<String>,
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
    pub ratio: Option<f64>,
    pub within_pct: Option<f64>,
    pub below: Option<f64>,
    pub above: Option<f64>,
    /// Free text shown with the result (what the paper says).
    pub note: Option<String>,
    /// PARDA: a host (or "all") instead of a tenant or server; metrics in `hosts::HOST_METRICS`.
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
    /// Host target: the same metric in the same scenario without PARDA (`[parda] enabled = false`).
    #[serde(default)]
    pub uncontrolled: bool,
    /// convergence_s: the band around the settled window (percent, default 10).
    pub band_pct: Option<f64>,
    /// pShift metrics: a bucket meets its reservation in a QoS period when it does at least this
    /// percentage of it (`reservation_met_fraction`, default 100), and exceeds its limit when it does more
    /// than the limit plus this percentage (`limit_exceeded_fraction`, default 0).
    pub threshold_pct: Option<f64>,
}

// ----------------------------------------------------------------------------------------------------
// Validated scenario
// ----------------------------------------------------------------------------------------------------

/// Service-time distribution of a device.
#[derive(Debug, Clone, PartialEq)]
pub enum ServiceModel {
    Exponential,
    Uniform { spread: f64 },
    Deterministic,
    Disk { seek_ns: f64, rotation_ns: f64, transfer_bytes_per_ns: f64, sequential_bytes: u64 },
}

impl ServiceModel {
    /// A service time (ns) with mean `mean_ns`, for a request whose position does not matter: drawn for
    /// the exponential and uniform models, the mean itself for the deterministic model and for the disk
    /// model (whose position-dependent time the main engine computes from request offsets).
    pub(crate) fn positionless_ns(&self, mean_ns: f64, rng: &mut impl rand::Rng) -> f64 {
        match *self {
            ServiceModel::Exponential => -(1.0 - rng.gen::<f64>()).ln() * mean_ns,
            ServiceModel::Uniform { spread } => mean_ns * (1.0 - spread + 2.0 * spread * rng.gen::<f64>()),
            ServiceModel::Deterministic | ServiceModel::Disk { .. } => mean_ns,
        }
    }
}

/// How a device serves the requests at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Discipline {
    /// One at a time, in arrival order.
    #[default]
    Fifo,
    /// All at once, sharing the device equally (`array.rs`).
    Ps,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub name: String,
    pub capacity_iops: f64,
    pub service: ServiceModel,
    /// Extra time per byte (ns), from `transfer_mb_s`.
    pub ns_per_byte: f64,
    pub queue_depth: u32,
    pub scheduler: SchedulerKind,
    /// Whether gateways piggyback delta/rho to this server (dmclock, rbfq, dtfq).
    pub distributed: bool,
    pub capacity_schedule: Vec<(Nanos, f64)>,
    pub limit_mode: LimitMode,
    pub batch: u32,
    pub batch_distance: u64,
    pub discipline: Discipline,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Routing {
    Stripe { stripe_bytes: u64 },
    Shares(Vec<f64>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum WorkloadKind {
    /// `per_server`: the window is per server (see `WorkloadFile::outstanding_per_server`).
    Closed {
        outstanding: u32,
        think: Nanos,
        per_server: bool,
    },
    Open {
        iops: f64,
    },
    OnOff {
        on: Nanos,
        off: Nanos,
        inner: Box<WorkloadKind>,
    },
    Burst {
        count: u32,
        period: Nanos,
    },
    Trace {
        records: std::sync::Arc<Vec<crate::trace::TraceRecord>>,
        time_scale: f64,
        repeat: bool,
    },
}

#[derive(Debug, Clone)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub size_bytes: u64,
    pub read_frac: f64,
    pub random_frac: f64,
    pub span_bytes: u64,
    pub start: Nanos,
    pub stop: Nanos,
}

#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    pub spec: QosSpec,
    /// Indices into `Scenario::servers`.
    pub servers: Vec<usize>,
    /// Spec per entry of `servers` (differs from `spec` only where `server_reservations` says so).
    pub server_specs: Vec<QosSpec>,
    pub routing: Routing,
    pub workload: Workload,
    /// Index into `Scenario::hosts` for a VM on a PARDA host.
    pub host: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub duration: Nanos,
    pub warmup: Nanos,
    pub seed: u64,
    pub interval: Nanos,
    pub cost_model: CostModel,
    pub net_delay: Nanos,
    pub servers: Vec<Server>,
    pub tenants: Vec<Tenant>,
    pub expect: Vec<ExpectFile>,
    /// The default scheduler name as written (for reports).
    pub scheduler_name: String,
    /// PARDA parameters, when the scenario has hosts.
    pub parda: Option<crate::hosts::Parda>,
    pub hosts: Vec<crate::hosts::Host>,
    /// A pShift cluster: the run uses `crate::pshift::engine` (tenants are its buckets).
    pub pshift: Option<std::sync::Arc<crate::pshift::section::PshiftSection>>,
}

impl Scenario {
    /// Reads and validates a scenario file. Relative trace paths resolve against the file's directory.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ScenarioError::Read { path: path.to_path_buf(), source })?;
        let file: ScenarioFile = toml::from_str(&text)
            .map_err(|e| ScenarioError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        file.validate(path.parent())
    }

    /// Parses and validates scenario text (trace paths relative to `base`).
    pub fn from_toml(text: &str, base: Option<&Path>) -> Result<Scenario, ScenarioError> {
        let file: ScenarioFile = toml::from_str(text)
            .map_err(|e| ScenarioError::Parse { path: PathBuf::from("<text>"), message: e.to_string() })?;
        file.validate(base)
    }

    /// A copy running every server on `kind` (for side-by-side comparisons).
    pub fn with_scheduler(&self, kind: SchedulerKind, distributed: bool) -> Scenario {
        let mut s = self.clone();
        for srv in &mut s.servers {
            srv.scheduler = kind;
            srv.distributed = distributed;
        }
        s.scheduler_name = kind.name().to_string();
        s
    }

    /// A copy with PARDA switched off: every host keeps a fixed issue queue (the uncontrolled baseline).
    pub fn without_parda(&self) -> Scenario {
        let mut s = self.clone();
        if let Some(p) = &mut s.parda {
            p.enabled = false;
        }
        s
    }

    pub fn tenant_index(&self, name: &str) -> Option<usize> {
        self.tenants.iter().position(|t| t.name == name)
    }
    pub fn server_index(&self, name: &str) -> Option<usize> {
        self.servers.iter().position(|t| t.name == name)
    }
}

fn secs(name: &str, field: &str, v: f64) -> Result<Nanos, String> {
    if !v.is_finite() || v < 0.0 || v > MAX_DURATION_S {
        return Err(format!("{name}: {field} must be between 0 and {MAX_DURATION_S} s, got {v}"));
    }
    Ok(Nanos::from_secs_f64(v))
}

/// Parses a scheduler name; returns the kind and whether it is distributed (piggybacks delta/rho).
pub fn parse_scheduler(s: &str) -> Result<(SchedulerKind, bool), String> {
    match s.to_ascii_lowercase().as_str() {
        "lfq" => Ok((SchedulerKind::Sfq, false)),
        "dtfq" => Ok((SchedulerKind::Sfq, true)),
        other => {
            let k: SchedulerKind = other.parse().map_err(|e: String| e.replace("fifo)", "fifo, lfq, dtfq)"))?;
            Ok((k, matches!(k, SchedulerKind::Dmclock | SchedulerKind::Rbfq)))
        }
    }
}

impl ScenarioFile {
    pub fn validate(self, base: Option<&Path>) -> Result<Scenario, ScenarioError> {
        let name = self.name.clone();
        self.validate_inner(base).map_err(|message| ScenarioError::Invalid { name, message })
    }

    fn validate_inner(self, base: Option<&Path>) -> Result<Scenario, String> {
        if self.name.trim().is_empty() {
            return Err("name must not be empty".into());
        }
        let duration = secs("scenario", "duration_s", self.duration_s)?;
        if duration == Nanos::ZERO {
            return Err("duration_s must be positive".into());
        }
        let warmup = secs("scenario", "warmup_s", self.warmup_s)?;
        if warmup >= duration {
            return Err(format!("warmup_s ({}) must be less than duration_s ({})", self.warmup_s, self.duration_s));
        }
        let interval = secs("scenario", "interval_s", self.interval_s.unwrap_or(1.0))?;
        if interval < Nanos::from_millis(1) {
            return Err("interval_s must be at least 0.001".into());
        }
        if (duration.0 / interval.0) as usize > MAX_INTERVALS {
            return Err(format!("duration_s / interval_s exceeds {MAX_INTERVALS} intervals"));
        }
        let cost_model = match &self.cost_model {
            None => CostModel::PerIo,
            Some(CostFile::Name(n)) if n == "io" => CostModel::PerIo,
            Some(CostFile::Name(n)) if n == "bytes" => CostModel::BYTES,
            Some(CostFile::Name(n)) => {
                return Err(format!("cost_model {n:?}: expected \"io\", \"bytes\" or {{ tm_ms, bpeak_mb_s }}"))
            }
            Some(CostFile::SeekTransfer { tm_ms, bpeak_mb_s }) => {
                CostModel::seek_transfer((tm_ms * 1e6).max(0.0) as u64, bpeak_mb_s * 1e6).map_err(|e| e.to_string())?
            }
        };
        let net = self.network.delay_ms;
        if !net.is_finite() || !(0.0..=10_000.0).contains(&net) {
            return Err(format!("network.delay_ms must be between 0 and 10000, got {net}"));
        }
        let default_sched = self.scheduler.clone().unwrap_or_else(|| "mclock".into());
        parse_scheduler(&default_sched)?;
        if self.servers.is_empty() {
            return Err("at least one [[servers]] is needed".into());
        }
        if self.servers.len() > MAX_SERVERS {
            return Err(format!("at most {MAX_SERVERS} servers"));
        }
        if self.tenants.is_empty() && self.pshift.is_none() {
            return Err("at least one [[tenants]] is needed".into());
        }
        if self.tenants.len() > MAX_TENANTS {
            return Err(format!("at most {MAX_TENANTS} tenants"));
        }
        let mut servers = Vec::with_capacity(self.servers.len());
        for s in &self.servers {
            servers.push(validate_server(s, &default_sched)?);
        }
        check_unique(servers.iter().map(|s| s.name.as_str()), "server")?;
        let mut tenants = Vec::with_capacity(self.tenants.len());
        for t in &self.tenants {
            tenants.push(validate_tenant(t, &servers, base, duration)?);
        }
        if self.pshift.is_some() && (self.parda.is_some() || !self.hosts.is_empty()) {
            return Err(
                "a scenario has either PARDA hosts ([parda], [[hosts]]) or a pShift cluster ([pshift]), not both"
                    .into(),
            );
        }
        let pshift = match &self.pshift {
            None => None,
            Some(p) => {
                let (section, all) =
                    crate::pshift::section::validate(p, &servers, tenants, self.seed, duration, interval)?;
                tenants = all;
                Some(std::sync::Arc::new(section))
            }
        };
        check_unique(tenants.iter().map(|t| t.name.as_str()), "tenant")?;
        let (parda, hosts) =
            crate::hosts::validate(self.parda.as_ref(), &self.hosts, &self.tenants, &mut tenants, &servers)?;
        for (i, e) in self.expect.iter().enumerate() {
            validate_expect(i, e, &tenants, &servers, &hosts, pshift.is_some())?;
        }
        Ok(Scenario {
            name: self.name,
            description: self.description,
            duration,
            warmup,
            seed: self.seed,
            interval,
            cost_model,
            net_delay: Nanos::from_secs_f64(net / 1e3),
            servers,
            tenants,
            expect: self.expect,
            scheduler_name: default_sched,
            parda,
            hosts,
            pshift,
        })
    }
}

fn check_unique<'a>(names: impl Iterator<Item = &'a str>, what: &str) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for n in names {
        if n.trim().is_empty() {
            return Err(format!("a {what} has an empty name"));
        }
        if !seen.insert(n) {
            return Err(format!("two {what}s are named {n:?}"));
        }
    }
    Ok(())
}

fn positive(what: &str, v: f64) -> Result<f64, String> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("{what} must be a positive number, got {v}"))
    }
}

fn validate_server(s: &ServerFile, default_sched: &str) -> Result<Server, String> {
    let n = &s.name;
    let capacity_iops = positive(&format!("server {n}: capacity_iops"), s.capacity_iops)?;
    if capacity_iops > 1e9 {
        return Err(format!("server {n}: capacity_iops above 1e9"));
    }
    let service = match s.service.as_str() {
        "exponential" => ServiceModel::Exponential,
        "deterministic" => ServiceModel::Deterministic,
        "uniform" => {
            let spread = s.uniform_spread.unwrap_or(0.5);
            if !(0.0..=1.0).contains(&spread) {
                return Err(format!("server {n}: uniform_spread must be in [0, 1], got {spread}"));
            }
            ServiceModel::Uniform { spread }
        }
        "disk" => {
            let d = s.disk.clone().unwrap_or(DiskFile {
                seek_ms: default_seek_ms(),
                rotation_ms: default_rotation_ms(),
                transfer_mb_s: default_transfer(),
                sequential_kb: default_seq_kb(),
            });
            if !(d.seek_ms >= 0.0 && d.rotation_ms >= 0.0 && d.sequential_kb >= 0.0) {
                return Err(format!("server {n}: disk times must be non-negative"));
            }
            positive(&format!("server {n}: disk.transfer_mb_s"), d.transfer_mb_s)?;
            ServiceModel::Disk {
                seek_ns: d.seek_ms * 1e6,
                rotation_ns: d.rotation_ms * 1e6,
                transfer_bytes_per_ns: d.transfer_mb_s * 1e6 / 1e9,
                sequential_bytes: (d.sequential_kb * 1024.0) as u64,
            }
        }
        other => {
            return Err(format!("server {n}: service {other:?}: expected exponential, uniform, deterministic or disk"))
        }
    };
    let ns_per_byte = match s.transfer_mb_s {
        None => 0.0,
        Some(t) => 1e9 / (positive(&format!("server {n}: transfer_mb_s"), t)? * 1e6),
    };
    if s.queue_depth == 0 || s.queue_depth > MAX_QUEUE_DEPTH {
        return Err(format!("server {n}: queue_depth must be in 1..={MAX_QUEUE_DEPTH}, got {}", s.queue_depth));
    }
    let (scheduler, distributed) =
        parse_scheduler(s.scheduler.as_deref().unwrap_or(default_sched)).map_err(|e| format!("server {n}: {e}"))?;
    let mut schedule = vec![(Nanos::ZERO, capacity_iops)];
    let mut last = 0.0;
    for step in &s.capacity_schedule {
        let at = secs(&format!("server {n}"), "capacity_schedule.at_s", step.at_s)?;
        positive(&format!("server {n}: capacity_schedule.iops"), step.iops)?;
        if step.at_s < last {
            return Err(format!("server {n}: capacity_schedule must be sorted by at_s"));
        }
        last = step.at_s;
        if at == Nanos::ZERO {
            schedule[0].1 = step.iops;
        } else {
            schedule.push((at, step.iops));
        }
    }
    let limit_mode = match s.limit_mode.as_deref() {
        None | Some("strict") => LimitMode::Strict,
        Some("break_when_idle") => LimitMode::BreakWhenIdle,
        Some(o) => return Err(format!("server {n}: limit_mode {o:?}: expected strict or break_when_idle")),
    };
    let batch = s.batch.unwrap_or(1);
    if batch == 0 || batch > 1024 {
        return Err(format!("server {n}: batch must be in 1..=1024"));
    }
    let bd = s.batch_distance_kb.unwrap_or(4096.0);
    if !(bd.is_finite() && bd >= 0.0) {
        return Err(format!("server {n}: batch_distance_kb must be non-negative"));
    }
    let discipline = match s.discipline.as_deref() {
        None | Some("fifo") => Discipline::Fifo,
        Some("ps") => Discipline::Ps,
        Some(o) => return Err(format!("server {n}: discipline {o:?}: expected fifo or ps")),
    };
    Ok(Server {
        name: n.clone(),
        capacity_iops,
        service,
        ns_per_byte,
        queue_depth: s.queue_depth,
        scheduler,
        distributed,
        capacity_schedule: schedule,
        limit_mode,
        batch,
        batch_distance: (bd * 1024.0) as u64,
        discipline,
    })
}

fn validate_tenant(t: &TenantFile, servers: &[Server], base: Option<&Path>, duration: Nanos) -> Result<Tenant, String> {
    let n = &t.name;
    let spec = QosSpec::new(t.reservation, t.limit, t.weight, t.idle_credit).map_err(|e| format!("tenant {n}: {e}"))?;
    let idx: Vec<usize> = match &t.servers {
        None => (0..servers.len()).collect(),
        Some(names) => {
            let mut v = Vec::new();
            for s in names {
                let i = servers
                    .iter()
                    .position(|x| &x.name == s)
                    .ok_or_else(|| format!("tenant {n}: unknown server {s:?}"))?;
                if v.contains(&i) {
                    return Err(format!("tenant {n}: server {s:?} listed twice"));
                }
                v.push(i);
            }
            if v.is_empty() {
                return Err(format!("tenant {n}: servers must not be empty"));
            }
            v
        }
    };
    let mut server_specs = vec![spec; idx.len()];
    for (s, &r) in &t.server_reservations {
        let i = servers
            .iter()
            .position(|x| &x.name == s)
            .ok_or_else(|| format!("tenant {n}: server_reservations names unknown server {s:?}"))?;
        let k = idx
            .iter()
            .position(|&x| x == i)
            .ok_or_else(|| format!("tenant {n}: server_reservations for {s:?}, which the tenant does not use"))?;
        let lim = spec.limit().map(|l| l.max(r));
        server_specs[k] =
            QosSpec::new(r, lim, spec.weight(), spec.idle_credit()).map_err(|e| format!("tenant {n} on {s}: {e}"))?;
    }
    let routing = match &t.routing {
        None => Routing::Stripe { stripe_bytes: 1 << 20 },
        Some(RoutingFile::Name(s)) if s == "stripe" => Routing::Stripe { stripe_bytes: 1 << 20 },
        Some(RoutingFile::Name(s)) => {
            return Err(format!(
                "tenant {n}: routing {s:?}: expected \"stripe\", {{ stripe_kb = .. }} or {{ shares = {{ .. }} }}"
            ))
        }
        Some(RoutingFile::Stripe { stripe_kb }) => {
            let bytes = (positive(&format!("tenant {n}: stripe_kb"), *stripe_kb)? * 1024.0) as u64;
            if bytes == 0 {
                return Err(format!("tenant {n}: stripe_kb {stripe_kb} is less than one byte"));
            }
            Routing::Stripe { stripe_bytes: bytes }
        }
        Some(RoutingFile::Shares { shares }) => {
            let mut v = vec![0.0; idx.len()];
            for (s, &w) in shares {
                let i = servers
                    .iter()
                    .position(|x| &x.name == s)
                    .ok_or_else(|| format!("tenant {n}: routing share for unknown server {s:?}"))?;
                let k = idx
                    .iter()
                    .position(|&x| x == i)
                    .ok_or_else(|| format!("tenant {n}: routing share for {s:?}, which the tenant does not use"))?;
                if !(w.is_finite() && w >= 0.0) {
                    return Err(format!("tenant {n}: routing share for {s:?} must be non-negative"));
                }
                v[k] = w;
            }
            if v.iter().sum::<f64>() <= 0.0 {
                return Err(format!("tenant {n}: routing shares must not all be zero"));
            }
            Routing::Shares(v)
        }
    };
    let workload = validate_workload(n, &t.workload, base, duration)?;
    Ok(Tenant { name: n.clone(), spec, servers: idx, server_specs, routing, workload, host: None })
}

fn validate_workload(n: &str, w: &WorkloadFile, base: Option<&Path>, duration: Nanos) -> Result<Workload, String> {
    let closed = |w: &WorkloadFile| -> Result<WorkloadKind, String> {
        if w.outstanding == 0 || w.outstanding > MAX_OUTSTANDING {
            return Err(format!("tenant {n}: outstanding must be in 1..={MAX_OUTSTANDING}"));
        }
        let think = secs(&format!("tenant {n}"), "think_ms", w.think_ms.unwrap_or(0.0) / 1e3)?;
        match w.outstanding_per_server {
            None => Ok(WorkloadKind::Closed { outstanding: w.outstanding, think, per_server: false }),
            Some(k) if k == 0 || k > MAX_OUTSTANDING => {
                Err(format!("tenant {n}: outstanding_per_server must be in 1..={MAX_OUTSTANDING}"))
            }
            Some(k) => Ok(WorkloadKind::Closed { outstanding: k, think, per_server: true }),
        }
    };
    let open = |w: &WorkloadFile| -> Result<WorkloadKind, String> {
        let iops = positive(
            &format!("tenant {n}: workload.iops"),
            w.iops.ok_or_else(|| format!("tenant {n}: open workload needs iops"))?,
        )?;
        Ok(WorkloadKind::Open { iops })
    };
    let kind = match w.kind.as_str() {
        "closed" => closed(w)?,
        "open" => open(w)?,
        "on_off" => {
            let on =
                secs(&format!("tenant {n}"), "on_s", w.on_s.ok_or_else(|| format!("tenant {n}: on_off needs on_s"))?)?;
            let off = secs(
                &format!("tenant {n}"),
                "off_s",
                w.off_s.ok_or_else(|| format!("tenant {n}: on_off needs off_s"))?,
            )?;
            if on == Nanos::ZERO {
                return Err(format!("tenant {n}: on_s must be positive"));
            }
            let inner = if w.iops.is_some() { open(w)? } else { closed(w)? };
            WorkloadKind::OnOff { on, off, inner: Box::new(inner) }
        }
        "burst" => {
            let count = w.burst_count.ok_or_else(|| format!("tenant {n}: burst needs burst_count"))?;
            if count == 0 || count > MAX_OUTSTANDING {
                return Err(format!("tenant {n}: burst_count must be in 1..={MAX_OUTSTANDING}"));
            }
            let p = w.burst_period_ms.ok_or_else(|| format!("tenant {n}: burst needs burst_period_ms"))?;
            let period = secs(
                &format!("tenant {n}"),
                "burst_period_ms",
                positive(&format!("tenant {n}: burst_period_ms"), p)? / 1e3,
            )?;
            if period < Nanos::from_micros(1) {
                return Err(format!("tenant {n}: burst_period_ms too small"));
            }
            WorkloadKind::Burst { count, period }
        }
        "trace" => {
            let t =
                w.trace.as_ref().ok_or_else(|| format!("tenant {n}: trace workload needs [tenants.workload.trace]"))?;
            let mut path = PathBuf::from(&t.path);
            if path.is_relative() {
                if let Some(b) = base {
                    path = b.join(path);
                }
            }
            let fmt = crate::trace::TraceFormat::resolve(t.format.as_deref(), &path)
                .map_err(|e| format!("tenant {n}: {e}"))?;
            let records = crate::trace::load(&path, fmt, t.device).map_err(|e| format!("tenant {n}: {e}"))?;
            if records.is_empty() {
                return Err(format!(
                    "tenant {n}: trace {} has no records (device filter {:?})",
                    path.display(),
                    t.device
                ));
            }
            positive(&format!("tenant {n}: trace.time_scale"), t.time_scale)?;
            WorkloadKind::Trace { records: std::sync::Arc::new(records), time_scale: t.time_scale, repeat: t.repeat }
        }
        other => {
            return Err(format!("tenant {n}: workload kind {other:?}: expected closed, open, on_off, burst or trace"))
        }
    };
    let size = positive(&format!("tenant {n}: size_kb"), w.size_kb)?;
    if size > 1024.0 * 1024.0 {
        return Err(format!("tenant {n}: size_kb above 1 GiB"));
    }
    for (f, v) in [("read_pct", w.read_pct), ("random_pct", w.random_pct)] {
        if !(0.0..=100.0).contains(&v) {
            return Err(format!("tenant {n}: {f} must be in [0, 100], got {v}"));
        }
    }
    let span = positive(&format!("tenant {n}: span_gb"), w.span_gb)?;
    let start = secs(&format!("tenant {n}"), "start_s", w.start_s)?;
    let stop = match w.stop_s {
        None => duration,
        Some(s) => secs(&format!("tenant {n}"), "stop_s", s)?,
    };
    if stop <= start {
        return Err(format!("tenant {n}: stop_s must be after start_s"));
    }
    Ok(Workload {
        kind,
        size_bytes: (size * 1024.0).round() as u64,
        read_frac: w.read_pct / 100.0,
        random_frac: w.random_pct / 100.0,
        span_bytes: ((span * (1u64 << 30) as f64) as u64).max(1 << 20),
        start,
        stop,
    })
}

const METRICS: [&str; 11] = [
    "iops",
    "mb_s",
    "latency_mean_ms",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "latency_max_ms",
    "reservation_fraction",
    "utilisation",
    "reservation_met_fraction",
    "limit_exceeded_fraction",
];

/// Metrics over buckets and QoS periods (pShift scenarios); `tenant` is optional for them.
pub const PERIOD_METRICS: [&str; 2] = ["reservation_met_fraction", "limit_exceeded_fraction"];

fn validate_expect(
    i: usize,
    e: &ExpectFile,
    tenants: &[Tenant],
    servers: &[Server],
    hosts: &[crate::hosts::Host],
    pshift: bool,
) -> Result<(), String> {
    let at = format!("expect[{i}]");
    if e.host.is_some() {
        return crate::hosts::validate_expect(&at, e, hosts);
    }
    if e.equilibrium || e.threshold || e.beta_ratio || e.uncontrolled || e.band_pct.is_some() {
        return Err(format!(
            "{at}: equilibrium, threshold, beta_ratio, uncontrolled and band_pct are for host expectations"
        ));
    }
    if !METRICS.contains(&e.metric.as_str()) {
        return Err(format!("{at}: metric {:?}: expected one of {}", e.metric, METRICS.join(", ")));
    }
    let per_period = PERIOD_METRICS.contains(&e.metric.as_str());
    if per_period && !pshift {
        return Err(format!("{at}: {} needs a [pshift] section (its QoS periods)", e.metric));
    }
    if let Some(t) = e.threshold_pct {
        if !per_period || !(t.is_finite() && (0.0..=1000.0).contains(&t)) {
            return Err(format!("{at}: threshold_pct applies to {} only, in [0, 1000]", PERIOD_METRICS.join(" and ")));
        }
    }
    match (&e.tenant, &e.server) {
        (None, None) if per_period => {}
        (Some(t), None) => {
            if !tenants.iter().any(|x| &x.name == t) {
                return Err(format!("{at}: unknown tenant {t:?}"));
            }
            if e.metric == "utilisation" {
                return Err(format!("{at}: utilisation is a server metric"));
            }
        }
        (None, Some(s)) => {
            if !servers.iter().any(|x| &x.name == s) {
                return Err(format!("{at}: unknown server {s:?}"));
            }
            if !matches!(e.metric.as_str(), "utilisation" | "iops") {
                return Err(format!("{at}: servers have only iops and utilisation"));
            }
        }
        _ => return Err(format!("{at}: name exactly one of tenant or server")),
    }
    if let Some(r) = &e.ratio_to {
        if !tenants.iter().any(|x| &x.name == r) {
            return Err(format!("{at}: ratio_to names unknown tenant {r:?}"));
        }
    }
    validate_targets(
        &at,
        e,
        &[("equals", e.equals.is_some()), ("oracle", e.oracle), ("ratio_to", e.ratio_to.is_some())],
    )
}

/// What every expectation shares: at most one of its target kinds (`kinds`: name, given) is given, a
/// target comes with `within_pct`, there is something to check, and the window is sane.
pub(crate) fn validate_targets(at: &str, e: &ExpectFile, kinds: &[(&str, bool)]) -> Result<(), String> {
    let names: Vec<&str> = kinds.iter().map(|k| k.0).collect();
    let given = kinds.iter().filter(|k| k.1).count();
    if given > 1 {
        return Err(format!("{at}: use one of {}", names.join(", ")));
    }
    if given == 1 && e.within_pct.is_none() {
        return Err(format!("{at}: {} need within_pct", names.join("/")));
    }
    if given == 0 && e.below.is_none() && e.above.is_none() {
        return Err(format!("{at}: says nothing to check (give {}, below or above)", names.join(", ")));
    }
    if let Some([a, b]) = e.window {
        if !(a.is_finite() && b.is_finite() && 0.0 <= a && a < b) {
            return Err(format!("{at}: window must be [start, end] with 0 <= start < end"));
        }
    }
    Ok(())
}
