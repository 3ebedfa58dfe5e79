//! # rein-runtime: Rein's IO runtime
//!
//! The tokio layer between the sans-IO core and real storage: storage backends ([`storage`]) and the
//! io_uring engine ([`uring`]), a modelled
//! device for repeatable experiments ([`devmodel`]), and the QoS dispatcher ([`dispatch`]) that drives a
//! rein-core scheduler on a monotonic clock. The NBD server and the admin endpoint build on these.
//! [`aggregate`] carries PARDA's cluster latency between hosts (a shared file, or UDP).
//!
//! `rein serve` is [`server`], configured by [`config`], with [`nbd`] for its connections ([`tls`] for
//! STARTTLS, [`access`] for access lists and connection caps, [`budget`] bounding the bytes they hold) and
//! [`admin`] for its HTTP endpoint, and [`node`] for the storage-node protocol a `rein gateway` speaks; [`probe`] measures a backend's capacity through a dispatcher. The other side,
//! for `rein load` and `rein demo`: the NBD [`client`], the load generator [`load`] and [`admin_client`].
//! [`notify`] tells a service manager (systemd) when a daemon is ready, reloading or stopping;
//! [`activation`] takes the listening sockets it passes (socket activation).
//! [`harness`]: the contracts of this crate's decoders of outside input, for the fuzz targets. [`durable`]
//! writes a file whole (the state file, and the `rein` command's output files).

pub mod access;
pub mod activation;
pub mod admin;
pub mod admin_client;
pub mod admin_guard;
pub mod aggregate;
pub mod bounded;
pub mod budget;
pub mod client;
pub mod config;
pub mod device_holders;
pub mod devmodel;
pub mod dispatch;
pub mod durable;
pub mod gateway;
pub mod harness;
pub mod job_spec;
pub mod live;
pub mod load;
mod load_watch;
pub mod lograte;
pub mod nbd;
pub mod node;
pub mod notify;
pub mod parda_host;
mod precise_timer;
pub mod preflight;
pub mod probe;
pub mod prom;
pub mod pshift_controller;
pub mod pshift_link;
pub mod reloads;
pub mod remote;
pub mod server;
pub mod sock;
mod stall;
pub mod state;
pub mod storage;
#[cfg(test)]
mod testkit;
pub mod tls;
pub mod uring;
mod wire;

/// A timer that fires later than this after its deadline means this process did not run meanwhile
/// (SIGSTOP, a paused VM, heavy swapping): whatever a peer sent in that time may be in the socket unread,
/// so timeouts that judge a peer's silence (a node's `request_timeout_s` in the gateway, a client's
/// `idle_timeout_s` in rein serve) start again instead of blaming the peer.
pub(crate) const STALLED: std::time::Duration = std::time::Duration::from_secs(1);

/// Why [`on_own_thread`] has no answer.
#[derive(Debug)]
pub(crate) enum ApartError {
    /// The thread could not be started.
    NotStarted(std::io::Error),
    /// The thread ended without an answer (its work panicked).
    Ended,
}

/// Runs `work` on a plain thread named `name`, its answer as a future: for work that can block for ever
/// (a read or an open on a hung network mount, a FIFO, a file under a lease), which on the event loop
/// would stop new connections and the stop signals. A plain thread rather than `spawn_blocking`: a
/// runtime waits for its blocking tasks when it is dropped, so stuck work would hold up the exit after
/// SIGTERM; a plain thread is left behind and ends with the process. Dropping the future leaves the
/// thread to finish; its answer is then dropped.
pub(crate) fn on_own_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> impl std::future::Future<Output = Result<T, ApartError>> + Send + Unpin + 'static {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let started = std::thread::Builder::new().name(name.into()).spawn(move || {
        let _ = tx.send(work());
    });
    Box::pin(async move {
        started.map_err(ApartError::NotStarted)?;
        rx.await.map_err(|_| ApartError::Ended)
    })
}

pub use devmodel::DeviceConfig;
pub use dispatch::{Clock, DispatchConfig, Dispatcher, IoEngine, IoError, IoRequest, IoResult, Op, Reply, Snapshot};
pub use stall::StallWatchError;
pub use storage::{FileMode, FileStorage, MemStorage, Storage, StorageError};
