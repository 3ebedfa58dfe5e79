//! PARDA latency aggregation over a real shared file and real UDP sockets on 127.0.0.x.
//!
//! Four hosts (threads for the file, tokio tasks for UDP, each UDP host on its own 127.0.0.x address)
//! run twelve 2-second control periods. Time (`now`) is explicit; only the sockets and the file are real.
//! Scripted faults, checked by every host every period:
//! - host 3 stops reporting after period 4 (drops out once its last report is older than the 5 s
//!   timeout: from period 7) and comes back at period 10 as a new incarnation (epoch 2, seq 1);
//! - period 6: host 1's record is corrupted after it is written (a flipped byte in the file; a
//!   bit-flipped datagram), and a valid record for host 1 arrives from the wrong place (another slot; an
//!   unknown sender): counted and skipped; host 1 stays live on its previous report;
//! - period 8: a torn write (half a new record over host 0's old one) in the file;
//! - host 2's clock jumps an hour ahead at period 4 and a day back at period 8: its reports keep
//!   counting (liveness and ordering use the receiver's clock and sequence numbers).
use rein_core::parda::{Aggregator, HostReport};
use rein_core::Nanos;
use rein_proto::parda::{encode, encode_slot, SLOT_BYTES};
use rein_runtime::aggregate::{CollectStats, FileAggregation, UdpAggregation};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Barrier};
use std::time::Duration;

const HOSTS: u32 = 4;
const PERIODS: u64 = 12;
const TIMEOUT: Nanos = Nanos::from_secs(5);

fn now(k: u64) -> Nanos {
    Nanos::from_secs(2 * k)
}

/// Whether host `h` reports in period `k`.
fn reports(h: u32, k: u64) -> bool {
    h != 3 || k <= 4 || k >= 10
}

/// Host `h`'s report for period `k`.
fn report(h: u32, k: u64) -> HostReport {
    let (epoch, seq) = if h == 3 && k >= 10 { (2, k - 9) } else { (1, k) };
    let timestamp = match (h, k) {
        (2, 4..=7) => Nanos::from_secs(3600 + 2 * k),
        (2, 8..) => Nanos::from_secs(2 * k).saturating_sub(Nanos::from_secs(86_400)),
        _ => now(k),
    };
    HostReport {
        host: h,
        epoch,
        seq,
        timestamp,
        latency_ns: (10 + 10 * h as u64 + k) * 1_000_000,
        ios: 100 * (h as u64 + 1),
    }
}

/// The report of host `h` the aggregators should use in period `k` (its latest valid one), if it is live.
fn effective(h: u32, k: u64) -> Option<HostReport> {
    let last = (1..=k).rev().find(|&j| reports(h, j))?;
    // A report received at now(last) is live while now(k) - now(last) < 5 s.
    if now(k).0 - now(last).0 >= TIMEOUT.0 {
        return None;
    }
    // Corrupted in the file/network in period 6 (host 1) and torn in period 8 (host 0, file only):
    // the previous one stands.
    Some(report(h, last))
}

/// The expected signal in period `k`. `torn`: the file test's torn write to host 0 in period 8.
/// `own1`: the viewer has host 1's period-6 report first-hand (UDP host 1 itself).
fn expected(k: u64, torn: bool, own1: bool) -> (f64, usize) {
    let (mut sum, mut ios, mut n) = (0.0, 0u64, 0);
    for h in 0..HOSTS {
        let Some(mut r) = effective(h, k) else { continue };
        if (h == 1 && k == 6 && !own1) || (torn && h == 0 && k == 8) {
            r = report(h, k - 1);
        }
        sum += r.latency_ns as f64 * r.ios as f64;
        ios += r.ios;
        n += 1;
    }
    (sum / ios as f64, n)
}

/// Checks a host's view in period `k`. Returns the problems found rather than panicking, so a failing
/// host does not leave the others waiting at a barrier: the test asserts at the end.
fn check(who: &str, k: u64, agg: &mut Aggregator, torn: bool, own1: bool) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(c) = agg.cluster(now(k)) else { return vec![format!("{who}, period {k}: no live host")] };
    let (want, hosts) = expected(k, torn, own1);
    if c.hosts != hosts {
        errors.push(format!("{who}, period {k}: {} live hosts, want {hosts} ({:?})", c.hosts, agg.live_hosts(now(k))));
    }
    if (c.latency_ns - want).abs() > 1e-6 {
        errors.push(format!("{who}, period {k}: cluster latency {} vs {want}", c.latency_ns));
    }
    if agg.is_live(now(k), 3) != (k <= 6 || k >= 10) {
        errors.push(format!("{who}, period {k}: host 3 liveness wrong"));
    }
    if !agg.is_live(now(k), 2) {
        errors.push(format!("{who}, period {k}: host 2's clock jumps must not matter"));
    }
    errors
}

/// A path in a fresh directory under the temp dir; the guard removes the directory and what is in it when
/// dropped (also on a panic).
fn temp_path(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::Builder::new().prefix("rein-aggregate-").tempdir().expect("temp dir");
    let path = dir.path().join(name);
    (dir, path)
}

#[test]
fn shared_file_aggregation_with_faults() {
    let (_dir, path) = temp_path("file");
    let barrier = Arc::new(Barrier::new(HOSTS as usize + 1));
    let mut threads = Vec::new();
    for h in 0..HOSTS {
        let (path, barrier) = (path.clone(), barrier.clone());
        threads.push(std::thread::spawn(move || {
            let mut file = FileAggregation::open(&path, 8).unwrap();
            let mut agg = Aggregator::new(TIMEOUT).unwrap();
            let mut seen: Vec<CollectStats> = Vec::new();
            let mut errors = Vec::new();
            for k in 1..=PERIODS {
                if reports(h, k) {
                    file.publish(&report(h, k)).unwrap();
                }
                barrier.wait(); // everyone has written
                barrier.wait(); // the gremlin has struck
                let stats = file.collect(now(k), &mut agg).unwrap();
                errors.extend(check(&format!("file host {h}"), k, &mut agg, true, false));
                seen.push(stats);
                barrier.wait(); // everyone has read
            }
            (seen, errors)
        }));
    }
    let mut gremlin = None;
    for k in 1..=PERIODS {
        barrier.wait(); // everyone has written (so the file exists)
        let gremlin =
            gremlin.get_or_insert_with(|| std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap());
        match k {
            6 => {
                // Flip one byte of host 1's record; write a valid host-1 record into host 5's slot.
                let mut b = [0u8; 1];
                gremlin.read_exact_at(&mut b, SLOT_BYTES as u64 + 40).unwrap();
                gremlin.write_all_at(&[b[0] ^ 0x04], SLOT_BYTES as u64 + 40).unwrap();
                gremlin.write_all_at(&encode_slot(&report(1, 99)), 5 * SLOT_BYTES as u64).unwrap();
            }
            7 => gremlin.write_all_at(&[0u8; SLOT_BYTES], 5 * SLOT_BYTES as u64).unwrap(),
            8 => {
                // Torn write: the first half of host 0's next record over its current one.
                let next = encode(&HostReport { seq: 100, latency_ns: 1, ..report(0, 8) });
                gremlin.write_all_at(&next[..32], 0).unwrap();
            }
            _ => {}
        }
        barrier.wait(); // gremlin done
        barrier.wait(); // everyone has read
    }
    for t in threads {
        let (seen, errors) = t.join().unwrap();
        assert!(errors.is_empty(), "{}", errors.join("\n"));
        // Period 1: 4 records, 4 empty slots. Period 6: host 1 corrupt, slot 5 misplaced.
        assert_eq!((seen[0].accepted, seen[0].empty), (4, 4));
        assert_eq!(seen[5].corrupt.len(), 1, "{:?}", seen[5]);
        assert_eq!(seen[5].corrupt[0].0, "slot 1");
        assert!(seen[5].corrupt[0].1.to_string().contains("checksum"), "{}", seen[5].corrupt[0].1);
        assert_eq!(seen[5].misplaced, 1);
        assert_eq!(seen[7].corrupt.len(), 1, "torn write in period 8: {:?}", seen[7]);
        // Host 3's last block stays in the file while it is away: re-read as a duplicate, not as life.
        assert!(seen[7].duplicate >= 1);
    }
}

#[test]
fn shared_file_bounds_and_errors() {
    let (_dir, path) = temp_path("bounds");
    assert!(FileAggregation::open(&path, 0).unwrap_err().to_string().contains("between 1 and"));
    assert!(FileAggregation::open(&path, rein_core::parda::MAX_HOSTS + 1).is_err());
    let mut f = FileAggregation::open(&path, 2).unwrap();
    let e = f.publish(&report(2, 1)).unwrap_err();
    assert!(e.to_string().contains("host id 2 out of range"), "{e}");
    // An empty (new) file reads as empty slots; a file longer than the table is read up to the table.
    let mut agg = Aggregator::new(TIMEOUT).unwrap();
    assert_eq!(f.collect(now(1), &mut agg).unwrap().empty, 2);
    f.publish(&report(1, 1)).unwrap();
    let st = f.collect(now(1), &mut agg).unwrap();
    assert_eq!((st.accepted, st.empty), (1, 1));
    // The largest table: one read of MAX_HOSTS slots.
    let (_dir2, path2) = temp_path("max");
    let mut big = FileAggregation::open(&path2, rein_core::parda::MAX_HOSTS).unwrap();
    big.publish(&HostReport { host: rein_core::parda::MAX_HOSTS - 1, ..report(0, 1) }).unwrap();
    let st = big.collect(now(1), &mut Aggregator::new(TIMEOUT).unwrap()).unwrap();
    assert_eq!((st.accepted, st.empty), (1, rein_core::parda::MAX_HOSTS as usize - 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_aggregation_with_faults() {
    // A failing host would leave the others at a barrier: bound the whole test instead of hanging.
    tokio::time::timeout(Duration::from_secs(120), udp_faults()).await.expect("test timed out");
}

async fn udp_faults() {
    let addr = |i: u32| -> SocketAddr { format!("127.0.0.{}:0", i + 1).parse().unwrap() };
    let mut socks = Vec::new();
    for h in 0..HOSTS {
        socks.push(UdpAggregation::bind(h, addr(h), &[]).await.unwrap());
    }
    let peers: Vec<(u32, SocketAddr)> =
        socks.iter().enumerate().map(|(h, s)| (h as u32, s.local_addr().unwrap())).collect();
    for (h, s) in socks.iter_mut().enumerate() {
        s.set_peers(&peers);
        assert_eq!(
            s.local_addr().unwrap().ip().to_string(),
            format!("127.0.0.{}", h + 1),
            "each host has its own address"
        );
    }
    // The gremlin sends from an address no host is configured with.
    let gremlin = tokio::net::UdpSocket::bind("127.0.0.9:0").await.unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(HOSTS as usize + 1));
    let mut tasks = Vec::new();
    for (h, sock) in socks.into_iter().enumerate() {
        let h = h as u32;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut agg = Aggregator::new(TIMEOUT).unwrap();
            let mut seen = Vec::new();
            let mut errors = Vec::new();
            for k in 1..=PERIODS {
                if reports(h, k) {
                    let own = report(h, k);
                    // Host 1's period-6 datagrams are "damaged in the network": the gremlin sends them.
                    if !(h == 1 && k == 6) {
                        sock.publish(&own).await;
                    }
                    agg.accept(now(k), own).unwrap();
                }
                barrier.wait().await; // everyone (and the gremlin) has sent
                                      // Datagrams this host should get this period: one per other reporting host, plus the
                                      // gremlin's two in period 6.
                let want = (0..HOSTS).filter(|&o| o != h && reports(o, k) && !(o == 1 && k == 6)).count()
                    + if k == 6 && h != 1 { 2 } else { 0 };
                let mut st = CollectStats::default();
                while st.accepted + st.duplicate + st.stale + st.corrupt.len() + st.misplaced < want {
                    if !sock.wait_readable(Duration::from_secs(10)).await {
                        errors.push(format!("host {h}, period {k}: datagrams lost ({st:?})"));
                        break;
                    }
                    let more = sock.drain(now(k), &mut agg);
                    st.accepted += more.accepted;
                    st.duplicate += more.duplicate;
                    st.stale += more.stale;
                    st.misplaced += more.misplaced;
                    st.corrupt.extend(more.corrupt);
                }
                errors.extend(check(&format!("udp host {h}"), k, &mut agg, false, h == 1));
                seen.push(st);
                barrier.wait().await; // everyone has read
            }
            (seen, errors)
        }));
    }
    for k in 1..=PERIODS {
        if k == 6 {
            // Host 1's record for this period with one flipped bit, and a valid one from the wrong sender,
            // to every host but host 1.
            let mut bad = encode(&report(1, 6));
            bad[33] ^= 0x80;
            for &(id, a) in &peers {
                if id != 1 {
                    gremlin.send_to(&bad, a).await.unwrap();
                    gremlin.send_to(&encode(&report(1, 98)), a).await.unwrap();
                }
            }
        }
        barrier.wait().await;
        barrier.wait().await;
    }
    for (h, t) in tasks.into_iter().enumerate() {
        let (seen, errors) = t.await.unwrap();
        assert!(errors.is_empty(), "{}", errors.join("\n"));
        assert_eq!(seen[0].accepted, 3, "host {h}");
        if h != 1 {
            assert_eq!(seen[5].corrupt.len(), 1, "host {h}: {:?}", seen[5]);
            assert!(seen[5].corrupt[0].0.starts_with("127.0.0.9:"));
            assert_eq!(seen[5].misplaced, 1, "host {h}");
        }
    }
}

/// Three PARDA hosts (rein-core's `HostController`, one tokio task each) run their control loop through
/// either transport: every period each completes IOs with its own latency (20, 30, 40 ms; 100, 200, 300
/// IOs), closes the period, exchanges reports and updates its window from the cluster signal. Every
/// host's signal is the IO-weighted mean, 33.3 ms.
async fn control_loop_over(kind: &str) {
    use rein_core::parda::{HostConfig, HostController, PardaConfig};
    use rein_core::{Poll, QosSpec, Request};
    use rein_runtime::aggregate::Transport;
    const N: u32 = 3;
    let (_dir, path) = temp_path(&format!("loop-{kind}"));
    let mut transports = Vec::new();
    for h in 0..N {
        transports.push(match kind {
            "file" => Transport::File(FileAggregation::open(&path, N).unwrap()),
            _ => Transport::Udp(
                UdpAggregation::bind(h, format!("127.0.0.{}:0", h + 1).parse().unwrap(), &[]).await.unwrap(),
            ),
        });
    }
    let peers: Vec<(u32, SocketAddr)> = transports
        .iter()
        .enumerate()
        .filter_map(|(h, t)| match t {
            Transport::Udp(u) => Some((h as u32, u.local_addr().unwrap())),
            Transport::File(_) => None,
        })
        .collect();
    for t in &mut transports {
        if let Transport::Udp(u) = t {
            u.set_peers(&peers);
        }
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(N as usize));
    let mut tasks = Vec::new();
    for (h, mut transport) in transports.into_iter().enumerate() {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let c = PardaConfig { latency_threshold: Nanos::from_millis(30), ..PardaConfig::default() };
            let mut host = HostController::new(
                c,
                HostConfig { id: h as u32, beta: Some(1.0), ..HostConfig::default() },
                Nanos::ZERO,
            )
            .unwrap();
            let vm = host.add_vm(QosSpec::weighted(1.0).unwrap()).unwrap();
            let mut agg = Aggregator::new(TIMEOUT).unwrap();
            let mut signals = Vec::new();
            for k in 1..=6u64 {
                let t = now(k);
                for n in 0..100 * (h as u64 + 1) {
                    host.enqueue(t, Request::new(vm, n)).unwrap();
                    let Poll::Dispatch(d) = host.poll(t) else { panic!("window has room") };
                    host.on_complete(t, d.tenant, Nanos::from_millis(20 + 10 * h as u64), 16384).unwrap();
                }
                let report = host.close_period(t);
                transport.exchange(t, &report, &mut agg).await.unwrap();
                barrier.wait().await; // everyone has published
                if let Transport::Udp(u) = &transport {
                    // Datagrams of this period: wait (bounded) until every peer's has arrived.
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                    while agg.peers().filter(|(_, p)| p.last.seq == k).count() < N as usize
                        && tokio::time::Instant::now() < deadline
                    {
                        u.wait_readable(Duration::from_millis(100)).await;
                        u.drain(t, &mut agg);
                    }
                } else if let Transport::File(f) = &mut transport {
                    f.collect(t, &mut agg).unwrap();
                }
                let signal = agg.cluster(t).map(|c| c.latency_ns);
                host.on_period(t, signal);
                signals.push(signal);
                barrier.wait().await; // everyone has read
            }
            (signals, host.stats().window)
        }));
    }
    let want = (20.0 * 100.0 + 30.0 * 200.0 + 40.0 * 300.0) / 600.0 * 1e6;
    let mut windows = Vec::new();
    for t in tasks {
        let (signals, window) = t.await.unwrap();
        for s in &signals {
            assert!((s.unwrap() - want).abs() < 1.0, "{kind}: signal {s:?} vs {want}");
        }
        windows.push(window);
    }
    // Same beta, same signal every period: the same window everywhere, below w_max (33 ms > 30 ms).
    assert!(windows.iter().all(|w| (w - windows[0]).abs() < 1e-9 && *w < 64.0), "{kind}: {windows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pardas_control_loop_over_the_shared_file() {
    // A failing host would leave the others at a barrier: bound the whole test instead of hanging.
    tokio::time::timeout(Duration::from_secs(120), control_loop_over("file")).await.expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pardas_control_loop_over_udp() {
    tokio::time::timeout(Duration::from_secs(120), control_loop_over("udp")).await.expect("test timed out");
}

/// Waits until `u` has a datagram to read (the sends are on loopback: at once), then drains it.
async fn drain_now(u: &UdpAggregation, k: u64, agg: &mut Aggregator) -> CollectStats {
    assert!(u.wait_readable(Duration::from_secs(5)).await, "nothing arrived");
    // Let every datagram of the batch land.
    tokio::time::sleep(Duration::from_millis(20)).await;
    u.drain(now(k), agg)
}

/// Signed reports (`[parda_host] key_file`): a sender that owns the peer's address (as anyone can who
/// forges a UDP source address) gets nothing believed without the key, and a replayed signed record
/// of an older incarnation cannot displace the live one. Without a key, the address check alone takes
/// the forgery: what the key closes.
#[tokio::test]
async fn signed_udp_reports_refuse_forgeries_from_the_peers_address() {
    use rein_proto::parda::{encode_signed, RecordError};
    use rein_runtime::aggregate::RecordKey;
    let key = Arc::new(RecordKey::new("parda", &[7u8; 32]).unwrap());
    let other = RecordKey::new("parda", &[8u8; 32]).unwrap();
    // The forger holds host 1's configured address.
    let forger = tokio::net::UdpSocket::bind("127.0.0.13:0").await.unwrap();
    let peer = forger.local_addr().unwrap();
    let open = UdpAggregation::bind(0, "127.0.0.12:0".parse().unwrap(), &[(1, peer)]).await.unwrap();
    let signed = UdpAggregation::bind(0, "127.0.0.12:0".parse().unwrap(), &[(1, peer)])
        .await
        .unwrap()
        .with_key(Some(key.clone()));
    let forged = HostReport { latency_ns: 900_000_000, ..report(1, 1) };
    // Without a key: believed on the address.
    let mut agg = Aggregator::new(TIMEOUT).unwrap();
    forger.send_to(&encode(&forged), open.local_addr().unwrap()).await.unwrap();
    assert_eq!(drain_now(&open, 1, &mut agg).await.accepted, 1, "the address alone is believed");
    // With a key: unsigned, signed with another key, and a signed record replayed with a bit flipped.
    let mut agg = Aggregator::new(TIMEOUT).unwrap();
    let to = signed.local_addr().unwrap();
    forger.send_to(&encode(&forged), to).await.unwrap();
    forger.send_to(&encode_signed(&forged, &other), to).await.unwrap();
    let mut flipped = encode_signed(&report(1, 1), key.as_ref());
    flipped[40] ^= 0x80;
    forger.send_to(&flipped, to).await.unwrap();
    let st = drain_now(&signed, 1, &mut agg).await;
    assert_eq!(st.accepted, 0, "{st:?}");
    let why: Vec<&RecordError> = st.corrupt.iter().map(|(_, e)| e).collect();
    assert_eq!(why, [&RecordError::Unsigned, &RecordError::Tag, &RecordError::Tag]);
    assert!(agg.cluster(now(1)).is_none());
    // The genuine host 1 (the key, the address): believed; then its older incarnation replayed is stale.
    let genuine = HostReport { epoch: 5, ..report(1, 2) };
    forger.send_to(&encode_signed(&genuine, key.as_ref()), to).await.unwrap();
    let old = HostReport { epoch: 4, seq: 99, latency_ns: 900_000_000, ..report(1, 1) };
    forger.send_to(&encode_signed(&old, key.as_ref()), to).await.unwrap();
    forger.send_to(&encode_signed(&genuine, key.as_ref()), to).await.unwrap();
    let st = drain_now(&signed, 2, &mut agg).await;
    assert_eq!((st.accepted, st.stale, st.duplicate, st.refused()), (1, 1, 1, 0), "{st:?}");
    assert_eq!(agg.cluster(now(2)).unwrap().latency_ns, genuine.latency_ns as f64);
    // A host with the key publishes signed records that a keyed peer believes.
    let sender =
        UdpAggregation::bind(1, "127.0.0.14:0".parse().unwrap(), &[(0, to)]).await.unwrap().with_key(Some(key.clone()));
    let receiver = UdpAggregation::bind(0, "127.0.0.12:0".parse().unwrap(), &[(1, sender.local_addr().unwrap())])
        .await
        .unwrap()
        .with_key(Some(key.clone()));
    let mut sender = sender;
    sender.set_peers(&[(0, receiver.local_addr().unwrap())]);
    assert_eq!(sender.publish(&report(1, 3)).await, 1);
    let mut agg = Aggregator::new(TIMEOUT).unwrap();
    assert_eq!(drain_now(&receiver, 3, &mut agg).await.accepted, 1);
    // A host without the key names what is wrong with a signed record.
    sender.set_peers(&[(0, open.local_addr().unwrap())]);
    sender.publish(&report(1, 4)).await;
    let st = drain_now(&open, 4, &mut Aggregator::new(TIMEOUT).unwrap()).await;
    assert_eq!(st.corrupt.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>(), [RecordError::Signed]);
    assert!(st.corrupt[0].1.to_string().contains("no key"));
}

/// One host's records take only its own places in the inbox: a captured signed record of host 1 sent
/// 150 times from host 1's address (twice the inbox's 76 places) is counted as 149 duplicates, and host
/// 2's one record, sent first, still counts. Before, the copies filled the inbox (the oldest go
/// first) and pushed host 2's record out: with a replay a few hundred times a second, every other host
/// left the cluster signal, and nothing was counted as refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_record_repeated_does_not_crowd_out_the_other_hosts() {
    use rein_proto::parda::encode_signed;
    use rein_runtime::aggregate::RecordKey;
    let key = Arc::new(RecordKey::new("parda", &[7u8; 32]).unwrap());
    let h1 = tokio::net::UdpSocket::bind("127.0.0.18:0").await.unwrap();
    let h2 = tokio::net::UdpSocket::bind("127.0.0.19:0").await.unwrap();
    let peers = [(1, h1.local_addr().unwrap()), (2, h2.local_addr().unwrap())];
    let u = UdpAggregation::bind(0, "127.0.0.20:0".parse().unwrap(), &peers).await.unwrap().with_key(Some(key.clone()));
    let to = u.local_addr().unwrap();
    let captured = encode_signed(&report(1, 1), key.as_ref());
    h2.send_to(&encode_signed(&report(2, 1), key.as_ref()), to).await.unwrap();
    for i in 0..150 {
        h1.send_to(&captured, to).await.unwrap();
        if i % 25 == 24 {
            // Paced, so that the kernel's receive buffer drops none.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut agg = Aggregator::new(TIMEOUT).unwrap();
    let st = u.drain(now(1), &mut agg);
    assert_eq!((st.accepted, st.duplicate), (2, 149), "{st:?}");
    assert_eq!(agg.live_hosts(now(1)), [1, 2]);
}

/// A flood of junk is read as it comes (a task reads the socket all the time): one exchange counts it all,
/// keeping at most `MAX_REFUSED_SHOWN` with their reasons, and nothing is left for the next. A peer's record
/// sent after a flood far larger than the socket's buffer is still received: before, at most
/// `max_datagrams` were read an exchange, the buffer stayed full of junk and the kernel dropped the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_junk_neither_piles_up_nor_crowds_out_a_peer() {
    use rein_runtime::aggregate::MAX_REFUSED_SHOWN;
    let junk = tokio::net::UdpSocket::bind("127.0.0.15:0").await.unwrap();
    let peer = tokio::net::UdpSocket::bind("127.0.0.17:0").await.unwrap();
    let u = UdpAggregation::bind(0, "127.0.0.16:0".parse().unwrap(), &[(1, peer.local_addr().unwrap())]).await.unwrap();
    let to = u.local_addr().unwrap();
    let n = 100;
    for i in 0..n {
        junk.send_to(&[i as u8; 64], to).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut agg = Aggregator::new(TIMEOUT).unwrap();
    let st = u.drain(now(1), &mut agg);
    assert_eq!(st.refused(), n, "all read: {st:?}");
    assert_eq!((st.corrupt.len(), st.corrupt_more), (MAX_REFUSED_SHOWN, n - MAX_REFUSED_SHOWN));
    assert_eq!(u.drain(now(2), &mut agg).refused(), 0, "nothing left over");
    // 50,000 junk datagrams (about 50 MB of receive buffer at 1 KiB each; the default is 208 KiB), then
    // the peer's record.
    for i in 0..50_000u32 {
        let _ = junk.send_to(&i.to_le_bytes(), to).await;
    }
    // The record, sent again every 100 ms for up to 10 s (a busy machine reads the flood more slowly):
    // before, the junk stayed in the buffer and every copy was dropped.
    let mut st = CollectStats::default();
    for _ in 0..100 {
        peer.send_to(&encode(&report(1, 3)), to).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let more = u.drain(now(3), &mut agg);
        st.accepted += more.accepted;
        st.corrupt_more += more.refused();
        if st.accepted > 0 {
            break;
        }
    }
    assert_eq!(st.accepted, 1, "the peer's record was crowded out: {st:?}");
    assert!(st.corrupt_more > 0, "the flood was read too");
}

/// The shared file with a key: slots carry the tag, a keyed host believes only signed slots, and a host
/// without the key names a signed slot.
#[test]
fn signed_board_slots() {
    use rein_proto::parda::RecordError;
    use rein_runtime::aggregate::RecordKey;
    let key = Arc::new(RecordKey::new("parda", &[9u8; 16]).unwrap());
    let (_dir, path) = temp_path("signed");
    let keyed = FileAggregation::open(&path, 4).unwrap().with_key(Some(key.clone()));
    let mut plain = FileAggregation::open(&path, 4).unwrap();
    keyed.publish(&report(0, 1)).unwrap();
    plain.publish(&report(1, 1)).unwrap();
    let mut keyed = keyed;
    let st = keyed.collect(now(1), &mut Aggregator::new(TIMEOUT).unwrap()).unwrap();
    assert_eq!((st.accepted, st.empty), (1, 2));
    assert_eq!(st.corrupt, [("slot 1".to_string(), RecordError::Unsigned)]);
    let st = plain.collect(now(1), &mut Aggregator::new(TIMEOUT).unwrap()).unwrap();
    assert_eq!(st.accepted, 1);
    assert_eq!(st.corrupt, [("slot 0".to_string(), RecordError::Signed)]);
    // Keys of fewer than 128 bits are refused, naming the fix.
    let e = RecordKey::new("parda", &[1u8; 15]).unwrap_err();
    assert!(matches!(e, rein_runtime::aggregate::RecordKeyError::Short { bytes: 15, min: 16 }), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("at least 16") && e.contains("psktool"), "{e}");
}

/// A board deleted or replaced under a host (module comment, "A board deleted or replaced"): the host's
/// next exchange opens the path again (creating the file when it is gone), says what happened, and goes
/// on in the file at the path with the hosts there. Before, it went on in the file it had open.
#[tokio::test]
async fn a_board_deleted_or_replaced_is_opened_again() {
    use rein_proto::parda::{decode_slot, Slot};
    use rein_runtime::aggregate::{BoardChange, Transport};
    let (_dir, path) = temp_path("moved");
    let mut t = Transport::File(FileAggregation::open(&path, 2).unwrap());
    let mut agg = Aggregator::new(TIMEOUT).unwrap();
    let slot = |i: usize| {
        let b = std::fs::read(&path).unwrap();
        match decode_slot(&b[i * SLOT_BYTES..(i + 1) * SLOT_BYTES]).unwrap() {
            Slot::Record(r) => Some(r),
            Slot::Empty => None,
        }
    };
    assert_eq!(t.exchange(now(1), &report(0, 1), &mut agg).await.unwrap().reopened, None);
    // Deleted: created again, this host's record in it.
    std::fs::remove_file(&path).unwrap();
    let st = t.exchange(now(2), &report(0, 2), &mut agg).await.unwrap();
    assert_eq!(st.reopened, Some(BoardChange::Deleted));
    assert_eq!(slot(0), Some(report(0, 2)));
    assert_eq!(t.exchange(now(3), &report(0, 3), &mut agg).await.unwrap().reopened, None, "once");
    // Replaced by another file (a host that found it gone and created it, with its record): opened, and
    // the other host's record read from it.
    std::fs::remove_file(&path).unwrap();
    FileAggregation::open(&path, 2).unwrap().publish(&report(1, 1)).unwrap();
    let st = t.exchange(now(4), &report(0, 4), &mut agg).await.unwrap();
    assert_eq!((st.reopened, st.accepted), (Some(BoardChange::Replaced), 1), "{st:?}");
    assert_eq!((slot(0), slot(1)), (Some(report(0, 4)), Some(report(1, 1))));
    assert_eq!(agg.live_hosts(now(4)), [0, 1]);
    // A path that cannot be opened again (its directory gone): an error naming it; the host keeps its
    // file meanwhile.
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_dir(path.parent().unwrap()).unwrap();
    let e = t.exchange(now(5), &report(0, 5), &mut agg).await.unwrap_err();
    assert!(e.to_string().contains(&format!("the board {} was deleted", path.display())), "{e}");
    std::fs::create_dir(path.parent().unwrap()).unwrap();
    assert_eq!(t.exchange(now(6), &report(0, 6), &mut agg).await.unwrap().reopened, Some(BoardChange::Deleted));
}

/// Another host with this host's id (module comment, "Two hosts with one id"): on the board, a record of
/// another epoch in this host's slot since its last write; over UDP, a datagram with its id and another
/// epoch. Either is counted with where it came from and never fed to the aggregator; the host's own
/// record (its slot before its first write, its epoch coming back over UDP) is not.
#[tokio::test]
async fn a_record_with_this_hosts_id_from_another_host_is_named() {
    use rein_runtime::aggregate::Transport;
    let (_dir, path) = temp_path("one-id");
    let twin = |seq| HostReport { epoch: 9, latency_ns: 900_000_000, ..report(0, seq) };
    // A previous incarnation's record in the slot at the start is no conflict (not written yet).
    FileAggregation::open(&path, 2).unwrap().publish(&twin(1)).unwrap();
    let mut t = Transport::File(FileAggregation::open(&path, 2).unwrap());
    let mut agg = Aggregator::new(TIMEOUT).unwrap();
    assert_eq!(t.exchange(now(1), &report(0, 1), &mut agg).await.unwrap().same_id, 0);
    assert_eq!(t.exchange(now(2), &report(0, 2), &mut agg).await.unwrap().same_id, 0, "its own last record");
    // The twin writes the slot between this host's writes.
    FileAggregation::open(&path, 2).unwrap().publish(&twin(2)).unwrap();
    let st = t.exchange(now(3), &report(0, 3), &mut agg).await.unwrap();
    assert_eq!((st.same_id, st.same_id_shown.clone()), (1, vec![("slot 0".to_string(), twin(2))]), "{st:?}");
    assert_eq!(agg.cluster(now(3)).unwrap().latency_ns, report(0, 3).latency_ns as f64, "the twin is not fed");
    // UDP: host 0 hears from a twin (listed as peer 1's address) and from itself (its own address listed as
    // peer 1's: its own record comes back, misplaced as before).
    let twin_sock = tokio::net::UdpSocket::bind("127.0.0.18:0").await.unwrap();
    let u = UdpAggregation::bind(0, "127.0.0.19:0".parse().unwrap(), &[(1, twin_sock.local_addr().unwrap())])
        .await
        .unwrap();
    u.publish(&report(0, 1)).await;
    let mut buf = [0u8; 128];
    let (n, _) = twin_sock.recv_from(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], &encode(&report(0, 1))[..]);
    twin_sock.send_to(&encode(&twin(3)), u.local_addr().unwrap()).await.unwrap();
    twin_sock.send_to(&buf[..n], u.local_addr().unwrap()).await.unwrap();
    let mut agg = Aggregator::new(TIMEOUT).unwrap();
    let mut st = drain_now(&u, 1, &mut agg).await;
    if st.same_id + st.misplaced < 2 {
        let more = drain_now(&u, 1, &mut agg).await;
        st.same_id += more.same_id;
        st.same_id_shown.extend(more.same_id_shown);
        st.misplaced += more.misplaced;
        st.accepted += more.accepted;
    }
    let from = twin_sock.local_addr().unwrap().to_string();
    assert_eq!((st.same_id, st.misplaced, st.accepted), (1, 1, 0), "{st:?}");
    assert_eq!(st.same_id_shown, [(from, twin(3))]);
}

/// The peers of two hosts with one id (module comment, "Two hosts with one id"): on the board the two
/// overwrite slot 0, and a peer (host 1) that reads the slot switching between them sees two
/// incarnations, each advancing. From one timeout after the switch on, the older one's new records are
/// rivals, counted with where they came from; the aggregator keeps the live (newer) incarnation's
/// report. A host that restarted (its slot now holding the new incarnation only) is no rival.
#[tokio::test]
async fn a_peer_names_two_hosts_that_share_a_slot() {
    use rein_runtime::aggregate::Transport;
    let (_dir, path) = temp_path("peer-of-one-id");
    let twin = |epoch, seq| HostReport { epoch, ..report(0, seq) };
    let writer = FileAggregation::open(&path, 2).unwrap();
    let mut peer = Transport::File(FileAggregation::open(&path, 2).unwrap());
    let mut agg = Aggregator::new(TIMEOUT).unwrap();
    // A restart first: epoch 1's records, then epoch 2's only.
    let mut rivals = Vec::new();
    for k in 1..=4u64 {
        writer.publish(&twin(if k <= 2 { 1 } else { 2 }, k)).unwrap();
        let st = peer.exchange(now(k), &report(1, k), &mut agg).await.unwrap();
        rivals.push(st.rivals);
    }
    assert_eq!(rivals, [0; 4], "a restart");
    // Then epoch 1 writes again between epoch 2's writes: the two hosts alternate in the slot.
    for k in 5..=12u64 {
        writer.publish(&twin(if k % 2 == 1 { 1 } else { 2 }, k)).unwrap();
        let st = peer.exchange(now(k), &report(1, k), &mut agg).await.unwrap();
        // The switch to epoch 2 came at now(3): from one timeout (5 s) later, epoch 1's records are rivals.
        let want = usize::from(k % 2 == 1 && now(k).saturating_sub(now(3)) >= TIMEOUT);
        assert_eq!(st.rivals, want, "period {k}: {st:?}");
        if want == 1 {
            assert_eq!(st.rivals_shown, [("slot 0".to_string(), twin(1, k))]);
            assert_eq!((st.accepted, st.stale), (0, 1), "the rival not taken: {st:?}");
        }
        let live = agg.peers().find(|(h, _)| **h == 0).map(|(_, p)| p.last.epoch);
        assert_eq!(live, Some(2), "period {k}: the newer incarnation stays the live one");
    }
}
