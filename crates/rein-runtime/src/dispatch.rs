//! The QoS dispatcher: rein-core's scheduler on a real clock, in front of a storage backend.
//!
//! # Model
//! One dispatcher task per backend owns a [`Scheduler`] (mClock by default; SFQ or FIFO for comparison),
//! unchanged from the simulator's. Connections send it [`IoRequest`]s over a bounded channel; it queues
//! them under their tenant, and whenever fewer than `depth` (D) requests are outstanding at the backend it
//! asks the scheduler for the next one and starts it.
//!
//! # Where a request runs
//! Each started request takes one of three routes, chosen from the configured [`IoEngine`] and from what
//! its storage says it can do ([`Storage::kernel_io`], [`Storage::inline_max_bytes`]), never from what type
//! the storage is (`offer_to_ring`, `runs_inline`):
//! 1. **The ring** (engine `uring`, the default): reads, writes (FUA as the write, then `fdatasync`) and
//!    flushes of storage that offers a descriptor are submitted to an io_uring owned by this task ([`crate::uring`]);
//!    page-cache hits complete during the submit call itself, the rest signal an eventfd this loop awaits.
//!    If the kernel refuses io_uring the engine falls back to `threads`. Every sync of such a storage
//!    runs on the ring, which runs them one at a time per storage (its invariant 5): a FUA trim or
//!    write-zeroes runs on the blocking pool (3.) without its sync, then comes back here for the ring to
//!    sync it. Before 2026-12-06 the pool ran its `fdatasync` too, beside the ring's, and answered 0
//!    whenever a ring's sync had taken the writeback error (Linux reports it to one sync only).
//! 2. **Inline**, on this task: IO the storage says never blocks (RAM: up to
//!    [`crate::storage::MEMORY_INLINE_MAX`]; a memory copy is cheaper than any hand-off), and with engine
//!    `inline` any IO up to `inline_max_bytes` other than a flush (only sensible for RAM-like storage).
//! 3. **The blocking pool** (tokio's, `pread`/`pwrite`): everything else, e.g. trim and write-zeroes of
//!    files, and every file IO with engine `threads`.
//!
//! Why capabilities rather than an engine object per export: the ring belongs to the dispatcher (one per
//! device, shared by all the exports on it, so that D bounds the device's queue), while whether a request
//! can use it depends on the storage and on the operation. Two narrow questions to the storage keep that
//! split, and a new backend is driven safely (the pool) until it answers them.
//!
//! A read's buffer is allocated once, with `headroom` spare bytes in front ([`Op::Read`]) that the NBD
//! server fills with the reply header: the data is not copied between the storage and the socket.
//!
//! A [`Poll::Wait`] arms a timer; a completion, a new request or a ring wake-up re-runs the loop. Time is
//! [`Clock`]: nanoseconds since the dispatcher started, from tokio's monotonic `Instant`.
//!
//! With a device model ([`crate::devmodel`]: rein-model's device, the simulator's), each request is also
//! admitted to the modelled device when it starts, and completes at `max(real IO done, modelled
//! completion)`. The model's next completion or capacity step is one more timer of this loop (no task per
//! request). That gives repeatable capacity for QoS experiments on any machine, a capacity schedule, and a
//! capacity that can change at run time.
//!
//! # pShift
//! With `scheduler = "token"` and a controller link ([`crate::pshift_link`]), the dispatcher also holds
//! rein-core's `TokenServer` (the simulator's pShift servers run the same): it reports each boundary's
//! interval and applies the controller's tokens. Counting starts at the controller's welcome (the IOs
//! then at the device count as in flight); tenants created later are mapped to their buckets at the next
//! boundary, deleted ones released at once. A boundary's report is cut at the boundary as the link
//! places it on this clock ([`Dispatcher::pshift_cut_at`], then one interval after each cut) and kept
//! for the controller's request; a request before its place is answered with a report cut then. The
//! link's latest placement wins over the schedule kept here (a boundary already cut re-places the ones
//! after it), so a schedule that drifted from the controller's (an offset measured with stale pings
//! after the controller stalled) comes back in step at the next ping instead of cutting early for good.
//! The device's busy time in a report leaves out the stalls of this process (SIGSTOP, a paused VM) that
//! fell while IOs were at the backend (`stall.rs`'s watch, the process's): its IOs finish
//! during the stall but are reaped after it, so the busy time held the whole stall, and the controller's
//! capacity estimate for the server (completed / busy x time left, pshift.txt §III-D) fell by the
//! stall's share of the interval for a round (a 3 s stall in a 1 s interval: to a quarter). Only the
//! backend's busy time: a device model's is its own.
//!
//! # Measurements
//! Per tenant: completions by phase, bytes, errors, a latency histogram (arrival to completion), the IOPS
//! of the last whole second, and *seconds below reservation*, judged by rein-model's reservation meter
//! (the simulator's checks use the same rule): seconds in which the tenant had requests in the server
//! (queued or at the backend) both when the second began and when it ended, yet was served less than its
//! reservation (minus one IO of rounding) during it. On a storage node a striped tenant's reservation is
//! the cluster's (dmClock's r_i), and the node judges its own part of it: `r c / (c + e)` for a second in
//! which it served the tenant cost `c` and the scheduler charged its reservation clock `e` for service
//! elsewhere (`TenantStats::rho`: the requests' rho; by default the estimate `c (1 - s)/s` from the
//! reservation share s the gateway's tracker sends, so the part is `r s`), kept from the last second
//! that served it. A node that owes the tenant `r s` and serves that does not count it below its
//! reservation; on one server `e` is 0 and the part is r. (Not own service plus the requests' delta, all
//! of the service elsewhere, against r: counted as requests arrive, that sum jitters from second to
//! second, and a tenant held at exactly its reservation read below it in a quarter of its seconds on
//! real nodes; nor own plus rho against r, whose one IO of tolerance shrinks to `s` of an IO here.) Per backend: outstanding IOs and a latency histogram
//! from dispatch to completion.
//!
//! # Invariants
//! 1. `outstanding <= depth` (asserted).
//! 2. Every request received is answered exactly once: completed, failed by the backend, or refused
//!    (unknown tenant, full queue, shutdown) with an error.
//! 3. On shutdown, queued requests are still dispatched and in-flight ones drained before the task ends.

use crate::devmodel::{DeviceConfig, ModelledDevice};
use crate::storage::{KernelIo, Storage, StorageError};
use crate::uring::{drain_eventfd, Completion, Uring, UringOp};
use rein_core::pshift::{ServerReport, StrayArrival, TokenMessage, TokenScheduler, TokenServer};
use rein_core::{
    Cost, Nanos, Phase, Piggyback, Poll, QosSpec, Request, SchedConfig, SchedError, Scheduler, SchedulerKind, TenantId,
    TenantStats,
};
use rein_model::device::DeviceError;
use rein_model::meter::ReservationMeter;
use rein_proto::ErrorKind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Monotonic time since an origin, as the core wants it. Built on tokio's `Instant`, which is the OS
/// monotonic clock in production and virtual time in tests that pause tokio's clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose origin is the present instant: [`Clock::now`] reads `Nanos(0)` now.
    pub fn new() -> Clock {
        Clock { origin: Instant::now() }
    }
    /// Nanoseconds since the origin; never decreases. Saturates at `u64::MAX` (about 584 years).
    pub fn now(&self) -> Nanos {
        Nanos::from_duration(self.origin.elapsed())
    }
    /// The tokio `Instant` at which [`Clock::now`] reads `t`: turns a core deadline (a [`Poll::Wait`]) into
    /// a timer.
    pub fn instant(&self, t: Nanos) -> Instant {
        self.origin + std::time::Duration::from_nanos(t.0)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// What a request asks of the backend.
#[derive(Debug)]
pub enum Op {
    /// Read `len` bytes. The result is one buffer of `headroom + len` bytes: `headroom` zero bytes the
    /// caller may fill later (a reply header), then the data.
    Read {
        /// Bytes to read from the request's offset.
        len: u32,
        /// Zero bytes placed in front of the data in the result buffer (not read from the storage); the
        /// NBD server writes its reply header there. 0 for a plain read.
        headroom: usize,
    },
    /// Write `data`.
    Write {
        /// The bytes to write at the request's offset; their length is the request's size.
        data: Vec<u8>,
    },
    /// Make completed writes durable.
    Flush,
    /// Discard `len` bytes.
    Trim {
        /// Bytes to discard from the request's offset; they read as zeroes afterwards.
        len: u32,
    },
    /// Write `len` zero bytes.
    WriteZeroes {
        /// Bytes to set to zero from the request's offset.
        len: u32,
        /// The range may become a hole (a discard that reads as zeroes: [`Storage::trim`]); false keeps
        /// it allocated (NBD's NO_HOLE).
        may_punch: bool,
    },
}

impl Op {
    /// A read of `len` bytes without headroom.
    pub fn read(len: u32) -> Op {
        Op::Read { len, headroom: 0 }
    }

    /// Bytes the request moves or covers.
    pub fn len(&self) -> u64 {
        match self {
            Op::Read { len, .. } | Op::Trim { len } | Op::WriteZeroes { len, .. } => *len as u64,
            Op::Write { data } => data.len() as u64,
            Op::Flush => 0,
        }
    }
    /// Whether the request covers no bytes (a flush, or a zero-length request). The scheduler still gets
    /// it with a size of 1 byte (sizes are at least 1).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request for the dispatcher: an operation on an export's storage, scheduled under a tenant's QoS.
pub struct IoRequest {
    /// The export's storage (several exports may share one dispatcher, i.e. one device).
    pub storage: Arc<dyn Storage>,
    /// Whose queue and spec the request is scheduled under: an id from [`Dispatcher::add_tenant`]; any
    /// other is refused with [`IoError::Refused`].
    pub tenant: TenantId,
    /// Byte offset into the storage (unused by a flush). Also the scheduler's locality hint.
    pub offset: u64,
    /// What to do, and on how many bytes.
    pub op: Op,
    /// Force unit access: the write is durable before it is answered.
    pub fua: bool,
    /// What the tenant's tracker at a gateway says it received elsewhere (dmClock's delta and rho, the
    /// spread's share; `rein_core::Request::piggyback`): set on storage-node sessions, `None` (nothing
    /// elsewhere) on plain ones.
    pub piggyback: Option<Piggyback>,
}

/// A completed request: a read's buffer (its headroom, then the data; empty for other requests), or the
/// error.
pub type IoResult = Result<Vec<u8>, IoError>;

/// How the scheduler served a request: the phase of its dispatch and the cost it was charged (without any
/// delta: `rein_core::Dispatch::cost`), or nothing for a request answered without a dispatch (refused
/// on arrival, failed at shutdown). A storage node's reply trailer carries it to the gateway.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// The phase; `None`: not dispatched.
    pub phase: Option<Phase>,
    /// The cost charged; `Cost(0)` when not dispatched.
    pub cost: Cost,
}

/// The callback of [`Dispatcher::submit`].
pub type Done = Box<dyn FnOnce(IoResult, Served) + Send>;

/// Where a request's result goes: a oneshot channel ([`Dispatcher::io`]) or a callback run on the
/// dispatcher task ([`Dispatcher::submit`]; it must be quick and must not block).
pub enum Reply {
    /// The result is sent on this channel; a receiver that is gone is ignored.
    Channel(oneshot::Sender<IoResult>),
    /// The function is called once with the result and how it was served, on the dispatcher task. The
    /// flag, if any, says that nobody can receive the result any more ([`Dispatcher::submit`]).
    Callback(Done, Option<Arc<AtomicBool>>),
}

impl Reply {
    fn send(self, r: IoResult, served: Served) {
        match self {
            Reply::Channel(tx) => {
                let _ = tx.send(r);
            }
            Reply::Callback(f, _) => f(r, served),
        }
    }

    /// Nobody waits for the result any more: the `io` caller dropped its future, or the submitter set the
    /// flag (its client's connection broke).
    fn is_abandoned(&self) -> bool {
        match self {
            Reply::Channel(tx) => tx.is_closed(),
            Reply::Callback(_, gone) => gone.as_ref().is_some_and(|g| g.load(Ordering::Relaxed)),
        }
    }
}

/// Why a request (or a tenant change) was not served.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The storage refused the IO (out of range, read-only) or the operating system failed it.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The scheduler did not take the request or change: an unknown tenant, a full queue, too many
    /// tenants.
    #[error("scheduler refused the request: {0}")]
    Refused(#[from] SchedError),
    /// The dispatcher task ended (the runtime is shutting down, or the task panicked) before answering.
    #[error("server is shutting down")]
    Shutdown,
    /// Nobody could receive the result any more when the request's turn came (its client's connection
    /// broke): it was not run ([`Dispatcher::submit`]).
    #[error("the requester is gone; not run")]
    Abandoned,
    /// A storage node behind a gateway failed the request, or could not be reached in time
    /// ([`crate::remote`]); `kind` is what the front answers.
    #[error("node {node}: {message}")]
    Node {
        /// The node's name.
        node: String,
        /// What the front answers.
        kind: ErrorKind,
        /// What happened.
        message: String,
    },
}

impl IoError {
    /// What kind of failure this is for a client: the storage's kind; an unknown tenant is an invalid
    /// request; any other refusal (a full queue) a lack of resources.
    pub fn kind(&self) -> ErrorKind {
        match self {
            IoError::Storage(e) => e.kind(),
            IoError::Refused(SchedError::UnknownTenant(_)) => ErrorKind::InvalidRequest,
            IoError::Refused(_) => ErrorKind::Exhausted,
            IoError::Shutdown => ErrorKind::Shutdown,
            IoError::Abandoned => ErrorKind::Io,
            IoError::Node { kind, .. } => *kind,
        }
    }
}

/// Per-tenant measurements kept by the dispatcher.
#[derive(Clone, Debug, Default)]
pub struct TenantCounters {
    /// Requests completed without error, by the [`Phase::index`] of the phase they were dispatched in.
    pub completed: [u64; 3],
    /// Bytes moved or covered ([`Op::len`]) by the requests counted in `completed`.
    pub bytes: u64,
    /// Requests answered with an error: refused by the scheduler on arrival, or failed by the storage.
    pub errors: u64,
    /// Sum of the latencies (arrival at the dispatcher to completion, ns) of the requests counted in
    /// `completed`; divided by their total, the mean latency.
    pub latency_sum_ns: u128,
    /// Latency histogram: counts in buckets with upper bounds [`LATENCY_BUCKETS_S`] (+Inf last), so
    /// `LATENCY_BUCKETS_S.len() + 1` entries (empty in a `Default` value).
    pub latency_buckets: Vec<u64>,
    /// Completions per second over the last tick (about one second); 0 until a tick has passed since the
    /// tenant was added.
    pub iops_last_s: f64,
    /// Requests received and not yet answered (queued at the scheduler or at the backend).
    pub in_flight: u64,
    /// Requests not run because nobody could receive their result any more when their turn came
    /// ([`IoError::Abandoned`]; not in `errors`).
    pub abandoned: u64,
    /// The reservation meter behind [`TenantCounters::below_reservation_s`].
    meter: Option<ReservationMeter>,
    /// Cost dispatched here, and the service elsewhere charged to its reservation clock
    /// ([`rein_core::TenantStats::rho`]), at the last tick (fixed point).
    own_at_tick: u128,
    rho_at_tick: u128,
    /// The part of the tenant's reservation this server owes (module comment): 1 on one server.
    part: Option<f64>,
    /// Completions at the last tick (for `iops_last_s`).
    completed_at_tick: u64,
}

impl TenantCounters {
    /// Seconds backlogged yet served below the reservation (module comment), as the meter counts them.
    pub fn below_reservation_s(&self) -> u64 {
        self.meter.as_ref().map_or(0, |m| m.below_seconds().round() as u64)
    }
}

/// Upper bounds (seconds) of the latency histogram buckets (Prometheus style).
pub const LATENCY_BUCKETS_S: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// The [`LATENCY_BUCKETS_S`] bucket of `latency` (the last, +Inf, past them all).
pub(crate) fn bucket_of(latency: Nanos) -> usize {
    let s = latency.as_secs_f64();
    LATENCY_BUCKETS_S.iter().position(|&u| s <= u).unwrap_or(LATENCY_BUCKETS_S.len())
}

/// Backend latency (dispatch to completion), all tenants together.
#[derive(Clone, Debug, Default)]
pub struct BackendCounters {
    /// Requests dispatched to the backend and finished there, successfully or not.
    pub completed: u64,
    /// Sum of their backend latencies in ns: dispatch to completion (with a device model, to the later of
    /// the real and the modelled completion).
    pub latency_sum_ns: u128,
    /// Histogram of the backend latencies, laid out as [`TenantCounters::latency_buckets`].
    pub latency_buckets: Vec<u64>,
}

/// A snapshot of one tenant.
#[derive(Clone, Debug)]
pub struct TenantSnapshot {
    /// The tenant's id, as [`Dispatcher::add_tenant`] returned it.
    pub id: TenantId,
    /// Its spec now (after any [`Dispatcher::set_spec`]).
    pub spec: QosSpec,
    /// The scheduler's counts for it: dispatched requests and cost by phase, requests queued now.
    pub sched: TenantStats,
    /// The dispatcher's measurements for it.
    pub counters: TenantCounters,
}

/// A snapshot of the dispatcher.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// When it was taken, on the dispatcher's [`Clock`] (ns since the dispatcher started).
    pub now: Nanos,
    /// The scheduling algorithm in use.
    pub scheduler: SchedulerKind,
    /// Requests at the backend now (dispatched, not yet completed); at most `depth`.
    pub outstanding: usize,
    /// D: the most requests outstanding at the backend at once ([`DispatchConfig::depth`]).
    pub depth: usize,
    /// Every tenant added, in the order it was added.
    pub tenants: Vec<TenantSnapshot>,
    /// The modelled device's capacity now, in IOPS; `None` without a device model.
    pub capacity_iops: Option<f64>,
    /// Time the device was busy since the dispatcher started (ns): with a device model, the model's busy
    /// periods (requests present, on the model's time, as the simulator's utilisation); otherwise the time
    /// with at least one IO outstanding at the backend.
    pub busy_ns: u64,
    /// Backend latency, all tenants together.
    pub backend: BackendCounters,
    /// The engine actually in use (after any fallback).
    pub io_engine: IoEngine,
    /// With the io_uring engine, the ring's syncs since the start: asked for (flushes and FUA writes'
    /// syncs) and handed to the kernel, fewer when syncs that came while one of their storage ran were
    /// merged into the next (a group commit; `crate::uring`'s invariant 5). `None` without a ring.
    pub syncs: Option<(u64, u64)>,
}

impl Snapshot {
    /// Its tenants by id (the registry lists tenants by name with their ids; a scan of this list per
    /// tenant made a look at N of them cost N^2 comparisons).
    pub fn by_id(&self) -> std::collections::HashMap<TenantId, &TenantSnapshot> {
        self.tenants.iter().map(|t| (t.id, t)).collect()
    }
}

enum Cmd {
    Io(IoRequest, Reply),
    AddTenant(QosSpec, oneshot::Sender<Result<TenantId, SchedError>>),
    SetSpec(TenantId, QosSpec, oneshot::Sender<Result<(), SchedError>>),
    SetConfig(SchedConfig, oneshot::Sender<()>),
    RemoveTenant(TenantId, oneshot::Sender<Result<(), SchedError>>),
    /// A snapshot of every tenant (`None`) or of these.
    Snapshot(Option<Vec<TenantId>>, oneshot::Sender<Snapshot>),
    SetCapacity(f64, oneshot::Sender<Result<(), CapacityError>>),
    ServiceScale(TenantId, f64),
    Abort(oneshot::Sender<usize>),
    /// pShift: a controller welcomed this server ([`Dispatcher::pshift_attach`]).
    PshiftAttach(PshiftAttach, oneshot::Sender<Result<(), PshiftError>>),
    /// pShift: the report for `(round, early)`.
    PshiftReport(u64, u32, oneshot::Sender<Result<ServerReport, PshiftError>>),
    /// pShift: the controller's tokens.
    PshiftTokens(TokenMessage),
    /// pShift: the controller is gone.
    PshiftDetach,
    /// pShift: the stall watch is this one (a test's, ticked by hand).
    #[cfg(test)]
    PshiftWatch(Arc<crate::stall::StallWatch>),
    /// pShift: the server's tenants that are buckets now ([`Dispatcher::pshift_map`]).
    PshiftMap(Vec<(TenantId, u32)>),
    /// pShift: where the next boundary's report is to be cut ([`Dispatcher::pshift_cut_at`]).
    PshiftCutAt(Cut),
}

/// IOs of tenant `id` at the backend now: received and not answered, less those still queued.
fn at_device(counters: &[TenantCounters], ts: &TokenScheduler, id: TenantId) -> u64 {
    let received = counters.get(id.index()).map_or(0, |c| c.in_flight);
    let queued = ts.stats(id).map_or(0, |st| st.queued as u64);
    received.saturating_sub(queued)
}

/// Why the dispatcher refuses a pShift call ([`Dispatcher::pshift_attach`],
/// [`Dispatcher::pshift_report`]); the link says which call.
#[derive(Debug, thiserror::Error)]
pub enum PshiftError {
    /// The dispatcher has stopped.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// A welcome to a server whose scheduler is not pShift's token scheduler.
    #[error("pShift needs scheduler = \"token\" (this server runs {running})")]
    NotToken {
        /// The scheduler it runs (its name in configs).
        running: &'static str,
    },
    /// The process's stall watch cannot start (`crate::stall`), as it says.
    #[error(transparent)]
    StallWatch(crate::stall::StallWatchError),
    /// A report asked of a server no controller has welcomed.
    #[error("no pShift controller has welcomed this server")]
    NotWelcomed,
}

/// What a pShift server learns from the controller's welcome ([`Dispatcher::pshift_attach`]).
#[derive(Debug)]
pub struct PshiftAttach {
    /// This server's index at the controller.
    pub server: u32,
    /// Whether stray arrivals are noted (the controller runs early rounds).
    pub strays: bool,
    /// Each bucket this server has: (its tenant here, its number at the controller).
    pub buckets: Vec<(TenantId, u32)>,
    /// Per bucket number, whether the controller limits it (empty: none).
    pub limited: Vec<bool>,
    /// Where stray-arrival notes go.
    pub strays_to: mpsc::UnboundedSender<StrayArrival>,
}

/// The dispatcher's scheduler: any kind behind the trait, or pShift's token scheduler held as itself (its
/// server side, [`TokenServer`], works on it).
enum Sched {
    Dyn(Box<dyn Scheduler>),
    Token(Box<TokenScheduler>),
}

impl std::ops::Deref for Sched {
    type Target = dyn Scheduler;
    fn deref(&self) -> &(dyn Scheduler + 'static) {
        match self {
            Sched::Dyn(s) => s.as_ref(),
            Sched::Token(t) => t.as_ref(),
        }
    }
}

impl std::ops::DerefMut for Sched {
    fn deref_mut(&mut self) -> &mut (dyn Scheduler + 'static) {
        match self {
            Sched::Dyn(s) => s.as_mut(),
            Sched::Token(t) => t.as_mut(),
        }
    }
}

/// A pShift server's state in the dispatcher: rein-core's [`TokenServer`] (the simulator's servers run the
/// same), the buckets by number, where stray notes go, and the busy time already reported.
struct PshiftState {
    server: TokenServer,
    bucket_ids: std::collections::HashMap<u32, TenantId>,
    strays_to: mpsc::UnboundedSender<StrayArrival>,
    busy_mark: u64,
    /// This process's stalls (module comment, "pShift").
    watch: Arc<crate::stall::StallWatch>,
    /// The watch's clock less this dispatcher's (ns): converts its times to this clock.
    watch_offset: i128,
    /// Stall time up to which the busy time was corrected.
    stall_counted_to: Nanos,
    /// Stall time inside the device's busy periods since the last report (ns): not busy time.
    stalled_busy_ns: u64,
    /// The next boundary on this clock, as the link placed it ([`Dispatcher::pshift_cut_at`]).
    cut: Option<Cut>,
    /// The latest boundary whose report was cut (at the boundary or on request).
    last_cut: Option<u64>,
    /// Boundaries' reports cut at the boundary, until the controller's request for each arrives (oldest
    /// first; more than one when the dispatcher ran late across boundaries: a stalled process cuts every
    /// boundary it missed when it wakes, before it reads the requests). At most [`MAX_STASHED`].
    stash: std::collections::VecDeque<(u64, ServerReport)>,
}

impl PshiftState {
    /// Counts the part of the latest stall (recorded, or in progress: [`crate::stall::StallWatch`]) that
    /// fell inside the device's busy period begun at `busy_since` and after the stall time already
    /// counted, as seen at `now` (module comment, "pShift").
    fn stalled_in_busy(&mut self, busy_since: Option<Nanos>, now: Nanos) {
        let Some(since) = busy_since else { return };
        let to_watch = |t: Nanos| Nanos((i128::from(t.0) + self.watch_offset).clamp(0, u64::MAX.into()) as u64);
        let to_here = |t: Nanos| Nanos((i128::from(t.0) - self.watch_offset).clamp(0, u64::MAX.into()) as u64);
        let Some((start, end)) = self.watch.last_stall(to_watch(now)) else { return };
        let (start, end) = (to_here(start), to_here(end));
        let from = start.max(since).max(self.stall_counted_to);
        self.stalled_busy_ns = self.stalled_busy_ns.saturating_add(end.saturating_sub(from).0);
        self.stall_counted_to = self.stall_counted_to.max(end);
    }
}

/// `watch`'s clock less `clock` (ns), read side by side: adds to a time on `clock` to give the watch's.
fn watch_offset(watch: &crate::stall::StallWatch, clock: Clock) -> i128 {
    i128::from(watch.now().0) - i128::from(clock.now().0)
}

/// How many cut reports a pShift server keeps for requests still to come (a stall across this many
/// boundaries loses the oldest, whose request then gets a report cut on request).
const MAX_STASHED: usize = 16;

/// When to cut a boundary's report: its round and time on the dispatcher's clock, and the time to the
/// next boundary (the cut after it is scheduled from here until the link says otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    /// The boundary's round.
    pub round: u64,
    /// The boundary on the dispatcher's clock.
    pub at: Nanos,
    /// The time between boundaries.
    pub interval: Nanos,
}

impl Cut {
    /// The boundary to cut after this one, cut at `now`: the next, or, if that is not after `now`, the
    /// first that is (the ones between are skipped: [`Dispatcher`]'s loop cut one per turn and never
    /// caught up with a schedule it was behind by more than an interval). The interval is not zero.
    fn next(self, now: Nanos) -> Cut {
        let next = self.after(self.round);
        match now.0.checked_sub(next.at.0) {
            Some(late) => next.after(next.round + late / next.interval.0),
            None => next,
        }
    }

    /// The first boundary after `round` (this one if it is later).
    fn after(self, round: u64) -> Cut {
        if self.round > round {
            return self;
        }
        let k = round + 1 - self.round;
        Cut { round: round + 1, at: Nanos(self.at.0.saturating_add(k.saturating_mul(self.interval.0))), ..self }
    }
}

/// Why the modelled capacity could not be changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CapacityError {
    /// The server has no device model.
    #[error("no device model configured")]
    NoModel,
    /// The value is out of range.
    #[error(transparent)]
    Invalid(#[from] DeviceError),
    /// The dispatcher has stopped.
    #[error("server is shutting down")]
    Shutdown,
}

/// How the dispatcher runs IO on file storage (module comment).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum IoEngine {
    /// Route 1: reads, writes and flushes of storage that offers a descriptor go to an io_uring owned by
    /// the dispatcher; the rest as with `Threads`. Becomes `Threads` if the kernel refuses io_uring.
    #[default]
    Uring,
    /// File IO runs on tokio's blocking pool (route 3); storage that says it never blocks (RAM, up to
    /// [`crate::storage::MEMORY_INLINE_MAX`]) still runs inline.
    Threads,
    /// IO up to [`DispatchConfig::inline_max_bytes`], other than a flush, runs on the dispatcher task
    /// itself (route 2); larger IO on the blocking pool. Only sensible for RAM-like storage: a slow file
    /// stalls every tenant.
    Inline,
}

impl IoEngine {
    /// The name in configs (`io_engine`), metrics and probe reports: `uring`, `threads` or `inline`
    /// (parsing also accepts `io_uring`).
    pub fn name(self) -> &'static str {
        match self {
            IoEngine::Uring => "uring",
            IoEngine::Threads => "threads",
            IoEngine::Inline => "inline",
        }
    }
}

/// An `io_engine` that names no [`IoEngine`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("io_engine {got:?}: expected uring, threads or inline")]
pub struct UnknownIoEngine {
    /// The name given.
    pub got: String,
}

impl std::str::FromStr for IoEngine {
    type Err = UnknownIoEngine;
    fn from_str(s: &str) -> Result<Self, UnknownIoEngine> {
        match s {
            "uring" | "io_uring" => Ok(IoEngine::Uring),
            "threads" => Ok(IoEngine::Threads),
            "inline" => Ok(IoEngine::Inline),
            o => Err(UnknownIoEngine { got: o.to_string() }),
        }
    }
}

/// Dispatcher settings.
#[derive(Clone, Debug)]
pub struct DispatchConfig {
    /// The scheduling algorithm (default mClock).
    pub scheduler: SchedulerKind,
    /// The scheduler's settings: cost model, limit mode, queue bounds (default [`SchedConfig::default`]).
    pub sched: SchedConfig,
    /// D: the most requests outstanding at the backend at once (default 32). Must be positive:
    /// [`Dispatcher::spawn`] panics on 0.
    pub depth: usize,
    /// Bound of the request channel from connections, in commands (default 4096; 0 counts as 1). A sender
    /// waits while it is full.
    pub channel: usize,
    /// How file IO runs (default [`IoEngine::Uring`]).
    pub io_engine: IoEngine,
    /// With [`IoEngine::Inline`]: the largest file request run on the dispatcher, in bytes (default 64 KiB;
    /// larger ones go to the blocking pool). Ignored by the other engines.
    pub inline_max_bytes: u64,
    /// With [`SchedulerKind::Token`]: the token scheduler's variant.
    pub token: TokenVariant,
    /// Deadlines (device model completions, limit and reservation tags) also on a timerfd, which fires
    /// within microseconds, not only on tokio's timer, which fires 0-2 ms late (`crate::precise_timer`;
    /// default true). Off for tests that pause tokio's clock: the timerfd's real-time wake-ups keep the
    /// paused clock from advancing by itself.
    pub precise_timer: bool,
}

/// Which token scheduler (pshift.txt §II; rein-core's `sched/tokens.rs`): the R order and whether the
/// round robin is weighted. The default is rein-core's default, unweighted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenVariant {
    /// Weighted round robin by tenant weight (§V "Local Priorities").
    pub weighted: bool,
    /// How R-token holders share the server.
    pub r_order: rein_core::pshift::tokens::ROrder,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            scheduler: SchedulerKind::Mclock,
            sched: SchedConfig::default(),
            depth: 32,
            channel: 4096,
            io_engine: IoEngine::Uring,
            inline_max_bytes: 64 * 1024,
            token: TokenVariant::default(),
            precise_timer: true,
        }
    }
}

/// A cheap, cloneable handle to a running dispatcher.
#[derive(Clone)]
pub struct Dispatcher {
    tx: mpsc::Sender<Cmd>,
    clock: Clock,
}

impl Dispatcher {
    /// Starts the dispatcher task on the current tokio runtime. It ends (after draining) when every handle
    /// is dropped; the returned join handle resolves then.
    pub fn spawn(device: Option<DeviceConfig>, config: DispatchConfig) -> (Dispatcher, tokio::task::JoinHandle<()>) {
        assert!(config.depth > 0, "depth must be positive");
        let (tx, rx) = mpsc::channel(config.channel.max(1));
        // A spec's limit is in the cost model's units for every scheduler (RBFQ's too).
        let sched = match config.scheduler {
            SchedulerKind::Token => {
                let ts = if config.token.weighted {
                    TokenScheduler::weighted(config.sched)
                } else {
                    TokenScheduler::new(config.sched)
                };
                Sched::Token(Box::new(ts.with_r_order(config.token.r_order)))
            }
            k => Sched::Dyn(k.build(config.sched)),
        };
        let (uring, io_engine) = match config.io_engine {
            IoEngine::Uring => match Uring::new(config.depth) {
                Ok(u) => (Some(u), IoEngine::Uring),
                Err(e) => {
                    tracing::warn!("io_uring unavailable ({e}); running file IO on the thread pool");
                    (None, IoEngine::Threads)
                }
            },
            other => (None, other),
        };
        let clock = Clock::new();
        let task = Task {
            sched,
            device: device.as_ref().map(ModelledDevice::new),
            ready: Vec::new(),
            depth: config.depth,
            clock,
            outstanding: 0,
            pending: Vec::new(),
            free: Vec::new(),
            counters: Vec::new(),
            scales: Vec::new(),
            backend: BackendCounters { latency_buckets: vec![0; LATENCY_BUCKETS_S.len() + 1], ..Default::default() },
            io_engine,
            inline_max_bytes: if io_engine == IoEngine::Inline { config.inline_max_bytes } else { 0 },
            precise_timer: config.precise_timer,
            uring,
            reaped: Vec::new(),
            ids: Vec::new(),
            kind: config.scheduler,
            tick: TickState::default(),
            busy_ended_ns: 0,
            busy_since: None,
            aborted: false,
            pshift: None,
        };
        let join = tokio::spawn(task.run(rx));
        (Dispatcher { tx, clock }, join)
    }

    /// Submits a request and waits for its completion. A request whose future is dropped before its turn
    /// is not run (as [`Dispatcher::submit`]'s with its flag set).
    pub async fn io(&self, req: IoRequest) -> IoResult {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Io(req, Reply::Channel(tx))).await.map_err(|_| IoError::Shutdown)?;
        rx.await.map_err(|_| IoError::Shutdown)?
    }

    /// Submits a request whose result is handed to `done` on the dispatcher task (no task or channel per
    /// request). `done` runs exactly once, with [`IoError::Shutdown`] if the dispatcher has stopped.
    ///
    /// `gone`, if given, is the requester's flag for "nobody can receive the result any more" (an NBD
    /// connection sets it when its socket broke). A request whose turn comes after it was set is answered
    /// with [`IoError::Abandoned`] and not run: it costs no backend IO and takes no device slot, and a
    /// WRITE of a client that vanished cannot land after a newer client's writes to the same blocks
    /// (behind a throttled tenant's queue that could be minutes later). The scheduler still serves it in
    /// its turn (it cannot take a request out of a queue), so it counts toward the tenant's limit.
    pub async fn submit(&self, req: IoRequest, done: Done, gone: Option<Arc<AtomicBool>>) {
        if let Err(mpsc::error::SendError(Cmd::Io(_, reply))) =
            self.tx.send(Cmd::Io(req, Reply::Callback(done, gone))).await
        {
            reply.send(Err(IoError::Shutdown), Served::default());
        }
    }

    /// Adds a tenant with `spec`; its id goes in [`IoRequest::tenant`]. Errors: [`IoError::Refused`] when
    /// the scheduler has its maximum of tenants, [`IoError::Shutdown`] when the dispatcher has stopped.
    pub async fn add_tenant(&self, spec: QosSpec) -> Result<TenantId, IoError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::AddTenant(spec, tx)).await.map_err(|_| IoError::Shutdown)?;
        Ok(rx.await.map_err(|_| IoError::Shutdown)??)
    }

    /// Changes tenant `id`'s spec at run time; it takes effect from the tenant's next request's tags.
    /// Errors: [`IoError::Refused`] for an unknown tenant, [`IoError::Shutdown`] when the dispatcher has
    /// stopped.
    pub async fn set_spec(&self, id: TenantId, spec: QosSpec) -> Result<(), IoError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::SetSpec(id, spec, tx)).await.map_err(|_| IoError::Shutdown)?;
        Ok(rx.await.map_err(|_| IoError::Shutdown)??)
    }

    /// Replaces the scheduler's settings at run time (a reload of `[mclock]`): queued requests stay, and the
    /// new rules apply from the next tags computed (rein-core's `Scheduler::set_config`). Fails only with
    /// [`IoError::Shutdown`].
    pub async fn set_sched_config(&self, config: SchedConfig) -> Result<(), IoError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::SetConfig(config, tx)).await.map_err(|_| IoError::Shutdown)?;
        rx.await.map_err(|_| IoError::Shutdown)
    }

    /// Removes tenant `id`: its queued requests are answered with [`IoError::Refused`] (unknown tenant), and
    /// later requests naming it too; requests already at the backend complete. Errors:
    /// [`IoError::Refused`] for an unknown tenant, [`IoError::Shutdown`] when the dispatcher has stopped.
    pub async fn remove_tenant(&self, id: TenantId) -> Result<(), IoError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::RemoveTenant(id, tx)).await.map_err(|_| IoError::Shutdown)?;
        Ok(rx.await.map_err(|_| IoError::Shutdown)??)
    }

    /// A copy of the dispatcher's state and counters, taken between two commands of its loop. Fails only
    /// with [`IoError::Shutdown`].
    pub async fn snapshot(&self) -> Result<Snapshot, IoError> {
        self.snapshot_with(None).await
    }

    /// [`Dispatcher::snapshot`] with only the tenants `ids` (those still known, in `ids`' order): what a
    /// change or a look at one tenant needs, at a cost in the dispatcher's loop (which the IO path waits
    /// for) that grows with `ids`, not with the tenants (a snapshot of 4,096 tenants copies 4,096
    /// counters).
    pub async fn snapshot_of(&self, ids: Vec<TenantId>) -> Result<Snapshot, IoError> {
        self.snapshot_with(Some(ids)).await
    }

    async fn snapshot_with(&self, only: Option<Vec<TenantId>>) -> Result<Snapshot, IoError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Snapshot(only, tx)).await.map_err(|_| IoError::Shutdown)?;
        rx.await.map_err(|_| IoError::Shutdown)
    }

    /// The shutdown deadline: answers every queued request with [`IoError::Shutdown`] (an NBD client gets
    /// ESHUTDOWN), and every request submitted from now on too; requests already at the backend still
    /// complete. Returns how many queued requests were failed (0 if the dispatcher has stopped).
    pub async fn abort_queued(&self) -> usize {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Cmd::Abort(tx)).await.is_err() {
            return 0;
        }
        rx.await.unwrap_or(0)
    }

    /// Multiplies the modelled service times of tenant `id`'s requests by `scale` (placement skew,
    /// [`DeviceConfig::service_scale`]); without a device model it changes nothing.
    pub async fn set_service_scale(&self, id: TenantId, scale: f64) -> Result<(), IoError> {
        self.tx.send(Cmd::ServiceScale(id, scale)).await.map_err(|_| IoError::Shutdown)
    }

    /// pShift: a controller welcomed this server. From now on the scheduler's tenants in `a.buckets` are
    /// the controller's buckets: reports count them, tokens apply to them, and an arrival the latest
    /// tokens did not plan for is noted on `a.strays_to`. Errors: the scheduler is not pShift's token
    /// scheduler (`scheduler = "token"`), or the dispatcher has stopped.
    pub async fn pshift_attach(&self, a: PshiftAttach) -> Result<(), PshiftError> {
        self.ask_pshift(|tx| Cmd::PshiftAttach(a, tx)).await
    }

    /// pShift: the report for boundary `round` (`early` = 0) or its early round `early`.
    pub async fn pshift_report(&self, round: u64, early: u32) -> Result<ServerReport, PshiftError> {
        self.ask_pshift(|tx| Cmd::PshiftReport(round, early, tx)).await
    }

    /// Sends the dispatcher the pShift command `cmd` makes around a reply channel and waits for its
    /// answer; a dispatcher that has stopped (the command not taken, or dropped unanswered) is
    /// [`PshiftError::ShuttingDown`].
    async fn ask_pshift<T>(
        &self,
        cmd: impl FnOnce(oneshot::Sender<Result<T, PshiftError>>) -> Cmd,
    ) -> Result<T, PshiftError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(cmd(tx)).await.map_err(|_| PshiftError::ShuttingDown)?;
        rx.await.map_err(|_| PshiftError::ShuttingDown)?
    }

    /// pShift: applies the controller's tokens (lines for buckets this server does not have are ignored).
    pub async fn pshift_tokens(&self, m: TokenMessage) {
        let _ = self.tx.send(Cmd::PshiftTokens(m)).await;
    }

    /// pShift: the server's tenants that are buckets now, as (tenant, bucket number): tenants created since
    /// the welcome are mapped (counted exactly from here on, with no tokens until the controller's next
    /// answer lists them), and mapped tenants not in `buckets` are forgotten. Ignored without a controller.
    pub async fn pshift_map(&self, buckets: Vec<(TenantId, u32)>) {
        let _ = self.tx.send(Cmd::PshiftMap(buckets)).await;
    }

    /// The dispatcher's clock (its times: reports, [`Dispatcher::pshift_cut_at`]).
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// pShift: boundary `cut.round`'s report is to be cut at `cut.at` (this dispatcher's clock: the
    /// boundary as the link places it), rather than when the controller's request for it arrives (which
    /// then takes the report cut then), and each boundary after it `cut.interval` later. A later call
    /// replaces an earlier one; a boundary already cut, and a call without a controller, are ignored.
    pub async fn pshift_cut_at(&self, cut: Cut) {
        let _ = self.tx.send(Cmd::PshiftCutAt(cut)).await;
    }

    /// pShift: the stall watch is `w` (a test's, ticked by hand).
    #[cfg(test)]
    async fn pshift_watch(&self, w: Arc<crate::stall::StallWatch>) {
        let _ = self.tx.send(Cmd::PshiftWatch(w)).await;
    }

    /// pShift: the controller is gone; the buckets go back to plain round robin until one answers again.
    pub async fn pshift_detach(&self) {
        let _ = self.tx.send(Cmd::PshiftDetach).await;
    }

    /// Changes the modelled device's capacity (until its schedule's next step, if any).
    pub async fn set_capacity(&self, iops: f64) -> Result<(), CapacityError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::SetCapacity(iops, tx)).await.map_err(|_| CapacityError::Shutdown)?;
        rx.await.map_err(|_| CapacityError::Shutdown)?
    }
}

struct Pending {
    req: IoRequest,
    reply: Reply,
    arrived: Nanos,
}

/// What travels with a started request until it is answered.
struct Token {
    reply: Reply,
    slot: usize,
    phase: Phase,
    /// The cost the scheduler charged (for [`Served`]).
    cost: Cost,
    bytes: u64,
    arrived: Nanos,
    dispatched: Nanos,
    /// Its job on the modelled device, if a device model is in front.
    job: Option<u32>,
}

impl Token {
    /// Sends the result to the requester and says what to count. `now` ends both latencies: with a device
    /// model it is the later of the real and the modelled completion.
    fn reply(self, res: IoResult, now: Nanos) -> Finished {
        let ok = res.is_ok();
        self.reply.send(res, Served { phase: Some(self.phase), cost: self.cost });
        Finished {
            slot: self.slot,
            phase: self.phase,
            bytes: self.bytes,
            latency: now.saturating_sub(self.arrived),
            device_latency: now.saturating_sub(self.dispatched),
            ok,
            at: now,
        }
    }
}

struct Finished {
    slot: usize,
    phase: Phase,
    bytes: u64,
    latency: Nanos,
    device_latency: Nanos,
    ok: bool,
    /// When it was answered (the clock read once per completion, for the latencies and the busy time).
    at: Nanos,
}

/// What comes back to the dispatcher task from IO run elsewhere (the blocking pool).
enum Back {
    /// Answered already: count it.
    Done(Finished),
    /// Real IO done, its job still on the modelled device: answer it when the model is done too.
    Outcome(Token, IoResult),
    /// A FUA trim or write-zeroes done on the blocking pool: its sync now, on the ring (module comment,
    /// route 1).
    Sync(Token, Arc<dyn Storage>),
}

/// When the once-a-second measurements last ran.
#[derive(Default)]
struct TickState {
    at: Nanos,
}

struct Task {
    sched: Sched,
    device: Option<ModelledDevice<(Token, IoResult)>>,
    /// Scratch: outcomes the model released.
    ready: Vec<(Token, IoResult)>,
    depth: usize,
    clock: Clock,
    outstanding: usize,
    pending: Vec<Option<Pending>>,
    free: Vec<usize>,
    counters: Vec<TenantCounters>,
    /// Per tenant slot: the multiplier on its requests' modelled service times (1 unless set).
    scales: Vec<f64>,
    backend: BackendCounters,
    io_engine: IoEngine,
    inline_max_bytes: u64,
    /// [`DispatchConfig::precise_timer`].
    precise_timer: bool,
    uring: Option<Uring<Token>>,
    reaped: Vec<Completion<Token>>,
    /// Tenants added, in order (for snapshots).
    ids: Vec<TenantId>,
    kind: SchedulerKind,
    tick: TickState,
    /// The backend's busy time: periods with an IO outstanding (ended ones summed, the open one's start).
    busy_ended_ns: u64,
    busy_since: Option<Nanos>,
    /// Set by [`Dispatcher::abort_queued`]: requests are failed, not queued.
    aborted: bool,
    /// pShift's server side, once a controller welcomed this server.
    pshift: Option<PshiftState>,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Back>();
        let eventfd = self.uring.as_ref().map(|u| u.eventfd());
        let mut ticker = tokio::time::interval(std::time::Duration::from_secs(1));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut wake: Option<Nanos> = None;
        let mut open = true;
        // Deadlines with the kernel's precision beside tokio's millisecond timer (crate::precise_timer).
        let mut timer = if self.precise_timer { crate::precise_timer::optional("deadlines") } else { None };
        loop {
            self.advance_device();
            self.pshift_cut();
            if open || self.sched.queued() > 0 {
                wake = self.pump(&done_tx);
            }
            if self.reap_ring() > 0 {
                continue; // slots freed: dispatch more before waiting
            }
            if !open && self.outstanding == 0 && self.sched.queued() == 0 {
                break;
            }
            // The scheduler's limit wake-up or the device model's next event, whichever is first.
            let model = self.device.as_ref().and_then(|d| d.next_deadline());
            let cut = self.pshift.as_ref().and_then(|p| p.cut).map(|c| c.at);
            let sleep_until = [wake, model, cut].into_iter().flatten().min().map(|t| self.clock.instant(t));
            let ring_busy = self.uring.as_ref().is_some_and(|u| u.inflight() > 0);
            tokio::select! {
                cmd = rx.recv(), if open => match cmd {
                    Some(c) => {
                        self.command(c);
                        // Take whatever else is already queued before dispatching (one pump per batch).
                        while let Ok(c) = rx.try_recv() {
                            self.command(c);
                        }
                    }
                    None => open = false,
                },
                Some(back) = done_rx.recv() => match back {
                    Back::Done(d) => self.finish(d),
                    Back::Outcome(token, res) => self.answer(token, res),
                    Back::Sync(token, storage) => self.sync_on_ring(token, storage),
                },
                r = async { eventfd.as_ref().expect("guarded").readable().await }, if ring_busy => {
                    if let Ok(mut g) = r {
                        drain_eventfd(eventfd.as_ref().expect("guarded"));
                        g.clear_ready();
                    }
                }
                _ = crate::precise_timer::sleep_until(&mut timer, sleep_until) => {}
                _ = ticker.tick() => self.on_tick(),
            }
        }
        tracing::debug!("dispatcher drained and stopped");
    }

    /// pShift: the report of `(round, early)` cut now (with the device's busy time since the last one).
    fn pshift_report(&mut self, round: u64, early: u32) -> Result<ServerReport, PshiftError> {
        let now = self.clock.now();
        let busy = self.busy_total(now);
        match (&mut self.pshift, &mut self.sched) {
            (Some(p), Sched::Token(ts)) => {
                if self.device.is_none() {
                    p.stalled_in_busy(self.busy_since, now);
                }
                let stalled = std::mem::take(&mut p.stalled_busy_ns);
                p.server.add_busy(busy.saturating_sub(p.busy_mark).saturating_sub(stalled));
                p.busy_mark = busy;
                Ok(p.server.report(ts, now, round, early, None))
            }
            _ => Err(PshiftError::NotWelcomed),
        }
    }

    /// pShift: at the boundary the link placed, cut that boundary's report and keep it for the request.
    fn pshift_cut(&mut self) {
        let now = self.clock.now();
        let Some(p) = self.pshift.as_mut() else { return };
        let Some(cut) = p.cut.filter(|c| now >= c.at) else { return };
        // Taken before the report, so a cut in the past is never a timer that fires again at once. A
        // dispatcher behind by more than an interval (a cut slower than the interval, a schedule placed
        // in the past) skips to the first boundary after now: cutting one per turn for every boundary
        // missed, it never caught up, never waited, and starved every other task of the process (a
        // controller's pong with a 1 us interval froze the server for good).
        p.cut = (cut.interval > Nanos::ZERO).then(|| cut.next(now));
        p.last_cut = Some(cut.round);
        let report = self.pshift_report(cut.round, 0);
        if let (Some(p), Ok(r)) = (&mut self.pshift, report) {
            if p.stash.len() == MAX_STASHED {
                p.stash.pop_front();
            }
            p.stash.push_back((cut.round, r));
        }
    }

    fn command(&mut self, c: Cmd) {
        match c {
            Cmd::Io(req, reply) if self.aborted => {
                if let Some(c) = self.counters.get_mut(req.tenant.index()) {
                    c.errors += 1;
                }
                reply.send(Err(IoError::Shutdown), Served::default());
            }
            Cmd::Abort(reply) => {
                let _ = reply.send(self.abort());
            }
            Cmd::Io(req, reply) => {
                let now = self.clock.now();
                let size = req.op.len().max(1);
                let offset = req.offset;
                let tenant = req.tenant;
                let piggyback = req.piggyback;
                let handle = match self.free.pop() {
                    Some(h) => h,
                    None => {
                        self.pending.push(None);
                        self.pending.len() - 1
                    }
                };
                self.pending[handle] = Some(Pending { req, reply, arrived: now });
                // Received and not answered; none is queued if its queue is empty, so then they are at the
                // backend (the scheduler reads the flag only then: Request::pending_here).
                let pending_here = self.counters.get(tenant.index()).is_some_and(|c| c.in_flight > 0);
                let mut request =
                    Request::new(tenant, handle as u64).size(size).offset(offset).pending_here(pending_here);
                if let Some(p) = piggyback {
                    request = request.piggyback(p);
                }
                match self.sched.enqueue(now, request) {
                    Ok(()) => {
                        if let Some(c) = self.counters.get_mut(tenant.index()) {
                            c.in_flight += 1;
                        }
                        if let Some(p) = &mut self.pshift {
                            if let Some(note) = p.server.arrived(tenant) {
                                let _ = p.strays_to.send(note);
                            }
                        }
                    }
                    Err(e) => {
                        let p = self.pending[handle].take().expect("just stored");
                        self.free.push(handle);
                        if let Some(c) = self.counters.get_mut(tenant.index()) {
                            c.errors += 1;
                        }
                        p.reply.send(Err(e.into()), Served::default());
                    }
                }
            }
            Cmd::AddTenant(spec, reply) => {
                let r = self.sched.add_tenant(spec);
                if let Ok(id) = r {
                    self.ids.push(id);
                    if self.counters.len() <= id.index() {
                        self.counters.resize_with(id.index() + 1, TenantCounters::default);
                    }
                    self.counters[id.index()] =
                        TenantCounters { latency_buckets: vec![0; LATENCY_BUCKETS_S.len() + 1], ..Default::default() };
                    // A reused slot starts unscaled.
                    if let Some(x) = self.scales.get_mut(id.index()) {
                        *x = 1.0;
                    }
                }
                let _ = reply.send(r);
            }
            Cmd::SetSpec(id, spec, reply) => {
                let _ = reply.send(self.sched.set_spec(id, spec));
            }
            Cmd::SetConfig(config, reply) => {
                self.sched.set_config(config);
                let _ = reply.send(());
            }
            Cmd::RemoveTenant(id, reply) => {
                // Its IOs at the device complete after it is gone, and its slot may be reused.
                if let Some(p) = &mut self.pshift {
                    p.server.release(id);
                    p.bucket_ids.retain(|_, x| *x != id);
                }
                let r = self.fail_queued(id, || IoError::Refused(SchedError::UnknownTenant(id))).map(|_| {
                    self.ids.retain(|x| *x != id);
                });
                let _ = reply.send(r);
            }
            Cmd::ServiceScale(id, scale) => {
                if self.scales.len() <= id.index() {
                    self.scales.resize(id.index() + 1, 1.0);
                }
                self.scales[id.index()] = scale;
            }
            Cmd::SetCapacity(iops, reply) => {
                let r = match &mut self.device {
                    Some(d) => d.set_capacity(iops).map_err(CapacityError::from),
                    None => Err(CapacityError::NoModel),
                };
                let _ = reply.send(r);
            }
            Cmd::PshiftAttach(a, reply) => {
                let now = self.clock.now();
                let busy = self.busy_total(now);
                let r = match &mut self.sched {
                    Sched::Token(ts) => {
                        let mut server = TokenServer::new(a.server, a.strays, now);
                        server.set_limited(a.limited);
                        let mut bucket_ids = std::collections::HashMap::new();
                        for &(id, b) in &a.buckets {
                            server.map(id, b);
                            bucket_ids.insert(b, id);
                        }
                        // Count from now: the IOs at the device are in flight (a link that comes up
                        // after the first requests, or again after a break).
                        let counts: std::collections::HashMap<TenantId, u64> =
                            a.buckets.iter().map(|&(id, _)| (id, at_device(&self.counters, ts, id))).collect();
                        server.resume(ts, now, |id| counts.get(&id).copied().unwrap_or(0));
                        // A new controller (or the same after a break): round robin until it answers.
                        server.detach(ts);
                        // Stalls before the welcome are not this report's (stall_counted_to).
                        match crate::stall::process() {
                            Ok(watch) => {
                                self.pshift = Some(PshiftState {
                                    server,
                                    bucket_ids,
                                    strays_to: a.strays_to,
                                    busy_mark: busy,
                                    watch_offset: watch_offset(&watch, self.clock),
                                    watch,
                                    stall_counted_to: now,
                                    stalled_busy_ns: 0,
                                    cut: None,
                                    last_cut: None,
                                    stash: Default::default(),
                                });
                                Ok(())
                            }
                            Err(e) => Err(PshiftError::StallWatch(e)),
                        }
                    }
                    Sched::Dyn(_) => Err(PshiftError::NotToken { running: self.kind.name() }),
                };
                let _ = reply.send(r);
            }
            Cmd::PshiftReport(round, early, reply) => {
                // The request's own report if it was cut (those of older boundaries will not be asked for:
                // the controller asks in order); a later boundary's stays for its request.
                let stashed = match &mut self.pshift {
                    Some(p) if early == 0 => {
                        while p.stash.front().is_some_and(|s| s.0 < round) {
                            p.stash.pop_front();
                        }
                        if p.stash.front().is_some_and(|s| s.0 == round) {
                            p.stash.pop_front().map(|s| s.1)
                        } else {
                            None
                        }
                    }
                    _ => None,
                };
                let r = match stashed {
                    Some(r) => Ok(r),
                    None => {
                        let r = self.pshift_report(round, early);
                        // A boundary reported on request (before the link placed it, or before its
                        // place came): its scheduled cut is moot.
                        if let (Some(p), 0) = (&mut self.pshift, early) {
                            p.last_cut = p.last_cut.max(Some(round));
                            p.cut = p.cut.map(|c| c.after(round));
                        }
                        r
                    }
                };
                let _ = reply.send(r);
            }
            Cmd::PshiftCutAt(cut) => {
                if let Some(p) = &mut self.pshift {
                    // The link's placement is the controller's schedule on this clock, and it wins over
                    // the one kept here: a boundary already cut re-places the ones after it. (A schedule
                    // that came out of a controller's stall ahead of it, from an offset measured with
                    // stale pings, cut every report a round early for good, and every answer was then
                    // stale and dropped.)
                    p.cut = Some(match p.last_cut {
                        Some(l) => cut.after(l),
                        None => cut,
                    });
                }
            }
            Cmd::PshiftTokens(m) => {
                if let (Some(p), Sched::Token(ts)) = (&mut self.pshift, &mut self.sched) {
                    let ids = &p.bucket_ids;
                    if !p.server.apply_message(ts, &m, |_, _, b| ids.get(&b).copied()) {
                        tracing::debug!(
                            round = m.round,
                            early = m.early,
                            "pShift: a stale answer dropped (a newer report was taken)"
                        );
                    }
                }
            }
            Cmd::PshiftMap(wanted) => {
                if let (Some(p), Sched::Token(ts)) = (&mut self.pshift, &mut self.sched) {
                    for (id, b) in p.server.mapped(ts) {
                        if !wanted.contains(&(id, b)) {
                            p.server.release(id);
                            p.bucket_ids.remove(&b);
                        }
                    }
                    for &(id, b) in &wanted {
                        if p.server.bucket_of(id) != Some(b) && ts.spec(id).is_ok() {
                            p.server.adopt(ts, id, b, at_device(&self.counters, ts, id));
                            p.bucket_ids.insert(b, id);
                        }
                    }
                }
            }
            #[cfg(test)]
            Cmd::PshiftWatch(w) => {
                if let Some(p) = &mut self.pshift {
                    p.watch_offset = watch_offset(&w, self.clock);
                    p.watch = w;
                }
            }
            Cmd::PshiftDetach => {
                if let (Some(p), Sched::Token(ts)) = (&mut self.pshift, &mut self.sched) {
                    p.server.detach(ts);
                }
                self.pshift = None;
            }
            Cmd::Snapshot(only, reply) => {
                let mut tenants = Vec::new();
                for &id in only.as_deref().unwrap_or(&self.ids) {
                    if let (Ok(spec), Ok(st)) = (self.sched.spec(id), self.sched.stats(id)) {
                        tenants.push(TenantSnapshot {
                            id,
                            spec,
                            sched: st,
                            counters: self.counters[id.index()].clone(),
                        });
                    }
                }
                let now = self.clock.now();
                let busy_ns = self.busy_total(now);
                let _ = reply.send(Snapshot {
                    now,
                    busy_ns,
                    scheduler: self.kind,
                    outstanding: self.outstanding,
                    depth: self.depth,
                    tenants,
                    capacity_iops: self.device.as_ref().map(|d| d.capacity()),
                    backend: self.backend.clone(),
                    io_engine: self.io_engine,
                    syncs: self.uring.as_ref().map(|u| (u.syncs_asked(), u.syncs_started())),
                });
            }
        }
    }

    /// The device's busy time since the start: the model's, or the backend's (time with an IO outstanding).
    fn busy_total(&self, now: Nanos) -> u64 {
        match &self.device {
            Some(d) => d.busy_ns(now),
            None => self.busy_ended_ns + self.busy_since.map_or(0, |s| now.0.saturating_sub(s.0)),
        }
    }

    /// The shutdown deadline (invariant 3's exception): every queued request is answered with
    /// [`IoError::Shutdown`], and so is every request that arrives from now on. Requests already at the
    /// backend finish as usual. Returns how many were failed here.
    fn abort(&mut self) -> usize {
        self.aborted = true;
        let ids = std::mem::take(&mut self.ids);
        let failed = ids.iter().map(|&id| self.fail_queued(id, || IoError::Shutdown).unwrap_or(0)).sum();
        self.ids = ids;
        failed
    }

    /// Takes tenant `id` out of the scheduler and answers each of its queued requests with `error()`
    /// (counted as an error, no longer in flight); returns how many. Requests at the backend are not
    /// touched. Errors: the scheduler's, for an unknown tenant.
    fn fail_queued(&mut self, id: TenantId, error: impl Fn() -> IoError) -> Result<usize, SchedError> {
        let handles = self.sched.remove_tenant(id)?;
        let failed = handles.len();
        for h in handles {
            let p = self.pending[h as usize].take().expect("a queued handle is pending");
            self.free.push(h as usize);
            if let Some(c) = self.counters.get_mut(id.index()) {
                c.in_flight = c.in_flight.saturating_sub(1);
                c.errors += 1;
            }
            p.reply.send(Err(error()), Served::default());
        }
        Ok(failed)
    }

    /// Dispatches while slots are free; returns when to wake for a limit, if any.
    fn pump(&mut self, done: &mpsc::UnboundedSender<Back>) -> Option<Nanos> {
        let mut wake = None;
        while self.outstanding < self.depth {
            let now = self.clock.now();
            match self.sched.poll(now, self.outstanding == 0) {
                Poll::Dispatch(d) => {
                    let handle = d.handle as usize;
                    let p = self.pending[handle].take().expect("dispatched handle is pending");
                    self.free.push(handle);
                    if p.reply.is_abandoned() {
                        // Not run (`Dispatcher::submit`): no device slot, no backend IO.
                        if let Some(c) = self.counters.get_mut(p.req.tenant.index()) {
                            c.in_flight = c.in_flight.saturating_sub(1);
                            c.abandoned += 1;
                        }
                        // The scheduler counted it dispatched; no completion will come for pShift's count.
                        if let Some(ps) = &mut self.pshift {
                            ps.server.recorded(p.req.tenant);
                        }
                        p.reply.send(Err(IoError::Abandoned), Served { phase: Some(d.phase), cost: d.cost });
                        continue;
                    }
                    self.outstanding += 1;
                    assert!(self.outstanding <= self.depth, "invariant 1");
                    if self.busy_since.is_none() {
                        self.busy_since = Some(now);
                    }
                    self.start(p, d.phase, d.cost, now, done);
                }
                Poll::Wait(t) => {
                    wake = Some(t);
                    break;
                }
                Poll::Empty => break,
            }
        }
        if let Some(u) = &mut self.uring {
            if let Err(e) = u.submit() {
                tracing::warn!("io_uring submit deferred: {e}");
            }
        }
        wake
    }

    /// Collects ring completions and answers them; returns how many finished.
    fn reap_ring(&mut self) -> usize {
        let Some(u) = &mut self.uring else { return 0 };
        if u.inflight() == 0 {
            return 0;
        }
        let mut reaped = std::mem::take(&mut self.reaped);
        let n = u.reap(&mut reaped);
        for (token, res) in reaped.drain(..) {
            self.answer(token, res.map_err(IoError::from));
        }
        self.reaped = reaped;
        n
    }

    fn start(&mut self, p: Pending, phase: Phase, cost: Cost, now: Nanos, done: &mpsc::UnboundedSender<Back>) {
        let bytes = p.req.op.len();
        let scale = self.scales.get(p.req.tenant.index()).copied().unwrap_or(1.0);
        let job = self.device.as_mut().map(|d| {
            let write = matches!(p.req.op, Op::Write { .. } | Op::WriteZeroes { .. });
            d.admit(now, p.arrived, bytes, p.req.offset, write, scale)
        });
        let Pending { req, reply, arrived } = p;
        let token = Token { reply, slot: req.tenant.index(), phase, cost, bytes, arrived, dispatched: now, job };
        // 1. The ring, if the storage offers a descriptor for this operation.
        let (mut req, token) = match &mut self.uring {
            Some(ring) => match offer_to_ring(ring, req, token) {
                RingOffer::Submitted => return,
                RingOffer::Refused(token, e) => return self.answer(token, Err(e.into())),
                RingOffer::Declined(req, token) => (req, token),
            },
            None => (req, token),
        };
        // A FUA trim or write-zeroes of a storage the ring syncs: its sync goes to the ring afterwards
        // (module comment, route 1).
        let sync_on_ring = req.fua && self.uring.is_some() && matches!(req.storage.kernel_io(0, 0, false), Ok(Some(_)));
        let then_sync = sync_on_ring.then(|| req.storage.clone());
        req.fua &= !sync_on_ring;
        // 2. Inline, if the storage says this never blocks, or the inline engine takes it.
        if runs_inline(&req, self.inline_max_bytes) {
            let res = execute(req);
            return match (then_sync, res) {
                (Some(storage), Ok(_)) => self.sync_on_ring(token, storage),
                (_, res) => self.answer(token, res),
            };
        }
        // 3. The blocking pool. Without a device model the answer goes out from there; with one, the
        // outcome comes back here to wait for the model, as does one whose sync is the ring's.
        let clock = self.clock;
        let done = done.clone();
        tokio::spawn(async move {
            let res = tokio::task::spawn_blocking(move || execute(req)).await.unwrap_or_else(|e| {
                Err(IoError::Storage(StorageError::Io { op: "task", source: std::io::Error::other(e.to_string()) }))
            });
            let back = match (then_sync, res) {
                (Some(storage), Ok(_)) => Back::Sync(token, storage),
                (_, res) if token.job.is_some() => Back::Outcome(token, res),
                (_, res) => Back::Done(token.reply(res, clock.now())),
            };
            let _ = done.send(back);
        });
    }

    /// Syncs `storage` on the ring for `token`, whose trim or write-zeroes is done (module comment, route
    /// 1); answered when the sync is.
    fn sync_on_ring(&mut self, token: Token, storage: Arc<dyn Storage>) {
        let ring = self.uring.as_mut().expect("a sync on the ring is asked only when there is one");
        match storage.kernel_io(0, 0, false) {
            Ok(Some(target)) => {
                ring.push(storage, target, 0, UringOp::Flush, token);
                // Submitted now: the loop submits after a round of dispatching, and there may be none.
                if let Err(e) = ring.submit() {
                    tracing::warn!("io_uring submit deferred: {e}");
                }
            }
            Ok(None) => {
                let e = StorageError::Io { op: "fdatasync", source: std::io::Error::other("no descriptor to sync") };
                self.answer(token, Err(e.into()))
            }
            Err(e) => self.answer(token, Err(e.into())),
        }
    }

    /// A request's real IO finished: answer it now, or (device model) when its modelled service is done.
    fn answer(&mut self, token: Token, res: IoResult) {
        let (token, res) = match (token.job, &mut self.device) {
            (Some(job), Some(d)) => match d.real_done(job, (token, res)) {
                Some(both) => both,
                None => return,
            },
            _ => (token, res),
        };
        let d = token.reply(res, self.clock.now());
        self.finish(d);
    }

    /// Runs the device model to now and answers the requests it releases.
    fn advance_device(&mut self) {
        let Some(d) = &mut self.device else { return };
        let now = self.clock.now();
        let mut ready = std::mem::take(&mut self.ready);
        d.advance(now, &mut ready);
        for (token, res) in ready.drain(..) {
            let done = token.reply(res, now);
            self.finish(done);
        }
        self.ready = ready;
    }

    fn finish(&mut self, d: Finished) {
        assert!(self.outstanding > 0, "completion without a dispatch");
        self.outstanding -= 1;
        if self.outstanding == 0 {
            if let (Some(p), None) = (&mut self.pshift, &self.device) {
                p.stalled_in_busy(self.busy_since, d.at);
            }
            if let Some(since) = self.busy_since.take() {
                self.busy_ended_ns += d.at.0.saturating_sub(since.0);
            }
        }
        self.backend.completed += 1;
        if let (Some(p), Sched::Token(ts)) = (&mut self.pshift, &self.sched) {
            p.server.device_completed();
            if let Some(id) = ts.id_at_slot(d.slot) {
                p.server.recorded(id);
            }
        }
        self.backend.latency_sum_ns += d.device_latency.0 as u128;
        self.backend.latency_buckets[bucket_of(d.device_latency)] += 1;
        if let Some(c) = self.counters.get_mut(d.slot) {
            c.in_flight = c.in_flight.saturating_sub(1);
            if d.ok {
                c.completed[d.phase.index()] += 1;
                c.bytes += d.bytes;
                c.latency_sum_ns += d.latency.0 as u128;
                c.latency_buckets[bucket_of(d.latency)] += 1;
            } else {
                c.errors += 1;
            }
        }
    }

    /// Once a second: per-tenant IOPS, and the reservation meter's verdict on the second (module comment).
    fn on_tick(&mut self) {
        let now = self.clock.now();
        let dt = now.saturating_sub(self.tick.at).as_secs_f64();
        self.tick.at = now;
        for &id in &self.ids {
            let (Ok(st), Ok(spec)) = (self.sched.stats(id), self.sched.spec(id)) else { continue };
            let c = &mut self.counters[id.index()];
            let completed: u64 = c.completed.iter().sum();
            let first = c.meter.is_none();
            if !first && dt > 0.0 {
                c.iops_last_s = completed.saturating_sub(c.completed_at_tick) as f64 / dt;
            }
            c.completed_at_tick = completed;
            // Served here, in the reservation's units (the cost model's), against this server's part of
            // the reservation: the tenant's own service over its own and that elsewhere which the
            // scheduler charged to its reservation clock in the second (kept from the last second that
            // served it; module comment).
            let own = st.cost.iter().sum::<u128>();
            let (d_own, d_rho) = (own.saturating_sub(c.own_at_tick), st.rho.saturating_sub(c.rho_at_tick));
            (c.own_at_tick, c.rho_at_tick) = (own, st.rho);
            if d_own > 0 {
                c.part = Some(d_own as f64 / (d_own + d_rho) as f64);
            }
            let meter = c.meter.get_or_insert_with(|| ReservationMeter::per_second(spec.reservation()));
            meter.set_reservation(spec.reservation() * c.part.unwrap_or(1.0));
            meter.observe(now, own as f64 / rein_core::Cost::ONE.0 as f64, c.in_flight > 0);
        }
    }
}

/// What the ring made of a request.
enum RingOffer {
    Submitted,
    /// The storage's checks failed (range, read-only): answer with the error.
    Refused(Token, StorageError),
    /// Not ring work (no descriptor, or trim / write-zeroes): route it elsewhere.
    Declined(IoRequest, Token),
}

/// Route 1 of the module comment: submits `req` to `ring` if its storage offers a descriptor for it.
fn offer_to_ring(ring: &mut Uring<Token>, req: IoRequest, token: Token) -> RingOffer {
    let IoRequest { storage, tenant, offset, op, fua, piggyback } = req;
    let target = match &op {
        Op::Read { len, .. } => storage.kernel_io(offset, *len as u64, false),
        Op::Write { data } => storage.kernel_io(offset, data.len() as u64, true),
        Op::Flush => storage.kernel_io(0, 0, false),
        Op::Trim { .. } | Op::WriteZeroes { .. } => Ok(None),
    };
    let target: KernelIo = match target {
        Ok(Some(t)) => t,
        Ok(None) => return RingOffer::Declined(IoRequest { storage, tenant, offset, op, fua, piggyback }, token),
        Err(e) => return RingOffer::Refused(token, e),
    };
    let op = match op {
        Op::Read { len, headroom } => UringOp::Read { len, headroom },
        // A zero-length FUA write syncs, as under the threads engine: a sync alone, with no write of
        // nothing before it.
        Op::Write { data } if data.is_empty() && fua => UringOp::Flush,
        Op::Write { data } => UringOp::Write { data, fua },
        Op::Flush => UringOp::Flush,
        op @ (Op::Trim { .. } | Op::WriteZeroes { .. }) => {
            return RingOffer::Declined(IoRequest { storage, tenant, offset, op, fua, piggyback }, token);
        }
    };
    ring.push(storage, target, offset, op, token);
    RingOffer::Submitted
}

/// Route 2 of the module comment: IO the storage says never blocks at this size, or (engine `inline`)
/// anything up to `inline_max_bytes` but a flush. A storage whose bound is 0 says any call may block, a
/// flush (0 bytes) and a zero-length FUA write included: they ran in place (an `fdatasync` on this
/// task, holding every tenant's dispatch) under the `threads` engine, and wherever io_uring is refused.
fn runs_inline(req: &IoRequest, inline_max_bytes: u64) -> bool {
    let bytes = req.op.len();
    let never_blocks = req.storage.inline_max_bytes();
    let within = |max: u64| max > 0 && bytes <= max;
    within(never_blocks) || (within(inline_max_bytes) && !matches!(req.op, Op::Flush))
}

fn execute(req: IoRequest) -> IoResult {
    let IoRequest { storage, offset, op, fua, .. } = req;
    match op {
        Op::Read { len, headroom } => {
            let mut buf = vec![0u8; headroom + len as usize];
            storage.read_at(&mut buf[headroom..], offset)?;
            Ok(buf)
        }
        Op::Write { data } => {
            storage.write_at(&data, offset)?;
            if fua {
                storage.flush()?;
            }
            Ok(Vec::new())
        }
        Op::Flush => {
            storage.flush()?;
            Ok(Vec::new())
        }
        Op::Trim { len } => {
            storage.trim(offset, len as u64)?;
            if fua {
                storage.flush()?;
            }
            Ok(Vec::new())
        }
        Op::WriteZeroes { len, may_punch } => {
            if may_punch {
                storage.trim(offset, len as u64)?;
            } else {
                storage.write_zeroes(offset, len as u64)?;
            }
            if fua {
                storage.flush()?;
            }
            Ok(Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next boundary after a cut: the following one, or the first after now when behind.
    #[test]
    fn a_cut_behind_skips_to_the_first_boundary_after_now() {
        let cut = Cut { round: 3, at: Nanos(30), interval: Nanos(10) };
        let at = |c: Cut| (c.round, c.at.0);
        assert_eq!(at(cut.next(Nanos(30))), (4, 40), "on time: the next");
        assert_eq!(at(cut.next(Nanos(39))), (4, 40));
        assert_eq!(at(cut.next(Nanos(40))), (5, 50), "the next already due: skipped");
        assert_eq!(at(cut.next(Nanos(95))), (10, 100));
        let tiny = Cut { round: 0, at: Nanos(0), interval: Nanos(1) };
        assert_eq!(at(tiny.next(Nanos(1_000_000))), (1_000_001, 1_000_001), "one cut, not a million");
    }

    /// RAM whose reads wait until the test lets them go.
    struct HeldReads {
        ram: crate::storage::MemStorage,
        open: std::sync::Mutex<bool>,
        opened: std::sync::Condvar,
    }

    impl HeldReads {
        fn set(&self, open: bool) {
            *self.open.lock().unwrap() = open;
            self.opened.notify_all();
        }
    }

    impl Storage for HeldReads {
        fn size(&self) -> u64 {
            self.ram.size()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError> {
            let g = self.open.lock().unwrap();
            drop(self.opened.wait_while(g, |open| !*open).unwrap());
            self.ram.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), StorageError> {
            self.ram.write_at(buf, offset)
        }
        fn flush(&self) -> Result<(), StorageError> {
            Ok(())
        }
        fn trim(&self, offset: u64, len: u64) -> Result<(), StorageError> {
            self.ram.trim(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), StorageError> {
            self.ram.write_zeroes(offset, len)
        }
    }

    /// The pShift calls' refusals, exactly as the link reports them: a scheduler that is not the token
    /// scheduler, a report before any welcome, and a dispatcher that has stopped.
    #[tokio::test]
    async fn pshift_refusals_read_as_before() {
        let attach = || {
            let (strays_to, _) = mpsc::unbounded_channel();
            PshiftAttach { server: 0, strays: false, buckets: vec![], limited: vec![], strays_to }
        };
        let config = |scheduler| DispatchConfig {
            scheduler,
            io_engine: IoEngine::Inline,
            precise_timer: false,
            ..DispatchConfig::default()
        };
        let (d, _join) = Dispatcher::spawn(None, config(SchedulerKind::Mclock));
        let e = d.pshift_attach(attach()).await.unwrap_err().to_string();
        assert_eq!(e, "pShift needs scheduler = \"token\" (this server runs mclock)");
        let (d, join) = Dispatcher::spawn(None, config(SchedulerKind::Token));
        let e = d.pshift_report(0, 0).await.unwrap_err().to_string();
        assert_eq!(e, "no pShift controller has welcomed this server");
        d.pshift_attach(attach()).await.unwrap();
        assert_eq!(d.pshift_report(0, 0).await.unwrap().round, 0);
        join.abort();
        let _ = join.await;
        assert_eq!(d.pshift_report(1, 0).await.unwrap_err().to_string(), "the server is shutting down");
        assert_eq!(d.pshift_attach(attach()).await.unwrap_err().to_string(), "the server is shutting down");
        assert!(matches!(d.pshift_report(1, 0).await.unwrap_err(), PshiftError::ShuttingDown));
        let (d, _join) = Dispatcher::spawn(None, config(SchedulerKind::Sfq));
        let e = d.pshift_attach(attach()).await.unwrap_err();
        assert!(matches!(e, PshiftError::NotToken { running: "sfq" }), "{e:?}");
        assert!(matches!(d.pshift_report(0, 0).await.unwrap_err(), PshiftError::NotWelcomed));
    }

    /// A dispatcher that takes a pShift call and drops it unanswered (its loop ending between receiving
    /// and answering) has stopped, as one that no longer takes calls: both calls read "the server is
    /// shutting down" ([`Dispatcher::ask_pshift`]'s second way to fail; the test above reaches the first).
    #[tokio::test]
    async fn a_pshift_call_dropped_unanswered_is_shutting_down() {
        let (tx, mut rx) = mpsc::channel(4);
        let d = Dispatcher { tx, clock: Clock::new() };
        let taken = tokio::spawn(async move {
            let mut n = 0;
            while let Some(cmd) = rx.recv().await {
                assert!(matches!(cmd, Cmd::PshiftAttach(..) | Cmd::PshiftReport(..)));
                n += 1;
                drop(cmd);
            }
            n
        });
        let (strays_to, _) = mpsc::unbounded_channel();
        let a = PshiftAttach { server: 0, strays: false, buckets: vec![], limited: vec![], strays_to };
        let e = d.pshift_attach(a).await.unwrap_err();
        assert!(matches!(e, PshiftError::ShuttingDown), "{e:?}");
        let e = d.pshift_report(3, 1).await.unwrap_err();
        assert_eq!(e.to_string(), "the server is shutting down");
        drop(d);
        assert_eq!(taken.await.unwrap(), 2, "both calls were taken, then dropped");
    }

    /// A pShift report's busy time leaves out a stall of the process that fell while an IO was at the
    /// backend (module comment, "pShift"); the stall watch is the test's, not ticked for 1.4 s as a
    /// stopped process's would not be. A read held 0.4 s with the watch ticking counts its 0.4 s; one held
    /// 1.4 s across a stall counts well under 0.3 s, whether the stall is still in progress when the read
    /// is reaped or already recorded. Before, the busy time held the whole stall (1.4 s), and the
    /// controller's capacity estimate for the server fell with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stall_with_an_io_at_the_backend_is_not_busy_time() {
        let config = DispatchConfig {
            scheduler: SchedulerKind::Token,
            io_engine: IoEngine::Threads,
            precise_timer: false,
            ..DispatchConfig::default()
        };
        let (d, join) = Dispatcher::spawn(None, config);
        let tenant = d.add_tenant(QosSpec::default()).await.unwrap();
        let (strays_to, _strays) = mpsc::unbounded_channel();
        let buckets = vec![(tenant, 0)];
        d.pshift_attach(PshiftAttach { server: 0, strays: false, buckets, limited: vec![], strays_to }).await.unwrap();
        let watch = Arc::new(crate::stall::StallWatch::default());
        d.pshift_watch(watch.clone()).await;
        let held = Arc::new(HeldReads {
            ram: crate::storage::MemStorage::new(1 << 20),
            open: Default::default(),
            opened: Default::default(),
        });
        let storage: Arc<dyn Storage> = held.clone();
        let ms = std::time::Duration::from_millis;
        // One read held `hold`, the watch ticked every 50 ms while `ticking` (else not at all, then once
        // at the end if `recorded`); returns the busy time of the report cut after it (s).
        let mut round = 0;
        let mut busy_across = |hold: std::time::Duration, ticking: bool, recorded: bool| {
            let (d, watch, held, storage) = (d.clone(), watch.clone(), held.clone(), storage.clone());
            round += 1;
            let round = round;
            async move {
                watch.tick(watch.now());
                d.pshift_report(round, 0).await.unwrap();
                held.set(false);
                let io = IoRequest { storage, tenant, offset: 0, op: Op::read(4096), fua: false, piggyback: None };
                let read = tokio::spawn({
                    let d = d.clone();
                    async move { d.io(io).await }
                });
                let t0 = std::time::Instant::now();
                while t0.elapsed() < hold {
                    tokio::time::sleep(ms(50)).await;
                    if ticking {
                        watch.tick(watch.now());
                    }
                }
                if recorded {
                    assert!(watch.tick(watch.now()).is_some(), "the stall recorded");
                }
                held.set(true);
                read.await.unwrap().unwrap();
                let r = d.pshift_report(round + 100, 0).await.unwrap();
                r.busy_ns as f64 / 1e9
            }
        };
        let ran = busy_across(ms(400), true, false).await;
        assert!((0.35..0.6).contains(&ran), "a read held 0.4 s with the process running: {ran} s busy");
        let in_progress = busy_across(ms(1400), false, false).await;
        assert!(in_progress < 0.3, "across a stall still in progress: {in_progress} s busy");
        let recorded = busy_across(ms(1400), false, true).await;
        assert!(recorded < 0.3, "across a stall recorded: {recorded} s busy");
        drop(d);
        join.await.unwrap();
    }

    /// A file's `flush`, counted (the rest passed through).
    struct CountedFlushes {
        file: crate::storage::FileStorage,
        flushes: std::sync::atomic::AtomicU32,
    }

    impl Storage for CountedFlushes {
        fn size(&self) -> u64 {
            self.file.size()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError> {
            self.file.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), StorageError> {
            self.file.write_at(buf, offset)
        }
        fn flush(&self) -> Result<(), StorageError> {
            self.flushes.fetch_add(1, Ordering::Relaxed);
            self.file.flush()
        }
        fn trim(&self, offset: u64, len: u64) -> Result<(), StorageError> {
            self.file.trim(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), StorageError> {
            self.file.write_zeroes(offset, len)
        }
        fn kernel_io(&self, offset: u64, len: u64, write: bool) -> Result<Option<KernelIo>, StorageError> {
            self.file.kernel_io(offset, len, write)
        }
        fn sync_failed(&self, errno: i32) {
            self.file.sync_failed(errno)
        }
        fn sync_error(&self) -> Option<StorageError> {
            self.file.sync_error()
        }
    }

    /// Route 1 of the module comment: under the io_uring engine a FUA trim's and a FUA write-zeroes' sync
    /// is the ring's (one at a time with the ring's other syncs of the file, its invariant 5), so the
    /// storage's own `flush`, which ran on the blocking pool beside them, is never called; under
    /// `threads` it is, once per request.
    #[tokio::test]
    async fn a_fua_trim_is_synced_on_the_ring_under_io_uring() {
        let d = tempfile::tempdir().unwrap();
        for engine in [IoEngine::Uring, IoEngine::Threads] {
            let file = crate::storage::FileStorage::open(&d.path().join(engine.name()), Some(1 << 20), false).unwrap();
            let counted = Arc::new(CountedFlushes { file, flushes: Default::default() });
            let storage: Arc<dyn Storage> = counted.clone();
            let config = DispatchConfig { io_engine: engine, precise_timer: false, ..DispatchConfig::default() };
            let (d, join) = Dispatcher::spawn(None, config);
            let tenant = d.add_tenant(QosSpec::default()).await.unwrap();
            let io = |offset, op, fua| IoRequest { storage: storage.clone(), tenant, offset, op, fua, piggyback: None };
            d.io(io(0, Op::Write { data: vec![7; 8192] }, false)).await.unwrap();
            d.io(io(0, Op::Trim { len: 4096 }, true)).await.unwrap();
            d.io(io(4096, Op::WriteZeroes { len: 4096, may_punch: false }, true)).await.unwrap();
            let mut back = vec![1u8; 8192];
            storage.read_at(&mut back, 0).unwrap();
            assert!(back.iter().all(|&b| b == 0), "{engine:?}: trimmed and zeroed");
            let ring = Uring::<u32>::new(8).is_ok();
            let flushes = counted.flushes.load(Ordering::Relaxed);
            let syncs = d.snapshot().await.unwrap().syncs;
            match engine {
                IoEngine::Uring if ring => {
                    assert_eq!(flushes, 0, "under io_uring the ring syncs");
                    // One after another: none merged (`/metrics`: rein_backend_syncs_total and _started_total).
                    assert_eq!(syncs, Some((2, 2)), "the ring's syncs");
                    // Eight FUA writes at once: each asks a sync, one at a time at the kernel, those that
                    // come while one runs merged into the next.
                    let writes = (0..8).map(|k| d.io(io(k * 4096, Op::Write { data: vec![1; 4096] }, true)));
                    for r in futures_util::future::join_all(writes).await {
                        r.unwrap();
                    }
                    let (asked, started) = d.snapshot().await.unwrap().syncs.unwrap();
                    assert_eq!(asked, 10);
                    assert!((3..=10).contains(&started), "{started} of {asked} syncs at the kernel");
                }
                IoEngine::Uring => eprintln!("io_uring unavailable here: the engine fell back to threads"),
                _ => {
                    assert_eq!(flushes, 2, "{engine:?}: the storage syncs each FUA request itself");
                    assert_eq!(syncs, None, "no ring");
                }
            }
            drop(d);
            join.await.unwrap();
        }
    }

    /// What runs on the dispatcher's task: RAM IO up to its bound (a flush too); on a file, nothing
    /// under the `threads` engine (a flush, 0 bytes, ran there), and under `inline` what fits but a flush.
    #[test]
    fn only_what_never_blocks_runs_inline() {
        let d = tempfile::tempdir().unwrap();
        let file: Arc<dyn Storage> =
            Arc::new(crate::storage::FileStorage::open(&d.path().join("f"), Some(1 << 20), false).unwrap());
        let ram: Arc<dyn Storage> = Arc::new(crate::storage::MemStorage::new(1 << 20));
        let tenant =
            rein_core::Fifo::new(SchedConfig::default()).add_tenant(QosSpec::new(0.0, None, 1.0, 0).unwrap()).unwrap();
        let req = |storage: &Arc<dyn Storage>, op: Op, fua: bool| IoRequest {
            storage: storage.clone(),
            tenant,
            offset: 0,
            op,
            fua,
            piggyback: None,
        };
        let write = |n: usize| Op::Write { data: vec![0; n] };
        for (op, fua) in [(Op::Flush, false), (write(0), true), (write(4096), false)] {
            assert!(!runs_inline(&req(&file, op, fua), 0), "a file's IO may block");
        }
        assert!(runs_inline(&req(&file, write(4096), false), 1 << 20), "engine inline");
        assert!(!runs_inline(&req(&file, Op::Flush, false), 1 << 20), "engine inline, but not a flush");
        assert!(runs_inline(&req(&ram, Op::Flush, false), 0) && runs_inline(&req(&ram, write(4096), true), 0));
    }
}
