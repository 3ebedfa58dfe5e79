//! The dispatcher on tokio's paused (virtual) clock: QoS over the modelled device, data integrity, errors.
use rein_core::oracle::{allocate, OracleTenant};
use rein_core::{QosSpec, SchedulerKind};
use rein_model::device::{CapacityStep, DeviceSpec, ServiceModel};
use rein_proto::ErrorKind;
use rein_runtime::{
    DeviceConfig, DispatchConfig, Dispatcher, FileStorage, IoEngine, IoError, IoRequest, MemStorage, Op, Storage,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Three closed-loop tenants (32 outstanding each) for `secs` virtual seconds; returns IOPS per tenant.
async fn run(kind: SchedulerKind, specs: &[QosSpec], capacity: f64, secs: u64) -> Vec<f64> {
    let storage: Arc<dyn rein_runtime::Storage> = Arc::new(MemStorage::new(1 << 30));
    let device = DeviceConfig {
        spec: DeviceSpec::new(capacity, ServiceModel::Exponential).unwrap(),
        seed: 3,
        stream: 0,
        service_scale: Vec::new(),
    };
    let (d, join) = Dispatcher::spawn(Some(device), DispatchConfig { scheduler: kind, ..paused() });
    let counts: Vec<Arc<AtomicU64>> = specs.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    let warm = tokio::time::Instant::now() + Duration::from_secs(1);
    let mut tasks = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let id = d.add_tenant(*spec).await.unwrap();
        for k in 0..32u64 {
            let (d, c, st) = (d.clone(), counts[i].clone(), storage.clone());
            tasks.push(tokio::spawn(async move {
                let mut off = k * 4096;
                while tokio::time::Instant::now() < deadline {
                    let r = d
                        .io(IoRequest {
                            storage: st.clone(),
                            tenant: id,
                            offset: off % (1 << 30),
                            op: Op::read(4096),
                            fua: false,
                            piggyback: None,
                        })
                        .await;
                    assert!(r.is_ok());
                    if tokio::time::Instant::now() > warm && tokio::time::Instant::now() <= deadline {
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                    off += 32 * 4096;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    drop(d);
    join.await.unwrap();
    counts.iter().map(|c| c.load(Ordering::Relaxed) as f64 / (secs - 1) as f64).collect()
}

/// The dispatcher's defaults without the timerfd: these tests pause tokio's clock, and the timerfd's real
/// wake-ups would keep it from advancing by itself (`DispatchConfig::precise_timer`).
fn paused() -> DispatchConfig {
    DispatchConfig { precise_timer: false, ..DispatchConfig::default() }
}

fn paper_specs() -> Vec<QosSpec> {
    vec![
        QosSpec::new(250.0, None, 1.0, 0).unwrap(),
        QosSpec::new(250.0, None, 2.0, 0).unwrap(),
        QosSpec::new(0.0, Some(1000.0), 3.0, 0).unwrap(),
    ]
}

#[tokio::test(start_paused = true)]
async fn mclock_over_the_device_model_meets_the_oracle() {
    let specs = paper_specs();
    let got = run(SchedulerKind::Mclock, &specs, 1200.0, 21).await;
    let want = allocate(&specs.iter().map(OracleTenant::from).collect::<Vec<_>>(), got.iter().sum()).rates;
    for i in 0..3 {
        assert!((got[i] - want[i]).abs() <= want[i] * 0.03, "tenant {i}: {got:?} vs oracle {want:?}");
    }
    assert!((got[0] - 250.0).abs() <= 250.0 * 0.03, "RD reservation: {got:?}");
}

#[tokio::test(start_paused = true)]
async fn fifo_over_the_same_device_misses_the_reservation() {
    // At 600 IOPS mClock gives RD and OLTP their 250 each (DM the last 100); FIFO shares by arrival order,
    // about 200 each, and RD's reservation is missed.
    let specs = paper_specs();
    let fifo = run(SchedulerKind::Fifo, &specs, 600.0, 11).await;
    assert!(fifo[0] < 225.0 && (fifo[0] - fifo[2]).abs() < 30.0, "FIFO: {fifo:?}");
    let mclock = run(SchedulerKind::Mclock, &specs, 600.0, 11).await;
    assert!(mclock[0] > 242.0 && mclock[1] > 242.0 && mclock[2] < 120.0, "mClock: {mclock:?}");
}

#[tokio::test(start_paused = true)]
async fn data_round_trips_and_errors_are_answered() {
    let storage: Arc<dyn rein_runtime::Storage> = Arc::new(MemStorage::new(1 << 20));
    let (d, join) = Dispatcher::spawn(None, paused());
    let id = d.add_tenant(QosSpec::default()).await.unwrap();
    let data: Vec<u8> = (0..8192).map(|i| (i % 253) as u8).collect();
    d.io(IoRequest {
        storage: storage.clone(),
        tenant: id,
        offset: 4096,
        op: Op::Write { data: data.clone() },
        fua: true,
        piggyback: None,
    })
    .await
    .unwrap();
    let back = d
        .io(IoRequest {
            storage: storage.clone(),
            tenant: id,
            offset: 4096,
            op: Op::read(8192),
            fua: false,
            piggyback: None,
        })
        .await
        .unwrap();
    assert_eq!(back, data);
    let e = d
        .io(IoRequest {
            storage: storage.clone(),
            tenant: id,
            offset: 1 << 20,
            op: Op::read(1),
            fua: false,
            piggyback: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "out of range is an invalid request: {e}");
    // The tenant still works after the error.
    d.io(IoRequest { storage: storage.clone(), tenant: id, offset: 0, op: Op::Flush, fua: false, piggyback: None })
        .await
        .unwrap();
    // A tenant id this dispatcher never issued (slot 1 of another dispatcher) is refused with EINVAL.
    let (other, j2) = Dispatcher::spawn(None, paused());
    let _ = other.add_tenant(QosSpec::default()).await.unwrap();
    let foreign = other.add_tenant(QosSpec::default()).await.unwrap();
    drop(other);
    j2.await.unwrap();
    let e = d
        .io(IoRequest {
            storage: storage.clone(),
            tenant: foreign,
            offset: 0,
            op: Op::read(1),
            fua: false,
            piggyback: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(e, IoError::Refused(_)) && e.kind() == ErrorKind::InvalidRequest, "{e}");
    let snap = d.snapshot().await.unwrap();
    assert_eq!(snap.tenants.len(), 1);
    assert_eq!(snap.tenants[0].counters.completed.iter().sum::<u64>(), 3, "write, read, flush");
    assert_eq!(snap.tenants[0].counters.errors, 1, "the out-of-range read");
    drop(d);
    join.await.unwrap();
    assert_eq!(IoError::Shutdown.kind(), ErrorKind::Shutdown);
}

/// A snapshot of some tenants holds those still known, in the order asked, with what the whole snapshot
/// says of them; the whole one holds every tenant in the order added.
#[tokio::test(start_paused = true)]
async fn a_snapshot_of_some_tenants_holds_those_alone() {
    let (d, join) = Dispatcher::spawn(None, paused());
    let mut ids = Vec::new();
    for r in 0..5 {
        ids.push(d.add_tenant(QosSpec::new(f64::from(r), None, 1.0, 0).unwrap()).await.unwrap());
    }
    d.remove_tenant(ids[1]).await.unwrap();
    let all = d.snapshot().await.unwrap();
    assert_eq!(all.tenants.iter().map(|t| t.id).collect::<Vec<_>>(), [ids[0], ids[2], ids[3], ids[4]]);
    let some = d.snapshot_of(vec![ids[4], ids[1], ids[0]]).await.unwrap();
    assert_eq!(some.tenants.iter().map(|t| t.id).collect::<Vec<_>>(), [ids[4], ids[0]], "the removed one left out");
    assert_eq!(some.tenants.iter().map(|t| t.spec.reservation()).collect::<Vec<_>>(), [4.0, 0.0]);
    let none = d.snapshot_of(Vec::new()).await.unwrap();
    assert!(none.tenants.is_empty());
    assert_eq!((none.depth, none.capacity_iops), (all.depth, all.capacity_iops));
    drop(d);
    join.await.unwrap();
}

/// A modelled device of 200 IOPS, each IO 5 ms.
fn device_of_200_iops() -> DeviceConfig {
    DeviceConfig {
        spec: DeviceSpec::new(200.0, ServiceModel::Deterministic).unwrap(),
        seed: 3,
        stream: 0,
        service_scale: Vec::new(),
    }
}

/// 48 closed loops of 4 KiB reads by `tenant` for 6.5 s of the (paused) clock, each request with
/// `piggyback`: more outstanding than D (32), so the scheduler, not the device queue, decides the order.
fn reads_for_6500_ms(
    d: &Dispatcher,
    tenant: rein_core::TenantId,
    piggyback: Option<rein_core::Piggyback>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new(1 << 30));
    let deadline = tokio::time::Instant::now() + Duration::from_millis(6500);
    (0..48u64)
        .map(|k| {
            let (d, storage) = (d.clone(), storage.clone());
            tokio::spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    let (offset, op, fua) = (k * 4096, Op::read(4096), false);
                    let _ = d.io(IoRequest { storage: storage.clone(), tenant, offset, op, fua, piggyback }).await;
                }
            })
        })
        .collect()
}

/// The once-a-second measurements: IOPS of the last second, and seconds below reservation counted only for
/// a tenant that is backlogged and under-served (an infeasible reservation), never for the others.
#[tokio::test(start_paused = true)]
async fn seconds_below_reservation_and_iops_are_measured() {
    let (d, join) = Dispatcher::spawn(Some(device_of_200_iops()), paused());
    // 300 IOPS reserved on a 200 IOPS device: backlogged and below reservation every second.
    let starved = d.add_tenant(QosSpec::new(300.0, None, 1.0, 0).unwrap()).await.unwrap();
    // No reservation: never counted, however little it gets.
    let best_effort = d.add_tenant(QosSpec::new(0.0, None, 1.0, 0).unwrap()).await.unwrap();
    let mut tasks = reads_for_6500_ms(&d, starved, None);
    tasks.extend(reads_for_6500_ms(&d, best_effort, None));
    tokio::time::sleep(Duration::from_millis(6200)).await;
    let snap = d.snapshot().await.unwrap();
    let get = |id| snap.tenants.iter().find(|t| t.id == id).unwrap().counters.clone();
    let (s, b) = (get(starved), get(best_effort));
    assert!(
        (5..=6).contains(&s.below_reservation_s()),
        "starved tenant: {} s below reservation",
        s.below_reservation_s()
    );
    assert_eq!(b.below_reservation_s(), 0);
    assert!((s.iops_last_s + b.iops_last_s - 200.0).abs() <= 10.0, "IOPS {} + {}", s.iops_last_s, b.iops_last_s);
    assert!(s.iops_last_s >= 190.0, "all capacity goes to the reservation: {}", s.iops_last_s);
    // The backend histogram saw every completion, at the modelled latency (>= 5 ms per IO at 200 IOPS).
    let completed: u64 = snap.tenants.iter().map(|t| t.counters.completed.iter().sum::<u64>()).sum();
    assert_eq!(snap.backend.completed, completed);
    assert!(snap.backend.latency_sum_ns as f64 / completed as f64 >= 4.9e6);
    for t in tasks {
        t.await.unwrap();
    }
    drop(d);
    join.await.unwrap();
}

/// On a storage node a striped tenant's reservation is the cluster's: a tenant reserved 300 IOPS whose
/// node serves 200 (all it can) is below it only if this node owes it more than that. Each request says
/// which part of the reservation this server owes (its gateway's reservation share): half (150 IOPS; the
/// rest the other servers' part) and the node counts no second below; all of it, every second.
#[tokio::test(start_paused = true)]
async fn a_striped_tenants_reservation_is_judged_by_this_servers_part() {
    let half = rein_core::ReservationShare::from_ratio(1, 2);
    for (share, below) in [(half, 0..=0), (rein_core::ReservationShare::ONE, 5..=6)] {
        let (d, join) = Dispatcher::spawn(Some(device_of_200_iops()), paused());
        let id = d.add_tenant(QosSpec::new(300.0, None, 1.0, 0).unwrap()).await.unwrap();
        let tasks = reads_for_6500_ms(&d, id, Some(rein_core::Piggyback { share, ..Default::default() }));
        tokio::time::sleep(Duration::from_millis(6200)).await;
        let snap = d.snapshot().await.unwrap();
        let c = &snap.tenants.iter().find(|t| t.id == id).unwrap().counters;
        assert!(c.iops_last_s >= 190.0, "the node serves what it can: {}", c.iops_last_s);
        assert!(below.contains(&c.below_reservation_s()), "share {share:?}: {} s below", c.below_reservation_s());
        for t in tasks {
            t.await.unwrap();
        }
        drop(d);
        join.await.unwrap();
    }
}

/// Every route (the ring, inline, the blocking pool; file and RAM storage) reads into one buffer with the
/// asked-for headroom in front, writes what it is given, and refuses what the storage's checks refuse.
#[tokio::test]
async fn every_route_reads_after_the_headroom_and_checks_ranges() {
    let dir = tempfile::Builder::new().prefix("rein-dispatch-routes-").tempdir().unwrap();
    let file: Arc<dyn Storage> =
        Arc::new(FileStorage::open(&dir.path().join("disk.img"), Some(1 << 20), false).unwrap());
    let ram: Arc<dyn Storage> = Arc::new(MemStorage::new(1 << 20));
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    for engine in [IoEngine::Uring, IoEngine::Threads, IoEngine::Inline] {
        let (d, join) = Dispatcher::spawn(None, DispatchConfig { io_engine: engine, ..paused() });
        let id = d.add_tenant(QosSpec::default()).await.unwrap();
        for storage in [&file, &ram] {
            let io = |offset, op| IoRequest {
                storage: storage.clone(),
                tenant: id,
                offset,
                op,
                fua: false,
                piggyback: None,
            };
            d.io(io(4096, Op::Write { data: data.clone() })).await.unwrap();
            d.io(io(0, Op::Flush)).await.unwrap();
            let back = d.io(io(4096, Op::Read { len: 8192, headroom: 28 })).await.unwrap();
            assert_eq!(back.len(), 28 + 8192, "{engine:?}");
            assert!(back[..28].iter().all(|&b| b == 0), "{engine:?}: the headroom is left alone");
            assert_eq!(&back[28..], &data[..], "{engine:?}");
            // A large read takes the pool or the ring, never the dispatcher itself: same bytes.
            let big = d.io(io(0, Op::read(1 << 20))).await.unwrap();
            assert_eq!(&big[4096..4096 + 8192], &data[..], "{engine:?}");
            let e = d.io(io((1 << 20) - 10, Op::read(4096))).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{engine:?}: {e}");
        }
        drop(d);
        join.await.unwrap();
    }
    // A read-only file refuses writes on every route.
    let ro: Arc<dyn Storage> = Arc::new(FileStorage::open(&dir.path().join("disk.img"), None, true).unwrap());
    for engine in [IoEngine::Uring, IoEngine::Threads] {
        let (d, join) = Dispatcher::spawn(None, DispatchConfig { io_engine: engine, ..paused() });
        let id = d.add_tenant(QosSpec::default()).await.unwrap();
        let w = IoRequest {
            storage: ro.clone(),
            tenant: id,
            offset: 0,
            op: Op::Write { data: vec![1; 512] },
            fua: true,
            piggyback: None,
        };
        assert_eq!(d.io(w).await.unwrap_err().kind(), ErrorKind::ReadOnly, "{engine:?}");
        drop(d);
        join.await.unwrap();
    }
    dir.close().unwrap();
}

/// The device model's capacity schedule runs on the dispatcher's clock: a closed loop on a 1,000 IOPS
/// deterministic device that drops to 250 IOPS at 2 s completes 1,000 per second, then 250, and an
/// operator's change (to 500 at 4 s) holds until the next step (back to 1,000 at 6 s).
#[tokio::test(start_paused = true)]
async fn the_capacity_follows_the_schedule_and_the_operator() {
    let spec = DeviceSpec::scheduled(
        1000.0,
        ServiceModel::Deterministic,
        &[CapacityStep { at_s: 2.0, iops: 250.0 }, CapacityStep { at_s: 6.0, iops: 1000.0 }],
    )
    .unwrap();
    let storage: Arc<dyn rein_runtime::Storage> = Arc::new(MemStorage::new(1 << 20));
    let (d, join) =
        Dispatcher::spawn(Some(DeviceConfig { spec, seed: 1, stream: 0, service_scale: Vec::new() }), paused());
    let id = d.add_tenant(QosSpec::default()).await.unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (d, st, done) = (d.clone(), storage.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while tokio::time::Instant::now() < deadline {
                let r = d.io(IoRequest {
                    storage: st.clone(),
                    tenant: id,
                    offset: 0,
                    op: Op::read(512),
                    fua: false,
                    piggyback: None,
                });
                r.await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut per_second = Vec::new();
    let mut last = 0;
    for s in 1..=8u64 {
        tokio::time::sleep_until(deadline - Duration::from_secs(8 - s)).await;
        let n = done.load(Ordering::Relaxed);
        per_second.push(n - last);
        last = n;
        if s == 4 {
            d.set_capacity(500.0).await.unwrap();
        }
    }
    let want = [1000, 1000, 250, 250, 500, 500, 1000, 1000];
    for (got, want) in per_second.iter().zip(want) {
        assert!(got.abs_diff(want) <= 2, "per second {per_second:?}, want {want:?}");
    }
    assert!(d.set_capacity(-3.0).await.is_err());
    for t in tasks {
        t.await.unwrap();
    }
    drop(d);
    join.await.unwrap();
    let (none, j2) = Dispatcher::spawn(None, paused());
    assert!(matches!(none.set_capacity(100.0).await, Err(rein_runtime::dispatch::CapacityError::NoModel)));
    drop(none);
    j2.await.unwrap();
}

/// After a capacity drop below the sum of reservations, a tenant without a reservation is served again
/// within a second of the capacity's return (issue "Scheduler fidelity": before the bounded repayment it
/// got 0 IOPS for 6 s after a 60 s overload). The example: t1 r=300 w=1; t2 l=800 w=4; t3 r=200
/// l=250 w=2; t4 r=100 w=1, closed loops of 32, capacity 2,000, then 300 for 60 s, then 2,500. Expected
/// values: §2.1 under overload (300 shared 150/0/100/50), eq. (1) after it (725/800/250/725).
#[tokio::test(start_paused = true)]
async fn an_unreserved_tenant_is_served_again_within_a_second_after_an_overload() {
    let spec = DeviceSpec::scheduled(
        2000.0,
        ServiceModel::Deterministic,
        &[CapacityStep { at_s: 5.0, iops: 300.0 }, CapacityStep { at_s: 65.0, iops: 2500.0 }],
    )
    .unwrap();
    let specs = [
        QosSpec::new(300.0, None, 1.0, 0).unwrap(),
        QosSpec::new(0.0, Some(800.0), 4.0, 0).unwrap(),
        QosSpec::new(200.0, Some(250.0), 2.0, 0).unwrap(),
        QosSpec::new(100.0, None, 1.0, 0).unwrap(),
    ];
    let storage: Arc<dyn rein_runtime::Storage> = Arc::new(MemStorage::new(1 << 20));
    let (d, join) =
        Dispatcher::spawn(Some(DeviceConfig { spec, seed: 1, stream: 0, service_scale: Vec::new() }), paused());
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs(69);
    let counts: Vec<Arc<AtomicU64>> = specs.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut tasks = Vec::new();
    for (i, sp) in specs.iter().enumerate() {
        let id = d.add_tenant(*sp).await.unwrap();
        for _ in 0..32 {
            let (d, st, c) = (d.clone(), storage.clone(), counts[i].clone());
            tasks.push(tokio::spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    let r = d.io(IoRequest {
                        storage: st.clone(),
                        tenant: id,
                        offset: 0,
                        op: Op::read(512),
                        fua: false,
                        piggyback: None,
                    });
                    r.await.unwrap();
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    let snapshot = |at: u64| {
        let counts = counts.clone();
        async move {
            tokio::time::sleep_until(start + Duration::from_secs(at)).await;
            counts.iter().map(|c| c.load(Ordering::Relaxed) as f64).collect::<Vec<f64>>()
        }
    };
    let s55 = snapshot(55).await;
    let s65 = snapshot(65).await;
    let s66 = snapshot(66).await;
    let s69 = snapshot(69).await;
    let rate = |a: &[f64], b: &[f64], secs: f64| a.iter().zip(b).map(|(x, y)| (y - x) / secs).collect::<Vec<_>>();
    let over = rate(&s55, &s65, 10.0);
    for (i, want) in [150.0, 0.0, 100.0, 50.0].into_iter().enumerate() {
        assert!((over[i] - want).abs() <= 0.03 * want + 1.0, "under overload t{}: {over:?}", i + 1);
    }
    let first = rate(&s65, &s66, 1.0);
    let want = [725.0, 800.0, 250.0, 725.0];
    for i in 0..4 {
        assert!(first[i] >= 0.5 * want[i], "first second after the overload, t{}: {first:?}", i + 1);
    }
    let after = rate(&s66, &s69, 3.0);
    for i in 0..4 {
        assert!((after[i] - want[i]).abs() <= 0.03 * want[i], "seconds 1-4 after the overload, t{}: {after:?}", i + 1);
    }
    for t in tasks {
        t.await.unwrap();
    }
    drop(d);
    join.await.unwrap();
}

/// `service_scale` (placement skew): a tenant whose requests take twice the device's service time gets
/// half the IOPS of one that is not scaled, alone on the same device (deterministic, 1,000 IOPS, FIFO).
#[tokio::test(start_paused = true)]
async fn a_scaled_tenant_takes_its_multiple_of_the_service_time() {
    let storage: Arc<dyn rein_runtime::Storage> = Arc::new(MemStorage::new(1 << 30));
    let mut iops = Vec::new();
    for scale in [1.0, 2.0, 0.5] {
        let device = DeviceConfig {
            spec: DeviceSpec::new(1000.0, ServiceModel::Deterministic).unwrap(),
            seed: 3,
            stream: 0,
            service_scale: Vec::new(),
        };
        let (d, join) = Dispatcher::spawn(Some(device), DispatchConfig { depth: 1, ..paused() });
        let id = d.add_tenant(QosSpec::default()).await.unwrap();
        d.set_service_scale(id, scale).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(2000);
        let mut tasks = Vec::new();
        for k in 0..4u64 {
            let (d, st) = (d.clone(), storage.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while tokio::time::Instant::now() < deadline {
                    let r = IoRequest {
                        storage: st.clone(),
                        tenant: id,
                        offset: k * 4096,
                        op: Op::read(4096),
                        fua: false,
                        piggyback: None,
                    };
                    d.io(r).await.unwrap();
                    n += 1;
                }
                n
            }));
        }
        let mut n = 0;
        for t in tasks {
            n += t.await.unwrap();
        }
        iops.push(n as f64 / 2.0);
        drop(d);
        join.await.unwrap();
    }
    // 1,000 / scale IOPS: one request at a time, each scale / 1,000 s.
    for (got, want) in iops.iter().zip([1000.0, 500.0, 2000.0]) {
        assert!((got - want).abs() <= 0.02 * want, "IOPS {iops:?}, want 1000 / scale");
    }
}

/// A pShift node for the tests below: the token scheduler on a deterministic 100-IOPS device model with
/// `depth` outstanding, one unreserved tenant, and `loops` closed loops of 512-byte reads on it until
/// `secs` from now. Returns the dispatcher, its task, the tenant and the loops' tasks.
async fn pshift_node(
    depth: usize,
    loops: usize,
    secs: f64,
) -> (Dispatcher, tokio::task::JoinHandle<()>, rein_core::TenantId, Vec<tokio::task::JoinHandle<()>>) {
    let storage: Arc<dyn rein_runtime::Storage> = Arc::new(MemStorage::new(1 << 20));
    let device = DeviceConfig {
        spec: DeviceSpec::new(100.0, ServiceModel::Deterministic).unwrap(),
        seed: 1,
        stream: 0,
        service_scale: Vec::new(),
    };
    let config = DispatchConfig { scheduler: SchedulerKind::Token, depth, ..paused() };
    let (d, join) = Dispatcher::spawn(Some(device), config);
    let id = d.add_tenant(QosSpec::new(0.0, None, 1.0, 0).unwrap()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
    let tasks = (0..loops)
        .map(|_| {
            let (d, st) = (d.clone(), storage.clone());
            tokio::spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    d.io(read_512(&st, id)).await.unwrap();
                }
            })
        })
        .collect();
    (d, join, id, tasks)
}

/// A 512-byte read at offset 0 of `storage` for `tenant`.
fn read_512(storage: &Arc<dyn rein_runtime::Storage>, tenant: rein_core::TenantId) -> IoRequest {
    IoRequest { storage: storage.clone(), tenant, offset: 0, op: Op::read(512), fua: false, piggyback: None }
}

/// Waits for the loops, then for the dispatcher to drain.
async fn finish(d: Dispatcher, join: tokio::task::JoinHandle<()>, tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        t.await.unwrap();
    }
    drop(d);
    join.await.unwrap();
}

/// The link's welcome for a node whose tenant `id` is bucket 0.
fn attach(id: rein_core::TenantId) -> rein_runtime::dispatch::PshiftAttach {
    let (strays_to, _) = tokio::sync::mpsc::unbounded_channel();
    rein_runtime::dispatch::PshiftAttach {
        server: 0,
        strays: false,
        buckets: vec![(id, 0)],
        limited: vec![],
        strays_to,
    }
}

/// A pShift server's reports count the IOs in flight exactly when the controller's link comes up after
/// the first requests, and when requests are abandoned (their client gone): 16 closed loops on a
/// 100-IOPS device for 1 s, then the link, then 5 abandoned requests; the first report's `in_flight` is
/// at most the dispatcher's depth, not the second's dispatches before the link (about 100) nor the five.
#[tokio::test(start_paused = true)]
async fn pshift_reports_count_in_flight_ios_across_a_late_link_and_abandoned_requests() {
    use std::sync::atomic::AtomicBool;
    let (d, join, id, tasks) = pshift_node(4, 16, 3.0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    d.pshift_attach(attach(id)).await.unwrap();
    let storage: Arc<dyn rein_runtime::Storage> = Arc::new(MemStorage::new(1 << 20));
    let gone = Arc::new(AtomicBool::new(true));
    let abandoned = Arc::new(AtomicU64::new(0));
    for _ in 0..5 {
        let a = abandoned.clone();
        let done: rein_runtime::dispatch::Done = Box::new(move |r, _| {
            if matches!(r, Err(IoError::Abandoned)) {
                a.fetch_add(1, Ordering::Relaxed);
            }
        });
        d.submit(read_512(&storage, id), done, Some(gone.clone())).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(abandoned.load(Ordering::Relaxed), 5, "the five were answered as abandoned");
    let r = d.pshift_report(0, 0).await.unwrap();
    let b = &r.buckets[0];
    assert!(b.dispatched >= 95, "about a second of dispatches at 100 IOPS: {b:?}");
    assert!(b.in_flight <= 4, "in flight: at most the depth, got {b:?}");
    finish(d, join, tasks).await;
}

/// A pShift server cuts a boundary's report at the boundary the link placed on its clock, not when the
/// controller's request arrives: with the boundary at 1 s and the request 5 ms later, the report covers
/// exactly 1 s (100 IOs at 100 IOPS), and the next boundary, one interval later, is cut by itself. A
/// boundary whose request comes before its place is reported then, and its scheduled cut dropped.
#[tokio::test(start_paused = true)]
async fn pshift_reports_are_cut_at_the_boundary_not_at_the_request() {
    use rein_core::Nanos;
    use rein_runtime::dispatch::Cut;
    let (d, join, id, tasks) = pshift_node(1, 8, 3.5).await;
    d.pshift_attach(attach(id)).await.unwrap();
    let clock = d.clock();
    let start = clock.now();
    let second = Nanos::from_secs(1);
    d.pshift_cut_at(Cut { round: 0, at: Nanos(start.0 + second.0), interval: second }).await;
    let sleep_to = |t: Nanos| tokio::time::sleep_until(clock.instant(Nanos(start.0 + t.0)));
    sleep_to(Nanos::from_millis(1005)).await;
    let r0 = d.pshift_report(0, 0).await.unwrap();
    assert_eq!(r0.elapsed_ns, second.0, "cut at the boundary: {r0:?}");
    assert!((99..=101).contains(&r0.buckets[0].dispatched), "{r0:?}");
    // The next boundary (2 s) is cut by itself; its request comes 30 ms late.
    sleep_to(Nanos::from_millis(2030)).await;
    let r1 = d.pshift_report(1, 0).await.unwrap();
    assert_eq!(r1.elapsed_ns, second.0, "the next boundary, one interval later: {r1:?}");
    // Round 2's request comes early (2.5 s, before its place at 3 s): reported then, and the cut at 3 s
    // is dropped (round 3's would be at 4 s, after the run).
    sleep_to(Nanos::from_millis(2500)).await;
    let r2 = d.pshift_report(2, 0).await.unwrap();
    assert_eq!(r2.elapsed_ns, 500_000_000, "{r2:?}");
    sleep_to(Nanos::from_millis(3100)).await;
    let r3 = d.pshift_report(3, 0).await.unwrap();
    assert_eq!(r3.elapsed_ns, 600_000_000, "no cut at 3 s for the round already reported: {r3:?}");
    finish(d, join, tasks).await;
}
