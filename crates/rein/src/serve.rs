//! `rein serve`: the NBD block server with per-tenant QoS.

use anyhow::{Context, Result};
use clap::Args;
use rein_runtime::config::ServerConfig;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Configuration file (see docs/serve.md); without it, the built-in default: three file-backed
    /// exports (rd, oltp, dm) in ./rein-data with the mClock paper's RD / OLTP / DM tenants.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Override the NBD listen address.
    #[arg(long)]
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// Listen on this Unix socket as well (overrides listen_unix; relative to the working directory).
    #[arg(long, value_name = "PATH")]
    pub(crate) listen_unix: Option<String>,
    /// Override the admin HTTP address.
    #[arg(long)]
    pub(crate) admin: Option<std::net::SocketAddr>,
    /// Override the scheduler (mclock, sfq, fifo, ...).
    #[arg(long)]
    pub(crate) scheduler: Option<rein_core::SchedulerKind>,
    /// Override the data directory.
    #[arg(long)]
    pub(crate) data_dir: Option<PathBuf>,
    /// Check the configuration as a start would (and nothing else: no listening, no file created or
    /// changed), print what it serves and exit: 0 when a start would accept it, 1 naming what is wrong.
    #[arg(long)]
    pub(crate) check_config: bool,
}

/// The server configuration: the file (or the built-in default) with the command line's overrides,
/// validated together (`rein_runtime::config::Overrides`).
pub(crate) fn load(args: &ServeArgs) -> Result<ServerConfig> {
    let overrides = rein_runtime::config::Overrides {
        listen: args.listen,
        listen_unix: args.listen_unix.clone(),
        admin: args.admin,
        scheduler: args.scheduler,
        data_dir: args.data_dir.clone(),
    };
    Ok(ServerConfig::load_with(args.config.as_deref(), &overrides)?)
}

/// Registers the stop signals now and returns what resolves at the first SIGINT (Ctrl-C) or SIGTERM, or
/// when a supervisor that asked for it is gone (`rein_runtime::server::parent_gone`): when a daemon
/// (`rein serve`, `rein gateway`) stops. Called before the daemon says it is listening, so that a signal
/// any time after that line is a graceful stop; a handler registered at the first poll of a lazy future
/// (as before) left a window after the line in which SIGTERM still had its default action, death without
/// the shutdown (most of the time when sent at once: `a_sigterm_right_after_listening_is_a_graceful_stop`).
/// Must be called inside the runtime.
pub(crate) fn stop_signals() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let parent = rein_runtime::server::parent_gone();
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
            _ = parent => {},
        }
    })
}

/// One message per SIGHUP (a reload request), for both daemons; a reload already waiting covers a signal
/// that comes meanwhile. Must be called inside the runtime.
pub(crate) fn hangups() -> Result<tokio::sync::mpsc::Receiver<()>> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).context("SIGHUP handler")?;
    let (tx, requests) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let _ = tx.try_send(());
        }
    });
    Ok(requests)
}

/// `--check-config`'s output: what the configuration `file` (none: the built-in default) serves, then
/// that it is fine.
pub(crate) fn print_check(file: &Option<PathBuf>, lines: Vec<String>) -> Result<()> {
    for l in lines {
        outln!("{l}");
    }
    let file = file.as_ref().map_or_else(|| "the built-in configuration".to_string(), |p| p.display().to_string());
    outln!("{file}: configuration OK");
    Ok(())
}

/// The listening sockets a service manager passed (`rein_runtime::activation`), for the roles `roles`
/// of `daemon`. Taken before the runtime starts, so before the process opens descriptors of its own;
/// never for `--check-config`, which binds nothing.
pub(crate) fn passed_sockets(
    daemon: &str,
    roles: &[rein_runtime::activation::Role],
) -> Result<rein_runtime::activation::Passed> {
    rein_runtime::activation::from_env(daemon, roles).map_err(|e| anyhow::anyhow!("socket activation: {e}"))
}

/// Raises the soft limit on open files towards `needed` (at most to the hard limit), and warns when it
/// stays below: with the usual soft limit of 1,024 the default `max_connections` (4,096) is never
/// reached, and clients beyond the descriptors fail at accept. `what` says what needs them.
pub(crate) fn check_open_files(needed: u64, what: &str) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let Rlimit { current: Some(soft), maximum } = getrlimit(Resource::Nofile) else { return };
    if soft >= needed {
        return;
    }
    let raised = maximum.map_or(needed, |hard| hard.min(needed));
    if raised > soft && setrlimit(Resource::Nofile, Rlimit { current: Some(raised), maximum }).is_ok() {
        tracing::info!(from = soft, to = raised, "raised the open-file limit for {what}");
    }
    let now = match getrlimit(Resource::Nofile).current {
        Some(n) => n,
        None => return,
    };
    if now < needed {
        tracing::warn!(
            limit = now,
            needed,
            "the open-file limit is below what {what} can use: connections beyond it fail at accept (raise it, e.g. ulimit -n {needed})"
        );
    }
}

/// Descriptors `rein serve` may use: its connection caps, one file per export, and a margin for logs,
/// listeners and the ring.
fn serve_files(cfg: &rein_runtime::config::ServerConfig) -> u64 {
    (cfg.caps.total + cfg.admin_access.max_connections + cfg.exports.len() + 64) as u64
}

/// `rein serve`: serves until Ctrl-C or SIGTERM; SIGHUP reloads the configuration file (with the same
/// command-line overrides).
pub(crate) fn run(args: ServeArgs) -> Result<()> {
    let cfg = load(&args)?;
    if args.check_config {
        return print_check(&args.config, rein_runtime::server::check_config(cfg)?);
    }
    check_open_files(serve_files(&cfg), "max_connections, the admin connections and the exports");
    let passed = passed_sockets("rein serve", &[rein_runtime::activation::NBD, rein_runtime::activation::ADMIN])?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    rt.block_on(async move {
        let shutdown = stop_signals()?;
        let requests = hangups()?;
        // Errors that do not name the file (a value out of range) get its path in front.
        let file = args.config.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "<built-in>".into());
        let reload = rein_runtime::server::Reload {
            requests,
            load: Box::new(move || {
                load(&args).map_err(|e| {
                    // Each cause once, as the binary prints a fatal error.
                    let msg = crate::report(&e);
                    if msg.contains(&file) {
                        msg
                    } else {
                        format!("{file}: {msg}")
                    }
                })
            }),
        };
        rein_runtime::server::run_with(cfg, shutdown, None, Some(reload), passed).await.map_err(anyhow::Error::from)
    })?;
    Ok(())
}
