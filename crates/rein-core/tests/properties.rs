//! Property tests: each QoS scheduler on a virtual-time device against the fluid oracle (mClock eq. (1)-(2)).
//!
//! Random tenant sets (2-50 tenants, random r/l/w, sum of r below capacity, all backlogged). Checked:
//! 1. each tenant's service is within 2% (or 2 IOs) of the oracle;
//! 2. never above l*T + 1;
//! 3. never below min(r*T, oracle) - 1.
//!
//! All three also when the capacity halves mid-run (oracle and bounds then per half).
mod common;

use proptest::prelude::*;
use rein_core::{Nanos, QosSpec, SchedulerKind};

#[derive(Debug, Clone)]
struct Case {
    capacity: f64,
    specs: Vec<QosSpec>,
}

fn case() -> impl Strategy<Value = Case> {
    (2usize..=50, 500.0f64..20_000.0, 0.0f64..0.9).prop_flat_map(|(n, capacity, resv_frac)| {
        let t = (0.0f64..1.0, 0.5f64..8.0, 0u8..4, 0.05f64..1.5);
        proptest::collection::vec(t, n).prop_map(move |raw| {
            let total_raw: f64 = raw.iter().map(|r| if r.2 < 2 { r.0 } else { 0.0 }).sum();
            let fair = capacity / n as f64;
            let specs = raw
                .iter()
                .map(|&(rr, w, kind, lf)| {
                    // kind 0-1: has a reservation; kind 1 and 3: has a limit.
                    let r = if kind < 2 && total_raw > 0.0 {
                        (rr / total_raw * resv_frac * capacity).max(0.0)
                    } else {
                        0.0
                    };
                    let r = if r < 1e-3 { 0.0 } else { r };
                    let l = if kind % 2 == 1 { Some((r + lf * fair).max(1.0)) } else { None };
                    QosSpec::new(r, l, w, 0).unwrap()
                })
                .collect();
            Case { capacity, specs }
        })
    })
}

fn check(kind: SchedulerKind, c: &Case, halve: bool) -> Result<(), TestCaseError> {
    // About 40,000 dispatches per run.
    let secs = 40_000.0 / c.capacity;
    let duration = Nanos::from_secs_f64(secs);
    let half = Nanos(duration.0 / 2);
    let schedule =
        if halve { vec![(Nanos(0), c.capacity), (half, c.capacity / 2.0)] } else { vec![(Nanos(0), c.capacity)] };
    let mut s = common::build(kind);
    let (run, expect) = common::run_vs_oracle(s.as_mut(), &c.specs, &schedule, duration);
    let t = duration.as_secs_f64();
    for (i, sp) in c.specs.iter().enumerate() {
        let got = run.served[i] as f64;
        let want = expect[i];
        let tol = (0.02 * want).max(2.0);
        prop_assert!((got - want).abs() <= tol, "{kind} tenant {i} ({sp}): served {got}, oracle {want:.1} (tol {tol:.1}), halve={halve}, C={}, first half {:?}, oracle rates {:?} / {:?}, by phase {:?}",
            c.capacity, run.served_at_change.first().map(|v| v[i]),
            common::oracle_rates(&c.specs, c.capacity)[i], common::oracle_rates(&c.specs, c.capacity / 2.0)[i], run.by_phase[i]);
        if let Some(l) = sp.limit() {
            prop_assert!(got <= l * t + 1.0, "{kind} tenant {i} ({sp}): served {got} above limit {}", l * t + 1.0);
        }
        // Per capacity step: min(r*T_h, oracle_h) where reservations are feasible (sum r <= C_h); where
        // they are not, the oracle shares C_h in proportion to r and discrete service may trail it by one
        // more IO. Then one IO of slack over the run, as the issue states, plus r/C: the tags that fall due
        // while the device serves its last, non-preemptible IO (1/C s) cannot be served before the end.
        // (Shrunk counterexample to the bare -1: C = 500, r = 396: two tags due in the last 2.8 ms.)
        let sum_r: f64 = c.specs.iter().map(|s| s.reservation()).sum();
        let c_min = schedule.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
        let mut floor = -1.0 - sp.reservation() / c_min;
        for (k, &(start, cap)) in schedule.iter().enumerate() {
            let end = schedule.get(k + 1).map_or(duration, |n| n.0);
            let th = end.saturating_sub(start).as_secs_f64();
            let oracle_h = common::oracle_rates(&c.specs, cap)[i] * th;
            floor += if sum_r <= cap { (sp.reservation() * th).min(oracle_h) } else { oracle_h - 1.0 };
        }
        prop_assert!(got >= floor, "{kind} tenant {i} ({sp}): served {got} below reservation floor {floor:.1}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn mclock_matches_oracle(c in case()) { check(SchedulerKind::Mclock, &c, false)?; }
    #[test]
    fn mclock_matches_oracle_when_capacity_halves(c in case()) { check(SchedulerKind::Mclock, &c, true)?; }
    #[test]
    fn dmclock_single_server_matches_oracle(c in case()) { check(SchedulerKind::Dmclock, &c, false)?; }
    #[test]
    fn dmclock_matches_oracle_when_capacity_halves(c in case()) { check(SchedulerKind::Dmclock, &c, true)?; }
    #[test]
    fn rbfq_matches_oracle(c in case()) { check(SchedulerKind::Rbfq, &c, false)?; }
    #[test]
    fn rbfq_matches_oracle_when_capacity_halves(c in case()) { check(SchedulerKind::Rbfq, &c, true)?; }

    /// SFQ has no reservations or limits: it must match the oracle of the weights alone.
    #[test]
    fn sfq_is_weight_proportional(c in case()) {
        let specs: Vec<QosSpec> = c.specs.iter().map(|s| QosSpec::weighted(s.weight()).unwrap()).collect();
        check(SchedulerKind::Sfq, &Case { capacity: c.capacity, specs }, false)?;
    }
}
