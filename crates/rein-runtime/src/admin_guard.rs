//! Who may use the admin endpoint, and how much of the server its connections may hold (issue 12,
//! point 2). The routes are [`crate::admin::router`]'s; this module wraps them, so routes added there are
//! covered without being listed here.
//!
//! # Access
//! - **Loopback by default** (`admin = "127.0.0.1:9180"`).
//! - **A bearer token** (`admin_token_file`): a file holding one token (surrounding whitespace and the
//!   final newline ignored; 1..=[`MAX_TOKEN_BYTES`] visible ASCII characters). Once configured, every
//!   request but `GET /healthz` needs `Authorization: Bearer <token>`; without it, or with another token,
//!   the answer is 401 with `WWW-Authenticate: Bearer realm="rein"` (RFC 6750), unknown paths included
//!   (so that an unauthenticated client cannot map the routes), and the connection closes after it
//!   (`Connection: close`: a client without the token cannot hold a slot by asking again and again on one
//!   connection, nor try tokens without a new connection each time). The comparison takes the same time
//!   whatever the presented token holds ([`AdminToken::matches`]).
//! - **A token file others can read is refused** (any of the mode's "other" bits: readable or writable by
//!   every local user). A warning would leave every local user with the admin's power (set a tenant's limit
//!   to 0.001 IOPS) while the operator believes the endpoint is protected; `chmod 600` is a one-line fix,
//!   and the error says so. Group access is allowed (an operators' group).
//! - **No exposure by accident**: an `admin` address that is not loopback without a token refuses to
//!   start, unless `admin_insecure = true`, which starts with a warning naming the address.
//!
//! # Connections
//! - At most `max_admin_connections` (default [`DEFAULT_MAX_CONNECTIONS`]) at once: the listener takes a
//!   permit before it accepts, and the connection holds it until it closes. At the cap, new connections
//!   wait in the kernel's accept queue, holding no descriptor of the server's, so an attacker's idle
//!   connections can never take the descriptors the NBD listener needs (issue 12 saw 20,000 of them stop
//!   NBD accepts).
//! - A connection with no byte read or written for `admin_idle_timeout_s` (default
//!   [`DEFAULT_IDLE_TIMEOUT`]) is closed, so held connections free their permits: a slow or idle client
//!   (mid-request or between keep-alive requests, or not reading its answer) cannot keep a slot.
//! - **A request must be in and its answer begun within `admin_idle_timeout_s` of its first byte**: the
//!   bytes of a request do not restart the idle timer, only the first of them (and each byte of an
//!   answer) does. Otherwise a client dribbling a header line a second (slowloris) kept its slot for
//!   ever, since hyper, under `axum::serve`, has no header-read timeout of its own (seen: two such
//!   connections kept a third client's `/healthz` unanswered as long as they ran). A request body is
//!   at most 2 MB (axum's default), so the default 60 s asks about 35 KB/s of an uploading client.
//!
//! # HTTPS (`admin_tls = true`)
//! The endpoint serves HTTPS only, with the `[tls]` table's `cert`/`key` ([`crate::tls::TlsConfig`], the
//! same OpenSSL context as NBD's STARTTLS: TLS 1.2 and 1.3, the same suites). The token check, the cap
//! and the idle timeout do not change: TLS hides the token on the wire, it does not replace it, so a
//! non-loopback address still needs `admin_token_file` (or `admin_insecure`).
//! - **`ca` applies here too**: with `tls.ca` set, an HTTPS client must present a certificate that
//!   chains to it (`curl --cert --key`), `/healthz` included. The admin endpoint can change every
//!   tenant's QoS, more than any NBD client can, so it should not be the one door that skips the client
//!   check the operator configured; and one `ca` meaning one thing ("this server's clients hold a
//!   certificate from this CA") is what an operator can reason about. A separate admin CA, or none on
//!   the admin side only, would be a new key (not needed yet). A PSK client (`psk_file`) passes the
//!   handshake here as on NBD; curl and browsers speak no TLS-PSK, and the token is still required.
//! - **The handshake runs in the connection's task, not in the accept loop**: [`CappedListener`] only
//!   accepts the socket (no IO, no TLS context yet); the handshake is driven by the [`AdminStream`]'s
//!   first polls, with the context current at the client's first byte
//!   ([`crate::tls::TlsConfig::server_stream`]: a client silent across a revoking reload meets the new
//!   one), which `axum::serve` makes in the task it spawns per
//!   connection. A client that connects and says nothing (or stalls mid-handshake) therefore holds one
//!   task and one permit, never the loop that accepts the others.
//! - **No reload turns it off** ([`crate::tls::AdminTls`], a context that cannot be absent): a reload
//!   whose file keeps `admin_tls = true` without `[tls]`'s certificate is refused whole, and one that
//!   drops `admin_tls` (with `[tls]` or without) needs a restart and keeps the running context, so the
//!   endpoint goes on with HTTPS and the certificate it has until the restart.
//! - **The handshake counts against the cap and has a deadline**: the permit is taken before the
//!   accept, as for plain HTTP; the idle timer, started at accept, is not reset by handshake bytes, so
//!   the whole handshake must finish within one `admin_idle_timeout_s` (a TLS handshake is two round
//!   trips; a client that dribbles it byte by byte is cut at the same time as a silent one).
//! - **A plain HTTP request is answered, not dropped**: a connection whose first byte is not a TLS
//!   handshake record gets `400` "this admin endpoint serves HTTPS only (admin_tls): use https://" in
//!   plain HTTP and is closed ([`rein_proto::https`]).
//! - Failed handshakes are logged once each (`admin endpoint: TLS handshake with PEER failed: ...`).
//! - **A reload that revokes a client closes its open connections** (a `crl` that lists its certificate,
//!   a `psk_file` without its identity), as on NBD: each connection is listed with what its client
//!   presented once its handshake is done ([`crate::tls::LiveTls::register`]), and the reload shuts its
//!   socket down; a handshake that completes after a reload that revokes its client is refused at that
//!   registration (the connection closed, logged as the reload logs a cut). Before, a revoked client kept a keep-alive connection, and with it the endpoint, for
//!   as long as it sent a request within every idle timeout.
//!
//! ## Cost
//! HTTPS sockets have `TCP_NODELAY`: the server's TLS 1.3 flight and its two session tickets are small
//! separate writes, and with Nagle waiting on the client's delayed ACK a fresh `curl https://.../healthz`
//! took 48 ms (median of 100; the handshake itself was done at 8 ms) against 3.4 ms with it. Measured
//! on the shared 2-core machine (load 4-5), debug build, P-256 certificate, curl 7.88, one process per
//! request: fresh connections, median of 200, 3.5-13.6 ms over HTTPS (the handshake most of it) against
//! 0.8-3.5 ms over HTTP; 1,000 requests on one keep-alive connection 0.15-0.16 s over HTTPS against
//! 0.08-0.14 s over HTTP (two sittings). The commands are in docs/serve.md.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_openssl::SslStream;

use crate::tls::AdminTls;

/// Default `max_admin_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Largest `max_admin_connections`.
pub const MAX_CONNECTIONS_LIMIT: usize = 4096;
/// Default `admin_idle_timeout_s`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest `admin_idle_timeout_s`, in seconds.
pub const MAX_IDLE_TIMEOUT_S: f64 = 3600.0;
/// Longest token, in bytes.
pub const MAX_TOKEN_BYTES: usize = 4096;
/// The path that answers without a token.
pub const HEALTHZ: &str = "/healthz";

/// How the admin endpoint is guarded (the `admin_*` keys; module comment).
#[derive(Debug, Clone, PartialEq)]
pub struct AdminAccess {
    /// `admin_token_file`: the bearer token's file (`None`: no token; then the endpoint must be on
    /// loopback or `insecure`).
    pub token_file: Option<PathBuf>,
    /// `admin_insecure`: serve a non-loopback address without a token (with a warning).
    pub insecure: bool,
    /// `max_admin_connections`: 1..=[`MAX_CONNECTIONS_LIMIT`].
    pub max_connections: usize,
    /// `admin_idle_timeout_s`: a connection idle this long is closed.
    pub idle_timeout: Duration,
}

impl Default for AdminAccess {
    fn default() -> AdminAccess {
        AdminAccess {
            token_file: None,
            insecure: false,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

impl AdminAccess {
    /// Validates the raw config values; errors name the key.
    pub fn new(
        token_file: Option<PathBuf>,
        insecure: bool,
        max_connections: usize,
        idle_timeout_s: f64,
    ) -> Result<AdminAccess, AdminAccessError> {
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&max_connections) {
            return Err(AdminAccessError::MaxConnections { got: max_connections, max: MAX_CONNECTIONS_LIMIT });
        }
        if !(idle_timeout_s.is_finite() && idle_timeout_s > 0.0 && idle_timeout_s <= MAX_IDLE_TIMEOUT_S) {
            return Err(AdminAccessError::IdleTimeout { got: idle_timeout_s, max: MAX_IDLE_TIMEOUT_S });
        }
        if token_file.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(AdminAccessError::EmptyTokenFile);
        }
        Ok(AdminAccess { token_file, insecure, max_connections, idle_timeout: Duration::from_secs_f64(idle_timeout_s) })
    }
}

/// Why the `admin_*` keys are refused ([`AdminAccess::new`]); the message names the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdminAccessError {
    /// `max_admin_connections` outside `1..=max`.
    #[error("max_admin_connections must be in 1..={max}, got {got}")]
    MaxConnections {
        /// The value given.
        got: usize,
        /// The most accepted ([`MAX_CONNECTIONS_LIMIT`]).
        max: usize,
    },
    /// `admin_idle_timeout_s` not in `(0, max]` seconds.
    #[error("admin_idle_timeout_s must be in (0, {max}] seconds, got {got}")]
    IdleTimeout {
        /// The value given.
        got: f64,
        /// The longest accepted ([`MAX_IDLE_TIMEOUT_S`]).
        max: f64,
    },
    /// `admin_token_file = ""`.
    #[error("admin_token_file is empty")]
    EmptyTokenFile,
}

/// Why the admin endpoint cannot be served as configured.
#[derive(Debug, thiserror::Error)]
pub enum AdminGuardError {
    /// The token file cannot be read.
    #[error("admin token file {}: {error}", path.display())]
    TokenRead {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        error: io::Error,
    },
    /// The token file's content or permissions are not acceptable (the message says what and how to fix
    /// it).
    #[error("admin token file {}: {error}", path.display())]
    TokenInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        error: TokenError,
    },
    /// A non-loopback admin address without a token (and without `admin_insecure`).
    #[error(
        "admin = \"{addr}\" is not a loopback address and no admin_token_file is set: anyone who reaches it could \
         {powers}; set admin_token_file, bind 127.0.0.1, or set admin_insecure = true"
    )]
    Exposed {
        /// The admin address.
        addr: SocketAddr,
        /// What its API lets a client do (the role's [`Powers`]).
        powers: Powers,
    },
}

/// What is wrong with an admin token file's kind, permissions or content ([`AdminToken::load`],
/// [`AdminToken::parse`]); [`AdminGuardError::TokenInvalid`] names the file before it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The path names a directory, a device, a FIFO or a socket.
    #[error("is not a regular file")]
    NotAFile,
    /// Every local user may read or write it (the mode's "other" bits); the message says how to fix it.
    #[error("is accessible to every user (mode {mode:o}); make it private: chmod 600 {}", path.display())]
    Exposed {
        /// The file's permission bits (`mode & 0o777`).
        mode: u32,
        /// The file, for the fix.
        path: PathBuf,
    },
    /// The file is far larger than a token (more than twice [`MAX_TOKEN_BYTES`]), so it is not read.
    #[error("is {bytes} bytes; a token is at most {MAX_TOKEN_BYTES}")]
    FileTooLarge {
        /// The file's size.
        bytes: u64,
    },
    /// Nothing but whitespace.
    #[error("is empty; it must hold one token")]
    Empty,
    /// A token longer than [`MAX_TOKEN_BYTES`] (surrounding whitespace dropped).
    #[error("holds {bytes} bytes; a token is at most {MAX_TOKEN_BYTES}")]
    TooLong {
        /// The token's length.
        bytes: usize,
    },
    /// A byte that is not visible ASCII (a space or a line break inside, a control or non-ASCII byte).
    #[error("must hold one token of visible ASCII characters (no spaces or line breaks inside)")]
    NotVisibleAscii,
}

/// A bearer token, from [`AdminToken::load`]. Its `Debug` never shows it.
#[derive(Clone)]
pub struct AdminToken(Arc<[u8]>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

impl AdminToken {
    /// Reads and checks a token file (module comment): readable, not accessible to others, one token of
    /// 1..=[`MAX_TOKEN_BYTES`] visible ASCII characters.
    pub fn load(path: &Path) -> Result<AdminToken, AdminGuardError> {
        use std::os::unix::fs::PermissionsExt;
        let read_err = |error| AdminGuardError::TokenRead { path: path.to_path_buf(), error };
        let invalid = |error| AdminGuardError::TokenInvalid { path: path.to_path_buf(), error };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        if !meta.is_file() {
            return Err(invalid(TokenError::NotAFile));
        }
        let mode = meta.permissions().mode();
        if mode & 0o007 != 0 {
            return Err(invalid(TokenError::Exposed { mode: mode & 0o777, path: path.to_path_buf() }));
        }
        if meta.len() > 2 * MAX_TOKEN_BYTES as u64 {
            return Err(invalid(TokenError::FileTooLarge { bytes: meta.len() }));
        }
        let text = rein_model::input::read_bounded(path, 2 * MAX_TOKEN_BYTES as u64).map_err(read_err)?;
        Self::parse(&text).map_err(invalid)
    }

    /// A token from a file's bytes: surrounding whitespace dropped, then 1..=[`MAX_TOKEN_BYTES`] visible
    /// ASCII characters (no space or line break inside).
    pub fn parse(text: &[u8]) -> Result<AdminToken, TokenError> {
        let token = text.trim_ascii();
        if token.is_empty() {
            return Err(TokenError::Empty);
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLong { bytes: token.len() });
        }
        if !token.iter().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::NotVisibleAscii);
        }
        Ok(AdminToken(token.into()))
    }

    /// The token's text (for a client's `Authorization` header).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("checked ASCII")
    }

    /// Whether `presented` is this token. The loop runs over the token's length and touches every byte
    /// whatever `presented` holds, so its time says nothing about how much of a guess was right (only the
    /// token's length, which is no secret worth keeping).
    pub fn matches(&self, presented: &[u8]) -> bool {
        let mut diff = (self.0.len() != presented.len()) as u8;
        for (i, &b) in self.0.iter().enumerate() {
            diff |= b ^ presented.get(i).copied().unwrap_or(0);
        }
        std::hint::black_box(diff) == 0
    }
}

/// What a role's admin API lets a client do, as the error and the warning about an endpoint without a
/// token say it (each daemon's admin API controls something else: `rein serve`'s its tenants, the
/// gateway's a PARDA host's window, the pShift controller's the start of its schedule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Powers(pub &'static str);

impl std::fmt::Display for Powers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Loads the token (if configured) and refuses an exposed address without one (module comment); `powers`
/// is what the role's admin API controls.
pub fn prepare(addr: SocketAddr, access: &AdminAccess, powers: Powers) -> Result<Option<AdminToken>, AdminGuardError> {
    let token = access.token_file.as_deref().map(AdminToken::load).transpose()?;
    if token.is_none() && !addr.ip().is_loopback() {
        if !access.insecure {
            return Err(AdminGuardError::Exposed { addr, powers });
        }
        tracing::warn!(
            admin = %addr,
            "admin endpoint on {addr} without a token (admin_insecure = true): anyone who reaches it can {powers}"
        );
    }
    Ok(token)
}

/// `admin_token_file` or `admin_insecure` where no admin endpoint uses them, in a role whose `admin` is
/// optional (the gateway, the pShift controller): a warning naming the keys, if so. Not an error: a
/// service manager may pass the admin socket to a file without `admin` (docs/serve.md, "Socket
/// activation"), and the keys then apply to it, so `--check-config`, which takes no sockets, cannot tell
/// unused keys from that use. `started`: said at a start that was passed no admin socket (else at
/// `--check-config`).
pub fn unused_admin_keys(access: &AdminAccess, admin: Option<SocketAddr>, started: bool) -> Option<String> {
    let token = access.token_file.as_ref().map(|f| format!("admin_token_file ({})", f.display()));
    let keys = match (token, access.insecure) {
        _ if admin.is_some() => return None,
        (None, false) => return None,
        (Some(t), false) => t,
        (None, true) => "admin_insecure".to_string(),
        (Some(t), true) => format!("{t} and admin_insecure"),
    };
    // (verb, what the keys do for a passed socket, what they do without one, what to remove)
    let (is, passed, nothing, remove) = match (access.token_file.is_some(), access.insecure) {
        (true, false) => ("is", "the token guards only", "the token file is not read", "admin_token_file"),
        (false, _) => ("is", "it applies only to", "it applies to nothing", "admin_insecure"),
        (true, true) => ("are", "they apply only to", "they apply to nothing", "them"),
    };
    Some(if started {
        format!(
            "{keys} {is} set but admin is not, and no admin socket was passed: there is no admin endpoint and \
             {nothing}; set admin, or remove {remove}"
        )
    } else {
        format!(
            "{keys} {is} set but admin is not: {passed} an admin socket a service manager passes; set admin to \
             serve the admin endpoint, or remove {remove}"
        )
    })
}

/// Why an admin endpoint of [`admin_listener`] cannot listen.
#[derive(Debug, thiserror::Error)]
pub enum AdminListenError {
    /// Its token file, or an exposed address without one ([`prepare`]).
    #[error(transparent)]
    Guard(#[from] AdminGuardError),
    /// The socket a service manager passed cannot be used; the error names the descriptor and why.
    #[error("socket activation: {0}")]
    Activation(crate::activation::ActivationError),
    /// The configured address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The operating system's error.
        source: io::Error,
    },
}

/// The admin endpoint of a role whose `admin` is optional (the gateway, the pShift controller): the
/// socket a service manager `passed` (judged by its own address: an exposed one needs the token; served
/// also when the file names no `admin`), else the `configured` address bound, else none, with a warning
/// for admin keys set for nothing ([`unused_admin_keys`]). Returns its listener and token.
pub async fn admin_listener(
    passed: Option<crate::activation::PassedSocket>,
    configured: Option<SocketAddr>,
    access: &AdminAccess,
    powers: Powers,
) -> Result<Option<(TcpListener, Option<AdminToken>)>, AdminListenError> {
    match (passed, configured) {
        (None, None) => {
            if let Some(w) = unused_admin_keys(access, None, true) {
                tracing::warn!("{w}");
            }
            Ok(None)
        }
        (Some(p), configured) => {
            let addr = p.tcp_addr().map_err(AdminListenError::Activation)?;
            let token = prepare(addr, access, powers)?;
            let instead =
                configured.map_or_else(|| "no admin (none in the configuration)".into(), |a| format!("admin = {a}"));
            p.log_use("the admin endpoint", &instead);
            Ok(Some((p.into_tcp().map_err(AdminListenError::Activation)?, token)))
        }
        (None, Some(addr)) => {
            let token = prepare(addr, access, powers)?;
            let l = crate::sock::bind_tcp(addr).map_err(|source| AdminListenError::Bind { addr, source })?;
            Ok(Some((l, token)))
        }
    }
}

/// `router` with `GET /healthz` added and, with a token, every other request checked (module comment).
pub fn protect(router: Router, token: Option<AdminToken>) -> Router {
    router.route(HEALTHZ, get(healthz)).layer(axum::middleware::from_fn_with_state(token, require_token))
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn require_token(State(token): State<Option<AdminToken>>, req: Request, next: Next) -> Response {
    let Some(token) = token else { return next.run(req).await };
    if req.uri().path() == HEALTHZ {
        return next.run(req).await;
    }
    let presented = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let bearer = presented.and_then(|v| {
        let (scheme, rest) = v.split_at_checked(7)?;
        scheme.eq_ignore_ascii_case(b"bearer ").then_some(rest.trim_ascii())
    });
    match bearer {
        Some(t) if token.matches(t) => next.run(req).await,
        _ => {
            let (challenge, msg) = match presented {
                None => ("Bearer realm=\"rein\"", "this endpoint needs Authorization: Bearer <token>"),
                Some(_) => ("Bearer realm=\"rein\", error=\"invalid_token\"", "the bearer token is not valid"),
            };
            let body = Json(serde_json::json!({ "error": msg }));
            // The connection closes after a 401: a client without the token cannot hold an admin slot by
            // asking again and again on one connection (each request within the idle timeout).
            let headers = [(header::WWW_AUTHENTICATE, challenge), (header::CONNECTION, "close")];
            (StatusCode::UNAUTHORIZED, headers, body).into_response()
        }
    }
}

/// The admin listener: at most `max_connections` accepted connections open at once, each closed after
/// `idle_timeout` without a byte in or out, and with `admin_tls` each a TLS server connection whose
/// handshake runs in its own task (module comment). For `axum::serve`.
pub struct CappedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    idle_timeout: Duration,
    /// With `admin_tls`: the `[tls]` context, as a reload replaces it ([`crate::tls`], "Reload").
    tls: Option<AdminTls>,
    /// Failed accepts: paced and logged as the NBD listeners' are, counted for the daemon's `/metrics`.
    accepts: Arc<crate::access::AcceptPacing>,
}

impl CappedListener {
    /// Wraps a bound listener; with `tls`, every connection is HTTPS, with the context `tls` holds when
    /// its handshake starts. Its failed accepts are counted in `accepts`, which the daemon's `/metrics`
    /// shows ([`crate::access::AcceptPacing::admin_metrics`]).
    pub fn new(
        inner: TcpListener,
        access: &AdminAccess,
        tls: Option<AdminTls>,
        accepts: Arc<crate::access::AcceptPacing>,
    ) -> CappedListener {
        CappedListener {
            inner,
            permits: Arc::new(Semaphore::new(access.max_connections)),
            idle_timeout: access.idle_timeout,
            tls,
            accepts,
        }
    }
}

impl axum::serve::Listener for CappedListener {
    type Io = AdminStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (AdminStream, SocketAddr) {
        // The permit first: at the cap, connections wait in the kernel's queue, not in our descriptors.
        let permit = self.permits.clone().acquire_owned().await.expect("the semaphore is never closed");
        loop {
            let (stream, peer) = match self.inner.accept().await {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of descriptors (EMFILE) or memory: wait for some to be freed.
                    tokio::time::sleep(self.accepts.failed("admin endpoint", &e).0).await;
                    continue;
                }
            };
            self.accepts.succeeded();
            let conn = match &self.tls {
                None => Conn::Plain(stream),
                // No IO here, and no TLS context yet: the handshake runs in the connection's task, with
                // the context current when it starts (module comment). No Nagle: the server's handshake
                // flight and session tickets are several small writes, and with Nagle against the
                // client's delayed ACK a fresh HTTPS request took 48 ms instead of a few (module
                // comment, "Cost").
                Some(live) => match stream.set_nodelay(true) {
                    Ok(()) => Conn::FirstByte(Some(stream), live.clone()),
                    Err(e) => {
                        tracing::warn!(%peer, "admin endpoint: cannot start TLS with {peer}: {e}");
                        continue;
                    }
                },
            };
            return (AdminStream::new(conn, peer, permit, self.idle_timeout), peer);
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// How many 4 KiB reads of a plain HTTP request are discarded before the answer (at most 64 KiB).
const PLAIN_DRAIN_READS: usize = 16;

/// Where an HTTPS connection's server handshake stands once it has started.
enum Handshake {
    /// The TLS handshake is under way, with the context the holder had when it started; once done, the
    /// connection is listed in the holder with what its client presented, or refused if a reload revoked
    /// that client meanwhile, so that a reload whose `crl` or `psk_file` revokes the client closes it
    /// (module comment, HTTPS).
    Running(AdminTls),
    /// Done: application data flows.
    Done,
}

/// The socket under an [`AdminStream`].
enum Conn {
    Plain(TcpStream),
    /// HTTPS waiting for its first byte: TLS, or a plain HTTP request to answer ([`rein_proto::https`]),
    /// with the context's holder, which the handshake takes the context from when it starts. The socket
    /// is taken out (`None`) only while [`AdminStream::poll_handshake`] wraps it in TLS.
    FirstByte(Option<TcpStream>, AdminTls),
    Tls(Box<SslStream<TcpStream>>, Handshake),
}

/// An admin connection: holds its [`CappedListener`] permit until dropped, runs its TLS handshake (with
/// `admin_tls`) in its first polls, and fails its reads and writes with `TimedOut` once nothing has
/// moved for the idle timeout (hyper then closes it).
pub struct AdminStream {
    conn: Conn,
    peer: SocketAddr,
    _permit: OwnedSemaphorePermit,
    idle_timeout: Duration,
    idle: Pin<Box<Sleep>>,
    /// Bytes of a request came in since the last answer byte went out: further request bytes do not
    /// restart the idle timer (module comment).
    in_request: bool,
    /// HTTPS: the connection's place in its context's list once its handshake is done ([`Handshake`]).
    registration: Option<crate::tls::Registration>,
}

impl AdminStream {
    fn new(conn: Conn, peer: SocketAddr, permit: OwnedSemaphorePermit, idle_timeout: Duration) -> AdminStream {
        let idle = Box::pin(tokio::time::sleep(idle_timeout));
        AdminStream { conn, peer, _permit: permit, idle_timeout, idle, in_request: false, registration: None }
    }

    fn moved(&mut self) {
        let at = Instant::now() + self.idle_timeout;
        self.idle.as_mut().reset(at);
    }

    /// Request bytes came in: the first after an answer restarts the idle timer, the rest of the request
    /// must come within it.
    fn read_some(&mut self) {
        if !self.in_request {
            self.in_request = true;
            self.moved();
        }
    }

    /// Answer bytes went out: the idle timer restarts, and the next request bytes start a new request.
    fn wrote_some(&mut self) {
        self.in_request = false;
        self.moved();
    }

    /// After a `Pending` from the socket: `TimedOut` if the idle deadline has passed (else the timer
    /// wakes this task when it does).
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        match self.idle.as_mut().poll(cx) {
            Poll::Ready(()) => {
                let during = match self.conn {
                    Conn::FirstByte(..) | Conn::Tls(_, Handshake::Running(_)) => " during the TLS handshake",
                    _ => "",
                };
                if !during.is_empty() {
                    tracing::info!(peer = %self.peer, "admin endpoint: TLS handshake with {} timed out", self.peer);
                }
                Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, format!("admin connection idle{during}")))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Drives the TLS handshake (nothing to do on plain HTTP or once done): `Ready(Ok)` when application
    /// data may flow, `Ready(Err)` when the connection must close (logged here, once), `Pending` while
    /// it runs. Handshake bytes do not reset the idle timer (module comment).
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Conn::FirstByte(Some(tcp), _) = &mut self.conn {
            let mut first = [0u8; 1];
            let mut buf = ReadBuf::new(&mut first);
            match tcp.poll_peek(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before TLS")))
                }
                Poll::Ready(Ok(_)) if !rein_proto::https::starts_tls(first[0]) => {
                    // Best effort, without waiting: read what the request sent so far (closing with
                    // unread bytes would reset the connection and lose the answer), then answer; a fresh
                    // socket's send buffer takes these few bytes at once.
                    let mut sink = [0u8; 4096];
                    for _ in 0..PLAIN_DRAIN_READS {
                        if !matches!(tcp.try_read(&mut sink), Ok(n) if n > 0) {
                            break;
                        }
                    }
                    let _ = tcp.try_write(rein_proto::https::PLAIN_HTTP_ANSWER);
                    tracing::info!(peer = %self.peer, "admin endpoint: plain HTTP from {} on the HTTPS port: answered 400", self.peer);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "plain HTTP on the HTTPS port",
                    )));
                }
                Poll::Ready(Ok(_)) => {}
            }
        }
        if let Conn::FirstByte(tcp, live) = &mut self.conn {
            // The handshake starts: with the context now, not the one current at accept (a client may
            // hold its connection silent across a reload that revokes it). There always is one: no
            // reload turns the admin endpoint's TLS off ([`AdminTls`]), so the refusal "TLS was turned
            // off by a reload" that stood here could not happen. No socket: a start that failed, polled
            // again after its error.
            let started = match tcp.take() {
                Some(tcp) => live.get().server_stream(tcp).map_err(|e| e.to_string()),
                None => Err("TLS could not start".to_string()),
            };
            match started {
                Ok(tls) => self.conn = Conn::Tls(Box::new(tls), Handshake::Running(live.clone())),
                Err(e) => {
                    tracing::warn!(peer = %self.peer, "admin endpoint: cannot start TLS with {}: {e}", self.peer);
                    return Poll::Ready(Err(io::Error::other(format!("TLS: {e}"))));
                }
            }
        }
        let Conn::Tls(tls, state) = &mut self.conn else { return Poll::Ready(Ok(())) };
        if let Handshake::Running(live) = state {
            match Pin::new(&mut **tls).poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    tracing::info!(peer = %self.peer, "admin endpoint: TLS handshake with {} failed: {e}", self.peer);
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, format!("TLS handshake: {e}"))));
                }
                Poll::Ready(Ok(())) => {
                    let live = live.clone();
                    *state = Handshake::Done;
                    // With a duplicate of its socket, which a reload that revokes the client shuts down.
                    // Refused (and logged there) if a reload revoked the client while the handshake ran.
                    let fd = std::os::fd::AsFd::as_fd(tls.get_ref()).try_clone_to_owned().ok();
                    if let Some(fd) = fd {
                        match live.register(tls.ssl(), self.peer.to_string(), fd) {
                            Ok(registration) => self.registration = registration,
                            Err(why) => {
                                return Poll::Ready(Err(io::Error::new(io::ErrorKind::PermissionDenied, why)));
                            }
                        }
                    }
                    self.moved();
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    /// The stream application data goes through (after [`AdminStream::poll_handshake`]).
    fn io(&mut self) -> Pin<&mut (dyn AdminIo + '_)> {
        match &mut self.conn {
            Conn::Plain(tcp) => Pin::new(tcp),
            Conn::Tls(tls, _) => Pin::new(&mut **tls),
            Conn::FirstByte(..) => unreachable!("no application data before poll_handshake's Ready(Ok)"),
        }
    }
}

/// A byte stream an [`AdminStream`] wraps (TCP, or TLS over TCP).
trait AdminIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AdminIo for T {}

/// Runs `$op` on the stream once the handshake is done; a `Ready` result with bytes moved calls `$on_moved`
/// ([`AdminStream::read_some`] or [`AdminStream::wrote_some`]), a `Pending` checks the idle timer.
macro_rules! after_handshake {
    ($self:ident, $cx:ident, $moved:expr, $on_moved:ident, $op:expr) => {{
        match $self.poll_handshake($cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return $self.check_idle($cx).map(Err),
        }
        match $op {
            Poll::Ready(r) => {
                if $moved(&r) {
                    $self.$on_moved();
                }
                Poll::Ready(r)
            }
            Poll::Pending => $self.check_idle($cx).map(Err),
        }
    }};
}

impl AsyncRead for AdminStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        after_handshake!(
            this,
            cx,
            |_: &io::Result<()>| buf.filled().len() > before,
            read_some,
            this.io().poll_read(cx, buf)
        )
    }
}

fn wrote(r: &io::Result<usize>) -> bool {
    matches!(r, Ok(n) if *n > 0)
}

impl AsyncWrite for AdminStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        after_handshake!(this, cx, wrote, wrote_some, this.io().poll_write(cx, data))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        after_handshake!(this, cx, wrote, wrote_some, this.io().poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.conn {
            Conn::Plain(tcp) => tcp.is_write_vectored(),
            Conn::Tls(tls, _) => tls.is_write_vectored(),
            Conn::FirstByte(..) => false,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.conn {
            Conn::FirstByte(..) | Conn::Tls(_, Handshake::Running(_)) => Poll::Ready(Ok(())),
            _ => self.io().poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.conn {
            // No TLS session to close: close the TCP connection.
            Conn::FirstByte(Some(tcp), _) => Pin::new(tcp).poll_shutdown(cx),
            Conn::FirstByte(None, _) => Poll::Ready(Ok(())),
            Conn::Tls(tls, Handshake::Running(_)) => Pin::new(tls.get_mut()).poll_shutdown(cx),
            _ => self.io().poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_and_compared_exactly() {
        let t = AdminToken::parse(b"  s3cret-token\n").unwrap();
        assert_eq!(t.as_str(), "s3cret-token");
        assert!(t.matches(b"s3cret-token"));
        for wrong in [&b""[..], b"s3cret-toke", b"s3cret-token!", b"S3cret-token", b"s3cret-token\0"] {
            assert!(!t.matches(wrong), "{wrong:?}");
        }
        assert!(format!("{t:?}").contains(".."), "Debug hides the token");
        assert_eq!(AdminToken::parse(b" \n").unwrap_err().to_string(), "is empty; it must hold one token");
        assert!(AdminToken::parse(b"two tokens").unwrap_err().to_string().contains("visible ASCII"));
        assert!(AdminToken::parse(&[b'a'; MAX_TOKEN_BYTES]).is_ok(), "at the bound");
        assert!(AdminToken::parse(&[b'a'; MAX_TOKEN_BYTES + 1]).unwrap_err().to_string().contains("at most 4096"));
    }

    /// Each refusal of a token file is its [`TokenError`] variant, with the message the `String` error
    /// had (the strings below are that error's text), after the file's name, once.
    #[test]
    fn token_refusals_are_typed_with_the_old_messages() {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(AdminToken::parse(b" \n").unwrap_err(), TokenError::Empty);
        let e = AdminToken::parse(b"two tokens").unwrap_err();
        assert_eq!(e, TokenError::NotVisibleAscii);
        assert_eq!(e.to_string(), "must hold one token of visible ASCII characters (no spaces or line breaks inside)");
        let e = AdminToken::parse(&[b'a'; MAX_TOKEN_BYTES + 1]).unwrap_err();
        assert_eq!(e, TokenError::TooLong { bytes: MAX_TOKEN_BYTES + 1 });
        assert_eq!(e.to_string(), "holds 4097 bytes; a token is at most 4096");
        let dir = tempfile::Builder::new().prefix("rein-token-").tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = AdminToken::load(&path).unwrap_err();
        let shown = path.display();
        assert!(
            matches!(&e, AdminGuardError::TokenInvalid { error: TokenError::Exposed { mode: 0o644, path: p }, .. } if *p == path),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "admin token file {shown}: is accessible to every user (mode 644); make it private: chmod 600 {shown}"
            )
        );
        let source = std::error::Error::source(&e).expect("the TokenError is the source").to_string();
        assert!(e.to_string().ends_with(&format!(": {source}")) && e.to_string().matches(&source).count() == 1);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, vec![b'a'; 2 * MAX_TOKEN_BYTES + 1]).unwrap();
        let e = AdminToken::load(&path).unwrap_err();
        assert!(
            matches!(&e, AdminGuardError::TokenInvalid { error: TokenError::FileTooLarge { bytes: 8193 }, .. }),
            "{e:?}"
        );
        assert_eq!(e.to_string(), format!("admin token file {shown}: is 8193 bytes; a token is at most 4096"));
        let e = AdminToken::load(dir.path()).unwrap_err();
        assert!(matches!(&e, AdminGuardError::TokenInvalid { error: TokenError::NotAFile, .. }), "{e:?}");
        assert_eq!(e.to_string(), format!("admin token file {}: is not a regular file", dir.path().display()));
    }

    #[test]
    fn token_files_others_can_read_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new().prefix("rein-token-").tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc\n").unwrap();
        for (mode, ok) in [(0o600, true), (0o640, true), (0o644, false), (0o602, false)] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let r = AdminToken::load(&path);
            assert_eq!(r.is_ok(), ok, "mode {mode:o}: {r:?}");
            if !ok {
                let e = r.unwrap_err().to_string();
                assert!(e.contains("is accessible to every user") && e.contains("chmod 600"), "{e}");
            }
        }
        let e = AdminToken::load(&dir.path().join("none")).unwrap_err().to_string();
        assert!(e.starts_with("admin token file ") && e.ends_with("No such file or directory (os error 2)"), "{e}");
    }

    #[test]
    fn an_exposed_address_needs_a_token_or_insecure() {
        let open: SocketAddr = "0.0.0.0:9180".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:9180".parse().unwrap();
        let mut access = AdminAccess::default();
        let powers = Powers("do what this role's API does");
        assert!(prepare(lo, &access, powers).unwrap().is_none());
        let e = prepare(open, &access, powers).unwrap_err().to_string();
        assert!(e.starts_with("admin = \"0.0.0.0:9180\" is not a loopback address"), "{e}");
        assert!(e.contains("anyone who reaches it could do what this role's API does; set admin_token_file"), "{e}");
        access.insecure = true;
        assert!(prepare(open, &access, powers).is_ok());
        access.insecure = false;
        // A token without an admin address is unused unless a service manager passes the socket.
        assert_eq!(unused_admin_keys(&access, None, false), None, "no token file");
        access.token_file = Some("t".into());
        assert_eq!(unused_admin_keys(&access, Some(lo), false), None);
        let at_check = unused_admin_keys(&access, None, false).unwrap();
        assert!(
            at_check.starts_with("admin_token_file (t) is set but admin is not: the token guards only"),
            "{at_check}"
        );
        let at_start = unused_admin_keys(&access, None, true).unwrap();
        assert!(at_start.contains("no admin socket was passed: there is no admin endpoint"), "{at_start}");
        assert!(at_start.contains("the token file is not read; set admin, or remove admin_token_file"), "{at_start}");
        // admin_insecure without admin, alone and beside the token file.
        access.insecure = true;
        let both = unused_admin_keys(&access, None, false).unwrap();
        assert!(both.starts_with("admin_token_file (t) and admin_insecure are set but admin is not: they apply only"));
        assert!(both.ends_with("or remove them"), "{both}");
        access.token_file = None;
        let insecure = unused_admin_keys(&access, None, true).unwrap();
        assert!(insecure.starts_with("admin_insecure is set but admin is not, and no admin socket"), "{insecure}");
        assert!(insecure.ends_with("it applies to nothing; set admin, or remove admin_insecure"), "{insecure}");
        assert_eq!(unused_admin_keys(&access, Some(lo), true), None);
        assert!(AdminAccess::new(None, false, 0, 60.0).unwrap_err().to_string().contains("max_admin_connections"));
        assert!(AdminAccess::new(None, false, 4097, 60.0).is_err());
        assert!(AdminAccess::new(None, false, 4096, 3600.0).is_ok());
        assert!(AdminAccess::new(None, false, 64, 0.0).unwrap_err().to_string().contains("admin_idle_timeout_s"));
    }

    /// The `admin_*` refusals are typed: the key's value and its bound, with the messages of before.
    #[test]
    fn admin_access_errors_are_typed_with_the_value_and_bound() {
        let e = AdminAccess::new(None, false, 4097, 60.0).unwrap_err();
        assert_eq!(e, AdminAccessError::MaxConnections { got: 4097, max: 4096 });
        assert_eq!(e.to_string(), "max_admin_connections must be in 1..=4096, got 4097");
        let e = AdminAccess::new(None, false, 64, 3600.5).unwrap_err();
        assert_eq!(e, AdminAccessError::IdleTimeout { got: 3600.5, max: 3600.0 });
        assert_eq!(e.to_string(), "admin_idle_timeout_s must be in (0, 3600] seconds, got 3600.5");
        let e = AdminAccess::new(None, false, 64, f64::NAN).unwrap_err();
        assert!(matches!(e, AdminAccessError::IdleTimeout { got, .. } if got.is_nan()), "{e:?}");
        let e = AdminAccess::new(Some(PathBuf::new()), false, 64, 60.0).unwrap_err();
        assert_eq!(e, AdminAccessError::EmptyTokenFile);
        assert_eq!(e.to_string(), "admin_token_file is empty");
    }
}
