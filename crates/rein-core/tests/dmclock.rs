//! dmClock across two servers (mclock-dmclock.txt §4.2, Fig. 10 situation), with a small virtual-time
//! driver: a tenant sending only to one server still gets its global reservation and its weight share.
mod common;

use rein_core::{
    Cost, Mclock, Nanos, Phase, Piggyback, Poll, PoolReturn, QosSpec, Request, ReservationSplit, SchedConfig,
    Scheduler, ServiceTracker, TenantId,
};

/// Two servers at 1,000 IOPS each (1 ms per IO, depth 1). Tenant A (weight 3) keeps 16 requests queued at
/// each server; tenant B keeps 16 queued at server 0 only. Returns (A, B) IOPS over `secs`.
fn run(b_spec: QosSpec, distributed: bool, secs: u64) -> (f64, f64) {
    let mut servers = [Mclock::dmclock(SchedConfig::default()), Mclock::dmclock(SchedConfig::default())];
    let a_spec = QosSpec::weighted(3.0).unwrap();
    let ids: Vec<[TenantId; 2]> =
        servers.iter_mut().map(|s| [s.add_tenant(a_spec).unwrap(), s.add_tenant(b_spec).unwrap()]).collect();
    // One tracker per tenant (A uses both servers; B only server 0, so its delta is always 0).
    let mut trackers = [ServiceTracker::new(2), ServiceTracker::new(2)];
    let send =
        |servers: &mut [Mclock; 2], trackers: &mut [ServiceTracker; 2], now: Nanos, t: usize, j: usize, h: u64| {
            let p = if distributed { trackers[t].prepare(j).unwrap() } else { Default::default() };
            servers[j].enqueue(now, Request::new(ids[j][t], h).piggyback(p)).unwrap();
        };
    let mut h = 0;
    for _ in 0..16 {
        for j in 0..2 {
            send(&mut servers, &mut trackers, Nanos(0), 0, j, h);
            h += 1;
        }
        send(&mut servers, &mut trackers, Nanos(0), 1, 0, h);
        h += 1;
    }
    let mut served = [0u64; 2];
    let end = secs * 1000;
    for ms in 0..end {
        let now = Nanos::from_millis(ms);
        for j in 0..2 {
            let Poll::Dispatch(d) = servers[j].poll(now, true) else { panic!("backlogged") };
            let t = if d.tenant == ids[j][0] { 0 } else { 1 };
            if ms >= 1000 {
                served[t] += 1;
            }
            // Completion reported to the tenant's tracker, then the tenant sends its next request there.
            trackers[t].complete(j, d.phase, d.cost).unwrap();
            send(&mut servers, &mut trackers, now, t, j, h);
            h += 1;
        }
    }
    let t = (secs - 1) as f64;
    (served[0] as f64 / t, served[1] as f64 / t)
}

#[test]
fn hot_spotting_tenant_gets_its_global_weight_share() {
    // Globally 3:1 over 2,000 IOPS: A 1,500, B 500. B can only use server 0, so server 0 must give B 500
    // (not the 250 a locally fair 3:1 split would).
    let (a, b) = run(QosSpec::weighted(1.0).unwrap(), true, 20);
    assert!((b - 500.0).abs() <= 10.0, "dmClock B = {b}");
    assert!((a - 1500.0).abs() <= 10.0, "dmClock A = {a}");
    // Without delta (plain mClock per server) B gets the local share only: the violation dmClock fixes.
    let (_, b_local) = run(QosSpec::weighted(1.0).unwrap(), false, 20);
    assert!((b_local - 250.0).abs() <= 10.0, "local mClock B = {b_local}");
}

#[test]
fn hot_spotting_tenant_keeps_its_global_reservation() {
    // B reserves 600 (> its 500 weight share): it gets 600, A the remaining 1,400.
    let (a, b) = run(QosSpec::new(600.0, None, 1.0, 0).unwrap(), true, 20);
    assert!((b - 600.0).abs() <= 10.0, "B = {b}");
    assert!((a - 1400.0).abs() <= 10.0, "A = {a}");
}

/// A tenant with a reservation of 1,000 served on two servers of 2,000 IOPS (0.5 ms per IO), each shared
/// with one weight-1 tenant; the tenant keeps 16 requests queued at each server. Returns its
/// (reservation-phase rate, total rate).
fn reserved_on_two(split: ReservationSplit) -> (f64, f64) {
    let mut servers = [Mclock::dmclock(SchedConfig::default()), Mclock::dmclock(SchedConfig::default())];
    let spec = QosSpec::new(1000.0, None, 1.0, 0).unwrap();
    let other = QosSpec::weighted(1.0).unwrap();
    let ids: Vec<[TenantId; 2]> =
        servers.iter_mut().map(|s| [s.add_tenant(spec).unwrap(), s.add_tenant(other).unwrap()]).collect();
    let mut tr = ServiceTracker::with_split(2, split);
    let mut h = 0;
    // Interleaved, so that the measured spread is 1:1 from the start.
    for _ in 0..16 {
        for j in 0..2 {
            let p = tr.prepare(j).unwrap();
            servers[j].enqueue(Nanos(0), Request::new(ids[j][0], h).piggyback(p)).unwrap();
            servers[j].enqueue(Nanos(0), Request::new(ids[j][1], h + 1)).unwrap();
            h += 2;
        }
    }
    let mut resv = 0u64;
    let mut total = 0u64;
    for step in 0..40_000u64 {
        let now = Nanos(step * 500_000);
        for j in 0..2 {
            let Poll::Dispatch(d) = servers[j].poll(now, true) else { panic!() };
            if d.tenant == ids[j][0] {
                if step >= 4000 {
                    total += 1;
                    resv += (d.phase == Phase::Reservation) as u64;
                }
                tr.complete(j, d.phase, d.cost).unwrap();
                let p = tr.prepare(j).unwrap();
                servers[j].enqueue(now, Request::new(ids[j][0], h).piggyback(p)).unwrap();
            } else {
                servers[j].enqueue(now, Request::new(ids[j][1], h)).unwrap();
            }
            h += 1;
        }
    }
    let secs = 36_000.0 * 0.0005;
    (resv as f64 / secs, total as f64 / secs)
}

#[test]
fn rho_counts_reservation_service_elsewhere() {
    // Globally: capacity 4,000 shared by the reserved tenant (weight 1, counted across both servers through
    // delta) and one weight-1 tenant per server: 4,000 / 3 = 1,333 each. That exceeds r, so the tenant is
    // proportional, and its reservation-phase service must total r = 1,000/s across both servers (rho),
    // not 1,000 per server.
    let (resv_rate, total) = reserved_on_two(ReservationSplit::Rho);
    assert!((resv_rate - 1000.0).abs() <= 30.0, "reservation-phase rate {resv_rate}");
    assert!((total - 4000.0 / 3.0).abs() <= 20.0, "total {total}");
}

#[test]
fn spread_charges_half_the_reservation_at_each_server() {
    // The same under the spread (share 1/2 at each server): each server owes r/2 = 500. A weight-phase
    // dispatch keeps its estimated rho (one IO elsewhere) in the R tag, so with w weight-phase and x
    // reservation-phase IOs per second at a server, x + w = 667 and x + w/2 = 500: x = 333, so 667/s in
    // the reservation phase over both servers. The total is the weight share, as under rho.
    let (resv_rate, total) = reserved_on_two(ReservationSplit::default());
    assert!((resv_rate - 2000.0 / 3.0).abs() <= 30.0, "reservation-phase rate {resv_rate}");
    assert!((total - 4000.0 / 3.0).abs() <= 20.0, "total {total}");
}

/// Regression (found by the RBFQ Fig. 13 DT-FQ reproduction): a dispatch reports the request's own cost,
/// not cost + delta, for every scheduler, or a tracker fed with it compounds delta geometrically.
#[test]
fn dispatch_cost_excludes_delta() {
    for kind in rein_core::SchedulerKind::ALL {
        let mut s = kind.build(SchedConfig::default());
        let a = s.add_tenant(QosSpec::weighted(1.0).unwrap()).unwrap();
        let p = Piggyback {
            delta: rein_core::Cost::units(7),
            rho: rein_core::Cost::units(3),
            share: rein_core::ReservationShare::ONE,
            pool_busy: false,
        };
        s.enqueue(Nanos(0), Request::new(a, 1).piggyback(p)).unwrap();
        let Poll::Dispatch(d) = s.poll(Nanos(0), true) else { panic!() };
        assert_eq!(d.cost, rein_core::Cost::ONE, "{kind}");
    }
}

/// [`common::served_in_a_row`] with A (weight 1) and B (weight `b_weight`), a delta of 1 on A's requests
/// (its pool also runs elsewhere). During the gap A's IOs are all at other servers, where it completes
/// `elsewhere` IOs; A's first returning request says whether its pool stayed busy (`busy`: its tracker's
/// flag) and carries `elsewhere` as its delta.
fn served_in_a_row(config: SchedConfig, b_weight: f64, gap_ms: u64, elsewhere: u64, busy: bool) -> u64 {
    let mut s = Mclock::dmclock(config);
    let a = s.add_tenant(QosSpec::weighted(1.0).unwrap()).unwrap();
    let b = s.add_tenant(QosSpec::weighted(b_weight).unwrap()).unwrap();
    let delta = |n: u64| Piggyback { delta: Cost::units(n), ..Default::default() };
    common::served_in_a_row(
        &mut s,
        (a, b),
        gap_ms,
        |h| Request::new(a, h).piggyback(delta(1)),
        |i, h| match i {
            0 => Request::new(a, h).piggyback(Piggyback { pool_busy: busy, ..delta(elsewhere) }),
            _ => Request::new(a, h),
        },
    )
}

/// Engine invariant 6, "Pools that move" (`SchedConfig::pool_return`): a tenant whose requests carry a
/// delta, whose pool stayed busy (the tracker's flag) and whose queue emptied less than the window ago
/// keeps its P tag, so the service B got alone
/// while A's pool was elsewhere, less what A got elsewhere, is A's to take back here: with equal weights,
/// `gap - elsewhere` IOs (one IO of slack either way: B's head tag at the return). At most `lag_ios` of
/// A's own IOs behind B. A pool that emptied (A was idle), a gap longer than the window, or the paper's
/// rule, re-bases A to virtual time (then A and B alternate: at most 1 in a row).
#[test]
fn a_pool_that_moved_keeps_its_lag_within_the_bound() {
    let rein = SchedConfig::default();
    let p = rein.pool_return.expect("on by default");
    assert_eq!((p.window, p.lag_ios), (Nanos::from_millis(100), 256));
    let near = |got: u64, want: u64| got.abs_diff(want) <= 1;
    let got = served_in_a_row(rein, 1.0, 50, 0, true);
    assert!(near(got, 50), "gap 50 ms, nothing elsewhere: {got} in a row, want 50");
    let got = served_in_a_row(rein, 1.0, 50, 20, true);
    assert!(near(got, 30), "gap 50 ms, 20 IOs elsewhere: {got} in a row, want 30");
    let got = served_in_a_row(rein, 1.0, 50, 80, true);
    assert!(got <= 1, "more elsewhere than B got here: no lag, {got} in a row");
    // B at weight 0.1: each of its IOs is 10 of A's, so 90 ms alone is 900 of A's IOs; the bound keeps 256.
    let got = served_in_a_row(rein, 0.1, 90, 0, true);
    assert!(near(got, 256), "lag beyond the bound: {got} in a row, want 256");
    // Idleness, not a pool that moved: the tracker says the pool emptied; re-based as in the paper.
    let got = served_in_a_row(rein, 1.0, 50, 0, false);
    assert!(got <= 1, "pool emptied during the gap: {got} in a row");
    // A gap longer than the window: re-based as in the paper.
    let got = served_in_a_row(rein, 1.0, 150, 0, true);
    assert!(got <= 1, "gap 150 ms (over the window): {got} in a row");
    // The paper's rule, and the setting off: every return re-based.
    for config in [SchedConfig::paper(), SchedConfig { pool_return: None, ..rein }] {
        let got = served_in_a_row(config, 1.0, 50, 0, true);
        assert!(got <= 1, "pool_return off: {got} in a row");
    }
    // A shorter window and a smaller bound are honoured.
    let small = SchedConfig { pool_return: Some(PoolReturn { window: Nanos::from_millis(40), lag_ios: 10 }), ..rein };
    assert!(served_in_a_row(small, 1.0, 50, 0, true) <= 1, "gap 50 ms over a 40 ms window");
    let got = served_in_a_row(small, 1.0, 30, 0, true);
    assert!(near(got, 10), "bound 10: {got} in a row");
}
