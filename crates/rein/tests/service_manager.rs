//! The daemons under a service manager (rein-runtime's `notify` module, systemd's `sd_notify` protocol):
//! each test binds the Unix datagram socket a service manager would, starts a daemon with
//! `$NOTIFY_SOCKET` naming it, and reads what the daemon says as it starts, reloads and stops. Socket
//! activation (rein-runtime's `activation` module): `systemd-socket-activate` binds the listening
//! sockets as socket units would and starts the daemon on the first connection, passing them. The unit
//! files in contrib/systemd are checked with `systemd-analyze verify`.
#![cfg(unix)]

mod common;

use common::{config_at, config_file, http, nbd_open, tmpdir, write_file, Rein, Server, MEMORY};
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
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

/// A `rein serve` node on 127.0.0.`host` in `dir/node` with one memory export `v` of 8 MiB.
fn node(dir: &Path, host: u8) -> Server {
    common::serve_in(
        &dir.join("node"),
        &common::local(host),
        "[[exports]]\nname = \"v\"\nbackend = \"memory\"\nsize_mb = 8\n",
    )
}

/// A gw.toml: `head` (its listen and admin lines), node `s1` at `node`, and volume `v` (8 MiB) on it.
fn one_volume(head: &str, node: SocketAddr) -> String {
    format!(
        "{head}\n[[nodes]]\nname = \"s1\"\naddress = \"{node}\"\n\
         [[exports]]\nname = \"v\"\nsize_mb = 8\nstripe_kb = 64\nwidths = {{ s1 = 1 }}\n"
    )
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
    let m = common::metrics(server.admin);
    assert_eq!(common::series_value(&m, "rein_config_last_reload_successful"), 1.0, "{m}");
    assert_eq!(common::series_value(&m, "rein_config_reloads_total{result=\"applied\"}"), 1.0, "{m}");
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
    let m = common::metrics(server.admin);
    assert_eq!(common::series_value(&m, "rein_config_last_reload_successful"), 0.0, "{m}");
    assert_eq!(common::series_value(&m, "rein_config_reloads_total{result=\"failed\"}"), 1.0, "{m}");

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

/// `rein gateway` and `rein pshift controller` say READY=1 once they listen and STOPPING=1 at SIGTERM, and
/// RELOADING=1 / READY=1 around a SIGHUP.
#[test]
fn the_gateway_and_the_pshift_controller_tell_the_service_manager_too() {
    let tmp = tmpdir("notify-gateway");
    let node = node(tmp.path(), 167);
    let gw_text = one_volume("listen = \"127.0.0.168:0\"\nadmin = \"127.0.0.168:0\"", node.nbd);
    let gw_config = write_file(tmp.path(), "gw.toml", &gw_text);
    let mgr = Manager::bind(tmp.path());
    let mut gw = start_with(Rein::new(&["gateway", "--config", gw_config.to_str().unwrap()]), &mgr);
    let ready = mgr.until("READY=1");
    assert!(
        status(&ready).contains("1 volume, 1 node configured (1 connected)")
            && status(&ready).contains(&gw.nbd.to_string())
    );
    gw.signal("-HUP");
    mgr.until("RELOADING=1");
    let ready = mgr.until("READY=1");
    assert_eq!(status(&ready), "configuration reloaded: 0 changes applied, 0 need a restart");
    let m = common::metrics(gw.admin);
    assert_eq!(common::series_value(&m, "rein_config_reloads_total{result=\"applied\"}"), 1.0, "{m}");
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
    assert!(status(&ready).contains("1 server, 1 bucket"), "{ready:?}");
    let m = common::metrics(ctl.admin);
    assert!(m.contains("rein_build_info{daemon=\"pshift_controller\""), "{m}");
    assert!(common::series_value(&m, "rein_process_start_time_seconds") > 1.7e9, "{m}");
    // It reloads (its `[tls]`, since 2026-12-05): RELOADING=1, then READY=1 with the outcome.
    ctl.signal("-HUP");
    mgr.until("RELOADING=1");
    let ready = mgr.until("READY=1");
    assert!(status(&ready).contains("configuration reloaded"), "{ready:?}");
    let m = common::metrics(ctl.admin);
    assert_eq!(common::series_value(&m, "rein_config_reloads_total{result=\"applied\"}"), 1.0, "{m}");
    ctl.signal("-TERM");
    mgr.until("STOPPING=1");
    ctl.terminate(WITHIN);
}

fn start_with(rein: Rein, mgr: &Manager) -> Server {
    rein.env("NOTIFY_SOCKET", &mgr.env()).start()
}

/// `systemd-socket-activate` (systemd's tool for trying socket activation) as the service manager: it
/// binds each of `listen` (`ADDRESS:PORT`, or a path for a Unix socket) as socket units would, names them
/// `--fdname=names`, and on the first connection execs `rein args` with the sockets as fds 3, 4, ...
/// (`$LISTEN_PID` is then rein's own, as under systemd). Its stderr and rein's are read into a log.
struct Activated {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Activated {
    /// Starts the manager with `flags` (such as `--datagram`) and waits until it listens on every socket.
    fn start(listen: &[&str], names: Option<&str>, flags: &[&str], args: &[&str]) -> Activated {
        let mut cmd = Command::new("systemd-socket-activate");
        for l in listen {
            cmd.arg(format!("--listen={l}"));
        }
        if let Some(n) = names {
            cmd.arg(format!("--fdname={n}"));
        }
        // The tool passes on only the environment it is told to.
        cmd.args(flags).args(["-E", "REIN_LOG=info", "-E", "NO_COLOR=1"]).arg(env!("CARGO_BIN_EXE_rein")).args(args);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("systemd-socket-activate: {e} (scripts/test.sh installs systemd)"));
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        let a = Activated { child, log };
        let t0 = Instant::now();
        while a.text().matches("Listening on ").count() < listen.len() {
            assert!(t0.elapsed() < WITHIN, "systemd-socket-activate did not listen: {}", a.text());
            std::thread::sleep(Duration::from_millis(20));
        }
        a
    }

    fn text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Waits (bounded) for a log line holding `needle`; returns it.
    fn wait_line(&self, needle: &str) -> String {
        let t0 = Instant::now();
        loop {
            if let Some(l) = self.log.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            assert!(t0.elapsed() < WITHIN, "no log line with {needle:?}: {}", self.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded) for the exit (the tool has become the daemon); returns its status and the log.
    fn exit(&mut self) -> (std::process::ExitStatus, String) {
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The reader has the last lines once the pipe is closed.
                std::thread::sleep(Duration::from_millis(100));
                return (status, self.text());
            }
            assert!(t0.elapsed() < WITHIN, "still running: {}", self.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM and a graceful exit (bounded).
    fn terminate(&mut self) {
        let ok = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap().success();
        assert!(ok, "kill -TERM");
        let (status, log) = self.exit();
        assert!(status.success(), "{status}: {log}");
    }
}

impl Drop for Activated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether something listens at `addr`.
fn listening(addr: &str) -> bool {
    TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(5)).is_ok()
}

/// `rein serve` serves the sockets the service manager passed, by their names, in place of the
/// configuration's addresses (which stay unbound): NBD on a TCP socket and a Unix one (both named
/// `nbd`), the admin endpoint on `admin`. The first client connects before the daemon exists (the tool
/// starts it on that connection): the kernel holds it in the passed socket's queue until the daemon
/// accepts it, as it holds clients across a restart under systemd. The Unix socket's file is the
/// manager's, left in place when the daemon stops.
#[test]
fn rein_serve_serves_the_sockets_the_service_manager_passes() {
    let tmp = tmpdir("activation-serve");
    let head = "listen = \"127.0.0.176:10810\"\nadmin = \"127.0.0.176:9181\"";
    let config = config_at(tmp.path(), head, MEMORY);
    let unix = tmp.path().join("nbd.sock");
    let listen = ["127.0.0.176:10809", unix.to_str().unwrap(), "127.0.0.176:9180"];
    let serve = ["serve", "--config", config.to_str().unwrap()];
    let mut manager = Activated::start(&listen, Some("nbd:nbd:admin"), &[], &serve);

    // Served through the passed socket by a daemon that did not run when the client connected.
    let nbd: SocketAddr = "127.0.0.176:10809".parse().unwrap();
    let open = nbd_open(nbd, "m", true, WITHIN).unwrap_or_else(|e| panic!("{e}: {}", manager.text()));
    assert_eq!(open.size, 4 << 20);
    let listening_line = manager.wait_line("rein serve listening");
    assert!(listening_line.contains(&format!("nbd_unix={}", unix.display())), "{listening_line}");
    for (what, fd, address, instead) in [
        ("NBD", 3, "127.0.0.176:10809", "listen = 127.0.0.176:10810"),
        ("NBD", 4, unix.to_str().unwrap(), "listen = 127.0.0.176:10810"),
        ("the admin endpoint", 5, "127.0.0.176:9180", "admin = 127.0.0.176:9181"),
    ] {
        manager.wait_line(&format!(
            "{what} on the socket passed by the service manager (fd {fd}, {address}), in place of {instead}"
        ));
    }
    let mut greeting = [0u8; 8];
    let mut u = UnixStream::connect(&unix).expect("NBD on the passed Unix socket");
    u.set_read_timeout(Some(WITHIN)).unwrap();
    u.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting, b"NBDMAGIC");
    let (code, _, body) = http("127.0.0.176:9180".parse().unwrap(), "GET", "/api/exports", "", "");
    assert!(code == 200 && body.contains("\"m\""), "{code} {body}");
    assert!(!listening("127.0.0.176:10810") && !listening("127.0.0.176:9181"), "the configuration's addresses");
    drop((open, u));

    // A reload that moves the addresses the passed sockets stand in for says they are not used (a restart
    // keeps the passed sockets too), not that they need a restart.
    let moved = std::fs::read_to_string(&config).unwrap().replace("10810", "10811").replace("9181", "9182");
    std::fs::write(&config, moved).unwrap();
    assert!(Command::new("kill").args(["-HUP", &manager.child.id().to_string()]).status().unwrap().success());
    let nbd_line = manager.wait_line("reload: listen, listen_unix: not used: NBD listens on the sockets");
    assert!(nbd_line.contains("the service manager passes (change the socket unit to move it)"), "{nbd_line}");
    manager.wait_line("reload: admin: not used: the admin endpoint listens on the socket the service manager passes");
    assert!(!manager.text().contains("listen (needs a restart)"), "{}", manager.text());

    manager.terminate();
    assert!(unix.exists(), "the passed Unix socket's file is the manager's");
}

/// A passed socket the daemon cannot use stops the start with one error naming the descriptor and what
/// is wrong (a datagram socket, a name it has no role for), and so do `$LISTEN_FDS` without a
/// `$LISTEN_PID` or for another process; `--check-config` binds nothing and takes no socket, so the
/// variables do not concern it.
#[test]
fn a_passed_socket_the_daemon_cannot_use_is_a_start_error_naming_it() {
    let tmp = tmpdir("activation-refused");
    let config = config_file(tmp.path(), 177, MEMORY);
    let serve = ["serve", "--config", config.to_str().unwrap()];

    let mut udp = Activated::start(&["127.0.0.177:10809"], Some("nbd"), &["--datagram"], &serve);
    let sender = std::net::UdpSocket::bind("127.0.0.177:0").unwrap();
    sender.send_to(b"x", "127.0.0.177:10809").unwrap();
    let (status, log) = udp.exit();
    assert!(!status.success(), "{log}");
    let want = "error: socket activation: fd 3 (for NBD, nbd): a datagram socket (ListenDatagram=); it takes a \
                listening stream socket (ListenStream=)";
    assert!(log.contains(want), "{log}");
    assert_eq!(log.matches("socket activation").count(), 1, "{log}");

    let mut unknown = Activated::start(&["127.0.0.177:10810"], Some("metrics"), &[], &serve);
    let _client = TcpStream::connect("127.0.0.177:10810").unwrap();
    let (status, log) = unknown.exit();
    assert!(!status.success(), "{log}");
    let want = "error: socket activation: fd 3 is named \"metrics\": rein serve takes sockets named nbd, admin \
                (FileDescriptorName=)";
    assert!(log.contains(want), "{log}");
    assert_eq!(log.matches("socket activation").count(), 1, "{log}");

    let err = Rein::serve(&config).env("LISTEN_FDS", "1").fails();
    assert!(err.contains("error: socket activation: LISTEN_FDS=1 is set without LISTEN_PID: "), "{err}");
    let err = Rein::serve(&config).env("LISTEN_FDS", "1").env("LISTEN_PID", "1").fails();
    assert!(
        err.contains("error: socket activation: LISTEN_FDS=1 is for process 1 (LISTEN_PID), not this one"),
        "{err}"
    );
    assert_eq!(err.matches("socket activation").count(), 1, "{err}");

    let check = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(serve)
        .arg("--check-config")
        .env("LISTEN_FDS", "1")
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
}

/// `$LISTEN_FDS` and `$LISTEN_PID` naming the daemon itself (a wrapper that execs it, as it should)
/// over a descriptor that is not open: the start stops with one error naming the descriptor and the
/// range the variables pass, not a panic or a socket taken at random.
#[test]
fn a_passed_descriptor_that_is_not_open_is_a_start_error_naming_it() {
    let tmp = tmpdir("activation-closed");
    let config = config_file(tmp.path(), 211, MEMORY);
    // The shell closes fd 3 and execs rein in its own place (same process id, so $$ is rein's).
    let out = Command::new("sh")
        .args(["-c", "exec 3<&-; LISTEN_PID=$$ exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_rein"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .env("LISTEN_FDS", "1")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("error: socket activation: fd 3: not open (LISTEN_FDS=1 passes fds 3 to 3)\n"), "{err}");
    assert_eq!(err.matches("socket activation").count(), 1, "{err}");
}

/// `rein gateway` takes a passed NBD socket and a passed admin socket (served although gw.toml names no
/// admin address), and `rein pshift controller` one for where its servers connect (`pshift`).
#[test]
fn the_gateway_and_the_pshift_controller_take_passed_sockets_too() {
    let tmp = tmpdir("activation-gateway");
    let node = node(tmp.path(), 178);
    // The admin socket passed to a file without `admin` is guarded by its admin_token_file (so a token
    // without `admin` is a warning at --check-config, not an error; none is logged here).
    let token = write_file(tmp.path(), "admin.token", "secret\n");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let gw_text = one_volume("listen = \"127.0.0.178:10810\"\nadmin_token_file = \"admin.token\"", node.nbd);
    let gw_config = write_file(tmp.path(), "gw.toml", &gw_text);
    let gateway = ["gateway", "--config", gw_config.to_str().unwrap()];
    let listen = ["127.0.0.178:10809", "127.0.0.178:9180"];
    let mut gw = Activated::start(&listen, Some("nbd:admin"), &[], &gateway);
    let open = nbd_open("127.0.0.178:10809".parse().unwrap(), "v", true, WITHIN)
        .unwrap_or_else(|e| panic!("{e}: {}", gw.text()));
    assert_eq!(open.size, 8 << 20);
    gw.wait_line("NBD on the socket passed by the service manager (fd 3, 127.0.0.178:10809), in place of listen = 127.0.0.178:10810");
    gw.wait_line(
        "the admin endpoint on the socket passed by the service manager (fd 4, 127.0.0.178:9180), in place of no \
         admin (none in the configuration)",
    );
    let (code, _, body) = http("127.0.0.178:9180".parse().unwrap(), "GET", "/healthz", "", "");
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, _, body) = http("127.0.0.178:9180".parse().unwrap(), "GET", "/api/nodes", "", "");
    assert_eq!(code, 401, "the token guards the passed admin socket: {body}");
    let (code, _, body) =
        http("127.0.0.178:9180".parse().unwrap(), "GET", "/api/nodes", "Authorization: Bearer secret\r\n", "");
    assert_eq!(code, 200, "{body}");
    assert!(!gw.text().contains("admin_token_file"), "{}", gw.text());
    assert!(!listening("127.0.0.178:10810"), "the configuration's listen");
    drop(open);
    // A reload that moves `listen`: not used (the passed socket stays), not "needs a restart".
    std::fs::write(&gw_config, gw_text.replace("10810", "10811")).unwrap();
    assert!(Command::new("kill").args(["-HUP", &gw.child.id().to_string()]).status().unwrap().success());
    gw.wait_line("reload: listen, listen_unix: not used: NBD listens on the sockets the service manager passes");
    gw.wait_line("configuration reloaded");
    assert!(!gw.text().contains("listen changed: needs a restart"), "{}", gw.text());
    gw.terminate();

    let ctl_dir = tmp.path().join("ctl");
    std::fs::create_dir_all(&ctl_dir).unwrap();
    let ctl_text = "listen = \"127.0.0.179:7801\"\nperiod_s = 1\nintervals = 5\n\
                    [[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n[[buckets]]\nname = \"b1\"\n";
    let ctl_config = write_file(&ctl_dir, "ctl.toml", ctl_text);
    let controller = ["pshift", "controller", "--config", ctl_config.to_str().unwrap()];
    let mut ctl = Activated::start(&["127.0.0.179:7800"], Some("pshift"), &[], &controller);
    let _server = TcpStream::connect("127.0.0.179:7800").unwrap();
    ctl.wait_line(
        "the pShift link on the socket passed by the service manager (fd 3, 127.0.0.179:7800), in place of listen = \
         127.0.0.179:7801",
    );
    ctl.wait_line("rein pshift controller listening");
    assert!(!listening("127.0.0.179:7801"), "the configuration's listen");
    ctl.terminate();
}

/// The unit files in contrib/systemd pass `systemd-analyze verify` (with `ExecStart` pointed at this
/// build's binary: verify checks that the program exists, and a line it cannot parse is a warning naming
/// the unit), and each runs its daemon as `Type=notify` with a watchdog, a stop timeout and, where the
/// daemon reloads, a reload by SIGHUP. Each socket unit passes its listener (`Accept=no`) under a name
/// its daemon takes, to a service of contrib/systemd.
#[test]
fn the_systemd_units_verify() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd");
    let tmp = tmpdir("notify-units");
    let mut names = Vec::new();
    let mut sockets = Vec::new();
    for entry in std::fs::read_dir(&units).expect("contrib/systemd") {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        if name.ends_with(".socket") {
            assert!(text.contains("\nAccept=no\n"), "{name} passes its listener");
            let fd_name = text.lines().find_map(|l| l.strip_prefix("FileDescriptorName=")).expect("FileDescriptorName");
            // The service it feeds: Service=, or the one of its own name.
            let service = text
                .lines()
                .find_map(|l| l.strip_prefix("Service="))
                .map_or_else(|| name.replace(".socket", ".service"), str::to_string);
            sockets.push((name.clone(), fd_name.to_string(), service));
            write_file(tmp.path(), &name, &text);
            names.push(name);
            continue;
        }
        if path.extension().is_none_or(|e| e != "service") {
            continue;
        }
        for want in ["\nType=notify\n", "\nTimeoutStopSec=", "\nWatchdogSec="] {
            assert!(text.contains(want), "{} lacks {want:?}", path.display());
        }
        // Every daemon reloads (the controller its `[tls]` since 2026-12-05), each reload checked first
        // (`--check-config`), with the file ExecStart names.
        assert!(text.contains("\nExecReload=/bin/kill -HUP $MAINPID\n"), "{name}'s ExecReload");
        let start = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
        assert!(text.contains(&format!("\nExecReload={start} --check-config\n")), "{name}'s check");
        let local = text.replace("/usr/local/bin/rein", env!("CARGO_BIN_EXE_rein"));
        write_file(tmp.path(), &name, &local);
        names.push(name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "rein-gateway-nbd.socket",
            "rein-gateway.service",
            "rein-pshift-controller.service",
            "rein-pshift-controller.socket",
            "rein-serve-admin.socket",
            "rein-serve-nbd.socket",
            "rein-serve.service"
        ]
    );
    // The names each daemon takes (rein-runtime's activation roles).
    for (socket, fd_name, service) in &sockets {
        let takes: &[&str] = match service.as_str() {
            "rein-serve.service" | "rein-gateway.service" => &["nbd", "admin"],
            "rein-pshift-controller.service" => &["pshift", "admin"],
            other => panic!("{socket} feeds {other}, not a service of contrib/systemd"),
        };
        assert!(takes.contains(&fd_name.as_str()), "{socket}: {service} takes no socket named {fd_name}");
    }
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

/// A start that probes the capacity (`probe_capacity_s`: 3 runs) tells the service manager first how much
/// longer the start takes (EXTEND_TIMEOUT_USEC: a probe of minutes outlasted a unit's default 90 s start
/// timeout, and `Restart=on-failure` started it over for good), and warns that the image it created is
/// holes, whose reads never reach the device (before: 341,000 IOPS measured and trusted in silence).
#[test]
fn a_start_that_probes_extends_its_start_timeout_and_warns_of_holes() {
    let tmp = tmpdir("notify-probe");
    let mgr = Manager::bind(tmp.path());
    let body = "probe_capacity_s = 0.2\n[[exports]]\nname = \"v\"\nsize_mb = 8\n";
    let config = config_file(tmp.path(), 228, body);
    let server = Rein::serve(&config).env("NOTIFY_SOCKET", &mgr.env()).env("REIN_LOG", "info").start();
    let extend = mgr.until("EXTEND_TIMEOUT_USEC=30600000");
    assert!(status(&extend).contains("measuring the capacity"), "{extend}");
    mgr.until("READY=1");
    let warned = server.wait_line("is mostly holes (none of its 8 MiB written)");
    assert!(warned.contains("WARN"), "{warned}");
    drop(server);
}
