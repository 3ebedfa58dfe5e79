//! Durable runtime state: what the admin API changed, kept in `data_dir/rein-state.json` and applied again
//! at start; and the lock that keeps a second server off the same data directory.
//!
//! # Model
//! The configuration file is the *base*; the state file is an *overlay* of the changes made at run time
//! (tenant specs changed, tenants and exports added or deleted, the capacity set through the admin API or
//! measured by the probe). The effective configuration is `overlay(base, state)` ([`overlay`]); after
//! every change the server writes `diff(base, effective)` ([`diff`]) as the new state file, so the file
//! holds exactly what differs from the configuration file, nothing else.
//!
//! # Precedence
//! Each entry records the configuration file's value of the same item *when the change was made* (its
//! `config` field: the tenant's spec, the export, the capacity settings; `null` when the file did not have
//! it). At start and on reload an entry applies only while the file still has that value: a run-time change
//! wins over the file until the operator edits the same item in the file, and then the file wins (the
//! entry is dropped, with a log line naming it). Items the file does not mention keep their run-time value
//! indefinitely. So an operator never loses a run-time change by restarting, and never has an edit of the
//! file silently overridden by an older run-time change.
//!
//! # Format (version 1)
//! ```json
//! { "version": 1,
//!   "tenants": { "rd": { "spec": {"reservation": 300, "limit": null, "weight": 1, "idle_credit": 0},
//!                        "config": {"reservation": 250, "limit": null, "weight": 1, "idle_credit": 0} },
//!                "gone": { "spec": null, "config": {...} } },
//!   "exports": { "new": { "export": {"name": "new", "backend": "memory", "size_mb": 16, "tenant": "rd",
//!                                    "read_only": false, "direct": false},
//!                         "config": null } },
//!   "capacity": { "iops": 5000, "source": "admin", "config": {"capacity_iops": null, "probe_capacity_s": 0} } }
//! ```
//! `spec`/`export` `null`: deleted at run time. A file export's `path` is the one the server opens, the data
//! directory already in it, and is read back as written ([`ExportOrigin::StateFile`]). A file with another `version`, or that does not parse, stops
//! the server at start with an error naming the file (module [`crate::server`] argues why it is not moved
//! aside).
//!
//! # Durability
//! [`save`] writes the file through [`crate::durable`]: a temporary file beside it, fsynced, renamed over
//! `rein-state.json`, the directory fsynced: after a crash the file is the old state or the new one,
//! never a mix. Every change is written before it is applied; a change that cannot be written is not
//! applied, and its temporary file is removed (the registry logs the error, [`crate::live`]).

use crate::config::{BackendKind, ExportConfig, ServerConfig, TenantConfig, MAX_EXPORTS};
use rein_core::QosSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The state file's name inside the data directory.
pub const STATE_FILE: &str = "rein-state.json";
/// The lock file's name inside the data directory (holds the server's pid).
pub const LOCK_FILE: &str = "rein.lock";
/// The state file format this server reads and writes.
pub const STATE_VERSION: u32 = 1;
/// Largest state file read, in bytes (16 MiB: thousands of tenants and exports).
pub const MAX_STATE_BYTES: u64 = 16 << 20;
/// Longest tenant name accepted by `POST /api/tenants`, in bytes; a state file's tenant that the
/// configuration file does not have and whose name is longer (or empty) is dropped.
pub const MAX_TENANT_NAME: usize = 256;

/// Why the state file or the lock could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The state file exists but could not be read.
    #[error("cannot read the state file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The state file is not a state file this server understands.
    #[error(
        "state file {path} is unusable: {message} (it holds the changes made through the admin API; fix it, or \
         move it away to start from the configuration file alone)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The state would be larger than a server reads back ([`MAX_STATE_BYTES`]); nothing was written.
    #[error(
        "the state would take {bytes} bytes, above the {MAX_STATE_BYTES} bytes a server reads back at its next \
         start; the change is refused (remove tenants or exports, or move long access lists into the \
         configuration file)"
    )]
    TooLarge {
        /// The serialised state's size.
        bytes: u64,
    },
    /// The state file could not be written.
    #[error("cannot write the state file {path}: {step}: {source}")]
    Write {
        /// The file being written.
        path: PathBuf,
        /// The step that failed, in words ([`crate::durable::Step::words`], or the removal of the file that
        /// an empty state makes).
        step: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Another process holds the data directory's lock.
    #[error("data directory {dir} is in use by another rein serve{}", holder.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// The holder's pid, as it wrote it into the lock file.
        holder: Option<u32>,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock {path}: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// A tenant's spec as the state file and the admin API write it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecJson {
    /// Reservation (IOPS or cost units per second).
    pub reservation: f64,
    /// Limit; `null`: none.
    pub limit: Option<f64>,
    /// Weight.
    pub weight: f64,
    /// Idle credit.
    pub idle_credit: u32,
}

impl From<QosSpec> for SpecJson {
    fn from(s: QosSpec) -> SpecJson {
        SpecJson { reservation: s.reservation(), limit: s.limit(), weight: s.weight(), idle_credit: s.idle_credit() }
    }
}

impl SpecJson {
    /// The validated spec.
    pub fn spec(&self) -> Result<QosSpec, rein_core::SpecError> {
        QosSpec::new(self.reservation, self.limit, self.weight, self.idle_credit)
    }
}

/// An export as the state file and `POST /api/exports` write it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportJson {
    /// The name NBD clients ask for.
    pub name: String,
    /// `file` or `memory`.
    pub backend: String,
    /// The file (file backend). In `POST /api/exports`: relative to the data directory
    /// ([`ExportOrigin::Admin`]). In the state file: the path the server opens, the data directory already
    /// in it (absolute, or relative to the working directory as a relative `data_dir` is;
    /// [`ExportOrigin::StateFile`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Size in MiB of a memory export or of a file created for it; `None`: the file must exist, and a
    /// memory export has [`crate::config::DEFAULT_MEMORY_MB`], as in rein.toml.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_mb: Option<u64>,
    /// Its tenant's name.
    pub tenant: String,
    /// Read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Networks whose clients may see and open it (CIDR); `None`: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_networks: Option<Vec<String>>,
    /// Identities (PSK identity or client certificate CN) that may see and open it; `None`: anyone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_identities: Option<Vec<String>>,
    /// O_DIRECT (file backend).
    #[serde(default)]
    pub direct: bool,
    /// The kernel's readahead (file backend; default true).
    #[serde(default = "crate::config::d_true", skip_serializing_if = "is_yes")]
    pub readahead: bool,
}

/// serde's `skip_serializing_if` passes a reference: the state file names `readahead` only when it is off.
fn is_yes(b: &bool) -> bool {
    *b
}

/// Where an [`ExportJson`] comes from, which says what its `path` is relative to and how strictly it is
/// checked ([`ExportJson::to_config`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportOrigin {
    /// `POST /api/exports`: the path is relative to the data directory and stays inside it (no `..`), and
    /// a memory export may not be larger than the machine's RAM.
    Admin,
    /// The state file: the path as [`ExportJson::from_config`] wrote it, the one the server opens (the data
    /// directory already in it). Joining the data directory again doubled a relative one
    /// (`rein-data/rein-data/x.img`), and every reload and the next start failed.
    StateFile,
}

impl ExportJson {
    /// The JSON form of a configured export whose tenant is `tenant`: a file export's path as the server
    /// opens it ([`ExportOrigin::StateFile`]).
    pub fn from_config(e: &ExportConfig, tenant: &str) -> ExportJson {
        let (backend, path) = match &e.backend {
            BackendKind::File { path } => ("file", Some(path.clone())),
            BackendKind::Memory => ("memory", None),
        };
        ExportJson {
            name: e.name.clone(),
            backend: backend.into(),
            path,
            size_mb: e.size.map(|s| s >> 20),
            tenant: tenant.into(),
            read_only: e.read_only,
            allow_networks: e.access.networks.as_ref().map(|n| n.iter().map(|n| n.to_string()).collect()),
            allow_identities: e.access.identities.clone(),
            direct: e.direct,
            readahead: e.readahead,
        }
    }

    /// Validates this export for a server whose data directory is `data_dir` and whose tenants are
    /// `tenants`. From `origin` [`ExportOrigin::Admin`] (exports created through the admin API) the path
    /// must be relative and stay inside `data_dir` (no `..`) and is joined to it, and a memory export may
    /// not be larger than the machine's RAM; from [`ExportOrigin::StateFile`] the path is taken as written.
    pub fn to_config(
        &self,
        data_dir: &Path,
        tenants: &[TenantConfig],
        origin: ExportOrigin,
    ) -> Result<ExportConfig, String> {
        let strict_path = origin == ExportOrigin::Admin;
        let name = &self.name;
        if name.is_empty() || name.len() > 4096 {
            return Err(format!("export name {name:?} is empty or longer than 4096 bytes"));
        }
        // Without size_mb a memory export has the size rein.toml gives it; a file export must exist.
        let size_mb = match (self.size_mb, self.backend.as_str()) {
            (Some(mb), _) => mb,
            (None, "memory") => crate::config::DEFAULT_MEMORY_MB,
            (None, _) => 0,
        };
        let size = size_mb
            .checked_mul(1 << 20)
            .filter(|&s| s <= crate::config::MAX_EXPORT_BYTES)
            .ok_or_else(|| format!("export {name}: size_mb must be in 1..=2^30"))?;
        crate::config::file_only_settings(name, &self.backend, self.direct, self.readahead)?;
        let backend = match self.backend.as_str() {
            "file" => {
                let p = self.path.clone().unwrap_or_else(|| PathBuf::from(format!("{name}.img")));
                if p.as_os_str().is_empty() {
                    return Err(format!("export {name}: path is empty (omit it for {name}.img)"));
                }
                if strict_path
                    && (p.is_absolute() || p.components().any(|c| !matches!(c, std::path::Component::Normal(_))))
                {
                    return Err(format!(
                        "export {name}: path {} must be relative to the data directory, without ..",
                        p.display()
                    ));
                }
                let path = if strict_path { data_dir.join(p) } else { p };
                // As at start (`FileStorage::open_with`), said as a bad request rather than a failed open;
                // a state file's entry fails at its open, naming the export, rather than being dropped.
                if strict_path && self.read_only && !path.exists() {
                    return Err(format!(
                        "export {name}: {} does not exist (a read-only export is not created)",
                        path.display()
                    ));
                }
                if self.size_mb.is_none() && !path.exists() {
                    return Err(format!(
                        "export {name}: {} does not exist (give size_mb to create it)",
                        path.display()
                    ));
                }
                BackendKind::File { path }
            }
            "memory" => {
                // An admin-created memory export cannot take the server down: its size is bounded by the
                // machine's RAM (MemTotal).
                if let Some(ram) = strict_path
                    .then(|| crate::preflight::mem_total_bytes(Path::new(crate::preflight::MEMINFO)))
                    .flatten()
                    .filter(|&ram| size > ram)
                {
                    return Err(format!(
                        "export {name}: a memory export of {size_mb} MiB is larger than this machine's RAM ({} MiB)",
                        ram >> 20
                    ));
                }
                BackendKind::Memory
            }
            o => return Err(format!("export {name}: backend {o:?}: expected file or memory")),
        };
        if size == 0 && self.size_mb.is_some() {
            return Err(format!("export {name}: size_mb must be in 1..=2^30"));
        }
        let tenant = tenants
            .iter()
            .position(|t| t.name == self.tenant)
            .ok_or_else(|| format!("export {name}: unknown tenant {:?}", self.tenant))?;
        let size = (size > 0).then_some(size);
        let access = crate::config::parse_access(name, &self.allow_networks, &self.allow_identities)?;
        Ok(ExportConfig {
            name: name.clone(),
            backend,
            size,
            tenant,
            read_only: self.read_only,
            direct: self.direct,
            readahead: self.readahead,
            access,
        })
    }
}

/// A tenant's run-time change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    /// The spec in force; `null`: deleted at run time.
    pub spec: Option<SpecJson>,
    /// The configuration file's spec when the change was made; `null`: the file had no such tenant.
    pub config: Option<SpecJson>,
}

/// An export's run-time change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportEntry {
    /// The export in force; `null`: deleted at run time.
    pub export: Option<ExportJson>,
    /// The configuration file's export when the change was made; `null`: the file had none of that name.
    pub config: Option<ExportJson>,
}

/// Where the capacity used for admission control came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// `capacity_iops` in the configuration file.
    Config,
    /// The `[device_model]`'s capacity.
    DeviceModel,
    /// The start-up probe (`probe_capacity_s`).
    Probe,
    /// `PUT /api/capacity`.
    Admin,
    /// None is known.
    None,
}

impl CapacitySource {
    /// Its name in logs and in `GET /api/capacity`.
    pub fn name(self) -> &'static str {
        match self {
            CapacitySource::Config => "config",
            CapacitySource::DeviceModel => "device_model",
            CapacitySource::Probe => "probe",
            CapacitySource::Admin => "admin",
            CapacitySource::None => "none",
        }
    }
}

/// The configuration file's capacity settings, recorded with a run-time capacity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacityBase {
    /// `capacity_iops` (or the device model's) from the file.
    pub capacity_iops: Option<f64>,
    /// `probe_capacity_s` from the file.
    pub probe_capacity_s: f64,
}

impl CapacityBase {
    /// The capacity settings of `cfg`.
    pub fn of(cfg: &ServerConfig) -> CapacityBase {
        CapacityBase { capacity_iops: cfg.capacity_iops, probe_capacity_s: cfg.probe_capacity_s }
    }
}

/// A capacity set at run time (admin) or measured (probe).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacityEntry {
    /// The capacity, IOPS.
    pub iops: f64,
    /// `admin` or `probe`.
    pub source: CapacitySource,
    /// The file's capacity settings then.
    pub config: CapacityBase,
}

/// The state file's contents (module comment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// Run-time tenant changes by name.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantEntry>,
    /// Run-time export changes by name.
    #[serde(default)]
    pub exports: BTreeMap<String, ExportEntry>,
    /// A capacity set at run time or measured.
    #[serde(default)]
    pub capacity: Option<CapacityEntry>,
}

impl Default for StateFile {
    fn default() -> Self {
        StateFile { version: STATE_VERSION, tenants: BTreeMap::new(), exports: BTreeMap::new(), capacity: None }
    }
}

impl StateFile {
    /// Nothing changed at run time.
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty() && self.exports.is_empty() && self.capacity.is_none()
    }
}

/// Reads `dir`'s state file; `Ok(None)` if there is none.
pub fn load(dir: &Path) -> Result<Option<StateFile>, StateError> {
    let path = dir.join(STATE_FILE);
    let bytes = match rein_model::input::read_bounded(&path, MAX_STATE_BYTES) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            return Err(StateError::Corrupt { path, message: format!("larger than {MAX_STATE_BYTES} bytes") })
        }
        Err(source) => return Err(StateError::Read { path, source }),
        Ok(bytes) => bytes,
    };
    parse(&bytes).map(Some).map_err(|message| StateError::Corrupt { path, message })
}

/// Parses state file text, checking the version.
pub fn parse(bytes: &[u8]) -> Result<StateFile, String> {
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let v: Version = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if v.version != STATE_VERSION {
        return Err(format!("version {} (this server reads version {STATE_VERSION})", v.version));
    }
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

/// Writes `state` as `dir`'s state file atomically (module comment); an empty state removes the file. On
/// an error the file is as it was and no temporary file is left.
pub fn save(dir: &Path, state: &StateFile) -> Result<(), StateError> {
    let path = dir.join(STATE_FILE);
    if !state.is_empty() {
        let text = serde_json::to_vec_pretty(state).expect("a state serialises");
        if text.len() as u64 > MAX_STATE_BYTES {
            // Written, it would stop the next start (`load` refuses it): refused now, the old file kept.
            return Err(StateError::TooLarge { bytes: text.len() as u64 });
        }
        return crate::durable::write(&path, &text).map_err(|e| StateError::Write {
            path,
            step: e.step.words(),
            source: e.source,
        });
    }
    let fail = |step: &'static str| {
        let path = path.clone();
        move |source| StateError::Write { path, step, source }
    };
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail("removing it")(e)),
        _ => {}
    }
    crate::durable::sync_directory(dir).map_err(fail("syncing its directory"))
}

/// The effective configuration: `base` with the entries of `state` that still apply (module comment).
#[derive(Debug, Clone)]
pub struct Overlaid {
    /// The configuration to run.
    pub config: ServerConfig,
    /// The capacity from the state, if one applies.
    pub capacity: Option<CapacityEntry>,
    /// One line per entry applied or dropped, for the log.
    pub notes: Vec<String>,
    /// Whether an entry was dropped (the state file should be rewritten).
    pub pruned: bool,
}

/// Applies `state` over `base` (module comment). Entries that no longer apply (the file changed the item)
/// are dropped with a note; entries that cannot apply (an export whose tenant is gone, an invalid spec)
/// are dropped with a note saying why.
pub fn overlay(base: &ServerConfig, state: &StateFile) -> Overlaid {
    let mut cfg = base.clone();
    let mut notes = Vec::new();
    let mut pruned = false;
    // The default export by name: entries delete and re-add exports, so its index is rebuilt at the end.
    let default_export = cfg.default_export.map(|i| cfg.exports[i].name.clone());
    // Exports by name with their tenant's name, so that tenant indices can be rebuilt at the end.
    let mut exports: Vec<(ExportConfig, String)> =
        cfg.exports.iter().map(|e| (e.clone(), cfg.tenants[e.tenant].name.clone())).collect();
    // By name, not by scanning: a state file may hold as many tenants as the scheduler takes (2^20), and a
    // scan per entry took minutes at that size. Each name comes once in the state, so an entry sees the
    // file's tenant of its name (or none); deletions are made together after the loop.
    let used: std::collections::HashSet<String> = exports.iter().map(|(_, t)| t.clone()).collect();
    let mut at: std::collections::HashMap<String, usize> =
        cfg.tenants.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
    let mut deleted = std::collections::HashSet::new();
    for (name, entry) in &state.tenants {
        let now = at.get(name).map(|&i| SpecJson::from(cfg.tenants[i].spec));
        if now != entry.config {
            notes.push(format!(
                "tenant {name}: the configuration file changed it since the run-time change; using the file"
            ));
            pruned = true;
            continue;
        }
        match &entry.spec {
            None => {
                if used.contains(name) {
                    notes.push(format!(
                        "tenant {name}: deleted at run time but an export of the file uses it; keeping it"
                    ));
                    pruned = true;
                    continue;
                }
                deleted.insert(name.as_str());
                notes.push(format!("tenant {name}: deleted (state file)"));
            }
            Some(_) if !(1..=MAX_TENANT_NAME).contains(&name.len()) && !at.contains_key(name) => {
                notes.push(format!(
                    "dropped the state file's tenant {name:?}: a new tenant's name must have 1..={MAX_TENANT_NAME} bytes"
                ));
                pruned = true;
            }
            Some(s) => match s.spec() {
                Ok(spec) => {
                    match at.get(name) {
                        Some(&i) => cfg.tenants[i].spec = spec,
                        None => {
                            at.insert(name.clone(), cfg.tenants.len());
                            cfg.tenants.push(TenantConfig { name: name.clone(), spec });
                        }
                    }
                    notes.push(format!("tenant {name}: {spec} (state file)"));
                }
                Err(e) => {
                    notes.push(format!("tenant {name}: dropped the state file's spec: {e}"));
                    pruned = true;
                }
            },
        }
    }
    if !deleted.is_empty() {
        cfg.tenants.retain(|t| !deleted.contains(t.name.as_str()));
    }
    let at: std::collections::HashMap<&str, usize> =
        cfg.tenants.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    for (name, entry) in &state.exports {
        let now = exports.iter().find(|(e, _)| &e.name == name).map(|(e, t)| ExportJson::from_config(e, t));
        if now != entry.config {
            notes.push(format!(
                "export {name}: the configuration file changed it since the run-time change; using the file"
            ));
            pruned = true;
            continue;
        }
        exports.retain(|(e, _)| &e.name != name);
        match &entry.export {
            None => notes.push(format!("export {name}: deleted (state file)")),
            Some(j) if j.name != *name => {
                notes.push(format!("dropped the state file's export {name}: it is named {:?} inside", j.name));
                pruned = true;
            }
            Some(_) if exports.len() >= MAX_EXPORTS => {
                notes.push(format!("dropped the state file's export {name}: at most {MAX_EXPORTS} exports"));
                pruned = true;
            }
            Some(j) => match j.to_config(&cfg.data_dir, &cfg.tenants, ExportOrigin::StateFile) {
                Ok(e) => {
                    notes.push(format!("export {name}: added (state file)"));
                    exports.push((e, j.tenant.clone()));
                }
                Err(e) => {
                    notes.push(format!("dropped the state file's export: {e}"));
                    pruned = true;
                }
            },
        }
    }
    // A tenant deleted through the file while a run-time export used it.
    exports.retain(|(e, t)| {
        let keep = at.contains_key(t.as_str());
        if !keep {
            notes.push(format!("export {}: its tenant {t} is gone; dropped", e.name));
            pruned = true;
        }
        keep
    });
    cfg.exports = exports
        .into_iter()
        .map(|(mut e, t)| {
            e.tenant = at[t.as_str()];
            e
        })
        .collect();
    cfg.default_export = default_export.and_then(|name| {
        let at = cfg.exports.iter().position(|e| e.name == name);
        if at.is_none() {
            notes.push(format!("default_export {name}: the export is deleted; the empty name opens nothing"));
        }
        at
    });
    let capacity = match state.capacity {
        // Only `PUT /api/capacity` (positive, finite) and the probe write one; a hand-edited or damaged
        // file may hold anything JSON does.
        Some(c) if !(c.iops.is_finite() && c.iops > 0.0) => {
            notes.push(format!("dropped the state file's capacity {} IOPS: a capacity must be positive", c.iops));
            pruned = true;
            None
        }
        Some(c) if c.config == CapacityBase::of(base) => {
            notes.push(format!("capacity {} IOPS ({}, state file)", c.iops, c.source.name()));
            Some(c)
        }
        Some(c) => {
            notes.push(format!(
                "capacity {} IOPS ({}): the configuration file changed its capacity settings since; using the file",
                c.iops,
                c.source.name()
            ));
            pruned = true;
            None
        }
        None => None,
    };
    Overlaid { config: cfg, capacity, notes, pruned }
}

/// The state file that turns `base` into `effective` with `capacity` (module comment).
pub fn diff(base: &ServerConfig, effective: &ServerConfig, capacity: Option<CapacityEntry>) -> StateFile {
    let mut st = StateFile { capacity, ..StateFile::default() };
    let spec_of = |c: &ServerConfig, n: &str| c.tenants.iter().find(|t| t.name == n).map(|t| SpecJson::from(t.spec));
    for name in base.tenants.iter().chain(&effective.tenants).map(|t| &t.name) {
        let (b, e) = (spec_of(base, name), spec_of(effective, name));
        if b != e {
            st.tenants.insert(name.clone(), TenantEntry { spec: e, config: b });
        }
    }
    let export_of = |c: &ServerConfig, n: &str| {
        c.exports.iter().find(|e| e.name == n).map(|e| ExportJson::from_config(e, &c.tenants[e.tenant].name))
    };
    for name in base.exports.iter().chain(&effective.exports).map(|e| &e.name) {
        let (b, e) = (export_of(base, name), export_of(effective, name));
        if b != e {
            st.exports.insert(name.clone(), ExportEntry { export: e, config: b });
        }
    }
    st
}

/// An exclusive `flock` on `data_dir/rein.lock`, held for the server's life (released when dropped, or by
/// the kernel when the process dies, so a crash never leaves a stale lock).
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    /// Takes the lock and writes this process's pid into the file. Errors: [`StateError::Locked`] naming
    /// the directory and the holder's pid when another process holds it, [`StateError::Lock`] otherwise.
    pub fn acquire(dir: &Path) -> Result<DirLock, StateError> {
        use std::os::fd::AsRawFd;
        let path = dir.join(LOCK_FILE);
        let lerr = |source| StateError::Lock { path: path.clone(), source };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(lerr)?;
        // SAFETY: flock(2) on a descriptor this function owns and keeps open; no memory is passed.
        #[allow(unsafe_code)] // flock(2) has no safe wrapper in std.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let holder = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse().ok());
                return Err(StateError::Locked { dir: dir.to_path_buf(), holder });
            }
            return Err(lerr(e));
        }
        file.set_len(0).map_err(lerr)?;
        writeln!(file, "{}", std::process::id()).map_err(lerr)?;
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> ServerConfig {
        ServerConfig::parse(text, Path::new("t.toml")).unwrap()
    }

    const BASE: &str = "data_dir = \"/d\"\n[[exports]]\nname = \"a\"\nbackend = \"memory\"\nsize_mb = 1\n\
                        [[tenants]]\nname = \"a\"\nreservation = 10\n[[tenants]]\nname = \"b\"\n";

    #[test]
    fn diff_then_overlay_is_the_effective_config() {
        let base = cfg(BASE);
        let mut eff = base.clone();
        eff.tenants[0].spec = QosSpec::new(20.0, None, 1.0, 0).unwrap();
        eff.tenants.retain(|t| t.name != "b");
        eff.tenants.push(TenantConfig { name: "c".into(), spec: QosSpec::new(5.0, Some(9.0), 2.0, 0).unwrap() });
        let c = eff.tenants.len() - 1;
        eff.exports.push(ExportConfig {
            name: "m".into(),
            backend: BackendKind::Memory,
            size: Some(2 << 20),
            tenant: c,
            read_only: false,
            direct: false,
            readahead: true,
            access: Default::default(),
        });
        let st = diff(&base, &eff, None);
        assert_eq!(st.tenants.len(), 3);
        assert_eq!(st.exports.len(), 1);
        let back = parse(&serde_json::to_vec(&st).unwrap()).unwrap();
        assert_eq!(back, st);
        let o = overlay(&base, &st);
        assert!(!o.pruned, "{:?}", o.notes);
        assert_eq!(diff(&base, &o.config, None), st);
        let names: Vec<_> = o.config.tenants.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
        assert_eq!(o.config.tenants[0].spec.reservation(), 20.0);
        assert_eq!(o.config.tenants[o.config.exports[1].tenant].name, "c");
    }

    /// An export added at run time under a relative data directory (the default `rein-data` is one) is
    /// read back from the state file at the path it was created at: it took the data directory twice
    /// (`rel/data/rel/data/x.img`), and the next start and every reload failed.
    /// Export x of tenant a: a 1 MiB file at `path` (none: the data directory's default name).
    fn file_export(path: Option<&str>) -> ExportJson {
        ExportJson {
            name: "x".into(),
            backend: "file".into(),
            path: path.map(Into::into),
            size_mb: Some(1),
            tenant: "a".into(),
            read_only: false,
            direct: false,
            readahead: true,
            allow_networks: None,
            allow_identities: None,
        }
    }

    #[test]
    fn a_relative_data_directory_is_not_taken_twice() {
        let base = cfg(&BASE.replace("\"/d\"", "\"rel/data\""));
        let j = file_export(None);
        let e = j.to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin).unwrap();
        assert_eq!(e.backend, BackendKind::File { path: "rel/data/x.img".into() });
        let mut eff = base.clone();
        eff.exports.push(e.clone());
        let st = diff(&base, &eff, None);
        let o = overlay(&base, &parse(&serde_json::to_vec(&st).unwrap()).unwrap());
        assert!(!o.pruned, "{:?}", o.notes);
        assert_eq!(o.config.exports.last().unwrap().backend, e.backend);
        assert_eq!(diff(&base, &o.config, None), st);
    }

    /// A state file adding more exports than the bound: those beyond it are dropped, each named.
    #[test]
    fn a_state_file_adds_no_export_beyond_the_bound() {
        let base = cfg(BASE);
        let mut eff = base.clone();
        for i in 0..MAX_EXPORTS + 2 {
            eff.exports.push(ExportConfig {
                name: format!("m{i}"),
                backend: BackendKind::Memory,
                size: Some(1 << 20),
                tenant: 0,
                read_only: false,
                direct: false,
                readahead: true,
                access: Default::default(),
            });
        }
        let st = diff(&base, &eff, None);
        let o = overlay(&base, &st);
        assert_eq!(o.config.exports.len(), MAX_EXPORTS);
        assert!(o.pruned);
        assert_eq!(o.notes.iter().filter(|n| n.contains("at most 4096 exports")).count(), 3, "{:?}", &o.notes[..3]);
    }

    /// Entries that cannot apply, each named: a run-time deletion of a tenant that an export of the file
    /// uses keeps the tenant; a run-time export of a tenant deleted at run time is dropped. (With the
    /// tenants looked up by name, the deletions are made after the tenant entries: this pins their order
    /// against the exports'.)
    #[test]
    fn a_tenant_in_use_is_kept_and_an_export_of_a_deleted_tenant_dropped() {
        let base = cfg(BASE);
        let spec = |r: f64| Some(SpecJson::from(QosSpec::new(r, None, 1.0, 0).unwrap()));
        let mut st = StateFile::default();
        // Export a (the file's) is tenant a's; b is deleted, c added then used by a run-time export, as b.
        st.tenants.insert("a".into(), TenantEntry { spec: None, config: spec(10.0) });
        st.tenants.insert("b".into(), TenantEntry { spec: None, config: spec(0.0) });
        st.tenants.insert("c".into(), TenantEntry { spec: spec(3.0), config: None });
        for (name, tenant) in [("mb", "b"), ("mc", "c")] {
            let j = ExportJson {
                name: name.into(),
                backend: "memory".into(),
                path: None,
                tenant: tenant.into(),
                ..file_export(None)
            };
            st.exports.insert(name.into(), ExportEntry { export: Some(j), config: None });
        }
        let o = overlay(&base, &st);
        assert!(o.pruned);
        let names: Vec<_> = o.config.tenants.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "c"], "{:?}", o.notes);
        let exports: Vec<_> =
            o.config.exports.iter().map(|e| (e.name.as_str(), o.config.tenants[e.tenant].name.as_str())).collect();
        assert_eq!(exports, [("a", "a"), ("mc", "c")], "{:?}", o.notes);
        assert!(o.notes.iter().any(|n| n.contains("tenant a: deleted at run time but an export of the file uses it")));
        assert!(o.notes.iter().any(|n| n == "tenant b: deleted (state file)"), "{:?}", o.notes);
        assert!(
            o.notes.iter().any(|n| n.starts_with("dropped the state file's export") && n.contains('b')),
            "{:?}",
            o.notes
        );
    }

    #[test]
    fn the_file_wins_once_it_changes_the_item() {
        let base = cfg(BASE);
        let mut eff = base.clone();
        eff.tenants[0].spec = QosSpec::new(20.0, None, 1.0, 0).unwrap();
        eff.tenants[1].spec = QosSpec::new(0.0, None, 7.0, 0).unwrap();
        let st = diff(&base, &eff, None);
        // The operator edits tenant a in the file: a follows the file, b keeps its run-time spec.
        let edited = cfg(&BASE.replace("reservation = 10", "reservation = 30"));
        let o = overlay(&edited, &st);
        assert!(o.pruned);
        assert_eq!(o.config.tenants[0].spec.reservation(), 30.0);
        assert_eq!(o.config.tenants[1].spec.weight(), 7.0);
        assert!(o.notes.iter().any(|n| n.contains("tenant a: the configuration file changed it")), "{:?}", o.notes);
        assert_eq!(diff(&edited, &o.config, None).tenants.len(), 1);
    }

    #[test]
    fn bad_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_none());
        std::fs::write(dir.path().join(STATE_FILE), "{\"version\": 1, \"tenants\": 3}").unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains(STATE_FILE) && e.contains("invalid type"), "{e}");
        std::fs::write(dir.path().join(STATE_FILE), "{\"version\": 2}").unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("version 2"), "{e}");
        let st = StateFile {
            capacity: Some(CapacityEntry {
                iops: 5.0,
                source: CapacitySource::Admin,
                config: CapacityBase { capacity_iops: None, probe_capacity_s: 0.0 },
            }),
            ..StateFile::default()
        };
        save(dir.path(), &st).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(st));
        assert_eq!(crate::testkit::dir_names(dir.path()), [STATE_FILE], "a temporary file is left");
        save(dir.path(), &StateFile::default()).unwrap();
        assert!(crate::testkit::dir_names(dir.path()).is_empty());
        assert!(load(dir.path()).unwrap().is_none());
    }

    /// A write that fails (here the rename, onto a directory in the state file's place) is an error naming
    /// the file and the cause, and leaves no temporary file behind (a full disk left an empty one).
    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(STATE_FILE)).unwrap();
        let st = StateFile {
            capacity: Some(CapacityEntry {
                iops: 5.0,
                source: CapacitySource::Admin,
                config: CapacityBase { capacity_iops: None, probe_capacity_s: 0.0 },
            }),
            ..StateFile::default()
        };
        let e = save(dir.path(), &st).unwrap_err().to_string();
        let path = dir.path().join(STATE_FILE);
        assert_eq!(
            e,
            format!(
                "cannot write the state file {}: checking what the path names: it is a directory, not a regular file, so it is left alone",
                path.display()
            )
        );
        assert_eq!(crate::testkit::dir_names(dir.path()), [STATE_FILE], "a temporary file is left");
    }

    /// A state larger than `load` reads back is refused by `save`, the file before it kept: the server
    /// never writes a state file that would stop its next start.
    #[test]
    fn a_state_over_the_bound_is_refused_and_the_file_kept() {
        let dir = tempfile::tempdir().unwrap();
        let base = cfg(BASE);
        let mut eff = base.clone();
        eff.tenants[0].spec = QosSpec::new(20.0, None, 1.0, 0).unwrap();
        let small = diff(&base, &eff, None);
        save(dir.path(), &small).unwrap();
        // 256-byte names: about 400 bytes per tenant, 50,000 tenants well over 16 MiB.
        let mut big = small.clone();
        let entry = big.tenants.values().next().unwrap().clone();
        big.tenants.extend((0..50_000).map(|i| (format!("{i:0>256}"), TenantEntry { config: None, ..entry.clone() })));
        let e = save(dir.path(), &big).unwrap_err();
        assert!(matches!(e, StateError::TooLarge { bytes } if bytes > MAX_STATE_BYTES), "{e}");
        assert!(e.to_string().contains("the change is refused"), "{e}");
        assert_eq!(load(dir.path()).unwrap(), Some(small));
        assert_eq!(crate::testkit::dir_names(dir.path()), [STATE_FILE], "a temporary file is left");
    }

    #[test]
    fn a_second_lock_names_the_directory_and_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let held = DirLock::acquire(dir.path()).unwrap();
        let e = DirLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(e.contains(&dir.path().display().to_string()), "{e}");
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        drop(held);
        DirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn admin_exports_stay_in_the_data_directory() {
        let base = cfg(BASE);
        let j = |p: &str| file_export(Some(p));
        let e = j("").to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin).unwrap_err();
        assert!(e.contains("path is empty"), "{e}");
        for p in ["/etc/passwd", "../x.img", "a/../../x.img"] {
            let e = j(p).to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin).unwrap_err();
            assert!(e.contains("must be relative"), "{e}");
        }
        let e =
            ExportJson { size_mb: None, ..j("nope.img") }.to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin);
        assert!(e.unwrap_err().contains("give size_mb to create it"));
        // A memory export without size_mb: the default of rein.toml (it needed size_mb).
        let mem = ExportJson { backend: "memory".into(), path: None, size_mb: None, ..j("x") };
        let e = mem.to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin).unwrap();
        assert_eq!(e.size, Some(crate::config::DEFAULT_MEMORY_MB << 20));
        let e = ExportJson { size_mb: Some(0), ..mem }.to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin);
        assert!(e.unwrap_err().contains("size_mb must be in 1..=2^30"));
        // A memory export larger than the machine: refused, not an abort (1 PiB is the largest size).
        let huge = ExportJson { backend: "memory".into(), path: None, size_mb: Some(1 << 30), ..j("x") };
        let e = huge.to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin).unwrap_err();
        assert!(e.contains("larger than this machine's RAM"), "{e}");
    }
}
