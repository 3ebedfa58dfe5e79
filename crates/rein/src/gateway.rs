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
}

/// `rein gateway`: serves until Ctrl-C or SIGTERM.
pub(crate) fn run(args: GatewayArgs) -> Result<()> {
    let mut cfg = GatewayConfig::load(&args.config)?;
    if let Some(a) = args.listen {
        cfg.listen = a;
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cfg.worker_threads {
        rt.worker_threads(n);
    }
    let rt = rt.enable_all().build().context("starting the tokio runtime")?;
    rt.block_on(async move {
        let mut hup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).context("SIGHUP handler")?;
        let (tx, requests) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                // A reload already waiting covers this signal too.
                let _ = tx.try_send(());
            }
        });
        let load = move || {
            let mut cfg = GatewayConfig::load(&args.config).map_err(|e| crate::report(&anyhow::Error::from(e)))?;
            if let Some(a) = args.listen {
                cfg.listen = a;
            }
            Ok(cfg)
        };
        let reload = rein_runtime::gateway::GatewayReload { requests, load: Box::new(load) };
        rein_runtime::gateway::run_with(cfg, crate::serve::interrupted(), None, Some(reload))
            .await
            .map_err(anyhow::Error::from)
    })
}
