//! The papers' worked examples, exactly.
mod common;

use rein_core::oracle::critical_capacities;
use rein_core::units::step_for_rate;
use rein_core::{Nanos, Phase, Poll, QosSpec, Rbfq, Request, SchedConfig, Scheduler, Tag};

const MS: u64 = 1_000_000;

/// rbfq-repair.txt §3.1 example and Table 3: M1 = 20, M2 = 40 IOPS, w1:w2 = 3:1, C = 100 IOPS.
#[test]
fn rbfq_table_3_schedule_and_tags() {
    let mut s = Rbfq::new(SchedConfig::default());
    let c1 = s.add_tenant(QosSpec::new(20.0, None, 3.0, 0).unwrap()).unwrap();
    let c2 = s.add_tenant(QosSpec::new(40.0, None, 1.0, 0).unwrap()).unwrap();
    for h in 0..64 {
        s.enqueue(Nanos(0), Request::new(c1, h)).unwrap();
        s.enqueue(Nanos(0), Request::new(c2, 1000 + h)).unwrap();
    }
    // Table 3 as printed (tags at assignment): local in ms, global in units of 1 s ("1/w" with w in IOPS).
    let local = [[0u64, 50, 100, 150, 200], [0, 25, 50, 75, 100]];
    let global = [[0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0, 4.0 / 3.0], [0.0, 1.0, 2.0, 3.0, 4.0]];
    let gstep = [step_for_rate(3.0), step_for_rate(1.0)];
    let lstep = [step_for_rate(20.0), step_for_rate(40.0)];
    let ids = [c1, c2];
    // Record each client's head tags as requests become heads, and every dispatch.
    let mut seen: [Vec<(Tag, Tag)>; 2] = [vec![], vec![]];
    let mut global_served = [0u64; 2];
    let mut reductions_at_head: [Vec<u64>; 2] = [vec![], vec![]];
    let mut log = vec![];
    let mut now = 0u64;
    for _ in 0..100 {
        for i in 0..2 {
            let (l, _u, g) = s.head_tags(ids[i]).unwrap().unwrap();
            // A new head request: one more than the client has had dispatched.
            if seen[i].len() < (s.stats(ids[i]).unwrap().total_dispatched() + 1) as usize {
                seen[i].push((l, g));
                reductions_at_head[i].push(global_served[i]);
            }
        }
        match s.poll(Nanos(now), true) {
            Poll::Dispatch(d) => {
                let i = if d.tenant == c1 { 0 } else { 1 };
                if d.phase == Phase::Weight {
                    global_served[i] += 1;
                }
                log.push((now / MS, i + 1, d.phase));
                now += 10 * MS; // C = 100 IOPS
            }
            other => panic!("backlogged clients, got {other:?}"),
        }
    }
    // The schedule narrated in §3.1: c1 local, c2 local, c1 global, c2 local, c1 global, then it repeats.
    let expect = [
        (0, 1, Phase::Reservation),
        (10, 2, Phase::Reservation),
        (20, 1, Phase::Weight),
        (30, 2, Phase::Reservation),
        (40, 1, Phase::Weight),
        (50, 1, Phase::Reservation),
        (60, 2, Phase::Reservation),
        (70, 1, Phase::Weight),
        (80, 2, Phase::Reservation),
        (90, 1, Phase::Weight),
    ];
    assert_eq!(&log[..10], &expect[..]);
    for i in 0..2 {
        for k in 0..5 {
            let (l, g) = seen[i][k];
            // Global tags exactly as in Table 3.
            assert_eq!(g, Tag(k as u128 * gstep[i]), "client {} request {} global tag", i + 1, k + 1);
            assert!((g.as_secs_f64() - global[i][k]).abs() < 1e-9);
            // Local tags as in Table 3 less 1/M for each global-phase dispatch before (the text: "requests
            // 3, 4, 5 etc have tags 50, 100, 150" after c1's first global dispatch).
            let want = Tag::from_nanos(Nanos(local[i][k] * MS)).0 - reductions_at_head[i][k] as u128 * lstep[i];
            assert!(l.0.abs_diff(want) <= 1, "client {} request {} local tag {l:?} want {want}", i + 1, k + 1);
        }
    }
    // 60 / 40 IOPS over the second.
    let per_client = |c: usize| log.iter().filter(|e| e.1 == c).count();
    assert_eq!((per_client(1), per_client(2)), (60, 40));
}

#[test]
fn rbfq_section_3_critical_capacities() {
    let (_, c) = critical_capacities(&[120.0, 75.0, 50.0, 25.0], &[20.0, 5.0, 10.0, 1.0]);
    assert_eq!(c, vec![270.0, 280.0, 550.0, 900.0]);
}

/// mClock §2.1 on a real scheduler: T = 1200 gives RD/OLTP/DM 250/380/570 IOPS.
#[test]
fn mclock_section_2_1_served() {
    let specs = [
        QosSpec::new(250.0, None, 1.0, 0).unwrap(),
        QosSpec::new(250.0, None, 2.0, 0).unwrap(),
        QosSpec::new(0.0, Some(1000.0), 3.0, 0).unwrap(),
    ];
    for (t, want) in [
        (1200.0, [250.0, 380.0, 570.0]),
        (500.0, [250.0, 250.0, 0.0]),
        (875.0, [250.0, 250.0, 375.0]),
        (1500.0, [250.0, 500.0, 750.0]),
        (2000.0, [1000.0 / 3.0, 2000.0 / 3.0, 1000.0]),
    ] {
        for (kind, mut s) in common::qos_schedulers() {
            let (run, expect) = common::run_vs_oracle(s.as_mut(), &specs, &[(Nanos(0), t)], Nanos::from_secs(100));
            for i in 0..3 {
                assert!((expect[i] - want[i] * 100.0).abs() < 1e-6);
                let got = run.served[i] as f64 / 100.0;
                assert!(
                    (got - want[i]).abs() <= want[i] * 0.005 + 0.03,
                    "{kind} T={t} tenant {i}: {got} IOPS, want {}",
                    want[i]
                );
            }
        }
    }
}
