//! `rein cluster up` and `rein cluster run` as a user runs them: real `rein serve` children on 127.0.0.x
//! (free ports), a real NBD client (nbdinfo) on a printed endpoint, signals, a child killed, the checks of
//! a scenario whose expectations come from mClock's eq. (1). Every test gives the command its own TMPDIR
//! (a tempdir) and checks that it is empty at the end: the run directory was removed.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a cluster may take to print `ready` (the nodes' start-up), and to exit after a signal.
const DEADLINE: Duration = Duration::from_secs(60);

/// Two servers: `s1` with tenants a and b, `s2` with tenant c, and d striped over both (a gateway);
/// 64 MiB spans.
const TWO_NODES: &str = r#"
name = "two-nodes"
duration_s = 3.0
warmup_s = 1.0
[[servers]]
name = "s1"
capacity_iops = 1000
queue_depth = 4
[[servers]]
name = "s2"
capacity_iops = 1000
queue_depth = 4
[[tenants]]
name = "a"
servers = ["s1"]
[tenants.workload]
kind = "closed"
span_gb = 0.0625
[[tenants]]
name = "b"
servers = ["s1"]
[tenants.workload]
kind = "closed"
span_gb = 0.0625
[[tenants]]
name = "c"
servers = ["s2"]
[tenants.workload]
kind = "closed"
span_gb = 0.0625
[[tenants]]
name = "d"
routing = { shares = { s1 = 1, s2 = 2 } }
[tenants.workload]
kind = "closed"
span_gb = 0.0625
"#;

fn rein(tmp: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rein"));
    c.args(args).env("TMPDIR", tmp).env("NO_COLOR", "1");
    c
}

fn scenario(dir: &Path, text: &str) -> String {
    let p = dir.join("scenario.toml");
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

// The tests that compare a real run's rates with an equation or the simulator take `common::measuring()`:
// on two cores, debug daemons of two clusters at once starve each other (the pShift comparison lost 11-13%
// of its nodes' throughput beside the others, 2 runs in 5).

/// A temporary directory, and in it the directory a run's own files go to (`TMPDIR` of `rein`).
fn run_dirs() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let run_tmp = tmp.path().join("tmp");
    std::fs::create_dir(&run_tmp).unwrap();
    (tmp, run_tmp)
}

/// `rein cluster up` on [`TWO_NODES`] in fresh [`run_dirs`], once ready: the directories (kept while they
/// live), the process and the lines it printed before `ready`.
fn up_two_nodes() -> (tempfile::TempDir, std::path::PathBuf, Up, Vec<String>) {
    let (tmp, run_tmp) = run_dirs();
    let mut up = Up::start(&run_tmp, &scenario(tmp.path(), TWO_NODES));
    let lines = up.ready();
    (tmp, run_tmp, up, lines)
}

/// The pids whose parent is `pid` (from /proc).
fn children(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so split after its closing parenthesis.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        if rest.split(' ').nth(1).and_then(|x| x.parse::<u32>().ok()) == Some(pid) {
            v.push(p);
        }
    }
    v
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Stops a child the test started, if it still runs when the test ends: a failed assertion must not
/// leave a cluster running (a `rein cluster up` or `run` whose test panicked ran on for as long as the
/// machine did, its nodes and controller with it). SIGTERM first, so that it stops its own children
/// and removes its run directory; SIGKILL after [`DEADLINE`] (its children then stop by themselves, see
/// `children_stop_by_themselves_when_up_is_killed_9`).
fn stop(child: &mut Child) {
    if !matches!(child.try_wait(), Ok(None)) {
        return;
    }
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A child process that [`stop`]s when dropped (a test's `rein cluster run`).
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        stop(&mut self.0);
    }
}

/// A running `rein cluster up`: its stdout lines arrive on `lines`, its stderr is collected. Dropped while
/// it runs (a test that failed), it is [`stop`]ped.
struct Up {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Drop for Up {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

impl Up {
    fn start(tmp: &Path, scenario: &str) -> Up {
        Up::start_with(tmp, scenario, &[])
    }

    /// [`Up::start`] with more arguments.
    fn start_with(tmp: &Path, scenario: &str, more: &[&str]) -> Up {
        Up::start_env(tmp, scenario, more, &[])
    }

    /// [`Up::start_with`] with more environment variables.
    fn start_env(tmp: &Path, scenario: &str, more: &[&str], envs: &[(&str, &str)]) -> Up {
        let mut cmd = rein(tmp, &["cluster", "up", scenario, "--base-port", "0"]);
        cmd.args(more).envs(envs.iter().copied());
        Up::spawn(cmd)
    }

    /// `rein cluster up` as `cmd` starts it (a wrapper that ends by exec'ing it keeps its process).
    fn spawn(mut cmd: Command) -> Up {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let mut err = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Up { child, lines, stderr: Some(stderr) }
    }

    /// The lines up to and including `ready`.
    fn ready(&mut self) -> Vec<String> {
        let deadline = Instant::now() + DEADLINE;
        let mut v = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == "ready" => return v,
                Ok(l) => v.push(l),
                Err(_) => {
                    // Dead or silent: stopped (SIGTERM first, so that it stops its nodes and removes its run
                    // directory: SIGKILL left them running into the test's directory as it went), its stderr
                    // says why (read if it closes within 5 s: a child of its may hold the pipe open).
                    stop(&mut self.child);
                    let closes = Instant::now() + Duration::from_secs(5);
                    while self.stderr.as_ref().is_some_and(|t| !t.is_finished()) && Instant::now() < closes {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    let stderr = match self.stderr.take_if(|t| t.is_finished()) {
                        Some(t) => t.join().unwrap_or_default(),
                        None => "(still open)".to_string(),
                    };
                    panic!("no `ready` line; got {v:?}; stderr: {stderr}");
                }
            }
        }
    }

    /// Waits (bounded) for the exit; returns its success and stderr.
    fn wait(mut self) -> (bool, String) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return (s.success(), self.stderr.take().expect("waited once").join().unwrap());
            }
            if Instant::now() > deadline {
                stop(&mut self.child);
                panic!("rein cluster up did not exit");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Sends `up` SIGTERM; it must exit successfully, none of `kids` may outlive it, and its run directory
/// (in `run_tmp`) must be gone.
fn terminate_and_check(up: Up, kids: Vec<u32>, run_tmp: &Path) {
    signal(up.child.id(), "-TERM");
    terminate_and_check_after_term(up, kids, run_tmp);
}

/// [`terminate_and_check`] once SIGTERM has been sent.
fn terminate_and_check_after_term(up: Up, kids: Vec<u32>, run_tmp: &Path) {
    let (ok, err) = up.wait();
    assert!(ok, "exit after SIGTERM: {err}");
    for k in kids {
        assert!(!alive(k), "child {k} outlived rein cluster up");
    }
    assert_eq!(empty(run_tmp), Vec::<String>::new(), "the run directory is removed");
}

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
}

fn empty(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

#[test]
fn up_prints_each_tenant_then_ready_and_sigterm_stops_every_child() {
    let _shared = common::beside_measuring();
    let (_tmp, run_tmp, up, lines) = up_two_nodes();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let mut uris = Vec::new();
    for (line, name) in lines.iter().zip(["a", "b", "c", "d"]) {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!((f.len(), f[0], f[1]), (3, "tenant", name), "{line}");
        assert!(f[2].starts_with("nbd://127.0.0.") && f[2].ends_with(&format!("/{name}")), "{line}");
        uris.push(f[2].to_string());
    }
    // a and b share node s1 (127.0.0.10); c is on s2 (127.0.0.11).
    assert!(uris[0].starts_with("nbd://127.0.0.10:") && uris[2].starts_with("nbd://127.0.0.11:"), "{uris:?}");
    assert_eq!(uris[0].rsplit_once('/').unwrap().0, uris[1].rsplit_once('/').unwrap().0);
    // d goes through its own gateway, after the nodes' addresses.
    assert!(uris[3].starts_with("nbd://127.0.0.12:"), "{uris:?}");
    // A client no one here wrote sees the exports, on a node and through the gateway: 64 MiB, the
    // scenario's span.
    for uri in [&uris[2], &uris[3]] {
        let out = Command::new("nbdinfo").args(["--size", uri]).output().expect("nbdinfo is installed");
        assert!(out.status.success(), "nbdinfo {uri}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), (64u64 << 20).to_string(), "{uri}");
    }
    let kids = children(up.child.id());
    assert_eq!(kids.len(), 3, "one rein serve per server and one rein gateway: {kids:?}");
    terminate_and_check(up, kids, &run_tmp);
}

/// Under a service manager (`$NOTIFY_SOCKET`, rein-runtime's notify module) `rein cluster up` says
/// READY=1 once its cluster is up, pings the watchdog and says STOPPING=1 at SIGTERM; its daemons say
/// nothing: they are not the unit's process (each would have said READY=1 as it listened, before the
/// cluster was up). Nor are sockets passed to the unit theirs: `$LISTEN_FDS` and the rest are removed
/// from their environment (a daemon would refuse to start with sockets meant for another process).
#[test]
fn up_alone_speaks_to_the_service_manager_not_its_daemons() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let sock_path = tmp.path().join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut up = Up::start_env(
        &run_tmp,
        &scenario(tmp.path(), TWO_NODES),
        &[],
        &[
            ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "200000"),
            ("LISTEN_FDS", "1"),
            ("LISTEN_PID", "1"),
            ("LISTEN_FDNAMES", "nbd"),
        ],
    );
    up.ready();
    let kids = children(up.child.id());
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        if let Ok(n) = sock.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    // The cluster's READY=1 (the daemons' would say "listening"), then its watchdog pings (every 100 ms).
    assert_eq!(got.first().map(String::as_str), Some("READY=1\nSTATUS=cluster up: 4 tenants\n"), "{got:?}");
    let pings = got.iter().filter(|m| *m == "WATCHDOG=1\n").count();
    assert!(pings >= 5 && pings + 1 == got.len(), "{got:?}");
    signal(up.child.id(), "-TERM");
    let mut stopping = false;
    while let Ok(n) = sock.recv(&mut buf) {
        stopping |= String::from_utf8_lossy(&buf[..n]).starts_with("STOPPING=1\n");
    }
    assert!(stopping, "STOPPING=1 after SIGTERM");
    terminate_and_check_after_term(up, kids, &run_tmp);
}

/// The daemons get none of the descriptors `rein cluster` inherited: a file its shell left open as fd 7
/// (`exec 7>>file`) stays open in `rein cluster` and in none of its children.
#[test]
fn daemons_get_none_of_the_descriptors_up_inherited() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let kept = tmp.path().join("kept-open");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "exec 7>>\"$0\"; exec \"$@\""])
        .arg(&kept)
        .arg(env!("CARGO_BIN_EXE_rein"))
        .args(["cluster", "up", &scenario(tmp.path(), TWO_NODES), "--base-port", "0"])
        .env("TMPDIR", &run_tmp)
        .env("NO_COLOR", "1");
    let mut up = Up::spawn(cmd);
    up.ready();
    let fd7 = |pid: u32| std::fs::read_link(format!("/proc/{pid}/fd/7")).ok();
    assert_eq!(fd7(up.child.id()), Some(kept.clone()), "rein cluster itself keeps what it inherited");
    let kids = children(up.child.id());
    assert_eq!(kids.len(), 3, "{kids:?}");
    for &k in &kids {
        assert_ne!(fd7(k), Some(kept.clone()), "child {k} holds rein cluster's inherited fd 7");
    }
    signal(up.child.id(), "-TERM");
    terminate_and_check_after_term(up, kids, &run_tmp);
}

#[test]
fn a_killed_child_makes_up_exit_non_zero_naming_it() {
    let _shared = common::beside_measuring();
    let (_tmp, run_tmp, up, _) = up_two_nodes();
    let kids = children(up.child.id());
    let s2 = *kids
        .iter()
        .find(|&&k| std::fs::read_to_string(format!("/proc/{k}/cmdline")).unwrap().contains("node-s2.toml"))
        .expect("node s2's process");
    signal(s2, "-KILL");
    let (ok, err) = up.wait();
    assert!(!ok, "a dead child is a failure");
    assert!(err.contains("node s2 (pid ") && err.contains("signal: 9"), "names the child and how it ended: {err}");
    assert!(err.contains("rein serve listening"), "quotes its log: {err}");
    // The log's directory is removed at the end: the error does not send the operator there (the log
    // lines it quotes, each starting with its time, may name the node's files as they were).
    let own: Vec<&str> = err.lines().filter(|l| !l.starts_with(|c: char| c.is_ascii_digit())).collect();
    assert!(!own.iter().any(|l| l.contains(&run_tmp.display().to_string())), "names a path it removes: {err}");
    assert!(err.contains("removed with the run's temporary directory; --dir DIR keeps the logs"), "{err}");
    for k in kids {
        assert!(!alive(k), "child {k} outlived rein cluster up");
    }
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "the run directory is removed");
}

/// Waits up to 15 s for `kids` to be gone; returns those still running, killed then.
fn gone_within_15_s(kids: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while kids.iter().any(|&k| alive(k)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<u32> = kids.iter().copied().filter(|&k| alive(k)).collect();
    for &k in &left {
        let _ = Command::new("kill").args(["-9", &k.to_string()]).status();
    }
    left
}

/// `rein cluster up` killed with SIGKILL cannot stop its children; they notice their parent is gone
/// (`REIN_EXIT_WITH_PARENT`, set by the supervisor) and stop by themselves.
#[test]
fn children_stop_by_themselves_when_up_is_killed_9() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp, mut up, _) = up_two_nodes();
    let kids = children(up.child.id());
    assert_eq!(kids.len(), 3, "{kids:?}");
    up.child.kill().unwrap(); // SIGKILL
    up.child.wait().unwrap();
    let left = gone_within_15_s(&kids);
    assert!(left.is_empty(), "children {left:?} outlived a killed rein cluster up by 15 s");
    // Its run directory stays, with the logs, until the next rein cluster finds it stale.
    let stale = empty(&run_tmp);
    assert_eq!(stale.len(), 1, "{stale:?}");
    let mut next = Up::start(&run_tmp, &scenario(tmp.path(), TWO_NODES));
    next.ready();
    assert!(!run_tmp.join(&stale[0]).exists(), "the stale run directory {} is still there", stale[0]);
    signal(next.child.id(), "-TERM");
    let (ok, err) = next.wait();
    assert!(ok, "{err}");
    assert!(err.contains("removed the run directory") && err.contains(&stale[0]), "{err}");
}

/// A signal during the start stops what started, at once and in order (it was seen only once every
/// process was ready, after `ready`; a stuck child held it for the whole readiness timeout); and
/// `rein cluster up` killed with SIGKILL during the start leaves no child running (a child still
/// loading its configuration took the process that adopted it for its parent, and ran on for good).
#[test]
fn a_signal_or_a_kill_during_the_start_leaves_no_child() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let sc = scenario(tmp.path(), TWO_NODES);
    // The children of `up` once both nodes are started, as soon as they are.
    let started = |up: &Up| {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let kids = children(up.child.id());
            if kids.len() >= 2 || Instant::now() > deadline {
                return kids;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let up = Up::start(&run_tmp, &sc);
    let kids = started(&up);
    assert_eq!(kids.len(), 2, "{kids:?}");
    signal(up.child.id(), "-INT");
    let lines: Vec<String> = up.lines.try_iter().collect();
    let (ok, err) = up.wait();
    assert!(ok, "{err}");
    assert!(err.contains("stopped by SIGINT during the start"), "{err}");
    assert!(!lines.iter().any(|l| l == "ready"), "{lines:?}");
    assert_eq!(gone_within_15_s(&kids), Vec::<u32>::new(), "children outlived the stop");
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "the run directory is removed");
    let mut up = Up::start(&run_tmp, &sc);
    let kids = started(&up);
    up.child.kill().unwrap(); // SIGKILL, while the nodes load their configuration
    up.child.wait().unwrap();
    assert_eq!(
        gone_within_15_s(&kids),
        Vec::<u32>::new(),
        "children outlived a rein cluster up killed during the start by 15 s"
    );
}

/// The files of a run directory and their contents (logs: their first 64 bytes, as they grow).
fn dir_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let mut bytes = std::fs::read(e.path()).unwrap();
            if name.ends_with(".log") {
                bytes.truncate(64);
            }
            (name, bytes)
        })
        .collect();
    v.sort();
    v
}

/// A second `rein cluster up` (or `run`) on a `--dir` a running one uses fails at once naming the
/// directory and the other cluster, and leaves the running one's configs, logs and pids file as they were
/// (it used to rewrite the configs, truncate the logs and replace the pids file before a node refused its
/// data directory).
#[test]
fn a_second_cluster_on_a_dir_in_use_is_refused_before_it_writes() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let keep = tmp.path().join("keep");
    let sc = scenario(tmp.path(), TWO_NODES);
    let mut up = Up::start_with(&run_tmp, &sc, &["--dir", keep.to_str().unwrap()]);
    up.ready();
    // Ready is the nodes' and the gateway's answers; a daemon's first log line can land just after (CI saw
    // the gateway's log still empty here): the files are read once every log has its first line.
    let logs_begun = || dir_files(&keep).iter().filter(|(n, _)| n.ends_with(".log")).all(|(_, b)| b.len() == 64);
    for _ in 0..100 {
        if logs_begun() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let before = dir_files(&keep);
    let names: Vec<&str> = before.iter().map(|(n, _)| n.as_str()).collect();
    for f in ["node-s1.toml", "node-s1.log", "pids", "rein-cluster.lock"] {
        assert!(names.contains(&f), "{f} in {names:?}");
    }
    let canonical = std::fs::canonicalize(&keep).unwrap();
    for cmd in ["up", "run"] {
        let out = rein(&run_tmp, &["cluster", cmd, &sc, "--base-port", "0", "--dir", keep.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd}: {stderr}");
        let want = format!(
            "error: the run directory {} is in use by another rein cluster (pid {}): give this one another \
             directory",
            canonical.display(),
            up.child.id()
        );
        assert_eq!(stderr.trim(), want, "{cmd}");
        assert_eq!(dir_files(&keep), before, "{cmd} changed the running cluster's files");
    }
    let kids = children(up.child.id());
    assert_eq!(kids.len(), 3, "the first cluster runs on: {kids:?}");
    signal(up.child.id(), "-TERM");
    let (ok, err) = up.wait();
    assert!(ok, "{err}");
    // Its lock went with it.
    let lock = std::fs::File::open(keep.join("rein-cluster.lock")).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("the lock is free");
}

/// A port P free on the addresses of [`TWO_NODES`]'s processes (127.0.0.10 to .12) with P + 1: their NBD
/// and admin ports under `--base-port P`.
fn free_base_port() -> u16 {
    for _ in 0..100 {
        let p = std::net::TcpListener::bind("127.0.0.10:0").unwrap().local_addr().unwrap().port();
        let free = |h: u8, k: u16| std::net::TcpListener::bind((std::net::Ipv4Addr::new(127, 0, 0, h), p + k)).is_ok();
        if p < u16::MAX && (10..=12).all(|h| free(h, 0) && free(h, 1)) {
            return p;
        }
    }
    panic!("no free pair of ports on 127.0.0.10 to 127.0.0.12");
}

/// A second `rein cluster up` (or `run`) on the ports of a running one fails before it starts anything,
/// naming the port and who else may hold it. Readiness is a connection to a child's NBD port and a
/// `/healthz` answer on its admin port, which the first cluster's node gave: `up` printed its endpoints
/// and `ready` (they were the first cluster's) before it saw its own node exit, unable to bind.
#[test]
fn a_second_cluster_on_ports_in_use_is_refused_before_it_starts() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let sc = scenario(tmp.path(), TWO_NODES);
    let base = free_base_port().to_string();
    let mut up = Up::spawn(rein(&run_tmp, &["cluster", "up", &sc, "--base-port", &base]));
    up.ready();
    let kids = children(up.child.id());
    assert_eq!(kids.len(), 3, "{kids:?}");
    for cmd in ["up", "run"] {
        let out = rein(&run_tmp, &["cluster", cmd, &sc, "--base-port", &base]).output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{cmd}: {stderr}");
        assert!(!stdout.lines().any(|l| l == "ready"), "{cmd} said ready on ports in use: {stdout}");
        assert!(
            stderr.starts_with(&format!("error: cannot listen on 127.0.0.10:{base} (node s1's NBD port): ")),
            "{cmd}: {stderr}"
        );
        assert!(stderr.contains("another rein cluster on the same ports?"), "{cmd}: {stderr}");
        assert!(stderr.contains("nothing was started"), "{cmd}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{cmd}: once: {stderr}");
        assert_eq!(empty(&run_tmp).len(), 1, "{cmd} left a run directory beside the first cluster's");
    }
    assert_eq!(children(up.child.id()), kids, "the first cluster runs on");
    terminate_and_check(up, kids, &run_tmp);
}

/// A `--dir` run again with the scenario's `span_gb` changed fails before it starts anything, naming the
/// image an earlier run left there, both sizes and what to do, and keeps that run's files; the same
/// scenario again reuses the images. (The node refused the image and exited, and the error quoted
/// `rein serve`'s advice to edit the export's `size_mb`, a line `rein cluster` writes anew each run.)
#[test]
fn a_dir_with_an_earlier_runs_image_of_another_size_is_refused_naming_it() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let keep = tmp.path().join("keep");
    let one = |span: &str| {
        format!(
            "name = \"one\"\nduration_s = 1.0\n[[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n[[tenants]]\n\
             name = \"t1\"\n[tenants.workload]\nkind = \"closed\"\nspan_gb = {span}\n"
        )
    };
    let run = |text: &str| {
        let sc = tmp.path().join("one.toml");
        std::fs::write(&sc, text).unwrap();
        let args = ["cluster", "run", sc.to_str().unwrap(), "--base-port", "0", "--quiet", "--dir"];
        rein(&run_tmp, &args).arg(&keep).output().unwrap()
    };
    let first = run(&one("0.0625"));
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let image = keep.join("node-s1/t1.img");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 << 20);
    let log = std::fs::read(keep.join("node-s1.log")).unwrap();
    let out = run(&one("0.125"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let want = format!(
        "error: the run directory {} holds node-s1/t1.img from an earlier run: it is 67108864 bytes, but node \
         s1's export t1 is 134217728 bytes in this scenario, and a node never resizes an image; remove that \
         file (a scratch image: the run's IOs are timed by the device model, not by what it holds), or give \
         another --dir; nothing was started",
        std::fs::canonicalize(&keep).unwrap().display()
    );
    assert_eq!(stderr.trim(), want);
    assert_eq!(std::fs::read(keep.join("node-s1.log")).unwrap(), log, "a node was started");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 << 20, "the image is kept");
    let again = run(&one("0.0625"));
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "no temporary run directory is left");
}

/// `rein cluster run --out` under a regular file fails before any process starts, naming it; a file that
/// cannot be written at the end (summary.json a directory) fails the run after its table is printed.
#[test]
fn run_checks_out_first_and_a_late_write_failure_keeps_the_summary() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let sc = scenario(tmp.path(), TWO_NODES);
    let file = tmp.path().join("file");
    std::fs::write(&file, "a file, not a directory").unwrap();
    let bad = file.join("out");
    let out =
        rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--quiet", "--out"]).arg(&bad).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!("error: --out {}: cannot create the directory: Not a directory (os error 20)", bad.display())
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "nothing started");
    // `--out` or `--dir` a file's name: said so (both were "... File exists").
    let out =
        rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--quiet", "--out"]).arg(&file).output().unwrap();
    assert!(!out.status.success());
    let want = format!("error: --out {}: it is a file, not a directory", file.display());
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), want);
    let out =
        rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--quiet", "--dir"]).arg(&file).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!("using {} as the run directory: it is a file, not a directory", file.display());
    assert!(stderr.contains(&want), "{stderr}");
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "nothing started");
    let dir = tmp.path().join("out");
    std::fs::create_dir_all(dir.join("summary.json")).unwrap();
    let out =
        rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--quiet", "--out"]).arg(&dir).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.starts_with("tenant ") && stdout.contains("\nd "), "the table: {stdout}");
    let late = format!(
        "error: writing {}: checking what the path names: it is a directory, not a regular file, so it is left alone",
        dir.join("summary.json").display()
    );
    assert_eq!(stderr.trim(), late);
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "the run directory is removed");
}

/// One server of 1,000 IOPS (deterministic service), three backlogged tenants: a reserves 500 with
/// weight 1, b and c have weights 1 and 2 and no reservation. mClock's eq. (1): a's weight share
/// (C/4 = 250) is below its reservation, so a gets r_a = 500 and b and c split the rest 1 : 2, whatever C
/// is on this machine (as long as it exceeds 500 and a's share stays below).
fn equation_one(c_to_b: f64, pct: f64) -> String {
    format!(
        r#"
name = "eq1"
duration_s = 4.0
warmup_s = 1.0
[[servers]]
name = "s1"
capacity_iops = 1000
service = "deterministic"
queue_depth = 4
[[tenants]]
name = "a"
reservation = 500
weight = 1
[tenants.workload]
kind = "closed"
outstanding = 8
span_gb = 0.0625
[[tenants]]
name = "b"
weight = 1
[tenants.workload]
kind = "closed"
outstanding = 8
span_gb = 0.0625
[[tenants]]
name = "c"
weight = 2
[tenants.workload]
kind = "closed"
outstanding = 8
span_gb = 0.0625
[[expect]]
tenant = "a"
metric = "iops"
equals = 500
within_pct = 10
[[expect]]
tenant = "c"
metric = "iops"
ratio_to = "b"
ratio = {c_to_b}
within_pct = {pct}
[[expect]]
server = "s1"
metric = "utilisation"
above = 0.9
"#
    )
}

#[test]
fn run_check_json_passes_an_equation_and_fails_a_wrong_expectation() {
    let _serial = common::measuring();
    let (tmp, run_tmp) = run_dirs();
    let out_dir = tmp.path().join("out");
    let sc = scenario(tmp.path(), &equation_one(2.0, 10.0));
    let out = rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--check", "--json", "--out"])
        .arg(&out_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON summary");
    let names: Vec<&str> = doc["tenants"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert!(stderr.contains("ok   tenant a: iops"), "{stderr}");
    // The phases come from the node: a is served mostly in the reservation phase.
    let a = &doc["tenants"][0];
    let resv = a["phase"]["reservation"].as_f64().unwrap();
    let all = resv + a["phase"]["weight"].as_f64().unwrap();
    assert!(resv / all > 0.8, "a's reservation phase: {a}");
    // The node's device busy time (GET /api/device): backlogged all run, so busy all the time.
    let u = doc["servers"][0]["utilisation"].as_f64().expect("the node reports its busy time");
    assert!(u > 0.9 && u <= 1.0 + 1e-9, "utilisation {u}");
    assert!(stderr.contains("ok   server s1: utilisation"), "{stderr}");
    for f in ["summary.json", "timeseries.csv", "check.json"] {
        assert!(out_dir.join(f).exists(), "{f} written");
    }
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "the run directory is removed");

    // The same run, expecting c and b equal: eq. (1) says 2 : 1, so the check fails, naming it.
    let sc = scenario(tmp.path(), &equation_one(1.0, 5.0));
    let out = rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--check", "--quiet"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("MISS tenant c: iops"), "{stdout}");
    // Named by its file, as every scenario error is.
    assert!(stderr.contains(&format!("scenario {sc}: 1 of 3 expectations missed")), "{stderr}");
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "the run directory is removed");
}

/// `--groups-at-once 1`: a scenario of two independent groups (s1 with a and b; s2 with c) runs as two
/// clusters one after another, and the joined report is the whole's: every tenant in the scenario's
/// order, each group's equation (1) met, the server rows from their own parts.
#[test]
fn groups_at_once_runs_each_group_on_its_own_cluster_and_joins_them() {
    let _serial = common::measuring();
    let (tmp, run_tmp) = run_dirs();
    let keep = tmp.path().join("keep");
    let sc = scenario(
        tmp.path(),
        r#"
name = "two-groups"
duration_s = 3.0
warmup_s = 1.0
[[servers]]
name = "s1"
capacity_iops = 1000
service = "deterministic"
queue_depth = 4
[[servers]]
name = "s2"
capacity_iops = 600
service = "deterministic"
queue_depth = 4
[[tenants]]
name = "a"
servers = ["s1"]
[tenants.workload]
kind = "closed"
outstanding = 8
span_gb = 0.0625
[[tenants]]
name = "c"
servers = ["s2"]
[tenants.workload]
kind = "closed"
outstanding = 8
span_gb = 0.0625
[[tenants]]
name = "b"
servers = ["s1"]
weight = 3
[tenants.workload]
kind = "closed"
outstanding = 8
span_gb = 0.0625
[[expect]]
tenant = "b"
metric = "iops"
ratio_to = "a"
ratio = 3.0
within_pct = 10
[[expect]]
tenant = "c"
metric = "iops"
equals = 600
within_pct = 10
[[expect]]
server = "s2"
metric = "utilisation"
above = 0.9
"#,
    );
    let out =
        rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--check", "--json", "--groups-at-once", "1"])
            .arg("--dir")
            .arg(&keep)
            .output()
            .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON summary");
    let names: Vec<&str> = doc["tenants"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "c", "b"], "the scenario's order, across the parts");
    let servers: Vec<&str> = doc["servers"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(servers, ["s1", "s2"]);
    assert!(stderr.contains("ok   tenant b: iops"), "{stderr}");
    assert!(stderr.contains("ok   tenant c: iops"), "{stderr}");
    assert!(stderr.contains("ok   server s2: utilisation"), "{stderr}");
    for part in ["part-1-of-2", "part-2-of-2"] {
        assert!(keep.join(part).is_dir(), "{part} kept under --dir");
    }
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "no run directory left");
}

/// A trace routed by device (RBFQ §4.2's files: `routing.devices`) reaches each device's server through
/// the gateway, which routes by offset: the load aims each record into its server's units. Device 0's
/// records (400 a second) go to s1 (2,000 IOPS), device 1's (50 a second) to s2 (100 IOPS), whose own
/// device busy time says so: about half busy. Records sent by their offsets instead (half to each server)
/// would give s2 225 a second, more than it can serve: busy all the time, and the tenant short.
#[test]
fn a_trace_routed_by_device_reaches_each_devices_server() {
    let _serial = common::measuring();
    let (tmp, run_tmp) = run_dirs();
    // disksim: arrival_ns devno start_lba size_sectors type(1 = read); 3 s, offsets spread over 1 GiB.
    let mut trace = String::new();
    for i in 0..1200u64 {
        trace.push_str(&format!("{} 0 {} 8 1\n", i * 2_500_000, (i * 7919 % 200_000) * 8));
        if i % 8 == 0 {
            trace.push_str(&format!("{} 1 {} 8 1\n", i * 2_500_000 + 1_000_000, (i * 104_729 % 200_000) * 8));
        }
    }
    std::fs::write(tmp.path().join("two-devices.trace"), trace).unwrap();
    let text = r#"
name = "by-device"
duration_s = 3.0
warmup_s = 0.5
[[servers]]
name = "s1"
capacity_iops = 2000
service = "deterministic"
queue_depth = 4
[[servers]]
name = "s2"
capacity_iops = 100
service = "deterministic"
queue_depth = 1
[[tenants]]
name = "f"
servers = ["s1", "s2"]
routing = { devices = { s1 = [0], s2 = [1] } }
[tenants.workload]
kind = "trace"
[tenants.workload.trace]
path = "two-devices.trace"
format = "disksim"
[[expect]]
tenant = "f"
metric = "iops"
equals = 450
within_pct = 10
[[expect]]
server = "s2"
metric = "utilisation"
above = 0.35
below = 0.65
[[expect]]
server = "s1"
metric = "utilisation"
below = 0.35
"#;
    let sc = scenario(tmp.path(), text);
    let out = rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--check", "--json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for what in ["ok   tenant f: iops", "ok   server s2: utilisation", "ok   server s1: utilisation"] {
        assert!(stderr.contains(what), "{what}: {stderr}");
    }
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "the run directory is removed");
}

/// `--first-address` moves the cluster: its one node listens at the address given (here this test's
/// own, 127.0.0.184), where it used to be 127.0.0.10 whatever was asked. A first address off loopback, or
/// without room for the plan's processes below .255, is refused naming the flag, with nothing started.
#[test]
fn first_address_places_the_processes_and_is_refused_without_room() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let one = TWO_NODES.split("[[servers]]\nname = \"s2\"").next().unwrap().to_string()
        + "[[tenants]]\nname = \"a\"\nservers = [\"s1\"]\n[tenants.workload]\nkind = \"closed\"\nspan_gb = 0.0625\n";
    let mut up = Up::start_with(&run_tmp, &scenario(tmp.path(), &one), &["--first-address", "127.0.0.184"]);
    let lines = up.ready();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("tenant a nbd://127.0.0.184:") && lines[0].ends_with("/a"), "{lines:?}");
    let kids = children(up.child.id());
    assert_eq!(kids.len(), 1, "one rein serve: {kids:?}");
    terminate_and_check(up, kids, &run_tmp);

    let sc = scenario(tmp.path(), TWO_NODES);
    for (first, want) in [
        (
            "127.0.0.253",
            format!(
                "error: scenario {sc}: 2 servers, 1 tenants over several servers and 0 PARDA hosts need 3 processes, \
                 each on its own address; from 127.0.0.253 (--first-address) to 127.0.0.254 at most 2 fit"
            ),
        ),
        (
            "192.168.1.10",
            "error: --first-address 192.168.1.10: not a loopback address; rein cluster's processes listen on \
             127.0.0.0/8 only (their admin endpoints have no token)"
                .to_string(),
        ),
    ] {
        let out =
            rein(&run_tmp, &["cluster", "up", &sc, "--base-port", "0", "--first-address", first]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.trim(), want);
        assert!(String::from_utf8_lossy(&out.stdout).is_empty());
    }
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "nothing was made");
}

/// A scenario `up` or `run` cannot read (missing, or not TOML) fails naming it, once, and leaves no `--dir`
/// behind: `up` created and locked the directory (its lock file left in it) before it read the scenario,
/// where `run` reads the scenario first. Nothing starts, so the addresses are only asked for.
#[test]
fn a_scenario_that_cannot_be_read_leaves_no_run_directory() {
    let (tmp, run_tmp) = run_dirs();
    let malformed = scenario(tmp.path(), "name = \"x\"\nduration_s = [\n");
    let missing = tmp.path().join("missing.toml").to_str().unwrap().to_string();
    let dir = tmp.path().join("run-dir");
    for sc in [&malformed, &missing] {
        for cmd in ["up", "run"] {
            let args = ["cluster", cmd, sc, "--base-port", "0", "--first-address", "127.0.0.141", "--dir"];
            let out = rein(&run_tmp, &args).arg(&dir).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{cmd} {sc}: {stderr}");
            assert!(stderr.starts_with("error: ") && stderr.contains(sc.as_str()), "{cmd} {sc}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{cmd} {sc}: said once: {stderr}");
            assert!(!dir.exists(), "{cmd} {sc}: the run directory was made: {:?}", empty(&dir));
        }
    }
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "nothing was made");
}

/// A scenario the cluster cannot run is refused, once, before anything starts; a `--dir` it created for
/// the run is gone again (its lock file was left in it: the plan is made after the lock, per part under
/// `--groups-at-once`), and one that was there keeps only its lock file.
#[test]
fn an_unsupported_feature_is_a_clear_error_before_anything_starts() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let text = TWO_NODES.replace("[[servers]]\nname = \"s1\"", "[network]\ndelay_ms = 2\n[[servers]]\nname = \"s1\"");
    let sc = scenario(tmp.path(), &text);
    let new_dir = tmp.path().join("new-dir");
    let new = new_dir.to_str().unwrap();
    let kept_dir = tmp.path().join("kept-dir");
    std::fs::create_dir(&kept_dir).unwrap();
    let kept = kept_dir.to_str().unwrap();
    let runs: [&[&str]; 6] = [
        &["up"],
        &["run"],
        &["up", "--dir", new],
        &["run", "--dir", new],
        &["run", "--dir", new, "--groups-at-once", "1"],
        &["run", "--dir", kept, "--groups-at-once", "1"],
    ];
    for args in runs {
        let (cmd, rest) = args.split_first().unwrap();
        let out = rein(&run_tmp, &["cluster", cmd, &sc, "--base-port", "0"]).args(rest).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stderr = stderr.lines().filter(|l| !l.contains("independent group(s)")).collect::<Vec<_>>().join("\n");
        assert!(!new_dir.exists(), "{args:?}: the new run directory stays: {:?}", empty(&new_dir));
        let kept_files = if args.contains(&kept) { vec!["rein-cluster.lock".to_string()] } else { vec![] };
        assert_eq!(empty(&kept_dir), kept_files, "{args:?}");
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(
            stderr.trim(),
            format!(
                "error: scenario {sc}: network.delay_ms cannot run on a real cluster: the nodes are on loopback; \
                 there is no delay to add"
            )
        );
        assert!(String::from_utf8_lossy(&out.stdout).is_empty());
    }
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "nothing was made");
}

#[test]
fn sigterm_during_run_stops_every_child_and_fails() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let sc = scenario(tmp.path(), &TWO_NODES.replace("duration_s = 3.0", "duration_s = 600.0"));
    let mut run = Stopped(
        rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--quiet"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let run = &mut run.0;
    // Wait until all three children run and the run directory exists, then interrupt.
    let deadline = Instant::now() + DEADLINE;
    let kids = loop {
        let k = children(run.id());
        if k.len() == 3 {
            break k;
        }
        assert!(Instant::now() < deadline && run.try_wait().unwrap().is_none(), "children did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    signal(run.id(), "-TERM");
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "rein cluster run did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    run.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    // During the start or after it, as the children were (three children: the gateway may be starting).
    let during = "interrupted by SIGTERM during the start: the processes started were stopped";
    assert!(err.contains("interrupted by SIGTERM: the cluster was stopped") || err.contains(during), "{err}");
    for k in kids {
        assert!(!alive(k), "child {k} outlived rein cluster run");
    }
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "the run directory is removed");
}

/// Two PARDA hosts (beta 1 and 2, cluster aggregation) in front of a processor-sharing array of 2,000
/// IOPS, each with one VM of 48 outstanding IOs; script-L 10 ms, periods of 0.25 s (the split between
/// the hosts closes about gamma sum(beta) / W = 10 % of its distance per period, so 24 periods before the
/// checked window bring it within 10 % from the start at w_max).
const PARDA_TWO_HOSTS: &str = r#"
name = "parda-two"
duration_s = 16.0
warmup_s = 6.0
scheduler = "fifo"
[parda]
latency_threshold_ms = 10
alpha = 0.0
period_s = 0.25
w_max = 64
aggregation = "cluster"
[[servers]]
name = "array"
capacity_iops = 2000
service = "exponential"
discipline = "ps"
queue_depth = 4096
[[hosts]]
name = "h1"
beta = 1
[[hosts]]
name = "h2"
beta = 2
[[tenants]]
name = "vm1"
host = "h1"
[tenants.workload]
kind = "closed"
outstanding = 48
span_gb = 0.0625
[[tenants]]
name = "vm2"
host = "h2"
[tenants.workload]
kind = "closed"
outstanding = 48
span_gb = 0.0625
[[expect]]
host = "h1"
metric = "window"
equilibrium = true
within_pct = 10
note = "eq. (3): W = C script-L + sum beta = 23, split 1:2"
[[expect]]
host = "h2"
metric = "window"
equilibrium = true
within_pct = 10
note = "eq. (3)"
[[expect]]
host = "all"
metric = "latency_mean_ms"
equilibrium = true
within_pct = 5
note = "eq. (3): script-L + sum beta / C = 11.5 ms"
[[expect]]
host = "all"
metric = "iops"
uncontrolled = true
within_pct = 5
note = "a processor-sharing array serves C whatever the windows"
"#;

/// PARDA on real daemons: each host a `rein gateway` with `[parda]`, the array a `rein serve` with the
/// scenario's device model; the host checks (eq. (3)) are the simulator's, on the hosts' own reports,
/// and the uncontrolled baseline they ask for runs on a second cluster.
#[test]
fn parda_hosts_run_on_real_daemons_and_meet_eq_3() {
    let _serial = common::measuring();
    let (tmp, run_tmp) = run_dirs();
    let sc = scenario(tmp.path(), PARDA_TWO_HOSTS);
    // A run that a loaded machine stalled is run again, up to three in all (`common::measure_again`; a CI
    // run's array served 1,835 of its 2,000 IOPS over the checked window); hosts that do not follow
    // eq. (3) miss in every run.
    let mut n = 0;
    let runs = common::measure_again(
        3,
        || {
            n += 1;
            let out_dir = tmp.path().join(format!("out{n}"));
            let out = rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--check", "--json", "--out"])
                .arg(&out_dir)
                .output()
                .unwrap();
            (out, out_dir)
        },
        |(out, _)| out.status.success(),
    );
    let (out, out_dir) = runs.last().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let each: Vec<_> = runs.iter().map(|(o, _)| String::from_utf8_lossy(&o.stderr)).collect();
    assert!(out.status.success(), "each run: {each:#?}");
    for line in
        ["ok   host h1: window", "ok   host h2: window", "ok   host all: latency_mean_ms", "ok   host all: iops"]
    {
        assert!(stderr.contains(line), "{line}: {stderr}");
    }
    // Every report (signed with the run's key) reached the other host's cluster signal.
    assert!(!stderr.contains("refused reports of other hosts"), "{stderr}");
    // Each host's first period ended where the simulator's does (0.25 s and 0.375 s into the run, within
    // 62.5 ms), placed by `PUT /api/parda/period`: a host left to tick from its own start warns.
    assert!(!stderr.contains("ended its first period"), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON summary");
    let hosts = doc["hosts"]["hosts"].as_array().expect("the hosts' summary");
    assert_eq!(hosts.len(), 2);
    let (w1, w2) = (hosts[0]["window_mean"].as_f64().unwrap(), hosts[1]["window_mean"].as_f64().unwrap());
    assert!((w2 / w1 - 2.0).abs() < 0.2, "windows {w1} : {w2}, beta 1 : 2");
    let csv = std::fs::read_to_string(out_dir.join("hosts.csv")).unwrap();
    assert!(csv.starts_with("t_s,host,window,beta,iops,latency_mean_ms,signal_ms,estimate_ms\n"));
    assert_eq!(csv.lines().count(), 1 + 2 * 16, "a row per host per second");
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "the run directories are removed");
}

/// pshift-exp3-limits-small with its rates divided by 4, written to `dir`: servers of 500 IOPS (a mean
/// service time of 2 ms), reservations of 300, limits of 600, the mixed order's floor 10 R-tokens (the file
/// scales it with the rates), b4's band with them. pShift's claims do not depend on the scale (the file
/// itself is the paper's Exp. 3 at 1/25), and the simulator's rates scale with it (329.0, 442.5, 596.8 and
/// 600.0 IOPS against 1,319.75, 1,764.25, 2,391.5 and 2,400.0). At the file's own rates
/// the debug daemons (a controller, four nodes and the load, about 7,900 IOPS) starved on this 2-core VM
/// in CI: on 2026-12-01 all three runs of one CI run (6,633, 6,216 and 6,298 of the simulator's 7,876 IOPS
/// in all, b1 1,101 against its 1,200), and beside two busy loops at nice 19 at 95% of the simulator's
/// sum (7,478 and 7,530) where a quarter of the rates kept 98.8% and 99.2% (1,944 and 1,952 of 1,968).
fn quarter_rates(dir: &Path) -> std::path::PathBuf {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/pshift-exp3-limits-small.toml");
    let mut text = std::fs::read_to_string(file).unwrap();
    // Each setting as the file has it, how often, and its value at a quarter of the rates: a file that
    // changes its numbers fails here rather than run at rates this test does not expect.
    for (from, times, to) in [
        ("capacity_iops = 2000\n".to_string(), 4, "capacity_iops = 500\n".to_string()),
        ("reservation = 1200\n".to_string(), 4, format!("reservation = {QUARTER_R}\n")),
        ("limit = 2400\n".to_string(), 4, format!("limit = {QUARTER_L}\n")),
        ("r_floor_ios = 40\n".to_string(), 1, "r_floor_ios = 10\n".to_string()),
        ("below = 2412\nabove = 2320\n".to_string(), 1, "below = 603\nabove = 580\n".to_string()),
    ] {
        assert_eq!(text.matches(&from).count(), times, "pshift-exp3-limits-small has {from:?} {times} times");
        text = text.replace(&from, &to);
    }
    let path = dir.join("pshift-exp3-limits-quarter.toml");
    std::fs::write(&path, text.replace("name = \"pshift-exp3-limits-small\"", "name = \"pshift-exp3-limits-quarter\""))
        .unwrap();
    path
}

/// Each bucket's reservation and limit (IOPS) in [`quarter_rates`]'s file.
const QUARTER_R: f64 = 300.0;
const QUARTER_L: f64 = 600.0;

/// pShift on real daemons: `rein cluster run` on pshift-exp3-limits-small at a quarter of its rates (a
/// controller and four token-scheduled nodes; buckets b1..b4 on 1..4 servers, R = 300 and L = 600 IOPS per
/// 1 s period, servers of C = 500: [`quarter_rates`]). pShift's model: every bucket gets at least R, none
/// more than L, so b1 (on s1 alone) gets R and b4 (backlogged on all four, 1,042 under round robin) gets L;
/// and the real run agrees with `rein sim` on the same file within 10% per bucket (issue 13's bound). The
/// margins below are the debug build's (this test's daemons): the release build meets the scenario's own
/// per-period checks at its full rates (docs/reproductions.md Part 4).
#[test]
fn pshift_buckets_run_on_real_daemons_and_agree_with_the_simulator() {
    let _serial = common::measuring();
    let (tmp, run_tmp) = run_dirs();
    let file = quarter_rates(tmp.path());
    let file = file.to_str().unwrap();
    let sim_out = tmp.path().join("sim");
    let out = rein(&run_tmp, &["sim", file, "--json", "--out", sim_out.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sim: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let iops = |doc: &serde_json::Value| -> Vec<f64> {
        doc["tenants"].as_array().unwrap().iter().map(|t| t["iops"].as_f64().unwrap()).collect()
    };
    let sim = iops(&sim);
    // The servers are busy throughout in pShift's model, so the buckets' IOPS sum to the cluster's capacity
    // (the simulator's 1,968 here, 7,876 at the file's rates). A real run whose sum falls short by more than
    // 2% lost device time to late wake-ups. At the file's rates (the figures in the rest of this comment;
    // [`quarter_rates`] says why the test now runs a quarter of them), on two cores, debug daemons beside
    // CI's other work (the one-hour test and the fuzz build, at nice 19) did in 1 of 2 CI runs on 2026-11-30
    // (7,544 IOPS in all; b2, which takes what the reservations leave, 1,581 against 1,764); beside three or
    // four busy loops at nice 19 in 22 runs of 22 (7,151-7,590), beside one in 4 of 7; alone 7,798-7,814;
    // beside two busy loops and a valgrind run at normal priority, 6,690 once (2026-12-01). Such a run also
    // sees other demand (a starved load leaves its queues idle, which the controller's backlog estimator
    // reads), so it is no comparison with the simulator: it is made again, up to three runs in all
    // (`common::measure_again`), and when all three are starved the least starved is judged on pShift's
    // guarantees alone (below), the simulator comparison being left to `scripts/cluster-vs-sim.sh` (release
    // builds, nothing else running). A wrong allocation keeps the sum, so it is not starved and fails the
    // comparison in its first run.
    let want: f64 = sim.iter().sum();
    // The controller's rounds.csv: (period, round, reservation IOs still wanted) at each period boundary.
    let boundaries = |dir: &Path| -> Vec<(u64, u64, u64)> {
        let csv = std::fs::read_to_string(dir.join("rounds.csv")).expect("rounds.csv written");
        (csv.lines().skip(1).map(|l| l.split(',').collect::<Vec<_>>()))
            .filter(|f| f[3] == "0")
            .map(|f| (f[1].parse().unwrap(), f[2].parse().unwrap(), f[5].parse().unwrap()))
            .collect()
    };
    let sim_rounds = boundaries(&sim_out);
    let wanted_bound = 0.05 * 4.0 * QUARTER_R;
    // A boundary whose reservation still wanted differs from the simulator's by more than the bound: on a
    // loaded machine one late report moves a few consecutive boundaries (CI on 2026-12-02: one boundary
    // 126 IOs off, the others within 8; beside two busy loops at nice 19, 1 run of 16 with 71, 51 and 28
    // at rounds 17-19), so such a run is made again as a starved one is. A wrong controller differs in
    // every run.
    let disturbed = |dir: &Path| {
        let real = boundaries(dir);
        real.len() != sim_rounds.len()
            || real.iter().zip(&sim_rounds).any(|(r, s)| r.2.abs_diff(s.2) as f64 > wanted_bound)
    };
    let mut n = 0;
    let runs = common::measure_again(
        3,
        || {
            n += 1;
            let real_out = tmp.path().join(format!("real{n}"));
            let args = ["cluster", "run", file, "--base-port", "0", "--json", "--out", real_out.to_str().unwrap()];
            let out = rein(&run_tmp, &args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{stderr}");
            let real = iops(&serde_json::from_slice(&out.stdout).expect("stdout is the JSON summary"));
            let sum: f64 = real.iter().sum();
            if sum < 0.98 * want {
                eprintln!(
                    "pShift buckets: real {real:?} IOPS, {sum:.0} in all against the simulator's {want:.0}: starved"
                );
            }
            let calm = !disturbed(&real_out);
            if !calm {
                eprintln!("pShift buckets: a boundary's reservation still wanted is off the simulator's: disturbed");
            }
            (real, real_out, sum, calm)
        },
        |(_, _, sum, calm)| *sum >= 0.98 * want && *calm,
    );
    let starved: Vec<f64> = runs.iter().filter(|r| r.2 < 0.98 * want).map(|r| r.2).collect();
    // The judged run: the last if it was neither starved nor disturbed (the runs before it were), else
    // the least starved.
    let last_good = runs.last().is_some_and(|r| r.2 >= 0.98 * want && r.3);
    let (real, real_out, sum, _) = if last_good {
        runs.into_iter().next_back().expect("at least one run")
    } else {
        runs.into_iter().max_by(|a, b| a.2.total_cmp(&b.2)).expect("at least one run")
    };
    assert!(sum >= 0.85 * want, "real {real:?} IOPS, {sum:.0} in all against {want:.0}: more than late wake-ups lose");
    let judged_starved = sum < 0.98 * want;
    eprintln!("pShift buckets: real {real:?} IOPS, the simulator's {sim:?}");
    assert_eq!(real.len(), 4);
    // pShift's guarantees: every bucket at least its reservation, b4 held at its limit.
    for (i, r) in real.iter().enumerate() {
        assert!(*r >= 0.97 * QUARTER_R, "b{} gets its reservation: {r:.0}", i + 1);
    }
    assert!(real[3] <= 1.01 * QUARTER_L && real[3] >= 0.95 * QUARTER_L, "b4 held at its limit: {:.0}", real[3]);
    // The controllers' rounds: the same 20 boundaries, each wanting the same reservation IOs within 5% of
    // a period's 4 x R (the real one reads its rounds from /api/pshift; `boundaries` and `disturbed` above).
    let real_rounds = boundaries(&real_out);
    assert_eq!(real_rounds.len(), 20, "{real_rounds:?}");
    for (r, s) in real_rounds.iter().zip(&sim_rounds) {
        assert_eq!((r.0, r.1), (s.0, s.1), "the same boundaries");
    }
    // Each closed period one by one, by the servers' counts (periods.csv): the same 4 periods of the 4
    // buckets from both, and no bucket-period past its limit on the real nodes, starved or not (a starved
    // run's reservations are judged above on the whole run).
    let periods = |dir: &Path| -> Vec<(String, String, u64, String)> {
        let csv = std::fs::read_to_string(dir.join("periods.csv")).expect("periods.csv written");
        (csv.lines().skip(1).map(|l| l.split(',').map(str::to_string).collect::<Vec<_>>()))
            .map(|f| (f[0].clone(), f[2].clone(), f[3].parse().unwrap(), f[6].clone()))
            .collect()
    };
    let (real_periods, sim_periods) = (periods(&real_out), periods(&sim_out));
    let keys = |p: &[(String, String, u64, String)]| p.iter().map(|r| (r.0.clone(), r.1.clone())).collect::<Vec<_>>();
    assert_eq!(real_periods.len(), 16, "{real_periods:?}");
    assert_eq!(keys(&real_periods), keys(&sim_periods));
    // A period with a node's report missing (late on a loaded machine) is not judged: its count is not
    // exact. At least one period must be judged.
    let judged: Vec<_> = real_periods.iter().filter(|r| r.3 != "incomplete").collect();
    assert!(judged.len() >= 4, "{real_periods:?}");
    for (period, bucket, completed, verdict) in judged {
        assert_ne!(verdict, "above_limit", "{bucket} in period {period}: {completed} IOs by the nodes' counts");
        assert!(*completed as f64 <= QUARTER_L, "{bucket} in period {period}: {completed} IOs, above every limit");
    }
    if judged_starved {
        eprintln!(
            "starved in every run ({starved:?} IOPS in all): judged on pShift's guarantees, not against the simulator"
        );
    } else {
        // The real run agrees with the simulator within 10% per bucket (issue 13's bound), and its
        // controller wanted the same reservation IOs at every boundary.
        for (i, (r, s)) in real.iter().zip(&sim).enumerate() {
            assert!((r / s - 1.0).abs() < 0.10, "b{}: real {r:.0} IOPS, simulator {s:.0}", i + 1);
        }
        for (r, s) in real_rounds.iter().zip(&sim_rounds) {
            assert!(r.2.abs_diff(s.2) as f64 <= wanted_bound, "reservation still wanted: real {r:?}, simulator {s:?}");
        }
    }
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "the run directory is removed");
}

/// `rein cluster up` on a pShift scenario: one line per bucket with its export on each of its servers
/// (b1 on s1 only ... b4 on all four), a client no one here wrote reads a bucket's export on a node, and
/// the children are the four nodes and the controller, all stopped by SIGTERM.
#[test]
fn up_on_a_pshift_scenario_prints_each_buckets_exports_on_its_servers() {
    let _shared = common::beside_measuring();
    let (_tmp, run_tmp) = run_dirs();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/pshift-exp3-limits-small.toml");
    let mut up = Up::start(&run_tmp, file.to_str().unwrap());
    let lines = up.ready();
    assert_eq!(lines.len(), 4, "{lines:?}");
    for (i, line) in lines.iter().enumerate() {
        let f: Vec<&str> = line.split(' ').collect();
        let name = format!("b{}", i + 1);
        assert_eq!((f.len(), f[0], f[1]), (3 + i, "tenant", name.as_str()), "{line}");
        for (k, uri) in f[2..].iter().enumerate() {
            assert!(
                uri.starts_with(&format!("nbd://127.0.0.{}:", 10 + k)) && uri.ends_with(&format!("/{name}")),
                "{line}"
            );
        }
    }
    let uri = lines[3].split(' ').nth(5).unwrap();
    let out = Command::new("nbdinfo").args(["--size", uri]).output().expect("nbdinfo is installed");
    assert!(out.status.success(), "nbdinfo {uri}: {}", String::from_utf8_lossy(&out.stderr));
    let kids = children(up.child.id());
    assert_eq!(kids.len(), 5, "four nodes and the controller: {kids:?}");
    terminate_and_check(up, kids, &run_tmp);
}

/// A run whose requests fail reports its table, then exits non-zero saying how many failed and the first
/// error: the node's disk fills (the run directory on a tmpfs of 2 MiB, under a 64 MiB image written at
/// random). Before, `rein cluster run` logged nothing of it and exited 0. Needs root (the mount);
/// elsewhere skipped.
#[test]
fn a_run_whose_requests_fail_exits_non_zero_after_its_report() {
    let _shared = common::beside_measuring();
    let (tmp, run_tmp) = run_dirs();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "rein-test-full"])
        .arg(&run_tmp)
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&run_tmp);
    let sc = scenario(
        tmp.path(),
        r#"
name = "full-disk"
duration_s = 2.0
warmup_s = 0.5
[[servers]]
name = "s1"
capacity_iops = 1000
[[tenants]]
name = "w"
servers = ["s1"]
[tenants.workload]
kind = "closed"
read_pct = 0
size_kb = 64
span_gb = 0.0625
"#,
    );
    let out = rein(&run_tmp, &["cluster", "run", &sc, "--base-port", "0", "--quiet"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("tenant ") && stdout.contains("\nw "), "the table first: {stdout}");
    assert!(stderr.contains("requests failed (the first: job w: ") && stderr.contains("ENOSPC"), "{stderr}");
    assert_eq!(empty(&run_tmp), Vec::<String>::new(), "the run directory is removed");
}
