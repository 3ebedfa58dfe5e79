//! A PARDA host on real IO: `rein gateway` with a `[parda]` table (parda.txt §3-4, flow-control-position.txt).
//!
//! # Model
//! A PARDA host sits between its VMs and a shared array and keeps at most its window of IOs outstanding at
//! the array; the window follows eq. (2) from the cluster's latency (or its own, §4.1), once per control
//! period. Here the host is a gateway: its VMs are the gateway's tenants (their weights are the shares of
//! §3.3), its exports are the VMs' disks, and the array is whatever the volumes are striped over (one
//! `rein serve` with a device model, nbdkit, qemu-nbd, a real array behind an NBD server). Every request
//! of every volume of the gateway passes one [`HostGate`], which drives rein-core's
//! [`HostController`], unchanged, as the simulator's host layer does (`rein-sim`'s `engine::parda`):
//! a request queues in the controller's local scheduler (SFQ with optional locality batching, or
//! mClock), the controller releases it while fewer than its window are outstanding, and the gate sends
//! it to its volume; the completion frees the slot and feeds eq. (1) with the latency the host saw (from
//! the moment it sent the request to its volume to the reply, the device latency PARDA measures: time
//! queued in the host is the VMs' latency, not the array's).
//!
//! Once per control period the gate closes the period (eq. (1)), exchanges reports with the other hosts
//! over the configured transport (rein-runtime's [`crate::aggregate`]: UDP datagrams to every peer, or
//! a slot in a shared file), takes the aggregator's cluster latency (or its own estimate under
//! `aggregation = "local"`) and updates the window (eq. (4), then eq. (2)). An uncontrolled host
//! (`controlled = false`, or `[parda] enabled = false`) keeps a fixed issue queue and publishes nothing.
//!
//! # Stalls
//! A latency is the host's clock at the reply less its clock at the send, so a host whose process did
//! not run meanwhile (SIGSTOP, a paused VM, heavy swapping) measures its own pause: the IOs in flight
//! across a 3 s pause came back with latencies of 3 s, its next report carried them, and the peers'
//! windows shrank for a few periods (the cluster average is theirs too). The process's `StallWatch`
//! (`stall.rs`), a thread that ticks every 50 ms, sees its stalls (two ticks more than `crate::STALLED`
//! apart, the rule `remote.rs` and `nbd.rs` apply to their timeouts), and the rule is: **an IO whose
//! interval from send to reply may hold a stall is left out of eq. (1)** (its reply frees its window
//! slot, as a failed issue's does, and counts in `stalled_ios`, not in `completed` or
//! `latency_sum_ns`), whichever period its reply falls in. The reply's callback asks the watch when it
//! reads the latency, so the answer does not depend on where the gate was when the process stopped (the
//! gate watched its own timers before, and missed a stop that fell while it ran or awaited a node
//! connection's backpressure: CI once read a 1,049 ms estimate). A few IOs sent just after the stall are
//! left out too (until the watch's next tick; `stall.rs`, invariant 2). Reports are published as usual,
//! with the latencies measured outside the stall. Each stall is logged once (a warning with its length)
//! and counted in `stalls`; one of less than `STALLED` plus the tick is not seen (its latencies are at
//! most that much off). The gate waits for a board IO a quarter of a period (at least 5 ms, at most 100 ms;
//! rein-runtime's `aggregate`, "A board that hangs"): a board on a file system that stops answering
//! held the whole gate, every VM's IO with it, until the file system came back; now the exchange fails
//! (counted in `exchange_errors`, logged), the host goes on with the reports it has (a peer drops out
//! after `aggregation_timeout`), and no other board IO starts until the hung one ends. A board slower
//! than the deadline on every IO (not hung) exchanges a period late: the reading of an IO that ended
//! after its deadline is fed at the next exchange (each period still pays the wait, and the errors
//! say so).
//!
//! # Configuration
//! `[parda]` is the same table as a scenario's (one parser: [`rein_model::parda_settings`]); what is
//! this host's is `[parda_host]`, as a scenario's `[[hosts]]` entry:
//! ```toml
//! [parda_host]
//! id = 0                          # the host's id in reports, unique in the cluster (0..4096)
//! beta = 2                        # optional: default beta_per_share x the sum of the tenants' weights
//! controlled = true               # false: a fixed issue queue of `window` IOs (default w_max)
//! udp = "127.0.0.21:7711"         # cluster aggregation over UDP: this host's socket ...
//! peers = [{ id = 1, address = "127.0.0.22:7711" }]   # ... and every other host's
//! # board = "/shared/parda.board" # or a shared file: this host's slot in it (board_slots, default 64)
//! # key_file = "parda.psk"        # the hosts' shared key: reports signed, only signed ones believed
//! ```
//!
//! # Invariants
//! 1. Every request a VM sends is answered once: issued and answered by its volume, refused at once
//!    (the local scheduler's queue bound), or failed with ESHUTDOWN when the gate stops.
//! 2. At most the controller's issue limit of requests are outstanding at the array (rein-core's
//!    invariant 3 of `parda`), counting every command (a FLUSH occupies the array's queue too).
//! 3. The gate's messages are bounded by the front: each is one request in flight, and the front's byte
//!    budget and connection caps bound those.
//!
//! # Deviations
//! The simulator places the hosts' periods by `[parda] period_phase`; a real host ticks from its start
//! unless told otherwise (`PUT /api/parda/period`, [`HostGate::set_period_end_in`], which `rein cluster`
//! sends each host as its load starts, so the hosts tick where the simulator's do), and refuses the key
//! rather than ignore it. A report's arrival takes whatever the transport takes (the simulator's
//! `aggregation_delay_ms` is refused here).
//!
//! # Mishaps the host names
//! A board deleted or replaced under the host is opened again at its path (created when it is gone),
//! so hosts that restart and hosts that ran on meet in one file again (`board_reopened`, a warning
//! naming the path). A valid record carrying the host's own id from another host (over UDP a datagram
//! with its id and another epoch; on the board its slot holding another incarnation's record since its
//! last write) means two hosts share an id: logged as an error at once, then at most once a minute
//! with the count while it lasts (`id_conflicts`, `id_conflict_from`); the host runs on. Their peers
//! see it on a board where their reads show the slot switching between the two hosts' incarnations,
//! both advancing: a warning naming the id, then at most once a minute (`peer_id_conflicts`,
//! `peer_id_conflict`). All are detected in rein-runtime's [`crate::aggregate`] (its module comment
//! says how).
//!
//! # Changes while running
//! A request whose connection closed while it waited in the host is not issued when its turn comes (as
//! `rein serve`'s dispatcher skips those): its window slot is freed at once and it counts in
//! `abandoned`. A reload's new spec for a VM reaches the local scheduler at once and beta from the next
//! period ([`HostGate::set_vm_spec`]); a tenant added by a reload joins the host when its first volume
//! opens ([`HostGate::add_vm`]). A tenant removed by a reload keeps its VM (and its share of beta) while
//! connections to its volumes are open, and its VM leaves the host when the last one closes
//! ([`VmLease`]).

use crate::aggregate::{BoardChange, FileAggregation, RecordKey, Transport, UdpAggregation, BOARD_IO_DEADLINE};
use crate::dispatch::{Clock, Done, IoError, Op};
use crate::lograte::LogRate;
use crate::remote::RemoteVolume;
use rein_core::parda::{Aggregator, HostConfig, HostController, HostStats, MAX_HOSTS};
use rein_core::{Nanos, Poll, QosSpec, Request, SchedConfig, TenantId};
use rein_model::parda_settings::{Aggregation, Parda, PardaFile};
use serde::Deserialize;
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Period records kept for `/api/parda` (the newest; about 2.3 hours at the default 2 s period).
pub const MAX_PERIOD_RECORDS: usize = 4096;
/// Slots of a shared board file when `board_slots` is not given.
pub const DEFAULT_BOARD_SLOTS: u32 = 64;

/// `[parda_host]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PardaHostFile {
    #[serde(default)]
    id: u32,
    beta: Option<f64>,
    #[serde(default = "crate::config::d_true")]
    controlled: bool,
    window: Option<f64>,
    udp: Option<String>,
    #[serde(default)]
    peers: Vec<PeerFile>,
    board: Option<String>,
    board_slots: Option<u32>,
    key_file: Option<String>,
    key_identity: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerFile {
    id: u32,
    address: String,
}

/// Where this host's reports go and the others' come from.
#[derive(Debug, Clone, PartialEq)]
pub enum ReportTransport {
    /// None: `aggregation = "local"`, or an uncontrolled host.
    None,
    /// Datagrams: this host's socket and every other host's (id, address).
    Udp {
        /// The address to bind.
        listen: SocketAddr,
        /// The other hosts (this host's own id left out).
        peers: Vec<(u32, SocketAddr)>,
    },
    /// A shared file with one slot per host.
    Board {
        /// The file.
        path: PathBuf,
        /// Its slots (host ids below it).
        slots: u32,
    },
}

/// The validated `[parda]` and `[parda_host]` of a gateway.
#[derive(Debug, Clone)]
pub struct HostSettings {
    /// The cluster's control law.
    pub parda: Parda,
    /// This host's id in reports.
    pub id: u32,
    /// Its beta as written (`None`: `beta_per_share` x the sum of its tenants' weights).
    pub beta: Option<f64>,
    /// Runs PARDA (`controlled` and `[parda] enabled`); else a fixed issue queue.
    pub runs: bool,
    /// The fixed issue queue of a host that does not run PARDA (`None`: w_max).
    pub window: Option<f64>,
    /// The local scheduler's settings (the gateway's `[mclock]`; `[parda]`'s batching over them).
    pub sched: SchedConfig,
    /// The cluster aggregation's transport.
    pub transport: ReportTransport,
    /// The hosts' shared key (`key_file`): records are signed and only signed ones believed.
    pub key: Option<Arc<RecordKey>>,
}

impl HostSettings {
    /// The controller's per-host configuration (`epoch` distinguishes this incarnation).
    pub fn host_config(&self, epoch: u64) -> HostConfig {
        let p = &self.parda;
        HostConfig {
            id: self.id,
            epoch,
            beta: self.beta,
            beta_per_share: p.beta_per_share,
            scheduler: p.local_scheduler,
            sched: SchedConfig { batch: p.batch, batch_distance: p.batch_distance, ..self.sched },
            fixed_window: if self.runs { None } else { Some(self.window.unwrap_or(p.config.w_max)) },
        }
    }
}

/// Why `[parda]` or `[parda_host]` is refused (gw.toml's validation); the message names the table and key.
#[derive(Debug, thiserror::Error)]
pub enum PardaHostError {
    /// `[parda] period_phase`, a simulator's key.
    #[error(
        "parda: period_phase places the simulator's hosts' periods; a real host's periods tick from its start, or \
         where PUT /api/parda/period puts them (remove the key)"
    )]
    PeriodPhase,
    /// A `[parda]` key is refused.
    #[error("{0}")]
    Parda(rein_model::parda_settings::PardaSettingsError),
    /// `[parda] aggregation_delay_ms`, a simulator's key.
    #[error(
        "parda: aggregation_delay_ms models the shared board's delay in the simulator; a real host's reports take \
         as long as their transport does (remove the key)"
    )]
    AggregationDelay,
    /// `id` at or above `max`.
    #[error("parda_host: id must be below {max}, got {got}")]
    Id {
        /// The id given.
        got: u32,
        /// The bound ([`MAX_HOSTS`]).
        max: u32,
    },
    /// `window` on a host PARDA controls.
    #[error(
        "parda_host: window is the fixed issue queue of an uncontrolled host (controlled = false, or [parda] \
         enabled = false); a PARDA host's window is bounded by [parda] w_min / w_max"
    )]
    WindowWhenControlled,
    /// The host's controller settings (`beta`, with `[parda]`'s) are refused.
    #[error("parda_host: {0}")]
    Host(rein_core::parda::PardaError),
    /// Both `udp` and `board`.
    #[error("parda_host: give udp (with peers) or board, not both")]
    UdpAndBoard,
    /// `peers` without `udp`.
    #[error("parda_host: peers are the other hosts' UDP sockets; give this host's as udp")]
    PeersWithoutUdp,
    /// `udp` or `board` where no report is published: local aggregation, or an uncontrolled host.
    #[error(
        "parda_host: udp / board are the cluster aggregation's transport, but {}",
        if *uncontrolled { "an uncontrolled host publishes nothing" } else { "[parda] aggregation = \"local\" uses the host's own latency" }
    )]
    UnusedTransport {
        /// The host is uncontrolled (else the aggregation is local).
        uncontrolled: bool,
    },
    /// `udp` is not an address.
    #[error("parda_host: udp {text:?} is not an address (ip:port)")]
    Udp {
        /// The text given.
        text: String,
    },
    /// A peer's id at or above `max`.
    #[error("parda_host: peers[{index}].id must be below {max}, got {got}")]
    PeerId {
        /// The peer's place in `peers`, from 0.
        index: usize,
        /// The id given.
        got: u32,
        /// The bound ([`MAX_HOSTS`]).
        max: u32,
    },
    /// A peer's address is not an address.
    #[error("parda_host: peers[{index}].address {text:?} is not an address (ip:port)")]
    PeerAddress {
        /// The peer's place in `peers`, from 0.
        index: usize,
        /// The text given.
        text: String,
    },
    /// Two peers of one id.
    #[error("parda_host: two peers have id {id}")]
    RepeatedPeer {
        /// The id.
        id: u32,
    },
    /// `board_slots` outside `1..=max`.
    #[error("parda_host: board_slots must be in 1..={max}, got {got}")]
    BoardSlots {
        /// The value given.
        got: u32,
        /// The most accepted ([`MAX_HOSTS`]).
        max: u32,
    },
    /// `id` at or above the board's slots.
    #[error("parda_host: id {id} has no slot in a board of {slots} (raise board_slots)")]
    NoSlot {
        /// The host's id.
        id: u32,
        /// The board's slots.
        slots: u32,
    },
    /// Cluster aggregation without `udp` or `board`.
    #[error(
        "parda_host: [parda] aggregation = \"cluster\" needs the reports' transport: udp = \"ip:port\" with peers = \
         [{{ id, address }}], or board = \"PATH\" (a file every host can read and write)"
    )]
    NoTransport,
    /// `key_file` on a host that publishes no report.
    #[error(
        "parda_host: key_file signs the reports of the cluster aggregation, which this host does not publish (no \
         udp or board)"
    )]
    KeyWithoutTransport,
    /// `key_file` or `key_identity` cannot be read or used (the message names the key and the file).
    #[error("{0}")]
    Key(crate::aggregate::RecordKeyFileError),
    /// `key_identity` without `key_file`.
    #[error("parda_host: key_identity needs key_file")]
    IdentityWithoutKey,
}

/// Validates `[parda]` and `[parda_host]` (`base`: the directory relative paths are taken from). Every
/// message names the table and key.
pub(crate) fn validate(
    parda: &PardaFile,
    host: Option<&PardaHostFile>,
    sched: SchedConfig,
    base: &Path,
) -> Result<HostSettings, PardaHostError> {
    if parda.period_phase.is_some() {
        return Err(PardaHostError::PeriodPhase);
    }
    let p = parda.validate().map_err(PardaHostError::Parda)?;
    if p.delay != Nanos::ZERO {
        return Err(PardaHostError::AggregationDelay);
    }
    let default = PardaHostFile { controlled: true, ..PardaHostFile::default() };
    let h = host.unwrap_or(&default);
    if h.id >= MAX_HOSTS {
        return Err(PardaHostError::Id { got: h.id, max: MAX_HOSTS });
    }
    let runs = h.controlled && p.enabled;
    if h.window.is_some() && runs {
        return Err(PardaHostError::WindowWhenControlled);
    }
    let mut settings = HostSettings {
        parda: p,
        id: h.id,
        beta: h.beta,
        runs,
        window: h.window,
        sched,
        transport: ReportTransport::None,
        key: None,
    };
    settings.host_config(0).validate().map_err(PardaHostError::Host)?;
    let p = &settings.parda;
    let given = match (&h.udp, &h.board) {
        (Some(_), Some(_)) => return Err(PardaHostError::UdpAndBoard),
        (None, None) if !h.peers.is_empty() => return Err(PardaHostError::PeersWithoutUdp),
        (u, b) => u.is_some() || b.is_some(),
    };
    let transport = if !runs || p.aggregation == Aggregation::Local {
        if given {
            return Err(PardaHostError::UnusedTransport { uncontrolled: !runs });
        }
        ReportTransport::None
    } else if let Some(u) = &h.udp {
        let listen: SocketAddr = u.parse().map_err(|_| PardaHostError::Udp { text: u.clone() })?;
        let mut peers: Vec<(u32, SocketAddr)> = Vec::with_capacity(h.peers.len());
        for (index, peer) in h.peers.iter().enumerate() {
            if peer.id >= MAX_HOSTS {
                return Err(PardaHostError::PeerId { index, got: peer.id, max: MAX_HOSTS });
            }
            let a: SocketAddr =
                peer.address.parse().map_err(|_| PardaHostError::PeerAddress { index, text: peer.address.clone() })?;
            if peers.iter().any(|&(id, _)| id == peer.id) {
                return Err(PardaHostError::RepeatedPeer { id: peer.id });
            }
            if peer.id != h.id {
                peers.push((peer.id, a));
            }
        }
        ReportTransport::Udp { listen, peers }
    } else if let Some(b) = &h.board {
        let slots = h.board_slots.unwrap_or(DEFAULT_BOARD_SLOTS);
        if slots == 0 || slots > MAX_HOSTS {
            return Err(PardaHostError::BoardSlots { got: slots, max: MAX_HOSTS });
        }
        if h.id >= slots {
            return Err(PardaHostError::NoSlot { id: h.id, slots });
        }
        ReportTransport::Board { path: base.join(b), slots }
    } else {
        return Err(PardaHostError::NoTransport);
    };
    settings.key = match (&h.key_file, &transport) {
        (Some(_), ReportTransport::None) => return Err(PardaHostError::KeyWithoutTransport),
        (Some(f), _) => Some(Arc::new(
            RecordKey::from_file(
                &base.join(f),
                "parda_host.key_file",
                h.key_identity.as_deref(),
                "parda_host.key_identity",
            )
            .map_err(PardaHostError::Key)?,
        )),
        (None, _) if h.key_identity.is_some() => return Err(PardaHostError::IdentityWithoutKey),
        (None, _) => None,
    };
    settings.transport = transport;
    Ok(settings)
}

/// One control period as `/api/parda` lists it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, Deserialize)]
pub struct PeriodRecord {
    /// When it ended (s since the gate started).
    pub at_s: f64,
    /// The window for the next period (IOs).
    pub window: f64,
    /// beta used (after eq. (4)).
    pub beta: f64,
    /// The latency signal used (ms): the cluster's, or the host's own; `None` without one.
    pub signal_ms: Option<f64>,
    /// The host's own eq. (1) estimate (ms).
    pub estimate_ms: Option<f64>,
    /// IOs completed in the period.
    pub ios: u64,
}

/// What the gate shows: the controller's state and its recent periods.
#[derive(Clone, Debug, serde::Serialize, Deserialize)]
pub struct HostStatus {
    /// The host's id.
    pub id: u32,
    /// Runs PARDA (else a fixed issue queue).
    pub controlled: bool,
    /// `cluster`, `local`, or `fixed` (an uncontrolled host).
    pub aggregation: String,
    /// w(t) (IOs).
    pub window: f64,
    /// IOs it may have outstanding now.
    pub issue_limit: u32,
    /// beta in use.
    pub beta: f64,
    /// beta before eq. (4): `[parda_host] beta`, or beta_per_share x the sum of the VMs' weights.
    pub beta_base: f64,
    /// VMs in the host's local scheduler.
    pub vms: usize,
    /// IOs outstanding at the array.
    pub outstanding: u32,
    /// IOs queued in the host.
    pub queued: usize,
    /// The own eq. (1) estimate (ms).
    pub estimate_ms: Option<f64>,
    /// The last signal used (ms).
    pub signal_ms: Option<f64>,
    /// Hosts in the last cluster average (this one included); 0 under local aggregation.
    pub cluster_hosts: usize,
    /// The other hosts configured as UDP peers (0 with a board, whose hosts are not listed, or local
    /// aggregation): with them all reporting, `cluster_hosts` is one more.
    #[serde(default)]
    pub peers: usize,
    /// Periods ended.
    pub periods: u64,
    /// IOs completed.
    pub completed: u64,
    /// Requests not issued because their connection had closed while they waited in the host.
    pub abandoned: u64,
    /// Their latencies summed (ns): with `completed`, the mean latency over any span between two reads.
    pub latency_sum_ns: u64,
    /// When this status was read (s on the gate's clock, the one `history` uses).
    pub now_s: f64,
    /// Report exchanges that failed (the board could not be written or read).
    pub exchange_errors: u64,
    /// Records refused (corrupt, misplaced, unsigned or with a tag that does not match).
    pub records_refused: u64,
    /// The identity of the key the host's reports are signed with (`key_file`), or `None` (unsigned).
    #[serde(default)]
    pub signed_by: Option<String>,
    /// Valid records carrying this host's id from another host: two hosts configured with one id (the
    /// first is logged as an error, then one line a minute with the count while it lasts).
    #[serde(default)]
    pub id_conflicts: u64,
    /// Where the last of them came from (a sender's address, or the board's slot).
    #[serde(default)]
    pub id_conflict_from: Option<String>,
    /// Records of a peer's incarnation that its live one displaced, still advancing: two other hosts
    /// report under one id (the first is logged as a warning, then one line a minute with the count while
    /// it lasts).
    #[serde(default)]
    pub peer_id_conflicts: u64,
    /// The last of them: the peer's id and where its record came from.
    #[serde(default)]
    pub peer_id_conflict: Option<String>,
    /// Times the board's path was found deleted or naming another file, and opened again.
    #[serde(default)]
    pub board_reopened: u64,
    /// Stalls of this process seen (module comment, "Stalls").
    #[serde(default)]
    pub stalls: u64,
    /// IOs answered across a stall, left out of eq. (1) (and of `completed` and `latency_sum_ns`).
    #[serde(default)]
    pub stalled_ios: u64,
    /// The newest periods, oldest first (at most [`MAX_PERIOD_RECORDS`]).
    pub history: VecDeque<PeriodRecord>,
}

impl HostStatus {
    fn update(&mut self, s: &HostStats) {
        self.window = s.window;
        self.issue_limit = s.issue_limit;
        self.beta = s.beta;
        self.beta_base = s.beta_base;
        self.outstanding = s.outstanding;
        self.queued = s.queued;
        self.estimate_ms = s.estimate_ns.map(|v| v / 1e6);
        self.periods = s.periods;
        self.completed = s.completed;
    }
}

/// Adds a period's record to `history`, dropping the oldest past [`MAX_PERIOD_RECORDS`].
fn keep_record(history: &mut VecDeque<PeriodRecord>, record: PeriodRecord) {
    crate::bounded::push(history, record, MAX_PERIOD_RECORDS);
}

/// A request waiting in the host.
struct Parked {
    volume: Arc<RemoteVolume>,
    offset: u64,
    op: Op,
    fua: bool,
    done: Done,
    /// The connection's flag: set once nobody can receive the reply.
    gone: Option<Arc<AtomicBool>>,
}

enum Msg {
    /// A VM's request arrives.
    Submit { vm: TenantId, parked: Parked },
    /// An issued request was answered: its latency at the array, its size, whether it succeeded, and
    /// whether a stall of this process may fall between its send and its reply (module comment,
    /// "Stalls").
    Answered { vm: TenantId, latency: Nanos, size: u64, ok: bool, crossed: bool },
    /// An administrator resizes an uncontrolled host's fixed issue queue.
    SetWindow(f64, tokio::sync::oneshot::Sender<Result<(), GateError>>),
    /// The current period ends this long from now (`PUT /api/parda/period`).
    SetPeriodEnd(std::time::Duration, tokio::sync::oneshot::Sender<Result<(), GateError>>),
    /// A VM joins the host (a tenant added by a reload).
    AddVm(QosSpec, tokio::sync::oneshot::Sender<Result<TenantId, GateError>>),
    /// A VM's spec changes (a reload).
    SetVmSpec(TenantId, QosSpec, tokio::sync::oneshot::Sender<Result<(), GateError>>),
    /// A VM leaves the host (its tenant was removed and its last volume closed: [`VmLease`]).
    RemoveVm(TenantId),
    /// The local scheduler's settings change (a reload of the gateway's `[mclock]`).
    SetSched(SchedConfig),
}

/// Why a PARDA host's gate cannot start ([`HostGate::start`]); the message names the part that failed
/// (its controller, a VM, the UDP socket, the board, the aggregator, the stall watch) once.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The controller refuses the host's settings.
    #[error("parda_host: {0}")]
    Controller(rein_core::parda::PardaError),
    /// The controller refuses one of the VMs.
    #[error("parda_host: {0}")]
    Vm(rein_core::parda::PardaError),
    /// The reports' UDP socket cannot be bound.
    #[error("parda_host: udp {listen}: {source}")]
    Udp {
        /// The socket's address (`[parda_host] udp`).
        listen: SocketAddr,
        /// Why not.
        source: crate::aggregate::AggregationError,
    },
    /// The shared board cannot be opened.
    #[error("parda_host: board {}: {source}", path.display())]
    Board {
        /// The board's file (`[parda_host] board`).
        path: PathBuf,
        /// Why not.
        source: crate::aggregate::AggregationError,
    },
    /// The aggregator refuses the reports' timeout.
    #[error("parda: {0}")]
    Aggregator(rein_core::parda::PardaError),
    /// The process's stall watch cannot start (`crate::stall`).
    #[error("parda_host: {0}")]
    StallWatch(#[source] crate::stall::StallWatchError),
}

/// Why the gate refuses a change ([`HostGate::set_fixed_window`], [`HostGate::set_period_end_in`],
/// [`HostGate::add_vm`], [`HostGate::set_vm_spec`]); the admin API answers it with 409, a reload names
/// the tenant.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GateError {
    /// The gate's task has ended.
    #[error("the PARDA host has stopped")]
    Stopped,
    /// A window set on a host that runs PARDA (its window follows eq. (2)).
    #[error(
        "this is a PARDA host: its window follows eq. (2) (only an uncontrolled host's fixed issue queue can be \
         set)"
    )]
    NotFixed,
    /// A fixed window the controller refuses (out of range).
    #[error("{0}")]
    Window(rein_core::parda::PardaError),
    /// A period end, a VM or a VM's spec the controller refuses.
    #[error("parda host: {0}")]
    Refused(rein_core::parda::PardaError),
}

/// The gate every request of a PARDA host passes; see the module comment.
pub struct HostGate {
    tx: mpsc::UnboundedSender<Msg>,
    status: Arc<Mutex<HostStatus>>,
    clock: Clock,
}

impl HostGate {
    /// Starts the host: the controller with `vms` (the tenants' specs, in order; their ids come back in
    /// the same order), the transport (binds the UDP socket or opens the board), and the gate's task on
    /// the current runtime. The task ends when the gate and every [`HostedVolume`] holding it are gone.
    pub async fn start(settings: &HostSettings, vms: &[QosSpec]) -> Result<(Arc<HostGate>, Vec<TenantId>), StartError> {
        // A restarted host takes a new incarnation, so its peers accept its reports from sequence 1 again.
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            .max(1);
        let clock = Clock::new();
        let mut ctl = HostController::new(settings.parda.config, settings.host_config(epoch), clock.now())
            .map_err(StartError::Controller)?;
        let mut ids = Vec::with_capacity(vms.len());
        for spec in vms {
            ids.push(ctl.add_vm(*spec).map_err(StartError::Vm)?);
        }
        let transport = match &settings.transport {
            ReportTransport::None => None,
            ReportTransport::Udp { listen, peers } => Some(Transport::Udp(
                UdpAggregation::bind(settings.id, *listen, peers)
                    .await
                    .map_err(|source| StartError::Udp { listen: *listen, source })?
                    .with_key(settings.key.clone()),
            )),
            ReportTransport::Board { path, slots } => Some(Transport::File(
                FileAggregation::open(path, *slots)
                    .map_err(|source| StartError::Board { path: path.clone(), source })?
                    .with_key(settings.key.clone())
                    .with_deadline(board_deadline(settings.parda.config.period)),
            )),
        };
        let agg = Aggregator::new(settings.parda.timeout).map_err(StartError::Aggregator)?;
        let watch = crate::stall::process().map_err(StartError::StallWatch)?;
        let aggregation = match (settings.runs, settings.parda.aggregation) {
            (false, _) => "fixed",
            (true, a) => a.name(),
        }
        .to_string();
        let mut status = HostStatus {
            id: settings.id,
            controlled: settings.runs,
            aggregation,
            window: 0.0,
            issue_limit: 0,
            beta: 0.0,
            outstanding: 0,
            queued: 0,
            estimate_ms: None,
            signal_ms: None,
            cluster_hosts: 0,
            peers: match &settings.transport {
                ReportTransport::Udp { peers, .. } => peers.len(),
                _ => 0,
            },
            periods: 0,
            completed: 0,
            abandoned: 0,
            beta_base: 0.0,
            vms: ids.len(),
            latency_sum_ns: 0,
            now_s: 0.0,
            exchange_errors: 0,
            records_refused: 0,
            signed_by: settings.key.as_ref().map(|k| k.identity().to_string()),
            id_conflicts: 0,
            id_conflict_from: None,
            peer_id_conflicts: 0,
            peer_id_conflict: None,
            board_reopened: 0,
            stalls: 0,
            stalled_ios: 0,
            history: VecDeque::new(),
        };
        status.update(&ctl.stats());
        let status = Arc::new(Mutex::new(status));
        let (tx, rx) = mpsc::unbounded_channel();
        let gate = Arc::new(HostGate { tx: tx.clone(), status: status.clone(), clock });
        let task = Task {
            ctl,
            agg,
            transport,
            runs: settings.runs,
            local: settings.parda.aggregation == Aggregation::Local,
            clock,
            parked: HashMap::new(),
            next_handle: 0,
            latency_sum_ns: 0,
            abandoned: 0,
            answers: tx.downgrade(),
            status,
            refused_logged: HashSet::new(),
            refused_overflow_logged: false,
            exchange_failing: LogRate::default(),
            id_conflicting: LogRate::default(),
            peer_id_conflicting: LogRate::default(),
            stalls_base: watch.stalls(),
            stalls_seen: watch.stalls(),
            watch,
            stalled_ios: 0,
        };
        tokio::spawn(task.run(rx));
        Ok((gate, ids))
    }

    /// The host's state now.
    pub fn status(&self) -> HostStatus {
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
        s.now_s = self.clock.now().as_secs_f64();
        s
    }

    /// Resizes an uncontrolled host's fixed issue queue to `window` IOs (parda.txt §5.2's runs resize the
    /// hosts' queues by hand; `PUT /api/parda/window`). IOs already issued stay outstanding; a smaller
    /// window issues nothing until enough complete. Errors: a PARDA host (its window follows eq. (2)), a
    /// window outside [1, 65536], or a gate that has stopped.
    pub async fn set_fixed_window(&self, window: f64) -> Result<(), GateError> {
        self.ask(|tx| Msg::SetWindow(window, tx)).await
    }

    /// The current control period ends `ends_in` from now, and the next ones a period apart from there
    /// (`PUT /api/parda/period`): hosts started at different moments line their periods up where a run
    /// wants them (`rein cluster` puts them where the simulator's hosts tick). The IOs of the period so
    /// far stay in it. Errors: more than two periods ahead, or a gate that has stopped.
    pub async fn set_period_end_in(&self, ends_in: std::time::Duration) -> Result<(), GateError> {
        self.ask(|tx| Msg::SetPeriodEnd(ends_in, tx)).await
    }

    /// A VM joins the host with `spec` (its weight is its share); returns its id. Errors: the host's VM
    /// bound, a spec the local scheduler refuses, or a gate that has stopped.
    pub async fn add_vm(&self, spec: QosSpec) -> Result<TenantId, GateError> {
        self.ask(|tx| Msg::AddVm(spec, tx)).await
    }

    /// VM `vm`'s spec becomes `spec`: the local scheduler uses it at once, beta (its share) from the next
    /// period. Errors: an unknown VM, a spec the local scheduler refuses, or a gate that has stopped.
    pub async fn set_vm_spec(&self, vm: TenantId, spec: QosSpec) -> Result<(), GateError> {
        self.ask(|tx| Msg::SetVmSpec(vm, spec, tx)).await
    }

    /// Sends the gate the message `msg` makes around a reply channel and waits for its answer; a gate that
    /// has stopped (the message not taken, or dropped unanswered) is [`GateError::Stopped`].
    async fn ask<T>(
        &self,
        msg: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, GateError>>) -> Msg,
    ) -> Result<T, GateError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx.send(msg(tx)).map_err(|_| GateError::Stopped)?;
        rx.await.map_err(|_| GateError::Stopped)?
    }

    /// The local scheduler takes `settings`' scheduler settings (the gateway's `[mclock]` with `[parda]`'s
    /// batching over them) from its next tags on; queued requests stay. A gate that has stopped has
    /// nothing to change.
    pub fn set_sched(&self, settings: &HostSettings) {
        let _ = self.tx.send(Msg::SetSched(settings.host_config(0).sched));
    }

    /// VM `vm` leaves the host: its share leaves beta from the next period, requests of it still queued
    /// in the host are answered [`IoError::Abandoned`], its IOs at the array complete as usual. Sent by
    /// the last [`VmLease`] of the VM as it drops; a gate that has stopped has nothing to remove.
    fn remove_vm(&self, vm: TenantId) {
        let _ = self.tx.send(Msg::RemoveVm(vm));
    }

    /// A request of VM `vm`: queued in the host, sent when the window allows (unless its `gone` is set by
    /// then), answered through its `done` (invariant 1).
    fn submit(&self, vm: TenantId, parked: Parked) {
        if let Err(mpsc::error::SendError(Msg::Submit { parked, .. })) = self.tx.send(Msg::Submit { vm, parked }) {
            (parked.done)(Err(IoError::Shutdown), Default::default());
        }
    }
}

/// A VM's place in a PARDA host, held by the gateway's tenant list and by each volume of the VM: when
/// the last holder lets go (the tenant was removed by a reload and the last connection to its volumes
/// closed), the VM leaves the host (its share leaves beta from the next period).
pub struct VmLease {
    /// The host.
    pub gate: Arc<HostGate>,
    /// The VM in the host's local scheduler.
    pub vm: TenantId,
}

impl Drop for VmLease {
    fn drop(&mut self) {
        self.gate.remove_vm(self.vm);
    }
}

/// A volume of a PARDA host's VM: its requests pass the host's gate.
pub struct HostedVolume {
    /// The volume.
    pub volume: Arc<RemoteVolume>,
    /// The VM (and its host).
    pub lease: Arc<VmLease>,
}

impl HostedVolume {
    /// Queues the request in the host; `done` gets the result. `gone`, if given, is the connection's flag
    /// for "nobody can receive the reply any more": a request still waiting in the host then is not
    /// issued (it is answered with [`IoError::Abandoned`]).
    pub fn submit(&self, offset: u64, op: Op, fua: bool, done: Done, gone: Option<Arc<AtomicBool>>) {
        let parked = Parked { volume: self.volume.clone(), offset, op, fua, done, gone };
        self.lease.gate.submit(self.lease.vm, parked)
    }
}

struct Task {
    ctl: HostController,
    agg: Aggregator,
    transport: Option<Transport>,
    runs: bool,
    local: bool,
    clock: Clock,
    parked: HashMap<u64, Parked>,
    next_handle: u64,
    /// Latencies of the completed IOs, summed (ns).
    latency_sum_ns: u64,
    /// Requests not issued because their connection had closed.
    abandoned: u64,
    /// For the answers' callbacks (weak: the task ends when every gate is gone and nothing is in flight).
    answers: mpsc::WeakUnboundedSender<Msg>,
    status: Arc<Mutex<HostStatus>>,
    /// Senders (or slots) whose refused reports were logged: each once, at most [`MAX_REFUSED_LOGGED`].
    refused_logged: HashSet<String>,
    /// Whether the log said that further places are only counted.
    refused_overflow_logged: bool,
    /// Failed exchanges: when the last one was logged and how many failed since (not started: the last
    /// one worked). The first failure is logged at once, then one line per [`EXCHANGE_FAILURE_LOG_EVERY`].
    exchange_failing: LogRate<Nanos>,
    /// Records of another host with this host's id: when the last line was logged and how many came
    /// since (not started: none yet). The first is logged at once, then one line per
    /// [`EXCHANGE_FAILURE_LOG_EVERY`] while more come.
    id_conflicting: LogRate<Nanos>,
    /// Records of two incarnations of one peer, both advancing (`peer_id_conflicts`): logged as
    /// `id_conflicting` is.
    peer_id_conflicting: LogRate<Nanos>,
    /// Stalls of this process (module comment, "Stalls").
    watch: Arc<crate::stall::StallWatch>,
    /// The watch's count of stalls when the host started: the host's are the ones after.
    stalls_base: u64,
    /// The watch's count of stalls when the last was logged here.
    stalls_seen: u64,
    /// IOs answered across a stall.
    stalled_ios: u64,
}

/// How often a run of failed report exchanges is logged (a full disk under the board failed every period:
/// two lines a second at `period_s = 0.5`).
const EXCHANGE_FAILURE_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Senders or slots whose refused reports are logged (each once); the rest count in `records_refused`.
const MAX_REFUSED_LOGGED: usize = 64;

/// How long a period's exchange waits for the board: a quarter of the period, at least 5 ms (a busy
/// machine's thread start and a network file system's IO) and at most [`BOARD_IO_DEADLINE`] (the control
/// loop, which issues and completes the VMs' IOs, awaits it; module comment, "Stalls").
fn board_deadline(period: Nanos) -> std::time::Duration {
    (std::time::Duration::from_nanos(period.0) / 4).clamp(std::time::Duration::from_millis(5), BOARD_IO_DEADLINE)
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut wait: Option<Nanos> = None;
        loop {
            let due = self.ctl.poll_timeout();
            let wake = wait.map_or(due, |w| w.min(due));
            let first = tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => Some(m),
                    None => break,
                },
                _ = tokio::time::sleep_until(self.clock.instant(wake)) => None,
            };
            if self.watch.stalls() != self.stalls_seen {
                self.stalled();
            }
            for m in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                self.handle(m);
            }
            let now = self.clock.now();
            if now >= self.ctl.poll_timeout() {
                self.period(now).await;
            }
            wait = self.pump().await;
            let st = self.ctl.stats();
            let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
            s.update(&st);
            s.latency_sum_ns = self.latency_sum_ns;
            s.abandoned = self.abandoned;
            s.stalls = self.stalls_seen - self.stalls_base;
            s.stalled_ios = self.stalled_ios;
            s.vms = self.ctl.scheduler().tenant_count();
        }
        for (_, p) in self.parked.drain() {
            (p.done)(Err(IoError::Shutdown), Default::default());
        }
    }

    /// The watch saw a stall (module comment, "Stalls"): logged once.
    fn stalled(&mut self) {
        self.stalls_seen = self.watch.stalls();
        let late = self.watch.last_len();
        let in_flight = self.ctl.stats().outstanding;
        tracing::warn!(
            stalled_s = late.as_secs_f64(),
            in_flight,
            "parda host: this process did not run for {:.1} s or more (stopped, or a paused VM): the {in_flight} \
             IOs in flight across the stall are left out of the latency estimate (their latency would be the \
             stall's; counted in stalled_ios)",
            late.as_secs_f64()
        );
    }

    fn handle(&mut self, m: Msg) {
        let now = self.clock.now();
        match m {
            Msg::Submit { vm, parked } => {
                let handle = self.next_handle;
                self.next_handle += 1;
                let mut req = Request::new(vm, handle);
                req.size = parked.op.len().max(1);
                req.offset = parked.offset;
                match self.ctl.enqueue(now, req) {
                    Ok(()) => {
                        self.parked.insert(handle, parked);
                    }
                    Err(e) => {
                        let e = match e {
                            rein_core::parda::PardaError::Sched(s) => IoError::Refused(s),
                            _ => IoError::Shutdown,
                        };
                        (parked.done)(Err(e), Default::default());
                    }
                }
            }
            Msg::SetWindow(window, reply) => {
                let r = self.ctl.set_fixed_window(now, window).map_err(|e| match e {
                    rein_core::parda::PardaError::NotFixed => GateError::NotFixed,
                    e => GateError::Window(e),
                });
                if r.is_ok() {
                    tracing::info!(window, "PARDA host: fixed issue queue resized");
                }
                let _ = reply.send(r);
            }
            Msg::SetPeriodEnd(ends_in, reply) => {
                let end = now.saturating_add(Nanos::from_duration(ends_in));
                let r = self.ctl.set_period_end(now, end).map_err(GateError::Refused);
                if r.is_ok() {
                    tracing::info!(ends_in_s = ends_in.as_secs_f64(), "PARDA host: control period moved");
                }
                let _ = reply.send(r);
            }
            Msg::AddVm(spec, reply) => {
                let r = self.ctl.add_vm(spec).map_err(GateError::Refused);
                let _ = reply.send(r);
            }
            Msg::SetVmSpec(vm, spec, reply) => {
                let r = self.ctl.set_vm_spec(vm, spec).map_err(GateError::Refused);
                let _ = reply.send(r);
            }
            Msg::SetSched(config) => self.ctl.set_sched_config(config),
            Msg::RemoveVm(vm) => match self.ctl.remove_vm(vm) {
                Ok(handles) => {
                    // Requests queued for it whose connections have not closed yet: nobody else can
                    // serve them.
                    for h in handles {
                        if let Some(p) = self.parked.remove(&h) {
                            self.abandoned += 1;
                            (p.done)(Err(IoError::Abandoned), Default::default());
                        }
                    }
                    tracing::info!(vm = vm.index(), "PARDA host: a removed tenant's VM left the host");
                }
                Err(e) => tracing::warn!("parda host: removing a VM: {e}"),
            },
            Msg::Answered { vm, latency, size, ok, crossed } => {
                // The controller knows every VM it issued for; an error here would be a gate bug, and
                // the slot must be freed either way, so it is only logged.
                let r = if ok && !crossed {
                    self.latency_sum_ns = self.latency_sum_ns.saturating_add(latency.0);
                    self.ctl.on_complete(now, vm, latency, size)
                } else {
                    // Its latency may hold a stall (module comment, "Stalls").
                    self.stalled_ios += u64::from(ok);
                    self.ctl.on_issue_failed(now, vm)
                };
                if let Err(e) = r {
                    tracing::error!("parda host: completion not taken: {e}");
                }
            }
        }
    }

    /// Issues what the window allows; returns when the local scheduler wants to be asked again.
    async fn pump(&mut self) -> Option<Nanos> {
        loop {
            let now = self.clock.now();
            match self.ctl.poll(now) {
                Poll::Dispatch(d) => {
                    let Some(p) = self.parked.remove(&d.handle) else {
                        tracing::error!(handle = d.handle, "parda host: dispatched a request it does not hold");
                        continue;
                    };
                    let vm = d.tenant;
                    if p.gone.as_ref().is_some_and(|g| g.load(Ordering::Relaxed)) {
                        // Nobody can receive the reply: the slot poll took goes back at once.
                        self.abandoned += 1;
                        if let Err(e) = self.ctl.on_issue_failed(now, vm) {
                            tracing::error!("parda host: abandoned request not released: {e}");
                        }
                        (p.done)(Err(IoError::Abandoned), Default::default());
                        continue;
                    }
                    let size = p.op.len().max(1);
                    let answers = self.answers.clone();
                    let clock = self.clock;
                    let sent = clock.now();
                    let done = p.done;
                    let watch = self.watch.clone();
                    // On the watch's clock, for its question (module comment, "Stalls").
                    let sent_w = watch.now();
                    let wrapped: Done = Box::new(move |res, served| {
                        let ok = res.is_ok();
                        let latency = clock.now().saturating_sub(sent);
                        let crossed = watch.crossed(sent_w, watch.now());
                        if let Some(tx) = answers.upgrade() {
                            let _ = tx.send(Msg::Answered { vm, latency, size, ok, crossed });
                        }
                        done(res, served);
                    });
                    p.volume.submit(p.offset, p.op, p.fua, wrapped).await;
                }
                Poll::Wait(t) => return Some(t),
                Poll::Empty => return None,
            }
        }
    }

    /// A control period ends: publish, aggregate, update (as the simulator's host layer).
    async fn period(&mut self, now: Nanos) {
        let mut cluster_hosts = 0;
        let mut errors = 0;
        let mut refused = 0;
        let mut reopened = 0;
        let mut same_id: Option<(u64, String)> = None;
        let mut rivals: Option<(u64, String)> = None;
        let signal = if self.runs {
            let own = self.ctl.close_period(now);
            if self.local {
                self.ctl.local_estimate_ns()
            } else {
                match self.transport.as_mut() {
                    Some(t) => match t.exchange(now, &own, &mut self.agg).await {
                        Ok(stats) => {
                            if self.exchange_failing.started() {
                                let since = std::mem::take(&mut self.exchange_failing).unlogged();
                                tracing::info!(failed = since, "parda host: report exchange restored");
                            }
                            refused += stats.refused() as u64;
                            if let (Some(change), Transport::File(f)) = (stats.reopened, &*t) {
                                reopened += 1;
                                board_reopened_log(f.path(), change);
                            }
                            if let Some((from, r)) = stats.same_id_shown.last() {
                                let n = stats.same_id as u64;
                                self.id_conflict(now, n, from, r);
                                same_id = Some((n, from.clone()));
                            }
                            if let Some((from, r)) = stats.rivals_shown.last() {
                                let n = stats.rivals as u64;
                                self.peer_id_conflict(now, n, from, r);
                                rivals = Some((n, format!("host {} from {from}", r.host)));
                            }
                            // Once per sender or slot (a flood of forgeries is counted, not logged).
                            let misplaced = stats.misplaced_shown.into_iter().map(|(from, host)| {
                                let e = format!(
                                    "a valid record for host {host}, which is not where that host reports from \
                                     (its configured address or slot)"
                                );
                                (from, e)
                            });
                            let corrupt = stats.corrupt.into_iter().map(|(from, e)| (from, e.to_string()));
                            for (from, e) in corrupt.chain(misplaced) {
                                if self.refused_logged.contains(&from) {
                                    continue;
                                }
                                if self.refused_logged.len() < MAX_REFUSED_LOGGED {
                                    tracing::warn!(%from, "parda host: report refused: {e} (further refusals \
                                                   from there are counted in records_refused)");
                                    self.refused_logged.insert(from);
                                } else if !self.refused_overflow_logged {
                                    tracing::warn!(
                                        "parda host: reports refused from more than \
                                                    {MAX_REFUSED_LOGGED} places; further ones are counted in \
                                                    records_refused only"
                                    );
                                    self.refused_overflow_logged = true;
                                }
                            }
                        }
                        Err(e) => {
                            errors += 1;
                            match minutely(&mut self.exchange_failing, now, 1) {
                                Some(None) => tracing::warn!(
                                    "parda host: report exchange failed: {e} (further failures are counted in \
                                     exchange_errors, logged at most once a minute)"
                                ),
                                Some(Some(since)) => {
                                    tracing::warn!(failed = since, "parda host: report exchange still failing: {e}")
                                }
                                None => {}
                            }
                            let _ = self.agg.accept(now, own);
                        }
                    },
                    None => {
                        let _ = self.agg.accept(now, own);
                    }
                }
                let c = self.agg.cluster(now);
                cluster_hosts = c.as_ref().map_or(0, |c| c.hosts);
                c.map(|c| c.latency_ns)
            }
        } else {
            None
        };
        let out = self.ctl.on_period(now, signal);
        let st = self.ctl.stats();
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        s.update(&st);
        s.signal_ms = signal.map(|v| v / 1e6);
        s.cluster_hosts = cluster_hosts;
        s.exchange_errors += errors;
        s.records_refused += refused;
        s.board_reopened += reopened;
        if let Some((n, from)) = same_id {
            s.id_conflicts += n;
            s.id_conflict_from = Some(from);
        }
        if let Some((n, which)) = rivals {
            s.peer_id_conflicts += n;
            s.peer_id_conflict = Some(which);
        }
        let record = PeriodRecord {
            at_s: now.as_secs_f64(),
            window: out.window,
            beta: out.beta,
            signal_ms: s.signal_ms,
            estimate_ms: s.estimate_ms,
            ios: out.ios,
        };
        keep_record(&mut s.history, record);
    }
}

impl Task {
    /// `n` records of another host with this host's id came in an exchange, the last from `from`
    /// (module comment, "Mishaps the host names"): logged at once, then once a minute while more come.
    fn id_conflict(&mut self, now: Nanos, n: u64, from: &str, r: &rein_core::parda::HostReport) {
        let (id, epoch) = (self.ctl.host_config().id, self.ctl.host_config().epoch);
        match minutely(&mut self.id_conflicting, now, n) {
            Some(None) => tracing::error!(
                %from,
                "parda host: another host uses this host's id {id}: a valid record for host {id} with epoch {} \
                 (this host's is {epoch}) came from {from}; the peers take both hosts' reports for one host's: \
                 give each host its own [parda_host] id (counted in id_conflicts, logged at most once a minute \
                 while it lasts)",
                r.epoch
            ),
            Some(Some(since)) => tracing::error!(
                %from,
                records = since,
                "parda host: another host still uses this host's id {id}: {since} more of its records, the last \
                 from {from} (epoch {})",
                r.epoch
            ),
            None => {}
        }
    }

    /// `n` records of a peer's displaced incarnation, still advancing, came in an exchange, the last
    /// `r` from `from` (module comment, "Mishaps the host names"): logged at once, then once a minute
    /// while more come.
    fn peer_id_conflict(&mut self, now: Nanos, n: u64, from: &str, r: &rein_core::parda::HostReport) {
        let id = r.host;
        match minutely(&mut self.peer_id_conflicting, now, n) {
            Some(None) => tracing::warn!(
                %from,
                "parda host: two hosts report as host {id}: records of its incarnation {} still come from {from} \
                 beside another incarnation's, each advancing; this host takes one at a time for host {id}, so \
                 the cluster signal is wrong: give each host its own [parda_host] id (or someone replays old \
                 records; counted in peer_id_conflicts, logged at most once a minute while it lasts)",
                r.epoch
            ),
            Some(Some(since)) => tracing::warn!(
                %from,
                records = since,
                "parda host: two hosts still report as host {id}: {since} more records of the incarnation its \
                 live one displaced, the last from {from} (epoch {})",
                r.epoch
            ),
            None => {}
        }
    }
}

/// A run of `n` more events at `now` in a run logged at once, then once per
/// [`EXCHANGE_FAILURE_LOG_EVERY`] (`state`: the line's [`LogRate`], not started before the first):
/// `Some(None)` to log the first, `Some(Some(k))` to log again with the `k` events since the last line,
/// `None` not to log now.
fn minutely(state: &mut LogRate<Nanos>, now: Nanos, n: u64) -> Option<Option<u64>> {
    let first = !state.started();
    let unlogged = state.due(now, EXCHANGE_FAILURE_LOG_EVERY, n)?;
    // A later line counts the events of its own batch too ("k more records, the last from ...").
    Some((!first).then_some(unlogged + n))
}

/// The board's path no longer named the open file and was opened again (module comment, "Mishaps the
/// host names").
fn board_reopened_log(path: &Path, change: BoardChange) {
    let path = path.display();
    match change {
        BoardChange::Deleted => tracing::warn!(
            %path,
            "parda host: the board {path} was deleted under this host: created it again (hosts still on the \
             deleted file move to the new one as they notice, within a period; counted in board_reopened)"
        ),
        BoardChange::Replaced => tracing::warn!(
            %path,
            "parda host: the board {path} names another file than the one this host had open (replaced, or \
             deleted and created again by another host): this host opened it and reports there now (counted in \
             board_reopened)"
        ),
    }
}

/// Appends the host's series to a `/metrics` text: window, issue limit, beta, IOs outstanding and queued,
/// the latency estimate and signal, periods and IOs completed, requests abandoned, failed exchanges and
/// refused reports (a count to alert on: forged or misconfigured senders), records of another host with
/// this host's id (another to alert on), board reopenings, stalls and the IOs answered across them.
pub fn metrics_text(o: &mut String, s: &HostStatus) {
    use std::fmt::Write;
    let id = s.id;
    let series: [(&str, &str, &str, f64); 19] = [
        ("rein_parda_window", "gauge", "The host's window w(t), IOs (eq. (2)).", s.window),
        (
            "rein_parda_issue_limit",
            "gauge",
            "IOs the host may have outstanding at the array now.",
            s.issue_limit.into(),
        ),
        ("rein_parda_beta", "gauge", "beta in use (after eq. (4)).", s.beta),
        ("rein_parda_outstanding", "gauge", "IOs outstanding at the array.", s.outstanding.into()),
        ("rein_parda_queued", "gauge", "IOs waiting in the host's local scheduler.", s.queued as f64),
        (
            "rein_parda_latency_estimate_seconds",
            "gauge",
            "The host's eq. (1) latency estimate.",
            s.estimate_ms.unwrap_or(0.0) / 1e3,
        ),
        (
            "rein_parda_signal_seconds",
            "gauge",
            "The latency signal of the last period (cluster or own).",
            s.signal_ms.unwrap_or(0.0) / 1e3,
        ),
        ("rein_parda_cluster_hosts", "gauge", "Hosts in the last cluster average.", s.cluster_hosts as f64),
        (
            "rein_parda_peers",
            "gauge",
            "Other hosts configured as UDP peers (0 with a board or local aggregation).",
            s.peers as f64,
        ),
        ("rein_parda_periods_total", "counter", "Control periods ended.", s.periods as f64),
        ("rein_parda_completed_total", "counter", "IOs completed at the array.", s.completed as f64),
        (
            "rein_parda_abandoned_total",
            "counter",
            "Requests not issued because their connection had closed while they waited.",
            s.abandoned as f64,
        ),
        (
            "rein_parda_exchange_errors_total",
            "counter",
            "Report exchanges that failed (the board not written or read).",
            s.exchange_errors as f64,
        ),
        (
            "rein_parda_records_refused_total",
            "counter",
            "Other hosts' reports refused: corrupt, from an address not the peer's, unsigned or with a tag that \
             does not match.",
            s.records_refused as f64,
        ),
        (
            "rein_parda_id_conflicts_total",
            "counter",
            "Valid records carrying this host's id from another host: two hosts configured with one id.",
            s.id_conflicts as f64,
        ),
        (
            "rein_parda_peer_id_conflicts_total",
            "counter",
            "Records of a peer's displaced incarnation that still advance: two other hosts report under one id.",
            s.peer_id_conflicts as f64,
        ),
        (
            "rein_parda_board_reopened_total",
            "counter",
            "Times the board's path was found deleted or naming another file, and opened again.",
            s.board_reopened as f64,
        ),
        ("rein_parda_stalls_total", "counter", "Stalls of this process seen (stopped, a paused VM).", s.stalls as f64),
        (
            "rein_parda_stalled_ios_total",
            "counter",
            "IOs answered across a stall, left out of the latency estimate.",
            s.stalled_ios as f64,
        ),
    ];
    for (metric, kind, help, v) in series {
        let _ = writeln!(o, "# HELP {metric} {help}\n# TYPE {metric} {kind}\n{metric}{{host=\"{id}\"}} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[parda]` and `[parda_host]`'s refusals are typed: the key's value, its bound, the peer's place
    /// (gateway's `parda_host_refusals_read_as_before` checks their messages).
    #[test]
    fn refusals_are_typed_with_the_key_value_and_bound() {
        #[derive(Deserialize)]
        struct Tables {
            parda: PardaFile,
            parda_host: Option<PardaHostFile>,
        }
        let refuse = |text: &str| {
            let t: Tables = toml::from_str(text).unwrap();
            match validate(&t.parda, t.parda_host.as_ref(), SchedConfig::default(), Path::new("")) {
                Err(e) => e,
                Ok(_) => panic!("accepted: {text}"),
            }
        };
        let cluster = "[parda]\nlatency_threshold_ms = 10\naggregation = \"cluster\"\n[parda_host]\n";
        let local = "[parda]\nlatency_threshold_ms = 10\naggregation = \"local\"\n[parda_host]\n";
        let e = refuse(&format!("{local}id = 4096"));
        assert!(matches!(e, PardaHostError::Id { got: 4096, max: 4096 }), "{e:?}");
        let e = refuse(&format!("{local}board = \"b\""));
        assert!(matches!(e, PardaHostError::UnusedTransport { uncontrolled: false }), "{e:?}");
        let e = refuse(&format!("{cluster}controlled = false\nudp = \"127.0.0.1:1\""));
        assert!(matches!(e, PardaHostError::UnusedTransport { uncontrolled: true }), "{e:?}");
        let e = refuse(&format!("{local}beta = -1"));
        assert!(matches!(e, PardaHostError::Host(_)), "{e:?}");
        let peers = "udp = \"127.0.0.1:1\"\npeers = [{ id = 1, address = \"127.0.0.1:2\" }, ";
        let e = refuse(&format!("{cluster}{peers}{{ id = 4096, address = \"127.0.0.1:3\" }}]"));
        assert!(matches!(e, PardaHostError::PeerId { index: 1, got: 4096, max: 4096 }), "{e:?}");
        let e = refuse(&format!("{cluster}{peers}{{ id = 2, address = \"h:1\" }}]"));
        assert!(matches!(&e, PardaHostError::PeerAddress { index: 1, text } if text == "h:1"), "{e:?}");
        let e = refuse(&format!("{cluster}{peers}{{ id = 1, address = \"127.0.0.1:3\" }}]"));
        assert!(matches!(e, PardaHostError::RepeatedPeer { id: 1 }), "{e:?}");
        let e = refuse(&format!("{cluster}board = \"b\"\nboard_slots = 4097"));
        assert!(matches!(e, PardaHostError::BoardSlots { got: 4097, max: 4096 }), "{e:?}");
        let e = refuse(&format!("{cluster}board = \"b\"\nboard_slots = 8\nid = 8"));
        assert!(matches!(e, PardaHostError::NoSlot { id: 8, slots: 8 }), "{e:?}");
        let e = refuse(&format!("{cluster}board = \"b\"\nkey_file = \"no-such-key-file\""));
        assert!(
            matches!(&e, PardaHostError::Key(crate::aggregate::RecordKeyFileError::Read(c))
                if matches!(&**c, crate::tls::CredentialError::File { key, .. } if key == "parda_host.key_file")),
            "{e:?}"
        );
        // A key too short for HMAC: the setting, the file, and the key's length with the bound.
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short.psk");
        std::fs::write(&short, format!("parda:{}\n", "ab".repeat(15))).unwrap();
        let e = refuse(&format!("{cluster}board = \"b\"\nkey_file = \"{}\"", short.display()));
        assert!(
            matches!(&e, PardaHostError::Key(crate::aggregate::RecordKeyFileError::Key {
                key_name: "parda_host.key_file",
                path,
                error: crate::aggregate::RecordKeyError::Short { bytes: 15, min: 16 },
            }) if path == &short),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with(&format!("parda_host.key_file {}: the key has 15 bytes", short.display())),
            "{e}"
        );
        let e = refuse(&format!("{cluster}udp = \"nowhere\""));
        assert!(matches!(&e, PardaHostError::Udp { text } if text == "nowhere"), "{e:?}");
        assert!(matches!(refuse(cluster), PardaHostError::NoTransport));
    }

    use rein_core::parda::PardaError;

    /// A host's settings from its `[parda]` and `[parda_host]` tables.
    fn settings(text: &str) -> HostSettings {
        #[derive(Deserialize)]
        struct Tables {
            parda: PardaFile,
            parda_host: Option<PardaHostFile>,
        }
        let t: Tables = toml::from_str(text).unwrap();
        validate(&t.parda, t.parda_host.as_ref(), SchedConfig::default(), Path::new("")).unwrap()
    }

    /// The gate's refusals, exactly as the admin API (409) and the gateway's errors show them: a PARDA
    /// host's window, a fixed window out of range, a period end too far ahead, an unknown VM's spec; and
    /// the start's refusals of its UDP socket (in use) and its board (in a missing directory).
    #[tokio::test]
    async fn the_gates_refusals_read_as_before() {
        let local = "[parda]\nlatency_threshold_ms = 10\nperiod_s = 1\naggregation = \"local\"\n[parda_host]\n";
        let spec = QosSpec::weighted(1.0).unwrap();
        let (gate, ids) = HostGate::start(&settings(local), &[spec]).await.unwrap();
        let e = gate.set_fixed_window(16.0).await.unwrap_err().to_string();
        assert_eq!(
            e,
            "this is a PARDA host: its window follows eq. (2) (only an uncontrolled host's fixed issue queue can be set)"
        );
        let e = gate.set_period_end_in(std::time::Duration::from_secs(3600)).await.unwrap_err().to_string();
        assert_eq!(
            e,
            "parda host: the control period's end must be from now to two periods ahead (2 s), got 3600 s from now"
        );
        gate.set_period_end_in(std::time::Duration::from_millis(500)).await.unwrap();
        gate.set_vm_spec(ids[0], QosSpec::weighted(2.0).unwrap()).await.unwrap();
        let (fixed, two) =
            HostGate::start(&settings(&format!("{local}controlled = false\n")), &[spec, spec]).await.unwrap();
        let e = fixed.set_fixed_window(0.0).await.unwrap_err().to_string();
        assert_eq!(e, "fixed window must be in [1, 65536], got 0");
        fixed.set_fixed_window(16.0).await.unwrap();
        let e = gate.set_vm_spec(two[1], spec).await.unwrap_err().to_string();
        assert_eq!(e, format!("parda host: scheduler: unknown tenant {} (never added, removed, or aged out)", two[1]));
        // Typed: what the controller refuses, under the call that asked.
        assert_eq!(gate.set_fixed_window(16.0).await, Err(GateError::NotFixed));
        assert!(matches!(fixed.set_fixed_window(0.0).await, Err(GateError::Window(PardaError::FixedWindow { .. }))));
        let e = gate.set_period_end_in(std::time::Duration::from_secs(3600)).await;
        assert!(matches!(e, Err(GateError::Refused(PardaError::PeriodEnd { max_ns: 2_000_000_000, .. }))), "{e:?}");
        let e = gate.set_vm_spec(two[1], spec).await;
        assert!(matches!(e, Err(GateError::Refused(PardaError::Sched(_)))), "{e:?}");
        // (The VM added takes slot 1, which `two[1]` names in the other host: after the refusals above.)
        assert_eq!(gate.add_vm(spec).await.unwrap().index(), 1);
        // The start: a UDP socket in use, a board in a missing directory.
        let taken = std::net::UdpSocket::bind("127.0.0.215:0").unwrap();
        let at = taken.local_addr().unwrap();
        let cluster = "[parda]\nlatency_threshold_ms = 10\naggregation = \"cluster\"\n[parda_host]\n";
        let udp = format!("{cluster}udp = \"{at}\"\npeers = [{{ id = 1, address = \"127.0.0.216:9\" }}]\n");
        let e = HostGate::start(&settings(&udp), &[spec]).await.err().unwrap().to_string();
        assert_eq!(
            e,
            format!("parda_host: udp {at}: bind on the aggregation file failed: Address already in use (os error 98)")
        );
        let e = HostGate::start(&settings(&udp), &[spec]).await.err().unwrap();
        assert!(matches!(&e, StartError::Udp { listen, .. } if *listen == at), "{e:?}");
        let dir = tempfile::tempdir().unwrap();
        let board = dir.path().join("missing").join("board");
        let text = format!("{cluster}board = \"{}\"\n", board.display());
        let e = HostGate::start(&settings(&text), &[spec]).await.err().unwrap().to_string();
        assert_eq!(
            e,
            format!(
                "parda_host: board {}: open on the aggregation file failed: No such file or directory (os error 2)",
                board.display()
            )
        );
    }

    /// [`minutely`]: the first event logged at once, then nothing within the minute, then a line with the
    /// events since.
    #[test]
    fn a_run_is_logged_at_once_then_once_a_minute_with_the_count() {
        let mut state = LogRate::default();
        let at = Nanos::from_secs;
        assert_eq!(minutely(&mut state, at(0), 3), Some(None), "the first at once");
        assert_eq!(minutely(&mut state, at(30), 2), None);
        assert_eq!(minutely(&mut state, at(59), 1), None);
        assert_eq!(minutely(&mut state, at(60), 1), Some(Some(2 + 2 + 1 + 1)), "3 - 1 logged, then 2, 1, 1");
        assert_eq!(minutely(&mut state, at(61), 1), None);
        assert_eq!(minutely(&mut state, at(120), 0), Some(Some(1)));
    }

    /// `/api/parda` keeps the newest [`MAX_PERIOD_RECORDS`] periods: at the bound all of them, one more
    /// drops the oldest.
    #[test]
    fn the_history_keeps_the_newest_periods() {
        let record = |ios| PeriodRecord { at_s: 0.0, window: 1.0, beta: 1.0, signal_ms: None, estimate_ms: None, ios };
        let mut history = VecDeque::new();
        for ios in 0..MAX_PERIOD_RECORDS as u64 {
            keep_record(&mut history, record(ios));
        }
        assert_eq!((history.len(), history[0].ios), (MAX_PERIOD_RECORDS, 0));
        keep_record(&mut history, record(MAX_PERIOD_RECORDS as u64));
        assert_eq!((history.len(), history[0].ios), (MAX_PERIOD_RECORDS, 1));
        assert_eq!(history.back().unwrap().ios, MAX_PERIOD_RECORDS as u64);
    }
}
