//! `rein load`: multi-tenant load over NBD, with a live per-tenant table and the same summary.json,
//! timeseries.csv and plots as `rein sim`, so simulated and real runs compare directly.

use anyhow::{bail, Context, Result};
use clap::Args;
use rein_model::report::{Cell, LatencySummary, RunTotals, ServerSummary, Summary, TenantSummary, Timeseries};
use rein_runtime::load::{Job, JobResult, LoadConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// NBD server address.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub addr: SocketAddr,
    /// A tenant's workload, repeatable: name=NAME[,export=EXPORT][,depth=N][,conns=N][,rate=IOPS]
    /// [,size=4k][,read=PCT][,random=PCT]. export defaults to the name; depth (closed loop, per
    /// connection) to 16; rate switches to an open loop.
    #[arg(long = "job", required = true)]
    pub jobs: Vec<String>,
    /// Seconds to run.
    #[arg(long, default_value_t = 30.0)]
    pub seconds: f64,
    /// Seconds excluded from the summary.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Where to write summary.json, timeseries.csv and plots.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

fn parse_size(v: &str) -> Result<u32> {
    let v = v.trim().to_ascii_lowercase();
    let (num, mul) = if let Some(n) = v.strip_suffix('k') {
        (n, 1024)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 1 << 20)
    } else {
        (v.as_str(), 1)
    };
    let n: u64 = num.parse().with_context(|| format!("size {v:?}: expected bytes, or a number with k or m"))?;
    u32::try_from(n * mul).context("size too large")
}

/// Parses one `--job` value.
pub fn parse_job(spec: &str) -> Result<Job> {
    let mut job = Job {
        name: String::new(),
        export: String::new(),
        connections: 1,
        depth: 16,
        rate: None,
        size: 4096,
        read: 1.0,
        random: 1.0,
    };
    for kv in spec.split(',') {
        let (k, v) = kv.split_once('=').with_context(|| format!("job {spec:?}: {kv:?} is not key=value"))?;
        let pct = |v: &str| -> Result<f64> {
            let x: f64 = v.parse().with_context(|| format!("{k}={v}: not a number"))?;
            if !(0.0..=100.0).contains(&x) {
                bail!("{k}={v}: a percentage must be in [0, 100]");
            }
            Ok(x / 100.0)
        };
        match k.trim() {
            "name" => job.name = v.to_string(),
            "export" => job.export = v.to_string(),
            "depth" => job.depth = v.parse().with_context(|| format!("depth={v}"))?,
            "conns" => job.connections = v.parse().with_context(|| format!("conns={v}"))?,
            "rate" => job.rate = Some(v.parse().with_context(|| format!("rate={v}"))?),
            "size" => job.size = parse_size(v)?,
            "read" => job.read = pct(v)?,
            "random" => job.random = pct(v)?,
            other => {
                bail!("job {spec:?}: unknown key {other:?} (name, export, depth, conns, rate, size, read, random)")
            }
        }
    }
    if job.name.is_empty() {
        bail!("job {spec:?}: name= is required");
    }
    if job.export.is_empty() {
        job.export = job.name.clone();
    }
    Ok(job)
}

/// Converts load results into the simulator's output types.
pub fn to_totals(
    results: &[JobResult],
    interval: Duration,
    duration: Duration,
    warmup: Duration,
    label: &str,
) -> RunTotals {
    let intervals = results.first().map_or(0, |r| r.cells.len());
    let measured = (duration - warmup).as_secs_f64();
    let first = (warmup.as_nanos().div_ceil(interval.as_nanos())) as usize;
    let mut cells = Vec::with_capacity(intervals * results.len());
    let mut tenants = Vec::new();
    for r in results {
        for c in &r.cells {
            cells.push(Cell {
                ios: c.ios.min(u32::MAX as u64) as u32,
                bytes: c.bytes,
                lat_sum_ns: c.lat_sum_ns,
                lat_max_ns: c.lat_max_ns,
                phase: [0; 3],
            });
        }
        let bytes: u64 = r.cells.iter().skip(first).map(|c| c.bytes).sum();
        let ms = |v: u64| v as f64 / 1e6;
        let n = r.hist.len();
        tenants.push(TenantSummary {
            name: r.name.clone(),
            reservation: None,
            limit: None,
            weight: None,
            completed: n,
            iops: n as f64 / measured,
            mb_s: bytes as f64 / 1e6 / measured,
            latency_ms: LatencySummary {
                mean: if n > 0 { r.hist.mean() / 1e6 } else { 0.0 },
                p50: ms(r.hist.value_at_quantile(0.5)),
                p95: ms(r.hist.value_at_quantile(0.95)),
                p99: ms(r.hist.value_at_quantile(0.99)),
                max: ms(r.hist.max()),
            },
            phase: None,
            rejected: r.errors,
        });
    }
    let total: u64 = tenants.iter().map(|t| t.completed).sum();
    RunTotals {
        summary: Summary {
            name: label.to_string(),
            scheduler: "measured".into(),
            seed: 0,
            duration_s: duration.as_secs_f64(),
            warmup_s: warmup.as_secs_f64(),
            tenants,
            servers: vec![ServerSummary {
                name: "nbd".into(),
                scheduler: "remote".into(),
                distributed: false,
                completed: total,
                iops: total as f64 / measured,
                utilisation: None,
            }],
            hosts: None,
        },
        hosts: None,
        timeseries: Timeseries {
            interval_s: interval.as_secs_f64(),
            intervals,
            tenant_names: results.iter().map(|r| r.name.clone()).collect(),
            server_names: vec![],
            cells,
            server_cells: vec![],
            capacity: vec![],
        },
        events: 0,
        time_regressions: 0,
    }
}

pub fn print_live(t: Duration, rows: &rein_runtime::load::Live) {
    let mut line = format!("{:>6.1}s", t.as_secs_f64());
    for (name, iops, lat) in rows {
        line.push_str(&format!("  | {name:<8} {iops:>8.1} IOPS {lat:>7.2} ms"));
    }
    eprintln!("{line}");
}

pub fn print_summary(totals: &RunTotals) {
    println!(
        "{:<12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "tenant", "IOPS", "MB/s", "lat ms", "p99 ms", "max ms", "errors"
    );
    for t in &totals.summary.tenants {
        println!(
            "{:<12} {:>10.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>7}",
            t.name, t.iops, t.mb_s, t.latency_ms.mean, t.latency_ms.p99, t.latency_ms.max, t.rejected
        );
    }
}

pub fn run(args: LoadArgs) -> Result<()> {
    let jobs = args.jobs.iter().map(|j| parse_job(j)).collect::<Result<Vec<_>>>()?;
    if !(args.seconds > 0.0 && args.seconds <= 86_400.0) || !(args.warmup >= 0.0 && args.warmup < args.seconds) {
        bail!("need 0 <= --warmup < --seconds <= 86400");
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let warmup = Duration::from_secs_f64(args.warmup);
    let interval = Duration::from_secs(1);
    let cfg = LoadConfig { addr: args.addr, jobs, duration, warmup, interval, seed: args.seed };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let quiet = args.json;
    let results = rt.block_on(rein_runtime::load::run(cfg, move |t, rows| {
        if !quiet {
            print_live(t, rows)
        }
    }))?;
    let totals = to_totals(&results, interval, duration, warmup, "rein-load");
    if let Some(dir) = &args.out {
        crate::sim::write_run(dir, "rein load", (duration - warmup).as_secs_f64(), &totals, None)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&totals.summary)?);
    } else {
        print_summary(&totals);
    }
    Ok(())
}
