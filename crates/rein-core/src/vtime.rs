//! A virtual-time server for driving schedulers in tests, demos and benchmarks.
//!
//! A single device serves one request at a time, each taking exactly `1/C` seconds at the capacity C in
//! force when it starts; C follows a schedule. Every tenant is kept backlogged (its queue refilled to
//! `queue_len` after each dispatch), which is the setting of the papers' allocation properties. Service
//! instants are kept in 2^-32 ns fixed point, so over any run the device does C*T requests within one.
//! This is deliberately tiny; the simulator crate has the full device, workload and network models.

use crate::sched::{Phase, Poll, Request, SchedError, Scheduler, TenantId};
use crate::units::{step_for_rate, Nanos, Tag};

/// What a backlogged run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BacklogRun {
    /// Requests dispatched per tenant, in the order of the `tenants` argument.
    pub served: Vec<u64>,
    /// Per tenant, dispatches by [`Phase::index`].
    pub by_phase: Vec<[u64; 3]>,
    /// Per tenant, requests dispatched before each capacity change (one entry per schedule step after the
    /// first).
    pub served_at_change: Vec<Vec<u64>>,
    /// Time the device sat idle because limits held everything back.
    pub idle: Nanos,
}

/// Drives `sched` for `duration` with every tenant in `tenants` backlogged. `capacity` is a schedule of
/// (start time, IOPS) pairs sorted by start time, the first starting at 0.
pub fn run_backlogged(
    sched: &mut dyn Scheduler,
    tenants: &[TenantId],
    capacity: &[(Nanos, f64)],
    duration: Nanos,
    queue_len: usize,
) -> Result<BacklogRun, SchedError> {
    assert!(!capacity.is_empty() && capacity[0].0 == Nanos::ZERO, "capacity schedule starts at 0");
    assert!(capacity.iter().all(|c| c.1.is_finite() && c.1 > 0.0), "capacities are positive");
    let mut index = vec![usize::MAX; tenants.iter().map(|t| t.index() + 1).max().unwrap_or(0)];
    for (i, t) in tenants.iter().enumerate() {
        index[t.index()] = i;
    }
    let mut run =
        BacklogRun { served: vec![0; tenants.len()], by_phase: vec![[0; 3]; tenants.len()], ..Default::default() };
    let mut handle = 0u64;
    for &t in tenants {
        for _ in 0..queue_len {
            sched.enqueue(Nanos::ZERO, Request::new(t, handle))?;
            handle += 1;
        }
    }
    let end = Tag::from_nanos(duration);
    let mut now = Tag::ZERO;
    let mut step_idx = 0;
    let mut step = step_for_rate(capacity[0].1);
    while now < end {
        while step_idx + 1 < capacity.len() && Tag::from_nanos(capacity[step_idx + 1].0) <= now {
            step_idx += 1;
            step = step_for_rate(capacity[step_idx].1);
            run.served_at_change.push(run.served.clone());
        }
        // The scheduler sees whole nanoseconds; the device keeps the fraction.
        let now_ns = Nanos(u64::try_from(now.0 >> crate::units::TAG_FRAC_BITS).unwrap_or(u64::MAX));
        match sched.poll(now_ns, true) {
            Poll::Dispatch(d) => {
                let i = index[d.tenant.index()];
                run.served[i] += 1;
                run.by_phase[i][d.phase.index()] += 1;
                sched.enqueue(now_ns, Request::new(d.tenant, handle))?;
                handle += 1;
                now = now.saturating_add(d.cost.times_step(step));
            }
            Poll::Wait(t) => {
                let next = Tag::from_nanos(t).max(now.saturating_add(1)).min(end);
                run.idle = run.idle.saturating_add(Nanos(((next.0 - now.0) >> crate::units::TAG_FRAC_BITS) as u64));
                now = next;
            }
            Poll::Empty => break,
        }
    }
    while run.served_at_change.len() + 1 < capacity.len() {
        run.served_at_change.push(run.served.clone());
    }
    Ok(run)
}

/// Served counts of a [`BacklogRun`] by phase name (for reports).
pub fn phase_names() -> [&'static str; 3] {
    [Phase::Reservation.name(), Phase::Weight.name(), Phase::OverLimit.name()]
}
