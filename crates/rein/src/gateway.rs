//! `rein gateway`: NBD volumes striped over storage nodes (docs/gateway.md). Parses arguments only; the
//! daemon is `rein_runtime::gateway`.

use anyhow::{Context, Result};
use clap::Args;
use rein_runtime::gateway::GatewayConfig;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub(crate) struct GatewayArgs {
    /// Configuration file (see docs/gateway.md).
    #[arg(long)]
    pub(crate) config: PathBuf,
    /// Override the NBD listen address.
    #[arg(long)]
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// Listen on this Unix socket as well (overrides listen_unix; relative to the working directory).
    #[arg(long, value_name = "PATH")]
    pub(crate) listen_unix: Option<String>,
    /// Check the configuration as a start would (and nothing else: no listening, no file created or
    /// changed), print its volumes (the nodes are not contacted) and exit: 0 when a start would accept it, 1 naming what is wrong.
    #[arg(long)]
    pub(crate) check_config: bool,
}

/// gw.toml with the command line's overrides, validated together (at start and at each reload).
fn load(args: &GatewayArgs) -> Result<GatewayConfig> {
    let overrides = rein_runtime::config::Overrides {
        listen: args.listen,
        listen_unix: args.listen_unix.clone(),
        ..Default::default()
    };
    Ok(GatewayConfig::load_with(&args.config, &overrides)?)
}

/// `rein gateway`: serves until Ctrl-C or SIGTERM; SIGHUP reloads gw.toml.
pub(crate) fn run(args: GatewayArgs) -> Result<()> {
    let cfg = load(&args)?;
    if args.check_config {
        return crate::serve::print_check(&Some(args.config.clone()), cfg.check()?);
    }
    // The front's caps, the admin connections and every node connection, with a margin.
    let needed = (cfg.caps.total + cfg.admin_access.max_connections + cfg.node_sessions() + 64) as u64;
    crate::serve::check_open_files(needed, "max_connections, the admin connections and the node connections");
    let roles = [rein_runtime::activation::NBD, rein_runtime::activation::ADMIN];
    let passed = crate::serve::passed_sockets("rein gateway", &roles)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.worker_threads)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let shutdown = crate::serve::stop_signals()?;
        let requests = crate::serve::hangups()?;
        let load = move || load(&args).map_err(|e| crate::report(&e));
        let reload = rein_runtime::gateway::GatewayReload { requests, load: Box::new(load) };
        rein_runtime::gateway::run_with(cfg, shutdown, None, Some(reload), passed).await.map_err(anyhow::Error::from)
    })
}
