//! No heap allocation per request in steady state: a counting allocator around 100,000 enqueue+dispatch
//! cycles with 1,000 backlogged tenants.
use rein_core::{Nanos, Poll, QosSpec, Request, SchedConfig, Scheduler, SchedulerKind};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// A global allocator is an unsafe trait by definition (the workspace denies unsafe code elsewhere); this
// one only counts and forwards to the system allocator with the caller's layout.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn steady_state_allocs(mut s: Box<dyn Scheduler>) -> u64 {
    let n = 1000;
    let ids: Vec<_> = (0..n)
        .map(|i| {
            let r = if i % 2 == 0 { 500.0 } else { 0.0 };
            s.add_tenant(QosSpec::new(r, Some(3000.0), 1.0 + (i % 4) as f64, 0).unwrap()).unwrap()
        })
        .collect();
    let mut h = 0u64;
    for &id in &ids {
        for _ in 0..16 {
            s.enqueue(Nanos(0), Request::new(id, h)).unwrap();
            h += 1;
        }
    }
    let mut now = 0u64;
    let cycle = |s: &mut Box<dyn Scheduler>, now: &mut u64, h: &mut u64| match s.poll(Nanos(*now), true) {
        Poll::Dispatch(d) => {
            s.enqueue(Nanos(*now), Request::new(d.tenant, *h)).unwrap();
            *h += 1;
            *now += 1_000; // 1M IOPS device
        }
        Poll::Wait(t) => *now = t.0,
        Poll::Empty => unreachable!(),
    };
    for _ in 0..200_000 {
        cycle(&mut s, &mut now, &mut h);
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..100_000 {
        cycle(&mut s, &mut now, &mut h);
    }
    ALLOCS.load(Ordering::Relaxed) - before
}

#[test]
fn no_allocation_per_request_in_steady_state() {
    for kind in [SchedulerKind::Mclock, SchedulerKind::Rbfq, SchedulerKind::Sfq] {
        assert_eq!(steady_state_allocs(kind.build(SchedConfig::default())), 0, "{kind}");
    }
}
