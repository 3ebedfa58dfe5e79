//! pShift on real daemons: `rein pshift controller` and two `rein serve` servers with `[pshift]`
//! (scheduler = "token", queue depth 1, a device model of C IOPS each), driven by `rein load` closed
//! loops. Every process is a child on its own 127.0.0.x address, stopped at the end.
//!
//! Expected values from pShift's model, not from Rein's runs (pshift.txt §II-III): bucket b1 reserves
//! R = 0.7 C and has demand only at server s1; b2 reserves nothing and is backlogged at s1 and s2. The
//! controller must put all of b1's R-tokens at s1, where the token scheduler serves R-token holders first
//! and the rest round robin: b1 gets R + (C - R) / 2 at s1, b2 (C - R) / 2 there and C at s2. Without the controller the servers are
//! plain round robin (Algorithm 1 with no tokens): b1 and b2 get C / 2 each at s1. The test runs both: with
//! the controller, then after killing it (the servers fall back to round robin).
#![cfg(unix)]

mod common;

use common::{connect_from, measure_again, tmpdir, write_file, Rein, Server};
use std::path::Path;
use std::process::Command as Cmd;
use std::time::{Duration, Instant};

/// Each server's capacity (IOPS).
const C: f64 = 1000.0;
/// b1's reservation (IOPS).
const R: f64 = 700.0;

/// A pShift server `name` on 127.0.0.`host` reporting to `controller`, with buckets b1 and b2.
fn server(dir: &Path, host: u8, name: &str, controller: &str) -> Server {
    server_with(dir, host, name, controller, &["b1", "b2"])
}

/// [`server`] with the buckets `buckets`.
fn server_with(dir: &Path, host: u8, name: &str, controller: &str, buckets: &[&str]) -> Server {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let mut text = format!(
        "listen = \"127.0.0.{host}:0\"\nadmin = \"127.0.0.{host}:0\"\ndata_dir = \"{}\"\nscheduler = \"token\"\n\
         queue_depth = 1\n[device_model]\ncapacity_iops = {C}\nservice = \"exponential\"\n\
         [pshift]\ncontroller = \"{controller}\"\nname = \"{name}\"\n",
        d.join("data").display()
    );
    for b in buckets {
        text.push_str(&format!(
            "[[tenants]]\nname = \"{b}\"\n[[exports]]\nname = \"{b}\"\ntenant = \"{b}\"\nbackend = \"memory\"\nsize_mb = 16\n"
        ));
    }
    Rein::serve(&write_file(&d, "rein.toml", &text)).start()
}

/// The controller on 127.0.0.`host` (a fixed port: the servers need it before it starts).
fn controller(dir: &Path, listen: &str, admin_host: u8) -> Server {
    let buckets = format!("[[buckets]]\nname = \"b1\"\nreservation_iops = {R}\n[[buckets]]\nname = \"b2\"\n");
    controller_with(dir, listen, admin_host, 1.0, &buckets)
}

/// [`controller`] with a QoS period of `period_s` and the `[[buckets]]` text `buckets`.
fn controller_with(dir: &Path, listen: &str, admin_host: u8, period_s: f64, buckets: &str) -> Server {
    let text = format!(
        "listen = \"{listen}\"\nadmin = \"127.0.0.{admin_host}:0\"\nperiod_s = {period_s}\nintervals = 5\n\
         estimator = \"backlog\"\n\
         [[servers]]\nname = \"s1\"\ncapacity_iops = {C}\n[[servers]]\nname = \"s2\"\ncapacity_iops = {C}\n{buckets}"
    );
    Rein::new(&["pshift", "controller", "--config", write_file(dir, "ctl.toml", &text).to_str().unwrap()]).start()
}

/// Bucket `b`'s completions at `s` so far, and those in the reservation phase (its `/api/tenants/b`).
fn by_phase(s: &Server, b: &str) -> (u64, u64) {
    let (code, _, body) = common::http(s.admin, "GET", &format!("/api/tenants/{b}"), "", "");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k}: {v}"));
    (n("completed"), n("completed_reservation_phase"))
}

/// Bucket `b`'s IOs completed at a server so far.
fn completed(s: &Server, b: &str) -> u64 {
    by_phase(s, b).0
}

/// A controller on 127.0.0.`host` with QoS periods of 0.5 s and buckets b2 (no reservation, no limit)
/// and b3 (limited to `limit` IOPS), two servers at `host` + 1 and + 2 with both, and a `rein load` of
/// both buckets at each, started once both servers are welcomed.
struct LimitedPair {
    ctl: Server,
    s1: Server,
    s2: Server,
    _loads: [Load; 2],
}

fn limited_pair(dir: &Path, host: u8, limit: f64) -> LimitedPair {
    let listen = format!("127.0.0.{host}:{}", free_port(&format!("127.0.0.{host}")));
    let buckets = format!("[[buckets]]\nname = \"b2\"\n[[buckets]]\nname = \"b3\"\nlimit_iops = {limit}\n");
    let ctl = controller_with(dir, &listen, host, 0.5, &buckets);
    let s1 = server_with(dir, host + 1, "s1", &listen, &["b2", "b3"]);
    let s2 = server_with(dir, host + 2, "s2", &listen, &["b2", "b3"]);
    for s in [&s1, &s2] {
        s.wait_line("pShift link: welcomed by the controller");
    }
    let loads = [load(&s1, &["b2", "b3"]), load(&s2, &["b2", "b3"])];
    LimitedPair { ctl, s1, s2, _loads: loads }
}

/// A server that stalls (SIGSTOP for 150 ms, which always covers a whole report timeout of half a 100 ms
/// interval, so at least one of its reports misses its round) has its late report counted when it comes
/// (rein-core's controller, "Late reports"), and b3's limit holds in every judged period by the servers'
/// counts. Periods with a report missing inside them are judged: without the late report counted they
/// would be incomplete. So are periods whose closing report comes late (two stalls aimed at closing
/// boundaries): their records wait an interval for it. Before the welcome said which buckets are limited, the empty answer a silent
/// server gets left b3 unlimited there (its tenant has no limit of its own) until the next answer: b3
/// completed 201-236 IOs in one period in 13 of 22 runs of this test, none over 200 in 12 runs since (and
/// the controller keeps what the silent server may still spend out of the other's tokens: rein-core's
/// controller, "Late reports").
#[test]
fn a_stalled_servers_late_reports_count_and_the_limit_holds() {
    let _serial = common::measuring();
    const L: f64 = 400.0;
    let tmp = tmpdir("pshift-daemons-stall");
    let LimitedPair { ctl, s1: _s1, s2, _loads } = limited_pair(tmp.path(), 91, L);
    std::thread::sleep(Duration::from_secs(2));
    // Eight stalls of s2, 0.61 s apart (so they fall at different points of the 0.5 s period).
    for _ in 0..8 {
        s2.signal("-STOP");
        std::thread::sleep(Duration::from_millis(150));
        s2.signal("-CONT");
        std::thread::sleep(Duration::from_millis(460));
    }
    let get = |path: &str| -> serde_json::Value {
        let (code, _, body) = common::http(ctl.admin, "GET", path, "", "");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    // Two stalls timed on the controller's schedule: from about 30 ms before a closing boundary (every
    // fifth) to about 80 ms after it, so s2's closing report misses its round (timeout 50 ms) and comes
    // before the next boundary's round. The period then waits for it and is judged.
    let round = || -> u64 {
        let (code, _, body) = common::http(ctl.admin, "GET", "/metrics", "", "");
        assert_eq!(code, 200, "{body}");
        let line = body.lines().find_map(|l| l.strip_prefix("rein_pshift_round ")).expect("the round gauge");
        line.trim().parse().unwrap()
    };
    // A stall that missed its boundary on a loaded machine (a CI run: boundary 85's report was in) is
    // tried again: up to 10 aimed stalls, for two that hit (at least one).
    let mut aimed = Vec::new();
    let mut stalls = 0;
    for tries in 0.. {
        if aimed.len() == 2 || stalls == 10 {
            break;
        }
        assert!(tries < 60, "the controller's rounds could not be placed within 30 ms in {tries} tries");
        // Boundary b's round is computed a few ms after b (its reports in): the round gauge changing
        // between two readings places b, to within their span (a slow reading is not used).
        let first = round();
        let mut before = std::time::Instant::now();
        let (seen, b) = loop {
            let t0 = std::time::Instant::now();
            let r = round();
            if r != first {
                break (std::time::Instant::now(), r - 1);
            }
            before = t0;
            std::thread::sleep(Duration::from_millis(2));
        };
        if seen - before > Duration::from_millis(30) {
            continue;
        }
        let closing = (b + 2).div_ceil(5) * 5;
        let at = seen + Duration::from_millis(100 * (closing - b)) - Duration::from_millis(30);
        std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
        s2.signal("-STOP");
        std::thread::sleep(Duration::from_millis(110));
        s2.signal("-CONT");
        stalls += 1;
        std::thread::sleep(Duration::from_millis(300));
        // A hit: the closing boundary's round went without s2's report, and the next boundary's round
        // had it (the late report came within the interval that the period's record waits). On a loaded
        // machine (a CI run: periods 15-17 incomplete, one with 0 IOs of b3) s2 can stay silent past the
        // next round too; its record is then incomplete by design, and the stall is aimed again.
        let st = get("/api/pshift");
        let missing = |b: u64| {
            (st["rounds"].as_array().unwrap().iter())
                .find(|r| r["round"] == b && r["early"] == 0)
                .map(|r| r["reports_missing"].as_u64().unwrap())
        };
        let hit = missing(closing).is_some_and(|m| m > 0) && missing(closing + 1) == Some(0);
        if hit {
            aimed.push(closing);
        }
    }
    assert!(!aimed.is_empty(), "none of {stalls} stalls aimed at a closing boundary made its report late");
    std::thread::sleep(Duration::from_secs(1));
    let (st, list) = (get("/api/pshift"), get("/api/pshift/periods"));
    assert_eq!(st["refused"], 0, "{st}");
    let late = st["late_reports"].as_u64().unwrap();
    // Per period: whether a round in it (its opening boundary included) went without a report.
    let missed: std::collections::BTreeSet<u64> = (st["rounds"].as_array().unwrap().iter())
        .filter(|r| r["reports_missing"].as_u64().unwrap() > 0)
        .map(|r| r["period"].as_u64().unwrap())
        .collect();
    let b3: Vec<(u64, u64, bool)> = (list["periods"].as_array().unwrap().iter())
        .map(|r| (r["period"].as_u64().unwrap(), r["completed"][1].as_u64().unwrap(), r["incomplete"] == true))
        .collect();
    eprintln!("stalls: late reports counted {late}; periods with a round missing a report {missed:?}; b3 (period, IOs, incomplete) {b3:?}");
    assert!(late >= 1, "no late report counted: {st}");
    assert!(!missed.is_empty(), "no round went without a report: {st}");
    let judged: Vec<&(u64, u64, bool)> = b3.iter().filter(|p| !p.2).collect();
    assert!(judged.iter().all(|p| p.1 <= 200), "b3 above its limit of 200 IOs in a judged period: {b3:?}");
    assert!(
        judged.iter().any(|p| missed.contains(&p.0)),
        "no period with a report missing inside it was judged (late reports not counted?): {b3:?}, missed {missed:?}"
    );
    // The aimed stalls: the closing boundary's round went without s2's report, and the period it closed
    // was judged all the same (before its record waited for late reports, it was incomplete).
    for c in aimed {
        let round = (st["rounds"].as_array().unwrap().iter()).find(|r| r["round"] == c).expect("the round is kept");
        assert!(round["reports_missing"].as_u64().unwrap() > 0, "the stall missed boundary {c}'s round: {round}");
        let period = c / 5 - 1;
        let p = b3.iter().find(|p| p.0 == period).expect("the period is closed");
        assert!(!p.2, "period {period}, whose closing report came late, is incomplete: {b3:?}");
    }
}

/// The rates (per second) of the counters `count` reads, over one window of `secs` seconds. The tests
/// measure again after a window outside their bounds ([`common::measure_again`], up to three windows): a
/// CI run beside the one-hour test stalled the debug daemons for a second or more (b3 at 279 IOPS against
/// a limit of 400, with a half-second period of 0 IOs); a wrong scheduler (b3 served as a stranger, 1,000
/// IOPS) misses in every window.
fn rates<const N: usize>(secs: u64, count: &impl Fn() -> [u64; N]) -> [f64; N] {
    let (c0, t0) = (count(), Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    let (c1, elapsed) = (count(), t0.elapsed().as_secs_f64());
    std::array::from_fn(|i| (c1[i] - c0[i]) as f64 / elapsed)
}

/// `rein load` closed loops of 8 4 KiB random reads for 60 s against server `s`, one job per bucket;
/// killed when dropped (also when a check fails, so no load outlives its test).
fn load(s: &Server, jobs: &[&str]) -> Load {
    let mut c = Cmd::new(env!("CARGO_BIN_EXE_rein"));
    c.args(["load", "--addr", &s.nbd.to_string(), "--seconds", "60", "--warmup", "0"]);
    for j in jobs {
        c.args(["--job", &format!("name={j},depth=8,size=4k,random=100")]);
    }
    common::KillOnDrop(
        c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("rein load starts"),
    )
}

/// A running `rein load`, killed on drop.
type Load = common::KillOnDrop;

// The tests that time real rates against pShift's model take `common::measuring()`: each runs a
// controller, two debug servers whose device models serve one request at a time, and two or three `rein
// load`s; two such tests at once on two cores wake the servers late enough that a device idles between
// requests. Measured on 2026-11-30 with cargo's two test threads beside three busy loops: without the lock
// the rate tests failed in 3 runs of 3 (s1 serving 954 of its 1,000 IOPS, b2 1,367-1,410 of its 1,600
// over both servers); with it, 1 run of 3 passed beside busy loops at normal priority (a lone test's
// servers still lose 10-17 %), and 3 of 3 beside busy loops at nice 19, CI's load.

fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind(format!("{ip}:0")).unwrap().local_addr().unwrap().port()
}

#[test]
fn the_controller_keeps_a_reservation_that_round_robin_does_not() {
    let _serial = common::measuring();
    let tmp = tmpdir("pshift-daemons");
    let dir = tmp.path();
    let listen = format!("127.0.0.81:{}", free_port("127.0.0.81"));
    let mut ctl = controller(dir, &listen, 81);
    let s1 = server(dir, 82, "s1", &listen);
    let s2 = server(dir, 83, "s2", &listen);
    for s in [&s1, &s2] {
        s.wait_line("pShift link: welcomed by the controller");
    }
    let _loads = [load(&s1, &["b1", "b2"]), load(&s2, &["b2"])];
    // Settle (two QoS periods), then measure.
    std::thread::sleep(Duration::from_secs(3));
    // At s1 b1 spends its R-tokens first (Algorithm 1: R-token holders before the rest), then both share
    // what is left round robin: b1 = R + (C - R) / 2, b2 = (C - R) / 2; b2 has s2 to itself.
    let (want1, want2) = (R + (C - R) / 2.0, (C - R) / 2.0);
    let ok = |[b1, b2, b2_s2]: &[f64; 3]| {
        *b1 >= R && (b1 - want1).abs() <= want1 * 0.06 && (b2 - want2).abs() <= C * 0.06 && *b2_s2 >= C * 0.9
    };
    let count = || [completed(&s1, "b1"), completed(&s1, "b2"), completed(&s2, "b2")];
    let windows = measure_again(3, || rates(6, &count), ok);
    eprintln!("with the controller: [s1 b1, s1 b2, s2 b2] IOPS per window {windows:?}");
    let (code, _, body) = common::http(ctl.admin, "GET", "/api/pshift", "", "");
    assert_eq!(code, 200, "{body}");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(st["rounds"].as_array().unwrap().len() >= 10, "{st}");
    assert!(st["servers"].as_array().unwrap().iter().all(|s| s[1] == true), "{st}");
    let [b1, b2, b2_s2] = *windows.last().unwrap();
    assert!(b1 >= R && (b1 - want1).abs() <= want1 * 0.06, "b1 at s1: {b1:.0} IOPS, want {want1} (R {R}); {windows:?}");
    assert!((b2 - want2).abs() <= C * 0.06, "b2 at s1: {b2:.0} IOPS, want {want2}; {windows:?}");
    assert!(b2_s2 >= C * 0.9, "b2 at s2: {b2_s2:.0}; {windows:?}");
    // Without the controller: round robin, C / 2 each at s1 (b1 well under its reservation), within
    // seconds of the controller's end.
    let t0 = Instant::now();
    ctl.terminate(Duration::from_secs(10));
    s1.wait_line("serving plain round robin until it answers");
    assert!(t0.elapsed() < Duration::from_secs(15), "round robin after {:?}", t0.elapsed());
    std::thread::sleep(Duration::from_secs(1));
    let half = |r: &f64| (r - C / 2.0).abs() <= C * 0.08;
    let count = || [completed(&s1, "b1"), completed(&s1, "b2")];
    let windows = measure_again(3, || rates(3, &count), |[b1, b2]| half(b1) && half(b2));
    eprintln!("round robin: [s1 b1, s1 b2] IOPS per window {windows:?}");
    let [rr1, rr2] = *windows.last().unwrap();
    assert!(half(&rr1) && half(&rr2), "round robin: b1 {rr1:.0}, b2 {rr2:.0}; {windows:?}");
}

/// Bad controller files and bad `[pshift]` tables are one-line errors naming the key; a server whose name
/// the controller does not know is refused by name (and keeps serving round robin).
#[test]
fn bad_configs_and_unknown_servers_are_named() {
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-bad");
    let dir = tmp.path();
    let head = "listen = \"127.0.0.84:0\"\nperiod_s = 1\n";
    let srv = "[[servers]]\nname = \"s1\"\ncapacity_iops = 100\n";
    for (body, want) in [
        (format!("{head}intervals = 0\n{srv}"), "intervals must be in 1..=1000, got 0"),
        (
            format!("{head}estimator = \"psychic\"\n{srv}"),
            "estimator \"psychic\": expected \"arrivals\" or \"backlog\"",
        ),
        (head.to_string(), "[[servers]]: between 1 and 1024 servers, got 0"),
        (format!("{head}{srv}{srv}"), "two servers are named \"s1\""),
        (
            format!("{head}{srv}[[buckets]]\nname = \"b\"\nreservation_iops = 10\nlimit_iops = 5\n"),
            "bucket b: limit_iops must be in [reservation_iops, 1e9], got 5",
        ),
        (format!("{head}perod_s = 2\n{srv}"), "ctl.toml: line 3, column 1: unknown field `perod_s`"),
        (format!("{head}{srv}[[buckets]]\nname = 7\n"), "ctl.toml: line 7, column 8: invalid type: integer `7`"),
        (format!("listen = \"x\"\nperiod_s = 1\n{srv}"), "listen \"x\" is not an address"),
    ] {
        let cfg = write_file(dir, "ctl.toml", &body);
        let out = Cmd::new(env!("CARGO_BIN_EXE_rein"))
            .args(["pshift", "controller", "--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{body}: started");
        assert!(err.contains(want), "{body}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{body}: one line: {err}");
    }
    // [pshift] needs the token scheduler.
    let d = dir.join("mclock");
    std::fs::create_dir_all(&d).unwrap();
    let text = format!(
        "listen = \"127.0.0.85:0\"\nadmin = \"127.0.0.85:0\"\ndata_dir = \"{}\"\n[pshift]\ncontroller = \"127.0.0.1:9\"\n\
         name = \"s1\"\n[[exports]]\nname = \"b1\"\nbackend = \"memory\"\nsize_mb = 1\n",
        d.join("data").display()
    );
    let err = Rein::serve(&write_file(&d, "rein.toml", &text)).fails();
    assert!(err.contains("[pshift] needs scheduler = \"token\""), "{err}");
    // The token scheduler's variant: the simulator's keys, errors naming them; controller and name together.
    for (table, want) in [
        ("r_order = \"fifo\"\n", "pshift.r_order \"fifo\": expected round_robin, proportional or mixed"),
        ("r_order = \"round_robin\"\nr_floor_ios = 40\n", "pshift.r_floor_ios is a setting of r_order = \"mixed\""),
        ("controller = \"127.0.0.1:9\"\n", "pshift.controller and pshift.name go together"),
    ] {
        let text = format!(
            "listen = \"127.0.0.85:0\"\nadmin = \"127.0.0.85:0\"\ndata_dir = \"{}\"\nscheduler = \"token\"\n[pshift]\n{table}\
             [[exports]]\nname = \"b1\"\nbackend = \"memory\"\nsize_mb = 1\n",
            d.join("data").display()
        );
        let err = Rein::serve(&write_file(&d, "rein.toml", &text)).fails();
        assert!(err.contains(want), "{table}: {err}");
    }
    // A server the controller does not know.
    let listen = format!("127.0.0.86:{}", free_port("127.0.0.86"));
    let ctl = controller(dir, &listen, 86);
    let s = server(dir, 87, "s9", &listen);
    s.wait_line("the controller refused this server: no server named \"s9\" in the controller's configuration");
    // Counted where the docs say (it was not), and a SIGHUP does not end the controller (its default
    // action once ended it without a word, and the servers' limits with it): it reloads ctl.toml, which
    // has not changed.
    let refused = || {
        let (status, _, body) = common::http(ctl.admin, "GET", "/api/pshift", "", "");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["refused"].as_u64().unwrap()
    };
    assert!(refused() >= 1, "an unknown server's hello is a refusal");
    ctl.signal("-HUP");
    let line = ctl.wait_line("configuration reloaded");
    assert!(line.contains("applied=0") && line.contains("needs_restart=0"), "{line}");
    assert!(refused() >= 1, "the controller still answers after SIGHUP");
    // A changed bucket needs a restart, and says so.
    let path = dir.join("ctl.toml");
    std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replacen("name = \"b1\"", "name = \"b9\"", 1))
        .unwrap();
    ctl.signal("-HUP");
    // The file as given to --config is named (until 2026-12-07 the line said "ctl.toml" whatever its name).
    ctl.wait_line(&format!(
        "{}'s servers, buckets, periods, addresses or access changed: needs a restart",
        path.display()
    ));
}

/// A limit holds across servers (pShift's point: L_i per period over all of them). Bucket b3 is limited to
/// L = 400 IOPS and backlogged at both servers beside b2 (no reservation, no limit), with QoS periods of
/// 0.5 s. pShift's model: b3's L-tokens (L x period over both servers) are all it may do, so b3 completes
/// L per second in total, and b2 the rest of both servers (2 C - L). Plain round robin would give b3 C / 2
/// at each server, 1,000 IOPS in all. Counted from the servers' completion counters over 6 s (12 periods:
/// a window not aligned to the periods is off by at most one period's L, 200 IOs, 8%).
#[test]
fn a_limit_holds_across_servers() {
    let _serial = common::measuring();
    const L: f64 = 400.0;
    let tmp = tmpdir("pshift-daemons-limit");
    let LimitedPair { ctl, s1, s2, _loads } = limited_pair(tmp.path(), 88, L);
    std::thread::sleep(Duration::from_secs(3));
    let count = |b: &str| completed(&s1, b) + completed(&s2, b);
    let b3_ok = |b3: &f64| (L * 0.9..=L * 1.08).contains(b3);
    let b2_ok = |b2: &f64| (b2 - (2.0 * C - L)).abs() <= 2.0 * C * 0.08;
    let both = || [count("b3"), count("b2")];
    let windows = measure_again(3, || rates(6, &both), |[b3, b2]| b3_ok(b3) && b2_ok(b2));
    eprintln!("limit across servers: [b3, b2] IOPS per window {windows:?} (L {L})");
    let [b3, b2] = *windows.last().unwrap();
    assert!((L * 0.9..=L * 1.08).contains(&b3), "b3 over both servers: {b3:.0} IOPS, limit {L}");
    assert!((b2 - (2.0 * C - L)).abs() <= 2.0 * C * 0.08, "b2: {b2:.0} IOPS, want {}", 2.0 * C - L);
    // By the servers' own counts (the controller's tally of closed periods), no period of b3 passed its
    // limit of L x 0.5 s = 200 IOs: the controller's invariant 4, on real daemons.
    let (code, _, body) = common::http(ctl.admin, "GET", "/api/pshift", "", "");
    assert_eq!(code, 200, "{body}");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    let p = &st["buckets"][1]["periods"];
    assert_eq!(st["buckets"][1]["name"], "b3");
    assert!(p["closed"].as_u64().unwrap() >= 16, "{p}");
    assert_eq!(p["above_limit"], 0, "b3's periods by the servers' counts: {p}");
    // The same periods one by one (`/api/pshift/periods`): b3's count in each within its 200, and b3's
    // IOs over them at its limit's rate (the tally read above may lag the list by a period).
    let (code, _, body) = common::http(ctl.admin, "GET", "/api/pshift/periods", "", "");
    assert_eq!(code, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let periods = list["periods"].as_array().unwrap();
    assert!(periods.len() as u64 >= p["closed"].as_u64().unwrap(), "{body}");
    assert_eq!(list["dropped"], 0);
    // A period with a server's report still missing when it closed (late, on a loaded machine) is not
    // judged: its count is not exact. (One read 204 in CI beside the one-hour test: a server whose report
    // was late got an answer listing nothing and served b3 without bound until the next one, fixed with
    // the welcome's limit flags; `a_stalled_servers_late_reports_count_and_the_limit_holds`.)
    let b3: Vec<(u64, bool)> =
        periods.iter().map(|r| (r["completed"][1].as_u64().unwrap(), r["incomplete"] == true)).collect();
    eprintln!("b3 per period (IOs, incomplete): {b3:?}; late reports counted: {}", st["late_reports"]);
    let complete: Vec<u64> = b3.iter().filter(|p| !p.1).map(|p| p.0).collect();
    assert!(complete.len() >= 4, "b3's IOs per period (count, incomplete): {b3:?}");
    assert!(complete.iter().all(|&n| n <= 200), "b3's IOs per period (count, incomplete): {b3:?}");
    let mean = complete.iter().sum::<u64>() as f64 / complete.len() as f64;
    assert!(mean >= 0.9 * 200.0, "b3's IOs per complete period, at its limit: {b3:?}");
}

/// Early rounds on real daemons (rein-core's controller, "Early rounds"; beyond the paper): a bucket whose
/// demand appears at a server mid-period, where the latest tokens gave it nothing, is noted to the
/// controller by the server, and the early round gives it R-tokens there before the next boundary. With
/// one redistribution interval of 4 s per period, bucket b1 (R = 700 IOPS, 2,800 IOs a period) starts at
/// s2 1.5 s after the first boundary, beside b2 backlogged there. The schedule starts (`hold`, then
/// `PUT /api/pshift/start`) once both servers are linked. With a fixed start 1 s after the controller's,
/// a loaded machine that takes longer to start the servers leaves the first boundary without their
/// reports and the servers without an answer, and then no early round can start: the likely cause of
/// a CI failure on 2026-11-30 (515 IOPS with early rounds, the round robin's rate). With early rounds it holds R-tokens at s2
/// within a few milliseconds: served first, all of s2's C = 1,000 IOPS until the boundary; without (the
/// paper's controller, `early_rounds = 0`) it waits for the boundary, served round robin: half. Measured
/// from 0.2 s after b1's first completion at s2 (3 s at the earliest) to 4.5 s, as b1's share of s2's
/// completions: a machine too loaded to keep s2 at C (beside three busy loops: 815-891 IOPS, with b1's
/// R-tokens in place) still serves b1 first. Another CI failure (485 IOPS, the early round answered 13 ms
/// after b1's load began) was an early report cut with only b1's first request at s2, already dispatched:
/// the controller now counts the stray bucket backlogged where it strayed.
#[test]
fn an_early_round_serves_a_bucket_that_moved_before_the_next_boundary() {
    let _serial = common::measuring();
    let tmp = tmpdir("pshift-daemons-early");
    // b1's share of s2's completions, its IOPS, and the controller's rounds for the failure message.
    let run = |early: u32, ip: u8| -> (Window, String) {
        let dir = tmp.path().join(format!("early{early}"));
        std::fs::create_dir_all(&dir).unwrap();
        let listen = format!("127.0.0.{ip}:{}", free_port(&format!("127.0.0.{ip}")));
        let text = format!(
            "listen = \"{listen}\"\nadmin = \"127.0.0.{ip}:0\"\nperiod_s = 4\nintervals = 1\nstart_s = 1\nhold = true\n\
             estimator = \"backlog\"\nearly_rounds = {early}\n\
             [[servers]]\nname = \"s1\"\ncapacity_iops = {C}\n[[servers]]\nname = \"s2\"\ncapacity_iops = {C}\n\
             [[buckets]]\nname = \"b1\"\nreservation_iops = {R}\n[[buckets]]\nname = \"b2\"\n"
        );
        let cfg = write_file(&dir, "ctl.toml", &text);
        let ctl = Rein::new(&["pshift", "controller", "--config", cfg.to_str().unwrap()]).start();
        let s1 = server(&dir, ip + 1, "s1", &listen);
        let s2 = server(&dir, ip + 2, "s2", &listen);
        for s in [&s1, &s2] {
            s.wait_line("pShift link: welcomed by the controller");
        }
        // The schedule starts once both servers are linked (`hold`), however long a loaded machine took to
        // start them: its first boundary is then 1 s from here, with both servers reporting.
        let (code, _, body) = common::http(ctl.admin, "PUT", "/api/pshift/start", "", "{}");
        assert_eq!(code, 200, "{body}");
        let t0 = Instant::now();
        let mut loads = vec![load(&s1, &["b2"]), load(&s2, &["b2"])];
        // The first boundary is at 1 s; b1 appears at s2 at 2.5 s (after the first fifth of the interval,
        // when the controller allows the first early round), measured from 3 s to 4.5 s (the next boundary
        // is at 5 s).
        let at = |s: f64| {
            let d = Duration::from_secs_f64(s).saturating_sub(t0.elapsed());
            std::thread::sleep(d);
        };
        at(2.5);
        loads.push(load(&s2, &["b1"]));
        // A loaded machine can take hundreds of ms to start the load (a CI run's early round was answered
        // at 3.137 s, a few ms after b1's first request, and the window from 3.0 s read 869 IOPS): the
        // window opens 0.2 s after b1's first completion at s2, and at 3.0 s at the earliest.
        let first = loop {
            if completed(&s2, "b1") > 0 {
                break t0.elapsed().as_secs_f64();
            }
            assert!(t0.elapsed() < Duration::from_millis(3600), "b1's load did not start at s2 by 3.6 s");
            std::thread::sleep(Duration::from_millis(10));
        };
        at((first + 0.2).max(3.0));
        let ((c0, r0), o0, m0) = (by_phase(&s2, "b1"), completed(&s2, "b2"), Instant::now());
        at(4.5);
        let ((c1, r1), o1) = (by_phase(&s2, "b1"), completed(&s2, "b2"));
        let rate = (c1 - c0) as f64 / m0.elapsed().as_secs_f64();
        let share = (c1 - c0) as f64 / ((c1 - c0) + (o1 - o0)).max(1) as f64;
        let resv = (r1 - r0) as f64 / (c1 - c0).max(1) as f64;
        let (_, _, body) = common::http(ctl.admin, "GET", "/api/pshift", "", "");
        let st: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let rounds: Vec<String> = st["rounds"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .map(|r| {
                        format!(
                            "({}, {}, {:.3} s, {}, wanted {}, r_phi {})",
                            r["round"],
                            r["early"],
                            r["at_s"].as_f64().unwrap_or(f64::NAN),
                            r["reports_missing"],
                            r["wanted"],
                            r["r_phi"]
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        (Window { share, rate, resv }, rounds.join(" "))
    };
    let ((with, rounds_with), (without, rounds_without)) = (run(4, 91), run(0, 94));
    eprintln!("b1 at s2 after its move, with early rounds: {with}; without: {without}; rounds {rounds_with}");
    // The mechanism: b1's IOs at s2 spend R-tokens. The effect: b1 is served first, nearly all of s2
    // (round robin gives half, 50 +- 10%; a machine too loaded to keep b1's queue full lets b2 in now and
    // then: 82-85% beside three busy loops at normal priority).
    assert!(
        with.resv >= 0.9 && (with.share >= 0.9 || (with.share >= 0.75 && with.rate < 0.9 * C)),
        "with early rounds b1 holds R-tokens at s2 and is served first: {with}; \
         rounds (round, early, answered at, reports missing): {rounds_with}"
    );
    assert!(
        without.resv == 0.0 && (without.share - 0.5).abs() <= 0.1,
        "without, round robin until the boundary: {without}; rounds: {rounds_without}"
    );
}

/// What the early-round test measures of b1 at s2 in its window.
struct Window {
    /// b1's share of s2's completions.
    share: f64,
    /// b1's IOPS.
    rate: f64,
    /// The share of b1's completions served in the reservation phase (on R-tokens).
    resv: f64,
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1}% of s2's completions, {:.0} IOPS, {:.1}% of them on R-tokens",
            100.0 * self.share,
            self.rate,
            100.0 * self.resv
        )
    }
}

/// A server `name` on 127.0.0.`host` with bucket b1, linked to `controller` with the `[pshift.tls]` text
/// `tls` (empty: plain).
fn link_server(dir: &Path, host: u8, name: &str, controller: &str, tls: &str) -> Server {
    let d = dir.join(format!("{name}-{host}"));
    std::fs::create_dir_all(&d).unwrap();
    let text = format!(
        "listen = \"127.0.0.{host}:0\"\nadmin = \"127.0.0.{host}:0\"\ndata_dir = \"{}\"\nscheduler = \"token\"\n\
         [pshift]\ncontroller = \"{controller}\"\nname = \"{name}\"\n{tls}\
         [[tenants]]\nname = \"b1\"\n[[exports]]\nname = \"b1\"\ntenant = \"b1\"\nbackend = \"memory\"\nsize_mb = 1\n",
        d.join("data").display()
    );
    Rein::serve(&write_file(&d, "rein.toml", &text)).start()
}

/// A server's link to its controller shows on its `/metrics` (alert ReinPshiftControllerLinkDown):
/// `rein_pshift_controller_connected` is 0 while there is no controller (the server starts first and
/// serves plain round robin), 1 once the controller has welcomed it, and 0 again after the controller is
/// gone. Before, a server that had lost its controller had no series that said so, only log lines.
#[test]
fn a_servers_metrics_show_its_link_to_the_controller() {
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-link-metric");
    let listen = format!("127.0.0.112:{}", free_port("127.0.0.112"));
    let s = link_server(tmp.path(), 113, "s1", &listen, "");
    let series = format!("rein_pshift_controller_connected{{controller=\"{listen}\",server=\"s1\"}}");
    let connected = || common::series_value(&common::metrics(s.admin), &series);
    s.wait_line("serving plain round robin until it answers");
    assert_eq!(connected(), 0.0, "no controller yet");
    let text = format!(
        "listen = \"{listen}\"\nadmin = \"127.0.0.112:0\"\nperiod_s = 1\n\
         [[servers]]\nname = \"s1\"\ncapacity_iops = 100\n[[buckets]]\nname = \"b1\"\n"
    );
    let cfg = write_file(tmp.path(), "ctl.toml", &text);
    let mut ctl = Rein::new(&["pshift", "controller", "--config", cfg.to_str().unwrap()]).start();
    // The server retries at most 5 s apart.
    common::wait_for("the link up", Duration::from_secs(15), connected, |v| *v == 1.0);
    s.wait_line("pShift link: welcomed by the controller");
    ctl.terminate(Duration::from_secs(10));
    common::wait_for("the link down", Duration::from_secs(15), connected, |v| *v == 0.0);
}

/// The controller link over TLS-PSK: with `[tls]` in ctl.toml every connection must complete a TLS
/// handshake before its hello, and with `allow_identities` only those PSK identities may say hello. A
/// server with the right key is welcomed; a plain server, a server with a wrong key, and one whose
/// identity is known but not allowed are not, and keep serving round robin (each says why in its log).
/// The server with the wrong key is welcomed once its key file is mended and it reloads; a server whose
/// identity the controller's key file loses at a reload has its open link cut. s2 is bound to identity
/// s2 (`identity`): s1's key, admitted, may not say hello as s2 (it could report for s2, or keep it out
/// as "connected already").
#[test]
fn the_controller_link_runs_tls_psk_and_refuses_the_rest() {
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-tls");
    let dir = tmp.path();
    let key = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let other = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";
    write_file(dir, "ctl.psk", &format!("s1:{key}\ns2:{key}\nx:{key}\n"));
    let listen = format!("127.0.0.101:{}", free_port("127.0.0.101"));
    let text = format!(
        "listen = \"{listen}\"\nadmin = \"127.0.0.101:0\"\nperiod_s = 1\nallow_identities = [\"s1\", \"s2\"]\n\
         [tls]\npsk_file = \"ctl.psk\"\n[[servers]]\nname = \"s1\"\ncapacity_iops = {C}\n[[servers]]\nname = \"s2\"\n\
         capacity_iops = {C}\nidentity = \"s2\"\n[[buckets]]\nname = \"b1\"\n"
    );
    let ctl =
        Rein::new(&["pshift", "controller", "--config", write_file(dir, "ctl.toml", &text).to_str().unwrap()]).start();
    let server = |host: u8, name: &str, tls: &str| link_server(dir, host, name, &listen, tls);
    write_file(dir, "s1.psk", &format!("s1:{key}\n"));
    let good = server(102, "s1", &format!("[pshift.tls]\npsk_file = \"{}\"\n", dir.join("s1.psk").display()));
    good.wait_line("pShift link: welcomed by the controller");
    let plain = server(103, "s2", "");
    plain.wait_line("serving plain round robin until it answers");
    write_file(dir, "s2-wrong.psk", &format!("s2:{other}\n"));
    let wrong = server(104, "s2", &format!("[pshift.tls]\npsk_file = \"{}\"\n", dir.join("s2-wrong.psk").display()));
    wrong.wait_line("TLS handshake");
    write_file(dir, "x.psk", &format!("x:{key}\n"));
    let stranger = server(105, "s2", &format!("[pshift.tls]\npsk_file = \"{}\"\n", dir.join("x.psk").display()));
    stranger.wait_line("serving plain round robin until it answers");
    ctl.wait_line("identity \"x\" is not in allow_identities");
    let posing = server(106, "s2", &format!("[pshift.tls]\npsk_file = \"{}\"\n", dir.join("s1.psk").display()));
    posing.wait_line("serving plain round robin until it answers");
    ctl.wait_line("server s2 connects with identity \"s2\" only, not \"s1\"");
    for s in [&plain, &wrong, &stranger, &posing] {
        assert!(
            s.wait_log(&["serving plain round robin"], Duration::from_secs(1)).contains("pShift link"),
            "a refused server says so"
        );
    }
    let (code, _, body) = common::http(ctl.admin, "GET", "/api/pshift", "", "");
    assert_eq!(code, 200, "{body}");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(st["servers"][0][1], true, "s1 connected: {st}");
    assert_eq!(st["servers"][1][1], false, "no s2 got in: {st}");
    assert!(st["refused"].as_u64().unwrap() >= 1, "{st}");
    // The wrong key replaced in place and the server reloaded (SIGHUP): its link's next connection uses
    // the new key and is welcomed, without a restart (crates/rein-runtime/src/tls.rs, "Reload").
    write_file(dir, "s2-wrong.psk", &format!("s2:{key}\n"));
    wrong.signal("-HUP");
    wrong.wait_line("reload: [pshift.tls]: new credentials");
    wrong.wait_line("pShift link: welcomed by the controller");
    let (_, _, body) = common::http(ctl.admin, "GET", "/api/pshift", "", "");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(st["servers"][1][1], true, "s2 connected after its reload: {st}");
    // The controller's key file loses s1 and the controller reloads: s1's open link is cut, not only its
    // next connection refused (crates/rein-runtime/src/tls.rs, "Reload").
    write_file(dir, "ctl.psk", &format!("s2:{key}\nx:{key}\n"));
    ctl.signal("-HUP");
    ctl.wait_line("closing a TLS connection: its PSK identity is no longer in tls.psk_file");
    let line = ctl.wait_line("reload: [tls]: 1 server connection closed");
    assert!(line.contains("the new credentials revoke their server"), "{line}");
    let t0 = std::time::Instant::now();
    loop {
        let (_, _, body) = common::http(ctl.admin, "GET", "/api/pshift", "", "");
        let st: serde_json::Value = serde_json::from_str(&body).unwrap();
        if st["servers"][0][1] == false {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "s1 still connected: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // allow_identities without [tls] is refused at load, naming both.
    let text = "listen = \"127.0.0.101:0\"\nperiod_s = 1\nallow_identities = [\"s1\"]\n[[servers]]\nname = \"s1\"\ncapacity_iops = 1\n";
    let out = Cmd::new(env!("CARGO_BIN_EXE_rein"))
        .args(["pshift", "controller", "--config", write_file(dir, "bad.toml", text).to_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("allow_identities needs a [tls] table"));
    // So is a server's identity.
    let text =
        "listen = \"127.0.0.101:0\"\nperiod_s = 1\n[[servers]]\nname = \"s1\"\ncapacity_iops = 1\nidentity = \"s1\"\n";
    let out = Cmd::new(env!("CARGO_BIN_EXE_rein"))
        .args(["pshift", "controller", "--config", write_file(dir, "bad.toml", text).to_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("server s1: identity needs a [tls] table"));
}

/// The controller link over x509: the controller's certificate (for its IP address) chains to the CA the
/// servers trust, and the servers' client certificates to the CA in its `[tls] ca`; `allow_identities`
/// admits certificate CNs. A server with its certificate is welcomed; one without a client certificate
/// is cut by the controller's alert, one whose CN is not allowed is refused. Both sides' `/metrics` give
/// their certificate's expiry.
#[test]
fn the_controller_link_runs_x509_with_client_certificates() {
    let _shared = common::beside_measuring();
    use common::tls::{make_ca, make_cert, server as server_ext, CLIENT};
    let tmp = tmpdir("pshift-daemons-x509");
    let dir = tmp.path();
    make_ca(dir, "ca", "rein test CA");
    make_cert(dir, "ca", "ctl", "controller", &server_ext("IP:127.0.0.106"));
    make_cert(dir, "ca", "s1", "s1", CLIENT);
    make_cert(dir, "ca", "s2", "s2", CLIENT);
    let listen = format!("127.0.0.106:{}", free_port("127.0.0.106"));
    let text = format!(
        "listen = \"{listen}\"\nadmin = \"127.0.0.106:0\"\nperiod_s = 1\nallow_identities = [\"s1\"]\n\
         [tls]\ncert = \"ctl-cert.pem\"\nkey = \"ctl-key.pem\"\nca = \"ca-cert.pem\"\n\
         [[servers]]\nname = \"s1\"\ncapacity_iops = {C}\n[[servers]]\nname = \"s2\"\ncapacity_iops = {C}\n\
         [[buckets]]\nname = \"b1\"\n"
    );
    let ctl =
        Rein::new(&["pshift", "controller", "--config", write_file(dir, "ctl.toml", &text).to_str().unwrap()]).start();
    let server = |host: u8, name: &str, client: Option<&str>| -> Server {
        let mut tls = format!("[pshift.tls]\nca = \"{}\"\n", dir.join("ca-cert.pem").display());
        if let Some(c) = client {
            tls.push_str(&format!(
                "cert = \"{}\"\nkey = \"{}\"\n",
                dir.join(format!("{c}-cert.pem")).display(),
                dir.join(format!("{c}-key.pem")).display()
            ));
        }
        link_server(dir, host, name, &listen, &tls)
    };
    let good = server(107, "s1", Some("s1"));
    good.wait_line("pShift link: welcomed by the controller");
    // TLS 1.3: the client's side of the handshake completes first; the controller's alert comes with
    // the first read.
    let anonymous = server(108, "s2", None);
    anonymous.wait_line("certificate required");
    let stranger = server(109, "s2", Some("s2"));
    stranger.wait_line("serving plain round robin until it answers");
    ctl.wait_line("identity \"s2\" is not in allow_identities");
    let (code, _, body) = common::http(ctl.admin, "GET", "/api/pshift", "", "");
    assert_eq!(code, 200, "{body}");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((st["servers"][0][1].clone(), st["servers"][1][1].clone()), (true.into(), false.into()), "{st}");
    // Each certificate's expiry in /metrics: the controller's own, and s1's client certificate.
    let expiry = |admin, use_: &str| {
        let series = format!("rein_tls_certificate_expiration_timestamp_seconds{{use=\"{use_}\"}}");
        common::series_value(&common::metrics(admin), &series) as i64
    };
    assert_eq!(expiry(ctl.admin, "controller"), common::tls::not_after(dir, "ctl-cert.pem"));
    assert_eq!(expiry(good.admin, "pshift_tls"), common::tls::not_after(dir, "s1-cert.pem"));
    // The controller's certificate renewed in place (30 days, was 2) and the controller reloaded: its
    // metric moves, and a server that connects then is welcomed under the new certificate.
    common::tls::make_cert_for(dir, "ca", "ctl2", "controller", &server_ext("IP:127.0.0.106"), 30);
    std::fs::copy(dir.join("ctl2-cert.pem"), dir.join("ctl-cert.pem")).unwrap();
    std::fs::copy(dir.join("ctl2-key.pem"), dir.join("ctl-key.pem")).unwrap();
    ctl.signal("-HUP");
    ctl.wait_line("reload: [tls]: new credentials");
    assert_eq!(expiry(ctl.admin, "controller"), common::tls::not_after(dir, "ctl2-cert.pem"));
    drop(good);
    let again = server(110, "s1", Some("s1"));
    again.wait_line("pShift link: welcomed by the controller");
    drop(again);
    // `[pshift.tls] crl`: with the CA's CRL, empty, s1 is welcomed; once the CRL lists the controller's
    // certificate and s1 reloads, its open link is cut and its reconnects are refused.
    common::tls::make_crl(dir, "ca", "crl.pem");
    let tls = format!(
        "[pshift.tls]\nca = \"{d}/ca-cert.pem\"\ncert = \"{d}/s1-cert.pem\"\nkey = \"{d}/s1-key.pem\"\n\
         crl = \"{d}/crl.pem\"\n",
        d = dir.display()
    );
    let revoking = link_server(dir, 111, "s1", &listen, &tls);
    revoking.wait_line("pShift link: welcomed by the controller");
    common::tls::revoke(dir, "ca", "ctl2");
    common::tls::make_crl(dir, "ca", "crl.pem");
    revoking.signal("-HUP");
    revoking.wait_line("closing a TLS link: its server's certificate (CN=controller) is revoked (pshift.tls.crl)");
    revoking.wait_line("reload: [pshift.tls]: the link to the controller closed: the new crl revokes its certificate");
    revoking.wait_line("the server's certificate is revoked: pshift.tls.crl lists it");
}

/// A tenant created at run time (the admin API) whose name is a bucket's becomes that bucket at the next
/// boundary, without the link reconnecting: the setting of [`a_limit_holds_across_servers`] with b3
/// created on both servers after they were welcomed. b3 must then complete L per second over both
/// servers; served as a stranger (the round robin's unlimited class) it would get C / 2 at each, 1,000.
#[test]
fn a_tenant_created_at_run_time_becomes_its_bucket() {
    let _serial = common::measuring();
    const L: f64 = 400.0;
    const JSON: &str = "Content-Type: application/json\r\n";
    let tmp = tmpdir("pshift-daemons-runtime");
    let dir = tmp.path();
    let listen = format!("127.0.0.115:{}", free_port("127.0.0.115"));
    let buckets = format!("[[buckets]]\nname = \"b2\"\n[[buckets]]\nname = \"b3\"\nlimit_iops = {L}\n");
    let _ctl = controller_with(dir, &listen, 115, 0.5, &buckets);
    let s1 = server_with(dir, 116, "s1", &listen, &["b2"]);
    let s2 = server_with(dir, 117, "s2", &listen, &["b2"]);
    for s in [&s1, &s2] {
        s.wait_line("pShift link: welcomed by the controller");
        let (code, _, body) = common::http(s.admin, "POST", "/api/tenants", JSON, r#"{"name": "b3"}"#);
        assert_eq!(code, 201, "{body}");
        let export = r#"{"name": "b3", "path": "b3.img", "size_mb": 16, "tenant": "b3"}"#;
        let (code, _, body) = common::http(s.admin, "POST", "/api/exports", JSON, export);
        assert_eq!(code, 201, "{body}");
        s.wait_line("a tenant created since the welcome is this bucket here now");
    }
    let _loads = [load(&s1, &["b2", "b3"]), load(&s2, &["b2", "b3"])];
    std::thread::sleep(Duration::from_secs(3));
    let count = || [completed(&s1, "b3") + completed(&s2, "b3")];
    let windows = measure_again(3, || rates(6, &count), |[b3]| (L * 0.9..=L * 1.08).contains(b3));
    eprintln!("a bucket created at run time: b3 IOPS per window {windows:?} (L {L})");
    let [b3] = *windows.last().unwrap();
    assert!((L * 0.9..=L * 1.08).contains(&b3), "b3 over both servers: {windows:?} IOPS in each window, limit {L}");
}

/// A controller that did not run for a while (SIGSTOP 10 s: a paused VM, a debugger) gets its servers
/// back in step: the servers break their silent links after 5 s (plain round robin meanwhile), and once
/// it runs again and has welcomed them again, b3 (limited to 400 IOPS over both servers) is served again at each
/// server within its limit. Before, a server whose boundary schedule came out of the stall ahead of the
/// controller's kept cutting its reports one round early for good, so every answer came stale and was
/// dropped: b3 got nothing there (its queued requests waited until the server stopped) and the
/// controller's own status looked healthy (a review found it; 3 s stalls did it too).
#[test]
fn servers_follow_the_controller_again_after_it_stalls() {
    let _serial = common::measuring();
    let tmp = tmpdir("pshift-daemons-ctl-stall");
    let p = limited_pair(tmp.path(), 140, 400.0);
    std::thread::sleep(Duration::from_secs(2));
    p.ctl.signal("-STOP");
    std::thread::sleep(Duration::from_secs(10));
    p.ctl.signal("-CONT");
    // Silent for over 5 s, the controller lost both links (the servers served plain round robin
    // meanwhile, pshift_link's SILENCE_TIMEOUT); they follow it again once it has welcomed them again.
    for s in [&p.s1, &p.s2] {
        let welcomes = || s.log.lock().unwrap().iter().filter(|l| l.contains("welcomed by the controller")).count();
        common::wait_for("a second welcome after the stall", Duration::from_secs(20), welcomes, |n| *n >= 2);
    }
    std::thread::sleep(Duration::from_secs(3));
    let [b3_s1, b3_s2] = rates(4, &|| [completed(&p.s1, "b3"), completed(&p.s2, "b3")]);
    assert!(b3_s1 > 40.0 && b3_s2 > 40.0, "b3 after the stall: {b3_s1:.0} and {b3_s2:.0} IOPS");
    assert!(b3_s1 + b3_s2 <= 400.0 * 1.15, "b3's limit: {:.0} IOPS", b3_s1 + b3_s2);
}

/// Sends `bytes` on `s` and reads until the controller closes it; returns what it answered.
fn exchange(mut s: std::net::TcpStream, bytes: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    let _ = s.write_all(bytes);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    answer
}

/// A fake controller's side of one connection: accepts it on `listener`, reads the server's hello and
/// welcomes it with one bucket `b1` (limited or not); returns the connection.
fn welcome_one(listener: &std::net::TcpListener, limited: bool) -> std::net::TcpStream {
    use std::io::Write;
    let (mut conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    read_one_frame(&mut conn, "hello");
    let welcome = rein_proto::pshift::Message::Welcome {
        server: 0,
        strays: false,
        buckets: vec!["b1".into()],
        limited: vec![limited],
    };
    conn.write_all(&frame(&welcome)).unwrap();
    conn
}

/// Reads from `s` until one whole pShift frame has come: its message. Errors: the socket's (a read
/// timeout), or `UnexpectedEof` if `s` closed first.
fn try_read_frame(s: &mut impl std::io::Read) -> std::io::Result<rein_proto::pshift::Message> {
    let mut buf = Vec::new();
    loop {
        if let Some((m, _)) = rein_proto::pshift::decode(&buf).unwrap() {
            return Ok(m);
        }
        let mut chunk = [0u8; 1024];
        match s.read(&mut chunk)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// [`try_read_frame`], which must succeed (`what`: the frame, for the failure).
fn read_one_frame(s: &mut impl std::io::Read, what: &str) -> rein_proto::pshift::Message {
    try_read_frame(s).unwrap_or_else(|e| panic!("no {what}: {e}"))
}

/// A pShift frame header of message type `kind` announcing `len` body bytes.
fn frame_header(kind: u8, len: u32) -> Vec<u8> {
    use rein_proto::pshift::{HEADER_BYTES, MAGIC, VERSION};
    let mut h = MAGIC.to_le_bytes().to_vec();
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&[kind, 0]);
    h.extend_from_slice(&len.to_le_bytes());
    assert_eq!(h.len(), HEADER_BYTES);
    h
}

/// A fake controller on 127.0.0.209: `serve` runs on a thread of its own with the listener, and the
/// connections it returns are held open until the fake is dropped (then it is joined, unless the test is
/// failing: a fake still waiting to accept would hold the failure up).
struct FakeController {
    addr: std::net::SocketAddr,
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeController {
    fn start(serve: impl FnOnce(&std::net::TcpListener) -> Vec<std::net::TcpStream> + Send + 'static) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.209:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let held = serve(&listener);
            let _ = stopped.recv_timeout(Duration::from_secs(30));
            drop(held);
        });
        FakeController { addr, stop, thread: Some(thread) }
    }
}

impl Drop for FakeController {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take().filter(|_| !std::thread::panicking()) {
            t.join().unwrap();
        }
    }
}

/// A controller on 127.0.0.`host` (its admin endpoint there too) with one server, s1 (100 IOPS), and one
/// bucket, b1, and `extra` lines at the top of its ctl.toml; its file in `dir`.
fn one_server_controller(dir: &Path, host: u8, extra: &str) -> Server {
    let text = format!(
        "listen = \"127.0.0.{host}:0\"\nadmin = \"127.0.0.{host}:0\"\nperiod_s = 1\n{extra}\
         [[servers]]\nname = \"s1\"\ncapacity_iops = 100\n[[buckets]]\nname = \"b1\"\n"
    );
    Rein::new(&["pshift", "controller", "--config", write_file(dir, "ctl.toml", &text).to_str().unwrap()]).start()
}

/// A pShift frame's bytes.
fn frame(m: &rein_proto::pshift::Message) -> Vec<u8> {
    let mut out = Vec::new();
    rein_proto::pshift::encode(m, &mut out).unwrap();
    out
}

/// The controller's `refused` count.
fn refused(ctl: &Server) -> u64 {
    let (code, _, body) = common::http(ctl.admin, "GET", "/api/pshift", "", "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["refused"].as_u64().unwrap()
}

/// Bad connections cannot flood the controller's log: 300 from outside `allow_networks`, 300 that send
/// a bad frame for a hello and 300 that say hello with a name the controller does not know are each cut
/// (and the refusals counted in `refused`), with at most one warning a second of each kind, the next one
/// naming how many were not logged (`unlogged=N`). Before, each logged a warning: 900 lines, as fast as a
/// peer could connect, from a peer that `allow_networks` does not even admit. A real server is still
/// welcomed after them.
#[test]
fn bad_connections_do_not_flood_the_controllers_log() {
    use rein_proto::pshift::Message;
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-log-flood");
    let ctl = one_server_controller(tmp.path(), 200, "allow_networks = [\"127.0.0.201/32\"]\n");
    const N: usize = 300;
    for _ in 0..N {
        assert!(exchange(connect_from("127.0.0.202", ctl.nbd), &[]).is_empty(), "cut at once");
        assert!(exchange(connect_from("127.0.0.201", ctl.nbd), b"not a pShift frame at all").is_empty());
        let answer = exchange(connect_from("127.0.0.201", ctl.nbd), &frame(&Message::Hello { name: "s9".into() }));
        let refuse = rein_proto::pshift::decode(&answer).unwrap().map(|m| m.0);
        assert!(matches!(refuse, Some(Message::Refuse { .. })), "{refuse:?}");
    }
    common::wait_for("refusals counted", Duration::from_secs(5), || refused(&ctl), |&n| n >= 2 * N as u64);
    let lines = |what: &str| ctl.log.lock().unwrap().iter().filter(|l| l.contains(what)).count();
    let logged = lines("pShift controller: connection");
    assert!(logged >= 1, "the first one is logged: {:#?}", ctl.log.lock().unwrap());
    assert!(logged <= 10, "{logged} lines for {} bad connections", 3 * N);
    // The next line after a quiet second says how many were not logged.
    let line = ctl.wait_unlogged("", || {
        exchange(connect_from("127.0.0.202", ctl.nbd), &[]);
    });
    assert!(line.contains("pShift controller: connection"));
    // A real server still gets in.
    let mut s = connect_from("127.0.0.201", ctl.nbd);
    use std::io::Write;
    s.write_all(&frame(&Message::Hello { name: "s1".into() })).unwrap();
    let welcome = read_one_frame(&mut s, "welcome");
    assert!(matches!(welcome, Message::Welcome { server: 0, .. }), "{welcome:?}");
}

/// A welcomed server's bad frames cannot flood the controller's log: a peer that says hello as s1 and then
/// sends 500 notes naming a bucket the controller does not have and 500 reports for a round it has not
/// reached gets each refused and counted in `refused`, with at most one warning a second of each kind for
/// that server (the next naming how many were not logged). Before, each frame logged a warning, as fast
/// as the peer could write them.
#[test]
fn a_servers_bad_frames_do_not_flood_the_controllers_log() {
    use rein_core::pshift::{ServerReport, StrayArrival};
    use rein_proto::pshift::Message;
    use std::io::Write;
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-frame-flood");
    let ctl = one_server_controller(tmp.path(), 203, "");
    let mut s = connect_from("127.0.0.204", ctl.nbd);
    s.write_all(&frame(&Message::Hello { name: "s1".into() })).unwrap();
    read_one_frame(&mut s, "welcome");
    const N: u64 = 500;
    let note = frame(&Message::Stray(StrayArrival { server: 0, bucket: 7, heard: (0, 0) }));
    let report = frame(&Message::Report(ServerReport {
        server: 0,
        round: 1 << 40,
        early: 0,
        elapsed_ns: 1,
        completed: 0,
        busy_ns: 0,
        buckets: Vec::new(),
    }));
    let mut frames = Vec::new();
    for _ in 0..N {
        frames.extend_from_slice(&note);
        frames.extend_from_slice(&report);
    }
    s.write_all(&frames).unwrap();
    common::wait_for("refusals counted", Duration::from_secs(10), || refused(&ctl), |&n| n >= 2 * N);
    let lines = |what: &str| ctl.log.lock().unwrap().iter().filter(|l| l.contains(what)).count();
    let (notes, reports) = (lines("note refused"), lines("report refused"));
    assert!(notes >= 1 && reports >= 1, "the first ones are logged: {:#?}", ctl.log.lock().unwrap());
    assert!(notes <= 5 && reports <= 5, "{notes} and {reports} lines for {N} bad notes and {N} bad reports");
    // The next bad note after a quiet second says how many were not logged; the connection stays.
    let line = ctl.wait_unlogged("note refused", || s.write_all(&note).unwrap());
    assert!(line.contains("s1"));
}

/// A peer that says hello as a server, is cut, and says hello again at once cannot flood the controller's
/// log: 200 connections that send a second hello after their welcome (a frame the controller closes a
/// server's connection for) and 200 that send a broken frame log at most a few lines of each kind (the
/// cut, the connection welcomed, the connection ended), the next after a quiet second naming how many
/// were not logged; every cut still counts in `refused`, and the next hello is still welcomed. Before,
/// each connection logged two or three lines, however fast they came (a release build logged 15,884
/// warnings in 5 s, and as many lines more).
#[test]
fn a_server_cut_again_and_again_does_not_flood_the_controllers_log() {
    use rein_proto::pshift::Message;
    use std::io::{Read, Write};
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-cut-flood");
    let ctl = one_server_controller(tmp.path(), 220, "");
    let hello = frame(&Message::Hello { name: "s1".into() });
    let mut broken = b"XXXX".to_vec();
    broken.extend_from_slice(&[0u8; 8]);
    // One connection: its hello, the welcome, then `bad`; returns once the controller has closed it.
    let session = |bad: &[u8]| {
        let mut s = connect_from("127.0.0.221", ctl.nbd);
        s.write_all(&hello).unwrap();
        read_one_frame(&mut s, "welcome");
        s.write_all(bad).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
    };
    const N: u64 = 200;
    let before = refused(&ctl);
    for _ in 0..N {
        session(&hello);
    }
    for _ in 0..N {
        session(&broken);
    }
    assert!(refused(&ctl) >= before + N, "every cut counted");
    let lines = |what: &str| ctl.log.lock().unwrap().iter().filter(|l| l.contains(what)).count();
    let counts = [
        lines("a second hello (a server says hello once, before its welcome); closing its connection"),
        lines("pShift server connected"),
        lines("pShift server disconnected"),
        lines("bad pShift frame"),
    ];
    assert!(counts.iter().all(|&n| n >= 1), "the first ones are logged: {counts:?}");
    assert!(counts.iter().all(|&n| n <= 10), "{counts:?} lines for {N} cuts and {N} broken frames");
    // The next cut after a quiet second says how many were not logged.
    let line = ctl.wait_unlogged("a second hello", || session(&hello));
    assert!(line.contains("s1"), "{line}");
    let line = ctl.wait_unlogged("pShift server connected", || session(&hello));
    assert!(line.contains("127.0.0.221"), "{line}");
    // A cut names the frame and whose it was: a note naming server 7 on server 0's (s1's) connection.
    let note = frame(&Message::Stray(rein_core::pshift::StrayArrival { server: 7, bucket: 0, heard: (0, 0) }));
    let named = "a stray note naming server 7 on server 0's connection; closing its connection";
    let line = common::wait_for(
        "the cut named",
        Duration::from_secs(5),
        || {
            session(&note);
            ctl.log.lock().unwrap().iter().find(|l| l.contains(named)).cloned()
        },
        |l| l.is_some(),
    );
    assert!(line.expect("found").contains("server=s1"));
}

/// Connections before their hello are bounded: a controller with one server takes `servers + 16` = 17
/// connections at once. With 17 silent ones held (from 17 addresses: one address holds at most two,
/// `silent_connections_from_one_address_hold_two_slots_at_most`), an 18th that says hello as s1 waits
/// (in the kernel's accept queue) until one of them closes, and is then welcomed; the silent ones are cut
/// 5 s after their accept (`no hello within 5 s`), so they hold their slots no longer.
#[test]
fn silent_connections_hold_the_controllers_slots_only_until_the_hello_timeout() {
    use rein_proto::pshift::Message;
    use std::io::{Read, Write};
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-slots");
    let ctl = one_server_controller(tmp.path(), 207, "");
    let mut silent: Vec<std::net::TcpStream> =
        (1..=17).map(|i| connect_from(&format!("127.0.1.{i}"), ctl.nbd)).collect();
    let mut s = connect_from("127.0.0.208", ctl.nbd);
    s.write_all(&frame(&Message::Hello { name: "s1".into() })).unwrap();
    // At the bound: the 18th is not taken while the 17 are held.
    s.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    let e = try_read_frame(&mut s).expect_err("no welcome while 17 connections hold every slot");
    assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{e}");
    // One slot frees: the 18th is welcomed at once.
    drop(silent.pop());
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let welcome = try_read_frame(&mut s).unwrap();
    assert!(matches!(welcome, Message::Welcome { server: 0, .. }), "{welcome:?}");
    // The silent ones are cut at the hello timeout (5 s after their accept).
    let t0 = Instant::now();
    for c in &mut silent {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(c.read(&mut b).unwrap_or(0), 0, "a silent connection is closed by the controller");
    }
    assert!(t0.elapsed() < Duration::from_secs(8), "cut after {:?}", t0.elapsed());
    ctl.wait_line("no hello within 5 s");
}

/// A controller that welcomes a server and then sends nothing and reads nothing (hung, stopped, or
/// hostile) does not hold the server's link for ever: after 5 s without a frame (a live controller answers
/// every ping, one each 100 ms) the link breaks, the server serves plain round robin again and
/// reconnects. Before, the link waited for ever, keeping the tokens of a controller that was gone: a
/// limited bucket whose L-tokens ran out was served nothing until the TCP connection died.
#[test]
fn a_silent_controller_does_not_hold_a_servers_link() {
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-silent-ctl");
    // Silent after its welcome: nothing sent, nothing read, the socket open until the test ends.
    let fake = FakeController::start(|listener| vec![welcome_one(listener, true)]);
    let s = link_server(tmp.path(), 209, "s1", &fake.addr.to_string(), "");
    s.wait_line("pShift link: welcomed by the controller");
    let line = s.wait_log(&["serving plain round robin until it answers"], Duration::from_secs(10));
    assert!(line.contains("no frame from the controller within 5 s"), "{line}");
}

/// A welcomed server's frames are bounded by a report's size for the configured buckets: with one bucket
/// a report body is at most 64 + 52 = 116 bytes. A frame announcing 116 body bytes is read (the controller
/// waits for its body); one announcing 117 is cut from its header alone, before any body is read, and
/// the log names the bound.
#[test]
fn a_welcomed_servers_frames_are_bounded_by_a_report() {
    use rein_proto::pshift::Message;
    use std::io::{Read, Write};
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-frame-bound");
    let ctl = one_server_controller(tmp.path(), 206, "");
    // A welcomed connection that then sends the header of a report (kind 5) of `len` body bytes.
    let header_after_welcome = |len: u32| {
        let mut s = connect_from("127.0.0.206", ctl.nbd);
        s.write_all(&frame(&Message::Hello { name: "s1".into() })).unwrap();
        read_one_frame(&mut s, "welcome");
        s.write_all(&frame_header(5, len)).unwrap();
        s
    };
    // Reads until the controller closes `s` (true) or `within` passes with it open (false); frames the
    // controller sends meanwhile (report requests) are skipped.
    let closed_within = |s: &mut std::net::TcpStream, within: Duration| {
        s.set_read_timeout(Some(within)).unwrap();
        let t0 = Instant::now();
        let mut chunk = [0u8; 1024];
        loop {
            match s.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) if t0.elapsed() < within => continue,
                Ok(_) => return false,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    };
    let mut over = header_after_welcome(117);
    assert!(closed_within(&mut over, Duration::from_secs(5)), "117 body bytes: cut from the header");
    ctl.wait_line("a pShift frame of 117 body bytes exceeds this connection's bound of 116");
    let mut at = header_after_welcome(116);
    assert!(!closed_within(&mut at, Duration::from_millis(500)), "116 body bytes: the body is waited for");
}

/// A controller's pong cannot set the server's dispatcher spinning: a boundary interval shorter than any
/// controller has (1 us: `period_s` at least 1 ms over at most 1,000 intervals), or a next boundary more
/// than 16 intervals before the controller's own clock, is a broken controller: the link breaks (plain
/// round robin, then a reconnect), naming the value. Before, the link handed such a schedule to the
/// dispatcher, which cut a report at every boundary it was behind, one per turn of its loop: with an
/// interval of 1 ns it never caught up (a core busy for good), and a boundary hours in the past with a
/// 1 ms interval cost millions of reports.
#[test]
fn a_controllers_absurd_schedule_breaks_the_link() {
    use rein_proto::pshift::Message;
    use std::io::Write;
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-absurd-pong");
    let fake = FakeController::start(|listener| {
        let pongs = [
            Message::Pong { t0: 0, t1: 1_000_000_000, next_round: 1, next_ns: 1_000_001_000, interval_ns: 1 },
            Message::Pong { t0: 0, t1: 3_600_000_000_000, next_round: 1, next_ns: 1_000, interval_ns: 1_000_000 },
        ];
        let mut held = Vec::new();
        for pong in pongs {
            let mut conn = welcome_one(listener, false);
            conn.write_all(&frame(&pong)).unwrap();
            held.push(conn);
        }
        held
    });
    let s = link_server(tmp.path(), 209, "s1", &fake.addr.to_string(), "");
    let line = s.wait_log(&["serving plain round robin until it answers"], Duration::from_secs(4));
    assert!(line.contains("a pong with a boundary interval of 1 ns"), "{line}");
    let line = s.wait_log(&["serving plain round robin", "next boundary"], Duration::from_secs(4));
    assert!(line.contains("16 intervals before the controller's clock"), "{line}");
}

/// After its welcome a controller's frames are bounded by a token message's size for the buckets it
/// named: with one bucket 64 + 20 = 84 bytes. A frame announcing 85 body bytes breaks the server's link
/// from its header alone, naming the bound; one of 84 is read whole (and, being no valid token message,
/// breaks the link as a bad frame). Before, every frame could be up to rein-proto's 64 MiB, read into
/// the server's memory.
#[test]
fn a_controllers_frames_are_bounded_by_a_token_message() {
    use std::io::Write;
    let _shared = common::beside_measuring();
    let tmp = tmpdir("pshift-daemons-ctl-frame-bound");
    let fake = FakeController::start(|listener| {
        let mut held = Vec::new();
        for len in [85u32, 84] {
            let mut conn = welcome_one(listener, false);
            // A token message (kind 7) of `len` body bytes: the 85-byte one's header only; the 84-byte one
            // whole, three lines and 4 bytes too many.
            let mut h = frame_header(7, len);
            if len == 84 {
                h.extend_from_slice(&[0u8; 16]); // server, round, early
                h.extend_from_slice(&3u32.to_le_bytes());
                for b in 0..3u32 {
                    h.extend_from_slice(&b.to_le_bytes());
                    h.extend_from_slice(&[0u8; 16]);
                }
                h.extend_from_slice(&[0u8; 4]);
                assert_eq!(h.len(), 12 + 84);
            }
            conn.write_all(&h).unwrap();
            held.push(conn);
        }
        held
    });
    let s = link_server(tmp.path(), 209, "s1", &fake.addr.to_string(), "");
    let line = s.wait_log(&["serving plain round robin until it answers"], Duration::from_secs(4));
    assert!(line.contains("a pShift frame of 85 body bytes exceeds this connection's bound of 84"), "{line}");
    // The second connection's 84-byte frame passes the bound and is read whole: a bad frame, not one
    // over the bound.
    let line = common::wait_for(
        "the second break",
        Duration::from_secs(4),
        || s.log.lock().unwrap().iter().filter(|l| l.contains("serving plain round robin")).nth(1).cloned(),
        |l| l.is_some(),
    )
    .unwrap();
    assert!(line.contains("bad pShift frame") && !line.contains("exceeds"), "{line}");
}
