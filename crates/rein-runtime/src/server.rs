//! `rein serve`: build the exports, the dispatcher and the listeners from a [`ServerConfig`], serve until
//! shutdown, then drain.
//!
//! Shutdown (SIGINT/SIGTERM in the binary, or the future passed to [`run`]): stop accepting; every
//! connection stops reading new requests, answers the ones in flight and closes; the dispatcher finishes
//! what it has queued; then `run` returns. Data written and acknowledged with FLUSH or FUA is on stable
//! storage (fdatasync) before its reply. All that has a deadline, `shutdown_timeout`: once it has passed,
//! the requests still queued are answered with ESHUTDOWN ([`crate::Dispatcher::abort_queued`]), each
//! connection gets [`crate::nbd::CLOSE_GRACE`] to write the replies that are ready and is then cut (a
//! client that does not read its replies, or sends half a WRITE, holds nothing up), and `run` returns once
//! the requests already at the backend have completed.

use crate::admin::{self, AdminState};
use crate::budget::Budget;
use crate::config::{Admission, BackendKind, ServerConfig};
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::nbd::{serve_connection, Export, Limits, NbdContext};
use crate::probe::{probe, ProbeConfig};
use crate::storage::{FileStorage, MemStorage, Storage};
use rein_core::TenantId;
use rein_proto::nbd::ExportInfo;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Largest number of simultaneous NBD connections; more are accepted and closed at once.
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
    /// An export's storage could not be opened or created.
    #[error("export {name}: {source}")]
    Export {
        /// The export.
        name: String,
        /// The storage's error.
        source: crate::storage::StorageError,
    },
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
    /// The dispatcher refused a configured tenant (too many tenants) or stopped.
    #[error("dispatcher: {0}")]
    Dispatcher(#[from] crate::dispatch::IoError),
    /// The start-up capacity probe (`probe_capacity_s`) failed; the message is its error.
    #[error("capacity probe failed: {0}")]
    Probe(String),
}

/// Opens (creating file exports that do not exist yet) an export's storage.
pub fn open_export(e: &crate::config::ExportConfig) -> Result<Arc<dyn Storage>, ServeError> {
    Ok(match &e.backend {
        BackendKind::File { path } => Arc::new(
            FileStorage::open_with(path, Some(e.size), e.read_only, e.direct)
                .map_err(|source| ServeError::Export { name: e.name.clone(), source })?,
        ),
        BackendKind::Memory => Arc::new(MemStorage::new(e.size)),
    })
}

/// Addresses the server actually listens on (useful with port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The NBD listener's address.
    pub nbd: SocketAddr,
    /// The admin endpoint's address.
    pub admin: SocketAddr,
}

/// Runs the server until `shutdown` resolves. `ready` gets the bound addresses once listening.
pub async fn run(
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()>,
    ready: Option<tokio::sync::oneshot::Sender<Bound>>,
) -> Result<(), ServeError> {
    std::fs::create_dir_all(&cfg.data_dir)
        .map_err(|source| ServeError::DataDir { path: cfg.data_dir.display().to_string(), source })?;
    let device = cfg.device.clone();
    let dcfg = DispatchConfig {
        scheduler: cfg.scheduler,
        sched: cfg.sched,
        depth: cfg.queue_depth,
        io_engine: cfg.io_engine,
        ..DispatchConfig::default()
    };
    let mut exports = Vec::with_capacity(cfg.exports.len());
    for e in &cfg.exports {
        exports.push(open_export(e)?);
    }
    let mut cfg = cfg;
    if cfg.probe_capacity_s > 0.0 && cfg.capacity_iops.is_none() {
        // Measure the largest export through a dispatcher like the server's own, before serving.
        let biggest = exports.iter().max_by_key(|s| s.size()).expect("at least one export").clone();
        let pc = ProbeConfig {
            seconds: cfg.probe_capacity_s,
            depth: cfg.queue_depth,
            io_engine: cfg.io_engine,
            ..ProbeConfig::default()
        };
        let r = probe(biggest, device.clone(), &pc).await.map_err(|e| ServeError::Probe(e.to_string()))?;
        tracing::info!(
            iops = r.iops.round(),
            p99_ms = r.latency_p99_ms,
            "capacity probe: using the measured capacity for admission control"
        );
        cfg.capacity_iops = Some(r.iops);
    }
    let (dispatcher, dispatcher_done) = Dispatcher::spawn(device, dcfg);
    if let Err(msg) = cfg.admission_check(cfg.tenants.iter().map(|t| t.spec)) {
        match cfg.admission {
            Admission::Refuse => return Err(ServeError::Admission(msg)),
            Admission::Warn => tracing::warn!("admission control: {msg}"),
        }
    }
    let mut tenant_ids: Vec<TenantId> = Vec::with_capacity(cfg.tenants.len());
    for t in &cfg.tenants {
        tenant_ids.push(dispatcher.add_tenant(t.spec).await?);
    }
    let storages = exports;
    let mut exports = Vec::with_capacity(cfg.exports.len());
    for (e, storage) in cfg.exports.iter().zip(storages) {
        let size = storage.size();
        exports.push(Export {
            info: ExportInfo {
                name: e.name.clone(),
                description: format!("tenant {}", cfg.tenants[e.tenant].name),
                size,
                read_only: e.read_only,
            },
            storage,
            tenant: tenant_ids[e.tenant],
        });
    }
    let ctx = Arc::new(NbdContext {
        exports,
        dispatcher: dispatcher.clone(),
        max_payload: cfg.max_request.min(u32::MAX as u64) as u32,
        limits: Limits {
            budget: Budget::new(cfg.max_inflight, cfg.max_inflight_per_tenant),
            idle_timeout: cfg.idle_timeout,
            close: watch::channel(false).0,
        },
    });
    let nbd = TcpListener::bind(cfg.listen).await.map_err(|source| ServeError::Bind { addr: cfg.listen, source })?;
    let admin_l = TcpListener::bind(cfg.admin).await.map_err(|source| ServeError::Bind { addr: cfg.admin, source })?;
    let bound = Bound { nbd: nbd.local_addr().expect("bound"), admin: admin_l.local_addr().expect("bound") };
    tracing::info!(nbd = %bound.nbd, admin = %bound.admin, scheduler = %cfg.scheduler, exports = cfg.exports.len(), "rein serve listening");
    let admin_state = AdminState {
        dispatcher: dispatcher.clone(),
        tenants: Arc::new(cfg.tenants.iter().zip(&tenant_ids).map(|(t, id)| (t.name.clone(), *id)).collect()),
        admission: cfg.admission,
        capacity_iops: cfg.capacity_iops,
        changes: Default::default(),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut admin_stop = stop_rx.clone();
    let admin_task = tokio::spawn(async move {
        let _ = axum::serve(admin_l, admin::router(admin_state))
            .with_graceful_shutdown(async move {
                let _ = admin_stop.wait_for(|s| *s).await;
            })
            .await;
    });
    if let Some(r) = ready {
        let _ = r.send(bound);
    }
    let conns = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            acc = nbd.accept() => {
                let (stream, peer) = match acc {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Ok(permit) = conns.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, "connection limit {MAX_CONNECTIONS} reached; closing");
                    continue;
                };
                let (ctx, stop) = (ctx.clone(), stop_rx.clone());
                tasks.spawn(async move {
                    // serve_connection logs how the connection ended, error included.
                    let _ = serve_connection(stream, ctx, stop).await;
                    drop(permit);
                });
                // Reap finished connection tasks so the set does not grow.
                while tasks.try_join_next().is_some() {}
            }
        }
    }
    tracing::info!(
        connections = tasks.len(),
        deadline_s = cfg.shutdown_timeout.as_secs_f64(),
        "shutting down: answering the requests in flight"
    );
    let _ = stop_tx.send(true);
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
        ctx.limits.close.send_replace(true);
        while tasks.join_next().await.is_some() {}
    }
    // The admin endpoint closed its listener at once; its open connections get a moment, not more.
    let admin_abort = admin_task.abort_handle();
    if tokio::time::timeout(crate::nbd::CLOSE_GRACE, admin_task).await.is_err() {
        admin_abort.abort();
    }
    drop(ctx);
    drop(dispatcher);
    let _ = dispatcher_done.await;
    tracing::info!("stopped");
    Ok(())
}
