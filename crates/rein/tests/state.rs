//! `rein serve`'s durable and dynamic state with the real binary (issue 12, point 5): run-time changes
//! survive a restart (and the log says they came from the state file), SIGHUP reloads the configuration,
//! the data directory is locked, a corrupt state file stops the start, admission fails closed without a
//! capacity, and exports added at run time serve real clients. Each test uses its own 127.0.0.x address
//! (port 0) and temporary directory.
#![cfg(unix)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    nbd: SocketAddr,
    admin: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Waits (bounded) for a log line containing `needle`.
    fn wait_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(l) = self.log.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            assert!(Instant::now() < deadline, "no log line with {needle:?}: {:#?}", self.log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success();
        assert!(ok);
    }

    /// Stops the server with SIGTERM and waits for it to exit.
    fn stop(mut self) {
        self.signal("-TERM");
        let _ = self.child.wait();
    }
}

fn write_config(dir: &Path, host: u8, body: &str) -> std::path::PathBuf {
    let cfg = format!(
        "listen = \"127.0.0.{host}:0\"\nadmin = \"127.0.0.{host}:0\"\ndata_dir = \"{}\"\n{body}",
        dir.join("data").display()
    );
    let path = dir.join("rein.toml");
    std::fs::write(&path, cfg).unwrap();
    path
}

/// Starts `rein serve --config <path>`; `Err(stderr)` if it exits before listening.
fn start(path: &Path) -> Result<Server, String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["serve", "--config", path.to_str().unwrap()])
        .env("REIN_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start rein serve");
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let l2 = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("rein serve listening") {
                let field = |k: &str| {
                    line.split(&format!("{k}="))
                        .nth(1)
                        .and_then(|r| r.split_whitespace().next())
                        .map(|s| s.parse::<SocketAddr>().unwrap())
                };
                let _ = tx.send(Ok((field("nbd").unwrap(), field("admin").unwrap())));
            }
            l2.lock().unwrap().push(line);
        }
        let _ = tx.send(Err(()));
    });
    match rx.recv_timeout(Duration::from_secs(60)).expect("server neither listened nor exited") {
        Ok((nbd, admin)) => Ok(Server { child, nbd, admin, log }),
        Err(()) => {
            let _ = child.wait();
            Err(log.lock().unwrap().join("\n"))
        }
    }
}

fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    (out[9..12].parse().unwrap(), out.split("\r\n\r\n").nth(1).unwrap_or("").to_string())
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
    let path = write_config(tmp.path(), 41, BASE);
    let s = start(&path).unwrap();
    assert_eq!(http(s.admin, "PUT", "/api/tenants/a", r#"{"reservation": 300, "weight": 5}"#).0, 200);
    assert_eq!(http(s.admin, "PUT", "/api/capacity", r#"{"iops": 2000}"#).0, 200);
    assert_eq!(http(s.admin, "POST", "/api/tenants", r#"{"name": "b", "reservation": 50}"#).0, 201);
    assert!(nbdinfo_size(s.nbd, "b").is_err(), "no export b yet");
    let (code, body) =
        http(s.admin, "POST", "/api/exports", r#"{"name": "b", "path": "b.img", "size_mb": 2, "tenant": "b"}"#);
    assert_eq!(code, 201, "{body}");
    assert_eq!(nbdinfo_size(s.nbd, "b"), Ok(2 << 20), "a new export is visible to new connections at once");
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
    s.wait_log("applied the run-time changes kept in the state file");
    s.wait_log("tenant a: r=300");
    // Deleting: the export first (409 before), then the tenant; both stay deleted after a restart.
    assert_eq!(http(s.admin, "DELETE", "/api/tenants/b", "").0, 409);
    assert_eq!(http(s.admin, "DELETE", "/api/exports/b", "").0, 204);
    assert!(nbdinfo_size(s.nbd, "b").is_err(), "a deleted export refuses new opens");
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
    s.wait_log("tenant a: the configuration file changed it");
}

/// Before: SIGHUP killed the server. Now it reloads the file: tenants and exports added, removed and
/// changed, settings that need a restart reported; a bad file changes nothing and is logged once.
#[test]
fn sighup_reloads_the_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_config(tmp.path(), 42, BASE);
    let s = start(&path).unwrap();
    let added = format!(
        "queue_depth = 8\n{}\n[[exports]]\nname = \"c\"\nbackend = \"memory\"\nsize_mb = 3\ntenant = \"c\"\n\
         [[tenants]]\nname = \"c\"\nreservation = 20\n",
        BASE.replace("reservation = 100", "reservation = 200")
    );
    std::fs::write(&path, write_config_text(tmp.path(), 42, &added)).unwrap();
    s.signal("-HUP");
    s.wait_log("configuration reloaded");
    assert_eq!(tenant(s.admin, "a")["reservation"].as_f64(), Some(200.0));
    assert_eq!(tenant(s.admin, "c")["reservation"].as_f64(), Some(20.0));
    assert_eq!(nbdinfo_size(s.nbd, "c"), Ok(3 << 20));
    s.wait_log("queue_depth (needs a restart)");
    // A bad file: logged once, nothing changes, the server keeps serving.
    std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replace("reservation = 20\n", "reservation = -1\n"))
        .unwrap();
    s.signal("-HUP");
    let line = s.wait_log("the running configuration is unchanged");
    assert!(line.contains("tenant c") && line.contains("rein.toml"), "{line}");
    assert_eq!(tenant(s.admin, "c")["reservation"].as_f64(), Some(20.0));
    // Removing the export and its tenant.
    std::fs::write(&path, write_config_text(tmp.path(), 42, BASE)).unwrap();
    s.signal("-HUP");
    s.wait_log("tenant c removed");
    assert!(nbdinfo_size(s.nbd, "c").is_err());
    assert_eq!(nbdinfo_size(s.nbd, "a"), Ok(1 << 20));
    let n = s.log.lock().unwrap().iter().filter(|l| l.contains("the running configuration is unchanged")).count();
    assert_eq!(n, 1, "the bad file is logged once");
}

fn write_config_text(dir: &Path, host: u8, body: &str) -> String {
    format!(
        "listen = \"127.0.0.{host}:0\"\nadmin = \"127.0.0.{host}:0\"\ndata_dir = \"{}\"\n{body}",
        dir.join("data").display()
    )
}

/// Before: two servers on one data directory both started. Now the second fails naming the directory and
/// the first one's pid.
#[test]
fn a_second_server_on_the_data_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_config(tmp.path(), 43, BASE);
    let s = start(&path).unwrap();
    let err = start(&path).err().expect("the second server must not start");
    assert!(err.contains("is in use by another rein serve") && err.contains(&format!("pid {}", s.child.id())), "{err}");
    assert!(err.contains(&tmp.path().join("data").display().to_string()), "{err}");
}

/// A state file that cannot be parsed stops the start with an error naming it (it is not ignored).
#[test]
fn a_corrupt_state_file_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_config(tmp.path(), 44, BASE);
    std::fs::create_dir_all(tmp.path().join("data")).unwrap();
    std::fs::write(tmp.path().join("data/rein-state.json"), "{\"version\": 1, \"tenants\": {\"a\": 3}}").unwrap();
    let err = start(&path).err().expect("must not start");
    assert!(err.contains("rein-state.json is unusable") && err.contains("move it away"), "{err}");
    assert_eq!(err.matches("invalid type").count(), 1, "the cause once: {err}");
}

/// Before: with reservations and no capacity, admission did nothing, silently. Now the server refuses to
/// start and says how to set one.
#[test]
fn admission_fails_closed_without_a_capacity() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_config(tmp.path(), 45, &BASE.replace("capacity_iops = 1000\n", ""));
    let err = start(&path).err().expect("must not start");
    assert!(
        err.contains("no capacity is known") && err.contains("capacity_iops") && err.contains("probe_capacity_s"),
        "{err}"
    );
    let path = write_config(tmp.path(), 45, &BASE.replace("capacity_iops = 1000\n", "admission = \"warn\"\n"));
    let s = start(&path).unwrap();
    s.wait_log("no capacity is known");
}
