//! The pShift cluster engine: servers with per-bucket queues under the Token Scheduler, a controller
//! reached over a network delay, buckets whose demand moves between servers.
//!
//! # Model
//! - **Servers**: `rein_core::pshift::TokenScheduler` (Algorithm 1, unchanged) in front of a FIFO device
//!   that keeps at most `queue_depth` requests (use 1: the scheduler then picks every request, as the
//!   paper's servers do) and serves one at a time with the server's service-time model, mean 1/capacity.
//! - **Buckets** (the scenario's tenants) follow a [`BucketPlan`]: a list of demand phases, each a set
//!   of active servers with shares. Open buckets send requests to each active server at `iops x share`
//!   per second (uniform spacing with a random phase, or Poisson); closed buckets keep a window of
//!   `per_server` requests at each active server. At a demand change the new phase starts; requests
//!   already at old servers complete, and old servers get no new ones.
//! - **Controller**: `rein_core::pshift::Controller`, unchanged. At every redistribution boundary each
//!   server snapshots its report (per-bucket arrivals, dispatches, queue, idle time; device completions
//!   and busy time); the reports reach the controller `delay` later, the controller answers at once, and
//!   the tokens reach the servers another `delay` later, where `TokenScheduler::grant` deducts what was
//!   served meanwhile. A bucket the message does not list gets no R-tokens and, if limited, no L-tokens.
//!   Before the first message (the warm-up interval before `start`) servers are plain round robin.
//!   Without a controller (`controller = false`) they stay so: the paper's baseline.
//! - Requests and completions cross the scenario's `network.delay_ms` between client and server.
//!
//! Determinism: events are ordered by (time, sequence); one PCG stream per server and per bucket (seeded
//! from the scenario seed and the index); no hash maps. Invariants: a server's `outstanding` never
//! exceeds its queue depth; every request is completed once or rejected (counted).

use super::section::{Arrivals, BucketLoad, BucketPlan, PshiftSection};
use crate::engine::{seed_for, SimError};
use crate::events::Events;
use crate::metrics::{Metrics, RunTotals};
use crate::scenario::Scenario;
use rand::Rng;
use rand_pcg::Pcg64Mcg;
use rein_core::pshift::{
    BucketQos, BucketReport, Controller, ControllerConfig, RoundSummary, ServerReport, SolveOptions, TokenMessage,
    TokenScheduler, Tokens,
};
use rein_core::{Limits, Nanos, Phase, Poll, Request, SchedConfig, Scheduler, TenantId};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

#[derive(Copy, Clone, Debug)]
enum Kind {
    Complete,
    Deliver,
    Notify,
    Tokens,
    Reports,
    Boundary,
    Change,
    /// Open arrivals due at server `a` (its own heap of streams holds the details).
    Arrive,
}

#[derive(Clone, Debug)]
struct Req {
    bucket: u32,
    server: u32,
    /// The bucket's id in the server's scheduler.
    tid: TenantId,
    size: u64,
    issued: Nanos,
    phase: Phase,
}

/// An open stream's next arrival at a server: (due, bucket, generation << 16 | stream index, mean gap in
/// ns, the bucket's id at the server). Everything an arrival needs rides in the entry, so it touches no
/// per-bucket state but the generation.
type Arrival = (u64, u32, u32, u64, TenantId);

struct Srv {
    sched: TokenScheduler,
    /// Open arrival streams to this server: (due time, bucket, generation << 16 | stream). One heap per
    /// server keeps the global event heap small (a few events per server instead of one per stream: at
    /// 80,000 streams the global heap's cache misses dominated).
    arrivals: BinaryHeap<Reverse<Arrival>>,
    /// The time of the `Arrive` event pending for this server, if any.
    arrive_at: Option<u64>,
    /// Scheduler slot -> bucket.
    bucket_of: Vec<u32>,
    device: VecDeque<u32>,
    in_service: Option<u32>,
    outstanding: u32,
    rng: Pcg64Mcg,
    busy_since: Option<Nanos>,
    busy_ns: u64,
    completed: u64,
    last_report: Nanos,
    heard: bool,
}

struct Bkt {
    rng: Pcg64Mcg,
    phase: usize,
    gen: u32,
    /// (server, id in its scheduler) for every server the bucket has sent to (a few dozen at most).
    ids: Vec<(u32, TenantId)>,
    /// Closed loops: requests in flight per server.
    in_flight: Vec<u32>,
}

/// A cluster run: the usual totals and what the controller computed each round.
pub struct ClusterRun {
    pub totals: RunTotals,
    pub rounds: Vec<RoundSummary>,
}

struct Cluster<'a> {
    sc: &'a Scenario,
    ps: &'a PshiftSection,
    now: Nanos,
    events: Events<Kind>,
    srv: Vec<Srv>,
    bkt: Vec<Bkt>,
    /// Per bucket, the generation of its demand phase (compact: read on every arrival).
    gen: Vec<u32>,
    /// Per bucket, its request size.
    size: Vec<u64>,
    reqs: Vec<Req>,
    free: Vec<u32>,
    metrics: Metrics,
    controller: Option<Controller>,
    pending_reports: Vec<ServerReport>,
    pending_tokens: Vec<TokenMessage>,
    rounds: Vec<RoundSummary>,
    events_run: u64,
}

/// Runs a scenario with a `[pshift]` section.
pub fn run(sc: &Scenario, progress: &mut dyn FnMut(Nanos)) -> Result<ClusterRun, SimError> {
    let ps = sc.pshift.as_deref().ok_or_else(|| SimError::Setup(sc.name.clone(), "no [pshift] section".into()))?;
    let err = |m: String| SimError::Setup(sc.name.clone(), m);
    let nb = sc.tenants.len();
    let config =
        SchedConfig { limits: Limits { max_tenants: nb.max(1), ..Limits::default() }, ..SchedConfig::default() };
    let srv = sc
        .servers
        .iter()
        .enumerate()
        .map(|(j, _)| Srv {
            sched: if ps.weighted { TokenScheduler::weighted(config) } else { TokenScheduler::new(config) },
            arrivals: BinaryHeap::new(),
            arrive_at: None,
            bucket_of: Vec::new(),
            device: VecDeque::new(),
            in_service: None,
            outstanding: 0,
            rng: Pcg64Mcg::new(seed_for(sc.seed, 1 << 32 | j as u64)),
            busy_since: None,
            busy_ns: 0,
            completed: 0,
            last_report: Nanos::ZERO,
            heard: false,
        })
        .collect();
    let bkt = ps
        .buckets
        .iter()
        .enumerate()
        .map(|(i, p)| Bkt {
            rng: Pcg64Mcg::new(seed_for(sc.seed, i as u64)),
            phase: 0,
            gen: 0,
            ids: Vec::new(),
            in_flight: if matches!(p.load, BucketLoad::Closed { .. }) { vec![0; sc.servers.len()] } else { Vec::new() },
        })
        .collect();
    let controller = if ps.controller {
        let period_s = ps.period.as_secs_f64();
        let qos = sc
            .tenants
            .iter()
            .map(|t| BucketQos {
                reservation: (t.spec.reservation() * period_s).round() as u64,
                limit: t.spec.limit().map(|l| (l * period_s).round() as u64),
            })
            .collect();
        let caps: Vec<f64> = sc.servers.iter().map(|s| s.capacity_iops).collect();
        let cfg = ControllerConfig {
            period: ps.period,
            intervals: ps.intervals,
            start: ps.start,
            estimator: ps.estimator,
            solve: SolveOptions { approx_top: ps.approx_top, ..SolveOptions::default() },
            report_timeout: Nanos(ps.period.0 / ps.intervals as u64 / 2),
        };
        Some(Controller::new(cfg, &caps, qos).map_err(|e| err(e.to_string()))?)
    } else {
        None
    };
    let mut c = Cluster {
        sc,
        ps,
        now: Nanos::ZERO,
        events: Events::new(),
        srv,
        bkt,
        gen: vec![0; nb],
        size: sc.tenants.iter().map(|t| t.workload.size_bytes).collect(),
        reqs: Vec::new(),
        free: Vec::new(),
        metrics: Metrics::new(sc).map_err(err)?,
        controller,
        pending_reports: Vec::new(),
        pending_tokens: Vec::new(),
        rounds: Vec::new(),
        events_run: 0,
    };
    for (i, p) in ps.buckets.iter().enumerate() {
        for (k, ph) in p.phases.iter().enumerate() {
            if ph.at < sc.duration {
                c.schedule(ph.at, Kind::Change, i as u32, k as u32);
            }
        }
    }
    if c.controller.is_some() {
        c.schedule(ps.start, Kind::Boundary, 0, 0);
    }
    Ok(c.run(progress))
}

impl<'a> Cluster<'a> {
    fn schedule(&mut self, t: Nanos, kind: Kind, a: u32, b: u32) {
        debug_assert!(t >= self.now);
        self.events.push(t, kind, a, b);
    }

    fn run(mut self, progress: &mut dyn FnMut(Nanos)) -> ClusterRun {
        let end = self.sc.duration;
        while let Some(ev) = self.events.pop_before(end) {
            self.now = ev.t;
            self.events_run += 1;
            if self.events_run & 0xFFFF == 0 {
                progress(self.now);
            }
            match ev.kind {
                Kind::Arrive => self.arrive(ev.a as usize),
                Kind::Change => self.change(ev.a as usize, ev.b as usize),
                Kind::Deliver => self.deliver(ev.a),
                Kind::Complete => self.complete(ev.a as usize, ev.b),
                Kind::Notify => self.notify(ev.a),
                Kind::Boundary => self.boundary(ev.a as u64),
                Kind::Reports => self.reports(),
                Kind::Tokens => self.tokens(),
            }
        }
        self.now = end;
        progress(end);
        for (j, s) in self.srv.iter_mut().enumerate() {
            if let Some(since) = s.busy_since.take() {
                self.metrics.server_busy(j, since, end);
            }
        }
        let mut totals = self.metrics.finish(self.sc);
        totals.events = self.events_run;
        totals.time_regressions = self.srv.iter().map(|s| s.sched.time_regressions()).sum();
        ClusterRun { totals, rounds: self.rounds }
    }

    fn plan(&self, i: usize) -> &'a BucketPlan {
        &self.ps.buckets[i]
    }

    /// A demand phase begins: new open streams (stale ones die by generation), or closed windows filled.
    fn change(&mut self, i: usize, k: usize) {
        let plan = self.plan(i);
        let b = &mut self.bkt[i];
        b.phase = k;
        b.gen += 1;
        let gen = b.gen;
        self.gen[i] = gen;
        match plan.load {
            BucketLoad::Open { iops } => {
                for (x, &(_, share)) in plan.phases[k].servers.iter().enumerate() {
                    let rate = iops * share;
                    if rate <= 0.0 {
                        continue;
                    }
                    let gap = 1e9 / rate;
                    let u: f64 = self.bkt[i].rng.gen();
                    let first = match self.ps.arrivals {
                        Arrivals::Uniform => u * gap,
                        Arrivals::Poisson => -(1.0 - u).ln() * gap,
                    };
                    let j = plan.phases[k].servers[x].0;
                    let tid = self.id_at(j, i);
                    let entry = (
                        self.now.0.saturating_add(first as u64),
                        i as u32,
                        gen << 16 | x as u32,
                        (gap.round() as u64).max(1),
                        tid,
                    );
                    self.push_arrival(j, entry);
                }
            }
            BucketLoad::Closed { per_server } => {
                for &(j, _) in &plan.phases[k].servers {
                    let have = self.bkt[i].in_flight[j];
                    for _ in have..per_server {
                        self.issue(i, j);
                    }
                }
            }
        }
    }

    /// Files a stream's next arrival at server j, moving the server's pending event earlier if needed.
    fn push_arrival(&mut self, j: usize, entry: Arrival) {
        let t = entry.0;
        let s = &mut self.srv[j];
        s.arrivals.push(Reverse(entry));
        if s.arrive_at.is_none_or(|x| t < x) {
            s.arrive_at = Some(t);
            self.schedule(Nanos(t), Kind::Arrive, j as u32, 0);
        }
    }

    /// Every arrival due at server j: issue it and file the stream's next one (streams of an old
    /// generation, after a demand change, are dropped).
    fn arrive(&mut self, j: usize) {
        let now = self.now.0;
        if self.srv[j].arrive_at != Some(now) {
            return; // superseded by an earlier event
        }
        self.srv[j].arrive_at = None;
        loop {
            let Some(mut top) = self.srv[j].arrivals.peek_mut() else { break };
            let Reverse((t, i, tag, gap, tid)) = *top;
            if t > now {
                break;
            }
            let i = i as usize;
            if tag >> 16 != self.gen[i] {
                // A stream of an earlier demand phase: it ends.
                std::collections::binary_heap::PeekMut::pop(top);
                continue;
            }
            let next = match self.ps.arrivals {
                Arrivals::Uniform => gap,
                Arrivals::Poisson => ((-(1.0 - self.bkt[i].rng.gen::<f64>()).ln() * gap as f64).round() as u64).max(1),
            };
            // Replace the top in place (one sift-down instead of a pop and a push).
            top.0 .0 = now.saturating_add(next);
            drop(top);
            self.issue_with(i, j, tid);
        }
        if let Some(&Reverse((t, ..))) = self.srv[j].arrivals.peek() {
            if self.srv[j].arrive_at.is_none_or(|x| t < x) {
                self.srv[j].arrive_at = Some(t);
                self.schedule(Nanos(t), Kind::Arrive, j as u32, 0);
            }
        }
    }

    fn issue(&mut self, i: usize, j: usize) {
        let tid = self.id_at(j, i);
        self.issue_with(i, j, tid);
    }

    fn issue_with(&mut self, i: usize, j: usize, tid: TenantId) {
        if let Some(f) = self.bkt[i].in_flight.get_mut(j) {
            *f += 1;
        }
        let req =
            Req { bucket: i as u32, server: j as u32, tid, size: self.size[i], issued: self.now, phase: Phase::Weight };
        let id = match self.free.pop() {
            Some(id) => {
                self.reqs[id as usize] = req;
                id
            }
            None => {
                self.reqs.push(req);
                (self.reqs.len() - 1) as u32
            }
        };
        if self.sc.net_delay > Nanos::ZERO {
            self.schedule(self.now.saturating_add(self.sc.net_delay), Kind::Deliver, id, 0);
        } else {
            self.deliver(id);
        }
    }

    /// The bucket's id at a server, adding it on first contact (after the controller has spoken, with no
    /// tokens: R = 0 and, if limited, L = 0, until a message gives it some).
    fn id_at(&mut self, j: usize, i: usize) -> TenantId {
        if let Some(&(_, id)) = self.bkt[i].ids.iter().find(|x| x.0 as usize == j) {
            return id;
        }
        let spec = self.sc.tenants[i].spec;
        let s = &mut self.srv[j];
        let id = s.sched.add_tenant(spec).expect("bounded by the bucket count");
        if s.heard {
            let l = if spec.limit().is_some() { Tokens::Count(0) } else { Tokens::Unlimited };
            s.sched.set_tokens(id, 0, l).expect("live");
        }
        if s.bucket_of.len() <= id.index() {
            s.bucket_of.resize(id.index() + 1, u32::MAX);
        }
        s.bucket_of[id.index()] = i as u32;
        self.bkt[i].ids.push((j as u32, id));
        id
    }

    fn deliver(&mut self, id: u32) {
        let r = &self.reqs[id as usize];
        let (i, j, size, tid) = (r.bucket as usize, r.server as usize, r.size, r.tid);
        if self.srv[j].sched.enqueue(self.now, Request::new(tid, id as u64).size(size)).is_err() {
            self.metrics.rejected(i);
            if let Some(f) = self.bkt[i].in_flight.get_mut(j) {
                *f -= 1;
            }
            self.free.push(id);
            return;
        }
        self.try_dispatch(j);
    }

    fn try_dispatch(&mut self, j: usize) {
        let depth = self.sc.servers[j].queue_depth;
        loop {
            let s = &mut self.srv[j];
            if s.outstanding >= depth {
                return;
            }
            match s.sched.poll(self.now, s.outstanding == 0) {
                Poll::Dispatch(d) => {
                    let id = d.handle as u32;
                    self.reqs[id as usize].phase = d.phase;
                    s.outstanding += 1;
                    s.device.push_back(id);
                    if s.in_service.is_none() {
                        self.start_service(j);
                    }
                }
                Poll::Wait(_) | Poll::Empty => return,
            }
        }
    }

    fn start_service(&mut self, j: usize) {
        let spec = &self.sc.servers[j];
        let s = &mut self.srv[j];
        let Some(id) = s.device.pop_front() else { return };
        let mean = 1e9 / spec.capacity_iops;
        let ns = spec.service.positionless_ns(mean, &mut s.rng) + self.reqs[id as usize].size as f64 * spec.ns_per_byte;
        s.in_service = Some(id);
        if s.busy_since.is_none() {
            s.busy_since = Some(self.now);
        }
        let at = self.now.saturating_add(Nanos((ns.round() as u64).max(1)));
        self.schedule(at, Kind::Complete, j as u32, id);
    }

    fn complete(&mut self, j: usize, id: u32) {
        let s = &mut self.srv[j];
        debug_assert_eq!(s.in_service, Some(id));
        s.in_service = None;
        s.outstanding -= 1;
        s.completed += 1;
        self.metrics.server_completion(j, self.now);
        if self.srv[j].device.is_empty() {
            if let Some(since) = self.srv[j].busy_since.take() {
                self.srv[j].busy_ns += self.now.0 - since.0.max(self.srv[j].last_report.0);
                self.metrics.server_busy(j, since, self.now);
            }
        } else {
            self.start_service(j);
        }
        if self.sc.net_delay > Nanos::ZERO {
            self.schedule(self.now.saturating_add(self.sc.net_delay), Kind::Notify, id, 0);
        } else {
            self.notify(id);
        }
        self.try_dispatch(j);
    }

    fn notify(&mut self, id: u32) {
        let r = self.reqs[id as usize].clone();
        self.free.push(id);
        let (i, j) = (r.bucket as usize, r.server as usize);
        self.metrics.completion(i, j, r.issued, self.now, r.size, r.phase);
        let plan = self.plan(i);
        if let BucketLoad::Closed { per_server } = plan.load {
            self.bkt[i].in_flight[j] -= 1;
            let active = plan.phases[self.bkt[i].phase].servers.iter().any(|x| x.0 == j);
            if active && self.bkt[i].in_flight[j] < per_server {
                self.issue(i, j);
            }
        }
    }

    /// A redistribution boundary: every server snapshots its report; they reach the controller later.
    fn boundary(&mut self, round: u64) {
        let now = self.now;
        let mut reports = Vec::with_capacity(self.srv.len());
        for (j, s) in self.srv.iter_mut().enumerate() {
            if let Some(since) = s.busy_since {
                s.busy_ns += now.0 - since.0.max(s.last_report.0);
            }
            let mut lines = Vec::new();
            for b in s.sched.take_interval(now) {
                let c = b.counters;
                if c.arrivals + c.dispatched_r + c.dispatched_l + b.queued > 0 {
                    lines.push(BucketReport {
                        bucket: s.bucket_of[b.id.index()],
                        arrivals: c.arrivals,
                        dispatched: c.dispatched_r + c.dispatched_l,
                        queued: b.queued,
                        idle_ns: c.idle_ns,
                    });
                }
            }
            lines.sort_unstable_by_key(|l| l.bucket);
            reports.push(ServerReport {
                server: j as u32,
                round,
                elapsed_ns: now.0 - s.last_report.0,
                completed: s.completed,
                busy_ns: s.busy_ns,
                buckets: lines,
            });
            s.last_report = now;
            s.completed = 0;
            s.busy_ns = 0;
        }
        self.pending_reports = reports;
        if self.ps.delay > Nanos::ZERO {
            self.schedule(now.saturating_add(self.ps.delay), Kind::Reports, 0, 0);
        } else {
            self.reports();
        }
        let next = self.ps.start.0 + (round + 1) * (self.ps.period.0 / self.ps.intervals as u64);
        if next < self.sc.duration.0 {
            self.schedule(Nanos(next), Kind::Boundary, (round + 1) as u32, 0);
        }
    }

    /// The reports reach the controller, which answers at once.
    fn reports(&mut self) {
        let c = self.controller.as_mut().expect("boundaries only with a controller");
        for r in std::mem::take(&mut self.pending_reports) {
            c.handle_report(r).expect("reports are well formed");
        }
        let (msgs, summary) = c.poll(self.now).expect("every server reported");
        self.rounds.push(summary);
        self.pending_tokens = msgs;
        if self.ps.delay > Nanos::ZERO {
            self.schedule(self.now.saturating_add(self.ps.delay), Kind::Tokens, 0, 0);
        } else {
            self.tokens();
        }
    }

    /// Token messages reach the servers.
    fn tokens(&mut self) {
        for m in std::mem::take(&mut self.pending_tokens) {
            let j = m.server as usize;
            let mut listed = vec![false; self.srv[j].bucket_of.len()];
            for &(i, r, l) in &m.tokens {
                let id = self.id_at(j, i as usize);
                if listed.len() <= id.index() {
                    listed.resize(id.index() + 1, false);
                }
                listed[id.index()] = true;
                self.srv[j].sched.grant(id, r, l).expect("live");
            }
            let s = &mut self.srv[j];
            s.heard = true;
            for (slot, &i) in s.bucket_of.iter().enumerate() {
                if i == u32::MAX || listed.get(slot).copied().unwrap_or(false) {
                    continue;
                }
                let id = s.sched.id_at_slot(slot).expect("mapped slots are live");
                let l = if self.sc.tenants[i as usize].spec.limit().is_some() {
                    Tokens::Count(0)
                } else {
                    Tokens::Unlimited
                };
                s.sched.set_tokens(id, 0, l).expect("live");
            }
            self.try_dispatch(j);
        }
    }
}
