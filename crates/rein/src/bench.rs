//! `rein bench`: speed measurements (never timed tests).
//!
//! - `rein bench sched`: steady-state cost of one enqueue plus one dispatch with N backlogged tenants
//!   (16 queued each; half with reservations of half their fair share; weights 1-4; limits 1.5x the fair
//!   share), against a plain FIFO queue (`VecDeque`) holding the same number of requests, in the same run.
//! - `rein bench sim`: simulated completions per wall-clock second for an N-tenant, 8-server mClock
//!   scenario.
//! - `rein bench pshift`: pShift's allocation time on the paper's synthetic instances against the max-flow
//!   baseline (ac-library-rs Dinic) on the same instance in the same run, by thread count, and the
//!   top-M approximation's Phi against its time.
//! - `rein bench dispatch`: the NBD server's dispatcher in-process (the capacity probe's closed-loop 4 KiB
//!   random reads, from N tenants, on a page-cached file through io_uring, or RAM), mClock against FIFO
//!   in alternating runs: the scheduling cost without the network and the client's noise.
//!
//! Each row is printed as soon as it is measured ([`Rows`]), and a benchmark stops measuring once
//! nobody reads stdout, with status 0: its output is its only product (`rein bench sched | head -1`
//! measures one row at most, not every tenant count).

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use rein_core::{Fifo, Mclock, Nanos, Poll, QosSpec, Rbfq, Request, SchedConfig, Scheduler, SchedulerKind, Sfq};
use serde::Serialize;
use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Instant;

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCmd {
    /// Scheduler cost per request (enqueue + dispatch) vs a plain FIFO queue.
    Sched(SchedArgs),
    /// Simulator speed: completions per second.
    Sim(SimBenchArgs),
    /// pShift allocation time vs the max-flow baseline (and the top-M approximation).
    Pshift(PshiftBenchArgs),
    /// The server's dispatcher in-process (no network, no client): IOPS through mClock vs FIFO.
    Dispatch(DispatchBenchArgs),
    /// The byte budget's fast path: ns per charge and release of a request that fits.
    Budget(BudgetBenchArgs),
}

#[derive(Debug, Args)]
pub(crate) struct BudgetBenchArgs {
    /// Charges per run.
    #[arg(long, default_value_t = 2_000_000)]
    pub(crate) charges: u32,
    /// Bytes per charge (a 4 KiB read and its reply header).
    #[arg(long, default_value_t = 4096 + 16)]
    pub(crate) bytes: usize,
    /// Runs; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) repeat: usize,
    /// Print the rows as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Serialize)]
struct BudgetRow {
    one_thread_ns: f64,
    two_threads_ns: [f64; 2],
}

#[derive(Debug, Args)]
pub(crate) struct DispatchBenchArgs {
    /// Comma-separated tenant counts.
    #[arg(long, default_value = "1,100", value_delimiter = ',', value_parser = parse_count)]
    pub(crate) tenants: Vec<usize>,
    /// Requests outstanding in all (closed loop), spread over the tenants.
    #[arg(long, default_value_t = 128)]
    pub(crate) outstanding: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) seconds: f64,
    /// Runs per configuration (alternating schedulers); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub(crate) repeat: usize,
    /// Backend: memory (RAM, requests inline) or file (a page-cached 256 MiB file through io_uring).
    #[arg(long, default_value = "file")]
    pub(crate) backend: String,
    /// Print the rows as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Serialize)]
struct DispatchRow {
    tenants: usize,
    backend: String,
    mclock_iops: f64,
    fifo_iops: f64,
    /// 1 - mclock / fifo, in percent (positive: mClock is slower).
    mclock_cost_pct: f64,
}

/// One closed-loop run through a fresh dispatcher (the capacity probe's load, with `kind` and `tenants`);
/// returns IOPS.
fn dispatch_run(
    kind: SchedulerKind,
    tenants: usize,
    outstanding: usize,
    seconds: f64,
    storage: std::sync::Arc<dyn rein_runtime::Storage>,
) -> Result<f64> {
    use rein_runtime::probe::{probe, ProbeConfig};
    let cfg = ProbeConfig {
        seconds,
        scheduler: kind,
        tenants,
        workers: Some(outstanding.max(tenants)),
        ..ProbeConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    Ok(rt.block_on(probe(storage, None, &cfg))?.iops)
}

/// `rein bench dispatch`: one row per tenant count.
fn dispatch(a: &DispatchBenchArgs) -> Result<()> {
    // Each flag alone, with the value given (all the bounds in one line left the culprit to be found).
    if !(a.seconds > 0.0 && a.seconds <= 600.0) {
        bail!("--seconds {} is out of range: a run lasts more than 0 and at most 600 s", a.seconds);
    }
    if a.repeat == 0 {
        bail!("--repeat 0 is out of range: at least 1");
    }
    if a.outstanding == 0 || a.outstanding > 100_000 {
        bail!("--outstanding {} is out of range: 1 to 100000 requests", a.outstanding);
    }
    let storage: std::sync::Arc<dyn rein_runtime::Storage> = match a.backend.as_str() {
        "memory" => std::sync::Arc::new(rein_runtime::MemStorage::new(256 << 20)),
        "file" => {
            let dir = tempfile::Builder::new().prefix("rein-bench-dispatch-").tempdir()?;
            let path = dir.path().join("bench.img");
            let f = rein_runtime::FileStorage::open(&path, Some(256 << 20), false)?;
            // The file and its directory go at once, the open descriptor keeping the file: a run stopped by
            // a signal (Ctrl-C), which runs no destructor, left the 256 MiB file in the temp directory.
            std::fs::remove_file(&path)?;
            dir.close()?;
            // Write it once so every read hits the page cache, as in the NBD benchmark.
            let chunk = vec![0x5Au8; 1 << 20];
            for i in 0..256u64 {
                rein_runtime::Storage::write_at(&f, &chunk, i << 20)?;
            }
            std::sync::Arc::new(f)
        }
        o => bail!("--backend {o:?}: expected memory or file"),
    };
    let mut rows = Rows::start(
        a.json,
        "| tenants | backend | mClock IOPS | FIFO IOPS | mClock cost |",
        "|---:|---|---:|---:|---:|",
        |r: &DispatchRow| {
            format!(
                "| {} | {} | {:.0} | {:.0} | {:+.1}% |",
                r.tenants, r.backend, r.mclock_iops, r.fifo_iops, r.mclock_cost_pct
            )
        },
    );
    'rows: for &n in &a.tenants {
        let (mut m, mut f) = (Vec::new(), Vec::new());
        for _ in 0..a.repeat {
            if rows.unread() {
                break 'rows;
            }
            m.push(dispatch_run(SchedulerKind::Mclock, n, a.outstanding, a.seconds, storage.clone())?);
            f.push(dispatch_run(SchedulerKind::Fifo, n, a.outstanding, a.seconds, storage.clone())?);
        }
        let (mi, fi) = (median(m), median(f));
        rows.print(&DispatchRow {
            tenants: n,
            backend: a.backend.clone(),
            mclock_iops: mi,
            fifo_iops: fi,
            mclock_cost_pct: 100.0 * (1.0 - mi / fi),
        })?;
    }
    rows.finish();
    Ok(())
}

/// One of a comma-separated list of tenant or bucket counts (clap's error names the flag and the value).
fn parse_count(x: &str) -> Result<usize, String> {
    const GIVE: &str = "give whole numbers from 1 to 1000000 separated by commas, as 1000,10000";
    if x.trim().is_empty() {
        return Err(format!("an empty count: {GIVE}"));
    }
    let v: usize = x.trim().replace('_', "").parse().map_err(|_| format!("{x:?} is not a count: {GIVE}"))?;
    if v == 0 || v > 1_000_000 {
        return Err(format!("count {v} out of range 1..=1000000"));
    }
    Ok(v)
}

#[derive(Debug, Args)]
pub(crate) struct SchedArgs {
    /// Comma-separated tenant counts.
    #[arg(long, default_value = "10,100,1000,10000,100000", value_delimiter = ',', value_parser = parse_count)]
    pub(crate) tenants: Vec<usize>,
    /// mclock, dmclock, rbfq, sfq, token or fifo.
    #[arg(long, default_value = "mclock")]
    pub(crate) scheduler: SchedulerKind,
    /// Requests timed per repetition (default: enough for about half a second).
    #[arg(long)]
    pub(crate) requests: Option<u64>,
    /// Repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) repeat: usize,
    /// Print the rows as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct SchedRow {
    pub(crate) scheduler: String,
    pub(crate) tenants: usize,
    pub(crate) ns_per_request: f64,
    pub(crate) fifo_ns_per_request: f64,
    /// ns_per_request / fifo_ns_per_request.
    pub(crate) ratio: f64,
    pub(crate) requests: u64,
    /// Fraction of timed dispatches made in the reservation phase (a sanity check of the workload).
    pub(crate) reservation_fraction: f64,
}

struct Setup<S> {
    s: S,
    now_ps: u128,
    step_ps: u128,
    handle: u64,
}

fn setup<S: Scheduler>(mut s: S, n: usize) -> Setup<S> {
    // Capacity: 1,000 IOPS per tenant; fair share by weight.
    let capacity = 1000.0 * n as f64;
    let wsum: f64 = (0..n).map(|i| 1.0 + (i % 4) as f64).sum();
    let mut handle = 0;
    let ids: Vec<_> = (0..n)
        .map(|i| {
            let w = 1.0 + (i % 4) as f64;
            let fair = capacity * w / wsum;
            let r = if i % 2 == 0 { 0.5 * fair } else { 0.0 };
            s.add_tenant(QosSpec::new(r, Some(1.5 * fair), w, 0).expect("valid bench spec")).expect("within bounds")
        })
        .collect();
    for &id in &ids {
        for _ in 0..16 {
            s.enqueue(Nanos(0), Request::new(id, handle)).expect("within bounds");
            handle += 1;
        }
    }
    Setup { s, now_ps: 0, step_ps: (1e12 / capacity) as u128, handle }
}

/// One steady-state step: dispatch one request and enqueue a replacement for its tenant. Returns whether
/// the dispatch was in the reservation phase.
#[inline(always)]
fn step<S: Scheduler>(b: &mut Setup<S>) -> bool {
    let now = Nanos((b.now_ps / 1000) as u64);
    match b.s.poll(now, true) {
        Poll::Dispatch(d) => {
            b.s.enqueue(now, Request::new(d.tenant, b.handle)).expect("queue bound holds");
            b.handle += 1;
            b.now_ps += b.step_ps;
            d.phase == rein_core::Phase::Reservation
        }
        Poll::Wait(t) => {
            b.now_ps = t.0 as u128 * 1000;
            false
        }
        Poll::Empty => unreachable!("tenants stay backlogged"),
    }
}

fn time_sched<S: Scheduler>(s: S, n: usize, requests: u64, repeat: usize) -> (f64, f64) {
    let mut b = setup(s, n);
    // Warm up: every tenant's queue turns over at least once.
    for _ in 0..(n as u64 * 32).max(200_000) {
        step(&mut b);
    }
    let mut times = Vec::new();
    let mut resv = 0u64;
    let mut done = 0u64;
    for _ in 0..repeat {
        let start_q = b.s.queued();
        let t0 = Instant::now();
        let mut k = 0;
        let mut dispatched = 0;
        while dispatched < requests {
            let before = b.handle;
            resv += step(&mut b) as u64;
            dispatched += b.handle - before;
            k += 1;
        }
        let el = t0.elapsed().as_secs_f64();
        black_box(k);
        assert_eq!(b.s.queued(), start_q, "steady state");
        done += dispatched;
        times.push(el * 1e9 / dispatched as f64);
    }
    (median(times), resv as f64 / done.max(1) as f64)
}

fn time_fifo(n: usize, requests: u64, repeat: usize) -> f64 {
    let mut q: VecDeque<(u32, u64)> = (0..n * 16).map(|i| ((i % n) as u32, i as u64)).collect();
    let mut times = Vec::new();
    let mut h = q.len() as u64;
    for _ in 0..repeat {
        let t0 = Instant::now();
        for _ in 0..requests {
            let (t, _) = q.pop_front().expect("non-empty");
            q.push_back((t, h));
            h += 1;
            black_box(&q);
        }
        times.push(t0.elapsed().as_secs_f64() * 1e9 / requests as f64);
    }
    median(times)
}

/// `rein bench sched`: one row per tenant count, the scheduler and FIFO measured in the same run.
fn sched(args: &SchedArgs) -> Result<()> {
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let mut rows = Rows::start(
        args.json,
        &format!("| tenants | {} ns/request | FIFO ns/request | ratio |", args.scheduler),
        "|---:|---:|---:|---:|",
        |r: &SchedRow| {
            format!("| {} | {:.1} | {:.1} | {:.1} |", r.tenants, r.ns_per_request, r.fifo_ns_per_request, r.ratio)
        },
    );
    for &n in &args.tenants {
        if rows.unread() {
            break;
        }
        let requests = args.requests.unwrap_or(2_000_000).max(1);
        let c = SchedConfig::default();
        let (ns, resv) = match args.scheduler {
            SchedulerKind::Mclock => time_sched(Mclock::new(c), n, requests, args.repeat),
            SchedulerKind::Dmclock => time_sched(Mclock::dmclock(c), n, requests, args.repeat),
            SchedulerKind::Rbfq => time_sched(Rbfq::new(c), n, requests, args.repeat),
            SchedulerKind::Sfq => time_sched(Sfq::new(c), n, requests, args.repeat),
            SchedulerKind::Fifo => time_sched(Fifo::new(c), n, requests, args.repeat),
            SchedulerKind::Token => time_sched(rein_core::pshift::TokenScheduler::new(c), n, requests, args.repeat),
        };
        let fifo = time_fifo(n, requests, args.repeat);
        let r = SchedRow {
            scheduler: args.scheduler.name().to_string(),
            tenants: n,
            ns_per_request: ns,
            fifo_ns_per_request: fifo,
            ratio: ns / fifo,
            requests,
            reservation_fraction: resv,
        };
        if progress(args.json) {
            errln!(
                "{:>8} tenants: {:>8.1} ns/request  (FIFO {:>6.1} ns, x{:.1}; {:.0}% reservation phase)",
                n,
                r.ns_per_request,
                r.fifo_ns_per_request,
                r.ratio,
                r.reservation_fraction * 100.0
            );
        }
        rows.print(&r)?;
    }
    rows.finish();
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct SimBenchArgs {
    /// Comma-separated tenant counts.
    #[arg(long, default_value = "1000,10000", value_delimiter = ',', value_parser = parse_count)]
    pub(crate) tenants: Vec<usize>,
    /// Servers the tenants are spread over (1..=1024).
    #[arg(long, default_value_t = 8)]
    pub(crate) servers: usize,
    /// Simulated seconds per run.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) seconds: f64,
    /// Print the rows as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct SimRow {
    pub(crate) tenants: usize,
    pub(crate) servers: usize,
    pub(crate) completions: u64,
    pub(crate) events: u64,
    pub(crate) wall_s: f64,
    pub(crate) completions_per_s: f64,
    /// The same scenario with every server running FIFO: the simulator without scheduling work.
    pub(crate) fifo_completions_per_s: f64,
    /// `completions_per_s / fifo_completions_per_s`.
    pub(crate) ratio_to_fifo: f64,
}

#[derive(Debug, Args)]
pub(crate) struct PshiftBenchArgs {
    /// Comma-separated bucket counts.
    #[arg(long, default_value = "1000,10000,100000", value_delimiter = ',', value_parser = parse_count)]
    pub(crate) buckets: Vec<usize>,
    #[command(flatten)]
    pub(crate) shape: crate::pshift::ShapeArgs,
    /// Comma-separated thread counts.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    pub(crate) threads: Vec<usize>,
    /// Comma-separated M for the top-M approximation (one thread); `--approx` alone for none.
    #[arg(long, default_value = "100,500,2000", value_delimiter = ',', num_args = 0..)]
    pub(crate) approx: Vec<usize>,
    /// Repetitions of each measurement; the median is reported.
    #[arg(long, default_value_t = 7)]
    pub(crate) repeat: usize,
    /// Seed of the generated instances.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Print the rows as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct PshiftRow {
    pub(crate) buckets: usize,
    pub(crate) threads: usize,
    pub(crate) approx_top: Option<usize>,
    /// Median pShift time (instance in memory -> R- and L-tokens).
    pub(crate) ms: f64,
    /// Fastest of the runs (less sensitive to other load on the machine).
    pub(crate) min_ms: f64,
    /// Median max-flow time on the same instance (graph construction + Dinic), and the fastest run.
    pub(crate) max_flow_ms: f64,
    pub(crate) max_flow_min_ms: f64,
    /// ms / max_flow_ms.
    pub(crate) ratio: f64,
    pub(crate) phi: u64,
    pub(crate) max_flow: u64,
    pub(crate) phi_initial: u64,
    /// Share of the removable weak excess tokens removed: (phi - phi_initial) / (max_flow - phi_initial).
    pub(crate) excess_removed_pct: f64,
    pub(crate) shifts: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `rein bench pshift`: one row per bucket count and thread count (and per M of the approximation).
fn pshift(a: &PshiftBenchArgs) -> Result<()> {
    if a.repeat == 0 || a.repeat > 1000 {
        bail!("--repeat must be in 1..=1000");
    }
    // Each thread count before the table's head: one out of range failed the run mid-table, after the
    // max-flow baseline had been timed.
    for &t in &a.threads {
        crate::pshift::check_threads(t)?;
    }
    let mut rows = Rows::start(
        a.json,
        "| buckets | threads | top M | pShift ms (median / min) | max-flow ms (median / min) | pShift / max flow | Phi | \
         max flow | excess removed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        |r: &PshiftRow| {
            format!(
                "| {} | {} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} | {} | {} | {:.1}% |",
                r.buckets,
                r.threads,
                r.approx_top.map_or("exact".into(), |m| m.to_string()),
                r.ms,
                r.min_ms,
                r.max_flow_ms,
                r.max_flow_min_ms,
                r.ratio,
                r.phi,
                r.max_flow,
                r.excess_removed_pct
            )
        },
    );
    'rows: for &n in &a.buckets {
        if rows.unread() {
            break;
        }
        let params = rein_sim::model::pshift::gen::GenParams {
            servers: a.shape.servers,
            buckets: n,
            active_servers: a.shape.active(),
            reserved_fraction: a.shape.reserved,
            demand_ratio: a.shape.demand_ratio,
            seed: a.seed,
            ..Default::default()
        };
        let inst = rein_sim::model::pshift::gen::generate(&params).map_err(anyhow::Error::msg)?;
        let mut mf = 0;
        let mf_times: Vec<f64> = (0..a.repeat)
            .map(|_| {
                let t0 = Instant::now();
                mf = black_box(rein_pshift_baseline::max_flow(black_box(&inst)));
                t0.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        let mf_min = mf_times.iter().cloned().fold(f64::INFINITY, f64::min);
        let mf_ms = median(mf_times);
        let mut runs: Vec<(usize, Option<usize>)> = a.threads.iter().map(|&t| (t, None)).collect();
        runs.extend(a.approx.iter().map(|&m| (1, Some(m))));
        for (threads, approx_top) in runs {
            if rows.unread() {
                break 'rows;
            }
            let mut last = None;
            let mut times = Vec::new();
            for _ in 0..a.repeat {
                let (alloc, secs) = crate::pshift::timed_solve(black_box(&inst), threads, approx_top, false)?;
                times.push(secs * 1e3);
                last = Some(alloc);
            }
            let alloc = last.expect("repeat >= 1");
            let min_ms = times.iter().cloned().fold(f64::INFINITY, f64::min);
            let ms = median(times);
            let st = alloc.r_stats;
            let removable = mf.saturating_sub(st.phi_initial);
            let row = PshiftRow {
                buckets: n,
                threads,
                approx_top,
                ms,
                min_ms,
                max_flow_ms: mf_ms,
                max_flow_min_ms: mf_min,
                ratio: ms / mf_ms,
                phi: alloc.phi(),
                max_flow: mf,
                phi_initial: st.phi_initial,
                excess_removed_pct: if removable == 0 {
                    100.0
                } else {
                    100.0 * (st.phi - st.phi_initial) as f64 / removable as f64
                },
                shifts: st.shifts,
            };
            if approx_top.is_none() && row.phi != mf {
                bail!("pShift's Phi {} differs from the max-flow value {mf} at {n} buckets", row.phi);
            }
            if progress(a.json) {
                errln!(
                    "{n:>7} buckets, {threads} thread(s){}: pShift {ms:.2} ms, max flow {mf_ms:.2} ms (x{:.2}); Phi {} of {mf}",
                    approx_top.map_or(String::new(), |m| format!(", top {m}")),
                    row.ratio,
                    row.phi
                );
            }
            rows.print(&row)?;
        }
    }
    rows.finish();
    Ok(())
}

/// A benchmark's rows on stdout, each printed as soon as it is measured: a Markdown table (its column
/// titles and alignment row at once, then a line per row) or, with `--json`, a JSON array, the text
/// `serde_json::to_string_pretty` gives the whole list, one element at a time ([`json_element`]).
struct Rows<T> {
    json: bool,
    row: fn(&T) -> String,
    printed: usize,
}

impl<T: Serialize> Rows<T> {
    /// Starts the output: `head` (the column titles) and `align` (their alignment row) for the table.
    fn start(json: bool, head: &str, align: &str, row: fn(&T) -> String) -> Rows<T> {
        if !json {
            outln!("{head}");
            outln!("{align}");
        }
        Rows { json, row, printed: 0 }
    }

    fn print(&mut self, r: &T) -> Result<()> {
        if self.json {
            out!("{}", json_element(self.printed == 0, r)?);
        } else {
            outln!("{}", (self.row)(r));
        }
        self.printed += 1;
        Ok(())
    }

    /// Ends the output (the JSON array's closing bracket).
    fn finish(self) {
        if self.json {
            out!("{}", json_end(self.printed));
        }
    }

    /// Nobody reads the rows any more (stdout closed, crate::stdout::closed): the benchmark stops
    /// measuring, and the command ends with its own status.
    fn unread(&self) -> bool {
        crate::stdout::closed()
    }
}

/// One element of a JSON array as `serde_json::to_string_pretty` prints the array: the opening bracket
/// (the first) or the comma after the one before, a line break, and the element's own pretty text
/// indented by two spaces. The last is followed by [`json_end`].
fn json_element<T: Serialize>(first: bool, r: &T) -> Result<String> {
    let mut text = String::from(if first { "[" } else { "," });
    for line in serde_json::to_string_pretty(r)?.lines() {
        text.push_str("\n  ");
        text.push_str(line);
    }
    Ok(text)
}

/// The end of a JSON array of `printed` elements printed by [`json_element`].
fn json_end(printed: usize) -> &'static str {
    if printed == 0 {
        "[]\n"
    } else {
        "\n]\n"
    }
}

/// Whether a line per row goes to stderr as it is measured, with details the table leaves out: not
/// with `--json` (whose rows hold them), nor when stdout is a terminal (where the table's own rows
/// appear as they are measured, and lines between them would break it).
fn progress(json: bool) -> bool {
    !json && !std::io::IsTerminal::is_terminal(&std::io::stdout())
}

/// `rein bench`: runs the measurement and prints a Markdown table (or `--json`).
pub(crate) fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Pshift(a) => pshift(&a),
        BenchCmd::Budget(a) => {
            if a.repeat == 0 || a.charges == 0 {
                bail!("--repeat and --charges must be at least 1");
            }
            let runs: Vec<_> =
                (0..a.repeat).map(|_| rein_runtime::budget::fast_path_cost_ns(a.charges, a.bytes)).collect();
            let med = |f: fn(&(f64, f64, f64)) -> f64| {
                let mut v: Vec<f64> = runs.iter().map(f).collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let row = BudgetRow { one_thread_ns: med(|r| r.0), two_threads_ns: [med(|r| r.1), med(|r| r.2)] };
            let mut rows = Rows::start(
                a.json,
                "| one thread ns | two threads (two tenants) ns |",
                "|---:|---:|",
                |r: &BudgetRow| {
                    format!("| {:.1} | {:.1} / {:.1} |", r.one_thread_ns, r.two_threads_ns[0], r.two_threads_ns[1])
                },
            );
            rows.print(&row)?;
            rows.finish();
            Ok(())
        }
        BenchCmd::Dispatch(a) => dispatch(&a),
        BenchCmd::Sched(a) => sched(&a),
        BenchCmd::Sim(a) => {
            if !(a.seconds > 0.0 && a.seconds <= 3600.0) {
                bail!("--seconds {} is out of range: a run simulates more than 0 and at most 3600 s", a.seconds);
            }
            if a.servers == 0 || a.servers > 1024 {
                bail!("--servers {} is out of range: 1 to 1024 servers", a.servers);
            }
            let mut rows = Rows::start(
                a.json,
                "| tenants | servers | mClock completions/s (millions) | FIFO completions/s (millions) | ratio |",
                "|---:|---:|---:|---:|---:|",
                |r: &SimRow| {
                    format!(
                        "| {} | {} | {:.2} | {:.2} | {:.2} |",
                        r.tenants,
                        r.servers,
                        r.completions_per_s / 1e6,
                        r.fifo_completions_per_s / 1e6,
                        r.ratio_to_fifo
                    )
                },
            );
            for &n in &a.tenants {
                if rows.unread() {
                    break;
                }
                let run = |scheduler: &str| -> Result<(u64, u64, f64)> {
                    let sc = rein_sim::bench::scenario(n, a.servers, a.seconds, scheduler);
                    let t0 = Instant::now();
                    let r = rein_sim::run(&sc, &mut |_| {})?;
                    Ok((r.completions(), r.events, t0.elapsed().as_secs_f64()))
                };
                let (completions, events, el) = run("mclock")?;
                let (fifo_completions, _, fifo_el) = run("fifo")?;
                let rate = completions as f64 / el;
                let fifo_rate = fifo_completions as f64 / fifo_el;
                let row = SimRow {
                    tenants: n,
                    servers: a.servers,
                    completions,
                    events,
                    wall_s: el,
                    completions_per_s: rate,
                    fifo_completions_per_s: fifo_rate,
                    ratio_to_fifo: rate / fifo_rate,
                };
                if progress(a.json) {
                    errln!("{n} tenants x {} servers: {completions} completions in {el:.2} s (FIFO: {fifo_completions} in {fifo_el:.2} s)", a.servers);
                }
                rows.print(&row)?;
            }
            rows.finish();
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--json` rows printed one at a time make the text the whole list printed at once made (nested
    /// arrays and null included), for no row, one and several.
    #[test]
    fn json_rows_one_at_a_time_are_the_whole_lists_text() {
        let row = |approx_top| PshiftRow {
            buckets: 1000,
            threads: 2,
            approx_top,
            ms: 1.5,
            min_ms: 1.25,
            max_flow_ms: 3.0,
            max_flow_min_ms: 2.5,
            ratio: 0.5,
            phi: 7,
            max_flow: 7,
            phi_initial: 3,
            excess_removed_pct: 100.0,
            shifts: 4,
        };
        let rows = [row(None), row(Some(100)), row(Some(500))];
        for n in 0..=rows.len() {
            let mut text = String::new();
            for (i, r) in rows[..n].iter().enumerate() {
                text.push_str(&json_element(i == 0, r).unwrap());
            }
            text.push_str(json_end(n));
            assert_eq!(text, serde_json::to_string_pretty(&rows[..n]).unwrap() + "\n", "{n} rows");
        }
        let budget = BudgetRow { one_thread_ns: 28.7, two_threads_ns: [30.1, 31.2] };
        let text = json_element(true, &budget).unwrap() + json_end(1);
        assert_eq!(text, serde_json::to_string_pretty(&[budget]).unwrap() + "\n");
    }
}
