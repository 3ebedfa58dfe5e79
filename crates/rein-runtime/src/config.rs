//! `rein serve` configuration (rein.toml), validated once into a [`ServerConfig`].
//!
//! ```toml
//! listen = "127.0.0.1:10809"     # NBD
//! admin = "127.0.0.1:9180"       # HTTP: /metrics, /api/tenants
//! data_dir = "rein-data"         # created if missing; relative to the working directory
//! scheduler = "mclock"           # mclock | dmclock | rbfq | sfq | fifo
//! queue_depth = 32               # D: requests outstanding at the backend
//! cost_model = "io"              # io | bytes | { tm_ms = 5, bpeak_mb_s = 60 }: shorthand for [mclock] cost_model
//! admission = "refuse"           # refuse | warn: when reservations exceed the capacity
//! capacity_iops = 5000           # reservable capacity for admission (default: the device model's)
//! max_request_kb = 32768
//! io_engine = "uring"            # uring (default; falls back to threads if the kernel refuses it)
//!                                # | threads: IO on a thread pool | inline: small IOs on the dispatcher
//! probe_capacity_s = 0           # > 0: measure the backend this long at start-up (random 4 KiB reads
//!                                #   at queue_depth, through the same dispatcher) and use the result for
//!                                #   admission when capacity_iops is not set
//!
//! [mclock]                       # optional: scheduler settings, the same table as a scenario's
//! preset = "rein"                # rein (default) | paper: mClock's Algorithm 1 as written
//! weight_lead_ios = 16           # integer | "none" (the paper)
//! limit_burst_ios = 8            # integer | "none" (the paper: L tags clamped at arrival)
//! reservation_lag = "100ms"      # "arrival" (the paper) | "unbounded" | a duration
//! limited_reenter_at_vnow = true # false: the paper
//! limit_mode = "strict"          # strict (Algorithm 1) | break_when_idle
//! batch = 1                      # locality batching (the paper: 8)
//! batch_distance_kb = 4096       # the paper: 4 MB
//!
//! [device_model]                 # optional: the simulator's device model on top of real storage
//! capacity_iops = 1200
//! service = "exponential"        # exponential | deterministic | uniform (uniform_spread) | disk (disk = {..})
//! transfer_mb_s = 200            # optional: size-dependent service time
//! discipline = "fifo"            # fifo | ps (processor sharing)
//! capacity_schedule = [{ at_s = 60, iops = 600 }]   # optional: capacity changes, from server start
//! seed = 0
//!
//! [[exports]]
//! name = "rd"
//! backend = "file"               # file | memory
//! path = "rd.img"                # file backend; relative to data_dir; created with size_mb if missing
//! size_mb = 1024
//! tenant = "rd"                  # which tenant's QoS the export's connections share (default: its name)
//! read_only = false
//! direct = false                 # O_DIRECT for 4 KiB-aligned IO (bypass the page cache)
//!
//! [[tenants]]
//! name = "rd"
//! reservation = 250              # IOPS (or bytes/s with cost_model = "bytes"); 0 = none
//! limit = 1000                   # omitted = unlimited
//! weight = 1
//! idle_credit = 0
//! ```
//!
//! Every error names the field. Without a file, [`ServerConfig::builtin`] is the default: one file-backed
//! export per demo tenant in `rein-data/`, the mClock paper's RD / OLTP / DM.

use crate::devmodel::DeviceConfig;
use crate::dispatch::IoEngine;
use rein_core::{QosSpec, SchedConfig, SchedulerKind};
use rein_model::device::{CapacityStep, DeviceParams, DiskParams};
use rein_model::sched_settings::{with_cost_model_shorthand, CostModelFile, SchedSettingsFile};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The text is not TOML, or does not fit the schema (an unknown field, a wrong type).
    #[error("{path}: {message}")]
    Parse {
        /// Where the text came from (`<built-in>` for [`BUILTIN`]).
        path: PathBuf,
        /// The TOML parser's message, with the line and column.
        message: String,
    },
    /// A value is out of range or inconsistent with another; the message names the field.
    #[error("config: {0}")]
    Invalid(String),
}

fn d_listen() -> String {
    "127.0.0.1:10809".into()
}
fn d_admin() -> String {
    "127.0.0.1:9180".into()
}
fn d_data() -> String {
    "rein-data".into()
}
fn d_sched() -> String {
    "mclock".into()
}
fn d_depth() -> u32 {
    32
}
fn d_weight() -> f64 {
    1.0
}
fn d_size() -> u64 {
    1024
}
fn d_backend() -> String {
    "file".into()
}
fn d_service() -> String {
    "exponential".into()
}
fn d_max_kb() -> u64 {
    32 * 1024
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default = "d_listen")]
    listen: String,
    #[serde(default = "d_admin")]
    admin: String,
    #[serde(default = "d_data")]
    data_dir: String,
    #[serde(default = "d_sched")]
    scheduler: String,
    #[serde(default = "d_depth")]
    queue_depth: u32,
    cost_model: Option<CostModelFile>,
    mclock: Option<SchedSettingsFile>,
    admission: Option<String>,
    capacity_iops: Option<f64>,
    #[serde(default = "d_max_kb")]
    max_request_kb: u64,
    io_engine: Option<String>,
    #[serde(default)]
    probe_capacity_s: f64,
    device_model: Option<DeviceFile>,
    #[serde(default)]
    exports: Vec<ExportFile>,
    #[serde(default)]
    tenants: Vec<TenantFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceFile {
    capacity_iops: f64,
    #[serde(default = "d_service")]
    service: String,
    uniform_spread: Option<f64>,
    disk: Option<DiskParams>,
    transfer_mb_s: Option<f64>,
    discipline: Option<String>,
    #[serde(default)]
    capacity_schedule: Vec<CapacityStep>,
    #[serde(default)]
    seed: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportFile {
    name: String,
    #[serde(default = "d_backend")]
    backend: String,
    path: Option<String>,
    #[serde(default = "d_size")]
    size_mb: u64,
    tenant: Option<String>,
    #[serde(default)]
    read_only: bool,
    #[serde(default)]
    direct: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantFile {
    name: String,
    #[serde(default)]
    reservation: f64,
    limit: Option<f64>,
    #[serde(default = "d_weight")]
    weight: f64,
    #[serde(default)]
    idle_credit: u32,
}

/// Where an export's bytes live (`backend`).
#[derive(Debug, Clone, PartialEq)]
pub enum BackendKind {
    /// A regular file or block device ([`crate::storage::FileStorage`]); a missing file is created with
    /// the export's size.
    File {
        /// The file: `path` (default `<name>.img`), under `data_dir` unless absolute.
        path: PathBuf,
    },
    /// RAM ([`crate::storage::MemStorage`]): zeroes at start, gone at exit.
    Memory,
}

/// One `[[exports]]` entry, validated.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// The name NBD clients ask for: unique, at most 4096 bytes.
    pub name: String,
    /// Where its bytes live (default a file).
    pub backend: BackendKind,
    /// Size in bytes (`size_mb` MiB, default 1 GiB; at most [`MAX_EXPORT_BYTES`]) of a new file or of RAM
    /// storage. An existing file keeps its own size.
    pub size: u64,
    /// Index into `ServerConfig::tenants`.
    pub tenant: usize,
    /// Refuse writes, trims and write-zeroes, and advertise the export as read-only (default false).
    pub read_only: bool,
    /// O_DIRECT for aligned IO (file backend).
    pub direct: bool,
}

/// A tenant: a `[[tenants]]` entry, or the default-spec tenant made for an export with no tenant of its
/// name.
#[derive(Debug, Clone)]
pub struct TenantConfig {
    /// Its name: unique and not empty; exports and the admin endpoint refer to it by name.
    pub name: String,
    /// Its validated spec: reservation and limit in IOPS (bytes/s with `cost_model = "bytes"`), weight,
    /// idle credit.
    pub spec: QosSpec,
}

/// What happens when the reservations exceed the reservable capacity (`admission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The default: the server does not start, and a spec change through the admin endpoint that would
    /// exceed the capacity is refused (HTTP 409).
    Refuse,
    /// The server starts and the change is applied, with a warning in the log (and in the admin answer).
    Warn,
}

/// A validated server configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The NBD listening address (default 127.0.0.1:10809).
    pub listen: SocketAddr,
    /// The admin HTTP endpoint's address (default 127.0.0.1:9180).
    pub admin: SocketAddr,
    /// Where file exports with relative paths live (default `rein-data`, relative to the working
    /// directory); created at start if missing.
    pub data_dir: PathBuf,
    /// The scheduling algorithm (default mClock).
    pub scheduler: SchedulerKind,
    /// D: requests outstanding at the backend, 1..=4096 (default 32).
    pub queue_depth: usize,
    /// The scheduler's settings (`[mclock]` and `cost_model`, rein-model's one parser for scenarios and
    /// rein.toml): cost model, tag rules, limit mode, batching. [`SchedConfig::limits`] is the default.
    pub sched: SchedConfig,
    /// What happens when reservations exceed the capacity (default [`Admission::Refuse`]).
    pub admission: Admission,
    /// Capacity used for admission control, in IOPS: configured, else the device model's at start (`None`:
    /// no admission control, unless `probe_capacity_s` measures one).
    pub capacity_iops: Option<f64>,
    /// Largest READ or WRITE accepted, in bytes (`max_request_kb` KiB: 1 KiB..=128 MiB, default 32 MiB).
    pub max_request: u64,
    /// How the dispatcher runs file IO (default io_uring, falling back to threads).
    pub io_engine: IoEngine,
    /// Seconds to measure the backend at start-up for admission (0: no probe).
    pub probe_capacity_s: f64,
    /// The simulator's device model in front of the storage (`[device_model]`); `None`: the storage's own
    /// speed.
    pub device: Option<DeviceConfig>,
    /// The exports, in file order: at least one, at most [`MAX_EXPORTS`].
    pub exports: Vec<ExportConfig>,
    /// The tenants: the `[[tenants]]` in file order, then one default-spec tenant per export that names
    /// none and has no tenant of its own name.
    pub tenants: Vec<TenantConfig>,
}

/// Largest export, in bytes (1 PiB).
pub const MAX_EXPORT_BYTES: u64 = 1 << 50;
/// Most `[[exports]]` in one configuration.
pub const MAX_EXPORTS: usize = 4096;

/// The built-in default: the mClock paper's §2.1 tenants, each with a 256 MiB file export.
pub const BUILTIN: &str = r#"
[[exports]]
name = "rd"
path = "rd.img"
size_mb = 256

[[exports]]
name = "oltp"
path = "oltp.img"
size_mb = 256

[[exports]]
name = "dm"
path = "dm.img"
size_mb = 256

[[tenants]]
name = "rd"
reservation = 250
weight = 1

[[tenants]]
name = "oltp"
reservation = 250
weight = 2

[[tenants]]
name = "dm"
limit = 1000
weight = 3
"#;

impl ServerConfig {
    /// Reads and validates the file at `path`. Errors: [`ConfigError::Read`] if it cannot be read, else as
    /// [`ServerConfig::parse`].
    pub fn load(path: &Path) -> Result<ServerConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        Self::parse(&text, path)
    }

    /// The built-in configuration, [`BUILTIN`]: what `rein serve` runs without a file. It is valid (a test
    /// parses it), so this never fails.
    pub fn builtin() -> ServerConfig {
        Self::parse(BUILTIN, Path::new("<built-in>")).expect("the built-in config is valid")
    }

    /// Parses and validates configuration text; `path` only names the source in errors. Errors:
    /// [`ConfigError::Parse`] for text that is not TOML or fields that do not exist or have the wrong
    /// type, [`ConfigError::Invalid`] (naming the field) for values out of range or inconsistent.
    pub fn parse(text: &str, path: &Path) -> Result<ServerConfig, ConfigError> {
        let f: File =
            toml::from_str(text).map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string() })?;
        validate(f).map_err(ConfigError::Invalid)
    }

    /// The position in `tenants` of the tenant called `name`, if there is one.
    pub fn tenant_index(&self, name: &str) -> Option<usize> {
        self.tenants.iter().position(|t| t.name == name)
    }

    /// Checks reservations against the capacity; `Err` explains the shortfall.
    pub fn admission_check(&self, specs: impl Iterator<Item = QosSpec>) -> Result<(), String> {
        let Some(cap) = self.capacity_iops else { return Ok(()) };
        let sum: f64 = specs.map(|s| s.reservation()).sum();
        if sum > cap {
            Err(format!("reservations total {sum} IOPS, above the reservable capacity of {cap} IOPS"))
        } else {
            Ok(())
        }
    }
}

fn validate(f: File) -> Result<ServerConfig, String> {
    let listen: SocketAddr =
        f.listen.parse().map_err(|e| format!("listen {:?}: {e} (expected address:port)", f.listen))?;
    let admin: SocketAddr = f.admin.parse().map_err(|e| format!("admin {:?}: {e} (expected address:port)", f.admin))?;
    let scheduler: SchedulerKind = f.scheduler.parse().map_err(|e: String| format!("scheduler: {e}"))?;
    if f.queue_depth == 0 || f.queue_depth > 4096 {
        return Err(format!("queue_depth must be in 1..=4096, got {}", f.queue_depth));
    }
    // `cost_model` at the top is a shorthand for `[mclock] cost_model` (as in a scenario); one of the two.
    let settings = with_cost_model_shorthand(f.mclock.as_ref(), f.cost_model.as_ref()).map_err(|e| e.to_string())?;
    let sched = settings.resolve().map_err(|e| e.to_string())?;
    let admission = match f.admission.as_deref() {
        None | Some("refuse") => Admission::Refuse,
        Some("warn") => Admission::Warn,
        Some(o) => return Err(format!("admission {o:?}: expected refuse or warn")),
    };
    let io_engine: IoEngine = match f.io_engine.as_deref() {
        None => IoEngine::Uring,
        Some(s) => s.parse()?,
    };
    if !(f.probe_capacity_s.is_finite() && (0.0..=60.0).contains(&f.probe_capacity_s)) {
        return Err(format!("probe_capacity_s must be in 0..=60 seconds, got {}", f.probe_capacity_s));
    }
    if f.max_request_kb == 0 || f.max_request_kb > 128 * 1024 {
        return Err(format!("max_request_kb must be in 1..=131072, got {}", f.max_request_kb));
    }
    let device = match f.device_model {
        None => None,
        Some(d) => {
            // The simulator's device: the same fields, defaults and checks as a scenario's [[servers]].
            let spec = DeviceParams {
                capacity_iops: d.capacity_iops,
                service: &d.service,
                uniform_spread: d.uniform_spread,
                disk: d.disk,
                transfer_mb_s: d.transfer_mb_s,
                discipline: d.discipline.as_deref(),
                capacity_schedule: d.capacity_schedule,
            }
            .validate()
            .map_err(|e| format!("device_model.{e}"))?;
            Some(DeviceConfig { spec, seed: d.seed })
        }
    };
    if let Some(c) = f.capacity_iops {
        if !(c.is_finite() && c > 0.0) {
            return Err(format!("capacity_iops must be positive, got {c}"));
        }
    }
    let capacity_iops = f.capacity_iops.or(device.as_ref().map(|d| d.spec.capacity_at(rein_core::Nanos::ZERO)));
    let mut tenants = Vec::new();
    for t in &f.tenants {
        if t.name.is_empty() || tenants.iter().any(|x: &TenantConfig| x.name == t.name) {
            return Err(format!("tenant name {:?} is empty or repeated", t.name));
        }
        let spec = QosSpec::new(t.reservation, t.limit, t.weight, t.idle_credit)
            .map_err(|e| format!("tenant {}: {e}", t.name))?;
        tenants.push(TenantConfig { name: t.name.clone(), spec });
    }
    if f.exports.is_empty() {
        return Err("at least one [[exports]] is needed".into());
    }
    if f.exports.len() > MAX_EXPORTS {
        return Err(format!("at most {MAX_EXPORTS} exports"));
    }
    let data_dir = PathBuf::from(&f.data_dir);
    let mut exports: Vec<ExportConfig> = Vec::new();
    for e in &f.exports {
        if e.name.is_empty() {
            return Err("an [[exports]] entry has an empty name".into());
        }
        if e.name.len() > 4096 || exports.iter().any(|x| x.name == e.name) {
            return Err(format!("export name {:?} is too long or repeated", e.name));
        }
        let size = e
            .size_mb
            .checked_mul(1 << 20)
            .filter(|&s| s > 0 && s <= MAX_EXPORT_BYTES)
            .ok_or_else(|| format!("export {}: size_mb must be in 1..=2^30", e.name))?;
        let backend = match e.backend.as_str() {
            "file" => {
                let p = PathBuf::from(e.path.clone().unwrap_or_else(|| format!("{}.img", e.name)));
                BackendKind::File { path: if p.is_absolute() { p } else { data_dir.join(p) } }
            }
            "memory" if e.direct => return Err(format!("export {}: direct = true needs backend = \"file\"", e.name)),
            "memory" => BackendKind::Memory,
            o => return Err(format!("export {}: backend {o:?}: expected file or memory", e.name)),
        };
        let tname = e.tenant.clone().unwrap_or_else(|| e.name.clone());
        let tenant = match tenants.iter().position(|t| t.name == tname) {
            Some(i) => i,
            None if e.tenant.is_none() => {
                // An export without a tenant of its name gets a default-weight tenant of its own.
                tenants.push(TenantConfig { name: tname.clone(), spec: QosSpec::default() });
                tenants.len() - 1
            }
            None => return Err(format!("export {}: unknown tenant {tname:?}", e.name)),
        };
        exports.push(ExportConfig {
            name: e.name.clone(),
            backend,
            size,
            tenant,
            read_only: e.read_only,
            direct: e.direct,
        });
    }
    let cfg = ServerConfig {
        listen,
        admin,
        data_dir,
        scheduler,
        queue_depth: f.queue_depth as usize,
        sched,
        admission,
        capacity_iops,
        max_request: f.max_request_kb * 1024,
        io_engine,
        probe_capacity_s: f.probe_capacity_s,
        device,
        exports,
        tenants,
    };
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_is_the_paper_example() {
        let c = ServerConfig::builtin();
        assert_eq!(c.listen.to_string(), "127.0.0.1:10809");
        assert_eq!(c.admin.to_string(), "127.0.0.1:9180");
        assert_eq!(c.exports.len(), 3);
        assert_eq!(c.tenants[c.exports[0].tenant].spec.reservation(), 250.0);
        assert_eq!(c.tenants[2].spec.limit(), Some(1000.0));
        assert_eq!(c.exports[0].backend, BackendKind::File { path: PathBuf::from("rein-data/rd.img") });
    }

    #[test]
    fn errors_name_the_field() {
        let e = |t: &str| ServerConfig::parse(t, Path::new("x.toml")).unwrap_err().to_string();
        assert!(e("listen = \"nowhere\"\n[[exports]]\nname = \"a\"").contains("listen \"nowhere\""));
        assert!(e("queue_depth = 0\n[[exports]]\nname = \"a\"").contains("queue_depth"));
        assert!(e("[[exports]]\nname = \"a\"\ntenant = \"zz\"").contains("unknown tenant \"zz\""));
        assert!(e("[[exports]]\nname = \"a\"\n[[tenants]]\nname = \"a\"\nreservation = 10\nlimit = 5")
            .contains("reservation 10 exceeds limit 5"));
        assert!(e("colour = 1\n[[exports]]\nname = \"a\"").contains("unknown field `colour`"));
        assert!(e("").contains("at least one [[exports]]"));
        assert!(e("scheduler = \"wfq\"\n[[exports]]\nname = \"a\"").contains("unknown scheduler"));
        assert!(e("io_engine = \"aio\"\n[[exports]]\nname = \"a\"").contains("io_engine \"aio\""));
        assert!(e("probe_capacity_s = -1\n[[exports]]\nname = \"a\"").contains("probe_capacity_s"));
        assert!(e("[[exports]]\nname = \"a\"\nbackend = \"memory\"\ndirect = true").contains("direct = true needs"));
    }

    #[test]
    fn mclock_table_reaches_the_scheduler_config() {
        let p = |t: &str| ServerConfig::parse(&format!("{t}\n[[exports]]\nname = \"a\""), Path::new("x.toml"));
        assert_eq!(p("").unwrap().sched, SchedConfig::default());
        assert_eq!(p("[mclock]\npreset = \"paper\"").unwrap().sched, SchedConfig::paper());
        let c = p("cost_model = { tm_ms = 5, bpeak_mb_s = 60 }\n[mclock]\nreservation_lag = \"unbounded\"\nbatch = 8")
            .unwrap()
            .sched;
        assert_eq!(c.cost_model, rein_core::CostModel::paper_disk());
        assert_eq!(c.reservation_lag, rein_core::ReservationLag::Unbounded);
        assert_eq!(c.batch, 8);
        assert_eq!(p("cost_model = \"bytes\"").unwrap().sched.cost_model, rein_core::CostModel::BYTES);
        let e = |t: &str| p(t).unwrap_err().to_string();
        assert_eq!(
            e("[mclock]\nlimit_burst_ios = -1"),
            "config: mclock.limit_burst_ios = -1: expected an IO count in 0..=1048576, or \"none\" (L tags clamped \
             at arrival, as in the paper)"
        );
        assert!(e("[mclock]\nreservation_lag = \"10\"").contains("mclock.reservation_lag = \"10\""));
        assert!(e("cost_model = \"lots\"").contains("cost_model = \"lots\": expected"));
        assert!(e("cost_model = \"io\"\n[mclock]\ncost_model = \"io\"").contains("cost_model is given twice"));
        assert!(e("[mclock]\nbatchsize = 8").contains("unknown field `batchsize`"));
    }

    #[test]
    fn admission() {
        let c = ServerConfig::parse("capacity_iops = 400\n[[exports]]\nname = \"a\"", Path::new("x")).unwrap();
        let r = |x| QosSpec::new(x, None, 1.0, 0).unwrap();
        assert!(c.admission_check([r(100.0), r(200.0)].into_iter()).is_ok());
        let e = c.admission_check([r(300.0), r(200.0)].into_iter()).unwrap_err();
        assert!(e.contains("500") && e.contains("400"), "{e}");
    }
}
