//! # Listening sockets passed by a service manager (systemd's socket activation)
//!
//! A service manager can bind a daemon's listening sockets itself and pass them, open, to the daemon
//! it starts (sd_listen_fds(3)): descriptors 3, 4, ... with `$LISTEN_FDS` saying how many,
//! `$LISTEN_PID` which process they are for and `$LISTEN_FDNAMES` their names (a socket unit's
//! `FileDescriptorName=`). The sockets stay open in the manager while the daemon restarts, so a client
//! that connects meanwhile waits in the kernel's queue and is served by the next daemon instead of being
//! refused; and the daemon needs no right to bind (a port below 1024, an address the manager chose).
//!
//! # Roles
//! Names decide what a socket is for. Each daemon lists its roles ([`Role`]): `nbd` ([`NBD`], `rein
//! serve`'s and `rein gateway`'s NBD listener: TCP or a Unix stream socket, as many as passed),
//! `admin` ([`ADMIN`], the HTTP endpoint: one TCP socket) and `pshift` ([`PSHIFT`], where a pShift
//! controller's servers connect: one TCP socket). A socket without a name (no `$LISTEN_FDNAMES`, the
//! name `unknown` or an empty one, or systemd's default, the socket unit's own name `NAME.socket`) takes
//! the daemon's first role, if it is the only socket passed. The daemon serves a role on its passed
//! sockets in place of the configuration's addresses for it (`listen` and `listen_unix` for `nbd`,
//! `admin` for `admin`), and says so in its log; a role without a passed socket is bound as configured.
//!
//! # Refused
//! Anything else stops the start with one error naming the descriptor and what is wrong with it (the
//! first found, in descriptor order): a name the daemon has no role for, a socket without a name among
//! several, a second socket for a role that takes one, a socket that is not a stream socket
//! (`ListenDatagram=`, `ListenSequentialPacket=`), one that does not listen (`Accept=yes` passes
//! connections, not listeners), a Unix socket for a role served over TCP, a descriptor that is not a
//! socket or not open; and `$LISTEN_FDS` without a `$LISTEN_PID` naming this process (a wrapper that
//! started the daemon as its child, without `exec`, or passed the variables on). sd_listen_fds(3)
//! ignores the variables then; here that would leave the daemon binding addresses the manager holds
//! (failing on "address in use", or serving beside the manager's socket), so it is said instead.
//!
//! # Invariants
//! 1. The descriptors are taken at most once per process ([`from_env`]): each is owned by one
//!    [`OwnedFd`], however many daemons a process runs.
//! 2. A taken descriptor is close-on-exec (the manager passes them without the flag).
//! 3. A passed Unix socket's file belongs to the manager: the daemon never removes it
//!    ([`crate::sock::NbdListeners`]), or the next start would listen on a socket nobody can reach.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// The environment variables of the protocol, removed from the environment of the daemons `rein cluster`
/// starts (they are for `rein cluster` itself, not for its children).
pub const ENV: [&str; 3] = ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"];

/// The first passed descriptor (`SD_LISTEN_FDS_START`).
pub(crate) const FIRST_FD: RawFd = 3;

/// The most sockets a daemon is passed (`$LISTEN_FDS`); more is refused before anything is taken.
pub const MAX_PASSED: u32 = 1024;

/// What a daemon does with a passed socket of this name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    /// The name (`FileDescriptorName=`).
    pub name: &'static str,
    /// What the socket serves, for the log and errors.
    pub what: &'static str,
    /// Whether a Unix stream socket serves it (else TCP only).
    pub unix: bool,
    /// Whether it takes several sockets (else one).
    pub many: bool,
}

/// NBD: `rein serve`'s and `rein gateway`'s listeners, TCP or Unix, as many as passed.
pub const NBD: Role = Role { name: "nbd", what: "NBD", unix: true, many: true };
/// The HTTP admin endpoint: one TCP socket (its access rules judge peers by address).
pub const ADMIN: Role = Role { name: "admin", what: "the admin endpoint", unix: false, many: false };
/// Where a pShift controller's servers connect: one TCP socket.
pub const PSHIFT: Role = Role { name: "pshift", what: "the pShift link", unix: false, many: false };

/// A passed listening socket, blocking mode off (ready for tokio's `from_std`).
#[derive(Debug)]
pub enum Listener {
    /// TCP, IPv4 or IPv6.
    Tcp(std::net::TcpListener),
    /// A Unix stream socket.
    Unix(std::os::unix::net::UnixListener),
}

impl Listener {
    /// Its local address for the log: `ADDRESS:PORT`, a Unix socket's path, `@NAME` for an abstract one.
    pub fn shown(&self) -> String {
        match self {
            Listener::Tcp(l) => l.local_addr().map_or_else(|e| format!("(address unknown: {e})"), |a| a.to_string()),
            Listener::Unix(l) => match l.local_addr() {
                Ok(a) => unix_shown(&a),
                Err(e) => format!("(address unknown: {e})"),
            },
        }
    }
}

/// A Unix socket's address for the log.
pub(crate) fn unix_shown(a: &std::os::unix::net::SocketAddr) -> String {
    use std::os::linux::net::SocketAddrExt;
    if let Some(p) = a.as_pathname() {
        p.display().to_string()
    } else if let Some(name) = a.as_abstract_name() {
        format!("@{}", String::from_utf8_lossy(name))
    } else {
        "(unnamed Unix socket)".into()
    }
}

/// A passed socket with its descriptor's number (for the log).
#[derive(Debug)]
pub struct PassedSocket {
    /// The descriptor it was passed as.
    pub fd: RawFd,
    /// The socket.
    pub listener: Listener,
}

impl PassedSocket {
    /// Logs, at info, that this socket serves `what` in place of the configuration's `instead`.
    pub fn log_use(&self, what: &str, instead: &str) {
        let address = self.listener.shown();
        tracing::info!(
            fd = self.fd,
            %address,
            "{what} on the socket passed by the service manager (fd {}, {address}), in place of {instead}",
            self.fd
        );
    }

    /// A TCP socket's local address (the error names the descriptor).
    pub fn tcp_addr(&self) -> Result<std::net::SocketAddr, ActivationError> {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr().map_err(|source| ActivationError::Io { fd: self.fd, source }),
            Listener::Unix(_) => Err(ActivationError::UnixForTcp { fd: self.fd }),
        }
    }

    /// The TCP listener for tokio (a role served over TCP never holds a Unix socket: [`from_env`]
    /// refuses one). The error names the descriptor. Must run inside a tokio runtime.
    pub fn into_tcp(self) -> Result<tokio::net::TcpListener, ActivationError> {
        match self.listener {
            Listener::Tcp(l) => {
                tokio::net::TcpListener::from_std(l).map_err(|source| ActivationError::Io { fd: self.fd, source })
            }
            Listener::Unix(_) => Err(ActivationError::UnixForTcp { fd: self.fd }),
        }
    }
}

/// The passed sockets by role; empty when nothing was passed.
#[derive(Debug, Default)]
pub struct Passed {
    sockets: Vec<(&'static str, PassedSocket)>,
}

impl Passed {
    /// No socket passed: every role is bound as configured.
    pub fn none() -> Passed {
        Passed::default()
    }

    /// The sockets for `role`, taken out (in descriptor order).
    pub fn take(&mut self, role: &Role) -> Vec<PassedSocket> {
        let (mine, rest) = std::mem::take(&mut self.sockets).into_iter().partition(|(r, _)| *r == role.name);
        self.sockets = rest;
        mine.into_iter().map(|(_, s)| s).collect()
    }

    /// The socket of a role that takes one ([`ADMIN`], [`PSHIFT`]), taken out.
    pub fn take_one(&mut self, role: &Role) -> Option<PassedSocket> {
        self.take(role).into_iter().next()
    }
}

#[cfg(test)]
impl Passed {
    /// `listener` (non-blocking) as if passed for `role`: a daemon's tests that need a socket option set
    /// before it listens.
    pub(crate) fn tcp(role: &Role, listener: std::net::TcpListener) -> Passed {
        Passed { sockets: vec![(role.name, PassedSocket { fd: -1, listener: Listener::Tcp(listener) })] }
    }
}

/// Set once the passed descriptors are taken (invariant 1).
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The sockets this process was passed (`$LISTEN_FDS`, `$LISTEN_PID`, `$LISTEN_FDNAMES`), each given
/// one of `roles` by its name; `daemon` names the daemon in errors. None passed (no `$LISTEN_FDS`):
/// [`Passed::none`]. The error names the descriptor and what is wrong (module comment, "Refused").
///
/// Call it early, before the process opens descriptors of its own (the binary does, before its
/// runtime): the variables are the manager's word that descriptors 3 and on were open when this
/// process started, and are this process's to take.
pub fn from_env(daemon: &str, roles: &[Role]) -> Result<Passed, ActivationError> {
    let var = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
    let listed = listed(
        var("LISTEN_FDS").as_deref(),
        var("LISTEN_PID").as_deref(),
        var("LISTEN_FDNAMES").as_deref(),
        std::process::id(),
    )?;
    if listed.is_empty() {
        return Ok(Passed::none());
    }
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Err(ActivationError::TakenAlready);
    }
    let count = listed.len();
    let mut taken = Vec::with_capacity(count);
    for (fd, name) in listed {
        let owned = take_fd(fd).map_err(|source| match source.raw_os_error() {
            Some(libc::EBADF) => ActivationError::NotOpen { fd, count },
            _ => ActivationError::Io { fd, source },
        })?;
        taken.push((fd, name, owned));
    }
    assign(daemon, roles, taken)
}

/// Why the passed sockets cannot be taken ([`from_env`]), or a passed socket cannot serve what it is
/// for ([`PassedSocket::tcp_addr`], [`PassedSocket::into_tcp`], [`crate::sock::NbdListeners::passed`]):
/// the variable, or the descriptor and what is wrong with it (module comment, "Refused").
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    /// `$LISTEN_FDS`, `$LISTEN_PID` or `$LISTEN_FDNAMES` pass no sockets this process can take.
    #[error(transparent)]
    Env(#[from] ListenEnvError),
    /// Another daemon in this process took the descriptors first (invariant 1).
    #[error("the passed sockets were taken already, by another daemon in this process")]
    TakenAlready,
    /// A descriptor `$LISTEN_FDS` passes is not open.
    #[error("fd {fd}: not open (LISTEN_FDS={count} passes fds {FIRST_FD} to {})", last_passed(.count))]
    NotOpen {
        /// The descriptor.
        fd: RawFd,
        /// How many `$LISTEN_FDS` passes.
        count: usize,
    },
    /// The operating system refused an operation on a passed descriptor (taking it, its address, its
    /// registration with tokio).
    #[error("fd {fd}: {source}")]
    Io {
        /// The descriptor.
        fd: RawFd,
        /// The operating system's error.
        source: io::Error,
    },
    /// A socket without a name of its own among several (only a lone one takes the first role).
    #[error(
        "fd {fd} has {} among {count} passed sockets: name each (FileDescriptorName=: {names})",
        no_name_shown(.name)
    )]
    Unnamed {
        /// The descriptor.
        fd: RawFd,
        /// Its name: empty, `unknown` or the socket unit's (`NAME.socket`).
        name: String,
        /// How many sockets were passed.
        count: usize,
        /// The daemon's role names, comma-separated.
        names: String,
    },
    /// A name the daemon has no role for.
    #[error("fd {fd} is named {name:?}: {daemon} takes sockets named {names} (FileDescriptorName=)")]
    UnknownName {
        /// The descriptor.
        fd: RawFd,
        /// Its name.
        name: String,
        /// The daemon, as its command names it.
        daemon: String,
        /// The daemon's role names, comma-separated.
        names: String,
    },
    /// A second socket for a role that takes one.
    #[error("fd {fd} is a second socket for {} ({}): it takes one", .role.what, .role.name)]
    Second {
        /// The descriptor.
        fd: RawFd,
        /// The role it is named for.
        role: Role,
    },
    /// A socket that cannot serve its role.
    #[error("fd {fd} (for {}, {}): {why}", .role.what, .role.name)]
    Unusable {
        /// The descriptor.
        fd: RawFd,
        /// The role it is named for.
        role: Role,
        /// Why not.
        why: UnusableSocket,
    },
    /// A Unix socket where TCP is needed.
    #[error("fd {fd}: a Unix socket where TCP is needed")]
    UnixForTcp {
        /// The descriptor.
        fd: RawFd,
    },
    /// No socket for NBD among those passed, where the caller needs one.
    #[error("no NBD socket was passed")]
    NoNbd,
}

/// The last descriptor `$LISTEN_FDS` = `count` passes ([`ActivationError::NotOpen`]).
fn last_passed(count: &usize) -> RawFd {
    FIRST_FD + *count as RawFd - 1
}

/// What [`UnusableSocket::Family`] adds when the role takes a Unix socket too.
fn or_unix(unix: &bool) -> &'static str {
    if *unix {
        " or Unix"
    } else {
        ""
    }
}

/// How [`ActivationError::Unnamed`] shows a name that is no name.
fn no_name_shown(name: &str) -> String {
    if name.is_empty() {
        "no name".to_string()
    } else {
        format!("no name of its own ({name:?})")
    }
}

/// Why a passed socket cannot serve its role ([`ActivationError::Unusable`]).
#[derive(Debug, thiserror::Error)]
pub enum UnusableSocket {
    /// The descriptor is not a socket.
    #[error("not a socket")]
    NotSocket,
    /// Not a stream socket (`ListenDatagram=`, `ListenSequentialPacket=`).
    #[error("{}; it takes a listening stream socket (ListenStream=)", socket_type_shown(.ty))]
    NotStream {
        /// Its type.
        ty: socket2::Type,
    },
    /// A stream socket that does not listen (a connection, passed under `Accept=yes`).
    #[error(
        "a stream socket that does not listen (Accept=yes passes each connection, not the listener: the socket \
         unit needs Accept=no)"
    )]
    NotListening,
    /// A Unix socket for a role served over TCP.
    #[error("a Unix socket; it is served over TCP (ListenStream=ADDRESS:PORT)")]
    UnixForTcp,
    /// A socket of another family than TCP's (or Unix, where the role takes it).
    #[error("a socket of family {domain:?}; it takes TCP{}", or_unix(.unix))]
    Family {
        /// Its family.
        domain: socket2::Domain,
        /// Whether the role takes a Unix socket.
        unix: bool,
    },
    /// The operating system refused to read or set the socket's options.
    #[error("{0}")]
    Io(io::Error),
}

/// How [`UnusableSocket::NotStream`] shows a socket's type.
fn socket_type_shown(ty: &socket2::Type) -> String {
    if *ty == socket2::Type::DGRAM {
        "a datagram socket (ListenDatagram=)".to_string()
    } else if *ty == socket2::Type::SEQPACKET {
        "a sequential-packet socket (ListenSequentialPacket=)".to_string()
    } else {
        format!("a socket of type {ty:?}")
    }
}

/// Marks every descriptor from 3 on that this process holds without close-on-exec (what its parent
/// left open: a service manager's passed sockets, a shell's `exec 7>file`, a lock, a pipe) close-on-exec,
/// so that the processes it starts get none of them; returns how many it marked. For a supervisor
/// (`rein cluster`), called before it starts anything: its daemons must not hold their grandparent's
/// sockets and files, which would keep a listener, a lock or a pipe's writing end alive after the
/// supervisor is gone. The descriptors stay open in this process.
#[allow(unsafe_code)] // fcntl(2) on a descriptor number has no safe counterpart; see the SAFETY comments.
pub fn close_inherited_on_exec() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return 0 };
    let fds: Vec<RawFd> =
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|&fd| fd >= FIRST_FD).collect();
    let mut marked = 0;
    for fd in fds {
        // SAFETY: fcntl on a descriptor number reads and writes no memory of this process; a number that
        // is not open (the listing's own, closed by now) fails with EBADF, and nothing else is changed.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
            // SAFETY: as above.
            if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } == 0 {
                marked += 1;
            }
        }
    }
    marked
}

/// The descriptors `$LISTEN_FDS` passes with their names (`$LISTEN_FDNAMES`; none without it), if
/// `$LISTEN_PID` is `me`; none without `$LISTEN_FDS`.
pub(crate) fn listed(
    fds: Option<&str>,
    pid: Option<&str>,
    names: Option<&str>,
    me: u32,
) -> Result<Vec<(RawFd, String)>, ListenEnvError> {
    let Some(fds) = fds else { return Ok(Vec::new()) };
    let count: u32 = fds.trim().parse().map_err(|_| ListenEnvError::FdsNotNumber { text: fds.to_string() })?;
    if count == 0 {
        return Ok(Vec::new());
    }
    // A daemon takes a few sockets (its roles); a count beyond this is a mistake, and taken at its word
    // it would make a list (and a check of each descriptor) as long as any number.
    if count > MAX_PASSED {
        return Err(ListenEnvError::TooMany { count });
    }
    let last = count as RawFd + FIRST_FD - 1;
    match pid {
        None => return Err(ListenEnvError::NoPid { count }),
        Some(p) => match p.trim().parse::<u32>() {
            Ok(p) if p == me => {}
            Ok(p) => return Err(ListenEnvError::OtherProcess { count, pid: p, me }),
            Err(_) => return Err(ListenEnvError::PidNotNumber { text: p.to_string() }),
        },
    }
    let names: Vec<String> = match names {
        None => vec![String::new(); count as usize],
        Some(n) => n.split(':').map(str::to_string).collect(),
    };
    if names.len() != count as usize {
        return Err(ListenEnvError::NameCount { names: names.join(":"), named: names.len(), count });
    }
    Ok((FIRST_FD..=last).zip(names).collect())
}

/// What [`ListenEnvError::NoPid`] and [`ListenEnvError::OtherProcess`] add: how the variables reach the
/// daemon.
const FOR_ME: &str = "the sockets are passed to the process that LISTEN_PID names; a wrapper must exec the daemon \
                      (not start it as a child) or unset LISTEN_FDS";

/// Why `$LISTEN_FDS`, `$LISTEN_PID` and `$LISTEN_FDNAMES` pass no sockets this process can take
/// ([`from_env`], [`ActivationError::Env`]): the variable and its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenEnvError {
    /// `LISTEN_FDS` is not a number.
    #[error("LISTEN_FDS={text:?} is not a number of descriptors")]
    FdsNotNumber {
        /// The value.
        text: String,
    },
    /// More than [`MAX_PASSED`] descriptors.
    #[error("LISTEN_FDS={count}: more sockets than a daemon takes (at most {MAX_PASSED})")]
    TooMany {
        /// `LISTEN_FDS`.
        count: u32,
    },
    /// `LISTEN_FDS` without `LISTEN_PID`.
    #[error("LISTEN_FDS={count} is set without LISTEN_PID: {FOR_ME}")]
    NoPid {
        /// `LISTEN_FDS`.
        count: u32,
    },
    /// `LISTEN_PID` names another process (a wrapper started the daemon as its child).
    #[error("LISTEN_FDS={count} is for process {pid} (LISTEN_PID), not this one ({me}): {FOR_ME}")]
    OtherProcess {
        /// `LISTEN_FDS`.
        count: u32,
        /// `LISTEN_PID`.
        pid: u32,
        /// This process's id.
        me: u32,
    },
    /// `LISTEN_PID` is not a number.
    #[error("LISTEN_PID={text:?} is not a process id")]
    PidNotNumber {
        /// The value.
        text: String,
    },
    /// `LISTEN_FDNAMES` names another number of sockets than `LISTEN_FDS` passes.
    #[error("LISTEN_FDNAMES={names:?} names {named} sockets, LISTEN_FDS passes {count}")]
    NameCount {
        /// `LISTEN_FDNAMES`.
        names: String,
        /// The names it gives.
        named: usize,
        /// `LISTEN_FDS`.
        count: u32,
    },
}

/// Whether `name` is no name: none given, sd_listen_fds_with_names(3)'s `unknown`, or systemd's
/// default, the socket unit's own name.
fn unnamed(name: &str) -> bool {
    name.is_empty() || name == "unknown" || name.ends_with(".socket")
}

/// Gives each taken socket its role and checks that it can serve it (module comment).
fn assign(daemon: &str, roles: &[Role], taken: Vec<(RawFd, String, OwnedFd)>) -> Result<Passed, ActivationError> {
    let names = roles.iter().map(|r| r.name).collect::<Vec<_>>().join(", ");
    let count = taken.len();
    let mut passed = Passed::none();
    for (fd, name, owned) in taken {
        let role = if unnamed(&name) {
            if count > 1 {
                return Err(ActivationError::Unnamed { fd, name, count, names });
            }
            &roles[0]
        } else {
            match roles.iter().find(|r| r.name == name) {
                Some(r) => r,
                None => return Err(ActivationError::UnknownName { fd, name, daemon: daemon.to_string(), names }),
            }
        };
        if !role.many && passed.sockets.iter().any(|(r, _)| *r == role.name) {
            return Err(ActivationError::Second { fd, role: *role });
        }
        let listener = listener(socket2::Socket::from(owned), role).map_err(|why| ActivationError::Unusable {
            fd,
            role: *role,
            why,
        })?;
        passed.sockets.push((role.name, PassedSocket { fd, listener }));
    }
    Ok(passed)
}

/// The socket as a listener for `role`, close-on-exec and non-blocking; the error says why it cannot be.
fn listener(s: socket2::Socket, role: &Role) -> Result<Listener, UnusableSocket> {
    // First, whatever follows: a descriptor of this process is not left to the programs it starts.
    s.set_cloexec(true).map_err(UnusableSocket::Io)?;
    let ty = s.r#type().map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTSOCK) => UnusableSocket::NotSocket,
        _ => UnusableSocket::Io(e),
    })?;
    if ty != socket2::Type::STREAM {
        return Err(UnusableSocket::NotStream { ty });
    }
    if !s.is_listener().map_err(UnusableSocket::Io)? {
        return Err(UnusableSocket::NotListening);
    }
    s.set_nonblocking(true).map_err(UnusableSocket::Io)?;
    let domain = s.domain().map_err(UnusableSocket::Io)?;
    if domain == socket2::Domain::IPV4 || domain == socket2::Domain::IPV6 {
        Ok(Listener::Tcp(s.into()))
    } else if domain == socket2::Domain::UNIX && role.unix {
        Ok(Listener::Unix(s.into()))
    } else if domain == socket2::Domain::UNIX {
        Err(UnusableSocket::UnixForTcp)
    } else {
        Err(UnusableSocket::Family { domain, unix: role.unix })
    }
}

/// Takes the passed descriptor `fd` as this process's own: the unsafe code of socket activation (with
/// [`close_inherited_on_exec`]).
#[allow(unsafe_code)] // OwnedFd::from_raw_fd and fcntl(2) have no safe counterparts; see the SAFETY comments.
fn take_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD reads a descriptor's flags and touches no memory of ours; on a number that is not
    // an open descriptor it fails (EBADF) and changes nothing.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is open (above), and `$LISTEN_PID` naming this process is the service manager's word
    // that it passed it to this process at its start, for this process to own ([`from_env`] checked
    // that); nothing else in the process uses it (the runtime and std never use a descriptor they did
    // not open), and it is taken once (invariant 1), so this OwnedFd is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    proptest::proptest! {
        /// Whatever the three variables hold, reading them never panics, and what it accepts is what
        /// sd_listen_fds(3) describes: `LISTEN_FDS` descriptors from 3 on, for this process only, each
        /// with its name from `LISTEN_FDNAMES` in order (none without it).
        #[test]
        fn any_environment_is_read_without_a_panic_and_an_accepted_one_is_consistent(
            fds in proptest::option::of(proptest::prop_oneof!["[0-9]{1,12}", "[ -~]{0,8}"]),
            pid in proptest::option::of(proptest::prop_oneof!["4242", "[0-9]{1,11}", "[ -~]{0,6}"]),
            names in proptest::option::of("[a-z:.]{0,24}"),
        ) {
            let me = 4242;
            if let Ok(list) = listed(fds.as_deref(), pid.as_deref(), names.as_deref(), me) {
                if let Some(count) = fds.as_deref().and_then(|f| f.trim().parse::<u64>().ok()).filter(|&c| c > 0) {
                    proptest::prop_assert!(count <= u64::from(MAX_PASSED), "{count} accepted");
                    proptest::prop_assert_eq!(pid.as_deref().map(str::trim), Some("4242"));
                    proptest::prop_assert_eq!(list.len() as u64, count);
                    for (k, (fd, name)) in list.iter().enumerate() {
                        proptest::prop_assert_eq!(*fd, FIRST_FD + k as i32);
                        let want = names.as_deref().map_or("", |n| n.split(':').nth(k).unwrap_or("?"));
                        proptest::prop_assert_eq!(name.as_str(), want);
                    }
                } else {
                    proptest::prop_assert!(list.is_empty(), "descriptors without a positive LISTEN_FDS");
                }
            }
        }
    }

    #[test]
    fn the_environment_is_read_as_sd_listen_fds_does_and_stranger_variables_are_errors() {
        assert_eq!(listed(None, Some("7"), Some("nbd"), 7).unwrap(), vec![], "no LISTEN_FDS: nothing passed");
        assert_eq!(listed(Some("0"), Some("7"), None, 7).unwrap(), vec![]);
        assert_eq!(listed(Some("1"), Some("7"), None, 7).unwrap(), vec![(3, String::new())]);
        assert_eq!(
            listed(Some("2"), Some("7"), Some("nbd:admin"), 7).unwrap(),
            vec![(3, "nbd".to_string()), (4, "admin".to_string())]
        );
        let e = listed(Some("1"), None, None, 7).unwrap_err().to_string();
        assert!(e.starts_with("LISTEN_FDS=1 is set without LISTEN_PID: ") && e.contains("exec the daemon"), "{e}");
        let e = listed(Some("1"), Some("8"), None, 7).unwrap_err().to_string();
        assert!(e.starts_with("LISTEN_FDS=1 is for process 8 (LISTEN_PID), not this one (7): "), "{e}");
        assert_eq!(
            listed(Some("x"), Some("7"), None, 7).unwrap_err().to_string(),
            "LISTEN_FDS=\"x\" is not a number of descriptors"
        );
        assert_eq!(
            listed(Some("1"), Some("me"), None, 7).unwrap_err().to_string(),
            "LISTEN_PID=\"me\" is not a process id"
        );
        assert_eq!(
            listed(Some("2"), Some("7"), Some("nbd"), 7).unwrap_err().to_string(),
            "LISTEN_FDNAMES=\"nbd\" names 1 sockets, LISTEN_FDS passes 2"
        );
        assert!(listed(Some("4294967295"), Some("7"), None, 7).unwrap_err().to_string().contains("more sockets"));
        // At the bound and past it (a billion unnamed sockets once allocated a name for each: 32 GB).
        assert_eq!(listed(Some("1024"), Some("7"), None, 7).unwrap().len(), 1024);
        assert_eq!(
            listed(Some("1025"), Some("7"), None, 7).unwrap_err().to_string(),
            "LISTEN_FDS=1025: more sockets than a daemon takes (at most 1024)"
        );
    }

    /// Each refusal of the variables is its [`ListenEnvError`] variant, carrying the values; the messages
    /// are those of the `String` error (strings checked against it).
    #[test]
    fn environment_refusals_are_typed() {
        use ListenEnvError as E;
        assert_eq!(listed(Some("x"), Some("7"), None, 7), Err(E::FdsNotNumber { text: "x".into() }));
        assert_eq!(listed(Some("1025"), Some("7"), None, 7), Err(E::TooMany { count: 1025 }));
        assert_eq!(listed(Some("1"), Some("me"), None, 7), Err(E::PidNotNumber { text: "me".into() }));
        let e = listed(Some("1"), None, None, 7).unwrap_err();
        assert_eq!(e, E::NoPid { count: 1 });
        assert_eq!(
            e.to_string(),
            "LISTEN_FDS=1 is set without LISTEN_PID: the sockets are passed to the process that LISTEN_PID names; a \
             wrapper must exec the daemon (not start it as a child) or unset LISTEN_FDS"
        );
        let e = listed(Some("1"), Some("8"), None, 7).unwrap_err();
        assert_eq!(e, E::OtherProcess { count: 1, pid: 8, me: 7 });
        assert_eq!(
            e.to_string(),
            "LISTEN_FDS=1 is for process 8 (LISTEN_PID), not this one (7): the sockets are passed to the process \
             that LISTEN_PID names; a wrapper must exec the daemon (not start it as a child) or unset LISTEN_FDS"
        );
        let e = listed(Some("2"), Some("7"), Some("nbd"), 7).unwrap_err();
        assert_eq!(e, E::NameCount { names: "nbd".into(), named: 1, count: 2 });
    }

    fn tcp() -> OwnedFd {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().into()
    }

    fn unix(dir: &std::path::Path, name: &str) -> OwnedFd {
        std::os::unix::net::UnixListener::bind(dir.join(name)).unwrap().into()
    }

    /// `assign` over sockets made here, numbered from 3 as if passed.
    fn assign_named(sockets: Vec<(&str, OwnedFd)>) -> Result<Passed, ActivationError> {
        let taken = (3..).zip(sockets).map(|(fd, (name, s))| (fd, name.to_string(), s)).collect();
        assign("rein serve", &[NBD, ADMIN], taken)
    }

    #[test]
    fn names_give_the_roles_and_a_lone_unnamed_socket_is_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = assign_named(vec![("nbd", tcp()), ("admin", tcp()), ("nbd", unix(dir.path(), "n.sock"))]).unwrap();
        let nbd = p.take(&NBD);
        assert_eq!(nbd.iter().map(|s| s.fd).collect::<Vec<_>>(), [3, 5]);
        assert!(matches!(nbd[0].listener, Listener::Tcp(_)) && matches!(nbd[1].listener, Listener::Unix(_)));
        assert_eq!(nbd[1].listener.shown(), dir.path().join("n.sock").display().to_string());
        let admin = p.take_one(&ADMIN).unwrap();
        assert_eq!(admin.fd, 4);
        assert!(matches!(&admin.listener, Listener::Tcp(l) if l.local_addr().unwrap().ip().is_loopback()));
        assert!(p.take(&NBD).is_empty() && p.take_one(&ADMIN).is_none(), "taken out");

        for lone in ["", "unknown", "rein-serve.socket"] {
            let mut p = assign_named(vec![(lone, tcp())]).unwrap();
            assert_eq!(p.take(&NBD).len(), 1, "{lone:?}");
        }
        assert!(assign_named(vec![]).unwrap().take(&NBD).is_empty());
    }

    #[test]
    fn every_other_socket_is_an_error_naming_its_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let e = assign_named(vec![("nbd", tcp()), ("metrics", tcp())]).map(drop).unwrap_err().to_string();
        assert_eq!(e, "fd 4 is named \"metrics\": rein serve takes sockets named nbd, admin (FileDescriptorName=)");
        let e = assign_named(vec![("nbd", tcp()), ("rein-serve.socket", tcp())]).map(drop).unwrap_err().to_string();
        assert_eq!(
            e,
            "fd 4 has no name of its own (\"rein-serve.socket\") among 2 passed sockets: name each \
             (FileDescriptorName=: nbd, admin)"
        );
        let e = assign_named(vec![("admin", tcp()), ("admin", tcp())]).map(drop).unwrap_err().to_string();
        assert_eq!(e, "fd 4 is a second socket for the admin endpoint (admin): it takes one");
        let e = assign_named(vec![("admin", unix(dir.path(), "a.sock"))]).map(drop).unwrap_err().to_string();
        assert_eq!(
            e,
            "fd 3 (for the admin endpoint, admin): a Unix socket; it is served over TCP (ListenStream=ADDRESS:PORT)"
        );
        let udp: OwnedFd = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().into();
        let e = assign_named(vec![("nbd", udp)]).map(drop).unwrap_err().to_string();
        assert_eq!(
            e,
            "fd 3 (for NBD, nbd): a datagram socket (ListenDatagram=); it takes a listening stream socket (ListenStream=)"
        );
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let connected: OwnedFd = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap().into();
        let e = assign_named(vec![("nbd", connected)]).map(drop).unwrap_err().to_string();
        assert!(e.starts_with("fd 3 (for NBD, nbd): a stream socket that does not listen (Accept=yes"), "{e}");
        let file: OwnedFd = std::fs::File::create(dir.path().join("f")).unwrap().into();
        let e = assign_named(vec![("nbd", file)]).map(drop).unwrap_err().to_string();
        assert_eq!(e, "fd 3 (for NBD, nbd): not a socket");
    }

    /// A role served over TCP given a Unix socket (which [`assign`] refuses, so only a caller's mistake
    /// reaches these) is an error naming the descriptor, not a panic.
    #[test]
    fn a_unix_socket_where_tcp_is_needed_is_an_error_naming_its_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let unix = |name: &str| std::os::unix::net::UnixListener::bind(dir.path().join(name)).unwrap();
        let p = PassedSocket { fd: 7, listener: Listener::Unix(unix("a.sock")) };
        assert_eq!(p.tcp_addr().unwrap_err().to_string(), "fd 7: a Unix socket where TCP is needed");
        let p = PassedSocket { fd: 8, listener: Listener::Unix(unix("b.sock")) };
        assert_eq!(p.into_tcp().unwrap_err().to_string(), "fd 8: a Unix socket where TCP is needed");
    }

    /// Each refusal of a passed socket is its [`ActivationError`] variant, carrying the descriptor and
    /// the role (the texts are checked above, unchanged from the `String` error).
    #[test]
    fn socket_refusals_are_typed() {
        use ActivationError as E;
        let dir = tempfile::tempdir().unwrap();
        let tcp = || -> OwnedFd { std::net::TcpListener::bind("127.0.0.211:0").unwrap().into() };
        let e = assign_named(vec![("nbd", tcp()), ("metrics", tcp())]).map(drop).unwrap_err();
        assert!(
            matches!(&e, E::UnknownName { fd: 4, name, daemon, .. } if name == "metrics" && daemon == "rein serve")
        );
        let e = assign_named(vec![("", tcp()), ("nbd", tcp())]).map(drop).unwrap_err();
        assert!(matches!(&e, E::Unnamed { fd: 3, count: 2, .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "fd 3 has no name among 2 passed sockets: name each (FileDescriptorName=: nbd, admin)"
        );
        let e = assign_named(vec![("admin", tcp()), ("admin", tcp())]).map(drop).unwrap_err();
        assert!(matches!(e, E::Second { fd: 4, role: ADMIN }), "{e:?}");
        let e = assign_named(vec![("admin", unix(dir.path(), "a.sock"))]).map(drop).unwrap_err();
        assert!(matches!(e, E::Unusable { fd: 3, role: ADMIN, why: UnusableSocket::UnixForTcp }), "{e:?}");
        let udp: OwnedFd = std::net::UdpSocket::bind("127.0.0.211:0").unwrap().into();
        let e = assign_named(vec![("nbd", udp)]).map(drop).unwrap_err();
        assert!(
            matches!(e, E::Unusable { fd: 3, role: NBD, why: UnusableSocket::NotStream { ty } } if ty == socket2::Type::DGRAM),
            "{e:?}"
        );
        let file: OwnedFd = std::fs::File::create(dir.path().join("f")).unwrap().into();
        let e = assign_named(vec![("nbd", file)]).map(drop).unwrap_err();
        assert!(matches!(e, E::Unusable { fd: 3, role: NBD, why: UnusableSocket::NotSocket }), "{e:?}");
        let p = PassedSocket {
            fd: 7,
            listener: Listener::Unix(std::os::unix::net::UnixListener::bind(dir.path().join("u")).unwrap()),
        };
        assert!(matches!(p.tcp_addr(), Err(E::UnixForTcp { fd: 7 })));
        // fd N not open: the range the variables pass.
        assert_eq!(E::NotOpen { fd: 4, count: 2 }.to_string(), "fd 4: not open (LISTEN_FDS=2 passes fds 3 to 4)");
    }

    #[test]
    fn a_taken_socket_is_close_on_exec_and_non_blocking() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = socket2::Socket::from(OwnedFd::from(l));
        s.set_cloexec(false).unwrap();
        let Listener::Tcp(l) = listener(s, &NBD).unwrap() else { panic!("a TCP listener") };
        let s = socket2::Socket::from(OwnedFd::from(l));
        assert!(s.nonblocking().unwrap());
        // The descriptor's flags as the kernel shows them (octal; O_CLOEXEC is 0o2000000).
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", s.as_raw_fd())).unwrap();
        let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).expect("a flags: line");
        assert_ne!(u32::from_str_radix(flags.trim(), 8).unwrap() & 0o2000000, 0, "{info}");
    }
}
