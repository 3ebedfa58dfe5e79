//! The run layer of a pShift cluster (pshift.txt §IV; the model is [`crate::model::pshift`]): buckets
//! whose demand moves between token-scheduled servers, and a controller reached over a network delay.
//!
//! # Model
//! - **Servers** are the engine's servers with rein-core's `TokenScheduler` (Algorithm 1, unchanged) as
//!   the scheduler; use `queue_depth = 1` and the scheduler picks every request, as the paper's servers
//!   do. Requests take the engine's one path: network, scheduler, device, completion.
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
//! - **Early rounds** (`early_rounds`, beyond the paper; rein-core's controller, "Early rounds"): a
//!   request of a bucket that the latest token message did not list at its server is a stray arrival;
//!   the server notes it to the controller once per message (`delay`). If the controller starts an
//!   early round, its request for reports reaches every server `delay` later; each reports the interval
//!   so far (`TokenScheduler::peek_interval`: the counters go on, and the boundary's report still covers
//!   the whole interval), and the answer comes back as at a boundary. The controller starts one only if
//!   the next boundary is at least four delays away, so its answer always arrives before it.
//!
//! Determinism: one PCG stream per bucket (seeded from the scenario seed and the index); open streams
//! sit in one heap per server, so the event queue holds a few events per server instead of one per
//! stream (at 80,000 streams the global heap's cache misses dominated).

use super::events::Kind;
use super::{SetupError, Sim};
use crate::model::pshift::{Arrivals, BucketLoad, BucketPlan, PshiftSection};
use crate::model::Scenario;
use rand::Rng;
use rand_pcg::Pcg64Mcg;
use rein_core::pshift::{Controller, ServerReport, StrayArrival, TokenMessage, TokenServer};
use rein_core::{Nanos, TenantId};
use rein_model::report::rounds::{ControllerRound, PeriodRecord};
use rein_model::seed::stream_rng;
use rein_model::workload::poisson_gap;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// An open stream's next arrival at a server: (due, bucket, generation << 16 | stream index, mean gap in
/// ns, the bucket's id at the server). Everything an arrival needs rides in the entry, so it touches no
/// per-bucket state but the generation.
type Arrival = (u64, u32, u32, u64, TenantId);

/// A server's pShift state besides its scheduler: its arrival streams, and rein-core's [`TokenServer`]
/// (its reports and how it applies answers, as `rein serve` with `[pshift]` runs them). A completion
/// counts when the recorder counts it (the IO is back at the bucket).
struct ClusterServer {
    /// Open arrival streams to this server: (due time, bucket, generation << 16 | stream).
    arrivals: BinaryHeap<Reverse<Arrival>>,
    /// The time of the `StreamArrive` event pending for this server, if any.
    arrive_at: Option<u64>,
    token: TokenServer,
}

/// A bucket's state.
struct Bucket {
    rng: Pcg64Mcg,
    phase: usize,
    /// (server, id in its scheduler) for every server the bucket has sent to (a few dozen at most).
    ids: Vec<(u32, TenantId)>,
    /// Closed loops: requests in flight per server.
    in_flight: Vec<u32>,
}

/// The cluster layer's state.
pub(super) struct Cluster<'a> {
    ps: &'a PshiftSection,
    servers: Vec<ClusterServer>,
    buckets: Vec<Bucket>,
    /// Per bucket, the generation of its demand phase (compact: read on every arrival).
    generation: Vec<u32>,
    /// Per bucket, its request size.
    size: Vec<u64>,
    controller: Option<Controller>,
    /// Messages on their way, in the order sent (every message takes the same `delay`, so they arrive in
    /// that order too).
    pending_reports: VecDeque<Vec<ServerReport>>,
    pending_tokens: VecDeque<Vec<TokenMessage>>,
    pending_strays: VecDeque<StrayArrival>,
    pending_snapshots: VecDeque<(u64, u32)>,
    /// The controller's rounds, as answered (rounds.csv).
    pub(super) rounds: Vec<ControllerRound>,
    /// The periods it closed (periods.csv).
    pub(super) closed: Vec<PeriodRecord>,
}

impl<'a> Cluster<'a> {
    /// After the run: the controller's tallies of closed periods and its buckets' QoS per period (bucket
    /// order), and the periods it closed one by one, taken out (none without a controller).
    pub(super) fn controller_periods(
        &mut self,
    ) -> Option<(&[rein_core::pshift::PeriodTally], &[rein_core::pshift::BucketQos], Vec<PeriodRecord>)> {
        let c = self.controller.as_ref()?;
        Some((c.periods(), c.buckets(), std::mem::take(&mut self.closed)))
    }

    pub(super) fn new(sc: &Scenario, ps: &'a PshiftSection) -> Result<Cluster<'a>, SetupError> {
        let buckets = ps
            .buckets
            .iter()
            .enumerate()
            .map(|(i, p)| Bucket {
                rng: stream_rng(sc.seed(), i as u64),
                phase: 0,
                ids: Vec::new(),
                in_flight: if matches!(p.load, BucketLoad::Closed { .. }) {
                    vec![0; sc.servers.len()]
                } else {
                    Vec::new()
                },
            })
            .collect();
        let controller = if ps.controller {
            let qos = sc.tenants.iter().map(|t| ps.bucket_qos(t)).collect();
            let caps: Vec<f64> = sc.servers.iter().map(|s| s.device.capacity_iops).collect();
            Some(Controller::new(ps.controller_config(), &caps, qos).map_err(SetupError::Controller)?)
        } else {
            None
        };
        Ok(Cluster {
            ps,
            servers: (0..sc.servers.len())
                .map(|j| ClusterServer {
                    arrivals: BinaryHeap::new(),
                    arrive_at: None,
                    token: TokenServer::new(j as u32, ps.early_rounds > 0, Nanos::ZERO),
                })
                .collect(),
            buckets,
            generation: vec![0; sc.tenants.len()],
            size: sc.tenants.iter().map(|t| t.workload.size_bytes).collect(),
            controller,
            pending_reports: VecDeque::new(),
            pending_tokens: VecDeque::new(),
            pending_strays: VecDeque::new(),
            pending_snapshots: VecDeque::new(),
            rounds: Vec::new(),
            closed: Vec::new(),
        })
    }

    /// A request of bucket `i` to server `j` was refused.
    pub(super) fn failed(&mut self, i: usize, j: usize) {
        if let Some(f) = self.buckets[i].in_flight.get_mut(j) {
            *f -= 1;
        }
    }

    /// The completion of a request dispatched by server `j` for its scheduler's tenant `id` was counted.
    pub(super) fn recorded(&mut self, j: usize, id: TenantId) {
        self.servers[j].token.recorded(id);
    }

    /// Server `j`'s device completed a request.
    pub(super) fn device_completed(&mut self, j: usize) {
        self.servers[j].token.device_completed();
    }

    /// Server `j`'s device went idle at `now`, busy since `from`.
    pub(super) fn device_idle(&mut self, j: usize, from: Nanos, now: Nanos) {
        self.servers[j].token.device_idle(from, now);
    }

    fn plan(&self, i: usize) -> &'a BucketPlan {
        &self.ps.buckets[i]
    }
}

/// The messages between the servers and the controller (each has its event [`Kind`] and its queue).
#[derive(Clone, Copy)]
enum Message {
    /// Every server's report, to the controller.
    Reports,
    /// The controller's token messages, to the servers.
    Tokens,
    /// A server's note of a stray arrival, to the controller.
    Stray,
    /// The controller's request for an early round's reports, to the servers.
    EarlyReport,
}

impl<'a> Sim<'a> {
    fn cluster(&mut self) -> &mut Cluster<'a> {
        self.cluster.as_mut().expect("pShift events need a cluster")
    }

    /// The first events: every bucket's demand phases, then the first redistribution boundary.
    pub(super) fn cluster_start(&mut self) {
        let ps = self.cluster().ps;
        for (i, p) in ps.buckets.iter().enumerate() {
            for (k, ph) in p.phases.iter().enumerate() {
                if ph.at < self.sc.duration {
                    self.schedule(ph.at, Kind::Change, i as u32, k as u32);
                }
            }
        }
        if self.cluster().controller.is_some() {
            self.schedule(ps.start, Kind::Boundary, 0, 0);
        }
    }

    /// A demand phase begins: new open streams (stale ones die by generation), or closed windows filled.
    pub(super) fn change(&mut self, i: usize, k: usize) {
        let now = self.now;
        let c = self.cluster();
        let plan = c.plan(i);
        c.buckets[i].phase = k;
        c.generation[i] += 1;
        let generation = c.generation[i];
        match plan.load {
            BucketLoad::Open { iops } => {
                for (x, &(j, share)) in plan.phases[k].servers.iter().enumerate() {
                    let rate = iops * share;
                    if rate <= 0.0 {
                        continue;
                    }
                    let gap = 1e9 / rate;
                    let c = self.cluster();
                    let rng = &mut c.buckets[i].rng;
                    // A uniform stream starts at a random phase of its spacing; a Poisson one a gap away.
                    let first = match c.ps.arrivals {
                        Arrivals::Uniform => rng.gen::<f64>() * gap,
                        Arrivals::Poisson => poisson_gap(rng, rate).0 as f64,
                    };
                    let tid = self.id_at(j, i);
                    let entry = (
                        now.0.saturating_add(first as u64),
                        i as u32,
                        generation << 16 | x as u32,
                        (gap.round() as u64).max(1),
                        tid,
                    );
                    self.push_arrival(j, entry);
                }
            }
            BucketLoad::Closed { per_server } => {
                for &(j, _) in &plan.phases[k].servers {
                    let have = self.cluster().buckets[i].in_flight[j];
                    for _ in have..per_server {
                        self.bucket_issue(i, j);
                    }
                }
            }
        }
    }

    /// Files a stream's next arrival at server j, moving the server's pending event earlier if needed.
    fn push_arrival(&mut self, j: usize, entry: Arrival) {
        let t = entry.0;
        self.cluster().servers[j].arrivals.push(Reverse(entry));
        self.arrive_by(j, t);
    }

    /// Schedules server j's `StreamArrive` at `t`, unless one is pending no later.
    fn arrive_by(&mut self, j: usize, t: u64) {
        let s = &mut self.cluster().servers[j];
        if s.arrive_at.is_none_or(|x| t < x) {
            s.arrive_at = Some(t);
            self.schedule(Nanos(t), Kind::StreamArrive, j as u32, 0);
        }
    }

    /// Every arrival due at server j: issue it and file the stream's next one (streams of an old
    /// generation, after a demand change, are dropped).
    pub(super) fn stream_arrive(&mut self, j: usize) {
        let now = self.now.0;
        if self.cluster().servers[j].arrive_at != Some(now) {
            return; // superseded by an earlier event
        }
        self.cluster().servers[j].arrive_at = None;
        loop {
            let c = self.cluster.as_mut().expect("cluster");
            let poisson = c.ps.arrivals == Arrivals::Poisson;
            let Some(mut top) = c.servers[j].arrivals.peek_mut() else { break };
            let Reverse((t, i, tag, gap, tid)) = *top;
            if t > now {
                break;
            }
            let i = i as usize;
            if tag >> 16 != c.generation[i] {
                // A stream of an earlier demand phase: it ends.
                std::collections::binary_heap::PeekMut::pop(top);
                continue;
            }
            let next = if poisson {
                // One Poisson draw for every open workload (rein-model); `gap` is the mean in ns.
                poisson_gap(&mut c.buckets[i].rng, 1e9 / gap as f64).0.max(1)
            } else {
                gap
            };
            // Replace the top in place (one sift-down instead of a pop and a push).
            top.0 .0 = now.saturating_add(next);
            drop(top);
            self.bucket_issue_with(i, j, tid);
        }
        if let Some(&Reverse((t, ..))) = self.cluster().servers[j].arrivals.peek() {
            self.arrive_by(j, t);
        }
    }

    fn bucket_issue(&mut self, i: usize, j: usize) {
        let tid = self.id_at(j, i);
        self.bucket_issue_with(i, j, tid);
    }

    fn bucket_issue_with(&mut self, i: usize, j: usize, tid: TenantId) {
        let c = self.cluster();
        if let Some(f) = c.buckets[i].in_flight.get_mut(j) {
            *f += 1;
        }
        let size = c.size[i];
        let req = super::Req {
            tenant: i as u32,
            server: j as u32,
            k: j as u32,
            tid,
            size,
            offset: 0,
            issued: self.now,
            phase: rein_core::Phase::Weight,
            write: false,
            cost: rein_core::Cost(0),
            host_issued: self.now,
        };
        self.rec.arrival(i, self.now);
        let id = self.alloc(req);
        self.transmit(id);
    }

    /// The bucket's id at a server, adding it on first contact (after the controller has spoken, with no
    /// tokens: R = 0 and, if limited, L = 0, until a message gives it some).
    fn id_at(&mut self, j: usize, i: usize) -> TenantId {
        if let Some(&(_, id)) = self.cluster().buckets[i].ids.iter().find(|x| x.0 as usize == j) {
            return id;
        }
        let spec = self.sc.tenants[i].spec;
        let ts = self.servers[j].sched.token();
        let c = self.cluster.as_mut().expect("cluster");
        let id = c.servers[j].token.add_bucket(ts, i as u32, spec);
        c.buckets[i].ids.push((j as u32, id));
        id
    }

    /// A request of bucket `i` completed at server `j`: a closed bucket refills its window there if the
    /// server is still one of its active ones.
    pub(super) fn bucket_completed(&mut self, i: usize, j: usize) {
        let c = self.cluster();
        let plan = c.plan(i);
        if let BucketLoad::Closed { per_server } = plan.load {
            let b = &mut c.buckets[i];
            b.in_flight[j] -= 1;
            let active = plan.phases[b.phase].servers.iter().any(|x| x.0 == j);
            if active && b.in_flight[j] < per_server {
                self.bucket_issue(i, j);
            }
        }
    }

    /// A message between the servers and the controller, queued in its `pending_*` list: it arrives
    /// `delay` later (its event runs then), or now.
    fn message(&mut self, m: Message) {
        let delay = self.cluster().ps.delay;
        if delay > Nanos::ZERO {
            let kind = match m {
                Message::Reports => Kind::Reports,
                Message::Tokens => Kind::Tokens,
                Message::Stray => Kind::Stray,
                Message::EarlyReport => Kind::EarlyReport,
            };
            self.schedule(self.now.saturating_add(delay), kind, 0, 0);
            return;
        }
        match m {
            Message::Reports => self.reports(),
            Message::Tokens => self.tokens(),
            Message::Stray => self.stray(),
            Message::EarlyReport => self.early_report(),
        }
    }

    /// A redistribution boundary: every server snapshots its report; they reach the controller later.
    pub(super) fn boundary(&mut self, round: u64) {
        self.snapshot(round, 0);
        let ps = self.cluster().ps;
        let next = ps.start.0 + (round + 1) * (ps.period.0 / ps.intervals as u64);
        if next < self.sc.duration.0 {
            self.schedule(Nanos(next), Kind::Boundary, (round + 1) as u32, 0);
        }
    }

    /// After the run: a QoS period that ends exactly at the run's end is closed with the servers' reports
    /// of that boundary (and any still on their way), so the controller's tally of closed periods counts
    /// it, as `rein cluster run` does (it reads the real controller after that boundary). Nothing the run
    /// recorded changes: no token message goes out and no round is added to rounds.csv
    /// (the closed period is added to periods.csv, stamped at the run's end).
    pub(super) fn cluster_close_at_end(&mut self) {
        let Some(c) = self.cluster.as_ref() else { return };
        let ps = c.ps;
        let (end, tau) = (self.sc.duration, ps.period.0 / u64::from(ps.intervals));
        if c.controller.is_none() || end <= ps.start || (end.0 - ps.start.0) % tau != 0 {
            return;
        }
        let round = (end.0 - ps.start.0) / tau;
        if !round.is_multiple_of(u64::from(ps.intervals)) {
            return; // not a period's end: nothing to close
        }
        self.snapshot(round, 0);
        let c = self.cluster();
        let ctl = c.controller.as_mut().expect("checked above");
        while let Some(batch) = c.pending_reports.pop_front() {
            for r in batch {
                let _ = ctl.handle_report(r);
            }
            while let Some((_, round)) = ctl.poll(end) {
                c.closed.extend(round.closed.iter().map(|p| PeriodRecord::new(end, p)));
            }
        }
    }

    /// Every server takes its report and sends it: for boundary `round`, what happened since the previous
    /// boundary (and the counters restart); for early round `early` after it, the interval so far (the
    /// counters go on).
    fn snapshot(&mut self, round: u64, early: u32) {
        let now = self.now;
        let mut reports = Vec::with_capacity(self.servers.len());
        let c = self.cluster.as_mut().expect("cluster");
        for (srv, s) in self.servers.iter_mut().zip(&mut c.servers) {
            let busy_since = srv.device.busy_since();
            reports.push(s.token.report(srv.sched.token(), now, round, early, busy_since));
        }
        c.pending_reports.push_back(reports);
        self.message(Message::Reports);
    }

    /// Request `id` of bucket `i` reached server `j`'s scheduler. If the latest token message did not list
    /// the bucket there, the server tells the controller once (a stray arrival: the controller may start an
    /// early round).
    pub(super) fn cluster_arrived(&mut self, j: usize, i: usize, id: TenantId) {
        let c = self.cluster.as_mut().expect("cluster");
        let Some(note) = c.servers[j].token.arrived(id) else { return };
        debug_assert_eq!(note.bucket, i as u32);
        c.pending_strays.push_back(note);
        self.message(Message::Stray);
    }

    /// A stray arrival's note reaches the controller; if it starts an early round, its request for reports
    /// goes to every server.
    pub(super) fn stray(&mut self) {
        let now = self.now;
        let c = self.cluster();
        let note = c.pending_strays.pop_front().expect("a note per event");
        let ctl = c.controller.as_mut().expect("strays only with a controller");
        let Some(early) = ctl.handle_stray(now, note).expect("notes are well formed") else { return };
        c.pending_snapshots.push_back(early);
        self.message(Message::EarlyReport);
    }

    /// The request for an early round's reports reaches the servers.
    pub(super) fn early_report(&mut self) {
        let (round, early) = self.cluster().pending_snapshots.pop_front().expect("a request per event");
        self.snapshot(round, early);
    }

    /// The reports reach the controller, which answers at once.
    pub(super) fn reports(&mut self) {
        let now = self.now;
        let c = self.cluster();
        let ctl = c.controller.as_mut().expect("reports only with a controller");
        let batch = c.pending_reports.pop_front().expect("a batch per event");
        let early = batch.first().is_some_and(|r| r.early > 0);
        for r in batch {
            ctl.handle_report(r).expect("reports are well formed");
        }
        // Every server reports at once: the batch completes its round, unless it is an early round's that
        // came too late (after its report timeout, a quarter interval) and was abandoned.
        let Some((msgs, round)) = ctl.poll(now) else {
            assert!(early, "every server reported the boundary");
            return;
        };
        c.rounds.push(ControllerRound::new(now, &round));
        c.closed.extend(round.closed.iter().map(|p| PeriodRecord::new(now, p)));
        c.pending_tokens.push_back(msgs);
        self.message(Message::Tokens);
    }

    /// Token messages reach the servers.
    pub(super) fn tokens(&mut self) {
        for m in self.cluster().pending_tokens.pop_front().expect("a batch per event") {
            let j = m.server as usize;
            // Buckets first seen here join the scheduler now (with no tokens, then the message's).
            let grants: Vec<_> = m.tokens.iter().map(|&(i, r, l)| (self.id_at(j, i as usize), r, l)).collect();
            let ts = self.servers[j].sched.token();
            self.cluster.as_mut().expect("cluster").servers[j].token.apply(ts, m.round, m.early, &grants);
            self.try_dispatch(j);
        }
    }
}
