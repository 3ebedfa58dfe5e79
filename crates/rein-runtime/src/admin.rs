//! The admin HTTP endpoint (default 127.0.0.1:9180).
//!
//! - `GET /metrics`: Prometheus text format. Per tenant: completions by phase, bytes, errors, a latency
//!   histogram, queued requests, and the spec; per backend: outstanding IOs, queue depth, busy seconds,
//!   modelled capacity; with `[pshift]`, whether the link to the controller is up
//!   (`rein_pshift_controller_connected`, [`crate::pshift_link::LinkStatus`]).
//! - `GET /api/tenants`: the tenants as JSON (spec and counters).
//! - `PUT /api/tenants/{name}`: change a tenant's spec at run time. The body is
//!   `{"reservation": 250, "limit": 1000, "weight": 2, "idle_credit": 0}` (omitted fields keep their value;
//!   `"limit": null` removes the limit). Invalid values get 400 with the reason; reservations above the
//!   reservable capacity get 409 (admission = refuse) or are applied with a warning (admission = warn).
//! - `POST /api/tenants`: add a tenant: `{"name": "new", "reservation": 100, "limit": null, "weight": 1,
//!   "idle_credit": 0}` (omitted: reservation 0, no limit, weight 1). 201; 400 for an invalid spec or a
//!   name that is empty or longer than 256 bytes; 409 when the name exists or admission refuses.
//! - `DELETE /api/tenants/{name}`: 204; 404 unknown; 409 while an export (or an open connection to a
//!   deleted export) uses it.
//! - `GET /api/exports`: the exports as JSON (name, tenant, size, read_only).
//! - `POST /api/exports`: add an export, visible to new connections at once: `{"name": "x", "backend":
//!   "file", "path": "x.img", "size_mb": 64, "tenant": "rd", "read_only": false, "direct": false}`
//!   (backend file by default; path relative to the data directory, default `<name>.img`, no `..`; the file
//!   is created only when `size_mb` is given, and never for a read-only export; a memory export without it has rein.toml's default,
//!   [`crate::config::DEFAULT_MEMORY_MB`]; tenant defaults to the export's name and must exist). 201; 400
//!   for bad fields; 404 for an unknown tenant; 409 when the name exists; 500 when the storage cannot be
//!   opened.
//! - `DELETE /api/exports/{name}`: 204: new connections no longer list or open it; open ones continue.
//! - `GET /api/capacity`: `{"iops": 5000, "source": "config", "reserved_iops": 500, "admission": "refuse",
//!   "device_model_iops": null}`: the capacity admission uses and where it came from (config,
//!   device_model, probe, admin or none).
//! - `GET /api/device`: `{"busy_s": 12.5, "outstanding": 3, "depth": 32, "capacity_iops": 1200.0}`: the
//!   time the device has been busy since the server started (a device model's busy periods, on its own
//!   time, as the simulator's utilisation; without one, the time with an IO outstanding at the backend),
//!   the IOs outstanding and the queue depth now, and the modelled capacity (`null` without a model).
//!   `rein load` and `rein cluster run` read it each interval for each server's utilisation.
//! - `PUT /api/capacity`: `{"iops": 600}` sets the capacity admission uses (and a device model's
//!   capacity, until its schedule's next step). 400 when not positive and finite; below the reservations'
//!   sum: 409 (refuse) or applied with a warning (warn).
//!
//! Every change is serialised, persisted in the state file and then applied ([`crate::live`]); a change
//! that cannot be persisted gets 500 and is not applied.

use crate::dispatch::LATENCY_BUCKETS_S;
use crate::live::{ChangeError, Registry};
use crate::prom::label;
use crate::state::ExportJson;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, put};
use axum::{Json, Router};
use rein_core::{Phase, QosSpec, TenantId};
use serde::{Deserialize, Serialize};
use std::fmt::Write;
use std::sync::Arc;

/// What this admin API controls, as the refusal of an address without a token says it.
pub const POWERS: crate::admin_guard::Powers = crate::admin_guard::Powers("change every tenant's QoS");

/// What the admin endpoint needs to know: the server's live state ([`Registry`]), which also serialises
/// every change (validation, admission, persistence and apply as one step, [`crate::live`]).
#[derive(Clone)]
pub struct AdminState {
    /// Tenants, exports and capacity, and their change lock.
    pub registry: Arc<Registry>,
    /// The build, the start and what the reloads came to, for `/metrics`.
    pub reloads: Arc<crate::reloads::Reloads>,
    /// The NBD connections and their caps, for `/metrics` ([`crate::access::ConnLimits::metrics`]).
    pub connections: Arc<crate::access::ConnLimits>,
    /// The storage-node protocol's service (`[node] enabled`), for `/metrics`.
    pub node: Option<Arc<crate::node::NodeService>>,
    /// A pShift server's link to its controller (`[pshift]` with `controller`), for `/metrics`.
    pub pshift_link: Option<Arc<crate::pshift_link::LinkStatus>>,
    /// The admin listener's failed accepts, for `/metrics`.
    pub admin_accepts: Arc<crate::access::AcceptPacing>,
}

/// The admin endpoint's routes (module comment) over `state`, ready for `axum::serve`.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/api/tenants", get(list).post(create_tenant))
        .route("/api/tenants/{name}", put(update).get(one).delete(delete_tenant))
        .route("/api/capacity", put(capacity).get(get_capacity))
        .route("/api/device", get(device))
        .route("/api/exports", get(list_exports).post(create_export))
        .route("/api/exports/{name}", delete(delete_export))
        .with_state(state)
}

fn change_err(e: ChangeError) -> Response {
    let code = match &e {
        ChangeError::NotFound(_) => StatusCode::NOT_FOUND,
        ChangeError::Invalid(_) => StatusCode::BAD_REQUEST,
        ChangeError::Conflict(_) => StatusCode::CONFLICT,
        ChangeError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        ChangeError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    err(code, e.to_string())
}

fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

/// The device as `GET /api/device` reports it (and `rein load` reads it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceJson {
    /// Seconds the device has been busy since the server started ([`crate::dispatch::Snapshot::busy_ns`]).
    pub busy_s: f64,
    /// IOs outstanding at the backend now.
    pub outstanding: usize,
    /// The most IOs outstanding at once (`queue_depth`).
    pub depth: usize,
    /// The modelled device's capacity (IOPS); `null` without a device model.
    pub capacity_iops: Option<f64>,
}

/// A tenant as `GET /api/tenants` reports it (and `rein load` reads it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TenantJson {
    /// Its name.
    pub name: String,
    /// Reservation (IOPS or cost units per second).
    pub reservation: f64,
    /// Limit; `null` when unlimited.
    pub limit: Option<f64>,
    /// Weight.
    pub weight: f64,
    /// Idle credit.
    pub idle_credit: u32,
    /// Completions.
    pub completed: u64,
    /// Completions served in the reservation phase.
    pub completed_reservation_phase: u64,
    /// Completions served in the weight phase, including any above the limit.
    pub completed_weight_phase: u64,
    /// Completions served above the limit (a limit mode that breaks limits when the device idles).
    #[serde(default)]
    pub completed_over_limit_phase: u64,
    /// Bytes transferred.
    pub bytes: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Requests waiting in the scheduler.
    pub queued: usize,
    /// Mean latency (ms).
    pub latency_mean_ms: f64,
    /// Completions in the last whole second.
    pub iops_last_s: f64,
    /// Seconds backlogged yet served below the reservation.
    pub below_reservation_s: u64,
}

impl TenantJson {
    /// The spec these fields describe.
    pub fn spec(&self) -> Result<QosSpec, rein_core::SpecError> {
        QosSpec::new(self.reservation, self.limit, self.weight, self.idle_credit)
    }
}

/// Each of the registry's tenants `names` with its part of the dispatcher's `snap`, in the registry's order.
fn with_counters<'a>(
    names: &'a [(String, TenantId)],
    snap: &'a crate::dispatch::Snapshot,
) -> Vec<(&'a str, &'a crate::dispatch::TenantSnapshot)> {
    let by_id = snap.by_id();
    names.iter().filter_map(|(n, id)| by_id.get(id).map(|t| (n.as_str(), *t))).collect()
}

/// The tenants as `GET /api/tenants` lists them; `only`: the one of that name alone (a snapshot of it
/// alone).
async fn tenants_json(s: &AdminState, only: Option<&str>) -> Result<Vec<TenantJson>, Response> {
    let all = s.registry.tenants();
    let d = s.registry.dispatcher();
    let one: Vec<(String, TenantId)>;
    let (names, snap): (&[(String, TenantId)], _) = match only {
        Some(name) => {
            one = all.id(name).map(|id| (name.to_string(), id)).into_iter().collect();
            (&one, d.snapshot_of(one.iter().map(|t| t.1).collect()).await)
        }
        None => (&all, d.snapshot().await),
    };
    let snap = snap.map_err(|e| err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(with_counters(names, &snap)
        .into_iter()
        .map(|(name, t)| {
            let done: u64 = t.counters.completed.iter().sum();
            TenantJson {
                name: name.to_string(),
                reservation: t.spec.reservation(),
                limit: t.spec.limit(),
                weight: t.spec.weight(),
                idle_credit: t.spec.idle_credit(),
                completed: done,
                completed_reservation_phase: t.counters.completed[Phase::Reservation.index()],
                completed_weight_phase: t.counters.completed[Phase::Weight.index()]
                    + t.counters.completed[Phase::OverLimit.index()],
                completed_over_limit_phase: t.counters.completed[Phase::OverLimit.index()],
                bytes: t.counters.bytes,
                errors: t.counters.errors,
                queued: t.sched.queued,
                latency_mean_ms: if done > 0 { t.counters.latency_sum_ns as f64 / done as f64 / 1e6 } else { 0.0 },
                iops_last_s: t.counters.iops_last_s,
                below_reservation_s: t.counters.below_reservation_s(),
            }
        })
        .collect())
}

async fn list(State(s): State<AdminState>) -> Response {
    match tenants_json(&s, None).await {
        Ok(v) => Json(v).into_response(),
        Err(r) => r,
    }
}

async fn one(State(s): State<AdminState>, Path(name): Path<String>) -> Response {
    match tenants_json(&s, Some(&name)).await {
        Ok(v) => match v.into_iter().next() {
            Some(t) => Json(t).into_response(),
            None => err(StatusCode::NOT_FOUND, format!("no tenant named {name:?}")),
        },
        Err(r) => r,
    }
}

/// The body of `PUT /api/tenants/{name}` (module comment); [`crate::harness::admin_bodies`] fuzzes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SpecUpdate {
    reservation: Option<f64>,
    #[serde(default, with = "double_option")]
    limit: Option<Option<f64>>,
    weight: Option<f64>,
    idle_credit: Option<u32>,
}

impl SpecUpdate {
    /// The spec this update makes of `current`: omitted fields keep their value.
    pub(crate) fn apply(&self, current: QosSpec) -> Result<QosSpec, rein_core::SpecError> {
        QosSpec::new(
            self.reservation.unwrap_or(current.reservation()),
            self.limit.unwrap_or(current.limit()),
            self.weight.unwrap_or(current.weight()),
            self.idle_credit.unwrap_or(current.idle_credit()),
        )
    }
}

/// Distinguishes a missing `limit` (keep) from `"limit": null` (remove).
mod double_option {
    use serde::{Deserialize, Deserializer};
    /// A present field, `null` or not: `Some(value)`; serde's `default` gives `None` when it is missing.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<f64>>, D::Error> {
        Ok(Some(Option::deserialize(d)?))
    }
}

async fn update(State(s): State<AdminState>, Path(name): Path<String>, body: axum::body::Bytes) -> Response {
    let upd: SpecUpdate = match serde_json::from_slice(&body) {
        Ok(u) => u,
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("bad JSON body: {e}")),
    };
    // Read, validate, admit, persist and apply under one lock (`Registry`).
    let r = s.registry.update_spec(&name, |cur| upd.apply(cur).map_err(|e| e.to_string())).await;
    match r {
        Ok((spec, warning)) => spec_answer(&name, spec, warning),
        Err(e) => change_err(e),
    }
}

fn spec_answer(name: &str, spec: QosSpec, warning: Option<String>) -> Response {
    Json(serde_json::json!({
        "name": name, "reservation": spec.reservation(), "limit": spec.limit(), "weight": spec.weight(),
        "idle_credit": spec.idle_credit(), "warning": warning,
    }))
    .into_response()
}

/// `POST /api/tenants`: a name and a spec (omitted fields: reservation 0, no limit, weight 1, idle credit 0).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTenant {
    name: String,
    #[serde(default)]
    reservation: f64,
    limit: Option<f64>,
    #[serde(default = "weight_one")]
    weight: f64,
    #[serde(default)]
    idle_credit: u32,
}

fn weight_one() -> f64 {
    1.0
}

/// The body of `POST /api/tenants` decoded and its spec validated, as the endpoint does before
/// [`Registry::add_tenant`] (which checks the name); the error is the 400 answer's message.
/// [`crate::harness::admin_create`] fuzzes it.
pub(crate) fn new_tenant(body: &[u8]) -> Result<(String, QosSpec), BodyError> {
    let t: NewTenant = serde_json::from_slice(body).map_err(BodyError::Json)?;
    let spec = QosSpec::new(t.reservation, t.limit, t.weight, t.idle_credit)
        .map_err(|error| BodyError::Spec { name: t.name.clone(), error })?;
    Ok((t.name, spec))
}

/// Why the body of `POST /api/tenants` or `POST /api/exports` is refused before the registry sees it: the
/// 400 answer's message.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// Not JSON of the route's schema (an unknown field, a wrong type, a missing name).
    #[error("bad JSON body: {0}")]
    Json(#[source] serde_json::Error),
    /// A tenant's spec is refused (reservation above limit, a weight not positive, ...).
    #[error("invalid spec for {name}: {error}")]
    Spec {
        /// The tenant's name.
        name: String,
        /// Why the spec is refused.
        #[source]
        error: rein_core::SpecError,
    },
}

async fn create_tenant(State(s): State<AdminState>, body: axum::body::Bytes) -> Response {
    let (name, spec) = match new_tenant(&body) {
        Ok(t) => t,
        Err(e) => return err(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match s.registry.add_tenant(&name, spec).await {
        Ok(warning) => (StatusCode::CREATED, spec_answer(&name, spec, warning)).into_response(),
        Err(e) => change_err(e),
    }
}

async fn delete_tenant(State(s): State<AdminState>, Path(name): Path<String>) -> Response {
    match s.registry.remove_tenant(&name).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => change_err(e),
    }
}

/// An export as `GET /api/exports` reports it.
#[derive(Serialize)]
struct ExportListed {
    name: String,
    tenant: String,
    size: u64,
    read_only: bool,
}

async fn list_exports(State(s): State<AdminState>) -> Response {
    let v: Vec<ExportListed> = s
        .registry
        .exports()
        .snapshot()
        .iter()
        .map(|e| ExportListed {
            name: e.info.name.clone(),
            tenant: e.tenant_name.clone(),
            size: e.info.size,
            read_only: e.info.read_only,
        })
        .collect();
    Json(v).into_response()
}

/// The body of `POST /api/exports` decoded, as the endpoint does before [`Registry::add_export`] (which
/// validates it with [`ExportJson::to_config`]); the error is the 400 answer's message.
/// [`crate::harness::admin_create`] fuzzes it.
pub(crate) fn new_export(body: &[u8]) -> Result<ExportJson, BodyError> {
    // The same fields and defaults as an `[[exports]]` entry of rein.toml.
    let n: crate::config::ExportFile = serde_json::from_slice(body).map_err(BodyError::Json)?;
    Ok(ExportJson {
        tenant: n.tenant.unwrap_or_else(|| n.name.clone()),
        name: n.name,
        backend: n.backend,
        path: n.path.map(std::path::PathBuf::from),
        size_mb: n.size_mb,
        read_only: n.read_only,
        direct: n.direct,
        readahead: n.readahead,
        allow_networks: n.allow_networks,
        allow_identities: n.allow_identities,
    })
}

async fn create_export(State(s): State<AdminState>, body: axum::body::Bytes) -> Response {
    let j = match new_export(&body) {
        Ok(j) => j,
        Err(e) => return err(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match s.registry.add_export(j).await {
        Ok(()) => (StatusCode::CREATED, Json(serde_json::json!({ "created": true }))).into_response(),
        Err(e) => change_err(e),
    }
}

async fn delete_export(State(s): State<AdminState>, Path(name): Path<String>) -> Response {
    match s.registry.remove_export(&name).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => change_err(e),
    }
}

/// The body of `PUT /api/capacity`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CapacityBody {
    pub(crate) iops: f64,
}

async fn capacity(State(s): State<AdminState>, body: axum::body::Bytes) -> Response {
    let b: CapacityBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("bad JSON body: {e}")),
    };
    match s.registry.set_capacity(b.iops).await {
        Ok(warning) => Json(serde_json::json!({ "iops": b.iops, "warning": warning })).into_response(),
        Err(e) => change_err(e),
    }
}

async fn device(State(s): State<AdminState>) -> Response {
    match s.registry.dispatcher().snapshot().await {
        Ok(x) => Json(DeviceJson {
            busy_s: x.busy_ns as f64 / 1e9,
            outstanding: x.outstanding,
            depth: x.depth,
            capacity_iops: x.capacity_iops,
        })
        .into_response(),
        Err(e) => err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn get_capacity(State(s): State<AdminState>) -> Response {
    match s.registry.capacity().await {
        Ok(c) => Json(c).into_response(),
        Err(e) => change_err(e),
    }
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let snap = match s.registry.dispatcher().snapshot().await {
        Ok(x) => x,
        Err(e) => return err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let names = s.registry.tenants();
    // Each tenant with its counters, found by id once (a scan per tenant and metric made a scrape of N
    // tenants cost 12 N^2 / 2 comparisons).
    let tenants = with_counters(&names, &snap);
    let mut o = String::new();
    let _ = writeln!(o, "# HELP rein_tenant_completed_total IOs completed, by scheduling phase.\n# TYPE rein_tenant_completed_total counter");
    for (name, t) in &tenants {
        for p in Phase::ALL {
            let _ = writeln!(
                o,
                "rein_tenant_completed_total{{tenant=\"{}\",phase=\"{}\"}} {}",
                label(name),
                p.name(),
                t.counters.completed[p.index()]
            );
        }
    }
    let mut gauge = |metric: &str, help: &str, kind: &str, f: &dyn Fn(&crate::dispatch::TenantSnapshot) -> f64| {
        let _ = writeln!(o, "# HELP {metric} {help}\n# TYPE {metric} {kind}");
        for (name, t) in &tenants {
            let _ = writeln!(o, "{metric}{{tenant=\"{}\"}} {}", label(name), f(t));
        }
    };
    gauge("rein_tenant_bytes_total", "Bytes transferred.", "counter", &|t| t.counters.bytes as f64);
    gauge("rein_tenant_errors_total", "Requests answered with an error.", "counter", &|t| t.counters.errors as f64);
    gauge(
        "rein_tenant_abandoned_total",
        "Requests not run: their client's connection broke before their turn.",
        "counter",
        &|t| t.counters.abandoned as f64,
    );
    gauge(
        "rein_tenant_enqueued_total",
        "Requests the scheduler took for the tenant (served since, or queued now): with the completions, what it asked against what it got.",
        "counter",
        &|t| t.sched.enqueued as f64,
    );
    gauge("rein_tenant_queued", "Requests waiting in the scheduler.", "gauge", &|t| t.sched.queued as f64);
    gauge("rein_tenant_reservation_iops", "Configured reservation.", "gauge", &|t| t.spec.reservation());
    gauge("rein_tenant_limit_iops", "Configured limit (+Inf when unlimited).", "gauge", &|t| t.spec.limit_or_inf());
    gauge("rein_tenant_weight", "Configured weight.", "gauge", &|t| t.spec.weight());
    gauge("rein_tenant_iops", "IOs completed in the last whole second.", "gauge", &|t| t.counters.iops_last_s);
    gauge(
        "rein_tenant_below_reservation_seconds_total",
        "Seconds in which the tenant was backlogged yet served below its reservation (on a storage node, below this node's part of it).",
        "counter",
        &|t| t.counters.below_reservation_s() as f64,
    );
    let _ = writeln!(o, "# HELP rein_tenant_latency_seconds Request latency from arrival at the scheduler to completion.\n# TYPE rein_tenant_latency_seconds histogram");
    for (name, t) in &tenants {
        histogram(
            &mut o,
            "rein_tenant_latency_seconds",
            &format!("tenant=\"{}\"", label(name)),
            &t.counters.latency_buckets,
            t.counters.latency_sum_ns,
        );
    }
    let _ = writeln!(o, "# HELP rein_backend_latency_seconds Backend latency, from dispatch to completion (all tenants).\n# TYPE rein_backend_latency_seconds histogram");
    histogram(&mut o, "rein_backend_latency_seconds", "", &snap.backend.latency_buckets, snap.backend.latency_sum_ns);
    let _ = writeln!(o, "# HELP rein_backend_outstanding IOs outstanding at the backend.\n# TYPE rein_backend_outstanding gauge\nrein_backend_outstanding {}", snap.outstanding);
    let _ = writeln!(o, "# HELP rein_backend_queue_depth Maximum IOs outstanding at the backend (D).\n# TYPE rein_backend_queue_depth gauge\nrein_backend_queue_depth {}", snap.depth);
    let _ = writeln!(o, "# HELP rein_device_busy_seconds_total Time the device was busy (a device model's busy periods; else an IO outstanding at the backend).\n# TYPE rein_device_busy_seconds_total counter\nrein_device_busy_seconds_total {}", snap.busy_ns as f64 / 1e9);
    if let Some((asked, started)) = snap.syncs {
        let _ = writeln!(o, "# HELP rein_backend_syncs_total Syncs the io_uring engine was asked for (flushes, FUA writes).\n# TYPE rein_backend_syncs_total counter\nrein_backend_syncs_total {asked}");
        let _ = writeln!(o, "# HELP rein_backend_syncs_started_total Syncs it handed to the kernel: fewer when syncs that came while one ran were merged into the next (group commit).\n# TYPE rein_backend_syncs_started_total counter\nrein_backend_syncs_started_total {started}");
    }
    if let Some(c) = snap.capacity_iops {
        let _ = writeln!(o, "# HELP rein_device_capacity_iops Modelled device capacity.\n# TYPE rein_device_capacity_iops gauge\nrein_device_capacity_iops {c}");
    }
    let _ = writeln!(o, "# HELP rein_scheduler_info The scheduler in use.\n# TYPE rein_scheduler_info gauge\nrein_scheduler_info{{scheduler=\"{}\",io_engine=\"{}\"}} 1", snap.scheduler, snap.io_engine.name());
    runtime_metrics(&mut o, "rein", &tokio::runtime::Handle::current().metrics());
    crate::stall::metrics(&mut o);
    s.admin_accepts.admin_metrics(&mut o);
    s.reloads.metrics(&mut o, true);
    s.connections.metrics(&mut o);
    if let Some(n) = &s.node {
        n.metrics(&mut o);
    }
    s.registry.presented().metrics(&mut o);
    if let Some(link) = &s.pshift_link {
        link.metrics(&mut o);
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], o).into_response()
}

/// The daemon's runtime threads: `{prefix}_worker_threads` (how many) and
/// `{prefix}_worker_busy_seconds_total{worker}` (how long each has run tasks, from tokio's runtime
/// `metrics`; a worker publishes it when it parks). A busy rate near 1 s per second on every worker says
/// the daemon needs more threads.
pub(crate) fn runtime_metrics(o: &mut String, prefix: &str, metrics: &tokio::runtime::RuntimeMetrics) {
    let n = metrics.num_workers();
    let _ = writeln!(
        o,
        "# HELP {prefix}_worker_threads The runtime's worker threads.\n# TYPE {prefix}_worker_threads gauge\n\
         {prefix}_worker_threads {n}"
    );
    let _ = writeln!(
        o,
        "# HELP {prefix}_worker_busy_seconds_total Time each worker thread spent running tasks.\n\
         # TYPE {prefix}_worker_busy_seconds_total counter"
    );
    for w in 0..n {
        let busy = metrics.worker_total_busy_duration(w).as_secs_f64();
        let _ = writeln!(o, "{prefix}_worker_busy_seconds_total{{worker=\"{w}\"}} {busy}");
    }
}

/// One Prometheus histogram series: cumulative `buckets` (counts per [`LATENCY_BUCKETS_S`] bucket, +Inf
/// last), the sum and the count, with `labels` (`name="value"`, or empty).
pub(crate) fn histogram(o: &mut String, metric: &str, labels: &str, buckets: &[u64], sum_ns: u128) {
    let (sep, braces) = if labels.is_empty() { ("", String::new()) } else { (",", format!("{{{labels}}}")) };
    let mut cum = 0u64;
    for (i, b) in LATENCY_BUCKETS_S.iter().enumerate() {
        cum += buckets.get(i).copied().unwrap_or(0);
        let _ = writeln!(o, "{metric}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}");
    }
    cum += buckets.last().copied().unwrap_or(0);
    let _ = writeln!(o, "{metric}_bucket{{{labels}{sep}le=\"+Inf\"}} {cum}");
    let _ = writeln!(o, "{metric}_sum{braces} {}", sum_ns as f64 / 1e9);
    let _ = writeln!(o, "{metric}_count{braces} {cum}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A refused body is its [`BodyError`] variant (the spec's error, or serde's, as its source); the 400
    /// answer's message is the `String` error's (strings checked against it).
    #[test]
    fn body_refusals_are_typed() {
        let e = new_tenant(br#"{"name": "a", "reservation": 500, "limit": 100}"#).unwrap_err();
        assert!(matches!(&e, BodyError::Spec { name, .. } if name == "a"), "{e:?}");
        assert_eq!(e.to_string(), "invalid spec for a: reservation 500 exceeds limit 100");
        let e = new_tenant(br#"{"name": "a", "colour": 1}"#).unwrap_err();
        assert!(matches!(e, BodyError::Json(_)), "{e:?}");
        assert!(e.to_string().starts_with("bad JSON body: unknown field `colour`"), "{e}");
        let e = new_export(b"{").unwrap_err();
        assert!(matches!(e, BodyError::Json(_)), "{e:?}");
        assert_eq!(e.to_string(), "bad JSON body: EOF while parsing an object at line 1 column 1");
    }

    /// One series per worker thread, counting up while the worker runs tasks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runtime_metrics_name_every_worker() {
        let metrics = tokio::runtime::Handle::current().metrics();
        let text_of = |m: &tokio::runtime::RuntimeMetrics| {
            let mut o = String::new();
            runtime_metrics(&mut o, "rein", m);
            o
        };
        tokio::spawn(async { std::thread::sleep(Duration::from_millis(20)) }).await.unwrap();
        let busy = |text: &str| -> Vec<f64> {
            text.lines()
                .filter(|l| l.starts_with("rein_worker_busy_seconds_total{worker="))
                .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
                .collect()
        };
        // A worker publishes its busy time when it parks: wait up to 5 s for the task's 20 ms.
        let mut text = text_of(&metrics);
        for _ in 0..500 {
            if busy(&text).iter().sum::<f64>() >= 0.015 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            text = text_of(&metrics);
        }
        assert!(text.contains("rein_worker_threads 2\n"), "{text}");
        assert_eq!(busy(&text).len(), 2, "{text}");
        assert!(busy(&text).iter().sum::<f64>() >= 0.015, "the 20 ms task counted: {text}");
    }
}
