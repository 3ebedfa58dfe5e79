//! The discrete-event engine.
//!
//! # Model
//! - **Servers**: a scheduler (from `rein-core`, unchanged) in front of a device. The scheduler releases a
//!   request whenever fewer than `queue_depth` (D) are outstanding at the device; the device serves its
//!   queue one request at a time (FIFO), so its latency grows with its queue. Service times come from the
//!   server's [`ServiceModel`] with mean `1/capacity`, scaled when the capacity schedule changes it.
//! - **Tenants**: each has a workload generator and, in front of the servers, a gateway: it routes each
//!   request (by offset striping or by shares, or keeps a window per server), and for distributed schedulers (dmclock, rbfq, dtfq) keeps a
//!   [`ServiceTracker`] whose delta/rho ride on every request. Gateway and server are `net_delay` apart
//!   each way.
//! - **Time** is integer nanoseconds. Events are ordered by (time, sequence number), so equal times run in
//!   the order they were scheduled: the run is a pure function of the scenario and its seed.
//! - **Randomness**: one PCG stream per server and per tenant, seeded from the scenario seed and the
//!   entity's index, so adding a tenant does not change the others' streams.
//!
//! - **PARDA hosts** (`hosts.rs`): a tenant that is a VM on a host sends its requests to the host's local
//!   scheduler; the host releases them to its array within its window and sees their completions. Host
//!   periods are events; a processor-sharing array (`array.rs`) completes requests by a rescheduled
//!   next-completion event.
//!
//! # Invariants
//! 1. A server's `outstanding` (dispatched, not completed) never exceeds its queue depth.
//! 2. Every request issued completes exactly once, or is rejected at a full scheduler queue (counted).
//! 3. Event times never decrease.

use crate::array::Ps;
use crate::events::Events;
use crate::hosts::HostLayer;
use crate::metrics::{Metrics, RunTotals};
use crate::scenario::{Discipline, Routing, Scenario, ServiceModel, WorkloadKind};
use rand::Rng;
use rand_pcg::Pcg64Mcg;
use rein_core::{
    Cost, Limits, Nanos, Phase, Poll, Request, SchedConfig, Scheduler, SchedulerKind, ServiceTracker, TenantId,
};
use std::collections::VecDeque;

#[derive(Copy, Clone, Debug)]
enum Kind {
    Complete,
    Wake,
    Deliver,
    Notify,
    Arrive,
    Toggle,
    Think,
    Capacity,
    Start,
    Stop,
    HostPeriod,
    HostWake,
    PsDone,
}

#[derive(Clone, Debug)]
struct Req {
    tenant: u32,
    server: u32,
    /// Index of `server` in the tenant's server list.
    k: u32,
    size: u64,
    offset: u64,
    issued: Nanos,
    phase: Phase,
    cost: Cost,
    /// When the tenant's host released it to the array (VMs on PARDA hosts).
    host_issued: Nanos,
}

struct ServerState {
    sched: Box<dyn Scheduler>,
    /// Scheduler slot -> tenant index.
    tenant_of_slot: Vec<u32>,
    outstanding: u32,
    device_q: VecDeque<u32>,
    in_service: Option<u32>,
    capacity: f64,
    /// Service-time multiplier: initial capacity / current capacity (1 unless the schedule changed it).
    slow: f64,
    rng: Pcg64Mcg,
    last_offset: u64,
    wake_at: Option<u64>,
    busy_since: Option<Nanos>,
    /// Processor-sharing device (`discipline = "ps"`) instead of the FIFO one.
    ps: Option<Ps>,
}

/// A tenant's simulator state. With thousands of tenants every completion lands on a cold tenant, so what
/// a closed-loop completion and its reissue need is on the first cache line (plus one [`Link`]), copied
/// out of the scenario; the rest is touched by other workloads and distributed runs.
#[repr(C, align(64))]
struct TenantState {
    // Line 0.
    rng: Pcg64Mcg,
    next_seq_offset: u64,
    /// The workload's request size, span and random fraction (as in `Workload`).
    size_bytes: u64,
    span_bytes: u64,
    random_frac: f64,
    /// The stripe for `Routing::Stripe`; 0 for `Routing::Shares`.
    stripe_bytes: u64,
    in_flight: u32,
    /// The tenant's links: `links[first_link..first_link + n_links]`, in the order of `Tenant::servers`.
    first_link: u32,
    // Line 1 and on.
    n_links: u32,
    active: bool,
    on: bool,
    /// The workload (the inner one of on_off) is closed-loop: its think time and per-server window flag.
    closed: Option<(Nanos, bool)>,
    tracker: Option<ServiceTracker>,
    trace_pos: usize,
    trace_base: Nanos,
    /// Cumulative routing shares (for `Routing::Shares`).
    cumulative: Vec<f64>,
}

/// A tenant at one of its servers.
#[derive(Copy, Clone, Debug)]
struct Link {
    /// The tenant's id at the server's scheduler.
    id: TenantId,
    server: u32,
    /// Requests in flight there.
    in_flight: u32,
}

/// A simulation in progress. Build with [`Sim::new`], run with [`Sim::run`].
pub struct Sim<'a> {
    sc: &'a Scenario,
    now: Nanos,
    events: Events<Kind>,
    servers: Vec<ServerState>,
    tenants: Vec<TenantState>,
    links: Vec<Link>,
    reqs: Vec<Req>,
    free: Vec<u32>,
    metrics: Metrics,
    events_run: u64,
    hosts: Option<HostLayer>,
    done: Vec<u32>,
}

/// `x.round() as u64` for a service time `x >= 1` ns, without the libm call `round` is on baseline x86-64:
/// below 2^52, `x + 0.5` is exact or lands on the next power of two, so truncating it rounds half away
/// from zero exactly as `round` does. (Larger values are integers already.)
#[inline]
fn round_ns(x: f64) -> u64 {
    if (1.0..4_503_599_627_370_496.0).contains(&x) {
        (x + 0.5) as u64
    } else {
        x.round() as u64
    }
}

pub(crate) fn seed_for(seed: u64, stream: u64) -> u128 {
    // splitmix64 of (seed, stream): independent, reproducible streams per entity.
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(0xD1B5_4A32_D192_ED03);
    let mut next = || {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    };
    ((next() as u128) << 64) | next() as u128
}

/// Error building a simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("scenario {0}: {1}")]
    Setup(String, String),
}

impl<'a> Sim<'a> {
    pub fn new(sc: &'a Scenario) -> Result<Sim<'a>, SimError> {
        let err = |m: String| SimError::Setup(sc.name.clone(), m);
        let mut servers = Vec::with_capacity(sc.servers.len());
        for (i, s) in sc.servers.iter().enumerate() {
            let config = SchedConfig {
                cost_model: sc.cost_model,
                limit_mode: s.limit_mode,
                batch: s.batch,
                batch_distance: s.batch_distance,
                limits: Limits { max_tenants: sc.tenants.len().max(1), ..Limits::default() },
                ..SchedConfig::default()
            };
            let sched: Box<dyn Scheduler> = match s.scheduler {
                // In the simulator a spec's limit is in the scenario's cost units for every scheduler.
                SchedulerKind::Rbfq => Box::new(rein_core::Rbfq::with_limit_in_cost_units(config)),
                k => k.build(config),
            };
            servers.push(ServerState {
                sched,
                tenant_of_slot: Vec::new(),
                outstanding: 0,
                device_q: VecDeque::new(),
                in_service: None,
                capacity: s.capacity_schedule[0].1,
                slow: s.capacity_iops / s.capacity_schedule[0].1,
                rng: Pcg64Mcg::new(seed_for(sc.seed, 1 << 32 | i as u64)),
                last_offset: 0,
                wake_at: None,
                busy_since: None,
                ps: (s.discipline == Discipline::Ps).then(Ps::default),
            });
        }
        let mut tenants = Vec::with_capacity(sc.tenants.len());
        let mut links = Vec::new();
        for (ti, t) in sc.tenants.iter().enumerate() {
            let first_link =
                u32::try_from(links.len()).map_err(|_| err("more than 2^32 tenant-server pairs".into()))?;
            for (k, &si) in t.servers.iter().enumerate() {
                let srv = &mut servers[si];
                let id = srv.sched.add_tenant(t.server_specs[k]).map_err(|e| err(format!("tenant {}: {e}", t.name)))?;
                if srv.tenant_of_slot.len() <= id.index() {
                    srv.tenant_of_slot.resize(id.index() + 1, u32::MAX);
                }
                srv.tenant_of_slot[id.index()] = ti as u32;
                links.push(Link { id, server: si as u32, in_flight: 0 });
            }
            let distributed = t.servers.iter().any(|&s| sc.servers[s].distributed) && t.servers.len() > 1;
            let cumulative = match &t.routing {
                Routing::Shares(v) => {
                    let total: f64 = v.iter().sum();
                    let mut acc = 0.0;
                    v.iter()
                        .map(|x| {
                            acc += x / total;
                            acc
                        })
                        .collect()
                }
                Routing::Stripe { .. } => Vec::new(),
            };
            let w = &t.workload;
            let closed = match &w.kind {
                WorkloadKind::OnOff { inner, .. } => inner.as_ref(),
                k => k,
            };
            tenants.push(TenantState {
                rng: Pcg64Mcg::new(seed_for(sc.seed, ti as u64)),
                next_seq_offset: 0,
                size_bytes: w.size_bytes,
                span_bytes: w.span_bytes,
                random_frac: w.random_frac,
                stripe_bytes: match t.routing {
                    Routing::Stripe { stripe_bytes } => stripe_bytes,
                    Routing::Shares(_) => 0,
                },
                in_flight: 0,
                first_link,
                n_links: t.servers.len() as u32,
                active: false,
                on: false,
                closed: match closed {
                    WorkloadKind::Closed { think, per_server, .. } => Some((*think, *per_server)),
                    _ => None,
                },
                tracker: distributed.then(|| ServiceTracker::new(t.servers.len())),
                trace_pos: 0,
                trace_base: Nanos::ZERO,
                cumulative,
            });
        }
        let metrics = Metrics::new(sc).map_err(err)?;
        let hosts = HostLayer::new(sc).map_err(err)?;
        let mut sim = Sim {
            sc,
            now: Nanos::ZERO,
            events: Events::new(),
            servers,
            tenants,
            links,
            reqs: Vec::new(),
            free: Vec::new(),
            metrics,
            events_run: 0,
            hosts,
            done: Vec::new(),
        };
        for h in 0..sim.hosts.as_ref().map_or(0, |l| l.len()) {
            let at = sim.hosts.as_ref().expect("hosts").first_period(h);
            sim.schedule(at, Kind::HostPeriod, h as u32, 0);
        }
        for (ti, t) in sc.tenants.iter().enumerate() {
            sim.schedule(t.workload.start, Kind::Start, ti as u32, 0);
            if t.workload.stop < sc.duration {
                sim.schedule(t.workload.stop, Kind::Stop, ti as u32, 0);
            }
        }
        for (si, s) in sc.servers.iter().enumerate() {
            for (k, &(at, _)) in s.capacity_schedule.iter().enumerate().skip(1) {
                sim.schedule(at, Kind::Capacity, si as u32, k as u32);
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
    pub fn run(mut self, progress: &mut dyn FnMut(Nanos)) -> RunTotals {
        let end = self.sc.duration;
        while let Some(ev) = self.events.pop_before(end) {
            let t = ev.t.0;
            self.now = ev.t;
            self.events_run += 1;
            if self.events_run & 0xFFFF == 0 {
                progress(self.now);
            }
            match ev.kind {
                Kind::Complete => self.complete(ev.a as usize, ev.b),
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
                    if self.tenants[t].active && self.tenants[t].on {
                        self.issue_to(t, (ev.b != u32::MAX).then_some(ev.b as usize));
                    }
                }
                Kind::Capacity => {
                    let s = ev.a as usize;
                    let iops = self.sc.servers[s].capacity_schedule[ev.b as usize].1;
                    self.servers[s].capacity = iops;
                    self.servers[s].slow = self.sc.servers[s].capacity_iops / iops;
                }
                Kind::Start => self.start(ev.a as usize),
                Kind::Stop => {
                    let t = ev.a as usize;
                    self.tenants[t].active = false;
                }
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
                Kind::PsDone => self.ps_done(ev.a as usize, ev.b),
            }
        }
        self.now = end;
        progress(end);
        // Close busy periods at the end for utilisation.
        for (i, s) in self.servers.iter_mut().enumerate() {
            if let Some(since) = s.busy_since.take() {
                self.metrics.server_busy(i, since, end);
            }
        }
        let mut totals = self.metrics.finish(self.sc);
        if let Some(layer) = self.hosts.take() {
            let h = layer.finish(self.sc);
            totals.summary.hosts = Some(h.summary.clone());
            totals.hosts = Some(h);
        }
        totals.events = self.events_run;
        totals.time_regressions = self.servers.iter().map(|s| s.sched.time_regressions()).sum();
        totals
    }

    fn start(&mut self, t: usize) {
        let ts = &mut self.tenants[t];
        ts.active = true;
        ts.on = true;
        ts.trace_base = self.now;
        let w = &self.sc.tenants[t].workload;
        match &w.kind {
            WorkloadKind::OnOff { on, .. } => {
                let at = self.now.saturating_add(*on);
                self.schedule(at, Kind::Toggle, t as u32, 0);
                self.begin_inner(t);
            }
            _ => self.begin_inner(t),
        }
    }

    /// Starts (or resumes, after an off period) the tenant's request generation.
    fn begin_inner(&mut self, t: usize) {
        let w = &self.sc.tenants[t].workload;
        let kind = match &w.kind {
            WorkloadKind::OnOff { inner, .. } => inner.as_ref(),
            k => k,
        };
        match kind {
            WorkloadKind::Closed { outstanding, per_server: false, .. } => {
                let n = outstanding.saturating_sub(self.tenants[t].in_flight);
                for _ in 0..n {
                    self.issue(t);
                }
            }
            WorkloadKind::Closed { outstanding, per_server: true, .. } => {
                let servers = self.sc.tenants[t].servers.len();
                for k in 0..servers {
                    let n = outstanding.saturating_sub(self.link(t, k).in_flight);
                    for _ in 0..n {
                        self.issue_to(t, Some(k));
                    }
                }
            }
            WorkloadKind::Open { .. } | WorkloadKind::Burst { .. } => {
                self.schedule(self.now, Kind::Arrive, t as u32, 0)
            }
            WorkloadKind::Trace { records, .. } => {
                let first = records[0].t_ns;
                let at = self.now.saturating_add(Nanos(first));
                self.schedule(at, Kind::Arrive, t as u32, 0);
            }
            WorkloadKind::OnOff { .. } => unreachable!("nested on_off is rejected by validation"),
        }
    }

    fn toggle(&mut self, t: usize) {
        if !self.tenants[t].active {
            return;
        }
        let WorkloadKind::OnOff { on, off, .. } = &self.sc.tenants[t].workload.kind else { return };
        let (on, off) = (*on, *off);
        let now_on = !self.tenants[t].on;
        self.tenants[t].on = now_on;
        let next = self.now.saturating_add(if now_on { on } else { off });
        self.schedule(next, Kind::Toggle, t as u32, 0);
        if now_on {
            self.begin_inner(t);
        }
    }

    fn arrive(&mut self, t: usize) {
        let ts = &self.tenants[t];
        if !ts.active || !ts.on {
            return;
        }
        let w = &self.sc.tenants[t].workload;
        let kind = match &w.kind {
            WorkloadKind::OnOff { inner, .. } => inner.as_ref(),
            k => k,
        };
        match kind {
            WorkloadKind::Open { iops } => {
                let iops = *iops;
                self.issue(t);
                let u: f64 = self.tenants[t].rng.gen();
                let gap = Nanos::from_secs_f64(-(1.0 - u).ln() / iops).max(Nanos(1));
                self.schedule(self.now.saturating_add(gap), Kind::Arrive, t as u32, 0);
            }
            WorkloadKind::Burst { count, period } => {
                let (count, period) = (*count, *period);
                for _ in 0..count {
                    self.issue(t);
                }
                self.schedule(self.now.saturating_add(period), Kind::Arrive, t as u32, 0);
            }
            WorkloadKind::Trace { records, time_scale, repeat } => {
                let (records, scale, repeat) = (records.clone(), *time_scale, *repeat);
                let pos = self.tenants[t].trace_pos;
                let r = records[pos];
                self.issue_sized(t, r.size, Some(r.offset));
                let mut next = pos + 1;
                if next == records.len() {
                    if !repeat {
                        self.tenants[t].trace_pos = next;
                        return;
                    }
                    next = 0;
                    // The replay restarts one mean gap after the last record.
                    let span = Nanos::from_secs_f64(records[records.len() - 1].t_ns as f64 * scale / 1e9);
                    let gap = Nanos(span.0 / records.len().max(1) as u64);
                    self.tenants[t].trace_base = self.tenants[t].trace_base.saturating_add(span).saturating_add(gap);
                }
                self.tenants[t].trace_pos = next;
                let at = self.tenants[t]
                    .trace_base
                    .saturating_add(Nanos::from_secs_f64(records[next].t_ns as f64 * scale / 1e9));
                self.schedule(at.max(self.now), Kind::Arrive, t as u32, 0);
            }
            WorkloadKind::Closed { .. } | WorkloadKind::OnOff { .. } => {}
        }
    }

    fn issue(&mut self, t: usize) {
        self.issue_to(t, None);
    }

    /// Issues a request of the workload's size, to server `k` of the tenant's list if given.
    fn issue_to(&mut self, t: usize, k: Option<usize>) {
        let size = self.tenants[t].size_bytes;
        self.issue_sized_to(t, size, None, k);
    }

    fn issue_sized(&mut self, t: usize, size: u64, offset: Option<u64>) {
        self.issue_sized_to(t, size, offset, None);
    }

    /// Generates one request of tenant `t` and sends it to its server (chosen by routing unless `force_k`).
    fn issue_sized_to(&mut self, t: usize, size: u64, offset: Option<u64>, force_k: Option<usize>) {
        let ts = &mut self.tenants[t];
        let offset = offset.unwrap_or_else(|| {
            let random = ts.random_frac >= 1.0 || (ts.random_frac > 0.0 && ts.rng.gen::<f64>() < ts.random_frac);
            let slots = (ts.span_bytes / size.max(1)).max(1);
            let off = if random { ts.rng.gen_range(0..slots) * size } else { ts.next_seq_offset % (slots * size) };
            ts.next_seq_offset = off + size;
            off
        });
        let n = ts.n_links as usize;
        let stripe_bytes = ts.stripe_bytes;
        let k = match force_k {
            Some(k) => k,
            None if n == 1 => 0,
            None if stripe_bytes != 0 => {
                // Divisions are slow; stripes and server counts are usually powers of two.
                let stripe = if stripe_bytes.is_power_of_two() {
                    offset >> stripe_bytes.trailing_zeros()
                } else {
                    offset / stripe_bytes
                };
                let n = n as u64;
                (if n.is_power_of_two() { stripe & (n - 1) } else { stripe % n }) as usize
            }
            None => {
                let u: f64 = ts.rng.gen();
                ts.cumulative.iter().position(|&c| u < c).unwrap_or(n - 1)
            }
        };
        ts.in_flight += 1;
        let link = &mut self.links[ts.first_link as usize + k];
        link.in_flight += 1;
        let server = link.server as usize;
        let req = Req {
            tenant: t as u32,
            server: server as u32,
            k: k as u32,
            size,
            offset,
            issued: self.now,
            phase: Phase::Weight,
            cost: Cost(0),
            host_issued: self.now,
        };
        let id = match self.free.pop() {
            Some(i) => {
                self.reqs[i as usize] = req;
                i
            }
            None => {
                self.reqs.push(req);
                (self.reqs.len() - 1) as u32
            }
        };
        if let Some(h) = self.hosts.as_ref().and_then(|l| l.host_of(t)) {
            // A VM: the request waits at its host for room in the window.
            if !self.hosts.as_mut().expect("hosts").enqueue(self.now, t, id as u64, size, offset) {
                self.reject(t, k, id);
                return;
            }
            self.host_pump(h);
            return;
        }
        if self.sc.net_delay > Nanos::ZERO {
            let at = self.now.saturating_add(self.sc.net_delay);
            self.schedule(at, Kind::Deliver, id, 0);
        } else {
            self.deliver(id);
        }
    }

    /// Releases what host `h`'s window allows to its array.
    fn host_pump(&mut self, h: usize) {
        loop {
            let layer = self.hosts.as_mut().expect("host_pump needs hosts");
            match layer.poll(h, self.now) {
                Poll::Dispatch(d) => {
                    let id = d.handle as u32;
                    self.reqs[id as usize].host_issued = self.now;
                    if self.sc.net_delay > Nanos::ZERO {
                        let at = self.now.saturating_add(self.sc.net_delay);
                        self.schedule(at, Kind::Deliver, id, 0);
                    } else {
                        self.deliver(id);
                    }
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

    /// A processor-sharing device: requests admitted at `s` since the last event, next completion event.
    fn ps_reschedule(&mut self, s: usize) {
        let now = self.now;
        let ps = self.servers[s].ps.as_mut().expect("ps server");
        ps.gen = ps.gen.wrapping_add(1);
        let gen = ps.gen;
        if let Some(t) = ps.next_completion() {
            self.schedule(t.max(now), Kind::PsDone, s as u32, gen);
        }
    }

    fn ps_done(&mut self, s: usize, gen: u32) {
        let now = self.now;
        let mut done = std::mem::take(&mut self.done);
        {
            let ps = self.servers[s].ps.as_mut().expect("ps server");
            if ps.gen != gen {
                self.done = done;
                return;
            }
            done.clear();
            ps.pop_done(now, &mut done);
        }
        for &id in &done {
            self.complete(s, id);
        }
        self.done = done;
        self.ps_reschedule(s);
    }

    fn deliver(&mut self, id: u32) {
        let r = &self.reqs[id as usize];
        let (t, s, k) = (r.tenant as usize, r.server as usize, r.k as usize);
        let ts = &mut self.tenants[t];
        // The gateway's tracker fills delta/rho as the request leaves it; with a network delay, completions
        // that reach the gateway meanwhile are counted in the next request (the paper's bounded staleness).
        let (delta, rho) = match &mut ts.tracker {
            Some(tr) if self.sc.servers[s].distributed => tr.prepare(k).expect("k < servers"),
            _ => (Cost(0), Cost(0)),
        };
        let req = Request { tenant: self.link(t, k).id, handle: id as u64, size: r.size, offset: r.offset, delta, rho };
        if self.servers[s].sched.enqueue(self.now, req).is_err() {
            // A full scheduler queue rejects the request (counted); the client sees it fail at once.
            if let Some(h) = self.hosts.as_ref().and_then(|l| l.host_of(t)) {
                self.hosts.as_mut().expect("hosts").failed(self.now, t);
                self.host_pump(h);
            }
            self.reject(t, k, id);
            return;
        }
        self.try_dispatch(s);
    }

    /// Tenant `t`'s link to server `k` of its list.
    #[inline]
    fn link(&self, t: usize, k: usize) -> &Link {
        &self.links[self.tenants[t].first_link as usize + k]
    }

    #[inline]
    fn link_mut(&mut self, t: usize, k: usize) -> &mut Link {
        let i = self.tenants[t].first_link as usize + k;
        &mut self.links[i]
    }

    /// A request of tenant `t` to server `k` of its list that never reached a device: counted as
    /// rejected, its in-flight counts and its slot released.
    fn reject(&mut self, t: usize, k: usize, id: u32) {
        self.metrics.rejected(t);
        self.tenants[t].in_flight -= 1;
        self.link_mut(t, k).in_flight -= 1;
        self.free.push(id);
    }

    fn try_dispatch(&mut self, s: usize) {
        let depth = self.sc.servers[s].queue_depth;
        loop {
            let srv = &mut self.servers[s];
            if srv.outstanding >= depth {
                return;
            }
            match srv.sched.poll(self.now, srv.outstanding == 0) {
                Poll::Dispatch(d) => {
                    let id = d.handle as u32;
                    let r = &mut self.reqs[id as usize];
                    r.phase = d.phase;
                    r.cost = d.cost;
                    srv.outstanding += 1;
                    if srv.ps.is_some() {
                        let ns = self.service_ns(s, id);
                        let srv = &mut self.servers[s];
                        if srv.busy_since.is_none() {
                            srv.busy_since = Some(self.now);
                        }
                        srv.ps.as_mut().expect("ps").admit(self.now, id, ns);
                        self.ps_reschedule(s);
                        continue;
                    }
                    srv.device_q.push_back(id);
                    if srv.in_service.is_none() {
                        self.start_service(s);
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

    fn start_service(&mut self, s: usize) {
        let Some(id) = self.servers[s].device_q.pop_front() else { return };
        let ns = self.service_ns(s, id);
        let srv = &mut self.servers[s];
        srv.in_service = Some(id);
        if srv.busy_since.is_none() {
            srv.busy_since = Some(self.now);
        }
        let at = self.now.saturating_add(Nanos(round_ns(ns)));
        self.schedule(at, Kind::Complete, s as u32, id);
    }

    /// Draws request `id`'s service time at server `s` (ns).
    fn service_ns(&mut self, s: usize, id: u32) -> f64 {
        let spec = &self.sc.servers[s];
        let srv = &mut self.servers[s];
        let r = &self.reqs[id as usize];
        let mean_ns = 1e9 / spec.capacity_iops;
        let base = match spec.service {
            ServiceModel::Disk { seek_ns, rotation_ns, transfer_bytes_per_ns, sequential_bytes } => {
                let dist = r.offset.abs_diff(srv.last_offset);
                let position = if dist <= sequential_bytes {
                    0.0
                } else {
                    // Seek time grows with the square root of the distance (normalised to 100 GiB), plus a
                    // uniform rotational delay.
                    let frac = (dist as f64 / (100u64 << 30) as f64).min(1.0);
                    seek_ns * (0.3 + 0.7 * frac.sqrt()) * 1.5 + rotation_ns * srv.rng.gen::<f64>()
                };
                position + r.size as f64 / transfer_bytes_per_ns
            }
            _ => spec.service.positionless_ns(mean_ns, &mut srv.rng),
        };
        srv.last_offset = r.offset + r.size;
        // A VM's host may sit worse or better on the array (placement skew).
        let scale = self.hosts.as_ref().map_or(1.0, |l| l.scale(r.tenant as usize));
        ((base + r.size as f64 * spec.ns_per_byte) * srv.slow * scale).max(1.0)
    }

    fn complete(&mut self, s: usize, id: u32) {
        let srv = &mut self.servers[s];
        srv.outstanding -= 1;
        self.metrics.server_completion(s, self.now);
        if let Some(ps) = &srv.ps {
            // Processor sharing: the request already left the device (`ps_done`).
            if ps.len() == 0 {
                if let Some(since) = srv.busy_since.take() {
                    self.metrics.server_busy(s, since, self.now);
                }
            }
        } else {
            debug_assert_eq!(srv.in_service, Some(id));
            srv.in_service = None;
            if srv.device_q.is_empty() {
                if let Some(since) = srv.busy_since.take() {
                    self.metrics.server_busy(s, since, self.now);
                }
            } else {
                self.start_service(s);
            }
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
        if let Some(h) = self.hosts.as_ref().and_then(|l| l.host_of(t)) {
            // The host sees the completion first: a slot frees in its window.
            self.hosts.as_mut().expect("hosts").complete(self.now, t, r.host_issued, r.size);
            self.host_pump(h);
        }
        self.link_mut(t, r.k as usize).in_flight -= 1;
        let ts = &mut self.tenants[t];
        ts.in_flight -= 1;
        if let Some(tr) = &mut ts.tracker {
            tr.complete(r.k as usize, r.phase, r.cost).expect("k < servers");
        }
        self.metrics.completion(t, r.server as usize, r.issued, self.now, r.size, r.phase);
        if !(ts.active && ts.on) {
            return;
        }
        if let Some((think, per_server)) = ts.closed {
            // A per-server window replaces the request at the same server.
            let k = if per_server { r.k } else { u32::MAX };
            if think > Nanos::ZERO {
                let at = self.now.saturating_add(think);
                self.schedule(at, Kind::Think, t as u32, k);
            } else {
                self.issue_to(t, (k != u32::MAX).then_some(k as usize));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::round_ns;
    use rand::{Rng, SeedableRng};

    #[test]
    fn round_ns_is_round() {
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(1);
        let edges = [
            1.0,
            1.5,
            2.5,
            2.4999999999999996,
            3.9999999999999996,
            4.5,
            1e15 + 0.5,
            4503599627370495.5,
            4503599627370497.0,
            1e300,
        ];
        for &x in &edges {
            assert_eq!(round_ns(x), x.round() as u64, "{x}");
        }
        for _ in 0..1_000_000 {
            let x = 1.0 + rng.gen::<f64>() * 10f64.powi(rng.gen_range(0..16));
            assert_eq!(round_ns(x), x.round() as u64, "{x}");
            let y = x.floor() + 0.5;
            assert_eq!(round_ns(y), y.round() as u64, "{y}");
            let z = f64::from_bits(y.to_bits() - 1);
            assert_eq!(round_ns(z), z.round() as u64, "{z}");
        }
    }
}
