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
/// answer a check (a connection whose first option is NBD_OPT_INFO) and counts the checks. Sessions
/// (NBD_OPT_GO) are served and held until the client leaves.
async fn slow_checked_node(slow: Duration) -> (SocketAddr, Arc<Checks>) {
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

/// Two volumes on one node, each checking every 5 ms, with a node that takes 30 ms to answer a check:
/// never two checks open at once there (without `NodeSpec::checks`, the two volumes' checks overlapped:
/// two at once). Each check ends with NBD_OPT_ABORT (the node's handshake ends `Aborted`, counted as
/// done), and what it read (read-only) holds.
#[tokio::test]
async fn a_node_gets_one_check_at_a_time() {
    let (addr, checks) = slow_checked_node(Duration::from_millis(30)).await;
    let node = NodeSpec {
        name: "a".into(),
        address: NodeAddress::Tcp(addr),
        protocol: NodeProtocol::Nbd,
        tls: None,
        log: Default::default(),
        route: Default::default(),
        checks: Default::default(),
    };
    let cfg = LinkConfig {
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        max_backoff: Duration::from_millis(100),
        connections: 1,
        read_only_check: Some(Duration::from_millis(5)),
    };
    let open = |name: &'static str| {
        let nodes = vec![node.clone()];
        async move {
            let stripe = Stripe::new(4096, &[1]).unwrap();
            RemoteVolume::open(name, 4096, stripe, &nodes, &["v".to_string()], None, cfg).await.unwrap()
        }
    };
    let (v, w) = (open("v").await, open("w").await);
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
