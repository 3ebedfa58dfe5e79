//! `rein load`'s engine against a real `rein serve` on loopback: the simulator's workload kinds on the
//! wire, the tenants' real specs and phases from the admin endpoint, and the bound on pending requests.
use rein_core::Nanos;
use rein_model::workload::WorkloadParams;
use rein_model::RunTotals;
use rein_runtime::config::ServerConfig;
use rein_runtime::load::{Job, LoadConfig};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

const CONFIG: &str = r#"
listen = "127.0.0.71:0"
admin = "127.0.0.71:0"
[device_model]
capacity_iops = 2000
service = "deterministic"
[[exports]]
name = "a"
backend = "memory"
size_mb = 16
[[exports]]
name = "b"
backend = "memory"
size_mb = 16
[[tenants]]
name = "a"
reservation = 500
[[tenants]]
name = "b"
limit = 600
weight = 3
"#;

fn job(name: &str, p: WorkloadParams, seconds: f64) -> Job {
    let workload = p.validate(Nanos::from_secs_f64(seconds), None, &[]).unwrap();
    Job {
        name: name.into(),
        export: name.into(),
        tenant: name.into(),
        connections: 2,
        workload,
        route: None,
        stream: None,
    }
}

/// Runs `jobs` for `seconds` against a fresh server; `admin`: give load the admin endpoint.
async fn load(jobs: Vec<Job>, seconds: f64, admin: bool, max_pending: usize) -> RunTotals {
    // Each server its own data directory: the server locks it.
    let data = tempfile::tempdir().unwrap();
    let text = format!("data_dir = \"{}\"\n{CONFIG}", data.path().display());
    let cfg = ServerConfig::parse(&text, Path::new("test.toml")).unwrap();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(rein_runtime::server::run(
        cfg,
        async move {
            let _ = stop_rx.await;
        },
        Some(ready_tx),
    ));
    let bound = ready_rx.await.expect("server starts");
    let lc = LoadConfig {
        admin: admin.then_some(bound.admin.into()),
        warmup: Duration::from_secs(1),
        interval: Duration::from_millis(500),
        seed: 3,
        name: "load-test".into(),
        max_pending,
        ..LoadConfig::new(bound.nbd, jobs, Duration::from_secs_f64(seconds))
    };
    let totals = rein_runtime::load::run(lc, |_, _| {}).await.unwrap();
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
    totals
}

fn within(got: f64, want: f64, pct: f64) -> bool {
    (got - want).abs() <= want * pct / 100.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_kinds_on_the_wire_with_the_servers_specs_and_phases() {
    let secs = 5.0;
    let open = job("a", WorkloadParams { kind: "open".into(), iops: Some(300.0), ..Default::default() }, secs);
    let burst = job(
        "b",
        WorkloadParams {
            kind: "burst".into(),
            burst_count: Some(20),
            burst_period_ms: Some(100.0),
            ..Default::default()
        },
        secs,
    );
    let t = load(vec![open, burst], secs, true, rein_runtime::load::MAX_PENDING).await;
    let (a, b) = (&t.summary.tenants[0], &t.summary.tenants[1]);
    // Poisson arrivals at 300/s over 4 measured seconds: 1,200 expected, sd about 35.
    assert!(within(a.iops, 300.0, 12.0), "open loop at 300 IOPS: {}", a.iops);
    // 20 every 100 ms: exactly 200/s.
    assert!(within(b.iops, 200.0, 5.0), "bursts of 20 per 100 ms: {}", b.iops);
    // The specs are the server's, not made up.
    assert_eq!((a.reservation, a.limit, a.weight), (Some(500.0), None, Some(1.0)));
    assert_eq!((b.reservation, b.limit, b.weight), (Some(0.0), Some(600.0), Some(3.0)));
    // Phases from the server's counters, covering the completions. a's requests arrive at 300/s with a
    // reservation of 500: one arriving at least 1/500 s after the previous has a due R tag, which happens
    // with probability e^(-300/500) = 0.55 for Poisson gaps; the others go by weight (the device is idle).
    let pa = a.phase.as_ref().expect("phases with the admin endpoint");
    let total = (pa.reservation + pa.weight + pa.over_limit) as f64;
    assert!(within(total, a.completed as f64, 5.0), "{pa:?} against {} completions", a.completed);
    assert!(pa.reservation as f64 > 0.35 * total, "{pa:?}");
    let pb = b.phase.as_ref().unwrap();
    assert_eq!(pb.reservation, 0, "b has no reservation");
    assert!(t.timeseries.to_csv().lines().nth(1).is_some_and(|l| !l.ends_with(",,")));
    assert_eq!(a.rejected + b.rejected, 0);
    // The device's busy time from the admin endpoint (GET /api/device): a FIFO device of 0.5 ms
    // deterministic service that takes 300 + 200 IOs a second is busy 500 x 0.5 ms = 25 % of the time.
    let u = t.summary.servers[0].utilisation.expect("utilisation with the admin endpoint");
    assert!(within(u, 0.25, 12.0), "utilisation {u}, the equation's 0.25");
    let completed = (a.completed + b.completed) as f64 / 4.0;
    assert!(within(u, completed * 0.0005, 5.0), "utilisation {u} against the measured {completed} IOPS");
    // The modelled device's capacity as the admin endpoint gives it, for every interval (the plots' line).
    assert_eq!(t.timeseries.capacity, [vec![2000.0; t.timeseries.intervals]]);
    // Both are open loops, and their arrivals are recorded: each run's arrivals cover its completions
    // (all but the few in flight at the end), and the fluid oracle gives each what it offered (T is the
    // measured 500; without the demand cap a's reservation of 500 took all of it and b's oracle was 0).
    assert!(a.open_loop && b.open_loop);
    for (k, x) in [a, b].into_iter().enumerate() {
        let cells = (0..t.timeseries.intervals).map(|i| t.timeseries.cell(k, i));
        let (arrived, all) = cells.fold((0u64, 0u64), |(a, n), c| (a + u64::from(c.arrivals), n + u64::from(c.ios)));
        assert!(arrived >= all && arrived <= all + 25, "{}: {arrived} arrivals, {all} completions", x.name);
    }
    let oracle = t.oracle_iops(1.0, secs);
    for (k, got) in [a.iops, b.iops].into_iter().enumerate() {
        assert!(within(oracle[k], got, 5.0), "oracle {oracle:?}: tenant {k} got {got}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_admin_endpoint_specs_and_phases_are_unknown_not_invented() {
    let secs = 3.0;
    let closed = job("a", WorkloadParams { outstanding: Some(4), ..Default::default() }, secs);
    let on_off = job(
        "b",
        WorkloadParams {
            kind: "on_off".into(),
            on_s: Some(0.5),
            off_s: Some(0.5),
            outstanding: Some(8),
            ..Default::default()
        },
        secs,
    );
    let t = load(vec![closed, on_off], secs, false, rein_runtime::load::MAX_PENDING).await;
    let (a, b) = (&t.summary.tenants[0], &t.summary.tenants[1]);
    assert_eq!((a.reservation, a.weight, a.phase.clone()), (None, None, None));
    assert!(t.summary.to_json().contains("\"weight\": null"));
    // The phase columns (the 7th to the 9th) are empty; arrivals and refusals are known.
    let row: Vec<String> = t.timeseries.to_csv().lines().nth(1).unwrap().split(',').map(String::from).collect();
    assert_eq!(row[6..9], ["", "", ""], "phase columns empty: {row:?}");
    assert!(row[9].parse::<u32>().unwrap() > 0 && row[10] == "0", "arrivals, no refusals: {row:?}");
    assert_eq!(t.summary.servers[0].utilisation, None);
    assert_eq!(t.timeseries.capacity, [Vec::<f64>::new()], "capacity unknown");
    // The device does 2,000 IOPS and b's limit holds it to 600 while on: half the time on.
    assert!(a.iops > 500.0, "{}", a.iops);
    assert!(b.iops > 150.0 && b.iops < 450.0, "on half the time at most 600: {}", b.iops);
    let cells: Vec<u32> = (0..t.timeseries.intervals).map(|i| t.timeseries.cell(1, i).ios).collect();
    // Off periods see only the 8 requests in flight when the workload paused.
    assert!(cells.iter().any(|&n| n <= 8) && cells.iter().any(|&n| n > 100), "on and off periods: {cells:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_arrivals_beyond_the_pending_bound_are_dropped_and_counted() {
    // 20,000 arrivals per second at a tenant limited to 600 IOPS: the queue grows until the bound (50 here)
    // and arrivals beyond it are counted as rejected, not buffered.
    let secs = 2.0;
    let flood = job("b", WorkloadParams { kind: "open".into(), iops: Some(20_000.0), ..Default::default() }, secs);
    let t = load(vec![flood], secs, false, 50).await;
    let b = &t.summary.tenants[0];
    assert!(b.rejected > 10_000, "{} rejected", b.rejected);
    assert!(within(b.iops, 600.0, 10.0), "the limit still holds: {}", b.iops);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_waits_for_answers_at_most_the_drain_timeout() {
    // 20,000 arrivals per second for 3 s at a tenant limited to 600 IOPS, with room for 40,000 pending: at
    // the end about 40,000 are queued at the server, a minute of its work at the limit. The run ends
    // within DRAIN_TIMEOUT of its duration (plus one DRAIN_TIMEOUT per connection's disconnect), not when
    // the queue has drained: the deadline below is half the drain.
    let secs = 3.0;
    let flood = job("b", WorkloadParams { kind: "open".into(), iops: Some(20_000.0), ..Default::default() }, secs);
    let bound = Duration::from_secs_f64(secs) + rein_runtime::load::DRAIN_TIMEOUT * 3 + Duration::from_secs(10);
    assert!(bound < Duration::from_secs(40_000 / 600 / 2));
    let t = tokio::time::timeout(bound, load(vec![flood], secs, false, 40_000))
        .await
        .expect("the run ends without draining the server's queue");
    assert!(within(t.summary.tenants[0].iops, 600.0, 10.0), "{}", t.summary.tenants[0].iops);
}

/// A workload whose timers are always due ends on time. One trace record replayed with `repeat`: the
/// file validation refuses (a pass of no time), built here directly; its replay then advances 1 ns a
/// pass, a timer per nanosecond, far more than any machine can issue. The driver runs at most
/// `TIMERS_PER_PASS` timers before it looks at the end again; before that bound the loop over due timers
/// took each pass longer than the last (and with a pass of no time never ended: `rein cluster run` spun
/// 14 minutes ignoring SIGTERM). The run is spawned so that a loop that never yields fails the deadline
/// instead of holding the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_whose_timers_are_always_due_ends_on_time() {
    use rein_model::trace::TraceRecord;
    use rein_model::workload::WorkloadKind;
    let secs = 2.0;
    let mut j = job("a", WorkloadParams::default(), secs);
    let one = TraceRecord { t_ns: 0, offset: 0, size: 4096, read: true, device: 0 };
    j.workload.kind = WorkloadKind::Trace { records: std::sync::Arc::new(vec![one]), time_scale: 1.0, repeat: true };
    let bound = Duration::from_secs_f64(secs) + rein_runtime::load::DRAIN_TIMEOUT * 3 + Duration::from_secs(10);
    let run = tokio::spawn(load(vec![j], secs, false, 64));
    let t = tokio::time::timeout(bound, run).await.expect("the run ends on time").unwrap();
    let a = &t.summary.tenants[0];
    assert!(a.rejected > 10_000, "arrivals beyond the pending bound are counted: {}", a.rejected);
}

/// A closed loop's think time ends when it should, not at tokio's next millisecond tick (the load's timers
/// on a timerfd beside tokio's, crate::precise_timer in rein-runtime): one request at a time with 1.5 ms of
/// think time. A cycle is the request's latency (issue to answer, as the load records it) plus the think
/// time, so IOPS x (mean latency + think) is 1 when every think time ends on time, whatever the machine's
/// round trip; what it lacks of 1 is the timer's lateness. On tokio's timer alone the product read 0.66-0.68
/// in six runs (the think times ended about 1 ms late on average); with the timerfd 0.965-0.970. A run on a machine too
/// busy to wake the load in time is made again, at most twice: a late timer fails every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_think_time_ends_on_time() {
    let secs = 3.0;
    let think_ms = 1.5;
    let mut got = Vec::new();
    for _ in 0..3 {
        let loop1 =
            job("a", WorkloadParams { outstanding: Some(1), think_ms: Some(think_ms), ..Default::default() }, secs);
        let t = load(vec![loop1], secs, false, rein_runtime::load::MAX_PENDING).await;
        let a = &t.summary.tenants[0];
        let product = a.iops * (a.latency_ms.mean + think_ms) / 1e3;
        got.push(product);
        if product > 0.9 {
            assert!(product < 1.02, "more cycles than latency and think time allow: {got:?}");
            return;
        }
    }
    panic!("IOPS x (latency + think) in three runs: {got:?}, want above 0.9 (1 for a punctual timer)");
}

#[tokio::test]
async fn a_missing_tenant_is_a_clear_error() {
    let addr = "127.0.0.1:9".parse::<SocketAddr>().unwrap();
    let cfg = LoadConfig { name: "x".into(), max_pending: 1, ..LoadConfig::new(addr, vec![], Duration::from_secs(1)) };
    let e = rein_runtime::load::run(cfg, |_, _| {}).await.unwrap_err();
    assert_eq!(e.to_string(), "no jobs");
}

/// Two fresh servers (the test's [`CONFIG`] on 127.0.0.72 and .73) run `job` for `secs`, its route's
/// windows on them; the run waits at its start gate (after 300 ms, told to go). Returns the run's totals
/// and the job's IOs each server completed.
async fn two_servers(
    mut job: Job,
    phases: Vec<(Nanos, Vec<f64>)>,
    arrivals: Option<rein_runtime::load::WindowArrivals>,
    secs: f64,
) -> (RunTotals, Vec<u64>) {
    let mut servers = Vec::new();
    for ip in ["127.0.0.72", "127.0.0.73"] {
        let data = tempfile::tempdir().unwrap();
        let text = format!("data_dir = \"{}\"\n{}", data.path().display(), CONFIG.replace("127.0.0.71", ip));
        let cfg = ServerConfig::parse(&text, Path::new("test.toml")).unwrap();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(rein_runtime::server::run(
            cfg,
            async move {
                let _ = stop_rx.await;
            },
            Some(ready_tx),
        ));
        servers.push((ready_rx.await.unwrap(), stop_tx, task, data));
    }
    job.connections = 1;
    job.route = Some(rein_runtime::load::JobRoute {
        addr: servers[0].0.nbd,
        spec: None,
        admins: Vec::new(),
        servers: vec![0, 1],
        layout: None,
        window_addrs: servers.iter().map(|s| s.0.nbd).collect(),
        phases,
        arrivals,
        devices: None,
    });
    let gate = rein_runtime::load::StartGate::default();
    let lc = LoadConfig {
        interval: Duration::from_millis(500),
        seed: 3,
        name: "phases".into(),
        servers: vec!["s0".into(), "s1".into()],
        start_gate: Some(gate.clone()),
        ..LoadConfig::new(servers[0].0.nbd, vec![job], Duration::from_secs_f64(secs))
    };
    let run = tokio::spawn(rein_runtime::load::run(lc, |_, _| {}));
    gate.ready.notified().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let told = std::time::Instant::now();
    gate.go.notify_one();
    let t = run.await.unwrap().unwrap();
    assert!(told.elapsed() >= Duration::from_secs_f64(secs), "the run's time started at the go");
    let mut counts = Vec::new();
    for (bound, ..) in &servers {
        let ts: Vec<rein_runtime::admin::TenantJson> =
            rein_runtime::admin_client::get_json(&bound.admin.into(), None, "/api/tenants").await.unwrap();
        let a = ts.iter().find(|x| x.name == "a").unwrap();
        counts.push(a.completed_reservation_phase + a.completed_weight_phase);
    }
    for (_, stop, task, _data) in servers {
        let _ = stop.send(());
        task.await.unwrap().unwrap();
    }
    (t, counts)
}

/// A job with a window at each of two servers, reached directly (`window_addrs`), and demand phases: the
/// first 1.5 s only at server 0, then only at server 1. Each server, a device of 2,000 IOPS, then serves
/// the job for 1.5 s: at most about 3,000 IOs each (with both windows active all along, about 6,000
/// each). What shows the phases, whatever the machine's speed, is when each server serves: server 1
/// nothing in the first phase, server 0 nothing from half a second into the second (its last window
/// drains in milliseconds). The lower bound on the counts only says each server served the job in its
/// phase: debug-built servers on a machine busy with other tests serve far below the device's rate (in
/// a CI run on 2026-12-01 server 1 served 1,635, 55 % of the 3,000). The run waits at its start gate:
/// it says it is ready once connected, and its time starts only when told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demand_phases_move_a_jobs_windows_between_servers() {
    let secs = 3.0;
    let j = job("a", WorkloadParams { outstanding_per_server: Some(4), ..Default::default() }, secs);
    let phases = vec![(Nanos::ZERO, vec![1.0, 0.0]), (Nanos::from_secs_f64(1.5), vec![0.0, 1.0])];
    let (t, counts) = two_servers(j, phases, None, secs).await;
    for (k, &n) in counts.iter().enumerate() {
        assert!((600..=3300).contains(&n), "server {k} served {n} of the job's IOs, not up to 3,000: {counts:?}");
    }
    // Completions per server over a window of the run (500 ms intervals).
    let served = |server: usize, a: f64, b: f64| t.timeseries.server_ios(server, a, b);
    assert_eq!(served(1, 0.0, 1.5), 0, "server 1 serves nothing before its phase");
    assert_eq!(served(0, 2.0, 3.0), 0, "server 0 serves nothing once its phase is over");
    assert!(served(0, 0.0, 1.5) > 0 && served(1, 2.0, 3.0) > 0, "each serves in its phase");
    // The report counts them at their servers too.
    for (s, &n) in t.summary.servers.iter().zip(&counts) {
        assert!(within(s.iops * 3.0, n as f64, 5.0), "{} at {} IOPS over the run, {n} IOs served", s.name, s.iops);
    }
}

/// Open arrivals per window: 400 IOPS split 1 : 3 over the two servers for 1.5 s, then all at server 0
/// for 1.5 s, evenly spaced (the devices, 2,000 IOPS, keep up). Server 0 gets 100 x 1.5 + 400 x 1.5 = 750
/// requests, server 1 300 x 1.5 = 450 (with the workload's own arrivals instead, all 1,200 at server 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_arrivals_per_window_follow_the_shares_of_each_phase() {
    let secs = 3.0;
    let j = job("a", WorkloadParams { kind: "open".into(), iops: Some(400.0), ..Default::default() }, secs);
    let phases = vec![(Nanos::ZERO, vec![0.25, 0.75]), (Nanos::from_secs_f64(1.5), vec![1.0, 0.0])];
    let arrivals = rein_runtime::load::WindowArrivals { iops: 400.0, uniform: true };
    let (t, counts) = two_servers(j, phases, Some(arrivals), secs).await;
    // 3% for arrivals due in the run's last moments on a busy machine (the run ends at its duration).
    assert!(
        within(counts[0] as f64, 750.0, 3.0) && within(counts[1] as f64, 450.0, 3.0),
        "{counts:?} against 750 / 450"
    );
    assert!(within(t.summary.tenants[0].iops, 400.0, 3.0), "{}", t.summary.tenants[0].iops);
}
