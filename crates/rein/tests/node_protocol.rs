//! The storage-node protocol against a real `rein serve` (docs/node-protocol.md): a Rust client speaking
//! the extension (rein-proto's client side, as `rein gateway` does), each server on its own 127.0.0.x.
//!
//! Expected values come from the protocol and the tag equations, never from a run: a request's cost under
//! `cost_model = "io"` is one unit (65,536 raw); under dmClock two backlogged tenants of equal weight whose
//! requests carry delta d_A and d_B (in units) are served in the ratio (1 + d_B) : (1 + d_A), since each P
//! tag advances by (cost + delta)/w (mclock-dmclock.txt §3.2.1).
mod common;

use common::{config_file, nbd_open_with, run_ok, tmpdir, tool, NbdOpen, Rein, Server};
use rein_core::{Cost, Phase};
use rein_proto::nbd::{
    decode_node_reply, decode_option_reply, encode_node_request, option_request, ClientHandshake, Command, NodeHello,
    NodeReplyTrailer, NodeSplit, NodeTag, NodeTenant, RequestHeader, SimpleReply, SpecSource, EINVAL,
    FLAG_C_FIXED_NEWSTYLE, OPT_REIN_NODE, OPT_STRUCTURED_REPLY, REP_ACK, REP_ERR_INVALID, REP_ERR_POLICY,
    REP_ERR_UNSUP, REP_REIN_NODE,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(20);

/// Two tenants behind a modelled device of 2,000 IOPS (deterministic), one memory export; the node
/// protocol on, with `specs`.
fn node_config(specs: &str, extra: &str) -> String {
    format!(
        r#"scheduler = "dmclock"
queue_depth = 2
{extra}
[node]
enabled = true
specs = "{specs}"

[device_model]
capacity_iops = 2000
service = "deterministic"

[[exports]]
name = "m"
backend = "memory"
size_mb = 4

[[tenants]]
name = "m"
weight = 1

[[tenants]]
name = "a"
weight = 1

[[tenants]]
name = "b"
reservation = 100
weight = 1
"#
    )
}

fn start(dir: &Path, host: u8, config: &str) -> Server {
    Rein::serve(&config_file(dir, host, config)).start()
}

fn tenant(name: &str, reservation: f64, weight: f64) -> NodeTenant {
    NodeTenant {
        name: name.into(),
        reservation,
        limit: None,
        weight,
        local_reservation: 0.0,
        idle_credit: 0,
        split: NodeSplit::Spread,
    }
}

fn open(addr: SocketAddr, hello: NodeHello) -> NbdOpen {
    nbd_open_with(addr, ClientHandshake::with_node("m", hello).unwrap(), TIMEOUT).unwrap()
}

/// Sends a request with its tag (and a WRITE's payload).
fn send(s: &mut TcpStream, command: Command, handle: u64, offset: u64, length: u32, tag: NodeTag, payload: &[u8]) {
    let mut out = Vec::new();
    encode_node_request(&RequestHeader { flags: 0, command, handle, offset, length }, &tag, &mut out);
    out.extend_from_slice(payload);
    s.write_all(&out).unwrap();
}

/// Reads one reply: the header, the trailer, and `data_len` bytes of data if it is a success.
fn recv(c: &mut NbdOpen, data_len: usize) -> (SimpleReply, NodeReplyTrailer, Vec<u8>) {
    loop {
        if let Some((reply, trailer, n)) = decode_node_reply(&c.buf).unwrap() {
            let want = if reply.error == 0 { data_len } else { 0 };
            if c.buf.len() >= n + want {
                let data = c.buf[n..n + want].to_vec();
                c.buf.drain(..n + want);
                return (reply, trailer, data);
            }
        }
        let mut chunk = [0u8; 65536];
        let k = c.stream.read(&mut chunk).unwrap();
        assert!(k > 0, "the node closed the connection");
        c.buf.extend_from_slice(&chunk[..k]);
    }
}

fn tag(slot: u32) -> NodeTag {
    NodeTag { slot, share: 65536, delta: 0, rho: 0, pool_busy: false }
}

#[test]
fn phases_and_costs_come_back_and_data_follows_the_trailer() {
    let tmp = tmpdir("node-phases");
    let s = start(tmp.path(), 130, &node_config("node", ""));
    let mut c = open(s.nbd, NodeHello::new(vec![tenant("a", 0.0, 1.0), tenant("b", 100.0, 1.0)]));
    let w = c.welcome.clone().expect("a node session");
    assert_eq!(w.tenants.len(), 2);
    assert!(w.tenants.iter().enumerate().all(|(i, g)| g.slot == i as u32 && g.source == SpecSource::Node));
    assert_eq!((w.tenants[1].reservation, w.tenants[1].weight), (100.0, 1.0), "the node's spec of b");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    send(&mut c.stream, Command::Write, 1, 8192, 4096, tag(0), &pattern);
    let (r, t, _) = recv(&mut c, 0);
    assert_eq!((r.handle, r.error), (1, 0));
    assert_eq!(t.cost, Cost::ONE.0, "cost_model io: one unit per request");
    assert!(matches!(t.phase, Some(Phase::Weight)), "a has no reservation: {t:?}");
    send(&mut c.stream, Command::Read, 2, 8192, 4096, tag(0), &[]);
    let (r, t, data) = recv(&mut c, 4096);
    assert_eq!((r.handle, r.error, t.cost), (2, 0, Cost::ONE.0));
    assert_eq!(data, pattern, "the data follows the trailer");
    // b reserves 100 IOPS: its first request, on an idle node, is due in the reservation phase (its R tag
    // is its arrival time).
    send(&mut c.stream, Command::Read, 3, 0, 512, tag(1), &[]);
    let (r, t, _) = recv(&mut c, 512);
    assert_eq!((r.handle, r.error, t), (3, 0, NodeReplyTrailer { phase: Some(Phase::Reservation), cost: Cost::ONE.0 }));
    s.wait_line("storage-node session granted");
}

/// dmClock's P tags advance by (cost + delta)/w: with equal weights, a tenant whose every request carries
/// delta = 3 units gets 1/(1+3) of the service of one with delta 0, i.e. 1/5 of the node in all.
#[test]
fn a_large_delta_gets_proportionally_less() {
    let tmp = tmpdir("node-delta");
    let s = start(tmp.path(), 131, &node_config("node", ""));
    let mut c = open(s.nbd, NodeHello::new(vec![tenant("a", 0.0, 1.0), tenant("m", 0.0, 1.0)]));
    let delta = 3 * Cost::ONE.0;
    let tags = [
        NodeTag { slot: 0, share: 65536, delta, rho: 0, pool_busy: false },
        NodeTag { slot: 1, share: 65536, delta: 0, rho: 0, pool_busy: false },
    ];
    // Requests outstanding per tenant: both always backlogged at the node. The share holds only while
    // both are queued there; a window of 16 let m's queue (1,600 IOPS) drain whenever this client thread
    // stalled for 10 ms, and a then took the node alone (0.231 once, on an idle machine). With 64, m
    // keeps requests queued through a 40 ms stall.
    let depth = 64;
    let mut handle = 0u64;
    for t in tags {
        for _ in 0..depth {
            handle += 1;
            send(&mut c.stream, Command::Read, handle * 2 + t.slot as u64, 0, 512, t, &[]);
        }
    }
    let (warmup, measured) = (400, 2000);
    let mut counts = [0u64; 2];
    for i in 0..warmup + measured {
        let (r, t, _) = recv(&mut c, 512);
        assert_eq!(r.error, 0);
        assert_eq!(t.cost, Cost::ONE.0);
        let slot = (r.handle % 2) as usize;
        if i >= warmup {
            counts[slot] += 1;
        }
        handle += 1;
        send(&mut c.stream, Command::Read, handle * 2 + slot as u64, 0, 512, tags[slot], &[]);
    }
    let share_a = counts[0] as f64 / measured as f64;
    let want = 1.0 / (1.0 + 4.0); // ratio 1 : (1 + 3)
    eprintln!("tenant a (delta 3 units) got {share_a:.3} of the node, counts {counts:?}; the tag equations: {want}");
    assert!(
        (share_a - want).abs() < 0.03,
        "tenant a (delta 3) got {share_a:.3} of the node, want {want} (counts {counts:?})"
    );
}

/// RBFQ's local minimum (rbfq-repair.txt §3.2: "at server s_j, the minimum requirement used in computing
/// the local tag should be M_ij"). The node models 500 IOPS; tenant a's hello sets local_reservation =
/// 300, above the 250 an equal weight would give it, so it must be served at least 300 IOPS (RBFQ's
/// property: a client whose M_i/w_i is above the fair share gets exactly M_i) against an equal-weight
/// tenant without one. The rate is counted over the wall time of the measurement, whatever the host
/// manages (the modelled device completes on tokio timers, so it may serve less than its 500 IOPS: then
/// the other tenant loses, not a).
#[test]
fn rbfq_applies_the_local_reservation() {
    let tmp = tmpdir("node-rbfq");
    let cfg = node_config("gateway", "")
        .replace("\"dmclock\"", "\"rbfq\"")
        .replace("capacity_iops = 2000", "capacity_iops = 500");
    let s = start(tmp.path(), 137, &cfg);
    let mut local = tenant("a", 0.0, 1.0);
    local.local_reservation = 300.0;
    let mut c = open(s.nbd, NodeHello::new(vec![local, tenant("m", 0.0, 1.0)]));
    assert_eq!(c.welcome.as_ref().unwrap().tenants[0].reservation, 300.0);
    let depth = 16;
    let mut handle = 0u64;
    for slot in 0..2u32 {
        for _ in 0..depth {
            handle += 1;
            send(&mut c.stream, Command::Read, handle * 2 + slot as u64, 0, 512, tag(slot), &[]);
        }
    }
    let (warmup, measured) = (100, 600);
    let mut counts = [0u64; 2];
    let mut started = std::time::Instant::now();
    for i in 0..warmup + measured {
        let (r, _, _) = recv(&mut c, 512);
        assert_eq!(r.error, 0);
        let slot = (r.handle % 2) as usize;
        if i == warmup {
            started = std::time::Instant::now();
        }
        if i > warmup {
            counts[slot] += 1;
        }
        handle += 1;
        send(&mut c.stream, Command::Read, handle * 2 + slot as u64, 0, 512, tag(slot as u32), &[]);
    }
    let seconds = started.elapsed().as_secs_f64();
    let (rate_a, rate_m) = (counts[0] as f64 / seconds, counts[1] as f64 / seconds);
    eprintln!(
        "tenant a (local reservation 300) {rate_a:.0} IOPS, m {rate_m:.0} IOPS, node {:.0} IOPS",
        rate_a + rate_m
    );
    assert!(rate_a >= 0.95 * 300.0, "tenant a got {rate_a:.0} IOPS, below its local minimum of 300 (m: {rate_m:.0})");
}

/// The replies to `opts`, sent at once in a raw handshake (one reply each), as (option, reply, message).
fn raw_options(addr: SocketAddr, opts: &[(u32, Vec<u8>)]) -> Vec<(u32, u32, String)> {
    raw_options_on(TcpStream::connect(addr).unwrap(), opts)
}

/// [`raw_options`] on a connection the caller made (from an address of its choice).
fn raw_options_on(mut s: TcpStream, opts: &[(u32, Vec<u8>)]) -> Vec<(u32, u32, String)> {
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    let mut out = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    for (o, d) in opts {
        option_request(&mut out, *o, d);
    }
    s.write_all(&out).unwrap();
    let mut buf = Vec::new();
    let mut replies = Vec::new();
    while replies.len() < opts.len() {
        if let Some((r, n)) = decode_option_reply(&buf).unwrap() {
            replies.push((r.option, r.reply, String::from_utf8_lossy(r.data).into_owned()));
            buf.drain(..n);
            continue;
        }
        let mut chunk = [0u8; 4096];
        let k = s.read(&mut chunk).unwrap();
        assert!(k > 0, "closed after {replies:?}");
        buf.extend_from_slice(&chunk[..k]);
    }
    replies
}

fn hello_bytes(h: &NodeHello) -> Vec<u8> {
    let mut d = Vec::new();
    h.encode(&mut d);
    d
}

/// A node session's bytes are charged to each slot's tenant, not to the export's: a gateway session of
/// tenant a that leaves 32 MiB of READ replies unread holds a's budget (1 MiB here) full, and a session
/// of tenant b on the same export is still served (before, both charged the export's tenant, so b waited
/// for a's client).
#[test]
fn a_tenant_holding_its_budget_does_not_stall_another_on_the_same_export() {
    let tmp = tmpdir("node-budget");
    let s = start(tmp.path(), 134, &node_config("gateway", "max_inflight_mb_per_tenant = 1"));
    let mut a = open(s.nbd, NodeHello::new(vec![tenant("a", 0.0, 1.0)]));
    let mut out = Vec::new();
    for handle in 0..64u64 {
        let header = RequestHeader { flags: 0, command: Command::Read, handle, offset: 0, length: 512 << 10 };
        encode_node_request(&header, &tag(0), &mut out);
    }
    a.stream.write_all(&out).unwrap(); // and never read the replies
    std::thread::sleep(Duration::from_millis(500));
    let mut b = open(s.nbd, NodeHello::new(vec![tenant("b", 0.0, 1.0)]));
    b.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = std::time::Instant::now();
    send(&mut b.stream, Command::Read, 1, 0, 4096, tag(0), &[]);
    let (r, _, data) = recv(&mut b, 4096);
    assert_eq!((r.handle, r.error, data.len()), (1, 0, 4096));
    assert!(t0.elapsed() < Duration::from_secs(5), "b waited {:?}", t0.elapsed());
    drop(a);
}

/// The welcome's boot identity (protocol v2): the same in every session of one node process, another
/// after the node restarts; a v1 hello (an older gateway) gets a v1 welcome without one.
#[test]
fn the_boot_identity_changes_only_when_the_node_restarts() {
    let tmp = tmpdir("node-boot");
    let config = config_file(tmp.path(), 133, &node_config("node", ""));
    let hello = || NodeHello::new(vec![tenant("a", 0.0, 1.0)]);
    let boot_of = |nbd| open(nbd, hello()).welcome.expect("a node session").boot.expect("a v2 welcome");
    let s = Rein::serve(&config).start();
    let first = boot_of(s.nbd);
    assert_ne!(first, 0);
    assert_eq!(boot_of(s.nbd), first, "a second session to the same node process");
    let v1 = open(s.nbd, NodeHello { version: 1, ..hello() }).welcome.expect("a node session");
    assert_eq!((v1.version, v1.boot), (1, None), "an older gateway gets a v1 welcome");
    s.stop();
    let s = Rein::serve(&config).start();
    assert_ne!(boot_of(s.nbd), first, "a restarted node states another boot");
}

#[test]
fn refusals_name_what_is_wrong() {
    let tmp = tmpdir("node-refusals");
    let s = start(tmp.path(), 132, &node_config("node", ""));
    // A tenant unknown under specs = "node".
    let r = raw_options(s.nbd, &[(OPT_REIN_NODE, hello_bytes(&NodeHello::new(vec![tenant("zz", 0.0, 1.0)])))]);
    assert_eq!(r[0].1, REP_ERR_POLICY);
    assert!(r[0].2.contains("tenant \"zz\" is not known"), "{r:?}");
    // Malformed hellos: each bad field named. Offsets in a one-tenant hello named "a": version 0, flags 2,
    // count 4, name_len 6, name 8, reservation 9, limit 17, weight 25, local_reservation 33, idle_credit
    // 41, split 45, reserved 46.
    let good = hello_bytes(&NodeHello::new(vec![tenant("a", 0.0, 1.0)]));
    let set = |at: usize, bytes: &[u8]| {
        let mut v = good.clone();
        v[at..at + bytes.len()].copy_from_slice(bytes);
        v
    };
    let cases = [
        (set(0, &[0, 0]), "version 0"),
        (set(2, &[0, 4]), "flags 0x4"),
        (set(4, &[0, 0]), "tenant count 0"),
        (set(6, &[0, 0]), "name length 0"),
        (set(17, &0f64.to_be_bytes()), "limit 0"),
        (set(33, &(-1f64).to_be_bytes()), "local_reservation -1"),
        (set(45, &[7]), "split 7"),
        // Trailing bytes are refused in a v1 hello (a v2 hello's are later versions' fields).
        ([&set(0, &[0, 1])[..], &[1, 2]].concat(), "2 trailing bytes"),
    ];
    let opts: Vec<(u32, Vec<u8>)> = cases.iter().map(|(d, _)| (OPT_REIN_NODE, d.clone())).collect();
    let replies = raw_options(s.nbd, &opts);
    for ((_, named), (opt, reply, msg)) in cases.iter().zip(&replies) {
        assert_eq!((*opt, *reply), (OPT_REIN_NODE, REP_ERR_INVALID), "{named}: {msg}");
        assert!(msg.contains(named), "{named:?} not in {msg:?}");
    }
    // Structured replies and the node protocol exclude each other, in either order.
    let hello = hello_bytes(&NodeHello::new(vec![tenant("a", 0.0, 1.0)]));
    let r = raw_options(s.nbd, &[(OPT_STRUCTURED_REPLY, vec![]), (OPT_REIN_NODE, hello.clone())]);
    assert_eq!((r[0].1, r[1].1), (REP_ACK, REP_ERR_INVALID), "{r:?}");
    let r = raw_options(s.nbd, &[(OPT_REIN_NODE, hello), (OPT_STRUCTURED_REPLY, vec![])]);
    assert_eq!((r[0].1, r[1].1), (REP_REIN_NODE, REP_ERR_INVALID), "{r:?}");
    // Plain clients are unaffected on the same server.
    let info = run_ok(tool("nbdinfo").arg(format!("nbd://{}/m", s.nbd)));
    assert!(info.contains("export-size: 4194304"), "{info}");
    let out = run_ok(tool("qemu-img").args(["info", "-f", "raw", &format!("nbd://{}/m", s.nbd)]));
    assert!(out.contains("4 MiB"), "{out}");
}

#[test]
fn bad_tags_get_einval_and_the_connection_goes_on() {
    let tmp = tmpdir("node-tags");
    let s = start(tmp.path(), 133, &node_config("node", ""));
    let mut c = open(s.nbd, NodeHello::new(vec![tenant("a", 0.0, 1.0)]));
    let bad = [
        NodeTag { slot: 1, ..tag(0) },
        NodeTag { share: 0, ..tag(0) },
        NodeTag { share: 65537, ..tag(0) },
        NodeTag { delta: 5, rho: 6, ..tag(0) },
    ];
    for (i, t) in bad.into_iter().enumerate() {
        // A WRITE: its payload is skipped, and the next request is read from the right place.
        send(&mut c.stream, Command::Write, 10 + i as u64, 0, 512, t, &[0xEE; 512]);
        let (r, trailer, _) = recv(&mut c, 0);
        assert_eq!((r.handle, r.error, trailer), (10 + i as u64, EINVAL, NodeReplyTrailer::default()), "{t:?}");
        send(&mut c.stream, Command::Read, 20 + i as u64, 0, 512, tag(0), &[]);
        let (r, trailer, data) = recv(&mut c, 512);
        assert_eq!((r.handle, r.error, trailer.cost), (20 + i as u64, 0, Cost::ONE.0));
        assert!(data.iter().all(|&b| b == 0), "the rejected write did not happen");
    }
}

#[test]
fn disabled_node_protocol_is_unsupported_and_plain_nbd_still_works() {
    let tmp = tmpdir("node-off");
    let s = start(tmp.path(), 134, &node_config("node", "").replace("enabled = true", "enabled = false"));
    let c = open(s.nbd, NodeHello::new(vec![tenant("a", 0.0, 1.0)]));
    assert_eq!(c.node_refused.as_ref().map(|r| r.0), Some(REP_ERR_UNSUP), "{:?}", c.node_refused);
    assert!(c.welcome.is_none() && c.size == 4 << 20, "the handshake went on plain");
    let info = run_ok(tool("nbdinfo").arg(format!("nbd://{}/m", s.nbd)));
    assert!(info.contains("export-size: 4194304"), "{info}");
}

#[test]
fn a_peer_outside_allow_networks_is_refused() {
    let tmp = tmpdir("node-peer");
    let cfg =
        node_config("node", "").replace("specs = \"node\"", "specs = \"node\"\nallow_networks = [\"10.0.0.0/8\"]");
    let s = start(tmp.path(), 135, &cfg);
    let c = open(s.nbd, NodeHello::new(vec![tenant("a", 0.0, 1.0)]));
    let (reply, msg) = c.node_refused.clone().expect("refused");
    assert_eq!(reply, REP_ERR_POLICY);
    assert!(msg.contains("127.0.0.1 may not use the storage-node protocol"), "{msg}");
    s.wait_line("storage-node hello refused");
}

#[test]
fn specs_gateway_adopts_the_gateways_specs_with_admission() {
    let tmp = tmpdir("node-gateway");
    let s = start(tmp.path(), 136, &node_config("gateway", ""));
    let mut local = tenant("loc", 300.0, 2.0);
    local.local_reservation = 40.0;
    local.limit = Some(30.0);
    let c = open(
        s.nbd,
        NodeHello::new(vec![
            NodeTenant { limit: Some(500.0), ..tenant("new", 30.0, 2.0) },
            tenant("b", 0.0, 5.0),
            local,
        ]),
    );
    let w = c.welcome.expect("granted");
    assert!(w.tenants.iter().all(|g| g.source == SpecSource::Gateway));
    assert_eq!((w.tenants[0].reservation, w.tenants[0].limit, w.tenants[0].weight), (30.0, Some(500.0), 2.0));
    assert_eq!((w.tenants[1].reservation, w.tenants[1].weight), (0.0, 5.0), "b's spec changed to the gateway's");
    // RBFQ's local minimum replaces the reservation at this node; the limit rises to it.
    assert_eq!(
        (w.tenants[2].reservation, w.tenants[2].limit, w.tenants[2].local_reservation),
        (40.0, Some(40.0), 40.0)
    );
    let (code, _, body) = common::http(s.admin, "GET", "/api/tenants", "", "");
    assert_eq!(code, 200);
    assert!(body.contains("\"new\"") && body.contains("\"loc\""), "{body}");
    // Admission: 30 + 40 already reserved of 2,000; asking 5,000 more is refused, naming the tenant.
    let c = open(s.nbd, NodeHello::new(vec![tenant("big", 5000.0, 1.0)]));
    let (reply, msg) = c.node_refused.expect("refused");
    assert_eq!(reply, REP_ERR_POLICY);
    assert!(msg.contains("tenant \"big\"") && msg.contains("capacity"), "{msg}");
}

/// Refused hellos cannot flood the node's log: a peer outside `[node] allow_networks` that sends 1,000
/// storage-node hellos, 8 on each connection (the most one handshake takes: a 9th is refused by the
/// handshake itself, naming the bound), gets each refused with NBD_REP_ERR_POLICY naming why, and the node
/// logs the refusals at most once a second, the next line with the number not logged (`unlogged=N`).
/// Before, each logged a line (1,000 lines from one connection of a peer the node does not admit, when a
/// handshake took any number of hellos).
#[test]
fn refused_hellos_do_not_flood_the_nodes_log() {
    let tmp = tmpdir("node-hello-flood");
    let cfg =
        node_config("node", "").replace("specs = \"node\"", "specs = \"node\"\nallow_networks = [\"127.0.0.201/32\"]");
    let s = start(tmp.path(), 205, &cfg);
    let hello = hello_bytes(&NodeHello::new(vec![tenant("a", 0.0, 1.0)]));
    // `n` hellos on a new connection from 127.0.0.204: their replies.
    let hellos = |n: usize| -> Vec<(u32, u32, String)> {
        raw_options_on(common::connect_from("127.0.0.204", s.nbd), &vec![(OPT_REIN_NODE, hello.clone()); n])
    };
    let max = rein_proto::nbd::MAX_NODE_HELLOS as usize;
    let over = hellos(max + 1);
    assert_eq!(
        over[max],
        (OPT_REIN_NODE, REP_ERR_POLICY, format!("at most {max} storage-node hellos on one connection"))
    );
    const N: usize = 1000;
    for _ in 0..N / max {
        for (option, reply, msg) in hellos(max) {
            assert_eq!((option, reply), (OPT_REIN_NODE, REP_ERR_POLICY));
            assert!(msg.contains("127.0.0.204 may not use the storage-node protocol"), "{msg}");
        }
    }
    let logged = s.log.lock().unwrap().iter().filter(|l| l.contains("storage-node hello refused")).count();
    assert!(logged >= 1, "the first is logged");
    assert!(logged <= 5, "{logged} lines for {N} refused hellos");
    // The next refusal after a quiet second says how many were not logged.
    let line = s.wait_unlogged("storage-node hello refused", || {
        hellos(1);
    });
    assert!(line.contains("may not use the storage-node protocol"));
}

/// Protocol v4 against a real node: a BLOCK_STATUS on a v4 session is answered with the simple reply, a
/// trailer with no phase (not scheduled) and the descriptors of the memory export (1 MiB pages never
/// written are holes); on a v3 session (a v3 gateway's hello) it is EINVAL, as before v4, and the session
/// goes on.
#[test]
fn block_status_is_answered_on_a_v4_session_and_einval_on_a_v3_one() {
    use rein_proto::nbd::{decode_node_extents, node_extents_len, NODE_VERSION_BLOCK_STATUS};
    let tmp = tmpdir("node-block-status");
    let s = start(tmp.path(), 111, &node_config("node", ""));
    let mut c = open(s.nbd, NodeHello::new(vec![tenant("a", 0.0, 1.0)]));
    assert_eq!(c.welcome.as_ref().map(|w| w.version), Some(NODE_VERSION_BLOCK_STATUS));
    send(&mut c.stream, Command::Write, 1, 1 << 20, 4096, tag(0), &[7; 4096]);
    assert_eq!(recv(&mut c, 0).0.error, 0);
    send(&mut c.stream, Command::BlockStatus, 2, 0, 4 << 20, tag(0), &[]);
    let (reply, trailer, _) = recv(&mut c, 0);
    assert_eq!((reply.handle, reply.error, trailer), (2, 0, NodeReplyTrailer::default()));
    let payload = loop {
        if let Ok(Some(n)) = node_extents_len(&c.buf) {
            if c.buf.len() >= n {
                break c.buf.drain(..n).collect::<Vec<u8>>();
            }
        }
        let mut chunk = [0u8; 65536];
        let k = c.stream.read(&mut chunk).unwrap();
        assert!(k > 0, "the node closed the connection");
        c.buf.extend_from_slice(&chunk[..k]);
    };
    assert_eq!(decode_node_extents(&payload, 4 << 20), Ok(vec![(1 << 20, 3), (1 << 20, 0), (2 << 20, 3)]));
    // A v3 session: no block status.
    let mut c = open(s.nbd, NodeHello { version: 3, ..NodeHello::new(vec![tenant("a", 0.0, 1.0)]) });
    assert_eq!(c.welcome.as_ref().map(|w| w.version), Some(3));
    send(&mut c.stream, Command::BlockStatus, 3, 0, 4 << 20, tag(0), &[]);
    assert_eq!(recv(&mut c, 0).0.error, EINVAL);
    send(&mut c.stream, Command::Read, 4, 1 << 20, 4096, tag(0), &[]);
    let (reply, _, data) = recv(&mut c, 4096);
    assert_eq!((reply.handle, reply.error, data), (4, 0, vec![7; 4096]), "the session goes on");
}
