//! The NBD server's connections: bytes between a socket and rein-proto's state machines, requests
//! through the QoS dispatcher.
//!
//! Each connection runs the fixed newstyle handshake ([`ServerHandshake`], bounded in time by
//! [`HANDSHAKE_TIMEOUT`] and in bytes by its option limit; told by the [`Policy`] which exports the client
//! may see, whether TLS is offered, and whether the connection is refused), switching to TLS on the same
//! socket when the handshake says so ([`crate::tls`]), then the transmission phase
//! ([`ServerTransmission`]): read into a buffer, feed the state machine, act on its event. A request goes
//! to the dispatcher with a completion callback that encodes the reply ([`ReplyEncoder`]) and hands it to
//! the connection's writer task (so one connection can have many in flight); a rejection is encoded and
//! handed over at once; a disconnect ends the reading. Every protocol decision (validation, which error,
//! reply formats) is rein-proto's: this module moves bytes, requests and replies. All connections of an
//! export share its tenant, hence its queue and QoS.
//!
//! Errors are per request where the spec allows (rein-proto's `transmission` module lists them): an
//! out-of-range offset, an oversize request or an unknown command or flag gets an error reply and the
//! connection stays usable. A malformed handshake, a bad request magic, or a rejected WRITE too large to
//! skip closes the connection (the stream cannot be resynchronised); other connections are unaffected. A
//! client that disappears mid-request only loses its own replies.
//!
//! # Bounds
//! - Requests in flight per connection: [`MAX_IN_FLIGHT_PER_CONN`]. Every request, answered with data or
//!   an error, holds a permit until its reply is written; with none left the connection stops reading.
//! - Bytes in flight: the byte budget ([`crate::budget`]), per tenant and global. A READ's length and a
//!   WRITE's payload are charged before the request goes on, and held until its reply is written; a
//!   connection waiting for its charge stops reading (backpressure).
//! - The input buffer: the state machine never needs more than one request header and its WRITE payload
//!   (28 bytes + the maximum payload) unconsumed, and a read asks for at most `READ_AHEAD` more; a
//!   rejected WRITE's payload is skipped as it arrives. Up to [`INPUT_FREE_BYTES`] the buffer is free;
//!   past that it is charged to the budget in full before it grows, and released once consumed, or handed
//!   (with its charge) to the WRITE whose payload it holds, which saves the copy.
//! - Time: the handshake [`HANDSHAKE_TIMEOUT`]; in the transmission phase, with `idle_timeout` set (off
//!   by default: qemu and the kernel's driver hold a quiet disk's connection for as long as the disk is
//!   attached and do not reconnect, so closing it failed the guest's next IO), a connection that has
//!   nothing in flight and receives nothing for that long is closed. With `stall_timeout` set (the
//!   default), a connection is closed whose request payload is not complete that long after its header
//!   (a WRITE trickled a byte at a time kept the connection busy and its buffer's charge on the tenant's
//!   budget indefinitely), or whose writer could hand no byte of its replies to the socket for that long
//!   (a client that stops reading its replies keeps their charges, and the next charge its reader waits
//!   for heads the tenant's queue: every connection of the tenant waited behind it, for ever). A slow
//!   reader whose bytes keep moving is not cut, however long a batch takes.
//! - Shutdown: the connection answers what is in flight and goes on reading, answering every new
//!   request with NBD_ESHUTDOWN without running it (the spec's SHOULD; rein-proto's
//!   `ServerTransmission::shut_down`); it ends at the client's NBD_CMD_DISC (which the spec makes a client
//!   send after an ESHUTDOWN), or once every reply is written and nothing came for [`DRAIN_GRACE`]. Once
//!   [`Limits::close`] is set (the server's shutdown deadline) it stops waiting for the budget, gives its
//!   writer [`CLOSE_GRACE`], and closes.
//! - The writer takes the replies that are ready, up to [`WRITE_BATCH`] of them or about
//!   [`WRITE_BATCH_BYTES`], and hands them to one vectored write. On a gateway's volume
//!   ([`Backend::Remote`]) it first yields one scheduler turn, so that the replies the node connections
//!   have ready (several nodes answer one round of requests) join the same write: with fio at iodepth 16
//!   over three nodes, about 5 % more IOPS on the 2-core machine (`scripts/bench-gateway.sh`). A local
//!   export's writer does not wait: its replies come from the dispatcher's thread, and the same turn cost
//!   rein serve about 10 % as a storage node.
//!
//! # Storage-node sessions (docs/node-protocol.md)
//! With a [`NodeGate`] in the [`Policy`] (`[node] enabled = true`), the handshake offers
//! NBD_OPT_REIN_NODE: a gateway's hello goes to the gate, which decides (who may speak it, whose specs
//! apply; [`crate::node`]) and gives one tenant per slot. On such a session each request is scheduled
//! under the tenant of its tag's slot, with the tag's piggyback (dmClock's delta and rho, the share), and
//! its reply carries the phase and cost of its dispatch ([`crate::dispatch::Served`]), and its bytes are
//! charged to that tenant's byte budget, so one tenant's backlog on a gateway's session cannot use up
//! another's. The input buffer's own charge (a large WRITE received before its tag is read) stays the
//! export's tenant's. Without a gate the option is an unknown one (UNSUP).
//!
//! # Block status (NBD_CMD_BLOCK_STATUS, `base:allocation`)
//! The handshake offers the `base:allocation` metadata context on every export: local ones
//! ([`Backend::Local`]: files, block devices, RAM, with or without a device model) answer from their
//! storage, a gateway volume ([`Backend::Remote`], [`Backend::Hosted`] without the host's window) from
//! its nodes' answers ([`RemoteVolume::block_status`]: one query per node of a bounded span, a node that
//! cannot answer reported as data).
//! A BLOCK_STATUS does not pass the per-tenant scheduler: it reads no data and moves no bytes to or from
//! the device, so charging it as IO would bill a tenant (and, with a device model, the modelled device)
//! for work it does not do, and queueing it behind the tenant's reads would only slow a copy that uses it
//! to skip them (nbdcopy, qemu-img convert). It is bounded instead by what every request holds: a slot
//! among the connection's [`MAX_IN_FLIGHT_PER_CONN`] and a charge to the tenant's byte budget of its
//! largest reply ([`BLOCK_STATUS_CHARGE`], [`p::MAX_EXTENTS`] descriptors), held until the reply is
//! written, so a client that floods it waits as one that floods READs does; the work per request is at
//! most two `lseek`s per descriptor ([`Storage::allocation`]) on tokio's blocking pool. Since no scheduler
//! paces them, a connection runs at most [`BLOCK_STATUS_AT_ONCE`] lookups at once and reads no further
//! request while another waits (up to 2,048 `lseek`s each: without the cap one connection's 256 in
//! flight could take 256 of the blocking pool's threads, which other exports' IO without io_uring
//! share), and the server at most [`BLOCK_STATUS_SERVER_AT_ONCE`] over all its connections ([`Limits::
//! lookups`]: a lookup past it waits on a task of its own, holding its request's slot and charge and its
//! connection's lookup; with only the connection's cap, 100 connections could take 200 threads). Copying
//! clients ask one at a time per connection (nbdcopy, qemu-img).
//!
//! # Transports
//! The code is generic over the stream. A plain connection (TCP or a Unix socket, [`crate::sock`]) splits
//! its socket into owned halves (no lock between reader and writer, as before TLS existed); a TLS
//! connection splits its `SslStream` with `tokio::io::split` (a lock shared by the two halves, since one
//! TLS session reads and writes).
//!
//! # Logs
//! At INFO, once each: `NBD connection opened` (peer, export, tenant, TLS, structured replies) and `NBD
//! connection closed` (peer, export, duration, requests, and the reason: the client closed or sent
//! NBD_CMD_DISC, idle timeout, shutdown, or the error), and `NBD handshake failed` with its cause (at
//! most once a second, the next line with the number not logged: a client can fail handshakes as fast
//! as it connects).
//!
//! # Copies per READ
//! One: the storage (the kernel through io_uring or `pread`, or a memory copy for RAM) writes the data
//! into the reply's own buffer, after headroom for the reply header ([`ReplyEncoder::headroom`]), and the
//! socket write takes that buffer as one of its slices. (It used to be three: into a read buffer, into the
//! reply, and into the writer's batch.) `O_DIRECT` reads add the copy out of their aligned buffer.

use crate::access::{Admit, ClientSlot, ConnCaps, ConnLimits, ConnRefusal, ExportAccess, TenantSlot, REFUSAL_TIMEOUT};
use crate::budget::{Budget, Charge, TenantBudget};
use crate::dispatch::Served;
use crate::dispatch::{Dispatcher, IoRequest, IoResult, Op};
use crate::remote::RemoteVolume;
use crate::sock::{Peer, Sock};
use crate::storage::Storage;
use crate::tls::{LiveTls, NbdStream, Registration, TlsConfig, TlsError};
use rein_core::TenantId;
use rein_proto::nbd::{
    self as p, Event, ExportInfo, Negotiated, NodeHello, NodeReplyTrailer, NodeWelcome, Rejection, ReplyEncoder,
    Request, RequestKind, ServerHandshake, ServerProgress, ServerTransmission, TlsMode, TransmissionConfig,
};
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Requests one connection may have in flight before the server stops reading from it.
pub const MAX_IN_FLIGHT_PER_CONN: usize = 256;
/// Time allowed for the whole handshake (every server's [`Limits::handshake_timeout`]).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most replies in one socket write.
pub const WRITE_BATCH: usize = 64;
/// A batch stops growing once it holds this many bytes.
pub const WRITE_BATCH_BYTES: usize = 256 * 1024;
/// The part of a connection's input buffer that is not charged to the byte budget ([`crate::budget`]); a
/// buffer grown past it (by a large WRITE) is charged in full before it grows, and released (or handed to
/// the WRITE with its charge) once consumed.
pub const INPUT_FREE_BYTES: usize = 128 * 1024;
/// After the shutdown deadline, how long a connection's writer may still take to write the replies that
/// are ready (the errors of the requests the deadline failed) before the connection is cut.
pub const CLOSE_GRACE: Duration = Duration::from_millis(500);
/// While shutting down, how long a connection with every request answered still reads: requests in
/// transit get NBD_ESHUTDOWN instead of a closed socket, and a client that got one has time for the soft
/// disconnect (NBD_CMD_DISC) the spec asks of it.
pub const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// While shutting down, how long a connection still in its handshake may stay silent before it is
/// closed (its options meanwhile get NBD_REP_ERR_SHUTDOWN). Longer than [`DRAIN_GRACE`]: a client that
/// is negotiating is about to send its next option, and an idle one costs only this wait (the shutdown
/// deadline bounds it).
pub const HANDSHAKE_DRAIN: Duration = Duration::from_secs(2);
/// What a BLOCK_STATUS holds of the byte budget until its reply is written: its largest reply.
pub const BLOCK_STATUS_CHARGE: usize = p::meta::block_status_reply_len(p::MAX_EXTENTS);
/// BLOCK_STATUS lookups a connection runs at once (module comment, "Block status"); the connection reads
/// no further request while another waits for one.
pub const BLOCK_STATUS_AT_ONCE: usize = 2;
/// BLOCK_STATUS lookups on local storage the whole server runs at once, over all its connections (module
/// comment, "Block status"): the threads of tokio's blocking pool they take at most.
pub const BLOCK_STATUS_SERVER_AT_ONCE: usize = 8;
/// Bytes asked of the socket per read at most, beyond what the state machine wants (read-ahead).
const READ_AHEAD: usize = 64 * 1024;
/// A consumed prefix at least this long is reclaimed (the rest moved to the front) before the next read.
const COMPACT_BYTES: usize = 64 * 1024;

/// An export as the server runs it.
#[derive(Clone)]
pub struct Export {
    /// What the handshake advertises.
    pub info: ExportInfo,
    /// Where its bytes live: local storage behind the dispatcher, or a volume on storage nodes.
    pub backend: Backend,
    /// Whose QoS its requests get.
    pub tenant: TenantId,
    /// The tenant's name (logs, the per-tenant connection cap's message).
    pub tenant_name: String,
    /// Who may see and open it (`allow_networks`, `allow_identities`).
    pub access: ExportAccess,
}

impl Export {
    /// What a handshake advertises now: [`Export::info`], read-only too when the export is a gateway
    /// volume a node export of which refuses writes ([`RemoteVolume::read_only`]: learnt as the volume
    /// runs, it holds for the connections opened from then on).
    pub fn advertised(&self) -> ExportInfo {
        let volume = match &self.backend {
            Backend::Local(_) => return self.info.clone(),
            Backend::Remote(v) => v,
            Backend::Hosted(h) => &h.volume,
        };
        ExportInfo { read_only: self.info.read_only || volume.read_only(), ..self.info.clone() }
    }
}

/// Where an export's requests go.
#[derive(Clone)]
pub enum Backend {
    /// Local storage, through [`NbdContext::dispatcher`] (`rein serve`).
    Local(Arc<dyn Storage>),
    /// A volume striped over storage nodes (`rein gateway`, [`crate::remote`]).
    Remote(Arc<RemoteVolume>),
    /// A volume of a PARDA host's VM (`rein gateway` with `[parda]`): its requests pass the host's window
    /// first ([`crate::parda_host`]).
    Hosted(Arc<crate::parda_host::HostedVolume>),
}

/// The exports new connections see: an immutable list swapped whole on each change. A connection takes one
/// snapshot for its handshake and keeps the `Arc<Export>` it opened.
#[derive(Default)]
pub struct ExportTable {
    current: RwLock<Arc<Vec<Arc<Export>>>>,
}

impl ExportTable {
    /// A table holding `exports`, in listing order.
    pub fn new(exports: Vec<Arc<Export>>) -> ExportTable {
        ExportTable { current: RwLock::new(Arc::new(exports)) }
    }

    /// The exports now, in listing order.
    pub fn snapshot(&self) -> Arc<Vec<Arc<Export>>> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the list (the admin API and reloads, through [`crate::live::Registry`]).
    pub(crate) fn set(&self, exports: Vec<Arc<Export>>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(exports);
    }
}

/// What every connection shares.
pub struct NbdContext {
    /// The exports, in the order the handshake lists them; changed at run time by the admin API and
    /// reloads. Each handshake reads one snapshot, and a connection keeps the export it opened.
    pub exports: Arc<ExportTable>,
    /// The QoS dispatcher in front of the local storage (`None` in a gateway: every export is
    /// [`Backend::Remote`]).
    pub dispatcher: Option<Dispatcher>,
    /// Largest READ or WRITE accepted, in bytes.
    pub max_payload: u32,
    /// Memory and time bounds of the connections.
    pub limits: Limits,
}

/// The bounds a connection keeps beyond the protocol's: its bytes in flight, its idle time, and the
/// shutdown deadline.
pub struct Limits {
    /// The byte budget the connections charge their payloads and replies to.
    pub budget: Budget,
    /// Close a connection with nothing in flight that receives nothing for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Close a connection whose client leaves a request's payload incomplete, or takes no byte of its
    /// replies, this long (`None`: never; module comment, "Time").
    pub stall_timeout: Option<Duration>,
    /// Close a connection whose handshake has not ended this long after it was accepted: the servers'
    /// [`HANDSHAKE_TIMEOUT`] (a field so that a test need not wait that long for it).
    pub handshake_timeout: Duration,
    /// Set to true at the shutdown deadline: connections stop waiting for the budget or for their replies
    /// to be written (after [`CLOSE_GRACE`]) and close.
    pub close: watch::Sender<bool>,
    /// The server's BLOCK_STATUS lookups on local storage running ([`BLOCK_STATUS_SERVER_AT_ONCE`]).
    pub lookups: Arc<Semaphore>,
}

impl Default for Limits {
    /// The default budget ([`Budget::default_sizes`]), no idle timeout, [`HANDSHAKE_TIMEOUT`].
    fn default() -> Self {
        Limits {
            budget: Budget::default_sizes(),
            idle_timeout: None,
            stall_timeout: None,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            close: watch::channel(false).0,
            lookups: Arc::new(Semaphore::new(BLOCK_STATUS_SERVER_AT_ONCE)),
        }
    }
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The socket failed.
    #[error("io: {0}")]
    Io(#[from] io::Error),
    /// The client broke the protocol, or was refused where the protocol has no error reply.
    #[error("protocol: {0}")]
    Proto(#[from] p::ProtoError),
    /// The handshake took longer than [`Limits::handshake_timeout`] (or a refused client longer than
    /// [`REFUSAL_TIMEOUT`]).
    #[error("handshake timed out")]
    Timeout,
    /// The TLS handshake after NBD_OPT_STARTTLS failed.
    #[error("{0}")]
    Tls(#[from] TlsError),
}

/// What decides, per connection, what a client may see and open: TLS, the default export and the
/// per-tenant connection cap ([`crate::access`]); each export carries its own access list
/// ([`Export::access`]). The server builds one from its config; [`Policy::open`] is the policy of a
/// server without any of these.
#[derive(Debug)]
pub struct Policy {
    /// TLS (`[tls]`), as a reload replaces it ([`crate::tls`], "Reload"); `None` inside: off.
    pub tls: LiveTls,
    /// The name of the export the empty name opens (`default_export`).
    pub default_export: Option<String>,
    /// Whether connections are counted per tenant (`max_connections_per_tenant`).
    pub cap_tenants: bool,
    /// The connection counters.
    pub limits: Arc<ConnLimits>,
    /// The storage-node protocol (`[node] enabled`); `None`: NBD_OPT_REIN_NODE is an unknown option.
    pub node: Option<Arc<dyn NodeGate>>,
}

/// A storage-node session as the gate grants it: the answer to the hello, and the dispatcher's tenant of
/// each slot (the welcome's order).
#[derive(Debug, Clone)]
pub struct NodeSession {
    /// What the handshake sends back.
    pub welcome: NodeWelcome,
    /// The tenant of each slot.
    pub tenants: Vec<TenantId>,
}

/// The gate's answer: a session, or a refusal (an `NBD_REP_ERR_*` and a message naming what is wrong).
pub type NodeVerdict = Result<NodeSession, (u32, String)>;

/// Decides storage-node hellos ([`crate::node::NodeService`] in `rein serve`).
pub trait NodeGate: Send + Sync + std::fmt::Debug {
    /// Answers `hello` from `peer` (with its TLS `identity`, if any).
    fn hello<'a>(
        &'a self,
        peer: Peer,
        identity: Option<&'a str>,
        hello: NodeHello,
    ) -> Pin<Box<dyn Future<Output = NodeVerdict> + Send + 'a>>;
}

impl Policy {
    /// No TLS, no default export, no per-tenant cap, no storage-node protocol, and the counters' default
    /// caps.
    pub fn open() -> Policy {
        Policy {
            tls: LiveTls::default(),
            default_export: None,
            cap_tenants: false,
            limits: ConnLimits::new(ConnCaps::default()),
            node: None,
        }
    }

    fn visible(exports: &[Arc<Export>], ip: IpAddr, identity: Option<&str>) -> Vec<bool> {
        exports.iter().map(|e| e.access.allows(ip, identity)).collect()
    }
}

/// How a connection in the transmission phase ended, when not with an error (for its log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The client closed its side.
    ClientClosed,
    /// The client sent NBD_CMD_DISC.
    Disconnect,
    /// No request in flight and no byte received for the idle timeout.
    Idle,
    /// A request's payload still incomplete a stall timeout after its header.
    SlowPayload,
    /// The client took no byte of its replies for the stall timeout.
    Stalled,
    /// The server is shutting down.
    Shutdown,
}

impl End {
    fn reason(self) -> &'static str {
        match self {
            End::ClientClosed => "client closed the connection",
            End::Disconnect => "client disconnected (NBD_CMD_DISC)",
            End::Idle => "idle timeout",
            End::SlowPayload => "a request's payload did not arrive within stall_timeout_s of its header",
            End::Stalled => "the client did not read its replies within stall_timeout_s",
            End::Shutdown => "server shutting down",
        }
    }
}

/// How a connection is admitted ([`ConnLimits::admit`]): served, or greeted and refused.
#[derive(Debug)]
pub enum Entry {
    /// Served; the slot counts it until it ends.
    Serve(ClientSlot),
    /// Every option refused with this reason's text (over a connection cap).
    Refuse(ConnRefusal, OwnedSemaphorePermit),
}

/// Serves one connection with [`Policy::open`] until the client disconnects, errs, or `shutdown` turns
/// true (then in-flight requests are answered before closing).
pub async fn serve_connection(
    stream: TcpStream,
    ctx: Arc<NbdContext>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConnError> {
    let policy = Policy::open();
    let stream = Sock::Tcp(stream);
    let peer = stream.peer()?;
    let Admit::Serve(slot) = policy.limits.admit(peer.ip()) else {
        unreachable!("the first connection of a new counter is under every default cap")
    };
    serve_client(stream, peer, Entry::Serve(slot), ctx, Arc::new(policy), shutdown).await
}

/// What a finished handshake leaves: the transport, what was agreed, the client's identity, its tenant
/// slot, and the tenants of a storage-node session's slots (empty otherwise).
type Opened = (NbdStream, Negotiated, Option<String>, Option<TenantSlot>, Vec<TenantId>, Option<Registration>);

/// What a server's accept loop does with one `accept` result (rein serve's and rein gateway's): admits the
/// connection under the policy's caps and spawns its task on `tasks` (a refused client is answered
/// there; one beyond even the refusal bound is closed at once), then reaps finished tasks so the set
/// does not grow. An accept error is logged at most once a second and paced by 10 ms to 1 s
/// ([`crate::access::ConnLimits::accept_failed`]).
pub async fn spawn_accepted(
    acc: io::Result<(Sock, Peer)>,
    tasks: &mut tokio::task::JoinSet<()>,
    ctx: &Arc<NbdContext>,
    policy: &Arc<Policy>,
    stop: &watch::Receiver<bool>,
) {
    let limits = &policy.limits;
    let (stream, peer) = match acc {
        Ok(x) => {
            limits.accept_succeeded();
            x
        }
        Err(e) => {
            let (pause, _) = limits.accept_failed(&e);
            tokio::time::sleep(pause).await;
            return;
        }
    };
    let entry = match limits.admit(peer.ip()) {
        Admit::Serve(slot) => Entry::Serve(slot),
        Admit::Refuse(why, permit) => {
            limits.log_refusal(peer, &why, false);
            Entry::Refuse(why, permit)
        }
        Admit::Close(why) => {
            limits.log_refusal(peer, &why, true);
            return;
        }
    };
    let (ctx, policy, stop) = (ctx.clone(), policy.clone(), stop.clone());
    tasks.spawn(async move {
        // serve_client logs how the connection ended, error included.
        let _ = serve_client(stream, peer, entry, ctx, policy, stop).await;
    });
    while tasks.try_join_next().is_some() {}
}

/// Serves one connection from `peer` under `policy` until the client disconnects, errs, or `shutdown`
/// turns true (then in-flight requests are answered before closing).
pub async fn serve_client(
    stream: Sock,
    peer: Peer,
    entry: Entry,
    ctx: Arc<NbdContext>,
    policy: Arc<Policy>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnError> {
    stream.set_nodelay()?;
    stream.set_keepalive()?;
    let mut input = Input::default();
    // One snapshot of the exports for the whole handshake; the connection keeps the export it opens.
    let exports = ctx.exports.snapshot();
    // As advertised now (a gateway volume may have turned read-only): the connection's transmission
    // phase keeps to what its handshake said.
    let infos: Vec<ExportInfo> = exports.iter().map(|e| e.advertised()).collect();
    let read_only: Vec<bool> = infos.iter().map(|i| i.read_only).collect();
    let mut out = Vec::new();
    let mut hs = ServerHandshake::with_max_payload(infos, ctx.max_payload, &mut out);
    // Whether STARTTLS is offered is set before each option is read (`handshake`), as TLS stands then.
    hs.set_default_export(policy.default_export.as_ref().and_then(|d| exports.iter().position(|e| e.info.name == *d)));
    hs.set_visible(Policy::visible(&exports, peer.ip(), None));
    // `base:allocation` on local exports only (module comment, "Block status").
    // Every export: local storage answers from its own allocation, a gateway volume from its nodes'.
    hs.set_block_status(vec![true; exports.len()]);
    hs.set_confirm_open(policy.cap_tenants);
    hs.set_node(policy.node.is_some());
    let (deadline, _slot) = match entry {
        Entry::Serve(slot) => (ctx.limits.handshake_timeout, Some(slot)),
        Entry::Refuse(why, _permit) => {
            hs.refuse_all(why.to_string());
            let refused = async {
                let mut stream = stream;
                stream.write_all(&out).await?;
                let mut shutdown = shutdown.clone();
                let _ =
                    handshake(&mut stream, &mut hs, &mut input, &policy, &exports, (peer, None), &mut shutdown).await?;
                Ok(())
            };
            return tokio::time::timeout(REFUSAL_TIMEOUT, refused).await.map_err(|_| ConnError::Timeout)?;
        }
    };
    let mut hs_shutdown = shutdown.clone();
    let opened = async {
        let mut stream = stream;
        stream.write_all(&out).await?;
        let shutdown = &mut hs_shutdown;
        match handshake(&mut stream, &mut hs, &mut input, &policy, &exports, (peer, None), shutdown).await? {
            HsEnd::Left => Ok(None),
            HsEnd::Open(n, slot, node) => Ok(Some((NbdStream::Plain(stream), n, None, slot, node, None))),
            HsEnd::StartTls(tls) => {
                // The context the STARTTLS was answered under, not the one current when the connection
                // came in: a client may hold its TCP connection open across a reload that revokes it
                // before it asks for TLS (and one that turns TLS off has its STARTTLS refused).
                let (mut stream, identity) = tls.accept(stream).await?;
                // With a duplicate of its socket, so that a reload that revokes this client can cut it;
                // refused if a reload revoked it while its handshake ran.
                let registration = match stream.get_ref().dup() {
                    Ok(fd) => policy.tls.register(stream.ssl(), peer.to_string(), fd).map_err(TlsError)?,
                    Err(_) => None,
                };
                hs.tls_established();
                hs.set_visible(Policy::visible(&exports, peer.ip(), identity.as_deref()));
                let who = (peer, identity.as_deref());
                match handshake(&mut stream, &mut hs, &mut input, &policy, &exports, who, shutdown).await? {
                    HsEnd::Left => Ok(None),
                    HsEnd::Open(n, slot, node) => {
                        Ok(Some((NbdStream::Tls(Box::new(stream)), n, identity, slot, node, registration)))
                    }
                    HsEnd::StartTls(_) => Err(ConnError::Proto(p::ProtoError::Malformed("a second NBD_OPT_STARTTLS"))),
                }
            }
        }
    };
    // A shutdown is answered inside the handshake (NBD_REP_ERR_SHUTDOWN); its deadline ends one at once
    // (a TLS handshake in progress, a client that keeps sending options).
    let mut close = ctx.limits.close.subscribe();
    let opened = tokio::select! {
        r = tokio::time::timeout(deadline, opened) => r,
        _ = closing(&mut close) => return Ok(()),
    };
    let opened: Option<Opened> = match opened {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => {
            policy.limits.log_failed_handshake(peer, &e);
            return Err(e);
        }
        Err(_) => {
            policy.limits.log_failed_handshake(peer, &ConnError::Timeout);
            return Err(ConnError::Timeout);
        }
    };
    // The registration lives as long as the connection (a reload can cut it while it is listed).
    let Some((transport, negotiated, identity, _tenant_slot, node_tenants, _registration)) = opened else {
        return Ok(());
    };
    let export = exports[negotiated.export].clone();
    drop(exports);
    let opened = Instant::now();
    tracing::info!(%peer, export = %export.info.name, tenant = %export.tenant_name, tls = hs.tls_active(), identity = identity.as_deref().unwrap_or(""), structured = negotiated.structured, node = negotiated.node.is_some(), "NBD connection opened");
    let config = TransmissionConfig::new(&export.info, &negotiated, ctx.max_payload);
    let machine = ServerTransmission::new(TransmissionConfig { read_only: read_only[negotiated.export], ..config });
    let conn = Conn { ctx: &ctx, export, peer, opened, node_tenants, counters: Arc::clone(&policy.limits) };
    match transport {
        NbdStream::Plain(stream) => {
            // The plain path keeps the socket's own halves (no lock between reader and writer).
            let (rd, wr) = stream.into_split();
            transmission(rd, wr, conn, machine, input, &mut shutdown).await
        }
        NbdStream::Tls(stream) => {
            let (rd, wr) = tokio::io::split(*stream);
            // OpenSSL writes one slice per call, so a reply's header would be a TLS record of its own:
            // a buffer gathers a batch's small replies into full records (large ones pass straight through).
            let wr = tokio::io::BufWriter::with_capacity(crate::wire::TLS_BUFFER_BYTES, wr);
            transmission(rd, wr, conn, machine, input, &mut shutdown).await
        }
    }
}

/// What the transmission phase knows of its connection.
struct Conn<'a> {
    ctx: &'a NbdContext,
    export: Arc<Export>,
    peer: Peer,
    opened: Instant,
    /// The tenant of each slot of a storage-node session (empty otherwise).
    node_tenants: Vec<TenantId>,
    /// The daemon's connection counters (its BLOCK_STATUS count among them).
    counters: Arc<ConnLimits>,
}

/// The transmission phase on a split transport: a reader here, the writer task, the wait for in-flight
/// replies (bounded by the shutdown deadline), and the connection's closing log line.
async fn transmission<R, W>(
    mut rd: R,
    wr: W,
    conn: Conn<'_>,
    machine: ServerTransmission,
    input: Input,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONN));
    let (replies, rx) = mpsc::unbounded_channel();
    let last_reply_ms = Arc::new(AtomicU64::new(0));
    let Conn { ctx, export, peer, opened, node_tenants, counters } = conn;
    let coalesce = matches!(export.backend, Backend::Remote(_) | Backend::Hosted(_));
    // Set once no reply can reach the client (the socket broke): its queued requests are then not run,
    // unless it sent NBD_CMD_DISC ([`Gone`]).
    let gone = Gone::default();
    // Set by the writer when the client leaves its replies unread for the stall timeout: the reader stops.
    let (cut_tx, cut) = watch::channel(false);
    let stall = ctx.limits.stall_timeout;
    let out = Out { opened, last_reply_ms: last_reply_ms.clone(), coalesce, gone: gone.clone(), stall, cut: cut_tx };
    let writer = tokio::spawn(write_replies(wr, rx, out));
    let mut close = ctx.limits.close.subscribe();
    let mut conn = Connection {
        export: Arc::clone(&export),
        dispatcher: ctx.dispatcher.as_ref(),
        machine,
        input,
        replies,
        permits: permits.clone(),
        lookups: Arc::new(Semaphore::new(BLOCK_STATUS_AT_ONCE)),
        server_lookups: Arc::clone(&ctx.limits.lookups),
        counters,
        budget: ctx.limits.budget.tenant(export.tenant),
        slot_budgets: node_tenants.iter().map(|&t| ctx.limits.budget.tenant(t)).collect(),
        idle: ctx.limits.idle_timeout.map(|after| Idle {
            after,
            sleep: Box::pin(tokio::time::sleep(after)),
            armed: LazyPoll::default(),
            last_rx: opened,
            opened,
            last_reply_ms,
        }),
        requests: 0,
        node_tenants,
        gone: gone.clone(),
        stall,
        cut,
    };
    let result = conn.transmission(&mut rd, shutdown, &mut close).await;
    if matches!(result, Err(ConnError::Io(_))) {
        // The socket failed (a reset): no reply of this connection will be read.
        gone.broken();
    }
    let requests = conn.requests;
    drop(conn);
    // Wait for in-flight requests to be answered and written (each holds a permit until then); their
    // callbacks then hold no sender any more, so the writer ends once it has written everything. At the
    // shutdown deadline, the writer gets CLOSE_GRACE for what is ready, then the connection is cut.
    let all = MAX_IN_FLIGHT_PER_CONN as u32;
    let drained = tokio::select! {
        _ = permits.acquire_many(all) => true,
        _ = closing(&mut close) => tokio::time::timeout(CLOSE_GRACE, permits.acquire_many(all)).await.is_ok(),
    };
    if drained {
        let _ = writer.await;
    } else {
        writer.abort();
    }
    let duration_s = (opened.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    let unanswered = MAX_IN_FLIGHT_PER_CONN - permits.available_permits();
    match &result {
        Ok(end) if drained => {
            tracing::info!(%peer, export = %export.info.name, duration_s, requests, reason = end.reason(), "NBD connection closed")
        }
        Ok(end) => {
            tracing::info!(%peer, export = %export.info.name, duration_s, requests, reason = end.reason(), unanswered, "NBD connection closed at the shutdown deadline, replies unwritten")
        }
        Err(e) => tracing::info!(%peer, export = %export.info.name, duration_s, requests, "NBD connection closed: {e}"),
    }
    result.map(|_| ())
}

/// The daemons' shutdown deadline (rein serve's and rein gateway's): tells every connection to close
/// ([`Limits::close`]: it stops waiting for the budget and gives its writer [`CLOSE_GRACE`]) and waits for
/// them; one still running a second after that is waiting on its backend (a gateway's node link full of
/// pieces a node holds back) and is cut. Returns how many were cut.
pub async fn close_connections(tasks: &mut tokio::task::JoinSet<()>, limits: &Limits) -> usize {
    limits.close.send_replace(true);
    let grace = CLOSE_GRACE + Duration::from_secs(1);
    if tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await.is_ok() {
        return 0;
    }
    let cut = tasks.len();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    cut
}

/// Resolves once `close` is true (or its sender is gone).
async fn closing(close: &mut watch::Receiver<bool>) {
    let _ = close.wait_for(|c| *c).await;
}

/// Returns once every request of the connection is answered (all its [`MAX_IN_FLIGHT_PER_CONN`] permits
/// free: a request holds one until its reply is written) and then [`DRAIN_GRACE`] has passed.
async fn drained(permits: &Semaphore) {
    let _all = permits.acquire_many(MAX_IN_FLIGHT_PER_CONN as u32).await;
    tokio::time::sleep(DRAIN_GRACE).await;
}

/// How a handshake on one transport ended.
enum HsEnd {
    /// The client aborted or left.
    Left,
    /// STARTTLS was acknowledged under this context (TLS as it stood when the option was read): run TLS
    /// with it, then go on.
    StartTls(TlsConfig),
    /// An export is open (with the client's tenant slot, if tenants are capped, and the tenants of a
    /// storage-node session's slots).
    Open(Negotiated, Option<TenantSlot>, Vec<TenantId>),
}

/// Runs the handshake on `stream` until it ends, needs TLS, or the client leaves. Bytes after the
/// handshake stay in `input`. `who`: the peer and its TLS identity (for the storage-node gate).
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    hs: &mut ServerHandshake,
    input: &mut Input,
    policy: &Policy,
    exports: &[Arc<Export>],
    who: (Peer, Option<&str>),
    shutdown: &mut watch::Receiver<bool>,
) -> Result<HsEnd, ConnError> {
    let mut out = Vec::new();
    // The tenants of the storage-node session the last hello was granted (a later hello replaces it).
    let mut node_tenants = Vec::new();
    loop {
        let wanted = input.unconsumed().len() + 1;
        let more = if hs.is_shut_down() {
            // Shutting down: options get NBD_REP_ERR_SHUTDOWN; a client silent for HANDSHAKE_DRAIN is left.
            match tokio::time::timeout(HANDSHAKE_DRAIN, input.fill(stream, wanted)).await {
                Ok(more) => more?,
                Err(_) => return Ok(HsEnd::Left),
            }
        } else {
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|s| *s) => {
                    hs.shut_down();
                    continue;
                }
                more = input.fill(stream, wanted) => more?,
            }
        };
        if !more {
            return Ok(HsEnd::Left);
        }
        loop {
            out.clear();
            // TLS as it stands now, for the options this call answers: a reload may have turned it on or
            // off since the connection came in, and a STARTTLS is decided before its reply (an ACK then
            // runs TLS under this very context; a refusal lets the handshake go on in plain).
            let tls_now = policy.tls.get().filter(|t| t.mode != TlsMode::Off);
            hs.set_tls(tls_now.as_ref().map_or(TlsMode::Off, |t| t.mode));
            let (used, mut progress) = hs.feed(input.unconsumed(), &mut out)?;
            input.consume(used);
            let mut slot = None;
            if let ServerProgress::NodeHello(hello) = progress {
                let gate = policy.node.as_ref().expect("the option is offered only with a gate");
                let verdict = gate.hello(who.0, who.1, hello).await.map(|session| {
                    // A tenant per slot: the transmission phase indexes this table with a tag's slot,
                    // which it checks against the welcome's count.
                    assert_eq!(session.tenants.len(), session.welcome.tenants.len(), "one tenant per slot");
                    node_tenants = session.tenants;
                    session.welcome
                });
                if verdict.is_err() {
                    node_tenants = Vec::new();
                }
                hs.node_verdict(verdict, &mut out);
                stream.write_all(&out).await?;
                continue; // the client may have sent more options already
            }
            if let ServerProgress::Opening(export) = progress {
                // The per-tenant cap, counted when the export opens; a refusal goes back to the client,
                // its message the refusal's text.
                let verdict = match exports.get(export) {
                    Some(e) if policy.cap_tenants => policy
                        .limits
                        .open_tenant(e.tenant.index(), &e.tenant_name)
                        .map(|s| slot = Some(s))
                        .map_err(|e| e.to_string()),
                    _ => Ok(()),
                };
                progress = hs.open(verdict, &mut out)?;
                if progress == ServerProgress::NeedMore && !input.unconsumed().is_empty() {
                    stream.write_all(&out).await?;
                    continue; // refused: the client may have sent more options already
                }
            }
            stream.write_all(&out).await?;
            match progress {
                // A reply batch ended the call with more options already received (`MAX_REPLY_BATCH`):
                // answer them before reading more.
                ServerProgress::NeedMore if used > 0 && !input.unconsumed().is_empty() => continue,
                ServerProgress::NeedMore | ServerProgress::Opening(_) | ServerProgress::NodeHello(_) => break,
                ServerProgress::Aborted => return Ok(HsEnd::Left),
                ServerProgress::Done(n) => {
                    let node = if n.node.is_some() { std::mem::take(&mut node_tenants) } else { Vec::new() };
                    return Ok(HsEnd::Open(n, slot, node));
                }
                ServerProgress::StartTls if input.unconsumed().is_empty() => {
                    let tls = tls_now.expect("the handshake acknowledges STARTTLS only under a TLS mode set on");
                    return Ok(HsEnd::StartTls(tls));
                }
                ServerProgress::StartTls => {
                    return Err(p::ProtoError::Malformed("data after NBD_OPT_STARTTLS before the TLS handshake").into())
                }
            }
        }
    }
}

/// What a request holds until its reply is written (or the connection is gone): its slot among the
/// connection's [`MAX_IN_FLIGHT_PER_CONN`], and its bytes' charge to the budget.
struct Held {
    _slot: OwnedSemaphorePermit,
    _bytes: Charge,
}

/// A reply and what its request holds until the reply is written.
type Reply = (Vec<u8>, Held);

/// One connection in the transmission phase.
struct Connection<'a> {
    /// Shared with each request in flight, whose completion names the export if the backend fails it.
    export: Arc<Export>,
    dispatcher: Option<&'a Dispatcher>,
    machine: ServerTransmission,
    input: Input,
    replies: mpsc::UnboundedSender<Reply>,
    permits: Arc<Semaphore>,
    /// BLOCK_STATUS lookups running ([`BLOCK_STATUS_AT_ONCE`]).
    lookups: Arc<Semaphore>,
    /// The server's ([`Limits::lookups`]).
    server_lookups: Arc<Semaphore>,
    /// The daemon's connection counters (`rein_nbd_block_status_total`).
    counters: Arc<ConnLimits>,
    budget: TenantBudget,
    /// On a storage-node session, each slot's tenant's budget (same order as `node_tenants`).
    slot_budgets: Vec<TenantBudget>,
    idle: Option<Idle>,
    /// Requests received (answered or not), for the closing log line.
    requests: u64,
    /// The tenant of each slot of a storage-node session (empty otherwise).
    node_tenants: Vec<TenantId>,
    /// Set when no reply can reach the client any more ([`Dispatcher::submit`]).
    gone: Gone,
    /// [`Limits::stall_timeout`].
    stall: Option<Duration>,
    /// True once the writer gave up on the client's reading ([`End::Stalled`]).
    cut: watch::Receiver<bool>,
}

/// Whether a connection's queued requests are still run: the flag [`Dispatcher::submit`] reads, set once
/// no reply can reach the client (its socket broke), so that a vanished client's queued requests are not
/// run when their turn comes (no WRITE of it lands later, possibly over a newer client's data) — unless
/// the client sent NBD_CMD_DISC first: the spec then requires every request it sent before to be
/// handled, and a client may close its socket right after (libnbd's `nbd_shutdown` then `nbd_close`),
/// which dropped its queued WRITEs (13 of 40 written, behind a 20 IOPS limit).
#[derive(Clone, Default)]
struct Gone {
    gone: Arc<AtomicBool>,
    disconnected: Arc<AtomicBool>,
}

impl Gone {
    /// The socket broke: queued requests are dropped, unless the client disconnected first. (Not set
    /// once the disconnect is known; set, then the disconnect checked again: whichever of this and
    /// [`Gone::disconnect`] comes last, a disconnect wins.) What it cannot save: requests sent before the
    /// DISC that the reader had not yet taken when the socket broke (it was waiting for a slot or the
    /// budget), since a request queued meanwhile may be dropped before the DISC is read.
    fn broken(&self) {
        if self.disconnected.load(Ordering::SeqCst) {
            return;
        }
        self.gone.store(true, Ordering::SeqCst);
        if self.disconnected.load(Ordering::SeqCst) {
            self.gone.store(false, Ordering::SeqCst);
        }
    }

    /// NBD_CMD_DISC came: every request received before it is run, whatever becomes of the socket.
    fn disconnect(&self) {
        self.disconnected.store(true, Ordering::SeqCst);
        self.gone.store(false, Ordering::SeqCst);
    }

    /// The flag for [`Dispatcher::submit`].
    fn flag(&self) -> Arc<AtomicBool> {
        self.gone.clone()
    }
}

impl Connection<'_> {
    /// Reads, feeds the state machine and acts on its events until the client disconnects or leaves, the
    /// protocol breaks, the connection is idle too long, `shutdown` turns true (then it stops reading), or
    /// `close` does (then it stops waiting for the budget too).
    async fn transmission<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        shutdown: &mut watch::Receiver<bool>,
        close: &mut watch::Receiver<bool>,
    ) -> Result<End, ConnError> {
        // The server's shutdown, one future for the whole connection: a waiter registered once, not one
        // per read. (It is not polled again once it has fired: the state machine is shut down then.)
        let probe = shutdown.clone();
        let stop = async {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        tokio::pin!(stop);
        let mut stop_armed = LazyPoll::default();
        // The writer's cut, the same way (it also ends the waits for the budget below).
        let (cut_probe, mut cut) = (self.cut.clone(), self.cut.clone());
        let cut_wait = async move {
            if cut.wait_for(|c| *c).await.is_err() {
                // The writer is gone without a cut (it ends only after the reader): never.
                std::future::pending::<()>().await;
            }
        };
        tokio::pin!(cut_wait);
        let mut cut_armed = LazyPoll::default();
        loop {
            let (used, event) = self.machine.feed(self.input.unconsumed())?;
            match event {
                Event::NeedMore { wanted } => {
                    self.input.consume(used);
                    // The state machine knows the shutdown once it was seen (no watch read per request).
                    let draining = self.machine.is_shut_down();
                    let idle = if draining { None } else { self.idle.as_mut().map(|idle| (idle, &*self.permits)) };
                    // A payload must follow its header within the stall timeout: bytes trickled one at a
                    // time would otherwise keep a connection "active" and hold the buffer's charge against
                    // the tenant's budget for as long as the client likes.
                    let payload = !draining && wanted > self.machine.config().request_head_len();
                    let payload_within = self.stall.filter(|_| payload);
                    let filled = if draining {
                        // Shutting down: what arrives is answered with ESHUTDOWN (the state machine
                        // rejects it); the connection ends once every reply is written and nothing more
                        // came for DRAIN_GRACE, at the client's DISC, or at the deadline.
                        let permits = &self.permits;
                        tokio::select! {
                            r = self.input.fill_charged(rd, wanted, &self.budget, idle, payload_within) => r?,
                            _ = drained(permits) => return Ok(End::Shutdown),
                            _ = closing(close) => return Ok(End::Shutdown),
                            _ = cut_wait.as_mut() => return Ok(End::Stalled),
                        }
                    } else {
                        let filled = {
                            let fill = self.input.fill_charged(rd, wanted, &self.budget, idle, payload_within);
                            tokio::pin!(fill);
                            std::future::poll_fn(|cx| {
                                // Shutdown first: bytes that arrive after it are refused, not run. (The
                                // watches are polled only once they have changed: `LazyPoll`.)
                                let changed = probe.has_changed().unwrap_or(true);
                                if stop_armed.poll(cx, stop.as_mut(), changed).is_ready() {
                                    return std::task::Poll::Ready(Err(End::Shutdown));
                                }
                                let cut = cut_probe.has_changed().unwrap_or(false);
                                if cut_armed.poll(cx, cut_wait.as_mut(), cut).is_ready() {
                                    return std::task::Poll::Ready(Err(End::Stalled));
                                }
                                fill.as_mut().poll(cx).map(Ok)
                            })
                            .await
                        };
                        match filled {
                            Ok(r) => r?,
                            Err(End::Stalled) => return Ok(End::Stalled),
                            Err(_) => {
                                self.machine.shut_down();
                                continue;
                            }
                        }
                    };
                    match filled {
                        Filled::Yes => {}
                        Filled::Eof => return Ok(End::ClientClosed), // with or without NBD_CMD_DISC
                        Filled::Idle => return Ok(End::Idle),
                        Filled::SlowPayload => return Ok(End::SlowPayload),
                    }
                }
                Event::Request { request, payload } => {
                    self.requests += 1;
                    let encoder = self.machine.replies();
                    // Bytes to charge now; a large WRITE's payload comes with the charge of the buffer it
                    // was received into.
                    let (op, mut charged, to_charge) = match request.kind {
                        RequestKind::Read => {
                            let headroom = encoder.headroom(&request);
                            (Op::Read { len: request.length, headroom }, None, request.length as usize + headroom)
                        }
                        RequestKind::Write => {
                            let len = payload.len();
                            if self.input.can_take(used) {
                                let (data, charge) = self.input.take_payload(used, len);
                                (Op::Write { data }, Some(charge), 0)
                            } else {
                                let data = payload.to_vec();
                                self.input.consume(used);
                                (Op::Write { data }, None, len)
                            }
                        }
                        RequestKind::Flush => (Op::Flush, None, 0),
                        RequestKind::Trim => (Op::Trim { len: request.length }, None, 0),
                        RequestKind::WriteZeroes => {
                            (Op::WriteZeroes { len: request.length, may_punch: !request.no_hole }, None, 0)
                        }
                        // Not scheduled (module comment, "Block status"): the slot and the reply's charge,
                        // then the backend's answer.
                        RequestKind::BlockStatus { .. } => {
                            self.input.consume(used);
                            let held = match self.hold_now(&mut None, BLOCK_STATUS_CHARGE, None) {
                                Some(held) => held,
                                None => tokio::select! {
                                    h = self.hold(None, BLOCK_STATUS_CHARGE, None) => h,
                                    _ = closing(close) => return Ok(End::Shutdown),
                                    _ = cut_wait.as_mut() => return Ok(End::Stalled),
                                },
                            };
                            let lookup = match self.lookups.clone().try_acquire_owned() {
                                Ok(lookup) => lookup,
                                Err(_) => tokio::select! {
                                    l = self.lookups.clone().acquire_owned() => l.expect("the semaphore is never closed"),
                                    _ = closing(close) => return Ok(End::Shutdown),
                                    _ = cut_wait.as_mut() => return Ok(End::Stalled),
                                },
                            };
                            self.block_status(request, held, lookup);
                            continue;
                        }
                    };
                    if !matches!(op, Op::Write { .. }) {
                        self.input.consume(used);
                    }
                    // A node session's request is charged to its slot's tenant.
                    let budget = request.tag.and_then(|t| self.slot_budgets.get(t.slot as usize));
                    let held = match self.hold_now(&mut charged, to_charge, budget) {
                        Some(held) => held,
                        None => tokio::select! {
                            h = self.hold(charged, to_charge, budget) => h,
                            _ = closing(close) => return Ok(End::Shutdown),
                            _ = cut_wait.as_mut() => return Ok(End::Stalled),
                        },
                    };
                    self.submit(request, op, encoder, held).await;
                }
                Event::Reject(rejection) => {
                    self.requests += 1;
                    self.input.consume(used);
                    let held = match self.hold_now(&mut None, 0, None) {
                        Some(held) => held,
                        None => tokio::select! {
                            h = self.hold(None, 0, None) => h,
                            _ = closing(close) => return Ok(End::Shutdown),
                            _ = cut_wait.as_mut() => return Ok(End::Stalled),
                        },
                    };
                    self.reject(&rejection, held);
                }
                Event::Disconnect => {
                    self.gone.disconnect();
                    return Ok(End::Disconnect);
                }
            }
        }
    }

    /// A slot among the connection's requests in flight, and the charge of `bytes` more to `budget` (the
    /// connection's when `None`; the request brings `charged` instead, if it has one): waits for both,
    /// without reading meanwhile (backpressure).
    async fn hold(&self, charged: Option<Charge>, bytes: usize, budget: Option<&TenantBudget>) -> Held {
        let slot = self.permits.clone().acquire_owned().await.expect("the semaphore is never closed");
        let charge = match charged {
            Some(c) => c,
            None => budget.unwrap_or(&self.budget).charge(bytes).await,
        };
        Held { _slot: slot, _bytes: charge }
    }

    /// [`Connection::hold`] when neither the slot nor the charge has to be waited for (the common case):
    /// no future and no watch for the shutdown deadline. `None` where `hold` would wait; then nothing is
    /// held and `charged` is left in place.
    fn hold_now(&self, charged: &mut Option<Charge>, bytes: usize, budget: Option<&TenantBudget>) -> Option<Held> {
        let slot = self.permits.clone().try_acquire_owned().ok()?;
        let charge = match charged.take() {
            Some(c) => c,
            // (The slot goes back if the budget has no room now.)
            None => budget.unwrap_or(&self.budget).try_charge(bytes)?,
        };
        Some(Held { _slot: slot, _bytes: charge })
    }

    /// Hands a request to the dispatcher (or the remote volume); the reply is encoded where the result appears (on the dispatcher
    /// task) and goes straight to the writer: no task or channel per request.
    async fn submit(&self, request: Request, op: Op, encoder: ReplyEncoder, held: Held) {
        let replies = self.replies.clone();
        // A tagged request (storage-node session) runs under its slot's tenant, with its piggyback; the
        // state machine checked the slot against the session's count, which is this table's length.
        let (tenant, piggyback) = match request.tag {
            Some(tag) => (self.node_tenants[tag.slot as usize], Some(tag.piggyback())),
            None => (self.export.tenant, None),
        };
        // A reference count (this once cloned the whole `Export`, strings and all, per request).
        let export = Arc::clone(&self.export);
        let done = Box::new(move |res: IoResult, served: Served| {
            let reply = match res {
                Ok(mut reply) => {
                    let trailer = NodeReplyTrailer { phase: served.phase, cost: served.cost.0 };
                    encoder.success_node(&request, trailer, &mut reply);
                    reply
                }
                Err(e) => {
                    if matches!(e, crate::dispatch::IoError::Storage(crate::storage::StorageError::Io { .. })) {
                        backend_failures().note(&export.info.name, request.kind.command(), &e);
                    }
                    tracing::debug!(handle = request.handle, command = %request.kind.command(), error = %e, "request failed");
                    let mut reply = Vec::new();
                    encoder.failure(&mut reply, request.handle, e.kind(), &e);
                    reply
                }
            };
            let _ = replies.send((reply, held));
        });
        match &self.export.backend {
            Backend::Local(storage) => {
                let req = IoRequest {
                    storage: storage.clone(),
                    tenant,
                    offset: request.offset,
                    op,
                    fua: request.fua,
                    piggyback,
                };
                let dispatcher = self.dispatcher.expect("a server with local exports has a dispatcher");
                dispatcher.submit(req, done, Some(self.gone.flag())).await;
            }
            Backend::Remote(volume) => volume.submit(request.offset, op, request.fua, done).await,
            Backend::Hosted(hosted) => hosted.submit(request.offset, op, request.fua, done, Some(self.gone.flag())),
        }
    }

    /// Answers a BLOCK_STATUS from the export's storage on the blocking pool, or a gateway volume's from
    /// its nodes ([`RemoteVolume::block_status`]; module comment, "Block status").
    fn block_status(&self, request: Request, held: Held, lookup: OwnedSemaphorePermit) {
        self.counters.block_status_taken();
        let encoder = self.machine.replies();
        let replies = self.replies.clone();
        let storage = match &self.export.backend {
            Backend::Local(storage) => Arc::clone(storage),
            Backend::Remote(v) => return volume_status(Arc::clone(v), request, encoder, held, lookup, replies),
            // Not through the host's window: it moves no data.
            Backend::Hosted(h) => return volume_status(Arc::clone(&h.volume), request, encoder, held, lookup, replies),
        };
        let export = Arc::clone(&self.export);
        // The connection's lookups running with this one (at most BLOCK_STATUS_AT_ONCE; tests read it).
        let lookups = BLOCK_STATUS_AT_ONCE - self.lookups.available_permits();
        let server = Arc::clone(&self.server_lookups);
        // The server's cap is waited for here, not in the reader: a connection's own two bound what it
        // holds meanwhile (module comment, "Block status").
        tokio::spawn(async move {
            let Ok(on_server) = server.clone().acquire_owned().await else { return };
            // The server's lookups running with this one (at most BLOCK_STATUS_SERVER_AT_ONCE; tests read it).
            let server_lookups = BLOCK_STATUS_SERVER_AT_ONCE - server.available_permits();
            tracing::debug!(handle = request.handle, lookups, server_lookups, "block status lookup");
            let _ = tokio::task::spawn_blocking(move || {
            let mut extents = p::Extents::new(&request);
            let mut reply = Vec::new();
            match storage.allocation(&mut extents) {
                // A chunk, or on a storage-node session (v4) the simple reply, trailer and payload.
                Ok(()) => encoder.block_status(&extents, request.handle, &mut reply),
                Err(e) => {
                    if matches!(e, crate::storage::StorageError::Io { .. }) {
                        backend_failures().note(&export.info.name, request.kind.command(), &e);
                    }
                    tracing::debug!(handle = request.handle, command = %request.kind.command(), error = %e, "request failed");
                    encoder.failure(&mut reply, request.handle, e.kind(), &e);
                }
            }
            let _ = replies.send((reply, held));
            // Given back last, when the thread is about to be idle again: the next lookup then mostly
            // finds it rather than starting another (the pool keeps a few threads for the caps).
            drop(lookup);
            drop(on_server);
        })
            .await;
        });
    }

    fn reject(&self, rejection: &Rejection, held: Held) {
        tracing::debug!(handle = rejection.handle, "request rejected: {rejection}");
        let mut reply = Vec::new();
        self.machine.replies().rejection(&mut reply, rejection);
        let _ = self.replies.send((reply, held));
    }
}

/// Answers a BLOCK_STATUS on a gateway volume from its nodes ([`RemoteVolume::block_status`]) on a task of
/// its own, holding the request's slot, charge and lookup permit until the reply is handed to the writer.
fn volume_status(
    volume: Arc<RemoteVolume>,
    request: Request,
    encoder: ReplyEncoder,
    held: Held,
    lookup: OwnedSemaphorePermit,
    replies: mpsc::UnboundedSender<Reply>,
) {
    tokio::spawn(async move {
        let mut extents = p::Extents::new(&request);
        volume.block_status(&mut extents).await;
        let mut reply = Vec::new();
        encoder.block_status(&extents, request.handle, &mut reply);
        let _ = replies.send((reply, held));
        drop(lookup);
    });
}

/// What [`Input::fill_charged`] got.
enum Filled {
    /// The bytes wanted are there.
    Yes,
    /// The peer closed first.
    Eof,
    /// Nothing in flight and no byte received for the idle timeout.
    Idle,
    /// The payload being received was not complete by its deadline.
    SlowPayload,
}

/// Received bytes not yet consumed by a state machine: `buf[start..]`. A buffer whose capacity exceeds
/// [`INPUT_FREE_BYTES`] holds `charge` for all of it.
#[derive(Default)]
struct Input {
    buf: Vec<u8>,
    start: usize,
    charge: Charge,
}

impl Input {
    fn unconsumed(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        assert!(self.start <= self.buf.len(), "consumed more than was received");
        if self.start == self.buf.len() {
            self.start = 0;
            if self.buf.capacity() > INPUT_FREE_BYTES {
                self.buf = Vec::new();
                self.charge = Charge::default();
            } else {
                self.buf.clear();
            }
        }
    }

    /// Moves the consumed prefix out when it is long, or when the buffer lacks room for `wanted` more.
    fn compact(&mut self, wanted: usize) {
        if self.start >= COMPACT_BYTES || (self.start > 0 && self.buf.capacity() - self.start < wanted) {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    /// The handshake's read (uncharged: the handshake's own limits bound it): reads until at least
    /// `wanted` bytes are unconsumed; false if the peer closed first.
    async fn fill<R: AsyncRead + Unpin>(&mut self, rd: &mut R, wanted: usize) -> io::Result<bool> {
        self.compact(wanted);
        while self.buf.len() - self.start < wanted {
            let missing = wanted - (self.buf.len() - self.start);
            self.buf.reserve(missing.max(READ_AHEAD));
            if rd.read_buf(&mut self.buf).await? == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The transmission phase's read: makes room for `wanted` unconsumed bytes (charging a buffer that
    /// grows past [`INPUT_FREE_BYTES`] in full first, and waiting for that charge), then reads straight
    /// into the buffer's spare capacity, at most [`READ_AHEAD`] past `wanted`. With `idle` = (timeout,
    /// the connection's request slots): gives up when no byte came for the timeout while nothing was in
    /// flight. With `payload_within`: gives up when the bytes wanted are not there that long after the
    /// buffer's charge was granted (a wait for the budget is the server's, not the client's).
    async fn fill_charged<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        wanted: usize,
        budget: &TenantBudget,
        mut idle: Option<(&mut Idle, &Semaphore)>,
        payload_within: Option<Duration>,
    ) -> io::Result<Filled> {
        self.compact(wanted);
        let needed = self.start + wanted;
        if self.buf.capacity() < needed {
            let target = needed.max((self.buf.len() + READ_AHEAD).min(INPUT_FREE_BYTES));
            if target > INPUT_FREE_BYTES {
                // Budget invariant 2: hold nothing of the input's while waiting.
                self.charge = Charge::default();
                self.charge = budget.charge(target).await;
            }
            self.buf.reserve_exact(target - self.buf.len());
        }
        // The payload's deadline, with the time it gives (None: no deadline).
        let mut payload = payload_within.map(|d| (Instant::now() + d, d));
        while self.buf.len() - self.start < wanted {
            let missing = wanted - (self.buf.len() - self.start);
            let limit = missing.max(READ_AHEAD) as u64;
            let read = async {
                match &mut idle {
                    None => read_some(rd, &mut self.buf, limit).await.map(Some),
                    Some((idle, slots)) => read_or_idle(rd, &mut self.buf, limit, idle, slots).await,
                }
            };
            let read = match payload {
                Some((by, within)) => tokio::select! {
                    // The bytes first: after a stall of this process both are ready, and the payload that
                    // came meanwhile is not cut for the time it waited in the socket.
                    biased;
                    r = read => r?,
                    _ = tokio::time::sleep_until(by) => {
                        let now = Instant::now();
                        if now.saturating_duration_since(by) > crate::STALLED {
                            // The timer fired late: this process did not run (crate::STALLED), and what the
                            // client sent meanwhile may be unread yet. The payload gets its time again, as
                            // an idle client does (`read_or_idle`). Before, a stall longer than
                            // stall_timeout_s cut the connections whose payloads were on their way.
                            payload = Some((now + within, within));
                            continue;
                        }
                        return Ok(Filled::SlowPayload);
                    }
                },
                None => read.await?,
            };
            let Some(n) = read else { return Ok(Filled::Idle) };
            if n == 0 {
                return Ok(Filled::Eof);
            }
        }
        Ok(Filled::Yes)
    }

    /// A WRITE's payload (`len` bytes ending `used` bytes into the unconsumed input) taken out of a
    /// charged buffer together with the buffer and its charge: the payload moves to the front (no new
    /// allocation) and the few bytes after it (at most [`READ_AHEAD`]) to a fresh, uncharged buffer.
    /// Only when [`Input::can_take`] says so.
    fn take_payload(&mut self, used: usize, len: usize) -> (Vec<u8>, Charge) {
        assert!(self.can_take(used), "only a charged buffer is taken");
        let end = self.start + used;
        let mut rest = Vec::with_capacity(READ_AHEAD);
        rest.extend_from_slice(&self.buf[end..]);
        let mut data = std::mem::replace(&mut self.buf, rest);
        data.copy_within(end - len..end, 0);
        data.truncate(len);
        self.start = 0;
        (data, std::mem::take(&mut self.charge))
    }

    /// Whether a WRITE whose request ends `used` bytes into the unconsumed input should take the buffer
    /// ([`Input::take_payload`]): the buffer is charged, and little was read past the request. Else its
    /// payload is copied out (and charged as a copy).
    fn can_take(&self, used: usize) -> bool {
        self.buf.capacity() > INPUT_FREE_BYTES && self.buf.len() - (self.start + used) <= READ_AHEAD
    }
}

/// One read of at most `limit` bytes into `buf`'s spare capacity (cancel-safe, as `read_buf` is).
async fn read_some<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut Vec<u8>, limit: u64) -> io::Result<usize> {
    AsyncReadExt::take(&mut *rd, limit).read_buf(buf).await
}

/// A connection's idle clock (`idle_timeout`): one timer per connection, re-armed only when it fires
/// early (so a busy connection pays no timer per read).
struct Idle {
    after: Duration,
    sleep: Pin<Box<Sleep>>,
    /// Whether `sleep` holds this task's waker (it is polled only then, or once elapsed).
    armed: LazyPoll,
    /// When the last byte was received.
    last_rx: Instant,
    opened: Instant,
    /// When the writer last wrote replies, in ms since `opened` (it stamps each batch).
    last_reply_ms: Arc<AtomicU64>,
}

impl Idle {
    /// When the connection turns idle if nothing happens meanwhile: the idle timeout after the last byte
    /// received or the last reply written, whichever is later.
    fn due(&self) -> Instant {
        let replied = self.opened + Duration::from_millis(self.last_reply_ms.load(Ordering::Relaxed));
        self.last_rx.max(replied) + self.after
    }

    /// Sets the timer to `due` (a new deadline: the timer must be polled again on the next wait).
    fn rearm(&mut self, due: Instant) {
        self.sleep.as_mut().reset(due);
        self.armed.forget();
    }
}

/// How often an export's backend failures are logged at most, after the first (which is logged at once).
pub(crate) const BACKEND_FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);
/// Exports whose failures are remembered at most (a name beyond them starts over: at worst one more line).
const BACKEND_FAILURE_EXPORTS: usize = 1024;

/// The operating system's failures of an export's storage (ENOSPC on a full disk, EIO, EPERM on an
/// immutable file), logged at WARN so that an operator sees them: the first of an export at once, then
/// at most one line every [`BACKEND_FAILURE_LOG_EVERY`] with how many failed since. (A client's own
/// mistakes, an out-of-range or read-only request, stay at debug level; a node's failures behind a
/// gateway are logged by the node and by the link.)
#[derive(Default)]
pub(crate) struct BackendFailures {
    /// Per export: when its last line was written, and the failures since.
    seen: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, u64)>>,
}

fn backend_failures() -> &'static BackendFailures {
    static FAILURES: std::sync::OnceLock<BackendFailures> = std::sync::OnceLock::new();
    FAILURES.get_or_init(BackendFailures::default)
}

impl BackendFailures {
    /// Counts one failure of `export`'s storage; logs it if the export's line is due. Returns whether it
    /// logged.
    pub(crate) fn note(&self, export: &str, command: impl std::fmt::Display, e: &dyn std::fmt::Display) -> bool {
        let now = std::time::Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= BACKEND_FAILURE_EXPORTS && !seen.contains_key(export) {
            seen.clear();
        }
        let (last, since) = match seen.get_mut(export) {
            Some(entry) => entry,
            None => {
                seen.insert(export.to_string(), (now, 0));
                tracing::warn!(export = %export, %command, error = %e, "the export's storage failed a request");
                return true;
            }
        };
        *since += 1;
        if now.duration_since(*last) < BACKEND_FAILURE_LOG_EVERY {
            return false;
        }
        tracing::warn!(
            export = %export,
            %command,
            error = %e,
            failed = *since,
            "the export's storage failed {} requests in the last {} s (this one: {e})",
            *since,
            now.duration_since(*last).as_secs()
        );
        *last = now;
        *since = 0;
        true
    }
}

/// One read of at most `limit` bytes into `buf`, or `None` once the connection is idle: nothing in
/// flight (all of `slots` free) and no byte received or reply written for the idle timeout. Requests in
/// flight when the time runs out restart it when they have all been answered.
async fn read_or_idle<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut Vec<u8>,
    limit: u64,
    idle: &mut Idle,
    slots: &Semaphore,
) -> io::Result<Option<usize>> {
    loop {
        // The read, or the idle timer once it has elapsed (polled again only then: it keeps this task's
        // waker, so a busy connection does not touch the timer per read).
        let read = {
            let read = read_some(rd, buf, limit);
            tokio::pin!(read);
            std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(r) = read.as_mut().poll(cx) {
                    return std::task::Poll::Ready(Some(r));
                }
                let elapsed = idle.sleep.is_elapsed();
                idle.armed.poll(cx, idle.sleep.as_mut(), elapsed).map(|()| None)
            })
            .await
        };
        if let Some(r) = read {
            idle.last_rx = Instant::now();
            return r.map(Some);
        }
        let due = idle.due();
        let now = Instant::now();
        if now < due {
            idle.rearm(due);
            continue;
        }
        if now - due > crate::STALLED {
            // The timer fired late: this process did not run (crate::STALLED), and bytes the client sent
            // meanwhile may not have been seen yet. The client gets its idle time again.
            idle.last_rx = now;
            idle.rearm(idle.due());
            continue;
        }
        if slots.available_permits() < MAX_IN_FLIGHT_PER_CONN {
            // Not idle: wait until everything in flight is answered (or a byte comes), then the
            // clock runs from the last reply.
            tokio::select! {
                biased;
                r = read_some(rd, buf, limit) => {
                    idle.last_rx = Instant::now();
                    return r.map(Some);
                }
                _ = slots.acquire_many(MAX_IN_FLIGHT_PER_CONN as u32) => {}
            }
            let due = idle.due();
            idle.rearm(due);
            continue;
        }
        return Ok(None);
    }
}

/// Polls a future that keeps its registration between polls (a [`Sleep`], a watch's wait) only when it
/// may have finished: the first time, when the caller says it may be ready, or when the task's waker is
/// not the one it holds. A `select!` would poll it at every wake-up of the task, and each such poll of a
/// timer or a watch costs about as much as a small request's whole bookkeeping.
#[derive(Default)]
struct LazyPoll {
    /// The waker the future was last polled with (`None`: not polled since it was set up).
    with: Option<std::task::Waker>,
}

impl LazyPoll {
    fn poll<F: Future>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        fut: Pin<&mut F>,
        may_be_ready: bool,
    ) -> std::task::Poll<F::Output> {
        let holds_ours = self.with.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if holds_ours && !may_be_ready {
            return std::task::Poll::Pending;
        }
        let polled = fut.poll(cx);
        if polled.is_pending() && !holds_ours {
            self.with = Some(cx.waker().clone());
        }
        polled
    }

    /// The future was reset (a new deadline): poll it on the next wait.
    fn forget(&mut self) {
        self.with = None;
    }
}

/// What the writer task shares with its connection.
struct Out {
    opened: Instant,
    /// When replies were last written, in ms since `opened` (the idle clock).
    last_reply_ms: Arc<AtomicU64>,
    /// Yield a turn before each write ([`Backend::Remote`], module comment).
    coalesce: bool,
    gone: Gone,
    /// [`Limits::stall_timeout`]: how long a write may go without a byte taken by the client's socket.
    stall: Option<Duration>,
    /// Set when a write waited that long: the reader stops ([`End::Stalled`]).
    cut: watch::Sender<bool>,
}

/// The writer task: replies in completion order, the ready ones in one vectored write. Replies are
/// dropped (releasing their permits) once written, or at once if the client is gone (then `gone` is set):
/// its socket failed, or took no byte for the stall timeout (then the reader is told to stop, and the
/// replies' charges go back to the budget).
async fn write_replies<W: AsyncWrite + Unpin>(mut wr: W, mut rx: mpsc::UnboundedReceiver<Reply>, out: Out) {
    let Out { opened, last_reply_ms, coalesce, gone, stall, cut } = out;
    let mut batch: Vec<Reply> = Vec::with_capacity(WRITE_BATCH);
    let mut broken = false;
    while let Some(first) = rx.recv().await {
        if coalesce {
            // One scheduler turn first: the node connections whose replies are ready complete theirs too,
            // and they all go in this write (module comment).
            tokio::task::yield_now().await;
        }
        let mut bytes = first.0.len();
        batch.push(first);
        while batch.len() < WRITE_BATCH && bytes < WRITE_BATCH_BYTES {
            let Ok(next) = rx.try_recv() else { break };
            bytes += next.0.len();
            batch.push(next);
        }
        if !broken {
            let written = match stall {
                // (`flush` is a no-op on a socket; it empties the TLS path's buffer.)
                None => async {
                    write_batch(&mut wr, &batch).await?;
                    wr.flush().await
                }
                .await
                .is_ok(),
                Some(d) => {
                    // Cut when no byte has gone out for the stall timeout, not when the batch takes longer
                    // (a 32 MiB reply to a slow reader is one batch). The timer is armed only once a write
                    // waits (`biased`: the write first).
                    let (base, moved) = (Instant::now(), AtomicU64::new(0));
                    let last = || base + Duration::from_nanos(moved.load(Ordering::Relaxed)) + d;
                    let mut wr = Moved { inner: &mut wr, base, at: &moved };
                    let write = async {
                        write_batch(&mut wr, &batch).await?;
                        wr.flush().await
                    };
                    tokio::pin!(write);
                    loop {
                        tokio::select! {
                            biased;
                            r = &mut write => break r.is_ok(),
                            _ = tokio::time::sleep_until(last()) => {
                                if Instant::now() >= last() {
                                    cut.send_replace(true);
                                    break false;
                                }
                            }
                        }
                    }
                }
            };
            if !written {
                broken = true; // client gone: keep draining so permits are released
                gone.broken();
            }
        }
        // Before the permits go with the batch: whoever sees them free sees the stamp (idle clock).
        last_reply_ms.store(opened.elapsed().as_millis() as u64, Ordering::Relaxed);
        batch.clear();
    }
    if !broken {
        let _ = wr.shutdown().await;
    }
}

/// A writer that notes when bytes last went out, in nanoseconds after `base` (the writer task's stall
/// timeout).
struct Moved<'a, W> {
    inner: &'a mut W,
    base: Instant,
    at: &'a AtomicU64,
}

impl<W> Moved<'_, W> {
    fn note<T>(&self, r: std::task::Poll<io::Result<T>>, moved: impl Fn(&T) -> bool) -> std::task::Poll<io::Result<T>> {
        if let std::task::Poll::Ready(Ok(v)) = &r {
            if moved(v) {
                self.at.store(self.base.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
        r
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Moved<'_, W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = Pin::new(&mut *self.inner).poll_write(cx, buf);
        self.note(r, |&n| n > 0)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = Pin::new(&mut *self.inner).poll_write_vectored(cx, bufs);
        self.note(r, |&n| n > 0)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        let r = Pin::new(&mut *self.inner).poll_flush(cx);
        self.note(r, |_| true)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

/// Writes every reply of `batch` (at most [`WRITE_BATCH`]): [`crate::wire::write_all`].
async fn write_batch<W: AsyncWrite + Unpin>(wr: &mut W, batch: &[Reply]) -> io::Result<()> {
    if let [(one, _)] = batch {
        return crate::wire::write_all(wr, &[one]).await;
    }
    let mut parts: [&[u8]; WRITE_BATCH] = [&[]; WRITE_BATCH];
    for (part, (reply, _)) in parts.iter_mut().zip(batch) {
        *part = reply;
    }
    crate::wire::write_all(wr, &parts[..batch.len().min(WRITE_BATCH)]).await
}

#[cfg(test)]
mod tests {
    use super::{BackendFailures, LazyPoll, BACKEND_FAILURE_EXPORTS, BACKEND_FAILURE_LOG_EVERY};

    /// An export's first backend failure is logged at once, the next ones at most once per
    /// BACKEND_FAILURE_LOG_EVERY with their count; each export on its own; the table stays bounded.
    #[test]
    fn backend_failures_are_logged_first_then_paced() {
        let f = BackendFailures::default();
        assert!(f.note("a", "write", &"No space left on device"));
        assert!(!f.note("a", "write", &"No space left on device"));
        assert!(!f.note("a", "flush", &"No space left on device"));
        assert!(f.note("b", "write", &"Input/output error"), "another export's first failure");
        let back = std::time::Instant::now() - BACKEND_FAILURE_LOG_EVERY;
        f.seen.lock().unwrap().get_mut("a").unwrap().0 = back;
        assert!(f.note("a", "write", &"No space left on device"), "due again");
        assert_eq!(f.seen.lock().unwrap()["a"].1, 0, "the count starts over after its line");
        for i in 0..2 * BACKEND_FAILURE_EXPORTS {
            f.note(&format!("e{i}"), "read", &"x");
        }
        assert!(f.seen.lock().unwrap().len() <= BACKEND_FAILURE_EXPORTS);
    }
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    /// Counts its polls; ready once `ready` is set.
    struct Counted {
        polls: u32,
        ready: bool,
    }

    impl Future for Counted {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.polls += 1;
            if self.ready {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    struct Nop;
    impl Wake for Nop {
        fn wake(self: Arc<Self>) {}
    }

    #[test]
    fn a_lazily_polled_future_is_polled_only_when_it_may_have_finished_or_lacks_the_waker() {
        let (one, two) = (Waker::from(Arc::new(Nop)), Waker::from(Arc::new(Nop)));
        let mut fut = Counted { polls: 0, ready: false };
        let mut lazy = LazyPoll::default();
        let poll = |lazy: &mut LazyPoll, fut: &mut Counted, waker: &Waker, maybe: bool| {
            lazy.poll(&mut Context::from_waker(waker), Pin::new(fut), maybe)
        };
        // The first poll registers the waker; later ones with it are skipped unless it may be ready.
        assert!(poll(&mut lazy, &mut fut, &one, false).is_pending());
        assert!(poll(&mut lazy, &mut fut, &one, false).is_pending());
        assert_eq!(fut.polls, 1);
        assert!(poll(&mut lazy, &mut fut, &one, true).is_pending());
        assert_eq!(fut.polls, 2);
        // Another waker: polled, so that the future holds the new one.
        assert!(poll(&mut lazy, &mut fut, &two, false).is_pending());
        assert!(poll(&mut lazy, &mut fut, &two, false).is_pending());
        assert_eq!(fut.polls, 3);
        // Forgotten (the future was reset): polled again.
        lazy.forget();
        assert!(poll(&mut lazy, &mut fut, &two, false).is_pending());
        assert_eq!(fut.polls, 4);
        // Ready shows when it may be ready.
        fut.ready = true;
        assert!(poll(&mut lazy, &mut fut, &two, false).is_pending(), "not looked at without a hint");
        assert!(poll(&mut lazy, &mut fut, &two, true).is_ready());
    }
}
