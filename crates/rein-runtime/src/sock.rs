//! NBD over TCP or a Unix-domain socket: one stream type for both, the peer it came from, the listeners,
//! and a node's address.
//!
//! # Model
//! A Unix-domain socket is how a client on the same host reaches an NBD server without the TCP stack
//! (qemu's `server.type=unix`, libnbd's `nbd+unix:///EXPORT?socket=PATH`, nbdkit's and qemu-nbd's
//! `--unix`); `rein gateway` uses it for nodes on its own host (`address = "unix:PATH"`). It is not a
//! speed-up there: over Unix links the gateway kept the same share of direct throughput as over loopback
//! TCP (docs/gateway.md, Speed), whose cost on the hop is the wake-ups, not the TCP stack. Everything
//! above the byte stream
//! (the handshake, TLS, transmission, the node protocol) is the same on both: [`Sock`] and its halves
//! delegate to the TCP or Unix socket inside.
//!
//! # Access
//! Who may connect to a Unix socket is decided by the socket file's permissions (`listen_unix_mode`,
//! default owner only, 0600). Beyond that, a Unix peer counts as the loopback address 127.0.0.1 for the
//! rules written for addresses (an export's `allow_networks`, `max_connections_per_client`, the
//! storage-node gate's `allow_networks`); TLS identities apply as on TCP. Logs name it by the
//! credentials the kernel reports (`unix(uid U, pid P)`).
//!
//! # Invariants
//! 1. [`bind_unix`] never removes anything but a socket file nothing listens on (a stale one from a
//!    server that was killed); a regular file, a directory, or a socket that a live server answers on is
//!    an error naming the path.
//! 2. The socket file is removed when its [`UnixSocketFile`] is dropped, if it is still the one bound
//!    (the same inode): a later server that took the path over keeps its own.
//! 3. No client connects before the socket file has its mode: the socket is bound, the mode set, and
//!    only then does it listen (a connection attempt in between is refused).
//! 4. A Unix socket a service manager passed ([`crate::activation`]) is served as it is: its file, its
//!    mode and its removal are the manager's (invariant 2 is for files this process bound).

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{tcp, unix, TcpListener, TcpStream, UnixListener, UnixStream};

/// Longest Unix socket path (bytes): `sockaddr_un`'s 108 less the terminating NUL.
pub const MAX_UNIX_PATH: usize = 107;
/// Mode of a Unix socket file when the configuration names none: the owner only.
pub const DEFAULT_UNIX_MODE: u32 = 0o600;

/// Where a client connection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A TCP client's address.
    Tcp(SocketAddr),
    /// A client on the Unix socket, with the credentials the kernel reports (if it does).
    Unix {
        /// Its user id.
        uid: Option<u32>,
        /// Its process id.
        pid: Option<i32>,
    },
}

impl Peer {
    /// The address the access rules see: a TCP client's IP, 127.0.0.1 for a Unix client (module comment).
    pub fn ip(&self) -> IpAddr {
        match self {
            Peer::Tcp(a) => a.ip(),
            Peer::Unix { .. } => IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Tcp(a) => write!(f, "{a}"),
            Peer::Unix { uid, pid } => {
                f.write_str("unix(")?;
                match uid {
                    Some(u) => write!(f, "uid {u}")?,
                    None => f.write_str("uid ?")?,
                }
                match pid {
                    Some(p) => write!(f, ", pid {p})"),
                    None => f.write_str(")"),
                }
            }
        }
    }
}

/// An NBD byte stream: TCP or a Unix-domain socket.
#[derive(Debug)]
pub enum Sock {
    /// Over TCP.
    Tcp(TcpStream),
    /// Over a Unix-domain socket.
    Unix(UnixStream),
}

/// The read half of a split [`Sock`].
#[derive(Debug)]
pub enum SockRead {
    /// Of a TCP stream.
    Tcp(tcp::OwnedReadHalf),
    /// Of a Unix stream.
    Unix(unix::OwnedReadHalf),
}

/// The write half of a split [`Sock`].
#[derive(Debug)]
pub enum SockWrite {
    /// Of a TCP stream.
    Tcp(tcp::OwnedWriteHalf),
    /// Of a Unix stream.
    Unix(unix::OwnedWriteHalf),
}

/// TCP keepalive on an NBD client's connection: probes after this long without traffic...
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
/// ...this far apart...
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ...and the connection fails after this many unanswered: a peer that vanished (a host powered off, a
/// network cut) frees its connection in about two minutes, while a quiet client, whose kernel answers
/// the probes, keeps it as long as it likes (NBD has no keepalive of its own, and `idle_timeout_s` is
/// off by default).
pub const KEEPALIVE_RETRIES: u32 = 6;

impl Sock {
    /// Turns off Nagle's algorithm on TCP (a Unix socket has none): replies and pieces leave when written.
    pub fn set_nodelay(&self) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_nodelay(true),
            Sock::Unix(_) => Ok(()),
        }
    }

    /// Turns on TCP keepalive ([`KEEPALIVE_IDLE`], [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_RETRIES`]); a
    /// Unix socket's peer is on this host, and its end is seen at once.
    pub fn set_keepalive(&self) -> io::Result<()> {
        let Sock::Tcp(s) = self else { return Ok(()) };
        let ka = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_RETRIES);
        socket2::SockRef::from(s).set_tcp_keepalive(&ka)
    }

    /// The peer: a TCP client's address, or a Unix client's credentials.
    pub fn peer(&self) -> io::Result<Peer> {
        match self {
            Sock::Tcp(s) => Ok(Peer::Tcp(s.peer_addr()?)),
            Sock::Unix(s) => Ok(unix_peer(s)),
        }
    }

    /// A duplicate of the socket's descriptor: shutting it down ends the connection from elsewhere
    /// ([`crate::tls::LiveTls::set`]).
    pub fn dup(&self) -> io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        match self {
            Sock::Tcp(s) => s.as_fd().try_clone_to_owned(),
            Sock::Unix(s) => s.as_fd().try_clone_to_owned(),
        }
    }

    /// Owned halves, with no lock between them.
    pub fn into_split(self) -> (SockRead, SockWrite) {
        match self {
            Sock::Tcp(s) => {
                let (r, w) = s.into_split();
                (SockRead::Tcp(r), SockWrite::Tcp(w))
            }
            Sock::Unix(s) => {
                let (r, w) = s.into_split();
                (SockRead::Unix(r), SockWrite::Unix(w))
            }
        }
    }
}

fn unix_peer(s: &UnixStream) -> Peer {
    match s.peer_cred() {
        Ok(c) => Peer::Unix { uid: Some(c.uid()), pid: c.pid() },
        Err(_) => Peer::Unix { uid: None, pid: None },
    }
}

/// Delegates the tokio IO traits to the variant's stream.
macro_rules! delegate_io {
    ($ty:ident, read) => {
        impl AsyncRead for $ty {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $ty::Tcp(s) => Pin::new(s).poll_read(cx, buf),
                    $ty::Unix(s) => Pin::new(s).poll_read(cx, buf),
                }
            }
        }
    };
    ($ty:ident, write) => {
        impl AsyncWrite for $ty {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $ty::Tcp(s) => Pin::new(s).poll_write(cx, buf),
                    $ty::Unix(s) => Pin::new(s).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $ty::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    $ty::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $ty::Tcp(s) => s.is_write_vectored(),
                    $ty::Unix(s) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $ty::Tcp(s) => Pin::new(s).poll_flush(cx),
                    $ty::Unix(s) => Pin::new(s).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $ty::Tcp(s) => Pin::new(s).poll_shutdown(cx),
                    $ty::Unix(s) => Pin::new(s).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_io!(Sock, read);
delegate_io!(Sock, write);
delegate_io!(SockRead, read);
delegate_io!(SockWrite, write);

/// Where a gateway reaches a node: `ADDRESS:PORT` over TCP, or `unix:PATH`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NodeAddress {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix socket's path.
    Unix(PathBuf),
}

impl NodeAddress {
    /// Parses `ADDRESS:PORT` or `unix:PATH` (a relative PATH is taken from `base`). The error names
    /// what is wrong, without the node's name (the caller adds it).
    pub fn parse(text: &str, base: &Path) -> Result<NodeAddress, NodeAddressError> {
        if let Some(path) = text.strip_prefix("unix:") {
            return Ok(NodeAddress::Unix(unix_path(path, base).map_err(NodeAddressError::Unix)?));
        }
        let a: SocketAddr = text.parse().map_err(|error| NodeAddressError::Address { error })?;
        if a.port() == 0 {
            return Err(NodeAddressError::PortZero);
        }
        Ok(NodeAddress::Tcp(a))
    }

    /// Connects: a stream and, on TCP, Nagle's algorithm off.
    pub async fn connect(&self) -> io::Result<Sock> {
        let s = match self {
            NodeAddress::Tcp(a) => Sock::Tcp(TcpStream::connect(a).await?),
            NodeAddress::Unix(p) => Sock::Unix(UnixStream::connect(p).await?),
        };
        s.set_nodelay()?;
        Ok(s)
    }

    /// The name a node's certificate is checked against when `tls_name` names none: the IP of a TCP
    /// address, `localhost` for a Unix socket.
    pub fn default_tls_name(&self) -> String {
        match self {
            NodeAddress::Tcp(a) => a.ip().to_string(),
            NodeAddress::Unix(_) => "localhost".into(),
        }
    }
}

/// Why a node's address is refused ([`NodeAddress::parse`]); the caller names the node and the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeAddressError {
    /// `unix:PATH` with a path that cannot be a socket's.
    #[error("{0}")]
    Unix(UnixPathError),
    /// Neither `unix:PATH` nor an IP address and port.
    #[error(
        "{error} (expected an IP address and port, such as 10.0.0.11:10809, or unix:PATH for a local socket; \
         host names are not resolved)"
    )]
    Address {
        /// Why it is no socket address.
        error: std::net::AddrParseError,
    },
    /// Port 0.
    #[error("port 0 (a node listens on a port of its own)")]
    PortZero,
}

impl fmt::Display for NodeAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeAddress::Tcp(a) => write!(f, "{a}"),
            NodeAddress::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Why a Unix socket path from the configuration is refused ([`unix_path`]); the caller names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnixPathError {
    /// An empty path.
    #[error("an empty Unix socket path")]
    Empty,
    /// A path with a NUL byte.
    #[error("Unix socket path {text:?} contains NUL")]
    Nul {
        /// The path given.
        text: String,
    },
    /// A path longer than a socket address holds, once joined to its base.
    #[error("Unix socket path {} has {bytes} bytes; the system allows at most {max}", path.display())]
    TooLong {
        /// The path, joined to its base.
        path: PathBuf,
        /// Its length in bytes.
        bytes: usize,
        /// The longest accepted ([`MAX_UNIX_PATH`]).
        max: usize,
    },
}

/// A socket file mode that is not octal `0000..=0777` ([`unix_mode`]); the caller names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a file mode (octal, 0000..=0777, such as \"0660\")")]
pub struct UnixModeError {
    /// The text given.
    pub text: String,
}

/// Why `listen_unix`, `listen_unix_mode` or `--listen-unix` is refused ([`UnixListen`]); the message
/// names which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnixListenError {
    /// `listen_unix` is not a usable path.
    #[error("listen_unix: {0}")]
    Path(UnixPathError),
    /// `listen_unix_mode` is not a file mode.
    #[error("listen_unix_mode: {0}")]
    Mode(UnixModeError),
    /// `listen_unix_mode` without `listen_unix`.
    #[error("listen_unix_mode needs listen_unix")]
    ModeWithoutPath,
    /// `--listen-unix` is not a usable path.
    #[error("--listen-unix: {0}")]
    CommandLine(UnixPathError),
}

/// A Unix socket path from the configuration: not empty, within [`MAX_UNIX_PATH`] bytes once joined to
/// `base` (the configuration file's directory) if relative, without NUL.
pub fn unix_path(text: &str, base: &Path) -> Result<PathBuf, UnixPathError> {
    if text.is_empty() {
        return Err(UnixPathError::Empty);
    }
    if text.contains('\0') {
        return Err(UnixPathError::Nul { text: text.to_string() });
    }
    let path = base.join(text);
    let bytes = path.as_os_str().len();
    if bytes > MAX_UNIX_PATH {
        return Err(UnixPathError::TooLong { path, bytes, max: MAX_UNIX_PATH });
    }
    Ok(path)
}

/// A socket file mode from the configuration: octal digits (`"0660"`, `"660"`), at most 0o777.
pub fn unix_mode(text: &str) -> Result<u32, UnixModeError> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o777 && !digits.is_empty() => Ok(m),
        _ => Err(UnixModeError { text: text.to_string() }),
    }
}

/// A Unix socket to listen on (`listen_unix`, `listen_unix_mode`), beside the TCP `listen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixListen {
    /// The socket file's path.
    pub path: PathBuf,
    /// Its file mode.
    pub mode: u32,
}

impl UnixListen {
    /// From the configuration's `listen_unix` (a relative path is taken from `base`, the configuration
    /// file's directory) and `listen_unix_mode` (default [`DEFAULT_UNIX_MODE`]); none without a path.
    pub fn from_config(
        path: Option<&str>,
        mode: Option<&str>,
        base: &Path,
    ) -> Result<Option<UnixListen>, UnixListenError> {
        let mode = mode.map(unix_mode).transpose().map_err(UnixListenError::Mode)?;
        match path {
            None if mode.is_some() => Err(UnixListenError::ModeWithoutPath),
            None => Ok(None),
            Some(p) => Ok(Some(UnixListen {
                path: unix_path(p, base).map_err(UnixListenError::Path)?,
                mode: mode.unwrap_or(DEFAULT_UNIX_MODE),
            })),
        }
    }

    /// A command line's `--listen-unix PATH` over `current` (relative to the working directory; the mode
    /// stays `current`'s, or the default).
    pub fn from_command_line(path: &str, current: Option<&UnixListen>) -> Result<UnixListen, UnixListenError> {
        let path = unix_path(path, Path::new("")).map_err(UnixListenError::CommandLine)?;
        Ok(UnixListen { path, mode: current.map_or(DEFAULT_UNIX_MODE, |u| u.mode) })
    }
}

/// A bound Unix socket file: removed when dropped if it is still the one bound (invariant 2).
#[derive(Debug)]
pub struct UnixSocketFile {
    path: PathBuf,
    inode: (u64, u64),
}

impl UnixSocketFile {
    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for UnixSocketFile {
    fn drop(&mut self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.inode {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Binds a Unix socket at `path` with file mode `mode`, replacing a stale socket file nothing listens on
/// (invariant 1). Must run inside a tokio runtime.
pub fn bind_unix(path: &Path, mode: u32) -> Result<(UnixListener, UnixSocketFile), UnixBindError> {
    let at = || path.to_path_buf();
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(UnixBindError::Live { path: at() }),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path).map_err(|source| UnixBindError::RemoveStale { path: at(), source })?;
                tracing::info!(path = %path.display(), "removed a stale Unix socket (nothing listened on it)");
            }
            Err(source) => return Err(UnixBindError::Unknown { path: at(), source }),
        },
        Ok(_) => return Err(UnixBindError::NotSocket { path: at() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(UnixBindError::Io { path: at(), source }),
    }
    // Bound, given its mode, and only then listening: no client connects under the umask's mode first.
    let err = |source: io::Error| UnixBindError::Io { path: at(), source };
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).map_err(err)?;
    socket.bind(&socket2::SockAddr::unix(path).map_err(err)?).map_err(err)?;
    let m = std::fs::symlink_metadata(path).map_err(err)?;
    let file = UnixSocketFile { path: path.to_path_buf(), inode: (m.dev(), m.ino()) };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| UnixBindError::Mode {
        path: at(),
        mode,
        source,
    })?;
    socket.listen(1024).map_err(err)?;
    socket.set_nonblocking(true).map_err(err)?;
    let listener = UnixListener::from_std(socket.into()).map_err(err)?;
    Ok((listener, file))
}

/// Why a Unix socket cannot be bound at its path ([`bind_unix`]): the path, and what is there or what
/// the operating system said.
#[derive(Debug, thiserror::Error)]
pub enum UnixBindError {
    /// A server listens on the socket at the path (invariant 1: it is not replaced).
    #[error("{}: another server listens on this socket", .path.display())]
    Live {
        /// The socket's path.
        path: PathBuf,
    },
    /// A stale socket (nothing listens on it) could not be removed.
    #[error("{}: cannot remove the stale socket: {source}", .path.display())]
    RemoveStale {
        /// The socket's path.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// A socket is there, and connecting to it neither reached a server nor was refused.
    #[error("{}: exists, and cannot tell whether a server listens on it: {source}", .path.display())]
    Unknown {
        /// The socket's path.
        path: PathBuf,
        /// The error connecting to it.
        source: io::Error,
    },
    /// Something other than a socket is at the path (invariant 1: it is not removed).
    #[error("{}: exists and is not a socket (not removed)", .path.display())]
    NotSocket {
        /// The path.
        path: PathBuf,
    },
    /// The socket file's mode could not be set.
    #[error("{}: cannot set mode {mode:04o}: {source}", .path.display())]
    Mode {
        /// The socket's path.
        path: PathBuf,
        /// The mode asked for.
        mode: u32,
        /// The operating system's error.
        source: io::Error,
    },
    /// The socket file's directory does not exist (found by `rein serve --check-config`; a start would
    /// fail to bind).
    #[error("{}: its directory {} does not exist (listen_unix)", .path.display(), .dir.display())]
    NoDirectory {
        /// The socket's path.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
    },
    /// The operating system refused to look at the path, or to make, bind or listen on the socket.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The socket's path.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
}

/// A daemon's NBD listeners (`rein serve`'s and `rein gateway`'s): TCP and, if configured, the Unix
/// socket (with its file); or the sockets a service manager passed ([`crate::activation`]), any number
/// of TCP and Unix ones.
#[derive(Debug)]
pub struct NbdListeners {
    listeners: Vec<NbdListener>,
    /// Where the next [`NbdListeners::accept`] starts looking: the one after the last that gave a
    /// connection, so that a listener with a queue always waiting does not starve the others.
    next: std::sync::atomic::AtomicUsize,
}

#[derive(Debug)]
enum NbdListener {
    Tcp(TcpListener),
    /// With the socket file to remove at the end if this process bound it; none for a passed socket,
    /// whose file is the service manager's (`crate::activation`, invariant 3).
    Unix(UnixListener, Option<UnixSocketFile>),
}

/// Binds a TCP listener on `addr` as tokio's `TcpListener::bind` does (`SO_REUSEADDR`, a backlog of
/// 1,024), except that an IPv6 wildcard (`[::]`) takes IPv4 too whatever the host's
/// `net.ipv6.bindv6only`: an operator who writes `[::]` means every address, and the configuration's
/// checks take `[::]:p` to cover `0.0.0.0:p` (`config::distinct_fronts`). Before, under
/// `bindv6only = 1` such a listener took IPv6 only: IPv4 clients were refused, and an admin endpoint on
/// `0.0.0.0` with the same port, refused by the check, would have bound. Must run inside a tokio runtime.
pub fn bind_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    if let IpAddr::V6(ip) = addr.ip() {
        if ip.is_unspecified() {
            s.set_only_v6(false)?;
        }
    }
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    TcpListener::from_std(s.into())
}

/// Why a daemon's NBD listeners could not be set up ([`NbdListeners::open`]).
#[derive(Debug)]
pub enum NbdListenError {
    /// `listen` (the address) could not be bound.
    Bind(SocketAddr, io::Error),
    /// `listen_unix` could not be bound; the error names the path and why.
    BindUnix(UnixBindError),
    /// A passed socket cannot be used; the error names its descriptor.
    Activation(crate::activation::ActivationError),
}

impl NbdListeners {
    /// A daemon's NBD listeners: the sockets a service manager passed for NBD, in place of `listen` and
    /// `listen_unix` (each logged at info, naming what it replaces), or, with none passed, `listen` and
    /// `listen_unix` bound here. Must run inside a tokio runtime.
    pub async fn open(
        listen: SocketAddr,
        listen_unix: Option<&UnixListen>,
        passed: Vec<crate::activation::PassedSocket>,
    ) -> Result<NbdListeners, NbdListenError> {
        if passed.is_empty() {
            let tcp = bind_tcp(listen).map_err(|e| NbdListenError::Bind(listen, e))?;
            return NbdListeners::new(tcp, listen_unix).map_err(NbdListenError::BindUnix);
        }
        let instead = match listen_unix {
            Some(u) => format!("listen = {listen} and listen_unix = {}", u.path.display()),
            None => format!("listen = {listen}"),
        };
        for s in &passed {
            s.log_use("NBD", &instead);
        }
        NbdListeners::passed(passed).map_err(NbdListenError::Activation)
    }

    /// The bound TCP listener and, if `unix` names one, the Unix socket, bound here ([`bind_unix`]).
    pub fn new(tcp: TcpListener, unix: Option<&UnixListen>) -> Result<NbdListeners, UnixBindError> {
        let mut listeners = vec![NbdListener::Tcp(tcp)];
        if let Some(u) = unix {
            let (l, file) = bind_unix(&u.path, u.mode)?;
            listeners.push(NbdListener::Unix(l, Some(file)));
        }
        Ok(NbdListeners { listeners, next: Default::default() })
    }

    /// The sockets a service manager passed for NBD (at least one), for tokio; the error names the
    /// descriptor. Must run inside a tokio runtime.
    pub fn passed(
        sockets: Vec<crate::activation::PassedSocket>,
    ) -> Result<NbdListeners, crate::activation::ActivationError> {
        let mut listeners = Vec::with_capacity(sockets.len());
        for s in sockets {
            let err = |source: io::Error| crate::activation::ActivationError::Io { fd: s.fd, source };
            listeners.push(match s.listener {
                crate::activation::Listener::Tcp(l) => NbdListener::Tcp(TcpListener::from_std(l).map_err(err)?),
                crate::activation::Listener::Unix(l) => {
                    NbdListener::Unix(UnixListener::from_std(l).map_err(err)?, None)
                }
            });
        }
        if listeners.is_empty() {
            return Err(crate::activation::ActivationError::NoNbd);
        }
        Ok(NbdListeners { listeners, next: Default::default() })
    }

    /// The first TCP listener's address; none when NBD is on passed Unix sockets only.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.listeners.iter().find_map(|l| match l {
            NbdListener::Tcp(t) => t.local_addr().ok(),
            NbdListener::Unix(..) => None,
        })
    }

    /// The TCP listeners' addresses for the "listening" log line (`none` without one).
    pub fn tcp_shown(&self) -> String {
        let shown: Vec<String> = self
            .listeners
            .iter()
            .filter_map(|l| match l {
                NbdListener::Tcp(t) => {
                    Some(t.local_addr().map_or_else(|e| format!("(unknown: {e})"), |a| a.to_string()))
                }
                NbdListener::Unix(..) => None,
            })
            .collect();
        if shown.is_empty() {
            "none".into()
        } else {
            shown.join(", ")
        }
    }

    /// The Unix sockets' paths for the "listening" log line (empty without one).
    pub fn unix_shown(&self) -> String {
        let shown: Vec<String> = self
            .listeners
            .iter()
            .filter_map(|l| match l {
                NbdListener::Tcp(_) => None,
                NbdListener::Unix(_, Some(f)) => Some(f.path().display().to_string()),
                NbdListener::Unix(u, None) => Some(
                    u.local_addr()
                        .map_or_else(|e| format!("(unknown: {e})"), |a| crate::activation::unix_shown(&a.into())),
                ),
            })
            .collect();
        shown.join(", ")
    }

    /// Every listener, for the service manager's status line: the TCP addresses, then the Unix paths.
    pub fn shown(&self) -> String {
        match (self.tcp_shown(), self.unix_shown()) {
            (t, u) if u.is_empty() => t,
            (t, u) if t == "none" => u,
            (t, u) => format!("{t}, {u}"),
        }
    }

    /// The next connection on any of them, and its peer. Cancel-safe (a connection is taken only when
    /// it is returned).
    pub async fn accept(&self) -> io::Result<(Sock, Peer)> {
        use std::sync::atomic::Ordering::Relaxed;
        std::future::poll_fn(|cx| {
            let n = self.listeners.len();
            let start = self.next.load(Relaxed);
            for k in 0..n {
                let i = (start + k) % n;
                let ready = match &self.listeners[i] {
                    NbdListener::Tcp(l) => l.poll_accept(cx).map_ok(|(s, a)| (Sock::Tcp(s), Peer::Tcp(a))),
                    NbdListener::Unix(l, _) => l.poll_accept(cx).map_ok(|(s, _)| {
                        let peer = unix_peer(&s);
                        (Sock::Unix(s), peer)
                    }),
                };
                if ready.is_ready() {
                    self.next.store((i + 1) % n, Relaxed);
                    return ready;
                }
            }
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn node_addresses_parse_with_clear_errors() {
        let base = Path::new("/etc/rein");
        assert_eq!(
            NodeAddress::parse("127.0.0.2:10809", base).unwrap(),
            NodeAddress::Tcp("127.0.0.2:10809".parse().unwrap())
        );
        assert_eq!(NodeAddress::parse("unix:/run/n.sock", base).unwrap(), NodeAddress::Unix("/run/n.sock".into()));
        assert_eq!(NodeAddress::parse("unix:n.sock", base).unwrap(), NodeAddress::Unix("/etc/rein/n.sock".into()));
        assert_eq!(NodeAddress::parse("unix:/run/n.sock", base).unwrap().to_string(), "unix:/run/n.sock");
        assert!(NodeAddress::parse("nowhere", base).unwrap_err().to_string().contains("or unix:PATH"));
        assert!(NodeAddress::parse("127.0.0.2:0", base).unwrap_err().to_string().contains("port 0"));
        assert!(NodeAddress::parse("unix:", base).unwrap_err().to_string().contains("empty"));
        let long = format!("unix:/{}", "a".repeat(MAX_UNIX_PATH));
        assert!(NodeAddress::parse(&long, base).unwrap_err().to_string().contains("at most 107"));
        // At the bound: 107 bytes is accepted.
        let at = format!("unix:/{}", "a".repeat(MAX_UNIX_PATH - 1));
        assert!(NodeAddress::parse(&at, base).is_ok());
        assert_eq!(NodeAddress::parse("unix:/x", base).unwrap().default_tls_name(), "localhost");
    }

    #[test]
    fn listen_unix_settings() {
        let base = Path::new("/etc/rein");
        assert_eq!(UnixListen::from_config(None, None, base).unwrap(), None);
        let u = UnixListen::from_config(Some("nbd.sock"), None, base).unwrap().unwrap();
        assert_eq!((u.path.as_path(), u.mode), (Path::new("/etc/rein/nbd.sock"), 0o600));
        let u = UnixListen::from_config(Some("/run/n.sock"), Some("0660"), base).unwrap().unwrap();
        assert_eq!(u.mode, 0o660);
        assert_eq!(
            UnixListen::from_config(None, Some("0660"), base).unwrap_err().to_string(),
            "listen_unix_mode needs listen_unix"
        );
        assert!(UnixListen::from_config(Some("x"), Some("9"), base)
            .unwrap_err()
            .to_string()
            .starts_with("listen_unix_mode: "));
        assert!(UnixListen::from_config(Some(""), None, base).unwrap_err().to_string().starts_with("listen_unix: "));
        let cli = UnixListen::from_command_line("x.sock", Some(&u)).unwrap();
        assert_eq!((cli.path.as_path(), cli.mode), (Path::new("x.sock"), 0o660));
        assert_eq!(UnixListen::from_command_line("x.sock", None).unwrap().mode, DEFAULT_UNIX_MODE);
        assert!(UnixListen::from_command_line("", None).unwrap_err().to_string().starts_with("--listen-unix: "));
    }

    /// The refusals are typed: which key, and the path or mode with its bound, as the messages of before.
    #[test]
    fn unix_socket_errors_are_typed_with_the_key_value_and_bound() {
        let base = Path::new("/etc/rein");
        let e = UnixListen::from_config(Some("x"), Some("1777"), base).unwrap_err();
        assert_eq!(e, UnixListenError::Mode(UnixModeError { text: "1777".into() }));
        assert_eq!(
            e.to_string(),
            "listen_unix_mode: \"1777\" is not a file mode (octal, 0000..=0777, such as \"0660\")"
        );
        assert_eq!(UnixListen::from_config(None, Some("0600"), base), Err(UnixListenError::ModeWithoutPath));
        assert_eq!(UnixListen::from_config(Some(""), None, base), Err(UnixListenError::Path(UnixPathError::Empty)));
        let e = UnixListen::from_config(Some("a\0b"), None, base).unwrap_err();
        assert_eq!(e, UnixListenError::Path(UnixPathError::Nul { text: "a\0b".into() }));
        // Too long once joined to the base: the joined path, its length and the bound.
        let name = "a".repeat(MAX_UNIX_PATH - "/etc/rein/".len() + 1);
        let e = UnixListen::from_config(Some(&name), None, base).unwrap_err();
        let joined = base.join(&name);
        assert_eq!(
            e,
            UnixListenError::Path(UnixPathError::TooLong { path: joined.clone(), bytes: MAX_UNIX_PATH + 1, max: 107 })
        );
        assert_eq!(
            e.to_string(),
            format!("listen_unix: Unix socket path {} has 108 bytes; the system allows at most 107", joined.display())
        );
        assert!(UnixListen::from_config(Some(&name[1..]), None, base).is_ok(), "at the bound");
        let e = UnixListen::from_command_line("", None).unwrap_err();
        assert_eq!(e, UnixListenError::CommandLine(UnixPathError::Empty));
        assert_eq!(e.to_string(), "--listen-unix: an empty Unix socket path");
        // A node's address: the path's own refusal, a socket address's, or port 0.
        assert_eq!(NodeAddress::parse("unix:", base), Err(NodeAddressError::Unix(UnixPathError::Empty)));
        assert_eq!(NodeAddress::parse("127.0.0.2:0", base), Err(NodeAddressError::PortZero));
        let e = NodeAddress::parse("node1:10809", base).unwrap_err();
        assert!(matches!(e, NodeAddressError::Address { .. }), "{e:?}");
        assert!(e.to_string().ends_with("unix:PATH for a local socket; host names are not resolved)"), "{e}");
    }

    #[test]
    fn modes_parse_as_octal() {
        assert_eq!(unix_mode("0660").unwrap(), 0o660);
        assert_eq!(unix_mode("600").unwrap(), 0o600);
        assert_eq!(unix_mode("0o777").unwrap(), 0o777);
        assert!(unix_mode("1777").unwrap_err().to_string().contains("0000..=0777"));
        assert!(unix_mode("rw").is_err());
        assert!(unix_mode("").is_err());
    }

    /// `[::]` takes IPv4 too under `net.ipv6.bindv6only = 1`: in a network namespace of its own (the
    /// sysctl is per namespace; unshare on a thread of its own, which moves only that thread), a plain
    /// bind there is IPv6 only, and [`bind_tcp`]'s is not.
    #[test]
    #[allow(unsafe_code)] // unshare(2) has no safe wrapper in std; see the SAFETY comment.
    fn an_ipv6_wildcard_takes_ipv4_too_whatever_bindv6only_says() {
        std::thread::spawn(|| {
            // SAFETY: unshare takes no pointers; it moves this thread (not the process) to a new namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "{}", io::Error::last_os_error());
            // The namespace's own value (net sysctls resolve by the calling thread's namespace); the
            // plain bind below checks that it took there.
            std::fs::write("/proc/sys/net/ipv6/bindv6only", "1").unwrap();
            let wild: SocketAddr = "[::]:0".parse().unwrap();
            let plain = std::net::TcpListener::bind(wild).unwrap();
            assert!(socket2::SockRef::from(&plain).only_v6().unwrap(), "the sysctl did not take");
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let ours = rt.block_on(async { bind_tcp(wild) }).unwrap();
            assert!(!socket2::SockRef::from(&ours).only_v6().unwrap(), "bind_tcp's [::] is IPv6 only");
            let v4: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let l = rt.block_on(async { bind_tcp(v4) }).unwrap();
            assert!(l.local_addr().unwrap().is_ipv4());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn peers_show_and_count_as_loopback() {
        let u = Peer::Unix { uid: Some(0), pid: Some(42) };
        assert_eq!(u.to_string(), "unix(uid 0, pid 42)");
        assert_eq!(u.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(Peer::Unix { uid: None, pid: None }.to_string(), "unix(uid ?)");
        let t = Peer::Tcp("127.0.0.9:5".parse().unwrap());
        assert_eq!((t.to_string().as_str(), t.ip()), ("127.0.0.9:5", "127.0.0.9".parse::<IpAddr>().unwrap()));
    }

    #[tokio::test]
    async fn bind_replaces_only_a_stale_socket_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        // A stale socket (bound, then its listener dropped without removing the file) is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let l = NbdListeners::new(tcp, Some(&UnixListen { path: path.clone(), mode: 0o640 })).unwrap();
        assert_eq!(l.unix_shown(), path.display().to_string());
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
        // Bytes pass both ways, and the peer is the caller's process.
        let client = async {
            let mut c = NodeAddress::Unix(path.clone()).connect().await.unwrap();
            c.write_all(b"ping").await.unwrap();
            let mut b = [0u8; 4];
            c.read_exact(&mut b).await.unwrap();
            b
        };
        let server = async {
            let (s, peer) = l.accept().await.unwrap();
            assert_eq!(peer, Peer::Unix { uid: Some(my_uid()), pid: Some(std::process::id() as i32) });
            let (mut r, mut w) = s.into_split();
            let mut b = [0u8; 4];
            r.read_exact(&mut b).await.unwrap();
            w.write_all(b"pong").await.unwrap();
        };
        let (got, ()) = tokio::join!(client, server);
        assert_eq!(&got, b"pong");
        // A live one is not replaced (the probe's connection is one the live server sees close at once).
        let e = bind_unix(&path, 0o600).unwrap_err();
        assert!(matches!(&e, UnixBindError::Live { path: p } if *p == path), "{e:?}");
        assert!(e.to_string().contains("another server listens"), "{e}");
        let tcp = tokio::net::TcpListener::bind("127.0.0.211:0").await.unwrap();
        let e = NbdListeners::new(tcp, Some(&UnixListen { path: path.clone(), mode: 0o600 })).unwrap_err();
        assert_eq!(e.to_string(), format!("{}: another server listens on this socket", path.display()));
        drop(l);
        assert!(!path.exists(), "the socket file is removed with its listener");
        // A regular file at the path is left alone.
        std::fs::write(&path, b"data").unwrap();
        let e = bind_unix(&path, 0o600).unwrap_err();
        assert!(matches!(&e, UnixBindError::NotSocket { path: p } if *p == path), "{e:?}");
        assert_eq!(e.to_string(), format!("{}: exists and is not a socket (not removed)", path.display()));
        assert_eq!(std::fs::read(&path).unwrap(), b"data");
    }

    #[tokio::test]
    async fn passed_sockets_take_turns_and_a_passed_socket_file_is_left_to_its_owner() {
        use crate::activation::{Listener, PassedSocket};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("passed.sock");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
        tcp.set_nonblocking(true).unwrap();
        unix.set_nonblocking(true).unwrap();
        let addr = tcp.local_addr().unwrap();
        let l = NbdListeners::passed(vec![
            PassedSocket { fd: 3, listener: Listener::Tcp(tcp) },
            PassedSocket { fd: 4, listener: Listener::Unix(unix) },
        ])
        .unwrap();
        assert_eq!(l.tcp_addr(), Some(addr));
        assert_eq!(l.shown(), format!("{addr}, {}", path.display()));
        // Two TCP connections and a Unix one waiting: the Unix one is taken second, not after every TCP
        // one (the listeners take turns).
        let _t1 = TcpStream::connect(addr).await.unwrap();
        let _t2 = TcpStream::connect(addr).await.unwrap();
        let _u = UnixStream::connect(&path).await.unwrap();
        // Time for the TCP handshakes' last ACK to land the connections in the accept queue.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let mut kinds = Vec::new();
        for _ in 0..3 {
            let (_, peer) = l.accept().await.unwrap();
            kinds.push(matches!(peer, Peer::Tcp(_)));
        }
        assert_eq!(kinds, [true, false, true], "TCP, Unix, TCP");
        drop(l);
        assert!(path.exists(), "a passed socket's file is the service manager's");

        let unix = std::os::unix::net::UnixListener::bind(dir.path().join("only.sock")).unwrap();
        unix.set_nonblocking(true).unwrap();
        let l = NbdListeners::passed(vec![PassedSocket { fd: 3, listener: Listener::Unix(unix) }]).unwrap();
        assert_eq!((l.tcp_addr(), l.tcp_shown()), (None, "none".to_string()));
        assert_eq!(l.shown(), dir.path().join("only.sock").display().to_string());
        let e = NbdListeners::passed(vec![]).unwrap_err();
        assert!(matches!(e, crate::activation::ActivationError::NoNbd), "{e:?}");
        assert_eq!(e.to_string(), "no NBD socket was passed");
    }

    /// The process's user id, from the file it just created (no unsafe `getuid`).
    fn my_uid() -> u32 {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::metadata(f.path()).unwrap().uid()
    }
}
