//! `rein gateway` over qemu's NBD server as plain NBD nodes (`protocol = "nbd"`): qemu-nbd (one export a
//! process) and qemu-storage-daemon (several), on 127.0.0.188, under a gateway on 127.0.0.190, each
//! skipped (saying so) where the program is not installed. What matters there is the gateway's check of
//! its node exports' flags (`read_only_check_s`; docs/gateway.md, "Read-only volumes"), a side connection
//! that asks NBD_OPT_INFO after NBD_OPT_INFO: qemu's server (nbd/server.c) counts no options in a
//! handshake, answers an unknown export NBD_REP_ERR_UNKNOWN and goes on, and ends a handshake after 10 s
//! (qemu-nbd's `--handshake-limit`); qemu-nbd serves one client at a time unless `-e` (`--shared`) says
//! more, so its nodes here run with `-e 4` (the gateway's session and the check's side connection are
//! two) and `-t` (it stays up when its last client leaves).
#![cfg(unix)]

mod common;

use common::{free_tcp, gateway_in, installed, local, tmpdir, KillOnDrop, Raw, Server};
use rein_proto::nbd::{ClientHandshake, ClientProgress, Probed, REP_ERR_UNKNOWN, TFLAG_READ_ONLY};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command as Cmd, Stdio};
use std::time::{Duration, Instant};

/// The gateway's node timeouts and a check of its node exports' flags every 0.2 s.
const TOP: &str =
    "request_timeout_s = 2\nconnect_timeout_s = 2\nreconnect_max_backoff_ms = 200\nread_only_check_s = 0.2\n";

/// Polls `f` every 50 ms until it returns true or 20 s pass; whether it did.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Starts `program` with `args`, its stderr to `log`, and waits until `addr` takes connections.
fn start(program: &str, args: &[String], log: &Path, addr: SocketAddr) -> KillOnDrop {
    let stderr = std::fs::File::create(log).unwrap();
    let child = Cmd::new(program).args(args).stdout(Stdio::null()).stderr(stderr).spawn().unwrap();
    let node = KillOnDrop(child);
    assert!(eventually(|| TcpStream::connect(addr).is_ok()), "{program} listens on {addr}");
    node
}

/// An empty image file `name` of 16 MiB in `dir`; its path as text.
fn image(dir: &Path, name: &str) -> String {
    let path = dir.join(name);
    std::fs::File::create(&path).unwrap().set_len(16 << 20).unwrap();
    path.to_str().unwrap().to_string()
}

/// Volume `export`'s link to `node` as the gateway's `/api/nodes` shows it.
fn link(gw: &Server, export: &str, node: &str) -> serde_json::Value {
    let (status, _, body) = common::http(gw.admin, "GET", "/api/nodes", "", "");
    assert_eq!(status, 200, "{body}");
    let volumes: serde_json::Value = serde_json::from_str(&body).unwrap();
    let volume = volumes.as_array().unwrap().iter().find(|v| v["export"] == export).expect(export);
    volume["nodes"].as_array().unwrap().iter().find(|n| n["node"] == node).expect(node).clone()
}

/// Volume `export`'s checks on `node`: (done, failed).
fn checks(gw: &Server, export: &str, node: &str) -> (u64, u64) {
    let n = link(gw, export, node);
    (n["read_only_checks"].as_u64().unwrap(), n["read_only_checks_failed"].as_u64().unwrap())
}

/// Whether a new connection to the gateway's volume `export` is told it is read-only.
fn advertised_read_only(gw: &Server, export: &str) -> bool {
    let open = common::nbd_open(gw.nbd, export, false, Duration::from_secs(20)).unwrap();
    open.flags & TFLAG_READ_ONLY != 0
}

/// A 4 KiB WRITE of `byte`s at offset 0 on `c` as handle `h`: the reply's error (0: written).
fn write_4k(c: &mut Raw, h: u64, byte: u8) -> u32 {
    c.send(rein_proto::nbd::Command::Write, h, 0, 4096, &[byte; 4096]);
    c.reply(0).1
}

/// What qemu wrote to stderr (`log`): nothing, or the lines of a handshake it ended in error.
fn quiet(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap()
}

/// Two qemu-nbd nodes, each with export `v`: q1 read-only (`-r`), q2 writable, its image behind qemu's
/// blkdebug driver answering the first write with EPERM. A probe of 40 exports on one connection to q1
/// gets 40 answers (`v` read-only, the others unknown). Volume `r` lies on q1, `w` on q2. The gateway's
/// checks of both succeed, period after period, none failed, and qemu-nbd logs nothing of them (each ends
/// with NBD_OPT_ABORT, which qemu answers and closes on quietly). `r` is advertised read-only and its
/// WRITE refused by the gateway. On `w`, q2's one EPERM makes the gateway take the export as read-only;
/// the next check reads its flags (writable, as qemu-nbd advertised all along), renews the session, and
/// `w` is advertised writable and written again, the bytes landing in q2's image.
#[test]
fn qemu_nbd_nodes_exports_are_checked_read_only_or_writable() {
    if !installed("qemu-nbd") {
        eprintln!("skipped: qemu-nbd is not installed");
        return;
    }
    let tmp = tmpdir("qemu-nbd-nodes");
    let dir = tmp.path();
    let node = |addr: SocketAddr| {
        ["-t", "-e", "4", "-x", "v", "-b", "127.0.0.188", "-p", &addr.port().to_string()].map(String::from).to_vec()
    };
    let (q1_log, q2_log) = (dir.join("q1.log"), dir.join("q2.log"));
    let q1_at = free_tcp("127.0.0.188");
    let mut q1_args = node(q1_at);
    q1_args.extend(["-r", "-f", "raw", &image(dir, "q1.img")].map(String::from));
    let _q1 = start("qemu-nbd", &q1_args, &q1_log, q1_at);
    // Its port chosen once q1 holds its own.
    let q2_at = free_tcp("127.0.0.188");
    let q2_image = image(dir, "q2.img");
    let mut q2_args = node(q2_at);
    q2_args.push("--image-opts".into());
    q2_args.push(format!(
        "driver=raw,file.driver=blkdebug,file.image.driver=file,file.image.filename={},\
         file.inject-error.0.event=pwritev,file.inject-error.0.errno=1,file.inject-error.0.once=on",
        q2_image.replace(',', ",,")
    ));
    let _q2 = start("qemu-nbd", &q2_args, &q2_log, q2_at);
    // One connection takes more NBD_OPT_INFOs than the gateway sends a plain node (30), unknown exports
    // among them: 40, `v` and 39 that q1 does not have.
    let names: Vec<String> = std::iter::once("v".to_string()).chain((1..40).map(|i| format!("none{i}"))).collect();
    let answers = probe(q1_at, &names);
    assert_eq!(answers.len(), 40, "{answers:?}");
    assert!(matches!(answers[0], Probed::Info { flags, .. } if flags & TFLAG_READ_ONLY != 0), "{answers:?}");
    let unknown = |a: &Probed| matches!(a, Probed::Refused { reply: REP_ERR_UNKNOWN, .. });
    assert!(answers[1..].iter().all(unknown), "{answers:?}");
    let text = format!(
        "{}\n{TOP}[[nodes]]\nname = \"q1\"\naddress = \"{q1_at}\"\nprotocol = \"nbd\"\n\
         [[nodes]]\nname = \"q2\"\naddress = \"{q2_at}\"\nprotocol = \"nbd\"\n\
         [[exports]]\nname = \"r\"\nsize_mb = 8\nwidths = {{ q1 = 1 }}\nnode_export = \"v\"\n\
         [[exports]]\nname = \"w\"\nsize_mb = 8\nwidths = {{ q2 = 1 }}\nnode_export = \"v\"\n",
        local(190)
    );
    let gw = gateway_in(&dir.join("gw"), &text);
    assert!(
        eventually(|| checks(&gw, "r", "q1").0 >= 3 && checks(&gw, "w", "q2").0 >= 3),
        "3 checks of each node: {:?} {:?}",
        checks(&gw, "r", "q1"),
        checks(&gw, "w", "q2")
    );
    assert_eq!(checks(&gw, "r", "q1").1, 0, "no check of q1 failed");
    assert_eq!(checks(&gw, "w", "q2").1, 0, "no check of q2 failed");
    assert!(advertised_read_only(&gw, "r"), "r is read-only, as q1's export");
    assert!(!advertised_read_only(&gw, "w"), "w is writable, as q2's export");
    let mut c = Raw::connect(gw.nbd, "r");
    assert_eq!(write_4k(&mut c, 1, 0xe0), 1, "r: the gateway's EPERM");
    // q2's one EPERM, then the check finds its export writable and renews the session.
    let mut c = Raw::connect(gw.nbd, "w");
    assert_eq!(write_4k(&mut c, 2, 0xe1), 1, "w: q2's EPERM (blkdebug)");
    gw.wait_line("the node refused a write with EPERM: its export is read-only now");
    gw.wait_line("the node's export is writable (a check of its flags)");
    gw.wait_line("node session renewed to learn whether its export still refuses writes");
    assert!(eventually(|| !advertised_read_only(&gw, "w")), "w is advertised writable again");
    let mut c = Raw::connect(gw.nbd, "w");
    assert_eq!(write_4k(&mut c, 3, 0xe2), 0, "w is written again");
    let bytes = std::fs::read(&q2_image).unwrap();
    assert!(bytes[..4096].iter().all(|&b| b == 0xe2), "the write is in q2's image");
    let failed = (checks(&gw, "r", "q1").1, checks(&gw, "w", "q2").1);
    assert_eq!(failed, (0, 0), "no check failed");
    drop(gw);
    assert_eq!(quiet(&q1_log), "", "qemu-nbd (q1) logged nothing of the checks");
    assert_eq!(quiet(&q2_log), "", "qemu-nbd (q2) logged nothing of the checks");
}

/// qemu-nbd as it starts by default, one client at a time (`-e 1`): while the gateway's session holds it,
/// the check's side connection waits in qemu-nbd's backlog, unanswered, and fails at
/// `connect_timeout_s` every period (counted in `read_only_checks_failed`), though the volume itself is
/// served. Hence `-e` above the gateway's connections to the node (docs/gateway.md).
#[test]
fn a_qemu_nbd_node_for_one_client_fails_the_checks() {
    if !installed("qemu-nbd") {
        eprintln!("skipped: qemu-nbd is not installed");
        return;
    }
    let tmp = tmpdir("qemu-nbd-one");
    let dir = tmp.path();
    let at = free_tcp("127.0.0.188");
    let port = at.port().to_string();
    let img = image(dir, "q.img");
    let args = ["-t", "-x", "v", "-b", "127.0.0.188", "-p", &port, "-f", "raw", &img].map(String::from);
    let log = dir.join("q.log");
    let _q = start("qemu-nbd", &args, &log, at);
    let top = TOP.replace("connect_timeout_s = 2", "connect_timeout_s = 0.5");
    let text = format!(
        "{}\n{top}[[nodes]]\nname = \"q\"\naddress = \"{at}\"\nprotocol = \"nbd\"\n\
         [[exports]]\nname = \"w\"\nsize_mb = 8\nnode_export = \"v\"\n",
        local(190)
    );
    let gw = gateway_in(&dir.join("gw"), &text);
    assert!(eventually(|| checks(&gw, "w", "q").1 >= 2), "2 checks failed: {:?}", checks(&gw, "w", "q"));
    // Done and failed are counted one after the other: equal once both are in.
    let all_failed = || {
        let (done, failed) = checks(&gw, "w", "q");
        done == failed
    };
    assert!(eventually(all_failed), "no check succeeded: {:?}", checks(&gw, "w", "q"));
    let mut c = Raw::connect(gw.nbd, "w");
    assert_eq!(write_4k(&mut c, 1, 0xe3), 0, "the volume is served");
}

/// Runs a probe of `exports` ([`ClientHandshake::probe`]) on one connection to `addr`: its answers.
fn probe(addr: SocketAddr, exports: &[String]) -> Vec<Probed> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hs = ClientHandshake::probe(exports);
    let mut buf = Vec::new();
    loop {
        let mut out = Vec::new();
        let (used, progress) = hs.feed(&buf, &mut out).unwrap_or_else(|e| panic!("{e}: {:?}", hs.probed()));
        buf.drain(..used);
        s.write_all(&out).unwrap();
        match progress {
            ClientProgress::NeedMore => {
                let mut chunk = [0u8; 4096];
                let n = s.read(&mut chunk).unwrap();
                assert!(n > 0, "the server closed the connection after {} answers", hs.probed().len());
                buf.extend_from_slice(&chunk[..n]);
            }
            ClientProgress::Info(answers) => return answers,
            other => panic!("{other:?}"),
        }
    }
}

/// qemu-storage-daemon with three exports (`a` writable, `b` read-only, `c` writable; null-co block
/// nodes, no files): a probe of 100 exports on one connection, these three and 97 it does not have,
/// gets 100 answers (qemu counts no options; an unknown export's NBD_OPT_INFO is answered
/// NBD_REP_ERR_UNKNOWN and the handshake goes on), so `PROBE_EXPORTS_ANY_SERVER` (30, for nbdkit's 32
/// options) is within what qemu takes. Under a gateway with a volume on each export, the node's one
/// check a period asks all three; none fails, and `b`'s volume is read-only, the others writable.
#[test]
fn a_qemu_storage_daemon_node_answers_every_info_of_a_long_probe() {
    if !installed("qemu-storage-daemon") {
        eprintln!("skipped: qemu-storage-daemon is not installed");
        return;
    }
    let tmp = tmpdir("qemu-sd-node");
    let dir = tmp.path();
    let at = free_tcp("127.0.0.188");
    let mut args =
        vec!["--nbd-server".to_string(), format!("addr.type=inet,addr.host=127.0.0.188,addr.port={}", at.port())];
    for (name, writable) in [("a", "on"), ("b", "off"), ("c", "on")] {
        let read_only = if writable == "on" { "off" } else { "on" };
        args.push("--blockdev".into());
        args.push(format!("driver=null-co,node-name=n{name},size=16777216,read-zeroes=on,read-only={read_only}"));
        args.push("--export".into());
        args.push(format!("type=nbd,id=e{name},node-name=n{name},name={name},writable={writable}"));
    }
    let log = dir.join("qsd.log");
    let _qsd = start("qemu-storage-daemon", &args, &log, at);
    let mut names: Vec<String> = (0..97).map(|i| format!("none{i}")).collect();
    for (at, name) in [(0, "a"), (50, "b"), (99, "c")] {
        names.insert(at, name.to_string());
    }
    let answers = probe(at, &names);
    assert_eq!(answers.len(), 100, "{answers:?}");
    const { assert!(100 > rein_proto::nbd::PROBE_EXPORTS_ANY_SERVER) };
    for (name, answer) in names.iter().zip(&answers) {
        match (name.as_str(), answer) {
            ("a" | "c", Probed::Info { flags, size }) => assert!(flags & TFLAG_READ_ONLY == 0 && *size == 16 << 20),
            ("b", Probed::Info { flags, .. }) => assert!(flags & TFLAG_READ_ONLY != 0, "b is read-only"),
            (_, Probed::Refused { reply, message }) if name.starts_with("none") => {
                assert_eq!(*reply, REP_ERR_UNKNOWN, "{name}: {message}");
                assert!(message.contains(&format!("export '{name}' not present")), "{message}");
            }
            _ => panic!("{name}: {answer:?}"),
        }
    }
    let mut text = format!("{}\n{TOP}[[nodes]]\nname = \"q\"\naddress = \"{at}\"\nprotocol = \"nbd\"\n", local(190));
    for name in ["a", "b", "c"] {
        text.push_str(&format!("[[exports]]\nname = \"{name}\"\nsize_mb = 8\n"));
    }
    let gw = gateway_in(&dir.join("gw"), &text);
    let all = || ["a", "b", "c"].map(|v| checks(&gw, v, "q"));
    assert!(eventually(|| all().iter().all(|&(done, _)| done >= 3)), "3 checks of each volume: {:?}", all());
    assert!(all().iter().all(|&(_, failed)| failed == 0), "none failed: {:?}", all());
    let read_only = ["a", "b", "c"].map(|v| advertised_read_only(&gw, v));
    assert_eq!(read_only, [false, true, false], "b alone is read-only");
    drop(gw);
    assert_eq!(quiet(&log), "", "qemu-storage-daemon logged nothing of the checks");
}
