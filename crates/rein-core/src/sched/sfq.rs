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
//! Invariants: a tenant is in `heap` iff it has queued requests (1); `v` never decreases (2).
//!
//! # Locality batching (PARDA §3.3)
//! With [`SchedConfig::batch`] > 1, after a tenant's request is dispatched up to `batch - 1` more of its
//! requests follow at once while each lies within [`SchedConfig::batch_distance`] bytes of the previous
//! one (PARDA's host scheduler "doesn't switch between VMs after every IO, instead scheduling a group of
//! IOs per VM as long as they exhibit some spatial locality"). Batched requests still advance the tenant's
//! tags, so a batch is paid for: a tenant gets at most `batch - 1` requests ahead of its SFQ order, and
//! its long-run share is unchanged. Batched dispatches do not advance `v` (the virtual time is the start
//! tag of the request chosen by tag order), so tenants that become active meanwhile are not pushed back.

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
        }
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
        let tag_cost = cost.saturating_add(req.delta);
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
