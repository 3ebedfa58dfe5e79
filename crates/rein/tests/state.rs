//! `rein serve`'s durable and dynamic state with the real binary (issue 12, point 5): run-time changes
//! survive a restart (and the log says they came from the state file), SIGHUP reloads the configuration,
//! the data directory is locked, a corrupt state file stops the start, admission fails closed without a
//! capacity, and exports added at run time serve real clients. Each test uses its own 127.0.0.x address
//! (port 0) and temporary directory.
#![cfg(unix)]

mod common;

use common::{config_file, local, Rein, Server};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// How long a server may take to listen.
const START_WITHIN: Duration = Duration::from_secs(60);

/// Starts `rein serve --config <path>`; `Err(its log)` if it exits before listening.
fn start(path: &Path) -> Result<Server, String> {
    Rein::serve(path).try_start(START_WITHIN)
}

/// The data directory `dir/data` (created), with a 1 MiB image of each name in `images`.
fn data_with(dir: &Path, images: &[&str]) -> std::path::PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    for f in images {
        std::fs::write(data.join(f), vec![0u8; 1 << 20]).unwrap();
    }
    data
}

fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let (code, _, body) = common::http(addr, method, path, "Content-Type: application/json\r\n", body);
    (code, body)
}

fn tenant(admin: SocketAddr, name: &str) -> serde_json::Value {
    let (code, body) = http(admin, "GET", &format!("/api/tenants/{name}"), "");
    assert_eq!(code, 200, "{name}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn nbdinfo_size(nbd: SocketAddr, export: &str) -> Result<u64, String> {
    let out = Command::new("nbdinfo")
        .args(["--size", &format!("nbd://{}/{export}", nbd)])
        .output()
        .expect("nbdinfo is installed (scripts/test.sh)");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().parse().unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

const BASE: &str = r#"
capacity_iops = 1000
[[exports]]
name = "a"
backend = "memory"
size_mb = 1
[[tenants]]
name = "a"
reservation = 100
"#;

/// Before: a PUT reverted silently on restart, and tenants and exports could not be added. Now every
/// change survives a restart, the log names what came from the state file, and an export added at run
/// time serves nbdinfo at once and after the restart.
#[test]
fn runtime_changes_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config_file(tmp.path(), 41, BASE);
    let s = start(&path).unwrap();
    assert_eq!(http(s.admin, "PUT", "/api/tenants/a", r#"{"reservation": 300, "weight": 5}"#).0, 200);
    assert_eq!(http(s.admin, "PUT", "/api/capacity", r#"{"iops": 2000}"#).0, 200);
    assert_eq!(http(s.admin, "POST", "/api/tenants", r#"{"name": "b", "reservation": 50}"#).0, 201);
    assert!(nbdinfo_size(s.nbd, "b").is_err(), "no export b yet");
    let (code, body) =
        http(s.admin, "POST", "/api/exports", r#"{"name": "b", "path": "b.img", "size_mb": 2, "tenant": "b"}"#);
    assert_eq!(code, 201, "{body}");
    assert_eq!(nbdinfo_size(s.nbd, "b"), Ok(2 << 20), "a new export is visible to new connections at once");
    // Names with control characters (they wrote lines of their own into the text log) and a name whose
    // default path lies in no directory (a 500, as a failed open, before) are bad requests.
    for (path, body, says) in [
        ("/api/exports", r#"{"name": "e\nfake line", "size_mb": 1, "tenant": "b"}"#, "has a control character"),
        ("/api/tenants", r#"{"name": "t\u001b[31m"}"#, "has a control character"),
        ("/api/exports", r#"{"name": "y/z", "size_mb": 1, "tenant": "b"}"#, "does not exist in the data directory"),
    ] {
        let (code, answer) = http(s.admin, "POST", path, body);
        assert_eq!(code, 400, "{body}: {answer}");
        assert!(answer.contains(says), "{body}: {answer}");
    }
    // Another export on the file export b has open, by its path or through a link, is refused (400),
    // read-only or not (b writes it); one on a file of its own is not.
    std::os::unix::fs::symlink(tmp.path().join("data/b.img"), tmp.path().join("data/link.img")).unwrap();
    for (path, ro) in [("b.img", false), ("link.img", false), ("b.img", true)] {
        let body = format!(r#"{{"name": "b2", "path": "{path}", "read_only": {ro}, "tenant": "b"}}"#);
        let (code, answer) = http(s.admin, "POST", "/api/exports", &body);
        assert_eq!(code, 400, "{path} read_only={ro}: {answer}");
        assert!(answer.contains(r#"exports \"b\" and \"b2\" are backed by the same file"#), "{answer}");
    }
    let (code, body) =
        http(s.admin, "POST", "/api/exports", r#"{"name": "b3", "path": "b3.img", "size_mb": 1, "tenant": "b"}"#);
    assert_eq!(code, 201, "{body}");
    assert_eq!(http(s.admin, "DELETE", "/api/exports/b3", "").0, 204);
    s.stop();
    let state = std::fs::read_to_string(tmp.path().join("data/rein-state.json")).unwrap();
    assert!(state.contains("\"version\": 1"), "{state}");
    let s = start(&path).unwrap();
    let a = tenant(s.admin, "a");
    assert_eq!((a["reservation"].as_f64(), a["weight"].as_f64()), (Some(300.0), Some(5.0)));
    assert_eq!(tenant(s.admin, "b")["reservation"].as_f64(), Some(50.0));
    let (_, cap) = http(s.admin, "GET", "/api/capacity", "");
    assert!(cap.contains("\"iops\":2000.0") && cap.contains("\"source\":\"admin\""), "{cap}");
    assert_eq!(nbdinfo_size(s.nbd, "b"), Ok(2 << 20));
    s.wait_line("applied the run-time changes kept in the state file");
    s.wait_line("tenant a: r=300");
    // Deleting: the export first (409 before), then the tenant; both stay deleted after a restart.
    assert_eq!(http(s.admin, "DELETE", "/api/tenants/b", "").0, 409);
    let open = common::Raw::connect(s.nbd, "b");
    assert_eq!(http(s.admin, "DELETE", "/api/exports/b", "").0, 204);
    assert!(nbdinfo_size(s.nbd, "b").is_err(), "a deleted export refuses new opens");
    // Its file is still written by the connection open to it: another tenant's export on it is refused
    // (before, tenant a's new export and b's connection wrote one disk); b's own, or once the
    // connection closed, a's, are not.
    let on_b = |name: &str, tenant: &str| {
        http(
            s.admin,
            "POST",
            "/api/exports",
            &format!(r#"{{"name": "{name}", "path": "b.img", "tenant": "{tenant}"}}"#),
        )
    };
    let (code, answer) = on_b("c", "a");
    assert_eq!(code, 400, "{answer}");
    assert!(answer.contains(r#"exports \"b (deleted, still open by its connections)\" and \"c\""#), "{answer}");
    assert_eq!(on_b("b4", "b").0, 201, "the deleted export's own tenant");
    assert_eq!(http(s.admin, "DELETE", "/api/exports/b4", "").0, 204);
    drop(open);
    let mut code = 0;
    for _ in 0..100 {
        code = on_b("c", "a").0;
        if code == 201 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(code, 201, "once the connection closed");
    assert_eq!(http(s.admin, "DELETE", "/api/exports/c", "").0, 204);
    assert_eq!(http(s.admin, "DELETE", "/api/tenants/b", "").0, 204);
    s.stop();
    let s = start(&path).unwrap();
    assert_eq!(http(s.admin, "GET", "/api/tenants/b", "").0, 404);
    assert!(nbdinfo_size(s.nbd, "b").is_err());
    // The operator edits tenant a in the file: the file wins for a from then on.
    s.stop();
    std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replace("reservation = 100", "reservation = 150"))
        .unwrap();
    let s = start(&path).unwrap();
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(150.0));
    s.wait_line("tenant a: the configuration file changed it");
}

/// The file's own export and tenant, deleted at run time, stay deleted: before, a restart or reload
/// brought the tenant back ("an export of the file uses it", counting the export the state had
/// deleted), and with it its reservation. With every export deleted and a capacity probe due, the start
/// runs without a capacity (it panicked: the probe had no export to measure).
#[test]
fn the_files_export_and_tenant_deleted_at_run_time_stay_deleted_and_a_probe_with_no_export_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config_file(tmp.path(), 182, BASE);
    let s = start(&path).unwrap();
    assert_eq!(http(s.admin, "DELETE", "/api/exports/a", "").0, 204);
    assert_eq!(http(s.admin, "DELETE", "/api/tenants/a", "").0, 204);
    s.signal("-HUP");
    reloaded(&s, 1);
    assert_eq!(http(s.admin, "GET", "/api/tenants/a", "").0, 404, "a reload keeps the deletion");
    s.stop();
    let s = start(&path).unwrap();
    assert_eq!(http(s.admin, "GET", "/api/tenants/a", "").0, 404, "a restart keeps the deletion");
    assert!(nbdinfo_size(s.nbd, "a").is_err());
    s.wait_line("tenant a: deleted (state file)");
    s.stop();
    let probing = BASE.replace("capacity_iops = 1000\n", "probe_capacity_s = 1\n");
    config_file(tmp.path(), 182, &probing);
    let s = start(&path).unwrap();
    s.wait_line("probe_capacity_s is set but there is no export to probe");
    assert_eq!(http(s.admin, "GET", "/api/tenants/a", "").0, 404);
}

/// Before: SIGHUP killed the server. Now it reloads the file: tenants and exports added, removed and
/// changed, settings that need a restart reported; a bad file changes nothing and is logged once.
#[test]
fn sighup_reloads_the_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config_file(tmp.path(), 42, BASE);
    let s = start(&path).unwrap();
    let added = format!(
        "queue_depth = 8\n{}\n[[exports]]\nname = \"c\"\nbackend = \"memory\"\nsize_mb = 3\ntenant = \"c\"\n\
         [[tenants]]\nname = \"c\"\nreservation = 20\n",
        BASE.replace("reservation = 100", "reservation = 200")
    );
    config_file(tmp.path(), 42, &added);
    s.signal("-HUP");
    s.wait_line("configuration reloaded");
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(200.0));
    assert_eq!(tenant(s.admin, "c")["reservation"].as_f64(), Some(20.0));
    assert_eq!(nbdinfo_size(s.nbd, "c"), Ok(3 << 20));
    s.wait_line("queue_depth (needs a restart)");
    // A bad file: logged once, nothing changes, the server keeps serving.
    std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replace("reservation = 20\n", "reservation = -1\n"))
        .unwrap();
    s.signal("-HUP");
    let line = s.wait_line("the running configuration is unchanged");
    assert!(line.contains("tenant c") && line.contains("rein.toml"), "{line}");
    assert_eq!(tenant(s.admin, "c")["reservation"].as_f64(), Some(20.0));
    // Removing the export and its tenant.
    config_file(tmp.path(), 42, BASE);
    s.signal("-HUP");
    s.wait_line("tenant c removed");
    assert!(nbdinfo_size(s.nbd, "c").is_err());
    assert_eq!(nbdinfo_size(s.nbd, "a"), Ok(1 << 20));
    let n = s.log.lock().unwrap().iter().filter(|l| l.contains("the running configuration is unchanged")).count();
    assert_eq!(n, 1, "the bad file is logged once");
}

/// `[mclock]` changes on a reload (it needed a restart before): here `limit_mode` from strict (Algorithm
/// 1: a tenant waits for its limit tag even on an idle device) to `break_when_idle`. Tenant "slow" is
/// limited to 2 IOPS with no burst: three READs sent at once take a second while strict (answered at
/// about 0, 0.5 and 1 s) and come back at once after the reload, the device being idle. A change of the
/// cost model (the unit of every reservation) still needs a restart, and is named.
#[test]
fn sighup_changes_the_scheduler_settings_live() {
    let tmp = tempfile::tempdir().unwrap();
    let text = |mclock: &str| {
        format!(
            "[mclock]\nlimit_burst_ios = 0\n{mclock}[[exports]]\nname = \"slow\"\nbackend = \"memory\"\nsize_mb = 1\n\
             [[tenants]]\nname = \"slow\"\nlimit = 2\n"
        )
    };
    let path = config_file(tmp.path(), 36, &text(""));
    let s = start(&path).unwrap();
    // Three READs in one write; returns how long the last answer took.
    let three = || {
        let mut c = common::Raw::connect(s.nbd, "slow");
        let t0 = std::time::Instant::now();
        let reads: Vec<u8> =
            (0..3u64).flat_map(|h| common::Raw::header(rein_proto::nbd::Command::Read, h, 0, 4096)).collect();
        std::io::Write::write_all(&mut c.s, &reads).unwrap();
        for _ in 0..3 {
            assert_eq!(c.reply(4096).1, 0, "a READ fails");
        }
        t0.elapsed()
    };
    let strict = three();
    assert!(strict >= Duration::from_millis(800), "strict: 3 READs at 2 IOPS took {strict:?}");
    config_file(tmp.path(), 36, &text("limit_mode = \"break_when_idle\"\ncost_model = \"bytes\"\n"));
    s.signal("-HUP");
    s.wait_line("configuration reloaded");
    let line = s.wait_line("reload: [mclock]");
    assert!(line.contains("limit_mode Strict -> BreakWhenIdle") && !line.contains("cost_model"), "{line}");
    s.wait_line("cost_model (needs a restart)");
    let idle = three();
    assert!(idle < Duration::from_millis(400), "break_when_idle: 3 READs on an idle device took {idle:?}");
}

/// Before: two servers on one data directory both started. Now the second fails naming the directory and
/// the first one's pid.
#[test]
fn a_second_server_on_the_data_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config_file(tmp.path(), 43, BASE);
    let s = start(&path).unwrap();
    let err = start(&path).err().expect("the second server must not start");
    assert!(err.contains("is in use by another rein serve") && err.contains(&format!("pid {}", s.pid())), "{err}");
    assert!(err.contains(&tmp.path().join("data").display().to_string()), "{err}");
}

/// A state file that cannot be parsed stops the start with an error naming it (it is not ignored).
#[test]
fn a_corrupt_state_file_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config_file(tmp.path(), 44, BASE);
    std::fs::create_dir_all(tmp.path().join("data")).unwrap();
    std::fs::write(tmp.path().join("data/rein-state.json"), "{\"version\": 1, \"tenants\": {\"a\": 3}}").unwrap();
    let err = start(&path).err().expect("must not start");
    assert!(err.contains("rein-state.json is unusable") && err.contains("move it away"), "{err}");
    assert_eq!(err.matches("invalid type").count(), 1, "the cause once: {err}");
}

/// Before: with reservations and no capacity, admission did nothing, silently. Now the server refuses to
/// start and says how to set one, and how to start anyway once (the error said `admission = "warn"`
/// twice: in its hint and again in the refusal's).
#[test]
fn admission_fails_closed_without_a_capacity() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config_file(tmp.path(), 45, &BASE.replace("capacity_iops = 1000\n", ""));
    let err = start(&path).err().expect("must not start");
    assert!(
        err.contains("no capacity is known") && err.contains("capacity_iops") && err.contains("probe_capacity_s"),
        "{err}"
    );
    assert_eq!(err.matches("admission = \"warn\"").count(), 1, "the way to start anyway, once: {err}");
    let path = config_file(tmp.path(), 45, &BASE.replace("capacity_iops = 1000\n", "admission = \"warn\"\n"));
    let s = start(&path).unwrap();
    s.wait_line("no capacity is known");
}

/// The outcome of the reload just asked for: waits (bounded) for `configuration reloaded` or for the line
/// of a reload that failed, and returns the first one.
fn reload_outcome(s: &Server) -> String {
    let t0 = std::time::Instant::now();
    loop {
        let found = s.log.lock().unwrap().iter().find_map(|l| {
            (l.contains("configuration reloaded") || l.contains("the running configuration is unchanged"))
                .then(|| l.clone())
        });
        if let Some(l) = found {
            return l;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no reload line: {:#?}", s.log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Before: an export added at run time under a relative `data_dir` (the default `rein-data` is one) was
/// kept in the state file with the data directory in its path and read back with the data directory
/// joined again: `reload: export vm7: s1/data/s1/data/vm7.img: open failed` at every SIGHUP, and the next
/// start failed the same way. Now both find it, and what was written before the restart is read back.
#[test]
fn an_export_added_under_a_relative_data_dir_survives_a_reload_and_a_restart() {
    let tmp = common::tmpdir("relative");
    let path = common::write_file(tmp.path(), "rein.toml", &format!("{}\ndata_dir = \"s1/data\"\n{BASE}", local(150)));
    let serve = || Rein::serve(&path).current_dir(tmp.path()).try_start(START_WITHIN);
    let s = serve().unwrap();
    let (code, body) = http(s.admin, "POST", "/api/exports", r#"{"name": "vm7", "size_mb": 8, "tenant": "a"}"#);
    assert_eq!(code, 201, "{body}");
    assert!(tmp.path().join("s1/data/vm7.img").is_file(), "the image is inside the data directory");
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut c = common::Raw::connect(s.nbd, "vm7");
    c.send(rein_proto::nbd::Command::Write, 1, 8192, 4096, &block);
    assert_eq!(c.reply(0).1, 0, "the WRITE fails");
    c.send(rein_proto::nbd::Command::Flush, 2, 0, 0, &[]);
    assert_eq!(c.reply(0).1, 0, "the FLUSH fails");
    drop(c);
    s.signal("-HUP");
    let line = reload_outcome(&s);
    assert!(line.contains("configuration reloaded"), "{line}");
    s.stop();
    let s = serve().unwrap_or_else(|log| panic!("the restart fails: {log}"));
    s.wait_line("export vm7: added (state file)");
    let mut c = common::Raw::connect(s.nbd, "vm7");
    c.send(rein_proto::nbd::Command::Read, 3, 8192, 4096, &[]);
    let (_, error, data) = c.reply(4096);
    assert_eq!(error, 0, "the READ fails");
    assert!(data == block, "the block written before the restart is not read back");
}

/// Waits (bounded) until the log has `n` lines `configuration reloaded`.
fn reloaded(s: &Server, n: usize) {
    let t0 = std::time::Instant::now();
    while s.log.lock().unwrap().iter().filter(|l| l.contains("configuration reloaded")).count() < n {
        assert!(t0.elapsed() < Duration::from_secs(30), "not {n} reloads: {:#?}", s.log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many log lines contain `part`.
fn lines_with(s: &Server, part: &str) -> usize {
    s.log.lock().unwrap().iter().filter(|l| l.contains(part)).count()
}

/// Before: a reload changed nothing of `idle_timeout_s`, `shutdown_timeout_s`, `max_inflight_mb`,
/// `max_inflight_mb_per_tenant`, `[node]` and `[pshift]`, and said nothing; and `default_export` and
/// `[tls]` were named as needing a restart only at the first reload that changed them, then taken as
/// applied (silent at the next reload of the same file, named again when the file went back to what
/// runs). Now each setting that cannot change live is named at every reload while the file differs from
/// what runs, and not once it matches again. (`[tls]` has applied live since 2026-12-05: said once per
/// change.)
#[test]
fn settings_that_need_a_restart_are_named_at_each_reload_until_the_file_matches() {
    let tmp = common::tmpdir("restart-only");
    common::write_file(tmp.path(), "keys.psk", "alice:00112233445566778899aabbccddeeff\n");
    let path = config_file(tmp.path(), 151, BASE);
    let s = start(&path).unwrap();
    let changed = format!(
        "idle_timeout_s = 60\nshutdown_timeout_s = 3\nmax_inflight_mb = 64\nmax_inflight_mb_per_tenant = 32\n\
         default_export = \"a\"\nscheduler = \"token\"\n{BASE}[node]\nenabled = true\n\
         [pshift]\ncontroller = \"127.0.0.151:7800\"\nname = \"s1\"\n[tls]\nmode = \"on\"\npsk_file = \"keys.psk\"\n"
    );
    let keys = [
        "idle_timeout_s",
        "shutdown_timeout_s",
        "max_inflight_mb",
        "max_inflight_mb_per_tenant",
        "[node]",
        "[pshift]",
        "default_export",
        "scheduler",
    ];
    let named = |key: &str| lines_with(&s, &format!("reload: {key} (needs a restart)"));
    for n in 1..=2 {
        config_file(tmp.path(), 151, &changed);
        s.signal("-HUP");
        reloaded(&s, n);
        for key in keys {
            assert_eq!(named(key), n, "{key} after reload {n}: {:#?}", s.log.lock().unwrap());
        }
        // `[tls]` applies live (since 2026-12-05), said once: the second reload finds the same bytes.
        assert_eq!(lines_with(&s, "reload: [tls]: mode off -> on, new credentials"), 1, "{:#?}", s.log.lock().unwrap());
    }
    // Back to what runs: nothing is named.
    config_file(tmp.path(), 151, BASE);
    s.signal("-HUP");
    reloaded(&s, 3);
    for key in keys {
        assert_eq!(named(key), 2, "{key} with the file as it runs: {:#?}", s.log.lock().unwrap());
    }
    assert_eq!(lines_with(&s, "needs a restart"), 2 * keys.len(), "{:#?}", s.log.lock().unwrap());
    assert_eq!(lines_with(&s, "reload: [tls]: mode on -> off"), 1, "{:#?}", s.log.lock().unwrap());
}

/// Before: SIGHUP read the configuration file on the server's event loop; with a FIFO in its place (or a
/// hung mount) the open blocked it: new NBD connections hung and SIGTERM was ignored (only SIGKILL ended
/// the server). Now the file is read on a thread of its own: clients are served meanwhile and SIGTERM
/// stops the server at once, the stuck read abandoned.
#[test]
fn a_reload_whose_file_never_reads_blocks_neither_clients_nor_sigterm() {
    let tmp = common::tmpdir("fifo");
    let path = config_file(tmp.path(), 152, BASE);
    let mut s = start(&path).unwrap();
    let _writer = common::fifo_in_place_of(&path);
    s.signal("-HUP");
    std::thread::sleep(Duration::from_millis(300));
    let open = common::nbd_open(s.nbd, "a", true, Duration::from_secs(5));
    assert!(open.is_ok_and(|o| o.size == 1 << 20), "a client is not served while the file is read");
    // One more SIGHUP waits for the read under way.
    s.signal("-HUP");
    let took = s.terminate(Duration::from_secs(5));
    assert!(took < Duration::from_secs(3), "SIGTERM took {took:?}");
    assert_eq!(lines_with(&s, "configuration reloaded"), 0);
    s.wait_line("the configuration file is still being read for a reload; that reload is abandoned");
}

/// A read lease on a file, held by this process until dropped: another process's open of the file for
/// writing blocks until the lease is released, or broken by the kernel after
/// `/proc/sys/fs/lease-break-time` seconds (45 by default), as an open on a hung network mount blocks. (A
/// FIFO would not do: an export's file is refused before it is opened if it is one.) The lease's break is
/// signalled with SIGURG, which this process ignores by default.
struct Lease {
    _file: std::fs::File,
}

impl Lease {
    #[allow(unsafe_code)] // fcntl(F_SETSIG, F_SETLEASE) has no safe wrapper; see the SAFETY comment.
    fn take(path: &Path) -> Lease {
        use std::os::fd::AsRawFd;
        // Linux's F_SETSIG (fcntl.h), which the libc crate does not define.
        const F_SETSIG: libc::c_int = 10;
        let file = std::fs::File::open(path).unwrap();
        // SAFETY: fcntl on a descriptor this function owns, with integer arguments.
        let ok = unsafe {
            libc::fcntl(file.as_raw_fd(), F_SETSIG, libc::SIGURG) == 0
                && libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) == 0
        };
        assert!(ok, "a read lease on {}: {}", path.display(), std::io::Error::last_os_error());
        Lease { _file: file }
    }
}

/// Before: a reload opened the storage of a new export on the server's event loop; a file whose open
/// blocked (here a file under a lease, in service a hung mount) stopped new NBD connections and SIGTERM
/// until it opened. Now the files are opened on a thread of their own and the reload applies, as a whole,
/// once they are open: meanwhile clients are served, nothing of the reload is applied, a newer reload
/// replaces it (the latest wins), and SIGTERM stops the server at once.
#[test]
fn a_reload_whose_export_file_blocks_its_open_blocks_neither_clients_nor_sigterm() {
    let break_s: u64 = std::fs::read_to_string("/proc/sys/fs/lease-break-time").unwrap().trim().parse().unwrap();
    assert!(break_s >= 20, "fs.lease-break-time is {break_s} s: too short for this test's bounds");
    let tmp = common::tmpdir("slow-open");
    let path = config_file(tmp.path(), 154, BASE);
    let data = data_with(tmp.path(), &["slow.img", "slow2.img"]);
    let mut s = start(&path).unwrap();
    let config = |reservation: u32, slow: &[&str]| {
        let mut body = BASE.replace("reservation = 100", &format!("reservation = {reservation}"));
        for f in slow {
            body += &format!("[[exports]]\nname = \"{f}\"\npath = \"{f}.img\"\ntenant = \"a\"\n");
        }
        config_file(tmp.path(), 154, &body);
    };
    let lease = Lease::take(&data.join("slow.img"));
    config(200, &["slow"]);
    s.signal("-HUP");
    std::thread::sleep(Duration::from_millis(300));
    let open = common::nbd_open(s.nbd, "a", false, Duration::from_secs(5));
    let open = open.unwrap_or_else(|e| panic!("a new client is not served while a reload opens a file: {e}"));
    let mut raw = common::Raw { s: open.stream, buf: open.buf };
    raw.send(rein_proto::nbd::Command::Read, 7, 0, 4096, &[]);
    assert_eq!(raw.reply(4096), (7, 0, vec![0u8; 4096]), "a READ on a new connection");
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(100.0), "applied before its file opened");
    // The latest wins: the file mended (no slow export), the stuck reload is replaced.
    config(300, &[]);
    s.signal("-HUP");
    s.wait_line("a newer reload replaces the one still under way");
    s.wait_line("configuration reloaded");
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(300.0));
    assert!(nbdinfo_size(s.nbd, "slow").is_err(), "the replaced reload's export was added");
    // Once the file opens (the lease released), the reload applies as a whole.
    config(400, &["slow"]);
    s.signal("-HUP");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(300.0), "applied before its file opened");
    drop(lease);
    s.wait_log(&["export slow added"], Duration::from_secs(10));
    assert_eq!(nbdinfo_size(s.nbd, "slow"), Ok(1 << 20));
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(400.0));
    // SIGTERM while a reload's open is stuck: the server stops at once, the reload abandoned.
    let _lease = Lease::take(&data.join("slow2.img"));
    config(400, &["slow", "slow2"]);
    s.signal("-HUP");
    std::thread::sleep(Duration::from_millis(300));
    let took = s.terminate(Duration::from_secs(5));
    assert!(took < Duration::from_secs(3), "SIGTERM took {took:?}");
    s.wait_line("stopping: a reload is still under way");
    assert_eq!(lines_with(&s, "configuration reloaded"), 2, "{:#?}", s.log.lock().unwrap());
}

/// Before: `POST /api/exports` of a file whose open blocked held up the server's exit after SIGTERM until
/// the open returned (the change's task kept the dispatcher alive, and the runtime waited for its blocking
/// open). Now a stop abandons a change still under way and the open's thread is left to end with the
/// process: SIGTERM stops the server at once.
#[test]
fn an_added_export_whose_file_blocks_its_open_does_not_hold_up_sigterm() {
    use std::io::Write;
    let (_tmp, _path, mut s, _lease) = leased_image("slow-add", 155);
    let body = r#"{"name": "slow", "path": "slow.img", "tenant": "a"}"#;
    let mut post = std::net::TcpStream::connect(s.admin).unwrap();
    write!(
        post,
        "POST /api/exports HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let open = common::nbd_open(s.nbd, "a", true, Duration::from_secs(5));
    assert!(open.is_ok_and(|o| o.size == 1 << 20), "a client is not served while an export's file is opened");
    let took = s.terminate(Duration::from_secs(10));
    assert!(took < Duration::from_secs(3), "SIGTERM took {took:?}");
    s.wait_line("stopping: changes still under way are abandoned");
    drop(post);
}

/// A server on 127.0.0.`host` over [`BASE`] in `tmpdir(name)`, whose data directory holds a 1 MiB
/// `slow.img` under another process's read lease (an open of it for writing blocks): the directory, the
/// configuration's path, the server and the lease (declared in that order, so they drop in reverse).
fn leased_image(name: &str, host: u8) -> (tempfile::TempDir, std::path::PathBuf, Server, Lease) {
    let tmp = common::tmpdir(name);
    let path = config_file(tmp.path(), host, BASE);
    let data = data_with(tmp.path(), &["slow.img"]);
    let s = start(&path).unwrap();
    let lease = Lease::take(&data.join("slow.img"));
    (tmp, path, s, lease)
}

/// `http`, answered within 5 s: `None` if not (the request left to end on its own thread).
fn http_within(admin: SocketAddr, method: &'static str, path: &str, body: &str) -> Option<(u16, String)> {
    let (path, body) = (path.to_string(), body.to_string());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(http(admin, method, &path, &body));
    });
    rx.recv_timeout(Duration::from_secs(5)).ok()
}

/// Before: `POST /api/exports` held the change lock while it opened the export's file, so a file whose
/// open blocked (here a file under a lease, in service a hung mount) held up every admin change after it
/// (a PUT, another POST, a DELETE) until the open returned. Now the file is opened without the lock: other
/// changes go on meanwhile; once the file opens, the export is checked again under the lock, and a name
/// taken meanwhile refuses it (409).
#[test]
fn an_added_export_whose_file_blocks_its_open_holds_up_no_other_admin_change() {
    let (_tmp, _path, s, lease) = leased_image("slow-add-others", 159);
    let admin = s.admin;
    let stuck = std::thread::spawn(move || {
        http(admin, "POST", "/api/exports", r#"{"name": "slow", "path": "slow.img", "tenant": "a"}"#)
    });
    std::thread::sleep(Duration::from_millis(300));
    let change = |method: &'static str, path: &str, body: &str| {
        http_within(admin, method, path, body)
            .unwrap_or_else(|| panic!("{method} {path} waits for the stuck POST's open"))
    };
    assert_eq!(change("PUT", "/api/tenants/a", r#"{"reservation": 200}"#).0, 200);
    let mm = r#"{"name": "mm", "backend": "memory", "size_mb": 1, "tenant": "a"}"#;
    assert_eq!(change("POST", "/api/exports", mm).0, 201);
    assert_eq!(change("DELETE", "/api/exports/mm", "").0, 204);
    // The stuck export's name, taken while its file is opened.
    let taken = r#"{"name": "slow", "backend": "memory", "size_mb": 2, "tenant": "a"}"#;
    assert_eq!(change("POST", "/api/exports", taken).0, 201);
    assert!(!stuck.is_finished(), "the POST of the file under a lease has an answer");
    drop(lease);
    let (code, body) = stuck.join().unwrap();
    assert_eq!(code, 409, "{body}");
    assert!(body.contains(r#"export \"slow\" exists"#), "{body}");
    assert_eq!(nbdinfo_size(s.nbd, "slow"), Ok(2 << 20), "the export is the memory one");
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(200.0));
}

/// The threads of process `pid` named `name` (as /proc shows them: at most 15 bytes).
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Before: each SIGHUP that replaced a reload stuck in the open of an export's file started one more
/// thread opening that file, each blocked for as long as the file: five reloads, five threads. Now a
/// reload that needs a file whose open is under way waits for that open: one thread, however many
/// reloads; once the file opens, the latest reload applies and the thread is gone.
#[test]
fn reloads_over_a_stuck_file_hold_one_thread_between_them() {
    let (tmp, _path, s, lease) = leased_image("slow-reloads", 160);
    let reloads = 5;
    for k in 0..reloads {
        let body = BASE.replace("reservation = 100", &format!("reservation = {}", 200 + k))
            + "[[exports]]\nname = \"slow\"\npath = \"slow.img\"\ntenant = \"a\"\n";
        config_file(tmp.path(), 160, &body);
        s.signal("-HUP");
        if k == 0 {
            std::thread::sleep(Duration::from_millis(300));
        } else {
            let t0 = std::time::Instant::now();
            while lines_with(&s, "a newer reload replaces") < k {
                assert!(t0.elapsed() < Duration::from_secs(30), "reload {k} not read: {:#?}", s.log.lock().unwrap());
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(threads_named(s.pid(), "rein-open"), 1, "threads opening the stuck file");
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(100.0), "applied before its file opened");
    drop(lease);
    reloaded(&s, 1);
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(200.0 + (reloads - 1) as f64));
    assert_eq!(nbdinfo_size(s.nbd, "slow"), Ok(1 << 20));
    let t0 = std::time::Instant::now();
    while threads_named(s.pid(), "rein-open") > 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "a thread opening the file is left");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Before: a change whose state file could not be written (a full disk) got its 500 and nothing else: no
/// log line, and an empty `rein-state.json.tmp` left in the data directory. Now the server logs it once
/// at ERROR, naming the file and the cause, and removes the temporary file; the change is not applied.
/// The write is made to fail by a directory in the state file's place (refused before anything is written;
/// as root a read-only directory would not stop the write).
#[test]
fn a_state_file_that_cannot_be_written_is_logged_once_and_leaves_no_temporary_file() {
    let tmp = common::tmpdir("unwritable");
    let path = config_file(tmp.path(), 153, BASE);
    let s = start(&path).unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(data.join("rein-state.json")).unwrap();
    let (code, body) = http(s.admin, "PUT", "/api/tenants/a", r#"{"reservation": 300}"#);
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("cannot write the state file"), "{body}");
    let line = s.wait_line("the change is not applied");
    assert!(line.contains("ERROR") && line.contains("rein-state.json") && line.contains("it is a directory"), "{line}");
    assert_eq!(lines_with(&s, "cannot write the state file"), 1, "{:#?}", s.log.lock().unwrap());
    let left: Vec<_> = std::fs::read_dir(&data).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!left.iter().any(|n| n.to_string_lossy().ends_with(".tmp")), "a temporary file is left: {left:?}");
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(100.0), "the change is applied");
}

/// Before: `POST /api/exports` refused a memory export without `size_mb` (400 `a memory export needs
/// size_mb`), though rein.toml gives one 1024 MiB. Now it has the same default.
#[test]
fn a_memory_export_added_without_size_mb_has_the_configs_default() {
    let tmp = common::tmpdir("memory-default");
    let path = config_file(tmp.path(), 156, BASE);
    let s = start(&path).unwrap();
    let (code, body) = http(s.admin, "POST", "/api/exports", r#"{"name": "mm", "backend": "memory", "tenant": "a"}"#);
    assert_eq!(code, 201, "{body}");
    let open = common::nbd_open(s.nbd, "mm", true, Duration::from_secs(5)).unwrap();
    assert_eq!(open.size, 1024 << 20);
}

/// `POST /api/exports` of a read-only export whose file is missing: 400 saying that a read-only export is
/// not created (before: 500 `open failed: No such file or directory`); nothing is created.
#[test]
fn a_read_only_export_of_a_missing_file_is_a_bad_request() {
    let tmp = common::tmpdir("ro-missing");
    let path = config_file(tmp.path(), 158, BASE);
    let s = start(&path).unwrap();
    let (code, body) = http(
        s.admin,
        "POST",
        "/api/exports",
        r#"{"name": "ro", "path": "ro.img", "size_mb": 8, "read_only": true, "tenant": "a"}"#,
    );
    assert_eq!(code, 400, "{body}");
    let img = tmp.path().join("data/ro.img");
    assert!(
        body.contains(&format!("export ro: {} does not exist (a read-only export is not created)", img.display())),
        "{body}"
    );
    assert!(!img.exists(), "an image was created");
}

/// A reload that removes a tenant whose deleted export still has a connection open (the API refuses
/// that with 409) applies, and says at WARN that the connection's requests now fail; before, a VM's IO
/// failed with EINVAL after an info line.
#[test]
fn a_reload_that_removes_a_tenant_with_open_connections_warns() {
    let tmp = tempfile::tempdir().unwrap();
    let with_z =
        format!("{BASE}[[exports]]\nname = \"z\"\nbackend = \"memory\"\nsize_mb = 1\n[[tenants]]\nname = \"z\"\n");
    let path = config_file(tmp.path(), 227, &with_z);
    let s = start(&path).unwrap();
    let open = common::Raw::connect(s.nbd, "z");
    std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replace(&with_z, BASE)).unwrap();
    s.signal("-HUP");
    reloaded(&s, 1);
    let line = s.wait_line("tenant z was removed while connections to its deleted export z are open");
    assert!(line.contains("WARN"), "{line}");
    drop(open);
}

/// A reload of `capacity_iops` changes the capacity admission uses, not the device model's: before, a
/// server started with a model of 2,000 IOPS served 5,000 once a reload set `capacity_iops = 5000`
/// (`device_model_iops` 5000 in `/api/capacity`), where a start with that file serves 2,000. A capacity
/// set at run time still sets the model, and a reload whose file edit drops it gives the model its own back.
#[test]
fn a_reload_of_capacity_iops_leaves_the_device_model_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let body = BASE.replace("capacity_iops = 1000", "capacity_iops = 2000\n[device_model]\ncapacity_iops = 2000");
    let path = config_file(tmp.path(), 178, &body);
    let s = start(&path).unwrap();
    let capacity = || {
        let (code, body) = http(s.admin, "GET", "/api/capacity", "");
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        (v["iops"].as_f64(), v["source"].as_str().map(str::to_string), v["device_model_iops"].as_f64())
    };
    // The file's first capacity_iops (admission's), not [device_model]'s.
    let edit = |from: &str, to: &str| {
        std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replacen(from, to, 1)).unwrap()
    };
    assert_eq!(capacity(), (Some(2000.0), Some("device_model".into()), Some(2000.0)));
    edit("capacity_iops = 2000", "capacity_iops = 5000");
    s.signal("-HUP");
    reloaded(&s, 1);
    assert_eq!(capacity(), (Some(5000.0), Some("config".into()), Some(2000.0)), "the model keeps its 2,000 IOPS");
    // A capacity set at run time is the model's too; the file's edit of capacity_iops drops it, and the
    // model is its own again.
    assert_eq!(http(s.admin, "PUT", "/api/capacity", r#"{"iops": 3000}"#).0, 200);
    assert_eq!(capacity(), (Some(3000.0), Some("admin".into()), Some(3000.0)));
    edit("capacity_iops = 5000", "capacity_iops = 4000");
    s.signal("-HUP");
    reloaded(&s, 2);
    assert_eq!(capacity(), (Some(4000.0), Some("config".into()), Some(2000.0)));
}
