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
//! - The input buffer: the state machine never needs more than one request header and its WRITE payload
//!   (28 bytes + the maximum payload) unconsumed; a rejected WRITE's payload is skipped as it arrives. A
//!   buffer grown past [`INPUT_SHRINK_BYTES`] by a large write is released once it is consumed.
//! - The writer takes the replies that are ready, up to [`WRITE_BATCH`] of them or about
//!   [`WRITE_BATCH_BYTES`], and hands them to one vectored write.
//!
//! # Transports
//! The code is generic over the stream. A plain connection splits its `TcpStream` into owned halves (no
//! lock between reader and writer, as before TLS existed); a TLS connection splits its `SslStream` with
//! `tokio::io::split` (a lock shared by the two halves, since one TLS session reads and writes).
//!
//! # Copies per READ
//! One: the storage (the kernel through io_uring or `pread`, or a memory copy for RAM) writes the data
//! into the reply's own buffer, after headroom for the reply header ([`ReplyEncoder::headroom`]), and the
//! socket write takes that buffer as one of its slices. (It used to be three: into a read buffer, into the
//! reply, and into the writer's batch.) `O_DIRECT` reads add the copy out of their aligned buffer.

use crate::access::{Admit, ClientSlot, ConnCaps, ConnLimits, ExportAccess, TenantSlot, REFUSAL_TIMEOUT};
use crate::dispatch::{Dispatcher, IoRequest, IoResult, Op};
use crate::storage::Storage;
use crate::tls::{TlsConfig, TlsError};
use rein_core::TenantId;
use rein_proto::nbd::{
    self as p, Event, ExportInfo, Negotiated, Rejection, ReplyEncoder, Request, RequestKind, ServerHandshake,
    ServerProgress, ServerTransmission, TlsMode, TransmissionConfig,
};
use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_openssl::SslStream;

/// Requests one connection may have in flight before the server stops reading from it.
pub const MAX_IN_FLIGHT_PER_CONN: usize = 256;
/// Time allowed for the whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most replies in one socket write.
pub const WRITE_BATCH: usize = 64;
/// A batch stops growing once it holds this many bytes.
pub const WRITE_BATCH_BYTES: usize = 256 * 1024;
/// An input buffer larger than this is released when everything in it has been consumed.
pub const INPUT_SHRINK_BYTES: usize = 4 << 20;
/// Bytes asked of the socket per read at least.
const READ_CHUNK: usize = 16 * 1024;
/// A consumed prefix at least this long is reclaimed (the rest moved to the front) before the next read.
const COMPACT_BYTES: usize = 64 * 1024;

/// An export as the server runs it.
pub struct Export {
    /// What the handshake advertises.
    pub info: ExportInfo,
    /// Where its bytes live.
    pub storage: Arc<dyn Storage>,
    /// Whose QoS its requests get.
    pub tenant: TenantId,
    /// The tenant's name (logs, the per-tenant connection cap's message).
    pub tenant_name: String,
    /// Who may see and open it (`allow_networks`, `allow_identities`).
    pub access: ExportAccess,
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
    /// The QoS dispatcher in front of the storage.
    pub dispatcher: Dispatcher,
    /// Largest READ or WRITE accepted, in bytes.
    pub max_payload: u32,
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
    /// The handshake took longer than [`HANDSHAKE_TIMEOUT`] (or a refused client longer than
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
    /// TLS (`[tls]`); `None`: off.
    pub tls: Option<TlsConfig>,
    /// The name of the export the empty name opens (`default_export`).
    pub default_export: Option<String>,
    /// Whether connections are counted per tenant (`max_connections_per_tenant`).
    pub cap_tenants: bool,
    /// The connection counters.
    pub limits: Arc<ConnLimits>,
}

impl Policy {
    /// No TLS, no default export, no per-tenant cap, and the counters' default caps.
    pub fn open() -> Policy {
        Policy { tls: None, default_export: None, cap_tenants: false, limits: ConnLimits::new(ConnCaps::default()) }
    }

    fn visible(exports: &[Arc<Export>], ip: IpAddr, identity: Option<&str>) -> Vec<bool> {
        exports.iter().map(|e| e.access.allows(ip, identity)).collect()
    }
}

/// How a connection is admitted ([`ConnLimits::admit`]): served, or greeted and refused.
#[derive(Debug)]
pub enum Entry {
    /// Served; the slot counts it until it ends.
    Serve(ClientSlot),
    /// Every option refused with this message (over a connection cap).
    Refuse(String, OwnedSemaphorePermit),
}

/// Serves one connection with [`Policy::open`] until the client disconnects, errs, or `shutdown` turns
/// true (then in-flight requests are answered before closing).
pub async fn serve_connection(
    stream: TcpStream,
    ctx: Arc<NbdContext>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConnError> {
    let policy = Policy::open();
    let peer = stream.peer_addr()?;
    let Admit::Serve(slot) = policy.limits.admit(peer.ip()) else {
        unreachable!("the first connection of a new counter is under every default cap")
    };
    serve_client(stream, peer, Entry::Serve(slot), ctx, Arc::new(policy), shutdown).await
}

/// The transport after the handshake.
enum Transport {
    Plain(TcpStream),
    Tls(Box<SslStream<TcpStream>>),
}

/// What a finished handshake leaves: the transport, what was agreed, the client's identity and its
/// tenant slot.
type Opened = (Transport, Negotiated, Option<String>, Option<TenantSlot>);

/// Serves one connection from `peer` under `policy` until the client disconnects, errs, or `shutdown`
/// turns true (then in-flight requests are answered before closing).
pub async fn serve_client(
    stream: TcpStream,
    peer: SocketAddr,
    entry: Entry,
    ctx: Arc<NbdContext>,
    policy: Arc<Policy>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnError> {
    stream.set_nodelay(true)?;
    let mut input = Input::default();
    // One snapshot of the exports for the whole handshake; the connection keeps the export it opens.
    let exports = ctx.exports.snapshot();
    let infos: Vec<ExportInfo> = exports.iter().map(|e| e.info.clone()).collect();
    let mut out = Vec::new();
    let mut hs = ServerHandshake::with_max_payload(infos, ctx.max_payload, &mut out);
    hs.set_tls(policy.tls.as_ref().map_or(TlsMode::Off, |t| t.mode));
    hs.set_default_export(policy.default_export.as_ref().and_then(|d| exports.iter().position(|e| e.info.name == *d)));
    hs.set_visible(Policy::visible(&exports, peer.ip(), None));
    hs.set_confirm_open(policy.cap_tenants);
    let (deadline, _slot) = match entry {
        Entry::Serve(slot) => (HANDSHAKE_TIMEOUT, Some(slot)),
        Entry::Refuse(message, _permit) => {
            hs.refuse_all(message);
            let refused = async {
                let mut stream = stream;
                stream.write_all(&out).await?;
                let _ = handshake(&mut stream, &mut hs, &mut input, &policy, &exports).await?;
                Ok(())
            };
            return tokio::time::timeout(REFUSAL_TIMEOUT, refused).await.map_err(|_| ConnError::Timeout)?;
        }
    };
    let opened = async {
        let mut stream = stream;
        stream.write_all(&out).await?;
        match handshake(&mut stream, &mut hs, &mut input, &policy, &exports).await? {
            HsEnd::Left => Ok(None),
            HsEnd::Open(n, slot) => Ok(Some((Transport::Plain(stream), n, None, slot))),
            HsEnd::StartTls => {
                let tls = policy.tls.as_ref().expect("the handshake offers STARTTLS only with TLS configured");
                let (mut stream, identity) = tls.accept(stream).await?;
                hs.tls_established();
                hs.set_visible(Policy::visible(&exports, peer.ip(), identity.as_deref()));
                match handshake(&mut stream, &mut hs, &mut input, &policy, &exports).await? {
                    HsEnd::Left => Ok(None),
                    HsEnd::Open(n, slot) => Ok(Some((Transport::Tls(Box::new(stream)), n, identity, slot))),
                    HsEnd::StartTls => Err(ConnError::Proto(p::ProtoError::Malformed("a second NBD_OPT_STARTTLS"))),
                }
            }
        }
    };
    let opened: Option<Opened> = tokio::time::timeout(deadline, opened).await.map_err(|_| ConnError::Timeout)??;
    let Some((transport, negotiated, identity, _tenant_slot)) = opened else { return Ok(()) };
    let export = exports[negotiated.export].clone();
    drop(exports);
    let export = &*export;
    tracing::debug!(%peer, export = %export.info.name, structured = negotiated.structured, identity = identity.as_deref().unwrap_or(""), tls = hs.tls_active(), "NBD connection ready");
    let machine = ServerTransmission::new(TransmissionConfig::new(&export.info, &negotiated, ctx.max_payload));
    match transport {
        Transport::Plain(stream) => {
            // The plain path keeps the socket's own halves (no lock between reader and writer).
            let (rd, wr) = stream.into_split();
            transmission(rd, wr, &ctx, export, machine, input, &mut shutdown).await
        }
        Transport::Tls(stream) => {
            let (rd, wr) = tokio::io::split(*stream);
            // OpenSSL writes one slice per call, so a reply's header would be a TLS record of its own:
            // a buffer gathers a batch's small replies into full records (large ones pass straight through).
            let wr = tokio::io::BufWriter::with_capacity(WRITE_BATCH_BYTES, wr);
            transmission(rd, wr, &ctx, export, machine, input, &mut shutdown).await
        }
    }
}

/// The transmission phase on a split transport: a reader here, the writer task, and the wait for
/// in-flight replies.
async fn transmission<R, W>(
    mut rd: R,
    wr: W,
    ctx: &NbdContext,
    export: &Export,
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
    let writer = tokio::spawn(write_replies(wr, rx));
    let mut conn =
        Connection { export, dispatcher: &ctx.dispatcher, machine, input, replies, permits: permits.clone() };
    let result = conn.transmission(&mut rd, shutdown).await;
    drop(conn);
    // Wait for in-flight requests to be answered and written (each holds a permit until then); their
    // callbacks then hold no sender any more, so the writer ends once it has written everything.
    let _ = permits.acquire_many(MAX_IN_FLIGHT_PER_CONN as u32).await;
    let _ = writer.await;
    result
}

/// How a handshake on one transport ended.
enum HsEnd {
    /// The client aborted or left.
    Left,
    /// STARTTLS was acknowledged: run TLS, then go on.
    StartTls,
    /// An export is open (with the client's tenant slot, if tenants are capped).
    Open(Negotiated, Option<TenantSlot>),
}

/// Runs the handshake on `stream` until it ends, needs TLS, or the client leaves. Bytes after the
/// handshake stay in `input`.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    hs: &mut ServerHandshake,
    input: &mut Input,
    policy: &Policy,
    exports: &[Arc<Export>],
) -> Result<HsEnd, ConnError> {
    let mut out = Vec::new();
    loop {
        if !input.fill(stream, input.unconsumed().len() + 1).await? {
            return Ok(HsEnd::Left);
        }
        loop {
            out.clear();
            let (used, mut progress) = hs.feed(input.unconsumed(), &mut out)?;
            input.consume(used);
            let mut slot = None;
            if let ServerProgress::Opening(export) = progress {
                // The per-tenant cap, counted when the export opens; a refusal goes back to the client.
                let verdict = match exports.get(export) {
                    Some(e) if policy.cap_tenants => {
                        policy.limits.open_tenant(e.tenant.index(), &e.tenant_name).map(|s| slot = Some(s))
                    }
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
                ServerProgress::NeedMore | ServerProgress::Opening(_) => break,
                ServerProgress::Aborted => return Ok(HsEnd::Left),
                ServerProgress::Done(n) => return Ok(HsEnd::Open(n, slot)),
                ServerProgress::StartTls if input.unconsumed().is_empty() => return Ok(HsEnd::StartTls),
                ServerProgress::StartTls => {
                    return Err(p::ProtoError::Malformed("data after NBD_OPT_STARTTLS before the TLS handshake").into())
                }
            }
        }
    }
}

/// A reply and the permit its request holds until the reply is written.
type Reply = (Vec<u8>, OwnedSemaphorePermit);

/// One connection in the transmission phase.
struct Connection<'a> {
    export: &'a Export,
    dispatcher: &'a Dispatcher,
    machine: ServerTransmission,
    input: Input,
    replies: mpsc::UnboundedSender<Reply>,
    permits: Arc<Semaphore>,
}

impl Connection<'_> {
    /// Reads, feeds the state machine and acts on its events until the client disconnects or leaves, the
    /// protocol breaks, or `shutdown` turns true.
    async fn transmission<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), ConnError> {
        loop {
            let (used, event) = self.machine.feed(self.input.unconsumed())?;
            match event {
                Event::NeedMore { wanted } => {
                    self.input.consume(used);
                    let more = tokio::select! {
                        r = self.input.fill(rd, wanted) => r?,
                        _ = shutdown.wait_for(|s| *s) => return Ok(()),
                    };
                    if !more {
                        return Ok(()); // client closed (with or without NBD_CMD_DISC)
                    }
                }
                Event::Request { request, payload } => {
                    let encoder = self.machine.replies();
                    let op = match request.kind {
                        RequestKind::Read => Op::Read { len: request.length, headroom: encoder.headroom(&request) },
                        RequestKind::Write => Op::Write { data: payload.to_vec() },
                        RequestKind::Flush => Op::Flush,
                        RequestKind::Trim => Op::Trim { len: request.length },
                        RequestKind::WriteZeroes => Op::WriteZeroes { len: request.length },
                    };
                    self.input.consume(used);
                    let permit = self.permit().await;
                    self.submit(request, op, encoder, permit).await;
                }
                Event::Reject(rejection) => {
                    self.input.consume(used);
                    let permit = self.permit().await;
                    self.reject(&rejection, permit);
                }
                Event::Disconnect => return Ok(()),
            }
        }
    }

    async fn permit(&self) -> OwnedSemaphorePermit {
        self.permits.clone().acquire_owned().await.expect("the semaphore is never closed")
    }

    /// Hands a request to the dispatcher; the reply is encoded where the result appears (on the dispatcher
    /// task) and goes straight to the writer: no task or channel per request.
    async fn submit(&self, request: Request, op: Op, encoder: ReplyEncoder, permit: OwnedSemaphorePermit) {
        let replies = self.replies.clone();
        let done = Box::new(move |res: IoResult| {
            let reply = match res {
                Ok(mut reply) => {
                    encoder.success(&request, &mut reply);
                    reply
                }
                Err(e) => {
                    tracing::debug!(handle = request.handle, command = %request.kind.command(), error = %e, "request failed");
                    let mut reply = Vec::new();
                    encoder.failure(&mut reply, request.handle, e.kind(), &e);
                    reply
                }
            };
            let _ = replies.send((reply, permit));
        });
        let req = IoRequest {
            storage: self.export.storage.clone(),
            tenant: self.export.tenant,
            offset: request.offset,
            op,
            fua: request.fua,
        };
        self.dispatcher.submit(req, done).await;
    }

    fn reject(&self, rejection: &Rejection, permit: OwnedSemaphorePermit) {
        tracing::debug!(handle = rejection.handle, "request rejected: {rejection}");
        let mut reply = Vec::new();
        self.machine.replies().rejection(&mut reply, rejection);
        let _ = self.replies.send((reply, permit));
    }
}

/// Received bytes not yet consumed by a state machine: `buf[start..]`.
#[derive(Default)]
struct Input {
    buf: Vec<u8>,
    start: usize,
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
            if self.buf.capacity() > INPUT_SHRINK_BYTES {
                self.buf = Vec::new();
            } else {
                self.buf.clear();
            }
        }
    }

    /// Reads (straight into the buffer's spare capacity) until at least `wanted` bytes are unconsumed;
    /// false if the peer closed first.
    async fn fill<R: AsyncRead + Unpin>(&mut self, rd: &mut R, wanted: usize) -> io::Result<bool> {
        if self.start >= COMPACT_BYTES || (self.start > 0 && self.buf.capacity() - self.start < wanted) {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        while self.buf.len() - self.start < wanted {
            let missing = wanted - (self.buf.len() - self.start);
            self.buf.reserve(missing.max(READ_CHUNK));
            if rd.read_buf(&mut self.buf).await? == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The writer task: replies in completion order, the ready ones in one vectored write. Replies are
/// dropped (releasing their permits) once written, or at once if the client is gone.
async fn write_replies<W: AsyncWrite + Unpin>(mut wr: W, mut rx: mpsc::UnboundedReceiver<Reply>) {
    let mut batch: Vec<Reply> = Vec::with_capacity(WRITE_BATCH);
    let mut broken = false;
    while let Some(first) = rx.recv().await {
        let mut bytes = first.0.len();
        batch.push(first);
        while batch.len() < WRITE_BATCH && bytes < WRITE_BATCH_BYTES {
            let Ok(next) = rx.try_recv() else { break };
            bytes += next.0.len();
            batch.push(next);
        }
        // (`flush` is a no-op on a socket; it empties the TLS path's buffer.)
        if !broken && (write_all_vectored(&mut wr, &batch).await.is_err() || wr.flush().await.is_err()) {
            broken = true; // client gone: keep draining so permits are released
        }
        batch.clear();
    }
    if !broken {
        let _ = wr.shutdown().await;
    }
}

/// Writes every reply of `batch` (at most [`WRITE_BATCH`]) with vectored writes, resuming after short
/// writes.
async fn write_all_vectored<W: AsyncWrite + Unpin>(wr: &mut W, batch: &[Reply]) -> io::Result<()> {
    assert!(batch.len() <= WRITE_BATCH, "a batch fits the slice array");
    // The first byte not yet written: `batch[i].0[at]`.
    let (mut i, mut at) = (0, 0);
    while i < batch.len() {
        let mut slices = [IoSlice::new(&[]); WRITE_BATCH];
        let pending = &batch[i..];
        for (k, (reply, _)) in pending.iter().enumerate() {
            slices[k] = IoSlice::new(if k == 0 { &reply[at..] } else { reply });
        }
        let mut written = wr.write_vectored(&slices[..pending.len()]).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while i < batch.len() {
            let left = batch[i].0.len() - at;
            if written < left {
                at += written;
                break;
            }
            written -= left;
            i += 1;
            at = 0;
        }
    }
    Ok(())
}
