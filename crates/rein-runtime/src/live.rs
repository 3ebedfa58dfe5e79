//! The server's live, changeable state: tenants, exports and the admission capacity, and every change to
//! them (the admin API's PUT/POST/DELETE, a reload of the configuration file).
//!
//! # Changes
//! Every change takes [`Registry`]'s change lock (`changes`) from its read of the current state to its
//! apply, so that validation, admission, persistence and apply are one step (issue 12, point 4): two
//! changes that fit the capacity alone but not together are never both accepted, and no change overwrites
//! another's fields. A change is validated, admitted against the capacity, written to the state file
//! ([`crate::state`]; not applied if that fails), then applied to the dispatcher and the tables. The IO
//! path never takes the change lock: connections read the [`ExportTable`] (one snapshot per handshake)
//! and the admin's reads take short `std` read locks.
//!
//! Changes are cancel-safe: a caller's future may be dropped at any await (hyper drops a handler whose
//! client closed the connection; a storage node's handshake timeout drops an `adopt`) and the registry
//! still agrees with the dispatcher. Each change's apply steps (the dispatcher's, the state file's and
//! the tables', and any undo) run in a task of their own ([`tokio::spawn`], which holds the change lock)
//! that the caller only awaits: dropping the caller drops the wait, never a change half-applied (the
//! dispatcher at the new spec, admission and the state file at the old). A caller dropped before that
//! task starts has changed nothing. `remove_export` changes nothing before its last await, so needs no
//! task.
//!
//! Opening an export's file can block for long (a hung network mount, a file under another process's
//! lease), so no change holds the change lock across an open: `add_export` checks the export, opens its
//! file, then takes the lock, checks it again (a change may have taken its name meanwhile) and applies;
//! `reload` opens the storage of new exports first, in its caller's future (the server's loop drops a
//! reload that a newer one replaces, or at shutdown), then checks and applies in a task of its own as the
//! others do. A file has at most one open under way, whichever changes wait for it (`Opens`). At the
//! server's stop the changes' tasks still running are abandoned ([`Registry::abandon_changes`]): one
//! stuck in the open of an added export's file would otherwise keep the dispatcher, and the server, alive.
//!
//! # Admission
//! The reservations' sum is checked against the capacity in use: the admin's (`PUT /api/capacity`), else
//! the probe's, else `capacity_iops`, else the device model's. A change that raises the sum above it, or a
//! capacity below the sum, is refused (409) under `admission = "refuse"` and applied with a warning under
//! `"warn"`. With no capacity known, `refuse` refuses any change that raises a positive sum (fails closed)
//! and says how to set one. A change that does not raise the sum is never refused.
//!
//! # Deleting
//! A deleted export is removed from the table at once: new connections cannot list or open it. Open
//! connections to it keep working until their clients disconnect (as an unlinked file stays open); its
//! storage is released with the last one. A tenant cannot be deleted (409) while an export uses it, nor
//! while connections to a deleted export of it are still open.

use crate::config::{Admission, ExportConfig, ServerConfig, TenantConfig, MAX_EXPORTS};
use crate::dispatch::{CapacityError, Dispatcher};
use crate::nbd::{Export, ExportTable};
use crate::state::{self, CapacityBase, CapacityEntry, CapacitySource, ExportJson, ExportOrigin, SpecJson};
use crate::tls::{AdminTls, LiveTls};
use rein_core::{QosSpec, SchedConfig, TenantId};
use rein_proto::nbd::ExportInfo;
use std::path::PathBuf;
use std::sync::{Arc, RwLock, Weak};

/// Longest tenant name accepted by `POST /api/tenants`, in bytes (defined with the state file, which
/// keeps such tenants).
pub use crate::state::MAX_TENANT_NAME;

/// The running export for configured export `e` of tenant `tenant` (named `tenant_name`) over `storage`.
pub fn make_export(
    e: &ExportConfig,
    tenant_name: &str,
    tenant: TenantId,
    storage: Arc<dyn crate::storage::Storage>,
) -> Export {
    Export {
        info: ExportInfo {
            name: e.name.clone(),
            description: format!("tenant {tenant_name}"),
            size: storage.size(),
            read_only: e.read_only,
            volatile: e.backend == crate::config::BackendKind::Memory,
            min_block: 1,
        },
        backend: crate::nbd::Backend::Local(storage),
        tenant,
        tenant_name: tenant_name.to_string(),
        access: e.access.clone(),
    }
}

/// Why a change was not applied; the admin API maps each to a status code.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// No such tenant or export (404).
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed or a value out of range (400).
    #[error("{0}")]
    Invalid(String),
    /// The change conflicts with the state: admission refused, a name taken, a tenant in use (409).
    #[error("{0}")]
    Conflict(String),
    /// The server is shutting down (503).
    #[error("{0}")]
    Unavailable(String),
    /// The state file could not be written, or the storage not opened (500); nothing was applied.
    #[error("{0}")]
    Failed(String),
}

/// The capacity in use, as `GET /api/capacity` reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CapacityInfo {
    /// Capacity for admission control, IOPS; `null`: none known.
    pub iops: Option<f64>,
    /// Where it came from: config, device_model, probe, admin or none.
    pub source: &'static str,
    /// The sum of the tenants' reservations.
    pub reserved_iops: f64,
    /// refuse or warn.
    pub admission: &'static str,
    /// The device model's capacity now, if there is a model.
    pub device_model_iops: Option<f64>,
}

/// The result of a reload: what changed and what needs a restart (every daemon's).
#[derive(Debug, Clone, Default)]
pub struct ReloadReport {
    /// One line per change applied.
    pub applied: Vec<String>,
    /// Settings that changed in the file but only take effect at the next start.
    pub needs_restart: Vec<String>,
}

impl ReloadReport {
    /// Logs the reload (each line applied, each needing a restart, then `configuration reloaded`), records
    /// it in `reloads` (applied, with the settings left for a restart) and returns its line for the
    /// service manager's `STATUS=` ([`crate::notify::ready`]).
    pub(crate) fn log(&self, reloads: &crate::reloads::Reloads) -> String {
        reloads.record_applied(self.needs_restart.len());
        for line in &self.applied {
            if line.starts_with("warning: ") {
                tracing::warn!("reload: {line}");
            } else {
                tracing::info!("reload: {line}");
            }
        }
        for line in &self.needs_restart {
            tracing::warn!("reload: {line}");
        }
        let (applied, needs_restart) = (self.applied.len(), self.needs_restart.len());
        tracing::info!(applied, needs_restart, "configuration reloaded");
        crate::reloads::reloaded_status(applied, needs_restart)
    }
}

struct Inner {
    /// The configuration file as last loaded (the state file's base).
    base: ServerConfig,
    /// What runs: `base` with the run-time changes.
    effective: ServerConfig,
    /// A capacity set at run time or measured, if any.
    capacity: Option<CapacityEntry>,
    /// Exports deleted while connections still held them (each knows its name and its tenant's).
    retired: Vec<Weak<Export>>,
}

/// How an error names a deleted export that connections still hold ([`Inner::still_open`]).
fn still_open_name(e: &Export) -> String {
    format!("{} (deleted, still open by its connections)", e.info.name)
}

/// What export `e`'s storage has open, as [`crate::preflight::check_added`] compares it, under `name`.
fn running_file<'a>(name: &'a str, e: &Export) -> crate::preflight::RunningFile<'a> {
    let (file, device) = match &e.backend {
        crate::nbd::Backend::Local(s) => (s.file_id(), s.device_number()),
        _ => (None, None),
    };
    crate::preflight::RunningFile { name, read_only: e.info.read_only, file, device }
}

impl Inner {
    /// The deleted exports that connections still hold (the others are dropped from `retired` here).
    fn still_open(&mut self) -> Vec<Arc<Export>> {
        self.retired.retain(|w| w.strong_count() > 0);
        self.retired.iter().filter_map(Weak::upgrade).collect()
    }
}

/// The tenants' names and ids, in the order added, with an index by name: every change, a node's hello and
/// a reload look tenants up by name (a scan per name made N of them cost N^2 comparisons). Reads as the
/// list ([`std::ops::Deref`]).
#[derive(Debug, Clone, Default)]
pub struct TenantNames {
    list: Vec<(String, TenantId)>,
    index: std::collections::HashMap<String, TenantId>,
}

impl TenantNames {
    /// The list `list` (names distinct), indexed.
    pub fn new(list: Vec<(String, TenantId)>) -> TenantNames {
        let index = list.iter().map(|(n, id)| (n.clone(), *id)).collect();
        TenantNames { list, index }
    }

    /// Tenant `name`'s id, if there is one.
    pub fn id(&self, name: &str) -> Option<TenantId> {
        self.index.get(name).copied()
    }

    fn push(&mut self, name: &str, id: TenantId) {
        self.list.push((name.to_string(), id));
        self.index.insert(name.to_string(), id);
    }

    fn remove(&mut self, name: &str) {
        self.list.retain(|(n, _)| n != name);
        self.index.remove(name);
    }
}

impl std::ops::Deref for TenantNames {
    type Target = [(String, TenantId)];
    fn deref(&self) -> &Self::Target {
        &self.list
    }
}

/// Tenants, exports and capacity, and the one lock that serialises changes to them (module comment).
pub struct Registry {
    dispatcher: Dispatcher,
    tenants: RwLock<Arc<TenantNames>>,
    exports: Arc<ExportTable>,
    capacity: RwLock<(Option<f64>, CapacitySource)>,
    admission: RwLock<Admission>,
    /// The data directory's state file and journal ([`state::Store`]); `None`: changes are not persisted.
    store: Option<std::sync::Mutex<state::Store>>,
    /// The change lock; an `Arc` so that a change's task can own its guard (module comment).
    changes: Arc<tokio::sync::Mutex<Inner>>,
    /// The export the empty name opens, by name: the NBD policy's, fixed at start (a reload names a change
    /// of it as needing a restart).
    default_export: Option<String>,
    /// The tasks of the changes under way ([`detached`]), to abandon at shutdown.
    pending: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
    /// The opens of exports' files under way, at most one per file ([`Opens`]).
    opens: Opens,
    /// Whether NBD and the admin endpoint listen on sockets a service manager passed
    /// ([`crate::activation`]): then `listen`/`listen_unix` and `admin` are not used, and a reload that
    /// changes them says so instead of naming them as needing a restart (a restart keeps the passed
    /// sockets too).
    passed: std::sync::atomic::AtomicU8,
    /// The NBD listener's TLS context (`[tls]`), which a reload replaces ([`crate::tls`], "Reload").
    tls: LiveTls,
    /// The admin endpoint's (`admin_tls`: the `[tls]` table's certificate), replaced by a reload that
    /// keeps `admin_tls` on; `None`: plain HTTP (turning it on or off needs a restart, and the running
    /// context stays: [`AdminTls`] never holds none).
    admin_tls: Option<AdminTls>,
    /// The pShift link's client context (`[pshift.tls]`), the running one a reload updates.
    pshift_tls: Option<crate::tls::LiveTlsClient>,
}

/// [`Registry::passed`]'s bits.
const PASSED_NBD: u8 = 1;
const PASSED_ADMIN: u8 = 2;

/// A tenant name's bounds (1..=[`MAX_TENANT_NAME`] bytes), for every change that adds one.
fn check_name(name: &str) -> Result<(), ChangeError> {
    if name.is_empty() || name.len() > MAX_TENANT_NAME {
        return Err(ChangeError::Invalid(format!("tenant name must be 1..={MAX_TENANT_NAME} bytes")));
    }
    // A newline or an escape in a name wrote lines of its own into the text log.
    if name.chars().any(char::is_control) {
        return Err(ChangeError::Invalid(format!("tenant name {name:?} has a control character")));
    }
    Ok(())
}

/// Tenant `id`'s (`name`'s) spec in the dispatcher's `snap`.
pub(crate) fn spec_in(snap: &crate::dispatch::Snapshot, id: TenantId, name: &str) -> Result<QosSpec, ChangeError> {
    snap.tenants
        .iter()
        .find(|t| t.id == id)
        .map(|t| t.spec)
        .ok_or_else(|| ChangeError::NotFound(format!("tenant {name:?} is gone")))
}

/// Runs change `what`'s `commit` to its end in a task of its own, whether or not the returned future is
/// awaited to its end or dropped (module comment). The task is spawned at once, before the first poll, and
/// listed in `pending` until the server stops ([`Registry::abandon_changes`]).
fn detached<T: Send + 'static>(
    pending: &std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
    what: &'static str,
    commit: impl std::future::Future<Output = Result<T, ChangeError>> + Send + 'static,
) -> impl std::future::Future<Output = Result<T, ChangeError>> {
    let task = tokio::spawn(commit);
    {
        let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.retain(|t| !t.is_finished());
        pending.push(task.abort_handle());
    }
    async move {
        task.await.map_err(|e| {
            if e.is_cancelled() {
                ChangeError::Unavailable(format!("{what}: the server is shutting down; the change may not be applied"))
            } else {
                tracing::error!("{what}: the change's task failed: {e}");
                ChangeError::Failed(format!("{what}: the change failed unexpectedly ({e}); it may be applied in part"))
            }
        })?
    }
}

/// The reservations' sum, in IOPS, `cfg` would have with `specs` for its tenants: as
/// [`ServerConfig::reserved`] sums them (the same order, so the same float), without a copy of `cfg`.
fn reserved_with(cfg: &ServerConfig, specs: impl Iterator<Item = QosSpec>) -> f64 {
    specs.map(|s| cfg.reservation_iops(&s)).sum()
}

fn read<T: Clone>(l: &RwLock<T>) -> T {
    l.read().unwrap_or_else(|e| e.into_inner()).clone()
}
fn write<T>(l: &RwLock<T>, v: T) {
    *l.write().unwrap_or_else(|e| e.into_inner()) = v;
}

/// The capacity `cfg` states and its source (`capacity_iops` equal to the device model's: the model).
pub fn config_capacity(cfg: &ServerConfig) -> (Option<f64>, CapacitySource) {
    let model = cfg.device.as_ref().map(|d| d.spec.capacity_at(rein_core::Nanos::ZERO));
    match cfg.capacity_iops {
        None => (None, CapacitySource::None),
        Some(c) if model == Some(c) => (Some(c), CapacitySource::DeviceModel),
        Some(c) => (Some(c), CapacitySource::Config),
    }
}

impl Registry {
    /// A registry over a running dispatcher. `base` is the configuration file, `effective` what runs
    /// (`base` with the state file applied), `tenants` the dispatcher's ids of `effective.tenants` (same
    /// order), `exports` the table of `effective.exports`; `capacity` a run-time capacity entry. With a
    /// `store` (of `effective.data_dir`), every change is kept in it.
    pub fn new(
        dispatcher: Dispatcher,
        base: ServerConfig,
        effective: ServerConfig,
        tenants: Vec<TenantId>,
        exports: Arc<ExportTable>,
        capacity: Option<CapacityEntry>,
        store: Option<state::Store>,
    ) -> Registry {
        assert_eq!(tenants.len(), effective.tenants.len(), "one id per tenant");
        let names = effective.tenants.iter().map(|t| t.name.clone()).zip(tenants).collect();
        let cap = match capacity {
            Some(c) => (Some(c.iops), c.source),
            None => config_capacity(&effective),
        };
        let (tls, admin_tls) = (LiveTls::new(effective.tls.clone()), effective.admin_tls.clone().map(AdminTls::new));
        let pshift_tls = effective.pshift.as_ref().and_then(|p| p.tls.as_ref()).map(|(c, _)| c.clone());
        Registry {
            default_export: effective.default_export.map(|i| effective.exports[i].name.clone()),
            dispatcher,
            tenants: RwLock::new(Arc::new(TenantNames::new(names))),
            exports,
            capacity: RwLock::new(cap),
            admission: RwLock::new(effective.admission),
            store: store.map(std::sync::Mutex::new),
            changes: Arc::new(tokio::sync::Mutex::new(Inner { base, effective, capacity, retired: Vec::new() })),
            pending: std::sync::Mutex::default(),
            opens: Opens::default(),
            passed: std::sync::atomic::AtomicU8::new(0),
            tls,
            admin_tls,
            pshift_tls,
        }
    }

    /// The certificates the server presents, for `/metrics` (their expiry).
    pub fn presented(&self) -> crate::tls::Presented {
        crate::tls::Presented::default()
            .server("nbd", Some(self.tls.clone()))
            .server("admin", self.admin_tls.clone())
            .client("pshift_tls", self.pshift_tls.clone())
    }

    /// The NBD listener's TLS context, as reloads replace it.
    pub fn tls(&self) -> LiveTls {
        self.tls.clone()
    }

    /// The admin endpoint's TLS context (`admin_tls`), as reloads replace it; `None`: plain HTTP.
    pub fn admin_tls(&self) -> Option<AdminTls> {
        self.admin_tls.clone()
    }

    /// Says that NBD (`nbd`) and the admin endpoint (`admin`) listen on sockets a service manager passed
    /// (the field's doc).
    pub fn set_passed(&self, nbd: bool, admin: bool) {
        let bits = if nbd { PASSED_NBD } else { 0 } | if admin { PASSED_ADMIN } else { 0 };
        self.passed.store(bits, std::sync::atomic::Ordering::Relaxed);
    }

    /// A registry for tenants already added to `dispatcher` and no exports, that persists nothing (tests
    /// of the admin endpoint).
    pub fn for_tenants(
        dispatcher: Dispatcher,
        tenants: Vec<(String, QosSpec, TenantId)>,
        admission: Admission,
        capacity_iops: Option<f64>,
    ) -> Registry {
        let mut cfg = ServerConfig::builtin();
        cfg.exports.clear();
        cfg.tenants = tenants.iter().map(|(n, s, _)| TenantConfig { name: n.clone(), spec: *s }).collect();
        cfg.admission = admission;
        cfg.capacity_iops = capacity_iops;
        cfg.device = None;
        let ids = tenants.iter().map(|t| t.2).collect();
        Registry::new(dispatcher, cfg.clone(), cfg, ids, Arc::default(), None, None)
    }

    /// Edits the tenants' names and ids in place (readers hold the list they took: it is copied only
    /// while one does).
    fn edit_tenants(&self, f: impl FnOnce(&mut TenantNames)) {
        f(Arc::make_mut(&mut self.tenants.write().unwrap_or_else(|e| e.into_inner())));
    }

    /// The dispatcher.
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// Tenant names and ids, in order, indexed by name.
    pub fn tenants(&self) -> Arc<TenantNames> {
        read(&self.tenants)
    }

    /// The export table.
    pub fn exports(&self) -> &Arc<ExportTable> {
        &self.exports
    }

    /// The admission policy in force.
    pub fn admission(&self) -> Admission {
        read(&self.admission)
    }

    /// The capacity in use for admission: the registry's, else the device model's now.
    fn capacity_now(&self, model: Option<f64>) -> (Option<f64>, CapacitySource) {
        match read(&self.capacity) {
            (Some(c), s) => (Some(c), s),
            (None, _) => (model, if model.is_some() { CapacitySource::DeviceModel } else { CapacitySource::None }),
        }
    }

    /// Checks a change that takes the reservations from `before` to `after` against `capacity`; `Ok(Some)`
    /// is a warning (admission = warn).
    fn admit(&self, before: f64, after: f64, capacity: Option<f64>) -> Result<Option<String>, ChangeError> {
        if after <= before || after <= 0.0 {
            return Ok(None);
        }
        let msg = match capacity {
            Some(cap) if after > cap => {
                format!("reservations would total {after} IOPS, above the reservable capacity of {cap} IOPS")
            }
            Some(_) => return Ok(None),
            None => format!(
                "reservations would total {after} IOPS but no capacity is known: PUT /api/capacity, or set \
                 capacity_iops or probe_capacity_s in the configuration"
            ),
        };
        match self.admission() {
            Admission::Refuse => Err(ChangeError::Conflict(msg)),
            Admission::Warn => {
                tracing::warn!("admission control: {msg}");
                Ok(Some(msg))
            }
        }
    }

    /// Keeps a change through the admin API (or a storage node's hello) by the entries it touches
    /// ([`state::Store::apply`]; nothing is written without a data directory): a file that cannot be
    /// written is logged here, once, at ERROR (the 500 alone left the operator nothing to see).
    fn persist(&self, change: state::Change) -> Result<(), ChangeError> {
        self.with_store(|s| s.apply(change)).inspect_err(|e| {
            if let ChangeError::Failed(e) = e {
                tracing::error!("{e}; the change is not applied");
            }
        })
    }

    /// Writes the state that turns `base` into `effective` with `capacity` (the whole difference: a
    /// reload's); a reload logs its own error ([`crate::server`]).
    fn write_state(
        &self,
        base: &ServerConfig,
        effective: &ServerConfig,
        capacity: Option<CapacityEntry>,
    ) -> Result<(), ChangeError> {
        self.with_store(|s| s.save(&state::diff(base, effective, capacity)))
    }

    fn with_store(
        &self,
        f: impl FnOnce(&mut state::Store) -> Result<(), state::StateError>,
    ) -> Result<(), ChangeError> {
        let Some(store) = &self.store else { return Ok(()) };
        let mut store = store.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut store).map_err(|e| match e {
            // The change itself is what would not fit: refused as a conflict with the state (409).
            state::StateError::TooLarge { .. } => ChangeError::Conflict(e.to_string()),
            e => ChangeError::Failed(e.to_string()),
        })
    }

    /// The dispatcher's snapshot of tenants `ids` alone ([`Dispatcher::snapshot_of`]): a change's cost in
    /// the dispatcher's loop does not grow with the tenants.
    async fn snapshot_of(&self, ids: Vec<TenantId>) -> Result<crate::dispatch::Snapshot, ChangeError> {
        self.dispatcher.snapshot_of(ids).await.map_err(|e| ChangeError::Unavailable(e.to_string()))
    }

    /// Changes tenant `name`'s spec to `f(current)` (an `Err` from `f` is a 400). Returns the new spec and
    /// any admission warning. Reading, `f` and admission run in the caller (they change nothing), the rest
    /// in a task that owns the change lock's guard (module comment).
    pub async fn update_spec(
        self: &Arc<Self>,
        name: &str,
        f: impl FnOnce(QosSpec) -> Result<QosSpec, String>,
    ) -> Result<(QosSpec, Option<String>), ChangeError> {
        let mut inner = Arc::clone(&self.changes).lock_owned().await;
        let id = self.id(name)?;
        let snap = self.snapshot_of(vec![id]).await?;
        let cur = spec_in(&snap, id, name)?;
        let spec = f(cur).map_err(|e| ChangeError::Invalid(format!("invalid spec for {name}: {e}")))?;
        let eff = &inner.effective;
        let after = reserved_with(eff, eff.tenants.iter().map(|t| if t.name == name { spec } else { t.spec }));
        let warning = self.admit(eff.reserved(), after, self.capacity_now(snap.capacity_iops).0)?;
        let (this, name) = (Arc::clone(self), name.to_string());
        detached(&self.pending, "update_spec", async move {
            this.persist(state::Change::new().tenant(&inner.base, &name, Some(spec)))?;
            this.dispatcher.set_spec(id, spec).await.map_err(|e| ChangeError::Unavailable(e.to_string()))?;
            inner.effective.tenants.iter_mut().filter(|t| t.name == name).for_each(|t| t.spec = spec);
            tracing::info!(tenant = %name, %spec, "spec changed");
            Ok((spec, warning))
        })
        .await
    }

    fn id(&self, name: &str) -> Result<TenantId, ChangeError> {
        self.tenants().id(name).ok_or_else(|| ChangeError::NotFound(format!("no tenant named {name:?}")))
    }

    /// Adds tenant `name` with `spec` (in a task of its own: module comment).
    pub async fn add_tenant(self: &Arc<Self>, name: &str, spec: QosSpec) -> Result<Option<String>, ChangeError> {
        let (this, name) = (Arc::clone(self), name.to_string());
        detached(&self.pending, "add_tenant", async move { this.add_tenant_now(&name, spec).await }).await
    }

    async fn add_tenant_now(&self, name: &str, spec: QosSpec) -> Result<Option<String>, ChangeError> {
        let mut inner = self.changes.lock().await;
        check_name(name)?;
        if self.id(name).is_ok() {
            return Err(ChangeError::Conflict(format!("tenant {name:?} exists (PUT /api/tenants/{name} changes it)")));
        }
        let snap = self.snapshot_of(Vec::new()).await?;
        let eff = &inner.effective;
        let after = reserved_with(eff, eff.tenants.iter().map(|t| t.spec).chain([spec]));
        let warning = self.admit(eff.reserved(), after, self.capacity_now(snap.capacity_iops).0)?;
        let id = self.dispatcher.add_tenant(spec).await.map_err(|e| match e {
            crate::dispatch::IoError::Shutdown => ChangeError::Unavailable(e.to_string()),
            e => ChangeError::Conflict(e.to_string()),
        })?;
        if let Err(e) = self.persist(state::Change::new().tenant(&inner.base, name, Some(spec))) {
            let _ = self.dispatcher.remove_tenant(id).await;
            return Err(e);
        }
        inner.effective.tenants.push(TenantConfig { name: name.into(), spec });
        self.edit_tenants(|names| names.push(name, id));
        tracing::info!(tenant = %name, %spec, "tenant added");
        Ok(warning)
    }

    /// Gives every tenant of `wanted` its spec as **one** change (a storage node adopting a gateway's
    /// hello, `[node] specs = "gateway"`): names not known are added, known tenants whose spec differs are
    /// changed, and the whole is admitted once (the reservations before against after, so the order of
    /// `wanted` does not matter), persisted once and applied; if any step fails nothing has changed.
    /// Returns the tenants' ids in `wanted`'s order, and any admission warning. Names must be distinct.
    /// A change that adds tenants is refused if the server would then hold more than `max_tenants`
    /// (`[node] max_tenants`; one that adds none is not, whatever the count).
    /// Runs in a task of its own (module comment): a handshake that times out cannot stop it half-way.
    pub async fn adopt(
        self: &Arc<Self>,
        wanted: &[(String, QosSpec)],
        max_tenants: usize,
    ) -> Result<(Vec<TenantId>, Option<String>), ChangeError> {
        let (this, wanted) = (Arc::clone(self), wanted.to_vec());
        detached(&self.pending, "adopt", async move { this.adopt_now(&wanted, max_tenants).await }).await
    }

    async fn adopt_now(
        &self,
        wanted: &[(String, QosSpec)],
        max_tenants: usize,
    ) -> Result<(Vec<TenantId>, Option<String>), ChangeError> {
        let mut inner = self.changes.lock().await;
        // By id throughout, not by a scan per tenant of the hello (the protocol allows many per hello; rein
        // gateway sends one per session, on a node that may hold thousands).
        let mut seen = std::collections::HashSet::with_capacity(wanted.len());
        for (name, _) in wanted {
            check_name(name)?;
            if !seen.insert(name.as_str()) {
                return Err(ChangeError::Invalid(format!("tenant {name:?} given twice")));
            }
        }
        let names = self.tenants();
        let snap = self.snapshot_of(wanted.iter().filter_map(|(n, _)| names.id(n)).collect()).await?;
        let by_id = snap.by_id();
        let before = inner.effective.reserved();
        let mut eff = inner.effective.clone();
        // What changes: (slot in `wanted`, the id if known, the spec it has now if known).
        let mut changes: Vec<(usize, Option<(TenantId, QosSpec)>)> = Vec::new();
        let mut ids: Vec<Option<TenantId>> = Vec::with_capacity(wanted.len());
        let mut respec = std::collections::HashMap::new();
        for (i, (name, spec)) in wanted.iter().enumerate() {
            match names.id(name) {
                Some(id) => {
                    let cur = by_id
                        .get(&id)
                        .map(|t| t.spec)
                        .ok_or_else(|| ChangeError::NotFound(format!("tenant {name:?} is gone")))?;
                    if cur != *spec {
                        respec.insert(name.as_str(), *spec);
                        changes.push((i, Some((id, cur))));
                    }
                    ids.push(Some(id));
                }
                None => {
                    eff.tenants.push(TenantConfig { name: name.clone(), spec: *spec });
                    changes.push((i, None));
                    ids.push(None);
                }
            }
        }
        eff.tenants.iter_mut().for_each(|t| t.spec = respec.get(t.name.as_str()).copied().unwrap_or(t.spec));
        // The list is edited in place below, not copied, once no one else holds it.
        drop(names);
        if changes.is_empty() {
            return Ok((ids.into_iter().map(|id| id.expect("all known")).collect(), None));
        }
        let added = changes.iter().filter(|c| c.1.is_none()).count();
        let held = self.tenants().len();
        if added > 0 && held + added > max_tenants {
            return Err(ChangeError::Conflict(format!(
                "adding {added} would make {} tenants on this node, above its [node] max_tenants of {max_tenants}",
                held + added
            )));
        }
        let warning = self.admit(before, eff.reserved(), self.capacity_now(snap.capacity_iops).0)?;
        // Apply in order; on a failure undo what was applied (a removal, or the spec it had).
        let mut applied: Vec<(TenantId, Option<QosSpec>)> = Vec::new();
        let mut failure = None;
        for &(i, known) in &changes {
            let spec = wanted[i].1;
            let step = match known {
                Some((id, cur)) => self.dispatcher.set_spec(id, spec).await.map(|_| (id, Some(cur))),
                None => self.dispatcher.add_tenant(spec).await.map(|id| (id, None)),
            };
            match step {
                Ok((id, undo)) => {
                    ids[i] = Some(id);
                    applied.push((id, undo));
                }
                Err(e) => {
                    failure = Some(match e {
                        crate::dispatch::IoError::Shutdown => ChangeError::Unavailable(e.to_string()),
                        e => ChangeError::Conflict(format!("tenant {:?}: {e}", wanted[i].0)),
                    });
                    break;
                }
            }
        }
        if failure.is_none() {
            let change = changes
                .iter()
                .fold(state::Change::new(), |c, &(i, _)| c.tenant(&inner.base, &wanted[i].0, Some(wanted[i].1)));
            if let Err(e) = self.persist(change) {
                failure = Some(e);
            }
        }
        if let Some(e) = failure {
            for (id, undo) in applied.into_iter().rev() {
                let _ = match undo {
                    Some(spec) => self.dispatcher.set_spec(id, spec).await,
                    None => self.dispatcher.remove_tenant(id).await,
                };
            }
            return Err(e);
        }
        inner.effective = eff;
        self.edit_tenants(|names| {
            for &(i, known) in &changes {
                let (name, spec) = (&wanted[i].0, wanted[i].1);
                match known {
                    Some(_) => tracing::info!(tenant = %name, %spec, "spec changed"),
                    None => {
                        names.push(name, ids[i].expect("applied"));
                        tracing::info!(tenant = %name, %spec, "tenant added");
                    }
                }
            }
        });
        Ok((ids.into_iter().map(|id| id.expect("known or applied")).collect(), warning))
    }

    /// Deletes tenant `name` (409 while an export, or an open connection to a deleted export, uses it).
    /// Runs in a task of its own (module comment).
    pub async fn remove_tenant(self: &Arc<Self>, name: &str) -> Result<(), ChangeError> {
        let (this, name) = (Arc::clone(self), name.to_string());
        detached(&self.pending, "remove_tenant", async move { this.remove_tenant_now(&name).await }).await
    }

    async fn remove_tenant_now(&self, name: &str) -> Result<(), ChangeError> {
        let mut inner = self.changes.lock().await;
        let id = self.id(name)?;
        let eff = &inner.effective;
        if let Some(e) = eff.exports.iter().find(|e| eff.tenants[e.tenant].name == name) {
            return Err(ChangeError::Conflict(format!(
                "tenant {name:?} is used by export {:?}; delete the export first",
                e.name
            )));
        }
        // Not counted: a connection's requests in flight hold the export too (one connection at depth 32
        // read as 34).
        let held = inner.still_open().into_iter().find(|e| e.tenant_name == name).map(|e| e.info.name.clone());
        if let Some(export) = held {
            return Err(ChangeError::Conflict(format!(
                "tenant {name:?} is used by the open connections to the deleted export {export:?}"
            )));
        }
        self.persist(state::Change::new().tenant(&inner.base, name, None))?;
        self.dispatcher.remove_tenant(id).await.map_err(|e| ChangeError::Unavailable(e.to_string()))?;
        let eff = &mut inner.effective;
        let pos = eff.tenants.iter().position(|t| t.name == name).expect("listed");
        eff.tenants.remove(pos);
        for e in &mut eff.exports {
            if e.tenant > pos {
                e.tenant -= 1;
            }
        }
        self.edit_tenants(|names| names.remove(name));
        tracing::info!(tenant = %name, "tenant deleted");
        Ok(())
    }

    /// Adds export `j` (its file, if any, inside the data directory; created only with `size_mb`). Runs
    /// in a task of its own (module comment): a request dropped while the file was being created once left
    /// the file without the export.
    pub async fn add_export(self: &Arc<Self>, j: ExportJson) -> Result<(), ChangeError> {
        let this = Arc::clone(self);
        detached(&self.pending, "add_export", async move { this.add_export_now(j).await }).await
    }

    /// The export is checked, its storage opened without the change lock (an open can block for long: a
    /// hung mount, a file under another process's lease; other changes go on meanwhile), then checked
    /// again under the lock, since a change may have come in between (the name taken, the tenant deleted),
    /// and applied. A file created by the open (`size_mb`) stays if that second check refuses the export.
    async fn add_export_now(&self, j: ExportJson) -> Result<(), ChangeError> {
        let (cfg, _) = self.check_new_export(&mut *self.changes.lock().await, &j)?;
        let mut opened = self.open(vec![(cfg, j.clone())]).await?;
        let storage = opened.pop().expect("one export opened").1;
        let mut inner = self.changes.lock().await;
        // The same file, size and mode as opened: the data directory does not change while the server
        // runs; only the tenant's index may have.
        let (cfg, id) = self.check_new_export(&mut inner, &j)?;
        let now = ExportJson::from_config(&cfg, &j.tenant);
        self.persist(state::Change::new().export(&inner.base, &j.name, Some(now)))?;
        let mut list = (*self.exports.snapshot()).clone();
        list.push(Arc::new(make_export(&cfg, &j.tenant, id, storage)));
        self.exports.set(list);
        inner.effective.exports.push(cfg);
        tracing::info!(export = %j.name, tenant = %j.tenant, "export added");
        Ok(())
    }

    /// A reload's new exports against the files that exports of other tenants may still write after it
    /// (`new`: the configuration it would apply): one deleted earlier and still open by its connections
    /// (`retired`), or one this reload removes, whose connections opened before would go on writing (the
    /// reload cannot tell whether it has any). An export of another tenant on such a file or block device
    /// would let two tenants write one disk: refused as `POST /api/exports` refuses it
    /// ([`Registry::check_new_export`]), naming the two steps that are safe. An export of the same tenant
    /// (a rename) is not. Until 2026-12-07 a reload checked only the new configuration's exports among
    /// themselves, and a reload that removed export `a` and added `b` of another tenant on its file served
    /// both until `a`'s connections closed.
    fn check_files_left_open(&self, inner: &mut Inner, new: &ServerConfig) -> Result<(), ChangeError> {
        let still_open = inner.still_open();
        let running = self.exports.snapshot();
        let removed = running.iter().filter(|x| !new.exports.iter().any(|e| e.name == x.info.name));
        let left: Vec<(String, &Arc<Export>)> = removed
            .map(|x| {
                (format!("{} (removed by this reload; its open connections would still write it)", x.info.name), x)
            })
            .chain(still_open.iter().map(|x| (still_open_name(x), x)))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        // Every export of the new configuration, a kept one too: one changed to the path of a removed one.
        for e in &new.exports {
            let tenant = &new.tenants[e.tenant].name;
            let others = left.iter().filter(|(_, x)| x.tenant_name != *tenant).map(|(name, x)| running_file(name, x));
            crate::preflight::check_added(&[], others, e).map_err(|err| {
                ChangeError::Invalid(format!(
                    "{err}: remove the first in one reload, then give its file to {:?} in another once its \
                     connections have closed",
                    e.name
                ))
            })?;
        }
        Ok(())
    }

    /// Export `j` as `POST /api/exports` would add it to what runs, with its tenant's id, or why not: its
    /// name taken, too many exports, a bad path, no such tenant, or the start-up checks (RAM, one file per
    /// export) over the list as it would be, counting as running a deleted export of another tenant that
    /// open connections still write (`retired`): deleting export `a` and adding `b` of another tenant on
    /// its file let both tenants write one disk until `a`'s connections closed.
    fn check_new_export(&self, inner: &mut Inner, j: &ExportJson) -> Result<(ExportConfig, TenantId), ChangeError> {
        let still_open = inner.still_open();
        let eff = &inner.effective;
        if eff.exports.iter().any(|e| e.name == j.name) {
            return Err(ChangeError::Conflict(format!("export {:?} exists", j.name)));
        }
        if eff.exports.len() >= MAX_EXPORTS {
            return Err(ChangeError::Conflict(format!("at most {MAX_EXPORTS} exports")));
        }
        let cfg = j
            .to_config(&eff.data_dir, &eff.tenants, ExportOrigin::Admin)
            .map_err(|e| ChangeError::Invalid(e.to_string()))?;
        let id = self.id(&j.tenant)?;
        // Against the files the running exports have open (no `stat` per export: adding E exports one by
        // one stat'ed E^2 / 2 files).
        let running = self.exports.snapshot();
        let held: Vec<_> =
            still_open.iter().filter(|e| e.tenant_name != j.tenant).map(|e| (still_open_name(e), e)).collect();
        let files =
            running.iter().map(|e| running_file(&e.info.name, e)).chain(held.iter().map(|(n, e)| running_file(n, e)));
        crate::preflight::check_added(&eff.exports, files, &cfg).map_err(|e| ChangeError::Invalid(e.to_string()))?;
        Ok((cfg, id))
    }

    /// Deletes export `name`: new connections no longer see it; open ones keep it (module comment).
    pub async fn remove_export(&self, name: &str) -> Result<(), ChangeError> {
        let mut inner = self.changes.lock().await;
        let Some(pos) = inner.effective.exports.iter().position(|e| e.name == name) else {
            return Err(ChangeError::NotFound(format!("no export named {name:?}")));
        };
        self.persist(state::Change::new().export(&inner.base, name, None))?;
        let mut list = (*self.exports.snapshot()).clone();
        if let Some(i) = list.iter().position(|e| e.info.name == name) {
            let e = list.remove(i);
            inner.retired.push(Arc::downgrade(&e));
        }
        self.exports.set(list);
        inner.effective.exports.remove(pos);
        tracing::info!(export = %name, "export deleted; open connections to it continue until they close");
        Ok(())
    }

    /// Sets the admission capacity (and a device model's capacity) to `iops`; returns any warning. Runs
    /// in a task of its own (module comment).
    pub async fn set_capacity(self: &Arc<Self>, iops: f64) -> Result<Option<String>, ChangeError> {
        let this = Arc::clone(self);
        detached(&self.pending, "set_capacity", async move { this.set_capacity_now(iops).await }).await
    }

    async fn set_capacity_now(&self, iops: f64) -> Result<Option<String>, ChangeError> {
        let mut inner = self.changes.lock().await;
        if !(iops.is_finite() && iops > 0.0) {
            return Err(ChangeError::Invalid(format!("capacity: iops must be positive and finite, got {iops}")));
        }
        let sum = inner.effective.reserved();
        let mut warning = None;
        if sum > iops {
            let msg = format!("the reservations total {sum} IOPS, above the new capacity of {iops} IOPS");
            match self.admission() {
                Admission::Refuse => return Err(ChangeError::Conflict(msg)),
                Admission::Warn => {
                    tracing::warn!("admission control: {msg}");
                    warning = Some(msg);
                }
            }
        }
        let old_model = self.snapshot_of(Vec::new()).await?.capacity_iops;
        match self.dispatcher.set_capacity(iops).await {
            Ok(()) | Err(CapacityError::NoModel) => {}
            Err(e @ CapacityError::Shutdown) => return Err(ChangeError::Unavailable(e.to_string())),
            Err(CapacityError::Invalid(e)) => return Err(ChangeError::Invalid(format!("capacity: {e}"))),
        }
        let entry = CapacityEntry { iops, source: CapacitySource::Admin, config: CapacityBase::of(&inner.base) };
        if let Err(e) = self.persist(state::Change::new().capacity(Some(entry))) {
            if let Some(m) = old_model {
                let _ = self.dispatcher.set_capacity(m).await;
            }
            return Err(e);
        }
        inner.capacity = Some(entry);
        write(&self.capacity, (Some(iops), CapacitySource::Admin));
        tracing::info!(iops, device_model = old_model.is_some(), "capacity changed");
        Ok(warning)
    }

    /// The capacity in use, its source and the reservations' sum.
    pub async fn capacity(&self) -> Result<CapacityInfo, ChangeError> {
        let inner = self.changes.lock().await;
        let model = self.snapshot_of(Vec::new()).await?.capacity_iops;
        let (iops, source) = self.capacity_now(model);
        Ok(CapacityInfo {
            iops,
            source: source.name(),
            reserved_iops: inner.effective.reserved(),
            admission: match self.admission() {
                Admission::Refuse => "refuse",
                Admission::Warn => "warn",
            },
            device_model_iops: model,
        })
    }

    /// At the server's stop (the admin endpoint closed): abandons the changes still under way, each at its
    /// next await, and returns how many there were. A change stuck in an open of its file (a hung mount)
    /// would otherwise hold the registry, hence the dispatcher, and the server would not exit. One cut
    /// after its state file was written is applied from it at the next start.
    pub fn abandon_changes(&self) -> usize {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        pending.iter().filter(|t| !t.is_finished()).map(|t| t.abort()).count()
    }

    /// Applies a new configuration file `new_base` (already validated): the state file's entries are
    /// applied over it as at start, and the difference from what runs is applied as one change. Settings
    /// that cannot change live are reported in [`ReloadReport::needs_restart`] and keep their running
    /// values. On an error nothing has changed.
    ///
    /// The storage of new and changed exports is opened first, on threads of their own (`Opens`) and
    /// without the change lock: an open can block for a long time (a hung network mount, a file
    /// under another process's lease), and neither the server's loop nor the admin's changes wait for
    /// it. Then, under the lock and in a task of its own (`detached`), the change is computed again
    /// from what runs then (an admin change may have come in between) and applied as one step, with the
    /// storage opened; an export that this second look finds still unopened is opened and the step tried
    /// again. Dropping the returned future while files are being opened applies nothing (a stuck open's
    /// thread is left behind; its storage, if it ever opens, is closed and its lock released); once the
    /// apply has started, it completes. A missing file with `size_mb` is created by its open even if the
    /// reload is dropped or fails afterwards, as at start (the configuration file names it).
    pub async fn reload(self: &Arc<Self>, new_base: ServerConfig) -> Result<ReloadReport, ChangeError> {
        let mut opened: Opened = Vec::new();
        let resized = Arc::new(self.resized_images(&new_base).await);
        loop {
            let this = Arc::clone(self);
            let base = new_base.clone();
            let resized = Arc::clone(&resized);
            match detached(&self.pending, "reload", async move { this.reload_step(base, opened, &resized).await })
                .await?
            {
                ReloadStep::Applied(report) => return Ok(report),
                ReloadStep::Open { missing, opened: kept } => {
                    opened = kept;
                    opened.extend(self.open(missing).await?);
                }
            }
        }
    }

    /// The running file exports that take their size from their image (no `size_mb` in `base`) and whose
    /// image has another size now, grown or shrunk by hand (`qemu-img resize`): name to why a reload opens
    /// them again, so that the connections opened from then on see the new size (those open keep theirs:
    /// NBD states an export's size once, at the handshake). Before, the new size was seen only once the
    /// export changed otherwise. Read before the change lock, on a blocking thread: an `fstat` on a hung
    /// mount blocks, as an open does.
    async fn resized_images(&self, base: &ServerConfig) -> std::collections::HashMap<String, String> {
        let sized_by_file: std::collections::HashSet<&str> = base
            .exports
            .iter()
            .filter(|e| e.size.is_none() && matches!(e.backend, crate::config::BackendKind::File { .. }))
            .map(|e| e.name.as_str())
            .collect();
        let storages: Vec<(String, Arc<dyn crate::storage::Storage>)> = self
            .exports
            .snapshot()
            .iter()
            .filter(|x| sized_by_file.contains(x.info.name.as_str()))
            .filter_map(|x| match &x.backend {
                crate::nbd::Backend::Local(s) => Some((x.info.name.clone(), Arc::clone(s))),
                _ => None,
            })
            .collect();
        if storages.is_empty() {
            return Default::default();
        }
        let read = move || {
            storages
                .into_iter()
                .filter_map(|(name, s)| {
                    let now = s.file_size_now().filter(|&n| n != s.size())?;
                    Some((name, format!("its image is now {now} bytes, was {}", s.size())))
                })
                .collect()
        };
        tokio::task::spawn_blocking(read).await.unwrap_or_default()
    }

    /// One try of [`Registry::reload`] under the change lock: checks the whole change, then either
    /// applies it with the storage in `opened` or, if an export to open is not among them, changes
    /// nothing and returns the exports to open (and `opened`, for the next try).
    async fn reload_step(
        &self,
        new_base: ServerConfig,
        mut opened: Opened,
        resized: &std::collections::HashMap<String, String>,
    ) -> Result<ReloadStep, ChangeError> {
        let mut inner = self.changes.lock().await;
        let mut report = ReloadReport::default();
        let old = inner.base.clone();
        let mut base = new_base;
        // Every setting is applied below or named here as needing a restart: a setting added to
        // ServerConfig is a compile error here until it is placed (several were once left out, and a
        // reload changed nothing of them without a word).
        let ServerConfig {
            listen: _,
            listen_unix: _,
            admin: _,
            admin_access: _,
            admin_tls: _,
            data_dir: _,
            scheduler: _,
            queue_depth: _,
            max_request: _,
            io_engine: _,
            probe_capacity_s: _,
            max_inflight: _,
            max_inflight_per_tenant: _,
            idle_timeout: _,
            stall_timeout: _,
            shutdown_timeout: _,
            device: _,
            tls: _,
            default_export: _,
            caps: _,
            node: _,
            pshift: _,
            token: _,
            // Applied live.
            sched: _,
            admission: _,
            capacity_iops: _,
            exports: _,
            tenants: _,
        } = &base;
        // `old` holds the running value of each (restored below after every reload), so the warning is
        // repeated at each reload while the file differs from what runs, and silent once it matches.
        // Addresses the service manager's sockets stand in for: a change is not used now or after a
        // restart (the socket unit decides them).
        let passed = self.passed.load(std::sync::atomic::Ordering::Relaxed);
        let unit = "the service manager passes (change the socket unit to move it)";
        if passed & PASSED_NBD != 0 && (base.listen != old.listen || base.listen_unix != old.listen_unix) {
            report.needs_restart.push(format!("listen, listen_unix: not used: NBD listens on the sockets {unit}"));
            (base.listen, base.listen_unix) = (old.listen, old.listen_unix.clone());
        }
        if passed & PASSED_ADMIN != 0 && base.admin != old.admin {
            report.needs_restart.push(format!("admin: not used: the admin endpoint listens on the socket {unit}"));
            base.admin = old.admin;
        }
        let mut restart = |key: &str| report.needs_restart.push(format!("{key} (needs a restart)"));
        macro_rules! restart_only {
            ($($field:ident => $key:expr),* $(,)?) => {$(
                if base.$field != old.$field {
                    restart($key);
                    base.$field = old.$field.clone();
                }
            )*};
        }
        // `[mclock]` changes live, but for the cost model: it gives every reservation and limit its unit
        // and the admission its count.
        if base.sched.cost_model != old.sched.cost_model {
            restart("cost_model");
            base.sched.cost_model = old.sched.cost_model;
        }
        restart_only!(
            listen => "listen",
            listen_unix => "listen_unix",
            admin => "admin",
            data_dir => "data_dir",
            scheduler => "scheduler",
            queue_depth => "queue_depth",
            max_request => "max_request_kb",
            io_engine => "io_engine",
            device => "[device_model]",
            probe_capacity_s => "probe_capacity_s",
            caps => "max_connections, max_connections_per_client or max_connections_per_tenant",
            admin_access => "admin_token_file, admin_insecure, max_admin_connections or admin_idle_timeout_s",
            max_inflight => "max_inflight_mb",
            max_inflight_per_tenant => "max_inflight_mb_per_tenant",
            idle_timeout => "idle_timeout_s",
            stall_timeout => "stall_timeout_s",
            shutdown_timeout => "shutdown_timeout_s",
            node => "[node]",
        );
        // `[tls]` applies to the connections opened from now on, its files read again (renewed
        // certificates under the same names too); the switch between HTTP and HTTPS for the admin
        // endpoint needs a restart, and until then the endpoint keeps the context it has.
        let tls_change = crate::tls::TlsConfig::change(old.tls.as_ref(), base.tls.as_ref());
        if base.admin_tls.is_some() != old.admin_tls.is_some() {
            restart("admin_tls");
            base.admin_tls = old.admin_tls.clone();
        }
        // `[pshift]` needs a restart but for `[pshift.tls]`'s credentials, which the link takes at its next
        // connection to the controller (the running settings stay: the link holds their cell).
        let link = |p: &Option<crate::pshift_link::LinkSettings>| {
            p.as_ref().map(|l| (l.controller, l.name.clone(), l.tls.as_ref().map(|(_, n)| n.clone())))
        };
        let mut pshift_tls = None;
        if link(&base.pshift) != link(&old.pshift) || base.token != old.token {
            restart("[pshift]");
        } else if let (Some((cell, _)), Some((next, _))) =
            (old.pshift.as_ref().and_then(|l| l.tls.as_ref()), base.pshift.as_ref().and_then(|l| l.tls.as_ref()))
        {
            pshift_tls = Some((cell.clone(), next.get()));
        }
        (base.pshift, base.token) = (old.pshift.clone(), old.token);
        let st = state::diff(&old, &inner.effective, inner.capacity);
        let o = state::overlay(&base, &st);
        // The default export is the NBD policy's, fixed at start: compared with what the new file makes of
        // it (the state file may have deleted its export), kept as the file has it (the state file's base).
        if o.config.default_export.map(|i| &o.config.exports[i].name) != self.default_export.as_ref() {
            restart("default_export");
        }
        report.applied.extend(o.notes.into_iter().filter(|n| n.contains("changed it since") || n.contains("dropped")));
        let new = o.config;
        let cur = inner.effective.clone();
        let cur = &cur;
        // What the new configuration asks that nothing will do, said once: when it comes in.
        let known = cur.warnings();
        report
            .applied
            .extend(new.warnings().into_iter().filter(|w| !known.contains(w)).map(|w| format!("warning: {w}")));
        // Capacity and admission of the new whole.
        let (cap, source) = match o.capacity {
            Some(c) => (Some(c.iops), c.source),
            None => config_capacity(&new),
        };
        let snap = self.snapshot_of(Vec::new()).await?;
        let cap_now = cap.or(snap.capacity_iops);
        let shortfall = crate::config::Shortfall::of(new.reserved(), cap_now).map(|s| s.to_string());
        if let Some(msg) = shortfall {
            match new.admission {
                Admission::Refuse => return Err(ChangeError::Conflict(format!("admission control: {msg}"))),
                Admission::Warn => report.applied.push(format!("warning: {msg}")),
            }
        }
        crate::preflight::check_exports(&new.exports).map_err(|e| ChangeError::Invalid(e.to_string()))?;
        self.check_files_left_open(&mut inner, &new)?;
        // New or changed exports need their storage open before anything is applied (opened off the lock
        // by the caller, [`Registry::reload`]): a failure leaves everything as it was.
        let json = |c: &ServerConfig, e: &ExportConfig| ExportJson::from_config(e, &c.tenants[e.tenant].name);
        // The running exports as written, by name (names are unique): one lookup per new export.
        let running: std::collections::HashMap<&str, ExportJson> =
            cur.exports.iter().map(|x| (x.name.as_str(), json(cur, x))).collect();
        // A running export whose sync failed (module `storage`, "A failed sync stays failed") is opened
        // again by any reload, changed or not: once the device is dealt with, the operator's reload ends
        // the error for the connections opened from then on (those open keep the failed storage, and its
        // error, to the end: their writes before it may be lost).
        // So is one whose image was resized by hand ([`Registry::resized_images`]).
        let mut again: std::collections::HashMap<String, String> = self
            .exports
            .snapshot()
            .iter()
            .filter_map(|x| match &x.backend {
                crate::nbd::Backend::Local(s) => s.sync_error().map(|e| {
                    (
                        x.info.name.clone(),
                        format!("{e} (for the connections opened from now on; those open keep the error)"),
                    )
                }),
                _ => None,
            })
            .collect();
        for (name, why) in resized {
            again.entry(name.clone()).or_insert_with(|| {
                format!("{why} (for the connections opened from now on; those open keep the old size)")
            });
        }
        let to_open: Vec<(&ExportConfig, ExportJson)> = new
            .exports
            .iter()
            .map(|e| (e, json(&new, e)))
            .filter(|(e, j)| running.get(e.name.as_str()) != Some(j) || again.contains_key(&e.name))
            .collect();
        let missing: Vec<(ExportConfig, ExportJson)> = to_open
            .iter()
            .filter(|(_, j)| !opened.iter().any(|(o, _)| o == j))
            .map(|(e, j)| ((*e).clone(), j.clone()))
            .collect();
        if !missing.is_empty() {
            return Ok(ReloadStep::Open { missing, opened });
        }
        let opened: Vec<(String, Arc<dyn crate::storage::Storage>)> = to_open
            .iter()
            .map(|(e, j)| {
                let i = opened.iter().position(|(o, _)| o == j).expect("none missing");
                (e.name.clone(), opened.swap_remove(i).1)
            })
            .collect();
        // Tenants by name (a scan per name made a reload of N tenants cost N^2 comparisons).
        let cur_tenants = self.tenants();
        let mut ids: Vec<(String, TenantId)> = Vec::new();
        let mut added = Vec::new();
        for t in &new.tenants {
            match cur_tenants.id(&t.name) {
                Some(id) => ids.push((t.name.clone(), id)),
                None => match self.dispatcher.add_tenant(t.spec).await {
                    Ok(id) => {
                        added.push(id);
                        ids.push((t.name.clone(), id));
                    }
                    Err(e) => {
                        for id in added {
                            let _ = self.dispatcher.remove_tenant(id).await;
                        }
                        return Err(ChangeError::Conflict(format!("tenant {}: {e}", t.name)));
                    }
                },
            }
        }
        let capacity_entry = o.capacity;
        if let Err(e) = self.write_state(&base, &new, capacity_entry) {
            for id in added {
                let _ = self.dispatcher.remove_tenant(id).await;
            }
            return Err(e);
        }
        // Apply: specs, exports, removed tenants, capacity and admission.
        let ids = TenantNames::new(ids);
        let cur_specs: std::collections::HashMap<&str, QosSpec> =
            cur.tenants.iter().map(|t| (t.name.as_str(), t.spec)).collect();
        for t in &new.tenants {
            match cur_specs.get(t.name.as_str()) {
                None => report.applied.push(format!("tenant {} added ({})", t.name, t.spec)),
                Some(&was) if was != t.spec => {
                    let _ = self.dispatcher.set_spec(ids.id(&t.name).expect("every tenant has an id"), t.spec).await;
                    report.applied.push(format!("tenant {}: {} -> {}", t.name, was, t.spec));
                }
                Some(_) => {}
            }
        }
        let old_list = self.exports.snapshot();
        let old_by_name: std::collections::HashMap<&str, &Arc<Export>> =
            old_list.iter().map(|x| (x.info.name.as_str(), x)).collect();
        let mut list = Vec::with_capacity(new.exports.len());
        for e in &new.exports {
            let tname = &new.tenants[e.tenant].name;
            let id = ids.id(tname).expect("every tenant has an id");
            match opened.iter().position(|(n, _)| *n == e.name) {
                Some(i) => {
                    let mut storage = opened[i].1.clone();
                    // A memory export changed (its tenant, access, read_only) keeps its RAM: the new one
                    // opened for it is empty, and every byte written to it was gone for the connections
                    // opened from then on, without a word. (One of another size starts anew.) The RAM
                    // comes through a handle of its own, read-only or not as the new export is: the old
                    // export's handle may have its writes stopped (below, or by an earlier reload to
                    // read_only), which stays with the old export's connections. Until 2026-12-06 the
                    // RAM was kept only from a writable export, and one made read-only started empty
                    // when a later reload made it writable again.
                    let old = old_by_name.get(e.name.as_str());
                    if let Some(old) = old.filter(|o| {
                        o.info.volatile
                            && e.backend == crate::config::BackendKind::Memory
                            && o.info.size == storage.size()
                    }) {
                        if let Some(shared) = match &old.backend {
                            crate::nbd::Backend::Local(s) => s.share_bytes(e.read_only),
                            _ => None,
                        } {
                            storage = shared;
                        }
                    }
                    let verb = match (running.get(e.name.as_str()), again.get(&e.name)) {
                        (Some(j), Some(why)) if *j == json(&new, e) => format!("opened again: {why}"),
                        (Some(_), _) => "changed".into(),
                        (None, _) => "added".into(),
                    };
                    report.applied.push(format!("export {} {verb}", e.name));
                    // Made read-only: the connections opened before keep the old export, told writable
                    // at their handshake; their writes are refused from now on (EPERM), where they went
                    // on landing after the reload had said read-only (an image frozen to be copied
                    // went on changing under the copy). Their FLUSHes still sync what came before.
                    if let Some(old) = old.filter(|o| e.read_only && !o.info.read_only) {
                        if let crate::nbd::Backend::Local(s) = &old.backend {
                            s.stop_writes();
                            report.applied.push(format!(
                                "export {}: read-only now; the writes of the connections opened before fail \
                                 (EPERM) from now on",
                                e.name
                            ));
                        }
                    }
                    list.push(Arc::new(make_export(e, tname, id, storage)));
                }
                None => list.push(Arc::clone(old_by_name.get(e.name.as_str()).expect("unchanged export runs"))),
            }
        }
        for x in old_list.iter() {
            if !list.iter().any(|y| Arc::ptr_eq(x, y)) {
                inner.retired.push(Arc::downgrade(x));
                if !new.exports.iter().any(|e| e.name == x.info.name) {
                    report.applied.push(format!("export {} removed", x.info.name));
                }
            }
        }
        self.exports.set(list);
        // What still holds a deleted export now is its connections.
        drop(old_by_name);
        drop(old_list);
        let still_open = inner.still_open();
        for (name, id) in cur_tenants.iter() {
            if ids.id(name).is_none() {
                let _ = self.dispatcher.remove_tenant(*id).await;
                report.applied.push(format!("tenant {name} removed"));
                // The API refuses this (409); the file is the operator's word, so it applies, said loudly:
                // the open connections' requests now fail.
                let open: Vec<String> =
                    still_open.iter().filter(|e| e.tenant_name == *name).map(|e| e.info.name.clone()).collect();
                if !open.is_empty() {
                    report.applied.push(format!(
                        "warning: tenant {name} was removed while connections to its deleted export {} are open: \
                         their requests fail (EINVAL) from now on",
                        open.join(", ")
                    ));
                }
            }
        }
        write(&self.tenants, Arc::new(ids));
        if read(&self.capacity) != (cap, source) {
            // The device model runs at a capacity set at run time (`PUT /api/capacity`, the probe's), as at
            // start; the file's `capacity_iops` is admission's alone ([device_model] sets the model's and
            // needs a restart). Before, a reload of `capacity_iops = 5000` over a model of 2,000 IOPS made
            // the model serve 5,000, which a start with the same file does not.
            let from_entry = |s: CapacitySource| matches!(s, CapacitySource::Admin | CapacitySource::Probe);
            let model = match (cap, capacity_entry) {
                (Some(c), Some(_)) => Some(c),
                // An entry the file's edit dropped: the model's own capacity again, as a start would have it.
                (_, None) if from_entry(read(&self.capacity).1) => {
                    cur.device.as_ref().map(|d| d.spec.capacity_at(rein_core::Nanos::ZERO))
                }
                _ => None,
            };
            if let Some(c) = model {
                let _ = self.dispatcher.set_capacity(c).await;
            }
            report.applied.push(format!(
                "capacity {} ({})",
                cap.map_or("none".to_string(), |c| format!("{c} IOPS")),
                source.name()
            ));
            write(&self.capacity, (cap, source));
        }
        if new.admission != cur.admission {
            report.applied.push(format!("admission {:?}", new.admission));
            write(&self.admission, new.admission);
        }
        let changed = sched_changes(&cur.sched, &new.sched);
        if !changed.is_empty() {
            let _ = self.dispatcher.set_sched_config(new.sched).await;
            report.applied.push(format!("[mclock] {}", changed.join(", ")));
        }
        // Built from the files as they are now, so replaced whatever the comparison says (module `tls`).
        let cut = self.tls.set(base.tls.clone());
        if !cut.is_empty() {
            report.applied.push(format!(
                "[tls]: {} closed: the new credentials revoke their client (each logged)",
                rein_core::Count(cut.len(), "open connection")
            ));
        }
        if let (Some(live), Some(t)) = (&self.admin_tls, &base.admin_tls) {
            let cut = live.set(t.clone());
            if !cut.is_empty() {
                report.applied.push(format!(
                    "admin_tls: {} closed: the new credentials revoke their client (each logged)",
                    rein_core::Count(cut.len(), "open admin connection")
                ));
            }
        }
        if let Some((cell, next)) = pshift_tls {
            if cell.get().changed(&next) {
                report.applied.push(
                    "[pshift.tls]: new credentials (the ca, cert, key, crl, psk_file or psk_identity, or their \
                     contents): for the next connection to the controller"
                        .to_string(),
                );
            }
            cell.set(next);
            let cut = cell.cut_revoked();
            if !cut.is_empty() {
                report.applied.push(
                    "[pshift.tls]: the link to the controller closed: the new crl revokes its certificate (logged)"
                        .to_string(),
                );
            }
        }
        if let Some(w) = base.tls.as_ref().and_then(|t| t.expiry_warning(crate::tls::unix_now())) {
            report.applied.push(format!("warning: {w}"));
        }
        if let Some(what) = tls_change {
            let admin = if base.admin_tls.is_some() { " and the admin endpoint's HTTPS" } else { "" };
            report.applied.push(format!(
                "[tls]: {what}: for NBD connections{admin} from now on (connections open keep their session)"
            ));
        }
        inner.capacity = capacity_entry;
        inner.effective = new;
        inner.base = base;
        Ok(ReloadStep::Applied(report))
    }
}

/// Storage opened for a reload, by its export as written.
type Opened = Vec<(ExportJson, Arc<dyn crate::storage::Storage>)>;

/// What one try of a reload did ([`Registry::reload_step`]).
enum ReloadStep {
    /// The change is applied.
    Applied(ReloadReport),
    /// Nothing is applied: these exports' storage must be opened first.
    Open {
        /// The exports to open (each also as written, which names its tenant).
        missing: Vec<(ExportConfig, ExportJson)>,
        /// The storage opened so far (given back for the next try).
        opened: Opened,
    },
}

/// What an open of an export's storage answers, to every change waiting for it (its error in words).
type OpenAnswer = Option<Result<Arc<dyn crate::storage::Storage>, String>>;

/// The opens of exports' files under way, by file: at most one per file at a time. Each runs on a thread
/// of its own (`crate::on_own_thread`; why not `spawn_blocking`: there), which an open that never
/// returns (a hung mount, a file under another process's lease) keeps for as long as it lasts. A change
/// that needs a file whose open is under way waits for that open rather than starting another thread:
/// for the same export as written it takes that open's storage; for another (other settings, another
/// name) it waits for that open to end and then opens the file itself. So SIGHUPs that replace one
/// another over a stuck file, or admin requests naming it, hold one thread between them, not one each.
/// Memory exports do not block, and are opened each on a thread of their own.
#[derive(Default)]
struct Opens {
    by_file: Arc<std::sync::Mutex<std::collections::HashMap<PathBuf, InFlight>>>,
    /// Numbers the opens, so that an open that ends removes its own entry only.
    next: std::sync::atomic::AtomicU64,
}

/// An open of a file under way ([`Opens`]).
struct InFlight {
    /// Which open it is.
    id: u64,
    /// The export it opens, as written.
    export: ExportJson,
    /// Its answer, once there is one.
    answer: tokio::sync::watch::Receiver<OpenAnswer>,
}

impl Opens {
    /// The answer to come of an open of `e`'s storage: the one under way for the same export, else a new
    /// one (`Err`: an open of another export of the same file, to wait for first).
    fn get_or_start(
        &self,
        e: &ExportConfig,
        j: &ExportJson,
    ) -> Result<tokio::sync::watch::Receiver<OpenAnswer>, tokio::sync::watch::Receiver<OpenAnswer>> {
        let crate::config::BackendKind::File { path } = &e.backend else { return Ok(self.start(e.clone(), None)) };
        let mut by_file = self.by_file.lock().unwrap_or_else(|x| x.into_inner());
        if let Some(f) = by_file.get(path) {
            if f.export == *j {
                tracing::info!(export = %j.name, path = %path.display(), "the file's open is still under way (for an earlier change); this change waits for it");
                return Ok(f.answer.clone());
            }
            return Err(f.answer.clone());
        }
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let answer = self.start(e.clone(), Some((path.clone(), id)));
        by_file.insert(path.clone(), InFlight { id, export: j.clone(), answer: answer.clone() });
        Ok(answer)
    }

    /// Starts the open of `e`'s storage on a thread of its own; an open listed as `listed` (its file and
    /// number) is taken off the list when it ends, before its answer is given: a change that comes later
    /// opens the file again.
    fn start(&self, e: ExportConfig, listed: Option<(PathBuf, u64)>) -> tokio::sync::watch::Receiver<OpenAnswer> {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let opened =
            crate::on_own_thread("rein-open", move || crate::preflight::open_export(&e).map_err(|x| x.to_string()));
        let by_file = Arc::clone(&self.by_file);
        tokio::spawn(async move {
            let answer = match opened.await {
                Ok(answer) => answer,
                Err(crate::ApartError::NotStarted(e)) => {
                    Err(format!("cannot start a thread to open the exports' storage: {e}"))
                }
                Err(crate::ApartError::Ended) => Err("the thread opening the exports' storage ended".into()),
            };
            if let Some((path, id)) = listed {
                let mut by_file = by_file.lock().unwrap_or_else(|x| x.into_inner());
                if by_file.get(&path).is_some_and(|f| f.id == id) {
                    by_file.remove(&path);
                }
            }
            // With nobody waiting any more (the changes dropped), the storage is closed here.
            let _ = tx.send(Some(answer));
        });
        rx
    }
}

impl Registry {
    /// Opens `exports`' storage, in order, each without the change lock and on a thread of its own, or
    /// through the open of its file already under way ([`Opens`]); the first failure is the error (naming
    /// the export and its file), and the storage opened before it is closed. Dropping the returned future
    /// leaves the opens under way to finish; what they open is then closed, unless another change waits
    /// for it.
    async fn open(&self, exports: Vec<(ExportConfig, ExportJson)>) -> Result<Opened, ChangeError> {
        let mut opened = Vec::with_capacity(exports.len());
        for (e, j) in exports {
            let mut answer = loop {
                match self.opens.get_or_start(&e, &j) {
                    Ok(answer) => break answer,
                    // Another export's open of the file: once it ends, this one opens the file.
                    Err(mut other) => {
                        if other.wait_for(Option::is_some).await.is_err() {
                            return Err(ChangeError::Failed("the thread opening the exports' storage ended".into()));
                        }
                    }
                }
            };
            let storage = match answer.wait_for(Option::is_some).await {
                Ok(a) => a.clone().expect("waited for an answer"),
                Err(_) => Err("the thread opening the exports' storage ended".into()),
            };
            opened.push((j, storage.map_err(ChangeError::Failed)?));
        }
        Ok(opened)
    }
}

/// The scheduler settings that differ between `old` and `new`, each as `name old -> new` (for the log).
pub(crate) fn sched_changes(old: &SchedConfig, new: &SchedConfig) -> Vec<String> {
    // `new` is destructured by the same list, so a setting added to SchedConfig cannot be left out.
    macro_rules! changes {
        ($($field:ident),*) => {{
            let SchedConfig { $($field),* } = new;
            let mut out = Vec::new();
            $(
                if old.$field != *$field {
                    out.push(format!("{} {:?} -> {:?}", stringify!($field), old.$field, $field));
                }
            )*
            out
        }};
    }
    changes!(
        cost_model,
        limit_mode,
        batch,
        batch_distance,
        idle_age,
        weight_lead_ios,
        limit_burst_ios,
        reservation_lag,
        limited_reenter_at_vnow,
        erase_age,
        pool_return,
        limits
    )
}

/// A spec's JSON form (for answers).
pub fn spec_json(s: QosSpec) -> SpecJson {
    SpecJson::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::DispatchConfig;
    use std::future::Future;
    use std::task::Poll;

    fn spec(r: f64) -> QosSpec {
        QosSpec::new(r, None, 1.0, 0).unwrap()
    }

    /// A registry (admission refuse, capacity 1,000) over a fresh dispatcher with tenant "rd" (r = 100),
    /// and tenant "b" (r = 800) with `with_b`.
    async fn registry(with_b: bool) -> Arc<Registry> {
        let (d, _join) = Dispatcher::spawn(None, DispatchConfig::default());
        let id = d.add_tenant(spec(100.0)).await.unwrap();
        let reg =
            Arc::new(Registry::for_tenants(d, vec![("rd".into(), spec(100.0), id)], Admission::Refuse, Some(1000.0)));
        if with_b {
            reg.add_tenant("b", spec(800.0)).await.unwrap();
        }
        reg
    }

    /// The dispatcher's tenants and specs are the registry's (its names and ids, and `effective`, which
    /// admission control and the state file read), once the runtime has run a while.
    async fn assert_agree(reg: &Registry, cut: usize) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let snap = reg.dispatcher.snapshot().await.unwrap();
        let inner = reg.changes.lock().await;
        if let Some(e) = inner.capacity {
            assert_eq!(read(&reg.capacity).0, Some(e.iops), "cut {cut}: admission's capacity is not the state's");
        }
        let names = reg.tenants();
        assert_eq!(names.len(), inner.effective.tenants.len(), "cut {cut}: names {names:?}");
        let mut ids: Vec<TenantId> = snap.tenants.iter().map(|t| t.id).collect();
        let mut reg_ids: Vec<TenantId> = names.iter().map(|t| t.1).collect();
        ids.sort_unstable();
        reg_ids.sort_unstable();
        assert_eq!(ids, reg_ids, "cut {cut}: the dispatcher's tenants are not the registry's");
        for (name, id) in names.iter() {
            let running = spec_in(&snap, *id, name).unwrap();
            let t = inner.effective.tenants.iter().find(|t| t.name == *name).expect("effective has every name");
            assert_eq!(
                t.spec, running,
                "cut {cut}: tenant {name}: the registry has {} but the dispatcher runs {running}",
                t.spec
            );
        }
    }

    /// Drops `change` (over a fresh registry from `setup`) after its 1st poll, then after its 2nd, and so
    /// on until it finishes undropped (every await it has was a cut point), as hyper drops a handler whose
    /// client closed the connection; after each cut the registry must agree with the dispatcher, and there
    /// must have been at least one cut.
    async fn cut_everywhere<S, F>(setup: impl Fn() -> S, change: impl Fn(Arc<Registry>) -> F)
    where
        S: Future<Output = Arc<Registry>>,
        F: Future,
    {
        let setup = || {
            let reg = setup();
            async move { (reg.await, Arc::new(())) }
        };
        cut_everywhere_then(setup, change, |reg, _, cut| async move { assert_agree(&reg, cut).await }).await
    }

    /// [`cut_everywhere`] with a setup that also makes `X` (a data directory, say) and a `check` of its own
    /// after each cut.
    async fn cut_everywhere_then<X, S, F, C>(
        setup: impl Fn() -> S,
        change: impl Fn(Arc<Registry>) -> F,
        check: impl Fn(Arc<Registry>, Arc<X>, usize) -> C,
    ) where
        S: Future<Output = (Arc<Registry>, Arc<X>)>,
        F: Future,
        C: Future<Output = ()>,
    {
        for cut in 1..1000 {
            let (reg, extra) = setup().await;
            // Boxed, so that `drop` drops it (a `pin!`ned one would live to the end of the block).
            let mut fut = Box::pin(change(Arc::clone(&reg)));
            let mut finished = false;
            for _ in 0..cut {
                if std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_ready())).await {
                    finished = true;
                    break;
                }
                tokio::task::yield_now().await;
            }
            drop(fut);
            check(reg, extra, cut).await;
            if finished {
                assert!(cut > 1, "{} cuts", cut - 1);
                return;
            }
        }
        panic!("the change never finished");
    }

    /// `PUT /api/tenants/rd {"reservation":900}` whose client goes away: the dispatcher must not run 900
    /// while admission counts 100 (which then admitted a POST of r = 850 over the capacity).
    #[tokio::test]
    async fn dropped_update_spec_still_completes() {
        cut_everywhere(
            || registry(false),
            |reg| async move {
                let _ = reg.update_spec("rd", |_| Ok(spec(900.0))).await;
                // Over-admission, if the change was dropped half-way.
                let r = reg.dispatcher.snapshot().await.unwrap().tenants[0].spec.reservation();
                let more = reg.add_tenant("c", spec(850.0)).await;
                assert!(r + 850.0 <= 1000.0 || more.is_err(), "over-admitted: rd runs at {r}");
            },
        )
        .await;
    }

    #[tokio::test]
    async fn dropped_add_tenant_still_completes() {
        cut_everywhere(
            || registry(false),
            |reg| async move {
                let _ = reg.add_tenant("b", spec(800.0)).await;
            },
        )
        .await;
    }

    #[tokio::test]
    async fn dropped_remove_tenant_still_completes() {
        cut_everywhere(
            || registry(true),
            |reg| async move {
                let _ = reg.remove_tenant("b").await;
            },
        )
        .await;
    }

    /// A storage node's handshake timeout drops `adopt` (a spec changed and a tenant added, one change).
    #[tokio::test]
    async fn dropped_adopt_still_completes() {
        cut_everywhere(
            || registry(false),
            |reg| async move {
                let _ = reg.adopt(&[("rd".to_string(), spec(300.0)), ("b".to_string(), spec(600.0))], usize::MAX).await;
            },
        )
        .await;
    }

    /// `POST /api/exports` of a file export created with `size_mb`, dropped after each poll in turn: the
    /// file exists exactly when the export is in the effective configuration and in the export table.
    /// Before the change ran in a task of its own, a cut while the file was being created left the file
    /// without the export (and the same POST again then found a file it had not made).
    #[tokio::test]
    async fn dropped_add_export_still_completes() {
        let setup = || async {
            let dir = Arc::new(tempfile::tempdir().unwrap());
            let reg = registry(false).await;
            reg.changes.lock().await.effective.data_dir = dir.path().to_path_buf();
            (reg, dir)
        };
        let change = |reg: Arc<Registry>| async move {
            let j = ExportJson {
                name: "x".into(),
                backend: "file".into(),
                path: None,
                size_mb: Some(1),
                tenant: "rd".into(),
                read_only: false,
                allow_networks: None,
                allow_identities: None,
                direct: false,
                readahead: true,
            };
            let _ = reg.add_export(j).await;
        };
        let check = |reg: Arc<Registry>, dir: Arc<tempfile::TempDir>, cut: usize| async move {
            // The file is created on a thread of its own (`on_own_thread`), which the change's task awaits:
            // the state is read once that task has ended, and so has the thread's work in `dir`. Before,
            // a look 5 ms in that found no file yet (a thread late on a busy machine) ended the check, and
            // `dir` was removed while the thread went on to create the file in it: one created between
            // the removal's last unlink and its rmdir left the directory behind.
            let mut settled = false;
            for _ in 0..2000 {
                settled = reg.pending.lock().unwrap().iter().all(|t| t.is_finished());
                if settled {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert!(settled, "cut {cut}: the change's task still runs after 10 s");
            let inner = reg.changes.lock().await;
            let listed = inner.effective.exports.iter().any(|e| e.name == "x");
            let tabled = reg.exports.snapshot().iter().any(|e| e.info.name == "x");
            let file = std::fs::read_dir(dir.path()).unwrap().count() > 0;
            assert_eq!(
                (listed, tabled),
                (file, file),
                "cut {cut}: file {file}, listed {listed}, in the table {tabled}"
            );
        };
        cut_everywhere_then(setup, change, check).await;
    }

    /// `PUT /api/capacity` dropped at any point leaves admission's capacity and the state in agreement.
    #[tokio::test]
    async fn dropped_set_capacity_still_completes() {
        cut_everywhere(
            || registry(false),
            |reg| async move {
                let _ = reg.set_capacity(500.0).await;
            },
        )
        .await;
    }
}
