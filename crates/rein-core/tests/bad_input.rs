//! Bad input has a defined result for every scheduler: an error or documented behaviour, never a panic or
//! a hang.
use rein_core::{CostModel, Limits, Nanos, Poll, QosSpec, Request, SchedConfig, SchedError, Scheduler, SchedulerKind};

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
