//! Idle and return (rbfq-repair.txt Fig. 14 situation): a tenant that used spare capacity while another was
//! idle is not starved when the other returns, and the returning tenant gets its share at once.
mod common;

use rein_core::{Nanos, Poll, PoolReturn, QosSpec, Request, SchedConfig, SchedulerKind};

/// One device at 1,000 IOPS (1 ms per IO). f1 is backlogged throughout; f2 is backlogged only during
/// `on` windows. Returns, for each 100 ms window, the IOs of (f1, f2).
fn on_off(kind: SchedulerKind, specs: [QosSpec; 2], on: &[(u64, u64)], total_ms: u64) -> Vec<(u64, u64)> {
    let mut s = common::build(kind);
    let f1 = s.add_tenant(specs[0]).unwrap();
    let f2 = s.add_tenant(specs[1]).unwrap();
    let mut windows = vec![(0u64, 0u64); (total_ms / 100) as usize];
    let mut queued2 = 0;
    for h in 0..16 {
        s.enqueue(Nanos(0), Request::new(f1, h)).unwrap();
    }
    let mut handle = 100;
    for ms in 0..total_ms {
        let now = Nanos::from_millis(ms);
        let f2_on = on.iter().any(|&(a, b)| ms >= a && ms < b);
        while f2_on && queued2 < 16 {
            s.enqueue(now, Request::new(f2, handle)).unwrap();
            handle += 1;
            queued2 += 1;
        }
        if let Poll::Dispatch(d) = s.poll(now, true) {
            let w = &mut windows[(ms / 100) as usize];
            if d.tenant == f1 {
                w.0 += 1;
                s.enqueue(now, Request::new(f1, handle)).unwrap();
                handle += 1;
            } else {
                w.1 += 1;
                queued2 -= 1;
            }
        }
    }
    windows
}

#[test]
fn returning_tenant_gets_its_share_at_once_and_the_other_is_not_starved() {
    for kind in [SchedulerKind::Mclock, SchedulerKind::Dmclock, SchedulerKind::Rbfq, SchedulerKind::Sfq] {
        // Equal weights: f1 alone for 5 s (it takes all 1,000 IOPS), then both for 2 s, f2 off, on again.
        let specs = [QosSpec::weighted(1.0).unwrap(), QosSpec::weighted(1.0).unwrap()];
        let w = on_off(kind, specs, &[(5_000, 7_000), (9_000, 11_000)], 11_000);
        for (i, &(a, b)) in w.iter().enumerate() {
            let t = i as u64 * 100;
            let f2_on = (5_000..7_000).contains(&t) || (9_000..11_000).contains(&t);
            if f2_on {
                // Every 100 ms window after the return, including the first: 50 / 50 within 4 IOs.
                assert!(a.abs_diff(50) <= 4 && b.abs_diff(50) <= 4, "{kind} window at {t} ms: f1 {a}, f2 {b}");
            } else if t != 7_000 {
                // (In the window right after f2 stops, its last queued requests drain.)
                assert!(a >= 99 && b == 0, "{kind} window at {t} ms: f1 {a}, f2 {b}");
            }
        }
    }
}

#[test]
fn returning_tenant_with_reservation_and_weights() {
    // f2 has a reservation of 300 and weight 1; f1 weight 3. When both are on: oracle 750 / 250 -> f2 is
    // reservation-clamped at 300, f1 gets 700.
    for kind in [SchedulerKind::Mclock, SchedulerKind::Rbfq] {
        let specs = [QosSpec::weighted(3.0).unwrap(), QosSpec::new(300.0, None, 1.0, 0).unwrap()];
        let w = on_off(kind, specs, &[(3_000, 6_000)], 6_000);
        for (i, &(a, b)) in w.iter().enumerate().skip(30) {
            assert!(b.abs_diff(30) <= 2 && a.abs_diff(70) <= 2, "{kind} window {i}: f1 {a}, f2 {b}");
        }
    }
}

#[test]
fn idle_credit_lets_a_returning_tenant_burst_ahead_but_only_sigma() {
    // sigma = 64: f2 returning from idle may run up to 64 IOs ahead of its share before equal sharing.
    let specs = [QosSpec::weighted(1.0).unwrap(), QosSpec::new(0.0, None, 1.0, 64).unwrap()];
    let w = on_off(SchedulerKind::Mclock, specs, &[(2_000, 4_000)], 4_000);
    let first = w[20];
    assert!(first.1 >= 80, "with credit, f2 should dominate its first 100 ms: {first:?}");
    let total1: u64 = w[20..].iter().map(|x| x.0).sum();
    let total2: u64 = w[20..].iter().map(|x| x.1).sum();
    // Over the 2 s both are on, f2 ends sigma = 64 IOs ahead of f1 (its P tag started 64/w behind), so
    // 1,032 / 968, and no further: the credit is bounded.
    assert!(total2.abs_diff(1032) <= 2 && total1.abs_diff(968) <= 2, "f1 {total1}, f2 {total2}");
}

/// [`common::served_in_a_row`] with A (weight 1) and B (weight `b_weight`) on one server, no delta anywhere:
/// during the gap A's last request is at the device or on its way back (a closed loop). A's first
/// returning request says whether A still had requests at this server's device (`pending`: what the
/// server counts).
fn local_served_in_a_row(kind: SchedulerKind, config: SchedConfig, b_weight: f64, gap_ms: u64, pending: bool) -> u64 {
    let mut s = kind.build(config);
    let a = s.add_tenant(QosSpec::weighted(1.0).unwrap()).unwrap();
    let b = s.add_tenant(QosSpec::weighted(b_weight).unwrap()).unwrap();
    common::served_in_a_row(
        &mut *s,
        (a, b),
        gap_ms,
        |h| Request::new(a, h),
        |i, h| Request::new(a, h).pending_here(i == 0 && pending),
    )
}

/// Engine "A pool still here" (`SchedConfig::pool_return` with `Request::pending_here`): a tenant whose
/// queue emptied while it still had requests at this server's device did not go idle (mClock §2: the
/// active VMs are "those with at least one pending IO"), so with equal weights the `gap` IOs B got alone
/// are A's to take back (one IO of slack either way: B's head tag at the return), at most `lag_ios` of
/// A's own IOs. A tenant with nothing at the device, a gap longer than the window, or the paper's rule:
/// re-based to virtual time (A and B then alternate: at most 1 in a row). For every tag scheduler, with
/// no delta on any request (one server).
#[test]
fn a_tenant_with_requests_at_the_device_keeps_its_lag_within_the_bound() {
    let rein = SchedConfig::default();
    let near = |got: u64, want: u64| got.abs_diff(want) <= 1;
    for kind in [SchedulerKind::Mclock, SchedulerKind::Dmclock, SchedulerKind::Rbfq] {
        let got = local_served_in_a_row(kind, rein, 1.0, 50, true);
        assert!(near(got, 50), "{kind}: gap 50 ms with requests at the device: {got} in a row, want 50");
        // B at weight 0.1: each of its IOs is 10 of A's, so 90 ms alone is 900 of A's IOs; the bound keeps 256.
        let got = local_served_in_a_row(kind, rein, 0.1, 90, true);
        assert!(near(got, 256), "{kind}: lag beyond the bound: {got} in a row, want 256");
        let got = local_served_in_a_row(kind, rein, 1.0, 50, false);
        assert!(got <= 1, "{kind}: nothing at the device, so idle: {got} in a row");
        let got = local_served_in_a_row(kind, rein, 1.0, 150, true);
        assert!(got <= 1, "{kind}: gap 150 ms (over the window): {got} in a row");
        for config in [SchedConfig::paper(), SchedConfig { pool_return: None, ..rein }] {
            let got = local_served_in_a_row(kind, config, 1.0, 50, true);
            assert!(got <= 1, "{kind}: pool_return off: {got} in a row");
        }
        let small =
            SchedConfig { pool_return: Some(PoolReturn { window: Nanos::from_millis(40), lag_ios: 10 }), ..rein };
        let got = local_served_in_a_row(kind, small, 1.0, 30, true);
        assert!(near(got, 10), "{kind}: bound 10: {got} in a row");
    }
}
