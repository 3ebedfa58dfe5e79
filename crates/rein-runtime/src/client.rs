//! An async NBD client (for `rein load` and tests): one connection, many requests in flight.
//!
//! A reader task decodes replies with rein-proto's [`ClientTransmission`] (structured replies in several
//! chunks included, each chunk's length checked against its request before it is awaited) and completes
//! the matching request by handle; callers await their own request. Bounds: at most [`MAX_IN_FLIGHT`]
//! requests per connection (callers beyond it wait); what a reply buffers is bounded by its request;
//! connecting (TCP, the NBD handshake and TLS's) takes at most [`CONNECT_TIMEOUT`]. A server's refusal in
//! the handshake is said as what it means (no such export, an access policy, TLS), the option and reply
//! by name ([`ClientError::Refused`], [`ClientError::Tls`]): servers may send no message with it.
//!
//! Once the connection breaks (the reader stops: the server closed it, broke the protocol, or the socket
//! failed; or a request could not be written) it stays broken: every request still waiting fails with the
//! reason, and every later one fails at once with it ([`NbdClient::broken`]), unsent. A reply with
//! NBD_ESHUTDOWN breaks it so for later requests too (the spec lets the client send nothing but its soft
//! disconnect then), while those still waiting get the server's answers.

use crate::tls::TlsClient;
use rein_proto::nbd::{
    self as p, ClientEvent, ClientHandshake, ClientProgress, ClientTransmission, Command, RequestHeader,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Semaphore};

/// Requests one connection has in flight at most; a caller beyond it waits for one to be answered.
pub const MAX_IN_FLIGHT: usize = 1024;

/// How long connecting may take at most, all of it: TCP's connect, the NBD handshake and the TLS
/// handshake (a server that accepts and never answers held `rein load` for good).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a connection or a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket failed: connecting, reading or writing.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The server broke the protocol, in the handshake (or refused the export there) or in a reply.
    #[error("protocol: {0}")]
    Proto(#[from] p::ProtoError),
    /// The connection ended before the answer arrived.
    #[error("server closed the connection")]
    Closed,
    /// The server answered the request with this NBD error number (`NBD_EINVAL`, `NBD_EPERM`,
    /// `NBD_ENOSPC`, ...).
    #[error("server answered error {0} ({name})", name = p::errno_name(*.0))]
    Errno(u32),
    /// The connection broke (the server broke the protocol in a reply, or the socket failed) before the
    /// answer arrived; the reason is the connection's.
    #[error("connection broke: {0}")]
    Broken(String),
    /// The server refused the export (it has none of that name, or refuses this client) or another step
    /// of the handshake: what that means, then the option and the reply by name and the server's message.
    #[error("{0}")]
    Refused(String),
    /// The TLS handshake failed (OpenSSL's reason: an untrusted certificate, an unknown PSK identity),
    /// or the server and the client disagree on TLS (the message says which way).
    #[error("TLS: {0}")]
    Tls(String),
    /// Connecting (TCP, the NBD handshake, TLS) took longer than this: the server does not answer.
    #[error("no answer within {} s (TCP connect, NBD handshake or TLS handshake): the server accepts but does not answer, or nothing listens", .0.as_secs_f64())]
    Timeout(Duration),
}

/// Why a connection is over once the server answered NBD_ESHUTDOWN.
const SHUTTING_DOWN: &str = "the server is shutting down (it answered NBD_ESHUTDOWN)";

type Waiter = oneshot::Sender<Result<Vec<u8>, ClientError>>;

/// What the request side and the reader task share: the protocol state and who waits for which handle.
struct Shared {
    proto: ClientTransmission,
    waiters: HashMap<u64, Waiter>,
    /// Why the connection broke, once it did (`Closed`: the server closed it between replies); set by
    /// the reader as it stops, or by a failed write. Requests fail at once with it from then on.
    broken: Option<ClientError>,
    /// The next request's handle.
    next: u64,
}

/// A copy of a connection's end, for each request that learns of it.
fn copy_end(e: &ClientError) -> ClientError {
    match e {
        ClientError::Closed => ClientError::Closed,
        ClientError::Broken(m) => ClientError::Broken(m.clone()),
        e => ClientError::Broken(e.to_string()),
    }
}

type Pending = Arc<Mutex<Shared>>;

/// The sending half of the socket: TCP's own, or TLS's.
enum Writer {
    Plain(tokio::net::tcp::OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<tokio_openssl::SslStream<TcpStream>>),
}

impl Writer {
    /// Writes every byte of `parts`, in order (vectored: a request's header and its payload without
    /// copying the payload).
    async fn write_all(&mut self, parts: &[&[u8]]) -> std::io::Result<()> {
        match self {
            Writer::Plain(w) => crate::wire::write_all(w, parts).await,
            Writer::Tls(w) => crate::wire::write_all(w, parts).await,
        }
    }
    async fn shutdown(&mut self) -> std::io::Result<()> {
        match self {
            Writer::Plain(w) => w.shutdown().await,
            Writer::Tls(w) => w.shutdown().await,
        }
    }
}

/// Starts the task that reads replies from `rd` (`buf`: what the handshake read past its end), and
/// fails every waiter with the connection's end when it stops.
fn spawn_reader<R: AsyncRead + Send + Unpin + 'static>(
    mut rd: R,
    buf: Vec<u8>,
    structured: bool,
    dead: Arc<AtomicBool>,
) -> Pending {
    let pending: Pending = Arc::new(Mutex::new(Shared {
        proto: ClientTransmission::new(structured, MAX_IN_FLIGHT),
        waiters: HashMap::new(),
        broken: None,
        next: 1,
    }));
    let pend = pending.clone();
    tokio::spawn(async move {
        let end = reader(&mut rd, buf, &pend).await;
        // Fail everything still waiting, with the reason the connection ended, and keep the reason: a
        // later request fails at once (under the same lock, so none slips in between).
        let mut g = pend.lock().unwrap_or_else(|e| e.into_inner());
        for (_, tx) in g.waiters.drain() {
            let _ = tx.send(Err(copy_end(&end)));
        }
        g.broken.get_or_insert(end);
        dead.store(true, Relaxed);
    });
    pending
}

/// How a handshake round on one transport ended.
enum Negotiated {
    /// The export is open: size, flags, structured replies, the server's size constraints.
    Ready((u64, u16, bool, p::BlockSize)),
    /// STARTTLS was acknowledged: run TLS, then negotiate on.
    StartTls,
}

/// Drives `hs` over `stream` until the export is open or TLS must start; `buf` keeps what was read past
/// the handshake.
async fn negotiate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    hs: &mut ClientHandshake,
    buf: &mut Vec<u8>,
) -> Result<Negotiated, ClientError> {
    loop {
        let mut out = Vec::new();
        let (used, prog) = hs.feed(buf, &mut out)?;
        buf.drain(..used);
        stream.write_all(&out).await?;
        match prog {
            ClientProgress::Ready { size, flags, structured } => {
                return Ok(Negotiated::Ready((size, flags, structured, hs.block_size())))
            }
            ClientProgress::StartTls => return Ok(Negotiated::StartTls),
            // Only a handshake made with `ClientHandshake::with_node` reports these; this one is not.
            ClientProgress::NodeReady { .. } | ClientProgress::NodeRefused(..) => {
                return Err(p::ProtoError::Malformed("a storage-node answer to a plain handshake").into())
            }
            // Only a `ClientHandshake::probe` reports it; this one opens its export.
            ClientProgress::Info { .. } => {
                return Err(p::ProtoError::Malformed("a probe's answer to a handshake that opens its export").into())
            }
            ClientProgress::NeedMore => {
                let mut chunk = [0u8; 4096];
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Err(ClientError::Closed);
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

/// A server's refusal of an option, said as what it means and what to do about it: the bare numbers read
/// as `server refused option 7: reply 0x80000006 ()`, with nothing naming the export (servers such as
/// nbdkit and qemu-nbd may send no message). A refusal of NBD_OPT_STARTTLS, or of the export for want of
/// TLS, is [`ClientError::Tls`]; any other is [`ClientError::Refused`], the option and reply by name.
fn refusal(e: ClientError, export: &str) -> ClientError {
    let ClientError::Proto(p::ProtoError::OptionRefused { option, reply, message }) = &e else { return e };
    let said = if message.is_empty() { String::new() } else { format!(" (the server says: {message})") };
    let (option, reply) = (*option, *reply);
    if option == p::OPT_STARTTLS {
        return ClientError::Tls(format!(
            "the server does not offer STARTTLS: it refused NBD_OPT_STARTTLS with {}{said}; drop --tls-ca/--tls-psk-file, or give the server a [tls] section",
            reply_name(reply)
        ));
    }
    if reply == p::REP_ERR_TLS_REQD {
        return ClientError::Tls(format!(
            "the server requires TLS: give --tls-ca or --tls-psk-file (it refused option {} with NBD_REP_ERR_TLS_REQD{said})",
            option_name(option)
        ));
    }
    let what = match (option, reply) {
        (p::OPT_GO, p::REP_ERR_UNKNOWN) => {
            format!("the server has no export named {export:?}")
        }
        (p::OPT_GO, p::REP_ERR_POLICY) => {
            format!("the server refuses this client the export {export:?} (its access policy)")
        }
        (p::OPT_GO, p::REP_ERR_SHUTDOWN) => "the server is shutting down".to_string(),
        _ => format!("the server refused a step of the handshake the client needs (export {export:?})"),
    };
    ClientError::Refused(format!("{what}: it refused {} with {}{said}", option_name(option), reply_name(reply)))
}

/// An option's name (its number if unknown).
fn option_name(option: u32) -> String {
    match option {
        p::OPT_EXPORT_NAME => "NBD_OPT_EXPORT_NAME".into(),
        p::OPT_STARTTLS => "NBD_OPT_STARTTLS".into(),
        p::OPT_INFO => "NBD_OPT_INFO".into(),
        p::OPT_GO => "NBD_OPT_GO".into(),
        p::OPT_STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY".into(),
        o => format!("{o}"),
    }
}

/// An error reply's name (its number if unknown).
fn reply_name(reply: u32) -> String {
    match reply {
        p::REP_ERR_UNSUP => "NBD_REP_ERR_UNSUP".into(),
        p::REP_ERR_POLICY => "NBD_REP_ERR_POLICY".into(),
        p::REP_ERR_INVALID => "NBD_REP_ERR_INVALID".into(),
        p::REP_ERR_TLS_REQD => "NBD_REP_ERR_TLS_REQD".into(),
        p::REP_ERR_UNKNOWN => "NBD_REP_ERR_UNKNOWN".into(),
        p::REP_ERR_SHUTDOWN => "NBD_REP_ERR_SHUTDOWN".into(),
        r => format!("{r:#x}"),
    }
}

/// A connected, negotiated NBD client.
pub struct NbdClient {
    writer: tokio::sync::Mutex<Writer>,
    pending: Pending,
    slots: Semaphore,
    /// The server answered NBD_ESHUTDOWN: the connection is broken for new requests (`broken`), and the
    /// last request in flight to end sends the soft disconnect.
    server_shutdown: AtomicBool,
    /// The soft disconnect was sent.
    disc_sent: AtomicBool,
    /// The export's size in bytes, as the handshake announced it.
    pub size: u64,
    /// The export's transmission flags from the handshake (`NBD_FLAG_*`: read-only, flush, FUA, trim,
    /// ...).
    pub flags: u16,
    /// The server's size constraints (NBD_INFO_BLOCK_SIZE; [`p::BlockSize::DEFAULT`] if it advertised
    /// none): READ and WRITE lengths are multiples of `min` and at most `max`.
    pub block: p::BlockSize,
    /// Set with [`Shared::broken`], read without the lock ([`NbdClient::is_broken`]).
    dead: Arc<AtomicBool>,
}

impl NbdClient {
    /// Connects to `addr` and negotiates `export` (fixed newstyle, asking for structured replies), then
    /// starts the task that reads replies. Errors: [`ClientError::Io`] from the socket,
    /// [`ClientError::Refused`] for an unknown export (or another refused option), [`ClientError::Proto`]
    /// for a handshake that breaks the protocol, [`ClientError::Closed`]
    /// if the server hangs up during it.
    pub async fn connect(addr: SocketAddr, export: &str) -> Result<Arc<NbdClient>, ClientError> {
        NbdClient::connect_with(addr, export, None).await
    }

    /// [`NbdClient::connect`], over TLS when `tls` gives a client context and the name the server's
    /// certificate must carry: NBD_OPT_STARTTLS first, and no plain session if the server refuses it
    /// ([`ClientError::Proto`]) or the TLS handshake fails ([`ClientError::Tls`]).
    pub async fn connect_with(
        addr: SocketAddr,
        export: &str,
        tls: Option<(&TlsClient, &str)>,
    ) -> Result<Arc<NbdClient>, ClientError> {
        NbdClient::connect_within(addr, export, tls, CONNECT_TIMEOUT).await
    }

    /// [`NbdClient::connect_with`], all of it (TCP, the NBD handshake, TLS) within `deadline`, else
    /// [`ClientError::Timeout`].
    pub async fn connect_within(
        addr: SocketAddr,
        export: &str,
        tls: Option<(&TlsClient, &str)>,
        deadline: Duration,
    ) -> Result<Arc<NbdClient>, ClientError> {
        match tokio::time::timeout(deadline, NbdClient::open(addr, export, tls)).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout(deadline)),
        }
    }

    /// Connects and negotiates, without a deadline ([`NbdClient::connect_within`] gives it one).
    async fn open(
        addr: SocketAddr,
        export: &str,
        tls: Option<(&TlsClient, &str)>,
    ) -> Result<Arc<NbdClient>, ClientError> {
        let mut tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let mut hs = ClientHandshake::new(export, true);
        if tls.is_some() {
            hs = hs.require_tls();
        }
        let mut buf = Vec::new();
        let dead = Arc::new(AtomicBool::new(false));
        let (wr, (size, flags, _, block), pending) =
            match negotiate(&mut tcp, &mut hs, &mut buf).await.map_err(|e| refusal(e, export))? {
                Negotiated::Ready(n) => {
                    // The plain path keeps the socket's own halves (no lock, no indirection).
                    let (rd, wr) = tcp.into_split();
                    (Writer::Plain(wr), n, spawn_reader(rd, buf, n.2, dead.clone()))
                }
                Negotiated::StartTls => {
                    let (client, name) = tls.expect("STARTTLS is asked for only with TLS");
                    let mut stream = client.connect(name, tcp).await.map_err(|e| ClientError::Tls(e.to_string()))?;
                    hs.tls_established()?;
                    let Negotiated::Ready(n) =
                        negotiate(&mut stream, &mut hs, &mut buf).await.map_err(|e| refusal(e, export))?
                    else {
                        return Err(p::ProtoError::Malformed("a second NBD_OPT_STARTTLS").into());
                    };
                    let (rd, wr) = tokio::io::split(stream);
                    (Writer::Tls(wr), n, spawn_reader(rd, buf, n.2, dead.clone()))
                }
            };
        Ok(Arc::new(NbdClient {
            writer: tokio::sync::Mutex::new(wr),
            pending,
            slots: Semaphore::new(MAX_IN_FLIGHT),
            server_shutdown: AtomicBool::new(false),
            disc_sent: AtomicBool::new(false),
            size,
            flags,
            block,
            dead,
        }))
    }

    /// Whether the connection broke ([`NbdClient::broken`] says why), without taking a lock.
    pub fn is_broken(&self) -> bool {
        self.dead.load(Relaxed)
    }

    /// Why the connection broke, if it did ([`ClientError::Closed`] or [`ClientError::Broken`] with the
    /// reason): every request now fails at once with it.
    pub fn broken(&self) -> Option<ClientError> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).broken.as_ref().map(copy_end)
    }

    /// Sends one request and waits for its reply (read data for READ).
    pub async fn request(
        &self,
        command: Command,
        offset: u64,
        length: u32,
        payload: &[u8],
        fua: bool,
    ) -> Result<Vec<u8>, ClientError> {
        let _slot = self.slots.acquire().await.map_err(|_| ClientError::Closed)?;
        let (tx, rx) = oneshot::channel();
        let header = {
            let mut g = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(end) = &g.broken {
                // Nobody would answer it: the reader has stopped, or the server answered NBD_ESHUTDOWN
                // (the spec: a client then sends only its soft disconnect).
                return Err(copy_end(end));
            }
            // Handles are taken under the lock, so the protocol state sees them one after another and can
            // name a second reply to one as such (rein-proto's `StrayReply`).
            let handle = g.next;
            g.next += 1;
            let flags = if fua { p::CMD_FLAG_FUA } else { 0 };
            let header = RequestHeader { flags, command, handle, offset, length };
            g.proto.sent(&header)?;
            g.waiters.insert(handle, tx);
            header
        };
        let handle = header.handle;
        // The header alone is this request's own memory while it waits for the writer: the payload is
        // the caller's (shared by every write of a `rein load` job; a copy per request once held
        // outstanding x size, 4.2 GB for 128 writes of 32 MiB to a server that did not read).
        let mut head = Vec::with_capacity(p::REQUEST_LEN);
        header.encode(&mut head);
        let written = {
            let mut w = self.writer.lock().await;
            w.write_all(&[&head, payload]).await
        };
        if let Err(e) = written {
            // Not sent whole: nobody waits for it, and a reply naming it is the server's error. The stream
            // is cut mid-request, so the connection is broken for every later request too.
            let mut g = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            g.proto.forget(handle);
            g.waiters.remove(&handle);
            g.broken.get_or_insert_with(|| ClientError::Broken(format!("sending a request failed: {e}")));
            self.dead.store(true, Relaxed);
            return Err(e.into());
        }
        let result = rx.await.map_err(|_| ClientError::Closed)?;
        if matches!(result, Err(ClientError::Errno(p::ESHUTDOWN))) {
            // The connection is over for new requests: broken, so that a caller stops sending on it
            // (`rein load` replaced each request that failed at once, unsent, and spun a CPU on it).
            let mut g = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            g.broken.get_or_insert_with(|| ClientError::Broken(SHUTTING_DOWN.into()));
            drop(g);
            self.server_shutdown.store(true, Relaxed);
            self.dead.store(true, Relaxed);
        }
        if self.server_shutdown.load(Relaxed) {
            // The server is shutting down: once nothing is in flight, disconnect softly (once), as the
            // spec asks of a client that received NBD_ESHUTDOWN.
            let idle = self.pending.lock().unwrap_or_else(|e| e.into_inner()).proto.outstanding() == 0;
            if idle {
                self.disconnect().await;
            }
        }
        result
    }

    /// Sends `NBD_CMD_DISC` (once) and closes the sending side; errors are ignored (the server may be gone).
    /// Requests still in flight get their replies if the server sends them before closing, else
    /// [`ClientError::Closed`].
    pub async fn disconnect(&self) {
        if self.disc_sent.swap(true, Relaxed) {
            return; // once (also after a server's NBD_ESHUTDOWN)
        }
        let mut msg = Vec::new();
        RequestHeader { flags: 0, command: Command::Disc, handle: 0, offset: 0, length: 0 }.encode(&mut msg);
        let mut w = self.writer.lock().await;
        let _ = w.write_all(&[&msg]).await;
        let _ = w.shutdown().await;
    }
}

/// Reads replies until the connection ends: its reason ([`ClientError::Closed`] when the server closed
/// it between replies).
async fn reader<R: AsyncRead + Unpin>(rd: &mut R, mut buf: Vec<u8>, pending: &Pending) -> ClientError {
    let mut start = 0;
    loop {
        // One lock per event: the decode, and for a reply its waiter.
        let (event, waiter) = {
            let mut g = pending.lock().unwrap_or_else(|e| e.into_inner());
            let event = g.proto.decode(&buf[start..]);
            let waiter = match &event {
                Ok(ClientEvent::Reply { handle, .. }) => g.waiters.remove(handle),
                _ => None,
            };
            (event, waiter)
        };
        match event {
            Err(e) => return e.into(),
            Ok(ClientEvent::Chunk { used }) => start += used,
            Ok(ClientEvent::Reply { used, reply, .. }) => {
                start += used;
                if let Some(tx) = waiter {
                    let _ = tx.send(reply.map_err(ClientError::Errno));
                }
            }
            Ok(ClientEvent::NeedMore { wanted }) => {
                buf.drain(..start);
                start = 0;
                // `wanted` is bounded by the request the reply answers (rein-proto's invariant 2).
                let need = wanted.saturating_sub(buf.len()).max(4096);
                buf.reserve(need.min(1 << 20));
                match rd.read_buf(&mut buf).await {
                    Ok(0) if buf.is_empty() => return ClientError::Closed,
                    Ok(0) => return ClientError::Broken("the server closed the connection within a reply".into()),
                    Ok(_) => {}
                    Err(e) => return e.into(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_proto::nbd::Reason;
    use rein_proto::nbd::{Event, Rejection};

    /// After a reply with NBD_ESHUTDOWN the client sends nothing but its soft disconnect (the spec: "If
    /// the client receives an `NBD_ESHUTDOWN` error it MUST initiate a soft disconnect"), once its other
    /// requests are answered; later requests fail at once without being sent.
    #[tokio::test]
    async fn after_eshutdown_the_client_sends_only_its_disconnect() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, mut machine, mut buf) = crate::testkit::accept_v(&listener).await.expect("a handshake");
            // Every request gets ESHUTDOWN; what the client sends is recorded until it closes.
            machine.shut_down();
            let mut events = Vec::new();
            loop {
                let (used, event) = machine.feed(&buf).unwrap();
                // (reply to send, whether the client disconnected); None: more input needed.
                let step = match event {
                    Event::NeedMore { .. } => None,
                    Event::Reject(r @ Rejection { reason: Reason::ShuttingDown, .. }) => {
                        let mut reply = Vec::new();
                        machine.replies().rejection(&mut reply, &r);
                        Some((reply, false))
                    }
                    Event::Disconnect => Some((Vec::new(), true)),
                    other => panic!("unexpected {other:?}"),
                };
                buf.drain(..used);
                match step {
                    None => {
                        if s.read_buf(&mut buf).await.unwrap() == 0 {
                            return events;
                        }
                    }
                    Some((_, true)) => {
                        events.push("disc");
                        return events;
                    }
                    Some((reply, false)) => {
                        s.write_all(&reply).await.unwrap();
                        events.push("rejected");
                    }
                }
            }
        });
        let c = NbdClient::connect(addr, "v").await.unwrap();
        let first = c.request(Command::Read, 0, 4096, &[], false).await;
        assert!(matches!(first, Err(ClientError::Errno(p::ESHUTDOWN))), "{first:?}");
        let second = c.request(Command::Read, 0, 4096, &[], false).await;
        assert!(matches!(&second, Err(ClientError::Broken(m)) if m == SHUTTING_DOWN), "not sent: {second:?}");
        assert!(c.is_broken(), "the connection is over for new requests");
        c.disconnect().await; // a second DISC is not sent
        let events = tokio::time::timeout(std::time::Duration::from_secs(10), server).await.unwrap().unwrap();
        assert_eq!(events, vec!["rejected", "disc"], "one request, then the soft disconnect");
    }

    /// A server that refuses NBD_OPT_GO with `reply` and `message` (as nbdkit and qemu-nbd may, without
    /// a message), after acknowledging structured replies; on 127.0.0.223.
    async fn refusing_go(reply: u32, message: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.223:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut greeting = p::NBDMAGIC.to_be_bytes().to_vec();
            greeting.extend_from_slice(&p::IHAVEOPT.to_be_bytes());
            greeting.extend_from_slice(&(p::FLAG_FIXED_NEWSTYLE | p::FLAG_NO_ZEROES).to_be_bytes());
            s.write_all(&greeting).await.unwrap();
            let mut flags = [0u8; 4];
            s.read_exact(&mut flags).await.unwrap();
            loop {
                let mut head = [0u8; 16];
                if s.read_exact(&mut head).await.is_err() {
                    return;
                }
                let option = u32::from_be_bytes(head[8..12].try_into().unwrap());
                let mut data = vec![0u8; u32::from_be_bytes(head[12..16].try_into().unwrap()) as usize];
                s.read_exact(&mut data).await.unwrap();
                let mut out = Vec::new();
                if option == p::OPT_GO {
                    p::option_reply(&mut out, option, reply, message.as_bytes());
                } else {
                    p::option_reply(&mut out, option, p::REP_ACK, &[]);
                }
                s.write_all(&out).await.unwrap();
            }
        });
        (addr, server)
    }

    /// A refused export is said as what it means, the option and reply by name: it read `server refused
    /// option 7: reply 0x80000006 ()` from a server that gives no message.
    #[tokio::test]
    async fn a_refused_export_is_named_with_what_the_refusal_means() {
        let (addr, server) = refusing_go(p::REP_ERR_UNKNOWN, "").await;
        let e = NbdClient::connect(addr, "nope").await.err().expect("no such export");
        assert!(matches!(e, ClientError::Refused(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "the server has no export named \"nope\": it refused NBD_OPT_GO with NBD_REP_ERR_UNKNOWN"
        );
        server.abort();
        let (addr, server) = refusing_go(p::REP_ERR_POLICY, "not for you").await;
        let e = NbdClient::connect(addr, "v").await.err().expect("refused");
        assert_eq!(
            e.to_string(),
            "the server refuses this client the export \"v\" (its access policy): it refused NBD_OPT_GO with \
             NBD_REP_ERR_POLICY (the server says: not for you)"
        );
        server.abort();
    }

    /// A server that accepts and never writes: connecting fails at its deadline (it waited for the
    /// greeting for good).
    #[tokio::test]
    async fn connecting_to_a_silent_server_fails_at_the_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.200:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = tokio::spawn(async move { listener.accept().await.map(|(s, _)| s) });
        let deadline = std::time::Duration::from_millis(300);
        let r = tokio::time::timeout(deadline * 20, NbdClient::connect_within(addr, "v", None, deadline)).await;
        let e = r.expect("the connect ends at its deadline").err().expect("no server answered");
        assert!(matches!(e, ClientError::Timeout(d) if d == deadline), "{e:?}");
        assert!(e.to_string().contains("no answer within 0.3 s"), "{e}");
        held.abort();
    }

    /// A server that answers a request twice breaks the connection, and the reason names the reply for
    /// what it is (it read "reply for a handle not sent"): the client's handles follow each other, so the
    /// protocol state knows the handle was answered already.
    #[tokio::test]
    async fn a_second_reply_is_named_as_such() {
        let listener = tokio::net::TcpListener::bind("127.0.0.201:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, mut machine, mut buf) = crate::testkit::accept_v(&listener).await.unwrap();
            for _ in 0..2 {
                let r = crate::testkit::next_request(&mut s, &mut machine, &mut buf).await.unwrap();
                let mut reply = Vec::new();
                p::simple_reply(&mut reply, r.handle, 0);
                // The second request's reply goes twice.
                s.write_all(&reply).await.unwrap();
                if r.handle == 2 {
                    s.write_all(&reply).await.unwrap();
                }
            }
            // Open until the test ends.
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        });
        let c = NbdClient::connect(addr, "v").await.unwrap();
        for _ in 0..2 {
            c.request(Command::Flush, 0, 0, &[], false).await.unwrap();
        }
        let start = std::time::Instant::now();
        while !c.is_broken() {
            assert!(start.elapsed() < std::time::Duration::from_secs(10), "the reader stops");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let why = c.broken().unwrap().to_string();
        assert_eq!(why, "connection broke: protocol: a second reply for handle 2, already answered");
        server.abort();
    }

    /// After the connection broke, a request fails at once with the connection's reason, unsent (it was
    /// written and waited for an answer no one would give: the reader had stopped).
    #[tokio::test]
    async fn a_request_after_the_connection_broke_fails_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.200:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let info = crate::testkit::export_v();
            crate::testkit::serve_handshake(&mut s, &info, None).await.expect("a handshake");
            // A reply with a bad magic breaks the protocol; then silence, the socket open.
            s.write_all(&[0xff; 16]).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            drop(s);
        });
        let c = NbdClient::connect(addr, "v").await.unwrap();
        let start = std::time::Instant::now();
        while !c.is_broken() {
            assert!(start.elapsed() < std::time::Duration::from_secs(10), "the reader stops");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), c.request(Command::Read, 0, 4096, &[], false))
            .await
            .expect("a request on a broken connection fails at once");
        let e = r.expect_err("nobody answers it");
        assert!(matches!(&e, ClientError::Broken(m) if !m.is_empty()), "{e:?}");
        assert_eq!(c.broken().map(|b| b.to_string()), Some(e.to_string()));
        server.abort();
    }
}
