//! `rein probe`: measure an export's backend the way `rein serve` will use it, and print the
//! `capacity_iops` line for admission control.

use anyhow::{bail, Context, Result};
use clap::Args;
use rein_runtime::probe::{probe, ProbeConfig};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub(crate) struct ProbeArgs {
    /// Server configuration (the same file as `rein serve --config`); default: the built-in one.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Export to measure (default: the largest).
    #[arg(long)]
    pub(crate) export: Option<String>,
    /// How long to measure.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) seconds: f64,
    /// IO size in KiB.
    #[arg(long, default_value_t = 4)]
    pub(crate) size_kb: u32,
    /// Requests outstanding (default: the config's queue_depth, as the server would keep).
    #[arg(long)]
    pub(crate) depth: Option<usize>,
    /// Share of reads in percent. Below 100 the probe overwrites the export with random data, so it
    /// also needs --destructive.
    #[arg(long, default_value_t = 100.0)]
    pub(crate) read_pct: f64,
    /// Allow writes (they destroy the export's contents).
    #[arg(long)]
    pub(crate) destructive: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The flags each within its range, each error naming the flag, the value given and the range, as `rein
/// load`'s `check_times` does: `--size-kb 0` was refused as `--size-kb 0 is out of range` alone, and the
/// others by the runtime's check, in bytes and by its own names, under the export's name (`export "a":
/// probe: IO size must be in 1..=16777216 bytes, got 20480000` for `--size-kb 20000`). `depth` is
/// `--depth`, or the config's `queue_depth` (`from_config`) when the flag is not given.
fn check_args(args: &ProbeArgs, depth: usize, from_config: bool) -> Result<()> {
    use rein_runtime::probe::{MAX_PROBE_BYTES_IN_FLIGHT, MAX_PROBE_DEPTH, MAX_PROBE_IO, MAX_PROBE_S};
    let seconds = args.seconds;
    if !(seconds > 0.0 && seconds <= MAX_PROBE_S) {
        bail!("--seconds {seconds} is out of range: a probe lasts more than 0 and at most {MAX_PROBE_S} s");
    }
    let max_kb = MAX_PROBE_IO / 1024;
    if args.size_kb == 0 || args.size_kb > max_kb {
        bail!(
            "--size-kb {} is out of range: a probe's IO size is 1 to {max_kb} KiB ({} MiB)",
            args.size_kb,
            max_kb / 1024
        );
    }
    if !(0.0..=100.0).contains(&args.read_pct) {
        bail!("--read-pct {} is out of range: the share of reads is 0 to 100 (percent)", args.read_pct);
    }
    let flag = if from_config { "the config's queue_depth" } else { "--depth" };
    if depth == 0 || depth > MAX_PROBE_DEPTH {
        bail!("{flag} {depth} is out of range: a probe keeps 1 to {MAX_PROBE_DEPTH} requests outstanding");
    }
    let in_flight = depth as u64 * u64::from(args.size_kb) * 1024;
    if in_flight > MAX_PROBE_BYTES_IN_FLIGHT {
        bail!(
            "{flag} {depth} x --size-kb {} is {} MiB in flight, above the probe's bound of {} MiB (1 GiB): lower \
             either",
            args.size_kb,
            in_flight >> 20,
            MAX_PROBE_BYTES_IN_FLIGHT >> 20
        );
    }
    Ok(())
}

/// `rein probe`: measures the export and prints its IOPS, MB/s and latency (or `--json`), then the
/// `capacity_iops` line for the server config. Writes need `--destructive`.
pub(crate) fn run(args: ProbeArgs) -> Result<()> {
    let cfg = rein_runtime::config::ServerConfig::load_with(args.config.as_deref(), &Default::default())?;
    let depth = args.depth.unwrap_or(cfg.queue_depth);
    check_args(&args, depth, args.depth.is_none())?;
    if args.read_pct < 100.0 && !args.destructive {
        bail!(
            "--read-pct {} writes random data over the export; add --destructive if that is what you want",
            args.read_pct
        );
    }
    let export = match &args.export {
        Some(n) => cfg.exports.iter().find(|e| &e.name == n).with_context(|| {
            format!(
                "no export {n:?} (the config has: {})",
                cfg.exports.iter().map(|e| e.name.as_str()).collect::<Vec<_>>().join(", ")
            )
        })?,
        None => cfg.exports.iter().max_by_key(|e| e.size).expect("a valid config has exports"),
    };
    let size_kb = args.size_kb;
    let pc = ProbeConfig {
        seconds: args.seconds,
        // In range: check_args.
        io_size: size_kb * 1024,
        depth,
        read_pct: args.read_pct,
        io_engine: cfg.io_engine,
        ..ProbeConfig::default()
    };
    // The settings first, then the export's image: nothing is opened (or created) for a probe that
    // cannot run.
    // (An export without a configured size is its file's: the probe checks the IO size against it again.)
    pc.validate(export.size.unwrap_or(u64::MAX)).map_err(|e| anyhow::anyhow!("export {:?}: {e}", export.name))?;
    if let rein_runtime::config::BackendKind::File { path } = &export.backend {
        // `rein serve` creates a missing image (sparse, all holes); measuring one measures nothing real.
        if !path.exists() {
            bail!(
                "export {:?}: {} does not exist; rein probe measures an existing image (start rein serve once to \
                 create it, or point the export's path at one)",
                export.name,
                path.display()
            );
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    let r = rt.block_on(async {
        let storage = rein_runtime::preflight::open_export(export)?;
        // An export without a configured size is its image's: one smaller than an IO is refused here, naming
        // the export and the flag, before the warning and the announcement below (the probe refused it
        // after both, as `probe: IO size 4096 is larger than the export (100 bytes)`).
        if u64::from(pc.io_size) > storage.size() {
            let what = match &export.backend {
                rein_runtime::config::BackendKind::File { path } => path.display().to_string(),
                _ => "it".to_string(),
            };
            bail!(
                "export {:?}: {what} is {} bytes, less than one IO of --size-kb {size_kb} ({} bytes)",
                export.name,
                storage.size(),
                pc.io_size
            );
        }
        // Reads of a hole never reach the device: an image that is mostly holes (the one a first start of
        // the built-in default creates) measures the file system, as the server's start-up probe warns.
        if let rein_runtime::config::BackendKind::File { path } = &export.backend {
            if let Some((holes, _, _)) = rein_runtime::probe::mostly_holes(path).filter(|_| args.read_pct > 0.0) {
                errln!(
                    "warning: export {:?}: {holes}: this measures the file system, not the disk; probe an image \
                     that holds data before using the result as capacity_iops",
                    export.name
                );
            }
        }
        let device = cfg.device.clone();
        if !args.json {
            errln!(
                "probing export {:?} for {} s: {} KiB {}, {} outstanding, io_engine {}{}",
                export.name,
                pc.seconds,
                size_kb,
                if pc.read_pct >= 100.0 {
                    "random reads".to_string()
                } else {
                    format!("random IO, {}% reads", pc.read_pct)
                },
                pc.depth,
                pc.io_engine.name(),
                if device.is_some() { ", through the configured device model" } else { "" },
            );
        }
        // The figures are the probe's only product: once nobody reads stdout, stop (as `rein bench`).
        let unread = async {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                if crate::stdout::closed() {
                    break;
                }
            }
        };
        tokio::select! {
            r = probe(storage, device, &pc) => anyhow::Ok(Some(r?)),
            () = unread => anyhow::Ok(None),
        }
    })?;
    let Some(r) = r else {
        errln!("rein probe: standard output's reader has gone; stopping");
        return Ok(());
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    // One decimal: the capacity line below is the floor of it (admission control errs low), and a
    // rounded figure read one above it.
    outln!("IOPS          {:.1}", r.iops);
    outln!("MB/s          {:.1}", r.mb_s);
    outln!(
        "latency (ms)  mean {:.3}  p50 {:.3}  p99 {:.3}  max {:.3}",
        r.latency_mean_ms,
        r.latency_p50_ms,
        r.latency_p99_ms,
        r.latency_max_ms
    );
    outln!("io_engine     {}", r.io_engine);
    outln!();
    outln!("For admission control, put in the server config (reservations above it are refused):");
    outln!("capacity_iops = {:.0}", r.iops.floor());
    Ok(())
}
