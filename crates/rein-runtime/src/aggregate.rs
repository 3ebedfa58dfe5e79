//! PARDA latency aggregation over real transports (parda.txt §4.2), feeding the core's
//! [`rein_core::parda::Aggregator`].
//!
//! Each host publishes its [`HostReport`] once per control period and collects everyone's; the core
//! aggregator turns what arrived into the cluster signal (IO-weighted average of live hosts), ignoring
//! duplicates and stale reports and dropping hosts silent for longer than its timeout (by the local
//! clock, never the peers'). The record is rein-proto's 64-byte block with a CRC-32: corrupt or torn
//! records are counted and skipped, never fed to the aggregator.
//!
//! - [`FileAggregation`] (§4.2 filesystem-based): a shared file on the shared storage; host `i` owns the
//!   512-byte slot at offset `512 * i` and overwrites it each period with one positioned write
//!   (`pwrite`); every host reads the whole file back with one positioned read. Sector-sized slots mean a
//!   host's write never overlaps another's. Blocking calls: run them on a blocking thread (they are one
//!   small IO each, once per period).
//! - [`UdpAggregation`] (§4.2 network-based): each host sends its record as one datagram to every peer;
//!   peers are configured as (host id, address) pairs and a datagram is accepted only from the address
//!   configured for the host id it names (a misconfigured or spoofing sender is counted, not believed).
//!
//! Time (`now`) is passed in by the caller, as in the core: liveness is the caller's monotonic clock at
//! collection time, so tests drive it explicitly and a daemon passes its clock.
//!
//! [`Transport`] makes the two interchangeable for a host's control loop: once per period,
//! `transport.exchange(now, &host.close_period(now), &mut aggregator)`, then
//! `host.on_period(now, aggregator.cluster(now).map(|c| c.latency_ns))`.

use rein_core::parda::{Accept, Aggregator, HostReport, MAX_HOSTS};
use rein_core::Nanos;
use rein_proto::parda::{
    decode, decode_slot, encode, encode_slot, slot_offset, RecordError, Slot, RECORD_BYTES, SLOT_BYTES,
};
use std::fs::{File, OpenOptions};
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// Largest datagram read (anything longer than a record is refused as oversized).
const MAX_DATAGRAM: usize = 1024;

/// Why a transport could not be set up or an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum AggregationError {
    /// A host id at or above the bound: the file's slot count, or [`MAX_HOSTS`] for UDP.
    #[error("host id {id} out of range for this aggregation file ({max} slots)")]
    HostId {
        /// The host id given.
        id: u32,
        /// The bound it must stay below.
        max: u32,
    },
    /// The file's slot count is 0 or above [`MAX_HOSTS`].
    #[error("aggregation file must have between 1 and {MAX_HOSTS} slots, got {0}")]
    Slots(u32),
    /// Opening, reading or writing the file, or binding the UDP socket, failed.
    #[error("{op} on the aggregation file failed: {source}")]
    Io {
        /// The call: `open`, `read`, `write` or `bind`.
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// Two peers were configured with this host id.
    #[error("two peers have host id {0}")]
    DuplicatePeer(u32),
}

/// What one collection saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CollectStats {
    /// New reports fed to the aggregator.
    pub accepted: usize,
    /// Reports the aggregator had already seen (re-read blocks, repeated datagrams).
    pub duplicate: usize,
    /// Older than what the aggregator has for that host.
    pub stale: usize,
    /// Never-written slots.
    pub empty: usize,
    /// Records that failed to decode (checksum, size, magic, ...), with where they came from: the slot
    /// index (file) or the sender (UDP).
    pub corrupt: Vec<(String, RecordError)>,
    /// Valid records that named the wrong host for where they were found (slot or sender address).
    pub misplaced: usize,
}

impl CollectStats {
    fn count(&mut self, a: Accept) {
        match a {
            Accept::First | Accept::Newer | Accept::Restarted => self.accepted += 1,
            Accept::Duplicate => self.duplicate += 1,
            Accept::Stale => self.stale += 1,
        }
    }
}

/// The filesystem-based transport; see the module comment.
#[derive(Debug)]
pub struct FileAggregation {
    file: Arc<File>,
    slots: u32,
    buf: Vec<u8>,
}

impl FileAggregation {
    /// Opens (creating it if needed, never truncating) the shared file with room for `slots` hosts.
    pub fn open(path: &Path, slots: u32) -> Result<FileAggregation, AggregationError> {
        if slots == 0 || slots > MAX_HOSTS {
            return Err(AggregationError::Slots(slots));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|source| AggregationError::Io { op: "open", source })?;
        Ok(FileAggregation { file: Arc::new(file), slots, buf: vec![0; slots as usize * SLOT_BYTES] })
    }

    /// Hosts the file has room for: host `i` owns the slot at byte `512 * i`, for `i < slots`.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Writes `report` into its host's slot (one `pwrite` of 512 bytes).
    pub fn publish(&self, report: &HostReport) -> Result<(), AggregationError> {
        if report.host >= self.slots {
            return Err(AggregationError::HostId { id: report.host, max: self.slots });
        }
        self.file
            .write_all_at(&encode_slot(report), slot_offset(report.host))
            .map_err(|source| AggregationError::Io { op: "write", source })
    }

    /// Reads the whole file in one read and feeds every valid record to `agg` as received at `now`.
    /// A file shorter than the slot table (hosts that never wrote) reads as empty slots.
    pub fn collect(&mut self, now: Nanos, agg: &mut Aggregator) -> Result<CollectStats, AggregationError> {
        read_table(&self.file, &mut self.buf)?;
        Ok(feed_table(&self.buf, now, agg))
    }
}

/// Either transport, for a host's control loop (module comment).
#[derive(Debug)]
pub enum Transport {
    /// Through a shared file on the shared storage.
    File(FileAggregation),
    /// By datagrams to every peer.
    Udp(UdpAggregation),
}

impl Transport {
    /// One period's exchange: publishes this host's `report`, feeds it to `agg` (a host counts its own
    /// latency), and feeds `agg` whatever the other hosts published that has arrived (the whole file, or
    /// the datagrams received since the last exchange). File IO runs on tokio's blocking pool.
    pub async fn exchange(
        &mut self,
        now: Nanos,
        report: &HostReport,
        agg: &mut Aggregator,
    ) -> Result<CollectStats, AggregationError> {
        match self {
            Transport::File(f) => {
                if report.host >= f.slots {
                    return Err(AggregationError::HostId { id: report.host, max: f.slots });
                }
                let file = f.file.clone();
                let mut buf = std::mem::take(&mut f.buf);
                let r = *report;
                let (buf, res) = tokio::task::spawn_blocking(move || {
                    let res = file
                        .write_all_at(&encode_slot(&r), slot_offset(r.host))
                        .map_err(|source| AggregationError::Io { op: "write", source })
                        .and_then(|()| read_table(&file, &mut buf));
                    (buf, res)
                })
                .await
                .expect("the aggregation file task does not panic");
                f.buf = buf;
                res?;
                Ok(feed_table(&f.buf, now, agg))
            }
            Transport::Udp(u) => {
                u.publish(report).await;
                agg.accept(now, *report).expect("host ids are validated at bind");
                Ok(u.drain(now, agg))
            }
        }
    }
}

/// Reads the slot table into `buf` (zeros past the end of the file).
fn read_table(file: &File, buf: &mut [u8]) -> Result<(), AggregationError> {
    buf.fill(0);
    let mut got = 0;
    // One positioned read; the loop only continues after a short read (signals, network filesystems).
    while got < buf.len() {
        let n =
            file.read_at(&mut buf[got..], got as u64).map_err(|source| AggregationError::Io { op: "read", source })?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(())
}

/// Decodes every slot of the table and feeds the valid records to `agg`.
fn feed_table(buf: &[u8], now: Nanos, agg: &mut Aggregator) -> CollectStats {
    let mut stats = CollectStats::default();
    for (i, slot) in buf.chunks_exact(SLOT_BYTES).enumerate() {
        match decode_slot(slot) {
            Ok(Slot::Empty) => stats.empty += 1,
            Ok(Slot::Record(r)) if r.host as usize != i => stats.misplaced += 1,
            Ok(Slot::Record(r)) => {
                let a = agg.accept(now, r).expect("slot index is below MAX_HOSTS");
                stats.count(a);
            }
            Err(e) => stats.corrupt.push((format!("slot {i}"), e)),
        }
    }
    stats
}

/// The network-based transport; see the module comment.
#[derive(Debug)]
pub struct UdpAggregation {
    socket: tokio::net::UdpSocket,
    host: u32,
    /// (host id, address) of every other host.
    peers: Vec<(u32, SocketAddr)>,
}

impl UdpAggregation {
    /// Binds `addr` for host `host` and sends to `peers` (host id, address); the host's own entry, if
    /// present, is left out.
    pub async fn bind(
        host: u32,
        addr: SocketAddr,
        peers: &[(u32, SocketAddr)],
    ) -> Result<UdpAggregation, AggregationError> {
        if host >= MAX_HOSTS {
            return Err(AggregationError::HostId { id: host, max: MAX_HOSTS });
        }
        let mut v: Vec<(u32, SocketAddr)> = Vec::new();
        for &(id, a) in peers {
            if id >= MAX_HOSTS {
                return Err(AggregationError::HostId { id, max: MAX_HOSTS });
            }
            if v.iter().any(|p| p.0 == id) {
                return Err(AggregationError::DuplicatePeer(id));
            }
            if id != host {
                v.push((id, a));
            }
        }
        let socket =
            tokio::net::UdpSocket::bind(addr).await.map_err(|source| AggregationError::Io { op: "bind", source })?;
        Ok(UdpAggregation { socket, host, peers: v })
    }

    /// The address the socket is bound to (with the real port when bound to port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Sets the peers (e.g. once every host has bound and its port is known).
    pub fn set_peers(&mut self, peers: &[(u32, SocketAddr)]) {
        self.peers = peers.iter().copied().filter(|p| p.0 != self.host).collect();
    }

    /// Sends `report` to every peer (one datagram each); returns how many sends succeeded (a peer that is
    /// down makes its send fail on some systems; that is not an error for the others).
    pub async fn publish(&self, report: &HostReport) -> usize {
        let rec = encode(report);
        let mut ok = 0;
        for &(_, a) in &self.peers {
            if self.socket.send_to(&rec, a).await.is_ok() {
                ok += 1;
            }
        }
        ok
    }

    /// Waits until a datagram is ready to read, at most `timeout`; false on timeout.
    pub async fn wait_readable(&self, timeout: std::time::Duration) -> bool {
        tokio::time::timeout(timeout, self.socket.readable()).await.is_ok_and(|r| r.is_ok())
    }

    /// Reads every datagram already received (without waiting) and feeds the valid ones to `agg` as
    /// received at `now`.
    pub fn drain(&self, now: Nanos, agg: &mut Aggregator) -> CollectStats {
        let mut stats = CollectStats::default();
        let mut buf = [0u8; MAX_DATAGRAM];
        loop {
            let (n, from) = match self.socket.try_recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // ICMP errors from earlier sends surface here on some systems; skip them.
                Err(_) => continue,
            };
            if n > RECORD_BYTES {
                stats.corrupt.push((from.to_string(), RecordError::Size { got: n, want: RECORD_BYTES }));
                continue;
            }
            match decode(&buf[..n]) {
                Err(e) => stats.corrupt.push((from.to_string(), e)),
                Ok(r) if !self.peers.iter().any(|&(id, a)| id == r.host && a == from) => stats.misplaced += 1,
                Ok(r) => {
                    let a = agg.accept(now, r).expect("decoded host ids are below MAX_HOSTS");
                    stats.count(a);
                }
            }
        }
        stats
    }
}
