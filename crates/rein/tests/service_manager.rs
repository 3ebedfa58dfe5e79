//! The daemons under a service manager (rein-runtime's `notify` module, systemd's `sd_notify` protocol):
//! each test binds the Unix datagram socket a service manager would, starts a daemon with
//! `$NOTIFY_SOCKET` naming it, and reads what the daemon says as it starts, reloads and stops. The unit
//! files in contrib/systemd are checked with `systemd-analyze verify`.
#![cfg(unix)]

mod common;

use common::{config_file, tmpdir, write_file, Rein, Server, MEMORY};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a message may take to come.
const WITHIN: Duration = Duration::from_secs(30);

/// The service manager's end: a datagram socket at `dir/notify.sock`.
struct Manager {
    sock: UnixDatagram,
    path: PathBuf,
}

impl Manager {
    fn bind(dir: &Path) -> Manager {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
        Manager { sock, path }
    }

    fn env(&self) -> String {
        self.path.to_str().unwrap().to_string()
    }

    /// The next message, if one comes within `within`.
    fn next(&self, within: Duration) -> Option<String> {
        self.sock.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8(buf[..n].to_vec()).expect("a UTF-8 message")),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => None,
            Err(e) => panic!("recv: {e}"),
        }
    }

    /// Reads messages until one has the line `line`; returns it. Panics after [`WITHIN`], listing what
    /// came.
    fn until(&self, line: &str) -> String {
        let t0 = Instant::now();
        let mut seen = Vec::new();
        while t0.elapsed() < WITHIN {
            if let Some(m) = self.next(Duration::from_millis(200)) {
                if m.lines().any(|l| l == line) {
                    return m;
                }
                seen.push(m);
            }
        }
        panic!("no message with {line:?} within {WITHIN:?}; got {seen:?}");
    }
}

/// The daemon's `/metrics` text.
fn metrics(admin: std::net::SocketAddr) -> String {
    let (code, _, body) = common::http(admin, "GET", "/metrics", "", "");
    assert_eq!(code, 200, "{body}");
    body
}

/// The value of `series` (its name with labels, as written) in a `/metrics` text.
fn series(text: &str, series: &str) -> f64 {
    let line = text.lines().find(|l| l.strip_prefix(series).is_some_and(|r| r.starts_with(' ')));
    line.unwrap_or_else(|| panic!("no {series} in {text}"))[series.len()..].trim().parse().unwrap()
}

/// The `STATUS=` line of a message.
fn status(message: &str) -> &str {
    message.lines().find_map(|l| l.strip_prefix("STATUS=")).unwrap_or_else(|| panic!("no STATUS= in {message:?}"))
}

/// `rein serve` says READY=1 once it listens (a client can connect then), RELOADING=1 then READY=1 around
/// each SIGHUP with the outcome in STATUS= (applied, or refused with the file's error, the configuration
/// unchanged), and STOPPING=1 when SIGTERM's graceful stop begins.
#[test]
fn rein_serve_tells_the_service_manager_ready_reloading_and_stopping() {
    let tmp = tmpdir("notify-serve");
    let mgr = Manager::bind(tmp.path());
    let config = config_file(tmp.path(), 163, MEMORY);
    let mut server = Rein::serve(&config).env("NOTIFY_SOCKET", &mgr.env()).start();
    let ready = mgr.until("READY=1");
    let s = status(&ready);
    assert!(s.starts_with("listening:") && s.contains(&server.nbd.to_string()), "{ready:?}");
    std::net::TcpStream::connect(server.nbd).expect("ready means listening");

    // A change that applies.
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap().replace("reservation = 10", "reservation = 20"))
        .unwrap();
    server.signal("-HUP");
    let reloading = mgr.until("RELOADING=1");
    assert!(reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")), "{reloading:?}");
    let ready = mgr.until("READY=1");
    assert_eq!(status(&ready), "configuration reloaded: 1 changes applied, 0 need a restart");
    let m = metrics(server.admin);
    assert_eq!(series(&m, "rein_config_last_reload_successful"), 1.0, "{m}");
    assert_eq!(series(&m, "rein_config_reloads_total{result=\"applied\"}"), 1.0, "{m}");
    assert!(m.contains("rein_build_info{daemon=\"serve\",version=\""), "{m}");

    // A file that does not parse: refused, the running configuration kept, and the manager told why.
    std::fs::write(&config, "listen = [").unwrap();
    server.signal("-HUP");
    mgr.until("RELOADING=1");
    let ready = mgr.until("READY=1");
    let s = status(&ready);
    assert!(
        s.starts_with("reload failed, the running configuration is unchanged:") && s.contains("rein.toml"),
        "{ready:?}"
    );
    assert!(!s.contains('\n'));
    // The monitoring system hears of it too (Prometheus' convention: alert on ... == 0).
    let m = metrics(server.admin);
    assert_eq!(series(&m, "rein_config_last_reload_successful"), 0.0, "{m}");
    assert_eq!(series(&m, "rein_config_reloads_total{result=\"failed\"}"), 1.0, "{m}");

    server.signal("-TERM");
    let stopping = mgr.until("STOPPING=1");
    assert!(status(&stopping).starts_with("stopping"), "{stopping:?}");
    server.terminate(WITHIN);
}

/// With `$WATCHDOG_USEC` the daemon pings at half of it from its accept loop; a `$WATCHDOG_PID` of
/// another process means the watchdog is not this one's, and there are no pings.
#[test]
fn the_watchdog_is_pinged_at_half_its_timeout_only_when_it_is_this_process_s() {
    let tmp = tmpdir("notify-watchdog");
    let mgr = Manager::bind(tmp.path());
    let config = config_file(tmp.path(), 164, MEMORY);
    let server = Rein::serve(&config).env("NOTIFY_SOCKET", &mgr.env()).env("WATCHDOG_USEC", "400000").start();
    mgr.until("READY=1");
    // 200 ms apart: about 10 in 2 s (a first one at once); at least 4 on a loaded machine.
    let t0 = Instant::now();
    let mut pings = 0;
    while t0.elapsed() < Duration::from_secs(2) {
        if mgr.next(Duration::from_millis(100)).is_some_and(|m| m.lines().any(|l| l == "WATCHDOG=1")) {
            pings += 1;
        }
    }
    assert!((4..=12).contains(&pings), "{pings} pings in 2 s at a 400 ms watchdog");
    drop(server);

    let other = tmpdir("notify-watchdog-other");
    let mgr = Manager::bind(other.path());
    let config = config_file(other.path(), 165, MEMORY);
    let _server = Rein::serve(&config)
        .env("NOTIFY_SOCKET", &mgr.env())
        .env("WATCHDOG_USEC", "400000")
        .env("WATCHDOG_PID", "1")
        .start();
    mgr.until("READY=1");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(1) {
        if let Some(m) = mgr.next(Duration::from_millis(100)) {
            assert!(!m.contains("WATCHDOG=1"), "pinged another process's watchdog: {m:?}");
        }
    }
}

/// A notify socket that is not there: the daemon serves, reloads and stops as usual, and says once that
/// it could not tell the service manager.
#[test]
fn a_missing_notify_socket_is_logged_once_and_the_daemon_serves() {
    let tmp = tmpdir("notify-missing");
    let config = config_file(tmp.path(), 166, MEMORY);
    let missing = tmp.path().join("no-such.sock");
    let mut server = Rein::serve(&config).env("NOTIFY_SOCKET", missing.to_str().unwrap()).start();
    server.wait_line("could not tell the service manager");
    server.signal("-HUP");
    server.wait_line("configuration reloaded");
    std::net::TcpStream::connect(server.nbd).expect("serving");
    server.terminate(WITHIN);
    let log = server.log.lock().unwrap().join("\n");
    assert_eq!(log.matches("could not tell the service manager").count(), 1, "{log}");
}

/// `rein gateway` and `rein pshift controller` say READY=1 once they listen and STOPPING=1 at SIGTERM; the
/// gateway also RELOADING=1 / READY=1 around a SIGHUP.
#[test]
fn the_gateway_and_the_pshift_controller_tell_the_service_manager_too() {
    let tmp = tmpdir("notify-gateway");
    let node_dir = tmp.path().join("node");
    std::fs::create_dir_all(&node_dir).unwrap();
    let node =
        Rein::serve(&config_file(&node_dir, 167, "[[exports]]\nname = \"v\"\nbackend = \"memory\"\nsize_mb = 8\n"))
            .start();
    let gw_text = format!(
        "listen = \"127.0.0.168:0\"\nadmin = \"127.0.0.168:0\"\n[[nodes]]\nname = \"s1\"\naddress = \"{}\"\n\
         [[exports]]\nname = \"v\"\nsize_mb = 8\nstripe_kb = 64\nwidths = {{ s1 = 1 }}\n",
        node.nbd
    );
    let gw_config = write_file(tmp.path(), "gw.toml", &gw_text);
    let mgr = Manager::bind(tmp.path());
    let mut gw = start_with(Rein::new(&["gateway", "--config", gw_config.to_str().unwrap()]), &mgr);
    let ready = mgr.until("READY=1");
    assert!(status(&ready).contains("1 volumes over 1 nodes") && status(&ready).contains(&gw.nbd.to_string()));
    gw.signal("-HUP");
    mgr.until("RELOADING=1");
    let ready = mgr.until("READY=1");
    assert_eq!(status(&ready), "configuration reloaded: 0 changes applied, 0 need a restart");
    let m = metrics(gw.admin);
    assert_eq!(series(&m, "rein_config_reloads_total{result=\"applied\"}"), 1.0, "{m}");
    assert!(m.contains("rein_build_info{daemon=\"gateway\""), "{m}");
    gw.signal("-TERM");
    mgr.until("STOPPING=1");
    gw.terminate(WITHIN);

    let ctl_dir = tmp.path().join("ctl");
    std::fs::create_dir_all(&ctl_dir).unwrap();
    let mgr = Manager::bind(&ctl_dir);
    let ctl_text = "listen = \"127.0.0.169:0\"\nadmin = \"127.0.0.169:0\"\nperiod_s = 1\nintervals = 5\n\
                    [[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n[[buckets]]\nname = \"b1\"\n";
    let ctl_config = write_file(&ctl_dir, "ctl.toml", ctl_text);
    let mut ctl = start_with(Rein::new(&["pshift", "controller", "--config", ctl_config.to_str().unwrap()]), &mgr);
    let ready = mgr.until("READY=1");
    assert!(status(&ready).contains("1 servers, 1 buckets"), "{ready:?}");
    let m = metrics(ctl.admin);
    assert!(m.contains("rein_build_info{daemon=\"pshift_controller\"") && !m.contains("rein_config_"), "{m}");
    assert!(series(&m, "rein_process_start_time_seconds") > 1.7e9, "{m}");
    ctl.signal("-TERM");
    mgr.until("STOPPING=1");
    ctl.terminate(WITHIN);
}

fn start_with(rein: Rein, mgr: &Manager) -> Server {
    rein.env("NOTIFY_SOCKET", &mgr.env()).start()
}

/// The unit files in contrib/systemd pass `systemd-analyze verify` (with `ExecStart` pointed at this
/// build's binary: verify checks that the program exists, and a line it cannot parse is a warning naming
/// the unit), and each runs its daemon as `Type=notify` with a watchdog, a stop timeout and, where the
/// daemon reloads, a reload by SIGHUP.
#[test]
fn the_systemd_units_verify() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd");
    let tmp = tmpdir("notify-units");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&units).expect("contrib/systemd") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "service") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for want in ["\nType=notify\n", "\nTimeoutStopSec=", "\nWatchdogSec="] {
            assert!(text.contains(want), "{} lacks {want:?}", path.display());
        }
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        // The controller does not reload (SIGHUP is ignored): no ExecReload that would pretend to.
        let reloads = name != "rein-pshift-controller.service";
        assert_eq!(text.contains("\nExecReload=/bin/kill -HUP $MAINPID\n"), reloads, "{name}'s ExecReload");
        // A reload is checked first (`--check-config`), with the file ExecStart names.
        let start = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
        assert_eq!(text.contains(&format!("\nExecReload={start} --check-config\n")), reloads, "{name}'s check");
        let local = text.replace("/usr/local/bin/rein", env!("CARGO_BIN_EXE_rein"));
        write_file(tmp.path(), &name, &local);
        names.push(name);
    }
    names.sort();
    assert_eq!(names, ["rein-gateway.service", "rein-pshift-controller.service", "rein-serve.service"]);
    let Ok(out) = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .args(names.iter().map(|n| tmp.path().join(n)))
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
    else {
        panic!("systemd-analyze is not installed (scripts/test.sh installs systemd)");
    };
    let err = String::from_utf8_lossy(&out.stderr);
    // Lines about units on this machine other than ours are not ours to judge.
    let ours: Vec<&str> = err.lines().filter(|l| names.iter().any(|n| l.contains(n.as_str()))).collect();
    assert!(out.status.success() && ours.is_empty(), "systemd-analyze verify: {err}");
}
