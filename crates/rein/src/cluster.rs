//! `rein cluster up` and `rein cluster run`: a scenario on real daemons (rein-cluster does the work; this
//! parses arguments and prints).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rein_cluster::{Plan, RunDir, Supervisor};
use rein_sim::Scenario;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::signal::unix::Signal;

/// How long each stage of children (nodes, then gateways) may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCmd {
    /// Start the scenario's servers as `rein serve` nodes (and a `rein gateway` per tenant over several
    /// servers), print `tenant NAME nbd://ADDR:PORT/EXPORT` per tenant and `ready`, serve until SIGINT or
    /// SIGTERM, then stop them all.
    Up(UpArgs),
    /// Start the cluster, drive the scenario's workloads through it for its duration, report as `rein sim`
    /// does, stop it all.
    Run(RunArgs),
}

#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Scenario file (TOML; see docs/scenarios.md and docs/cluster.md).
    pub(crate) scenario: PathBuf,
    /// NBD port of every process (each on its own loopback address; admin on the next port); 0: free
    /// ports chosen at start.
    #[arg(long, default_value_t = 10809)]
    pub(crate) base_port: u16,
    /// Address of the first process (the first server's node); the others follow it (127.0.0.10,
    /// 127.0.0.11, ...). A loopback address (127.0.0.0/8), with room for every process up to its .254.
    #[arg(long, value_name = "ADDR", default_value_t = rein_cluster::plan::DEFAULT_FIRST_ADDRESS)]
    pub(crate) first_address: std::net::Ipv4Addr,
    /// Keep configs, logs and node data here (default: a temporary directory, removed at the end).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) up: UpArgs,
    /// Run at most N of the scenario's independent groups at a time (tenants and the servers they share;
    /// docs/cluster.md), one cluster after another, and join their totals in the scenario's order: for
    /// sweeps whose points together ask more of this machine than it has. Default: all at once.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) groups_at_once: Option<u32>,
    #[command(flatten)]
    pub(crate) report: crate::sim::ReportArgs,
}

pub(crate) fn run(cmd: ClusterCmd) -> Result<()> {
    // The daemons get the descriptors their configuration and the supervisor give them, none of what
    // this process inherited (a service manager's sockets, a shell's open files).
    let marked = rein_runtime::activation::close_inherited_on_exec();
    if marked > 0 {
        tracing::debug!(descriptors = marked, "inherited descriptors kept from the daemons (close-on-exec)");
    }
    match cmd {
        ClusterCmd::Up(a) => up(a),
        ClusterCmd::Run(a) => run_scenario(a),
    }
}

/// `--dir`, created and locked against another `rein cluster` (before anything is written into it), for
/// the whole command.
fn lock_dir(a: &UpArgs) -> Result<Option<RunDir>> {
    Ok(a.dir.as_deref().map(RunDir::lock).transpose()?)
}

/// Plans `sc` and starts its processes (their files in `sub` of `dir`, if both are given); a signal
/// meanwhile stops what started (`interruptible`). `Err(signal)` inside: stopped by that signal, during
/// the start or right after it.
fn start_with(
    rt: &tokio::runtime::Runtime,
    signals: (&mut Signal, &mut Signal),
    a: &UpArgs,
    sc: &Scenario,
    (dir, sub): (Option<&RunDir>, Option<&str>),
) -> Result<Result<(Plan, Supervisor), &'static str>> {
    let exe = std::env::current_exe().context("finding the rein executable")?;
    for d in rein_cluster::supervisor::sweep_stale_runs() {
        errln!("removed the run directory {} of a rein cluster that was killed", d.display());
    }
    // Node data lives in the run's directory: plan against it once it exists.
    let dir = match (dir, sub) {
        (Some(d), Some(s)) => Some(d.sub(s)?),
        (d, _) => d.cloned(),
    };
    // Free ports (`--base-port 0`) are held while the plan is made, each one distinct, and released
    // before the start checks them and the children bind them.
    let mut ports = rein_cluster::supervisor::Ports::new(a.base_port);
    let plan = Plan::at(sc, a.first_address, |h, k| ports.port(h, k))?;
    drop(ports);
    let (started, signalled) =
        interruptible(rt, signals, |stop| Supervisor::start(&plan, &exe, dir.as_ref(), READY_TIMEOUT, stop));
    match (started, signalled) {
        (Err(rein_cluster::supervisor::ClusterError::Interrupted), Some(signal)) => Ok(Err(signal)),
        (Err(e), _) => Err(e.into()),
        // A signal right after the start: stop now, as after `ready`.
        (Ok(sup), Some(signal)) => finish(Arc::new(Mutex::new(sup)), Ok(Err(signal))),
        (Ok(sup), None) => Ok(Ok((plan, sup))),
    }
}

/// Runs `start` (which waits for the processes it starts to be ready) on a thread of its own while this
/// one waits for SIGTERM or SIGINT: a signal sets the flag `start` watches, and it stops what it had
/// started. Returns its result, and the signal that came, if one did (also one just after it ended).
fn interruptible<T: Send>(
    rt: &tokio::runtime::Runtime,
    (term, int): (&mut Signal, &mut Signal),
    start: impl FnOnce(&AtomicBool) -> T + Send,
) -> (T, Option<&'static str>) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let worker = s.spawn(|| start(&stop));
        let signalled = rt.block_on(async {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            loop {
                tokio::select! {
                    _ = term.recv() => return Some("SIGTERM"),
                    _ = int.recv() => return Some("SIGINT"),
                    _ = tick.tick() => if worker.is_finished() { return None },
                }
            }
        });
        stop.store(signalled.is_some(), Ordering::Relaxed);
        (worker.join().expect("the start does not panic"), signalled)
    })
}

/// Waits for SIGINT or SIGTERM, or a child's exit (an error naming it).
async fn serve_until_signal(sup: &Mutex<Supervisor>, signals: (Signal, Signal)) -> Result<()> {
    let (mut term, mut int) = signals;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut watchdog = rein_runtime::notify::Watchdog::from_env();
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
            () = watchdog.tick() => watchdog.ping(),
            _ = tick.tick() => {
                if let Some(d) = sup.lock().expect("supervisor lock").poll() {
                    return Err(d.into());
                }
            }
        }
    }
}

/// Stops the cluster; `res` is the outcome so far, which a stop error does not hide.
fn finish<T>(sup: Arc<Mutex<Supervisor>>, res: Result<T>) -> Result<T> {
    let sup = Arc::try_unwrap(sup)
        .map_err(|_| anyhow::anyhow!("the supervisor is still shared"))
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()));
    let stopped = sup.and_then(|s| s.stop().map_err(anyhow::Error::from));
    match (res, stopped) {
        (Ok(v), Ok(killed)) => {
            if !killed.is_empty() {
                errln!(
                    "warning: killed after {} s: {}",
                    rein_cluster::supervisor::STOP_TIMEOUT.as_secs(),
                    killed.join(", ")
                );
            }
            Ok(v)
        }
        (Ok(_), Err(e)) => Err(e),
        (Err(e), _) => Err(e),
    }
}

/// `rein cluster up`.
fn up(a: UpArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut term, mut int) = crate::signals::signals(&rt)?;
    // The scenario first, as `run` reads it: one that cannot be read leaves no `--dir` behind (it was
    // created and locked, its lock file left in it, before the scenario was read).
    let sc = Scenario::load(&a.scenario)?;
    let dir = lock_dir(&a)?;
    let (plan, sup) = match start_with(&rt, (&mut term, &mut int), &a, &sc, (dir.as_ref(), None))? {
        Ok(started) => started,
        Err(signal) => {
            errln!("stopped by {signal} during the start: the processes started were stopped");
            return Ok(());
        }
    };
    let sup = Arc::new(Mutex::new(sup));
    if let Some(c) = &plan.controller {
        // Nobody drives this cluster's load: its pShift schedule starts now.
        let admin = rein_runtime::admin_client::AdminEndpoint::from(c.admin);
        let started = rt.block_on(rein_runtime::admin_client::put_json(
            &admin,
            None,
            "/api/pshift/start",
            &serde_json::json!({}),
        ));
        if let Err(e) = started {
            return finish(sup, Err(anyhow::anyhow!("starting the pShift controller's schedule: {e}")));
        }
    }
    for e in &plan.endpoints {
        // A pShift bucket opens its export on each of its servers directly: one address per server.
        let uris: Vec<String> = if e.direct.is_empty() {
            vec![e.uri()]
        } else {
            e.direct.iter().map(|a| format!("nbd://{a}/{}", e.export)).collect()
        };
        outln!("tenant {} {}", e.tenant, uris.join(" "));
    }
    outln!("ready");
    // Under a unit of its own (rein-runtime's notify module), the cluster is the unit's service; its
    // daemons do not speak for it.
    rein_runtime::notify::ready(&format!("cluster up: {} tenants", plan.endpoints.len()));
    let res = rt.block_on(serve_until_signal(&sup, (term, int)));
    rein_runtime::notify::stopping();
    finish(sup, res)
}

/// `rein cluster run`.
fn run_scenario(a: RunArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (mut term, mut int) = crate::signals::signals(&rt)?;
    let sc = Scenario::load(&a.up.scenario)?;
    if a.report.check {
        crate::sim::require_expectations(&sc)?;
    }
    if let Some(out) = &a.report.out {
        crate::sim::check_out(out)?;
    }
    let dir = lock_dir(&a.up)?;
    let dir = dir.as_ref();
    // Requests that failed in any of the runs (a part, the baseline): said after the report, which stands.
    let mut failures = rein_runtime::load::Failures::default();
    let totals = match a.groups_at_once {
        None => {
            if !(a.report.quiet || a.report.json) {
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                if let Some(hint) = crowding_hint(&sc, cpus) {
                    errln!("{hint}");
                }
            }
            run_on_cluster(&rt, &a, &sc, (dir, None), (&mut term, &mut int), &mut failures)?
        }
        Some(n) => {
            let groups = sc.groups().len();
            if !(a.report.quiet || a.report.json) {
                errln!(
                    "{}: {groups} independent group(s), run {n} at a time ({} cluster(s) one after another)",
                    sc.name(),
                    groups.div_ceil(n as usize)
                );
            }
            rein_sim::run_in_parts(&sc, n as usize, |part, k, parts| {
                let label = format!("part-{}-of-{parts}", k + 1);
                run_on_cluster(&rt, &a, part, (dir, Some(&label)), (&mut term, &mut int), &mut failures)
            })?
        }
    };
    // Expectations against the uncontrolled run (PARDA off) get it as the simulator's do: the same
    // scenario without PARDA, run on a cluster of its own after this one.
    let baseline = match a.report.check.then(|| rein_sim::check::baseline_scenario(&sc)).flatten() {
        Some(b) => {
            if !(a.report.quiet || a.report.json) {
                errln!("running the baseline the checks ask for ({}: PARDA off)", b.name());
            }
            Some(run_on_cluster(&rt, &a, &b, (dir, Some("baseline")), (&mut term, &mut int), &mut failures)?)
        }
        None => None,
    };
    let results = a.report.check.then(|| rein_sim::check::check(&sc, &totals, baseline.as_ref()));
    let reported = crate::sim::report(&a.report, &sc, &totals, results, crate::load::print_summary);
    // Failed requests make the run's numbers suspect whatever the checks said: the exit status says so
    // (as `rein load`'s), after the report and the checks; a missed check is said first.
    match (reported, crate::load::failed(&failures)) {
        (Err(e), Err(f)) => Err(anyhow::anyhow!("{e}; {f}")),
        (r, f) => r.and(f),
    }
}

/// A note for a scenario of several independent groups whose servers outnumber this machine's CPUs by
/// more than four to one: run whole, its groups compete for the CPUs, which the simulated servers do not
/// (parda-fig5-workloads: 36 arrays on 2 CPUs read 0.006-0.72 of the simulator whole, 32 of 36 within
/// 3.4 % one group at a time).
fn crowding_hint(sc: &Scenario, cpus: usize) -> Option<String> {
    let groups = sc.groups().len();
    (groups > 1 && sc.servers().len() > 4 * cpus).then(|| {
        format!(
            "note: {} has {groups} independent groups on {} servers and this machine {cpus} CPU(s); run \
             whole, the groups compete for the CPUs. `--groups-at-once N` runs N groups at a time and joins \
             them (docs/cluster.md)",
            sc.name(),
            sc.servers().len()
        )
    })
}

/// Starts `sc` on a cluster (its files in `sub` of `dir`, if both are given), drives it for its duration
/// with a progress bar, stops the cluster. The load's failed requests are added to `failures`.
fn run_on_cluster(
    rt: &tokio::runtime::Runtime,
    a: &RunArgs,
    sc: &Scenario,
    (dir, sub): (Option<&RunDir>, Option<&str>),
    (term, int): (&mut Signal, &mut Signal),
    failures: &mut rein_runtime::load::Failures,
) -> Result<rein_model::RunTotals> {
    let (plan, sup) = match start_with(rt, (&mut *term, &mut *int), &a.up, sc, (dir, sub))? {
        Ok(started) => started,
        Err(signal) => anyhow::bail!("interrupted by {signal} during the start: the processes started were stopped"),
    };
    let sup = Arc::new(Mutex::new(sup));
    let quiet = a.report.quiet || a.report.json;
    let bar = if quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(sc.duration().0);
        b.set_style(
            ProgressStyle::with_template("{prefix} [{bar:40}] {msg}, ETA {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_prefix(match sub {
            Some(s) => format!("{} ({s})", sc.name()),
            None => sc.name().to_string(),
        });
        b
    };
    let total = sc.duration().as_secs_f64();
    let b = bar.clone();
    let (sc_run, plan_run, sup_run) = (sc.clone(), plan.clone(), sup.clone());
    // The load runs as a task on the runtime's workers, not on this thread (`block_on`'s): the connections'
    // reader tasks then wake it on a worker, without waking this thread once per request.
    let mut drive = rt.spawn(async move {
        rein_cluster::drive(&sc_run, &plan_run, sup_run, move |t, _| {
            b.set_position(t.as_nanos().min(u64::MAX as u128) as u64);
            b.set_message(format!("{:.0}/{total:.0} s", t.as_secs_f64()));
        })
        .await
    });
    // A signal ends the run early: everything is stopped, and the run fails (its totals are incomplete).
    let res = rt.block_on(async {
        tokio::select! {
            r = &mut drive => match r {
                Ok(r) => r.map_err(anyhow::Error::from),
                Err(e) => Err(anyhow::anyhow!("the load's task failed: {e}")),
            },
            _ = term.recv() => Err(anyhow::anyhow!("interrupted by SIGTERM: the cluster was stopped")),
            _ = int.recv() => Err(anyhow::anyhow!("interrupted by SIGINT: the cluster was stopped")),
        }
    });
    // The load's task holds the supervisor too: stopped and gone before the stop (else the supervisor was
    // still shared, and its drop killed every child with SIGKILL instead of stopping them).
    if !drive.is_finished() {
        drive.abort();
        let _ = rt.block_on(drive);
    }
    bar.finish_and_clear();
    let outcome = finish(sup, res)?;
    failures.merge(outcome.failures);
    Ok(outcome.totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The note appears for a sweep of many independent servers on few CPUs, and not for one group, nor
    /// where the CPUs suffice.
    #[test]
    fn crowding_hint_names_the_groups_and_the_flag() {
        let sweep = Scenario::load(&std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scenarios/parda-fig5-workloads.toml"
        )))
        .unwrap();
        let hint = crowding_hint(&sweep, 2).expect("36 arrays on 2 CPUs");
        assert!(hint.contains("36 independent groups on 36 servers"), "{hint}");
        assert!(hint.contains("--groups-at-once"), "{hint}");
        assert_eq!(crowding_hint(&sweep, 9), None, "36 servers on 9 CPUs: four to one");
        let one = Scenario::load(&std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scenarios/dmclock-fig10.toml"
        )))
        .unwrap();
        assert_eq!(crowding_hint(&one, 1), None, "one group");
    }
}
