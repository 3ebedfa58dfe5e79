//! `rein serve`: build the exports, the dispatcher and the listeners from a [`ServerConfig`], serve until
//! shutdown, then drain.
//!
//! The data directory is locked for the server's life, and the run-time changes kept in its state file
//! ([`crate::state`]) are applied over the configuration at start; tenants, exports and capacity then live
//! in a [`Registry`] ([`crate::live`]) that the admin endpoint and reloads ([`Reload`], SIGHUP in the
//! binary) change.
//!
//! Shutdown (SIGINT/SIGTERM in the binary, or the future passed to [`run`]): stop accepting; every
//! connection stops reading new requests, answers the ones in flight and closes; the dispatcher finishes
//! what it has queued; then `run` returns. Data written and acknowledged with FLUSH or FUA is on stable
//! storage (fdatasync) before its reply. All that has a deadline, `shutdown_timeout`: once it has passed,
//! the requests still queued are answered with ESHUTDOWN ([`crate::Dispatcher::abort_queued`]), each
//! connection gets [`crate::nbd::CLOSE_GRACE`] to write the replies that are ready and is then cut (a
//! client that does not read its replies, or sends half a WRITE, holds nothing up), and `run` returns once
//! the requests already at the backend have completed.

use crate::access::ConnLimits;
use crate::admin::{self, AdminState};
use crate::budget::Budget;
use crate::config::{Admission, BackendKind, ServerConfig, Shortfall};
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::live::{make_export, Registry};
use crate::nbd::{spawn_accepted, ExportTable, Limits, NbdContext, Policy};
use crate::state::{self, CapacityBase, CapacityEntry, CapacitySource, DirLock, StateFile};
use rein_core::{Count, TenantId};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;

/// The environment variable by which a supervisor (`rein cluster`) asks a daemon it starts to stop when
/// the supervisor itself is gone, even if it was killed with SIGKILL and could not stop it
/// ([`parent_gone`]).
pub const EXIT_WITH_PARENT_ENV: &str = "REIN_EXIT_WITH_PARENT";

/// With [`EXIT_WITH_PARENT_ENV`]: the process id of the parent this process must have ([`parent_gone`]).
pub const PARENT_PID_ENV: &str = "REIN_PARENT_PID";

/// How often [`parent_gone`] looks at the parent.
const PARENT_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// With [`EXIT_WITH_PARENT_ENV`] set (to anything), resolves once the process that started this one has
/// exited (this process is re-parented: its parent pid changes), within 200 ms; without it, never. With
/// [`PARENT_PID_ENV`] too (as `rein cluster` sets it: its own id), that is the parent this process must
/// have: one gone before this process looked (a supervisor killed while this one loaded its
/// configuration) is seen at once; without it, the parent is the one this process has when it looks.
pub fn parent_gone() -> impl std::future::Future<Output = ()> + Send + 'static {
    // The parent is read now, not at the first poll: a parent that died in between would otherwise be
    // taken for the process that adopted this one, and never be seen to go.
    let watch = std::env::var_os(EXIT_WITH_PARENT_ENV).is_some();
    let parent = std::os::unix::process::parent_id();
    let expected = std::env::var(PARENT_PID_ENV).ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(parent);
    async move {
        if !watch {
            return std::future::pending().await;
        }
        loop {
            if std::os::unix::process::parent_id() != expected {
                tracing::warn!(parent = expected, "the process that started this one is gone: stopping");
                return;
            }
            tokio::time::sleep(PARENT_POLL).await;
        }
    }
}

/// The default of `max_connections`, simultaneous NBD connections; a client over it (or over
/// `max_connections_per_client`) is greeted and refused ([`crate::access`]).
pub const MAX_CONNECTIONS: usize = 4096;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The data directory could not be created.
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// An export's storage could not be opened or created (or does not fit the machine's RAM).
    #[error(transparent)]
    Open(#[from] crate::preflight::OpenError),
    /// The admin endpoint cannot be served as configured (token file, exposed address).
    #[error(transparent)]
    Admin(#[from] crate::admin_guard::AdminGuardError),
    /// The exports cannot be served together (too much RAM, one file in two exports).
    #[error(transparent)]
    Preflight(#[from] crate::preflight::PreflightError),
    /// The reservations exceed the reservable capacity and `admission = "refuse"`; the message gives the
    /// total and the capacity.
    #[error("admission control: {0} (set admission = \"warn\" to start anyway)")]
    Admission(String),
    /// A listening socket (NBD or admin) could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The Unix socket (`listen_unix`) could not be bound; the error names the path and why.
    #[error("cannot listen on the Unix socket {0}")]
    BindUnix(crate::sock::UnixBindError),
    /// A socket the service manager passed cannot be used ([`crate::activation`]); the error names the
    /// descriptor and why.
    #[error("socket activation: {0}")]
    Activation(crate::activation::ActivationError),
    /// The dispatcher refused a configured tenant (too many tenants) or stopped.
    #[error("dispatcher: {0}")]
    Dispatcher(#[from] crate::dispatch::IoError),
    /// The start-up capacity probe (`probe_capacity_s`) failed; the message is its error.
    #[error("capacity probe failed: {0}")]
    Probe(String),
    /// The data directory is locked by another server, or the state file cannot be read or written.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
}

impl From<crate::sock::NbdListenError> for ServeError {
    fn from(e: crate::sock::NbdListenError) -> Self {
        use crate::sock::NbdListenError as E;
        match e {
            E::Bind(addr, source) => ServeError::Bind { addr, source },
            E::BindUnix(e) => ServeError::BindUnix(e),
            E::Activation(e) => ServeError::Activation(e),
        }
    }
}

/// A reload's loader ([`ConfigLoader`], [`crate::gateway::GatewayLoader`]), shared with the thread that
/// runs it ([`read_apart`]).
pub type SharedLoader<T> = Arc<std::sync::Mutex<Box<dyn FnMut() -> Result<T, String> + Send>>>;

/// Runs `load` (a reload's read and parse of the configuration file) on a thread of its own; the answer
/// comes on the returned channel. Reading the file can block for ever (a FIFO put in its place, a hung
/// network mount): on the event loop it stopped new connections and the stop signals (only SIGKILL
/// ended the server). The thread is `crate::on_own_thread`'s (why a plain one: there). No answer (the
/// thread could not be started, or `load` panicked) is an error naming that.
pub fn read_apart<T: Send + 'static>(
    load: &SharedLoader<T>,
) -> impl Future<Output = Result<T, String>> + Send + Unpin + 'static {
    let load = Arc::clone(load);
    let answer = crate::on_own_thread("rein-reload", move || {
        let mut load = load.lock().unwrap_or_else(|e| e.into_inner());
        load()
    });
    Box::pin(async move {
        match answer.await {
            Ok(read) => read,
            Err(e) => {
                if let crate::ApartError::NotStarted(e) = e {
                    tracing::error!("reload: cannot start the thread that reads the configuration: {e}");
                }
                Err("the configuration could not be read (its reading thread ended)".into())
            }
        }
    })
}

/// One reload: apply the configuration read, `cfg`, log what changed, or the error once. Returns the
/// outcome in a line, for the service manager ([`crate::notify::ready`]): `Err` if it was refused.
async fn reload_config(
    registry: Arc<Registry>,
    cfg: ServerConfig,
    reloads: Arc<crate::reloads::Reloads>,
) -> Result<String, String> {
    match registry.reload(cfg).await {
        Ok(r) => Ok(r.log(&reloads)),
        Err(e) => Err(crate::reloads::reload_refused(&e)),
    }
}

/// A reload under way ([`reload_config`]): its outcome in a line, `Err` if it was refused.
type Applying = std::pin::Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;

/// Admission control at start: the reservations against the capacity (`capacity`, from the state file or
/// a probe, else the configuration's): refused under `admission = "refuse"`, a warning under `"warn"`.
fn admit(cfg: &ServerConfig, capacity: Option<&CapacityEntry>) -> Result<(), ServeError> {
    let (cap, source) = match capacity {
        Some(c) => (Some(c.iops), c.source),
        None => crate::live::config_capacity(cfg),
    };
    let shortfall = Shortfall::of(cfg.reserved(), cap).map(|s| match s {
        Shortfall::Above { .. } => format!("{s} ({})", source.name()),
        Shortfall::Unknown { .. } => {
            format!("{s}: set capacity_iops, probe_capacity_s or [device_model], or PUT /api/capacity once it runs")
        }
    });
    if let Some(msg) = shortfall {
        match cfg.admission {
            Admission::Refuse => return Err(ServeError::Admission(msg)),
            Admission::Warn => tracing::warn!("admission control: {msg}"),
        }
    }
    Ok(())
}

/// `rein serve --check-config`: what a start would refuse before it listens, without starting, locking,
/// creating or writing anything, so that it can run beside the server it is about to reload: the admin
/// endpoint's settings (its token file), the state file in `data_dir` applied over `cfg` as at start, the
/// exports as a whole ([`crate::preflight::check_exports`]) and each one's file
/// ([`crate::preflight::inspect_export`]: for a writable export, a block device the system holds or an
/// image a loop device is attached to too), and admission control. Returns a line per finding to print.
/// Not checked: binding the addresses (the running server holds them), what only an open for writing
/// tells (permissions, `O_DIRECT`), and a capacity that `probe_capacity_s` would measure (admission is
/// then checked against the state file's or the configuration's capacity, if any).
pub fn check_config(cfg: ServerConfig) -> Result<Vec<String>, ServeError> {
    crate::admin_guard::prepare(cfg.admin, &cfg.admin_access, crate::admin::POWERS)?;
    let mut lines = Vec::new();
    let saved = state::load(&cfg.data_dir)?;
    let over = state::overlay(&cfg, saved.as_ref().unwrap_or(&StateFile::default()));
    if saved.is_some() {
        let path = cfg.data_dir.join(state::STATE_FILE);
        lines.push(format!(
            "state file {}: {} applied over the file",
            path.display(),
            Count(over.notes.len(), "entry")
        ));
        lines.extend(over.notes.iter().map(|n| format!("  {n}")));
    }
    let eff = over.config;
    // A start binds it there and fails if the directory is missing (docs: "The directory must exist").
    if let Some(u) = &eff.listen_unix {
        if let Some(dir) = u.path.parent().filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
            return Err(ServeError::BindUnix(crate::sock::UnixBindError::NoDirectory {
                path: u.path.clone(),
                dir: dir.to_path_buf(),
            }));
        }
    }
    crate::preflight::check_exports(&eff.exports)?;
    if let Some(t) = &eff.tls {
        lines.extend(t.describe(crate::tls::unix_now()));
    }
    for e in &eff.exports {
        lines.push(crate::preflight::inspect_export(e, &eff.data_dir, |path| {
            state::server_holding(&eff.data_dir, path)
        })?);
    }
    let probe = eff.probe_capacity_s > 0.0 && eff.capacity_iops.is_none() && over.capacity.is_none();
    if probe {
        lines.push("capacity: probed at start (probe_capacity_s); admission is checked then".into());
    } else {
        admit(&eff, over.capacity.as_ref())?;
    }
    lines.extend(eff.warnings().into_iter().map(|w| format!("warning: {w}")));
    lines.push(format!(
        "{}, {}, scheduler {}, NBD on {}, admin on {}",
        Count(eff.tenants.len(), "tenant"),
        Count(eff.exports.len(), "export"),
        eff.scheduler,
        eff.listen,
        eff.admin
    ));
    Ok(lines)
}

/// Addresses the server actually listens on (useful with port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The NBD listener's address (the first TCP one, with several passed by a service manager; the
    /// unspecified `0.0.0.0:0` when NBD is on passed Unix sockets only).
    pub nbd: SocketAddr,
    /// The admin endpoint's address.
    pub admin: SocketAddr,
}

/// Reads the configuration file again (with the command line's overrides), for a reload.
pub type ConfigLoader = Box<dyn FnMut() -> Result<ServerConfig, String> + Send>;

/// Reloads on demand: each message on `requests` (SIGHUP in the binary, or a test) reads the
/// configuration with `load` and applies the difference ([`crate::live::Registry::reload`]). A file that
/// does not load or validate, or a change that cannot apply as a whole, leaves everything as it was and is
/// logged once. `load` runs on a thread of its own ([`read_apart`]), and so does the opening of the
/// storage of new or changed exports ([`crate::live::Registry::reload`]): the server accepts connections,
/// serves them, and stops on its signal while a file is read or opened (a hung network mount).
///
/// A request that comes while the configuration file is being read waits for that read, then reads the
/// file again. A configuration read while an earlier reload is still under way (opening its exports'
/// files) replaces it, the latest wins: the earlier one is dropped, and if it was still opening files
/// nothing of it is applied (its files, if they ever open, are closed, or taken by the newer one if it
/// needs them: a file has one open under way at most); if it was already applying, it completes and the
/// newer one applies after it. So an open that never returns does not hold up the reloads after it, nor
/// do they add threads stuck in it: the operator mends the file and sends SIGHUP again.
pub struct Reload {
    /// One message per reload.
    pub requests: tokio::sync::mpsc::Receiver<()>,
    /// Reads and validates the configuration.
    pub load: ConfigLoader,
}

/// Runs the server until `shutdown` resolves. `ready` gets the bound addresses once listening.
pub async fn run(
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()>,
    ready: Option<tokio::sync::oneshot::Sender<Bound>>,
) -> Result<(), ServeError> {
    run_with(cfg, shutdown, ready, None, crate::activation::Passed::none()).await
}

/// [`run`], reloading the configuration when `reload` asks.
///
/// At start: the data directory is created and locked ([`DirLock`]; a second server on it fails naming it
/// and the holder's pid); the state file is read and applied over `cfg` ([`crate::state`]), each entry
/// logged. A state file that cannot be read or parsed stops the start with an error naming it, rather than
/// being moved aside: starting without it would silently revert every change the operator made at run time
/// (the very failure it exists to prevent), and moving it aside would make the next start revert them for
/// good; the error says how to recover.
///
/// `passed`: the listening sockets a service manager passed ([`crate::activation`], roles
/// [`crate::activation::NBD`] and [`crate::activation::ADMIN`]), served in place of `listen` and
/// `listen_unix`, or of `admin`; [`crate::activation::Passed::none`] binds the configuration's.
pub async fn run_with(
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()>,
    ready: Option<tokio::sync::oneshot::Sender<Bound>>,
    reload: Option<Reload>,
    mut passed: crate::activation::Passed,
) -> Result<(), ServeError> {
    crate::stall::watch_process();
    let passed_nbd = passed.take(&crate::activation::NBD);
    let passed_admin = passed.take_one(&crate::activation::ADMIN);
    let passed_roles = (!passed_nbd.is_empty(), passed_admin.is_some());
    // A passed admin socket is judged by its own address (an exposed one needs the token).
    let admin_addr = match &passed_admin {
        Some(s) => s.tcp_addr().map_err(ServeError::Activation)?,
        None => cfg.admin,
    };
    let admin_token = crate::admin_guard::prepare(admin_addr, &cfg.admin_access, crate::admin::POWERS)?;
    std::fs::create_dir_all(&cfg.data_dir)
        .map_err(|source| ServeError::DataDir { path: cfg.data_dir.display().to_string(), source })?;
    let _lock = DirLock::acquire(&cfg.data_dir)?;
    let base = cfg;
    let (mut store, saved) = state::Store::open(&base.data_dir)?;
    let over = state::overlay(&base, saved.as_ref().unwrap_or(&StateFile::default()));
    if saved.is_some() {
        let path = base.data_dir.join(state::STATE_FILE);
        for n in &over.notes {
            tracing::info!(state_file = %path.display(), "{n}");
        }
        tracing::info!(state_file = %path.display(), entries = over.notes.len(), "applied the run-time changes kept in the state file");
    }
    let cfg = over.config;
    let mut capacity = over.capacity;
    let mut rewrite = over.pruned;
    let device = cfg.device.clone();
    let dcfg = DispatchConfig {
        scheduler: cfg.scheduler,
        sched: cfg.sched,
        depth: cfg.queue_depth,
        io_engine: cfg.io_engine,
        token: cfg.token,
        ..DispatchConfig::default()
    };
    crate::preflight::check_exports(&cfg.exports)?;
    let mut exports = Vec::with_capacity(cfg.exports.len());
    for e in &cfg.exports {
        exports.push(crate::preflight::open_export(e)?);
        if e.backend == BackendKind::Memory {
            tracing::warn!(
                export = %e.name,
                "export {} is in RAM: its data is lost when the server stops; FLUSH and FUA are not offered",
                e.name
            );
        }
    }
    // The probe measures the largest export; with none (the state file deleted every export at run time)
    // there is nothing to measure, and the server runs without a capacity, as without the probe.
    let probed = cfg.exports.iter().zip(&exports).max_by_key(|(_, s)| s.size());
    let probe_due = cfg.probe_capacity_s > 0.0 && cfg.capacity_iops.is_none() && capacity.is_none();
    if probe_due && probed.is_none() {
        tracing::warn!(
            "probe_capacity_s is set but there is no export to probe (the state file deleted them): the capacity \
             stays unknown (admission control as without a capacity) until a start with an export probes it"
        );
    }
    if let Some(biggest) = probed.filter(|_| probe_due) {
        let runs = std::time::Duration::from_secs_f64(cfg.probe_capacity_s) * crate::probe::STARTUP_RUNS as u32;
        crate::notify::extend_start(
            runs + std::time::Duration::from_secs(30),
            &format!("measuring the capacity (probe_capacity_s): {} s", runs.as_secs()),
        );
        let r = crate::probe::probe_export(biggest.0, biggest.1.clone(), device.clone(), &cfg)
            .await
            .map_err(|e| ServeError::Probe(e.to_string()))?;
        capacity = Some(CapacityEntry { iops: r.iops, source: CapacitySource::Probe, config: CapacityBase::of(&base) });
        rewrite = true;
    }
    admit(&cfg, capacity.as_ref())?;
    if rewrite {
        store.save(&state::diff(&base, &cfg, capacity))?;
    }
    let (dispatcher, dispatcher_done) = Dispatcher::spawn(device, dcfg);
    if let Some(c) = capacity.filter(|_| cfg.device.is_some()) {
        let _ = dispatcher.set_capacity(c.iops).await;
    }
    let mut tenant_ids: Vec<TenantId> = Vec::with_capacity(cfg.tenants.len());
    for t in &cfg.tenants {
        tenant_ids.push(dispatcher.add_tenant(t.spec).await?);
    }
    // Placement skew of the device model: validated to name configured tenants.
    for (name, scale) in cfg.device.iter().flat_map(|d| &d.service_scale) {
        if let Some(i) = cfg.tenants.iter().position(|t| &t.name == name) {
            dispatcher.set_service_scale(tenant_ids[i], *scale).await?;
        }
    }
    let storages = exports;
    let mut exports = Vec::with_capacity(cfg.exports.len());
    for (e, storage) in cfg.exports.iter().zip(storages) {
        exports.push(Arc::new(make_export(e, &cfg.tenants[e.tenant].name, tenant_ids[e.tenant], storage)));
    }
    let table = Arc::new(ExportTable::new(exports));
    let limits = ConnLimits::new(cfg.caps);
    let registry = Arc::new(Registry::new(
        dispatcher.clone(),
        base,
        cfg.clone(),
        tenant_ids,
        table.clone(),
        capacity,
        Some(store),
    ));
    registry.set_passed(passed_roles.0, passed_roles.1);
    let node_service =
        cfg.node.enabled.then(|| Arc::new(crate::node::NodeService::new(cfg.node.clone(), registry.clone())));
    let node = node_service.clone().map(|n| n as Arc<dyn crate::nbd::NodeGate>);
    let policy = Arc::new(Policy {
        tls: registry.tls(),
        default_export: cfg.default_export.map(|i| cfg.exports[i].name.clone()),
        cap_tenants: true,
        limits: limits.clone(),
        node,
    });
    let ctx = Arc::new(NbdContext {
        exports: table.clone(),
        dispatcher: Some(dispatcher.clone()),
        max_payload: cfg.max_request.min(u32::MAX as u64) as u32,
        limits: Limits {
            budget: Budget::new(cfg.max_inflight, cfg.max_inflight_per_tenant),
            idle_timeout: cfg.idle_timeout,
            stall_timeout: cfg.stall_timeout,
            handshake_timeout: crate::nbd::HANDSHAKE_TIMEOUT,
            ..Limits::default()
        },
    });
    let nbd = crate::sock::NbdListeners::open(cfg.listen, cfg.listen_unix.as_ref(), passed_nbd).await?;
    let admin_l = match passed_admin {
        Some(s) => {
            s.log_use("the admin endpoint", &format!("admin = {}", cfg.admin));
            s.into_tcp().map_err(ServeError::Activation)?
        }
        None => crate::sock::bind_tcp(cfg.admin).map_err(|source| ServeError::Bind { addr: cfg.admin, source })?,
    };
    let bound = Bound {
        nbd: nbd.tcp_addr().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
        admin: admin_l.local_addr().expect("bound"),
    };
    for w in cfg.warnings() {
        tracing::warn!("{w}");
    }
    let data_dir = std::path::absolute(&cfg.data_dir).unwrap_or_else(|_| cfg.data_dir.clone());
    tracing::info!(nbd = %nbd.tcp_shown(), nbd_unix = %nbd.unix_shown(), admin = %bound.admin, admin_https = cfg.admin_tls.is_some(), scheduler = %cfg.scheduler, exports = cfg.exports.len(), data_dir = %data_dir.display(), "rein serve listening");
    if let Some(w) = cfg.tls.as_ref().and_then(|t| t.expiry_warning(crate::tls::unix_now())) {
        tracing::warn!("{w}");
    }
    crate::notify::ready(&format!(
        "listening: NBD on {}, admin on {}, {}",
        nbd.shown(),
        bound.admin,
        Count(cfg.exports.len(), "export")
    ));
    let mut watchdog = crate::notify::Watchdog::from_env();
    let reloads = Arc::new(crate::reloads::Reloads::new("serve"));
    let pshift_link = cfg.pshift.as_ref().map(|p| Arc::new(crate::pshift_link::LinkStatus::new(p)));
    let admin_state = AdminState {
        registry: registry.clone(),
        reloads: reloads.clone(),
        connections: limits.clone(),
        node: node_service,
        pshift_link: pshift_link.clone(),
        admin_accepts: Arc::default(),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut admin_stop = stop_rx.clone();
    let admin_l = crate::admin_guard::CappedListener::new(
        admin_l,
        &cfg.admin_access,
        registry.admin_tls(),
        admin_state.admin_accepts.clone(),
    );
    let admin_router = crate::admin_guard::protect(admin::router(admin_state), admin_token);
    let admin_task = tokio::spawn(async move {
        let _ = axum::serve(admin_l, admin_router)
            .with_graceful_shutdown(async move {
                let _ = admin_stop.wait_for(|s| *s).await;
            })
            .await;
    });
    // A pShift server reports to its controller until the server stops (the link holds a dispatcher handle).
    if let (Some(p), Some(status)) = (cfg.pshift.clone(), pshift_link) {
        let reg = registry.clone();
        let tenants = move || reg.tenants().to_vec();
        tokio::spawn(crate::pshift_link::run(p, dispatcher.clone(), tenants, stop_rx.clone(), status));
    }
    if let Some(r) = ready {
        let _ = r.send(bound);
    }
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    let (mut reload_rx, load) = match reload {
        Some(r) => (Some(r.requests), Some(Arc::new(std::sync::Mutex::new(r.load)))),
        None => (None, None),
    };
    // The read of the configuration file of a reload under way ([`read_apart`]).
    let mut reading = None;
    // The reload of the configuration last read, while it opens its exports' storage and applies
    // ([`Reload`]: a newer one replaces it).
    // Its outcome, for the service manager's READY=1 once no reload is under way ([`crate::notify`]).
    let mut applying: Option<Applying> = None;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(()) = async { reload_rx.as_mut().expect("guarded").recv().await }, if reload_rx.is_some() && reading.is_none() => {
                crate::notify::reloading();
                reading = Some(read_apart(load.as_ref().expect("with reload_rx")));
            }
            read = async { reading.as_mut().expect("guarded").await }, if reading.is_some() => {
                reading = None;
                match read {
                    Ok(cfg) => {
                        if applying.is_some() {
                            tracing::warn!("reload: a newer reload replaces the one still under way (nothing of that one is applied if it was still opening its exports' files)");
                        }
                        applying = Some(Box::pin(reload_config(registry.clone(), cfg, reloads.clone())));
                    }
                    Err(e) => {
                        tracing::error!("reload: {e}; the running configuration is unchanged");
                        reloads.record(false);
                        if applying.is_none() {
                            crate::notify::ready(&crate::reloads::reload_failed_status(&e));
                        }
                    }
                }
            }
            outcome = async { applying.as_mut().expect("guarded").await }, if applying.is_some() => {
                applying = None;
                // An applied one was recorded with its settings left for a restart (`ReloadReport::log`).
                if outcome.is_err() {
                    reloads.record(false);
                }
                if reading.is_none() {
                    crate::notify::ready(outcome.as_ref().unwrap_or_else(|e| e));
                }
            }
            () = watchdog.tick() => watchdog.ping(),
            acc = nbd.accept() => spawn_accepted(acc, &mut tasks, &ctx, &policy, &stop_rx).await,
        }
    }
    crate::notify::stopping();
    if reading.is_some() {
        tracing::warn!("stopping: the configuration file is still being read for a reload; that reload is abandoned");
    }
    if applying.take().is_some() {
        tracing::warn!("stopping: a reload is still under way; it is abandoned (nothing of it is applied if it was still opening its exports' files)");
    }
    // Told first, logged after: a request a client sends once it sees the line is refused (ESHUTDOWN).
    let _ = stop_tx.send(true);
    // Connections that ended since the last accept are still in the set: not counted as open.
    while tasks.try_join_next().is_some() {}
    tracing::info!(
        connections = tasks.len(),
        deadline_s = cfg.shutdown_timeout.as_secs_f64(),
        "shutting down: answering the requests in flight"
    );
    // The Unix socket's file goes with its listener.
    drop(nbd);
    let drained =
        tokio::time::timeout(cfg.shutdown_timeout, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        let failed = dispatcher.abort_queued().await;
        tracing::warn!(
            connections = tasks.len(),
            failed_requests = failed,
            "shutdown deadline passed: queued requests answered with ESHUTDOWN, closing connections"
        );
        let cut = crate::nbd::close_connections(&mut tasks, &ctx.limits).await;
        if cut > 0 {
            tracing::warn!(connections = cut, "connections still running after the close: cut");
        }
    }
    // The admin endpoint closed its listener at once; its open connections get a moment, not more.
    let admin_abort = admin_task.abort_handle();
    if tokio::time::timeout(crate::nbd::CLOSE_GRACE, admin_task).await.is_err() {
        admin_abort.abort();
    }
    // A change stuck in an open of its file (POST /api/exports on a hung mount) would hold the registry,
    // hence the dispatcher, for as long as the open takes.
    let abandoned = registry.abandon_changes();
    if abandoned > 0 {
        tracing::warn!(changes = abandoned, "stopping: changes still under way are abandoned");
    }
    drop(ctx);
    // The policy's [node] service holds the registry, hence a dispatcher handle: dropped too, or the
    // dispatcher never ends and a storage node never exits.
    drop(policy);
    drop(registry);
    drop(dispatcher);
    let _ = dispatcher_done.await;
    tracing::info!("stopped");
    Ok(())
}
