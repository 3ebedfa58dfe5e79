//! `rein load` when the server fails it: a server that never answers, requests answered with errors, an
//! export or server the job cannot use. nbdkit (memory plugin, error and blocksize-policy filters) plays
//! the server, on 127.0.0.203 (port chosen free), and is stopped at the end; tests needing it are skipped
//! when it is not installed. A run refused before connecting listens on 127.0.0.188 to see no connection.
mod common;

use common::{free_tcp, installed, KillOnDrop as Server};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const IP: &str = "127.0.0.203";

/// nbdkit with `args` (filters, plugin and its parameters) on [`IP`], once it accepts connections.
fn nbdkit(args: &[&str]) -> Option<(Server, SocketAddr)> {
    if !installed("nbdkit") {
        eprintln!("skipped: nbdkit is not installed");
        return None;
    }
    let addr = free_tcp(IP);
    let port = addr.port();
    let child = Command::new("nbdkit")
        .args(["-f", "--exit-with-parent", "-i", IP, "-p", &port.to_string()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    let start = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(start.elapsed() < Duration::from_secs(20), "nbdkit did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some((server, addr))
}

/// Runs `rein load --addr ADDR ARGS`, killed if it takes longer than `limit`: (success, stdout, stderr).
fn load(addr: SocketAddr, args: &[&str], limit: Duration) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["load", "--addr", &addr.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("rein load still ran after {limit:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// A server that accepts and never writes: the connect fails after its deadline (30 s), naming the
/// address (it waited for the server's greeting for good).
#[test]
fn a_silent_server_fails_the_connect_at_its_deadline() {
    let listener = TcpListener::bind((IP, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let held = std::thread::spawn(move || {
        // Accepts one connection and holds it, silent, until the test ends.
        let (s, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(60));
        drop(s);
    });
    let (ok, _, err) = load(addr, &["--job", "name=x", "--seconds", "2", "--warmup", "0"], Duration::from_secs(50));
    assert!(!ok, "{err}");
    assert!(err.contains(&addr.to_string()) && err.contains("no answer within 30 s"), "{err}");
    drop(held);
}

/// Every request answered with EIO: the run exits non-zero naming the count and the error; the failed
/// requests are not the server's completions.
#[test]
fn failed_requests_fail_the_run_and_are_no_completions() {
    let Some((_s, addr)) = nbdkit(&["--filter=error", "memory", "1M", "error=EIO", "error-rate=100%"]) else {
        return;
    };
    let (ok, out, err) =
        load(addr, &["--job", "name=x,depth=4", "--seconds", "2", "--warmup", "0", "--json"], Duration::from_secs(30));
    assert!(!ok, "the run's requests all failed: {err}");
    assert!(err.contains("requests failed") && err.contains("error 5 (EIO)"), "{err}");
    let v = json(&out);
    assert!(v["tenants"][0]["rejected"].as_u64().unwrap() > 0, "{out}");
    assert_eq!(v["tenants"][0]["completed"].as_u64(), Some(0), "{out}");
    assert_eq!(v["servers"][0]["completed"].as_u64(), Some(0), "a failed request is no completion: {out}");
}

/// A closed loop keeps its depth through errors: with 2% of requests failing, it still runs after its
/// first second (each failure shrank the loop by one until it stopped: 0 IOPS after about 400 requests).
#[test]
fn a_closed_loop_keeps_its_depth_through_errors() {
    let Some((_s, addr)) = nbdkit(&["--filter=error", "memory", "1M", "error=EIO", "error-rate=2%"]) else {
        return;
    };
    let (ok, out, err) = load(
        addr,
        &["--job", "name=x,depth=4,read=100", "--seconds", "3", "--warmup", "1", "--json"],
        Duration::from_secs(30),
    );
    assert!(!ok, "some requests failed: {err}");
    let v = json(&out);
    let t = &v["tenants"][0];
    assert!(t["completed"].as_u64().unwrap() > 2000, "the loop still runs after its first second: {out}");
    assert!(t["rejected"].as_u64().unwrap() > 0, "{out}");
}

/// A write job on a read-only export is refused at connect, naming the job, the server and why (every
/// write failed with EPERM).
#[test]
fn a_write_job_on_a_read_only_export_is_refused() {
    let Some((_s, addr)) = nbdkit(&["-r", "memory", "1M"]) else { return };
    let (ok, _, err) =
        load(addr, &["--job", "name=x,read=50", "--seconds", "1", "--warmup", "0"], Duration::from_secs(30));
    assert!(!ok);
    assert!(err.contains("job x") && err.contains("read-only") && err.contains(&addr.to_string()), "{err}");
    assert!(!err.contains("requests failed"), "refused before any load: {err}");
}

/// Request sizes the server's size constraints refuse (above its largest payload, not a multiple of its
/// minimum block) are refused at connect, naming the job, the size and the server's limit.
#[test]
fn sizes_outside_the_servers_block_sizes_are_refused() {
    let Some((_s, addr)) = nbdkit(&[
        "--filter=blocksize-policy",
        "memory",
        "1M",
        "blocksize-minimum=4096",
        "blocksize-maximum=65536",
        "blocksize-error-policy=error",
    ]) else {
        return;
    };
    for (size, want) in [
        ("1k", "not a multiple of the server's minimum block size (4096 bytes)"),
        ("128k", "above the largest request the server takes (65536 bytes)"),
    ] {
        let job = format!("name=y,size={size}");
        let (ok, _, err) = load(addr, &["--job", &job, "--seconds", "1", "--warmup", "0"], Duration::from_secs(30));
        assert!(!ok);
        assert!(err.contains("job y") && err.contains(want), "{size}: {err}");
    }
}

/// A trace replay on an export below one sector is refused at connect (it panicked).
#[test]
fn a_trace_replay_on_an_export_below_a_sector_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.trace");
    std::fs::write(&trace, "0 0 0 8 1\n1000000 0 8 8 1\n").unwrap();
    let Some((_s, addr)) = nbdkit(&["memory", "256"]) else { return };
    let job = format!("name=t,trace={},format=disksim", trace.display());
    let (ok, _, err) = load(addr, &["--job", &job, "--seconds", "1", "--warmup", "0"], Duration::from_secs(30));
    assert!(!ok);
    assert!(
        err.contains("job t") && err.contains("256 bytes: a trace replay needs at least one 512-byte sector"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// TLS refusals name the option and what to do: a server without TLS refusing NBD_OPT_STARTTLS, and one
/// requiring TLS refusing a plain client (both read `server refused option N: reply 0x8000000N ()`).
#[test]
fn tls_refusals_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let psk = dir.path().join("keys.psk");
    std::fs::write(&psk, "alice:000102030405060708090a0b0c0d0e0f\n").unwrap();
    let psk = psk.display().to_string();
    let Some((_s, addr)) = nbdkit(&["--tls=off", "memory", "1M"]) else { return };
    let args = ["--job", "name=x", "--seconds", "1", "--warmup", "0", "--tls-psk-file", &psk];
    let (ok, _, err) = load(addr, &args, Duration::from_secs(30));
    assert!(!ok);
    assert!(err.contains("the server does not offer STARTTLS") && err.contains("NBD_OPT_STARTTLS"), "{err}");
    drop(_s);

    let psk_arg = format!("--tls-psk={psk}");
    let Some((_s, addr)) = nbdkit(&["--tls=require", &psk_arg, "memory", "1M"]) else { return };
    let (ok, _, err) = load(addr, &["--job", "name=x", "--seconds", "1", "--warmup", "0"], Duration::from_secs(30));
    assert!(!ok);
    assert!(err.contains("the server requires TLS: give --tls-ca or --tls-psk-file"), "{err}");
}

/// A fake NBD server on [`IP`] (its port chosen by the OS) with one export, "x" (1 MiB): each connection
/// gets the real handshake (rein-proto's), then is handed to `serve` on a thread of its own with the
/// transmission state and the bytes read past the handshake. Stopped (and its connections' threads
/// joined, which end when the client closes) when dropped.
struct Fake {
    addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

type Serve = dyn Fn(TcpStream, rein_proto::nbd::ServerTransmission, Vec<u8>) + Send + Sync;

impl Fake {
    fn start(serve: impl Fn(TcpStream, rein_proto::nbd::ServerTransmission, Vec<u8>) + Send + Sync + 'static) -> Fake {
        use rein_proto::nbd::{ExportInfo, ServerHandshake, ServerProgress, ServerTransmission, TransmissionConfig};
        use std::io::{Read, Write};
        let listener = TcpListener::bind((IP, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let serve: std::sync::Arc<Serve> = std::sync::Arc::new(serve);
        let stopped = stop.clone();
        let accept = std::thread::spawn(move || {
            let mut conns = Vec::new();
            for s in listener.incoming() {
                if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(mut s) = s else { continue };
                let serve = serve.clone();
                conns.push(std::thread::spawn(move || {
                    let info = ExportInfo {
                        name: "x".into(),
                        description: String::new(),
                        size: 1 << 20,
                        read_only: false,
                        volatile: true,
                        min_block: 1,
                    };
                    let mut out = Vec::new();
                    let mut hs = ServerHandshake::new(vec![info.clone()], &mut out);
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        if s.write_all(&out).is_err() {
                            return;
                        }
                        out.clear();
                        let (used, progress) = match hs.feed(&buf, &mut out) {
                            Ok(x) => x,
                            Err(_) => return,
                        };
                        buf.drain(..used);
                        match progress {
                            ServerProgress::Done(negotiated) => {
                                if s.write_all(&out).is_err() {
                                    return;
                                }
                                let machine =
                                    ServerTransmission::new(TransmissionConfig::new(&info, &negotiated, 1 << 20));
                                return serve(s, machine, buf);
                            }
                            ServerProgress::NeedMore if used > 0 => continue,
                            ServerProgress::NeedMore => match s.read(&mut chunk) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            },
                            _ => return,
                        }
                    }
                }));
            }
            for c in conns {
                let _ = c.join();
            }
        });
        Fake { addr, stop, accept: Some(accept) }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
    }
}

/// How a fake server's connection answers ([`answer`]).
#[derive(Clone, Copy)]
struct Answer<'a> {
    /// From this request on (counted from 0), the answers are held until `release()` says true.
    hold_from: u64,
    release: &'a dyn Fn() -> bool,
    /// After this many answers, the connection is closed.
    close_after: u64,
}

impl Answer<'_> {
    /// Every request answered at once, the connection never closed.
    const ALL: Answer<'static> = Answer { hold_from: u64::MAX, release: &|| true, close_after: u64::MAX };
}

/// Answers the requests a fake server's connection reads, in order, each with success (and a READ's
/// data), as `how` says, until the client closes.
fn answer(mut s: TcpStream, mut machine: rein_proto::nbd::ServerTransmission, mut buf: Vec<u8>, how: Answer<'_>) {
    let Answer { hold_from, release, close_after } = how;
    use rein_proto::nbd::{simple_reply, Event, RequestKind};
    use std::io::{Read, Write};
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut held: Vec<u8> = Vec::new();
    let mut n = 0u64;
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let holding = n >= hold_from && !release();
        if !holding && !held.is_empty() && s.write_all(&std::mem::take(&mut held)).is_err() {
            return;
        }
        let (used, reply) = match machine.feed(&buf) {
            Ok((used, Event::Request { request, .. })) => {
                let mut reply = Vec::new();
                simple_reply(&mut reply, request.handle, 0);
                if request.kind == RequestKind::Read {
                    reply.resize(reply.len() + request.length as usize, 0);
                }
                (used, Some(reply))
            }
            Ok((used, Event::NeedMore { .. })) => (used, None),
            Ok((_, Event::Disconnect)) | Ok((_, Event::Reject(_))) | Err(_) => return,
        };
        buf.drain(..used);
        match reply {
            Some(reply) => {
                held.extend_from_slice(&reply);
                if (n < hold_from || release()) && s.write_all(&std::mem::take(&mut held)).is_err() {
                    return;
                }
                n += 1;
                if n == close_after {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                    return;
                }
            }
            None => match s.read(&mut chunk) {
                Ok(0) => return,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => return,
            },
        }
    }
}

/// A server that stops answering (requests outstanding, the connection open) is said during the run,
/// once, with the job, the requests outstanding and how long; and its answers' return is said too. It
/// was said only at the run's end, as requests unanswered, or (when the answers came before the end) not
/// at all: 8 s without an answer showed only as `0.0 IOPS`. The server holds its answers until the test
/// has read the stall's line from `rein load`'s stderr, so the line is checked to come during the run
/// (nothing is timed but the hang bound).
#[test]
fn a_server_that_stops_answering_is_said_during_the_run() {
    use std::io::BufRead;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let release = std::sync::Arc::new(AtomicBool::new(false));
    let released = release.clone();
    let server = Fake::start(move |s, machine, buf| {
        answer(s, machine, buf, Answer { hold_from: 20, release: &|| released.load(SeqCst), ..Answer::ALL })
    });
    let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["load", "--addr", &server.addr.to_string(), "--job", "name=x,depth=4,read=100"])
        .args(["--seconds", "14", "--warmup", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut child = Server(child); // killed if the test fails before it ends
    let started = Instant::now();
    let (mut stalled, mut resumed) = (None, None);
    let mut all = Vec::new();
    for line in stderr.lines() {
        let line = line.unwrap();
        assert!(started.elapsed() < Duration::from_secs(60), "rein load still runs: {all:?}");
        if line.contains("no answer for") {
            assert!(stalled.is_none(), "said once: {all:?}");
            stalled = Some(line.clone());
            release.store(true, SeqCst);
        }
        if line.contains("answers resumed") {
            resumed = Some(line.clone());
        }
        all.push(line);
    }
    let status = child.0.wait().unwrap();
    let stalled = stalled.unwrap_or_else(|| panic!("the stall was not said during the run: {all:#?}"));
    assert!(stalled.contains("job x: connection 1 to ") && stalled.contains("4 requests outstanding"), "{stalled}");
    let resumed = resumed.unwrap_or_else(|| panic!("the answers' return was not said: {all:#?}"));
    assert!(resumed.contains("job x: connection 1 to ") && resumed.contains("without one"), "{resumed}");
    assert!(status.success(), "every request was answered in the end: {all:#?}");
}

/// A run whose every connection breaks (the server answers a few requests, then closes each connection)
/// ends there, with an error naming each job's stop and why, whatever the job's kind; it waited out
/// --seconds (a server killed 2 s into a 20 s run held it 18 s more, the open loop counting 3,613
/// requests failed unsent).
#[test]
fn a_run_whose_connections_all_break_ends_early() {
    // Five answers on each connection, then it closes.
    let server = Fake::start(|s, machine, buf| answer(s, machine, buf, Answer { close_after: 5, ..Answer::ALL }));
    let args = ["--job", "name=x,depth=4,conns=2,read=100", "--job", "name=y,export=x,rate=200,read=100"];
    let (ok, out, err) = load(
        server.addr,
        &[&args[..], &["--seconds", "60", "--warmup", "0", "--json"]].concat(),
        Duration::from_secs(30),
    );
    assert!(!ok, "{err}");
    assert!(err.contains("error: the run ended early, at "), "{err}");
    for job in ["x", "y"] {
        assert!(err.contains(&format!("job {job}: stopped at ")), "{job}: {err}");
    }
    assert!(err.contains("all its 2 connections broke"), "{err}");
    assert!(err.contains("its connection broke (connection 1 to "), "{err}");
    let v = json(&out);
    assert_eq!(v["tenants"].as_array().map(Vec::len), Some(2), "the summary is still written: {out}");
    // It covers the time the run ran (its rates were averaged over the 60 s planned).
    let ran = v["duration_s"].as_f64().unwrap();
    assert!(ran < 30.0, "the summary's duration is the run's: {ran} s");
    let completed = v["tenants"][0]["completed"].as_f64().unwrap();
    let iops = v["tenants"][0]["iops"].as_f64().unwrap();
    assert!(completed > 0.0 && (iops - completed / ran).abs() < 1e-6 * iops, "{iops} IOPS, {completed} in {ran} s");
}

/// A server that answers every request with an error is said during the run: the first error at once
/// (which request, which error), then a count at most every 5 s, not a line per error; it was said only
/// at the end (96,828 requests failed in 5 s, the live table reading `0.0 IOPS`). The first line comes
/// before the live table's first second. With --max-errors the job stops at that many, and the run ends
/// early.
#[test]
fn a_server_failing_every_request_is_said_during_the_run() {
    let Some((_s, addr)) = nbdkit(&["--filter=error", "memory", "1M", "error=EIO", "error-rate=100%"]) else {
        return;
    };
    let (ok, _, err) =
        load(addr, &["--job", "name=x,depth=4,read=100", "--seconds", "7", "--warmup", "0"], Duration::from_secs(40));
    assert!(!ok, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let first = lines.iter().position(|l| l.contains("its further errors are counted here every 5 s"));
    let first = first.unwrap_or_else(|| panic!("the first error was not said: {err}"));
    assert!(
        lines[first].contains("job x: the server answered a read of 4096 bytes at offset ")
            && lines[first].contains("with error 5 (EIO)"),
        "{}",
        lines[first]
    );
    let live = lines.iter().position(|l| l.trim_start().starts_with("1.0s")).expect("the live table");
    assert!(first < live, "said at once, before the first second's line: {err}");
    let counts: Vec<&&str> = lines.iter().filter(|l| l.contains("more requests failed in")).collect();
    assert!((1..=2).contains(&counts.len()), "a count every 5 s of the 7: {err}");
    assert!(counts[0].contains("job x: ") && counts[0].contains(" in all); the last: the server answered"), "{err}");
    let said = lines.iter().filter(|l| l.contains("error 5 (EIO)")).count();
    assert!(said <= 4, "not a line per error: {said} lines: {err}");

    let (ok, _, err) = load(
        addr,
        &["--job", "name=x,depth=4,read=100", "--max-errors", "10", "--seconds", "60", "--warmup", "0"],
        Duration::from_secs(30),
    );
    assert!(!ok);
    assert!(
        err.contains("job x: stopped at ") && err.contains(": 10 of its requests failed (--max-errors 10)"),
        "{err}"
    );
    assert!(err.contains("error: the run ended early, at "), "{err}");
}

/// `--admin` naming a daemon other than rein serve (here a pShift controller's endpoint, a gateway's
/// alike) is refused before any load, saying what `--admin` is for; before, `admin endpoint ADDR:
/// /api/tenants: HTTP 404: ` and nothing more.
#[test]
fn an_admin_endpoint_without_tenants_is_named_as_not_rein_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let ctl = common::pshift_controller(tmp.path(), 179);
    let nowhere: SocketAddr = "127.0.0.179:9".parse().unwrap();
    let admin = ctl.admin.to_string();
    let (ok, _, err) =
        load(nowhere, &["--admin", &admin, "--job", "name=a", "--seconds", "3"], Duration::from_secs(30));
    assert!(!ok, "{err}");
    assert!(
        err.contains(&format!("--admin {admin}: no /api/tenants there: --admin names a rein serve's admin endpoint")),
        "{err}"
    );
}

/// A run whose timeseries would exceed the report's bound ((600 jobs + 1 server) x 86,400 intervals of
/// 1 s) is refused at once, naming the numbers, without connecting: it was refused only after every job's
/// connection had opened (here, to a listener that never answers: the 30 s connect deadline first).
#[test]
fn a_run_over_the_timeseries_bound_is_refused_before_connecting() {
    let listener = TcpListener::bind(("127.0.0.188", 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let specs: Vec<String> = (0..600).map(|i| format!("name=j{i}")).collect();
    let mut args: Vec<&str> = vec!["--seconds", "86400", "--warmup", "0"];
    for s in &specs {
        args.extend(["--job", s]);
    }
    let (ok, _, err) = load(addr, &args, Duration::from_secs(20));
    assert!(!ok, "{err}");
    let want = "duration 86400 s / interval 1 s = 86400 intervals, x (600 jobs + 1 servers), exceeds 50000000 \
                timeseries cells: run fewer jobs or a shorter run";
    assert_eq!(err.matches(want).count(), 1, "{err}");
    let accepted = listener.accept().map(|_| ());
    assert_eq!(accepted.unwrap_err().kind(), std::io::ErrorKind::WouldBlock, "no connection was made");
}

/// A TLS file (`--tls-ca`, `--tls-psk-file`) that is a FIFO no process writes to is refused at once,
/// naming the flag and the file: its blocking open waited for a writer for ever, before any connection
/// (as a daemon's `[tls]` file did at start). Nothing listens at the address: the run never gets there.
#[test]
fn a_tls_file_that_is_a_fifo_without_a_writer_is_refused_at_once() {
    let tmp = common::tmpdir("load-tls-fifo");
    let fifo = tmp.path().join("ca.pem");
    // Its owner's only: a secret file others may read is warned of, a line of its own.
    assert!(Command::new("mkfifo").args(["-m", "600"]).arg(&fifo).status().unwrap().success());
    let fifo = fifo.to_str().unwrap();
    let addr: SocketAddr = "127.0.0.141:9".parse().unwrap();
    for flag in ["--tls-ca", "--tls-psk-file"] {
        let (ok, _, err) = load(addr, &["--job", "name=a", "--seconds", "3", flag, fifo], Duration::from_secs(20));
        assert!(!ok, "{flag}");
        assert!(err.starts_with(&format!("error: {flag} {fifo}: ")), "{flag}: {err}");
        assert_eq!(err.lines().count(), 1, "{flag}: {err}");
    }
}

/// Ctrl-C (SIGINT) stops a run before its `--seconds` and keeps what ran: the summary on stdout and
/// `--out` over the time it ran, and an error naming the signal and when (it died at once, exit status
/// 130, with no summary and an empty `--out`).
#[test]
fn a_run_stopped_by_sigint_reports_what_ran() {
    let Some((_s, addr)) = nbdkit(&["memory", "16M"]) else {
        return;
    };
    let tmp = common::tmpdir("load-sigint");
    let out_dir = tmp.path().join("out");
    let child = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["load", "--addr", &addr.to_string(), "--job", "name=x,depth=4", "--seconds", "30", "--warmup", "0"])
        .args(["--json", "--out", out_dir.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Server(child);
    std::thread::sleep(Duration::from_millis(2500));
    let (status, stdout, stderr) = signalled(&mut child, &[("-INT", Duration::ZERO)], "SIGINT");
    assert_eq!(status.code(), Some(1), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: interrupted by SIGINT at ")
            && last.ends_with(" of 30.0 s: the summary covers the time it ran"),
        "{stderr}"
    );
    let v = json(&stdout);
    let ran = v["duration_s"].as_f64().unwrap();
    assert!(ran > 1.0 && ran < 10.0, "the summary covers the time it ran, not 30 s: {ran}");
    assert!(v["tenants"][0]["completed"].as_u64().unwrap() > 0, "{stdout}");
    let written = std::fs::read_to_string(out_dir.join("summary.json")).expect("--out written");
    assert_eq!(json(&written)["duration_s"].as_f64(), Some(ran), "{written}");
}

/// Sends `child` each signal of `signals` after its pause, then waits (15 s at most, `what` naming the
/// signals in the failure) for it to end: its exit status, stdout and stderr.
fn signalled(
    child: &mut Server,
    signals: &[(&str, Duration)],
    what: &str,
) -> (std::process::ExitStatus, String, String) {
    for (sig, pause) in signals {
        std::thread::sleep(*pause);
        assert!(Command::new("kill").args([*sig, &child.0.id().to_string()]).status().unwrap().success());
    }
    let sent = Instant::now();
    while child.0.try_wait().unwrap().is_none() {
        assert!(sent.elapsed() < Duration::from_secs(15), "rein load still runs after {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = child.0.wait().unwrap();
    let read = |pipe: Option<Box<dyn std::io::Read>>| {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut pipe.unwrap(), &mut text).unwrap();
        text
    };
    let stdout = read(child.0.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read>));
    let stderr = read(child.0.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read>));
    (status, stdout, stderr)
}

/// A second signal while the first one's drain waits for the requests in flight (held 20 s each by
/// nbdkit's delay filter; the drain gives them 5 s, then ends with exit status 1) ends `rein load` at once, with the status of a death by that signal (143 for
/// SIGTERM, 130 for SIGINT) and a line saying it stopped without a summary, and nothing on stdout.
#[test]
fn a_second_signal_during_the_drain_ends_the_run_at_once() {
    for (first, second, name, status) in
        [("-INT", "-TERM", "SIGTERM after SIGINT", 143), ("-TERM", "-INT", "SIGINT after SIGTERM", 130)]
    {
        let Some((_s, addr)) = nbdkit(&["--filter=delay", "memory", "16M", "rdelay=20", "wdelay=20"]) else {
            return;
        };
        let child = Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["load", "--addr", &addr.to_string(), "--job", "name=x,depth=4", "--seconds", "30"])
            .args(["--warmup", "0", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = Server(child);
        let pauses = [(first, Duration::from_millis(1500)), (second, Duration::from_millis(500))];
        let started = Instant::now();
        let (exit, stdout, stderr) = signalled(&mut child, &pauses, name);
        assert!(started.elapsed() < Duration::from_secs(10), "not at once: {:?}", started.elapsed());
        assert_eq!(exit.code(), Some(status), "{name}: {stderr}");
        let last = stderr.trim_end().lines().last().unwrap_or("");
        assert_eq!(last, format!("error: {name}: stopping at once, without a summary"), "{stderr}");
        assert_eq!(stdout, "", "{name}");
    }
}
