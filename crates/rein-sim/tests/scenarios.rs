//! Runs every scenario in `scenarios/` and requires each of its expectations to hold (what
//! `rein sim --check` does), checks that a deliberately wrong scheduler makes some of them fail, and
//! checks that runs are deterministic.
use rein_model::{DeviceSpec, Discipline, ServiceModel};
use rein_sim::check::Sabotage;
use rein_sim::file::ScenarioFile;
use rein_sim::{run, run_and_check, Scenario};
use std::path::{Path, PathBuf};

fn scenario_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("scenarios/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_scenario_meets_its_expectations() {
    let files = scenario_files();
    assert!(!files.is_empty());
    let mut misses = Vec::new();
    for f in &files {
        let sc = Scenario::load(f).unwrap_or_else(|e| panic!("{e}"));
        assert!(!sc.expect().is_empty(), "{}: a scenario without expectations checks nothing", f.display());
        let t0 = std::time::Instant::now();
        let (r, results) = run_and_check(&sc, &mut |_| {}).unwrap();
        eprintln!("{} ({} completions, {:.2?})", sc.name(), r.completions(), t0.elapsed());
        for c in results {
            eprintln!("  {} {}", if c.ok { "ok  " } else { "MISS" }, c.description);
            if !c.ok {
                misses.push(format!("{}: {}", sc.name(), c.description));
            }
        }
    }
    assert!(misses.is_empty(), "missed expectations:\n{}", misses.join("\n"));
}

/// The four pShift runs of paper scale (64 servers, 10,000 buckets): 20-33 s each in the test profile,
/// three quarters of a pass over every scenario. Their checks are over thousands of buckets, so a seed
/// moves them least; `pshift-exp1-small` (the same experiment at a smaller scale) stays in the pass,
/// and `bash scripts/seeds.sh` runs these too (seeds 2-7 all met, 2026-12-01). They still run with
/// their file's seed and under a wrong scheduler below.
const SLOW_FOR_THE_SEED_PASS: [&str; 4] =
    ["pshift-exp1", "pshift-exp2-na2-nd0", "pshift-exp2-na2-nd1", "pshift-exp2-na2-nd1-early"];

/// The checks must hold for other seeds too, not only for the seed in the file: each scenario runs once
/// more with a seed from 2 to 20, a different one per scenario (its position in the sorted list), so
/// every CI run covers a spread of seeds; except [`SLOW_FOR_THE_SEED_PASS`]. `bash scripts/seeds.sh`
/// runs every scenario with seeds 1-20.
#[test]
fn a_sample_of_other_seeds_meets_the_expectations() {
    let mut misses = Vec::new();
    let mut left_out = Vec::new();
    for (i, f) in scenario_files().iter().enumerate() {
        let sc = Scenario::load(f).unwrap_or_else(|e| panic!("{e}"));
        if SLOW_FOR_THE_SEED_PASS.contains(&sc.name()) {
            left_out.push(sc.name().to_string());
            continue;
        }
        let sc = sc.with_seed(2 + (i as u64 % 19)).unwrap();
        let (_, results) = run_and_check(&sc, &mut |_| {}).unwrap();
        for c in results.into_iter().filter(|c| !c.ok) {
            misses.push(format!("{} seed {}: {}", sc.name(), sc.seed(), c.description));
        }
    }
    assert!(misses.is_empty(), "missed expectations:\n{}", misses.join("\n"));
    assert_eq!(
        left_out.len(),
        SLOW_FOR_THE_SEED_PASS.len(),
        "a scenario left out of the seed pass is gone: {left_out:?}"
    );
}

#[test]
fn same_scenario_and_seed_give_identical_output() {
    for f in scenario_files().iter().take(3) {
        let sc = Scenario::load(f).unwrap();
        let a = run(&sc, &mut |_| {}).unwrap();
        let b = run(&sc, &mut |_| {}).unwrap();
        assert_eq!(serde_json::to_string(&a.summary).unwrap(), serde_json::to_string(&b.summary).unwrap());
        assert_eq!(a.timeseries.to_csv(), b.timeseries.to_csv());
        assert_eq!(a.events, b.events);
        // A different seed changes the run (the seed is really used).
        let sc2 = sc.with_seed(sc.seed() + 1).unwrap();
        let c = run(&sc2, &mut |_| {}).unwrap();
        assert_ne!(a.timeseries.to_csv(), c.timeseries.to_csv(), "{}: seed has no effect", sc.name());
    }
}

/// Scenarios whose checks describe a baseline without QoS controls, so that no wrong scheduler can break
/// them: pShift's plain round robin runs have no controller to remove (and their token schedulers are
/// not swapped for FIFO); the PARDA tables without PARDA are calibration records (their numbers are the
/// capacity fit's targets, marked as inputs) with one VM per host, so FIFO in place of the hosts' local
/// SFQ changes nothing they check. The two `-pool-rho` dmClock files check that the paper's rho rule
/// *misses* the reservations with one pool per client (the side-by-side of issue "Scheduler fidelity");
/// a wrong scheduler misses them too, so no sabotage can make those checks fail. PARDA §5.2's runs
/// without flow control (`parda-fig7-static-windows`, `parda-table2-queue-lengths`) and the position
/// paper's queue-limit steps (`flowcontrol-fig3cd-queue-limit`) reproduce what fixed host queues do, with
/// PARDA off and one VM per host: nothing to sabotage. So are the two array runs, PARDA §5.2's Fig. 6
/// (`parda-fig6-hosts`) and the position paper's Fig. 3(a)(b) (`flowcontrol-fig3ab-hosts`): what they
/// check is the array model's throughput and latency as hosts join, and
/// [`array_checks_fail_without_the_array`] shows those checks fail with the array taken away. So is
/// PARDA §5.1's workload sweep (`parda-fig5-workloads`: one VM per array, FIFO, no QoS), whose check
/// [`the_workload_sweep_fails_without_the_disks_positions`] shows failing with the disks' positions taken
/// away.
const BASELINES: [&str; 13] = [
    "flowcontrol-fig3ab-hosts",
    "flowcontrol-fig3cd-queue-limit",
    "parda-fig6-hosts",
    "parda-fig5-workloads",
    "parda-fig7-static-windows",
    "parda-table2-queue-lengths",
    "dmclock-fig10-pool-rho",
    "dmclock-fig9-resv-pool-rho",
    "parda-table3-uncontrolled",
    "parda-table4-uncontrolled",
    "pshift-exp3-rr",
    "pshift-exp4-200-rr",
    "pshift-exp4-rr",
];

/// Every scenario's checks, run with a deliberately wrong scheduler ([`Sabotage`]), must fail: a check
/// that holds whatever the scheduler does checks nothing. For each scenario the sabotages that apply are
/// tried in [`Sabotage::ALL`]'s order until one makes a check fail (one extra run per scenario in the
/// usual case, so the test costs about as much as `every_scenario_meets_its_expectations`); the
/// `no-controller` builds a scenario validation accepts: the checks of the controller's tally
/// (`count = "servers"`, which validation refuses without a controller) are dropped, so every check it
/// keeps measures a number, and the load's own checks still catch the round robin. Before, those checks
/// stayed and missed on "no closed period to judge" (NaN), a miss that says nothing of the scheduler.
#[test]
fn without_the_controller_no_check_reads_a_tally_that_is_not_there() {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/pshift-exp3-limits-small.toml");
    let sc = Scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
    let text = std::fs::read_to_string(&f).unwrap();
    let tally = text.matches("count = \"servers\"").count();
    assert!(tally > 0, "the file has checks of the controller's tally");
    let wrong = Sabotage::NoController.apply(&sc).unwrap();
    assert_eq!(wrong.expect().len(), sc.expect().len() - tally);
    let (_, results) = run_and_check(&wrong, &mut |_| {}).unwrap();
    assert_eq!(results.len(), wrong.expect().len());
    for c in &results {
        assert!(!c.measured.is_nan(), "{}", c.description);
    }
    assert!(results.iter().any(|c| !c.ok), "round robin misses the load's own checks");
}

/// scenarios in [`BASELINES`] are the ones no sabotage applies to.
#[test]
fn checks_fail_under_a_wrong_scheduler() {
    let mut uncaught = Vec::new();
    for f in &scenario_files() {
        let sc = Scenario::load(f).unwrap_or_else(|e| panic!("{e}"));
        let t0 = std::time::Instant::now();
        let mut applied = Vec::new();
        let mut caught = None;
        for sabotage in Sabotage::ALL {
            let Some(wrong) = sabotage.apply(&sc) else { continue };
            applied.push(sabotage.name());
            let (_, results) = run_and_check(&wrong, &mut |_| {}).unwrap();
            let failed: Vec<String> = results.into_iter().filter(|c| !c.ok).map(|c| c.description).collect();
            if !failed.is_empty() {
                caught = Some((sabotage, failed));
                break;
            }
        }
        match (&caught, BASELINES.contains(&sc.name())) {
            (Some((sabotage, failed)), baseline) => {
                eprintln!(
                    "{} under {} ({:.2?}): {} checks fail",
                    sc.name(),
                    sabotage.name(),
                    t0.elapsed(),
                    failed.len()
                );
                for d in failed {
                    eprintln!("  FAIL {d}");
                }
                assert!(!baseline, "{}: listed in BASELINES but {} makes a check fail", sc.name(), sabotage.name());
            }
            (None, true) => eprintln!("{}: a baseline, no check fails under {applied:?}", sc.name()),
            (None, false) => uncaught.push(format!("{} (tried {applied:?})", sc.name())),
        }
    }
    assert!(uncaught.is_empty(), "checks that no wrong scheduler makes fail:\n{}", uncaught.join("\n"));
}

/// The array scenarios' checks come from the closed queueing network (throughput C nQ / (nQ + D - 1) as
/// hosts join): they must fail when the array is replaced by a device of the same capacity that serves
/// it from one request on (processor sharing, or FIFO), as Rein's other array models do.
#[test]
fn array_checks_fail_without_the_array() {
    for name in ["parda-fig6-hosts", "flowcontrol-fig3ab-hosts"] {
        let f = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../scenarios/{name}.toml"));
        let sc = Scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(sc.servers()[0].device.discipline, Discipline::Array(_)), "{name}: an array");
        for discipline in [Discipline::Ps, Discipline::Fifo] {
            // The file with the array's server on `discipline`, all else as written.
            let mut file = ScenarioFile::read(&f).unwrap();
            file.servers[0].discipline = Some(discipline.name().to_string());
            file.servers[0].array = None;
            let wrong = file.validate_at(&f).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(wrong.servers()[0].device, DeviceSpec { discipline, ..sc.servers()[0].device.clone() });
            let (_, results) = run_and_check(&wrong, &mut |_| {}).unwrap();
            let failed: Vec<&str> = results.iter().filter(|c| !c.ok).map(|c| c.description.as_str()).collect();
            assert!(
                failed.iter().any(|d| d.starts_with("server array: iops in [15, 60] s")),
                "{name} with a {discipline:?} device: the one-host checks must fail, failed: {failed:?}"
            );
        }
    }
}

/// PARDA Fig. 5's workload sweep (`parda-fig5-workloads`, one VM per array: nothing to sabotage) checks
/// where the minimum latency falls. That comes from the disks' positions: a sequential read continues
/// where the disk's head is, and pays no seek or rotation. Keep the arrays but take the positions away
/// (exponential service) and the sequential 4 KB reads become the slowest reads of all (the eight
/// in flight queue at the one or two disks that hold their stripe unit, where random ones spread over
/// ten: 29 ms at seed 1 against 8.4 for the next lowest), so the check
/// must fail. (A processor-sharing or FIFO device in place of each array is no test of it: it serves
/// every workload alike, about 5 ms, and which point comes lowest is then the draws'.)
#[test]
fn the_workload_sweep_fails_without_the_disks_positions() {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/parda-fig5-workloads.toml");
    let sc = Scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
    // The file with every server's service exponential, all else as written.
    let mut file = ScenarioFile::read(&f).unwrap();
    for srv in &mut file.servers {
        srv.service = "exponential".to_string();
        srv.disk = None;
    }
    let wrong = file.validate_at(&f).unwrap_or_else(|e| panic!("{e}"));
    for (srv, w) in sc.servers().iter().zip(wrong.servers()) {
        assert!(matches!(srv.device.service, ServiceModel::Disk(_)), "{}: the disk model", srv.name);
        assert_eq!(w.device, DeviceSpec { service: ServiceModel::Exponential, ..srv.device.clone() });
    }
    let (_, results) = run_and_check(&wrong, &mut |_| {}).unwrap();
    let failed: Vec<&str> = results.iter().filter(|c| !c.ok).map(|c| c.description.as_str()).collect();
    assert!(
        failed.iter().any(|d| d.starts_with("tenant vm-k4-read100-rand0: latency_mean_ms")),
        "without positions the minimum must move: {results:?}"
    );
}
