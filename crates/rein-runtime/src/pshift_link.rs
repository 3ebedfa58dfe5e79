//! A pShift server's link to its controller: `rein serve` with a `[pshift]` table (docs/pshift-daemons.md),
//! and the frame IO both sides use.
//!
//! # Model
//! The server's dispatcher runs pShift's token scheduler (`scheduler = "token"`) and rein-core's
//! `TokenServer` ([`crate::dispatch::Dispatcher::pshift_attach`]). This link connects to the controller
//! (over TLS with `[pshift.tls]`: the handshake within the connect timeout, never falling back to plain),
//! says hello with the server's name, and takes the welcome: its index and the bucket names, which it
//! maps to the server's tenants of the same names (a bucket without a tenant here has no demand here; a
//! tenant that is no bucket is served in the round robin's L class, unlimited). Then it answers each
//! report request with the dispatcher's report, hands each token message to the dispatcher, and sends the
//! dispatcher's stray-arrival notes. Before a boundary's report it maps the tenants created or deleted
//! since ([`crate::dispatch::Dispatcher::pshift_map`]), so a tenant created at run time is its bucket
//! from the next boundary on, without a reconnect. When the link breaks the buckets go back to plain round robin and the
//! link reconnects (100 ms, doubling to 5 s); a refusal (an unknown name) is logged once and retried at
//! the longest backoff.
//!
//! # Invariants
//! 1. Tokens are applied only from the controller that welcomed this connection, and only those for this
//!    server's index.
//! 2. Frames in are bounded by rein-proto's [`rein_proto::pshift::MAX_BODY`]; the buffer holds at most one
//!    frame and one read beyond it.

use crate::dispatch::{Dispatcher, PshiftAttach};
use rein_core::TenantId;
use rein_proto::pshift::{self as wire, Message};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The longest wait between two connection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A connection attempt (and the welcome) must complete within this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads one frame (`buf` keeps what was read beyond it). Cancel-safe: dropped before it completes, it
/// leaves in `buf` every byte it read, for the next call. Errors: the peer closed, the socket failed, or
/// the frame is bad (the message names the field).
pub async fn read_frame<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut Vec<u8>) -> Result<Message, String> {
    read_frame_within(rd, buf, wire::MAX_BODY).await
}

/// [`read_frame`] with a tighter bound on the body: a frame whose header announces more than `max_body`
/// bytes is refused before its body is read (a peer's hello is small; a server's report holds at most a
/// line per bucket).
pub async fn read_frame_within<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut Vec<u8>,
    max_body: usize,
) -> Result<Message, String> {
    loop {
        let want = wire::frame_len(buf).map_err(|e| format!("bad pShift frame: {e}"))?;
        if let Some(n) = want.filter(|&n| n > wire::HEADER_BYTES + max_body) {
            return Err(format!(
                "a pShift frame of {} body bytes exceeds this connection's bound of {max_body}",
                n - wire::HEADER_BYTES
            ));
        }
        if let Some((m, used)) = wire::decode(buf).map_err(|e| format!("bad pShift frame: {e}"))? {
            buf.drain(..used);
            return Ok(m);
        }
        // Read what the frame still needs (the header first), at most 64 KiB at a time. `read_buf` appends
        // only what it read, so a read cancelled by a `select!` (the link also waits for stray notes)
        // leaves `buf` as it was.
        let want = want.unwrap_or(wire::HEADER_BYTES);
        let chunk = want.saturating_sub(buf.len()).clamp(1, 64 << 10);
        buf.reserve(chunk);
        let n = (&mut *rd).take(chunk as u64).read_buf(buf).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("the peer closed the connection".into());
        }
    }
}

/// Writes one frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(wr: &mut W, m: &Message) -> Result<(), String> {
    let mut out = Vec::new();
    wire::encode(m, &mut out).map_err(|e| format!("encoding a {}: {e}", m.name()))?;
    wr.write_all(&out).await.map_err(|e| format!("write: {e}"))
}

/// The validated `[pshift]` table of rein serve.
#[derive(Debug, Clone)]
pub struct LinkSettings {
    /// The controller's address.
    pub controller: SocketAddr,
    /// This server's name in the controller's configuration.
    pub name: String,
    /// TLS to the controller (`[pshift.tls]`): the client context and the name its certificate must
    /// carry (x509; unused with PSK).
    pub tls: Option<(crate::tls::TlsClient, String)>,
}

/// A link's byte stream: plain TCP or TLS over it.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}
/// A boxed [`Io`].
pub type Stream = Box<dyn Io>;

/// Runs the link until the dispatcher stops: `tenants` gives the server's tenants by name at each welcome.
pub async fn run(
    s: LinkSettings,
    dispatcher: Dispatcher,
    tenants: impl Fn() -> Vec<(String, TenantId)> + Send + 'static,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut last_error = String::new();
    loop {
        let r = tokio::select! {
            r = session(&s, &dispatcher, &tenants) => r,
            _ = stop.wait_for(|x| *x) => return,
        };
        dispatcher.pshift_detach().await;
        let (e, wait) = match r {
            Ok(()) => ("the controller closed the connection".to_string(), Duration::from_millis(100)),
            Err(Failure::Refused(e)) => (e, MAX_BACKOFF),
            Err(Failure::Broken(e, reached)) => {
                if reached {
                    backoff = Duration::from_millis(100);
                }
                (e, backoff)
            }
        };
        if e != last_error {
            tracing::warn!(controller = %s.controller, "pShift link: {e}; serving plain round robin until it answers");
            last_error = e;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|x| *x) => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The server's tenants that are buckets (tenant, bucket number), and the names of those that are not.
fn resolve<'a>(buckets: &[String], here: &'a [(String, TenantId)]) -> (Vec<(TenantId, u32)>, Vec<&'a str>) {
    let mapped = (buckets.iter().enumerate())
        .filter_map(|(b, name)| here.iter().find(|(n, _)| n == name).map(|(_, id)| (*id, b as u32)))
        .collect();
    let strangers = here.iter().filter(|(n, _)| !buckets.contains(n)).map(|(n, _)| n.as_str()).collect();
    (mapped, strangers)
}

enum Failure {
    /// The controller refused this server.
    Refused(String),
    /// The connection failed; whether it had been welcomed.
    Broken(String, bool),
}

async fn session(
    s: &LinkSettings,
    dispatcher: &Dispatcher,
    tenants: &(impl Fn() -> Vec<(String, TenantId)> + Send),
) -> Result<(), Failure> {
    let broken = |e: String| Failure::Broken(e, false);
    let sock = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(s.controller))
        .await
        .map_err(|_| broken(format!("no connection within {} s", CONNECT_TIMEOUT.as_secs())))?
        .map_err(|e| broken(format!("connect: {e}")))?;
    let _ = sock.set_nodelay(true);
    let stream: Stream = match &s.tls {
        None => Box::new(sock),
        Some((client, name)) => Box::new(
            tokio::time::timeout(CONNECT_TIMEOUT, client.connect(name, sock))
                .await
                .map_err(|_| broken(format!("no TLS handshake within {} s", CONNECT_TIMEOUT.as_secs())))?
                .map_err(|e| broken(format!("TLS handshake: {e}")))?,
        ),
    };
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut buf = Vec::new();
    write_frame(&mut wr, &Message::Hello { name: s.name.clone() }).await.map_err(broken)?;
    let first = tokio::time::timeout(CONNECT_TIMEOUT, read_frame(&mut rd, &mut buf))
        .await
        .map_err(|_| broken(format!("no welcome within {} s", CONNECT_TIMEOUT.as_secs())))?
        .map_err(broken)?;
    let (index, strays, names) = match first {
        Message::Welcome { server, strays, buckets } => (server, strays, buckets),
        Message::Refuse { reason } => {
            return Err(Failure::Refused(format!("the controller refused this server: {reason}")))
        }
        other => return Err(broken(format!("expected a welcome, got a {}", other.name()))),
    };
    let mut here = tenants();
    let (buckets, strangers) = resolve(&names, &here);
    if !strangers.is_empty() {
        tracing::warn!(tenants = ?strangers, "pShift: tenants that are no bucket of the controller's (served unlimited in the round robin)");
    }
    let (stray_tx, mut stray_rx) = mpsc::unbounded_channel();
    let mapped = buckets.len();
    let mut current = buckets.clone();
    dispatcher
        .pshift_attach(PshiftAttach { server: index, strays, buckets, strays_to: stray_tx })
        .await
        .map_err(|e| Failure::Refused(format!("pShift link: {e}")))?;
    tracing::info!(controller = %s.controller, index, buckets = mapped, "pShift link: welcomed by the controller");
    let welcomed = |e: String| Failure::Broken(e, true);
    loop {
        tokio::select! {
            f = read_frame(&mut rd, &mut buf) => match f.map_err(welcomed)? {
                Message::ReportRequest { round, early } => {
                    // Tenants created or deleted since: a boundary's report covers the buckets of now.
                    let now_here = if early == 0 { tenants() } else { Vec::new() };
                    if early == 0 && now_here != here {
                        let (buckets, strangers) = resolve(&names, &now_here);
                        for (id, b) in buckets.iter().filter(|x| !current.contains(x)) {
                            tracing::info!(bucket = %names[*b as usize], tenant = ?id, "pShift: a tenant created since the welcome is this bucket here now");
                        }
                        let new_strangers: Vec<&str> =
                            strangers.into_iter().filter(|n| !here.iter().any(|(h, _)| h == n)).collect();
                        if !new_strangers.is_empty() {
                            tracing::warn!(tenants = ?new_strangers, "pShift: tenants that are no bucket of the controller's (served unlimited in the round robin)");
                        }
                        if buckets != current {
                            dispatcher.pshift_map(buckets.clone()).await;
                            current = buckets;
                        }
                        here = now_here;
                    }
                    let r = dispatcher.pshift_report(round, early).await.map_err(welcomed)?;
                    write_frame(&mut wr, &Message::Report(r)).await.map_err(welcomed)?;
                }
                Message::Tokens(m) if m.server == index => dispatcher.pshift_tokens(m).await,
                other => return Err(welcomed(format!("unexpected {} from the controller", other.name()))),
            },
            Some(note) = stray_rx.recv() => {
                write_frame(&mut wr, &Message::Stray(note)).await.map_err(welcomed)?;
            }
        }
    }
}
