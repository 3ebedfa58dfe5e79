//! Helpers shared by the core's integration tests.
// Each test binary compiles its own copy of this module and uses only some of the helpers.
#![allow(dead_code)]

use rein_core::oracle::{allocate, OracleTenant};
use rein_core::vtime::{run_backlogged, BacklogRun};
use rein_core::{Nanos, Poll, QosSpec, Request, SchedConfig, Scheduler, SchedulerKind, TenantId};

/// The QoS schedulers held to the oracle, with limits in IOPS.
pub(crate) fn qos_schedulers() -> Vec<(SchedulerKind, Box<dyn Scheduler>)> {
    [SchedulerKind::Mclock, SchedulerKind::Dmclock, SchedulerKind::Rbfq].into_iter().map(|k| (k, build(k))).collect()
}

/// A scheduler of `kind` with the default configuration (per-IO cost: limits in IOPS).
pub(crate) fn build(kind: SchedulerKind) -> Box<dyn Scheduler> {
    kind.build(SchedConfig::default())
}

pub(crate) fn add_all(s: &mut dyn Scheduler, specs: &[QosSpec]) -> Vec<TenantId> {
    specs.iter().map(|sp| s.add_tenant(*sp).unwrap()).collect()
}

pub(crate) fn oracle_rates(specs: &[QosSpec], capacity: f64) -> Vec<f64> {
    let ts: Vec<OracleTenant> = specs.iter().map(OracleTenant::from).collect();
    allocate(&ts, capacity).rates
}

/// Runs backlogged tenants against a capacity schedule; returns the run and the oracle's expected service
/// (IOs) per tenant over the whole run.
pub(crate) fn run_vs_oracle(
    s: &mut dyn Scheduler,
    specs: &[QosSpec],
    schedule: &[(Nanos, f64)],
    duration: Nanos,
) -> (BacklogRun, Vec<f64>) {
    let ids = add_all(s, specs);
    let run = run_backlogged(s, &ids, schedule, duration, 16).unwrap();
    let mut expect = vec![0.0; specs.len()];
    for (k, &(start, cap)) in schedule.iter().enumerate() {
        let end = schedule.get(k + 1).map_or(duration, |n| n.0);
        let secs = end.saturating_sub(start).as_secs_f64();
        for (e, r) in expect.iter_mut().zip(oracle_rates(specs, cap)) {
            *e += r * secs;
        }
    }
    (run, expect)
}

/// The situation of the tests of a tenant's return (engine invariant 6, `SchedConfig::pool_return`): one
/// server at 1 ms per IO. Tenants `a` and `b` of `s` share it for 2 s, each with one request queued (A's
/// built by `a_request(handle)`). Then A's queue empties: its last queued request is dispatched, and A
/// sends nothing while B is served alone for `gap_ms`. A comes back with 1,000 requests, the i-th built by
/// `a_return(i, handle)`. Returns how many of them are served before B's next IO.
pub(crate) fn served_in_a_row(
    s: &mut dyn Scheduler,
    (a, b): (TenantId, TenantId),
    gap_ms: u64,
    a_request: impl Fn(u64) -> Request,
    a_return: impl Fn(u64, u64) -> Request,
) -> u64 {
    s.enqueue(Nanos(0), a_request(0)).unwrap();
    s.enqueue(Nanos(0), Request::new(b, 1)).unwrap();
    let mut h = 2;
    let mut ms = 0;
    while ms < 2000 {
        let Poll::Dispatch(d) = s.poll(Nanos::from_millis(ms), true) else { panic!("both backlogged") };
        let next = if d.tenant == a { a_request(h) } else { Request::new(b, h) };
        s.enqueue(Nanos::from_millis(ms), next).unwrap();
        h += 1;
        ms += 1;
    }
    // A's last queued request is served; A sends no more for now.
    loop {
        let Poll::Dispatch(d) = s.poll(Nanos::from_millis(ms), true) else { panic!("B backlogged") };
        ms += 1;
        if d.tenant == a {
            break;
        }
        s.enqueue(Nanos::from_millis(ms), Request::new(b, h)).unwrap();
        h += 1;
    }
    for _ in 0..gap_ms {
        let Poll::Dispatch(d) = s.poll(Nanos::from_millis(ms), true) else { panic!("B backlogged") };
        assert_eq!(d.tenant, b);
        s.enqueue(Nanos::from_millis(ms), Request::new(b, h)).unwrap();
        h += 1;
        ms += 1;
    }
    let now = Nanos::from_millis(ms);
    for i in 0..1000 {
        s.enqueue(now, a_return(i, h)).unwrap();
        h += 1;
    }
    let mut in_a_row = 0;
    while let Poll::Dispatch(d) = s.poll(now, true) {
        if d.tenant == b {
            break;
        }
        in_a_row += 1;
    }
    in_a_row
}
