//! Helpers shared by the core's integration tests.
// Each test binary compiles its own copy of this module and uses only some of the helpers.
#![allow(dead_code)]

use rein_core::oracle::{allocate, OracleTenant};
use rein_core::vtime::{run_backlogged, BacklogRun};
use rein_core::{Nanos, QosSpec, SchedConfig, Scheduler, SchedulerKind, TenantId};

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
