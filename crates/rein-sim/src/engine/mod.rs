//! The run layer: the discrete-event engine.
//!
//! # Model
//! - **Servers** (`engine/server.rs`): a scheduler (from `rein-core`, unchanged) in front of a device (rein-model's
//!   [`Device`]). The scheduler releases a request whenever fewer than `queue_depth` (D) are outstanding
//!   at the device; the device serves them FIFO (one at a time, its latency grows with its queue) or by
//!   processor sharing, with service times from its model, scaled when the capacity schedule changes it.
//! - **Tenants**: each has a workload generator (rein-model's [`Generator`]) and, in front of the servers,
//!   a gateway: it routes each request (by offset striping or by shares, or keeps a window per server),
//!   and for distributed schedulers (dmclock, rbfq, dtfq) keeps a [`ServiceTracker`] whose delta/rho ride
//!   on every request. Gateway and server are `net_delay` apart each way. pShift buckets have neither:
//!   the cluster layer drives them.
//! - **Layers**: PARDA hosts (`engine/parda.rs`): a tenant that is a VM on a host sends its requests to the host's
//!   local scheduler, which releases them to its array within its window and sees their completions;
//!   host periods are events. A pShift cluster (`engine/pshift.rs`): buckets' demand phases and arrival streams,
//!   the servers' token schedulers, reports and a controller across a modelled delay; its requests take
//!   the same path through servers and devices as every other.
//! - **Time** is integer nanoseconds. Events are ordered by (time, sequence number), so equal times run in
//!   the order they were scheduled: the run is a pure function of the scenario and its seed.
//! - **Randomness**: one PCG stream per server and per tenant (rein-model's [`rein_model::seed`]), seeded
//!   from the scenario seed and the entity's index, so adding a tenant does not change the others'
//!   streams.
//!
//! The engine records into rein-model's [`Recorder`] (and [`HostRecorder`]) and returns a [`Recording`];
//! the report layer ([`crate::report`]) turns it into totals.
//!
//! # Invariants
//! 1. A server's `outstanding` (dispatched, not completed) never exceeds its queue depth.
//! 2. Every request issued completes exactly once, or is rejected at a full scheduler queue (counted).
//! 3. Event times never decrease.

mod events;
mod parda;
mod pshift;
mod server;

use crate::model::Scenario;
use events::{Events, Kind};
use parda::HostLayer;
use pshift::Cluster;
use rein_core::pshift::TokenScheduler;
use rein_core::{Cost, Limits, Nanos, Phase, Piggyback, Poll, Request, SchedConfig, ServiceTracker, TenantId};
use rein_model::device::{Discipline, Job};
use rein_model::report::hosts::HostRecorder;
use rein_model::report::rounds::PeriodLog;
use rein_model::seed::{server_stream, stream_seed};
use rein_model::workload::{Arrival, Begin, Reissue};
use rein_model::{Device, Generator, Recorder, Router};
use server::{Sched, Server};

/// What a run recorded, for the report layer.
pub struct Recording {
    /// Tenants' and servers' measurements.
    pub recorder: Recorder,
    /// PARDA hosts' measurements.
    pub hosts: Option<HostRecorder>,
    /// Events run.
    pub events: u64,
    /// Times a scheduler was handed a time earlier than one it had seen.
    pub time_regressions: u64,
    /// A pShift controller's rounds (empty without one).
    pub rounds: Vec<rein_model::report::rounds::ControllerRound>,
    /// Per bucket (name), its closed periods as the controller counted them (empty without one).
    pub periods: Vec<(String, rein_model::report::rounds::PeriodCounts)>,
    /// The same periods one by one (empty without one).
    pub period_log: PeriodLog,
}

/// Error building a simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario cannot be set up (a bound of the recorder or a scheduler): the scenario as errors
    /// name it ([`Scenario::label`]), and what is wrong (boxed: rein-core's errors are large).
    #[error("scenario {0}: {1}")]
    Setup(String, Box<SetupError>),
    /// The runs of a scenario's parts do not fit together ([`crate::run_in_parts`]).
    #[error("joining the parts' runs: {0}")]
    Join(#[from] rein_model::report::JoinError),
}

/// What keeps a validated scenario from being set up: a bound of the recorder, a scheduler, a PARDA host
/// or the pShift controller, each error as its crate made it.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// More tenant-server pairs than a 32-bit link index holds.
    #[error("more than 2^32 tenant-server pairs")]
    TooManyLinks,
    /// A server's scheduler refuses a tenant.
    #[error("tenant {tenant}: {error}")]
    AddTenant {
        /// The tenant.
        tenant: String,
        /// The scheduler's error.
        error: rein_core::SchedError,
    },
    /// The timeseries would exceed the recorder's bound. Validation refuses such a file
    /// ([`crate::model::ModelError::Timeseries`]); a scenario changed since meets it here.
    #[error("{0}")]
    Recorder(rein_model::recorder::TooManyCells),
    /// The hosts' timeseries would exceed the recorder's bound. Validation refuses such a file
    /// ([`crate::model::ModelError::HostTimeseries`]); a scenario changed since meets it here.
    #[error("{0}")]
    HostSeries(rein_model::report::hosts::TooManyHostCells),
    /// rein-core refuses a PARDA host.
    #[error("host {host}: {error}")]
    Host {
        /// The host.
        host: String,
        /// rein-core's error.
        error: rein_core::parda::PardaError,
    },
    /// A PARDA host's scheduler refuses a VM.
    #[error("host {host}: VM {vm}: {error}")]
    Vm {
        /// The host.
        host: String,
        /// The VM (tenant).
        vm: String,
        /// rein-core's error.
        error: rein_core::parda::PardaError,
    },
    /// rein-core refuses the hosts' aggregation timeout.
    #[error("{0}")]
    Aggregator(rein_core::parda::PardaError),
    /// rein-core refuses the pShift controller's configuration.
    #[error("{0}")]
    Controller(rein_core::pshift::ControllerError),
}

/// A request in flight: one cache line, aligned, so reaching a request costs one miss at most.
#[derive(Clone, Debug)]
#[repr(align(64))]
struct Req {
    tenant: u32,
    server: u32,
    /// Index of `server` in the tenant's server list (pShift: the server itself).
    k: u32,
    /// The tenant's id at the server's scheduler.
    tid: TenantId,
    size: u64,
    offset: u64,
    issued: Nanos,
    phase: Phase,
    /// A write (an array device's RAID-5 writes cost more).
    write: bool,
    cost: Cost,
    /// When the tenant's host released it to the array (VMs on PARDA hosts).
    host_issued: Nanos,
}

/// A tenant's simulator state. With thousands of tenants every completion lands on a cold tenant. A
/// closed-loop completion and its reissue read the gateway line (router, links, tracker) and the
/// generator's hot line: two adjacent lines of one 128-byte block, which the hardware fetches as a pair.
#[repr(C, align(128))]
struct TenantState {
    // Line 0: the gateway.
    router: Router,
    /// The tenant's links: `links[first_link..first_link + router.servers()]`, in the order of
    /// `Tenant::servers`.
    first_link: u32,
    /// dmClock/RBFQ's delta/rho tracker (distributed servers only; boxed to keep the line).
    tracker: Option<Box<ServiceTracker>>,
    // Line 1 (hot) and 2: the workload.
    gen: Generator,
}

/// A tenant at one of its servers: the gateway's view of it.
#[derive(Copy, Clone, Debug)]
struct Link {
    /// The tenant's id at the server's scheduler.
    id: TenantId,
    server: u32,
    /// Requests the gateway has in flight there (per-server windows ask for it).
    in_flight: u32,
}

/// A simulation in progress.
struct Sim<'a> {
    sc: &'a Scenario,
    now: Nanos,
    events: Events<Kind>,
    servers: Vec<Server>,
    /// Per tenant, its gateway and generator (empty in a pShift cluster, whose layer drives its buckets).
    tenants: Vec<TenantState>,
    /// The tenants' links (empty in a pShift cluster).
    links: Vec<Link>,
    reqs: Vec<Req>,
    free: Vec<u32>,
    rec: Recorder,
    events_run: u64,
    hosts: Option<HostLayer>,
    cluster: Option<Cluster<'a>>,
    done: Vec<u32>,
}

/// Runs `sc` to the end; `progress` is called now and then with the simulated time reached.
pub fn run(sc: &Scenario, progress: &mut dyn FnMut(Nanos)) -> Result<Recording, SimError> {
    Ok(Sim::new(sc)?.run(progress))
}

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario) -> Result<Sim<'a>, SimError> {
        let err = |e: SetupError| SimError::Setup(sc.label(), Box::new(e));
        // First, before anything is built (validation refuses what this would: a changed scenario).
        let rec = Recorder::new(sc.tenants.len(), sc.servers.len(), sc.duration, sc.interval, sc.warmup)
            .map_err(|e| err(SetupError::Recorder(e)))?;
        // Every server's scheduler holds up to the scenario's tenant (or bucket) count.
        let limits = Limits { max_tenants: sc.tenants.len().max(1), ..Limits::default() };
        let mut servers = Vec::with_capacity(sc.servers.len());
        for s in &sc.servers {
            let sched = match &sc.pshift {
                Some(ps) => {
                    let config = SchedConfig { limits, ..SchedConfig::default() };
                    let ts = if ps.weighted { TokenScheduler::weighted(config) } else { TokenScheduler::new(config) };
                    let ts = ts.with_r_order(ps.r_order);
                    Sched::Token(Box::new(ts))
                }
                None => {
                    // The server's `[mclock]` settings, with the scenario's tenant bound.
                    let config = SchedConfig { limits, ..s.sched };
                    // A spec's limit is in the scenario's cost units for every scheduler (RBFQ's too).
                    Sched::Plain(s.scheduler.build(config))
                }
            };
            let device = Device::new(&s.device, stream_seed(sc.seed(), server_stream(s.stream)));
            servers.push(Server::new(sched, s.queue_depth, device, sc.tenants.len()));
        }
        // Gateways and generators; pShift buckets have none: the cluster layer drives them and adds them
        // to servers as their demand moves.
        let mut tenants = Vec::new();
        let mut links = Vec::new();
        if sc.pshift.is_none() {
            tenants.reserve_exact(sc.tenants.len());
            for t in &sc.tenants {
                let first_link = u32::try_from(links.len()).map_err(|_| err(SetupError::TooManyLinks))?;
                for (k, &si) in t.servers.iter().enumerate() {
                    let id = servers[si]
                        .sched
                        .get()
                        .add_tenant(t.server_specs[k])
                        .map_err(|error| err(SetupError::AddTenant { tenant: t.name.clone(), error }))?;
                    links.push(Link { id, server: si as u32, in_flight: 0 });
                }
                let distributed = t.servers.iter().any(|&s| sc.servers[s].distributed) && t.servers.len() > 1;
                tenants.push(TenantState {
                    router: Router::new(&t.routing, t.servers.len()),
                    first_link,
                    tracker: distributed
                        .then(|| Box::new(ServiceTracker::with_split(t.servers.len(), t.reservation_split))),
                    gen: Generator::new(&t.workload, stream_seed(sc.seed(), t.stream)),
                });
            }
        }
        let hosts = HostLayer::new(sc).map_err(err)?;
        let cluster = match &sc.pshift {
            Some(ps) => Some(Cluster::new(sc, ps).map_err(err)?),
            None => None,
        };
        let mut sim = Sim {
            sc,
            now: Nanos::ZERO,
            events: Events::new(),
            servers,
            tenants,
            links,
            reqs: Vec::new(),
            free: Vec::new(),
            rec,
            events_run: 0,
            hosts,
            cluster,
            done: Vec::new(),
        };
        if sim.cluster.is_some() {
            sim.cluster_start();
        } else {
            for h in 0..sim.hosts.as_ref().map_or(0, |l| l.len()) {
                let at = sim.hosts.as_ref().expect("hosts").first_period(h);
                sim.schedule(at, Kind::HostPeriod, h as u32, 0);
                for (k, &(at, _)) in sc.hosts[h].window_schedule.iter().enumerate() {
                    sim.schedule(at, Kind::HostWindow, h as u32, k as u32);
                }
            }
            for (ti, t) in sc.tenants.iter().enumerate() {
                sim.schedule(t.workload.start, Kind::Start, ti as u32, 0);
                if t.workload.stop < sc.duration {
                    sim.schedule(t.workload.stop, Kind::Stop, ti as u32, 0);
                }
            }
        }
        for (si, s) in sc.servers.iter().enumerate() {
            for k in 1..s.device.schedule.len() {
                sim.schedule(s.device.schedule[k].0, Kind::Capacity, si as u32, k as u32);
            }
        }
        Ok(sim)
    }

    #[inline]
    fn schedule(&mut self, t: Nanos, kind: Kind, a: u32, b: u32) {
        debug_assert!(t >= self.now, "invariant 3");
        self.events.push(t, kind, a, b);
    }

    /// Runs to the end; `progress` is called now and then with the simulated time reached.
    fn run(mut self, progress: &mut dyn FnMut(Nanos)) -> Recording {
        let end = self.sc.duration;
        while let Some(ev) = self.events.pop_before(end) {
            let t = ev.t.0;
            self.now = ev.t;
            self.events_run += 1;
            if self.events_run & 0xFFFF == 0 {
                progress(self.now);
            }
            match ev.kind {
                Kind::Complete => self.fifo_complete(ev.a as usize),
                Kind::Wake => {
                    let s = ev.a as usize;
                    if self.servers[s].wake_at == Some(t) {
                        self.servers[s].wake_at = None;
                    }
                    self.try_dispatch(s);
                }
                Kind::Deliver => self.deliver(ev.a),
                Kind::Notify => self.notify(ev.a),
                Kind::Arrive => self.arrive(ev.a as usize),
                Kind::Toggle => self.toggle(ev.a as usize),
                Kind::Think => {
                    let t = ev.a as usize;
                    if self.tenants[t].gen.is_running() {
                        self.issue(t, (ev.b != u32::MAX).then_some(ev.b as usize));
                    }
                }
                Kind::Capacity => {
                    let s = ev.a as usize;
                    let iops = self.sc.servers[s].device.schedule[ev.b as usize].1;
                    self.servers[s].device.set_capacity(iops);
                }
                Kind::Start => self.start(ev.a as usize),
                Kind::Stop => self.tenants[ev.a as usize].gen.stop(),
                Kind::HostPeriod => {
                    let h = ev.a as usize;
                    let next = self.hosts.as_mut().expect("host events need hosts").period(h, self.now);
                    self.schedule(next.max(self.now), Kind::HostPeriod, h as u32, 0);
                    self.host_pump(h);
                }
                Kind::HostWake => {
                    let h = ev.a as usize;
                    let w = self.hosts.as_mut().expect("host events need hosts").wake_at(h);
                    if *w == Some(t) {
                        *w = None;
                    }
                    self.host_pump(h);
                }
                Kind::HostWindow => {
                    let h = ev.a as usize;
                    let window = self.sc.hosts[h].window_schedule[ev.b as usize].1;
                    self.hosts.as_mut().expect("host events need hosts").set_fixed_window(h, self.now, window);
                    self.host_pump(h);
                }
                Kind::PsDone => self.ps_done(ev.a as usize, ev.b),
                Kind::StreamArrive => self.stream_arrive(ev.a as usize),
                Kind::Change => self.change(ev.a as usize, ev.b as usize),
                Kind::Boundary => self.boundary(ev.a as u64),
                Kind::Reports => self.reports(),
                Kind::Stray => self.stray(),
                Kind::EarlyReport => self.early_report(),
                Kind::Tokens => self.tokens(),
            }
        }
        self.now = end;
        progress(end);
        // Close busy periods at the end for utilisation.
        for (i, s) in self.servers.iter().enumerate() {
            if let Some(since) = s.device.busy_since() {
                self.rec.server_busy(i, since, end);
            }
        }
        if self.cluster.is_some() {
            self.cluster_close_at_end();
        }
        // The controller's periods: its tally per bucket, and each period one by one (none without one).
        let names = || self.sc.tenants.iter().map(|t| t.name.clone());
        let (periods, period_log) = match self.cluster.as_mut().and_then(|c| c.controller_periods()) {
            Some((tallies, qos, records)) => (
                names().zip(tallies.iter().map(|&t| t.into())).collect(),
                PeriodLog { buckets: names().zip(qos.iter().copied()).collect(), records },
            ),
            None => (Vec::new(), PeriodLog::default()),
        };
        Recording {
            periods,
            period_log,
            time_regressions: self.servers.iter().map(|s| s.sched.time_regressions()).sum(),
            recorder: self.rec,
            hosts: self.hosts.map(HostLayer::finish),
            events: self.events_run,
            rounds: self.cluster.map(|c| c.rounds).unwrap_or_default(),
        }
    }

    // ---- Tenants: the workload generator ----------------------------------------------------------

    fn start(&mut self, t: usize) {
        let sc = self.sc;
        if let Some(at) = self.tenants[t].gen.start(self.now, &sc.tenants[t].workload) {
            self.schedule(at, Kind::Toggle, t as u32, 0);
        }
        self.begin(t);
    }

    /// Starts (or resumes, after an off period) the tenant's request generation.
    fn begin(&mut self, t: usize) {
        let sc = self.sc;
        match self.tenants[t].gen.begin(self.now, &sc.tenants[t].workload) {
            Begin::Fill => {
                for _ in 0..self.tenants[t].gen.deficit(None) {
                    self.issue(t, None);
                }
            }
            Begin::FillPerServer => {
                for k in 0..sc.tenants[t].servers.len() {
                    let at_k = self.links[self.tenants[t].first_link as usize + k].in_flight;
                    for _ in 0..self.tenants[t].gen.deficit(Some(at_k)) {
                        self.issue(t, Some(k));
                    }
                }
            }
            Begin::ArriveAt(at) => self.schedule(at, Kind::Arrive, t as u32, 0),
        }
    }

    fn toggle(&mut self, t: usize) {
        let sc = self.sc;
        if let Some((next, on)) = self.tenants[t].gen.toggle(self.now, &sc.tenants[t].workload) {
            self.schedule(next, Kind::Toggle, t as u32, 0);
            if on {
                self.begin(t);
            }
        }
    }

    fn arrive(&mut self, t: usize) {
        let spec = &self.sc.tenants[t].workload;
        match self.tenants[t].gen.arrival(spec) {
            None => return,
            Some(Arrival::Generated(n)) => {
                for _ in 0..n {
                    self.issue(t, None);
                }
            }
            Some(Arrival::Record(r)) => {
                let k = self.tenants[t].router.device_server(r.device);
                self.send(t, r.size, r.offset, !r.read, k)
            }
        }
        if let Some(at) = self.tenants[t].gen.next_arrival(self.now, spec) {
            self.schedule(at, Kind::Arrive, t as u32, 0);
        }
    }

    /// Issues a request of the workload's size, to server `k` of the tenant's list if given.
    #[inline]
    fn issue(&mut self, t: usize, k: Option<usize>) {
        let gen = &mut self.tenants[t].gen;
        let size = gen.size_bytes();
        let io = gen.next_io();
        self.send(t, size, io.offset, !io.read, k);
    }

    /// Sends a request of tenant `t` through its gateway: to server `force_k` of its list, or routed.
    fn send(&mut self, t: usize, size: u64, offset: u64, write: bool, force_k: Option<usize>) {
        let TenantState { gen, router, first_link, .. } = &mut self.tenants[t];
        let k = match force_k {
            Some(k) => k,
            None => router.route(offset, || gen.uniform()),
        };
        gen.issued();
        self.rec.arrival(t, self.now);
        let link = &mut self.links[*first_link as usize + k];
        link.in_flight += 1;
        let link = *link;
        let req = Req {
            tenant: t as u32,
            server: link.server,
            k: k as u32,
            tid: link.id,
            size,
            offset,
            issued: self.now,
            phase: Phase::Weight,
            write,
            cost: Cost(0),
            host_issued: self.now,
        };
        let id = self.alloc(req);
        if let Some(h) = self.hosts.as_ref().and_then(|l| l.host_of(t)) {
            // A VM: the request waits at its host for room in the window.
            if !self.hosts.as_mut().expect("hosts").enqueue(self.now, t, id as u64, size, offset) {
                self.reject(id);
                return;
            }
            self.host_pump(h);
            return;
        }
        self.transmit(id);
    }

    fn alloc(&mut self, req: Req) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.reqs[i as usize] = req;
                i
            }
            None => {
                self.reqs.push(req);
                (self.reqs.len() - 1) as u32
            }
        }
    }

    /// Sends request `id` over the network to its server.
    #[inline]
    fn transmit(&mut self, id: u32) {
        if self.sc.net_delay > Nanos::ZERO {
            let at = self.now.saturating_add(self.sc.net_delay);
            self.schedule(at, Kind::Deliver, id, 0);
        } else {
            self.deliver(id);
        }
    }

    /// A request that never reached a device: counted as rejected, its tenant told, its slot released.
    fn reject(&mut self, id: u32) {
        let r = &self.reqs[id as usize];
        let (t, k, s) = (r.tenant as usize, r.k as usize, r.server as usize);
        self.rec.rejected(t, self.now);
        match &mut self.cluster {
            Some(c) => c.failed(t, s),
            None => {
                let ts = &mut self.tenants[t];
                ts.gen.failed();
                self.links[ts.first_link as usize + k].in_flight -= 1;
            }
        }
        self.free.push(id);
    }

    // ---- PARDA hosts -------------------------------------------------------------------------------

    /// Releases what host `h`'s window allows to its array.
    fn host_pump(&mut self, h: usize) {
        loop {
            let layer = self.hosts.as_mut().expect("host_pump needs hosts");
            match layer.poll(h, self.now) {
                Poll::Dispatch(d) => {
                    let id = d.handle as u32;
                    self.reqs[id as usize].host_issued = self.now;
                    self.transmit(id);
                }
                Poll::Wait(t) => {
                    let w = layer.wake_at(h);
                    if w.is_none_or(|x| t.0 < x) {
                        *w = Some(t.0);
                        self.schedule(t, Kind::HostWake, h as u32, 0);
                    }
                    return;
                }
                Poll::Empty => return,
            }
        }
    }

    // ---- Servers -----------------------------------------------------------------------------------

    fn deliver(&mut self, id: u32) {
        let r = &self.reqs[id as usize];
        let (t, s, k) = (r.tenant as usize, r.server as usize, r.k as usize);
        // The gateway's tracker fills delta/rho as the request leaves it; with a network delay, completions
        // that reach the gateway meanwhile are counted in the next request (the paper's bounded staleness).
        // pShift buckets have no gateway, hence no tracker.
        let piggyback = match self.tenants.get_mut(t).and_then(|ts| ts.tracker.as_mut()) {
            Some(tr) if self.sc.servers[s].distributed => tr.prepare(k).expect("k < servers"),
            _ => Piggyback::default(),
        };
        let tid = r.tid;
        let pending = self.servers[s].pending[t] > 0;
        let req = Request::new(tid, id as u64).size(r.size).offset(r.offset).piggyback(piggyback).pending_here(pending);
        if self.servers[s].sched.get().enqueue(self.now, req).is_err() {
            // A full scheduler queue rejects the request (counted); the client sees it fail at once. It
            // leaves the tenant's pool as its tracker counts it (the pool flag).
            if let Some(tr) = self.tenants.get_mut(t).and_then(|ts| ts.tracker.as_mut()) {
                if self.sc.servers[s].distributed {
                    tr.abandon(k).expect("k < servers");
                }
            }
            if let Some(h) = self.hosts.as_ref().and_then(|l| l.host_of(t)) {
                self.hosts.as_mut().expect("hosts").failed(self.now, t);
                self.host_pump(h);
            }
            self.reject(id);
            return;
        }
        if self.cluster.is_some() {
            self.cluster_arrived(s, t, tid);
        }
        self.try_dispatch(s);
    }

    fn try_dispatch(&mut self, s: usize) {
        loop {
            let srv = &mut self.servers[s];
            if srv.outstanding >= srv.depth {
                return;
            }
            match srv.sched.get().poll(self.now, srv.outstanding == 0) {
                Poll::Dispatch(d) => {
                    let id = d.handle as u32;
                    let r = &mut self.reqs[id as usize];
                    r.phase = d.phase;
                    r.cost = d.cost;
                    srv.outstanding += 1;
                    debug_assert!(srv.outstanding <= srv.depth, "invariant 1");
                    srv.pending[r.tenant as usize] += 1;
                    // A VM's host may sit worse or better on the array (placement skew).
                    let scale = self.hosts.as_ref().map_or(1.0, |l| l.scale(r.tenant as usize));
                    let job = Job { id, size: r.size, offset: r.offset, scale, write: r.write };
                    let srv = &mut self.servers[s];
                    match srv.device.discipline() {
                        Discipline::Ps | Discipline::Array(_) => {
                            srv.device.concurrent_admit(self.now, job);
                            self.concurrent_rearm(s);
                        }
                        Discipline::Fifo => {
                            if let Some(at) = srv.device.fifo_arrive(self.now, job) {
                                self.schedule(at, Kind::Complete, s as u32, 0);
                            }
                        }
                    }
                }
                Poll::Wait(t) => {
                    if srv.wake_at.is_none_or(|w| t.0 < w) {
                        srv.wake_at = Some(t.0);
                        self.schedule(t, Kind::Wake, s as u32, 0);
                    }
                    return;
                }
                Poll::Empty => return,
            }
        }
    }

    /// A FIFO device finishes the request in service; the next one starts.
    fn fifo_complete(&mut self, s: usize) {
        let f = self.servers[s].device.fifo_finish(self.now);
        if let Some(at) = f.next {
            self.schedule(at, Kind::Complete, s as u32, 0);
        }
        if let Some(from) = f.busy_from {
            self.device_idle(s, from);
        }
        self.complete(s, f.id);
    }

    /// A processor-sharing device or an array: the next completion after arrivals or departures.
    fn concurrent_rearm(&mut self, s: usize) {
        if let Some((t, generation)) = self.servers[s].device.concurrent_rearm() {
            self.schedule(t.max(self.now), Kind::PsDone, s as u32, generation);
        }
    }

    fn ps_done(&mut self, s: usize, generation: u32) {
        let mut done = std::mem::take(&mut self.done);
        done.clear();
        if !self.servers[s].device.concurrent_take_done(self.now, generation, &mut done) {
            self.done = done;
            return;
        }
        for &id in &done {
            if let Some(from) = self.servers[s].device.end_busy_if_idle() {
                self.device_idle(s, from);
            }
            self.complete(s, id);
        }
        self.done = done;
        self.concurrent_rearm(s);
    }

    /// Server `s`'s device went idle at now after being busy since `from`.
    fn device_idle(&mut self, s: usize, from: Nanos) {
        self.rec.server_busy(s, from, self.now);
        if let Some(c) = &mut self.cluster {
            c.device_idle(s, from, self.now);
        }
    }

    /// Request `id` left server `s`'s device.
    fn complete(&mut self, s: usize, id: u32) {
        self.servers[s].outstanding -= 1;
        let t = self.reqs[id as usize].tenant as usize;
        self.servers[s].pending[t] -= 1;
        self.rec.server_completion(s, self.now);
        if let Some(c) = &mut self.cluster {
            c.device_completed(s);
        }
        if self.sc.net_delay > Nanos::ZERO {
            let at = self.now.saturating_add(self.sc.net_delay);
            self.schedule(at, Kind::Notify, id, 0);
        } else {
            self.notify(id);
        }
        self.try_dispatch(s);
    }

    /// The completion reaches the tenant's gateway/client.
    fn notify(&mut self, id: u32) {
        let r = self.reqs[id as usize].clone();
        self.free.push(id);
        let t = r.tenant as usize;
        if let Some(c) = &mut self.cluster {
            c.recorded(r.server as usize, r.tid);
            self.rec.completion(t, r.issued, self.now, r.size, r.phase);
            self.bucket_completed(t, r.server as usize);
            return;
        }
        if let Some(h) = self.hosts.as_ref().and_then(|l| l.host_of(t)) {
            // The host sees the completion first: a slot frees in its window.
            self.hosts.as_mut().expect("hosts").complete(self.now, t, r.host_issued, r.size);
            self.host_pump(h);
        }
        let ts = &mut self.tenants[t];
        self.links[ts.first_link as usize + r.k as usize].in_flight -= 1;
        if let Some(tr) = &mut ts.tracker {
            tr.complete(r.k as usize, r.phase, r.cost).expect("k < servers");
        }
        let reissue = ts.gen.completed(self.now, r.k as usize);
        self.rec.completion(t, r.issued, self.now, r.size, r.phase);
        match reissue {
            Reissue::No => {}
            Reissue::Now(k) => self.issue(t, k),
            Reissue::At(at, k) => self.schedule(at, Kind::Think, t as u32, k.map_or(u32::MAX, |k| k as u32)),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_request_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<super::Req>(), 64);
        assert_eq!(std::mem::align_of::<super::Req>(), 64);
    }

    #[test]
    fn a_tenants_hot_lines_share_a_128_byte_block() {
        use std::mem::{align_of, offset_of};
        assert_eq!(align_of::<super::TenantState>(), 128);
        assert!(offset_of!(super::TenantState, tracker) + 8 <= 64, "the gateway fits line 0");
        assert_eq!(offset_of!(super::TenantState, gen), 64, "the generator's hot line is line 1");
    }

    /// A scenario whose timeseries the recorder refuses: validation refuses such a file
    /// (`model::check_timeseries`), so here one changed after it (its fields are public). The error is
    /// typed, and names the scenario once.
    #[test]
    fn a_setup_error_is_typed() {
        use super::{SetupError, SimError};
        let mut text = String::from(
            "name = \"big\"\nduration_s = 1000\ninterval_s = 0.01\n[[servers]]\nname = \"s\"\ncapacity_iops = 100\n",
        );
        for i in 0..100 {
            text.push_str(&format!("[[tenants]]\nname = \"t{i}\"\n[tenants.workload]\nkind = \"closed\"\n"));
        }
        let mut sc = crate::Scenario::from_toml(&text, None).unwrap();
        sc.interval = rein_core::Nanos::from_millis(1);
        let e = super::run(&sc, &mut |_| {}).err().expect("refused");
        let SimError::Setup(scenario, setup) = &e else { panic!("not a setup error: {e}") };
        assert_eq!(scenario, "\"big\"");
        let SetupError::Recorder(cells) = &**setup else { panic!("not the recorder's bound: {e}") };
        assert_eq!((cells.tenants, cells.servers, cells.intervals), (100, 1, 1_000_000));
        assert!(e.to_string().starts_with("scenario \"big\": "), "{e}");
    }
}
