//! PARDA against its analytic oracle, eq. (3), and the host's local scheduling, on virtual time.
//!
//! - The window controller alone, with the array as Little's law (`L = sum w / C`): windows converge to
//!   eq. (3) and latency to `script_L + sum beta / C` (proptest over hosts, betas, C, script-L, gamma).
//! - Whole hosts ([`HostController`]: local SFQ, estimator, window, eq. (4)) issuing to a virtual FIFO
//!   array, aggregated through an [`Aggregator`]: the same equilibrium with discrete IOs (proptest), and
//!   local-only estimation agreeing with it when all hosts see the same latencies.
//! - Local scheduling inside a host: shares, mClock reservations, SFQ batching, eq. (4) when a VM idles.
//! - Bad input: clear errors, no panics.
use proptest::prelude::*;
use rein_core::parda::{
    equilibrium_latency, equilibrium_windows, Aggregator, HostConfig, HostController, PardaConfig, PardaError,
    WindowController,
};
use rein_core::{Nanos, Poll, QosSpec, Request, SchedConfig, SchedulerKind, TenantId};
use std::collections::VecDeque;

fn config(threshold_ms: f64, gamma: f64, w_max: f64) -> PardaConfig {
    PardaConfig {
        latency_threshold: Nanos::from_secs_f64(threshold_ms / 1e3),
        gamma,
        period: Nanos::from_secs(1),
        w_min: 1.0,
        w_max,
        initial_window: Some(1.0),
        ..PardaConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// eq. (2) at every host with the cluster latency `sum w / C` converges to eq. (3).
    #[test]
    fn fluid_windows_converge_to_eq3(
        betas in proptest::collection::vec(0.2f64..8.0, 1..10),
        capacity in 50.0f64..20_000.0,
        threshold_ms in 2.0f64..400.0,
        gamma in 0.2f64..1.0,
    ) {
        let c = config(threshold_ms, gamma, 1e4);
        let want = equilibrium_windows(&betas, capacity, threshold_ms / 1e3);
        prop_assume!(want.iter().all(|&w| w > 1.0 && w < 1e4));
        // The total converges by (1 - gamma) per period, the split among hosts only by
        // gamma * sum beta / (C script_L + sum beta) (module comment of `parda`): run 30 of those.
        let sum_beta: f64 = betas.iter().sum();
        let tc = (capacity * threshold_ms / 1e3 + sum_beta) / (gamma * sum_beta);
        prop_assume!(tc < 3000.0);
        let mut ws: Vec<WindowController> = betas.iter().map(|_| WindowController::new(&c)).collect();
        for _ in 0..(30.0 * tc) as usize + 100 {
            let l_ns = ws.iter().map(|w| w.window()).sum::<f64>() / capacity * 1e9;
            for (w, &b) in ws.iter_mut().zip(&betas) {
                w.update(Some(l_ns), b);
            }
        }
        for (w, want) in ws.iter().zip(&want) {
            prop_assert!((w.window() - want).abs() <= 1e-6 * want, "{} vs {}", w.window(), want);
        }
        let l = ws.iter().map(|w| w.window()).sum::<f64>() / capacity;
        let want_l = equilibrium_latency(&betas, capacity, threshold_ms / 1e3);
        prop_assert!((l - want_l).abs() <= 1e-6 * want_l);
        // Windows are in the ratio of the betas.
        for (i, w) in ws.iter().enumerate() {
            let r = w.window() / ws[0].window();
            prop_assert!((r - betas[i] / betas[0]).abs() <= 1e-6 * r);
        }
    }

    /// Windows clamped at w_max stay there; the rest still share what is left.
    #[test]
    fn bounds_hold_under_any_signal(latencies in proptest::collection::vec(0.0f64..1e12, 1..200), beta in 0.0f64..100.0) {
        let c = PardaConfig { w_min: 2.0, w_max: 40.0, initial_window: None, ..config(30.0, 0.8, 40.0) };
        let mut w = WindowController::new(&c);
        for l in latencies {
            let v = w.update(Some(l), beta);
            prop_assert!((2.0..=40.0).contains(&v));
            prop_assert!(w.issue_limit() >= 2 && w.issue_limit() <= 40);
            w.on_slot_freed();
        }
    }
}

/// A virtual array: one FIFO server with a fixed service time, shared by PARDA hosts each running one
/// backlogged VM (or several).
struct Cluster {
    hosts: Vec<HostController>,
    vms: Vec<Vec<TenantId>>,
    /// (host, vm, issued at) in array order.
    array: VecDeque<(usize, TenantId, Nanos)>,
    service: Nanos,
    busy_until: Nanos,
    agg: Aggregator,
    aggregated: bool,
    now: Nanos,
    next_handle: u64,
    /// Each period's window, per host.
    windows: Vec<Vec<f64>>,
    completions: u64,
}

impl Cluster {
    fn new(c: PardaConfig, betas: &[f64], capacity: f64, aggregated: bool) -> Cluster {
        let mut hosts = Vec::new();
        let mut vms = Vec::new();
        for (i, &b) in betas.iter().enumerate() {
            let hc = HostConfig { id: i as u32, beta: Some(b), ..HostConfig::default() };
            // Stagger the hosts' periods.
            let start = Nanos(c.period.0 * i as u64 / betas.len() as u64);
            let mut h = HostController::new(c, hc, start).unwrap();
            let vm = h.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
            hosts.push(h);
            vms.push(vec![vm]);
        }
        let n = hosts.len();
        Cluster {
            hosts,
            vms,
            array: VecDeque::new(),
            service: Nanos::from_secs_f64(1.0 / capacity),
            busy_until: Nanos::ZERO,
            agg: Aggregator::new(Nanos::from_secs(10)).unwrap(),
            aggregated,
            now: Nanos::ZERO,
            next_handle: 0,
            windows: vec![Vec::new(); n],
            completions: 0,
        }
    }

    /// Keeps `backlog` requests queued per VM.
    fn fill(&mut self, h: usize, backlog: usize) {
        for &vm in &self.vms[h] {
            while self.hosts[h].scheduler().stats(vm).unwrap().queued < backlog {
                self.next_handle += 1;
                self.hosts[h].enqueue(self.now, Request::new(vm, self.next_handle)).unwrap();
            }
        }
    }

    fn pump(&mut self, h: usize) {
        while let Poll::Dispatch(d) = self.hosts[h].poll(self.now) {
            if self.array.is_empty() {
                self.busy_until = self.now.saturating_add(self.service);
            }
            self.array.push_back((h, d.tenant, self.now));
        }
    }

    fn run(&mut self, until: Nanos, backlog: usize) {
        for h in 0..self.hosts.len() {
            self.fill(h, backlog);
            self.pump(h);
        }
        loop {
            let (hp, tp) =
                (0..self.hosts.len()).map(|h| (h, self.hosts[h].poll_timeout())).min_by_key(|x| x.1).unwrap();
            let tc = if self.array.is_empty() { Nanos::MAX } else { self.busy_until };
            let t = tc.min(tp);
            if t >= until {
                break;
            }
            self.now = t;
            if tc <= tp {
                let (h, vm, issued) = self.array.pop_front().unwrap();
                if !self.array.is_empty() {
                    self.busy_until = self.now.saturating_add(self.service);
                }
                self.hosts[h].on_complete(self.now, vm, self.now.saturating_sub(issued), 4096).unwrap();
                self.completions += 1;
                self.fill(h, backlog);
                self.pump(h);
            } else {
                let r = self.hosts[hp].close_period(self.now);
                self.agg.accept(self.now, r).unwrap();
                let signal = if self.aggregated {
                    self.agg.cluster(self.now).map(|c| c.latency_ns)
                } else {
                    self.hosts[hp].local_estimate_ns()
                };
                let out = self.hosts[hp].on_period(self.now, signal);
                self.windows[hp].push(out.window);
                self.pump(hp);
            }
        }
    }

    fn mean_window(&self, h: usize, last: usize) -> f64 {
        let w = &self.windows[h];
        let k = last.min(w.len());
        w[w.len() - k..].iter().sum::<f64>() / k as f64
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Whole hosts on a discrete FIFO array, aggregated: windows within 3% of eq. (3), and the measured
    /// cluster latency within 3% of `script_L + sum beta / C`.
    #[test]
    fn hosts_on_a_virtual_array_reach_eq3(
        betas in proptest::collection::vec(0.5f64..4.0, 2..6),
        capacity in 200.0f64..2000.0,
        threshold_ms in 10.0f64..100.0,
    ) {
        let c = config(threshold_ms, 0.8, 1000.0);
        let want = equilibrium_windows(&betas, capacity, threshold_ms / 1e3);
        // Eq. (3) is fluid; a host's window counts whole IOs at the array, so below about 4 IOs the 3 %
        // tolerance is under a tenth of an IO (CI saw 3.48 against 3.59 at betas [1.07, 1.19, 0.71],
        // C = 687, L = 10.2 ms, 3.1 % off).
        prop_assume!(want.iter().all(|&w| w > 4.0));
        // The split among hosts converges with time constant tc periods (see the fluid test).
        let sum_beta: f64 = betas.iter().sum();
        let tc = (capacity * threshold_ms / 1e3 + sum_beta) / (0.8 * sum_beta);
        prop_assume!(tc < 25.0);
        let mut cl = Cluster::new(c, &betas, capacity, true);
        cl.run(Nanos::from_secs(250), 8);
        for (h, want) in want.iter().enumerate() {
            let got = cl.mean_window(h, 50);
            prop_assert!((got - want).abs() <= 0.03 * want, "host {h}: window {got:.2} vs eq. (3) {want:.2}");
        }
        let sum: f64 = (0..betas.len()).map(|h| cl.mean_window(h, 50)).sum();
        let l = sum / capacity;
        let want_l = equilibrium_latency(&betas, capacity, threshold_ms / 1e3);
        prop_assert!((l - want_l).abs() <= 0.03 * want_l, "latency {l} vs {want_l}");
    }
}

#[test]
fn fig2_shape_on_a_virtual_array() {
    // §3.2 Fig. 2 in miniature: 1:2:3, script-L 200 ms, C = 400 then 100 req/s.
    let c = PardaConfig {
        latency_threshold: Nanos::from_millis(200),
        period: Nanos::from_secs(1),
        w_max: 200.0,
        initial_window: None,
        ..PardaConfig::default()
    };
    let betas = [1.0, 2.0, 3.0];
    let mut cl = Cluster::new(c, &betas, 400.0, true);
    cl.run(Nanos::from_secs(150), 8);
    let want = equilibrium_windows(&betas, 400.0, 0.2);
    for (h, want) in want.iter().enumerate() {
        let got = cl.mean_window(h, 30);
        assert!((got - want).abs() < 0.03 * want, "C = 400: host {h} {got} vs {want}");
    }
    cl.service = Nanos::from_secs_f64(1.0 / 100.0);
    cl.run(Nanos::from_secs(300), 8);
    let want = equilibrium_windows(&betas, 100.0, 0.2);
    for (h, want) in want.iter().enumerate() {
        let got = cl.mean_window(h, 50);
        assert!((got - want).abs() < 0.05 * want, "C = 100: host {h} {got} vs {want}");
    }
}

#[test]
fn local_estimation_agrees_when_hosts_see_the_same_latency() {
    // On a FIFO array every host's IOs wait in the same queue, so local estimates agree and local
    // control also reaches eq. (3) (§4.1's divergence needs per-host latency differences).
    let betas = [1.0, 1.0, 2.0];
    let mut cl = Cluster::new(config(30.0, 0.8, 500.0), &betas, 1000.0, false);
    cl.run(Nanos::from_secs(200), 8);
    let want = equilibrium_windows(&betas, 1000.0, 0.03);
    for (h, want) in want.iter().enumerate() {
        let got = cl.mean_window(h, 50);
        assert!((got - want).abs() < 0.05 * want, "host {h}: {got} vs {want}");
    }
}

/// A host with a fixed window (no PARDA) and several VMs, issuing to an array that completes one IO per
/// `service`; returns the IOs each VM got.
fn run_host(h: &mut HostController, vms: &[TenantId], offsets: &[u64], service: Nanos, until: Nanos) -> Vec<u64> {
    let mut inflight: VecDeque<(TenantId, Nanos)> = VecDeque::new();
    let mut now = Nanos::ZERO;
    let mut done = vec![0u64; vms.len()];
    let mut handle = 0;
    let mut next_off = offsets.to_vec();
    let refill = |h: &mut HostController, now: Nanos, handle: &mut u64, next_off: &mut Vec<u64>| {
        for (i, &vm) in vms.iter().enumerate() {
            while h.scheduler().stats(vm).unwrap().queued < 16 {
                *handle += 1;
                h.enqueue(now, Request::new(vm, *handle).offset(next_off[i])).unwrap();
                next_off[i] += 4096;
            }
        }
    };
    while now < until {
        refill(h, now, &mut handle, &mut next_off);
        while let Poll::Dispatch(d) = h.poll(now) {
            inflight.push_back((d.tenant, now));
        }
        now = now.saturating_add(service);
        let (vm, issued) = inflight.pop_front().expect("the window holds at least one IO");
        h.on_complete(now, vm, now.saturating_sub(issued), 4096).unwrap();
        done[vms.iter().position(|&v| v == vm).unwrap()] += 1;
    }
    done
}

#[test]
fn local_sfq_divides_the_window_by_shares() {
    let hc = HostConfig { fixed_window: Some(12.0), ..HostConfig::default() };
    let mut h = HostController::new(PardaConfig::default(), hc, Nanos::ZERO).unwrap();
    let a = h.add_vm(QosSpec::weighted(20.0).unwrap()).unwrap();
    let b = h.add_vm(QosSpec::weighted(10.0).unwrap()).unwrap();
    assert_eq!(h.beta_base(), 30.0, "beta = K sum s with K = 1");
    let done = run_host(&mut h, &[a, b], &[0, 1 << 40], Nanos::from_millis(1), Nanos::from_secs(10));
    let ratio = done[0] as f64 / done[1] as f64;
    assert!((ratio - 2.0).abs() < 0.02, "20:10 shares got {done:?}");
    assert!(h.stats().outstanding <= 12);
}

#[test]
fn local_mclock_keeps_reservations_and_limits_inside_the_host_share() {
    // Array gives the host 1,000 IOPS; VM a has r = 600 with weight 1, b weight 3 and a limit of 300, c
    // weight 1. mClock: a 600 (reservation), b 300 (limit), c the rest (100).
    let hc = HostConfig { fixed_window: Some(8.0), scheduler: SchedulerKind::Mclock, ..HostConfig::default() };
    let mut h = HostController::new(PardaConfig::default(), hc, Nanos::ZERO).unwrap();
    let a = h.add_vm(QosSpec::new(600.0, None, 1.0, 0).unwrap()).unwrap();
    let b = h.add_vm(QosSpec::new(0.0, Some(300.0), 3.0, 0).unwrap()).unwrap();
    let c = h.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    let done = run_host(&mut h, &[a, b, c], &[0, 0, 0], Nanos::from_millis(1), Nanos::from_secs(20));
    let iops: Vec<f64> = done.iter().map(|&d| d as f64 / 20.0).collect();
    assert!((iops[0] - 600.0).abs() < 12.0, "{iops:?}");
    assert!((iops[1] - 300.0).abs() < 6.0, "{iops:?}");
    assert!((iops[2] - 100.0).abs() < 12.0, "{iops:?}");
}

#[test]
fn local_sfq_batches_nearby_requests() {
    let sched = SchedConfig { batch: 4, batch_distance: 64 << 10, ..SchedConfig::default() };
    let hc = HostConfig { fixed_window: Some(1.0), sched, ..HostConfig::default() };
    let mut h = HostController::new(PardaConfig::default(), hc, Nanos::ZERO).unwrap();
    let a = h.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    let b = h.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    let c = h.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    // a: sequential offsets, batched in runs of 4. b and c: 1 GiB apart, never batched (SFQ lets them
    // alternate while they catch up with a's batch).
    let mut handle = 0;
    for i in 0..64u64 {
        for (vm, off) in [(a, i * 4096), (b, i << 30), (c, (i << 30) + (1 << 29))] {
            handle += 1;
            h.enqueue(Nanos(0), Request::new(vm, handle).offset(off)).unwrap();
        }
    }
    let mut order = Vec::new();
    for t in 1..=60u64 {
        let Poll::Dispatch(d) = h.poll(Nanos(t)) else { panic!("window 1 frees after each completion") };
        order.push(if d.tenant == a {
            'a'
        } else if d.tenant == b {
            'b'
        } else {
            'c'
        });
        h.on_complete(Nanos(t), d.tenant, Nanos(1), 4096).unwrap();
    }
    let s: String = order.into_iter().collect();
    assert!(s.starts_with("aaaa"), "{s}");
    assert!(!s.contains("aaaaa"), "batches are bounded: {s}");
    assert!(!s.contains("bb") && !s.contains("cc"), "b and c are not batched: {s}");
    // Long-run shares are kept: a is at most one batch ahead.
    let na = s.matches('a').count() as i64;
    let nb = s.matches('b').count() as i64;
    assert!((na - nb).abs() <= 4, "{s}");
}

#[test]
fn an_idle_vm_lowers_its_hosts_beta_and_window() {
    // §5.5 in miniature: a host with VMs of shares 20 and 10 (K = 1/5: beta 6) next to a host with beta
    // 4. When the shares-10 VM idles, beta drops to 4 and the windows converge to equal.
    let c = PardaConfig {
        latency_threshold: Nanos::from_millis(25),
        period: Nanos::from_secs(1),
        w_max: 200.0,
        ..PardaConfig::default()
    };
    let mut cl = Cluster::new(c, &[1.0, 4.0], 2000.0, true);
    let h1 = HostConfig { id: 0, beta: None, beta_per_share: 0.2, ..HostConfig::default() };
    cl.hosts[0] = HostController::new(c, h1, Nanos::ZERO).unwrap();
    let v1 = cl.hosts[0].add_vm(QosSpec::weighted(20.0).unwrap()).unwrap();
    let v2 = cl.hosts[0].add_vm(QosSpec::weighted(10.0).unwrap()).unwrap();
    cl.vms[0] = vec![v1, v2];
    cl.run(Nanos::from_secs(60), 64);
    assert!((cl.hosts[0].beta() - 6.0).abs() < 1e-9, "{}", cl.hosts[0].beta());
    let r = cl.mean_window(0, 20) / cl.mean_window(1, 20);
    assert!((r - 1.5).abs() < 0.05, "6:4 -> {r}");
    // VM 2 idles: drop its queued requests and stop refilling it.
    cl.vms[0] = vec![v1];
    for h in cl.hosts[0].remove_vm(v2).unwrap() {
        let _ = h;
    }
    cl.run(Nanos::from_secs(120), 64);
    assert!((cl.hosts[0].beta() - 4.0).abs() < 1e-9, "{}", cl.hosts[0].beta());
    let r = cl.mean_window(0, 20) / cl.mean_window(1, 20);
    assert!((r - 1.0).abs() < 0.05, "4:4 -> {r}");
}

#[test]
fn bad_calls_get_clear_errors() {
    let mut h = HostController::new(PardaConfig::default(), HostConfig::default(), Nanos::ZERO).unwrap();
    let vm = h.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    assert_eq!(h.on_complete(Nanos(1), vm, Nanos(1), 1), Err(PardaError::UnexpectedCompletion));
    let bad = |hc: HostConfig| HostController::new(PardaConfig::default(), hc, Nanos::ZERO).unwrap_err();
    assert!(bad(HostConfig { beta: Some(0.0), ..HostConfig::default() }).to_string().contains("beta"));
    assert!(bad(HostConfig { beta: Some(f64::NAN), ..HostConfig::default() }).to_string().contains("beta"));
    assert!(matches!(bad(HostConfig { id: 1 << 20, ..HostConfig::default() }), PardaError::HostId { .. }));
    assert!(matches!(bad(HostConfig { beta_per_share: -1.0, ..HostConfig::default() }), PardaError::BetaPerShare(_)));
    assert!(matches!(
        bad(HostConfig { fixed_window: Some(0.5), ..HostConfig::default() }),
        PardaError::FixedWindow { .. }
    ));
    let e =
        HostController::new(PardaConfig { gamma: 2.0, ..PardaConfig::default() }, HostConfig::default(), Nanos::ZERO)
            .unwrap_err();
    assert_eq!(e, PardaError::Gamma(2.0));
    // Unknown VM: a scheduler error, state unchanged.
    let mut other = HostController::new(PardaConfig::default(), HostConfig::default(), Nanos::ZERO).unwrap();
    let _ = other.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    let ghost = other.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    assert!(matches!(h.enqueue(Nanos(2), Request::new(ghost, 1)), Err(PardaError::Sched(_))));
    assert_eq!(h.stats().queued, 0);
    // Time going backwards is clamped and counted.
    h.enqueue(Nanos(100), Request::new(vm, 1)).unwrap();
    h.enqueue(Nanos(50), Request::new(vm, 2)).unwrap();
    assert!(h.time_regressions() >= 1);
}

#[test]
fn period_cadence_and_reports() {
    let c = PardaConfig { period: Nanos::from_secs(2), ..PardaConfig::default() };
    let hc = HostConfig { id: 7, epoch: 3, ..HostConfig::default() };
    let mut h = HostController::new(c, hc, Nanos::from_secs(1)).unwrap();
    let vm = h.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    assert_eq!(h.poll_timeout(), Nanos::from_secs(3));
    h.enqueue(Nanos::from_secs(1), Request::new(vm, 1)).unwrap();
    let Poll::Dispatch(d) = h.poll(Nanos::from_secs(1)) else { panic!() };
    h.on_complete(Nanos::from_secs(2), d.tenant, Nanos::from_millis(40), 4096).unwrap();
    assert_eq!(h.local_estimate_ns(), None, "the estimate changes at period ends");
    let r = h.close_period(Nanos::from_secs(3));
    assert_eq!((r.host, r.epoch, r.seq, r.latency_ns, r.ios), (7, 3, 1, 40_000_000, 1));
    assert_eq!(h.close_period(Nanos::from_secs(3)), r, "closing twice gives the same report");
    assert_eq!(h.local_estimate_ns(), Some(40e6));
    let out = h.on_period(Nanos::from_secs(3), Some(40e6));
    assert_eq!(out.ios, 1);
    assert_eq!(h.poll_timeout(), Nanos::from_secs(5));
    let r2 = h.close_period(Nanos::from_secs(5));
    assert_eq!((r2.seq, r2.ios, r2.latency_ns), (2, 0, 40_000_000), "a new period counts from zero and keeps L");
    // on_period without close_period closes it.
    let out = h.on_period(Nanos::from_secs(5), None);
    assert_eq!(out.ios, 0);
    assert_eq!(h.close_period(Nanos::from_secs(7)).seq, 3);
}

#[test]
fn a_period_end_can_be_moved_within_two_periods() {
    let c = PardaConfig { period: Nanos::from_secs(2), ..PardaConfig::default() };
    let mut h = HostController::new(c, HostConfig::default(), Nanos::ZERO).unwrap();
    let vm = h.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    h.enqueue(Nanos::ZERO, Request::new(vm, 1)).unwrap();
    let Poll::Dispatch(d) = h.poll(Nanos::ZERO) else { panic!() };
    h.on_complete(Nanos::from_millis(500), d.tenant, Nanos::from_millis(40), 4096).unwrap();
    // Now 1 s in: the period ends at 3.5 s rather than 2 s; its IO stays in it.
    h.set_period_end(Nanos::from_secs(1), Nanos::from_millis(3500)).unwrap();
    assert_eq!(h.poll_timeout(), Nanos::from_millis(3500));
    let out = h.on_period(Nanos::from_millis(3500), Some(40e6));
    assert_eq!(out.ios, 1);
    assert_eq!(h.poll_timeout(), Nanos::from_millis(5500), "the next ones follow a period apart");
    // Refused: before now, or beyond two periods.
    let e = h.set_period_end(Nanos::from_secs(4), Nanos::from_millis(3999)).unwrap_err();
    assert_eq!(e, PardaError::PeriodEnd { ahead_ns: -1_000_000, max_ns: 4_000_000_000 });
    // In seconds, as `PUT /api/parda/period` takes them (it said "(4000000000 ns), got -1000000 ns").
    assert_eq!(
        e.to_string(),
        "the control period's end must be from now to two periods ahead (4 s), got -0.001 s from now"
    );
    let e = h.set_period_end(Nanos::from_secs(4), Nanos(8_000_000_001)).unwrap_err();
    assert!(matches!(e, PardaError::PeriodEnd { ahead_ns: 4_000_000_001, .. }), "{e:?}");
    assert!(e.to_string().ends_with("(4 s), got 4.000000001 s from now"), "{e}");
    assert_eq!(h.poll_timeout(), Nanos::from_millis(5500), "a refused end changes nothing");
    h.set_period_end(Nanos::from_secs(4), Nanos::from_secs(8)).unwrap();
    h.set_period_end(Nanos::from_secs(4), Nanos::from_secs(4)).unwrap();
    assert_eq!(h.poll_timeout(), Nanos::from_secs(4));
}

#[test]
fn vms_per_host_are_bounded() {
    use rein_core::parda::MAX_VMS_PER_HOST;
    let mut h = HostController::new(PardaConfig::default(), HostConfig::default(), Nanos::ZERO).unwrap();
    for _ in 0..MAX_VMS_PER_HOST {
        h.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    }
    assert_eq!(h.add_vm(QosSpec::weighted(1.0).unwrap()), Err(PardaError::TooManyVms { max: MAX_VMS_PER_HOST }));
    assert_eq!(h.beta_base(), MAX_VMS_PER_HOST as f64, "beta = K sum s over all of them");
}

#[test]
fn an_uncontrolled_hosts_window_can_be_resized_and_a_parda_hosts_cannot() {
    let hc = HostConfig { fixed_window: Some(8.0), ..HostConfig::default() };
    let mut h = HostController::new(PardaConfig::default(), hc, Nanos::ZERO).unwrap();
    let vm = h.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
    for i in 0..32u64 {
        let req = Request::new(vm, i).size(4096).offset(i << 20);
        h.enqueue(Nanos::ZERO, req).unwrap();
    }
    let issue = |h: &mut HostController, now| {
        std::iter::from_fn(|| matches!(h.poll(now), Poll::Dispatch(_)).then_some(())).count()
    };
    assert_eq!(issue(&mut h, Nanos::ZERO), 8);
    // Shrinking holds the issued IOs and issues nothing until fewer than the new window are out.
    h.set_fixed_window(Nanos::from_millis(1), 4.0).unwrap();
    assert_eq!(issue(&mut h, Nanos::from_millis(1)), 0);
    for _ in 0..5 {
        h.on_complete(Nanos::from_millis(2), vm, Nanos::from_millis(1), 4096).unwrap();
    }
    assert_eq!(issue(&mut h, Nanos::from_millis(2)), 1, "3 out after 5 of 8 completed: one more fits in 4");
    h.set_fixed_window(Nanos::from_millis(3), 16.0).unwrap();
    assert_eq!(issue(&mut h, Nanos::from_millis(3)), 12);
    assert_eq!(h.stats().window, 16.0);
    assert!(matches!(h.set_fixed_window(Nanos::from_millis(3), 0.5), Err(PardaError::FixedWindow { .. })));
    let mut p = HostController::new(PardaConfig::default(), HostConfig::default(), Nanos::ZERO).unwrap();
    assert!(matches!(p.set_fixed_window(Nanos::ZERO, 8.0), Err(PardaError::NotFixed)));
}
