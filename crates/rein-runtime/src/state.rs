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
//! The state file is written whole through [`crate::durable`]: a temporary file beside it, fsynced,
//! renamed over `rein-state.json`, the directory fsynced: after a crash the file is the old state or the
//! new one, never a mix. Every change is kept before it is applied; a change that cannot be kept is not
//! applied, and no temporary file is left (the registry logs the error, [`crate::live`]).
//!
//! # Journal
//! Rewriting the whole file per change made adding N tenants one by one write O(N^2) bytes (1.4 GB for
//! 4,096). So a [`Store`] writes the file at the first change, then appends each change's entries (the
//! difference from the state kept: the entries set, `null` for one gone, the capacity) as one JSON line
//! to `rein-state.journal` and syncs it (`fdatasync`); once the journal is longer than the file (and
//! [`MIN_JOURNAL_BYTES`]) the next change rewrites the file whole and removes the journal, so both stay
//! within a small multiple of the state and the bytes written are O(N) in all. Reading ([`Store::open`])
//! applies the journal's lines over the file in order. Each writing of the file has a generation (in the
//! file, `"generation"`: past the one before, and nanoseconds since the epoch, so past what an earlier
//! run wrote), and each record the generation of the file it follows: a crash between a rewrite and the
//! journal's removal leaves records of the earlier generation, which reading skips (they are in the file;
//! replayed, they put back older values of entries that the change that rewrote the file had set). A
//! file and records without one (written before generations) are generation 0, and read as before. A last
//! line cut short (a crash while it was appended; the change was never applied) is ignored with a
//! warning, and the next change rewrites the file; a bad line before others is an error naming the
//! journal and the line. An append that fails is cut back before the error is returned.
//!
//! An admin change names the entries it touches ([`Change`]: a tenant's or an export's, computed from
//! the configuration file's item of that name and what runs now) and [`Store::apply`] keeps them, so a
//! change costs its entries, not the state (computing [`diff`] whole per change, and copying the state
//! kept, made adding N tenants one by one cost O(N^2) entry copies: 4.4 ms per add at 4,096 tenants).
//! A reload, which may change anything, keeps the whole [`diff`] ([`Store::save`]). The oracle of
//! [`Store::apply`] is [`diff`]: a proptest holds them equal over random changes.

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

/// The running `rein serve` of `data_dir`, if it has the block device `path` open: the pid that its lock
/// file ([`LOCK_FILE`]) names, if that process has both the lock file and a node of the
/// device open (its descriptors in `/proc/PID/fd`; a pid left in the file by a server that died names
/// a process that has neither). [`crate::preflight::Holder::Unseen`] where the lock file or the descriptors cannot be
/// read for want of permission (another user's server); `None` where there is no lock file or no such
/// process, or it does not hold the device. `rein serve --check-config` asks it of a writable block
/// device it finds claimed ([`crate::preflight::inspect_export`]).
pub fn server_holding(data_dir: &Path, path: &Path) -> Option<crate::preflight::Holder> {
    use crate::preflight::Holder;
    use std::io::ErrorKind::PermissionDenied;
    let lock = data_dir.join(LOCK_FILE);
    let pid: u32 = match std::fs::read_to_string(&lock) {
        Ok(text) => text.trim().parse().ok()?,
        Err(e) if e.kind() == PermissionDenied => return Some(Holder::Unseen(None)),
        Err(_) => return None,
    };
    // The lock file by the path the server's descriptor names (the kernel's link text is the file's
    // absolute path, symbolic links resolved), and the device by its number.
    let lock = std::fs::canonicalize(&lock).ok()?;
    let node = std::fs::canonicalize(path).ok()?;
    let device = crate::device_holders::block_device_behind(path, &node, &node)?;
    let fds = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(fds) => fds,
        Err(e) if e.kind() == PermissionDenied => return Some(Holder::Unseen(Some(pid))),
        Err(_) => return None,
    };
    let (mut has_lock, mut has_device) = (false, false);
    for fd in fds.flatten() {
        // Only files: a socket's, pipe's or anonymous inode's link names no path.
        let Ok(target) = std::fs::read_link(fd.path()) else { continue };
        has_lock |= target == lock;
        // Only the device's files are stat'ed (the server's image files may be on a network file system,
        // where a stat hangs while its server is gone).
        has_device |= crate::device_holders::block_device_behind(&fd.path(), &target, &node) == Some(device);
    }
    (has_lock && has_device).then_some(Holder::Holds(pid))
}

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
        "state file {path} is unusable: {error} (it holds the changes made through the admin API; fix it, or \
         move it away to start from the configuration file alone)"
    )]
    Corrupt {
        /// The file (the state file or its journal).
        path: PathBuf,
        /// What is wrong.
        #[source]
        error: StateFileError,
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
    ) -> Result<ExportConfig, ExportSpecError> {
        let strict_path = origin == ExportOrigin::Admin;
        let name = &self.name;
        if name.is_empty() || name.len() > 4096 {
            return Err(ExportSpecError::NameLength { name: name.clone() });
        }
        // Through the API: a name with a newline or an escape wrote lines of its own into the text log.
        if strict_path && name.chars().any(char::is_control) {
            return Err(ExportSpecError::NameControl { name: name.clone() });
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
            .ok_or_else(|| ExportSpecError::SizeMb { name: name.clone() })?;
        crate::config::file_only_settings(name, &self.backend, self.direct, self.readahead)?;
        let backend = match self.backend.as_str() {
            "file" => {
                let p = self.path.clone().unwrap_or_else(|| PathBuf::from(format!("{name}.img")));
                if p.as_os_str().is_empty() {
                    return Err(ExportSpecError::EmptyPath { name: name.clone() });
                }
                if strict_path
                    && (p.is_absolute() || p.components().any(|c| !matches!(c, std::path::Component::Normal(_))))
                {
                    return Err(ExportSpecError::PathNotRelative { name: name.clone(), path: p });
                }
                let path = if strict_path { data_dir.join(p) } else { p };
                // A directory that is not there (a name `y/z` makes the default path `y/z.img`) is the
                // request's fault: a bad request, not the failed open (500) it was.
                if strict_path && path.parent().is_some_and(|d| !d.is_dir()) && data_dir.is_dir() {
                    return Err(ExportSpecError::NoDirectory { name: name.clone(), path });
                }
                // As at start (`FileStorage::open_with`), said as a bad request rather than a failed open;
                // a state file's entry fails at its open, naming the export, rather than being dropped.
                if strict_path && self.read_only && !path.exists() {
                    return Err(ExportSpecError::ReadOnlyMissing { name: name.clone(), path });
                }
                if self.size_mb.is_none() && !path.exists() {
                    return Err(ExportSpecError::MissingWithoutSize { name: name.clone(), path });
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
                    return Err(ExportSpecError::AboveRam { name: name.clone(), size_mb, ram_mb: ram >> 20 });
                }
                BackendKind::Memory
            }
            o => return Err(ExportSpecError::Backend { name: name.clone(), got: o.to_string() }),
        };
        if size == 0 && self.size_mb.is_some() {
            return Err(ExportSpecError::SizeMb { name: name.clone() });
        }
        let tenant = tenants
            .iter()
            .position(|t| t.name == self.tenant)
            .ok_or_else(|| ExportSpecError::UnknownTenant { name: name.clone(), tenant: self.tenant.clone() })?;
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

/// Why an export of the admin API or the state file ([`ExportJson::to_config`]) is refused: the export and
/// what is wrong, once.
#[derive(Debug, thiserror::Error)]
pub enum ExportSpecError {
    /// A name empty or longer than 4,096 bytes.
    #[error("export name {name:?} is empty or longer than 4096 bytes")]
    NameLength {
        /// The name given.
        name: String,
    },
    /// A name with a control character (through the API: it would write lines of its own into the log).
    #[error("export name {name:?} has a control character")]
    NameControl {
        /// The name given.
        name: String,
    },
    /// `size_mb` 0 or beyond 2^30.
    #[error("export {name}: size_mb must be in 1..=2^30")]
    SizeMb {
        /// The export.
        name: String,
    },
    /// A setting only a file export takes, or an access list, refused (the message names the export).
    #[error(transparent)]
    Setting(#[from] crate::config::SettingError),
    /// `path` given empty.
    #[error("export {name}: path is empty (omit it for {name}.img)")]
    EmptyPath {
        /// The export.
        name: String,
    },
    /// Through the API: a path absolute or with `..`.
    #[error("export {name}: path {} must be relative to the data directory, without ..", path.display())]
    PathNotRelative {
        /// The export.
        name: String,
        /// The path given.
        path: PathBuf,
    },
    /// Through the API: the path's directory is not in the data directory.
    #[error("export {name}: the directory of {} does not exist in the data directory", path.display())]
    NoDirectory {
        /// The export.
        name: String,
        /// The path, joined to the data directory.
        path: PathBuf,
    },
    /// Through the API: a read-only export of a file that is not there (it is not created).
    #[error("export {name}: {} does not exist (a read-only export is not created)", path.display())]
    ReadOnlyMissing {
        /// The export.
        name: String,
        /// The file.
        path: PathBuf,
    },
    /// A file that is not there, without `size_mb` to create it.
    #[error("export {name}: {} does not exist (give size_mb to create it)", path.display())]
    MissingWithoutSize {
        /// The export.
        name: String,
        /// The file.
        path: PathBuf,
    },
    /// Through the API: a memory export larger than the machine's RAM.
    #[error("export {name}: a memory export of {size_mb} MiB is larger than this machine's RAM ({ram_mb} MiB)")]
    AboveRam {
        /// The export.
        name: String,
        /// Its size.
        size_mb: u64,
        /// The machine's RAM (MemTotal).
        ram_mb: u64,
    },
    /// A backend other than file or memory.
    #[error("export {name}: backend {got:?}: expected file or memory")]
    Backend {
        /// The export.
        name: String,
        /// The backend given.
        got: String,
    },
    /// A tenant the server does not have.
    #[error("export {name}: unknown tenant {tenant:?}")]
    UnknownTenant {
        /// The export.
        name: String,
        /// The tenant given.
        tenant: String,
    },
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
    /// Which writing of the file this is (module comment, "Journal"): the journal's records carry the
    /// generation of the file they follow, and others are stale. 0 (absent) in a file written before
    /// generations; a [`Store`] reads it, and the state it gives out has 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Default for StateFile {
    fn default() -> Self {
        StateFile {
            version: STATE_VERSION,
            tenants: BTreeMap::new(),
            exports: BTreeMap::new(),
            capacity: None,
            generation: 0,
        }
    }
}

impl StateFile {
    /// Nothing changed at run time.
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty() && self.exports.is_empty() && self.capacity.is_none()
    }
}

/// Reads `dir`'s state: the state file with its journal's changes applied ([`Store::open`]); `Ok(None)`
/// if there is neither.
pub fn load(dir: &Path) -> Result<Option<StateFile>, StateError> {
    Store::open(dir).map(|(_, state)| state)
}

/// Reads `path` whole, up to `max` bytes; `Ok(None)` if it does not exist.
fn read_state_bytes(path: &Path, max: u64) -> Result<Option<Vec<u8>>, StateError> {
    match crate::durable::read(path, max) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            Err(StateError::Corrupt { path: path.to_path_buf(), error: StateFileError::TooLarge { max } })
        }
        Err(source) => Err(StateError::Read { path: path.to_path_buf(), source }),
        Ok(bytes) => Ok(Some(bytes)),
    }
}

/// What is wrong with a state file's or its journal's bytes ([`parse`], [`apply_journal`];
/// [`StateError::Corrupt`] names the file).
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// Longer than a server reads back.
    #[error("larger than {max} bytes")]
    TooLarge {
        /// The bound read.
        max: u64,
    },
    /// Not JSON of the state file's schema.
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    /// Another version than [`STATE_VERSION`].
    #[error("version {got} (this server reads version {STATE_VERSION})")]
    Version {
        /// The version in the file.
        got: u32,
    },
    /// A journal line (not the last) that is not a record.
    #[error("line {line}: {error}")]
    JournalLine {
        /// The line's number (1-based).
        line: usize,
        /// Why it is not a record.
        #[source]
        error: serde_json::Error,
    },
    /// A journal record of another version than [`STATE_VERSION`].
    #[error("line {line}: version {got} (this server reads version {STATE_VERSION})")]
    JournalVersion {
        /// The line's number (1-based).
        line: usize,
        /// The version in the record.
        got: u32,
    },
}

/// Parses state file text, checking the version.
pub fn parse(bytes: &[u8]) -> Result<StateFile, StateFileError> {
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let v: Version = serde_json::from_slice(bytes).map_err(StateFileError::Json)?;
    if v.version != STATE_VERSION {
        return Err(StateFileError::Version { got: v.version });
    }
    serde_json::from_slice(bytes).map_err(StateFileError::Json)
}

/// The journal's name inside the data directory (module comment, "Journal").
pub const JOURNAL_FILE: &str = "rein-state.journal";
/// A journal shorter than this is not compacted into the state file, however small that file is.
pub const MIN_JOURNAL_BYTES: u64 = 64 << 10;

/// One change as the journal keeps it: the entries it sets (`null`: the entry is gone from the state) and
/// the capacity entry if it changed (`"capacity": null`: no run-time capacity any more).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Delta {
    version: u32,
    /// The generation of the state file this record follows ([`StateFile::generation`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    generation: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    tenants: BTreeMap<String, Option<TenantEntry>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    exports: BTreeMap<String, Option<ExportEntry>>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    capacity: Option<Option<CapacityEntry>>,
}

/// A key that is present deserialises to `Some`, also when its value is `null` (`Delta::capacity`).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The entries of `new` that differ from `old`'s, as a delta (`None`: gone).
fn delta_map<T: Clone + PartialEq>(
    old: &BTreeMap<String, T>,
    new: &BTreeMap<String, T>,
) -> BTreeMap<String, Option<T>> {
    let mut d: BTreeMap<String, Option<T>> =
        new.iter().filter(|(k, v)| old.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
    d.extend(old.keys().filter(|k| !new.contains_key(*k)).map(|k| (k.clone(), None)));
    d
}

impl Delta {
    fn between(old: &StateFile, new: &StateFile) -> Delta {
        Delta {
            version: STATE_VERSION,
            generation: 0,
            tenants: delta_map(&old.tenants, &new.tenants),
            exports: delta_map(&old.exports, &new.exports),
            capacity: (old.capacity != new.capacity).then_some(new.capacity),
        }
    }

    fn is_empty(&self) -> bool {
        self.tenants.is_empty() && self.exports.is_empty() && self.capacity.is_none()
    }

    /// The delta that takes the state `old` would become under this one back to `old`.
    fn undo(&self, old: &StateFile) -> Delta {
        Delta {
            version: STATE_VERSION,
            generation: 0,
            tenants: self.tenants.keys().map(|k| (k.clone(), old.tenants.get(k).cloned())).collect(),
            exports: self.exports.keys().map(|k| (k.clone(), old.exports.get(k).cloned())).collect(),
            capacity: self.capacity.map(|_| old.capacity),
        }
    }

    fn apply(self, st: &mut StateFile) {
        fn set<T>(map: &mut BTreeMap<String, T>, delta: BTreeMap<String, Option<T>>) {
            for (k, v) in delta {
                match v {
                    Some(v) => map.insert(k, v),
                    None => map.remove(&k),
                };
            }
        }
        set(&mut st.tenants, self.tenants);
        set(&mut st.exports, self.exports);
        if let Some(c) = self.capacity {
            st.capacity = c;
        }
    }
}

/// One run-time change to the state, by the entries it touches: for each tenant and export it names,
/// the entry [`diff`] would give it, computed from that tenant or export alone ([`Store::apply`]). What
/// every admin change persists: computing `diff` whole per change made adding N tenants one by one cost
/// N^2 entry copies.
#[derive(Debug, Clone)]
pub struct Change {
    delta: Delta,
}

impl Default for Change {
    fn default() -> Change {
        Change::new()
    }
}

impl Change {
    /// An empty change.
    pub fn new() -> Change {
        Change { delta: Delta { version: STATE_VERSION, ..Delta::default() } }
    }

    /// Tenant `name` runs with `now` (`None`: deleted) over the configuration file `base`.
    pub fn tenant(mut self, base: &ServerConfig, name: &str, now: Option<QosSpec>) -> Change {
        let b = base.tenant_index(name).map(|i| SpecJson::from(base.tenants[i].spec));
        let e = now.map(SpecJson::from);
        self.delta.tenants.insert(name.to_string(), (b != e).then_some(TenantEntry { spec: e, config: b }));
        self
    }

    /// Export `name` runs as `now` (`None`: deleted) over the configuration file `base`.
    pub fn export(mut self, base: &ServerConfig, name: &str, now: Option<ExportJson>) -> Change {
        let b = base
            .exports
            .iter()
            .find(|e| e.name == name)
            .map(|e| ExportJson::from_config(e, &base.tenants[e.tenant].name));
        let entry = (b != now).then_some(ExportEntry { export: now, config: b });
        self.delta.exports.insert(name.to_string(), entry);
        self
    }

    /// The run-time capacity is now `capacity`.
    pub fn capacity(mut self, capacity: Option<CapacityEntry>) -> Change {
        self.delta.capacity = Some(capacity);
        self
    }
}

/// The bytes one map entry takes in the pretty state file at most: `    "KEY": ` and its value, its lines
/// indented four more spaces than alone, and `,\n` ([`Store`]'s bound on the file it would write, without
/// writing it; a unit test holds it to the real file within a few bytes).
fn entry_bytes<T: Serialize>(key: &str, value: &T) -> u64 {
    let alone = serde_json::to_vec_pretty(value).expect("an entry serialises");
    let lines = alone.iter().filter(|&&b| b == b'\n').count();
    let key = serde_json::to_string(key).expect("a name serialises").len();
    (4 + key + 2 + alone.len() + 4 * lines + 2) as u64
}

/// The bytes of the pretty state file but its map entries: the version, the capacity, the maps' braces
/// (each non-empty map opens and closes on lines of its own, `{\n` ... `  }` instead of `{}`: 4 bytes).
fn frame_bytes(capacity: Option<CapacityEntry>) -> u64 {
    // The generation at its longest (module comment, "Journal").
    let frame = StateFile { capacity, generation: u64::MAX, ..StateFile::default() };
    serde_json::to_vec_pretty(&frame).expect("a state serialises").len() as u64 + 4 + 4
}

/// The bytes the pretty state file of `st` takes at most, by [`frame_bytes`] and [`entry_bytes`].
fn state_bytes(st: &StateFile) -> u64 {
    frame_bytes(st.capacity)
        + st.tenants.iter().map(|(k, v)| entry_bytes(k, v)).sum::<u64>()
        + st.exports.iter().map(|(k, v)| entry_bytes(k, v)).sum::<u64>()
}

/// What [`apply_journal`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalRead {
    /// The bytes of the records applied (all whole lines).
    pub bytes: usize,
    /// The last line's number if it was ignored as incomplete.
    pub cut: Option<usize>,
    /// Records skipped as stale: they follow another generation of the state file than the one read (a
    /// crash between a rewrite of the file and the journal's removal left them; the file holds them).
    pub stale: usize,
}

/// Applies the journal text `journal` over `state` (module comment, "Journal"; `None`: no state file, the
/// records apply over an empty state). A last line that does not parse or lacks its newline is ignored
/// (its number in [`JournalRead::cut`]); another line that does not parse, or of another version, is an
/// error naming the line.
pub fn apply_journal(state: &mut Option<StateFile>, journal: &[u8]) -> Result<JournalRead, StateFileError> {
    let mut read = JournalRead { bytes: 0, cut: None, stale: 0 };
    let generation = state.as_ref().map_or(0, |s| s.generation);
    let mut lines = journal.split_inclusive(|&b| b == b'\n').enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let last = lines.peek().is_none();
        match serde_json::from_slice::<Delta>(line) {
            Ok(d) if d.version != STATE_VERSION => {
                return Err(StateFileError::JournalVersion { line: i + 1, got: d.version })
            }
            Ok(d) if line.ends_with(b"\n") && d.generation != generation => read.stale += 1,
            Ok(d) if line.ends_with(b"\n") => {
                d.apply(state.get_or_insert_with(StateFile::default));
                read.bytes += line.len();
            }
            Err(error) if !last => return Err(StateFileError::JournalLine { line: i + 1, error }),
            // Only the last line can lack its newline.
            _ => read.cut = Some(i + 1),
        }
    }
    Ok(read)
}

/// A data directory's run-time state and the files that keep it (module comment, "Journal"): the state
/// file and the journal of changes since it was written.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    /// The state the files hold.
    kept: StateFile,
    /// [`state_bytes`] of `kept`.
    bytes: u64,
    /// The state file's length (0: none).
    file_bytes: u64,
    /// The journal, once opened for appending.
    journal: Option<std::fs::File>,
    /// The journal's length: its records, all whole.
    journal_bytes: u64,
    /// An append failed and could not be cut back: the next save rewrites the state file.
    torn: bool,
    /// The state file's generation ([`StateFile::generation`]; 0: none written by this store yet).
    generation: u64,
}

impl Store {
    /// Reads `dir`'s state file and applies its journal's records in order. A last record cut short (a
    /// crash while it was appended: the change was never applied) is ignored with a warning; any other
    /// record that does not parse is an error naming the journal and the line. Returns the store and the
    /// state (`None`: neither file exists).
    pub fn open(dir: &Path) -> Result<(Store, Option<StateFile>), StateError> {
        let path = dir.join(STATE_FILE);
        let file = read_state_bytes(&path, MAX_STATE_BYTES)?;
        let mut state = match &file {
            Some(bytes) => Some(parse(bytes).map_err(|error| StateError::Corrupt { path, error })?),
            None => None,
        };
        let jpath = dir.join(JOURNAL_FILE);
        // A journal is compacted once longer than the state file (or MIN_JOURNAL_BYTES): twice the
        // state's bound holds it with its last record.
        let journal = read_state_bytes(&jpath, 2 * MAX_STATE_BYTES)?.unwrap_or_default();
        let read =
            apply_journal(&mut state, &journal).map_err(|error| StateError::Corrupt { path: jpath.clone(), error })?;
        let generation = state.as_ref().map_or(0, |s| s.generation);
        if let Some(s) = &mut state {
            s.generation = 0;
        }
        if read.stale > 0 {
            tracing::info!(
                journal = %jpath.display(),
                "{}: {} of an earlier state file, which the state file holds (a stop between its rewrite and \
                 the journal's removal leaves them): not applied",
                jpath.display(),
                rein_core::Count(read.stale, "record")
            );
        }
        if let Some(line) = read.cut {
            tracing::warn!(
                journal = %jpath.display(),
                "{}: its last line (line {line}) is incomplete, as a crash while it was appended leaves it: \
                 ignored, since the change it held was never applied",
                jpath.display()
            );
        }
        let kept = state.clone().unwrap_or_default();
        let store = Store {
            bytes: state_bytes(&kept),
            kept,
            file_bytes: file.map_or(0, |f| f.len() as u64),
            journal_bytes: read.bytes as u64,
            // A record cut short, or stale ones, stay in the file until the state file is rewritten.
            torn: read.bytes < journal.len(),
            generation,
            ..Store::at(dir)
        };
        Ok((store, state.filter(|s| !s.is_empty())))
    }

    /// The store of `dir` as if it held nothing (no file read).
    fn at(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
            kept: StateFile::default(),
            bytes: frame_bytes(None),
            file_bytes: 0,
            journal: None,
            journal_bytes: 0,
            torn: false,
            generation: 0,
        }
    }

    /// Keeps `state` (module comment, "Journal"): its differences from the state kept are appended to the
    /// journal as one record and synced, or, once the journal is longer than the state file (and
    /// [`MIN_JOURNAL_BYTES`]), the state file is rewritten whole and the journal removed. A state whose
    /// file would exceed [`MAX_STATE_BYTES`] is refused. On an error nothing is kept: the files hold the
    /// state before (an append cut short is cut back, or ignored by [`Store::open`] if that fails too).
    /// This compares the whole state with the one kept; a change that knows the entries it touches keeps
    /// them with [`Store::apply`] instead, at their cost.
    pub fn save(&mut self, state: &StateFile) -> Result<(), StateError> {
        self.keep(Delta::between(&self.kept, state))
    }

    /// Keeps one change given by the entries it touches ([`Change`]) as [`Store::save`] keeps the state it
    /// makes (the same record, bound and files), at a cost that grows with the entries touched (and the
    /// logarithm of the state's), not with the state: every admin change comes this way.
    pub fn apply(&mut self, change: Change) -> Result<(), StateError> {
        self.keep(change.delta)
    }

    /// Keeps `delta` over `kept` ([`Store::save`]).
    fn keep(&mut self, mut delta: Delta) -> Result<(), StateError> {
        // Entries the state already holds as the change sets them change nothing (no record for them).
        let old = &self.kept;
        delta.tenants.retain(|k, v| old.tenants.get(k) != v.as_ref());
        delta.exports.retain(|k, v| old.exports.get(k) != v.as_ref());
        if delta.capacity == Some(old.capacity) {
            delta.capacity = None;
        }
        if delta.is_empty() {
            return Ok(());
        }
        // The file's size bound, from the entries the change replaces (not a serialisation per change).
        fn sizes<T: Serialize>(old: &BTreeMap<String, T>, delta: &BTreeMap<String, Option<T>>) -> (u64, u64) {
            delta.iter().fold((0, 0), |(gone, new), (k, v)| {
                (gone + old.get(k).map_or(0, |e| entry_bytes(k, e)), new + v.as_ref().map_or(0, |e| entry_bytes(k, e)))
            })
        }
        let ((tg, tn), (eg, en)) = (sizes(&old.tenants, &delta.tenants), sizes(&old.exports, &delta.exports));
        let (mut gone, mut new) = (tg + eg, tn + en);
        if let Some(c) = delta.capacity {
            (gone, new) = (gone + frame_bytes(old.capacity), new + frame_bytes(c));
        }
        let bytes = self.bytes + new - gone;
        if bytes > MAX_STATE_BYTES {
            // Written, it would stop the next start (`open` refuses it): refused now, the files kept.
            return Err(StateError::TooLarge { bytes });
        }
        delta.generation = self.generation;
        let mut line = serde_json::to_vec(&delta).expect("a delta serialises");
        line.push(b'\n');
        // `kept` takes the change in place (no copy of the state) and gives it back if it is not kept.
        let undo = delta.undo(old);
        delta.apply(&mut self.kept);
        // The first change writes the state file (where an operator looks for the changes), the next ones
        // the journal until it outgrows the file.
        let r = if self.kept.is_empty()
            || self.torn
            || self.file_bytes == 0
            || self.journal_bytes + line.len() as u64 > self.file_bytes.max(MIN_JOURNAL_BYTES)
        {
            self.compact_kept()
        } else {
            self.append(&line).map(|()| self.bytes = bytes)
        };
        if r.is_err() {
            undo.apply(&mut self.kept);
        }
        r
    }

    /// Appends `line` to the journal and syncs it; on an error cuts the journal back to its records.
    fn append(&mut self, line: &[u8]) -> Result<(), StateError> {
        let path = self.dir.join(JOURNAL_FILE);
        let fail = |step: &'static str| {
            let path = path.clone();
            move |source| StateError::Write { path, step, source }
        };
        if self.journal.is_none() {
            let f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&path)
                .map_err(fail("opening the journal"))?;
            // A journal just created must be in its directory before a record in it counts.
            crate::durable::sync_directory(&self.dir).map_err(fail("syncing its directory"))?;
            self.journal = Some(f);
        }
        let f = self.journal.as_mut().expect("opened");
        let r = f
            .write_all(line)
            .map_err(fail("appending to the journal"))
            .and_then(|()| f.sync_data().map_err(fail("syncing the journal")));
        if r.is_err() && f.set_len(self.journal_bytes).and_then(|()| f.sync_data()).is_err() {
            self.torn = true;
        }
        r?;
        self.journal_bytes += line.len() as u64;
        Ok(())
    }

    /// Writes `kept` as the state file, whole ([`crate::durable`]), with a new generation, then removes
    /// the journal (every record of which the file now holds: a crash between the two leaves records of
    /// the file's earlier generation, which [`Store::open`] skips). An empty state removes both files. On
    /// an error the byte counts are the ones before. A failed sync of the directory after the file's
    /// rename is no error: the file holds the change, which the next start applies, so it is kept (with a
    /// warning that a crash of the machine may undo it), and the next change rewrites.
    fn compact_kept(&mut self) -> Result<(), StateError> {
        let mut state = std::mem::take(&mut self.kept);
        let bytes = self.bytes;
        let r = self.rewrite(&mut state);
        self.kept = state;
        if r.is_err() {
            self.bytes = bytes;
        }
        // A rewrite that failed may have left the files other than the journal's records assume (an empty
        // state's removal that failed): the next save rewrites too.
        if matches!(r, Err(StateError::Write { .. })) {
            self.torn = true;
        }
        r
    }

    /// [`Store::compact_kept`]'s writing; `state` carries the new generation while it is serialised (a
    /// copy of the whole state for one field cost a clone per compaction) and 0 again after.
    fn rewrite(&mut self, state: &mut StateFile) -> Result<(), StateError> {
        let path = self.dir.join(STATE_FILE);
        let fail = |path: &Path, step: &'static str| {
            let path = path.to_path_buf();
            move |source| StateError::Write { path, step, source }
        };
        let mut file_bytes = 0;
        let mut unsynced = false;
        if state.is_empty() {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(&path, "removing it")(e)),
                _ => {}
            }
        } else {
            // A generation the journal's records so far cannot carry: past this store's, and past any an
            // earlier run could have written (nanoseconds since the epoch).
            let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let generation = (self.generation + 1).max(since_epoch.as_nanos() as u64);
            state.generation = generation;
            let text = serde_json::to_vec_pretty(&*state).expect("a state serialises");
            state.generation = 0;
            if text.len() as u64 > MAX_STATE_BYTES {
                return Err(StateError::TooLarge { bytes: text.len() as u64 });
            }
            match crate::durable::write(&path, &text) {
                Ok(()) => {}
                // After the rename: the file is the new one, which the next start reads, so the change is
                // kept (reported as not kept, it was applied at the next start all the same); whether
                // the rename survives a crash of the machine is not known, and the next change rewrites.
                Err(e) if e.step == crate::durable::Step::SyncDirectory => {
                    tracing::warn!(
                        state_file = %path.display(),
                        "{}: written, but syncing its directory failed ({}): the change is kept, and may not \
                         survive a crash of the machine",
                        path.display(),
                        e.source
                    );
                    unsynced = true;
                }
                Err(e) => return Err(StateError::Write { path: path.clone(), step: e.step.words(), source: e.source }),
            }
            file_bytes = text.len() as u64;
            self.generation = generation;
        }
        self.bytes = state_bytes(state);
        self.file_bytes = file_bytes;
        self.journal = None;
        let jpath = self.dir.join(JOURNAL_FILE);
        match std::fs::remove_file(&jpath) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // The state file holds every record: left, the journal only repeats it (and is cut next time).
            Err(e) => {
                tracing::warn!(journal = %jpath.display(), "cannot remove {}: {e}", jpath.display());
                self.torn = true;
                return Ok(());
            }
            Ok(()) => {}
        }
        self.journal_bytes = 0;
        // The file and the journal's removal are done: a failed sync leaves them as they are (the change
        // kept, as above), and the next change rewrites.
        if let Err(e) = crate::durable::sync_directory(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), "{}: syncing the directory failed ({e}): the change is kept, and may not survive a crash of the machine", self.dir.display());
            unsynced = true;
        }
        self.torn = unsynced;
        Ok(())
    }
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
    // file's tenant of its name (or none); deletions are decided after the exports (below).
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
            // Decided once the exports are (a tenant an export still uses is kept).
            None => {
                deleted.insert(name.as_str());
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
    for (name, entry) in &state.exports {
        let now = exports.iter().find(|(e, _)| &e.name == name).map(|(e, t)| ExportJson::from_config(e, t));
        if now != entry.config {
            notes.push(format!(
                "export {name}: the configuration file changed it since the run-time change; using the file"
            ));
            pruned = true;
            continue;
        }
        // The file's export of this name is replaced only by what applies: a run-time replacement that
        // cannot (its tenant gone, a bad entry) is dropped and the file's export stays, as a tenant's
        // spec that cannot apply leaves the file's (dropping both deleted the export for good).
        let in_file = exports.iter().position(|(e, _)| &e.name == name);
        let kept = if in_file.is_some() { "; the configuration file's export stays" } else { "" };
        match &entry.export {
            None => {
                exports.retain(|(e, _)| &e.name != name);
                notes.push(format!("export {name}: deleted (state file)"));
            }
            Some(j) if j.name != *name => {
                notes.push(format!("dropped the state file's export {name}: it is named {:?} inside{kept}", j.name));
                pruned = true;
            }
            Some(_) if in_file.is_none() && exports.len() >= MAX_EXPORTS => {
                notes.push(format!("dropped the state file's export {name}: at most {MAX_EXPORTS} exports"));
                pruned = true;
            }
            Some(j) => match j.to_config(&cfg.data_dir, &cfg.tenants, ExportOrigin::StateFile) {
                Ok(e) => {
                    exports.retain(|(e, _)| &e.name != name);
                    notes.push(format!("export {name}: added (state file)"));
                    exports.push((e, j.tenant.clone()));
                }
                Err(e) => {
                    notes.push(format!("dropped the state file's export: {e}{kept}"));
                    pruned = true;
                }
            },
        }
    }
    // Tenants deleted at run time go, but one an export uses, as the exports came out: a file's export
    // the file added back, or one whose run-time replacement could not apply (the file's stays, with its
    // tenant). A file's export the state deleted or moved to another tenant does not keep it, so an
    // export deleted and then its tenant, through the API, stay deleted (the tenant came back).
    if !deleted.is_empty() {
        let used: std::collections::HashSet<&str> = exports.iter().map(|(_, t)| t.as_str()).collect();
        deleted.retain(|name| {
            let keep = used.contains(name);
            notes.push(if keep {
                format!("tenant {name}: deleted at run time but an export uses it; keeping it")
            } else {
                format!("tenant {name}: deleted (state file)")
            });
            pruned |= keep;
            !keep
        });
        cfg.tenants.retain(|t| !deleted.contains(t.name.as_str()));
    }
    let at: std::collections::HashMap<&str, usize> =
        cfg.tenants.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
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
    use std::collections::HashMap;
    let mut st = StateFile { capacity, ..StateFile::default() };
    // By name, not by scanning: the start and every reload compute this over as many tenants as the
    // scheduler takes (a scan per name cost N^2 name comparisons; when every admin change computed it,
    // adding N tenants one by one cost N^3 / 3).
    let specs = |c: &ServerConfig| -> HashMap<String, SpecJson> {
        c.tenants.iter().map(|t| (t.name.clone(), SpecJson::from(t.spec))).collect()
    };
    let (bs, es) = (specs(base), specs(effective));
    for name in bs.keys().chain(es.keys()) {
        let (b, e) = (bs.get(name).copied(), es.get(name).copied());
        if b != e {
            st.tenants.insert(name.clone(), TenantEntry { spec: e, config: b });
        }
    }
    let exports = |c: &ServerConfig| -> HashMap<String, ExportJson> {
        c.exports.iter().map(|e| (e.name.clone(), ExportJson::from_config(e, &c.tenants[e.tenant].name))).collect()
    };
    let (bx, ex) = (exports(base), exports(effective));
    for name in bx.keys().chain(ex.keys()) {
        let (b, e) = (bx.get(name), ex.get(name));
        if b != e {
            st.exports.insert(name.clone(), ExportEntry { export: e.cloned(), config: b.cloned() });
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

    /// A run-time deletion of a tenant that an export uses keeps the tenant, named: an export of the file,
    /// or one of the state (which the API cannot make: a tenant with an export is not deleted; a file
    /// edited by hand can hold it, and the export's data is kept rather than dropped). (With the tenants
    /// looked up by name, the deletions are decided after the exports: this pins their order.)
    #[test]
    fn a_tenant_in_use_is_kept() {
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
        assert_eq!(names, ["a", "b", "c"], "{:?}", o.notes);
        let exports: Vec<_> =
            o.config.exports.iter().map(|e| (e.name.as_str(), o.config.tenants[e.tenant].name.as_str())).collect();
        assert_eq!(exports, [("a", "a"), ("mb", "b"), ("mc", "c")], "{:?}", o.notes);
        for t in ["a", "b"] {
            let note = format!("tenant {t}: deleted at run time but an export uses it; keeping it");
            assert!(o.notes.contains(&note), "{:?}", o.notes);
        }
    }

    /// An export deleted at run time and then its tenant: both stay deleted (the tenant was kept, "an
    /// export of the file uses it", by the export the state had deleted, and came back at the next start).
    /// A run-time replacement of a file's export whose tenant the file then drops leaves the file's export
    /// (it was deleted for good with its replacement).
    #[test]
    fn deletions_stay_and_a_replacement_that_cannot_apply_leaves_the_files_export() {
        let base = cfg(BASE);
        let mut eff = base.clone();
        eff.exports.clear();
        eff.tenants.retain(|t| t.name != "a");
        let o = overlay(&base, &diff(&base, &eff, None));
        let names: Vec<_> = o.config.tenants.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["b"], "{:?}", o.notes);
        assert!(o.config.exports.is_empty(), "{:?}", o.notes);
        assert!(!o.pruned, "{:?}", o.notes);
        assert!(o.notes.iter().any(|n| n == "tenant a: deleted (state file)"), "{:?}", o.notes);

        let mut eff = base.clone();
        eff.exports[0].tenant = 1;
        let st = diff(&base, &eff, None);
        let without_b = cfg("data_dir = \"/d\"\n[[exports]]\nname = \"a\"\nbackend = \"memory\"\nsize_mb = 1\n\
                             [[tenants]]\nname = \"a\"\nreservation = 10\n");
        let o = overlay(&without_b, &st);
        assert!(o.pruned);
        let exports: Vec<_> =
            o.config.exports.iter().map(|e| (e.name.as_str(), o.config.tenants[e.tenant].name.as_str())).collect();
        assert_eq!(exports, [("a", "a")], "{:?}", o.notes);
        assert!(
            o.notes
                .iter()
                .any(|n| n.contains("unknown tenant") && n.ends_with("the configuration file's export stays")),
            "{:?}",
            o.notes
        );
        assert!(diff(&without_b, &o.config, None).exports.is_empty(), "the rewrite keeps the file's export");
        // The same, with the export's first tenant deleted at run time after the move: the file's export
        // stays, and so does its tenant (both went).
        let mut eff = base.clone();
        eff.exports[0].tenant = 1;
        eff.tenants.remove(0);
        eff.exports[0].tenant = 0;
        let o = overlay(&without_b, &diff(&base, &eff, None));
        let exports: Vec<_> =
            o.config.exports.iter().map(|e| (e.name.as_str(), o.config.tenants[e.tenant].name.as_str())).collect();
        assert_eq!(exports, [("a", "a")], "{:?}", o.notes);
        assert!(o.notes.iter().any(|n| n.starts_with("tenant a: deleted at run time but an export uses it")));
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

    /// Each refusal of a state file or its journal is its [`StateFileError`] variant inside
    /// [`StateError::Corrupt`] naming the file; the messages are those of the `String` error (strings
    /// checked against it).
    #[test]
    fn state_file_refusals_are_typed() {
        let e = parse(b"{\"version\": 2}").unwrap_err();
        assert!(matches!(e, StateFileError::Version { got: 2 }), "{e:?}");
        assert_eq!(e.to_string(), "version 2 (this server reads version 1)");
        let e = parse(b"{\"version\": 1, \"tenants\": 3}").unwrap_err();
        assert!(matches!(e, StateFileError::Json(_)), "{e:?}");
        assert_eq!(e.to_string(), "invalid type: integer `3`, expected a map at line 1 column 27");
        let e = apply_journal(&mut None, b"{\"version\":1,\"tenants\":3}\n{\"version\":1}\n").unwrap_err();
        assert!(matches!(e, StateFileError::JournalLine { line: 1, .. }), "{e:?}");
        assert_eq!(e.to_string(), "line 1: invalid type: integer `3`, expected a map at line 1 column 24");
        let e = apply_journal(&mut None, b"{\"version\":1}\n{\"version\":2}\n").unwrap_err();
        assert!(matches!(e, StateFileError::JournalVersion { line: 2, got: 2 }), "{e:?}");
        assert_eq!(e.to_string(), "line 2: version 2 (this server reads version 1)");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        std::fs::write(&path, "{\"version\": 2}").unwrap();
        let e = load(dir.path()).unwrap_err();
        assert!(
            matches!(&e, StateError::Corrupt { path: p, error: StateFileError::Version { got: 2 } } if *p == path),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "state file {} is unusable: version 2 (this server reads version 1) (it holds the changes made \
                 through the admin API; fix it, or move it away to start from the configuration file alone)",
                path.display()
            )
        );
        std::fs::write(&path, vec![b' '; 11]).unwrap();
        let e = read_state_bytes(&path, 10).unwrap_err();
        assert!(matches!(&e, StateError::Corrupt { error: StateFileError::TooLarge { max: 10 }, .. }), "{e:?}");
        assert!(e.to_string().contains(" is unusable: larger than 10 bytes (it holds"), "{e}");
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

    /// Writes `state` whole, whatever the directory holds (the state file rewritten, any journal removed).
    fn save(dir: &Path, state: &StateFile) -> Result<(), StateError> {
        Store { kept: state.clone(), ..Store::at(dir) }.compact_kept()
    }

    fn tenant(r: f64) -> TenantEntry {
        TenantEntry { spec: Some(QosSpec::new(r, None, 1.0, 0).unwrap().into()), config: None }
    }

    /// Changes one at a time go to the journal (a line each, not the whole state), a restart reads the
    /// file and the journal back to the same state, the journal is folded into the file once longer than
    /// it, and a last line cut short by a crash is ignored while a bad line before others is an error
    /// naming the journal and the line. The size bound agrees with the file written.
    #[test]
    fn changes_are_journaled_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, none) = Store::open(dir.path()).unwrap();
        assert!(none.is_none());
        let mut st = StateFile::default();
        let mut rewrites = 0;
        for i in 0..2000 {
            st.tenants.insert(format!("t{i:05}"), tenant(i as f64));
            if i % 7 == 0 {
                st.tenants.remove(&format!("t{:05}", i / 2));
            }
            let had = store.journal_bytes;
            store.save(&st).unwrap();
            if store.journal_bytes < had {
                rewrites += 1;
                let file = std::fs::read(dir.path().join(STATE_FILE)).unwrap();
                assert!(state_bytes(&st) >= file.len() as u64 && state_bytes(&st) <= file.len() as u64 + 16);
            } else {
                assert!(store.journal_bytes - had < 200, "one line per change: {}", store.journal_bytes - had);
            }
            assert!(store.journal_bytes <= store.file_bytes.max(MIN_JOURNAL_BYTES));
            assert_eq!(store.bytes, state_bytes(&st), "the size bound kept change by change");
        }
        // The file is rewritten as it doubles or so: a few times, not per change.
        assert!((1..=10).contains(&rewrites), "{rewrites} rewrites");
        assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&st));
        // A crash while a line was appended: the part written is ignored.
        let jpath = dir.path().join(JOURNAL_FILE);
        let mut j = std::fs::read(&jpath).unwrap();
        j.extend_from_slice(b"{\"version\":1,\"tenants\":{\"zz");
        std::fs::write(&jpath, &j).unwrap();
        let (mut store, back) = Store::open(dir.path()).unwrap();
        assert_eq!(back.as_ref(), Some(&st));
        // The next change rewrites the file rather than append after the cut line.
        st.tenants.insert("after".into(), tenant(1.0));
        store.save(&st).unwrap();
        assert!(!jpath.exists());
        assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&st));
        // A bad line with another after it is corruption, named.
        std::fs::write(&jpath, "{\"version\":1,\"tenants\":3}\n{\"version\":1}\n").unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains(JOURNAL_FILE) && e.contains("line 1"), "{e}");
        std::fs::write(&jpath, "{\"version\":2}\n").unwrap();
        assert!(load(dir.path()).unwrap_err().to_string().contains("version 2"));
        // Records the file already holds (a crash between the rewrite and the journal's removal) change
        // nothing when read again.
        let mut old = st.clone();
        old.tenants.remove("after");
        std::fs::write(&jpath, format!("{}\n", serde_json::to_string(&Delta::between(&old, &st)).unwrap())).unwrap();
        assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&st));
        // Emptied: both files go.
        let (mut store, _) = Store::open(dir.path()).unwrap();
        store.save(&StateFile::default()).unwrap();
        assert!(crate::testkit::dir_names(dir.path()).is_empty());
    }

    /// One step of [`changes_kept_one_by_one_are_the_whole_diff`]: (kind, name, value) drawn small so
    /// that names recur, specs return to the file's, and exports come and go.
    fn change_step(
        base: &ServerConfig,
        eff: &mut ServerConfig,
        cap: &mut Option<CapacityEntry>,
        (kind, name, value): (u8, u8, u8),
    ) -> Option<Change> {
        let name = ["a", "b", "c", "d"][usize::from(name % 4)];
        let spec = QosSpec::new(10.0 * f64::from(value % 3), None, 1.0, 0).unwrap();
        let used = |eff: &ServerConfig, t: &str| eff.exports.iter().any(|e| eff.tenants[e.tenant].name == t);
        match kind % 5 {
            // Add a tenant or change its spec.
            0 | 1 => {
                match eff.tenant_index(name) {
                    Some(i) => eff.tenants[i].spec = spec,
                    None => eff.tenants.push(TenantConfig { name: name.into(), spec }),
                }
                Some(Change::new().tenant(base, name, Some(spec)))
            }
            2 => {
                let i = eff.tenant_index(name).filter(|_| !used(eff, name))?;
                eff.tenants.remove(i);
                eff.exports.iter_mut().filter(|e| e.tenant > i).for_each(|e| e.tenant -= 1);
                Some(Change::new().tenant(base, name, None))
            }
            // Add an export of the first tenant, or delete it.
            3 => match eff.exports.iter().position(|e| e.name == name) {
                Some(i) => {
                    eff.exports.remove(i);
                    Some(Change::new().export(base, name, None))
                }
                None => {
                    let tenant = eff.tenants.first()?.name.clone();
                    let j = ExportJson {
                        name: name.into(),
                        backend: "memory".into(),
                        path: None,
                        size_mb: Some(1 + u64::from(value % 2)),
                        tenant,
                        read_only: false,
                        direct: false,
                        readahead: true,
                        allow_networks: None,
                        allow_identities: None,
                    };
                    eff.exports.push(j.to_config(&eff.data_dir, &eff.tenants, ExportOrigin::Admin).unwrap());
                    Some(Change::new().export(base, name, Some(j)))
                }
            },
            _ => {
                *cap = (value % 3 > 0).then_some(CapacityEntry {
                    iops: f64::from(value),
                    source: CapacitySource::Admin,
                    config: CapacityBase::of(base),
                });
                Some(Change::new().capacity(*cap))
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Every admin change is kept by the entries it touches ([`Store::apply`]); the oracle is the
        /// whole difference between the file and what runs ([`diff`]), which the state kept, the size
        /// bound and the files read back must equal after every change.
        #[test]
        fn changes_kept_one_by_one_are_the_whole_diff(steps in proptest::collection::vec((0u8..5, 0u8..4, 0u8..6), 1..60)) {
            let dir = tempfile::tempdir().unwrap();
            let base = cfg(BASE);
            let (mut eff, mut cap) = (base.clone(), None);
            let (mut store, _) = Store::open(dir.path()).unwrap();
            for step in steps {
                let Some(change) = change_step(&base, &mut eff, &mut cap, step) else { continue };
                store.apply(change).unwrap();
                let whole = diff(&base, &eff, cap);
                proptest::prop_assert_eq!(&store.kept, &whole, "after {:?}", step);
                proptest::prop_assert_eq!(store.bytes, state_bytes(&whole));
            }
            let whole = diff(&base, &eff, cap);
            proptest::prop_assert_eq!(load(dir.path()).unwrap().unwrap_or_default(), whole);
        }
    }

    /// A change that cannot be written is not kept: the next one's files hold the state before it and
    /// the next change, not the one refused.
    #[test]
    fn a_change_not_written_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let base = cfg(BASE);
        let spec = QosSpec::new(5.0, None, 1.0, 0).unwrap();
        let (mut store, _) = Store::open(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join(STATE_FILE)).unwrap();
        store.apply(Change::new().tenant(&base, "c", Some(spec))).unwrap_err();
        std::fs::remove_dir(dir.path().join(STATE_FILE)).unwrap();
        store.apply(Change::new().tenant(&base, "d", Some(spec))).unwrap();
        let back = load(dir.path()).unwrap().unwrap();
        assert_eq!(back.tenants.keys().collect::<Vec<_>>(), ["d"]);
        assert_eq!(store.bytes, state_bytes(&back));
        // The same once the journal is in use.
        store.apply(Change::new().tenant(&base, "e", Some(spec))).unwrap();
        assert!(dir.path().join(JOURNAL_FILE).exists());
        let big = "x".repeat(MAX_STATE_BYTES as usize);
        let e = store.apply(Change::new().tenant(&base, &big, Some(spec))).unwrap_err();
        assert!(matches!(e, StateError::TooLarge { .. }), "{e}");
        store.apply(Change::new().tenant(&base, "f", Some(spec))).unwrap();
        let back = load(dir.path()).unwrap().unwrap();
        assert_eq!(back.tenants.keys().collect::<Vec<_>>(), ["d", "e", "f"]);
    }

    /// The capacity entry travels in the journal too, set and cleared.
    #[test]
    fn the_capacity_is_journaled() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path()).unwrap();
        let mut st = StateFile::default();
        st.tenants.insert("a".into(), tenant(1.0));
        store.save(&st).unwrap();
        st.capacity = Some(CapacityEntry {
            iops: 5.0,
            source: CapacitySource::Admin,
            config: CapacityBase { capacity_iops: None, probe_capacity_s: 0.0 },
        });
        store.save(&st).unwrap();
        assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&st));
        assert_eq!(store.bytes, state_bytes(&st));
        st.capacity = None;
        store.save(&st).unwrap();
        assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&st));
        assert_eq!(store.bytes, state_bytes(&st));
        assert!(dir.path().join(JOURNAL_FILE).exists());
    }

    /// A stop between a rewrite of the state file and the journal's removal leaves the journal's records
    /// beside a file that holds them and the change after them: replayed over it, they put an entry the
    /// last change set back to an older value (tenant a at 2 where the file says 3). Each record carries
    /// the generation of the file it follows, and records of another generation are skipped.
    #[test]
    fn a_journal_left_by_a_stop_in_a_rewrite_is_not_replayed_over_the_newer_file() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path()).unwrap();
        let mut st = StateFile::default();
        st.tenants.insert("a".into(), tenant(1.0));
        store.save(&st).unwrap();
        st.tenants.insert("a".into(), tenant(2.0));
        store.save(&st).unwrap();
        let jpath = dir.path().join(JOURNAL_FILE);
        let journal = std::fs::read(&jpath).unwrap();
        assert_eq!(journal.iter().filter(|&&b| b == b'\n').count(), 1, "a = 2 is journaled");
        st.tenants.insert("a".into(), tenant(3.0));
        store.save(&st).unwrap();
        store.compact_kept().unwrap();
        assert!(!jpath.exists());
        std::fs::write(&jpath, &journal).unwrap(); // as the stop left it
        assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&st), "a = 3, as the file says");
        let (mut store, _) = Store::open(dir.path()).unwrap();
        assert!(store.torn, "the next change rewrites the file and removes the stale journal");
        st.tenants.insert("b".into(), tenant(4.0));
        store.save(&st).unwrap();
        assert!(!jpath.exists());
        assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&st));
        // A file and journal without generations (written before them) are read as before.
        let old = serde_json::to_vec_pretty(&StateFile { generation: 0, ..st.clone() }).unwrap();
        std::fs::write(dir.path().join(STATE_FILE), old).unwrap();
        std::fs::write(&jpath, "{\"version\":1,\"capacity\":null,\"tenants\":{\"b\":null}}\n").unwrap();
        st.tenants.remove("b");
        assert_eq!(load(dir.path()).unwrap().as_ref(), Some(&st));
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
        let e = j("").to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin).unwrap_err().to_string();
        assert!(e.contains("path is empty"), "{e}");
        for p in ["/etc/passwd", "../x.img", "a/../../x.img"] {
            let e = j(p).to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin).unwrap_err().to_string();
            assert!(e.contains("must be relative"), "{e}");
        }
        let e =
            ExportJson { size_mb: None, ..j("nope.img") }.to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin);
        assert!(e.unwrap_err().to_string().contains("give size_mb to create it"));
        // A memory export without size_mb: the default of rein.toml (it needed size_mb).
        let mem = ExportJson { backend: "memory".into(), path: None, size_mb: None, ..j("x") };
        let e = mem.to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin).unwrap();
        assert_eq!(e.size, Some(crate::config::DEFAULT_MEMORY_MB << 20));
        let e = ExportJson { size_mb: Some(0), ..mem }.to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin);
        assert!(e.unwrap_err().to_string().contains("size_mb must be in 1..=2^30"));
        // A memory export larger than the machine: refused, not an abort (1 PiB is the largest size).
        let huge = ExportJson { backend: "memory".into(), path: None, size_mb: Some(1 << 30), ..j("x") };
        let e = huge.to_config(&base.data_dir, &base.tenants, ExportOrigin::Admin).unwrap_err().to_string();
        assert!(e.contains("larger than this machine's RAM"), "{e}");
    }

    /// Each refusal of an export is its [`ExportSpecError`] variant, carrying the export and the value;
    /// the messages are those of the `String` error (strings checked against it).
    #[test]
    fn export_refusals_are_typed() {
        let base = cfg(BASE);
        let (dir, tenants) = (&base.data_dir, &base.tenants);
        let admin = |j: ExportJson| j.to_config(dir, tenants, ExportOrigin::Admin).unwrap_err();
        let j = |p: &str| file_export(Some(p));
        let e = admin(j("../x.img"));
        assert!(matches!(&e, ExportSpecError::PathNotRelative { path, .. } if path == Path::new("../x.img")), "{e:?}");
        let name = j("x").name;
        assert_eq!(
            e.to_string(),
            format!("export {name}: path ../x.img must be relative to the data directory, without ..")
        );
        let e = admin(ExportJson { name: String::new(), ..j("x.img") });
        assert!(matches!(&e, ExportSpecError::NameLength { name } if name.is_empty()), "{e:?}");
        assert_eq!(e.to_string(), "export name \"\" is empty or longer than 4096 bytes");
        let e = admin(ExportJson { name: "a\nb".into(), ..j("x.img") });
        assert!(matches!(&e, ExportSpecError::NameControl { .. }), "{e:?}");
        assert_eq!(e.to_string(), "export name \"a\\nb\" has a control character");
        let e = admin(ExportJson { backend: "tape".into(), ..j("x.img") });
        assert!(matches!(&e, ExportSpecError::Backend { got, .. } if got == "tape"), "{e:?}");
        assert_eq!(e.to_string(), format!("export {name}: backend \"tape\": expected file or memory"));
        let e = admin(ExportJson { tenant: "nobody".into(), ..j("x.img") });
        assert!(matches!(&e, ExportSpecError::UnknownTenant { tenant, .. } if tenant == "nobody"), "{e:?}");
        assert_eq!(e.to_string(), format!("export {name}: unknown tenant \"nobody\""));
        let e = admin(ExportJson { size_mb: Some(0), ..j("x.img") });
        assert!(matches!(&e, ExportSpecError::SizeMb { .. }), "{e:?}");
        let e = admin(ExportJson { size_mb: None, ..j("nope.img") });
        assert!(matches!(&e, ExportSpecError::MissingWithoutSize { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("export {name}: {} does not exist (give size_mb to create it)", dir.join("nope.img").display())
        );
        let e = admin(ExportJson { backend: "memory".into(), path: None, direct: true, ..j("x") });
        assert!(matches!(&e, ExportSpecError::Setting(_)), "{e:?}");
        assert_eq!(e.to_string(), "export x: direct = true needs backend = \"file\"");
    }
}
