//! SFQ(D): start-time fair queuing with depth D, the proportional-share baseline of both papers
//! (Jin, Chase, Kaur, "Interposed proportional sharing for a storage service utility", SIGMETRICS 2004;
//! mClock's Fig. 6-7 comparison).
//!
//! # Model
//! Each request of tenant i gets a start tag `S = max(v, F')` and a finish tag `F = S + cost/w_i`, where F'
//! is the finish tag of the tenant's previous request and v is the *virtual time*: the start tag of the
//! request dispatched last. The request with the smallest start tag is dispatched; the caller keeps at
//! most D outstanding. Reservations and limits are ignored (that is the point of the baseline); weights,
//! the cost model and the bounds apply.
//!
//! Like the engine, start tags are computed when a request becomes its tenant's head (same values for
//! backlogged tenants), so state is O(1) per tenant plus one heap over tenants.
//!
//! Invariants: a tenant is in `heap` iff it has queued requests (1); `v` never decreases (2) except in a
//! renormalisation (3): `v < VTIME_CEILING` between calls.
//!
//! # Virtual time's range
//! Tags are in the engine's units (2^-32 ns per unit of cost at weight 1) and `v` only rises, so it
//! meets the end of a `u128` as the engine's `vnow` does (engine module comment, "Virtual time's range",
//! for the rates and the numbers): a request's delta counts as at most [`Cost::MAX`], so one request moves
//! a tag by less than 2^113, and when `v` reaches `VTIME_CEILING` (2^127) every tag (`v`, every tenant's
//! `start` and `finish`, the heap's keys) is lowered by `v - VTIME_REBASED` (to 2^126), saturating at 0.
//! Nothing behind `v` matters: a queued tenant's start tag is at least `v` (the smallest is served and
//! becomes `v`; a tenant becoming active starts at `max(finish, v)`; a batch only moves its own tenant's
//! tags forward), and an idle tenant's finish tag counts only through `max(finish, v)`. So the clipping
//! at 0 changes nothing, and lowering every tag by one constant changes no decision (tested against a
//! twin that never renormalises). The check is one comparison where `v` rises.
//!
//! # Locality batching (PARDA §3.3)
//! With [`SchedConfig::batch`] > 1, after a tenant's request is dispatched up to `batch - 1` more of its
//! requests follow at once while each lies within [`SchedConfig::batch_distance`] bytes of the previous
//! one (PARDA's host scheduler "doesn't switch between VMs after every IO, instead scheduling a group of
//! IOs per VM as long as they exhibit some spatial locality"). Batched requests still advance the tenant's
//! tags, so a batch is paid for: a tenant gets at most `batch - 1` requests ahead of its SFQ order, and
//! its long-run share is unchanged. Batched dispatches do not advance `v` (the virtual time is the start
//! tag of the request chosen by tag order), so tenants that become active meanwhile are not pushed back.

use super::engine::VtimeRange;
use super::heap::IndexedHeap;
use super::slab::Slab;
use super::{
    Dispatch, Phase, Poll, QosSpec, Request, SchedConfig, SchedError, Scheduler, SchedulerKind, TenantId, TenantStats,
};
use crate::units::{step_for_rate, Cost, LatestTime, Nanos, Tag};
use std::collections::VecDeque;

#[derive(Debug, Clone, Default)]
struct Tenant {
    spec: QosSpec,
    step: u128,
    /// (handle, own cost, tag cost = own cost + delta, offset).
    queue: VecDeque<(u64, Cost, Cost, u64)>,
    finish: Tag,
    start: Tag,
    stats: TenantStats,
}

/// SFQ(D); see the module comment.
#[derive(Debug, Clone)]
pub struct Sfq {
    config: SchedConfig,
    tenants: Slab<Tenant>,
    heap: IndexedHeap,
    v: Tag,
    time: LatestTime,
    queued: usize,
    /// Locality batch in progress: (slot, remaining, offset of the request dispatched last).
    batch: Option<(u32, u32, u64)>,
    /// Where `v` is renormalised (tests move it).
    vtime: VtimeRange,
}

impl Sfq {
    /// SFQ(D) with the config's cost model, batching and bounds; reservations and limits are ignored.
    pub fn new(config: SchedConfig) -> Self {
        Sfq {
            config,
            tenants: Slab::default(),
            heap: IndexedHeap::new(),
            v: Tag::ZERO,
            time: LatestTime::default(),
            queued: 0,
            batch: None,
            vtime: VtimeRange::DEFAULT,
        }
    }

    /// Invariant 3: lowers every tag by `v - rebased`, saturating at 0 (module comment, "Virtual time's
    /// range").
    #[cold]
    #[inline(never)]
    fn renormalise(&mut self) {
        let by = self.vtime.rebase(&mut self.v);
        for t in self.tenants.values_mut() {
            t.start = t.start.saturating_sub(by);
            t.finish = t.finish.saturating_sub(by);
        }
        self.heap.lower_keys(by);
    }

    /// Tests: renormalise when `v` reaches `ceiling`, down to `rebased` (below it).
    #[cfg(test)]
    fn set_vtime_range(&mut self, ceiling: u128, rebased: u128) {
        self.vtime.set(ceiling, rebased);
    }

    /// Tests: starts virtual time at `v` instead of 0, before any request (every tag is 0 until then).
    #[cfg(test)]
    fn start_vtime_at(&mut self, v: Tag) {
        assert!(self.tenants.iter().all(|(_, t)| t.finish == Tag::ZERO), "a fresh scheduler");
        self.v = v;
    }

    /// Checks invariants 1 and 3 (tests).
    #[cfg(test)]
    fn check(&self) {
        for (id, t) in self.tenants.iter() {
            assert_eq!(self.heap.contains(id.slot), !t.queue.is_empty(), "invariant 1 for {id}");
        }
        self.heap.check();
        assert!(!self.vtime.reached(self.v), "invariant 3");
    }
}

impl Scheduler for Sfq {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Sfq
    }
    fn add_tenant(&mut self, spec: QosSpec) -> Result<TenantId, SchedError> {
        let t = Tenant {
            spec,
            step: step_for_rate(spec.weight()),
            queue: VecDeque::new(),
            finish: Tag::ZERO,
            start: Tag::ZERO,
            stats: TenantStats::default(),
        };
        let id = self.tenants.insert(self.config.limits.max_tenants, t)?;
        self.heap.grow_slots(self.tenants.slots());
        Ok(id)
    }
    fn set_spec(&mut self, id: TenantId, spec: QosSpec) -> Result<(), SchedError> {
        let t = self.tenants.get_mut(id)?;
        t.spec = spec;
        t.step = step_for_rate(spec.weight());
        Ok(())
    }
    fn set_config(&mut self, config: SchedConfig) {
        self.batch = None;
        self.config = config;
    }
    fn remove_tenant(&mut self, id: TenantId) -> Result<Vec<u64>, SchedError> {
        let t = self.tenants.remove(id)?;
        self.heap.remove(id.slot);
        if self.batch.is_some_and(|b| b.0 == id.slot) {
            self.batch = None;
        }
        self.queued -= t.queue.len();
        Ok(t.queue.iter().map(|q| q.0).collect())
    }
    fn enqueue(&mut self, now: Nanos, req: Request) -> Result<(), SchedError> {
        self.time.advance(now);
        if self.queued >= self.config.limits.max_queued {
            return Err(SchedError::QueueFull { max: self.config.limits.max_queued });
        }
        let max_t = self.config.limits.max_queued_per_tenant;
        let cost = self.config.cost_model.cost(req.size);
        // DT-FQ: the tags also count service received elsewhere (delta); the dispatch reports only the
        // request's own cost, which is what the tracker must count.
        // A peer's delta counts as at most `Cost::MAX` (module comment, "Virtual time's range").
        let tag_cost = cost.saturating_add(req.delta.min(Cost::MAX));
        let v = self.v;
        let t = self.tenants.get_mut(req.tenant)?;
        if t.queue.len() >= max_t {
            return Err(SchedError::TenantQueueFull { tenant: req.tenant, max: max_t });
        }
        t.queue.push_back((req.handle, cost, tag_cost, req.offset));
        t.stats.enqueued += 1;
        self.queued += 1;
        if t.queue.len() == 1 {
            t.start = t.finish.max(v);
            let s = t.start;
            self.heap.set(req.tenant.slot, s);
        }
        Ok(())
    }
    fn poll(&mut self, now: Nanos, _device_idle: bool) -> Poll {
        self.time.advance(now);
        let distance = self.config.batch_distance;
        let batched = match self.batch {
            Some((slot, remaining, last))
                if remaining > 0
                    && self.tenants.at(slot).queue.front().is_some_and(|q| q.3.abs_diff(last) <= distance) =>
            {
                Some((slot, remaining - 1))
            }
            _ => None,
        };
        let slot = match batched {
            Some((slot, _)) => slot,
            None => {
                let Some((start, slot)) = self.heap.peek() else {
                    self.batch = None;
                    return Poll::Empty;
                };
                self.v = self.v.max(start);
                if self.vtime.reached(self.v) {
                    self.renormalise();
                }
                slot
            }
        };
        let t = self.tenants.at_mut(slot);
        let (handle, cost, tag_cost, offset) = t.queue.pop_front().expect("heap holds backlogged tenants");
        t.finish = t.start.saturating_add(tag_cost.times_step(t.step));
        t.stats.dispatched[Phase::Weight.index()] += 1;
        t.stats.cost[Phase::Weight.index()] += cost.0 as u128;
        self.queued -= 1;
        if t.queue.is_empty() {
            self.heap.remove(slot);
        } else {
            t.start = t.finish;
            let s = t.start;
            self.heap.set(slot, s);
        }
        self.batch = match batched {
            Some((slot, remaining)) => Some((slot, remaining, offset)),
            None if self.config.batch > 1 => Some((slot, self.config.batch - 1, offset)),
            None => None,
        };
        Poll::Dispatch(Dispatch { tenant: self.tenants.id_of(slot), handle, phase: Phase::Weight, cost })
    }
    fn maintain(&mut self, now: Nanos) -> usize {
        self.time.advance(now);
        0
    }
    fn queued(&self) -> usize {
        self.queued
    }
    fn tenant_count(&self) -> usize {
        self.tenants.len()
    }
    fn stats(&self, id: TenantId) -> Result<TenantStats, SchedError> {
        let t = self.tenants.get(id)?;
        Ok(TenantStats { queued: t.queue.len(), ..t.stats })
    }
    fn spec(&self, id: TenantId) -> Result<QosSpec, SchedError> {
        Ok(self.tenants.get(id)?.spec)
    }
    fn time_regressions(&self) -> u64 {
        self.time.regressions()
    }
}

/// Virtual time's range (module comment): renormalisations that change no decision.
#[cfg(test)]
mod vtime {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Add(f64),
        /// Tenant, size, delta in units, offset.
        Enqueue(usize, u64, u64, u64),
        Poll(u64),
        SetWeight(usize, f64),
        Remove(usize),
        SetConfig(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => (0.1f64..10.0).prop_map(Op::Add),
            3 => (0usize..8, 0u64..1_000_000, prop_oneof![Just(0u64), 0u64..16], 0u64..100_000)
                .prop_map(|(t, size, delta, off)| Op::Enqueue(t, size, delta, off)),
            3 => (0u64..20_000_000).prop_map(Op::Poll),
            1 => (0usize..8, 0.1f64..10.0).prop_map(|(t, w)| Op::SetWeight(t, w)),
            1 => (0usize..8).prop_map(Op::Remove),
            1 => (0usize..3).prop_map(Op::SetConfig),
        ]
    }

    /// Per-IO cost, per-byte cost, and locality batches (which do not move `v`).
    fn configs() -> [SchedConfig; 3] {
        [
            SchedConfig::default(),
            SchedConfig { cost_model: crate::CostModel::BYTES, ..SchedConfig::default() },
            SchedConfig { batch: 4, batch_distance: 50_000, ..SchedConfig::default() },
        ]
    }

    /// Where both twins start virtual time: far above every gap a run opens (under 2^90), so nothing is
    /// clipped at 0.
    const ORIGIN: u128 = 1 << 100;
    /// The twin renormalises whenever `v` rises this far above the origin: every request or few.
    const STRIDE: u128 = 1 << 62;

    proptest! {
        /// Two SFQs fed the same operations, one renormalising whenever `v` rises 2^62 above the origin,
        /// the other never in the run: the same answer to every call, and the same start tags but for
        /// the renormalisations' total offset.
        #[test]
        fn renormalising_changes_no_decision(ops in proptest::collection::vec(op(), 1..300), cfg in 0usize..3) {
            let mut plain = Sfq::new(configs()[cfg]);
            let mut renormalised = plain.clone();
            renormalised.set_vtime_range(ORIGIN + STRIDE, ORIGIN);
            plain.start_vtime_at(Tag(ORIGIN));
            renormalised.start_vtime_at(Tag(ORIGIN));
            let mut ids = vec![];
            let (mut now, mut handle) = (0u64, 0u64);
            for op in ops {
                match op {
                    Op::Add(w) => {
                        let spec = QosSpec::weighted(w).unwrap();
                        let id = plain.add_tenant(spec).unwrap();
                        prop_assert_eq!(renormalised.add_tenant(spec).unwrap(), id);
                        ids.push(id);
                    }
                    Op::Enqueue(t, size, delta, off) => {
                        if let Some(&id) = ids.get(t) {
                            let mut req = Request::new(id, handle).size(size).offset(off);
                            req.delta = Cost::units(delta);
                            handle += 1;
                            prop_assert_eq!(plain.enqueue(Nanos(now), req), renormalised.enqueue(Nanos(now), req));
                        }
                    }
                    Op::Poll(dt) => {
                        now += dt;
                        prop_assert_eq!(plain.poll(Nanos(now), true), renormalised.poll(Nanos(now), true));
                    }
                    Op::SetWeight(t, w) => {
                        if let Some(&id) = ids.get(t) {
                            let spec = QosSpec::weighted(w).unwrap();
                            prop_assert_eq!(plain.set_spec(id, spec), renormalised.set_spec(id, spec));
                        }
                    }
                    Op::Remove(t) => {
                        if let Some(&id) = ids.get(t) {
                            prop_assert_eq!(plain.remove_tenant(id), renormalised.remove_tenant(id));
                        }
                    }
                    Op::SetConfig(c) => {
                        plain.set_config(configs()[c]);
                        renormalised.set_config(configs()[c]);
                    }
                }
                plain.check();
                renormalised.check();
                let offset = plain.v.0 - renormalised.v.0;
                for &id in &ids {
                    let (Ok(a), Ok(b)) = (plain.tenants.get(id), renormalised.tenants.get(id)) else { continue };
                    if !a.queue.is_empty() {
                        prop_assert_eq!(a.start.0 - b.start.0, offset, "start tags are lowered with v");
                    }
                }
            }
        }
    }
}
