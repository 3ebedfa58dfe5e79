//! Starts a [`Plan`]'s processes, waits until each is ready, watches them, and stops them.
//!
//! # Model
//! Each child is the current executable (`rein serve --config ..`, `rein gateway --config ..`), started in
//! the run's directory (where relative data paths resolve), with its config and log (stdout and stderr)
//! there: a fresh temporary one, removed at the end,
//! or one the caller names (kept), locked first ([`RunDir`]) so that a second `rein cluster` on it fails
//! before it writes anything there. A child is ready when its NBD port accepts a connection and its admin
//! endpoint answers `GET /healthz` with 200, so every port is checked free before the first child
//! starts (another process's listener would answer for a child that failed to bind it). Nodes start
//! first (a gateway connects to them), then gateways.
//!
//! # Invariants
//! 1. Every child started is stopped by [`Supervisor::stop`] (SIGTERM, then SIGKILL after
//!    [`STOP_TIMEOUT`]) and waited for; dropping a supervisor without stopping it kills and reaps every
//!    child (SIGKILL) and removes a temporary directory, so a panic leaves no process behind.
//! 2. A child that exits before `stop` is reported by name, exit status and the last lines of its log
//!    ([`ChildDied`]), never ignored.
//! 3. Waiting is bounded: readiness by the caller's deadline, stopping by [`STOP_TIMEOUT`] plus the
//!    SIGKILL's reaping.
//!
//! # Deviations
//! A supervisor killed with SIGKILL cannot stop its children itself: it starts them with
//! `REIN_EXIT_WITH_PARENT=1` and `REIN_PARENT_PID` its process id, so they stop once they see it gone
//! (also one that starts after it is gone), and its temporary run directory (with
//! the logs) stays until the next supervisor's [`sweep_stale_runs`] finds its owner and every child in
//! its `pids` file gone and removes it.

use crate::plan::Plan;
use rein_runtime::admin_client;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long children get to exit after SIGTERM before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Log lines quoted when a child dies.
pub const LOG_TAIL_LINES: usize = 20;
/// How often readiness and exits are polled.
const POLL: Duration = Duration::from_millis(50);

/// A child's log file as an error names it. A temporary run directory is removed when the run stops,
/// and the log with it: the error then says so (and how to keep logs) instead of naming a path that will
/// not be there; the log's last lines are in the error either way.
#[derive(Debug, Clone, Default)]
pub struct LogFile {
    /// Where the child writes it.
    pub path: PathBuf,
    /// Its directory stays after the run (`--dir`).
    pub kept: bool,
}

impl std::fmt::Display for LogFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.kept {
            write!(f, "{}", self.path.display())
        } else {
            f.write_str("(removed with the run's temporary directory; --dir DIR keeps the logs)")
        }
    }
}

/// A child exited while it should be serving.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what} {name} (pid {pid}) exited: {status}; the last lines of its log {log}:\n{tail}")]
pub struct ChildDied {
    /// "node" or "gateway".
    pub what: &'static str,
    /// The server's or tenant's name.
    pub name: String,
    /// Its process id.
    pub pid: u32,
    /// How it exited.
    pub status: String,
    /// Its log file.
    pub log: LogFile,
    /// The last [`LOG_TAIL_LINES`] lines of the log.
    pub tail: String,
}

/// Why a cluster could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Another `rein cluster` holds the run directory's lock ([`RunDir`]).
    #[error(
        "the run directory {} is in use by another rein cluster{}: give this one another directory",
        dir.display(),
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    DirInUse {
        /// The directory.
        dir: PathBuf,
        /// The holder's pid, as it wrote it into the lock file.
        holder: Option<u32>,
    },
    /// A child exited.
    #[error(transparent)]
    Died(Box<ChildDied>),
    /// A child was not ready in time.
    #[error(transparent)]
    NotReady(Box<NotReady>),
    /// A signal asked the start to stop (its flag set): what had started was stopped.
    #[error("interrupted during the start: the processes started were stopped")]
    Interrupted,
    /// A port the plan gives a process cannot be listened on (checked before anything starts): another
    /// process listens there, or the port is not this user's to take.
    #[error(
        "cannot listen on {addr} ({role}): {source}{}; nothing was started",
        if source.kind() == std::io::ErrorKind::AddrInUse {
            " (another process listens there: another rein cluster on the same ports? give another \
             --base-port, or --base-port 0 for free ones)"
        } else {
            ""
        }
    )]
    PortUnusable {
        /// The address.
        addr: SocketAddr,
        /// Whose port it is ("node s1's NBD port").
        role: String,
        /// Why it cannot be listened on.
        source: std::io::Error,
    },
    /// A kept run directory (`--dir`) holds a node's image from an earlier run with another size than
    /// this plan gives it (checked before anything starts): `rein serve` never resizes an image.
    #[error(
        "the run directory {} holds {} from an earlier run: it is {actual} bytes, but node {node}'s export \
         {export} is {want} bytes in this scenario, and a node never resizes an image; remove that file (a \
         scratch image: the run's IOs are timed by the device model, not by what it holds), or give another \
         --dir; nothing was started",
        dir.display(),
        file.display()
    )]
    StaleImage {
        /// The run directory.
        dir: PathBuf,
        /// The image, relative to it.
        file: PathBuf,
        /// The server's name.
        node: String,
        /// The export's name.
        export: String,
        /// The image's size in bytes.
        actual: u64,
        /// The size the plan gives it.
        want: u64,
    },
    /// pShift servers had not reached the controller in time.
    #[error("pShift servers {} had not reached the controller within {secs} s; the last lines of its log {log}:\n{tail}", servers.join(", "))]
    NotLinked {
        /// The servers the controller did not list as connected.
        servers: Vec<String>,
        /// The deadline.
        secs: f64,
        /// The controller's log file.
        log: LogFile,
        /// The last lines of its log.
        tail: String,
    },
}

impl From<ChildDied> for ClusterError {
    fn from(d: ChildDied) -> ClusterError {
        ClusterError::Died(Box::new(d))
    }
}

/// A child was not ready in time.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{what} {name} was not ready within {secs} s (NBD {nbd}, admin {admin}); the last lines of its log {log}:\n{tail}"
)]
pub struct NotReady {
    /// "node" or "gateway".
    pub what: &'static str,
    /// Its name.
    pub name: String,
    /// The deadline.
    pub secs: f64,
    /// Its NBD address.
    pub nbd: SocketAddr,
    /// Its admin address.
    pub admin: SocketAddr,
    /// Its log file.
    pub log: LogFile,
    /// The last lines of its log.
    pub tail: String,
}

/// The lock file in a run directory the caller names: `flock`ed by the `rein cluster` that runs there,
/// holding its pid.
pub const LOCK_FILE: &str = "rein-cluster.lock";

/// A run directory the caller names (`--dir`), created if missing and locked against a second
/// `rein cluster` for as long as this value, a clone or a [`RunDir::sub`] of it lives (a `flock` on
/// [`LOCK_FILE`] inside: the kernel drops it when the process ends, also by SIGKILL, so a lock is never
/// stale). Nothing is written into the directory before its lock is held.
///
/// A directory this lock created that holds nothing but its lock file when the lock goes (a command that
/// failed before it started anything: a scenario the cluster cannot run, a part that could not be
/// planned) is removed with its lock file, and so is each directory it was created in that the lock made
/// too and that is empty then, so that a failed `rein cluster up --dir NEW/RUN` leaves no `NEW` behind. A
/// directory that was there before keeps its lock file.
#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
    /// The locks held: this directory's and those of the directories it is inside of ([`RunDir::sub`]).
    _locks: Vec<Arc<DirLock>>,
}

/// A held `flock` on a run directory's [`LOCK_FILE`], and whether the lock created the directory.
#[derive(Debug)]
struct DirLock {
    file: std::fs::File,
    /// The directory (canonical), if the lock created it: removed on drop if only the lock file is in it.
    created: Option<PathBuf>,
    /// The directories its creation made on the way to it (canonical, deepest first: those above it, and
    /// any a `..` in its name passed through): each removed after it if empty.
    created_above: Vec<PathBuf>,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let Some(dir) = &self.created else { return };
        // Still holding the lock: only the lock file in the directory means nothing was written there.
        let only_lock = std::fs::read_dir(dir)
            .map(|entries| entries.map(|e| e.map(|e| e.file_name())).collect::<Result<Vec<_>, _>>())
            .is_ok_and(|names| names.is_ok_and(|n| n.len() == 1 && n[0] == LOCK_FILE));
        if only_lock && std::fs::remove_file(dir.join(LOCK_FILE)).is_ok() {
            // Fails, leaving the directory (and those above it), if another process wrote into it meanwhile.
            if std::fs::remove_dir(dir).is_ok() {
                for above in &self.created_above {
                    // Fails on one that is not empty (something else was made in it): kept, and those above.
                    if std::fs::remove_dir(above).is_err() {
                        break;
                    }
                }
            }
        }
    }
}

impl RunDir {
    /// Creates `dir` if missing and takes its lock. Errors: [`ClusterError::DirInUse`] naming the
    /// directory (and the holder's pid) when another process holds it, [`ClusterError::Io`] otherwise.
    pub fn lock(dir: &Path) -> Result<RunDir, ClusterError> {
        // `create_dir_all` on a file's name says only "File exists".
        if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
            let e = std::io::Error::new(std::io::ErrorKind::NotADirectory, "it is a file, not a directory");
            return Err(io(format!("using {} as the run directory", dir.display()))(e));
        }
        let existed = std::fs::symlink_metadata(dir).is_ok();
        // The directories above `dir` that creating it makes (named as given: `..` and links resolved
        // once they exist).
        let missing: Vec<&Path> = dir
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .take_while(|a| std::fs::symlink_metadata(a).is_err())
            .collect();
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let path = std::fs::canonicalize(dir).map_err(io(format!("resolving {}", dir.display())))?;
        let mut created_above: Vec<PathBuf> = missing.iter().filter_map(|a| std::fs::canonicalize(a).ok()).collect();
        created_above.sort_by(|a, b| b.components().count().cmp(&a.components().count()).then(a.cmp(b)));
        created_above.dedup();
        let file_path = path.join(LOCK_FILE);
        let lerr = || io(format!("locking {}", file_path.display()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&file_path)
            .map_err(lerr())?;
        use rustix::fs::{flock, FlockOperation};
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let holder = std::fs::read_to_string(&file_path).ok().and_then(|s| s.trim().parse().ok());
                return Err(ClusterError::DirInUse { dir: path, holder });
            }
            Err(e) => return Err(lerr()(e.into())),
        }
        let lock = DirLock {
            file,
            created: (!existed).then(|| path.clone()),
            created_above: if existed { Vec::new() } else { created_above },
        };
        let mut file = &lock.file;
        file.set_len(0).map_err(lerr())?;
        writeln!(file, "{}", std::process::id()).map_err(lerr())?;
        Ok(RunDir { path, _locks: vec![Arc::new(lock)] })
    }

    /// The directory `name` inside this one, created if missing and locked too (so that another
    /// `rein cluster` given it directly fails as well); it holds this one's lock while it lives.
    pub fn sub(&self, name: &str) -> Result<RunDir, ClusterError> {
        let mut sub = RunDir::lock(&self.path.join(name))?;
        sub._locks.extend(self._locks.iter().cloned());
        Ok(sub)
    }

    /// The directory (canonical).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

struct Proc {
    what: &'static str,
    name: String,
    nbd: SocketAddr,
    admin: SocketAddr,
    log: LogFile,
    child: Child,
    /// Reaped already (its status), so it is neither signalled nor waited for again.
    exited: Option<ExitStatus>,
}

/// The running children of a plan.
pub struct Supervisor {
    procs: Vec<Proc>,
    dir: PathBuf,
    /// Remove `dir` at the end (a temporary directory).
    remove: bool,
    stopped: bool,
    /// The lock of a directory the caller named, held until the supervisor is gone.
    _lock: Option<RunDir>,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

/// The last `n` lines of the file at `path` (or why it cannot be read), from at most its last 64 KiB (a
/// child's log may be large).
pub fn log_tail(path: &Path, n: usize) -> String {
    let tail = || -> std::io::Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        const TAIL: u64 = 64 << 10;
        let mut f = std::fs::File::open(path)?;
        let len = f.seek(SeekFrom::End(0))?;
        f.seek(SeekFrom::Start(len.saturating_sub(TAIL)))?;
        let mut bytes = Vec::new();
        f.take(TAIL).read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    match tail() {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read it: {e})"),
    }
}

/// Writes `text` to a new file at `path` that only its owner can read (a key).
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(text.as_bytes())
}

/// Whether `addr` answers `GET /healthz` with 200 within `timeout`.
fn healthy(addr: SocketAddr, timeout: Duration) -> bool {
    let endpoint = admin_client::AdminEndpoint::from(addr);
    admin_client::get_blocking(&endpoint, rein_runtime::admin_guard::HEALTHZ, timeout).is_ok()
}

/// Every TCP address `plan`'s processes listen on, each with whose port it is (the UDP ones:
/// [`udp_addrs`]).
fn listen_addrs(plan: &Plan) -> Vec<(SocketAddr, String)> {
    let mut v = Vec::new();
    if let Some(c) = &plan.controller {
        v.push((c.listen, "the pShift controller's port for the nodes".to_string()));
        v.push((c.admin, "the pShift controller's admin port".to_string()));
    }
    for n in &plan.nodes {
        v.push((n.nbd, format!("node {}'s NBD port", n.name)));
        v.push((n.admin, format!("node {}'s admin port", n.name)));
    }
    for g in &plan.gateways {
        v.push((g.nbd, format!("gateway {}'s NBD port", g.tenant)));
        v.push((g.admin, format!("gateway {}'s admin port", g.tenant)));
    }
    v
}

/// Every UDP address `plan`'s processes bind (the PARDA hosts' report sockets), each with whose it is.
fn udp_addrs(plan: &Plan) -> Vec<(SocketAddr, String)> {
    let reports =
        |g: &crate::plan::GatewayPlan| g.udp.map(|a| (a, format!("PARDA {}'s UDP port for reports", g.tenant)));
    plan.gateways.iter().filter_map(reports).collect()
}

/// Refuses a plan whose ports cannot be listened on, before any process starts. A child that cannot
/// bind its port exits, but readiness is a connection to that port and a `/healthz` answer: where
/// another process already listens (a second `rein cluster up` on the same `--base-port`), it answers
/// for the child, and `up` printed `ready` with endpoints that were the other cluster's before it saw
/// its own node exit. Each address is bound once and released at once (a listener that accepted nothing
/// leaves nothing behind); a process that takes a port between this check and the child's bind is still
/// caught by the child's exit, only later.
fn check_ports(plan: &Plan) -> Result<(), ClusterError> {
    for (addr, role) in listen_addrs(plan) {
        if let Err(source) = std::net::TcpListener::bind(addr) {
            return Err(ClusterError::PortUnusable { addr, role, source });
        }
    }
    for (addr, role) in udp_addrs(plan) {
        if let Err(source) = std::net::UdpSocket::bind(addr) {
            return Err(ClusterError::PortUnusable { addr, role, source });
        }
    }
    Ok(())
}

/// Refuses a kept run directory `dir` in which a node of `plan` would find an image an earlier run left
/// with another size (the scenario's `span_gb` changed, or its routing widths): the node refused it at
/// its start and exited, and the error quoted `rein serve`'s advice to edit the export's `size_mb`, a
/// line of a config `rein cluster` writes anew each run. Read from each node's config as `rein serve`
/// reads it (its own parser), so the paths and sizes are the ones the node will open.
fn check_images(plan: &Plan, dir: &Path) -> Result<(), ClusterError> {
    use rein_runtime::config::{BackendKind, ServerConfig};
    for n in &plan.nodes {
        // A plan's configs parse (the plan read them back); one that did not is the node's to report.
        let Ok(cfg) = ServerConfig::parse(&n.config, &dir.join("node.toml")) else { continue };
        for e in &cfg.exports {
            let (BackendKind::File { path }, Some(want)) = (&e.backend, e.size) else { continue };
            let Ok(meta) = std::fs::metadata(dir.join(path)) else { continue };
            if meta.is_file() && meta.len() != want {
                return Err(ClusterError::StaleImage {
                    dir: dir.to_path_buf(),
                    file: path.clone(),
                    node: n.name.clone(),
                    export: e.name.clone(),
                    actual: meta.len(),
                    want,
                });
            }
        }
    }
    Ok(())
}

/// The servers the pShift controller at `admin` does not list as connected (`GET /api/pshift`), or `None`
/// if it cannot be asked now.
fn pshift_unlinked(admin: SocketAddr, timeout: Duration) -> Option<Vec<String>> {
    let body = admin_client::get_blocking(&admin.into(), "/api/pshift", timeout).ok()?;
    let status: rein_runtime::pshift_controller::ControllerStatus = serde_json::from_slice(&body).ok()?;
    Some(status.servers.into_iter().filter(|(_, connected)| !connected).map(|(name, _)| name).collect())
}

impl Supervisor {
    /// Writes the plan's configs into `dir` (locked by the caller; a new temporary directory when `None`),
    /// starts every process with `exe`, and waits until each is ready (at most `ready_timeout` for each
    /// stage). On any failure every child started so far is stopped before the error returns; a port that
    /// cannot be listened on is refused before anything starts ([`ClusterError::PortUnusable`]), and so is
    /// a kept directory's image of another size ([`ClusterError::StaleImage`]).
    pub fn start(
        plan: &Plan,
        exe: &Path,
        dir: Option<&RunDir>,
        ready_timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<Supervisor, ClusterError> {
        check_ports(plan)?;
        let (path, remove) = match dir {
            Some(d) => {
                check_images(plan, d.path())?;
                (d.path().to_path_buf(), false)
            }
            None => (temp_dir()?, true),
        };
        let mut sup = Supervisor { procs: Vec::new(), dir: path, remove, stopped: false, _lock: dir.cloned() };
        match sup.start_all(plan, exe, ready_timeout, stop) {
            Ok(()) => Ok(sup),
            // Asked to stop: what started stops as at the end of a run (SIGTERM, then the grace).
            Err(ClusterError::Interrupted) => {
                sup.stop()?;
                Err(ClusterError::Interrupted)
            }
            // On another error, `sup` is dropped: every child is killed and a temporary directory removed.
            Err(e) => Err(e),
        }
    }

    /// [`Supervisor::start`]'s processes, in order, each group waited for.
    fn start_all(
        &mut self,
        plan: &Plan,
        exe: &Path,
        ready_timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<(), ClusterError> {
        let sup = self;
        if let Some(c) = &plan.controller {
            // The nodes connect to it (and keep trying until it listens).
            sup.spawn(exe, "controller", &["pshift", "controller"], "pshift", &c.config, c.admin, c.admin)?;
        }
        for n in &plan.nodes {
            sup.spawn(exe, "node", &["serve"], &n.name, &n.config, n.nbd, n.admin)?;
        }
        if plan.parda_key {
            let path = sup.dir.join(crate::plan::PARDA_KEY_FILE);
            let line = rein_runtime::aggregate::RecordKey::generate_line("parda").map_err(|e| ClusterError::Io {
                what: "making the PARDA hosts' key".into(),
                source: std::io::Error::other(e),
            })?;
            write_private(&path, &line).map_err(io(format!("writing {}", path.display())))?;
        }
        sup.wait_ready(ready_timeout, stop)?;
        if let Some(c) = &plan.controller {
            // A node whose link comes up after the load began serves round robin until it does.
            sup.wait_linked(c.admin, ready_timeout, stop)?;
        }
        for g in &plan.gateways {
            sup.spawn(exe, "gateway", &["gateway"], &g.tenant, &g.config, g.nbd, g.admin)?;
        }
        sup.wait_ready(ready_timeout, stop)
    }

    /// The run's directory (configs, logs, node data).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The children's process ids, in start order.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|p| p.child.id()).collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        &mut self,
        exe: &Path,
        what: &'static str,
        sub: &[&str],
        name: &str,
        config: &str,
        nbd: SocketAddr,
        admin: SocketAddr,
    ) -> Result<(), ClusterError> {
        let cfg = self.dir.join(format!("{what}-{name}.toml"));
        std::fs::write(&cfg, config).map_err(io(format!("writing {}", cfg.display())))?;
        let log = LogFile { path: self.dir.join(format!("{what}-{name}.log")), kept: !self.remove };
        let out = std::fs::File::create(&log.path).map_err(io(format!("creating {}", log.path.display())))?;
        let err = out.try_clone().map_err(io(format!("opening {}", log.path.display())))?;
        let mut cmd = Command::new(exe);
        // Under a unit of its own, `rein cluster` is the unit's process, not its children: the service
        // manager's socket and the sockets it passed (if any) are not theirs.
        for var in rein_runtime::notify::ENV.into_iter().chain(rein_runtime::activation::ENV) {
            cmd.env_remove(var);
        }
        let child = cmd
            .current_dir(&self.dir)
            .args(sub)
            .arg("--config")
            .arg(&cfg)
            .env("NO_COLOR", "1")
            // Killed with SIGKILL, `rein cluster` cannot stop its children: they stop by themselves. With
            // this process's id: a child that starts after it is gone knows at once (it read its parent
            // only once up, and took the process that adopted it for its parent).
            .env(rein_runtime::server::EXIT_WITH_PARENT_ENV, "1")
            .env(rein_runtime::server::PARENT_PID_ENV, std::process::id().to_string())
            // A process group of its own: a terminal's Ctrl-C reaches `rein cluster`, which stops the
            // children in order (it reached them too, and one that exited during the start was taken
            // for a crash).
            .process_group(0)
            .env("REIN_LOG", std::env::var("REIN_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io(format!("starting {what} {name} ({} {})", exe.display(), sub.join(" "))))?;
        self.procs.push(Proc { what, name: name.into(), nbd, admin, log, child, exited: None });
        let pids: Vec<String> = self.procs.iter().map(|p| format!("{} {} {}", p.child.id(), p.what, p.name)).collect();
        std::fs::write(self.dir.join("pids"), pids.join("\n") + "\n").map_err(io("writing the pids file"))?;
        Ok(())
    }

    /// Waits until every child is ready, or one exits, or `timeout` passes, or `stop` is set
    /// ([`ClusterError::Interrupted`]). Each probe takes at most the time left.
    fn wait_ready(&mut self, timeout: Duration, stop: &AtomicBool) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        let mut ready = vec![false; self.procs.len()];
        loop {
            if let Some(d) = self.poll() {
                return Err(d.into());
            }
            for (i, p) in self.procs.iter().enumerate() {
                let left = deadline.saturating_duration_since(Instant::now());
                if stop.load(Ordering::Relaxed) {
                    return Err(ClusterError::Interrupted);
                }
                if !ready[i] && !left.is_zero() {
                    ready[i] = TcpStream::connect_timeout(&p.nbd, POLL.min(left)).is_ok()
                        && healthy(p.admin, Duration::from_secs(1).min(left));
                }
            }
            if ready.iter().all(|&r| r) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let p = &self.procs[ready.iter().position(|r| !r).expect("one is not ready")];
                return Err(ClusterError::NotReady(Box::new(NotReady {
                    what: p.what,
                    name: p.name.clone(),
                    secs: timeout.as_secs_f64(),
                    nbd: p.nbd,
                    admin: p.admin,
                    log: p.log.clone(),
                    tail: log_tail(&p.log.path, LOG_TAIL_LINES),
                })));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until the pShift controller at `admin` lists every server as connected, or a child exits, or
    /// `timeout` passes.
    fn wait_linked(&mut self, admin: SocketAddr, timeout: Duration, stop: &AtomicBool) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(d) = self.poll() {
                return Err(d.into());
            }
            if stop.load(Ordering::Relaxed) {
                return Err(ClusterError::Interrupted);
            }
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let unlinked = pshift_unlinked(admin, Duration::from_secs(1).min(left));
            if unlinked.as_ref().is_some_and(|u| u.is_empty()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let log = self.procs.iter().find(|p| p.what == "controller").map(|p| p.log.clone()).unwrap_or_default();
                return Err(ClusterError::NotLinked {
                    servers: unlinked.unwrap_or_else(|| vec!["(the controller's status could not be read)".into()]),
                    secs: timeout.as_secs_f64(),
                    tail: log_tail(&log.path, LOG_TAIL_LINES),
                    log,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// The first child found to have exited since the last call (`None`: all are running).
    pub fn poll(&mut self) -> Option<ChildDied> {
        for p in &mut self.procs {
            if p.exited.is_some() {
                continue;
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                p.exited = Some(status);
                return Some(ChildDied {
                    what: p.what,
                    name: p.name.clone(),
                    pid: p.child.id(),
                    status: status.to_string(),
                    log: p.log.clone(),
                    tail: log_tail(&p.log.path, LOG_TAIL_LINES),
                });
            }
        }
        None
    }

    /// Stops every child: SIGTERM, then SIGKILL to those still running after [`STOP_TIMEOUT`]; waits for
    /// all; removes a temporary directory. Returns the children that had to be killed.
    pub fn stop(mut self) -> Result<Vec<String>, ClusterError> {
        let killed = self.stop_all(STOP_TIMEOUT);
        self.stopped = true;
        if self.remove {
            std::fs::remove_dir_all(&self.dir).map_err(io(format!("removing {}", self.dir.display())))?;
        }
        Ok(killed)
    }

    fn stop_all(&mut self, grace: Duration) -> Vec<String> {
        // Gateways first (they hold connections to the nodes), then nodes; all signalled at once.
        for p in self.procs.iter_mut().rev() {
            if p.exited.is_none() {
                if let Some(pid) = rustix::process::Pid::from_raw(p.child.id() as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                }
            }
        }
        let deadline = Instant::now() + grace;
        let mut killed = Vec::new();
        for p in &mut self.procs {
            while p.exited.is_none() {
                match p.child.try_wait() {
                    Ok(Some(s)) => p.exited = Some(s),
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                    _ => {
                        let _ = p.child.kill();
                        p.exited = p.child.wait().ok();
                        killed.push(format!("{} {}", p.what, p.name));
                        break;
                    }
                }
            }
        }
        killed
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        for p in &mut self.procs {
            if p.exited.is_none() {
                let _ = p.child.kill();
                p.exited = p.child.wait().ok();
            }
        }
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Removes the temporary run directories (`rein-cluster-<pid>-<n>` under the system's temporary directory,
/// made by [`temp_dir`]: its marker file inside, owned by this user) left by supervisors killed with SIGKILL: those whose supervisor (the pid in the name) and every child in
/// their `pids` file are gone. A directory whose owner or a child still runs, or whose `pids` file cannot
/// be read while its owner is gone for less than a minute (a start cut short), is kept. Returns what it
/// removed.
pub fn sweep_stale_runs() -> Vec<PathBuf> {
    sweep_stale_runs_in(&std::env::temp_dir())
}

fn alive(pid: u32) -> bool {
    // Signal 0 checks that the process exists (EPERM: it does, under another user).
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| !matches!(rustix::process::test_kill_process(p), Err(e) if e == rustix::io::Errno::SRCH))
}

/// The file [`temp_dir`] puts in each directory it makes: only such directories are ever swept, so a
/// kept `--dir` (or anyone else's directory) of a name like ours is never removed.
const TEMP_MARKER: &str = ".rein-cluster-temporary";

fn sweep_stale_runs_in(base: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(base) else { return removed };
    let uid = rustix::process::getuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("rein-cluster-")) else { continue };
        let Some(owner) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if owner == std::process::id() || alive(owner) {
            continue;
        }
        let dir = entry.path();
        // Ours: made by temp_dir (its marker, a file and not a link) and by this user.
        let ours = std::fs::symlink_metadata(dir.join(TEMP_MARKER)).is_ok_and(|m| m.is_file())
            && std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        if !ours {
            continue;
        }
        let children = match std::fs::read_to_string(dir.join("pids")) {
            Ok(text) => text.lines().filter_map(|l| l.split_whitespace().next()?.parse::<u32>().ok()).collect(),
            Err(_) => {
                // No pids file: a start cut short, or not ours; only once it is old enough to be stale.
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|e| e > Duration::from_secs(60)));
                if !old {
                    continue;
                }
                Vec::new()
            }
        };
        if children.iter().any(|&p| alive(p)) {
            continue;
        }
        if std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(dir);
        }
    }
    removed
}

/// A new directory `rein-cluster-<pid>-<n>` under the system's temporary directory.
pub fn temp_dir() -> Result<PathBuf, ClusterError> {
    let base = std::env::temp_dir();
    for n in 0..1000u32 {
        let d = base.join(format!("rein-cluster-{}-{n}", std::process::id()));
        match std::fs::create_dir(&d) {
            Ok(()) => {
                let marker = "a temporary run directory of rein cluster: removed when its run ends, or by a later \
                              run once its supervisor and children are gone\n";
                std::fs::write(d.join(TEMP_MARKER), marker).map_err(io(format!("creating {}", d.display())))?;
                return Ok(d);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io(format!("creating {}", d.display()))(e)),
        }
    }
    Err(io("creating a temporary directory")(std::io::Error::other("1000 names taken")))
}

/// The ports of a plan's processes (`--base-port`): port `k` of a process at `host` is `base + k`, or,
/// with `base` 0, a free one (the OS's choice for a socket bound here). Each free port's socket stays
/// bound until this is dropped, so that one plan never gets a port twice on one address: closed at once,
/// the kernel could hand the same port out again for the next process or the next port of the same
/// process (a node's NBD and admin ports equal, about one pair in 11,000: the node could not bind its
/// admin port and `rein cluster up` failed before printing a line). A PARDA host's port for reports
/// ([`crate::plan::UDP_REPORTS_PORT`]) is a free UDP port, held by a UDP socket (a free TCP port can be
/// in use for UDP). Drop it once the plan is made: the children bind the ports next (one that another
/// process takes first is still caught: `check_ports`, or the child's exit).
pub struct Ports {
    base: u16,
    held: Vec<std::net::TcpListener>,
    held_udp: Vec<std::net::UdpSocket>,
}

impl Ports {
    /// Ports from `base` (0: free ones).
    pub fn new(base: u16) -> Ports {
        Ports { base, held: Vec::new(), held_udp: Vec::new() }
    }

    /// Port `k` of the process at `host`.
    pub fn port(&mut self, host: std::net::Ipv4Addr, k: u16) -> std::io::Result<u16> {
        let base = self.base;
        if base != 0 {
            return base
                .checked_add(k)
                .ok_or_else(|| std::io::Error::other(format!("port {base} + {k} is above 65535")));
        }
        if k == crate::plan::UDP_REPORTS_PORT {
            let s = std::net::UdpSocket::bind((host, 0))?;
            let port = s.local_addr()?.port();
            self.held_udp.push(s);
            return Ok(port);
        }
        let l = std::net::TcpListener::bind((host, 0))?;
        let port = l.local_addr()?.port();
        self.held.push(l);
        Ok(port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--base-port 0`: the free ports of one plan are distinct on each address. Each was a socket bound
    /// and closed at once, so the kernel could hand the same port out again for the next (one pair in
    /// about 11,000 here: a node's NBD and admin ports equal, its admin bind refused, `rein cluster up`
    /// failed before printing a line); now each is held until the plan is made. 500 on one address: the
    /// old way repeats one with a probability of about 1 - 1e-4.
    #[test]
    fn the_free_ports_of_one_plan_are_distinct() {
        let host = std::net::Ipv4Addr::new(127, 0, 0, 241);
        let mut ports = Ports::new(0);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..500u16 {
            // Distinct by protocol: a UDP port for reports may have a TCP port's number.
            let k = i % 3;
            let p = ports.port(host, k).unwrap();
            assert!(seen.insert((k == crate::plan::UDP_REPORTS_PORT, p)), "port {p} handed out twice (the {i}th)");
        }
        // Released once the plan is made: the children bind them.
        drop(ports);
        let p = seen.iter().find(|(udp, _)| !udp).unwrap().1;
        std::net::TcpListener::bind((host, p)).expect("a port of a dropped Ports is free again");
        assert_eq!(Ports::new(100).port(host, 1).unwrap(), 101);
        let e = Ports::new(65535).port(host, 1).unwrap_err().to_string();
        assert_eq!(e, "port 65535 + 1 is above 65535");
    }

    /// A PARDA host's port for reports is a free UDP port, held for UDP until the plan is made (it was a
    /// free TCP port, which another process may hold for UDP: the plan was then refused by
    /// `check_ports`).
    #[test]
    fn a_free_report_port_is_free_for_udp() {
        let host = std::net::Ipv4Addr::new(127, 0, 0, 241);
        let mut ports = Ports::new(0);
        let p = ports.port(host, crate::plan::UDP_REPORTS_PORT).unwrap();
        let e = std::net::UdpSocket::bind((host, p)).expect_err("held for UDP while the plan is made");
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        drop(ports);
        std::net::UdpSocket::bind((host, p)).expect("free for the PARDA host once the plan is made");
    }

    /// A PARDA host's UDP port for the other hosts' reports is checked with the TCP ports: held by
    /// another process, the plan is refused before anything starts, naming it (the host failed to bind
    /// it and exited after the nodes had started).
    #[test]
    fn a_parda_hosts_udp_port_in_use_is_refused_naming_it() {
        let base = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let sc = rein_sim::Scenario::load(&base.join("parda-fig2.toml")).unwrap();
        // A plan whose ports are all free now, from a base the kernel hands out.
        let plan = (0..20)
            .find_map(|_| {
                let first = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
                let plan = Plan::new(&sc, |_, k| Ok(first.saturating_sub(2).saturating_add(k))).unwrap();
                check_ports(&plan).is_ok().then_some(plan)
            })
            .expect("a plan whose ports are free");
        let host = plan.gateways.iter().find_map(|g| g.udp.map(|a| (a, g.tenant.clone()))).expect("a UDP host");
        let _held = std::net::UdpSocket::bind(host.0).unwrap();
        match check_ports(&plan) {
            Err(ClusterError::PortUnusable { addr, role, .. }) => {
                assert_eq!(addr, host.0);
                assert_eq!(role, format!("PARDA {}'s UDP port for reports", host.1));
            }
            other => panic!("the UDP port in use was not refused: {other:?}"),
        }
    }

    /// The servers a controller's status lists as not connected are named; a status that cannot be read
    /// is `None`, not "all linked".
    #[test]
    fn the_controllers_status_names_unlinked_servers() {
        use rein_runtime::pshift_controller::ControllerStatus;
        use std::io::Read;
        let serve_once = |code: &'static str, body: String| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let t = std::thread::spawn(move || {
                let (mut c, _) = l.accept().unwrap();
                let mut req = [0u8; 1024];
                let _ = c.read(&mut req).unwrap();
                let head = format!("HTTP/1.1 {code}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                c.write_all(head.as_bytes()).unwrap();
                c.write_all(body.as_bytes()).unwrap();
            });
            (addr, t)
        };
        let status = ControllerStatus {
            round: 0,
            now_s: 0.1,
            origin_s: None,
            servers: vec![("s1".into(), true), ("s2".into(), false), ("s3".into(), false)],
            buckets: vec![],
            refused: 0,
            late_reports: 0,
            rounds: Default::default(),
        };
        let (addr, t) = serve_once("200 OK", serde_json::to_string(&status).unwrap());
        assert_eq!(pshift_unlinked(addr, Duration::from_secs(2)), Some(vec!["s2".to_string(), "s3".to_string()]));
        t.join().unwrap();
        let all = ControllerStatus { servers: vec![("s1".into(), true)], ..status };
        let (addr, t) = serve_once("200 OK", serde_json::to_string(&all).unwrap());
        assert_eq!(pshift_unlinked(addr, Duration::from_secs(2)), Some(vec![]));
        t.join().unwrap();
        let (addr, t) = serve_once("503 Service Unavailable", "{}".into());
        assert_eq!(pshift_unlinked(addr, Duration::from_secs(2)), None);
        t.join().unwrap();
    }

    /// A named run directory is locked: a second lock on it (or on a directory inside a locked one's
    /// sub) fails naming the directory and the holder, and writes nothing; the lock goes with its last
    /// holder.
    #[test]
    fn a_run_directory_is_locked_while_it_is_used() {
        let base = tempfile::tempdir().unwrap();
        let d = base.path().join("run");
        let held = RunDir::lock(&d).unwrap();
        let lock_text = std::fs::read_to_string(d.join(LOCK_FILE)).unwrap();
        assert_eq!(lock_text, format!("{}\n", std::process::id()));
        let e = RunDir::lock(&d).unwrap_err().to_string();
        let want = format!(
            "the run directory {} is in use by another rein cluster (pid {}): give this one another directory",
            held.path().display(),
            std::process::id()
        );
        assert_eq!(e, want);
        assert_eq!(std::fs::read_to_string(d.join(LOCK_FILE)).unwrap(), lock_text, "the holder's pid stays");
        // A part of the run: its own directory is locked, and the whole run's stays locked while it lives.
        let part = held.sub("part-1").unwrap();
        drop(held);
        assert!(matches!(RunDir::lock(&d), Err(ClusterError::DirInUse { .. })), "the part holds the run's lock");
        assert!(matches!(RunDir::lock(&d.join("part-1")), Err(ClusterError::DirInUse { .. })));
        drop(part);
        RunDir::lock(&d).unwrap();
        RunDir::lock(&d.join("part-1")).unwrap();
    }

    /// A run directory the lock created goes with its lock if nothing else was written into it (a command
    /// that failed before it started anything), parts first; one that was there before, or that holds
    /// more than the lock file, stays with its lock file.
    #[test]
    fn a_run_directory_the_lock_made_goes_with_it_if_nothing_was_written() {
        let base = tempfile::tempdir().unwrap();
        let d = base.path().join("run");
        let run = RunDir::lock(&d).unwrap();
        let part = run.sub("part-1-of-2").unwrap();
        drop(run);
        assert!(d.join("part-1-of-2").join(LOCK_FILE).exists(), "held by the part");
        drop(part);
        assert!(!d.exists(), "the part's directory, then the run's, removed");
        let run = RunDir::lock(&d).unwrap();
        let part = run.sub("part-1-of-2").unwrap();
        std::fs::write(part.path().join("node-s1.log"), "started\n").unwrap();
        drop((run, part));
        assert!(d.join("part-1-of-2").join("node-s1.log").exists() && d.join(LOCK_FILE).exists(), "kept");
        let before = tempfile::tempdir().unwrap();
        drop(RunDir::lock(before.path()).unwrap());
        assert!(before.path().join(LOCK_FILE).exists(), "a directory that was there keeps its lock file");
    }

    /// `--dir NEW/a/RUN`: the directories the lock made above the run's go with it (deepest first) when
    /// nothing was written; one that holds something else stays, and those above it. Before this change
    /// only RUN went (NEW/a stayed).
    #[test]
    fn the_directories_made_above_a_run_directory_go_with_it() {
        let base = tempfile::tempdir().unwrap();
        let new = base.path().join("new");
        drop(RunDir::lock(&new.join("a").join("run")).unwrap());
        assert!(!new.exists(), "new/a/run, new/a and new removed");
        // Named through `..`: the same directories.
        drop(RunDir::lock(&new.join("a").join("..").join("b")).unwrap());
        assert!(!new.exists(), "new/b and new removed");
        // Something else made in new/a meanwhile: new/a and new stay.
        let run = RunDir::lock(&new.join("a").join("run")).unwrap();
        std::fs::write(new.join("a").join("other"), "x").unwrap();
        drop(run);
        assert!(!new.join("a").join("run").exists() && new.join("a").join("other").exists(), "new/a kept");
        // A directory that was there: nothing above it is touched.
        drop(RunDir::lock(&new.join("a")).unwrap());
        assert!(new.join("a").join(LOCK_FILE).exists());
    }

    /// A run directory whose supervisor and children are gone is removed; one whose supervisor or a child
    /// still runs, and other directories, are kept.
    #[test]
    fn stale_run_directories_are_swept() {
        let base = tempfile::tempdir().unwrap();
        let me = std::process::id();
        // A pid that is surely gone: a child that has exited and been reaped.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let gone = c.id();
        c.wait().unwrap();
        let mk = |name: &str, pids: Option<String>| {
            let d = base.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("node-s1.log"), "log").unwrap();
            std::fs::write(d.join(TEMP_MARKER), "").unwrap();
            if let Some(p) = pids {
                std::fs::write(d.join("pids"), p).unwrap();
            }
            d
        };
        let stale = mk(&format!("rein-cluster-{gone}-0"), Some(format!("{gone} node s1\n")));
        let child_alive = mk(&format!("rein-cluster-{gone}-1"), Some(format!("{me} node s1\n")));
        let owner_alive = mk(&format!("rein-cluster-{me}-0"), Some(format!("{gone} node s1\n")));
        let fresh_no_pids = mk(&format!("rein-cluster-{gone}-2"), None);
        let other = mk("rein-clusterx", None);
        // A kept `--dir` of a name like ours, its run over (no marker: not made by temp_dir); it was
        // removed before the marker.
        let kept = mk(&format!("rein-cluster-{gone}-3"), Some(format!("{gone} node s1\n")));
        std::fs::remove_file(kept.join(TEMP_MARKER)).unwrap();
        assert_eq!(sweep_stale_runs_in(base.path()), vec![stale.clone()]);
        assert!(!stale.exists());
        for d in [child_alive, owner_alive, fresh_no_pids, other, kept] {
            assert!(d.exists(), "{} removed", d.display());
        }
    }
}
