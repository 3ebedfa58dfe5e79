//! `rein demo`: Rein's main job on a built-in default.
//!
//! Starts `rein serve` on its built-in default (three file-backed exports rd, oltp, dm in a data
//! directory) in front of a modelled device of 2,400 IOPS, runs the mClock paper's RD / OLTP / DM tenants
//! against it with `rein load` (16, 32 and 64 requests outstanding: DM is a bulk copy), halves the device's capacity half-way
//! through the admin endpoint, and prints and plots whether reservations and limits held: at 2,400 IOPS DM
//! is held at its 1,000 IOPS limit and RD and OLTP split the rest 1:2; at 1,200 IOPS RD keeps its 250 IOPS
//! reservation (its weight share would be 200) and OLTP and DM split what is left 2:3 (380 / 570).
//!
//! `--simulated` runs the same example in the simulator instead (scenarios/demo.toml).
//!
//! Outputs go to `--out` (default `out/rein-demo`, under the `out/` folder that git ignores; not `out/demo`,
//! which `scripts/reproduce.sh` fills from scenarios/demo.toml). The live run's export images are scratch:
//! sparse files of 256 MiB each, about 50 MB written in the default 30 s (a quarter of the 4 KiB requests are
//! writes). They live in `<out>/data` while the server runs and are removed when the demo ends, so a run
//! leaves only the summary, the time series and the plots.

use crate::sim;
use anyhow::{bail, Context, Result};
use clap::Args;
use rein_core::oracle::{allocate, OracleTenant};
use rein_core::SchedulerKind;
use rein_model::device::{DeviceSpec, ServiceModel};
use rein_runtime::config::ServerConfig;
use rein_runtime::load::LoadConfig;
use rein_runtime::DeviceConfig;
use rein_sim::model::NamedScheduler;
use rein_sim::Scenario;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// The built-in simulated scenario (also at scenarios/demo.toml).
pub(crate) const DEMO_TOML: &str = include_str!("../../../scenarios/demo.toml");

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Scheduler to demonstrate (try fifo or sfq to see what goes wrong without mClock): a name `rein sim
    /// --scheduler` takes, parsed once, here, for the live run and `--simulated` alike.
    #[arg(long, default_value = "mclock")]
    pub(crate) scheduler: NamedScheduler,
    /// Where to write summary.json, timeseries.csv and the plots (the live run's scratch export images live
    /// in its data/ folder while the server runs and are removed at the end).
    #[arg(long, default_value = "out/rein-demo")]
    pub(crate) out: PathBuf,
    /// Seconds of load (the capacity halves half-way); the live run only (`--simulated` runs the built-in
    /// scenario's 120 simulated seconds).
    #[arg(long, default_value_t = 30.0, conflicts_with = "simulated")]
    pub(crate) seconds: f64,
    /// Run the example in the simulator instead of on a live server.
    #[arg(long)]
    pub(crate) simulated: bool,
    /// Print the result as JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Serialize)]
struct WindowRow {
    name: String,
    reservation: f64,
    limit: Option<f64>,
    weight: f64,
    iops: f64,
    oracle: f64,
}

#[derive(Debug, Serialize)]
struct Window {
    label: String,
    from_s: f64,
    to_s: f64,
    capacity_iops: f64,
    tenants: Vec<WindowRow>,
}

#[derive(Debug, Serialize)]
struct DemoResult {
    scheduler: String,
    windows: Vec<Window>,
    reservations_held: bool,
    limits_held: bool,
}

/// `rein demo`: the module comment's run, live or `--simulated`.
pub(crate) fn run(args: DemoArgs) -> Result<()> {
    if args.simulated {
        return run_simulated(args);
    }
    check_live_flags(&args)?;
    // An unwritable --out fails now, not after the run (and after the flags: a refused one makes nothing).
    crate::sim::check_out(&args.out)?;
    // lfq and dtfq are SFQ on one server with no gateway (the simulator's names for where its tags
    // come from across servers): the live run is SFQ under the name given, as `--simulated` runs it.
    let kind = args.scheduler.kind();
    let name = args.scheduler.name().to_string();
    let mut cfg = ServerConfig::builtin();
    cfg.listen = "127.0.0.1:0".parse().expect("valid");
    cfg.admin = "127.0.0.1:0".parse().expect("valid");
    cfg.scheduler = kind;
    let data = args.out.join("data");
    for e in &mut cfg.exports {
        if let rein_runtime::config::BackendKind::File { path } = &mut e.backend {
            *path = data.join(path.file_name().expect("file name"));
        }
    }
    cfg.data_dir = data;
    cfg.device = Some(DeviceConfig {
        spec: DeviceSpec::new(2400.0, ServiceModel::Exponential)?,
        seed: 1,
        stream: 0,
        service_scale: Vec::new(),
    });
    cfg.capacity_iops = Some(2400.0);
    let specs: Vec<_> = cfg.tenants.iter().map(|t| (t.name.clone(), t.spec)).collect();
    let total = Duration::from_secs_f64(args.seconds);
    let half = total / 2;
    // What the demo makes (listed before it makes any of it) goes at the end.
    let mut scratch = Scratch::new(
        &cfg.data_dir,
        cfg.exports
            .iter()
            .filter_map(|e| match &e.backend {
                rein_runtime::config::BackendKind::File { path } => Some(path.clone()),
                _ => None,
            })
            .chain([rein_runtime::state::STATE_FILE, rein_runtime::state::LOCK_FILE].map(|f| cfg.data_dir.join(f))),
    );
    // The demo starts from its own configuration: the capacity a previous run set through the admin API
    // (kept in the state file) must not carry over. The state file goes only under the data directory's
    // lock, so never from under a server running there (it removed a running server's state); the lock is
    // released just before the demo's own server takes it.
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("creating the demo's data directory {}", cfg.data_dir.display()))?;
    {
        let _lock = match rein_runtime::state::DirLock::acquire(&cfg.data_dir) {
            Ok(l) => l,
            Err(e) => {
                // Another server's directory: nothing in it is the demo's to remove.
                scratch.disarm();
                bail!("{e}: the demo's data directory is in use; choose another --out than {}", shown(&args.out));
            }
        };
        match std::fs::remove_file(cfg.data_dir.join(rein_runtime::state::STATE_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).context(format!("removing the previous demo's {}", rein_runtime::state::STATE_FILE))
            }
            _ => {}
        }
    }
    if !args.json {
        // The plan first, so that whoever started it knows what to expect and for how long.
        let tenants: Vec<String> = specs.iter().map(|(n, s)| describe(n, s)).collect();
        errln!(
            "rein demo: the mClock paper's §2.1 tenants {} on a live rein serve ({name} scheduler) over a \
             modelled device of 2,400 IOPS, halved to 1,200 IOPS after {:.0} s; {:.0} s of load, then a summary; \
             outputs in {}",
            tenants.join(", "),
            half.as_secs_f64(),
            total.as_secs_f64(),
            shown(&args.out)
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let quiet = args.json;
    let run_name = format!("rein demo, live {name}");
    let outcome = rt.block_on(async move {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let cost_model = cfg.sched.cost_model;
        let server = tokio::spawn(rein_runtime::server::run(cfg, async move { let _ = stop_rx.await; }, Some(ready_tx)));
        let bound = match ready_rx.await {
            Ok(b) => b,
            Err(_) => return Err(server.await?.err().map(anyhow::Error::from).unwrap_or_else(|| anyhow::anyhow!("server did not start"))),
        };
        if !quiet {
            errln!("rein serve on nbd://{} (admin http://{}), modelled device 2,400 IOPS; load for {:.0} s, capacity halves at {:.0} s", bound.nbd, bound.admin, total.as_secs_f64(), half.as_secs_f64());
        }
        let admin = bound.admin;
        let halver = tokio::spawn(async move {
            tokio::time::sleep(half).await;
            rein_runtime::admin_client::put_json(&admin.into(), None, "/api/capacity", &serde_json::json!({ "iops": 1200.0 }))
                .await
                .context("halving the modelled capacity")
        });
        // RD is light (16 outstanding), OLTP busier (32), DM a bulk copy keeping 64 in flight.
        let jobs = [("rd", 16), ("oltp", 32), ("dm", 64)]
            .iter()
            .map(|&(n, depth)| crate::load::parse_job(&format!("name={n},depth={depth},read=75"), total))
            .collect::<Result<Vec<_>>>()?;
        let lc = LoadConfig {
            admin: Some(admin.into()),
            warmup: Duration::from_secs(1),
            name: run_name,
            cost_model,
            ..LoadConfig::new(bound.nbd, jobs, total)
        };
        let res = rein_runtime::load::run_checked(lc, move |t, rows| {
            if !quiet {
                crate::load::print_live(t, rows)
            }
        })
        .await;
        halver.await??;
        let _ = stop_tx.send(());
        server.await??;
        Ok::<_, anyhow::Error>(res?)
    })?;
    let totals = &outcome.totals;
    // Windows: skip a second after the start and after the capacity step.
    let h = half.as_secs_f64();
    let t = total.as_secs_f64();
    let windows_def =
        [("capacity 2,400 IOPS", 1.0, h.floor(), 2400.0), ("capacity 1,200 IOPS", h.ceil() + 1.0, t.floor(), 1200.0)];
    let mut windows = Vec::new();
    let (mut resv_ok, mut limit_ok) = (true, true);
    for (label, a, b, cap) in windows_def {
        let iops: Vec<f64> = (0..specs.len()).map(|i| totals.timeseries.iops(i, a, b)).collect();
        let oracle = allocate(&specs.iter().map(|(_, s)| OracleTenant::from(s)).collect::<Vec<_>>(), cap).rates;
        let mut rows = Vec::new();
        for (i, (name, spec)) in specs.iter().enumerate() {
            if spec.reservation() > 0.0 && iops[i] < spec.reservation().min(oracle[i]) * 0.95 {
                resv_ok = false;
            }
            if spec.limit().is_some_and(|l| iops[i] > l * 1.02) {
                limit_ok = false;
            }
            rows.push(WindowRow {
                name: name.clone(),
                reservation: spec.reservation(),
                limit: spec.limit(),
                weight: spec.weight(),
                iops: iops[i],
                oracle: oracle[i],
            });
        }
        windows.push(Window { label: label.into(), from_s: a, to_s: b, capacity_iops: cap, tenants: rows });
    }
    let drawn = crate::sim::write_run(&args.out, &format!("rein demo, live {name}"), t - 1.0, totals, None)?;
    // Failed requests (a full disk under the data directory, say) fail the demo after its report.
    let failed = crate::load::failed(&outcome.failures);
    let out = DemoResult { scheduler: name.clone(), windows, reservations_held: resv_ok, limits_held: limit_ok };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return failed;
    }
    outln!("\nThe mClock paper's §2.1 tenants on a live rein serve ({} scheduler), 75% reads of 4 KiB, 16 / 32 / 64 outstanding:", name);
    for w in &out.windows {
        outln!("{} ({:.0}-{:.0} s):", w.label, w.from_s, w.to_s);
        outln!("  {:<6} {:>6} {:>6} {:>3} {:>9} {:>9} {:>8}", "tenant", "r", "l", "w", "IOPS", "oracle", "diff");
        for r in &w.tenants {
            outln!(
                "  {:<6} {:>6} {:>6} {:>3} {:>9.1} {:>9.1} {:>+7.1}%",
                r.name,
                r.reservation,
                r.limit.map_or("-".into(), |l| format!("{l}")),
                r.weight,
                r.iops,
                r.oracle,
                100.0 * (r.iops - r.oracle) / r.oracle.max(1e-9)
            );
        }
    }
    outln!(
        "\nwith {}: reservations held (within 5%): {}; limit held (within 2%): {}",
        name,
        if resv_ok { "yes" } else { "NO" },
        if limit_ok { "yes" } else { "NO" }
    );
    let dir = shown(&args.out);
    outln!("{}data: {dir}/summary.json, {dir}/timeseries.csv", plots_line(&drawn, &dir));
    failed
}

/// The live run's flags, checked before anything is made: `--scheduler` one the demo can run, `--seconds`
/// in range (each error naming the value given).
fn check_live_flags(args: &DemoArgs) -> Result<()> {
    // Held to the rule of `--simulated` and `rein sim --scheduler` (docs/scenarios.md): without pShift's
    // controller the token scheduler is plain round robin labelled token, and the live run judged it
    // (`with token: reservations held (within 5%): yes`).
    if matches!(args.scheduler.kind(), SchedulerKind::Token) {
        bail!(
            "scheduler \"token\" is pShift's, whose controller hands out the tokens: the demo has none (it would be \
             plain round robin); use mclock, dmclock, rbfq, sfq or fifo (from --scheduler token)"
        );
    }
    if !(args.seconds >= 6.0 && args.seconds <= 3600.0) {
        bail!("--seconds {} is out of range: the live demo runs 6 to 3600 s", args.seconds);
    }
    Ok(())
}

/// `plots: DIR/iops.png, DIR/latency.png (and .svg); `: the plots drawn (none without a font), for the
/// closing line that names the outputs.
fn plots_line(drawn: &[&str], dir: &str) -> String {
    if drawn.is_empty() {
        return String::new();
    }
    let pngs: Vec<String> = drawn.iter().map(|p| format!("{dir}/{p}.png")).collect();
    format!("plots: {} (and .svg); ", pngs.join(", "))
}

/// `rd (r 250, w 1)`: a tenant's name and spec for the plan line.
fn describe(name: &str, spec: &rein_core::QosSpec) -> String {
    let mut parts = Vec::new();
    if spec.reservation() > 0.0 {
        parts.push(format!("r {}", spec.reservation()));
    }
    if let Some(l) = spec.limit() {
        parts.push(format!("l {l}"));
    }
    parts.push(format!("w {}", spec.weight()));
    format!("{name} ({})", parts.join(", "))
}

/// The output directory as an absolute path when it can be made one: scripts/demo.sh runs from the
/// repository root, which need not be the operator's working directory.
fn shown(dir: &std::path::Path) -> String {
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()).display().to_string()
}

/// The live run's export images: created by the server in the data directory, removed when the demo
/// ends, also on an error. Files and a directory that were there before the demo started are left alone.
struct Scratch {
    files: Vec<PathBuf>,
    dir: Option<PathBuf>,
}

impl Scratch {
    /// Removes at the end those of `files` that do not exist now, and `dir` if it does not exist now and
    /// is then empty.
    fn new(dir: &std::path::Path, files: impl Iterator<Item = PathBuf>) -> Scratch {
        Scratch { files: files.filter(|f| !f.exists()).collect(), dir: (!dir.exists()).then(|| dir.to_path_buf()) }
    }
}

impl Scratch {
    /// Removes nothing after all.
    fn disarm(&mut self) {
        self.files.clear();
        self.dir = None;
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        if let Some(d) = &self.dir {
            // Only if empty: anything else put there stays.
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn run_simulated(args: DemoArgs) -> Result<()> {
    let mut sc = Scenario::from_toml(DEMO_TOML, None)?;
    sc = sc
        .with_scheduler_named(&args.scheduler)
        .map_err(|e| anyhow::anyhow!("{e} (from --scheduler {})", args.scheduler.name()))?;
    // An unwritable --out fails now, not after the run (and after the scheduler: a refused one makes nothing).
    crate::sim::check_out(&args.out)?;
    let (r, results) = sim::run_with_progress(&sc, args.json, true)?;
    let results = results.expect("asked to check");
    let drawn = sim::write_outputs(&args.out, &sc, &r, Some(&results))?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&r.summary)?);
        return Ok(());
    }
    outln!("{}\n", sc.description().trim());
    for (label, a, b) in [("capacity 2,400 IOPS (5-60 s)", 5.0, 60.0), ("capacity 1,200 IOPS (65-120 s)", 65.0, 120.0)]
    {
        let oracle = r.oracle_iops(a, b);
        outln!("{label}:");
        outln!("  {:<6} {:>10} {:>10} {:>8}", "tenant", "IOPS", "oracle", "diff");
        for (i, t) in sc.tenants().iter().enumerate() {
            let got = r.timeseries.iops(i, a, b);
            outln!(
                "  {:<6} {:>10.1} {:>10.1} {:>+7.1}%",
                t.name,
                got,
                oracle[i],
                100.0 * (got - oracle[i]) / oracle[i].max(1e-9)
            );
        }
    }
    outln!();
    let misses = sim::print_checks(&results, false);
    let held = |word: &str| {
        results
            .iter()
            .zip(sc.expect())
            .filter(|(_, e)| e.note.as_deref().is_some_and(|n| n.contains(word)))
            .all(|(c, _)| c.ok)
    };
    let (resv_ok, limit_ok) = (held("reservation"), held("limit"));
    outln!(
        "\nwith {} (simulated): reservations held: {}; limit held: {}",
        args.scheduler.name(),
        if resv_ok { "yes" } else { "NO" },
        if limit_ok { "yes" } else { "NO" }
    );
    let dir = shown(&args.out);
    outln!("{}data: {dir}/summary.json, {dir}/timeseries.csv, {dir}/check.json", plots_line(&drawn, &dir));
    if misses > 0 && args.scheduler.kind() == SchedulerKind::Mclock {
        bail!("{misses} expectations missed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// `rein demo --scheduler NAME` is parsed once, by clap, for the live run and `--simulated` alike:
    /// before, the live run parsed it by the core's names and `--simulated` by the simulator's (lfq and
    /// dtfq only there), each after the output folder was checked. A name that is none is the command
    /// line's error, naming the known ones; the default is mClock; lfq keeps its name (the reports').
    #[test]
    fn the_scheduler_is_parsed_once_for_both_runs() {
        let parse = |more: &[&str]| crate::Cli::try_parse_from([&["rein", "demo"], more].concat());
        let e = parse(&["--scheduler", "wfq"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        let e = e.to_string();
        assert!(e.contains("unknown scheduler \"wfq\" (expected one of mclock, dmclock, rbfq, sfq, token"), "{e}");
        let args = |more: &[&str]| match parse(more).unwrap().cmd {
            crate::Cmd::Demo(a) => a,
            _ => panic!("not rein demo"),
        };
        assert_eq!(args(&[]).scheduler.kind(), rein_core::SchedulerKind::Mclock);
        for more in [&["--scheduler", "lfq"][..], &["--scheduler", "lfq", "--simulated"]] {
            let s = args(more).scheduler;
            assert_eq!((s.name(), s.kind()), ("lfq", rein_core::SchedulerKind::Sfq), "{more:?}");
        }
    }

    /// `--seconds` is the live run's: given with `--simulated` it is a usage error (it was ignored without
    /// a word, the simulated run lasting its scenario's time); its default does not count as given.
    #[test]
    fn seconds_with_simulated_is_refused() {
        let parse = |more: &[&str]| crate::Cli::try_parse_from([&["rein", "demo"], more].concat());
        let e = parse(&["--simulated", "--seconds", "2"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{e}");
        assert!(e.to_string().contains("the argument '--simulated' cannot be used with '--seconds <SECONDS>'"), "{e}");
        assert!(parse(&["--simulated"]).is_ok());
        assert!(parse(&["--seconds", "8"]).is_ok());
    }
}
