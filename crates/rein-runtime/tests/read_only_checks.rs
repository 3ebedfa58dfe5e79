//! The gateway's check of its node exports' flags (`read_only_check_s`; remote.rs, "Read-only node
//! exports") against a fake node on 127.0.0.175: each check is a side connection that opens nothing
//! (NBD_OPT_INFO, then NBD_OPT_ABORT), and a node gets one check at a time from the whole gateway.
//!
//! A test binary of its own: in rein-runtime's unit tests it ran beside
//! `a_nodes_second_reply_is_named_as_such`, which captures its own thread's log with a scoped tracing
//! subscriber, and that capture then missed the line it waits for, every time (through tracing's
//! process-wide state; the exact path was not pinned down).
use rein_model::stripe::Stripe;
use rein_proto::nbd::{ExportInfo, ServerHandshake, ServerProgress, OPT_INFO};
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
    NodeSpec {
        name: name.into(),
        address: NodeAddress::Tcp(addr),
        protocol: NodeProtocol::Nbd,
        tls: None,
        log: Default::default(),
        route: Default::default(),
        checks: Default::default(),
    }
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

/// Two volumes on one node, each checking every 5 ms, with a node that takes 30 ms to answer a check:
/// never two checks open at once there (without `NodeSpec::checks`, the two volumes' checks overlapped:
/// two at once). Each check ends with NBD_OPT_ABORT (the node's handshake ends `Aborted`, counted as
/// done), and what it read (read-only) holds.
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
/// checks the healthy one at least 5 times within 3 s. A check waits for another volume's check of the
/// same node at most `connect_timeout`, then leaves the node out that time. Before, it waited its turn
/// behind every other volume's, 40 x 50 ms a round, and the healthy node was checked once or twice.
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
