//! The QoS dispatcher: rein-core's scheduler on a real clock, in front of a storage backend.
//!
//! # Model
//! One dispatcher task per backend owns a [`Scheduler`] (mClock by default; SFQ or FIFO for comparison),
//! unchanged from the simulator's. Connections send it [`IoRequest`]s over a bounded channel; it queues
//! them under their tenant, and whenever fewer than `depth` (D) requests are outstanding at the backend it
//! asks the scheduler for the next one and starts it on tokio's blocking pool. A [`Poll::Wait`] arms a
//! timer; a completion or a new request re-runs the loop. Time is [`Clock`]: nanoseconds since the
//! dispatcher started, from tokio's monotonic `Instant`.
//!
//! With a [`DeviceModel`], each request also waits for its slot on a modelled device (FIFO, rate C,
//! service-time distribution): the request completes at `max(real IO done, modelled completion)`. That
//! gives repeatable capacity for QoS experiments on any machine, and a capacity that can change at run time.
//!
//! # Invariants
//! 1. `outstanding <= depth` (asserted).
//! 2. Every request received is answered exactly once: completed, failed by the backend, or refused
//!    (unknown tenant, full queue, shutdown) with an error.
//! 3. On shutdown, queued requests are still dispatched and in-flight ones drained before the task ends.

use crate::devmodel::DeviceModel;
use crate::storage::{Storage, StorageError};
use rein_core::{Nanos, Phase, Poll, QosSpec, Request, SchedConfig, SchedError, Scheduler, SchedulerKind, TenantId, TenantStats};
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
    pub fn new() -> Clock {
        Clock { origin: Instant::now() }
    }
    pub fn now(&self) -> Nanos {
        Nanos(self.origin.elapsed().as_nanos().min(u64::MAX as u128) as u64)
    }
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
    Read { len: u32 },
    Write { data: Vec<u8> },
    Flush,
    Trim { len: u32 },
    WriteZeroes { len: u32 },
}

impl Op {
    pub fn len(&self) -> u64 {
        match self {
            Op::Read { len } | Op::Trim { len } | Op::WriteZeroes { len } => *len as u64,
            Op::Write { data } => data.len() as u64,
            Op::Flush => 0,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct IoRequest {
    /// The export's storage (several exports may share one dispatcher, i.e. one device).
    pub storage: Arc<dyn Storage>,
    pub tenant: TenantId,
    pub offset: u64,
    pub op: Op,
    /// Force unit access: flush after a write before answering.
    pub fua: bool,
}

/// A completed request: read data (for reads), or the error.
pub type IoResult = Result<Vec<u8>, IoError>;

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("scheduler refused the request: {0}")]
    Refused(#[from] SchedError),
    #[error("server is shutting down")]
    Shutdown,
}

impl IoError {
    /// NBD errno for this error.
    pub fn errno(&self) -> u32 {
        match self {
            IoError::Storage(e) => e.errno(),
            IoError::Refused(SchedError::UnknownTenant(_)) => 22, // EINVAL
            IoError::Refused(_) => 12,                            // ENOMEM: queue full
            IoError::Shutdown => 108,                             // ESHUTDOWN
        }
    }
}

/// Per-tenant measurements kept by the dispatcher.
#[derive(Clone, Debug, Default)]
pub struct TenantCounters {
    pub completed: [u64; 3],
    pub bytes: u64,
    pub errors: u64,
    pub latency_sum_ns: u128,
    /// Latency histogram: counts in buckets with upper bounds [`LATENCY_BUCKETS_S`] (+Inf last).
    pub latency_buckets: Vec<u64>,
}

/// Upper bounds (seconds) of the latency histogram buckets (Prometheus style).
pub const LATENCY_BUCKETS_S: [f64; 14] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// A snapshot of one tenant.
#[derive(Clone, Debug)]
pub struct TenantSnapshot {
    pub id: TenantId,
    pub spec: QosSpec,
    pub sched: TenantStats,
    pub counters: TenantCounters,
}

/// A snapshot of the dispatcher.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub now: Nanos,
    pub scheduler: SchedulerKind,
    pub outstanding: usize,
    pub depth: usize,
    pub tenants: Vec<TenantSnapshot>,
    pub capacity_iops: Option<f64>,
}

enum Cmd {
    Io(IoRequest, oneshot::Sender<IoResult>),
    AddTenant(QosSpec, oneshot::Sender<Result<TenantId, SchedError>>),
    SetSpec(TenantId, QosSpec, oneshot::Sender<Result<(), SchedError>>),
    Snapshot(oneshot::Sender<Snapshot>),
}

struct Done {
    slot: usize,
    phase: Phase,
    bytes: u64,
    latency: Nanos,
    ok: bool,
}

/// Dispatcher settings.
#[derive(Clone, Debug)]
pub struct DispatchConfig {
    pub scheduler: SchedulerKind,
    pub sched: SchedConfig,
    /// D: requests outstanding at the backend.
    pub depth: usize,
    /// Bound of the request channel from connections.
    pub channel: usize,
    /// Run requests of at most this many bytes directly on the dispatcher instead of the blocking pool.
    /// A thread hand-off costs more than a page-cache or RAM access, so for memory-backed or cached
    /// exports inline IO is several times cheaper; for slow disks keep it 0 (every IO on the pool), or a
    /// slow read stalls the dispatcher. Requests with a device model always wait asynchronously.
    pub inline_max_bytes: u64,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig { scheduler: SchedulerKind::Mclock, sched: SchedConfig::default(), depth: 32, channel: 4096, inline_max_bytes: 0 }
    }
}

/// A cheap, cloneable handle to a running dispatcher.
#[derive(Clone)]
pub struct Dispatcher {
    tx: mpsc::Sender<Cmd>,
    device: Option<Arc<DeviceModel>>,
}

impl Dispatcher {
    /// Starts the dispatcher task on the current tokio runtime. It ends (after draining) when every handle
    /// is dropped; the returned join handle resolves then.
    pub fn spawn(device: Option<Arc<DeviceModel>>, config: DispatchConfig) -> (Dispatcher, tokio::task::JoinHandle<()>) {
        assert!(config.depth > 0, "depth must be positive");
        let (tx, rx) = mpsc::channel(config.channel.max(1));
        let sched = match config.scheduler {
            SchedulerKind::Rbfq => Box::new(rein_core::Rbfq::with_limit_in_cost_units(config.sched)) as Box<dyn Scheduler>,
            k => k.build(config.sched),
        };
        let task = Task {
            sched,
            device: device.clone(),
            depth: config.depth,
            clock: Clock::new(),
            outstanding: 0,
            pending: Vec::new(),
            free: Vec::new(),
            counters: Vec::new(),
            inline_max_bytes: config.inline_max_bytes,
            ids: Vec::new(),
            kind: config.scheduler,
        };
        let join = tokio::spawn(task.run(rx));
        (Dispatcher { tx, device }, join)
    }

    /// Submits a request and waits for its completion.
    pub async fn io(&self, req: IoRequest) -> IoResult {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Io(req, tx)).await.map_err(|_| IoError::Shutdown)?;
        rx.await.map_err(|_| IoError::Shutdown)?
    }

    pub async fn add_tenant(&self, spec: QosSpec) -> Result<TenantId, IoError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::AddTenant(spec, tx)).await.map_err(|_| IoError::Shutdown)?;
        Ok(rx.await.map_err(|_| IoError::Shutdown)??)
    }

    pub async fn set_spec(&self, id: TenantId, spec: QosSpec) -> Result<(), IoError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::SetSpec(id, spec, tx)).await.map_err(|_| IoError::Shutdown)?;
        Ok(rx.await.map_err(|_| IoError::Shutdown)??)
    }

    pub async fn snapshot(&self) -> Result<Snapshot, IoError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Snapshot(tx)).await.map_err(|_| IoError::Shutdown)?;
        rx.await.map_err(|_| IoError::Shutdown)
    }

    /// Changes the modelled device's capacity (no-op without a device model).
    pub fn set_capacity(&self, iops: f64) -> bool {
        match &self.device {
            Some(d) => d.set_capacity(iops),
            None => false,
        }
    }
}

struct Pending {
    req: IoRequest,
    reply: oneshot::Sender<IoResult>,
    arrived: Nanos,
}

struct Task {
    sched: Box<dyn Scheduler>,
    device: Option<Arc<DeviceModel>>,
    depth: usize,
    clock: Clock,
    outstanding: usize,
    pending: Vec<Option<Pending>>,
    free: Vec<usize>,
    counters: Vec<TenantCounters>,
    inline_max_bytes: u64,
    /// Tenants added, in order (for snapshots).
    ids: Vec<TenantId>,
    kind: SchedulerKind,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        let mut wake: Option<Nanos> = None;
        let mut open = true;
        loop {
            if open || self.sched.queued() > 0 {
                wake = self.pump(&done_tx);
            }
            if !open && self.outstanding == 0 && self.sched.queued() == 0 {
                break;
            }
            let sleep_until = wake.map(|t| self.clock.instant(t));
            tokio::select! {
                cmd = rx.recv(), if open => match cmd {
                    Some(c) => self.command(c),
                    None => open = false,
                },
                Some(d) = done_rx.recv() => self.finish(d),
                _ = async { tokio::time::sleep_until(sleep_until.expect("guarded")).await }, if sleep_until.is_some() => {}
            }
        }
        tracing::debug!("dispatcher drained and stopped");
    }

    fn command(&mut self, c: Cmd) {
        match c {
            Cmd::Io(req, reply) => {
                let now = self.clock.now();
                let size = req.op.len().max(1);
                let offset = req.offset;
                let tenant = req.tenant;
                let handle = match self.free.pop() {
                    Some(h) => h,
                    None => {
                        self.pending.push(None);
                        self.pending.len() - 1
                    }
                };
                self.pending[handle] = Some(Pending { req, reply, arrived: now });
                if let Err(e) = self.sched.enqueue(now, Request::new(tenant, handle as u64).size(size).offset(offset)) {
                    let p = self.pending[handle].take().expect("just stored");
                    self.free.push(handle);
                    if let Some(c) = self.counters.get_mut(tenant.index()) {
                        c.errors += 1;
                    }
                    let _ = p.reply.send(Err(e.into()));
                }
            }
            Cmd::AddTenant(spec, reply) => {
                let r = self.sched.add_tenant(spec);
                if let Ok(id) = r {
                    self.ids.push(id);
                    if self.counters.len() <= id.index() {
                        self.counters.resize_with(id.index() + 1, TenantCounters::default);
                    }
                    self.counters[id.index()] = TenantCounters { latency_buckets: vec![0; LATENCY_BUCKETS_S.len() + 1], ..Default::default() };
                }
                let _ = reply.send(r);
            }
            Cmd::SetSpec(id, spec, reply) => {
                let _ = reply.send(self.sched.set_spec(id, spec));
            }
            Cmd::Snapshot(reply) => {
                let mut tenants = Vec::new();
                for &id in &self.ids {
                    if let (Ok(spec), Ok(st)) = (self.sched.spec(id), self.sched.stats(id)) {
                        tenants.push(TenantSnapshot { id, spec, sched: st, counters: self.counters[id.index()].clone() });
                    }
                }
                let _ = reply.send(Snapshot {
                    now: self.clock.now(),
                    scheduler: self.kind,
                    outstanding: self.outstanding,
                    depth: self.depth,
                    tenants,
                    capacity_iops: self.device.as_ref().map(|d| d.capacity()),
                });
            }
        }
    }

    /// Dispatches while slots are free; returns when to wake for a limit, if any.
    fn pump(&mut self, done: &mpsc::UnboundedSender<Done>) -> Option<Nanos> {
        while self.outstanding < self.depth {
            let now = self.clock.now();
            match self.sched.poll(now, self.outstanding == 0) {
                Poll::Dispatch(d) => {
                    let handle = d.handle as usize;
                    let p = self.pending[handle].take().expect("dispatched handle is pending");
                    self.free.push(handle);
                    self.outstanding += 1;
                    debug_assert!(self.outstanding <= self.depth, "invariant 1");
                    self.start(p, d.phase, now, done.clone());
                }
                Poll::Wait(t) => return Some(t),
                Poll::Empty => return None,
            }
        }
        None
    }

    fn start(&mut self, p: Pending, phase: Phase, now: Nanos, done: mpsc::UnboundedSender<Done>) {
        if self.device.is_none() && p.req.op.len() <= self.inline_max_bytes {
            // Inline: no task, no thread hand-off; the completion is accounted at once.
            let Pending { req, reply, arrived } = p;
            let slot = req.tenant.index();
            let bytes = req.op.len();
            let res = execute(req);
            let ok = res.is_ok();
            let latency = self.clock.now().saturating_sub(arrived);
            let _ = reply.send(res);
            self.finish(Done { slot, phase, bytes, latency, ok });
            return;
        }
        let deadline = self.device.as_ref().map(|d| self.clock.instant(d.admit(now, p.req.op.len())));
        let clock = self.clock;
        let slot = p.req.tenant.index();
        tokio::spawn(async move {
            let Pending { req, reply, arrived } = p;
            let bytes = req.op.len();
            let res = tokio::task::spawn_blocking(move || execute(req))
                .await
                .unwrap_or_else(|e| Err(IoError::Storage(StorageError::Io { op: "task", source: std::io::Error::other(e.to_string()) })));
            if let Some(dl) = deadline {
                tokio::time::sleep_until(dl).await;
            }
            let ok = res.is_ok();
            let latency = clock.now().saturating_sub(arrived);
            let _ = reply.send(res);
            let _ = done.send(Done { slot, phase, bytes, latency, ok });
        });
    }

    fn finish(&mut self, d: Done) {
        assert!(self.outstanding > 0, "completion without a dispatch");
        self.outstanding -= 1;
        if let Some(c) = self.counters.get_mut(d.slot) {
            if d.ok {
                c.completed[d.phase.index()] += 1;
                c.bytes += d.bytes;
                c.latency_sum_ns += d.latency.0 as u128;
                let s = d.latency.as_secs_f64();
                let b = LATENCY_BUCKETS_S.iter().position(|&u| s <= u).unwrap_or(LATENCY_BUCKETS_S.len());
                c.latency_buckets[b] += 1;
            } else {
                c.errors += 1;
            }
        }
    }
}

fn execute(req: IoRequest) -> IoResult {
    let IoRequest { storage, offset, op, fua, .. } = req;
    match op {
        Op::Read { len } => {
            let mut buf = vec![0u8; len as usize];
            storage.read_at(&mut buf, offset)?;
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
        Op::WriteZeroes { len } => {
            storage.write_zeroes(offset, len as u64)?;
            if fua {
                storage.flush()?;
            }
            Ok(Vec::new())
        }
    }
}
