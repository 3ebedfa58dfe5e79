//! Bad input has a defined result for every scheduler: an error or documented behaviour, never a panic or
//! a hang.
use proptest::prelude::*;
use rein_core::{
    Cost, CostModel, LimitMode, Limits, Nanos, Poll, PoolReturn, QosSpec, Rbfq, Request, ReservationLag, SchedConfig,
    SchedError, Scheduler, SchedulerKind, TenantId,
};
use std::collections::HashSet;

fn each(config: SchedConfig) -> Vec<Box<dyn Scheduler>> {
    SchedulerKind::ALL.iter().map(|k| k.build(config)).collect()
}

#[test]
fn unknown_and_stale_tenants_are_errors() {
    for mut s in each(SchedConfig::default()) {
        let a = s.add_tenant(QosSpec::default()).unwrap();
        s.enqueue(Nanos(0), Request::new(a, 1)).unwrap();
        s.enqueue(Nanos(0), Request::new(a, 2)).unwrap();
        assert_eq!(s.remove_tenant(a).unwrap(), vec![1, 2], "{:?}: queued handles come back", s.kind());
        assert_eq!(s.queued(), 0);
        assert_eq!(s.enqueue(Nanos(0), Request::new(a, 3)), Err(SchedError::UnknownTenant(a)));
        assert_eq!(s.remove_tenant(a), Err(SchedError::UnknownTenant(a)));
        assert!(s.stats(a).is_err() && s.spec(a).is_err());
        assert_eq!(s.set_spec(a, QosSpec::default()), Err(SchedError::UnknownTenant(a)));
        let b = s.add_tenant(QosSpec::default()).unwrap();
        assert_eq!(b.index(), a.index(), "slot reused");
        assert_ne!(a, b, "but the stale id stays unknown");
        assert_eq!(s.enqueue(Nanos(0), Request::new(a, 4)), Err(SchedError::UnknownTenant(a)));
        assert_eq!(s.poll(Nanos(0), true), Poll::Empty);
    }
}

#[test]
fn time_going_backwards_is_clamped_and_counted() {
    for mut s in each(SchedConfig::default()) {
        let a = s.add_tenant(QosSpec::new(10.0, Some(10.0), 1.0, 0).unwrap()).unwrap();
        s.enqueue(Nanos::from_secs(100), Request::new(a, 1)).unwrap();
        s.enqueue(Nanos::from_secs(5), Request::new(a, 2)).unwrap();
        assert!(matches!(s.poll(Nanos::from_secs(1), true), Poll::Dispatch(_)));
        assert!(s.time_regressions() >= 1, "{:?}", s.kind());
        // The second request is not released early by the stale clock (limit 10/s).
        if matches!(s.kind(), SchedulerKind::Mclock | SchedulerKind::Dmclock | SchedulerKind::Rbfq) {
            match s.poll(Nanos::from_secs(2), true) {
                Poll::Wait(t) => assert!(t > Nanos::from_secs(100), "{:?} wait {t}", s.kind()),
                other => panic!("{:?}: {other:?}", s.kind()),
            }
        }
    }
}

#[test]
fn zero_and_huge_costs_are_clamped() {
    let config = SchedConfig { cost_model: CostModel::BYTES, ..Default::default() };
    for mut s in each(config) {
        // 1 MB/s limit; a zero-size request costs the minimum, a huge one the maximum.
        let a = s.add_tenant(QosSpec::new(0.0, Some(1e6), 1.0, 0).unwrap()).unwrap();
        let b = s.add_tenant(QosSpec::new(0.0, None, 1.0, 0).unwrap()).unwrap();
        s.enqueue(Nanos(0), Request::new(a, 1).size(u64::MAX)).unwrap();
        s.enqueue(Nanos(0), Request::new(a, 2).size(0)).unwrap();
        for h in 0..1000 {
            s.enqueue(Nanos(0), Request::new(b, 10 + h).size(0)).unwrap();
        }
        let mut n = 0;
        loop {
            match s.poll(Nanos(1), true) {
                Poll::Dispatch(_) => n += 1,
                Poll::Wait(t) => {
                    // a's huge request pushed its limit tag ~2^40 bytes / 1 MB/s = 12.7 days out.
                    assert!(t > Nanos::from_secs(86_400), "{:?}: {t}", s.kind());
                    break;
                }
                Poll::Empty => break,
            }
            assert!(n <= 1002, "no hang");
        }
        assert!(n >= 1001, "{:?}: zero-cost requests still dispatch ({n})", s.kind());
    }
}

#[test]
fn bounds_hold_and_leave_state_unchanged() {
    let limits = Limits { max_tenants: 3, max_queued_per_tenant: 4, max_queued: 10 };
    for mut s in each(SchedConfig { limits, ..Default::default() }) {
        let ids: Vec<_> = (0..3).map(|_| s.add_tenant(QosSpec::default()).unwrap()).collect();
        assert_eq!(s.add_tenant(QosSpec::default()), Err(SchedError::TooManyTenants { max: 3 }));
        for h in 0..4 {
            s.enqueue(Nanos(0), Request::new(ids[0], h)).unwrap();
        }
        assert_eq!(
            s.enqueue(Nanos(0), Request::new(ids[0], 9)),
            Err(SchedError::TenantQueueFull { tenant: ids[0], max: 4 })
        );
        for h in 0..4 {
            s.enqueue(Nanos(0), Request::new(ids[1], h)).unwrap();
        }
        s.enqueue(Nanos(0), Request::new(ids[2], 0)).unwrap();
        s.enqueue(Nanos(0), Request::new(ids[2], 1)).unwrap();
        assert_eq!(s.enqueue(Nanos(0), Request::new(ids[2], 2)), Err(SchedError::QueueFull { max: 10 }));
        assert_eq!(s.queued(), 10);
        let mut n = 0;
        while let Poll::Dispatch(_) = s.poll(Nanos(0), true) {
            n += 1;
        }
        assert_eq!(n, 10, "{:?}", s.kind());
    }
}

#[test]
fn maintain_erases_long_idle_tenants() {
    let config = SchedConfig {
        erase_age: Some(Nanos::from_secs(60)),
        idle_age: Some(Nanos::from_secs(10)),
        ..Default::default()
    };
    for kind in [SchedulerKind::Mclock, SchedulerKind::Rbfq] {
        let mut s = kind.build(config);
        let a = s.add_tenant(QosSpec::default()).unwrap();
        let b = s.add_tenant(QosSpec::default()).unwrap();
        s.enqueue(Nanos(0), Request::new(a, 1)).unwrap();
        s.enqueue(Nanos(0), Request::new(b, 2)).unwrap();
        assert!(matches!(s.poll(Nanos(0), true), Poll::Dispatch(_)));
        assert_eq!(s.maintain(Nanos::from_secs(30)), 0);
        // b still has a queued request: never erased; a went idle at t=0 and is erased at 60 s.
        let erased = s.maintain(Nanos::from_secs(61));
        let (gone, kept) = if s.stats(a).is_err() { (a, b) } else { (b, a) };
        assert_eq!(erased, 1);
        assert!(s.stats(kept).is_ok() && s.stats(gone).is_err());
        assert_eq!(s.tenant_count(), 1);
    }
}

#[test]
fn runtime_respecification_takes_effect() {
    for kind in [SchedulerKind::Mclock, SchedulerKind::Rbfq] {
        let mut s = kind.build(SchedConfig::default());
        let a = s.add_tenant(QosSpec::default()).unwrap();
        for h in 0..1000 {
            s.enqueue(Nanos(0), Request::new(a, h)).unwrap();
        }
        // Unlimited: all due now. Then limit to 10 IOPS: the next one waits ~100 ms.
        assert!(matches!(s.poll(Nanos(0), true), Poll::Dispatch(_)));
        s.set_spec(a, QosSpec::new(0.0, Some(10.0), 1.0, 0).unwrap()).unwrap();
        assert_eq!(s.spec(a).unwrap().limit(), Some(10.0));
        let mut n = 0;
        let mut now = Nanos(0);
        for _ in 0..100 {
            match s.poll(now, true) {
                Poll::Dispatch(_) => n += 1,
                Poll::Wait(t) => now = t,
                Poll::Empty => break,
            }
            if now > Nanos::from_secs(1) {
                break;
            }
        }
        assert!((9..=12).contains(&n), "{kind}: {n} dispatches in ~1 s at 10 IOPS");
        // And back to unlimited with a reservation.
        s.set_spec(a, QosSpec::new(5.0, None, 2.0, 0).unwrap()).unwrap();
        assert!(matches!(s.poll(now, true), Poll::Dispatch(_)));
    }
}

/// Operations with the extremes every input accepts: rates and weights at their bounds, sizes and deltas
/// of 0 and u64::MAX, polls at huge steps, pool return with an endless window.
#[derive(Debug, Clone)]
enum Op {
    Add(QosSpec),
    /// Tenant, size, delta (rho is half of it), pool busy, pending here.
    Enqueue(usize, u64, u64, bool, bool),
    Poll(u64, bool),
    SetSpec(usize, QosSpec),
    Remove(usize),
    Maintain(u64),
    SetConfig(u8),
}

fn extreme_spec() -> impl Strategy<Value = QosSpec> {
    let rate = prop_oneof![Just(1e-3), Just(1e12), Just(1.0), 1e-3f64..1e12];
    let weight = prop_oneof![Just(1e-3), Just(1e6), Just(1.0), 1e-3f64..1e6];
    (prop::option::of(rate.clone()), prop::option::of(rate), weight, 0u32..=256).prop_map(|(r, l, w, sigma)| {
        let r = r.unwrap_or(0.0);
        QosSpec::new(r, l.map(|l| l.max(r)), w, sigma).unwrap()
    })
}

fn extreme_op() -> impl Strategy<Value = Op> {
    let big = || prop_oneof![Just(0u64), Just(u64::MAX), 0u64..1 << 20];
    prop_oneof![
        1 => extreme_spec().prop_map(Op::Add),
        4 => (0usize..6, big(), big(), any::<bool>(), any::<bool>())
            .prop_map(|(t, size, delta, busy, here)| Op::Enqueue(t, size, delta, busy, here)),
        4 => (prop_oneof![Just(0u64), 0u64..1_000_000_000, Just(u64::MAX / 2)], any::<bool>())
            .prop_map(|(dt, idle)| Op::Poll(dt, idle)),
        1 => (0usize..6, extreme_spec()).prop_map(|(t, spec)| Op::SetSpec(t, spec)),
        1 => (0usize..6).prop_map(Op::Remove),
        1 => (0u64..1_000_000_000).prop_map(Op::Maintain),
        1 => (0u8..6).prop_map(Op::SetConfig),
    ]
}

fn extreme_config(i: u8) -> SchedConfig {
    let d = SchedConfig::default();
    match i {
        0 => d,
        1 => SchedConfig::paper(),
        2 => SchedConfig { cost_model: CostModel::BYTES, limit_mode: LimitMode::BreakWhenIdle, ..d },
        3 => SchedConfig { batch: 4, idle_age: Some(Nanos(1000)), erase_age: Some(Nanos(5000)), ..d },
        4 => SchedConfig {
            reservation_lag: ReservationLag::Unbounded,
            limit_burst_ios: Some(0),
            weight_lead_ios: Some(0),
            ..d
        },
        _ => SchedConfig {
            cost_model: CostModel::paper_disk(),
            pool_return: Some(PoolReturn { window: Nanos::MAX, lag_ios: u32::MAX }),
            ..d
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
    /// Review 1's fuzz: whatever accepted values come, the tag schedulers never panic, never lose or
    /// repeat a request, never ask to wait for a time already here, and drain what they hold.
    #[test]
    fn extreme_accepted_values_neither_panic_nor_lose_nor_stall(
        kind in 0usize..4, config in 0u8..6, ops in prop::collection::vec(extreme_op(), 1..300),
    ) {
        let config = extreme_config(config);
        let mut s: Box<dyn Scheduler> = match kind {
            0 => SchedulerKind::Dmclock.build(config),
            1 => SchedulerKind::Rbfq.build(config),
            2 => Box::new(Rbfq::with_byte_limit(config)),
            _ => SchedulerKind::Sfq.build(config),
        };
        let mut ids: Vec<TenantId> = vec![];
        let mut live: HashSet<u64> = HashSet::new();
        let (mut now, mut handle) = (0u64, 0u64);
        for op in ops {
            match op {
                Op::Add(spec) => ids.extend(s.add_tenant(spec).ok()),
                Op::Enqueue(t, size, delta, busy, here) => {
                    let Some(&id) = ids.get(t % ids.len().max(1)) else { continue };
                    let mut r = Request::new(id, handle).size(size).pending_here(here);
                    (r.delta, r.rho, r.pool_busy) = (Cost(delta), Cost(delta / 2), busy);
                    if s.enqueue(Nanos(now), r).is_ok() {
                        live.insert(handle);
                    }
                    handle += 1;
                }
                Op::Poll(dt, idle) => {
                    now = now.saturating_add(dt);
                    match s.poll(Nanos(now), idle) {
                        Poll::Dispatch(d) => prop_assert!(live.remove(&d.handle), "{} twice or unknown", d.handle),
                        Poll::Wait(t) => prop_assert!(t > Nanos(now) || t == Nanos::MAX, "Wait({t:?}) at {now}"),
                        Poll::Empty => prop_assert_eq!(s.queued(), 0),
                    }
                }
                Op::SetSpec(t, spec) => {
                    if let Some(&id) = ids.get(t % ids.len().max(1)) {
                        let _ = s.set_spec(id, spec);
                    }
                }
                Op::Remove(t) => {
                    if !ids.is_empty() {
                        let id = ids.remove(t % ids.len());
                        for h in s.remove_tenant(id).unwrap_or_default() {
                            prop_assert!(live.remove(&h));
                        }
                    }
                }
                Op::Maintain(dt) => {
                    now = now.saturating_add(dt);
                    s.maintain(Nanos(now));
                    ids.retain(|id| s.stats(*id).is_ok());
                }
                Op::SetConfig(c) => s.set_config(extreme_config(c)),
            }
            prop_assert_eq!(s.queued(), live.len());
        }
        // Drain, jumping to each time asked for: everything comes out unless held by a limit past the
        // end of the clock.
        for _ in 0..100_000 {
            match s.poll(Nanos(now), true) {
                Poll::Dispatch(d) => prop_assert!(live.remove(&d.handle)),
                Poll::Wait(t) if t < Nanos::MAX => {
                    prop_assert!(t > Nanos(now));
                    now = t.0;
                }
                Poll::Wait(_) | Poll::Empty => break,
            }
        }
    }
}
