//! The scheduling engine's hot path, counted without running the hour (`perf stat -e instructions`).
//!
//! `cargo run --release -p rein-core --example hour_loop -- [REQUESTS] [TENANTS]`
//! - without TENANTS: the loop of `one_hour_at_one_million_iops_is_exact` (`sched::mclock`'s tests) for
//!   REQUESTS requests (default 5e7): one tenant at r = l = 1,000,000 IOPS, per request one enqueue, one
//!   poll that dispatches and one that waits;
//! - with TENANTS: `rein bench sched`'s steady state for that many backlogged tenants (16 queued each,
//!   half reserving half their fair share, weights 1-4, limits 1.5x the fair share), REQUESTS dispatches
//!   after a warm-up, each followed by an enqueue for its tenant.
use rein_core::sched::{Mclock, Poll, Request, SchedConfig, Scheduler};
use rein_core::{Nanos, Phase, QosSpec};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let requests: u64 = args.next().map_or(50_000_000, |a| a.parse().expect("REQUESTS: a count"));
    match args.next() {
        None => hour(requests),
        Some(n) => tenants(requests, n.parse().expect("TENANTS: a count")),
    }
}

fn hour(requests: u64) {
    let mut s = Mclock::new(SchedConfig::default());
    let a = s.add_tenant(QosSpec::new(1e6, Some(1e6), 1.0, 0).expect("valid spec")).expect("one tenant");
    let (mut now, mut served, mut resv) = (Nanos(0), 0u64, 0u64);
    s.enqueue(now, Request::new(a, 0)).expect("queued");
    s.enqueue(now, Request::new(a, 1)).expect("queued");
    let t0 = Instant::now();
    while served < requests {
        match s.poll(now, true) {
            Poll::Dispatch(d) => {
                served += 1;
                resv += (d.phase == Phase::Reservation) as u64;
                s.enqueue(now, Request::new(a, served + 1)).expect("queued");
            }
            Poll::Wait(t) => now = t,
            Poll::Empty => unreachable!("the tenant stays backlogged"),
        }
    }
    let ns = t0.elapsed().as_secs_f64() * 1e9 / requests as f64;
    assert_eq!(resv, served, "every request in the reservation phase");
    println!("{requests} requests to {now:?}: {ns:.2} ns/request, {:.0} s for the hour's 3.6e9", ns * 3.6);
}

fn tenants(requests: u64, n: usize) {
    let mut s = Mclock::new(SchedConfig::default());
    // Capacity: 1,000 IOPS per tenant; fair share by weight (as `rein bench sched`).
    let capacity = 1000.0 * n as f64;
    let wsum: f64 = (0..n).map(|i| 1.0 + (i % 4) as f64).sum();
    let mut handle = 0;
    for i in 0..n {
        let w = 1.0 + (i % 4) as f64;
        let fair = capacity * w / wsum;
        let r = if i % 2 == 0 { 0.5 * fair } else { 0.0 };
        let id = s.add_tenant(QosSpec::new(r, Some(1.5 * fair), w, 0).expect("valid spec")).expect("tenant");
        for _ in 0..16 {
            s.enqueue(Nanos(0), Request::new(id, handle)).expect("queued");
            handle += 1;
        }
    }
    let (mut now_ps, step_ps) = (0u128, (1e12 / capacity) as u128);
    let (mut served, mut resv) = (0u64, 0u64);
    let warm = (n as u64 * 32).max(200_000);
    let mut t0 = Instant::now();
    while served < warm + requests {
        if served == warm {
            t0 = Instant::now();
        }
        let now = Nanos((now_ps / 1000) as u64);
        match s.poll(now, true) {
            Poll::Dispatch(d) => {
                s.enqueue(now, Request::new(d.tenant, handle)).expect("queued");
                handle += 1;
                served += 1;
                now_ps += step_ps;
                resv += (d.phase == Phase::Reservation) as u64;
            }
            Poll::Wait(t) => now_ps = t.0 as u128 * 1000,
            Poll::Empty => unreachable!("tenants stay backlogged"),
        }
    }
    let ns = t0.elapsed().as_secs_f64() * 1e9 / requests as f64;
    println!("{n} tenants, {requests} requests: {ns:.2} ns/request ({resv} in the reservation phase)");
}
