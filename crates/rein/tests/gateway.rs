//! `rein gateway` over real storage nodes, driven by real clients: three `rein serve` nodes (or plain NBD
//! servers), each on its own 127.0.0.x address (port chosen by the OS), and one gateway, all child
//! processes in a temporary directory, killed at the end. Expected layouts come from the stripe equation
//! of docs/gateway.md, computed here independently of `rein_model::stripe`.
#![cfg(unix)]

mod common;

use common::{
    free_tcp, gateway_in, local, random_file, run_ok, serve_in, tmpdir, tool, write_file, KillOnDrop, Raw, Rein, Server,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command as Cmd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of each node's file export.
const NODE_MB: u64 = 32;
/// The stripe unit of the test volumes.
const UNIT: u64 = 64 << 10;

/// A `rein serve` node with one file export `v` of [`NODE_MB`] on 127.0.0.`host`, port `port` (0: any).
fn node(dir: &Path, host: u8, port: u16) -> Server {
    let head = format!("listen = \"127.0.0.{host}:{port}\"\nadmin = \"127.0.0.{host}:0\"");
    let body = format!("capacity_iops = 100000\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\n");
    serve_in(&dir.join(format!("node{host}")), &head, &body)
}

/// The file behind node `host`'s export.
fn node_file(dir: &Path, host: u8) -> PathBuf {
    dir.join(format!("node{host}")).join("data").join("v.img")
}

/// Makes node `host`'s image ([`node_file`], [`NODE_MB`]) before the node starts: a read-only export is
/// not created.
fn node_image(dir: &Path, host: u8) {
    let file = node_file(dir, host);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::File::create(file).unwrap().set_len(NODE_MB << 20).unwrap();
}

/// A gateway config on 127.0.0.`host`: the top-level keys of [`TIMES`], `nodes` (name, address), then
/// `body`.
fn gateway_config(dir: &Path, host: u8, nodes: &[(&str, SocketAddr)], body: &str) -> PathBuf {
    gateway_config_with(dir, host, "", nodes, body)
}

/// [`gateway_config`] with more top-level keys (`top`).
fn gateway_config_with(dir: &Path, host: u8, top: &str, nodes: &[(&str, SocketAddr)], body: &str) -> PathBuf {
    let mut text = format!("{}\n{TIMES}{top}", local(host));
    for (name, addr) in nodes {
        text.push_str(&format!("[[nodes]]\nname = \"{name}\"\naddress = \"{addr}\"\n"));
    }
    text.push_str(body);
    write_file(dir, "gw.toml", &text)
}

fn gateway(config: &Path) -> Server {
    Rein::gateway(config).start()
}

/// The node timeouts of the tests.
const TIMES: &str = "request_timeout_s = 2\nconnect_timeout_s = 2\nreconnect_max_backoff_ms = 200\n";

/// Widths 1, 2, 1 over s1, s2, s3 (W = 4), 64 KiB units, a 64 MiB volume.
const VOLUME: &str = "[[exports]]\nname = \"v\"\nsize_mb = 64\nstripe_kb = 64\nwidths = { s1 = 1, s2 = 2, s3 = 1 }\n";

/// Where volume byte `o` lives under widths 1, 2, 1 (docs/gateway.md): (node index, node offset).
fn expected_location(o: u64) -> (usize, u64) {
    let (widths, starts) = ([1u64, 2, 1], [0u64, 1, 3]);
    let u = o / UNIT;
    let (r, p) = (u / 4, u % 4);
    let j = if p < 1 {
        0
    } else if p < 3 {
        1
    } else {
        2
    };
    (j, (r * widths[j] + (p - starts[j])) * UNIT + o % UNIT)
}

/// Three nodes on 127.0.0.`first`, +1, +2 and a gateway on +3 striping [`VOLUME`] over them (s1, s2, s3).
fn three_nodes_and_gateway(dir: &Path, first: u8) -> (Vec<Server>, Server) {
    three_nodes_and_gateway_with(dir, first, "")
}

/// [`three_nodes_and_gateway`] with more top-level gateway keys (`top`).
fn three_nodes_and_gateway_with(dir: &Path, first: u8, top: &str) -> (Vec<Server>, Server) {
    let nodes: Vec<Server> = (first..first + 3).map(|h| node(dir, h, 0)).collect();
    let list = [("s1", nodes[0].nbd), ("s2", nodes[1].nbd), ("s3", nodes[2].nbd)];
    let gw = gateway(&gateway_config_with(dir, first + 3, top, &list, VOLUME));
    (nodes, gw)
}

fn uri(gw: &Server) -> String {
    format!("nbd://{}/v", gw.nbd)
}

/// qemu-io, killed after 60 s (a hang fails the test instead of holding it).
fn qemu_io(uri: &str, commands: &[&str]) -> std::process::Output {
    tool("qemu-io");
    let mut c = Cmd::new("timeout");
    c.args(["60", "qemu-io", "-f", "raw"]);
    for cmd in commands {
        c.args(["-c", cmd]);
    }
    c.arg(uri).output().unwrap()
}

/// Runs qemu-io; true if every command succeeded (qemu-io exits 0 even after a failed command, so the
/// output is checked for "failed").
fn qemu_io_ok(uri: &str, commands: &[&str]) -> (bool, String) {
    let out = qemu_io(uri, commands);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success() && !text.contains("failed") && !text.contains("Pattern verification"), text)
}

#[test]
fn real_clients_round_trip_through_three_nodes() {
    let dir = tmpdir("gw-clients");
    // A pool of two connections per node (the default is one): the pieces of the clients' requests, and
    // a write and the read after it, go over either, and the bytes must still come back as written.
    let (_nodes, gw) = three_nodes_and_gateway_with(dir.path(), 31, "connections_per_node = 2\n");
    let uri = uri(&gw);
    // Without layout_file, a volume over several nodes is a warning at start (it was an INFO line).
    let line = gw.wait_line("layout_file is not set: the layouts of volumes over several nodes (export v among them)");
    assert!(line.contains("WARN") && line.contains("would lay their data out anew unchecked, scrambling it"), "{line}");
    // nbdinfo: the volume's size and flags.
    let info = run_ok(tool("nbdinfo").arg(&uri));
    assert!(info.contains("export-size: 67108864"), "{info}");
    assert!(info.contains("can_flush: true") && info.contains("can_fua: true"), "{info}");
    // qemu-img convert in and out: byte-identical.
    let src = dir.path().join("src.bin");
    random_file(&src, 8 << 20, 7);
    run_ok(tool("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw", src.to_str().unwrap(), &uri]));
    let back = dir.path().join("back.bin");
    run_ok(tool("qemu-img").args(["convert", "-f", "raw", "-O", "raw", &uri, back.to_str().unwrap()]));
    let written = std::fs::read(&src).unwrap();
    assert_eq!(written[..], std::fs::read(&back).unwrap()[..8 << 20], "qemu-img round trip");
    // The bytes are where the stripe equation puts them on the nodes' own files.
    let files: Vec<Vec<u8>> = (31..=33).map(|h| std::fs::read(node_file(dir.path(), h)).unwrap()).collect();
    for o in (0..written.len() as u64).step_by(4093) {
        let (j, at) = expected_location(o);
        assert_eq!(files[j][at as usize], written[o as usize], "volume byte {o} on node {j} at {at}");
    }
    // nbdcopy round trip at an offset that is not unit-aligned (through qemu-io: nbdcopy copies whole).
    let src2 = dir.path().join("src2.bin");
    random_file(&src2, 16 << 20, 9);
    run_ok(tool("nbdcopy").args([src2.to_str().unwrap(), &uri]));
    let back2 = dir.path().join("back2.bin");
    run_ok(tool("nbdcopy").args([&uri, back2.to_str().unwrap()]));
    assert_eq!(std::fs::read(&src2).unwrap()[..], std::fs::read(&back2).unwrap()[..16 << 20], "nbdcopy round trip");
    // qemu-io patterns across stripe boundaries (a write spanning 3 units and 3 nodes, a read of its edges).
    let (ok, out) = qemu_io_ok(
        &uri,
        &[
            "write -P 0x5a 60k 200k",
            "read -P 0x5a 60k 200k",
            "read -P 0x5a 63k 2k",
            "write -z 100k 10k",
            "read -P 0 100k 10k",
            "read -P 0x5a 110k 150k",
            "flush",
        ],
    );
    assert!(ok, "qemu-io patterns: {out}");
    // fio with verification.
    let fio = run_ok(tool("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        "--size=16m",
        "--iodepth=16",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--output-format=json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&fio[fio.find('{').unwrap()..]).unwrap();
    assert_eq!(v["jobs"][0]["error"], 0, "fio verify failed: {fio}");
    assert!(v["jobs"][0]["read"]["io_bytes"].as_u64().unwrap() >= 16 << 20, "verify read everything back");
    // /api/nodes: every node connected.
    let (status, _, body) = common::http(gw.admin, "GET", "/api/nodes", "", "");
    assert_eq!(status, 200);
    let nodes_json: serde_json::Value = serde_json::from_str(&body).unwrap();
    for n in nodes_json[0]["nodes"].as_array().unwrap() {
        assert_eq!(n["connected"], n["connections"], "{body}");
    }
    let (status, _, metrics) = common::http(gw.admin, "GET", "/metrics", "", "");
    assert_eq!(status, 200);
    assert!(metrics.contains("rein_gateway_node_connections_up{export=\"v\",node=\"s2\"} 2"), "{metrics}");
    // One worker thread by default, busy for part of the run.
    assert!(metrics.contains("rein_gateway_worker_threads 1\n"), "{metrics}");
    assert!(metrics.contains("rein_gateway_worker_busy_seconds_total{worker=\"0\"} "), "{metrics}");
    // The requests the clients made, counted per volume and node, none failed.
    let value = |series: &str| common::series_value(&metrics, series);
    let reads = value("rein_gateway_requests_total{export=\"v\",kind=\"read\"}");
    let writes = value("rein_gateway_requests_total{export=\"v\",kind=\"write\"}");
    assert!(reads > 100.0 && writes > 100.0, "{metrics}");
    assert!(
        value("rein_gateway_read_bytes_total{export=\"v\"}") >= (16u64 << 20) as f64,
        "fio verify read 16 MiB back"
    );
    assert_eq!(value("rein_gateway_request_errors_total{export=\"v\"}"), 0.0);
    let all = value("rein_gateway_request_latency_seconds_count{export=\"v\"}");
    let kinds: f64 = ["read", "write", "flush", "trim", "write_zeroes", "block_status"]
        .iter()
        .map(|k| value(&format!("rein_gateway_requests_total{{export=\"v\",kind=\"{k}\"}}")))
        .sum();
    assert_eq!(all, kinds, "every request has a latency");
    for node in ["s1", "s2", "s3"] {
        assert!(value(&format!("rein_gateway_node_pieces_total{{export=\"v\",node=\"{node}\"}}")) > 0.0);
        assert_eq!(value(&format!("rein_gateway_node_piece_errors_total{{export=\"v\",node=\"{node}\"}}")), 0.0);
    }
}

/// Polls `f` until it returns true or `within` passes.
fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn a_dead_or_stalled_node_fails_its_pieces_with_eio_and_a_returning_one_serves_again() {
    let dir = tmpdir("gw-fail");
    let (mut nodes, gw) = three_nodes_and_gateway(dir.path(), 41);
    let uri = uri(&gw);
    let (ok, out) = qemu_io_ok(&uri, &["write -P 0x11 0 256k", "flush"]);
    assert!(ok, "{out}");
    // s2 holds units 1 and 2 (64k..192k); s1 unit 0.
    let s2 = nodes[1].nbd;
    drop(nodes.remove(1)); // killed
    let t0 = Instant::now();
    let (ok, out) = qemu_io_ok(&uri, &["read -P 0x11 64k 4k"]);
    assert!(!ok && out.contains("Input/output error"), "a read on the dead node fails with EIO: {out}");
    assert!(t0.elapsed() < Duration::from_secs(10), "within request_timeout_s (2 s) and qemu-io's start-up");
    let (ok, out) = qemu_io_ok(&uri, &["read -P 0x11 0 4k"]);
    assert!(ok, "the other nodes still serve: {out}");
    let (_, _, metrics) = common::http(gw.admin, "GET", "/metrics", "", "");
    let errors = |node: &str| {
        metrics.lines().any(|l| {
            l.starts_with(&format!("rein_gateway_node_piece_errors_total{{export=\"v\",node=\"{node}\"}} "))
                && !l.ends_with(" 0")
        })
    };
    assert!(errors("s2") && !errors("s1"), "the dead node's failed pieces are counted: {metrics}");
    assert!(!metrics.contains("rein_gateway_node_sessions_lost_total{export=\"v\",node=\"s2\"} 0"), "{metrics}");
    // A stalled node (SIGSTOP): its pieces fail within request_timeout_s, no hang.
    let s1_pid = nodes[0].pid().to_string();
    assert!(Cmd::new("kill").args(["-STOP", &s1_pid]).status().unwrap().success());
    let t0 = Instant::now();
    let (ok, out) = qemu_io_ok(&uri, &["read 0 4k"]);
    let took = t0.elapsed();
    assert!(Cmd::new("kill").args(["-CONT", &s1_pid]).status().unwrap().success());
    assert!(!ok && out.contains("Input/output error"), "a stalled node's piece fails: {out}");
    assert!(took >= Duration::from_secs(2), "not before request_timeout_s: {took:?}");
    assert!(took < Duration::from_secs(10), "within request_timeout_s and a scan: {took:?}");
    // s2 returns on its address (same data file): the gateway reconnects and serves again.
    nodes.insert(1, node(dir.path(), 42, s2.port()));
    assert!(
        eventually(Duration::from_secs(20), || qemu_io_ok(&uri, &["read -P 0x11 0 256k"]).0),
        "the gateway serves again after the node returned: {:?}",
        gw.log.lock().unwrap()
    );
    gw.wait_line("node connection restored");
}

#[test]
fn a_flushed_write_survives_the_gateway_killed_9() {
    let dir = tmpdir("gw-kill9");
    let (nodes, gw) = three_nodes_and_gateway(dir.path(), 51);
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x77 0 512k", "flush"]);
    assert!(ok, "{out}");
    assert!(Cmd::new("kill").args(["-9", &gw.pid().to_string()]).status().unwrap().success());
    drop(gw);
    drop(nodes); // the nodes stop too: what the flush made durable is in their files
    let files: Vec<Vec<u8>> = (51..=53).map(|h| std::fs::read(node_file(dir.path(), h)).unwrap()).collect();
    for o in (0..512u64 << 10).step_by(1021) {
        let (j, at) = expected_location(o);
        assert_eq!(files[j][at as usize], 0x77, "volume byte {o} on node {j} at {at}");
    }
}

/// A node killed -9 (and back) between a write it acknowledged and the FLUSH that would have made it
/// durable: the gateway cannot know the write survived, so that FLUSH fails with EIO (once); a FLUSH with
/// nothing lost succeeds (remote.rs, "FLUSH after a lost session").
#[test]
fn a_flush_after_a_node_lost_unflushed_writes_fails_once() {
    let dir = tmpdir("gw-lost");
    let (mut nodes, gw) = three_nodes_and_gateway(dir.path(), 61);
    let uri = uri(&gw);
    // Writes flushed, then a node restarts: nothing was at risk, the next FLUSH succeeds.
    let (ok, out) = qemu_io_ok(&uri, &["write -P 0x21 0 256k", "flush"]);
    assert!(ok, "{out}");
    let s2 = nodes[1].nbd;
    drop(nodes.remove(1));
    nodes.insert(1, node(dir.path(), 62, s2.port()));
    assert!(eventually(Duration::from_secs(20), || qemu_io_ok(&uri, &["read -P 0x21 0 256k"]).0), "s2 is back");
    let (ok, out) = qemu_io_ok(&uri, &["flush"]);
    assert!(ok, "no write was at risk: {out}");
    // Now a write s2 acknowledges, s2 killed -9 and back before the FLUSH (qemu-io sleeps meanwhile;
    // writeback: its writes carry no FUA).
    tool("qemu-io");
    let client = Cmd::new("timeout")
        .args(["60", "qemu-io", "-f", "raw", "-t", "writeback", "-c", "write -P 0x22 0 256k", "-c", "sleep 8000"])
        .args(["-c", "flush", &uri])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read(node_file(dir.path(), 62))
            .is_ok_and(|f| f[..64 << 10].iter().all(|&b| b == 0x22))),
        "s2 has the write (in its page cache)"
    );
    assert!(Cmd::new("kill").args(["-9", &nodes[1].pid().to_string()]).status().unwrap().success());
    drop(nodes.remove(1));
    nodes.insert(1, node(dir.path(), 62, s2.port()));
    let out = client.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // qemu-io prints nothing for a failed flush; it exits 1 after any failed command, and the write and
    // the sleep succeeded.
    assert!(text.contains("wrote 262144/262144"), "{text}");
    assert_eq!(out.status.code(), Some(1), "the FLUSH fails: {text} {:?}", gw.log.lock().unwrap());
    gw.wait_line("the next FLUSH fails");
    // Reported once: the next FLUSH succeeds.
    let (ok, out) = qemu_io_ok(&uri, &["flush"]);
    assert!(ok, "{out}");
    let (_, _, metrics) = common::http(gw.admin, "GET", "/metrics", "", "");
    assert!(metrics.contains("rein_gateway_node_flush_lost_total{export=\"v\",node=\"s2\"} 1\n"), "{metrics}");
}

/// A session renewed for a tenant's new spec ends with its node alive and marks nothing; a node that then
/// restarts before a session opens again (here: stopped, so the renewal's connection times out, then
/// killed -9 and started again on its data) may have lost the writes it acknowledged unflushed, and the
/// next FLUSH fails (remote.rs, "FLUSH after a lost session": the new session meets another boot
/// identity). Before, that FLUSH succeeded; without the renewal it failed, as a lost session's does.
#[test]
fn a_node_that_restarts_across_a_renewal_fails_the_next_flush() {
    use rein_proto::nbd::Command;
    let tmp = tmpdir("gw-renew-restart");
    let dir = tmp.path();
    let node_at = |port: u16| {
        let head = format!("listen = \"127.0.0.236:{port}\"\nadmin = \"127.0.0.236:0\"");
        serve_in(&dir.join("node236"), &head, &storage_node_body("", "", ""))
    };
    let node = node_at(0);
    let addr = node.nbd;
    let text = |reservation: u32| {
        format!(
            "{}\n{TIMES}connections_per_node = 1\n[[nodes]]\nname = \"s1\"\naddress = \"{addr}\"\nprotocol = \"rein\"\n\
             [[tenants]]\nname = \"c2\"\nreservation = {reservation}\n[[exports]]\nname = \"v\"\ntenant = \"c2\"\nsize_mb = 16\n",
            local(237)
        )
    };
    let gw = gateway_in(dir, &text(100));
    node.wait_line("storage-node session granted");
    let mut c = Raw::connect(gw.nbd, "v");
    c.send(Command::Write, 1, 0, 65536, &[0x23; 65536]);
    assert_eq!(c.reply(0).1, 0, "the node acknowledges the write (no FLUSH yet)");
    node.signal("-STOP");
    write_file(dir, "gw.toml", &text(200));
    gw.signal("-HUP");
    gw.wait_line("did not finish the NBD handshake within connect_timeout_s");
    assert!(Cmd::new("kill").args(["-9", &node.pid().to_string()]).status().unwrap().success());
    drop(node);
    let _node = node_at(addr.port());
    gw.wait_line("node connection restored");
    c.send(Command::Flush, 2, 0, 0, &[]);
    assert_eq!(c.reply(0).1, 5, "the FLUSH fails with EIO: {:?}", gw.log.lock().unwrap());
    gw.wait_line("the node restarted (another boot identity) with writes not yet flushed");
    // Reported once.
    c.send(Command::Flush, 3, 0, 0, &[]);
    assert_eq!(c.reply(0).1, 0);
}

/// A node down when the gateway starts does not stop it: the gateway starts (the log names the node),
/// pieces for that node fail with EIO at once, the others are served, and the node is used once it comes
/// up. A FLUSH meanwhile succeeds: a node never reached acknowledged no write.
#[test]
fn a_node_down_at_start_does_not_stop_the_gateway() {
    let dir = tmpdir("gw-down");
    let (n1, n3) = (node(dir.path(), 81, 0), node(dir.path(), 83, 0));
    let s2 = free_tcp("127.0.0.82");
    let list = [("s1", n1.nbd), ("s2", s2), ("s3", n3.nbd)];
    let gw = gateway(&gateway_config(dir.path(), 84, &list, VOLUME));
    gw.wait_line("node unreachable at start");
    let uri = uri(&gw);
    let (ok, out) = qemu_io_ok(&uri, &["write -P 0x31 0 64k", "read -P 0x31 0 64k", "flush"]);
    assert!(ok, "s1 serves, and the FLUSH skips a node never reached: {out}");
    let t0 = Instant::now();
    let (ok, out) = qemu_io_ok(&uri, &["read 64k 4k"]);
    assert!(!ok && out.contains("Input/output error"), "s2's pieces fail: {out}");
    assert!(t0.elapsed() < Duration::from_secs(10), "at once, not after a timeout");
    let _n2 = node(dir.path(), 82, s2.port());
    assert!(
        eventually(Duration::from_secs(20), || qemu_io_ok(&uri, &["write -P 0x32 64k 128k", "read -P 0x32 64k 128k"])
            .0),
        "s2 is used once it is up: {:?}",
        gw.log.lock().unwrap()
    );
    gw.wait_line("node connection restored");
    // The start-up hint (rein-runtime's gateway, "A hint at start") follows this machine's halt polling:
    // logged right after the listening line when polling is off, never otherwise.
    let polling = std::fs::read_to_string(rein_runtime::gateway::HALT_POLL_NS).ok();
    if polling.as_deref().map(str::trim) == Some("0") {
        gw.wait_line("halts idle vCPUs at once");
    } else {
        let log = gw.log.lock().unwrap();
        assert!(!log.iter().any(|l| l.contains("halts idle vCPUs")), "no hint with polling {polling:?}: {log:#?}");
    }
    drop((n1, n3));
}

/// Plain NBD servers as nodes. nbdkit's nodes advertise no WRITE_ZEROES (the nozero filter): the
/// gateway, which offers it to VMs, sends such a node WRITEs of zeroes instead (it sent the command the
/// node did not advertise, which the spec forbids, and the VM's zeroing failed).
#[test]
fn the_gateway_fronts_plain_nbd_servers() {
    let Some(server) = ["nbdkit", "qemu-nbd"].into_iter().find(|t| common::installed(t)) else {
        eprintln!("skipped: neither nbdkit nor qemu-nbd is installed");
        return;
    };
    let dir = tmpdir("gw-plain");
    let mut children = Vec::new();
    let mut list = Vec::new();
    for (i, host) in [61u8, 62].into_iter().enumerate() {
        let ip = format!("127.0.0.{host}");
        let port = free_tcp(&ip).port();
        let child = if server == "nbdkit" {
            Cmd::new("nbdkit")
                .args(["-f", "--filter=nozero", "-i", &ip, "-p", &port.to_string(), "-e", "v", "memory", "64M"])
                .spawn()
                .unwrap()
        } else {
            let img = dir.path().join(format!("plain{i}.img"));
            std::fs::write(&img, vec![0u8; 64 << 20]).unwrap();
            Cmd::new("qemu-nbd")
                .args(["-f", "raw", "-b", &ip, "-p", &port.to_string(), "-x", "v", "-t", img.to_str().unwrap()])
                .spawn()
                .unwrap()
        };
        children.push(KillOnDrop(child));
        let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
        assert!(
            eventually(Duration::from_secs(20), || std::net::TcpStream::connect(addr).is_ok()),
            "{server} did not listen"
        );
        list.push((["p1", "p2"][i], addr));
    }
    let mut text = format!("{}\n", local(64));
    for (name, addr) in &list {
        text.push_str(&format!("[[nodes]]\nname = \"{name}\"\naddress = \"{addr}\"\nprotocol = \"nbd\"\n"));
    }
    text.push_str("[[exports]]\nname = \"v\"\nsize_mb = 64\nstripe_kb = 64\n");
    let gw = gateway_in(dir.path(), &text);
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x3c 100k 300k", "read -P 0x3c 100k 300k", "flush"]);
    assert!(ok, "through {server}: {out}");
    // And one zeroing larger than the window of zero WRITEs in flight (16 of 1 MiB), which waits its turn.
    let zero = [
        "write -z 150k 100k",
        "read -P 0x3c 100k 50k",
        "read -P 0 150k 100k",
        "read -P 0x3c 250k 150k",
        "write -P 0x5a 48M 1M",
        "write -z 8M 40M",
        "read -P 0 8M 40M",
        "read -P 0x5a 48M 1M",
    ];
    let (ok, out) = qemu_io_ok(&uri(&gw), &zero);
    assert!(ok, "zeroes through {server}: {out}");
}

/// Nodes' size constraints (NBD_INFO_BLOCK_SIZE) bind the gateway: a `rein serve` node that takes READs
/// and WRITEs of 64 KiB at most and an nbdkit node of 4 KiB blocks and 128 KiB at most (its
/// blocksize-policy filter, which fails what breaks them), under a volume of 1 MiB units. A 4 MiB write
/// and its read go as pieces each node takes (before, a 1 MiB piece failed with EINVAL at both), the
/// pieces counted. The volume advertises 4 KiB blocks (the larger node minimum): qemu aligns a read off
/// them itself; a raw client's is EINVAL at the gateway, not sent, and the node's connection stays up.
#[test]
fn pieces_keep_to_each_nodes_size_constraints() {
    tool("nbdkit");
    let dir = tmpdir("gw-blocks");
    let body = format!("capacity_iops = 100000\nmax_request_kb = 64\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\n");
    let small = serve_in(&dir.path().join("node223"), &local(223), &body);
    let addr = free_tcp("127.0.0.224");
    let policy = ["blocksize-minimum=4096", "blocksize-maximum=131072", "blocksize-error-policy=error"];
    let _nbdkit = KillOnDrop(
        Cmd::new("nbdkit")
            .args(["-f", "--filter=blocksize-policy", "-i", "127.0.0.224", "-p", &addr.port().to_string()])
            .args(["-e", "v", "memory", "64M"])
            .args(policy)
            .spawn()
            .unwrap(),
    );
    assert!(
        eventually(Duration::from_secs(20), || std::net::TcpStream::connect(addr).is_ok()),
        "nbdkit did not listen"
    );
    let mut text = format!("{}\n{TIMES}", local(225));
    for (name, addr, protocol) in [("s1", small.nbd, "auto"), ("s2", addr, "nbd")] {
        text.push_str(&format!("[[nodes]]\nname = \"{name}\"\naddress = \"{addr}\"\nprotocol = \"{protocol}\"\n"));
    }
    text.push_str("[[exports]]\nname = \"v\"\nsize_mb = 32\nstripe_kb = 1024\n");
    let gw = gateway_in(dir.path(), &text);
    let before = pieces_sent(gw.admin);
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x4b 0 4M", "read -P 0x4b 0 4M"]);
    assert!(ok, "{out}");
    // 2 MiB on each node, written then read: s1 in 64 KiB pieces (32 each way), s2 in 128 KiB (16).
    let sent = pieces_sent(gw.admin) - before;
    assert!(sent >= 2 * (32 + 16), "{sent} pieces");
    // The volume advertises the largest of its nodes' minimum blocks, so a client that asks aligns
    // itself: qemu reads 4 KiB at an offset off s2's blocks by reading around it.
    let info = run_ok(tool("nbdinfo").args(["--json", &uri(&gw)]));
    assert!(info.contains("\"block_size_minimum\": 4096"), "{info}");
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0x4b 1049088 4096"]);
    assert!(ok, "{out}");
    // A client that does not align (this raw one): a piece off s2's blocks is the gateway's EINVAL, not
    // sent (the spec binds a client that asked for the constraints; nbdkit here would refuse it too,
    // another node might close the connection).
    let read = |offset: u64| {
        let before = pieces_sent(gw.admin);
        let mut raw = Raw::connect(gw.nbd, "v");
        raw.send(rein_proto::nbd::Command::Read, 1, offset, 4096, &[]);
        let (_, error, _) = raw.reply(4096);
        (error, pieces_sent(gw.admin) - before)
    };
    assert_eq!(read(1052672), (0, 1));
    assert_eq!(read(1049088), (rein_proto::nbd::EINVAL, 0), "the unaligned piece is not sent");
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0x4b 1M 1M"]);
    assert!(ok, "s2 still serves: {out}");
    assert!(!gw.log.lock().unwrap().iter().any(|l| l.contains("connection lost")), "{:?}", gw.log.lock().unwrap());
}

#[test]
fn bad_configs_are_one_line_errors_naming_the_key() {
    let dir = tmpdir("gw-bad");
    let n = node(dir.path(), 71, 0);
    let good_node = format!("[[nodes]]\nname = \"s1\"\naddress = \"{}\"\n", n.nbd);
    let export = "[[exports]]\nname = \"v\"\nsize_mb = 8\n";
    let cases: Vec<(String, &str)> = vec![
        (format!("connections_per_node = 0\n{good_node}{export}"), "connections_per_node"),
        (format!("request_timeout_s = 0\n{good_node}{export}"), "request_timeout_s"),
        (format!("reconnect_max_backoff_ms = 1\n{good_node}{export}"), "reconnect_max_backoff_ms"),
        (format!("bogus = 1\n{good_node}{export}"), "bogus"),
        (format!("{good_node}protocol = \"smtp\"\n{export}"), "protocol"),
        (format!("[[nodes]]\nname = \"s1\"\naddress = \"nowhere\"\n{export}"), "address"),
        // A host name: syntax the operator may expect to work; the error says it is not resolved.
        (
            format!("[[nodes]]\nname = \"s1\"\naddress = \"node1.example:10809\"\n{export}"),
            "host names are not resolved",
        ),
        (format!("{good_node}{export}widths = {{ s9 = 1 }}\n"), "widths names unknown node \"s9\""),
        (format!("{good_node}{export}stripe_kb = 0\n"), "stripe_kb"),
        // The key once (it said "widths: widths must include ...").
        (format!("{good_node}{export}widths = {{ s1 = 0 }}\n"), "export v: widths must include at least one node"),
        (format!("{good_node}[[tenants]]\nname = \"v\"\nreservation_split = \"x\"\n{export}"), "reservation_split"),
        (
            format!("{good_node}[[tenants]]\nname = \"v\"\nserver_reservations = {{ s7 = 5 }}\n{export}"),
            "server_reservations",
        ),
        (good_node.clone(), "[[exports]]"),
        // A node without the storage-node protocol under protocol = "rein": refused at start, naming it.
        (format!("{good_node}protocol = \"rein\"\n{export}"), "node s1"),
        // Start-time errors name the node: an export too small for the layout (an unreachable node does not
        // stop the start: a_node_down_at_start_does_not_stop_the_gateway).
        (format!("{good_node}[[exports]]\nname = \"v\"\nsize_mb = 64\n"), "node s1: export \"v\" is 33554432 bytes"),
        // TLS to the nodes.
        (format!("[node_tls]\n{good_node}{export}"), "node_tls needs node_tls.ca"),
        (format!("[node_tls]\nca = \"c.pem\"\npsk_file = \"k.psk\"\n{good_node}{export}"), "not both"),
        (format!("[node_tls]\nca = \"missing.pem\"\n{good_node}{export}"), "node_tls.ca"),
        (format!("[node_tls]\npsk_file = \"two.psk\"\n{good_node}{export}"), "name one with node_tls.psk_identity"),
        (format!("[node_tls]\npsk_file = \"two.psk\"\npsk_identity = \"c\"\n{good_node}{export}"), "\"c\" is not in"),
        (format!("{good_node}tls = true\n{export}"), "tls = true needs a [node_tls] table"),
        (format!("{good_node}tls_name = \"n.example\"\n{export}"), "tls_name needs TLS"),
    ];
    write_file(dir.path(), "two.psk", "a:00ff\nb:ff00\n");
    for (i, (text, key)) in cases.iter().enumerate() {
        let cfg = write_file(dir.path(), &format!("bad{i}.toml"), &format!("listen = \"127.0.0.73:0\"\n{text}"));
        let err = Rein::gateway(&cfg).env("REIN_LOG", "off").fails();
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "case {i}: one line: {err}");
        assert!(lines[0].contains(key), "case {i}: the error names {key:?}: {err}");
    }
}

/// IOs the node behind `admin` completed for `tenant` (all phases), from its /metrics.
fn completed(admin: SocketAddr, tenant: &str) -> u64 {
    let (status, _, body) = common::http(admin, "GET", "/metrics", "", "");
    assert_eq!(status, 200);
    let prefix = format!("rein_tenant_completed_total{{tenant=\"{tenant}\",");
    body.lines().filter(|l| l.starts_with(&prefix)).map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap()).sum()
}

/// A `rein serve` storage node on 127.0.0.`host` (dmClock, `[node] specs = "gateway"`) with file exports
/// `v` and `w` of [`NODE_MB`] each.
fn storage_node(dir: &Path, host: u8) -> Server {
    storage_node_with(dir, host, "", "", "")
}

/// [`storage_node`] with the top-level keys `top`, the `[node]` keys `node_keys` and the tables `tables`
/// added.
fn storage_node_with(dir: &Path, host: u8, top: &str, node_keys: &str, tables: &str) -> Server {
    serve_in(&dir.join(format!("node{host}")), &local(host), &storage_node_body(top, node_keys, tables))
}

/// The configuration body of [`storage_node_with`].
fn storage_node_body(top: &str, node_keys: &str, tables: &str) -> String {
    format!(
        "capacity_iops = 100000\nscheduler = \"dmclock\"\n{top}{tables}[node]\nenabled = true\nspecs = \"gateway\"\n\
         {node_keys}[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\n[[exports]]\nname = \"w\"\nsize_mb = {NODE_MB}\n"
    )
}

/// A storage node's `[mclock]` table that holds limits strictly (no burst), for tests that count on a
/// tenant's pace.
const STRICT_LIMITS: &str = "[mclock]\nlimit_burst_ios = 0\n";

/// A gateway config on 127.0.0.`host` over the one storage node `node` (storage-node protocol, one
/// connection), with the top-level keys `top` (the timeouts), tenant c2 limited to `limit` IOPS, and
/// volume v of `size_mb` MiB for it.
fn limited_gateway_config(dir: &Path, host: u8, top: &str, node: &Server, limit: u32, size_mb: u32) -> PathBuf {
    let text = format!(
        "{}\n{top}connections_per_node = 1\n[[nodes]]\nname = \"s1\"\naddress = \"{}\"\nprotocol = \"rein\"\n\
         [[tenants]]\nname = \"c2\"\nlimit = {limit}\n[[exports]]\nname = \"v\"\ntenant = \"c2\"\nsize_mb = {size_mb}\n",
        local(host),
        node.nbd
    );
    write_file(dir, "gw.toml", &text)
}

#[test]
fn storage_node_sessions_schedule_the_gateways_tenant_at_each_node() {
    let dir = tmpdir("gw-rein");
    let nodes = [storage_node(dir.path(), 81), storage_node(dir.path(), 82), storage_node(dir.path(), 83)];
    let list = [("s1", nodes[0].nbd), ("s2", nodes[1].nbd), ("s3", nodes[2].nbd)];
    let mut body = String::new();
    for n in 1..=3 {
        body.push_str(&format!("[[nodes]]\nname = \"s{n}\"\naddress = \"{}\"\nprotocol = \"rein\"\n", list[n - 1].1));
    }
    let text = format!(
        "{}\n{TIMES}{body}[[tenants]]\nname = \"c2\"\nreservation = 100\nweight = 2\n[[exports]]\nname = \"v\"\n\
         tenant = \"c2\"\nsize_mb = 64\nstripe_kb = 64\nwidths = {{ s1 = 1, s2 = 2, s3 = 1 }}\n",
        local(84)
    );
    let gw = gateway_in(dir.path(), &text);
    for n in &nodes {
        n.wait_line("storage-node session granted");
    }
    let before: Vec<u64> = nodes.iter().map(|n| completed(n.admin, "c2")).collect();
    // One 256 KiB write and read of units 0..4: s1 holds unit 0, s2 units 1 and 2, s3 unit 3 (layout
    // equation), so s2 serves two pieces of each request for s3's one.
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x22 0 256k", "read -P 0x22 0 256k", "flush"]);
    assert!(ok, "{out}");
    let after: Vec<u64> = nodes.iter().map(|n| completed(n.admin, "c2")).collect();
    let served: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(served.iter().all(|&c| c > 0), "every node scheduled c2's pieces as c2: {served:?}");
    assert_eq!(served[1] - served[2], 2, "s2 served 2 pieces more than s3 (2 per request vs 1): {served:?}");
    // A storage node stops on SIGTERM like any rein serve (its [node] service held the dispatcher alive).
    drop(gw);
    for mut n in nodes {
        n.terminate(Duration::from_secs(20));
    }
}

/// The front is rein serve's connection code: STARTTLS with PSK (required), and an export's
/// `allow_identities`.
#[test]
fn the_front_requires_tls_and_checks_identities() {
    let dir = tmpdir("gw-tls");
    let nodes = [node(dir.path(), 91, 0), node(dir.path(), 92, 0)];
    let key =
        |seed: u8| (0..32u8).map(|i| format!("{:02x}", i.wrapping_mul(37).wrapping_add(seed))).collect::<String>();
    let keys = write_file(dir.path(), "keys.psk", &format!("alice:{}\nbob:{}\n", key(1), key(2)));
    let mut text = format!("{}\n{TIMES}[tls]\nmode = \"require\"\npsk_file = \"keys.psk\"\n", local(93));
    for (i, n) in nodes.iter().enumerate() {
        text.push_str(&format!("[[nodes]]\nname = \"s{i}\"\naddress = \"{}\"\n", n.nbd));
    }
    text.push_str("[[exports]]\nname = \"v\"\nsize_mb = 16\nallow_identities = [\"alice\"]\n");
    let gw = gateway_in(dir.path(), &text);
    let as_user = |user: &str| format!("nbds://{user}@{}/v?tls-psk-file={}", gw.nbd, keys.display());
    let info = run_ok(tool("nbdinfo").arg(as_user("alice")));
    assert!(info.contains("with TLS") && info.contains("export-size: 16777216"), "{info}");
    let plain = tool("nbdinfo").arg(format!("nbd://{}/v", gw.nbd)).output().unwrap();
    assert!(!plain.status.success(), "plain NBD is refused under mode = require");
    let bob = tool("nbdinfo").arg(as_user("bob")).output().unwrap();
    assert!(!bob.status.success(), "bob is not in allow_identities");
}

/// The spec node `admin` applies to `tenant` (GET /api/tenants/NAME): reservation and weight.
fn node_spec(admin: SocketAddr, tenant: &str) -> (f64, f64) {
    let (status, _, body) = common::http(admin, "GET", &format!("/api/tenants/{tenant}"), "", "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    (v["reservation"].as_f64().unwrap(), v["weight"].as_f64().unwrap())
}

/// SIGHUP reloads gw.toml: a tenant's new spec reaches its storage nodes in a new hello (the data and the
/// sessions carry on), a volume is added and then removed, a change that needs a restart is named, and a
/// bad file changes nothing.
#[test]
fn sighup_restates_specs_and_adds_and_removes_volumes() {
    let dir = tmpdir("gw-reload");
    let nodes = [storage_node(dir.path(), 91), storage_node(dir.path(), 92)];
    let mut head = format!("{}\n{TIMES}", local(93));
    for (n, node) in nodes.iter().enumerate() {
        head.push_str(&format!("[[nodes]]\nname = \"s{}\"\naddress = \"{}\"\nprotocol = \"rein\"\n", n + 1, node.nbd));
    }
    let tenant = |r: u32, w: u32| format!("[[tenants]]\nname = \"c2\"\nreservation = {r}\nweight = {w}\n");
    let v = "[[exports]]\nname = \"v\"\ntenant = \"c2\"\nsize_mb = 16\nstripe_kb = 64\n";
    let w = "[[exports]]\nname = \"w\"\ntenant = \"c2\"\nsize_mb = 8\nstripe_kb = 64\n";
    let cfg = write_file(dir.path(), "gw.toml", &format!("{head}{}{v}", tenant(100, 2)));
    let gw = gateway(&cfg);
    for n in &nodes {
        n.wait_line("storage-node session granted");
        assert_eq!(node_spec(n.admin, "c2"), (100.0, 2.0));
    }
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x5e 0 256k", "flush"]);
    assert!(ok, "{out}");
    // A new spec: v's sessions say hello again with it.
    write_file(dir.path(), "gw.toml", &format!("{head}{}{v}", tenant(300, 3)));
    gw.signal("-HUP");
    gw.wait_line("configuration reloaded");
    for n in &nodes {
        let t0 = Instant::now();
        while node_spec(n.admin, "c2") != (300.0, 3.0) {
            assert!(t0.elapsed() < Duration::from_secs(20), "the node still applies {:?}", node_spec(n.admin, "c2"));
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0x5e 0 256k", "write -P 0x5f 256k 64k", "flush"]);
    assert!(ok, "after the new hello: {out}");
    gw.wait_line("node session renewed with the tenant's new spec");
    // A second volume.
    write_file(dir.path(), "gw.toml", &format!("{head}{}{v}{w}", tenant(300, 3)));
    gw.signal("-HUP");
    gw.wait_line("export w added");
    let info = run_ok(tool("nbdinfo").arg(format!("nbd://{}/w", gw.nbd)));
    assert!(info.contains("export-size: 8388608"), "{info}");
    // A change that needs a restart is named and changes nothing; w removed.
    let moved = format!("{head}{}{v}", tenant(300, 3)).replace("stripe_kb = 64", "stripe_kb = 128");
    write_file(dir.path(), "gw.toml", &moved);
    gw.signal("-HUP");
    // Without layout_file the line says what that restart would do to v's data (it only said a restart
    // was needed, and the restart then scrambled it).
    gw.wait_line(
        "export v: size_mb, stripe_kb, widths, node_export or tenant changed: needs a restart; a restart with this \
         file would lay its data out anew, scrambling it",
    );
    gw.wait_line("export w removed");
    let out = Cmd::new("nbdinfo").arg(format!("nbd://{}/w", gw.nbd)).output().unwrap();
    assert!(!out.status.success(), "w is still served");
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0x5e 0 256k", "read -P 0x5f 256k 64k"]);
    assert!(ok, "v kept its layout: {out}");
    // A bad file changes nothing.
    write_file(dir.path(), "gw.toml", "this is not toml");
    gw.signal("-HUP");
    gw.wait_line("the running configuration is unchanged");
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0x5e 0 256k"]);
    assert!(ok, "{out}");
    // A volume on v's node exports with another layout, v removed in the same reload (its connections may
    // still be open): the two layouts would scramble each other's data (before, B read A's units out of
    // order and A's writes landed in B). Refused, naming both; v is still served. Once v is removed (and
    // its connections closed), x is added.
    let x = "[[exports]]\nname = \"x\"\ntenant = \"c2\"\nsize_mb = 8\nstripe_kb = 128\nnode_export = \"v\"\n";
    write_file(dir.path(), "gw.toml", &format!("{head}{}{w}{x}", tenant(300, 3)));
    gw.signal("-HUP");
    gw.wait_line("is held by export v (which this reload removes; its connections may be open) with another layout");
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0x5e 0 256k"]);
    assert!(ok, "v is still served: {out}");
    write_file(dir.path(), "gw.toml", &format!("{head}{}{w}", tenant(300, 3)));
    gw.signal("-HUP");
    gw.wait_line("export v removed");
    write_file(dir.path(), "gw.toml", &format!("{head}{}{w}{x}", tenant(300, 3)));
    gw.signal("-HUP");
    gw.wait_line("export x added");
}

/// With `protocol` left at "auto", a storage node that refuses the gateway's hello (here its `[node]
/// allow_networks` does not cover the gateway) stops the start as under `protocol = "rein"`: one line
/// naming the node and its reason. Before, the gateway went on in plain NBD there (pieces untagged, the
/// node's own spec, QoS across nodes off, nothing logged above debug). A plain NBD node (`rein serve`
/// without `[node]`, which does not know the option) is still spoken to in plain NBD beside a storage
/// node, `/api/nodes` says which protocol each link speaks, and a reload that changes the tenant's spec
/// says the spec reaches the storage node only.
#[test]
fn a_node_that_refuses_the_hello_fails_under_auto_and_a_plain_nbd_node_runs_plain() {
    let tmp = tmpdir("gw-auto");
    let dir = tmp.path();
    let refusing = storage_node_with(dir, 226, "", "allow_networks = [\"10.0.0.0/8\"]\n", "");
    let (plain, tagged) = (node(dir, 227, 0), storage_node(dir, 229));
    let config = |file: &str, nodes: &[SocketAddr], reservation: u32| {
        let mut text = format!("{}\n{TIMES}", local(228));
        for (i, addr) in nodes.iter().enumerate() {
            text.push_str(&format!("[[nodes]]\nname = \"s{}\"\naddress = \"{addr}\"\n", i + 1));
        }
        text.push_str(&format!(
            "[[tenants]]\nname = \"c2\"\nreservation = {reservation}\n[[exports]]\nname = \"v\"\ntenant = \"c2\"\n\
             size_mb = 16\nstripe_kb = 64\n"
        ));
        write_file(dir, file, &text)
    };
    let err = Rein::gateway(&config("refused.toml", &[refusing.nbd], 100)).env("REIN_LOG", "off").fails();
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("node s1")
            && lines[0].contains("the node refused the storage-node protocol (reply 0x80000002)")
            && lines[0].contains("may not use the storage-node protocol"),
        "{err}"
    );
    // The refusing node counts it (its log says one refusal a second).
    let refused = common::series_value(&common::metrics(refusing.admin), "rein_node_hellos_total{result=\"refused\"}");
    assert!(refused >= 1.0, "{refused}");
    // s1 plain, s2 a storage node, both under auto.
    let gw = gateway(&config("gw.toml", &[plain.nbd, tagged.nbd], 100));
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x2e 0 1M", "read -P 0x2e 0 1M", "flush"]);
    assert!(ok, "{out}");
    let (status, _, body) = common::http(gw.admin, "GET", "/api/nodes", "", "");
    assert_eq!(status, 200);
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let protocols: Vec<&str> =
        listed[0]["nodes"].as_array().unwrap().iter().map(|n| n["protocol"].as_str().unwrap()).collect();
    assert_eq!(protocols, ["nbd", "rein"], "{body}");
    config("gw.toml", &[plain.nbd, tagged.nbd], 200);
    gw.signal("-HUP");
    gw.wait_line("configuration reloaded");
    let renewed = |node: &str| gw.wait_log(&["node session renewed", node], Duration::from_secs(10));
    let line = renewed("s1");
    assert!(line.contains("in plain NBD") && line.contains("does not reach it"), "{line}");
    let line = renewed("s2");
    assert!(line.contains("with the tenant's new spec"), "{line}");
    let welcomed = common::series_value(&common::metrics(tagged.admin), "rein_node_hellos_total{result=\"welcomed\"}");
    assert!(welcomed >= 2.0, "the start's session and the renewed one: {welcomed}");
    assert!(!common::metrics(plain.admin).contains("rein_node_hellos_total"), "no [node], no series");
}

/// A storage node on 127.0.0.`host` like [`storage_node`], that requires TLS (its certificate
/// `<host>-cert.pem` for IP 127.0.0.`host`, client certificates checked against `ca-cert.pem`, and PSK
/// identities from `nodes.psk`) and lets only the identities `gw-a` and `gw-p` use the storage-node
/// protocol.
fn tls_storage_node(dir: &Path, host: u8) -> Server {
    let tls = format!(
        "[tls]\nmode = \"require\"\ncert = \"{d}/n{host}-cert.pem\"\nkey = \"{d}/n{host}-key.pem\"\n\
         ca = \"{d}/ca-cert.pem\"\npsk_file = \"{d}/nodes.psk\"\n",
        d = dir.display()
    );
    storage_node_with(dir, host, "", "allow_identities = [\"gw-a\", \"gw-p\"]\n", &tls)
}

/// Links to storage nodes that require TLS: the gateway runs STARTTLS with a client certificate or a
/// PSK, checks each node's certificate against `[node_tls] ca` and the node's address, and a node admits
/// only the identities its `[node] allow_identities` names. Every way of getting it wrong stops the
/// gateway at start with one line naming the node and the cause; nothing falls back to plain NBD.
#[test]
fn node_links_run_tls_and_nodes_admit_only_the_named_gateways() {
    use common::tls::{make_ca, make_cert, server, CLIENT};
    let tmp = tmpdir("gw-node-tls");
    let dir = tmp.path();
    make_ca(dir, "ca", "Rein test CA");
    make_ca(dir, "other", "Another CA");
    for h in [131, 132] {
        make_cert(dir, "ca", &format!("n{h}"), &format!("node{h}"), &server(&format!("IP:127.0.0.{h}")));
    }
    make_cert(dir, "ca", "gwa", "gw-a", CLIENT);
    make_cert(dir, "ca", "gwb", "gw-b", CLIENT);
    let key =
        |seed: u8| (0..32u8).map(|i| format!("{:02x}", i.wrapping_mul(29).wrapping_add(seed))).collect::<String>();
    write_file(dir, "nodes.psk", &format!("gw-p:{}\ngw-q:{}\n", key(3), key(4)));
    write_file(dir, "gw.psk", &format!("gw-p:{}\n", key(3)));
    write_file(dir, "wrong.psk", &format!("gw-p:{}\n", key(5)));
    write_file(dir, "q.psk", &format!("gw-q:{}\n", key(4)));
    let nodes = [tls_storage_node(dir, 131), tls_storage_node(dir, 132)];
    let config = |name: &str, node_tls: &str, extra: &str| {
        // Two connections per node (the default is one): every link of the pool must be TLS.
        let mut text = format!("{}\n{TIMES}connections_per_node = 2\n{node_tls}", local(133));
        for (i, n) in nodes.iter().enumerate() {
            text.push_str(&format!(
                "[[nodes]]\nname = \"s{}\"\naddress = \"{}\"\nprotocol = \"rein\"\n{extra}",
                i + 1,
                n.nbd
            ));
        }
        text.push_str(
            "[[tenants]]\nname = \"c2\"\nreservation = 100\n[[exports]]\nname = \"v\"\ntenant = \"c2\"\nsize_mb = 16\n",
        );
        write_file(dir, name, &text)
    };
    let x509 = |cert: &str| {
        format!("[node_tls]\nca = \"ca-cert.pem\"\ncert = \"{cert}-cert.pem\"\nkey = \"{cert}-key.pem\"\n")
    };
    let psk = |file: &str| format!("[node_tls]\npsk_file = \"{file}\"\n");
    // x509 with gw-a's certificate: data goes through both nodes.
    let gw = gateway(&config("a.toml", &x509("gwa"), ""));
    for n in &nodes {
        n.wait_line("storage-node session granted");
    }
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x6b 0 512k", "read -P 0x6b 0 512k", "flush"]);
    assert!(ok, "{out}");
    let (status, _, body) = common::http(gw.admin, "GET", "/api/nodes", "", "");
    assert_eq!(status, 200);
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let links = listed[0]["nodes"].as_array().unwrap();
    assert!(links.len() == 2 && links.iter().all(|n| n["tls"] == true && n["connected"] == 2), "{body}");
    // The client certificate's expiry, in /metrics.
    let series = "rein_tls_certificate_expiration_timestamp_seconds{use=\"node_tls\"}";
    let expiry = common::series_value(&common::metrics(gw.admin), series);
    assert_eq!(expiry as i64, common::tls::not_after(dir, "gwa-cert.pem"));
    drop(gw);
    // PSK (gw-p): reads what gw-a wrote.
    let gw = gateway(&config("p.toml", &psk("gw.psk"), ""));
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0x6b 0 512k"]);
    assert!(ok, "{out}");
    drop(gw);
    // Plain NBD (no storage-node option) runs over TLS too.
    let cfg = config("nbd.toml", &x509("gwa"), "");
    std::fs::write(&cfg, std::fs::read_to_string(&cfg).unwrap().replace("\"rein\"", "\"nbd\"")).unwrap();
    let gw = gateway(&cfg);
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0x6b 0 512k", "write -P 0x6c 64k 64k", "flush"]);
    assert!(ok, "{out}");
    drop(gw);
    // What must stop the start, and the words that say why.
    let cases = [
        ("plain.toml", String::new(), "", "the node requires TLS: give the gateway a [node_tls] table"),
        ("b.toml", x509("gwb"), "", "(identity \"gw-b\") may not use the storage-node protocol"),
        ("q.toml", psk("q.psk"), "", "(identity \"gw-q\") may not use the storage-node protocol"),
        ("wrongkey.toml", psk("wrong.psk"), "", "refused PSK identity \"gw-p\": it does not know it, or holds another"),
        ("name.toml", x509("gwa"), "tls_name = \"s1.example\"\n", "hostname mismatch"),
        ("ca.toml", x509("gwa").replace("ca-cert.pem", "other-cert.pem"), "", "certificate verify failed"),
    ];
    for (file, node_tls, extra, want) in cases {
        let cfg = config(file, &node_tls, extra);
        let err = Rein::gateway(&cfg).env("REIN_LOG", "off").fails();
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{file}: one line: {err}");
        // Both nodes refuse alike; the open fails with the first refusal to come, either node's.
        let named = lines[0].contains("node s1 (") || lines[0].contains("node s2 (");
        assert!(named && lines[0].contains(want), "{file}: wants {want:?}: {err}");
    }
    // A node that does not offer TLS: refused, not used in plain.
    let plain = node(dir, 134, 0);
    let text = format!(
        "listen = \"127.0.0.133:0\"\n{TIMES}{}[[nodes]]\nname = \"s1\"\naddress = \"{}\"\n[[exports]]\nname = \"v\"\nsize_mb = 16\n",
        x509("gwa"),
        plain.nbd
    );
    let cfg = write_file(dir, "tlsless.toml", &text);
    let err = Rein::gateway(&cfg).env("REIN_LOG", "off").fails();
    assert!(err.contains("node s1") && err.contains("the node does not offer TLS, which [node_tls] requires"), "{err}");
    // A gateway started without TLS nodes, to which a reload adds the first: its certificate's expiry
    // shows in /metrics from then on.
    let head = format!(
        "{}
{TIMES}",
        local(133)
    );
    let p = format!("[[nodes]]\nname = \"p\"\naddress = \"{}\"\ntls = false\n", plain.nbd);
    let v = "[[exports]]\nname = \"v\"\nsize_mb = 16\nwidths = { p = 1 }\n";
    let cfg = write_file(dir, "grow.toml", &format!("{head}{p}{v}"));
    let gw = gateway(&cfg);
    assert!(!common::metrics(gw.admin).contains(series), "no TLS node yet");
    let s1 = format!("[[nodes]]\nname = \"s1\"\naddress = \"{}\"\nprotocol = \"rein\"\n", nodes[0].nbd);
    let w = "[[tenants]]\nname = \"c2\"\n[[exports]]\nname = \"w\"\ntenant = \"c2\"\nsize_mb = 8\nwidths = { s1 = 1 }\nnode_export = \"w\"\n";
    write_file(dir, "grow.toml", &format!("{head}{}{p}{s1}{v}{w}", x509("gwa")));
    gw.signal("-HUP");
    gw.wait_line("reload: export w added");
    let expiry = common::series_value(&common::metrics(gw.admin), series);
    assert_eq!(expiry as i64, common::tls::not_after(dir, "gwa-cert.pem"));
    // A reload that leaves no TLS node (s1 and its volume removed): the certificate is presented to no node
    // any more, and its expiry leaves /metrics (it stayed, and would have raised the expiry alert).
    write_file(dir, "grow.toml", &format!("{head}{}{p}{v}", x509("gwa")));
    gw.signal("-HUP");
    gw.wait_line("reload: node s1 removed");
    assert!(!common::metrics(gw.admin).contains(series), "no TLS node any more");
}

/// `[node_tls] crl` revokes node certificates, as a node's `[tls] crl` revokes client ones: a gateway
/// whose CRL lists a node's certificate does not start (one line naming the node and the cause), and a
/// reload that brings a CRL listing it cuts the links open to that node, whose reconnects are then
/// refused, while the other node's stay up. A CRL no CA of `ca` signed, or one beside a PSK, stops the
/// start with the key named.
#[test]
fn node_tls_crl_revokes_a_node_and_a_reload_cuts_its_links() {
    use common::tls::{make_ca, make_cert, make_crl, revoke, server, CLIENT};
    let tmp = tmpdir("gw-node-crl");
    let dir = tmp.path();
    make_ca(dir, "ca", "Rein test CA");
    make_ca(dir, "other", "Another CA");
    for h in [138, 139] {
        make_cert(dir, "ca", &format!("n{h}"), &format!("node{h}"), &server(&format!("IP:127.0.0.{h}")));
    }
    make_cert(dir, "ca", "gwa", "gw-a", CLIENT);
    write_file(dir, "nodes.psk", &format!("gw-p:{}\n", "ab".repeat(32)));
    make_crl(dir, "ca", "crl.pem");
    make_crl(dir, "other", "other-crl.pem");
    let nodes = [tls_storage_node(dir, 138), tls_storage_node(dir, 139)];
    let config = |name: &str, node_tls: &str| {
        let mut text = format!("{}\n{TIMES}{node_tls}", local(140));
        for (i, n) in nodes.iter().enumerate() {
            text.push_str(&format!("[[nodes]]\nname = \"s{}\"\naddress = \"{}\"\nprotocol = \"rein\"\n", i + 1, n.nbd));
        }
        text.push_str(
            "[[tenants]]\nname = \"c2\"\nreservation = 100\n[[exports]]\nname = \"v\"\ntenant = \"c2\"\nsize_mb = 16\n",
        );
        write_file(dir, name, &text)
    };
    let x509 = |crl: &str| {
        format!("[node_tls]\nca = \"ca-cert.pem\"\ncert = \"gwa-cert.pem\"\nkey = \"gwa-key.pem\"\ncrl = \"{crl}\"\n")
    };
    let gw = gateway(&config("gw.toml", &x509("crl.pem")));
    for n in &nodes {
        n.wait_line("storage-node session granted");
    }
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x5a 0 512k", "flush"]);
    assert!(ok, "an empty CRL revokes no node: {out}");
    // s2's certificate revoked, the CRL written over the file and the gateway reloaded.
    revoke(dir, "ca", "n139");
    make_crl(dir, "ca", "crl.pem");
    gw.signal("-HUP");
    let line = gw.wait_line("reload: [node_tls]: 1 node link closed");
    assert!(line.contains("the new crl revokes its node's certificate"), "{line}");
    gw.wait_line("closing a TLS link: its server's certificate (CN=node139) is revoked (node_tls.crl)");
    gw.wait_line("the server's certificate is revoked: node_tls.crl lists it");
    let links = || {
        let (status, _, body) = common::http(gw.admin, "GET", "/api/nodes", "", "");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v[0]["nodes"].as_array().unwrap().iter().map(|n| n["connected"].as_u64().unwrap()).collect::<Vec<_>>()
    };
    let t0 = Instant::now();
    while links() != [1, 0] {
        assert!(t0.elapsed() < Duration::from_secs(10), "links per node: {:?}", links());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(links(), [1, 0], "s2 stays refused through its reconnects (backoff 200 ms)");
    drop(gw);
    // At start: refused, one line naming the node.
    let err = Rein::gateway(&config("again.toml", &x509("crl.pem"))).env("REIN_LOG", "off").fails();
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].contains("node s2") && lines[0].contains("node_tls.crl lists it"), "{err}");
    // Bad tables: a CRL of another CA, a CRL beside a PSK.
    let err = Rein::gateway(&config("other.toml", &x509("other-crl.pem"))).env("REIN_LOG", "off").fails();
    assert!(err.contains("node_tls.crl") && err.contains("not signed by a CA of node_tls.ca"), "{err}");
    let psk = "[node_tls]\npsk_file = \"nodes.psk\"\ncrl = \"crl.pem\"\n";
    let err = Rein::gateway(&config("psk.toml", psk)).env("REIN_LOG", "off").fails();
    assert!(err.contains("node_tls.crl needs node_tls.ca"), "{err}");
}

/// A node moved to another host (its data copied there) is followed by a reload, without a restart:
/// the gateway's session to s1 ends at the old address once its pieces are answered and reconnects to
/// the new one, s2's is untouched, reads running through the move all succeed, the data written before
/// reads back from the new host, and new writes land there, not on the old one.
#[test]
fn a_reload_moves_a_node_to_another_address() {
    let tmp = tmpdir("gw-move");
    let dir = tmp.path();
    let (old, s2) = (node(dir, 144, 0), node(dir, 147, 0));
    let volume = "[[exports]]\nname = \"v\"\nsize_mb = 16\nstripe_kb = 64\n";
    let gw = gateway(&gateway_config(dir, 146, &[("s1", old.nbd), ("s2", s2.nbd)], volume));
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x3c 0 1M", "flush"]);
    assert!(ok, "{out}");
    // The replacement host: s1's file copied (flushed above), served at another address.
    std::fs::create_dir_all(node_file(dir, 145).parent().unwrap()).unwrap();
    std::fs::copy(node_file(dir, 144), node_file(dir, 145)).unwrap();
    let new = node(dir, 145, 0);
    // Reads through the move, none of which may fail.
    let reads = Reads::start(uri(&gw), "read -P 0x3c 0 1M");
    gateway_config(dir, 146, &[("s1", new.nbd), ("s2", s2.nbd)], volume);
    gw.signal("-HUP");
    gw.wait_line(&format!(
        "reload: node s1 moved from {} to {}: its sessions end once their pieces are answered and reconnect there",
        old.nbd, new.nbd
    ));
    gw.wait_line(&format!("node session renewed at its new place {}", new.nbd));
    let nodes = || {
        let (status, _, body) = common::http(gw.admin, "GET", "/api/nodes", "", "");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v[0]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| (n["address"].to_string(), n["connected"].as_u64().unwrap()))
            .collect::<Vec<_>>()
    };
    let want = vec![(format!("\"{}\"", new.nbd), 1), (format!("\"{}\"", s2.nbd), 1)];
    let t0 = Instant::now();
    while nodes() != want {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", nodes());
        std::thread::sleep(Duration::from_millis(50));
    }
    reads.stop();
    let log = gw.log.lock().unwrap().clone();
    assert!(!log.iter().any(|l| l.contains("needs a restart") || l.contains("node connection lost")), "{log:#?}");
    drop(old);
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0x3c 0 1M", "write -P 0x3d 0 64k", "flush"]);
    assert!(ok, "through the moved node: {out}");
    let first = |host: u8| std::fs::read(node_file(dir, host)).unwrap()[..65536].to_vec();
    assert!(first(145).iter().all(|&b| b == 0x3d), "the new write is on the new host");
    assert!(first(144).iter().all(|&b| b == 0x3c), "and not on the old one");
}

/// The first volume's link to node `s1` as `/api/nodes` shows it.
fn s1_report(gw: &Server) -> serde_json::Value {
    let (status, _, body) = common::http(gw.admin, "GET", "/api/nodes", "", "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v[0]["nodes"][0]["node"], "s1", "{body}");
    v[0]["nodes"][0].clone()
}

/// [`s1_report`]'s (tls, connected, protocol).
fn s1_link(gw: &Server) -> (bool, u64, String) {
    let n = s1_report(gw);
    (n["tls"].as_bool().unwrap(), n["connected"].as_u64().unwrap(), n["protocol"].to_string())
}

/// [`s1_report`]'s read-only checks: (run, failed).
fn s1_checks(gw: &Server) -> (u64, u64) {
    let n = s1_report(gw);
    (n["read_only_checks"].as_u64().unwrap(), n["read_only_checks_failed"].as_u64().unwrap())
}

/// A 4 KiB WRITE of `byte` at `offset` on `c` (handle `h`); the reply's error.
fn write_at(c: &mut Raw, h: u64, offset: u64, byte: u8) -> u32 {
    c.send(rein_proto::nbd::Command::Write, h, offset, 4096, &[byte; 4096]);
    c.reply(0).1
}

/// A FLUSH on `c` (handle `h`); the reply's error.
fn flush_on(c: &mut Raw, h: u64) -> u32 {
    c.send(rein_proto::nbd::Command::Flush, h, 0, 0, &[]);
    c.reply(0).1
}

/// A READ of `len` bytes at `offset` on `c` (handle `h`): the reply's error and data.
fn read_at(c: &mut Raw, h: u64, offset: u64, len: u32) -> (u32, Vec<u8>) {
    c.send(rein_proto::nbd::Command::Read, h, offset, len, &[]);
    let (handle, error, data) = c.reply(len as usize);
    assert_eq!(handle, h);
    (error, data)
}

/// TLS rolled out to a storage node without a restart of the gateway (crates/rein-runtime/src/gateway.rs,
/// "Reload"; `NodeMoves`): a plain `rein serve` node is reloaded to require TLS (its session with the
/// gateway, opened before, goes on), then the gateway is reloaded with a `[node_tls]` table: its session
/// to s1 ends once its pieces are answered and reconnects at once over TLS. An NBD connection to the
/// gateway opened before both reloads writes and reads on through them on the same socket, its data
/// intact, and new connections work; the checks of the node export's flags (a side connection each,
/// `read_only_check_s`) follow the link to TLS. Before, the gateway's reload named the change as needing a restart
/// (which drops every client) and its links stayed plain. A reload that turns TLS on without a
/// `[node_tls]` table, or with an empty one, is refused as a whole, naming the node (or the table), and
/// so is one with good credentials while the node does not offer TLS yet (the reload tries the node at
/// its new settings first; before that try, the reload was applied and the link's reconnects failed):
/// the links run on as they did.
#[test]
fn a_reload_turns_tls_on_for_a_node_link_and_open_connections_carry_on() {
    let tmp = tmpdir("gw-tls-on");
    let dir = tmp.path();
    let key = (0..32u8).map(|i| format!("{:02x}", i.wrapping_mul(43).wrapping_add(7))).collect::<String>();
    write_file(dir, "nodes.psk", &format!("gw-p:{key}\n"));
    write_file(dir, "gw.psk", &format!("gw-p:{key}\n"));
    let s1 = node(dir, 181, 0);
    let volume = "[[exports]]\nname = \"v\"\nsize_mb = 16\n";
    let top = format!("{}\n{TIMES}read_only_check_s = 0.2\n", local(184));
    let gw = gateway(&gateway_config_with(dir, 184, "read_only_check_s = 0.2\n", &[("s1", s1.nbd)], volume));
    let mut c = Raw::connect(gw.nbd, "v");
    assert_eq!(write_at(&mut c, 1, 0, 0xa1), 0);
    assert_eq!(flush_on(&mut c, 2), 0);
    assert_eq!(s1_link(&gw), (false, 1, "\"nbd\"".to_string()));
    // Bad reloads: TLS on without [node_tls], or with a table that gives no credentials. Refused whole.
    let s1_tls = format!("[[nodes]]\nname = \"s1\"\naddress = \"{}\"\ntls = true\n", s1.nbd);
    write_file(dir, "gw.toml", &format!("{top}{s1_tls}{volume}"));
    gw.signal("-HUP");
    let line = gw.wait_line("the running configuration is unchanged");
    assert!(line.contains("node s1: tls = true needs a [node_tls] table"), "{line}");
    write_file(dir, "gw.toml", &format!("{top}[node_tls]\n{s1_tls}{volume}"));
    gw.signal("-HUP");
    // Its own line (the one before also names [node_tls]): a reload still to come when the next file is
    // written would read that one, and apply it once the node below offers TLS.
    gw.wait_log(&["the running configuration is unchanged", "node_tls needs"], Duration::from_secs(30));
    assert_eq!(s1_link(&gw), (false, 1, "\"nbd\"".to_string()), "the link as it ran");
    // Good credentials, but the node does not offer TLS yet: the reload tries the node and is refused.
    let gw_tls =
        format!("{top}[node_tls]\npsk_file = \"gw.psk\"\n[[nodes]]\nname = \"s1\"\naddress = \"{}\"\n{volume}", s1.nbd);
    write_file(dir, "gw.toml", &gw_tls);
    gw.signal("-HUP");
    let line = gw.wait_log(
        &["the running configuration is unchanged", "refuses the link as this reload sets it"],
        Duration::from_secs(30),
    );
    assert!(
        line.contains(&format!(
            "node s1: the node at {} refuses the link as this reload sets it (protocol auto, TLS on): the node does \
             not offer TLS, which [node_tls] requires",
            s1.nbd
        )),
        "{line}"
    );
    assert_eq!(s1_link(&gw), (false, 1, "\"nbd\"".to_string()), "the link as it ran");
    assert_eq!(write_at(&mut c, 3, 4096, 0xa2), 0, "the connection opened before writes on");
    assert_eq!(flush_on(&mut c, 4), 0);
    // The node requires TLS from now on (its sessions up keep theirs).
    let head = local(181);
    let body = format!(
        "capacity_iops = 100000\n[tls]\nmode = \"require\"\npsk_file = \"{}\"\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\n",
        dir.join("nodes.psk").display()
    );
    common::config_at(&dir.join("node181"), &head, &body);
    s1.signal("-HUP");
    s1.wait_line("configuration reloaded");
    assert_eq!(write_at(&mut c, 5, 8192, 0xa3), 0, "the gateway's plain session to the node goes on");
    assert_eq!(flush_on(&mut c, 6), 0);
    let plain = tool("nbdinfo").arg(format!("nbd://{}/v", s1.nbd)).output().unwrap();
    assert!(!plain.status.success(), "the node refuses plain clients now");
    // So the checks of its export's flags, plain side connections, fail.
    let failed = s1_checks(&gw).1;
    assert!(eventually(Duration::from_secs(10), || s1_checks(&gw).1 > failed), "{:?}", s1_checks(&gw));
    // The gateway with [node_tls]: s1's link turns to TLS, live.
    write_file(dir, "gw.toml", &gw_tls);
    gw.signal("-HUP");
    gw.wait_line(
        "reload: node s1: TLS on the link off -> on: its sessions end once their pieces are answered and reconnect \
         with the new settings",
    );
    gw.wait_line(&format!("node session renewed at its new place {} (protocol auto, TLS)", s1.nbd));
    assert!(
        eventually(Duration::from_secs(10), || s1_link(&gw) == (true, 1, "\"nbd\"".to_string())),
        "{:?}",
        s1_link(&gw)
    );
    // The plain session left with a soft disconnect, and its successor runs TLS as gw-p.
    s1.wait_log(&["NBD connection closed", "(NBD_CMD_DISC)"], Duration::from_secs(10));
    s1.wait_log(&["NBD connection opened", "tls=true", "identity=\"gw-p\""], Duration::from_secs(10));
    // The checks follow the link to TLS: once a round begun before the reload is over, none fails.
    let first = s1_checks(&gw).0;
    assert!(eventually(Duration::from_secs(10), || s1_checks(&gw).0 >= first + 2), "{:?}", s1_checks(&gw));
    let (run, failed) = s1_checks(&gw);
    assert!(eventually(Duration::from_secs(10), || s1_checks(&gw).0 >= run + 3), "{:?}", s1_checks(&gw));
    assert_eq!(s1_checks(&gw).1, failed, "checks over TLS succeed");
    // The connection opened before reads what it wrote, and writes and flushes on, on the same socket.
    let (e, data) = read_at(&mut c, 7, 0, 3 * 4096);
    assert_eq!(e, 0);
    assert!(data[..4096].iter().all(|&b| b == 0xa1) && data[4096..8192].iter().all(|&b| b == 0xa2));
    assert!(data[8192..].iter().all(|&b| b == 0xa3));
    assert_eq!(write_at(&mut c, 8, 12288, 0xa4), 0);
    assert_eq!(flush_on(&mut c, 9), 0, "every write was flushed before the link turned: the FLUSH succeeds");
    let file = std::fs::read(node_file(dir, 181)).unwrap();
    assert!(file[12288..16384].iter().all(|&b| b == 0xa4), "the write after the reload is on the node");
    // New connections too.
    let (ok, out) =
        qemu_io_ok(&uri(&gw), &["read -P 0xa1 0 4k", "read -P 0xa4 12k 4k", "write -P 0xa5 16k 4k", "flush"]);
    assert!(ok, "{out}");
    let log = gw.log.lock().unwrap().clone();
    assert!(!log.iter().any(|l| l.contains("needs a restart") || l.contains("node connection lost")), "{log:#?}");
    let renewed = log.iter().filter(|l| l.contains("node session renewed")).count();
    assert_eq!(renewed, 1, "one session, renewed once: the refused reloads renewed none: {log:#?}");
}

/// gw.toml at 127.0.0.182 with one node s1 at `node` spoken to in `protocol`, tenant c2 (its table ending
/// with `tenant_keys`) and its 16 MiB volume v, written in `dir`.
fn one_node_gw(dir: &Path, node: SocketAddr, protocol: &str, tenant_keys: &str) -> PathBuf {
    let text = format!(
        "{}\n{TIMES}[[nodes]]\nname = \"s1\"\naddress = \"{node}\"\nprotocol = \"{protocol}\"\n[[tenants]]\nname = \"c2\"\n\
         {tenant_keys}[[exports]]\nname = \"v\"\ntenant = \"c2\"\nsize_mb = 16\n",
        local(182)
    );
    write_file(dir, "gw.toml", &text)
}

/// A reload that turns a node's link to the storage-node protocol at a node that refuses it (a `rein
/// serve` without `[node] enabled`) is refused, naming the node, before any session moves: the link
/// speaks plain NBD on and a connection opened before writes on. Before, the reload was applied and
/// every reconnect failed (`the node refused the storage-node protocol`), the volume's pieces on the node
/// with EIO, until a reload put the protocol back.
#[test]
fn a_reload_to_a_protocol_the_node_refuses_is_refused() {
    let tmp = tmpdir("gw-protocol-refused");
    let dir = tmp.path();
    let s1 = node(dir, 185, 0);
    let config = |protocol: &str| one_node_gw(dir, s1.nbd, protocol, "");
    let gw = gateway(&config("nbd"));
    let mut c = Raw::connect(gw.nbd, "v");
    assert_eq!(write_at(&mut c, 1, 0, 0xc1), 0);
    config("rein");
    gw.signal("-HUP");
    let line = gw.wait_log(
        &["the running configuration is unchanged", "refuses the link as this reload sets it"],
        Duration::from_secs(30),
    );
    assert!(
        line.contains(&format!(
            "node s1: the node at {} refuses the link as this reload sets it (protocol rein, TLS off): the node \
             refused the storage-node protocol",
            s1.nbd
        )),
        "{line}"
    );
    assert_eq!(s1_link(&gw), (false, 1, "\"nbd\"".to_string()), "the link as it ran");
    assert_eq!(write_at(&mut c, 2, 4096, 0xc2), 0, "the connection opened before writes on");
    assert_eq!(flush_on(&mut c, 3), 0);
    let (e, data) = read_at(&mut c, 4, 0, 8192);
    assert!(e == 0 && data[..4096].iter().all(|&b| b == 0xc1) && data[4096..].iter().all(|&b| b == 0xc2));
    let log = gw.log.lock().unwrap().clone();
    assert!(!log.iter().any(|l| l.contains("node session renewed") || l.contains("node connection lost")), "{log:#?}");
}

/// A node's `protocol` changed by a reload, nbd -> rein and back, on a live volume (`NodeMoves`): the
/// gateway's session ends once its pieces are answered and says hello again at once in the new protocol.
/// Under rein the node schedules the volume's pieces as tenant c2 (its `specs = "gateway"`), under nbd as
/// its own export's tenant again; a connection opened before both reloads keeps its data and writes on.
/// Before, the reload named the change as needing a restart and the link spoke as it started.
#[test]
fn a_reload_switches_a_nodes_protocol_live() {
    let tmp = tmpdir("gw-protocol");
    let dir = tmp.path();
    let s1 = storage_node(dir, 185);
    let config = |protocol: &str| one_node_gw(dir, s1.nbd, protocol, "reservation = 100\n");
    let gw = gateway(&config("nbd"));
    let mut c = Raw::connect(gw.nbd, "v");
    assert_eq!(write_at(&mut c, 1, 0, 0xb1), 0);
    assert_eq!(flush_on(&mut c, 2), 0);
    assert_eq!(s1_link(&gw), (false, 1, "\"nbd\"".to_string()));
    assert_eq!(completed(s1.admin, "c2"), 0, "plain NBD: the node does not know c2");
    // nbd -> rein.
    config("rein");
    gw.signal("-HUP");
    gw.wait_line(
        "reload: node s1: protocol nbd -> rein: its sessions end once their pieces are answered and reconnect with \
         the new settings",
    );
    s1.wait_line("storage-node session granted");
    assert!(
        eventually(Duration::from_secs(10), || s1_link(&gw) == (false, 1, "\"rein\"".to_string())),
        "{:?}",
        s1_link(&gw)
    );
    let (e, data) = read_at(&mut c, 3, 0, 4096);
    assert!(e == 0 && data.iter().all(|&b| b == 0xb1), "the data written under nbd");
    assert_eq!(write_at(&mut c, 4, 4096, 0xb2), 0);
    assert_eq!(flush_on(&mut c, 5), 0);
    let tagged = completed(s1.admin, "c2");
    assert!(tagged >= 3, "the read, write and flush scheduled as c2 at the node: {tagged}");
    // rein -> nbd.
    config("nbd");
    gw.signal("-HUP");
    gw.wait_line(
        "reload: node s1: protocol rein -> nbd: its sessions end once their pieces are answered and reconnect with \
         the new settings",
    );
    assert!(
        eventually(Duration::from_secs(10), || s1_link(&gw) == (false, 1, "\"nbd\"".to_string())),
        "{:?}",
        s1_link(&gw)
    );
    let (e, data) = read_at(&mut c, 6, 0, 8192);
    assert!(e == 0 && data[..4096].iter().all(|&b| b == 0xb1) && data[4096..].iter().all(|&b| b == 0xb2));
    assert_eq!(write_at(&mut c, 7, 8192, 0xb3), 0);
    assert_eq!(flush_on(&mut c, 8), 0);
    assert_eq!(completed(s1.admin, "c2"), tagged, "plain NBD again: nothing more as c2");
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0xb2 4k 4k", "read -P 0xb3 8k 4k"]);
    assert!(ok, "a new connection: {out}");
    let log = gw.log.lock().unwrap().clone();
    assert!(!log.iter().any(|l| l.contains("needs a restart") || l.contains("node connection lost")), "{log:#?}");
}

/// A reload whose file misspells a volume's `read_only` (`readonly`) is refused, `unknown field`, and
/// changes nothing; the connection opened before writes on (the volume's own `read_only`:
/// `a_volume_of_its_own_read_only_refuses_every_connections_writes`). Made read-only on its node by a
/// reload of `rein serve`, the volume stops
/// the writes of the connections opened before too, as rein serve's own do (`Storage::stop_writes`): the
/// node refuses them on the links the gateway opened before its reload, and the gateway answers the VM's
/// WRITE, WRITE_ZEROES and TRIM with the node's EPERM; the bytes on the node stay, and a FLUSH still
/// succeeds.
#[test]
fn a_volume_made_read_only_stops_the_writes_of_open_connections() {
    use rein_proto::nbd::Command;
    let tmp = tmpdir("gw-read-only");
    let dir = tmp.path();
    let head = "listen = \"127.0.0.160:0\"\nadmin = \"127.0.0.160:0\"";
    let body = format!("capacity_iops = 100000\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\n");
    let s1 = serve_in(&dir.join("node160"), head, &body);
    let volume = "[[exports]]\nname = \"v\"\nsize_mb = 16\n";
    let gw = gateway(&gateway_config(dir, 161, &[("s1", s1.nbd)], volume));
    let write = |c: &mut Raw, command: Command, h: u64, byte: u8| {
        let data = [byte; 4096];
        c.send(command, h, 0, 4096, if command == Command::Write { &data[..] } else { &[] });
        c.reply(0).1
    };
    let flush = |c: &mut Raw, h: u64| {
        c.send(Command::Flush, h, 0, 0, &[]);
        c.reply(0).1
    };
    let mut old = Raw::connect(gw.nbd, "v");
    assert_eq!(write(&mut old, Command::Write, 1, 0xa1), 0);
    // The gateway's file with a typo: refused as a whole.
    gateway_config(dir, 161, &[("s1", s1.nbd)], &format!("{volume}readonly = true\n"));
    gw.signal("-HUP");
    let line = gw.wait_line("the running configuration is unchanged");
    assert!(line.contains("unknown field `readonly`"), "{line}");
    assert_eq!(write(&mut old, Command::Write, 2, 0xa2), 0, "the volume runs as it did");
    assert_eq!(flush(&mut old, 3), 0);
    // The node's export made read-only by a reload of the node.
    common::config_at(&dir.join("node160"), head, &format!("{body}read_only = true\n"));
    s1.signal("-HUP");
    s1.wait_line("export v: read-only now");
    let t0 = Instant::now();
    while write(&mut Raw::connect(gw.nbd, "v"), Command::Write, 4, 0xa3) != 1 {
        assert!(t0.elapsed() < Duration::from_secs(10), "a new connection still writes: {:#?}", gw.log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    for (h, command) in [(5, Command::Write), (6, Command::WriteZeroes), (7, Command::Trim)] {
        assert_eq!(write(&mut old, command, h, 0xa4), 1, "{command:?} on the connection opened before: EPERM");
    }
    let file = std::fs::read(node_file(dir, 160)).unwrap();
    assert!(file[..4096].iter().all(|&b| b == 0xa2), "the node's bytes are those written before");
    assert_eq!(flush(&mut old, 8), 0, "a FLUSH still succeeds");
}

/// Whether a new connection to the gateway's volume v is told it is read-only (NBD_FLAG_READ_ONLY).
fn advertised_read_only(gw: &Server) -> bool {
    let open = common::nbd_open(gw.nbd, "v", false, Duration::from_secs(20)).unwrap();
    open.flags & rein_proto::nbd::TFLAG_READ_ONLY != 0
}

/// A 4 KiB WRITE of `byte`s at offset 0 on `c` as handle `h`: the reply's error (0: written).
fn write_4k(c: &mut Raw, h: u64, byte: u8) -> u32 {
    c.send(rein_proto::nbd::Command::Write, h, 0, 4096, &[byte; 4096]);
    c.reply(0).1
}

/// Whether nbdinfo says the volume at `uri` is read-only (`is_read_only` in its JSON).
fn nbdinfo_read_only(uri: &str) -> bool {
    let json = run_ok(tool("nbdinfo").args(["--json", uri]));
    let flat: String = json.split_whitespace().collect();
    assert!(flat.contains("\"is_read_only\":"), "{json}");
    flat.contains("\"is_read_only\":true")
}

/// A volume over a node export that is read-only (`read_only = true` on s1 from its start) is advertised
/// read-only (NBD_FLAG_READ_ONLY), as s1's handshake said: nbdinfo shows `is_read_only: true`, nbdcopy
/// refuses to write to it, and a WRITE across both its nodes gets EPERM from the gateway itself, no piece sent, so the bytes of the
/// writable node s2 stay as they were, while reads are served; `/api/nodes` and `rein admin nodes` say
/// it. Before, the volume was advertised writable
/// and such a WRITE landed on s2 while s1 refused its part with EPERM: half written. The listening line
/// counts the nodes configured apart from those connected (s3, named in gw.toml, no volume uses).
#[test]
fn a_volume_over_a_read_only_node_export_is_advertised_read_only() {
    use rein_proto::nbd::{Command, TFLAG_READ_ONLY};
    let tmp = tmpdir("gw-ro-start");
    let dir = tmp.path();
    node_image(dir, 120);
    let body = format!("capacity_iops = 100000\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\nread_only = true\n");
    let s1 = serve_in(&dir.join("node120"), &local(120), &body);
    let s2 = node(dir, 121, 0);
    let s3 = free_tcp("127.0.0.121");
    let volume = "[[exports]]\nname = \"v\"\nsize_mb = 16\nstripe_kb = 64\nwidths = { s1 = 1, s2 = 1 }\n";
    let gw = gateway(&gateway_config(dir, 122, &[("s1", s1.nbd), ("s2", s2.nbd), ("s3", s3)], volume));
    let line = gw.wait_line("rein gateway listening");
    assert!(line.contains("nodes_configured=3 nodes_connected=2"), "{line}");
    gw.wait_line("the node's export is read-only (NBD_FLAG_READ_ONLY at its handshake)");
    assert!(nbdinfo_read_only(&uri(&gw)), "nbdinfo sees the volume read-only");
    // A real client refuses to write up front (before, it wrote and got EPERM).
    let zeroes = dir.join("zeroes.raw");
    std::fs::write(&zeroes, vec![0u8; 4096]).unwrap();
    let out = tool("nbdcopy").arg(&zeroes).arg(uri(&gw)).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("the destination is read-only"), "nbdcopy: {err}");
    let (status, _, body) = common::http(gw.admin, "GET", "/api/nodes", "", "");
    assert_eq!(status, 200);
    let nodes: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(nodes[0]["read_only"], true, "{body}");
    let per_node: Vec<_> = nodes[0]["nodes"].as_array().unwrap().iter().map(|n| n["read_only"].clone()).collect();
    assert_eq!(per_node, [true, false], "s1 read-only, s2 writable: {body}");
    let admin = [String::from("admin"), "--admin".into(), gw.admin.to_string(), "nodes".into()];
    let table = run_ok(Cmd::new(env!("CARGO_BIN_EXE_rein")).args(&admin).env("NO_COLOR", "1"));
    assert!(table.lines().any(|l| l.starts_with("v (read-only)") && l.contains(" s1 ")), "{table}");
    assert!(table.lines().any(|l| l.starts_with("v (read-only)") && l.contains(" s2 ")), "{table}");
    let open = common::nbd_open(gw.nbd, "v", false, Duration::from_secs(20)).unwrap();
    assert_ne!(open.flags & TFLAG_READ_ONLY, 0, "advertised read-only: flags {:#x}", open.flags);
    let mut c = Raw { s: open.stream, buf: open.buf };
    let before = pieces_sent(gw.admin);
    let data = vec![0xb7u8; 2 * UNIT as usize];
    c.send(Command::Write, 1, 0, data.len() as u32, &data);
    assert_eq!(c.reply(0).1, 1, "a WRITE over s1 and s2: EPERM");
    for (h, command) in [(2, Command::WriteZeroes), (3, Command::Trim)] {
        c.send(command, h, UNIT, 4096, &[]);
        assert_eq!(c.reply(0).1, 1, "{command:?} on s2's unit: EPERM");
    }
    assert_eq!(pieces_sent(gw.admin), before, "the gateway refuses them itself: no piece sent");
    let s2_bytes = std::fs::read(node_file(dir, 121)).unwrap();
    assert!(s2_bytes[..UNIT as usize].iter().all(|&b| b == 0), "s2's unit is not written");
    c.send(Command::Read, 4, 0, 2 * UNIT as u32, &[]);
    let (_, error, read) = c.reply(2 * UNIT as usize);
    assert_eq!((error, read.len()), (0, 2 * UNIT as usize), "reads are served");
    assert_eq!(pieces_sent(gw.admin), before + 2, "a READ over two units: one piece per node");
}

/// A node down when the gateway starts is taken as writable (what its export is, is unknown; the gateway
/// does not wait for it): the volume is advertised writable, and once the node is up with a read-only
/// export its first handshake says so, and new connections see the volume read-only.
#[test]
fn a_node_down_at_start_is_taken_as_writable_until_its_handshake_says_otherwise() {
    use rein_proto::nbd::TFLAG_READ_ONLY;
    let tmp = tmpdir("gw-ro-down");
    let dir = tmp.path();
    let addr = free_tcp("127.0.0.136");
    let gw = gateway(&gateway_config(dir, 137, &[("s1", addr)], "[[exports]]\nname = \"v\"\nsize_mb = 16\n"));
    gw.wait_line("node unreachable at start");
    let flags = || common::nbd_open(gw.nbd, "v", false, Duration::from_secs(20)).unwrap().flags;
    assert_eq!(flags() & TFLAG_READ_ONLY, 0, "unknown yet: writable");
    node_image(dir, 136);
    let head = format!("listen = \"{addr}\"\nadmin = \"127.0.0.136:0\"");
    let body = format!("capacity_iops = 100000\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\nread_only = true\n");
    let _s1 = serve_in(&dir.join("node136"), &head, &body);
    gw.wait_line("node connection restored");
    gw.wait_line("the node's export is read-only (NBD_FLAG_READ_ONLY at its handshake)");
    assert_ne!(flags() & TFLAG_READ_ONLY, 0, "its handshake said read-only");
}

/// A node export made read-only by a reload of its node (`rein serve`): the gateway's session, opened
/// before, is not told; the node refuses its next write with EPERM, and from that the gateway takes the
/// volume as read-only: new connections see it read-only (nbdinfo: `is_read_only: true`) and get EPERM
/// from the gateway itself for their writes, no piece sent, and so does the connection opened before
/// (told writable at its handshake; its writes went on to the node until 2026-12-07). Made writable again on the node (another reload of it), the volume stays
/// read-only until a new session to the node says so: a reload of the gateway renews the sessions that
/// refuse writes, and from then on new connections see it writable, and they and the one opened first
/// write. (The gateway's periodic check of the node exports' flags is off here, `read_only_check_s = 0`:
/// `a_node_export_reloaded_read_only_is_learnt_by_the_check_without_a_write` has it.)
#[test]
fn a_node_export_made_read_only_by_a_reload_makes_new_connections_read_only() {
    let tmp = tmpdir("gw-ro-reload");
    let dir = tmp.path();
    let node_dir = dir.join("node123");
    let head = |port: u16| format!("listen = \"127.0.0.123:{port}\"\nadmin = \"127.0.0.123:0\"");
    let body = |read_only: bool| {
        format!("capacity_iops = 100000\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\nread_only = {read_only}\n")
    };
    let s1 = serve_in(&node_dir, &head(0), &body(false));
    let addr = s1.nbd;
    let volume = "[[exports]]\nname = \"v\"\nsize_mb = 16\n";
    let gw = gateway(&gateway_config_with(dir, 124, "read_only_check_s = 0\n", &[("s1", addr)], volume));
    let (read_only, write) = (advertised_read_only, write_4k);
    assert!(!read_only(&gw), "writable to begin with");
    let mut old = Raw::connect(gw.nbd, "v");
    assert_eq!(write(&mut old, 1, 0xc1), 0);
    common::config_at(&node_dir, &head(0), &body(true));
    s1.signal("-HUP");
    s1.wait_line("export v: read-only now");
    assert_eq!(write(&mut old, 2, 0xc2), 1, "the node's EPERM");
    // Learnt before that EPERM was passed on.
    assert!(read_only(&gw), "a new connection sees the volume read-only");
    gw.wait_line("the node refused a write with EPERM: its export is read-only now");
    assert!(nbdinfo_read_only(&uri(&gw)), "so does nbdinfo");
    let mut new = Raw::connect(gw.nbd, "v");
    let before = pieces_sent(gw.admin);
    assert_eq!(write(&mut new, 3, 0xc3), 1, "the gateway's EPERM");
    assert_eq!(pieces_sent(gw.admin), before, "no piece sent for it");
    assert_eq!(write(&mut old, 4, 0xc4), 1, "the connection opened before: the gateway's EPERM too");
    assert_eq!(pieces_sent(gw.admin), before, "no piece sent for it either (until 2026-12-07 it went on)");
    let file = std::fs::read(node_file(dir, 123)).unwrap();
    assert!(file[..4096].iter().all(|&b| b == 0xc1), "the node's bytes are those written before");
    // The node's export writable again: a reload of the node ends no session, so the gateway goes on
    // taking it as read-only; a reload of the gateway renews the sessions that refuse writes, and their
    // new handshakes say it is writable.
    common::config_at(&node_dir, &head(0), &body(false));
    s1.signal("-HUP");
    let reloads = || s1.log.lock().unwrap().iter().filter(|l| l.contains("configuration reloaded")).count();
    assert!(eventually(Duration::from_secs(30), || reloads() == 2), "the node's second reload");
    assert!(read_only(&gw), "not learnt yet");
    gw.signal("-HUP");
    let line = gw.wait_line("configuration reloaded");
    assert!(line.contains("applied=1"), "{line}");
    gw.wait_line("export v: the sessions with s1 renew to learn whether its export is still read-only");
    gw.wait_line("node session renewed to learn whether its export still refuses writes");
    gw.wait_line("the node's export is writable (its new session's handshake says so)");
    assert!(!read_only(&gw), "a new connection sees the volume writable again");
    let mut again = Raw::connect(gw.nbd, "v");
    assert_eq!(write(&mut again, 5, 0xc5), 0, "and writes");
    assert_eq!(write(&mut old, 6, 0xc6), 0, "so does the connection opened first (advertised writable)");
    assert_eq!(write(&mut new, 7, 0xc7), 1, "the one advertised read-only keeps to it");
    let file = std::fs::read(node_file(dir, 123)).unwrap();
    assert!(file[..4096].iter().all(|&b| b == 0xc6), "the last write landed");
    // A reload with nothing read-only renews nothing.
    gw.signal("-HUP");
    gw.wait_log(&["configuration reloaded", "applied=0"], Duration::from_secs(30));
}

/// The gateway's check of its node exports' flags (`read_only_check_s`, here 0.2 s): s1's export made
/// read-only by a reload of that `rein serve` while the gateway runs, no write sent, the gateway learns
/// it within a few checks: a new connection sees the volume read-only (its handshake's flag, nbdinfo) and
/// a WRITE over s1 and s2 gets EPERM from the gateway itself, nothing sent, s2's bytes as they were.
/// Made writable again by another reload of s1, the check renews the gateway's sessions with s1 (opened
/// before, they would refuse writes still): new connections see the volume writable, and a WRITE over
/// both nodes lands on both. Before, the gateway advertised the volume writable until a write was
/// refused (a WRITE over both nodes landed on s2 alone), and once it learnt it, only a reconnect or a
/// gateway reload unlearnt it.
#[test]
fn a_node_export_reloaded_read_only_is_learnt_by_the_check_without_a_write() {
    use rein_proto::nbd::Command;
    let tmp = tmpdir("gw-ro-check");
    let dir = tmp.path();
    let node_dir = dir.join("node175");
    let body = |read_only: bool| {
        format!("capacity_iops = 100000\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\nread_only = {read_only}\n")
    };
    let s1 = serve_in(&node_dir, &local(175), &body(false));
    let s2 = node(dir, 176, 0);
    let volume = "[[exports]]\nname = \"v\"\nsize_mb = 16\nstripe_kb = 64\nwidths = { s1 = 1, s2 = 1 }\n";
    let top = "read_only_check_s = 0.2\n";
    let gw = gateway(&gateway_config_with(dir, 177, top, &[("s1", s1.nbd), ("s2", s2.nbd)], volume));
    assert!(!advertised_read_only(&gw), "writable to begin with");
    // A connection told writable at its handshake, before the node's reload.
    let mut old = Raw::connect(gw.nbd, "v");
    common::config_at(&node_dir, &local(175), &body(true));
    s1.signal("-HUP");
    s1.wait_line("export v: read-only now");
    assert!(eventually(Duration::from_secs(10), || advertised_read_only(&gw)), "a new connection sees it read-only");
    gw.wait_line("the node's export is read-only now (a check of its flags)");
    assert!(nbdinfo_read_only(&uri(&gw)), "so does nbdinfo");
    let mut c = Raw::connect(gw.nbd, "v");
    let before = pieces_sent(gw.admin);
    let data = vec![0xd1u8; 2 * UNIT as usize];
    c.send(Command::Write, 1, 0, data.len() as u32, &data);
    assert_eq!(c.reply(0).1, 1, "a WRITE over s1 and s2: the gateway's EPERM");
    assert_eq!(pieces_sent(gw.admin), before, "no piece sent");
    old.send(Command::Write, 3, 0, data.len() as u32, &data);
    assert_eq!(old.reply(0).1, 1, "a WRITE over s1 and s2 on the connection opened before: the gateway's EPERM");
    assert_eq!(pieces_sent(gw.admin), before, "no piece sent for it either");
    let s2_bytes = std::fs::read(node_file(dir, 176)).unwrap();
    assert!(s2_bytes[..UNIT as usize].iter().all(|&b| b == 0), "s2's unit is not written (no torn write)");
    // Writable again on s1: the check renews the sessions that refuse writes.
    common::config_at(&node_dir, &local(175), &body(false));
    s1.signal("-HUP");
    let reloads = || s1.log.lock().unwrap().iter().filter(|l| l.contains("configuration reloaded")).count();
    assert!(eventually(Duration::from_secs(30), || reloads() == 2), "the node's second reload");
    assert!(eventually(Duration::from_secs(10), || !advertised_read_only(&gw)), "a new connection sees it writable");
    gw.wait_line("the node's export is writable (a check of its flags)");
    gw.wait_line("node session renewed to learn whether its export still refuses writes");
    assert!(!nbdinfo_read_only(&uri(&gw)), "so does nbdinfo");
    let mut c = Raw::connect(gw.nbd, "v");
    let data = vec![0xd2u8; 2 * UNIT as usize];
    c.send(Command::Write, 2, 0, data.len() as u32, &data);
    assert_eq!(c.reply(0).1, 0, "a WRITE over s1 and s2 succeeds");
    for host in [175, 176] {
        let bytes = std::fs::read(node_file(dir, host)).unwrap();
        assert!(bytes[..UNIT as usize].iter().all(|&b| b == 0xd2), "node {host} has its unit");
    }
    old.send(Command::Write, 4, 0, data.len() as u32, &data);
    assert_eq!(old.reply(0).1, 0, "the connection opened before writes again");
}

/// A reload of the gateway, with a node export that refuses writes, runs the volume's check of the
/// export's flags at once (`read_only_check_s = 3600` here, so no periodic check comes first) instead of
/// renewing the node sessions: while the export is still read-only nothing is renewed, through two such
/// reloads and their checks (until 2026-12-07 every reload renewed those sessions, a handshake each, and
/// ran no check); once a reload of the node has made it writable, the gateway's next reload finds it so
/// and the sessions renew. `/api/nodes` counts the checks.
#[test]
fn a_gateway_reload_checks_read_only_node_exports_at_once() {
    let tmp = tmpdir("gw-ro-reload-check");
    let dir = tmp.path();
    let node_dir = dir.join("node155");
    node_image(dir, 155);
    let body = |read_only: bool| {
        format!("capacity_iops = 100000\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\nread_only = {read_only}\n")
    };
    let s1 = serve_in(&node_dir, &local(155), &body(true));
    let volume = "[[exports]]\nname = \"v\"\nsize_mb = 16\n";
    let gw = gateway(&gateway_config_with(dir, 157, "read_only_check_s = 3600\n", &[("s1", s1.nbd)], volume));
    gw.wait_line("the node's export is read-only (NBD_FLAG_READ_ONLY at its handshake)");
    let checks = || {
        let (status, _, body) = common::http(gw.admin, "GET", "/api/nodes", "", "");
        assert_eq!(status, 200, "{body}");
        let nodes: serde_json::Value = serde_json::from_str(&body).unwrap();
        let s1 = &nodes[0]["nodes"][0];
        (s1["read_only_checks"].as_u64().unwrap(), s1["read_only_checks_failed"].as_u64().unwrap())
    };
    assert_eq!(checks(), (0, 0), "no check yet: the first is an hour away");
    gw.signal("-HUP");
    let line = gw.wait_line("configuration reloaded");
    assert!(line.contains("applied=1"), "{line}");
    gw.wait_line("export v: a check of the flags of s1's export runs now");
    assert!(eventually(Duration::from_secs(10), || checks() == (1, 0)), "the reload's check: {:?}", checks());
    assert!(advertised_read_only(&gw), "still read-only");
    // A renewal the check asked for would be logged within moments; a second reload and its check, run
    // through to the end and logged after, prove that those moments passed (the first check's count
    // alone did not: a renewal follows it).
    let gw_reloads = || gw.log.lock().unwrap().iter().filter(|l| l.contains("configuration reloaded")).count();
    gw.signal("-HUP");
    assert!(eventually(Duration::from_secs(30), || gw_reloads() == 2), "the gateway's second reload");
    assert!(eventually(Duration::from_secs(10), || checks() == (2, 0)), "its check: {:?}", checks());
    let renewed = || gw.log.lock().unwrap().iter().filter(|l| l.contains("node session renewed")).count();
    assert_eq!(renewed(), 0, "nothing renewed while the export is read-only");
    // Writable on the node: the gateway's next reload checks, and renews the sessions.
    common::config_at(&node_dir, &local(155), &body(false));
    s1.signal("-HUP");
    let reloads = || s1.log.lock().unwrap().iter().filter(|l| l.contains("configuration reloaded")).count();
    assert!(eventually(Duration::from_secs(30), || reloads() == 1), "the node's reload");
    gw.signal("-HUP");
    gw.wait_line("the node's export is writable (a check of its flags)");
    gw.wait_line("node session renewed to learn whether its export still refuses writes");
    assert!(eventually(Duration::from_secs(10), || !advertised_read_only(&gw)), "a new connection sees it writable");
    assert_eq!(checks(), (3, 0));
    let (status, _, metrics) = common::http(gw.admin, "GET", "/metrics", "", "");
    assert_eq!(status, 200);
    assert!(metrics.contains("rein_gateway_node_read_only_checks_total{export=\"v\",node=\"s1\"} 3\n"), "{metrics}");
    assert!(metrics.contains("rein_gateway_node_read_only_checks_failed_total{export=\"v\",node=\"s1\"} 0\n"));
}

/// A plain NBD node (nbdkit, its error filter answering EPERM to WRITEs while a file exists) that
/// refused one write: the gateway takes its export as read-only; once the node writes again, its export
/// advertised writable all along, the gateway's check (`read_only_check_s`) sees the flags writable and
/// renews the session, and new connections see the volume writable and write. Before, the volume stayed
/// read-only until the session was lost or the gateway was reloaded.
#[test]
fn a_plain_nbd_nodes_eperm_is_unlearnt_by_the_check() {
    if !common::installed("nbdkit") {
        eprintln!("skipped: nbdkit is not installed");
        return;
    }
    let tmp = tmpdir("gw-ro-plain");
    let dir = tmp.path();
    let fail = dir.join("fail");
    let addr = free_tcp("127.0.0.178");
    let (ip, port) = (addr.ip().to_string(), addr.port().to_string());
    let error_file = format!("error-pwrite-file={}", fail.display());
    let args = ["-f", "--filter=error", "-i", &ip, "-p", &port, "-e", "v", "memory", "32M"];
    let errors = ["error-pwrite=EPERM", "error-pwrite-rate=100%", &error_file];
    let _nbdkit = KillOnDrop(Cmd::new("nbdkit").args(args).args(errors).spawn().unwrap());
    assert!(eventually(Duration::from_secs(20), || std::net::TcpStream::connect(addr).is_ok()), "nbdkit listens");
    let text = format!(
        "{}\n{TIMES}read_only_check_s = 0.2\n[[nodes]]\nname = \"p1\"\naddress = \"{addr}\"\nprotocol = \"nbd\"\n\
         [[exports]]\nname = \"v\"\nsize_mb = 16\n",
        local(179)
    );
    let gw = gateway_in(dir, &text);
    assert!(!advertised_read_only(&gw), "writable to begin with");
    let mut c = Raw::connect(gw.nbd, "v");
    std::fs::write(&fail, b"").unwrap();
    assert_eq!(write_4k(&mut c, 1, 0xe1), 1, "the node's EPERM");
    // The volume is read-only from here until the next check (at most 0.2 s): too short a time to look
    // at without a race; `a_node_export_made_read_only_by_a_reload_makes_new_connections_read_only` does.
    gw.wait_line("the node refused a write with EPERM: its export is read-only now");
    std::fs::remove_file(&fail).unwrap();
    assert!(eventually(Duration::from_secs(10), || !advertised_read_only(&gw)), "a new connection sees it writable");
    gw.wait_line("the node's export is writable (a check of its flags)");
    let mut c = Raw::connect(gw.nbd, "v");
    assert_eq!(write_4k(&mut c, 2, 0xe2), 0, "and writes");
}

/// The check of the node exports' flags reaches a node as its links do: over TLS (x509, a node that
/// requires it and admits only the named gateway identities) and over a Unix socket, both storage nodes
/// (`protocol = "rein"`; the check itself states no tenant). Each node's export made read-only by a
/// reload of it, then writable again, the gateway learns it with no write sent, and new connections
/// see the volume so; a write at the end lands.
#[test]
fn the_check_reaches_tls_and_unix_socket_nodes() {
    use common::tls::{make_ca, make_cert, server, CLIENT};
    let tmp = tmpdir("gw-ro-check-tls");
    let dir = tmp.path();
    make_ca(dir, "ca", "Rein test CA");
    make_cert(dir, "ca", "n175", "node175", &server("IP:127.0.0.175"));
    make_cert(dir, "ca", "gwa", "gw-a", CLIENT);
    let tls = format!(
        "[tls]\nmode = \"require\"\ncert = \"{d}/n175-cert.pem\"\nkey = \"{d}/n175-key.pem\"\nca = \"{d}/ca-cert.pem\"\n",
        d = dir.display()
    );
    let (tls_keys, unix_top) = ("allow_identities = [\"gw-a\"]\n", "listen_unix = \"nbd.sock\"\n");
    let t1 = storage_node_with(dir, 175, "", tls_keys, &tls);
    let u1 = storage_node_with(dir, 176, unix_top, "", "");
    let sock = dir.join("node176").join("nbd.sock");
    let text = format!(
        "{}\n{TIMES}read_only_check_s = 0.2\n[node_tls]\nca = \"ca-cert.pem\"\ncert = \"gwa-cert.pem\"\nkey = \"gwa-key.pem\"\n\
         [[nodes]]\nname = \"t1\"\naddress = \"{}\"\nprotocol = \"rein\"\n\
         [[nodes]]\nname = \"u1\"\naddress = \"unix:{}\"\nprotocol = \"rein\"\ntls = false\n\
         [[exports]]\nname = \"v\"\nsize_mb = 16\n",
        local(177),
        t1.nbd,
        sock.display()
    );
    let gw = gateway_in(dir, &text);
    for n in [&t1, &u1] {
        n.wait_line("storage-node session granted");
    }
    assert!(!advertised_read_only(&gw), "writable to begin with");
    let v = format!("name = \"v\"\nsize_mb = {NODE_MB}\n");
    for (n, host, top, keys, tables) in [(&t1, 175, "", tls_keys, tls.as_str()), (&u1, 176, unix_top, "", "")] {
        let body = storage_node_body(top, keys, tables);
        let node_dir = dir.join(format!("node{host}"));
        common::config_at(&node_dir, &local(host), &body.replace(&v, &format!("{v}read_only = true\n")));
        n.signal("-HUP");
        n.wait_line("export v: read-only now");
        assert!(eventually(Duration::from_secs(10), || advertised_read_only(&gw)), "node {host} read-only: learnt");
        common::config_at(&node_dir, &local(host), &body);
        n.signal("-HUP");
        assert!(eventually(Duration::from_secs(10), || !advertised_read_only(&gw)), "node {host} writable: learnt");
    }
    let mut c = Raw::connect(gw.nbd, "v");
    let data = vec![0xf1u8; 2 * UNIT as usize];
    c.send(rein_proto::nbd::Command::Write, 1, 0, data.len() as u32, &data);
    assert_eq!(c.reply(0).1, 0, "a WRITE over both nodes succeeds");
}

/// A volume's own `read_only` (gw.toml): advertised read-only (the handshake's flag, nbdinfo), its writes
/// refused by the gateway with EPERM and nothing sent, reads served. Made writable by a reload, a new
/// connection writes; made read-only again by a reload, the writes of a connection opened while it was
/// writable fail too (EPERM, nothing sent, the node's bytes unchanged) and its FLUSH and reads succeed;
/// writable again, that connection writes again. `rein gateway --check-config` says it. Before, a volume
/// had no `read_only`: a file with it did not load (unknown field), and a volume could be frozen only by
/// making its node exports read-only and reloading the nodes.
#[test]
fn a_volume_of_its_own_read_only_refuses_every_connections_writes() {
    use rein_proto::nbd::Command;
    let tmp = tmpdir("gw-own-ro");
    let dir = tmp.path();
    let s1 = serve_in(
        &dir.join("node186"),
        "listen = \"127.0.0.186:0\"\nadmin = \"127.0.0.186:0\"",
        &format!("capacity_iops = 100000\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\n"),
    );
    let config = |read_only: bool| {
        gateway_config(
            dir,
            188,
            &[("s1", s1.nbd)],
            &format!("[[exports]]\nname = \"v\"\nsize_mb = 16\nread_only = {read_only}\n"),
        )
    };
    let check = run_ok(Cmd::new(env!("CARGO_BIN_EXE_rein")).args([
        "gateway",
        "--config",
        config(true).to_str().unwrap(),
        "--check-config",
    ]));
    assert!(check.contains("volume v: 16 MiB of tenant v, 64 KiB units over s1, read-only"), "{check}");
    let gw = gateway(&config(true));
    let (read_only, write) = (advertised_read_only, write_4k);
    assert!(read_only(&gw), "advertised read-only");
    assert!(nbdinfo_read_only(&uri(&gw)), "nbdinfo says so");
    let mut frozen = Raw::connect(gw.nbd, "v");
    let before = pieces_sent(gw.admin);
    assert_eq!(write(&mut frozen, 1, 0xd1), 1, "EPERM");
    assert_eq!(pieces_sent(gw.admin), before, "nothing sent");
    config(false);
    gw.signal("-HUP");
    gw.wait_line("export v: writable again");
    assert!(!read_only(&gw), "writable for a new connection");
    let mut open = Raw::connect(gw.nbd, "v");
    assert_eq!(write(&mut open, 2, 0xd2), 0, "a connection opened now writes");
    config(true);
    gw.signal("-HUP");
    gw.wait_line("export v: read-only now; the writes of the connections opened before fail (EPERM)");
    let before = pieces_sent(gw.admin);
    assert_eq!(write(&mut open, 3, 0xd3), 1, "the connection opened while writable: EPERM");
    open.send(Command::Trim, 4, 0, 4096, &[]);
    assert_eq!(open.reply(0).1, 1, "TRIM too");
    assert_eq!(pieces_sent(gw.admin), before, "nothing sent for them");
    open.send(Command::Flush, 5, 0, 0, &[]);
    assert_eq!(open.reply(0).1, 0, "its FLUSH succeeds");
    open.send(Command::Read, 6, 0, 4096, &[]);
    assert_eq!(open.reply(4096), (6, 0, vec![0xd2; 4096]), "and its reads, the bytes written before");
    let file = std::fs::read(node_file(dir, 186)).unwrap();
    assert!(file[..4096].iter().all(|&b| b == 0xd2), "the node's bytes are those written before");
    assert!(read_only(&gw), "a new connection sees it read-only");
    config(false);
    gw.signal("-HUP");
    let writable = || gw.log.lock().unwrap().iter().filter(|l| l.contains("export v: writable again")).count();
    assert!(eventually(Duration::from_secs(30), || writable() == 2), "the second reload to writable");
    assert_eq!(write(&mut open, 7, 0xd7), 0, "the connection opened while writable writes again");
    assert_eq!(write(&mut frozen, 8, 0xd8), 1, "the one advertised read-only keeps to it");
}

/// A reload (SIGHUP) adds and removes nodes without a restart (crates/rein-runtime/src/gateway.rs,
/// `NodePlan`): s3 is added with a volume on it, in the same reload as s2 and its volume are removed,
/// while reads of a volume on s1 run through the reload and none fails; the new volume's bytes land on
/// s3. A node a kept volume uses cannot go (named), a node added at a running node's address is taken (as
/// at start), a volume listing its nodes in another order than the gateway runs them is refused (a restart
/// would lay it out otherwise), and the removed s2 comes back at its place with a volume on it.
#[test]
fn a_reload_adds_and_removes_nodes() {
    let tmp = tmpdir("gw-add-node");
    let dir = tmp.path();
    // Storage nodes (the storage-node protocol: the tenants' trackers count every node).
    let (s1, s2, s3) = (storage_node(dir, 148), storage_node(dir, 149), storage_node(dir, 246));
    let vol = |name: &str, widths: &str| {
        format!("[[exports]]\nname = \"{name}\"\nsize_mb = 8\nstripe_kb = 64\nwidths = {{ {widths} }}\nnode_export = \"v\"\n")
    };
    // Tenant a, declared (spread), and its volume a on s1.
    let a = format!("[[tenants]]\nname = \"a\"\n{}", vol("a", "s1 = 1"));
    let gw =
        gateway(&gateway_config(dir, 247, &[("s1", s1.nbd), ("s2", s2.nbd)], &format!("{a}{}", vol("b", "s2 = 1"))));
    let at = |v: &str| format!("nbd://{}/{v}", gw.nbd);
    let (ok, out) = qemu_io_ok(&at("a"), &["write -P 0x41 0 1M", "flush"]);
    assert!(ok, "{out}");
    let (ok, out) = qemu_io_ok(&at("b"), &["write -P 0x42 0 64k", "flush"]);
    assert!(ok, "{out}");
    let reads = Reads::start(at("a"), "read -P 0x41 0 1M");
    // A client keeps b open through the reload that removes it.
    let mut keeper = Cmd::new("timeout")
        .args(["60", "qemu-io", "-f", "raw", &at("b")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exports = || {
        let (status, _, body) = common::http(gw.admin, "GET", "/api/nodes", "", "");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let list = v.as_array().unwrap().iter();
        list.map(|e| (e["export"].as_str().unwrap().to_string(), e["removed"].as_bool().unwrap())).collect::<Vec<_>>()
    };
    // Its connection is b's second (the write above was the first).
    let opened_b = || {
        gw.log.lock().unwrap().iter().filter(|l| l.contains("NBD connection opened") && l.contains("export=b")).count()
    };
    assert!(eventually(Duration::from_secs(30), || opened_b() == 2), "{}", opened_b());
    assert_eq!(exports(), [("a".to_string(), false), ("b".to_string(), false)]);
    // s2 and b go, s3 and c come; c is a's tenant's, whose tracker then counts s3 too. The same reload
    // changes a's reservation_split (a restart: a keeps the split it runs, over the places added).
    let c = vol("c", "s3 = 1").replace("size_mb", "tenant = \"a\"\nsize_mb");
    let a_rho = a.replace("name = \"a\"\n[[exports]]", "name = \"a\"\nreservation_split = \"rho\"\n[[exports]]");
    assert_ne!(a_rho, a);
    gateway_config(dir, 247, &[("s1", s1.nbd), ("s3", s3.nbd)], &format!("{a_rho}{c}"));
    gw.signal("-HUP");
    gw.wait_line(&format!("reload: node s3 added at {} (for volumes from now on)", s3.nbd));
    gw.wait_line(
        "reload: node s2 removed (no new volume can use it); connections open on removed volumes that use it keep it \
         until they close",
    );
    // /api/nodes shows b as removed while its client holds it, and no more once it quits.
    let removed_b = vec![("a".to_string(), false), ("c".to_string(), false), ("b".to_string(), true)];
    assert_eq!(exports(), removed_b);
    {
        use std::io::Write;
        let mut stdin = keeper.stdin.take().unwrap();
        writeln!(stdin, "read -P 0x42 0 64k\nquit").unwrap();
    }
    let out = keeper.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("read 65536/65536") && !text.contains("failed"), "b through s2 after the reload: {text}");
    assert!(eventually(Duration::from_secs(10), || exports().len() == 2), "{:?}", exports());
    gw.wait_line("reload: export c added");
    gw.wait_line("reload: tenant a: reservation_split changed: needs a restart");
    gw.wait_line("configuration reloaded applied=4 needs_restart=1");
    let (ok, out) = qemu_io_ok(&at("c"), &["write -P 0x43 0 128k", "flush", "read -P 0x43 0 128k"]);
    assert!(ok, "through the added node: {out}");
    s3.wait_line("storage-node session granted");
    let first = |host: u8, n: usize| std::fs::read(node_file(dir, host)).unwrap()[..n].to_vec();
    assert!(first(246, 131072).iter().all(|&b| b == 0x43), "c's bytes are on s3");
    assert!(first(149, 65536).iter().all(|&b| b == 0x42), "and b's stay on s2");
    assert!(!Cmd::new("nbdinfo").arg(at("b")).output().unwrap().status.success(), "b is gone");
    reads.stop();
    // s1 dropped while a uses it (gw.toml moves a to s3): both named, a keeps running over s1.
    let a_on_s3 = vol("a", "s3 = 1").replace("node_export = \"v\"", "node_export = \"a\"");
    gateway_config(dir, 247, &[("s3", s3.nbd)], &format!("{a_on_s3}{c}"));
    gw.signal("-HUP");
    gw.wait_line("reload: node s1 removed while export a uses it: needs a restart");
    gw.wait_line("reload: export a: size_mb, stripe_kb, widths, node_export or tenant changed: needs a restart");
    let (ok, out) = qemu_io_ok(&at("a"), &["read -P 0x41 0 1M"]);
    assert!(ok, "a runs over s1: {out}");
    // s4 at s1's address (another name for that server, as a start allows): added; no volume uses it,
    // and the next file drops it again.
    gateway_config(dir, 247, &[("s1", s1.nbd), ("s3", s3.nbd), ("s4", s1.nbd)], &format!("{a}{c}"));
    gw.signal("-HUP");
    gw.wait_line(&format!("reload: node s4 added at {}", s1.nbd));
    // s2 back, listed before s1 for a volume over both: s1 runs first, so refused; in order, added.
    let both = vol("d", "s1 = 1, s2 = 1").replace("node_export = \"v\"", "node_export = \"w\"");
    let file = gateway_config(dir, 247, &[("s2", s2.nbd), ("s1", s1.nbd), ("s3", s3.nbd)], &format!("{a}{c}{both}"));
    gw.signal("-HUP");
    // The file as given to --config is named (until 2026-12-07 every such error said "gw.toml").
    gw.wait_line(&format!("export d: {} lists its nodes as s2, s1, the gateway runs them as s1, s2", file.display()));
    gateway_config(dir, 247, &[("s1", s1.nbd), ("s2", s2.nbd), ("s3", s3.nbd)], &format!("{a}{c}{both}"));
    gw.signal("-HUP");
    gw.wait_line("reload: node s2 back (for volumes from now on)");
    gw.wait_line("reload: export d added");
    let (ok, out) = qemu_io_ok(&at("a"), &["read -P 0x41 0 1M"]);
    assert!(ok, "a kept its data: {out}");
    let log = gw.log.lock().unwrap().clone();
    assert!(!log.iter().any(|l| l.contains("node connection lost")), "{log:#?}");
}

/// docs/gateway.md, "Growing a volume onto new nodes": a node added by a reload with a volume of the same
/// tenant laid out over the old and the new node; nbdcopy copies the volume into it through the gateway,
/// and the copy reads back whole, part of it from the new node's export.
#[test]
fn a_volume_grows_onto_an_added_node_by_a_copy() {
    let tmp = tmpdir("gw-grow");
    let dir = tmp.path();
    let (s1, s2) = (storage_node(dir, 248), storage_node(dir, 249));
    let v = "[[tenants]]\nname = \"t\"\nreservation = 100\n\
             [[exports]]\nname = \"v\"\ntenant = \"t\"\nsize_mb = 8\nstripe_kb = 64\nwidths = { s1 = 1 }\n";
    let gw = gateway(&gateway_config(dir, 251, &[("s1", s1.nbd)], v));
    let src = dir.join("src.img");
    random_file(&src, 8 << 20, 57);
    let at = |name: &str| format!("nbd://{}/{name}", gw.nbd);
    run_ok(tool("nbdcopy").args([src.to_str().unwrap(), &at("v")]));
    let v2 = "[[exports]]\nname = \"v2\"\ntenant = \"t\"\nsize_mb = 8\nstripe_kb = 64\nwidths = { s1 = 1, s2 = 1 }\n\
              node_export = \"w\"\n";
    gateway_config(dir, 251, &[("s1", s1.nbd), ("s2", s2.nbd)], &format!("{v}{v2}"));
    gw.signal("-HUP");
    gw.wait_line("reload: export v2 added");
    run_ok(tool("nbdcopy").args([&at("v"), &at("v2")]));
    let back = dir.join("back.img");
    run_ok(tool("nbdcopy").args([&at("v2"), back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&back).unwrap(), "the copy reads back whole");
    // Units alternate s1, s2: v2's second unit is s2's first.
    let w = std::fs::read(dir.join("node249").join("data").join("w.img")).unwrap();
    assert_eq!(w[..UNIT as usize], std::fs::read(&src).unwrap()[UNIT as usize..2 * UNIT as usize]);
}

/// docs/gateway.md, "Growing a volume": two `rein serve` nodes whose file images (8 MiB, no `size_mb`)
/// hold a 16 MiB volume; a pattern near its end, on both nodes. size_mb raised to 32 with s2's image
/// not grown: the gateway's reload names s2, its export's size and what is needed there, and nbdinfo
/// still says 16 MiB. Both images grown (`truncate`), the nodes reloaded, the gateway reloaded: nbdinfo
/// (a new connection) says 32 MiB, the old pattern reads back, a write near the new end reads back and
/// lands on s2 past its old part (the stripe maps offsets whatever the size), the node sessions renewed
/// for the new size (a `rein serve` session keeps the size of its handshake); a connection opened
/// before keeps its 16 MiB (a read past them is refused) and reads on. A lowered size_mb needs a
/// restart, named as cutting off the data past the new end. Before, every one of these reloads said
/// `size_mb, stripe_kb, widths, node_export or tenant changed: needs a restart`.
#[test]
fn a_reload_grows_a_volume_over_grown_node_images() {
    let tmp = tmpdir("gw-grow-in-place");
    let dir = tmp.path();
    let hosts = [113u8, 114];
    let body = "capacity_iops = 100000\n[[exports]]\nname = \"v\"\n";
    let grow = |host: u8, mb: u64| {
        std::fs::OpenOptions::new().write(true).open(node_file(dir, host)).unwrap().set_len(mb << 20).unwrap()
    };
    let nodes: Vec<Server> = hosts
        .iter()
        .map(|&h| {
            let file = node_file(dir, h);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::File::create(file).unwrap().set_len(8 << 20).unwrap();
            serve_in(&dir.join(format!("node{h}")), &local(h), body)
        })
        .collect();
    let list = [("s1", nodes[0].nbd), ("s2", nodes[1].nbd)];
    let volume = |mb: u32| format!("[[exports]]\nname = \"v\"\nsize_mb = {mb}\nstripe_kb = 64\n");
    let gw = gateway(&gateway_config(dir, 250, &list, &volume(16)));
    let size = || run_ok(tool("nbdinfo").args(["--size", &uri(&gw)])).trim().to_string();
    let reloads = |s: &Server| s.log.lock().unwrap().iter().filter(|l| l.contains("configuration reloaded")).count();
    let reload = |s: &Server| {
        let before = reloads(s);
        s.signal("-HUP");
        assert!(eventually(Duration::from_secs(30), || reloads(s) > before), "{:#?}", s.log.lock().unwrap());
    };
    assert_eq!(size(), (16u64 << 20).to_string());
    // The last 4 KiB of the volume (on s2: units alternate s1, s2) and of the unit before it (on s1).
    let (end, before_end) = ((16u64 << 20) - 4096, (16u64 << 20) - UNIT - 4096);
    let mut old = Raw::connect(gw.nbd, "v");
    assert_eq!(write_at(&mut old, 1, end, 0xe1), 0);
    assert_eq!(write_at(&mut old, 2, before_end, 0xe2), 0);
    assert_eq!(flush_on(&mut old, 3), 0);
    // s1 grown, s2 not: refused, naming s2.
    grow(113, 16);
    reload(&nodes[0]);
    nodes[0].wait_line("export v opened again");
    gateway_config(dir, 250, &list, &volume(32));
    reload(&gw);
    let line = gw.wait_line("size_mb 32 needs");
    assert!(
        line.contains(
            "export v: size_mb 32 needs 16777216 bytes of node s2's export v, which has 8388608 (grow it on the node \
             first, then reload the gateway); the volume stays at size_mb 16"
        ),
        "{line}"
    );
    assert!(!line.contains("node s1"), "{line}");
    assert_eq!(size(), (16u64 << 20).to_string(), "the volume keeps its size");
    // s2 grown too: applied.
    grow(114, 16);
    reload(&nodes[1]);
    nodes[1].wait_line("export v opened again");
    reload(&gw);
    let line = gw.wait_line("export v: size_mb 16 -> 32");
    assert!(line.contains("for connections opened from now on"), "{line}");
    assert_eq!(size(), (32u64 << 20).to_string(), "a new connection sees the new size");
    let at = uri(&gw);
    let new_end = (32u64 << 20) - 4096;
    let (ok, out) = qemu_io_ok(
        &at,
        &[
            &format!("read -P 0xe1 {end} 4096"),
            &format!("read -P 0xe2 {before_end} 4096"),
            &format!("write -P 0xe3 {new_end} 4096"),
            &format!("read -P 0xe3 {new_end} 4096"),
            "flush",
        ],
    );
    assert!(ok, "the old bytes read back, and the new end takes a write: {out}");
    gw.wait_line("node session renewed for the volume's new size");
    // The new end lies on s2 past its old 8 MiB: its last 4 KiB of 16 MiB now.
    let s2 = std::fs::read(node_file(dir, 114)).unwrap();
    assert_eq!(s2.len(), 16 << 20);
    assert!(s2[(16 << 20) - 4096..].iter().all(|&b| b == 0xe3), "the new part lands after s2's old part");
    assert!(s2[(8 << 20) - 4096..8 << 20].iter().all(|&b| b == 0xe1), "the old part stays where it was");
    // The connection opened before keeps its size: reads its bytes, and is refused past its end.
    let (error, data) = read_at(&mut old, 4, end, 4096);
    assert_eq!((error, data.iter().all(|&b| b == 0xe1)), (0, true));
    old.send(rein_proto::nbd::Command::Read, 5, 16 << 20, 4096, &[]);
    assert_ne!(old.reply(0).1, 0, "past its 16 MiB");
    // Lowered: needs a restart, in its own words.
    gateway_config(dir, 250, &list, &volume(8));
    reload(&gw);
    gw.wait_line(
        "export v: size_mb lowered from 32 to 8: needs a restart, and the restart cuts off the volume's last 24 MiB",
    );
    assert_eq!(size(), (32u64 << 20).to_string());
}

/// `layout_file` (crates/rein-runtime/src/gateway/layouts.rs): the layouts a gateway runs are recorded,
/// and a start (or `--check-config`) with gw.toml's `[[nodes]]` reordered, which would lay the volume
/// out otherwise and scramble its data, is refused naming the volume and both layouts; with the order
/// back the data reads as written. A volume added by a reload is recorded too.
#[test]
fn a_start_that_would_lay_a_volume_out_otherwise_is_refused() {
    let tmp = tmpdir("gw-layouts");
    let dir = tmp.path();
    let (s1, s2) = (storage_node(dir, 252), storage_node(dir, 253));
    let top = "layout_file = \"layouts.json\"\n";
    let v = "[[exports]]\nname = \"v\"\nsize_mb = 8\nstripe_kb = 64\n";
    let in_order = [("s1", s1.nbd), ("s2", s2.nbd)];
    let cfg = gateway_config_with(dir, 221, top, &in_order, v);
    let gw = gateway(&cfg);
    let (ok, out) =
        qemu_io_ok(&format!("nbd://{}/v", gw.nbd), &["write -P 0x61 0 64k", "write -P 0x62 64k 64k", "flush"]);
    assert!(ok, "{out}");
    let w = "[[exports]]\nname = \"w\"\nsize_mb = 8\nwidths = { s2 = 1 }\nnode_export = \"w\"\n";
    gateway_config_with(dir, 221, top, &in_order, &format!("{v}{w}"));
    gw.signal("-HUP");
    gw.wait_line("reload: export w added");
    // A reload with v's stripe_kb changed names the restart it needs, which layout_file would refuse.
    let wider = format!("{v}{w}").replace("stripe_kb = 64", "stripe_kb = 128");
    gateway_config_with(dir, 221, top, &in_order, &wider);
    gw.signal("-HUP");
    gw.wait_line(
        "export v: size_mb, stripe_kb, widths, node_export or tenant changed: needs a restart; a restart with this \
         file is refused: layout_file records the layout it runs",
    );
    drop(gw);
    let recorded = std::fs::read_to_string(dir.join("layouts.json")).unwrap();
    assert!(recorded.contains("\"v\"") && recorded.contains("\"w\""), "{recorded}");
    // s2 before s1: v's units would swap places.
    let reordered = gateway_config_with(dir, 221, top, &[("s2", s2.nbd), ("s1", s1.nbd)], &format!("{v}{w}"));
    let want = format!(
        "export v: {} lays it out as 64 KiB units over s2 (export \"v\", width 1), s1 (export \"v\", width \
         1), its data was written as 64 KiB units over s1 (export \"v\", width 1), s2 (export \"v\", width 1)",
        reordered.display()
    );
    let restore = format!("restore {}'s [[nodes]] order", reordered.display());
    for err in [
        Rein::gateway(&reordered).env("REIN_LOG", "off").fails(),
        Rein::new(&["gateway", "--config", reordered.to_str().unwrap(), "--check-config"]).fails(),
    ] {
        assert!(err.contains(&want) && err.contains(&restore), "{err}");
        assert!(!err.contains("export w"), "w (on s2 alone) keeps its layout: {err}");
    }
    let back = gateway_config_with(dir, 221, top, &in_order, &format!("{v}{w}"));
    let out = run_ok(Cmd::new(env!("CARGO_BIN_EXE_rein")).args([
        "gateway",
        "--config",
        back.to_str().unwrap(),
        "--check-config",
    ]));
    assert!(out.contains("layouts.json: 2 volumes as recorded, 0 new"), "{out}");
    let gw = gateway(&back);
    let (ok, out) = qemu_io_ok(&format!("nbd://{}/v", gw.nbd), &["read -P 0x61 0 64k", "read -P 0x62 64k 64k"]);
    assert!(ok, "in order again, v reads as written: {out}");
    drop(gw);
    // A layout_file that is a FIFO is named, not waited on (a plain open waits for a writer for ever, and
    // held the start with it).
    assert!(Cmd::new("mkfifo").arg(dir.join("fifo")).status().unwrap().success());
    let fifo = gateway_config_with(dir, 221, "layout_file = \"fifo\"\n", &in_order, v);
    let err = Rein::new(&["gateway", "--config", fifo.to_str().unwrap(), "--check-config"]).fails();
    assert!(err.contains("fifo: cannot read it: it is a FIFO, not a regular file, so it is not read"), "{err}");
    // Without layout_file, --check-config warns that nothing checks v's layout (it said nothing).
    let unrecorded = gateway_config_with(dir, 221, "", &in_order, v);
    let out = run_ok(Cmd::new(env!("CARGO_BIN_EXE_rein")).args([
        "gateway",
        "--config",
        unrecorded.to_str().unwrap(),
        "--check-config",
    ]));
    assert!(out.contains("warning: layout_file is not set") && out.contains("(export v among them)"), "{out}");
}

/// qemu-io runs of `read` (twice each) over `uri` on a thread, from [`Reads::start`] to [`Reads::stop`]
/// and at least three: for reads that run through a reload, none of which may fail.
struct Reads {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Reads {
    fn start(uri: String, read: &str) -> Reads {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (until, read) = (stop.clone(), read.to_string());
        let thread = std::thread::spawn(move || {
            let mut rounds = 0;
            while !until.load(std::sync::atomic::Ordering::Relaxed) || rounds < 3 {
                let (ok, out) = qemu_io_ok(&uri, &[&read, &read]);
                assert!(ok, "a read through the reload failed: {out}");
                rounds += 1;
            }
        });
        Reads { stop, thread }
    }

    /// Stops the reads; panics if one failed.
    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("no read failed");
    }
}

/// A reload (SIGHUP) takes renewed TLS credentials on both sides of a gateway without a restart
/// (crates/rein-runtime/src/tls.rs, "Reload"). The PSK of the gateway's node links is rotated in place:
/// the nodes' key file and the gateway's get the new key and both reload; the same reload gives the
/// tenant a new spec, so every node session is renewed, over new connections, which succeed only with
/// the new key (the nodes no longer know the old one), and the data written before reads back. The
/// front's PSK file is rotated in the same reload: a TLS client with the new key is served, one with the
/// old key is not.
#[test]
fn a_reload_takes_renewed_node_and_front_credentials() {
    use common::tls::{make_ca, make_cert, server};
    let tmp = tmpdir("gw-tls-reload");
    let dir = tmp.path();
    make_ca(dir, "ca", "Rein test CA");
    for h in [135, 136] {
        make_cert(dir, "ca", &format!("n{h}"), &format!("node{h}"), &server(&format!("IP:127.0.0.{h}")));
    }
    let key =
        |seed: u8| (0..32u8).map(|i| format!("{:02x}", i.wrapping_mul(31).wrapping_add(seed))).collect::<String>();
    write_file(dir, "nodes.psk", &format!("gw-p:{}\n", key(3)));
    write_file(dir, "gw.psk", &format!("gw-p:{}\n", key(3)));
    write_file(dir, "front.psk", &format!("alice:{}\n", key(8)));
    let old_front = write_file(dir, "old-front.psk", &format!("alice:{}\n", key(8)));
    let new_front = write_file(dir, "new-front.psk", &format!("alice:{}\n", key(9)));
    let nodes = [tls_storage_node(dir, 135), tls_storage_node(dir, 136)];
    let config = |reservation: u32| {
        let mut text = format!(
            "{}\n{TIMES}[tls]\nmode = \"on\"\npsk_file = \"front.psk\"\n[node_tls]\npsk_file = \"gw.psk\"\n",
            local(137)
        );
        for (i, n) in nodes.iter().enumerate() {
            text.push_str(&format!("[[nodes]]\nname = \"s{}\"\naddress = \"{}\"\nprotocol = \"rein\"\n", i + 1, n.nbd));
        }
        text.push_str(&format!(
            "[[tenants]]\nname = \"c2\"\nreservation = {reservation}\n[[exports]]\nname = \"v\"\ntenant = \"c2\"\nsize_mb = 16\n"
        ));
        write_file(dir, "gw.toml", &text)
    };
    let gw = gateway(&config(100));
    let front = |psk: &Path| {
        tool("nbdinfo").arg(format!("nbds://alice@{}/v?tls-psk-file={}", gw.nbd, psk.display())).output().unwrap()
    };
    assert!(front(&old_front).status.success(), "the front with the first key");
    assert!(!front(&new_front).status.success(), "not with the next");
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x7a 0 512k", "flush"]);
    assert!(ok, "{out}");
    // The nodes first: they take the new key for new sessions (those up keep theirs).
    write_file(dir, "nodes.psk", &format!("gw-p:{}\n", key(5)));
    for n in &nodes {
        n.signal("-HUP");
        n.wait_line("reload: [tls]: new credentials");
    }
    // Then the gateway, with a new spec for c2: its node sessions are renewed over new connections.
    write_file(dir, "gw.psk", &format!("gw-p:{}\n", key(5)));
    std::fs::copy(&new_front, dir.join("front.psk")).unwrap();
    config(200);
    gw.signal("-HUP");
    gw.wait_line("configuration reloaded");
    gw.wait_line("reload: [node_tls]: new credentials");
    gw.wait_line("reload: [tls]: new credentials");
    for n in &nodes {
        let t0 = Instant::now();
        while node_spec(n.admin, "c2").0 != 200.0 {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no renewed session reached {}: {:#?}",
                n.nbd,
                gw.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read -P 0x7a 0 512k", "write -P 0x7b 512k 64k", "flush"]);
    assert!(ok, "over the renewed sessions: {out}");
    assert!(
        !gw.log.lock().unwrap().iter().any(|l| l.contains("node connection failed")),
        "{:#?}",
        gw.log.lock().unwrap()
    );
    assert!(front(&new_front).status.success(), "the front with the new key");
    assert!(!front(&old_front).status.success(), "not with the old one");
}

/// A storage node shutting down answers late pieces with NBD_ESHUTDOWN. The spec: "If the client receives
/// an `NBD_ESHUTDOWN` error it MUST initiate a soft disconnect", and it SHOULD first wait for its requests
/// in flight. The gateway does so: the late piece fails (EIO to the VM), the pieces queued at the node are
/// still answered, and the session ends with NBD_CMD_DISC (the node's log names it), not by the node
/// timing out or closing on the gateway.
#[test]
fn a_node_shutting_down_gets_the_gateways_soft_disconnect() {
    use rein_proto::nbd::Command;
    use std::io::Write;
    let tmp = tmpdir("gw-eshutdown");
    let dir = tmp.path();
    let mut node = storage_node_with(dir, 141, "shutdown_timeout_s = 20\n", "", STRICT_LIMITS);
    let times = TIMES.replace("request_timeout_s = 2", "request_timeout_s = 20");
    let gw = gateway(&limited_gateway_config(dir, 142, &times, &node, 2, 8));
    node.wait_line("storage-node session granted");
    let mut c = Raw::connect(gw.nbd, "v");
    // Three READs at 2 IOPS: one at once, two queued at the node (about 0.5 s and 1 s).
    let three: Vec<u8> = (0..3u64).flat_map(|h| Raw::header(Command::Read, h, 0, 4096)).collect();
    c.s.write_all(&three).unwrap();
    let (h, e, _) = c.reply(4096);
    assert_eq!((h, e), (0, 0));
    node.signal("-TERM");
    node.wait_log(&["shutting down"], Duration::from_secs(5));
    c.send(Command::Read, 10, 0, 4096, &[]);
    let mut got = std::collections::BTreeMap::new();
    for _ in 0..3 {
        let (h, e, _) = c.reply(4096);
        got.insert(h, e);
    }
    let eio = 5;
    assert_eq!(got, [(1, 0), (2, 0), (10, eio)].into(), "queued pieces answered, the late one failed");
    node.wait_log(&["NBD connection closed", "(NBD_CMD_DISC)"], Duration::from_secs(10));
    gw.wait_log(&["node connection lost", "the node is shutting down (NBD_ESHUTDOWN)"], Duration::from_secs(10));
    let _ = c.s.write_all(&Raw::header(Command::Disc, 11, 0, 0));
    node.terminate(Duration::from_secs(20));
}

/// A tenant's limit holds its pieces at a live node: they wait their turn, they do not time out. Twelve
/// 4 KiB READs pipelined to a tenant limited to 4 IOPS take about 3 s at its node, past the gateway's
/// 1 s `request_timeout_s`; the node answers one every 250 ms, so every READ succeeds. With a deadline
/// per piece (the old rule) the pieces queued behind the limit failed with EIO after 1 s.
#[test]
fn a_limited_tenants_deep_queue_is_throttled_not_failed() {
    use rein_proto::nbd::Command;
    use std::io::Write;
    let tmp = tmpdir("gw-throttled");
    let dir = tmp.path();
    let node = storage_node_with(dir, 151, "", "", STRICT_LIMITS);
    let times = TIMES.replace("request_timeout_s = 2", "request_timeout_s = 1");
    let gw = gateway(&limited_gateway_config(dir, 152, &times, &node, 4, 8));
    node.wait_line("storage-node session granted");
    let mut c = Raw::connect(gw.nbd, "v");
    let reads: Vec<u8> = (0..12u64).flat_map(|h| Raw::header(Command::Read, h, h * 4096, 4096)).collect();
    let start = std::time::Instant::now();
    c.s.write_all(&reads).unwrap();
    let mut errors = Vec::new();
    for _ in 0..12 {
        let (handle, error, _) = c.reply(4096);
        if error != 0 {
            errors.push((handle, error));
        }
    }
    let took = start.elapsed();
    assert!(errors.is_empty(), "every READ succeeds at the limited pace: failed {errors:?} after {took:?}");
    assert!(took >= Duration::from_millis(2000), "the limit held them back ({took:?}), past the 1 s timeout");
    let lost = gw.log.lock().unwrap().iter().any(|l| l.contains("node connection lost"));
    assert!(!lost, "the node session was never reset");
}

/// A gateway that did not run for a while (SIGSTOP here; a paused VM, a debugger, swapping) does not
/// blame its node for the replies that came meanwhile: 8 writes throttled at the node (20 IOPS, so they
/// are answered while the gateway is stopped), the gateway stopped 4 s against a request timeout of 1 s;
/// after SIGCONT every write succeeds, no node session is lost, and a FLUSH succeeds. Before, the
/// silence check ran before the replies waiting in the socket were read: all 8 failed with EIO and the
/// next FLUSH failed ("a node connection was lost").
#[test]
fn a_stalled_gateway_reads_its_nodes_replies_before_judging_them_silent() {
    use rein_proto::nbd::Command;
    let tmp = tmpdir("gw-stalled");
    let dir = tmp.path();
    let node = storage_node_with(dir, 153, "", "", STRICT_LIMITS);
    let times = TIMES.replace("request_timeout_s = 2", "request_timeout_s = 1");
    let gw = gateway(&limited_gateway_config(dir, 154, &times, &node, 20, 8));
    node.wait_line("storage-node session granted");
    let mut c = Raw::connect(gw.nbd, "v");
    c.s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for h in 0..8u64 {
        c.send(Command::Write, h, h * 4096, 4096, &[h as u8; 4096]);
    }
    std::thread::sleep(Duration::from_millis(100));
    gw.signal("-STOP");
    std::thread::sleep(Duration::from_secs(4));
    gw.signal("-CONT");
    let mut errors = Vec::new();
    for _ in 0..8 {
        let (handle, error, _) = c.reply(0);
        if error != 0 {
            errors.push((handle, error));
        }
    }
    assert!(errors.is_empty(), "writes failed after the stall: {errors:?}");
    c.send(Command::Flush, 99, 0, 0, &[]);
    assert_eq!(c.reply(0), (99, 0, vec![]), "the FLUSH after the stall");
    let lost = gw.log.lock().unwrap().iter().any(|l| l.contains("node connection lost"));
    assert!(!lost, "a node session was reset: {:#?}", gw.log.lock().unwrap());
}

/// The gateway's HTTP endpoint is guarded as rein serve's (an adversarial review opened 20,000 idle
/// connections to it: the gateway ran out of descriptors and NBD accepts failed): a bearer token for
/// everything but `/healthz`, a non-loopback address refused without one, and a cap with an idle timeout
/// (two idle connections at `max_admin_connections = 2` hold a third client only until they time out).
#[test]
fn the_gateway_admin_endpoint_is_guarded_as_rein_serves() {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let tmp = tmpdir("gw-admin");
    let dir = tmp.path();
    let n = node(dir, 161, 0);
    let token = write_file(dir, "admin.token", "s3cret\n");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = |admin: &str, keys: &str| {
        format!(
            "listen = \"127.0.0.162:0\"\nadmin = \"{admin}\"\n{keys}{TIMES}[[nodes]]\nname = \"s1\"\naddress = \"{}\"\n\
             [[exports]]\nname = \"v\"\nsize_mb = 8\n",
            n.nbd
        )
    };
    let keys = "admin_token_file = \"admin.token\"\nmax_admin_connections = 2\nadmin_idle_timeout_s = 0.5\n";
    let gw = gateway_in(dir, &text("127.0.0.162:0", keys));
    assert_eq!(common::http(gw.admin, "GET", "/metrics", "", "").0, 401);
    let (code, _, body) = common::http(gw.admin, "GET", "/metrics", "Authorization: Bearer s3cret\r\n", "");
    assert!(code == 200 && body.contains("rein_gateway"), "{code} {body}");
    let mut idle: Vec<std::net::TcpStream> = (0..2).map(|_| std::net::TcpStream::connect(gw.admin).unwrap()).collect();
    let (code, _, body) = common::http(gw.admin, "GET", "/healthz", "", "");
    assert_eq!((code, body.as_str()), (200, "ok\n"), "served once the idle connections timed out");
    for c in &mut idle {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(c.read(&mut b).unwrap_or(0), 0, "the idle connection was closed by the gateway");
    }
    let exposed = write_file(dir, "exposed.toml", &text("0.0.0.0:0", ""));
    let err = Rein::gateway(&exposed).env("REIN_LOG", "off").fails();
    assert!(err.contains("is not a loopback address and no admin_token_file is set"), "{err}");
}

/// The gateway's shutdown keeps its deadline when its nodes hold its pieces. Ten 8 MiB READs to a tenant
/// limited to 2 IOPS are 1,280 pieces (64 KiB units) at its one node: more than a node connection takes
/// (1,024), so the front connection waits to hand over the rest, and the node answers 2 a second. With
/// `shutdown_timeout_s = 1` the gateway exits within a few seconds of SIGTERM; it used to wait for the
/// node's answers (minutes here).
#[test]
fn the_gateways_shutdown_keeps_its_deadline_when_its_nodes_hold_its_pieces() {
    use rein_proto::nbd::Command;
    use std::io::Write;
    let tmp = tmpdir("gw-deadline");
    let dir = tmp.path();
    let node = storage_node_with(dir, 171, "", "", STRICT_LIMITS);
    let times = format!("{TIMES}shutdown_timeout_s = 1\n");
    let mut gw = gateway(&limited_gateway_config(dir, 172, &times, &node, 2, 32));
    node.wait_line("storage-node session granted");
    let mut c = Raw::connect(gw.nbd, "v");
    let reads: Vec<u8> = (0..10u64).flat_map(|h| Raw::header(Command::Read, h, (h % 4) * (8 << 20), 8 << 20)).collect();
    c.s.write_all(&reads).unwrap();
    eventually(Duration::from_secs(10), || completed(node.admin, "c2") >= 2);
    let took = gw.terminate(Duration::from_secs(20));
    assert!(took < Duration::from_secs(8), "the gateway exited {took:?} after SIGTERM (deadline 1 s)");
    gw.wait_log(&["connections still waiting for their nodes: cut"], Duration::from_secs(1));
}

/// A gateway that stops ends its node sessions with NBD_CMD_DISC, as the NBD spec asks of a client (the
/// nodes used to see the connections just close).
#[test]
fn a_stopping_gateway_disconnects_from_its_nodes() {
    let tmp = tmpdir("gw-disc");
    let (nodes, mut gw) = three_nodes_and_gateway(tmp.path(), 181);
    let (ok, out) = qemu_io_ok(&uri(&gw), &["write -P 0x31 0 256k", "read -P 0x31 0 256k"]);
    assert!(ok, "{out}");
    gw.terminate(Duration::from_secs(20));
    for n in &nodes {
        n.wait_log(&["NBD connection closed", "(NBD_CMD_DISC)"], Duration::from_secs(5));
    }
}

/// A node that keeps refusing the gateway's reconnects says why in the log (it used to be silent after
/// the first loss: the review saw 84 failed attempts in 20 s and no line). Here the node is down at
/// start, then comes up with an export too small for the volume: each attempt fails, and the log names
/// the cause.
#[test]
fn failed_reconnects_are_logged_with_their_cause() {
    let tmp = tmpdir("gw-reconnect-log");
    let dir = tmp.path();
    let s1 = free_tcp("127.0.0.191");
    let gw = gateway(&gateway_config(dir, 192, &[("s1", s1)], "[[exports]]\nname = \"v\"\nsize_mb = 8\n"));
    gw.wait_line("node unreachable at start");
    let head = format!("listen = \"{s1}\"\nadmin = \"127.0.0.191:0\"");
    let _small = serve_in(&dir.join("small"), &head, "[[exports]]\nname = \"v\"\nsize_mb = 1\n");
    let line = gw.wait_log(&["node connection failed", "is 1048576 bytes"], Duration::from_secs(20));
    assert!(line.contains("s1") && line.contains("attempts"), "{line}");
}

/// A node at the gateway's own front (a typo for a node's port on a shared host, `--listen` on a node's
/// address, or the front's Unix socket) is refused, by `--check-config` and by a start, naming the node
/// and the address. Before, the gateway started, connected to itself once it listened (`node connection
/// restored`), and each request came back through its own front, nested 257 deep, until
/// request_timeout_s failed them all with EIO.
#[test]
fn a_node_at_the_gateways_own_front_is_refused() {
    let tmp = tmpdir("gw-self");
    let dir = tmp.path();
    let front = free_tcp("127.0.0.194");
    let export = "[[exports]]\nname = \"v\"\nsize_mb = 8\n";
    let node = |address: &str| format!("[[nodes]]\nname = \"s1\"\naddress = \"{address}\"\n{export}");
    let own = format!("this gateway's own front ({front})");
    let same = write_file(dir, "same.toml", &format!("listen = \"{front}\"\n{}", node(&front.to_string())));
    let other = write_file(dir, "other.toml", &format!("listen = \"127.0.0.194:0\"\n{}", node(&front.to_string())));
    let (same, other) = (same.to_str().unwrap(), other.to_str().unwrap());
    let front = front.to_string();
    for (args, says) in [
        (vec!["gateway", "--config", same, "--check-config"], own.as_str()),
        (vec!["gateway", "--config", same], &own),
        (vec!["gateway", "--config", other, "--listen", &front, "--check-config"], &own),
    ] {
        let err = Rein::new(&args).env("REIN_LOG", "off").fails();
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line: {err}");
        assert!(lines[0].contains("node s1") && lines[0].contains(says), "{args:?}: {err}");
    }
    let unix = format!("listen = \"127.0.0.194:0\"\nlisten_unix = \"gw.sock\"\n{}", node("unix:gw.sock"));
    let unix = write_file(dir, "unix.toml", &unix);
    let err = Rein::new(&["gateway", "--config", unix.to_str().unwrap(), "--check-config"]).fails();
    assert!(err.contains("node s1") && err.contains("this gateway's own front") && err.contains("gw.sock"), "{err}");
}

/// A node unreachable at start is named once, by the start's line: the reconnects that fail for the same
/// reason say nothing more until the reason changes. Here the node takes TCP connections and never greets
/// (the test accepts them, which counts the gateway's attempts), then goes away: the start's line names
/// the silent handshake, the failed reconnects of the three pooled connections add nothing for it, and
/// the next cause (the connections cut) is logged. Before, each pooled connection's first failed
/// reconnect logged the start's cause again: four lines for one cause.
#[test]
fn a_node_down_at_start_is_named_once_until_its_cause_changes() {
    let tmp = tmpdir("gw-down-once");
    let silent = std::net::TcpListener::bind("127.0.0.198:0").unwrap();
    silent.set_nonblocking(true).unwrap();
    let addr = silent.local_addr().unwrap();
    let body = "[[exports]]\nname = \"v\"\nsize_mb = 8\n";
    let gw = gateway(&gateway_config_with(tmp.path(), 199, "connections_per_node = 3\n", &[("s1", addr)], body));
    gw.wait_line("node unreachable at start");
    // The start's attempt, each connection's first reconnect (which then times out as the start's did), and
    // each one's second: the failures of the first reconnects were handled (and logged, or not) by then.
    let mut held = Vec::new();
    common::wait_for(
        "the gateway's attempts",
        Duration::from_secs(30),
        || {
            while let Ok((sock, _)) = silent.accept() {
                held.push(sock);
            }
            held.len()
        },
        |&n| n >= 7,
    );
    drop((held, silent));
    let changed = |l: &String| l.contains("node connection failed") && !l.contains("did not finish");
    common::wait_for("the next cause", Duration::from_secs(30), || gw.log.lock().unwrap().iter().any(changed), |&c| c);
    let log = gw.log.lock().unwrap();
    let silent = log.iter().filter(|l| l.contains("did not finish the NBD handshake")).count();
    assert_eq!(silent, 1, "{log:#?}");
}

/// A node that was down and came back is "restored" once: a later new session (here the hello again with
/// a tenant's new spec, after a reload) is not logged as a restore. Before, every session after an outage
/// said `node connection restored` again (the review saw it after each SIGHUP that changed a spec).
#[test]
fn a_node_restored_once_is_not_restored_again_at_each_new_session() {
    let tmp = tmpdir("gw-restored-once");
    let dir = tmp.path();
    let s1 = free_tcp("127.0.0.196");
    let head = format!("{}\n{TIMES}[[nodes]]\nname = \"s1\"\naddress = \"{s1}\"\nprotocol = \"rein\"\n", local(197));
    let volume = |limit: u32| {
        format!(
            "[[tenants]]\nname = \"c2\"\nlimit = {limit}\n[[exports]]\nname = \"v\"\ntenant = \"c2\"\nsize_mb = 8\n"
        )
    };
    let gw = gateway(&write_file(dir, "gw.toml", &format!("{head}{}", volume(1000))));
    gw.wait_line("node unreachable at start");
    let body = format!(
        "capacity_iops = 100000\nscheduler = \"dmclock\"\n[node]\nenabled = true\nspecs = \"gateway\"\n\
         [[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\n"
    );
    let _node = serve_in(&dir.join("node"), &format!("listen = \"{s1}\"\nadmin = \"127.0.0.196:0\""), &body);
    gw.wait_line("node connection restored");
    write_file(dir, "gw.toml", &format!("{head}{}", volume(2000)));
    gw.signal("-HUP");
    gw.wait_line("node session renewed with the tenant's new spec");
    // A client's connection after the renewal: its lines come after any the renewal logged.
    let (ok, out) = qemu_io_ok(&uri(&gw), &["read 0 4k"]);
    assert!(ok, "{out}");
    gw.wait_line("NBD connection closed");
    let log = gw.log.lock().unwrap();
    let restored = log.iter().filter(|l| l.contains("node connection restored")).count();
    assert_eq!(restored, 1, "{log:#?}");
}

/// Pieces the gateway sent to its nodes so far (all volumes and nodes), from its /metrics.
fn pieces_sent(admin: SocketAddr) -> u64 {
    let (status, _, body) = common::http(admin, "GET", "/metrics", "", "");
    assert_eq!(status, 200);
    body.lines()
        .filter(|l| l.starts_with("rein_gateway_node_pieces_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// A TRIM or WRITE_ZEROES carries no payload, so the gateway sends one node request per node however
/// large it is (a node's part of any range is contiguous): discarding the whole 64 MiB volume (qemu sends
/// it as two 32 MiB requests, its NBD request size) is at most 6 node requests, not 1,024 (the review's
/// 512 MiB TRIMs were 8,192 pieces each). The bytes are right: the zeroed range reads as zeroes across
/// unit boundaries, its neighbours keep their data, and after the discard the volume reads as zeroes.
#[test]
fn trim_and_write_zeroes_are_one_piece_per_node() {
    let tmp = tmpdir("gw-trim");
    let (_nodes, gw) = three_nodes_and_gateway(tmp.path(), 195);
    let uri = uri(&gw);
    let (ok, out) = qemu_io_ok(&uri, &["write -P 0x5a 0 1m"]);
    assert!(ok, "{out}");
    let (ok, out) = qemu_io_ok(
        &uri,
        &["write -z 100k 300k", "read -P 0x5a 0 100k", "read -P 0 100k 300k", "read -P 0x5a 400k 624k"],
    );
    assert!(ok, "{out}");
    let before = pieces_sent(gw.admin);
    let (ok, out) = qemu_io_ok(&uri, &["discard 0 64m"]);
    assert!(ok, "{out}");
    let sent = pieces_sent(gw.admin) - before;
    assert!((3..=6).contains(&sent), "node requests for the whole-volume discard: {sent}");
    let (ok, out) = qemu_io_ok(&uri, &["read -P 0 0 1m"]);
    assert!(ok, "{out}");
}

/// A gateway passes WRITE_ZEROES's NO_HOLE to its nodes: zeroing the whole volume with NO_HOLE (qemu-io
/// `write -z`) leaves the nodes' files allocated, and without it (`write -z -u`, may unmap) punches their
/// holes, as a node does for its own clients (before, the flag was dropped and every node allocated).
#[test]
fn write_zeroes_keeps_no_hole_on_its_way_to_the_nodes() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tmpdir("gw-zeroes");
    let (_nodes, gw) = three_nodes_and_gateway(tmp.path(), 160);
    let uri = uri(&gw);
    let allocated = || -> u64 {
        (160..163u8)
            .map(|h| {
                let f = node_file(tmp.path(), h);
                std::fs::File::open(&f).unwrap().sync_all().unwrap();
                std::fs::metadata(&f).unwrap().blocks() * 512
            })
            .sum()
    };
    let (ok, out) = qemu_io_ok(&uri, &["write -P 0x5a 0 16m"]);
    assert!(ok, "{out}");
    let full = allocated();
    assert!(full >= 16 << 20, "{full} bytes allocated on the nodes");
    let (ok, out) = qemu_io_ok(&uri, &["write -z 0 8m", "read -P 0 0 8m"]);
    assert!(ok, "{out}");
    assert!(allocated() >= 16 << 20, "NO_HOLE kept the nodes' ranges allocated: {} bytes", allocated());
    let (ok, out) = qemu_io_ok(&uri, &["write -z -u 8m 8m", "read -P 0 0 16m"]);
    assert!(ok, "{out}");
    let after = allocated();
    assert!(after <= full - (8 << 20), "may-unmap zeroing punched the nodes' 8 MiB: {full} -> {after} bytes");
}

/// A node that takes the TCP connection but never greets is told apart from one that cannot be reached:
/// the gateway starts (its pieces fail with EIO until it answers) and the log says the handshake did not
/// finish, not that there was no connection.
#[test]
fn a_node_that_never_greets_is_named_as_such() {
    let tmp = tmpdir("gw-silent");
    let silent = std::net::TcpListener::bind("127.0.0.197:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let gw = gateway(&gateway_config(tmp.path(), 198, &[("s1", addr)], "[[exports]]\nname = \"v\"\nsize_mb = 8\n"));
    let line = gw.wait_line("node unreachable at start");
    assert!(line.contains("did not finish the NBD handshake within connect_timeout_s (2 s)"), "{line}");
    drop(silent);
}

/// Out of file descriptors at start (`ulimit -n 40`, 60 volumes on one node), a node connection's failure
/// says it is this gateway's limit, not the node (it said only "node unreachable ... Too many open files").
#[test]
fn running_out_of_descriptors_is_named_as_such() {
    let tmp = tmpdir("gw-emfile");
    let closed = free_tcp("127.0.0.189");
    let body: String = (0..60).map(|i| format!("[[exports]]\nname = \"v{i}\"\nsize_mb = 1\n")).collect();
    let cfg = gateway_config(tmp.path(), 188, &[("s1", closed)], &body);
    let gw = Rein::gateway(&cfg).nofile(40).start();
    let line = gw.wait_line("out of file descriptors");
    assert!(line.contains("raise its open-file limit"), "{line}");
}

/// A reload that opens volumes on a silent node (5 of them, a connect timeout of 2 s each) runs beside the
/// accept loop: a client of a running volume is served meanwhile (before, it waited for the whole reload:
/// 19 s for 10 such volumes), and the reload still completes, its new volumes opened together as at start
/// (one after another it took 5 x 2 s).
#[test]
fn a_reload_waiting_for_a_silent_node_does_not_hold_new_connections() {
    let tmp = tmpdir("gw-reload-silent");
    let node = storage_node(tmp.path(), 194);
    let silent = std::net::TcpListener::bind("127.0.0.193:0").unwrap();
    let mut head = format!("{}\n{TIMES}", local(192));
    head.push_str(&format!("[[nodes]]\nname = \"s1\"\naddress = \"{}\"\nprotocol = \"rein\"\n", node.nbd));
    head.push_str(&format!("[[nodes]]\nname = \"s2\"\naddress = \"{}\"\n", silent.local_addr().unwrap()));
    let v = "[[exports]]\nname = \"v\"\nsize_mb = 8\nwidths = { s1 = 1, s2 = 0 }\n";
    let cfg = write_file(tmp.path(), "gw.toml", &format!("{head}{v}"));
    let gw = gateway(&cfg);
    let info = || run_ok(tool("nbdinfo").arg(format!("nbd://{}/v", gw.nbd)));
    assert!(info().contains("export-size: 8388608"));
    let on_silent: String =
        (0..5).map(|i| format!("[[exports]]\nname = \"w{i}\"\nsize_mb = 8\nwidths = {{ s1 = 0, s2 = 1 }}\n")).collect();
    write_file(tmp.path(), "gw.toml", &format!("{head}{v}{on_silent}"));
    let hup = Instant::now();
    gw.signal("-HUP");
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    assert!(info().contains("export-size: 8388608"));
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "a client waited {took:?} for the reload");
    gw.wait_log(&["configuration reloaded"], Duration::from_secs(30));
    let reload = hup.elapsed();
    assert!(reload < Duration::from_secs(7), "the reload took {reload:?} (5 volumes one after another: 10 s)");
    drop(silent);
}

/// A node that accepts and never greets costs a volume's start one connect timeout (2 s here), paid by the
/// volumes together: 8 volumes on it listen in well under 8 x 2 s (one after another: 16 s), and a SIGTERM
/// while they open stops the gateway at once (before, it was heard only once the gateway listened: 1,024
/// volumes on such a node took 85 min that could not be cut short).
#[test]
fn volumes_open_together_and_a_stop_during_the_start_is_heard() {
    let tmp = tmpdir("gw-silent-start");
    let silent = std::net::TcpListener::bind("127.0.0.196:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let body: String = (0..8).map(|i| format!("[[exports]]\nname = \"v{i}\"\nsize_mb = 8\n")).collect();
    let cfg = gateway_config(tmp.path(), 195, &[("s1", addr)], &body);
    let t0 = Instant::now();
    let gw = gateway(&cfg);
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(10), "listening after {took:?}");
    drop(gw);
    let mut child = Rein::gateway(&cfg).spawn();
    std::thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    Cmd::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    while signalled.elapsed() < Duration::from_secs(20) && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = signalled.elapsed();
    let _ = child.kill(); // still running after 20 s: the test fails below
    let status = child.wait().unwrap();
    let mut log = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut log).unwrap();
    assert!(status.success(), "{status:?} after {after:?}: {log}");
    assert!(after < Duration::from_secs(1), "stopped {after:?} after SIGTERM: {log}");
    assert!(log.contains("stopped while opening the volumes' node connections"), "{log}");
    drop(silent);
}

/// As for `rein serve` (`a_sigterm_right_after_listening_is_a_graceful_stop` in tests/serve.rs): a
/// SIGTERM sent the moment the gateway says it is listening stops it gracefully (status 0, the shutdown
/// logged), not by the signal's default action (the old code lost this race less often for the gateway
/// than for rein serve: 1 in 20 tries by hand). Its one node is down: the gateway starts anyway, and
/// stops at once. It used to wait out the 2 s it gives a node to take its DISC, for a node it had no
/// session with (each try took 2.0 s).
#[test]
fn a_sigterm_right_after_the_gateway_listens_is_a_graceful_stop() {
    for i in 0..5u8 {
        let dir = tmpdir("gw-sigterm-at-once");
        let s1 = free_tcp("127.0.0.125");
        let volume = "[[exports]]\nname = \"v\"\nsize_mb = 4\nstripe_kb = 64\nwidths = { s1 = 1 }\n";
        let config = gateway_config(dir.path(), 126, &[("s1", s1)], volume);
        let (status, log, took) = Rein::gateway(&config).term_at_listening();
        assert!(status.success() && log.contains("shutting down"), "try {i}: {status:?}\n{log}");
        assert!(took < Duration::from_millis(1500), "try {i}: stopped {took:?} after the SIGTERM\n{log}");
    }
}

/// Nodes on this host over Unix sockets (`address = "unix:PATH"`, the nodes' `listen_unix`), and the
/// gateway's front on one too (`listen_unix`): qemu-img in over the front's socket, nbdcopy out over
/// TCP, byte-identical, with the bytes where the stripe equation puts them; each node grants the
/// storage-node session to a Unix peer. A node killed with SIGKILL leaves its socket file behind: the
/// restarted node replaces it and the gateway reconnects.
#[test]
fn nodes_and_the_front_over_unix_sockets() {
    let dir = tmpdir("gw-unix");
    let d = dir.path();
    let sock = |h: u8| d.join(format!("node{h}")).join("nbd.sock");
    let start = |h: u8| storage_node_with(d, h, "listen_unix = \"nbd.sock\"\n", "", "");
    let mut nodes: Vec<Server> = (171..=173).map(start).collect();
    let mut body = String::new();
    for (i, h) in (171..=173).enumerate() {
        body.push_str(&format!(
            "[[nodes]]\nname = \"s{}\"\naddress = \"unix:{}\"\nprotocol = \"rein\"\n",
            i + 1,
            sock(h).display()
        ));
    }
    let gw = gateway_in(d, &format!("{}\nlisten_unix = \"gw.sock\"\n{TIMES}{body}{VOLUME}", local(174)));
    for n in &nodes {
        let granted = n.wait_line("storage-node session granted");
        assert!(granted.contains("peer=unix(uid "), "{granted}");
    }
    let front = format!("nbd+unix:///v?socket={}", d.join("gw.sock").display());
    let src = d.join("src.bin");
    random_file(&src, 4 << 20, 9);
    run_ok(tool("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw", src.to_str().unwrap(), &front]));
    let back = d.join("back.bin");
    run_ok(tool("nbdcopy").args([&uri(&gw), back.to_str().unwrap()]));
    let written = std::fs::read(&src).unwrap();
    assert_eq!(written[..], std::fs::read(&back).unwrap()[..4 << 20], "in over the Unix front, out over TCP");
    let files: Vec<Vec<u8>> = (171..=173).map(|h| std::fs::read(node_file(d, h)).unwrap()).collect();
    for o in (0..written.len() as u64).step_by(4093) {
        let (j, at) = expected_location(o);
        assert_eq!(files[j][at as usize], written[o as usize], "volume byte {o} on node {j} at {at}");
    }
    // s2 killed: its socket file stays, stale. Restarted, it replaces the file; the gateway reconnects.
    let mut s2 = nodes.remove(1);
    s2.child.kill().unwrap();
    s2.child.wait().unwrap();
    assert!(sock(172).exists(), "SIGKILL leaves the socket file");
    let s2 = start(172);
    s2.wait_line("removed a stale Unix socket");
    assert!(
        eventually(Duration::from_secs(20), || qemu_io_ok(&front, &["read 0 256k"]).0),
        "the gateway serves again after the node returned: {:?}",
        gw.log.lock().unwrap()
    );
    gw.wait_line("node connection restored");
    let (ok, out) = qemu_io_ok(&front, &["write -P 0x5a 0 256k", "read -P 0x5a 0 256k", "flush"]);
    assert!(ok, "{out}");
}

/// Before: SIGHUP read gw.toml on the gateway's event loop; with a FIFO in its place (or a hung mount)
/// the open blocked it: new clients hung and SIGTERM was ignored. Now the file is read on a thread of its
/// own: clients are served meanwhile and SIGTERM stops the gateway at once.
#[test]
fn a_reload_whose_file_never_reads_blocks_neither_clients_nor_sigterm() {
    let dir = tmpdir("gw-fifo");
    let n = node(dir.path(), 154, 0);
    let cfg =
        gateway_config(dir.path(), 155, &[("s1", n.nbd)], "[[exports]]\nname = \"v\"\nsize_mb = 16\nstripe_kb = 64\n");
    let mut gw = gateway(&cfg);
    let _writer = common::fifo_in_place_of(&cfg);
    gw.signal("-HUP");
    std::thread::sleep(Duration::from_millis(300));
    let open = common::nbd_open(gw.nbd, "v", true, Duration::from_secs(5));
    assert!(open.is_ok_and(|o| o.size == 16 << 20), "a client is not served while gw.toml is read");
    let took = gw.terminate(Duration::from_secs(5));
    assert!(took < Duration::from_secs(3), "SIGTERM took {took:?}");
    gw.wait_line(&format!("{} is still being read for a reload; that reload is abandoned", cfg.display()));
}

/// A node that completes every handshake and closes the connection at once (broken, or hostile) cannot
/// flood the gateway's log nor draw reconnects as fast as it answers: the link backs off as after failed
/// attempts (a session that ends within `reconnect_max_backoff_ms`, and at least a second, does not
/// count as restored), and each loss of the same reason is logged once per minute, its "restored" line
/// with it. Before, every session reset the backoff to 50 ms and logged two lines: 12 sessions in about
/// half a second, 23 lines.
#[test]
fn a_node_that_closes_after_every_handshake_is_not_a_log_flood() {
    use rein_proto::nbd::{ExportInfo, ServerHandshake, ServerProgress};
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let tmp = tmpdir("gw-flapping-node");
    let listener = std::net::TcpListener::bind("127.0.0.205:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (sessions, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let node = {
        let (sessions, stop, times) = (sessions.clone(), stop.clone(), times.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let export = ExportInfo {
                    name: "v".into(),
                    description: String::new(),
                    size: 8 << 20,
                    read_only: false,
                    volatile: false,
                    min_block: 1,
                };
                let mut out = Vec::new();
                let mut hs = ServerHandshake::new(vec![export], &mut out);
                let mut input = Vec::new();
                let done = loop {
                    if conn.write_all(&out).is_err() {
                        break false;
                    }
                    out.clear();
                    let mut chunk = [0u8; 4096];
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => break false,
                        Ok(n) => input.extend_from_slice(&chunk[..n]),
                    }
                    match hs.feed(&input, &mut out) {
                        Ok((used, progress)) => {
                            input.drain(..used);
                            if let ServerProgress::Done(_) = progress {
                                break conn.write_all(&out).is_ok();
                            }
                        }
                        Err(_) => break false,
                    }
                };
                if done {
                    times.lock().unwrap().push(Instant::now());
                    sessions.fetch_add(1, Ordering::Relaxed);
                }
                // Dropped: closed right after the handshake.
            }
        })
    };
    let node_keys =
        "[[nodes]]\nname = \"s1\"\naddress = \"ADDR\"\nprotocol = \"nbd\"\n".replace("ADDR", &addr.to_string());
    let text = format!(
        "listen = \"127.0.0.206:0\"\nadmin = \"127.0.0.206:0\"\n{TIMES}{node_keys}[[exports]]\nname = \"v\"\nsize_mb = 8\n"
    );
    let gw = gateway_in(tmp.path(), &text);
    common::wait_for("12 sessions", Duration::from_secs(10), || sessions.load(Ordering::Relaxed), |&n| n >= 12);
    let lines = |what: &str| gw.log.lock().unwrap().iter().filter(|l| l.contains(what)).count();
    let (lost, restored) = (lines("node connection lost"), lines("node connection restored"));
    assert!(lost >= 1, "the first loss is logged: {:#?}", gw.log.lock().unwrap());
    assert!(lost <= 2 && restored <= 2, "{lost} lost and {restored} restored lines for 12 sessions");
    // Backoff 50, 100, then 200 ms (reconnect_max_backoff_ms) between sessions: 1.95 s at least.
    let t = times.lock().unwrap().clone();
    assert!(t[11] - t[0] >= Duration::from_secs(1), "12 sessions in {:?}", t[11] - t[0]);
    drop(gw);
    stop.store(true, Ordering::Relaxed);
    let _ = std::net::TcpStream::connect(addr);
    node.join().unwrap();
}

/// Failed handshakes cannot flood the gateway's log: 300 connections that send junk for a handshake are
/// each cut, and logged at most once a second (`NBD handshake failed`, the next line with `unlogged=N`).
/// Before, each logged a line, as fast as a client could connect.
#[test]
fn failed_handshakes_do_not_flood_the_gateways_log() {
    use std::io::{Read, Write};
    let tmp = tmpdir("gw-handshake-flood");
    let dir = tmp.path();
    let n = node(dir, 202, 0);
    let gw = gateway(&gateway_config(dir, 203, &[("s1", n.nbd)], "[[exports]]\nname = \"v\"\nsize_mb = 8\n"));
    let junk = |gw: &Server| {
        let mut c = common::connect_from("127.0.0.204", gw.nbd);
        let mut greeting = [0u8; 18];
        c.read_exact(&mut greeting).unwrap();
        let _ = c.write_all(b"\0\0\0\x01this is no NBD option");
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
    };
    for _ in 0..300 {
        junk(&gw);
    }
    let logged = || gw.log.lock().unwrap().iter().filter(|l| l.contains("NBD handshake failed")).count();
    common::wait_for("the first failure logged", Duration::from_secs(5), logged, |&k| k >= 1);
    assert!(logged() <= 5, "{} lines for 300 failed handshakes", logged());
    let line = gw.wait_unlogged("NBD handshake failed", || junk(&gw));
    assert!(line.contains("protocol"));
}

/// The front and the admin endpoint are bound before the node handshakes: with either port in use the
/// start fails naming it, without waiting for a node that takes connections and never greets (its
/// `connect_timeout_s` is an hour here; before, the port was reported only after it).
#[test]
fn a_busy_port_fails_the_start_before_the_node_handshakes() {
    let tmp = tmpdir("gw-busy-port");
    let silent = std::net::TcpListener::bind("127.0.0.241:0").unwrap();
    let node = silent.local_addr().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.242:0").unwrap();
    let taken = busy.local_addr().unwrap();
    let tail = format!(
        "connect_timeout_s = 3600\n[[nodes]]\nname = \"s1\"\naddress = \"{node}\"\n\
         [[exports]]\nname = \"v\"\nsize_mb = 8\n"
    );
    for (head, what) in [
        (format!("listen = \"{taken}\"\n"), format!("{taken}")),
        (format!("listen = \"127.0.0.243:0\"\nadmin = \"{taken}\"\n"), format!("{taken}")),
    ] {
        let cfg = write_file(tmp.path(), "gw.toml", &format!("{head}{tail}"));
        let err = Rein::gateway(&cfg).env("REIN_LOG", "off").fails();
        assert!(err.contains(&what) && err.contains("Address already in use"), "{err}");
    }
    drop((silent, busy));
}

/// One node's outage is logged for the node, not for each volume and pooled connection: three volumes
/// with two connections each on one node (six connections), the node killed and started again, log its
/// loss and its failed reconnects once per reason, and one "restored" line counting the six connections
/// of the three volumes. Before, each connection logged its loss, its first failed reconnect and its
/// restore: 18 lines.
#[test]
fn a_node_outage_is_logged_for_the_node_not_for_each_connection() {
    let tmp = tmpdir("gw-outage-lines");
    let dir = tmp.path();
    let exports: String =
        (0..3).map(|i| format!("[[exports]]\nname = \"v{i}\"\nbackend = \"memory\"\nsize_mb = 8\n")).collect();
    let node_body = format!("capacity_iops = 100000\n{exports}");
    let node_head = |port: u16| format!("listen = \"127.0.0.244:{port}\"\nadmin = \"127.0.0.244:0\"");
    let node = serve_in(&dir.join("node"), &node_head(0), &node_body);
    let addr = node.nbd;
    let volumes: String = (0..3).map(|i| format!("[[exports]]\nname = \"v{i}\"\nsize_mb = 8\n")).collect();
    let gw = gateway(&gateway_config_with(dir, 245, "connections_per_node = 2\n", &[("s1", addr)], &volumes));
    drop(node); // killed
    gw.wait_line("node connection lost");
    gw.wait_line("node connection failed");
    let _node = serve_in(&dir.join("node"), &node_head(addr.port()), &node_body);
    let restored = gw.wait_line("node connection restored");
    assert!(restored.contains("connections=6") && restored.contains("volumes=3"), "{restored}");
    let log = gw.log.lock().unwrap();
    let lines = |what: &str| log.iter().filter(|l| l.contains(what)).count();
    let (lost, failed) = (lines("node connection lost"), lines("node connection failed"));
    assert!(lost <= 2 && failed <= 2, "{lost} lost and {failed} failed lines for one outage: {log:#?}");
    assert_eq!(lines("node connection restored"), 1, "{log:#?}");
}

/// Listeners on 127.0.0.`host` that take TCP connections and never write (each connection held until
/// the value drops): nodes that accept and then stay silent.
struct SilentNodes {
    addrs: Vec<SocketAddr>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SilentNodes {
    fn new(host: u8, n: usize) -> SilentNodes {
        let listeners: Vec<std::net::TcpListener> = (0..n)
            .map(|_| {
                let l = std::net::TcpListener::bind(format!("127.0.0.{host}:0")).unwrap();
                l.set_nonblocking(true).unwrap();
                l
            })
            .collect();
        let addrs = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let until = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !until.load(std::sync::atomic::Ordering::Relaxed) {
                for l in &listeners {
                    while let Ok((sock, _)) = l.accept() {
                        held.push(sock);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        SilentNodes { addrs, stop, thread: Some(thread) }
    }
}

impl Drop for SilentNodes {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Nodes that take the connection and stay silent cost a volume's open, and a reload that changes their
/// protocol, one `connect_timeout_s` together (1 s here), not one each: a volume over two `rein serve`
/// nodes and four silent ones starts within 2.5 s (its nodes were connected one after another: 4 s), a
/// reload that changes the four silent nodes' protocol (`NodeMoves::try_places`, all at once) completes
/// as fast and names each as not reached (its sessions reconnect with the new settings once it
/// answers; before, nothing said so), and a reload that the two `rein serve` nodes refuse (the
/// storage-node protocol, without `[node]`) beside four silent ones fails as fast, naming both (before,
/// the first to answer only).
#[test]
fn a_reload_tries_its_changed_nodes_together() {
    let tmp = tmpdir("gw-try-together");
    let dir = tmp.path();
    let serve = |name: &str| {
        let body = format!("capacity_iops = 100000\n[[exports]]\nname = \"v\"\nsize_mb = {NODE_MB}\n");
        serve_in(&dir.join(name), &local(180), &body)
    };
    let (r1, r2) = (serve("r1"), serve("r2"));
    let silent = SilentNodes::new(180, 4);
    let mut places = vec![("s1", r1.nbd), ("s2", r2.nbd)];
    places.extend(["s3", "s4", "s5", "s6"].into_iter().zip(silent.addrs.iter().copied()));
    let config = |rein: &[&str]| {
        let mut text =
            format!("{}\nrequest_timeout_s = 2\nconnect_timeout_s = 1\nreconnect_max_backoff_ms = 200\n", local(181));
        for (name, addr) in &places {
            let protocol = if rein.contains(name) { "rein" } else { "nbd" };
            text.push_str(&format!("[[nodes]]\nname = \"{name}\"\naddress = \"{addr}\"\nprotocol = \"{protocol}\"\n"));
        }
        text.push_str(
            "[[tenants]]\nname = \"c2\"\n[[exports]]\nname = \"v\"\ntenant = \"c2\"\nsize_mb = 12\n\
             widths = { s1 = 1, s2 = 1, s3 = 1, s4 = 1, s5 = 1, s6 = 1 }\n",
        );
        write_file(dir, "gw.toml", &text)
    };
    // The volume's start: its six nodes connected together, the four silent ones one timeout in all.
    let t0 = Instant::now();
    let gw = gateway(&config(&[]));
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(2500), "the start took {took:?} (one node after another: 4 x 1 s)");
    // The four silent nodes to rein: each tried with the volume's session, together.
    config(&["s3", "s4", "s5", "s6"]);
    let hup = Instant::now();
    gw.signal("-HUP");
    gw.wait_log(&["configuration reloaded"], Duration::from_secs(30));
    let took = hup.elapsed();
    assert!(took < Duration::from_millis(2500), "the reload took {took:?} (one node after another: 4 x 1 s)");
    for (name, addr) in &places[2..] {
        let line = gw.wait_log(&[&format!("node {name}: not reached at {addr}")], Duration::from_secs(1));
        assert!(line.contains("did not finish the NBD handshake within connect_timeout_s (1 s)"), "{line}");
    }
    // s1 and s2 to rein, which both refuse, and the silent four back to nbd: all six tried together.
    config(&["s1", "s2"]);
    let hup = Instant::now();
    gw.signal("-HUP");
    let line = gw.wait_log(&["the running configuration is unchanged"], Duration::from_secs(30));
    let took = hup.elapsed();
    assert!(took < Duration::from_millis(2500), "the refused reload took {took:?}");
    for (name, addr) in &places[..2] {
        let refused = format!(
            "node {name}: the node at {addr} refuses the link as this reload sets it (protocol rein, TLS off): the node \
             refused the storage-node protocol"
        );
        assert!(line.contains(&refused), "{name} not named: {line}");
    }
}

/// A node that answers and refuses (here a `rein serve` without the volume's node export) stops the
/// gateway's start at once, named, however long another node stays silent (one that takes the
/// connection and never greets; `connect_timeout_s = 3`): in one volume over both nodes, and with the
/// silent node's volume before the refused one; and a reload that adds the volume over both fails as
/// fast. They used to wait out the silent node's whole connect timeout for a failure known at once (the
/// volume's nodes were awaited all, and the volumes in order).
#[test]
fn a_refusing_node_fails_the_start_without_waiting_for_a_silent_one() {
    let tmp = tmpdir("gw-refused-beside-silent");
    let node = storage_node(tmp.path(), 184);
    let silent = SilentNodes::new(185, 1);
    let head = format!(
        "{}\nrequest_timeout_s = 2\nconnect_timeout_s = 3\nreconnect_max_backoff_ms = 200\n[[nodes]]\nname = \
         \"s1\"\naddress = \"{}\"\n[[nodes]]\nname = \"s2\"\naddress = \"{}\"\n",
        local(185),
        silent.addrs[0],
        node.nbd
    );
    let one = "[[exports]]\nname = \"v\"\nsize_mb = 8\nnode_export = \"gone\"\n";
    let apart = "[[exports]]\nname = \"a\"\nsize_mb = 8\nwidths = { s1 = 1, s2 = 0 }\nnode_export = \"v\"\n\
                 [[exports]]\nname = \"b\"\nsize_mb = 8\nwidths = { s1 = 0, s2 = 1 }\nnode_export = \"gone\"\n";
    for (volume, body) in [("v", one), ("b", apart)] {
        let cfg = write_file(tmp.path(), "gw.toml", &format!("{head}{body}"));
        let t0 = Instant::now();
        let err = Rein::gateway(&cfg).fails();
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(1500), "export {volume}: the start failed after {took:?}: {err}");
        let named = format!("export {volume}: node s2 ({}): ", node.nbd);
        assert!(err.contains(&named) && err.contains("\"gone\""), "{named} not in: {err}");
    }
    // A reload that adds the volume over both nodes fails as fast, and changes nothing.
    let w = "[[exports]]\nname = \"w\"\nsize_mb = 8\nwidths = { s1 = 0, s2 = 1 }\nnode_export = \"w\"\n";
    let gw = gateway(&write_file(tmp.path(), "gw.toml", &format!("{head}{w}")));
    write_file(tmp.path(), "gw.toml", &format!("{head}{w}{one}"));
    let hup = Instant::now();
    gw.signal("-HUP");
    let line = gw.wait_log(&["the running configuration is unchanged"], Duration::from_secs(30));
    let took = hup.elapsed();
    assert!(took < Duration::from_millis(1500), "the reload failed after {took:?}: {line}");
    let named = format!("export v: node s2 ({}): ", node.nbd);
    assert!(line.contains(&named) && line.contains("\"gone\""), "{named} not in: {line}");
}
