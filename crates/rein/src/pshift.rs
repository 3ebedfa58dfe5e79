//! `rein pshift`: pShift token allocation on instance files (solve), the paper's synthetic instances (gen).
//!
//! Thin: JSON in and out, threads and timing here; validation and the algorithm in `rein_core::pshift`,
//! the generator in `rein_sim::pshift::gen`, the max-flow baseline in `rein-pshift-baseline`. The instance
//! format is in docs/pshift.md.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rein_core::pshift::{solve, Allocation, Instance, SolveOptions};
use rein_model::pshift_instance::{self, MAX_INSTANCE_BYTES};
use rein_model::report::PeriodMetric;
use rein_sim::model::pshift::gen::{generate, GenParams};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Most threads `--threads` accepts.
pub(crate) const MAX_THREADS: usize = 256;

#[derive(Debug, Subcommand)]
pub(crate) enum PshiftCmd {
    /// Allocate R- and L-tokens for an instance file; print JSON (Phi, max-flow value, tokens per bucket
    /// and server).
    Solve(SolveArgs),
    /// Write one of the paper's synthetic instances as JSON (§IV: Zipf reservations, N_A active servers,
    /// r = reserved fraction, m = demand / reservation).
    Gen(GenArgs),
    /// Experiment 2: run a scenario with [pshift.generate] for every N_A (active servers) x N_D (demand
    /// changes) and several seeds; print the error (share of buckets missing 5% or more of their
    /// reservation) as a table.
    Sweep(SweepArgs),
    /// pShift's controller as a daemon: servers (`rein serve` with `[pshift]`) report to it, it sends them
    /// tokens (docs/pshift-daemons.md). Runs until Ctrl-C or SIGTERM.
    Controller(ControllerArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ControllerArgs {
    /// Configuration file (docs/pshift-daemons.md).
    #[arg(long)]
    pub(crate) config: PathBuf,
    /// Check the configuration as a start would (and nothing else: no listening, no file created or
    /// changed), print what it serves and exit: 0 when a start would accept it, 1 naming what is wrong.
    #[arg(long)]
    pub(crate) check_config: bool,
}

/// `rein pshift controller`: the daemon is `rein_runtime::pshift_controller`.
fn controller(a: &ControllerArgs) -> Result<()> {
    let s = rein_runtime::pshift_controller::ControllerSettings::load(&a.config)?;
    if a.check_config {
        return crate::serve::print_check(&Some(a.config.clone()), s.check()?);
    }
    let roles = [rein_runtime::activation::PSHIFT, rein_runtime::activation::ADMIN];
    let passed = crate::serve::passed_sockets("rein pshift controller", &roles)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let shutdown = crate::serve::stop_signals()?;
        // SIGHUP reloads ctl.toml's `[tls]` (the rest needs a restart, and says so).
        let requests = crate::serve::hangups()?;
        let path = a.config.clone();
        let load = move || {
            rein_runtime::pshift_controller::ControllerSettings::load(&path).map_err(|e| crate::report(&e.into()))
        };
        let reload = rein_runtime::pshift_controller::ControllerReload { requests, load: Box::new(load) };
        rein_runtime::pshift_controller::run(s, shutdown, None, passed, Some(reload)).await.map_err(anyhow::Error::msg)
    })
}

#[derive(Debug, Args)]
pub(crate) struct SweepArgs {
    /// A scenario with [pshift.generate] (e.g. scenarios/pshift-exp1.toml).
    pub(crate) scenario: PathBuf,
    /// Comma-separated N_A values.
    #[arg(long, default_value = "2,4,8", value_delimiter = ',')]
    pub(crate) active: Vec<usize>,
    /// Comma-separated N_D values (demand changes per bucket over the run's periods).
    #[arg(long, default_value = "0,1,2,5,10", value_delimiter = ',')]
    pub(crate) changes: Vec<u32>,
    /// Runs per cell (seeds: the scenario's, then +1, ...); the mean is reported.
    #[arg(long, default_value_t = 5)]
    pub(crate) runs: u64,
    /// A bucket is in error when it does less than this percentage of its reservation in a period.
    #[arg(long, default_value_t = 95.0)]
    pub(crate) threshold_pct: f64,
    /// Early rounds per redistribution interval, overriding the scenario's `early_rounds` (0: the
    /// paper's controller, as in its Fig. 4).
    #[arg(long)]
    pub(crate) early_rounds: Option<u32>,
    /// Print the cells as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Serialize)]
struct SweepCell {
    active: usize,
    changes: u32,
    /// Mean error (share of bucket-periods below the threshold), and its range over the runs.
    error: f64,
    error_min: f64,
    error_max: f64,
    runs: u64,
}

fn sweep(a: &SweepArgs) -> Result<()> {
    if a.runs == 0 || a.runs > 100 {
        bail!("--runs must be in 1..=100");
    }
    let file = rein_sim::file::ScenarioFile::read(&a.scenario)?;
    if file.pshift.as_ref().and_then(|p| p.generate.as_ref()).is_none() {
        bail!("scenario {}: the sweep needs a scenario with [pshift.generate]", a.scenario.display());
    }
    let mut cells = Vec::new();
    for &na in &a.active {
        for &nd in &a.changes {
            let mut errs = Vec::new();
            for r in 0..a.runs {
                // The table is the sweep's only product: once nobody reads stdout, stop (as `rein bench`).
                if crate::stdout::closed() {
                    errln!("rein pshift sweep: standard output's reader has gone; stopping");
                    return Ok(());
                }
                let mut f = file.clone();
                let seed = file.seed + r;
                f.seed = seed;
                let p = f.pshift.as_mut().expect("checked");
                if a.early_rounds.is_some() {
                    p.early_rounds = a.early_rounds;
                }
                let g = p.generate.as_mut().expect("checked");
                g.active_servers = rein_sim::file::pshift::ActiveFile::One(na);
                g.demand_changes = nd;
                let sc = f.validate_at(&a.scenario).with_context(|| format!("N_A = {na}, N_D = {nd}"))?;
                let t0 = Instant::now();
                let run = rein_sim::run(&sc, &mut |_| {})?;
                let ps = sc.pshift().expect("pshift scenario");
                let all: Vec<usize> = (0..sc.tenants().len()).collect();
                let periods = ps.periods_in(ps.start.as_secs_f64(), sc.duration().as_secs_f64());
                let (_, met) =
                    run.tenant_periods(&all, &periods, PeriodMetric::ReservationMetFraction, a.threshold_pct);
                errs.push(1.0 - met);
                if !a.json {
                    errln!(
                        "N_A = {na}, N_D = {nd}, seed {seed}: error {:.3}% ({:.1} s)",
                        100.0 * (1.0 - met),
                        t0.elapsed().as_secs_f64()
                    );
                }
            }
            let mean = errs.iter().sum::<f64>() / errs.len() as f64;
            cells.push(SweepCell {
                active: na,
                changes: nd,
                error: mean,
                error_min: errs.iter().cloned().fold(f64::INFINITY, f64::min),
                error_max: errs.iter().cloned().fold(0.0, f64::max),
                runs: a.runs,
            });
        }
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&cells)?);
    } else {
        out!("| N_A \\ N_D |");
        for nd in &a.changes {
            out!(" {nd} |");
        }
        outln!();
        outln!("|---:|{}", "---:|".repeat(a.changes.len()));
        for &na in &a.active {
            out!("| {na} |");
            for c in cells.iter().filter(|c| c.active == na) {
                out!(" {:.2}% ({:.2}-{:.2}) |", 100.0 * c.error, 100.0 * c.error_min, 100.0 * c.error_max);
            }
            outln!();
        }
    }
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct SolveArgs {
    /// Instance file (JSON; see docs/pshift.md).
    pub(crate) instance: PathBuf,
    /// Threads for the parallel part (initial allocation and token movement sums).
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// §III-C approximation: only the top M buckets by tokens and by spare demand shift.
    #[arg(long)]
    pub(crate) approx_top: Option<usize>,
    /// With --approx-top M: the top M entries of each server (by demand there) instead of the cluster's
    /// top M buckets (the other reading of §III-C).
    #[arg(long, requires = "approx_top")]
    pub(crate) approx_per_server: bool,
    /// Skip the max-flow baseline (it is computed by default, to print `max_flow` and `optimal`).
    #[arg(long)]
    pub(crate) no_max_flow: bool,
    /// Only the totals (no per-bucket and per-server lists).
    #[arg(long)]
    pub(crate) summary: bool,
}

/// The shape of a synthetic instance (§IV-C), shared by `rein pshift gen` and `rein bench pshift`.
#[derive(Debug, Args)]
pub(crate) struct ShapeArgs {
    /// N: storage servers.
    #[arg(long, default_value_t = 64)]
    pub(crate) servers: usize,
    /// N_A: active servers per bucket [default: 8, or N when there are fewer servers].
    #[arg(long)]
    pub(crate) active: Option<usize>,
    /// r: reserved fraction of the total capacity.
    #[arg(long, short = 'r', default_value_t = 1.0)]
    pub(crate) reserved: f64,
    /// m: demand / reservation.
    #[arg(long, short = 'm', default_value_t = 1.1)]
    pub(crate) demand_ratio: f64,
}

impl ShapeArgs {
    /// The paper's N_A = 8 (§IV-C), or every server when there are fewer: `--servers 4` alone is a valid
    /// instance.
    pub(crate) const DEFAULT_ACTIVE: usize = 8;

    /// N_A: as given, or the default.
    pub(crate) fn active(&self) -> usize {
        self.active.unwrap_or(Self::DEFAULT_ACTIVE.min(self.servers))
    }
}

#[derive(Debug, Args)]
pub(crate) struct GenArgs {
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
    /// C^j: IOs per server per QoS period.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) capacity: u64,
    /// Buckets (tenants).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) buckets: usize,
    /// Zipf exponent s of the reservations (0 = equal).
    #[arg(long, default_value_t = 0.5)]
    pub(crate) zipf_s: f64,
    /// Zipf exponent of the demand split over a bucket's active servers.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) demand_zipf_s: f64,
    /// Give every bucket a limit of this many times its reservation.
    #[arg(long)]
    pub(crate) limit_ratio: Option<f64>,
    /// Seed of the generator.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Write here instead of stdout.
    #[arg(long, short)]
    pub(crate) out: Option<PathBuf>,
}

impl GenArgs {
    fn params(&self) -> GenParams {
        GenParams {
            servers: self.shape.servers,
            capacity: self.capacity,
            buckets: self.buckets,
            reservation_zipf_s: self.zipf_s,
            reserved_fraction: self.shape.reserved,
            demand_ratio: self.shape.demand_ratio,
            active_servers: self.shape.active(),
            demand_zipf_s: self.demand_zipf_s,
            limit_ratio: self.limit_ratio,
            seed: self.seed,
        }
    }
}

// ------------------------------------------------------------------------------------------------------
// The instance file
// ------------------------------------------------------------------------------------------------------

/// Reads and validates an instance file (size bound, then `rein_model::pshift_instance`).
pub(crate) fn load_instance(path: &Path) -> Result<Instance> {
    // Read with the bound (a size the file system states is not trusted: /dev/zero states 0).
    let text = rein_model::input::read_text_regular(path, MAX_INSTANCE_BYTES).map_err(|e| match e.kind() {
        std::io::ErrorKind::FileTooLarge => {
            anyhow::anyhow!("instance {} is larger than the {} MiB bound", path.display(), MAX_INSTANCE_BYTES >> 20)
        }
        _ => anyhow::Error::from(e).context(format!("cannot read instance {}", path.display())),
    })?;
    pshift_instance::parse(&text).map_err(|e| match e {
        pshift_instance::InstanceFileError::Json(j) => {
            anyhow::anyhow!("instance {} is not a valid instance file: {j}", path.display())
        }
        pshift_instance::InstanceFileError::Invalid(e) => anyhow::anyhow!("instance {}: {e}", path.display()),
    })
}

// ------------------------------------------------------------------------------------------------------
// Solving
// ------------------------------------------------------------------------------------------------------

/// `--threads N` within 1..=[`MAX_THREADS`], or an error naming the value given.
pub(crate) fn check_threads(threads: usize) -> Result<()> {
    if threads == 0 || threads > MAX_THREADS {
        bail!("--threads must be in 1..={MAX_THREADS}, got {threads}");
    }
    Ok(())
}

/// Runs pShift on `threads` threads (a rayon pool of that size; 1 = sequential) and times it.
pub(crate) fn timed_solve(
    inst: &Instance,
    threads: usize,
    approx_top: Option<usize>,
    approx_per_server: bool,
) -> Result<(Allocation, f64)> {
    check_threads(threads)?;
    let opts = SolveOptions { approx_top, approx_per_server, parallel: threads > 1, ..Default::default() };
    if threads == 1 {
        let t0 = Instant::now();
        let a = solve(inst, &opts);
        return Ok((a, t0.elapsed().as_secs_f64()));
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().context("starting the thread pool")?;
    Ok(pool.install(|| {
        let t0 = Instant::now();
        let a = solve(inst, &opts);
        (a, t0.elapsed().as_secs_f64())
    }))
}

#[derive(Debug, Serialize)]
struct TokensOut {
    r: u64,
    l: u64,
}

#[derive(Debug, Serialize)]
struct BucketOut {
    name: String,
    reservation: u64,
    limit: Option<u64>,
    demand: u64,
    r_tokens: u64,
    /// `null` for an unlimited bucket: it needs no L-tokens (servers serve it without).
    l_tokens: Option<u64>,
    allocation: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Serialize)]
struct ServerOut {
    name: String,
    capacity: u64,
    r_tokens: u64,
    l_tokens: u64,
}

#[derive(Debug, Serialize)]
struct StatsOut {
    shifts: u64,
    tokens_shifted: u64,
    longest_path: u32,
    searches: u64,
    participating_buckets: u32,
}

#[derive(Debug, Serialize)]
struct SolveOut {
    /// Effective capacity of the R-tokens: reservation IOs the servers can do.
    phi: u64,
    /// Phi of the initial proportional allocation (Alg. 3).
    phi_initial: u64,
    /// sum_i min(R_i, D_i): what Phi would be if every reservation could be met.
    reservations: u64,
    max_flow: Option<u64>,
    optimal: Option<bool>,
    /// Phi of the L-tokens on the residual capacity.
    phi_l: u64,
    threads: usize,
    approx_top: Option<usize>,
    approx_per_server: bool,
    time_ms: f64,
    max_flow_time_ms: Option<f64>,
    stats: StatsOut,
    #[serde(skip_serializing_if = "Option::is_none")]
    servers: Option<Vec<ServerOut>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    buckets: Option<Vec<BucketOut>>,
}

fn solve_out(inst: &Instance, a: &Allocation, args: &SolveArgs, secs: f64) -> SolveOut {
    let (max_flow, mf_ms) = if args.no_max_flow {
        (None, None)
    } else {
        let t0 = Instant::now();
        let v = rein_pshift_baseline::max_flow(inst);
        (Some(v), Some(t0.elapsed().as_secs_f64() * 1e3))
    };
    let reservations = (0..inst.buckets()).map(|i| inst.reservation(i).min(inst.total_demand(i))).sum();
    let st = &a.r_stats;
    let mut out = SolveOut {
        phi: a.phi(),
        phi_initial: st.phi_initial,
        reservations,
        max_flow,
        optimal: max_flow.map(|m| m == a.phi()),
        phi_l: a.l_stats.phi,
        threads: args.threads,
        approx_top: args.approx_top,
        approx_per_server: args.approx_per_server,
        time_ms: secs * 1e3,
        max_flow_time_ms: mf_ms,
        stats: StatsOut {
            shifts: st.shifts + a.l_stats.shifts,
            tokens_shifted: st.tokens_shifted + a.l_stats.tokens_shifted,
            longest_path: st.longest_path.max(a.l_stats.longest_path),
            searches: st.searches + a.l_stats.searches,
            participating_buckets: st.participating,
        },
        servers: None,
        buckets: None,
    };
    if !args.summary {
        let mut srv: Vec<ServerOut> = (0..inst.servers())
            .map(|j| ServerOut { name: inst.server_name(j), capacity: inst.capacity(j), r_tokens: 0, l_tokens: 0 })
            .collect();
        let mut buckets = Vec::with_capacity(inst.buckets());
        for i in 0..inst.buckets() {
            let mut alloc = serde_json::Map::new();
            let (mut r, mut l) = (0, 0);
            for e in inst.bucket_entries(i) {
                let j = inst.entry_server(e);
                srv[j].r_tokens += a.r[e];
                srv[j].l_tokens += a.l[e];
                r += a.r[e];
                l += a.l[e];
                alloc.insert(
                    inst.server_name(j),
                    serde_json::to_value(TokensOut { r: a.r[e], l: a.l[e] }).expect("plain struct"),
                );
            }
            buckets.push(BucketOut {
                name: inst.bucket_name(i),
                reservation: inst.reservation(i),
                limit: inst.limit(i),
                demand: inst.total_demand(i),
                r_tokens: r,
                l_tokens: inst.limit(i).map(|_| l),
                allocation: alloc,
            });
        }
        out.servers = Some(srv);
        out.buckets = Some(buckets);
    }
    out
}

/// `rein pshift`: solve an instance file (JSON on stdout), run the Experiment 2 sweep, generate an
/// instance, or run the controller daemon.
pub(crate) fn run(cmd: PshiftCmd) -> Result<()> {
    match cmd {
        PshiftCmd::Solve(a) => {
            let inst = load_instance(&a.instance)?;
            let (alloc, secs) = timed_solve(&inst, a.threads, a.approx_top, a.approx_per_server)?;
            let out = solve_out(&inst, &alloc, &a, secs);
            outln!("{}", serde_json::to_string_pretty(&out)?);
        }
        PshiftCmd::Sweep(a) => sweep(&a)?,
        PshiftCmd::Controller(a) => controller(&a)?,
        PshiftCmd::Gen(a) => {
            let inst = generate(&a.params()).map_err(anyhow::Error::msg).context("rein pshift gen")?;
            let json = pshift_instance::to_json(&inst);
            match &a.out {
                // Whole or not at all (a full disk left a cut instance that failed later, in solve).
                Some(p) => rein_runtime::durable::write(p, json.as_bytes())?,
                None => out!("{json}"),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// An instance path naming a device that never ends is refused as not a regular file (before the bound:
    /// the size check read the stated 0 bytes and `rein pshift solve /dev/zero` grew to 7 GB in 6 s; a
    /// regular file is read with the bound, rein-model's input module).
    #[test]
    fn an_instance_is_read_with_a_bound() {
        let e = super::load_instance(std::path::Path::new("/dev/zero")).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.starts_with("cannot read instance /dev/zero: it is a device, not a regular file"), "{e}");
    }
}
