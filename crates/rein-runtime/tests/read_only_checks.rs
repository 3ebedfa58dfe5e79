//! The gateway's check of its node exports' flags (`read_only_check_s`; remote.rs, "Read-only node
//! exports") against fake nodes on 127.0.0.175 and 127.0.0.180: a node's check is a side connection
//! that opens nothing (an NBD_OPT_INFO for each export its volumes use, then NBD_OPT_ABORT), one a
//! period for every volume of the gateway on the node, within the options the node takes.
//!
//! A test binary of its own: in rein-runtime's unit tests it ran beside
//! `a_nodes_second_reply_is_named_as_such`, which captures its own thread's log with a scoped tracing
//! subscriber, and that capture then missed the line it waits for, every time (through tracing's
//! process-wide state; the exact path was not pinned down).
use rein_model::stripe::Stripe;
use rein_proto::nbd::{option_reply, ExportInfo, ServerHandshake, ServerProgress, OPT_INFO, REP_ERR_POLICY};
use rein_runtime::remote::{LinkConfig, NodeProtocol, NodeSpec, RemoteVolume};
use rein_runtime::sock::NodeAddress;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The checks a fake node saw: those done, those open now, the most open at once.
#[derive(Default)]
struct Checks {
    done: AtomicUsize,
    open: AtomicUsize,
    most: AtomicUsize,
}

/// A fake node with export "v" (read-only, so that no check renews a session) that takes `slow` to
/// answer a check (a connection whose first option is NBD_OPT_INFO; `None`: it never answers, a silent
/// node) and counts the checks. Sessions (NBD_OPT_GO) are served and held until the client leaves.
async fn slow_checked_node(slow: Option<Duration>) -> (SocketAddr, Arc<Checks>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.175:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let checks = Arc::new(Checks::default());
    let seen = checks.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let checks = seen.clone();
            tokio::spawn(async move {
                let info = ExportInfo {
                    name: "v".into(),
                    description: String::new(),
                    size: 1 << 20,
                    read_only: true,
                    volatile: false,
                    min_block: 1,
                };
                let mut out = Vec::new();
                let mut hs = ServerHandshake::new(vec![info], &mut out);
                s.write_all(&out).await.unwrap();
                // Client flags (4 bytes), then the first option's magic (8) and code (4).
                let mut buf = Vec::new();
                while buf.len() < 16 {
                    if s.read_buf(&mut buf).await.unwrap() == 0 {
                        return;
                    }
                }
                let check = u32::from_be_bytes(buf[12..16].try_into().unwrap()) == OPT_INFO;
                if check {
                    let now = checks.open.fetch_add(1, Ordering::SeqCst) + 1;
                    checks.most.fetch_max(now, Ordering::SeqCst);
                    let Some(slow) = slow else {
                        // Silent: held, unanswered, until the client leaves.
                        while s.read_buf(&mut buf).await.is_ok_and(|n| n > 0) {}
                        checks.open.fetch_sub(1, Ordering::SeqCst);
                        return;
                    };
                    tokio::time::sleep(slow).await;
                }
                loop {
                    out.clear();
                    let (used, progress) = hs.feed(&buf, &mut out).unwrap();
                    buf.drain(..used);
                    let _ = s.write_all(&out).await;
                    match progress {
                        ServerProgress::NeedMore if used > 0 => {}
                        ServerProgress::NeedMore => {
                            if s.read_buf(&mut buf).await.map_or(true, |n| n == 0) {
                                break;
                            }
                        }
                        // The check's NBD_OPT_ABORT.
                        ServerProgress::Aborted => break,
                        // A session: held until the client leaves.
                        ServerProgress::Done(_) => {
                            while s.read_buf(&mut buf).await.is_ok_and(|n| n > 0) {}
                            return;
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
                if check {
                    checks.open.fetch_sub(1, Ordering::SeqCst);
                    checks.done.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (addr, checks)
}

/// A plain NBD node `name` at `addr`.
fn node_at(name: &str, addr: SocketAddr) -> NodeSpec {
    NodeSpec::new(name, NodeAddress::Tcp(addr), NodeProtocol::Nbd, None)
}

/// One connection per node, a check every 5 ms, `connect_timeout`.
fn config(connect_timeout: Duration) -> LinkConfig {
    LinkConfig {
        request_timeout: Duration::from_secs(10),
        connect_timeout,
        max_backoff: Duration::from_millis(100),
        connections: 1,
        read_only_check: Some(Duration::from_millis(5)),
    }
}

/// Opens volume `name` of 4 KiB per node over `nodes` (export "v" on each, width 1).
async fn open(name: &str, nodes: &[NodeSpec], cfg: LinkConfig) -> Arc<RemoteVolume> {
    let stripe = Stripe::new(4096, &vec![1; nodes.len()]).unwrap();
    let exports = vec!["v".to_string(); nodes.len()];
    RemoteVolume::open(name, 4096 * nodes.len() as u64, stripe, nodes, &exports, None, cfg).await.unwrap()
}

/// Two volumes on one node, checking every 5 ms, with a node that takes 30 ms to answer a check: never
/// two checks open at once there (when each volume had its own check, without a lock on the node the
/// two overlapped: two at once; now the node has one check for both). Each check ends with
/// NBD_OPT_ABORT (the node's handshake ends `Aborted`, counted as done), and what it read (read-only)
/// holds.
#[tokio::test]
async fn a_node_gets_one_check_at_a_time() {
    let (addr, checks) = slow_checked_node(Some(Duration::from_millis(30))).await;
    let node = node_at("a", addr);
    let cfg = config(Duration::from_secs(10));
    let (v, w) = (open("v", std::slice::from_ref(&node), cfg).await, open("w", &[node], cfg).await);
    assert!(v.read_only() && w.read_only(), "the handshakes said read-only");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while checks.done.load(Ordering::SeqCst) < 8 {
        assert!(tokio::time::Instant::now() < deadline, "8 checks done in time");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(checks.most.load(Ordering::SeqCst), 1, "one check at a time at the node");
    assert!(v.read_only() && w.read_only(), "the checks said read-only too");
    v.close(Duration::from_secs(1)).await;
    w.close(Duration::from_secs(1)).await;
}

/// A node silent to checks (it takes the connection and never answers NBD_OPT_INFO), under 40 volumes
/// and a 50 ms `connect_timeout`, does not hold up the checks of another node: the volume over both
/// checks the healthy one at least 5 times within 3 s. Each node has its own check, so the silent one's
/// `connect_timeout` a period holds up none but its own. (When each volume checked its nodes one after
/// another, a check first waited its turn behind every other volume's at the silent node, 40 x 50 ms a
/// round, and the healthy node was checked once or twice.)
#[tokio::test]
async fn a_silent_node_does_not_hold_up_the_checks_of_another() {
    let (silent, _) = slow_checked_node(None).await;
    let (healthy, checks) = slow_checked_node(Some(Duration::ZERO)).await;
    let (s, h) = (node_at("s", silent), node_at("h", healthy));
    let cfg = config(Duration::from_millis(50));
    let mut volumes = Vec::new();
    for i in 0..40 {
        volumes.push(open(&format!("s{i}"), std::slice::from_ref(&s), cfg).await);
    }
    let both = open("both", &[s, h], cfg).await;
    let t0 = tokio::time::Instant::now();
    while checks.done.load(Ordering::SeqCst) < 5 {
        assert!(t0.elapsed() < Duration::from_secs(3), "the healthy node checked 5 times within 3 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    both.close(Duration::from_secs(1)).await;
    for v in volumes {
        v.close(Duration::from_secs(1)).await;
    }
}

/// What an option-level fake node saw: per check connection (one whose first option is NBD_OPT_INFO),
/// the exports its NBD_OPT_INFOs named, in order, and whether it ended in NBD_OPT_ABORT; and the
/// connections of any kind (checks and sessions) accepted, and those open now.
#[derive(Default)]
struct Seen {
    checks: std::sync::Mutex<Vec<(Vec<String>, bool)>>,
    accepted: AtomicUsize,
    open: AtomicUsize,
}

impl Seen {
    fn connections(&self) -> Vec<(Vec<String>, bool)> {
        self.checks.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.checks.lock().unwrap().len()
    }

    /// Connections accepted so far, and open now.
    fn accepted_open(&self) -> (usize, usize) {
        (self.accepted.load(Ordering::SeqCst), self.open.load(Ordering::SeqCst))
    }
}

/// A connection of an option-level fake node, counted open from its accept until its handler returns.
struct Open(Arc<Seen>);

impl Open {
    fn new(seen: Arc<Seen>) -> Open {
        seen.accepted.fetch_add(1, Ordering::SeqCst);
        seen.open.fetch_add(1, Ordering::SeqCst);
        Open(seen)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A fake node on 127.0.0.180 with exports `names` (1 MiB each; read-only those `read_only` says, read
/// anew at each option, so a test can flip one), answering option by option: NBD_OPT_INFO for `refused`
/// with NBD_REP_ERR_POLICY, and, with `cap`, closing a connection at its option past `cap` without an
/// answer (nbdkit counts 32, NBD_OPT_STARTTLS and NBD_OPT_ABORT included). Sessions (NBD_OPT_GO) are
/// served and held until the client leaves.
async fn option_node(
    names: &[&str],
    read_only: Arc<std::sync::Mutex<Vec<bool>>>,
    refused: Option<&'static str>,
    cap: Option<usize>,
) -> (SocketAddr, Arc<Seen>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.180:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (names, read_only, seen) = (names.clone(), read_only.clone(), log.clone());
            let open = Open::new(seen.clone());
            tokio::spawn(async move {
                let _open = open;
                let exports = || {
                    let ro = read_only.lock().unwrap().clone();
                    names
                        .iter()
                        .zip(ro)
                        .map(|(name, read_only)| ExportInfo {
                            name: name.clone(),
                            description: String::new(),
                            size: 1 << 20,
                            read_only,
                            volatile: false,
                            min_block: 1,
                        })
                        .collect::<Vec<_>>()
                };
                let mut out = Vec::new();
                let _ = ServerHandshake::new(exports(), &mut out);
                s.write_all(&out).await.unwrap();
                let mut buf = Vec::new();
                let fill = async |s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>, n: usize| {
                    while buf.len() < n {
                        if s.read_buf(buf).await.map_or(true, |r| r == 0) {
                            return false;
                        }
                    }
                    true
                };
                if !fill(&mut s, &mut buf, 4).await {
                    return;
                }
                let flags: Vec<u8> = buf.drain(..4).collect();
                let (mut infos, mut options, mut check) = (Vec::new(), 0, None);
                loop {
                    if !fill(&mut s, &mut buf, 16).await {
                        break;
                    }
                    let code = u32::from_be_bytes(buf[8..12].try_into().unwrap());
                    let len = u32::from_be_bytes(buf[12..16].try_into().unwrap()) as usize;
                    if !fill(&mut s, &mut buf, 16 + len).await {
                        break;
                    }
                    let option: Vec<u8> = buf.drain(..16 + len).collect();
                    options += 1;
                    check.get_or_insert(code == OPT_INFO);
                    if cap.is_some_and(|c| options > c) {
                        break; // as nbdkit: "client spent too much time negotiating"
                    }
                    if code == OPT_INFO {
                        let name_len = u32::from_be_bytes(option[16..20].try_into().unwrap()) as usize;
                        let name = String::from_utf8_lossy(&option[20..20 + name_len]).into_owned();
                        infos.push(name.clone());
                        if Some(name.as_str()) == refused {
                            let mut out = Vec::new();
                            option_reply(&mut out, OPT_INFO, REP_ERR_POLICY, b"not for you");
                            s.write_all(&out).await.unwrap();
                            continue;
                        }
                    }
                    // Any other option: a fresh handshake (the exports as they are now) answers it.
                    let mut out = Vec::new();
                    let mut hs = ServerHandshake::new(exports(), &mut out);
                    out.clear();
                    let (_, progress) = hs.feed(&[flags.clone(), option].concat(), &mut out).unwrap();
                    let _ = s.write_all(&out).await;
                    match progress {
                        ServerProgress::NeedMore => {}
                        ServerProgress::Aborted => {
                            seen.checks.lock().unwrap().push((infos, true));
                            return;
                        }
                        // A session: held until the client leaves.
                        ServerProgress::Done(_) => {
                            while s.read_buf(&mut buf).await.is_ok_and(|n| n > 0) {}
                            return;
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
                if check == Some(true) {
                    seen.checks.lock().unwrap().push((infos, false));
                }
            });
        }
    });
    (addr, seen)
}

/// Opens volume `name` of 4 KiB on `node`'s export `export` (width 1).
async fn open_on(name: &str, node: &NodeSpec, export: &str, cfg: LinkConfig) -> Arc<RemoteVolume> {
    let stripe = Stripe::new(4096, &[1]).unwrap();
    let exports = vec![export.to_string()];
    RemoteVolume::open(name, 4096, stripe, std::slice::from_ref(node), &exports, None, cfg).await.unwrap()
}

/// Volumes `v0`, `v1`, ... on `node`, one for each of `exports` in order, checking every 100 ms.
async fn checked_volumes<S: AsRef<str>>(node: &NodeSpec, exports: &[S]) -> Vec<Arc<RemoteVolume>> {
    let cfg = LinkConfig { read_only_check: Some(Duration::from_millis(100)), ..config(Duration::from_secs(10)) };
    let mut volumes = Vec::new();
    for (i, export) in exports.iter().enumerate() {
        volumes.push(open_on(&format!("v{i}"), node, export.as_ref(), cfg).await);
    }
    volumes
}

/// A node of its own (another fake node on 127.0.0.180, export "w") with one volume checking it every
/// 100 ms, as [`checked_volumes`]' do: its checks go on while a test closes the volumes of another node,
/// and count the periods that pass ([`periods_pass`]). Returns the volume (to close) and what its node saw.
async fn witness() -> (Arc<RemoteVolume>, Arc<Seen>) {
    let (addr, seen) = option_node(&["w"], Arc::new(std::sync::Mutex::new(vec![false])), None, None).await;
    let w = checked_volumes(&node_at("w", addr), &["w"]).await.remove(0);
    (w, seen)
}

/// Waits until the witness node (`seen`, [`witness`]) has seen 3 check connections more than now: the
/// first may have started before, the second started at a period's due time after now and the third a
/// period after the second, so one whole period at least has passed on the gateway's timers, and the
/// runtime has run a check through to its end since (every node's check has its own task, on the same
/// period). A fixed sleep proved neither: on a loaded machine nothing may have run meanwhile.
async fn periods_pass(seen: &Seen) {
    let mark = seen.count();
    until("3 checks more at the witness node", || seen.count() >= mark + 3).await;
}

/// The checks counted for `v` on its one node: (done, failed).
fn counted(v: &RemoteVolume) -> (u64, u64) {
    let r = &v.node_report()[0];
    (r.stats.checks.load(Ordering::SeqCst), r.stats.checks_failed.load(Ordering::SeqCst))
}

/// Waits (up to 20 s) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}, in time");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Five volumes on one node, each over its own export, checking every 100 ms: each period is ONE side
/// connection to the node carrying an NBD_OPT_INFO for each of the five exports, then NBD_OPT_ABORT, and
/// each volume counts one check a connection that asked its export. The node refuses one export's
/// NBD_OPT_INFO (NBD_REP_ERR_POLICY): that volume's checks fail, the others' do not. An export made
/// read-only on the node is found by a check (its volume read-only, the others not). Closed, the volumes'
/// exports are no longer asked. Before, each volume had its own check: five connections a period, one
/// NBD_OPT_INFO each.
#[tokio::test]
async fn one_connection_a_period_checks_every_volume_on_a_node() {
    let names = ["e0", "e1", "e2", "e3", "e4"];
    let read_only = Arc::new(std::sync::Mutex::new(vec![false; 5]));
    let (addr, seen) = option_node(&names, read_only.clone(), Some("e1"), None).await;
    let volumes = checked_volumes(&node_at("a", addr), &names).await;
    let (w, witnessed) = witness().await;
    // The rounds from here on have every volume (the one running now may have started before).
    let start = seen.count() + 1;
    until("3 check connections", || seen.count() >= start + 3).await;
    read_only.lock().unwrap()[3] = true;
    until("v3 read-only", || volumes[3].read_only()).await;
    let connections = seen.connections();
    for (asked, aborted) in &connections[start..] {
        assert_eq!(
            (asked.as_slice(), *aborted),
            (&names.map(String::from)[..], true),
            "5 INFOs, then ABORT: {connections:?}"
        );
    }
    for v in &volumes {
        v.close(Duration::from_secs(1)).await;
    }
    // A round running at the close ends (the node holds no connection: the sessions closed, the round's
    // connection ended), and its counts are in once a period has passed at the witness node.
    until("no connection open at the node", || seen.accepted_open().1 == 0).await;
    periods_pass(&witnessed).await;
    let (accepted, _) = seen.accepted_open();
    let connections = seen.connections();
    for (i, v) in volumes.iter().enumerate() {
        let (done, failed) = counted(v);
        let asked = connections.iter().filter(|(asked, _)| asked.contains(&names[i].to_string())).count();
        assert_eq!(done, asked as u64, "v{i}: one check counted a connection that asked e{i}");
        assert_eq!(failed, if i == 1 { done } else { 0 }, "v{i}: only e1's checks fail");
        assert_eq!(v.read_only(), i == 3, "v{i}");
    }
    // Then nothing more is asked: another period has passed, the witness node checked, this one not.
    periods_pass(&witnessed).await;
    assert_eq!(seen.count(), connections.len(), "no check after the volumes closed");
    assert_eq!(seen.accepted_open().0, accepted, "no connection at all after the volumes closed");
    w.close(Duration::from_secs(1)).await;
}

/// More exports on a node than one connection may carry: a plain NBD node (not known to be `rein
/// serve`) gets at most `PROBE_EXPORTS_ANY_SERVER` (30) NBD_OPT_INFOs a connection, so 31 volumes are
/// checked on two connections a period, 30 exports then 1, against a node that cuts a connection after
/// 32 options as nbdkit does (STARTTLS, were there one, and ABORT count), and no check fails. Without
/// the bound, the 31 went on one connection, which the node cut (seen: no connection of 30).
#[tokio::test]
async fn a_node_gets_no_more_options_on_a_connection_than_it_takes() {
    let names: Vec<String> = (0..31).map(|i| format!("e{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let read_only = Arc::new(std::sync::Mutex::new(vec![false; 31]));
    let (addr, seen) = option_node(&refs, read_only, None, Some(32)).await;
    let volumes = checked_volumes(&node_at("a", addr), &names).await;
    let start = seen.count() + 1;
    until("6 check connections", || seen.count() >= start + 6).await;
    // The rounds as they were with every volume open (no round of a volume closing or closed); the
    // pair of one running now may be half in (the pairs cut short are left out below).
    let connections = seen.connections();
    for v in &volumes {
        v.close(Duration::from_secs(1)).await;
    }
    assert_eq!(rein_proto::nbd::PROBE_EXPORTS_ANY_SERVER, 30);
    // From the first round with every volume: pairs of (the first 30, the last one).
    let first = start + connections[start..].iter().position(|(asked, _)| asked.len() == 30).unwrap();
    let rounds: Vec<_> = connections[first..].chunks(2).filter(|pair| pair.len() == 2).collect();
    assert!(rounds.len() >= 2, "{connections:?}");
    for pair in rounds {
        assert_eq!(pair[0], (names[..30].to_vec(), true), "{connections:?}");
        assert_eq!(pair[1], (names[30..].to_vec(), true), "{connections:?}");
    }
    for (i, v) in volumes.iter().enumerate() {
        let (done, failed) = counted(v);
        assert!(done >= 2 && failed == 0, "v{i}: {done} checks, {failed} failed");
    }
}

/// A fake node on 127.0.0.180 with writable exports `names` (1 MiB each) that answers each option
/// `delay` late (its greeting at once): a slow link, whose every round trip takes `delay`. Sessions
/// (NBD_OPT_GO) are served and held until the client leaves.
async fn slow_link_node(names: &[&str], delay: Duration) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.180:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let exports: Vec<ExportInfo> = names
        .iter()
        .map(|name| ExportInfo {
            name: name.to_string(),
            description: String::new(),
            size: 1 << 20,
            read_only: false,
            volatile: false,
            min_block: 1,
        })
        .collect();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let exports = exports.clone();
            tokio::spawn(async move {
                let mut out = Vec::new();
                let mut hs = ServerHandshake::new(exports, &mut out);
                if s.write_all(&out).await.is_err() {
                    return;
                }
                let mut buf = Vec::new();
                loop {
                    out.clear();
                    let Ok((used, progress)) = hs.feed(&buf, &mut out) else { return };
                    buf.drain(..used);
                    if !out.is_empty() {
                        tokio::time::sleep(delay).await;
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                    match progress {
                        ServerProgress::NeedMore if used > 0 => {}
                        ServerProgress::NeedMore => {
                            if s.read_buf(&mut buf).await.map_or(true, |n| n == 0) {
                                return;
                            }
                        }
                        // A session: held until the client leaves.
                        ServerProgress::Done(_) => {
                            while s.read_buf(&mut buf).await.is_ok_and(|n| n > 0) {}
                            return;
                        }
                        // The check's NBD_OPT_ABORT, or anything else: the connection ends.
                        _ => return,
                    }
                }
            });
        }
    });
    addr
}

/// Eight volumes over eight exports of a node on a slow link (each answer 150 ms late), checking every
/// 100 ms under a `connect_timeout` of 500 ms: a check asks the eight exports on one connection, eight
/// round trips (1.2 s and more), each within the timeout, and none fails: the timeout is each round
/// trip's. Before, it covered the whole conversation, so every check of more than three exports failed
/// (at the default 5 s: every check of 256 exports over a link of more than 19 ms).
#[tokio::test]
async fn a_check_over_a_slow_link_has_a_timeout_per_round_trip() {
    let names: Vec<String> = (0..8).map(|i| format!("e{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let node = node_at("a", slow_link_node(&refs, Duration::from_millis(150)).await);
    let cfg = LinkConfig { read_only_check: Some(Duration::from_millis(100)), ..config(Duration::from_millis(500)) };
    let mut volumes = Vec::new();
    for (i, export) in names.iter().enumerate() {
        volumes.push(open_on(&format!("v{i}"), &node, export, cfg).await);
    }
    until("3 checks of every volume", || volumes.iter().all(|v| counted(v).0 >= 3)).await;
    for (i, v) in volumes.iter().enumerate() {
        let (done, failed) = counted(v);
        assert_eq!(failed, 0, "v{i}: {failed} of {done} checks failed");
        v.close(Duration::from_secs(1)).await;
    }
}

/// A node that takes the connection and never answers fails a check within one `connect_timeout`
/// (300 ms here), however many exports the check would ask (eight): three rounds of checks (each a 50 ms
/// period and the timeout) take well under 3 x (2 x 300 ms + 50 ms), where a deadline that grew with the
/// exports asked would take 8 x 300 ms a round.
#[tokio::test]
async fn a_silent_node_fails_a_check_within_one_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.180:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let node = node_at("a", addr);
    let cfg = LinkConfig { read_only_check: Some(Duration::from_millis(50)), ..config(Duration::from_millis(300)) };
    let opens = (0..8).map(|i| {
        let node = &node;
        async move { open_on(&format!("v{i}"), node, &format!("e{i}"), cfg).await }
    });
    let volumes = futures_util::future::join_all(opens).await;
    let v = &volumes[0];
    until("2 failed checks", || counted(v).1 >= 2).await;
    let t0 = tokio::time::Instant::now();
    until("3 more failed checks", || counted(v).1 >= 5).await;
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(3 * 650), "3 rounds of checks took {took:?}");
    assert_eq!(counted(v).0, counted(v).1, "every check failed");
    for v in &volumes {
        v.close(Duration::from_secs(1)).await;
    }
    silent.abort();
}
