//! The multi-tenant NBD load generator behind `rein load` and `rein demo`.
//!
//! # Model
//! Each job is a tenant's workload against one export, over `connections` NBD connections. *What* it
//! issues and *when* is rein-model's workload generator, the simulator's own: closed loops (one pool of
//! `outstanding` requests, replaced on completion after an optional think time), open Poisson arrivals,
//! on/off periods, bursts, and trace replay; offsets, sizes and the read mix come from the same draws.
//! This module only moves the generator's decisions onto the network: one tokio task holds every
//! job's generator and timer, sends each request on the job's next connection (round robin; a request
//! that starts where the previous one ended stays on that one's connection, `Pick`) and feeds
//! completions back. What it measures goes into rein-model's [`Recorder`], so the result is the same
//! [`RunTotals`] (summary.json, timeseries.csv) the simulator writes.
//!
//! With the server's admin endpoint (`admin`), the report carries the tenants' real specs (read at the
//! start from `GET /api/tenants`, the job's `tenant` naming which) and the completions by scheduling phase
//! (the server's counters, read once per interval). Without it, they are unknown and reported as such.
//!
//! A job may have its own server ([`JobRoute`]: `rein cluster` gives each tenant its own endpoint, a
//! gateway or a node): then its spec comes from the route, and its phases are the sums of the counters
//! of the route's admin endpoints (the nodes behind its gateway). A closed loop with per-server windows
//! (`outstanding_per_server`) keeps one window per server of the route; the route's `layout` moves a
//! generated offset into server k's part of the export (without it, window k's offsets are left as
//! drawn: right for a job on one server). Completions count at the route's server k in the report; a
//! pooled job's at the server its layout says holds the offset (its first server without a layout).
//!
//! A route may also give each window its own server (`window_addrs`: a pShift bucket, which a client
//! reaches at each server directly, without a gateway) and demand phases (`phases`): from each phase's
//! time on, only its active windows (those with a share) get requests. At a phase's start each active
//! window of a closed loop is filled up to the workload's window; a completion at a window that is no
//! longer active is not replaced. With `arrivals` the job is open per window instead: each active window
//! gets its own stream at the job's rate times the window's share, evenly spaced from a random phase or
//! Poisson, and a phase change ends the old streams (the simulator's pShift buckets do all of this).
//!
//! # Bounds
//! A job keeps at most `max_pending` ([`MAX_PENDING`] by default) requests issued and unanswered; open-loop
//! arrivals beyond it are dropped and counted as rejected. Trace records are sent at their offset modulo the
//! export's size (aligned to 512 bytes) and at most the export's size (and the server's largest request),
//! in whole sectors; with [`JobRoute::devices`], a listed
//! device's record is then aimed into its window's part of the export by the route's layout. At the end, the answers still due
//! are awaited for at most [`DRAIN_TIMEOUT`] (not recorded as completions), then abandoned with their
//! connections; those that failed or never came are counted ([`Failures`]) and among the report's rejected.
//!
//! # Failures
//! A request the server answers with an error counts as rejected (not as a completion, at the job or at
//! its server) and a closed loop replaces it as it would a completion, so it keeps its depth; the errors
//! are said during the run, the first at once and then a count at most every few seconds
//! (`load_watch.rs`). A connection that breaks stays broken ([`NbdClient::broken`]): its reason is
//! logged once, its requests fail at once, and the job's later requests go to its other connections while
//! any is whole. A server shutting down (a reply with NBD_ESHUTDOWN) breaks the connection so too.
//!
//! A job *stops* (its generator stops, its timers are dropped, nothing of it is issued again; what it has
//! in flight is still recorded) when it has no whole connection left, whatever its kind (an open loop's
//! arrivals each failed at once, unsent, until the run's end), or when [`LoadConfig::max_errors`] of its
//! requests have failed. Its stop is logged and listed ([`Failures::stopped`]); once every job has
//! stopped, the run ends there ([`Failures::ended_at`]) rather than at its duration: a server killed 2 s
//! into a 20 s run held `rein load` the 18 s left, its open loop counting 3,613 requests failed unsent.
//! The report of a run that ended early covers the time it ran ([`Recorder::end_at`]; its rates were
//! averaged over the whole planned run), unless [`LoadConfig::report_early_end`] is off. So does the
//! report of a run stopped by its caller ([`LoadConfig::stop`]: `rein load` on SIGINT or SIGTERM), whose
//! requests in flight are drained as at the run's end ([`Failures::interrupted_at`]).
//! Connections on which requests are outstanding and nothing is answered for a few seconds (the
//! connection open) are said as the run goes, and so is their end (`load_watch.rs`).
//! [`run_checked`] returns what failed ([`Failures`]) beside the totals; `rein load` exits non-zero on it.
//!
//! # Checks before connecting
//! Job names are unique (each is the report's row of its tenant), and the run's bounds hold, among them
//! the timeseries' (jobs + servers) x intervals cells within [`rein_model::recorder::MAX_CELLS`]
//! ([`LoadError::Timeseries`]): a run over it is refused before it connects to anything.
//!
//! # Checks at connect
//! Before any load: each connection within [`crate::client::CONNECT_TIMEOUT`]; no job that writes on an
//! export the server says is read-only; request sizes within the server's size constraints
//! (NBD_INFO_BLOCK_SIZE: at most its largest payload, a multiple of its minimum block); no empty export,
//! and no trace replay on an export (or a server's largest request) below one 512-byte sector.

use crate::admin::TenantJson;
use crate::client::{ClientError, NbdClient};
use crate::dispatch::Clock;
use crate::load_watch::{Answered, JobWatch, Said};
use futures_util::stream::{FuturesUnordered, StreamExt};
use rand::Rng;
use rein_core::{Nanos, QosSpec};
use rein_model::recorder::{RunMeta, ServerMeta, TenantMeta};
use rein_model::seed::stream_seed;
use rein_model::workload::{Arrival, Begin, Reissue, WorkloadSpec};
use rein_model::{Generator, Recorder, RunTotals};
use rein_proto::nbd::Command;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// The requests in flight, polled by the driver itself: no task per request, so an answer wakes the
/// driver once (a spawned task per request cost a spawn, a wake of the task and a wake of the driver).
type InFlight = FuturesUnordered<Pin<Box<dyn Future<Output = Done> + Send>>>;

/// Requests one job may have issued and unanswered, by default.
pub const MAX_PENDING: usize = 65_536;
/// Mixed into the run's seed for the per-window arrival streams (so they do not repeat the generators').
const ARRIVAL_STREAMS: u64 = 0x5053_4849_4654; // "PSHIFT"
/// How long the end of a run waits for the answers still due, and then for each disconnect.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Most timers the driver runs before it looks at completions, its tick and the end again: a workload
/// whose timers are always due (more than the machine can issue) then still ends on time and can be
/// stopped.
const TIMERS_PER_PASS: usize = 4096;
/// Largest request `rein load` sends (the server's default limit).
pub const MAX_REQUEST_BYTES: u64 = 32 << 20;

/// One tenant's workload against one export.
#[derive(Debug, Clone)]
pub struct Job {
    /// The job's name (the report's tenant name).
    pub name: String,
    /// The export it opens.
    pub export: String,
    /// The server's tenant behind the export (for its spec and phase counts from the admin endpoint).
    pub tenant: String,
    /// NBD connections; requests go to them in turn.
    pub connections: usize,
    /// What and when it issues (validated).
    pub workload: WorkloadSpec,
    /// Its own server, spec and phase sources, instead of the run's (`None`: the run's).
    pub route: Option<JobRoute>,
    /// The random stream its draws come from (rein-model's `seed::stream_seed`; `None`: its index in the
    /// run's jobs). `rein cluster run` gives a tenant's stream in its scenario, as the simulator does.
    pub stream: Option<u64>,
}

/// How a job's export is laid out over its route's servers (a gateway's stripes).
pub trait Layout: Send + Sync + std::fmt::Debug {
    /// Moves a generated `offset` (of a `len`-byte request) into window k's server's part of the export.
    fn aim(&self, k: usize, offset: u64, len: u64) -> u64;
    /// The window (index into [`JobRoute::servers`]) whose server holds `offset`.
    fn window_of(&self, offset: u64) -> usize;
}

/// A job's own server (module comment).
#[derive(Debug, Clone)]
pub struct JobRoute {
    /// The NBD server it opens its export on.
    pub addr: SocketAddr,
    /// Its spec, for the report (`None`: unknown).
    pub spec: Option<QosSpec>,
    /// Admin endpoints whose phase counters for the job's tenant are summed (empty: phases unknown).
    pub admins: Vec<crate::admin_client::AdminEndpoint>,
    /// Indices into [`LoadConfig::servers`]: per-server window k is at `servers[k]` (at least one).
    pub servers: Vec<usize>,
    /// The export's layout over `servers`: per-server windows aim with it, and other requests count at
    /// the server it says holds them (without it: as drawn, and at the first server).
    pub layout: Option<Arc<dyn Layout>>,
    /// Per window, its own NBD server (the job's export on each, `connections` to each); empty: every
    /// window's requests go to `addr`.
    pub window_addrs: Vec<SocketAddr>,
    /// Demand phases (module comment): (from when, per window its share of the demand, 0 where it is not
    /// active), in time order; empty: every window is active all along.
    pub phases: Vec<(Nanos, Vec<f64>)>,
    /// Open arrivals per window (module comment), instead of the workload's own; needs `phases`.
    pub arrivals: Option<WindowArrivals>,
    /// Routing by a trace's devices (the scenario's `routing.devices`, built as the simulator builds it):
    /// a record of a listed device is aimed with `layout` into its window's part of the export (the
    /// router's server index is the window); `None`: records go where their offsets fall.
    pub devices: Option<rein_model::routing::Router>,
}

/// A job's open arrivals per window: a stream at each active window ([`JobRoute::arrivals`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowArrivals {
    /// The job's total rate (IOPS), split over the active windows by their shares.
    pub iops: f64,
    /// Evenly spaced from a random phase (the pShift paper's "uniform rate"); false: Poisson.
    pub uniform: bool,
}

/// A load run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The NBD server.
    pub addr: SocketAddr,
    /// Its admin endpoint, if known.
    pub admin: Option<crate::admin_client::AdminEndpoint>,
    /// The admin endpoint's bearer token, if it needs one.
    pub admin_token: Option<crate::admin_guard::AdminToken>,
    /// The jobs.
    pub jobs: Vec<Job>,
    /// How long to run.
    pub duration: Duration,
    /// Time excluded from the totals.
    pub warmup: Duration,
    /// Timeseries interval.
    pub interval: Duration,
    /// The seed of the workload draws.
    pub seed: u64,
    /// The report's name.
    pub name: String,
    /// Requests a job may have issued and unanswered ([`MAX_PENDING`] unless a test wants fewer).
    pub max_pending: usize,
    /// The servers' names in the report (empty: one, named by `addr`); [`JobRoute::servers`] index them.
    pub servers: Vec<String>,
    /// The admin endpoint of each of `servers` (same order), whose device busy time (`GET /api/device`)
    /// gives the report's utilisation; empty: the run's `admin` for a run of one server, else unknown.
    pub server_admins: Vec<crate::admin_client::AdminEndpoint>,
    /// TLS to the NBD servers (every connection starts with NBD_OPT_STARTTLS), if set.
    pub tls: Option<LoadTls>,
    /// The servers' cost model (the unit of the specs read from them), for the report's fluid oracle;
    /// the admin API does not say it, so the caller does (`rein load`: io; `rein cluster`: the scenario's).
    pub cost_model: rein_core::CostModel,
    /// A gate before the run's time starts ([`StartGate`]; `None`: none).
    pub start_gate: Option<StartGate>,
    /// A job stops once this many of its requests have failed (answered with an error, or lost with a
    /// connection); `None`: never (module comment, "Failures"). `rein load --max-errors`.
    pub max_errors: Option<u64>,
    /// A run that ends early (every job stopped) reports the time it ran ([`Recorder::end_at`]: its
    /// duration, rates and timeseries end there), as `rein load` does; `false`: the planned duration, as
    /// `rein cluster run` needs, whose parts' reports are joined and must have one duration.
    pub report_early_end: bool,
    /// Ends the run early when notified (`rein load` on SIGINT or SIGTERM; a notification that comes
    /// before the run's loop waits for it is kept): what ran is reported as a run whose jobs all stopped
    /// is ([`Failures::interrupted_at`]). `None`: nothing stops the run so.
    pub stop: Option<Arc<tokio::sync::Notify>>,
}

impl LoadConfig {
    /// A run of `jobs` against the NBD server at `addr` for `duration`, with the defaults a caller sets
    /// only to change: no warm-up, intervals of 1 s, seed 1, named `rein-load`, [`MAX_PENDING`], one
    /// server named by `addr` and no admin endpoint (utilisation unknown), no TLS, specs in IOPS, no start
    /// gate, no error limit, a run that ends early reported as it ran, and no stop. Set the rest with
    /// struct update syntax (`LoadConfig { seed: 3, ..LoadConfig::new(addr, jobs, duration) }`).
    pub fn new(addr: SocketAddr, jobs: Vec<Job>, duration: Duration) -> LoadConfig {
        LoadConfig {
            addr,
            admin: None,
            admin_token: None,
            jobs,
            duration,
            warmup: Duration::ZERO,
            interval: Duration::from_secs(1),
            seed: 1,
            name: "rein-load".into(),
            max_pending: MAX_PENDING,
            servers: Vec::new(),
            server_admins: Vec::new(),
            tls: None,
            cost_model: rein_core::CostModel::PerIo,
            start_gate: None,
            max_errors: None,
            report_early_end: true,
            stop: None,
        }
    }
}

/// Something to do between opening every connection and the run's first request: the run says it is
/// ready (`ready`) and starts when told (`go`). `rein cluster` starts a pShift controller's schedule
/// there, so that the schedule's origin is just before the run's (by half the request's round trip)
/// and the QoS periods of both line up.
#[derive(Debug, Clone, Default)]
pub struct StartGate {
    /// Notified once when every connection is open.
    pub ready: Arc<tokio::sync::Notify>,
    /// The run waits for this before its time starts.
    pub go: Arc<tokio::sync::Notify>,
}

/// TLS for a load run's NBD connections.
#[derive(Debug, Clone)]
pub struct LoadTls {
    /// The client context (x509 or PSK).
    pub client: crate::tls::TlsClient,
    /// The name the servers' certificates must carry; `None`: each server's IP address.
    pub name: Option<String>,
}

/// Why a load run could not run.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A job's export could not be opened.
    #[error("job {job}: cannot connect to export {export:?} at {addr}: {source}")]
    Connect {
        /// The job.
        job: String,
        /// The export.
        export: String,
        /// The server.
        addr: SocketAddr,
        /// Why.
        source: ClientError,
    },
    /// The admin endpoint could not be read.
    #[error("{0}")]
    Admin(#[from] crate::admin_client::AdminClientError),
    /// The run's timeseries would keep more than [`rein_model::recorder::MAX_CELLS`] cells: (jobs +
    /// servers) x intervals. Refused before connecting to anything (module comment).
    #[error(
        "duration {duration_s} s / interval {interval_s} s = {} intervals, x ({} jobs + {} servers), exceeds {} \
         timeseries cells: run fewer jobs or a shorter run",
        .cells.intervals, .cells.tenants, .cells.servers, rein_model::recorder::MAX_CELLS
    )]
    Timeseries {
        /// The cells asked for (a job is a tenant of the report).
        cells: rein_model::recorder::TooManyCells,
        /// The run's duration (s).
        duration_s: f64,
        /// The timeseries interval (s).
        interval_s: f64,
    },
    /// The configuration is out of range (the message names what).
    #[error("{0}")]
    Invalid(String),
}

/// Live progress: per job, IOPS and mean latency (ms) over the last interval.
pub type Live = Vec<(String, f64, f64)>;

impl LoadConfig {
    fn validate(&self) -> Result<(), LoadError> {
        let bad = |m: String| Err(LoadError::Invalid(m));
        if self.jobs.is_empty() {
            return bad("no jobs".into());
        }
        if self.max_pending == 0 {
            return bad("max_pending must be positive".into());
        }
        if self.max_errors == Some(0) {
            return bad("max_errors must be positive (None: no limit)".into());
        }
        // A job's name is its tenant's in the report: two jobs of one name made two rows of that name in
        // summary.json and timeseries.csv that nothing told apart (the simulator refuses it the same way).
        let mut names = std::collections::HashSet::new();
        if let Some(j) = self.jobs.iter().find(|j| !names.insert(j.name.as_str())) {
            return bad(format!(
                "two jobs are named {:?}: each job's name is its row in the report, so names must differ (two jobs \
                 may still drive one export and tenant with export= and tenant=)",
                j.name
            ));
        }
        for j in &self.jobs {
            if j.connections == 0 || j.connections > 1024 {
                return bad(format!("job {}: connections must be in 1..=1024", j.name));
            }
            if j.workload.size_bytes > MAX_REQUEST_BYTES {
                return bad(format!("job {}: requests above {} MiB", j.name, MAX_REQUEST_BYTES >> 20));
            }
            if let Some(r) = &j.route {
                let n = self.servers.len().max(1);
                if r.servers.is_empty() || r.servers.iter().any(|&s| s >= n) {
                    return bad(format!("job {}: route servers must be 1 or more of the run's {n}", j.name));
                }
                let w = r.servers.len();
                if !r.window_addrs.is_empty() && r.window_addrs.len() != w {
                    return bad(format!("job {}: {} window addresses for {w} windows", j.name, r.window_addrs.len()));
                }
                if r.phases.iter().any(|p| p.1.len() != w || p.1.iter().any(|x| !(x.is_finite() && *x >= 0.0)))
                    || r.phases.windows(2).any(|p| p[0].0 > p[1].0)
                {
                    return bad(format!(
                        "job {}: demand phases must be in time order, each with a share (>= 0) for each of its {w} windows",
                        j.name
                    ));
                }
                if let Some(a) = r.arrivals {
                    if r.phases.is_empty() || !(a.iops.is_finite() && a.iops > 0.0 && a.iops <= 1e9) {
                        return bad(format!(
                            "job {}: per-window arrivals need demand phases and a rate in (0, 1e9]",
                            j.name
                        ));
                    }
                }
            }
        }
        if !self.server_admins.is_empty() && self.server_admins.len() != self.servers.len().max(1) {
            return bad(format!(
                "{} server admin endpoints for {} servers",
                self.server_admins.len(),
                self.servers.len().max(1)
            ));
        }
        if self.interval.is_zero() || self.duration.is_zero() || self.warmup >= self.duration {
            return bad("need duration > warm-up >= 0 and a positive interval".into());
        }
        // The recorder's bound, counted (not allocated) before connecting to anything: checked only
        // when the recorder was made, after every connection, a run over it opened them all first.
        let (duration, interval) = (Nanos::from_duration(self.duration), Nanos::from_duration(self.interval));
        let intervals = rein_model::recorder::intervals(duration, interval);
        rein_model::recorder::TooManyCells::check(self.jobs.len(), self.report_servers(), intervals)
            .map_err(|cells| self.too_many_cells(cells))
    }

    /// The report's servers: [`LoadConfig::servers`], or one named by `addr`.
    fn report_servers(&self) -> usize {
        self.servers.len().max(1)
    }

    fn too_many_cells(&self, cells: rein_model::recorder::TooManyCells) -> LoadError {
        LoadError::Timeseries {
            cells,
            duration_s: self.duration.as_secs_f64(),
            interval_s: self.interval.as_secs_f64(),
        }
    }
}

/// A timer of one job's generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Start,
    Stop,
    Toggle,
    Arrive,
    /// Demand phase i of the job's route begins.
    Phase(usize),
    /// An arrival of window k's stream of the job's demand phase with this number.
    WindowArrive(usize, u32),
    /// A think time ends: reissue (to this window, for per-server windows).
    Think(Option<usize>),
}

/// A pending timer: (when, sequence number for ties, job, what).
type TimerEntry = (Nanos, u64, usize, Timer);

/// A request's outcome, back at the driver.
struct Done {
    job: usize,
    /// The window it was issued in (0 for a pooled job).
    k: usize,
    /// Its connection: (group, index in the group).
    conn: (usize, usize),
    issued: Nanos,
    /// When the driver polled the answer in (the request's future stamps it as it resolves).
    done: Nanos,
    /// A READ (else a WRITE), where, and how long.
    read: bool,
    offset: u64,
    bytes: u64,
    /// Why it failed (`None`: it succeeded).
    err: Option<ClientError>,
}

/// What failed in a run (all zero and empty when nothing did).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failures {
    /// Requests that failed: answered with an error, or lost with their connection (during the run or
    /// at its end).
    pub failed: u64,
    /// The first failure (`job NAME: server answered error 5 (EIO)`, or a connection's reason).
    pub first: Option<String>,
    /// Requests still unanswered at the end after [`DRAIN_TIMEOUT`] (abandoned with their connections).
    pub unanswered: u64,
    /// Each connection that broke during the run, once: `job NAME: connection N to ADDR: reason`.
    pub broken: Vec<String>,
    /// Each job that stopped before the run's end, once, with when and why (`job NAME: stopped at 2.1 s:
    /// ...`; module comment, "Failures").
    pub stopped: Vec<String>,
    /// When the run ended, if before its duration: every job had stopped.
    pub ended_at: Option<Duration>,
    /// When the run was stopped by [`LoadConfig::stop`], if it was (not a failure: [`Failures::any`]
    /// does not count it). Its report ends there, as one that ended early does.
    pub interrupted_at: Option<Duration>,
}

impl Failures {
    /// Whether anything failed.
    pub fn any(&self) -> bool {
        self.failed > 0 || self.unanswered > 0 || !self.broken.is_empty() || !self.stopped.is_empty()
    }

    /// Adds `other`'s failures (another run's, as of a scenario run in parts): its first failure counts
    /// only where this has none.
    pub fn merge(&mut self, other: Failures) {
        self.failed += other.failed;
        self.unanswered += other.unanswered;
        if self.first.is_none() {
            self.first = other.first;
        }
        self.broken.extend(other.broken);
        self.stopped.extend(other.stopped);
        let earliest = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.ended_at = earliest(self.ended_at, other.ended_at);
        self.interrupted_at = earliest(self.interrupted_at, other.interrupted_at);
    }

    fn note(&mut self, job: &str, e: &ClientError) {
        self.failed += 1;
        if self.first.is_none() {
            self.first = Some(format!("job {job}: {e}"));
        }
    }
}

/// Whether `e` is the connection's failure rather than the server's answer to the request. NBD_ESHUTDOWN
/// is both: the server's answer, and the end of the connection (the client sends nothing more on it).
fn connection_error(e: &ClientError) -> bool {
    !matches!(e, ClientError::Errno(n) if *n != rein_proto::nbd::ESHUTDOWN)
}

/// The run's totals and what failed in it ([`run_checked`]).
#[derive(Debug)]
pub struct Outcome {
    /// The report.
    pub totals: RunTotals,
    /// What failed.
    pub failures: Failures,
}

/// Which of a group's connections a request takes: the next in turn, except that a request starting
/// where the previous one ended (a sequential run) stays on the previous one's connection, for at most
/// [`crate::nbd::MAX_IN_FLIGHT_PER_CONN`] requests in a row. Each connection is read by its own task at
/// the server, so a run spread over several reaches the scheduler reordered: on a disk model, where an
/// access that does not continue the previous one pays a seek, mClock's locality batching (Table 5) got
/// 0.714x of the simulator's throughput on `rein cluster` with the run spread over 4 connections.
#[derive(Debug, Clone, Copy, Default)]
struct Pick {
    /// The connection the next request that does not continue a run takes.
    next: usize,
    /// The previous request's connection, where it ended, and how many in a row went there.
    last: usize,
    end: u64,
    run: usize,
}

impl Pick {
    /// The connection (index below `n`) for a request of `len` bytes at `offset`.
    fn choose(&mut self, offset: u64, len: u64, n: usize) -> usize {
        let i = if offset == self.end && self.run > 0 && self.run < crate::nbd::MAX_IN_FLIGHT_PER_CONN {
            self.run += 1;
            self.last
        } else {
            let i = self.next % n.max(1);
            self.next = (i + 1) % n.max(1);
            self.run = 1;
            i
        };
        self.last = i;
        self.end = offset.saturating_add(len);
        i
    }
}

struct JobState {
    gen: Generator,
    /// Connection groups: one, or one per window ([`JobRoute::window_addrs`]).
    clients: Vec<Vec<Arc<NbdClient>>>,
    /// Per group, which connection the next request takes.
    pick: Vec<Pick>,
    export_size: u64,
    /// The largest trace record sent (whole sectors, within the export and the servers' largest request).
    trace_max: u64,
    /// The job's name and its connection groups' servers, for what failed.
    name: String,
    addrs: Vec<SocketAddr>,
    /// Write payload (0x5a bytes), shared by the job's writes of up to its length.
    payload: Arc<[u8]>,
    clock: Clock,
    /// [`LoadConfig::max_pending`].
    max_pending: usize,
    /// Requests in flight per window.
    at_window: Vec<u32>,
    /// The report's server index of each window.
    windows: Vec<usize>,
    /// Per window, whether it gets requests now (its demand phase).
    active: Vec<bool>,
    /// [`JobRoute::phases`].
    phases: Vec<(Nanos, Vec<f64>)>,
    /// [`JobRoute::arrivals`], with the current phase's number (older streams end) and the streams' draws.
    arrivals: Option<(WindowArrivals, u32, rand_pcg::Pcg64Mcg)>,
    layout: Option<Arc<dyn Layout>>,
    /// [`JobRoute::devices`].
    devices: Option<rein_model::routing::Router>,
    /// This interval, for the live table.
    live_ios: u64,
    live_lat_ns: u64,
    /// What its connections and errors say during the run.
    watch: JobWatch,
    /// Its requests that failed so far (for [`LoadConfig::max_errors`]).
    failed: u64,
    /// It stopped (module comment, "Failures").
    stopped: bool,
}

/// Runs the load; `live` is called once per interval with the jobs' IOPS and latency. What failed is
/// logged and in the totals' rejected counts; [`run_checked`] returns it as well.
pub async fn run(cfg: LoadConfig, live: impl FnMut(Duration, &Live) + Send) -> Result<RunTotals, LoadError> {
    Ok(run_checked(cfg, live).await?.totals)
}

/// What a job needs of its export and the server behind it, checked at connect (module comment): `spec`
/// is the job's workload fitted to the export, `c` a connection to `addr`.
fn check_export(j: &Job, spec: &WorkloadSpec, addr: SocketAddr, c: &NbdClient) -> Result<(), LoadError> {
    use rein_model::workload::WorkloadKind;
    use rein_proto::nbd::TFLAG_READ_ONLY;
    let at = format!("job {}: export {:?} at {addr}", j.name, j.export);
    let bad = |m: String| Err(LoadError::Invalid(format!("{at}: {m}")));
    let b = c.block;
    if c.size == 0 {
        return bad("the export is empty (0 bytes)".into());
    }
    let trace = match &spec.kind {
        WorkloadKind::Trace { records, .. } => Some(records),
        _ => None,
    };
    let writes = match trace {
        Some(records) => records.iter().any(|r| !r.read),
        None => spec.read_frac < 1.0,
    };
    if writes && c.flags & TFLAG_READ_ONLY != 0 {
        return bad("the server says it is read-only (NBD_FLAG_READ_ONLY) and the job writes (set read=100)".into());
    }
    match trace {
        None => {
            let size = spec.size_bytes;
            if size > u64::from(b.max) {
                return bad(format!(
                    "size {size} bytes is above the largest request the server takes ({} bytes)",
                    b.max
                ));
            }
            if !size.is_multiple_of(u64::from(b.min.max(1))) {
                return bad(format!(
                    "size {size} bytes is not a multiple of the server's minimum block size ({} bytes)",
                    b.min
                ));
            }
        }
        Some(records) => {
            if c.size < 512 {
                return bad(format!(
                    "the export is {} bytes: a trace replay needs at least one 512-byte sector",
                    c.size
                ));
            }
            if b.max < 512 {
                return bad(format!(
                    "the server's largest request is {} bytes: a trace replay sends whole 512-byte sectors",
                    b.max
                ));
            }
            if b.min > 512 {
                return bad(format!(
                    "the server's minimum block size is {} bytes: a trace replay sends requests aligned to 512 bytes",
                    b.min
                ));
            }
            let max = trace_max(c.size, b.max);
            if let Some(r) = records.iter().find(|r| !r.size.clamp(512, max).is_multiple_of(u64::from(b.min.max(1)))) {
                return bad(format!(
                    "trace record of {} bytes at offset {} is not a multiple of the server's minimum block size ({} bytes)",
                    r.size, r.offset, b.min
                ));
            }
        }
    }
    Ok(())
}

/// The largest trace record sent to an export of `export` bytes on a server whose largest request is
/// `server_max`: whole sectors (at least one when both are: [`check_export`]).
fn trace_max(export: u64, server_max: u32) -> u64 {
    (export.min(MAX_REQUEST_BYTES).min(u64::from(server_max)) & !511).max(512)
}

/// [`run`], returning what failed beside the totals.
pub async fn run_checked(cfg: LoadConfig, mut live: impl FnMut(Duration, &Live) + Send) -> Result<Outcome, LoadError> {
    cfg.validate()?;
    // Specs from the admin endpoint, before any load.
    let server_tenants: Option<Vec<TenantJson>> = match &cfg.admin {
        Some(a) => Some(crate::admin_client::get_json(a, cfg.admin_token.as_ref(), "/api/tenants").await.map_err(
            |e| match e {
                // Another daemon's endpoint (a gateway's, a pShift controller's): it said only `HTTP 404`.
                crate::admin_client::AdminClientError::Status { addr, status: 404, .. } => LoadError::Invalid(format!(
                    "--admin {addr}: no /api/tenants there: --admin names a rein serve's admin endpoint, whose \
                     tenants' specs the report shows (a rein gateway's or a pShift controller's has none: leave \
                     --admin out)"
                )),
                e => e.into(),
            },
        )?),
        None => None,
    };
    let mut specs: Vec<Option<QosSpec>> = Vec::new();
    for j in &cfg.jobs {
        specs.push(match (&j.route, &server_tenants) {
            (Some(r), _) => r.spec,
            (None, None) => None,
            (None, Some(ts)) => {
                let t = ts.iter().find(|t| t.name == j.tenant).ok_or_else(|| {
                    LoadError::Invalid(format!("job {}: the server has no tenant {:?} (set tenant=)", j.name, j.tenant))
                })?;
                Some(t.spec().map_err(|e| LoadError::Invalid(format!("tenant {}: {e}", t.name)))?)
            }
        });
    }
    // Where each job's phase counters are read: its route's admin endpoints, or the run's.
    let mut endpoints: Vec<crate::admin_client::AdminEndpoint> = Vec::new();
    let mut sources: Vec<Vec<usize>> = Vec::new();
    for j in &cfg.jobs {
        let eps: Vec<crate::admin_client::AdminEndpoint> = match &j.route {
            Some(r) => r.admins.clone(),
            None => cfg.admin.iter().cloned().collect(),
        };
        let mut ix = Vec::new();
        for e in eps {
            let i = match endpoints.iter().position(|x| format!("{x:?}") == format!("{e:?}")) {
                Some(i) => i,
                None => {
                    endpoints.push(e);
                    endpoints.len() - 1
                }
            };
            ix.push(i);
        }
        sources.push(ix);
    }
    let phases_known = sources.iter().all(|s| !s.is_empty());
    let tenants: Vec<String> = cfg.jobs.iter().map(|j| j.tenant.clone()).collect();
    // The servers' phase counters at the start: each interval's phases are differences from here on.
    let mut phases_base: Option<Vec<[u64; 3]>> = if !phases_known {
        None
    } else if let (Some(ts), true) = (&server_tenants, cfg.jobs.iter().all(|j| j.route.is_none())) {
        Some(tenants.iter().map(|t| phase_counts(ts, t)).collect())
    } else {
        read_phases(&endpoints, cfg.admin_token.as_ref(), &sources, &tenants).await
    };
    // Connect everything first, so a bad export fails before any load starts.
    let clock = Clock::new();
    let mut jobs = Vec::with_capacity(cfg.jobs.len());
    for (ji, j) in cfg.jobs.iter().enumerate() {
        let addrs: Vec<SocketAddr> = match &j.route {
            Some(r) if !r.window_addrs.is_empty() => r.window_addrs.clone(),
            Some(r) => vec![r.addr],
            None => vec![cfg.addr],
        };
        let mut clients = Vec::with_capacity(addrs.len());
        for &addr in &addrs {
            let mut group = Vec::with_capacity(j.connections);
            for _ in 0..j.connections {
                let name = cfg.tls.as_ref().map(|t| t.name.clone().unwrap_or_else(|| addr.ip().to_string()));
                let tls = cfg.tls.as_ref().zip(name.as_deref()).map(|(t, n)| (&t.client, n));
                let c = NbdClient::connect_with(addr, &j.export, tls).await.map_err(|source| LoadError::Connect {
                    job: j.name.clone(),
                    export: j.export.clone(),
                    addr,
                    source,
                })?;
                group.push(c);
            }
            clients.push(group);
        }
        // Offsets are drawn for the smallest of the servers' exports.
        let export_size = clients.iter().map(|g| g[0].size).min().unwrap_or(0);
        let server_max = clients.iter().map(|g| g[0].block.max).min().unwrap_or(u32::MAX);
        let windows = j.route.as_ref().map_or(vec![0], |r| r.servers.clone());
        let phases = j.route.as_ref().map_or(Vec::new(), |r| r.phases.clone());
        // With phases, no window is active before the first one begins.
        let active = vec![phases.is_empty(); windows.len()];
        let mut spec = j.workload.clone();
        // Offsets stay inside the export.
        spec.span_bytes = spec.span_bytes.min(export_size).max(1);
        spec.size_bytes = spec.size_bytes.min(export_size.max(1));
        for (g, &addr) in clients.iter().zip(&addrs) {
            check_export(j, &spec, addr, &g[0])?;
        }
        let stream = j.stream.unwrap_or(ji as u64);
        let gen = Generator::new(&spec, stream_seed(cfg.seed, stream));
        let payload = vec![0x5au8; spec.size_bytes as usize].into();
        let watch = JobWatch::new(clients.iter().map(Vec::len));
        jobs.push((
            spec,
            JobState {
                gen,
                pick: vec![Pick::default(); clients.len()],
                clients,
                export_size,
                trace_max: trace_max(export_size, server_max),
                name: j.name.clone(),
                addrs,
                payload,
                clock,
                max_pending: cfg.max_pending,
                at_window: vec![0; windows.len()],
                windows,
                active,
                phases,
                arrivals: j
                    .route
                    .as_ref()
                    .and_then(|r| r.arrivals)
                    .map(|a| (a, 0, rein_model::seed::stream_rng(cfg.seed ^ ARRIVAL_STREAMS, stream))),
                layout: j.route.as_ref().and_then(|r| r.layout.clone()),
                devices: j.route.as_ref().and_then(|r| r.devices.clone()),
                live_ios: 0,
                live_lat_ns: 0,
                watch,
                failed: 0,
                stopped: false,
            },
        ));
    }
    let (specs_w, mut states): (Vec<WorkloadSpec>, Vec<JobState>) = jobs.into_iter().unzip();
    let duration = Nanos::from_duration(cfg.duration);
    let interval = Nanos::from_duration(cfg.interval);
    let servers: Vec<String> = if cfg.servers.is_empty() { vec![cfg.addr.to_string()] } else { cfg.servers.clone() };
    // Each server's busy time at the start: each interval's busy time is a difference from here on.
    let busy_endpoints: Vec<Option<crate::admin_client::AdminEndpoint>> = if !cfg.server_admins.is_empty() {
        cfg.server_admins.iter().cloned().map(Some).collect()
    } else if servers.len() == 1 {
        vec![cfg.admin.clone()]
    } else {
        vec![None; servers.len()]
    };
    let busy_base = read_busy(&busy_endpoints, cfg.admin_token.as_ref()).await;
    if let Some(g) = &cfg.start_gate {
        g.ready.notify_one();
        g.go.notified().await;
    }
    let mut busy = BusyReads {
        ok: busy_endpoints.iter().zip(&busy_base).map(|(e, b)| e.is_none() || b.is_some()).collect(),
        carry: vec![0; busy_base.len()],
        capacity: busy_base.iter().map(|b| b.and_then(|d| d.capacity_iops).map(|c| vec![(Nanos::ZERO, c)])).collect(),
        base: busy_base.iter().map(|b| b.map(|d| d.busy_ns)).collect(),
        endpoints: busy_endpoints,
        interval,
        duration,
    };
    let mut rec = Recorder::new(cfg.jobs.len(), servers.len(), duration, interval, Nanos::from_duration(cfg.warmup))
        .map_err(|cells| cfg.too_many_cells(cells))?;
    // The run's time starts here, not at `clock`'s origin (before connecting).
    let start = clock.now();
    let now = || clock.now().saturating_sub(start);
    let at_instant = |t: Nanos| clock.instant(t.saturating_add(start));
    let mut timers: BinaryHeap<Reverse<TimerEntry>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut arm = |timers: &mut BinaryHeap<_>, at: Nanos, job: usize, t: Timer| {
        seq += 1;
        timers.push(Reverse((at, seq, job, t)));
    };
    for (ji, spec) in specs_w.iter().enumerate() {
        arm(&mut timers, spec.start, ji, Timer::Start);
        if spec.stop < duration {
            arm(&mut timers, spec.stop, ji, Timer::Stop);
        }
        for (i, p) in states[ji].phases.iter().enumerate() {
            if p.0 < duration {
                arm(&mut timers, p.0, ji, Timer::Phase(i));
            }
        }
    }
    let mut inflight: InFlight = FuturesUnordered::new();
    let mut failures = Failures::default();
    // Jobs stopped (module comment, "Failures").
    let mut stopped = 0usize;
    // The connections whose breaking was reported: (job, group, index).
    let mut reported = std::collections::HashSet::new();
    // Phase counters and busy times are read by one task, in interval order, so the driver never waits for
    // the admin endpoints: it sends an interval's index and receives the counts later.
    let (phase_ask, phase_read) = if phases_known || busy.known() {
        let (ask, mut asked) = tokio::sync::mpsc::unbounded_channel::<usize>();
        let (answer, read) = tokio::sync::mpsc::unbounded_channel();
        let token = cfg.admin_token.clone();
        let (endpoints, sources) = (endpoints.clone(), sources.clone());
        let busy_eps = busy.endpoints.clone();
        tokio::spawn(async move {
            while let Some(i) = asked.recv().await {
                let counts =
                    if phases_known { read_phases(&endpoints, token.as_ref(), &sources, &tenants).await } else { None };
                let busy_ns = read_busy(&busy_eps, token.as_ref()).await;
                if answer.send((i, counts, busy_ns)).is_err() {
                    break;
                }
            }
        });
        (Some(ask), Some(read))
    } else {
        (None, None)
    };
    let mut phase_read = phase_read;
    let mut tick = tokio::time::interval_at(at_instant(interval), cfg.interval);
    let mut shown = 0usize;
    // The generator's timers (arrivals, think times, trace records) with the kernel's precision beside
    // tokio's millisecond timer (crate::precise_timer): on tokio's alone a think time of 1.61 ms ended
    // at the next tick or the one after, which lengthened every cycle of a closed loop with think times.
    let mut precise = crate::precise_timer::optional("the workload's timers");
    loop {
        let t = now();
        if t >= duration {
            break;
        }
        // Run the timers that are due, at most TIMERS_PER_PASS of them: the rest wait for the next pass,
        // after the select below has taken completions, the tick and the end (and let a cancelled run stop).
        let mut handled = 0usize;
        while let Some(&Reverse((at, _, ji, timer))) = timers.peek() {
            if at > t || handled == TIMERS_PER_PASS {
                break;
            }
            handled += 1;
            timers.pop();
            if states[ji].stopped {
                continue; // a stopped job's timers are dropped
            }
            let spec = &specs_w[ji];
            let st = &mut states[ji];
            // The generator decides on the timer's own time (`at`), so a late wake-up does not shift the
            // workload's schedule; requests are stamped with the real time they leave (`t`).
            match timer {
                Timer::Start => {
                    if let Some(next) = st.gen.start(at, spec) {
                        arm(&mut timers, next, ji, Timer::Toggle);
                    }
                    begin(ji, spec, st, at, t, &mut inflight, &mut rec, &mut |a, k| arm(&mut timers, a, ji, k));
                }
                Timer::Stop => st.gen.stop(),
                Timer::Toggle => {
                    if let Some((next, on)) = st.gen.toggle(at, spec) {
                        arm(&mut timers, next, ji, Timer::Toggle);
                        if on {
                            begin(ji, spec, st, at, t, &mut inflight, &mut rec, &mut |a, k| arm(&mut timers, a, ji, k));
                        }
                    }
                }
                Timer::Arrive => {
                    match st.gen.arrival(spec) {
                        None => continue,
                        Some(Arrival::Generated(n)) => {
                            for _ in 0..n {
                                issue(ji, st, None, None, t, &mut inflight, &mut rec);
                            }
                        }
                        Some(Arrival::Record(r)) => {
                            issue(ji, st, Some((r.offset, r.size, r.read, r.device)), None, t, &mut inflight, &mut rec)
                        }
                    }
                    if let Some(next) = st.gen.next_arrival(at, spec) {
                        arm(&mut timers, next, ji, Timer::Arrive);
                    }
                }
                Timer::WindowArrive(k, g) => {
                    let Some((a, generation, rng)) = &mut st.arrivals else { continue };
                    if g != *generation {
                        continue; // a stream of an earlier phase
                    }
                    // Phase i's streams are number i + 1.
                    let rate = a.iops * st.phases[g as usize - 1].1[k];
                    let next = if a.uniform {
                        Nanos::from_secs_f64(1.0 / rate).max(Nanos(1))
                    } else {
                        rein_model::workload::poisson_gap(rng, rate)
                    };
                    arm(&mut timers, at.saturating_add(next), ji, Timer::WindowArrive(k, g));
                    if st.gen.is_running() {
                        issue(ji, st, None, Some(k), t, &mut inflight, &mut rec);
                    }
                }
                Timer::Think(k) => {
                    if st.gen.is_running() && k.is_none_or(|k| st.active[k]) {
                        issue(ji, st, None, k, t, &mut inflight, &mut rec);
                    }
                }
                Timer::Phase(i) => {
                    for (a, x) in st.active.iter_mut().zip(&st.phases[i].1) {
                        *a = *x > 0.0;
                    }
                    if let Some((a, generation, rng)) = &mut st.arrivals {
                        // The old phase's streams end; each active window starts its own.
                        *generation += 1;
                        for (k, &share) in st.phases[i].1.iter().enumerate() {
                            if share > 0.0 {
                                let rate = a.iops * share;
                                let first = if a.uniform {
                                    Nanos::from_secs_f64(rng.gen::<f64>() / rate)
                                } else {
                                    rein_model::workload::poisson_gap(rng, rate)
                                };
                                arm(&mut timers, at.saturating_add(first), ji, Timer::WindowArrive(k, *generation));
                            }
                        }
                    }
                    // Each active window is filled up to the workload's window (a closed per-server
                    // loop); other kinds keep their own timing.
                    if st.gen.is_running() && matches!(st.gen.begin(at, spec), Begin::FillPerServer) {
                        for k in 0..st.windows.len() {
                            if st.active[k] {
                                for _ in 0..st.gen.deficit(Some(st.at_window[k])) {
                                    issue(ji, st, None, Some(k), t, &mut inflight, &mut rec);
                                }
                            }
                        }
                    }
                }
            }
        }
        let next_timer = timers.peek().map(|Reverse((at, ..))| at_instant(*at));
        let end = at_instant(duration);
        tokio::select! {
            Some(d) = inflight.next() => {
                let t = d.done.saturating_sub(start);
                let st = &mut states[d.job];
                st.at_window[d.k] -= 1;
                // The server's answer (data or an error), or its connection's failure.
                let answered = d.err.as_ref().is_none_or(|e| matches!(e, ClientError::Errno(_)));
                st.watch.ended(d.conn, t, answered);
                let reissue = match &d.err {
                    None => {
                        rec.completion_phase_unknown(d.job, d.issued, t, d.bytes);
                        rec.server_completion(st.windows[d.k], t);
                        st.live_ios += 1;
                        st.live_lat_ns += t.saturating_sub(d.issued).0;
                        st.gen.completed(t, d.k)
                    }
                    Some(e) => {
                        rec.rejected(d.job, t);
                        failures.note(&st.name, e);
                        st.failed += 1;
                        if let ClientError::Errno(errno) = *e {
                            if !connection_error(e) {
                                let what = Answered { read: d.read, bytes: d.bytes, offset: d.offset, errno };
                                let last = cfg.max_errors.is_some_and(|m| st.failed >= m);
                                if let Some(line) = st.watch.failed(&st.name, t, what, last) {
                                    say(line);
                                }
                            }
                        }
                        if connection_error(e) && reported.insert((d.job, d.conn)) {
                            report_broken(st, d.conn, e, &mut failures);
                        }
                        if !st.stopped {
                            if let Some(why) = stop_reason(st, d.conn, cfg.max_errors) {
                                stop(st, t, &why, &mut failures);
                                stopped += 1;
                            }
                        }
                        // Replaced as a completion would be (a closed loop keeps its depth), unless the
                        // job stopped (its generator replaces nothing then), or the window's connections
                        // are all broken (it would fail at once, and again).
                        if connection_error(e) && st.clients[d.conn.0].iter().all(|c| c.is_broken()) {
                            st.gen.failed();
                            Reissue::No
                        } else {
                            st.gen.completed(t, d.k)
                        }
                    }
                };
                match reissue {
                    Reissue::No => {}
                    Reissue::Now(k) if k.is_none_or(|k| st.active[k]) => issue(d.job, st, None, k, t, &mut inflight, &mut rec),
                    Reissue::Now(_) => {}
                    Reissue::At(at, k) => arm(&mut timers, at, d.job, Timer::Think(k)),
                }
                if stopped == states.len() {
                    // Nothing is left to run: the run ends here, not at its duration.
                    failures.ended_at = Some(Duration::from_nanos(t.0));
                    tracing::error!(
                        "every job has stopped: the run ends at {:.1} s of {:.1} s",
                        t.as_secs_f64(),
                        cfg.duration.as_secs_f64()
                    );
                    break;
                }
            }
            _ = tick.tick() => {
                let i = shown;
                shown += 1;
                let rows: Live = cfg.jobs.iter().zip(states.iter_mut()).map(|(j, st)| {
                    let iops = st.live_ios as f64 / cfg.interval.as_secs_f64();
                    let lat = if st.live_ios > 0 { st.live_lat_ns as f64 / st.live_ios as f64 / 1e6 } else { 0.0 };
                    st.live_ios = 0;
                    st.live_lat_ns = 0;
                    (j.name.clone(), iops, lat)
                }).collect();
                live(Duration::from_nanos(now().0), &rows);
                // Stalled connections, answers resumed, errors not yet counted.
                let t = now();
                for st in states.iter_mut() {
                    let clients = &st.clients;
                    for line in st.watch.check(&st.name, t, &st.addrs, |(g, i)| clients[g][i].is_broken()) {
                        say(line);
                    }
                }
                if let Some(ask) = &phase_ask {
                    let _ = ask.send(i);
                }
            }
            Some((i, counts, busy_ns)) = async { phase_read.as_mut().expect("guarded").recv().await }, if phase_read.is_some() => {
                set_phases(i, counts, &mut phases_base, &mut rec);
                busy.record(i, busy_ns, &mut rec);
            }
            _ = crate::precise_timer::sleep_until(&mut precise, next_timer) => {}
            () = async { cfg.stop.as_ref().expect("guarded").notified().await }, if cfg.stop.is_some() => {
                let t = now();
                failures.interrupted_at = Some(Duration::from_nanos(t.0));
                tracing::warn!("stopped at {:.1} s of {:.1} s", t.as_secs_f64(), cfg.duration.as_secs_f64());
                break;
            }
            _ = tokio::time::sleep_until(end) => break,
        }
    }
    if let (Some(ask), Some(mut read)) = (phase_ask, phase_read) {
        // The last interval's phases (its tick falls at the end), then every answer still due, in order.
        let _ = ask.send(shown);
        drop(ask);
        while let Some((i, counts, busy_ns)) = read.recv().await {
            set_phases(i, counts, &mut phases_base, &mut rec);
            busy.record(i, busy_ns, &mut rec);
        }
    }
    // Answers still due are awaited (a request in flight at the end completes), not recorded, for at most
    // DRAIN_TIMEOUT; the rest are abandoned (an overloaded open loop can leave more queued at the server
    // than it answers in minutes).
    // Those that fail then are counted as failed, and those never answered as unanswered: both among
    // the rejected (at the run's end).
    // The run's end: its duration, or when every job had stopped, or when it was stopped.
    let end = failures.ended_at.or(failures.interrupted_at).map_or(duration, Nanos::from_duration).min(duration);
    let end_t = Nanos(end.0.saturating_sub(1));
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while let Some(d) = inflight.next().await {
            let st = &mut states[d.job];
            st.at_window[d.k] -= 1;
            if let Some(e) = &d.err {
                rec.rejected(d.job, end_t);
                failures.note(&st.name, e);
                if connection_error(e) && reported.insert((d.job, d.conn)) {
                    report_broken(st, d.conn, e, &mut failures);
                }
            }
        }
    })
    .await;
    if !inflight.is_empty() {
        failures.unanswered = inflight.len() as u64;
        tracing::warn!(
            "{} requests still unanswered {} s after the run's end: abandoned, counted as rejected",
            inflight.len(),
            DRAIN_TIMEOUT.as_secs()
        );
    }
    drop(inflight);
    for (ji, n) in unanswered_by_job(&states) {
        for _ in 0..n {
            rec.rejected(ji, end_t);
        }
    }
    // Every connection disconnects at once, all within one DRAIN_TIMEOUT: a server that no longer reads (its
    // queues full) must not hold the end up either (one after another, 1,024 such connections took 85 min).
    let goodbyes = states.iter().flat_map(|st| st.clients.iter().flatten()).map(|c| c.disconnect());
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, futures_util::future::join_all(goodbyes)).await;
    let meta = RunMeta {
        name: cfg.name.clone(),
        scheduler: "measured".into(),
        seed: cfg.seed,
        tenants: cfg
            .jobs
            .iter()
            .zip(&specs)
            .map(|(j, spec)| TenantMeta {
                name: j.name.clone(),
                spec: *spec,
                // A pShift bucket's per-window streams are open whatever the workload says.
                open_loop: j.workload.kind.open_loop() || j.route.as_ref().is_some_and(|r| r.arrivals.is_some()),
            })
            .collect(),
        servers: servers
            .into_iter()
            .enumerate()
            .map(|(k, name)| ServerMeta {
                name,
                scheduler: "remote".into(),
                distributed: false,
                capacity: busy.capacity(k),
                busy_observed: busy.observed(k),
            })
            .collect(),
        cost_model: cfg.cost_model,
        phases_known,
    };
    // A run that ended early reports the time it ran, not the time it was planned for.
    if cfg.report_early_end {
        rec.end_at(end);
    }
    Ok(Outcome { totals: rec.finish(&meta), failures })
}

/// Each job's requests still unanswered (issued, neither completed nor failed).
fn unanswered_by_job(states: &[JobState]) -> Vec<(usize, u64)> {
    states.iter().enumerate().map(|(ji, st)| (ji, st.at_window.iter().map(|&n| u64::from(n)).sum())).collect()
}

/// Logs a line of [`crate::load_watch`] at its level.
fn say(line: Said) {
    match line {
        Said::Warn(l) => tracing::warn!("{l}"),
        Said::Info(l) => tracing::info!("{l}"),
    }
}

/// Why job `st` stops now, after a request on `conn` failed, if it does (module comment, "Failures"): it
/// has no whole connection left, or `max_errors` of its requests have failed.
fn stop_reason(st: &JobState, conn: (usize, usize), max_errors: Option<u64>) -> Option<String> {
    if st.clients.iter().flatten().all(|c| c.is_broken()) {
        let n: usize = st.clients.iter().map(Vec::len).sum();
        let c = &st.clients[conn.0][conn.1];
        let reason = c.broken().map_or_else(|| "?".to_string(), |b| b.to_string());
        let which = format!("connection {} to {}: {reason}", conn.1 + 1, st.addrs[conn.0]);
        return Some(if n == 1 {
            format!("its connection broke ({which}), and nothing more can be sent")
        } else {
            format!("all its {n} connections broke (the last: {which}), and nothing more can be sent")
        });
    }
    let limit = max_errors?;
    (st.failed >= limit).then(|| format!("{} of its requests failed (--max-errors {limit})", st.failed))
}

/// Stops job `st` at `t` for `why`: nothing of it is issued again (module comment, "Failures").
fn stop(st: &mut JobState, t: Nanos, why: &str, failures: &mut Failures) {
    st.stopped = true;
    st.gen.stop();
    let line = format!("job {}: stopped at {:.1} s: {why}", st.name, t.as_secs_f64());
    tracing::error!("{line}");
    failures.stopped.push(line);
}

/// Logs (once per connection: the caller keeps which) that a connection of `st` broke, with its reason.
fn report_broken(st: &JobState, conn: (usize, usize), e: &ClientError, failures: &mut Failures) {
    let reason = st.clients[conn.0][conn.1].broken().map_or_else(|| e.to_string(), |b| b.to_string());
    let line = format!("job {}: connection {} to {}: {reason}", st.name, conn.1 + 1, st.addrs[conn.0]);
    tracing::warn!("{line}");
    failures.broken.push(line);
}

/// The servers' device busy times, read from their admin endpoints each interval (`GET /api/device`).
struct BusyReads {
    /// Per report server: where its busy time is read (`None`: unknown).
    endpoints: Vec<Option<crate::admin_client::AdminEndpoint>>,
    /// Per server: the last busy time read (ns), the base of the next interval's difference.
    base: Vec<Option<u64>>,
    /// Per server: every read so far succeeded (a failed one makes its utilisation unknown, not low).
    ok: Vec<bool>,
    /// Per server: busy time read but not yet recorded (ns), because it exceeded its interval: a read
    /// comes a little after the interval's end, so an interval's difference can exceed its length while
    /// the next one's falls short.
    carry: Vec<u64>,
    /// Per server: its modelled device's capacity as read, `(from, IOPS)` with a point where it changed
    /// (at the end of the interval whose read first showed it: within an interval of the change); `None`
    /// once a read had none (no device model, or a failed read: unknown).
    capacity: Vec<Option<Vec<(Nanos, f64)>>>,
    interval: Nanos,
    duration: Nanos,
}

impl BusyReads {
    fn known(&self) -> bool {
        self.endpoints.iter().any(Option::is_some)
    }

    /// Whether server `k`'s busy time was read throughout the run.
    fn observed(&self, k: usize) -> bool {
        self.endpoints.get(k).is_some_and(Option::is_some) && self.ok[k]
    }

    /// Server `k`'s capacity over the run as read (rein-model's `ServerMeta::capacity`); empty when
    /// unknown.
    fn capacity(&self, k: usize) -> Vec<(Nanos, f64)> {
        if !self.observed(k) {
            return Vec::new();
        }
        self.capacity.get(k).cloned().flatten().unwrap_or_default()
    }

    /// Interval `i`'s busy time per server: the difference from the last read (plus what an earlier
    /// interval could not hold), at most the interval's length, recorded as busy up to the interval's end
    /// (the recorder counts what falls after the warm-up). So no interval is more than fully busy.
    fn record(&mut self, i: usize, read: Vec<Option<DeviceRead>>, rec: &mut Recorder) {
        let start = self.interval.0.saturating_mul(i as u64).min(self.duration.0);
        let end = self.interval.0.saturating_mul(i as u64 + 1).min(self.duration.0);
        for (k, read) in read.into_iter().enumerate() {
            if self.endpoints[k].is_none() {
                continue;
            }
            let schedule = &mut self.capacity[k];
            match (read.and_then(|d| d.capacity_iops), schedule.as_mut()) {
                (Some(c), Some(v)) if v.last().is_none_or(|l| l.1 != c) && end < self.duration.0 => {
                    v.push((Nanos(end), c))
                }
                (Some(_), Some(_)) => {}
                _ => *schedule = None,
            }
            let now = read.map(|d| d.busy_ns);
            match (self.base[k], now) {
                (Some(b), Some(n)) => {
                    let busy = n.saturating_sub(b) + self.carry[k];
                    let held = busy.min(end - start);
                    self.carry[k] = busy - held;
                    rec.server_busy(k, Nanos(end - held), Nanos(end));
                }
                _ => self.ok[k] = false,
            }
            self.base[k] = now;
        }
    }
}

/// What a read of a server's `GET /api/device` gives the run.
#[derive(Copy, Clone, Debug)]
struct DeviceRead {
    /// Busy time since the server started (ns).
    busy_ns: u64,
    /// The modelled device's capacity; `None` without a device model.
    capacity_iops: Option<f64>,
}

/// Each server's device busy time and capacity from its admin endpoint; `None` where there is none or
/// it failed.
async fn read_busy(
    endpoints: &[Option<crate::admin_client::AdminEndpoint>],
    token: Option<&crate::admin_guard::AdminToken>,
) -> Vec<Option<DeviceRead>> {
    let mut out = Vec::with_capacity(endpoints.len());
    for e in endpoints {
        out.push(match e {
            Some(e) => crate::admin_client::get_json::<crate::admin::DeviceJson>(e, token, "/api/device")
                .await
                .ok()
                .map(|d| DeviceRead { busy_ns: (d.busy_s * 1e9).round() as u64, capacity_iops: d.capacity_iops }),
            None => None,
        });
    }
    out
}

/// Records interval `i`'s completions by phase: the differences of the server's counters (`counts`, per
/// job) since `base` (then `base` moves on). A failed read (`None`) leaves the interval's phases at zero.
fn set_phases(i: usize, counts: Option<Vec<[u64; 3]>>, base: &mut Option<Vec<[u64; 3]>>, rec: &mut Recorder) {
    let Some(counts) = counts else { return };
    if let Some(b) = base.as_ref() {
        for (ji, (c, b)) in counts.iter().zip(b).enumerate() {
            let d = [0, 1, 2].map(|p| c[p].saturating_sub(b[p]).min(u32::MAX as u64) as u32);
            rec.set_phases(ji, i, d);
        }
    }
    *base = Some(counts);
}

/// Each job's (reservation, weight, over-limit) counts summed over its sources (indices into `endpoints`);
/// `None` if an endpoint could not be read.
async fn read_phases(
    endpoints: &[crate::admin_client::AdminEndpoint],
    token: Option<&crate::admin_guard::AdminToken>,
    sources: &[Vec<usize>],
    tenants: &[String],
) -> Option<Vec<[u64; 3]>> {
    let mut read = Vec::with_capacity(endpoints.len());
    for e in endpoints {
        read.push(crate::admin_client::get_json::<Vec<TenantJson>>(e, token, "/api/tenants").await.ok()?);
    }
    Some(
        sources
            .iter()
            .zip(tenants)
            .map(|(src, t)| {
                src.iter().fold([0u64; 3], |acc, &e| {
                    let c = phase_counts(&read[e], t);
                    [acc[0] + c[0], acc[1] + c[1], acc[2] + c[2]]
                })
            })
            .collect(),
    )
}

/// (reservation, weight, over-limit) completions of `tenant` in the server's counters.
fn phase_counts(ts: &[TenantJson], tenant: &str) -> [u64; 3] {
    ts.iter().find(|t| t.name == tenant).map_or([0; 3], |t| {
        let over = t.completed_over_limit_phase;
        [t.completed_reservation_phase, t.completed_weight_phase.saturating_sub(over), over]
    })
}

/// Starts or resumes a job's generation at `now`.
#[allow(clippy::too_many_arguments)]
fn begin(
    ji: usize,
    spec: &WorkloadSpec,
    st: &mut JobState,
    at: Nanos,
    now: Nanos,
    inflight: &mut InFlight,
    rec: &mut Recorder,
    arm: &mut dyn FnMut(Nanos, Timer),
) {
    match st.gen.begin(at, spec) {
        Begin::Fill => {
            for _ in 0..st.gen.deficit(None) {
                issue(ji, st, None, None, now, inflight, rec);
            }
        }
        Begin::FillPerServer => {
            for k in 0..st.windows.len() {
                if !st.active[k] {
                    continue;
                }
                for _ in 0..st.gen.deficit(Some(st.at_window[k])) {
                    issue(ji, st, None, Some(k), now, inflight, rec);
                }
            }
        }
        // Per-window streams replace the workload's own arrivals.
        Begin::ArriveAt(_) if st.arrivals.is_some() => {}
        Begin::ArriveAt(at) => arm(at, Timer::Arrive),
    }
}

/// Sends one request of job `ji`: generated (to window `k` of per-server windows), or a trace record
/// `(offset, size, read, device)`.
fn issue(
    ji: usize,
    st: &mut JobState,
    record: Option<(u64, u64, bool, u32)>,
    k: Option<usize>,
    now: Nanos,
    inflight: &mut InFlight,
    rec: &mut Recorder,
) {
    let (offset, size, read) = match record {
        Some((offset, size, read, device)) => {
            // Whole sectors within the export and the server's largest request ([`check_export`] refuses
            // an export or a server without one sector).
            let size = size.clamp(512, st.trace_max);
            let room = (st.export_size - size) / 512 + 1;
            let offset = (offset / 512 % room) * 512;
            // Routing by device: into the device's window's part of the export.
            let window = st.devices.as_ref().and_then(|r| r.device_server(device));
            match (window, &st.layout) {
                (Some(w), Some(layout)) => (layout.aim(w, offset, size), size, read),
                _ => (offset, size, read),
            }
        }
        None => {
            let size = st.gen.size_bytes();
            let io = st.gen.next_io();
            match (k, &st.layout) {
                (Some(k), Some(layout)) => (layout.aim(k, io.offset, size), size, io.read),
                _ => (io.offset, size, io.read),
            }
        }
    };
    let k = k.or_else(|| st.layout.as_ref().map(|l| l.window_of(offset))).unwrap_or(0).min(st.windows.len() - 1);
    rec.arrival(ji, now);
    if st.gen.in_flight() as usize >= st.max_pending {
        // Over the bound: the arrival is dropped (counted).
        rec.rejected(ji, now);
        return;
    }
    st.gen.issued();
    st.at_window[k] += 1;
    let g = if st.clients.len() > 1 { k } else { 0 };
    let n = st.clients[g].len();
    let mut i = st.pick[g].choose(offset, size, n);
    // A broken connection is passed over for the next whole one (if none is, the request fails at once).
    if let Some(whole) = (0..n).map(|d| (i + d) % n).find(|&c| !st.clients[g][c].is_broken()) {
        i = whole;
    }
    let client = st.clients[g][i].clone();
    st.watch.issued((g, i), now);
    let (payload, clock) = (st.payload.clone(), st.clock);
    inflight.push(Box::pin(async move {
        let r = if read {
            client.request(Command::Read, offset, size as u32, &[], false).await
        } else if let Some(p) = payload.get(..size as usize) {
            client.request(Command::Write, offset, size as u32, p, false).await
        } else {
            // A trace record larger than the job's size.
            client.request(Command::Write, offset, size as u32, &vec![0x5au8; size as usize], false).await
        };
        Done { job: ji, k, conn: (g, i), issued: now, done: clock.now(), read, offset, bytes: size, err: r.err() }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sequential run stays on one connection (up to the per-connection bound, then moves on); any other
    /// request takes the next connection in turn, so random offsets spread evenly.
    #[test]
    fn a_sequential_run_stays_on_its_connection() {
        let mut p = Pick::default();
        let seq: Vec<usize> = (0..6).map(|i| p.choose(i * 4096, 4096, 4)).collect();
        assert_eq!(seq, [0; 6]);
        let jumps: Vec<usize> = [1u64 << 30, 7 << 20, 3 << 20, 5 << 20].iter().map(|&o| p.choose(o, 4096, 4)).collect();
        assert_eq!(jumps, [1, 2, 3, 0]);
        // The last jump's run continues on its connection, the next jump goes on in turn.
        assert_eq!(p.choose((5 << 20) + 4096, 4096, 4), 0);
        assert_eq!(p.choose(0, 4096, 4), 1);
        let mut p = Pick::default();
        let long: Vec<usize> =
            (0..crate::nbd::MAX_IN_FLIGHT_PER_CONN as u64 + 1).map(|i| p.choose(i * 512, 512, 4)).collect();
        assert!(long[..crate::nbd::MAX_IN_FLIGHT_PER_CONN].iter().all(|&c| c == 0));
        assert_eq!(long[crate::nbd::MAX_IN_FLIGHT_PER_CONN], 1, "at the bound the run moves on");
        assert_eq!(Pick::default().choose(0, 512, 1), 0);
    }

    /// A one-second run of one job "v" (export and tenant "v") of `params` over `connections`
    /// connections to `addr`, named `name`, measured from its start (no warm-up).
    fn one_job_run(
        addr: SocketAddr,
        name: &str,
        connections: usize,
        params: rein_model::workload::WorkloadParams,
    ) -> LoadConfig {
        let workload = params.validate(Nanos::from_secs(1), None, &[]).unwrap();
        let job = Job {
            name: "v".into(),
            export: "v".into(),
            tenant: "v".into(),
            connections,
            workload,
            route: None,
            stream: None,
        };
        LoadConfig {
            interval: Duration::from_millis(500),
            name: name.into(),
            ..LoadConfig::new(addr, vec![job], Duration::from_secs(1))
        }
    }
    /// A run whose timeseries would exceed the recorder's bound is refused before it connects to
    /// anything, naming the numbers: it was refused only when the recorder was made, after opening every
    /// job's connections (here, to a listener that never answers the handshake: CONNECT_TIMEOUT first).
    #[tokio::test]
    async fn a_run_over_the_cell_bound_is_refused_before_connecting() {
        let listener = std::net::TcpListener::bind("127.0.0.188:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let one = one_job_run(addr, "big", 1, rein_model::workload::WorkloadParams::default()).jobs.remove(0);
        // (600 jobs + 1 server) x 86,400 intervals of 1 s: 51,926,400 cells.
        let jobs = |n: usize| (0..n).map(|i| Job { name: format!("j{i}"), ..one.clone() }).collect();
        let cfg = LoadConfig::new(addr, jobs(600), Duration::from_secs(86_400));
        let e = tokio::time::timeout(Duration::from_secs(5), run_checked(cfg, |_, _| {}))
            .await
            .expect("refused at once")
            .unwrap_err();
        assert!(
            matches!(&e, LoadError::Timeseries { cells, duration_s, interval_s }
                if cells.tenants == 600 && cells.servers == 1 && cells.intervals == 86_400
                    && *duration_s == 86_400.0 && *interval_s == 1.0),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "duration 86400 s / interval 1 s = 86400 intervals, x (600 jobs + 1 servers), exceeds 50000000 \
             timeseries cells: run fewer jobs or a shorter run"
        );
        let accepted = listener.accept().map(|_| ());
        assert_eq!(accepted.unwrap_err().kind(), std::io::ErrorKind::WouldBlock, "no connection was made");
        // At the bound: 577 jobs + 1 server over 86,400 intervals fit (49,939,200 cells), one more does not.
        let at = LoadConfig::new(addr, jobs(577), Duration::from_secs(86_400));
        assert!(at.validate().is_ok(), "{:?}", at.validate());
        let over = LoadConfig::new(addr, jobs(578), Duration::from_secs(86_400));
        assert!(matches!(over.validate(), Err(LoadError::Timeseries { .. })));
    }

    /// A server that completes the handshake and then stops reading: the run's end (answers still due,
    /// then the disconnects) takes at most two DRAIN_TIMEOUTs whatever the connections. One disconnect
    /// after another took a DRAIN_TIMEOUT each (8 connections: 47 s; 1,024: 85 min).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_disconnects_at_the_end_are_bounded_together() {
        let listener = tokio::net::TcpListener::bind("127.0.0.72:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let deaf = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let info = crate::testkit::export_v();
                if crate::testkit::serve_handshake(&mut s, &info, None).await.is_some() {
                    held.push(s); // open, never read again
                }
            }
        });
        let p = rein_model::workload::WorkloadParams {
            outstanding: Some(128),
            size_kb: Some(1024.0),
            read_pct: Some(0.0),
            span_gb: 0.001,
            ..Default::default()
        };
        let cfg = one_job_run(addr, "deaf", 8, p);
        let started = std::time::Instant::now();
        let bound = Duration::from_secs(1) + DRAIN_TIMEOUT * 2 + Duration::from_secs(5);
        let run = tokio::spawn(run_checked(cfg, |_, _| {}));
        let res = tokio::time::timeout(bound, run).await;
        deaf.abort();
        let out = res.expect("the end is bounded").unwrap().unwrap();
        assert_eq!(out.totals.summary.tenants.len(), 1);
        assert!(started.elapsed() < bound);
        // The requests never answered are counted (they were dropped without a trace), among the rejected.
        let unanswered = out.failures.unanswered;
        assert!(unanswered > 0 && out.failures.any(), "{:?}", out.failures);
        assert_eq!(out.totals.summary.tenants[0].rejected, unanswered, "{:?}", out.failures);
    }

    /// A server that answers every request with NBD_ESHUTDOWN (nbdkit does on SIGTERM): the job's
    /// connection is over, its breaking is logged once, and the closed loop stops. Each replacement failed
    /// at once, unsent, and was replaced again: a loop on one CPU for the rest of the run, 24 million
    /// "failed" requests in 18 s that no server saw.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_shutting_down_ends_the_connection_without_a_spin() {
        use rein_proto::nbd::Event;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.226:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, mut machine, mut buf) = crate::testkit::accept_v(&listener).await.unwrap();
            machine.shut_down();
            let mut rejected = 0u64;
            loop {
                let (used, event) = machine.feed(&buf).unwrap();
                // The reply to send; None: more input needed.
                let reply = match event {
                    Event::NeedMore { .. } => None,
                    Event::Reject(r) => {
                        let mut reply = Vec::new();
                        machine.replies().rejection(&mut reply, &r);
                        Some(reply)
                    }
                    Event::Disconnect => return rejected,
                    other => panic!("unexpected {other:?}"),
                };
                buf.drain(..used);
                match reply {
                    None if s.read_buf(&mut buf).await.unwrap() == 0 => return rejected,
                    None => {}
                    Some(reply) => {
                        s.write_all(&reply).await.unwrap();
                        rejected += 1;
                    }
                }
            }
        });
        let p =
            rein_model::workload::WorkloadParams { outstanding: Some(4), read_pct: Some(100.0), ..Default::default() };
        let cfg = one_job_run(addr, "shutdown", 1, p);
        let out = tokio::time::timeout(Duration::from_secs(30), run_checked(cfg, |_, _| {})).await.unwrap().unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(10), server).await.unwrap().unwrap();
        // The window's 4 requests at most (those sent after the first answer are not: the client sends
        // only its disconnect then), each failed once, and no more.
        assert!((1..=4).contains(&seen), "{seen}");
        assert!(out.failures.failed <= 4, "the window's requests, no more: {:?}", out.failures);
        assert_eq!(out.totals.summary.tenants[0].rejected, out.failures.failed);
        assert_eq!(out.failures.broken.len(), 1, "{:?}", out.failures.broken);
        assert!(out.failures.broken[0].contains("the server is shutting down"), "{:?}", out.failures.broken);
    }

    /// Busy time read a little late is carried into the next interval, never recorded as more than an
    /// interval holds; a failed read makes the server's utilisation unknown. The capacity read with it
    /// (a modelled device's) is kept where it changed, and unknown for a server with a failed read.
    #[test]
    fn busy_reads_carry_the_excess_and_never_exceed_an_interval() {
        let sec = 1_000_000_000u64;
        let endpoint: crate::admin_client::AdminEndpoint = SocketAddr::from(([127, 0, 0, 1], 9)).into();
        let mut busy = BusyReads {
            endpoints: vec![Some(endpoint.clone()), Some(endpoint)],
            base: vec![Some(0), Some(0)],
            ok: vec![true, true],
            carry: vec![0, 0],
            capacity: vec![Some(vec![(Nanos::ZERO, 2400.0)]), Some(vec![(Nanos::ZERO, 100.0)])],
            interval: Nanos(sec),
            duration: Nanos(3 * sec),
        };
        let mut rec = Recorder::new(0, 2, Nanos(3 * sec), Nanos(sec), Nanos::ZERO).unwrap();
        let d = |busy_ns: u64, capacity: f64| Some(DeviceRead { busy_ns, capacity_iops: Some(capacity) });
        // Server 0: 1.2 s by the first read (0.2 s of it belongs to the next interval), 1.8 s, then 3.0 s;
        // its capacity halved during the second interval (and a change at the run's end is not kept).
        busy.record(0, vec![d(sec * 12 / 10, 2400.0), d(sec / 2, 100.0)], &mut rec);
        busy.record(1, vec![d(sec * 18 / 10, 1200.0), None], &mut rec);
        busy.record(2, vec![d(3 * sec, 600.0), d(sec, 100.0)], &mut rec);
        assert!(busy.observed(0) && !busy.observed(1), "server 1 missed a read");
        assert_eq!(busy.capacity(0), [(Nanos::ZERO, 2400.0), (Nanos(2 * sec), 1200.0)]);
        assert_eq!(busy.capacity(1), [], "unknown after a failed read");
        let meta = RunMeta {
            name: "t".into(),
            scheduler: "measured".into(),
            seed: 1,
            tenants: Vec::new(),
            servers: (0..2)
                .map(|k| ServerMeta {
                    name: format!("s{k}"),
                    scheduler: "remote".into(),
                    distributed: false,
                    capacity: Vec::new(),
                    busy_observed: busy.observed(k),
                })
                .collect(),
            phases_known: false,
            cost_model: rein_core::CostModel::PerIo,
        };
        let totals = rec.finish(&meta);
        // 1.0 + (0.6 + 0.2) + 1.0 (1.2 read, the 0.2 beyond the run dropped) over 3 s.
        let u = totals.summary.servers[0].utilisation.unwrap();
        assert!((u - 2.8 / 3.0).abs() < 1e-9, "{u}");
        assert_eq!(totals.summary.servers[1].utilisation, None);
    }
}
