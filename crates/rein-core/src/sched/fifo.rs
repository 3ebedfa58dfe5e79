//! FIFO: requests in arrival order, whatever their tenant. The baseline with no QoS at all: what a
//! device queue does on its own. Specs are accepted and reported but not enforced.
//!
//! Invariant: `queue` holds exactly the queued requests of live tenants, in arrival order, and each
//! tenant's `queued` counts its entries.

use super::slab::Slab;
use super::{
    Dispatch, Phase, Poll, QosSpec, Request, SchedConfig, SchedError, Scheduler, SchedulerKind, TenantId, TenantStats,
};
use crate::units::{LatestTime, Nanos};
use std::collections::VecDeque;

#[derive(Debug, Clone, Default)]
struct Tenant {
    spec: QosSpec,
    stats: TenantStats,
}

/// FIFO; see the module comment.
#[derive(Debug, Clone)]
pub struct Fifo {
    config: SchedConfig,
    tenants: Slab<Tenant>,
    queue: VecDeque<(TenantId, u64, u64)>,
    time: LatestTime,
}

impl Fifo {
    /// A FIFO; of the config it uses only the cost model (for the reported cost) and the bounds.
    pub fn new(config: SchedConfig) -> Self {
        Fifo { config, tenants: Slab::default(), queue: VecDeque::new(), time: LatestTime::default() }
    }
}

impl Scheduler for Fifo {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Fifo
    }
    fn add_tenant(&mut self, spec: QosSpec) -> Result<TenantId, SchedError> {
        self.tenants.insert(self.config.limits.max_tenants, Tenant { spec, stats: TenantStats::default() })
    }
    fn set_spec(&mut self, id: TenantId, spec: QosSpec) -> Result<(), SchedError> {
        self.tenants.get_mut(id)?.spec = spec;
        Ok(())
    }
    fn set_config(&mut self, config: SchedConfig) {
        self.config = config;
    }
    fn remove_tenant(&mut self, id: TenantId) -> Result<Vec<u64>, SchedError> {
        self.tenants.remove(id)?;
        let mut out = Vec::new();
        self.queue.retain(|&(t, h, _)| {
            if t == id {
                out.push(h);
                false
            } else {
                true
            }
        });
        Ok(out)
    }
    fn enqueue(&mut self, now: Nanos, req: Request) -> Result<(), SchedError> {
        self.time.advance(now);
        if self.queue.len() >= self.config.limits.max_queued {
            return Err(SchedError::QueueFull { max: self.config.limits.max_queued });
        }
        let max_t = self.config.limits.max_queued_per_tenant;
        let t = self.tenants.get_mut(req.tenant)?;
        if t.stats.queued >= max_t {
            return Err(SchedError::TenantQueueFull { tenant: req.tenant, max: max_t });
        }
        t.stats.queued += 1;
        t.stats.enqueued += 1;
        self.queue.push_back((req.tenant, req.handle, req.size));
        Ok(())
    }
    fn poll(&mut self, now: Nanos, _device_idle: bool) -> Poll {
        self.time.advance(now);
        let Some((tenant, handle, size)) = self.queue.pop_front() else { return Poll::Empty };
        let cost = self.config.cost_model.cost(size);
        let t = self.tenants.get_mut(tenant).expect("queue holds live tenants only");
        t.stats.queued -= 1;
        t.stats.dispatched[Phase::Weight.index()] += 1;
        t.stats.cost[Phase::Weight.index()] += cost.0 as u128;
        Poll::Dispatch(Dispatch { tenant, handle, phase: Phase::Weight, cost })
    }
    fn maintain(&mut self, _now: Nanos) -> usize {
        0
    }
    fn queued(&self) -> usize {
        self.queue.len()
    }
    fn tenant_count(&self) -> usize {
        self.tenants.len()
    }
    fn stats(&self, id: TenantId) -> Result<TenantStats, SchedError> {
        Ok(self.tenants.get(id)?.stats)
    }
    fn spec(&self, id: TenantId) -> Result<QosSpec, SchedError> {
        Ok(self.tenants.get(id)?.spec)
    }
    fn time_regressions(&self) -> u64 {
        self.time.regressions()
    }
}
