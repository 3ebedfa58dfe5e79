//! Runs every scenario in `scenarios/` and requires each of its expectations to hold (what
//! `rein sim --check` does), and checks that runs are deterministic.
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
        assert!(!sc.expect.is_empty(), "{}: a scenario without expectations checks nothing", f.display());
        let t0 = std::time::Instant::now();
        let (r, results) = run_and_check(&sc, &mut |_| {}).unwrap();
        eprintln!("{} ({} completions, {:.2?})", sc.name, r.completions(), t0.elapsed());
        for c in results {
            eprintln!("  {} {}", if c.ok { "ok  " } else { "MISS" }, c.description);
            if !c.ok {
                misses.push(format!("{}: {}", sc.name, c.description));
            }
        }
    }
    assert!(misses.is_empty(), "missed expectations:\n{}", misses.join("\n"));
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
        let mut sc2 = sc.clone();
        sc2.seed += 1;
        let c = run(&sc2, &mut |_| {}).unwrap();
        assert_ne!(a.timeseries.to_csv(), c.timeseries.to_csv(), "{}: seed has no effect", sc.name);
    }
}
