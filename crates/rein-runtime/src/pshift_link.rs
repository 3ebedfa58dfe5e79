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
//! dispatcher's stray-arrival notes. Every [`PING_EVERY`] it pings the controller, whose answer carries
//! its clock and next boundary: the link places that boundary on the dispatcher's clock
//! ([`ClockOffset`]) and the dispatcher cuts the report there, so a report covers the interval up to the
//! boundary, not up to the request's arrival (0.5-2.8 ms later on a busy machine). Before a boundary's
//! report it maps the tenants created or deleted since ([`crate::dispatch::Dispatcher::pshift_map`]), so
//! a tenant created at run time is its bucket from the next boundary on, without a reconnect. When the
//! link breaks the buckets go back to plain round robin and the link reconnects (100 ms, doubling to
//! 5 s; the wait starts again from 100 ms only after a welcomed session that lasted [`STABLE_SESSION`]:
//! a controller that welcomed the server and then broke every session at once, closing it or sending a
//! pong the link refuses, was reconnected to 10 times a second for good, with a welcome logged each
//! time, where it is now retried as one that refuses connections); a refusal (an unknown name, or the name of a server connected already) is logged once and retried at the longest backoff. A controller
//! that sends no frame for [`SILENCE_TIMEOUT`] (it answers a ping every [`PING_EVERY`]), or takes none
//! within it, breaks the link too: a hung or stopped controller does not keep its last tokens in force
//! (a limited bucket whose L-tokens ran out was served nothing) until the TCP connection dies. A ping
//! tick more than `crate::STALLED` late means this process did not run: the controller gets its
//! [`SILENCE_TIMEOUT`] again (what it sent meanwhile is read first). A pong's schedule is checked
//! before the dispatcher gets it: an interval below [`MIN_INTERVAL_NS`] or a next boundary more than
//! [`MAX_LATE_INTERVALS`] intervals before the controller's clock breaks the link (the dispatcher cuts
//! a report at every boundary it is behind, one per turn of its loop: with a 1 ns interval it never
//! caught up and kept a core busy).
//!
//! Whether the link is up shows on the server's `/metrics` ([`LinkStatus`]:
//! `rein_pshift_controller_connected`, 1 from the controller's welcome until the link breaks), so that an
//! operator can alert on a server that serves plain round robin because it lost its controller; before,
//! only its log said so.
//!
//! # Invariants
//! 1. Tokens are applied only from the controller that welcomed this connection, and only those for this
//!    server's index.
//! 2. Frames in are bounded by rein-proto's [`rein_proto::pshift::MAX_WELCOME_BODY`] until the welcome
//!    (16 MiB: what a controller's welcome can need; the constant says how), and after
//!    it by a token message's size for the welcome's buckets ([`rein_proto::pshift::controller_body_max`]:
//!    a frame announcing more is refused from its header, before its body is read); the buffer holds at
//!    most one frame and one read beyond it.

use crate::dispatch::{Cut, Dispatcher, PshiftAttach};
use rein_core::TenantId;
use rein_proto::pshift::{self as wire, Message};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// How often the link pings the controller for its clock and schedule.
pub const PING_EVERY: Duration = Duration::from_millis(100);
/// Pings whose round trips are kept: the offset comes from the shortest of them.
const OFFSET_SAMPLES: usize = 16;

/// The controller's clock against this server's, from ping exchanges (NTP's estimate): a ping sent at
/// `t0` and answered at `t2` (this clock) with the controller's `t1` puts the controller's clock at
/// `t1 - (t0 + t2) / 2` ahead, within half the round trip; the exchange with the shortest round trip of
/// the last few is taken (the others waited somewhere).
#[derive(Debug, Default)]
pub struct ClockOffset {
    /// (round trip, offset), newest last.
    samples: std::collections::VecDeque<(u64, i128)>,
}

impl ClockOffset {
    /// Takes one exchange; returns the offset now taken (controller minus this clock, ns).
    pub fn sample(&mut self, t0: u64, t1: u64, t2: u64) -> Option<i128> {
        if t2 >= t0 {
            let sample = (t2 - t0, i128::from(t1) - (i128::from(t0) + i128::from(t2)) / 2);
            crate::bounded::push(&mut self.samples, sample, OFFSET_SAMPLES);
        }
        self.offset()
    }

    /// The offset of the shortest round trip kept.
    pub fn offset(&self) -> Option<i128> {
        self.samples.iter().min_by_key(|s| s.0).map(|s| s.1)
    }

    /// A time on the controller's clock on this one (0 if it falls before this clock's origin).
    pub fn local(&self, controller_ns: u64) -> Option<rein_core::Nanos> {
        let t = i128::from(controller_ns) - self.offset()?;
        Some(rein_core::Nanos(t.clamp(0, i128::from(u64::MAX)) as u64))
    }
}

/// The first wait before a connection attempt after the link broke (it doubles up to [`MAX_BACKOFF`]).
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two connection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A welcomed session that lasted this long starts the backoff again from [`MIN_BACKOFF`]; one that
/// ended sooner leaves it as it was (module comment).
pub const STABLE_SESSION: Duration = Duration::from_secs(1);
/// A connection attempt (and the welcome) must complete within this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest boundary interval a pong may state: a controller's shortest (`period_s` at least 1 ms
/// over at most 1,000 intervals). The dispatcher cuts a report at every boundary it is behind, one per
/// turn of its loop, so a shorter one would keep it cutting for good.
pub const MIN_INTERVAL_NS: u64 = 1_000;
/// How many intervals before the controller's own clock a pong's next boundary may lie (a controller
/// late to ask for a boundary's reports); further back, the dispatcher would cut a report for every
/// boundary since.
pub const MAX_LATE_INTERVALS: u64 = 16;

/// A welcomed link that reads no frame for this long (a live controller answers every ping, one each
/// [`PING_EVERY`]), or cannot write one within it (the controller does not read), is broken: the server
/// serves plain round robin and reconnects, rather than keep a gone controller's tokens for ever.
pub const SILENCE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a frame could not be read ([`read_frame`], [`read_frame_within`]).
#[derive(Debug, thiserror::Error)]
pub enum ReadFrameError {
    /// The header or the body is not a valid frame (the wire error names the field).
    #[error("bad pShift frame: {0}")]
    Bad(wire::WireError),
    /// The header announces a body over the connection's bound.
    #[error("a pShift frame of {body} body bytes exceeds this connection's bound of {max_body}")]
    TooLarge {
        /// The body's length as announced, bytes.
        body: usize,
        /// The connection's bound, bytes.
        max_body: usize,
    },
    /// The socket failed.
    #[error("read: {0}")]
    Read(std::io::Error),
    /// The peer closed the connection.
    #[error("the peer closed the connection")]
    Closed,
}

/// Why a frame could not be written ([`write_frame`]).
#[derive(Debug, thiserror::Error)]
pub enum WriteFrameError {
    /// The message does not encode (a field out of range; the wire error names it).
    #[error("encoding a {message}: {source}")]
    Encode {
        /// The message's name.
        message: &'static str,
        /// Why not.
        source: wire::WireError,
    },
    /// The socket failed.
    #[error("write: {0}")]
    Write(std::io::Error),
}

/// A pong's schedule the dispatcher is not given ([`check_schedule`]; module comment).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ScheduleError {
    /// A boundary interval under [`MIN_INTERVAL_NS`].
    #[error("a pong with a boundary interval of {interval_ns} ns (a controller's is at least {MIN_INTERVAL_NS} ns)")]
    Interval {
        /// The pong's interval, ns.
        interval_ns: u64,
    },
    /// A next boundary more than [`MAX_LATE_INTERVALS`] intervals before the controller's clock.
    #[error(
        "a pong whose next boundary ({next_ns} ns) is more than {MAX_LATE_INTERVALS} intervals before the \
         controller's clock ({t1} ns)"
    )]
    Late {
        /// The pong's next boundary, ns on the controller's clock.
        next_ns: u64,
        /// The controller's clock when it answered, ns.
        t1: u64,
    },
}

/// Reads one frame (`buf` keeps what was read beyond it). Cancel-safe: dropped before it completes, it
/// leaves in `buf` every byte it read, for the next call. Errors: the peer closed, the socket failed, or
/// the frame is bad (the message names the field).
pub async fn read_frame<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut Vec<u8>) -> Result<Message, ReadFrameError> {
    read_frame_within(rd, buf, wire::MAX_BODY).await
}

/// [`read_frame`] with a tighter bound on the body: a frame whose header announces more than `max_body`
/// bytes is refused before its body is read (a peer's hello is small; a server's report holds at most a
/// line per bucket).
pub async fn read_frame_within<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut Vec<u8>,
    max_body: usize,
) -> Result<Message, ReadFrameError> {
    loop {
        let want = wire::frame_len(buf).map_err(ReadFrameError::Bad)?;
        if let Some(n) = want.filter(|&n| n > wire::HEADER_BYTES + max_body) {
            return Err(ReadFrameError::TooLarge { body: n - wire::HEADER_BYTES, max_body });
        }
        if let Some((m, used)) = wire::decode(buf).map_err(ReadFrameError::Bad)? {
            buf.drain(..used);
            return Ok(m);
        }
        // Read what the frame still needs (the header first), at most 64 KiB at a time. `read_buf` appends
        // only what it read, so a read cancelled by a `select!` (the link also waits for stray notes)
        // leaves `buf` as it was.
        let want = want.unwrap_or(wire::HEADER_BYTES);
        let chunk = want.saturating_sub(buf.len()).clamp(1, 64 << 10);
        buf.reserve(chunk);
        let n = (&mut *rd).take(chunk as u64).read_buf(buf).await.map_err(ReadFrameError::Read)?;
        if n == 0 {
            return Err(ReadFrameError::Closed);
        }
    }
}

/// Writes one frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(wr: &mut W, m: &Message) -> Result<(), WriteFrameError> {
    let mut out = Vec::new();
    wire::encode(m, &mut out).map_err(|source| WriteFrameError::Encode { message: m.name(), source })?;
    wr.write_all(&out).await.map_err(WriteFrameError::Write)
}

/// [`write_frame`] within `timeout`. Errors: `None` when the frame did not go out in time (the peer does
/// not read), else [`write_frame`]'s.
pub async fn write_frame_within<W: AsyncWrite + Unpin>(
    wr: &mut W,
    m: &Message,
    timeout: Duration,
) -> Result<(), Option<WriteFrameError>> {
    match tokio::time::timeout(timeout, write_frame(wr, m)).await {
        Ok(r) => r.map_err(Some),
        Err(_) => Err(None),
    }
}

/// Whether a server's link to its controller is up, for `rein serve`'s `/metrics` (module comment): [`run`]
/// keeps it, the admin endpoint reads it.
#[derive(Debug)]
pub struct LinkStatus {
    /// The controller's address and this server's name in its configuration (the series' labels).
    controller: SocketAddr,
    name: String,
    /// Welcomed by the controller, and the link not broken since.
    connected: std::sync::atomic::AtomicBool,
}

impl LinkStatus {
    /// The status of the link `s` configures: not connected.
    pub fn new(s: &LinkSettings) -> LinkStatus {
        LinkStatus { controller: s.controller, name: s.name.clone(), connected: false.into() }
    }

    /// Whether the controller has welcomed the link and it is up (its tokens apply).
    pub fn connected(&self) -> bool {
        self.connected.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Marks the link up until the returned guard drops (the session ends: broken, refused or stopped).
    fn up(&self) -> LinkUp<'_> {
        self.connected.store(true, std::sync::atomic::Ordering::Relaxed);
        LinkUp(self)
    }

    /// `rein_pshift_controller_connected{controller, server}`: 1 while the link is up, 0 while the server
    /// connects, is refused or has lost the link (it serves plain round robin then).
    pub fn metrics(&self, o: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            o,
            "# HELP rein_pshift_controller_connected 1 while the pShift controller has welcomed this server and \
             the link is up (its tokens apply); 0 while the server connects, is refused, or has lost the link \
             (plain round robin: limits not enforced, reservations not shifted).\n\
             # TYPE rein_pshift_controller_connected gauge\n\
             rein_pshift_controller_connected{{controller=\"{}\",server=\"{}\"}} {}",
            self.controller,
            crate::prom::label(&self.name),
            u8::from(self.connected())
        );
    }
}

/// A welcomed session's mark on its [`LinkStatus`]: the link is down again when it drops.
struct LinkUp<'a>(&'a LinkStatus);

impl Drop for LinkUp<'_> {
    fn drop(&mut self) {
        self.0.connected.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The validated `[pshift]` table of rein serve.
#[derive(Debug, Clone)]
pub struct LinkSettings {
    /// The controller's address.
    pub controller: SocketAddr,
    /// This server's name in the controller's configuration.
    pub name: String,
    /// TLS to the controller (`[pshift.tls]`): the client context, as a reload replaces it for the next
    /// connection ([`crate::tls`], "Reload"), and the name its certificate must carry (x509; unused with
    /// PSK).
    pub tls: Option<(crate::tls::LiveTlsClient, String)>,
    /// How long the controller may take to answer the hello: [`CONNECT_TIMEOUT`] (a field so that a test
    /// need not wait that long).
    pub welcome_timeout: Duration,
}

/// A link's byte stream: plain TCP or TLS over it.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}
/// A boxed [`Io`].
pub type Stream = Box<dyn Io>;

/// Runs the link until the dispatcher stops: `tenants` gives the server's tenants by name at each welcome;
/// `status` says whether the link is up.
pub async fn run(
    s: LinkSettings,
    dispatcher: Dispatcher,
    tenants: impl Fn() -> Vec<(String, TenantId)> + Send + 'static,
    mut stop: tokio::sync::watch::Receiver<bool>,
    status: std::sync::Arc<LinkStatus>,
) {
    let mut backoff = MIN_BACKOFF;
    let mut last_error = String::new();
    loop {
        let r = tokio::select! {
            r = session(&s, &dispatcher, &tenants, &status) => r,
            _ = stop.wait_for(|x| *x) => return,
        };
        dispatcher.pshift_detach().await;
        let (e, wait) = match r {
            Ok(()) => (SessionError::Closed, backoff),
            Err(Failure::Refused(e)) => (e, MAX_BACKOFF),
            Err(Failure::Broken(e, welcomed)) => {
                // Only a session that lasted starts the backoff again: a controller that welcomes and then
                // breaks every session (closes it, or sends a pong the link refuses) was reconnected to
                // every 100 ms for good, a welcome logged each time (module comment).
                if welcomed.is_some_and(|at| at.elapsed() >= STABLE_SESSION) {
                    backoff = MIN_BACKOFF;
                }
                (e, backoff)
            }
        };
        // The same failure as the last is not logged again (compared by its text: an io error has no
        // equality).
        let e = e.to_string();
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

/// A pong's schedule, checked before the dispatcher is given it (module comment): the interval at least
/// [`MIN_INTERVAL_NS`], and the next boundary at most [`MAX_LATE_INTERVALS`] intervals before the
/// controller's clock `t1`.
fn check_schedule(t1: u64, next_ns: u64, interval_ns: u64) -> Result<(), ScheduleError> {
    if interval_ns < MIN_INTERVAL_NS {
        return Err(ScheduleError::Interval { interval_ns });
    }
    if next_ns.saturating_add(MAX_LATE_INTERVALS.saturating_mul(interval_ns)) < t1 {
        return Err(ScheduleError::Late { next_ns, t1 });
    }
    Ok(())
}

/// Logs tenants that are no bucket of the controller's, if any.
fn warn_strangers(strangers: &[&str]) {
    if !strangers.is_empty() {
        tracing::warn!(tenants = ?strangers, "pShift: tenants that are no bucket of the controller's (served unlimited in the round robin)");
    }
}

/// The server's tenants that are buckets (tenant, bucket number), and the names of those that are not.
/// By hash lookups: a welcome names up to a million buckets and a server may have thousands of tenants,
/// and this runs on a worker thread of the runtime that serves NBD (a scan of the tenants per bucket
/// took buckets x tenants comparisons: 0.60 s of that thread at 100,000 x 10,000, against 10 ms by hash,
/// release build, one run).
fn resolve<'a>(buckets: &[String], here: &'a [(String, TenantId)]) -> (Vec<(TenantId, u32)>, Vec<&'a str>) {
    let mut by_name: HashMap<&str, TenantId> = HashMap::with_capacity(here.len());
    for (n, id) in here {
        // The first tenant of a name, as a scan would find it.
        by_name.entry(n.as_str()).or_insert(*id);
    }
    let mapped = (buckets.iter().enumerate())
        .filter_map(|(b, name)| by_name.get(name.as_str()).map(|id| (*id, b as u32)))
        .collect();
    let named: HashSet<&str> = buckets.iter().map(String::as_str).collect();
    let strangers = here.iter().filter(|(n, _)| !named.contains(n.as_str())).map(|(n, _)| n.as_str()).collect();
    (mapped, strangers)
}

/// How a session ended ([`session`]): refused (the next attempt waits [`MAX_BACKOFF`]) or broken.
enum Failure {
    /// The controller (or the dispatcher, at the welcome) refused this server.
    Refused(SessionError),
    /// The connection failed; when it was welcomed, if it was.
    Broken(SessionError, Option<tokio::time::Instant>),
}

/// Why a session with the controller ended; [`run`] logs it as "pShift link: {this}; serving plain round
/// robin until it answers".
#[derive(Debug, thiserror::Error)]
enum SessionError {
    /// A session that ended without an error (as `run` words it).
    #[error("the controller closed the connection")]
    Closed,
    /// The TCP connection did not complete within [`CONNECT_TIMEOUT`].
    #[error("no connection within {} s", timeout.as_secs())]
    ConnectTimeout {
        /// The bound ([`CONNECT_TIMEOUT`]).
        timeout: Duration,
    },
    /// The TCP connection failed.
    #[error("connect: {0}")]
    Connect(#[source] std::io::Error),
    /// The TLS handshake did not complete within [`CONNECT_TIMEOUT`].
    #[error("no TLS handshake within {} s", timeout.as_secs())]
    TlsTimeout {
        /// The bound ([`CONNECT_TIMEOUT`]).
        timeout: Duration,
    },
    /// The TLS handshake failed.
    #[error("TLS handshake: {0}")]
    TlsHandshake(#[source] crate::tls::TlsError),
    /// A reload revoked the controller's certificate while the handshake ran (as `crate::tls` words it).
    #[error("TLS: {why}")]
    TlsRevoked {
        /// Why, as the TLS layer says it.
        why: String,
    },
    /// The hello could not be written.
    #[error(transparent)]
    Hello(WriteFrameError),
    /// No answer to the hello within the welcome timeout ([`LinkSettings::welcome_timeout`]).
    #[error("no welcome within {} s", timeout.as_secs_f64())]
    WelcomeTimeout {
        /// The bound.
        timeout: Duration,
    },
    /// The answer to the hello could not be read.
    #[error(transparent)]
    Welcome(ReadFrameError),
    /// The controller refused this server, with its reason (the controller's words, from the wire).
    #[error("the controller refused this server: {reason}")]
    Refused {
        /// The controller's reason.
        reason: String,
    },
    /// The hello was answered by a frame that is neither a welcome nor a refusal.
    #[error("expected a welcome, got a {got}")]
    NotWelcome {
        /// The frame's name ([`Message::name`]).
        got: &'static str,
    },
    /// The dispatcher refused the welcome (its scheduler is not the token scheduler, say).
    #[error(transparent)]
    Attach(crate::dispatch::PshiftError),
    /// A welcomed session read no frame within [`SILENCE_TIMEOUT`].
    #[error("no frame from the controller within {} s", timeout.as_secs())]
    Silent {
        /// The bound ([`SILENCE_TIMEOUT`]).
        timeout: Duration,
    },
    /// The controller did not take a frame within [`SILENCE_TIMEOUT`] (it does not read).
    #[error("the controller took no frame within {} s", timeout.as_secs())]
    NotRead {
        /// The bound ([`SILENCE_TIMEOUT`]).
        timeout: Duration,
    },
    /// A frame to the controller could not be written.
    #[error(transparent)]
    Write(WriteFrameError),
    /// A frame from the controller could not be read (bad, over the bound, the socket, closed).
    #[error(transparent)]
    Read(ReadFrameError),
    /// The dispatcher could not give the report asked for.
    #[error(transparent)]
    Report(crate::dispatch::PshiftError),
    /// A pong's schedule out of bounds ([`check_schedule`]).
    #[error(transparent)]
    Schedule(ScheduleError),
    /// A welcomed session got a frame a controller does not send.
    #[error("unexpected {got} from the controller")]
    Unexpected {
        /// The frame's name ([`Message::name`]).
        got: &'static str,
    },
}

async fn session(
    s: &LinkSettings,
    dispatcher: &Dispatcher,
    tenants: &(impl Fn() -> Vec<(String, TenantId)> + Send),
    status: &LinkStatus,
) -> Result<(), Failure> {
    let broken = |e: SessionError| Failure::Broken(e, None);
    let sock = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(s.controller))
        .await
        .map_err(|_| broken(SessionError::ConnectTimeout { timeout: CONNECT_TIMEOUT }))?
        .map_err(|e| broken(SessionError::Connect(e)))?;
    let _ = sock.set_nodelay(true);
    // Over TLS with a certificate, the link is listed while it lives, so that a reload whose
    // `[pshift.tls] crl` revokes the controller's certificate cuts it.
    let mut _registration = None;
    let stream: Stream = match &s.tls {
        None => Box::new(sock),
        Some((client, name)) => {
            let tls = tokio::time::timeout(CONNECT_TIMEOUT, client.get().connect(name, sock))
                .await
                .map_err(|_| broken(SessionError::TlsTimeout { timeout: CONNECT_TIMEOUT }))?
                .map_err(|e| broken(SessionError::TlsHandshake(e)))?;
            let fd = std::os::fd::AsFd::as_fd(tls.get_ref()).try_clone_to_owned().ok();
            let peer = format!("the pShift controller ({name})");
            // Refused if a reload revoked the controller while the handshake ran (crate::tls, "Reload").
            if let Some(fd) = fd {
                _registration =
                    client.register(tls.ssl(), peer, fd).map_err(|why| broken(SessionError::TlsRevoked { why }))?;
            }
            Box::new(tls)
        }
    };
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut buf = Vec::new();
    write_frame(&mut wr, &Message::Hello { name: s.name.clone() }).await.map_err(|e| broken(SessionError::Hello(e)))?;
    // The answer is a welcome or a refusal, so at most a welcome's bound (a frame announcing more is
    // refused from its header).
    let first = tokio::time::timeout(s.welcome_timeout, read_frame_within(&mut rd, &mut buf, wire::MAX_WELCOME_BODY))
        .await
        .map_err(|_| broken(SessionError::WelcomeTimeout { timeout: s.welcome_timeout }))?
        .map_err(|e| broken(SessionError::Welcome(e)))?;
    let (index, strays, names, limited) = match first {
        Message::Welcome { server, strays, buckets, limited } => (server, strays, buckets, limited),
        Message::Refuse { reason } => return Err(Failure::Refused(SessionError::Refused { reason })),
        other => return Err(broken(SessionError::NotWelcome { got: other.name() })),
    };
    // After the welcome the controller's largest frame is a token message with a line per bucket.
    let max_body = wire::controller_body_max(names.len());
    let mut here = tenants();
    let (buckets, strangers) = resolve(&names, &here);
    warn_strangers(&strangers);
    let (stray_tx, mut stray_rx) = mpsc::unbounded_channel();
    let mapped = buckets.len();
    let mut current = buckets.clone();
    dispatcher
        .pshift_attach(PshiftAttach { server: index, strays, buckets, limited, strays_to: stray_tx })
        .await
        .map_err(|e| Failure::Refused(SessionError::Attach(e)))?;
    tracing::info!(controller = %s.controller, index, buckets = mapped, "pShift link: welcomed by the controller");
    // Up until the session ends, however it ends (an error, or `run` dropping it at the stop).
    let _up = status.up();
    let welcomed_at = tokio::time::Instant::now();
    let welcomed = |e: SessionError| Failure::Broken(e, Some(welcomed_at));
    // Pings place the controller's boundaries on the dispatcher's clock, where it cuts each report.
    let clock = dispatcher.clock();
    let mut offset = ClockOffset::default();
    let mut placed: Option<Cut> = None;
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Every write within SILENCE_TIMEOUT, and a frame read within it of the last one.
    let silent = || welcomed(SessionError::Silent { timeout: SILENCE_TIMEOUT });
    let unwritten = |e: Option<WriteFrameError>| {
        welcomed(e.map_or(SessionError::NotRead { timeout: SILENCE_TIMEOUT }, SessionError::Write))
    };
    let mut heard = tokio::time::Instant::now();
    loop {
        tokio::select! {
            // In this order: a ping tick that comes late says this process did not run (crate::STALLED),
            // and frames that came meanwhile are read, before silence is judged.
            biased;
            at = ping.tick() => {
                if at.elapsed() > crate::STALLED {
                    heard = tokio::time::Instant::now();
                }
                let m = Message::Ping { t0: clock.now().0 };
                write_frame_within(&mut wr, &m, SILENCE_TIMEOUT).await.map_err(unwritten)?;
            }
            Some(note) = stray_rx.recv() => {
                write_frame_within(&mut wr, &Message::Stray(note), SILENCE_TIMEOUT).await.map_err(unwritten)?;
            }
            f = read_frame_within(&mut rd, &mut buf, max_body) => {
                heard = tokio::time::Instant::now();
                match f.map_err(|e| welcomed(SessionError::Read(e)))? {
                    Message::ReportRequest { round, early } => {
                        // Tenants created or deleted since: a boundary's report covers the buckets of now.
                        let now_here = if early == 0 { tenants() } else { Vec::new() };
                        if early == 0 && now_here != here {
                            let (buckets, strangers) = resolve(&names, &now_here);
                            let before: HashSet<&(TenantId, u32)> = current.iter().collect();
                            for (id, b) in buckets.iter().filter(|x| !before.contains(x)) {
                                tracing::info!(bucket = %names[*b as usize], tenant = ?id, "pShift: a tenant created since the welcome is this bucket here now");
                            }
                            let known: HashSet<&str> = here.iter().map(|(h, _)| h.as_str()).collect();
                            let new_strangers: Vec<&str> = strangers.into_iter().filter(|n| !known.contains(n)).collect();
                            warn_strangers(&new_strangers);
                            if buckets != current {
                                dispatcher.pshift_map(buckets.clone()).await;
                                current = buckets;
                            }
                            here = now_here;
                        }
                        let r = dispatcher.pshift_report(round, early).await.map_err(|e| welcomed(SessionError::Report(e)))?;
                        write_frame_within(&mut wr, &Message::Report(r), SILENCE_TIMEOUT).await.map_err(unwritten)?;
                    }
                    Message::Tokens(m) if m.server == index => dispatcher.pshift_tokens(m).await,
                    Message::Pong { t0, t1, next_round, next_ns, interval_ns } => {
                        if next_ns > 0 {
                            check_schedule(t1, next_ns, interval_ns).map_err(|e| welcomed(SessionError::Schedule(e)))?;
                        }
                        offset.sample(t0, t1, clock.now().0);
                        if let (true, Some(at)) = (next_ns > 0, offset.local(next_ns)) {
                            let cut = Cut { round: next_round, at, interval: rein_core::Nanos(interval_ns) };
                            if placed != Some(cut) {
                                dispatcher.pshift_cut_at(cut).await;
                                placed = Some(cut);
                            }
                        }
                    }
                    other => return Err(welcomed(SessionError::Unexpected { got: other.name() })),
                }
            }
            _ = tokio::time::sleep_until(heard + SILENCE_TIMEOUT) => return Err(silent()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::DispatchConfig;
    use tokio::net::TcpListener;

    /// A link to `controller` with a welcome timeout of `welcome_timeout`, over a token dispatcher.
    fn link(controller: SocketAddr, welcome_timeout: Duration) -> (LinkSettings, Dispatcher) {
        let config = DispatchConfig { scheduler: rein_core::SchedulerKind::Token, ..DispatchConfig::default() };
        let (dispatcher, _join) = Dispatcher::spawn(None, config);
        (LinkSettings { controller, name: "s1".into(), tls: None, welcome_timeout }, dispatcher)
    }

    /// Accepts one link on `listener` and reads its hello.
    async fn hello(listener: &TcpListener) -> (TcpStream, Vec<u8>) {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let m = read_frame(&mut sock, &mut buf).await.unwrap();
        assert_eq!(m, Message::Hello { name: "s1".into() });
        (sock, buf)
    }

    /// What a session ended with: (refused, the message, whether it was welcomed).
    fn ended(r: Result<(), Failure>) -> (bool, String, bool) {
        match r {
            Ok(()) => (false, "closed".into(), true),
            Err(f) => {
                let (refused, e, welcomed) = failed(f);
                (refused, e.to_string(), welcomed)
            }
        }
    }

    /// A session's failure: (refused, why, whether it was welcomed).
    fn failed(f: Failure) -> (bool, SessionError, bool) {
        match f {
            Failure::Refused(e) => (true, e, false),
            Failure::Broken(e, welcomed) => (false, e, welcomed.is_some()),
        }
    }

    /// The welcome timeout at its bound (5 s in servers, 300 ms here): a controller that takes the hello
    /// and says nothing has the link broken at the deadline, not before, and its connection closed; the
    /// next attempt, to a controller that answers, is welcomed.
    #[tokio::test]
    async fn a_controller_that_never_welcomes_is_left_at_the_deadline() {
        let listener = TcpListener::bind("127.0.0.211:0").await.unwrap();
        let deadline = Duration::from_millis(300);
        let (s, dispatcher) = link(listener.local_addr().unwrap(), deadline);
        let status = LinkStatus::new(&s);
        // Left within 4 s: by the test's 300 ms, not the servers' 5 s.
        let silent = async {
            let (mut sock, _) = hello(&listener).await;
            let mut rest = Vec::new();
            tokio::time::timeout(CONNECT_TIMEOUT - Duration::from_secs(1), sock.read_to_end(&mut rest)).await
        };
        let started = tokio::time::Instant::now();
        let (r, closed) = tokio::join!(session(&s, &dispatcher, &Vec::new, &status), silent);
        let (refused, e, welcomed) = ended(r);
        assert!(!refused && !welcomed && e == "no welcome within 0.3 s", "{e}");
        assert!(started.elapsed() >= deadline, "left after {:?}", started.elapsed());
        assert!(matches!(closed, Ok(Ok(0))), "the silent controller's connection is closed: {closed:?}");
        let answering = async {
            let (mut sock, _) = hello(&listener).await;
            let m = Message::Welcome { server: 0, strays: false, buckets: vec!["a".into()], limited: vec![] };
            write_frame(&mut sock, &m).await.unwrap();
        };
        let (r, ()) = tokio::join!(session(&s, &dispatcher, &Vec::new, &status), answering);
        let (_, e, welcomed) = ended(r);
        assert!(welcomed, "{e}");
        assert!(!status.connected(), "the welcomed session has ended: the link is down");
    }

    /// A welcome the dispatcher refuses (its scheduler is not the token scheduler) ends the session
    /// refused, naming the refusal once: `run` logs it as "pShift link: {e}; serving plain round robin
    /// ...", which read "pShift link: pShift link: pShift needs ..." before.
    #[tokio::test]
    async fn a_welcome_the_dispatcher_refuses_is_named_once() {
        let listener = TcpListener::bind("127.0.0.218:0").await.unwrap();
        let config = DispatchConfig { scheduler: rein_core::SchedulerKind::Mclock, ..DispatchConfig::default() };
        let (dispatcher, _join) = Dispatcher::spawn(None, config);
        let controller = listener.local_addr().unwrap();
        let s = LinkSettings { controller, name: "s1".into(), tls: None, welcome_timeout: CONNECT_TIMEOUT };
        let status = LinkStatus::new(&s);
        let welcoming = async {
            let (mut sock, _) = hello(&listener).await;
            let m = Message::Welcome { server: 0, strays: false, buckets: vec!["a".into()], limited: vec![] };
            write_frame(&mut sock, &m).await.unwrap();
            sock
        };
        let (r, _sock) = tokio::join!(session(&s, &dispatcher, &Vec::new, &status), welcoming);
        let (refused, e, _) = ended(r);
        assert!(refused, "{e}");
        assert_eq!(e, "pShift needs scheduler = \"token\" (this server runs mclock)");
    }

    /// A session's failures, exactly as `run` logs them ("pShift link: {e}; serving plain round robin
    /// ..."): no controller listening, one that closes before the welcome, refuses, answers the hello
    /// with another frame, and, once welcomed, sends a frame the link does not take, a pong whose schedule
    /// is out of bounds, or closes.
    #[tokio::test]
    async fn session_failures_read_as_before() {
        let listener = TcpListener::bind("127.0.0.234:0").await.unwrap();
        let controller = listener.local_addr().unwrap();
        let (s, dispatcher) = link(controller, CONNECT_TIMEOUT);
        let status = LinkStatus::new(&s);
        // The controller's side of one session: answers the hello with `frames`, then closes its side
        // (the socket itself is kept until the session ends, so that a ping the link writes meanwhile does
        // not turn the close into a reset).
        let answer = |frames: Vec<Message>| {
            let listener = &listener;
            async move {
                let (mut sock, _) = hello(listener).await;
                for m in &frames {
                    write_frame(&mut sock, m).await.unwrap();
                }
                sock.shutdown().await.unwrap();
                sock
            }
        };
        let welcome = Message::Welcome { server: 0, strays: false, buckets: vec!["a".into()], limited: vec![] };
        type Is = fn(&SessionError) -> bool;
        let cases: [(Vec<Message>, bool, bool, String, Is); 6] = [
            (vec![], false, false, "the peer closed the connection".into(), |e| {
                matches!(e, SessionError::Welcome(ReadFrameError::Closed))
            }),
            (
                vec![Message::Refuse { reason: "no server named \"s1\"".into() }],
                true,
                false,
                "the controller refused this server: no server named \"s1\"".into(),
                |e| matches!(e, SessionError::Refused { reason } if reason == "no server named \"s1\""),
            ),
            (vec![Message::Ping { t0: 1 }], false, false, "expected a welcome, got a ping".into(), |e| {
                matches!(e, SessionError::NotWelcome { got: "ping" })
            }),
            (
                vec![welcome.clone(), Message::Ping { t0: 1 }],
                false,
                true,
                "unexpected ping from the controller".into(),
                |e| matches!(e, SessionError::Unexpected { got: "ping" }),
            ),
            (
                vec![
                    welcome.clone(),
                    Message::Pong { t0: 1, t1: 1_000_000_000, next_round: 1, next_ns: 1, interval_ns: 999 },
                ],
                false,
                true,
                "a pong with a boundary interval of 999 ns (a controller's is at least 1000 ns)".into(),
                |e| matches!(e, SessionError::Schedule(ScheduleError::Interval { interval_ns: 999 })),
            ),
            (vec![welcome.clone()], false, true, "the peer closed the connection".into(), |e| {
                matches!(e, SessionError::Read(ReadFrameError::Closed))
            }),
        ];
        for (frames, want_refused, want_welcomed, want, is) in cases {
            let (r, _sock) = tokio::join!(session(&s, &dispatcher, &Vec::new, &status), answer(frames));
            let (refused, e, welcomed) = failed(r.expect_err("every case fails"));
            assert_eq!(e.to_string(), want);
            assert!(is(&e), "{e:?}");
            assert_eq!((refused, welcomed), (want_refused, want_welcomed), "{e}");
        }
        // Nobody listening: the connect's error, as the system words it.
        drop(listener);
        let r = session(&s, &dispatcher, &Vec::new, &status).await;
        let (refused, e, welcomed) = failed(r.expect_err("nobody listens"));
        assert!(!refused && !welcomed, "{e}");
        assert_eq!(e.to_string(), "connect: Connection refused (os error 111)");
        assert!(matches!(&e, SessionError::Connect(io) if io.kind() == std::io::ErrorKind::ConnectionRefused), "{e:?}");
        // The io error is the source, its text said once in the message.
        let source = std::error::Error::source(&e).map(|s| s.to_string());
        assert_eq!(source.as_deref(), Some("Connection refused (os error 111)"));
        // The texts of the failures no peer here makes (timeouts, the TLS layer's, the dispatcher's).
        let texts: [(SessionError, &str); 7] = [
            (SessionError::Closed, "the controller closed the connection"),
            (SessionError::ConnectTimeout { timeout: CONNECT_TIMEOUT }, "no connection within 5 s"),
            (SessionError::TlsTimeout { timeout: CONNECT_TIMEOUT }, "no TLS handshake within 5 s"),
            (SessionError::WelcomeTimeout { timeout: Duration::from_millis(300) }, "no welcome within 0.3 s"),
            (SessionError::Silent { timeout: SILENCE_TIMEOUT }, "no frame from the controller within 5 s"),
            (SessionError::NotRead { timeout: SILENCE_TIMEOUT }, "the controller took no frame within 5 s"),
            (SessionError::TlsHandshake(crate::tls::TlsError("x".into())), "TLS handshake: TLS handshake failed: x"),
        ];
        for (e, want) in texts {
            assert_eq!(e.to_string(), want);
        }
    }

    /// `resolve` by hash lookups gives what the scan of the tenants per bucket gave (the oracle below):
    /// each bucket named by a tenant, in bucket order, the first tenant of a duplicated name, a bucket
    /// named twice mapped twice, and the tenants no bucket names, in their order.
    #[test]
    fn resolve_matches_names_as_a_scan_would() {
        fn scan<'a>(buckets: &[String], here: &'a [(String, TenantId)]) -> (Vec<(TenantId, u32)>, Vec<&'a str>) {
            let mapped = (buckets.iter().enumerate())
                .filter_map(|(b, name)| here.iter().find(|(n, _)| n == name).map(|(_, id)| (*id, b as u32)))
                .collect();
            let strangers = here.iter().filter(|(n, _)| !buckets.contains(n)).map(|(n, _)| n.as_str()).collect();
            (mapped, strangers)
        }
        let mut sched = rein_core::SchedulerKind::Fifo.build(Default::default());
        let mut x = 7u64;
        for case in 0..200 {
            let mut draw = |n: u64| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 33) % n
            };
            let names = 1 + draw(12);
            let here: Vec<(String, TenantId)> = (0..draw(10))
                .map(|_| (format!("t{}", draw(names)), sched.add_tenant(rein_core::QosSpec::default()).unwrap()))
                .collect();
            let buckets: Vec<String> = (0..draw(10)).map(|_| format!("t{}", draw(names))).collect();
            assert_eq!(resolve(&buckets, &here), scan(&buckets, &here), "case {case}: {buckets:?} {here:?}");
        }
    }

    /// A controller that welcomes the server and then breaks every session at once is retried with the
    /// backoff growing (100 ms, 200 ms, 400 ms, ... up to 5 s), as one that refuses connections: 5
    /// sessions in 3 s. A session that lasted [`STABLE_SESSION`] starts the backoff again: the next
    /// attempt comes 100 ms after it ends (a controller's restart is still met at once). Before, every
    /// welcomed session started the backoff again, however short: 30 sessions in 3 s here, 10 a second
    /// (each a "welcomed" line in the log) for as long as the controller did so.
    #[tokio::test]
    async fn a_controller_that_breaks_every_session_is_retried_with_a_growing_backoff() {
        let listener = TcpListener::bind("127.0.0.217:0").await.unwrap();
        let (s, dispatcher) = link(listener.local_addr().unwrap(), CONNECT_TIMEOUT);
        let status = std::sync::Arc::new(LinkStatus::new(&s));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let running = tokio::spawn(run(s, dispatcher, Vec::new, stopped, status));
        let welcome = Message::Welcome { server: 0, strays: false, buckets: vec!["a".into()], limited: vec![] };
        let start = tokio::time::Instant::now();
        let mut sessions = 0;
        while let Ok((mut sock, _)) = tokio::time::timeout_at(start + Duration::from_secs(3), hello(&listener)).await {
            write_frame(&mut sock, &welcome).await.unwrap();
            sessions += 1;
        }
        assert!((2..=6).contains(&sessions), "{sessions} sessions in 3 s");
        // A session that lasts: held open past STABLE_SESSION (the link pings meanwhile), then closed.
        let (mut sock, _) = hello(&listener).await;
        write_frame(&mut sock, &welcome).await.unwrap();
        tokio::time::sleep(STABLE_SESSION + Duration::from_millis(200)).await;
        drop(sock);
        let closed = tokio::time::Instant::now();
        let again = tokio::time::timeout(MAX_BACKOFF, hello(&listener)).await;
        assert!(again.is_ok(), "no attempt within {MAX_BACKOFF:?} of a stable session's end");
        assert!(closed.elapsed() < Duration::from_secs(2), "the next attempt after {:?}", closed.elapsed());
        stop.send(true).unwrap();
        running.await.unwrap();
    }

    /// The welcome at its bound (rein-proto's `MAX_WELCOME_BODY`, 16 MiB): a controller announcing one
    /// byte more is left from the frame's header, naming the bound (the link read at most 64 MiB before);
    /// a welcome of exactly the bound is taken.
    #[tokio::test]
    async fn a_welcome_beyond_its_bound_is_refused_from_its_header() {
        let listener = TcpListener::bind("127.0.0.212:0").await.unwrap();
        let (s, dispatcher) = link(listener.local_addr().unwrap(), CONNECT_TIMEOUT);
        let status = LinkStatus::new(&s);
        let line = 2 + rein_core::pshift::MAX_NAME_LEN;
        let full = (wire::MAX_WELCOME_BODY - 12) / line;
        let mut buckets: Vec<String> = (0..full).map(|k| format!("{k:0>256}")).collect();
        buckets.push("x".repeat(wire::MAX_WELCOME_BODY - 12 - full * line - 2));
        assert_eq!(wire::welcome_body_len(&buckets, &[]), wire::MAX_WELCOME_BODY);
        let mut welcome = Vec::new();
        wire::encode(&Message::Welcome { server: 0, strays: false, buckets, limited: vec![] }, &mut welcome).unwrap();
        let mut header = welcome[..wire::HEADER_BYTES].to_vec();
        header[8..12].copy_from_slice(&(wire::MAX_WELCOME_BODY as u32 + 1).to_le_bytes());
        let oversized = async {
            let (mut sock, _) = hello(&listener).await;
            sock.write_all(&header).await.unwrap();
            let mut rest = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut rest)).await
        };
        let (r, closed) = tokio::join!(session(&s, &dispatcher, &Vec::new, &status), oversized);
        let (_, e, welcomed) = ended(r);
        assert!(!welcomed && e.contains("welcome body of 16777217 bytes exceeds the bound of 16777216"), "{e}");
        assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");
        let at_bound = async {
            let (mut sock, _) = hello(&listener).await;
            sock.write_all(&welcome).await.unwrap();
        };
        let (r, ()) = tokio::join!(session(&s, &dispatcher, &Vec::new, &status), at_bound);
        let (_, e, welcomed) = ended(r);
        assert!(welcomed, "{e}");
    }

    /// `rein_pshift_controller_connected` is 1 only while a welcomed session holds the link up, and names
    /// the controller and the server (its name escaped as a label value).
    #[test]
    fn the_link_status_is_up_only_while_a_session_holds_it() {
        let controller = "127.0.0.30:7800".parse().unwrap();
        let s = LinkSettings { controller, name: "s\"1".into(), tls: None, welcome_timeout: CONNECT_TIMEOUT };
        let status = LinkStatus::new(&s);
        let text = |st: &LinkStatus| {
            let mut o = String::new();
            st.metrics(&mut o);
            o
        };
        let series = "rein_pshift_controller_connected{controller=\"127.0.0.30:7800\",server=\"s\\\"1\"}";
        assert!(text(&status).contains(&format!("\n{series} 0\n")), "{}", text(&status));
        assert!(text(&status).contains("# TYPE rein_pshift_controller_connected gauge\n"));
        {
            let _up = status.up();
            assert!(status.connected());
            assert!(text(&status).ends_with(&format!("\n{series} 1\n")), "{}", text(&status));
        }
        assert!(!status.connected(), "down again when the session ends");
    }

    /// The frames' and the pong's refusals, exactly as the link and the controller log them: a closed
    /// peer, a failing socket, a frame over the connection's bound, a bad header, a message that does
    /// not encode, and a pong's schedule out of bounds.
    #[tokio::test]
    async fn frame_and_schedule_refusals_read_as_before() {
        let mut buf = Vec::new();
        let e = read_frame(&mut &b""[..], &mut buf).await.unwrap_err().to_string();
        assert_eq!(e, "the peer closed the connection");
        let e = read_frame(&mut crate::testkit::Failing, &mut buf).await.unwrap_err().to_string();
        assert_eq!(e, "read: the socket failed");
        let mut hello = Vec::new();
        wire::encode(&Message::Hello { name: "s1".into() }, &mut hello).unwrap();
        let body = hello.len() - wire::HEADER_BYTES;
        let e = read_frame_within(&mut &hello[..], &mut Vec::new(), body - 1).await.unwrap_err().to_string();
        assert_eq!(e, format!("a pShift frame of {body} body bytes exceeds this connection's bound of {}", body - 1));
        assert!(matches!(read_frame_within(&mut &hello[..], &mut Vec::new(), body).await, Ok(Message::Hello { .. })));
        let garbage = [0xffu8; wire::HEADER_BYTES];
        let e = read_frame(&mut &garbage[..], &mut Vec::new()).await.unwrap_err().to_string();
        assert_eq!(e, format!("bad pShift frame: {}", wire::frame_len(&garbage).unwrap_err()));
        let e = write_frame(&mut crate::testkit::Failing, &Message::Ping { t0: 1 }).await.unwrap_err().to_string();
        assert_eq!(e, "write: the socket failed");
        let empty = Message::Hello { name: String::new() };
        let e = write_frame(&mut Vec::new(), &empty).await.unwrap_err().to_string();
        assert_eq!(e, format!("encoding a hello: {}", wire::encode(&empty, &mut Vec::new()).unwrap_err()));
        let e = write_frame_within(&mut crate::testkit::Failing, &Message::Ping { t0: 1 }, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(e.map(|e| e.to_string()).as_deref(), Some("write: the socket failed"));
        // Typed: what is wrong, with the numbers it names.
        let e = read_frame_within(&mut &hello[..], &mut Vec::new(), body - 1).await.unwrap_err();
        assert!(matches!(e, ReadFrameError::TooLarge { body: b, max_body } if b == body && max_body == body - 1));
        assert!(matches!(read_frame(&mut &b""[..], &mut Vec::new()).await, Err(ReadFrameError::Closed)));
        assert!(matches!(read_frame(&mut &garbage[..], &mut Vec::new()).await, Err(ReadFrameError::Bad(_))));
        let e = write_frame(&mut Vec::new(), &empty).await.unwrap_err();
        assert!(matches!(e, WriteFrameError::Encode { message: "hello", .. }), "{e:?}");
        assert_eq!(
            check_schedule(1_000_000_000, 1, 1_000_000),
            Err(ScheduleError::Late { next_ns: 1, t1: 1_000_000_000 })
        );
        let t1 = 1_000_000_000;
        assert_eq!(
            check_schedule(t1, t1, 999).unwrap_err().to_string(),
            "a pong with a boundary interval of 999 ns (a controller's is at least 1000 ns)"
        );
        assert_eq!(
            check_schedule(t1, 1, 1_000_000).unwrap_err().to_string(),
            "a pong whose next boundary (1 ns) is more than 16 intervals before the controller's clock (1000000000 ns)"
        );
    }

    /// A pong's schedule at its bounds: an interval of 1,000 ns is taken and 999 refused; a next boundary
    /// exactly 16 intervals before the controller's clock is taken, one nanosecond earlier refused.
    #[test]
    fn pong_schedules_at_their_bounds() {
        let t1 = 1_000_000_000;
        assert!(check_schedule(t1, t1, MIN_INTERVAL_NS).is_ok());
        let e = check_schedule(t1, t1, MIN_INTERVAL_NS - 1).unwrap_err().to_string();
        assert!(e.contains("interval of 999 ns"), "{e}");
        let late = t1 - MAX_LATE_INTERVALS * 1_000_000;
        assert!(check_schedule(t1, late, 1_000_000).is_ok());
        let e = check_schedule(t1, late - 1, 1_000_000).unwrap_err().to_string();
        assert!(e.contains("more than 16 intervals before"), "{e}");
        assert!(check_schedule(t1, 1, u64::MAX).is_ok(), "saturating: a huge interval covers any lateness");
    }

    /// The controller's clock 5 ms ahead: an exchange with a 100 us round trip places it within 50 us, a
    /// slower one (a ping that waited 3 ms on the way out) is outvoted by the faster, and a controller time
    /// maps to this clock by the offset.
    #[test]
    fn the_shortest_round_trip_sets_the_offset() {
        let mut o = ClockOffset::default();
        assert_eq!(o.offset(), None);
        // Sent at 1,000,000, answered (controller) at 6,000,050, back at 1,000,100: offset 5,000,000.
        assert_eq!(o.sample(1_000_000, 6_000_050, 1_000_100), Some(5_000_000));
        // Sent at 2,000,000, waited 3 ms before the controller saw it: a 3.1 ms round trip, not taken.
        assert_eq!(o.sample(2_000_000, 10_000_000, 5_100_000), Some(5_000_000));
        assert_eq!(o.local(7_000_000), Some(rein_core::Nanos(2_000_000)));
        assert_eq!(o.local(1_000), Some(rein_core::Nanos(0)), "before this clock's origin");
        // An answer older than its ping (clocks cannot do that) is ignored.
        assert_eq!(o.sample(9, 0, 8), Some(5_000_000));
        for k in 0..OFFSET_SAMPLES as u64 {
            o.sample(10_000_000 + k, 17_000_000 + k, 10_000_200 + k);
        }
        assert_eq!(o.offset(), Some(6_999_900), "the old samples leave: only the last 16 count");
    }
}
