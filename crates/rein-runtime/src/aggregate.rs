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
//!   small IO each, once per period). In a host's exchange ([`Transport::exchange`]) the read comes
//!   before the write, so the host's own slot shows what was written there since its last write (see
//!   "Two hosts with one id"), and the path is checked first (see "A board deleted or replaced").
//! - [`UdpAggregation`] (§4.2 network-based): each host sends its record as one datagram to every peer;
//!   peers are configured as (host id, address) pairs and a datagram is accepted only from the address
//!   configured for the host id it names (a misconfigured or spoofing sender is counted, not believed).
//!
//! With a [`RecordKey`] (`[parda_host] key_file`: a key every host shares) each record carries an
//! HMAC-SHA-256 tag (rein-proto's signed records) on both transports: a host then believes only records
//! signed with the key, whatever address or slot they come from, and the address check stays as a second
//! line. Without a key a UDP record is believed on its sender's address, which anyone who can send to
//! the host's port can forge. A replayed signed record is a duplicate or stale (sequence numbers, and
//! epochs that only move forward: rein-core's aggregator), also once its host is silent: an epoch a host
//! had before is never taken again (a stream captured while the host ran kept it live after it went
//! down). What a replay can still do: deliver records of the host's current epoch that this host never
//! received (lost datagrams), each once (no challenge, no synchronised clocks).
//!
//! Bounds: a task reads the UDP socket all the time (so junk never fills the kernel's buffer and crowds
//! out the peers' records: read at most [`max_datagrams`] a period, a flood of 8,000 junk datagrams a
//! second once cut peers out of the cluster average 9 times in 12); at most [`max_datagrams`] valid
//! records wait for an exchange (the oldest go first), of one host at most [`WAITING_PER_HOST`] (a record
//! no newer than the one of its epoch already waiting is counted as a duplicate or stale at once, so a
//! replayed record repeated takes one place, not every other host's), and at most [`MAX_REFUSED_SHOWN`] refused records
//! are kept with their reasons (the rest are counted), so a flood of junk costs a bounded amount of memory,
//! and one decode (a CRC, or an HMAC with a key) a datagram.
//!
//! # A board deleted or replaced
//! The board is opened once, and an open file outlives its name: a board deleted under running hosts
//! (or replaced, e.g. by a copy) left them writing the old file while a host that restarted created a
//! new one at the path, and the cluster split in two without a word. Each exchange therefore first
//! checks (one `stat`) that the path still names the file the host has open (same device and inode);
//! if not, it opens the path again as the start does (creating the file when it is gone) and exchanges
//! through the new file, and the collection says what happened ([`CollectStats::reopened`]: the host
//! logs it). Every host that notices does the same, so the hosts, restarted or not, meet in the one
//! file at the path again within a period. A path that cannot be opened again (its directory gone) is
//! an exchange error, and the host keeps exchanging through the file it has until it can.
//!
//! # A board that hangs
//! A board on a file system that stops answering (an NFS server gone, with a hard mount) holds the
//! thread that reads or writes it for as long as it is gone. The exchange waits for its board IO at most
//! [`FileAggregation::with_deadline`] (the host gives a quarter of its period, 5 to 100 ms); past that
//! it fails (`AggregationError::Slow`) and the IO runs on alone, on a thread of its own (a runtime
//! waits for its blocking pool's tasks when it stops: a hung one held a stopping gateway): the host's
//! control loop, which awaits the exchange, goes on issuing and completing its VMs' IOs, with the
//! reports it has (a peer drops out after the aggregator's timeout). Until
//! that IO ends no other starts (one blocking thread held, not one per period) and each exchange fails
//! at once (`AggregationError::Stuck`, with how long the IO has run); once it ends, the next exchange
//! feeds its reading (the aggregator takes only records newer than it has, received then: a period
//! late at most), its write, if it succeeded, counts as the host's last (see "Two hosts with one id"),
//! its errors are logged once, and a new IO starts. So a board slower than the deadline on every IO
//! (not hung) still exchanges, each reading a period late; before, its readings were dropped and the
//! host never exchanged.
//!
//! # Two hosts with one id
//! Two hosts configured with the same id are one host to their peers (one slot, one entry in the
//! aggregator). Each host tells by its epoch (its incarnation, rein-core's `HostConfig::epoch`, a start
//! time in nanoseconds: two hosts never share one): a valid record carrying the host's own id and another
//! epoch is another host's ([`CollectStats::same_id`]). Over UDP a host never sends to itself, so such a
//! datagram is another host's at once (a record of the host's own epoch that comes back is its own,
//! through a peer address that is its own: misplaced, as before). On the board the host's slot is read
//! before the host writes it, so it holds the host's last record unless another writer came in between;
//! the check starts after the host's first write into the file (the slot may hold a record of the
//! host's previous incarnation until then). Such records are never fed to the aggregator (the host's own
//! report stands for its id), and the host logs them (`parda_host`).
//!
//! Their peers see them too, where they can: on the board the two overwrite one slot, and a peer that
//! reads it sees records of two incarnations, each advancing (rein-core's `Accept::Rival`, counted in
//! [`CollectStats::rivals`]; a peer whose reads always fall between the same two writes sees one of them
//! only, and cannot tell). Over UDP a peer takes a host id's records from one configured address only,
//! so the other host's are refused as misplaced.
//!
//! Time (`now`) is passed in by the caller, as in the core: liveness is the caller's monotonic clock at
//! collection time, so tests drive it explicitly and a daemon passes its clock.
//!
//! [`Transport`] makes the two interchangeable for a host's control loop: once per period,
//! `transport.exchange(now, &host.close_period(now), &mut aggregator)`, then
//! `host.on_period(now, aggregator.cluster(now).map(|c| c.latency_ns))`.

use crate::lograte::LogRate;
use rein_core::parda::{Accept, Aggregator, HostReport, MAX_HOSTS};
use rein_core::Nanos;
use rein_proto::parda::{
    decode_datagram, decode_slot_with, encode_datagram, encode_slot_with, slot_offset, RecordAuth, RecordError, Slot,
    RECORD_BYTES, SIGNED_BYTES, SLOT_BYTES, TAG_BYTES,
};
use std::fs::{File, OpenOptions};
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest datagram read (anything longer than a signed record is refused as oversized).
const MAX_DATAGRAM: usize = 1024;
/// Refused records kept with their reasons per exchange (the rest are only counted).
pub const MAX_REFUSED_SHOWN: usize = 16;
/// Shortest record key: 128 bits.
pub const MIN_KEY_BYTES: usize = 16;

/// Datagrams one exchange reads at most, with `peers` other hosts: four per host and 64 more.
pub fn max_datagrams(peers: usize) -> usize {
    4 * (peers + 1) + 64
}

/// The hosts' shared key: signs this host's records and checks the others' (HMAC-SHA-256; module
/// comment).
pub struct RecordKey {
    key: openssl::pkey::PKey<openssl::pkey::Private>,
    /// The identity of the key's line in its file (for the log).
    identity: String,
    /// The first bytes of an all-zero record's tag: tells keys apart without showing one (`Debug`, which a
    /// reload compares).
    fingerprint: u32,
}

impl std::fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordKey")
            .field("identity", &self.identity)
            .field("fingerprint", &format_args!("{:08x}", self.fingerprint))
            .finish()
    }
}

/// Why a record key is refused ([`RecordKey::new`]).
#[derive(Debug, thiserror::Error)]
pub enum RecordKeyError {
    /// Fewer than `min` bytes.
    #[error(
        "the key has {bytes} bytes; a record key needs at least {min} (128 bits): `psktool -u parda -p FILE` \
         writes one of 32"
    )]
    Short {
        /// The key's length.
        bytes: usize,
        /// The shortest accepted ([`MIN_KEY_BYTES`]).
        min: usize,
    },
    /// OpenSSL refuses the key as an HMAC key.
    #[error("the key: {0}")]
    Key(openssl::error::ErrorStack),
    /// HMAC-SHA-256 does not work (so tagging in the control loop could fail).
    #[error("HMAC-SHA-256 is not available: {0}")]
    Hmac(openssl::error::ErrorStack),
}

/// Why a record key cannot be read from its file ([`RecordKey::from_file`]); the message names the key
/// and the file.
#[derive(Debug, thiserror::Error)]
pub enum RecordKeyFileError {
    /// The file cannot be read, or has no line for the identity.
    #[error("{0}")]
    Read(Box<crate::tls::CredentialError>),
    /// The file's key is refused.
    #[error("{key_name} {}: {error}", path.display())]
    Key {
        /// The key's setting (`parda_host.key_file`).
        key_name: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with the key.
        error: RecordKeyError,
    },
}

/// Why no record key could be made ([`RecordKey::generate_line`]): OpenSSL gave no random bytes.
#[derive(Debug, thiserror::Error)]
#[error("no random bytes for a record key: {0}")]
pub struct GenerateKeyError(#[source] openssl::error::ErrorStack);

impl RecordKey {
    /// A key of at least [`MIN_KEY_BYTES`] bytes.
    pub fn new(identity: &str, key: &[u8]) -> Result<RecordKey, RecordKeyError> {
        if key.len() < MIN_KEY_BYTES {
            return Err(RecordKeyError::Short { bytes: key.len(), min: MIN_KEY_BYTES });
        }
        let key = openssl::pkey::PKey::hmac(key).map_err(RecordKeyError::Key)?;
        let mut k = RecordKey { key, identity: identity.to_string(), fingerprint: 0 };
        // HMAC must work here, so that tagging in the control loop cannot fail; its first tag is the
        // key's fingerprint.
        let t = k.try_tag(&[0u8; RECORD_BYTES]).map_err(RecordKeyError::Hmac)?;
        k.fingerprint = u32::from_be_bytes([t[0], t[1], t[2], t[3]]);
        Ok(k)
    }

    /// Reads the key from a PSK file (`identity:hexkey` lines, as TLS's `psk_file`): the line of
    /// `identity`, or the file's only one. Errors name `key_name` and the file.
    pub fn from_file(
        path: &Path,
        key_name: &'static str,
        identity: Option<&str>,
        identity_key: &str,
    ) -> Result<RecordKey, RecordKeyFileError> {
        let (id, key) = crate::tls::read_psk_identity(path, key_name, identity, identity_key)
            .map_err(|e| RecordKeyFileError::Read(Box::new(e)))?;
        RecordKey::new(&id, &key).map_err(|error| RecordKeyFileError::Key { key_name, path: path.to_path_buf(), error })
    }

    /// A new random key of 32 bytes as a PSK file's line (`identity:hexkey`), for a file that
    /// [`RecordKey::from_file`] reads (`rein cluster` writes one per run).
    pub fn generate_line(identity: &str) -> Result<String, GenerateKeyError> {
        Self::generate_line_with(identity, openssl::rand::rand_bytes)
    }

    /// [`RecordKey::generate_line`], its key's bytes filled by `fill`.
    fn generate_line_with(
        identity: &str,
        fill: impl FnOnce(&mut [u8]) -> Result<(), openssl::error::ErrorStack>,
    ) -> Result<String, GenerateKeyError> {
        let mut key = [0u8; 32];
        fill(&mut key).map_err(GenerateKeyError)?;
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        Ok(format!("{identity}:{hex}\n"))
    }

    /// The identity of the key's line.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn try_tag(&self, record: &[u8; RECORD_BYTES]) -> Result<[u8; TAG_BYTES], openssl::error::ErrorStack> {
        let mut s = openssl::sign::Signer::new(openssl::hash::MessageDigest::sha256(), &self.key)?;
        s.update(record)?;
        let mut tag = [0u8; TAG_BYTES];
        s.sign(&mut tag)?;
        Ok(tag)
    }
}

impl RecordAuth for RecordKey {
    fn tag(&self, record: &[u8; RECORD_BYTES]) -> [u8; TAG_BYTES] {
        self.try_tag(record).expect("HMAC-SHA-256 worked when the key was made (RecordKey::new)")
    }
}

fn auth_of(key: &Option<Arc<RecordKey>>) -> Option<&dyn RecordAuth> {
    key.as_deref().map(|k| k as &dyn RecordAuth)
}

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
    /// The board IO did not end within the deadline (a file system that hangs): it runs on, and the
    /// exchange goes on without it (module comment, "A board that hangs").
    #[error("the board did not answer within {} ms (its IO runs on; exchanges resume when it ends)", deadline.as_millis())]
    Slow {
        /// How long the exchange waited.
        deadline: std::time::Duration,
    },
    /// An earlier exchange's board IO is still running: none other starts.
    #[error("the board has not answered an IO for {:.1} s (a file system that hangs?)", running.as_secs_f64())]
    Stuck {
        /// How long that IO has run.
        running: std::time::Duration,
    },
    /// Two peers were configured with this host id.
    #[error("two peers have host id {0}")]
    DuplicatePeer(u32),
    /// The board's path no longer names the file the host has open, and opening it again failed (the
    /// host goes on with the file it has).
    #[error("the board {} {change}, and opening it again failed: {source}", path.display())]
    Reopen {
        /// The board's path.
        path: PathBuf,
        /// What happened to it.
        change: BoardChange,
        /// The operating system's error.
        source: io::Error,
    },
}

/// What happened to a board's path under a running host (module comment, "A board deleted or
/// replaced").
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BoardChange {
    /// No file at the path: it was deleted (the host creates it again).
    Deleted,
    /// The path names another file than the one the host has open: replaced, or deleted and created
    /// again by another host.
    Replaced,
}

impl std::fmt::Display for BoardChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BoardChange::Deleted => "was deleted",
            BoardChange::Replaced => {
                "names another file than the one this host had open (replaced, or deleted and created again)"
            }
        })
    }
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
    /// Records that failed to decode (checksum, size, magic, tag, ...), with where they came from: the
    /// slot index (file) or the sender (UDP); the first [`MAX_REFUSED_SHOWN`].
    pub corrupt: Vec<(String, RecordError)>,
    /// Records that failed to decode beyond those in `corrupt`.
    pub corrupt_more: usize,
    /// Valid records that named the wrong host for where they were found (slot or sender address).
    pub misplaced: usize,
    /// Where the first [`MAX_REFUSED_SHOWN`] misplaced records were found (slot or sender) and the host
    /// each named, for the log.
    pub misplaced_shown: Vec<(String, u32)>,
    /// Valid records carrying this host's own id and another epoch: another host configured with the
    /// same id (module comment, "Two hosts with one id"). Never fed to the aggregator.
    pub same_id: usize,
    /// Where the first [`MAX_REFUSED_SHOWN`] of them were found (slot or sender) and the record, for the
    /// log.
    pub same_id_shown: Vec<(String, HostReport)>,
    /// Valid records of a peer's incarnation that its live one displaced, still advancing: two other
    /// hosts report under one id (rein-core's `Accept::Rival`; module comment, "Two hosts with one id").
    /// Counted in `accepted` or `stale` as well, by whether the aggregator took them.
    pub rivals: usize,
    /// Where the first [`MAX_REFUSED_SHOWN`] of them were found (slot or sender) and the record, for the
    /// log.
    pub rivals_shown: Vec<(String, HostReport)>,
    /// The board's path named another file, or none, when this exchange began: it was opened again
    /// (module comment, "A board deleted or replaced").
    pub reopened: Option<BoardChange>,
}

impl CollectStats {
    /// Every record refused: corrupt (shown or not) and misplaced.
    pub fn refused(&self) -> usize {
        self.corrupt.len() + self.corrupt_more + self.misplaced
    }

    /// Adds the new reports a late board reading fed (module comment, "A board that hangs"). Its
    /// refusals are not added: they are those of the table read now, or of the same table a period
    /// before, and would count twice.
    fn add_late(&mut self, late: CollectStats) {
        self.accepted += late.accepted;
    }

    fn misplace(&mut self, from: impl FnOnce() -> String, host: u32) {
        self.misplaced += 1;
        if self.misplaced_shown.len() < MAX_REFUSED_SHOWN {
            self.misplaced_shown.push((from(), host));
        }
    }

    fn note_same_id(&mut self, from: impl FnOnce() -> String, r: HostReport) {
        self.same_id += 1;
        if self.same_id_shown.len() < MAX_REFUSED_SHOWN {
            self.same_id_shown.push((from(), r));
        }
    }

    fn refuse(&mut self, from: impl FnOnce() -> String, e: RecordError) {
        if self.corrupt.len() < MAX_REFUSED_SHOWN {
            self.corrupt.push((from(), e));
        } else {
            self.corrupt_more += 1;
        }
    }

    /// The aggregator's verdict `a` on record `r`, found at `from` (slot or sender).
    fn count(&mut self, a: Accept, from: impl FnOnce() -> String, r: HostReport) {
        match a {
            Accept::First | Accept::Newer | Accept::Restarted | Accept::Rival { taken: true } => self.accepted += 1,
            Accept::Duplicate => self.duplicate += 1,
            Accept::Stale | Accept::Rival { taken: false } => self.stale += 1,
        }
        if let Accept::Rival { .. } = a {
            self.rivals += 1;
            if self.rivals_shown.len() < MAX_REFUSED_SHOWN {
                self.rivals_shown.push((from(), r));
            }
        }
    }
}

/// The filesystem-based transport; see the module comment.
#[derive(Debug)]
pub struct FileAggregation {
    path: PathBuf,
    file: Arc<File>,
    /// The open file's (device, inode): what the path must still name (module comment).
    identity: (u64, u64),
    slots: u32,
    buf: Vec<u8>,
    key: Option<Arc<RecordKey>>,
    /// The record this host last wrote into this file by [`Transport::exchange`] (`None` before the first
    /// write, and again after the file is opened anew): what its slot holds unless another host wrote
    /// there (module comment, "Two hosts with one id").
    written: Option<HostReport>,
    /// How long an exchange waits for its board IO (module comment, "A board that hangs").
    deadline: std::time::Duration,
    /// A board IO that outlived its deadline, still running: the report it writes and when it began.
    stuck: Option<(tokio::sync::oneshot::Receiver<BoardIo>, HostReport, std::time::Instant)>,
    /// Tests: each board IO first takes this lock, so a test that holds it plays a board that hangs.
    #[cfg(test)]
    hang: Arc<std::sync::Mutex<()>>,
}

/// What one exchange's board IO gives back: the table's buffer and the file (the one it opened again, if
/// the path had changed), whether the path still named the open file, the read and the write.
type BoardIo = (Vec<u8>, Arc<File>, Checked, Result<(), AggregationError>, Result<(), AggregationError>);

/// Whether the board's path still named the open file: `Some` with what happened and the (device, inode)
/// of the file opened again.
type Checked = Result<Option<(BoardChange, (u64, u64))>, AggregationError>;

/// How long an exchange waits for its board IO unless told otherwise
/// ([`FileAggregation::with_deadline`]).
pub const BOARD_IO_DEADLINE: std::time::Duration = std::time::Duration::from_millis(100);

/// Opens (creating it if needed, never truncating) a board; returns it with its (device, inode).
fn open_board(path: &Path) -> io::Result<(File, (u64, u64))> {
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
    let m = file.metadata()?;
    Ok((file, (m.dev(), m.ino())))
}

/// Whether `path` still names the file of `identity` (module comment, "A board deleted or replaced"):
/// `Ok(None)` if it does, else what happened; a `stat` that fails otherwise than "not found" is an error.
fn board_change(path: &Path, identity: (u64, u64)) -> io::Result<Option<BoardChange>> {
    match std::fs::metadata(path) {
        Ok(m) if (m.dev(), m.ino()) == identity => Ok(None),
        Ok(_) => Ok(Some(BoardChange::Replaced)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Some(BoardChange::Deleted)),
        Err(e) => Err(e),
    }
}

impl FileAggregation {
    /// Opens (creating it if needed, never truncating) the shared file with room for `slots` hosts.
    pub fn open(path: &Path, slots: u32) -> Result<FileAggregation, AggregationError> {
        if slots == 0 || slots > MAX_HOSTS {
            return Err(AggregationError::Slots(slots));
        }
        let (file, identity) = open_board(path).map_err(|source| AggregationError::Io { op: "open", source })?;
        Ok(FileAggregation {
            path: path.to_path_buf(),
            file: Arc::new(file),
            identity,
            slots,
            buf: vec![0; slots as usize * SLOT_BYTES],
            key: None,
            written: None,
            deadline: BOARD_IO_DEADLINE,
            stuck: None,
            #[cfg(test)]
            hang: Arc::default(),
        })
    }

    /// Waits at most `deadline` for an exchange's board IO (module comment, "A board that hangs").
    pub fn with_deadline(mut self, deadline: std::time::Duration) -> FileAggregation {
        self.deadline = deadline;
        self
    }

    /// The board's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes back what a board IO had (`buf`, `file`), and with `checked` a reopening: the file it
    /// opened (the change returned; nothing written there yet).
    fn settle(&mut self, buf: Vec<u8>, file: Arc<File>, checked: &Checked) -> Option<BoardChange> {
        self.buf = buf;
        let Ok(Some((change, id))) = checked else { return None };
        (self.file, self.identity, self.written) = (file, *id, None);
        Some(*change)
    }

    /// Signs this host's records with `key` and believes only records signed with it (module comment).
    pub fn with_key(mut self, key: Option<Arc<RecordKey>>) -> FileAggregation {
        self.key = key;
        self
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
            .write_all_at(&encode_slot_with(report, auth_of(&self.key)), slot_offset(report.host))
            .map_err(|source| AggregationError::Io { op: "write", source })
    }

    /// Reads the whole file in one read and feeds every valid record to `agg` as received at `now`.
    /// A file shorter than the slot table (hosts that never wrote) reads as empty slots.
    pub fn collect(&mut self, now: Nanos, agg: &mut Aggregator) -> Result<CollectStats, AggregationError> {
        read_table(&self.file, &mut self.buf)?;
        Ok(feed_table(&self.buf, now, agg, auth_of(&self.key), None))
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
    /// the datagrams received since the last exchange). File IO runs on a thread of its own (module
    /// comment, "A board that hangs").
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
                // A board IO still running past its deadline: none other starts until it ends.
                let mut reopened_late = None;
                let mut late = None;
                if let Some((io, written, since)) = &mut f.stuck {
                    let (buf, file, checked, read, wrote) = match io.try_recv() {
                        Ok(done) => done,
                        Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                            return Err(AggregationError::Stuck { running: since.elapsed() })
                        }
                        Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                            unreachable!("the board IO's thread always answers")
                        }
                    };
                    let (written, ran) = (*written, since.elapsed());
                    f.stuck = None;
                    // Its reading, its reopening (said with this exchange) and its write stand: the
                    // peers' records it read are fed now (the aggregator keeps only what is newer than
                    // it has), so a board slower than the deadline on every IO still exchanges, a
                    // period late. Its errors are said once, here.
                    reopened_late = f.settle(buf, file, &checked);
                    if wrote.is_ok() {
                        f.written = Some(written);
                    }
                    if read.is_ok() {
                        late = Some(feed_table(&f.buf, now, agg, auth_of(&f.key), Some((report.host, f.written))));
                    }
                    for e in [read.err(), wrote.err(), checked.err()].into_iter().flatten() {
                        tracing::warn!(
                            path = %f.path.display(),
                            "the PARDA board IO that outlived its deadline ended after {} ms with an error: {e}",
                            ran.as_millis()
                        );
                    }
                }
                let (path, file, identity) = (f.path.clone(), f.file.clone(), f.identity);
                let mut buf = std::mem::take(&mut f.buf);
                let slot = encode_slot_with(report, auth_of(&f.key));
                let host = report.host;
                #[cfg(test)]
                let hang = f.hang.clone();
                // On a thread of its own, not tokio's blocking pool: a runtime waits for its blocking
                // tasks when it is dropped, and a hung board IO held a stopping gateway for good.
                let (tx, mut io) = tokio::sync::oneshot::channel();
                let board_io = move || -> BoardIo {
                    #[cfg(test)]
                    drop(hang.lock());
                    // Does the path still name the open file? If not, open it again as the start does
                    // (module comment, "A board deleted or replaced").
                    let (mut file, mut checked) = (file, Ok(None));
                    match board_change(&path, identity) {
                        Ok(None) => {}
                        Ok(Some(change)) => match open_board(&path) {
                            Ok((f, id)) => {
                                file = Arc::new(f);
                                checked = Ok(Some((change, id)));
                            }
                            Err(source) => checked = Err(AggregationError::Reopen { path, change, source }),
                        },
                        Err(source) => checked = Err(AggregationError::Io { op: "stat", source }),
                    }
                    // Read before the write: this host's slot then shows whether another host wrote
                    // there since its last write (module comment, "Two hosts with one id"). The peers'
                    // slots are read even when the write fails (a full file system): the host still
                    // follows the cluster while its own report cannot be published.
                    let read = read_table(&file, &mut buf);
                    let wrote = file
                        .write_all_at(&slot, slot_offset(host))
                        .map_err(|source| AggregationError::Io { op: "write", source });
                    (buf, file, checked, read, wrote)
                };
                let spawned = std::thread::Builder::new().name("parda-board".into()).spawn(move || {
                    let _ = tx.send(board_io());
                });
                if let Err(source) = spawned {
                    // The buffer went with the closure: a new one for the next exchange.
                    f.buf = vec![0; f.slots as usize * SLOT_BYTES];
                    return Err(AggregationError::Io { op: "spawn the board's thread", source });
                }
                let done = match tokio::time::timeout(f.deadline, &mut io).await {
                    Ok(done) => done.expect("the board IO's thread always answers"),
                    Err(_) => {
                        f.stuck = Some((io, *report, std::time::Instant::now()));
                        return Err(AggregationError::Slow { deadline: f.deadline });
                    }
                };
                let (buf, file, checked, read, wrote) = done;
                let reopened = f.settle(buf, file, &checked);
                // The host's own report stands for its id, whatever its slot holds.
                agg.accept(now, *report).expect("host ids are below the slot count, itself at most MAX_HOSTS");
                read?;
                let mut stats = feed_table(&f.buf, now, agg, auth_of(&f.key), Some((host, f.written)));
                if let Some(late) = late {
                    stats.add_late(late);
                }
                stats.reopened = reopened.or(reopened_late);
                f.written = wrote.is_ok().then_some(*report).or(f.written);
                wrote?;
                checked?;
                Ok(stats)
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

/// Decodes every slot of the table (with `auth`, only signed ones) and feeds the valid records to `agg`.
/// With `own` (this host's id and the record it last wrote into the file), its own slot is not fed (its
/// report goes to `agg` directly) but checked for another host's record (module comment, "Two hosts
/// with one id").
fn feed_table(
    buf: &[u8],
    now: Nanos,
    agg: &mut Aggregator,
    auth: Option<&dyn RecordAuth>,
    own: Option<(u32, Option<HostReport>)>,
) -> CollectStats {
    let mut stats = CollectStats::default();
    for (i, slot) in buf.chunks_exact(SLOT_BYTES).enumerate() {
        match decode_slot_with(slot, auth) {
            Ok(Slot::Empty) => stats.empty += 1,
            Ok(Slot::Record(r)) if r.host as usize != i => stats.misplace(|| format!("slot {i}"), r.host),
            Ok(Slot::Record(r)) if own.is_some_and(|(host, _)| host == r.host) => {
                if own.and_then(|(_, written)| written).is_some_and(|w| w.epoch != r.epoch) {
                    stats.note_same_id(|| format!("slot {i}"), r);
                }
            }
            Ok(Slot::Record(r)) => {
                let a = agg.accept(now, r).expect("slot index is below MAX_HOSTS");
                stats.count(a, || format!("slot {i}"), r);
            }
            Err(e) => stats.refuse(|| format!("slot {i}"), e),
        }
    }
    stats
}

/// The network-based transport; see the module comment.
#[derive(Debug)]
pub struct UdpAggregation {
    socket: Arc<tokio::net::UdpSocket>,
    host: u32,
    /// What the reader task and the control loop share.
    shared: Arc<std::sync::Mutex<UdpShared>>,
    /// Told each time the reader has taken a datagram.
    arrived: Arc<tokio::sync::Notify>,
    reader: tokio::task::JoinHandle<()>,
}

/// The peers and key the reader checks datagrams against, and what it has taken since the last drain.
#[derive(Debug, Default)]
struct UdpShared {
    /// This host's id, and its epoch once it has published (module comment, "Two hosts with one id").
    host: u32,
    epoch: Option<u64>,
    /// (host id, address) of every other host.
    peers: Vec<(u32, SocketAddr)>,
    key: Option<Arc<RecordKey>>,
    /// Valid records from peers, oldest first, at most [`max_datagrams`] (the oldest go first), and of
    /// one host at most [`WAITING_PER_HOST`].
    inbox: std::collections::VecDeque<HostReport>,
    /// Per host with records in the inbox: how many, and the epoch and sequence of its newest.
    waiting: std::collections::HashMap<u32, (usize, u64, u64)>,
    /// Refused datagrams since the last drain (`accepted`, `duplicate`, `stale` are the drain's).
    stats: CollectStats,
}

impl UdpShared {
    /// Checks one datagram of `n` bytes from `from` and keeps it if it is a peer's valid record.
    fn take(&mut self, buf: &[u8], from: SocketAddr) {
        let auth = auth_of(&self.key);
        if buf.len() > SIGNED_BYTES {
            let want = if auth.is_some() { SIGNED_BYTES } else { RECORD_BYTES };
            self.stats.refuse(|| from.to_string(), RecordError::Size { got: buf.len(), want });
            return;
        }
        match decode_datagram(buf, auth) {
            Err(e) => self.stats.refuse(|| from.to_string(), e),
            // Another host with this host's id (a host never sends to itself; its own record coming back
            // through a peer address that is its own is misplaced, below).
            Ok(r) if r.host == self.host && self.epoch != Some(r.epoch) => {
                self.stats.note_same_id(|| from.to_string(), r)
            }
            Ok(r) if !self.peers.iter().any(|&(id, a)| id == r.host && a == from) => {
                self.stats.misplace(|| from.to_string(), r.host)
            }
            Ok(r) => {
                // A host's records take its own places only: a record no newer than the one of its
                // epoch already waiting is counted and dropped here (the aggregator would refuse it), and
                // past WAITING_PER_HOST the host's further records are dropped. One signed record
                // replayed 240 times a second from a peer's address (or forged ones without a key) pushed
                // every other host's records out of the inbox, and the cluster signal with them.
                let w = self.waiting.entry(r.host).or_insert((0, r.epoch, 0));
                if w.0 > 0 && w.1 == r.epoch && r.seq <= w.2 {
                    if r.seq == w.2 {
                        self.stats.duplicate += 1;
                    } else {
                        self.stats.stale += 1;
                    }
                    return;
                }
                if w.0 >= WAITING_PER_HOST {
                    self.stats.stale += 1;
                    return;
                }
                *w = (w.0 + 1, r.epoch, r.seq);
                crate::bounded::push(&mut self.inbox, r, max_datagrams(self.peers.len()));
            }
        }
    }
}

/// How many records of one host wait for an exchange at most (four a period is more than a host that
/// publishes once a period sends; [`max_datagrams`] holds four per host).
pub const WAITING_PER_HOST: usize = 4;

/// Reads the socket for as long as the aggregation lives, so that its buffer never fills with what
/// nobody reads: a peer's record is not dropped by the kernel behind a flood of junk (which, read at most
/// [`max_datagrams`] a period, once cut peers out of the cluster average 9 times in 12).
async fn read_datagrams(
    socket: Arc<tokio::net::UdpSocket>,
    shared: Arc<std::sync::Mutex<UdpShared>>,
    arrived: Arc<tokio::sync::Notify>,
) {
    let mut buf = [0u8; MAX_DATAGRAM];
    let mut failing = LogRate::default();
    loop {
        match socket.recv_from(&mut buf).await {
            Ok((n, from)) => {
                shared.lock().unwrap_or_else(|e| e.into_inner()).take(&buf[..n], from);
                arrived.notify_one();
            }
            Err(e) => {
                let (say, pause) = after_recv_error(&mut failing, std::time::Instant::now(), &e);
                if let Some(unlogged) = say {
                    tracing::warn!(
                        addr = ?socket.local_addr().ok(),
                        error = %e,
                        unlogged,
                        "reading the hosts' report socket failed; retrying every {} ms",
                        RECV_RETRY.as_millis()
                    );
                }
                match pause {
                    Some(p) => tokio::time::sleep(p).await,
                    None => tokio::task::yield_now().await,
                }
            }
        }
    }
}

/// The pause before the report socket is read again after an error that is not a peer's ICMP message.
const RECV_RETRY: std::time::Duration = std::time::Duration::from_millis(10);

/// What [`read_datagrams`] does after `recv_from` failed with `e` at `now`: `(a line to log, with the
/// failures not logged since the last; a pause before reading again)`. A refused or reset connection is an
/// ICMP message about an earlier send (some systems surface it on the next read): skipped at once, not
/// logged. Any other error (out of memory, a socket gone bad) would come back on every read, so the
/// reader pauses [`RECV_RETRY`] (it spun a core before, in silence) and says so once a minute.
fn after_recv_error(
    failing: &mut LogRate<std::time::Instant>,
    now: std::time::Instant,
    e: &std::io::Error,
) -> (Option<u64>, Option<std::time::Duration>) {
    use std::io::ErrorKind::{ConnectionRefused, ConnectionReset, Interrupted};
    if matches!(e.kind(), ConnectionRefused | ConnectionReset | Interrupted) {
        return (None, None);
    }
    (failing.due(now, std::time::Duration::from_secs(60), 1), Some(RECV_RETRY))
}

impl Drop for UdpAggregation {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl UdpAggregation {
    /// Binds `addr` for host `host` and sends to `peers` (host id, address); the host's own entry, if
    /// present, is left out. A task reads the socket from now on (module comment).
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
        let socket = Arc::new(
            tokio::net::UdpSocket::bind(addr).await.map_err(|source| AggregationError::Io { op: "bind", source })?,
        );
        let shared = Arc::new(std::sync::Mutex::new(UdpShared { host, peers: v, ..UdpShared::default() }));
        let arrived = Arc::new(tokio::sync::Notify::new());
        let reader = tokio::spawn(read_datagrams(socket.clone(), shared.clone(), arrived.clone()));
        Ok(UdpAggregation { socket, host, shared, arrived, reader })
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, UdpShared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Signs this host's records with `key` and believes only records signed with it (module comment).
    pub fn with_key(self, key: Option<Arc<RecordKey>>) -> UdpAggregation {
        self.shared().key = key;
        self
    }

    /// The address the socket is bound to (with the real port when bound to port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Sets the peers (e.g. once every host has bound and its port is known).
    pub fn set_peers(&mut self, peers: &[(u32, SocketAddr)]) {
        let host = self.host;
        self.shared().peers = peers.iter().copied().filter(|p| p.0 != host).collect();
    }

    /// Sends `report` to every peer (one datagram each); returns how many sends succeeded (a peer that is
    /// down makes its send fail on some systems; that is not an error for the others).
    pub async fn publish(&self, report: &HostReport) -> usize {
        let (rec, peers) = {
            let mut s = self.shared();
            if report.host == s.host {
                s.epoch = Some(report.epoch);
            }
            (encode_datagram(report, auth_of(&s.key)), s.peers.clone())
        };
        let mut ok = 0;
        for (_, a) in peers {
            if self.socket.send_to(&rec, a).await.is_ok() {
                ok += 1;
            }
        }
        ok
    }

    /// Waits until a datagram has been taken since the last drain, at most `timeout`; false on timeout.
    pub async fn wait_readable(&self, timeout: std::time::Duration) -> bool {
        let taken = |s: &UdpShared| !s.inbox.is_empty() || s.stats.refused() > 0;
        if taken(&self.shared()) {
            return true;
        }
        tokio::time::timeout(timeout, self.arrived.notified()).await.is_ok()
    }

    /// Feeds the records taken since the last drain (at most [`max_datagrams`]) to `agg` as received at
    /// `now`, with the refusals counted meanwhile.
    pub fn drain(&self, now: Nanos, agg: &mut Aggregator) -> CollectStats {
        let (inbox, mut stats, peers) = {
            let mut s = self.shared();
            s.waiting.clear();
            (std::mem::take(&mut s.inbox), std::mem::take(&mut s.stats), s.peers.clone())
        };
        for r in inbox {
            let a = agg.accept(now, r).expect("decoded host ids are below MAX_HOSTS");
            // Taken only from the address configured for its host id (`UdpShared::take`).
            let from =
                || peers.iter().find(|p| p.0 == r.host).map_or_else(|| format!("host {}", r.host), |p| p.1.to_string());
            stats.count(a, from, r);
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A generated key is a PSK file's line that [`RecordKey::from_file`] reads; without random bytes
    /// the refusal names the record key and OpenSSL's error once.
    #[test]
    fn a_generated_key_reads_back_and_no_random_bytes_is_named_once() {
        let line = RecordKey::generate_line("parda").unwrap();
        let (identity, hex) = line.trim_end().split_once(':').unwrap();
        assert_eq!((identity, hex.len(), line.ends_with('\n')), ("parda", 64, true));
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("parda.psk");
        std::fs::write(&path, &line).unwrap();
        assert_eq!(RecordKey::from_file(&path, "key_file", None, "identity").unwrap().identity(), "parda");
        let e = RecordKey::generate_line_with("parda", |_| Err(openssl::error::ErrorStack::get())).unwrap_err();
        assert_eq!(e.to_string(), "no random bytes for a record key: OpenSSL error");
        assert_eq!(std::error::Error::source(&e).map(|s| s.to_string()).as_deref(), Some("OpenSSL error"));
    }

    /// A read error of the report socket: a peer's ICMP message (refused, reset) is skipped at once and
    /// not logged; any other error pauses the reader (which spun a core on it before, in silence) and is
    /// said once a minute with the count between.
    #[test]
    fn a_read_error_that_stays_pauses_the_reader_and_is_said_once_a_minute() {
        let mut failing = LogRate::default();
        let t0 = std::time::Instant::now();
        for kind in [io::ErrorKind::ConnectionRefused, io::ErrorKind::ConnectionReset, io::ErrorKind::Interrupted] {
            assert_eq!(after_recv_error(&mut failing, t0, &io::Error::from(kind)), (None, None), "{kind:?}");
        }
        let bad = io::Error::from_raw_os_error(libc::ENOMEM);
        assert_eq!(after_recv_error(&mut failing, t0, &bad), (Some(0), Some(RECV_RETRY)), "the first at once");
        for s in 1..60 {
            let at = t0 + Duration::from_secs(s);
            assert_eq!(after_recv_error(&mut failing, at, &bad), (None, Some(RECV_RETRY)), "at {s} s");
        }
        let at = t0 + Duration::from_secs(60);
        assert_eq!(after_recv_error(&mut failing, at, &bad), (Some(59), Some(RECV_RETRY)), "a minute on");
    }

    fn report(host: u32, seq: u64) -> HostReport {
        HostReport {
            host,
            epoch: 1,
            seq,
            timestamp: Nanos::from_secs(seq),
            latency_ns: 5_000_000 * u64::from(host + 1),
            ios: 100,
        }
    }

    /// A board of two hosts in a fresh directory (prefix `prefix`): the peer (host 1) has published its
    /// report 1, and host 0's transport, whose IO waits 50 ms and is held while the returned lock is, has
    /// exchanged once (taking it). Returns the directory, the peer, the lock, the transport and host 0's
    /// aggregator.
    #[allow(clippy::type_complexity)]
    async fn board_of_two(
        prefix: &str,
    ) -> (tempfile::TempDir, FileAggregation, Arc<std::sync::Mutex<()>>, Transport, Aggregator) {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        let path = dir.path().join("board");
        let peer = FileAggregation::open(&path, 2).unwrap();
        peer.publish(&report(1, 1)).unwrap();
        let f = FileAggregation::open(&path, 2).unwrap().with_deadline(Duration::from_millis(50));
        let hang = f.hang.clone();
        let mut t = Transport::File(f);
        let mut agg = Aggregator::new(Nanos::from_secs(60)).unwrap();
        assert_eq!(t.exchange(Nanos::from_secs(1), &report(0, 1), &mut agg).await.unwrap().accepted, 1);
        (dir, peer, hang, t, agg)
    }

    /// A board that stops answering (module comment, "A board that hangs"): the exchange fails after its
    /// deadline instead of waiting with it; the next fail at once while that IO runs, starting no other;
    /// once it ends its write stands (the slot holds its record) and exchanges read the table again.
    /// Before, the exchange awaited the IO, and the PARDA host's control loop (every VM's IO) with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::await_holding_lock)] // the lock held across the exchanges is the hung file system
    async fn a_board_that_hangs_fails_the_exchange_at_its_deadline() {
        let (dir, peer, hang, mut t, mut agg) = board_of_two("rein-board-hang-").await;
        let path = dir.path().join("board");
        let at = |s: u64| Nanos::from_secs(s);
        let held = hang.lock().unwrap();
        let t0 = std::time::Instant::now();
        let e = t.exchange(at(2), &report(0, 2), &mut agg).await.unwrap_err();
        assert!(matches!(e, AggregationError::Slow { .. }) && e.to_string().contains("within 50 ms"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        for _ in 0..3 {
            let e = t.exchange(at(3), &report(0, 3), &mut agg).await.unwrap_err();
            assert!(matches!(e, AggregationError::Stuck { .. }), "{e}");
        }
        let Transport::File(f) = &t else { unreachable!() };
        assert!(f.stuck.is_some(), "one IO, held");
        // The file system answers again: the stuck IO's write (report 2) lands; the next exchange takes
        // it back and runs its own.
        drop(held);
        let Transport::File(f) = &t else { unreachable!() };
        // Written once the held IO goes on (its thread ends soon after the lock is free).
        let slot0 = |path: &Path| std::fs::read(path).unwrap()[..SLOT_BYTES].to_vec();
        for _ in 0..1000 {
            if decode_slot_with(&slot0(&path), None).unwrap() == Slot::Record(report(0, 2)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(f.stuck.is_some());
        assert_eq!(decode_slot_with(&slot0(&path), None).unwrap(), Slot::Record(report(0, 2)));
        peer.publish(&report(1, 2)).unwrap();
        let mut st = None;
        for _ in 0..1000 {
            match t.exchange(at(4), &report(0, 4), &mut agg).await {
                Ok(s) => {
                    st = Some(s);
                    break;
                }
                Err(AggregationError::Stuck { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(e) => panic!("{e}"),
            }
        }
        let st = st.expect("the exchanges start again once the IO ends");
        assert_eq!((st.accepted, st.same_id), (1, 0), "{st:?}");
        assert_eq!(decode_slot_with(&slot0(&path), None).unwrap(), Slot::Record(report(0, 4)));
    }

    /// A board slower than the deadline on every IO (module comment, "A board that hangs") still
    /// exchanges: the reading of an IO that ended late is fed at the next exchange, even when that
    /// exchange's own IO is late again. Before, late readings were dropped and the peer's new report
    /// (seq 2) never reached the aggregator.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::await_holding_lock)] // the lock held across the exchanges is the slow file system
    async fn a_board_slower_than_its_deadline_still_exchanges() {
        let (dir, peer, hang, mut t, mut agg) = board_of_two("rein-board-slow-").await;
        let path = dir.path().join("board");
        let at = |s: u64| Nanos::from_secs(s);
        let held = hang.lock().unwrap();
        peer.publish(&report(1, 2)).unwrap();
        let e = t.exchange(at(2), &report(0, 2), &mut agg).await.unwrap_err();
        assert!(matches!(e, AggregationError::Slow { .. }), "{e}");
        // The IO ends (its write lands after its read), and the next one is slow again.
        drop(held);
        let slot0 = |path: &Path| std::fs::read(path).unwrap()[..SLOT_BYTES].to_vec();
        for _ in 0..1000 {
            if decode_slot_with(&slot0(&path), None).unwrap() == Slot::Record(report(0, 2)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let held = hang.lock().unwrap();
        let mut last = None;
        for _ in 0..1000 {
            match t.exchange(at(3), &report(0, 3), &mut agg).await {
                Err(AggregationError::Stuck { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
                other => {
                    last = Some(other);
                    break;
                }
            }
        }
        assert!(matches!(last, Some(Err(AggregationError::Slow { .. }))), "{last:?}");
        let seq = agg.peers().find(|(h, _)| **h == 1).map(|(_, p)| p.last.seq);
        assert_eq!(seq, Some(2), "the late reading's report of host 1 was fed");
        drop(held);
        settle(&mut t, &mut agg).await;
        drop(dir);
    }

    /// Exchanges until one ends within its deadline, so no board IO runs on when the test's directory
    /// goes: one still running after the removal saw its board deleted and made it again (CI found the
    /// directory left behind with that board in it).
    async fn settle(t: &mut Transport, agg: &mut Aggregator) {
        for _ in 0..2000 {
            match t.exchange(Nanos::from_secs(99), &report(0, 99), agg).await {
                Ok(_) => return,
                Err(AggregationError::Stuck { .. } | AggregationError::Slow { .. }) => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("the board IO never ended within its deadline");
    }
}
