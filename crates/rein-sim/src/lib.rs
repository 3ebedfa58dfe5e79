//! # rein-sim: a deterministic discrete-event simulator for Rein's schedulers
//!
//! Drives the schedulers of `rein-core` unchanged (no copies of their logic) against rein-model's
//! devices, workloads and gateways, from TOML scenario files. A run is a pure function of its scenario
//! and seed: same input, same bytes out (no wall clock, no threads, no hash-map iteration).
//!
//! The crate is cut by layer, every import pointing down (a test in `crates/rein/tests/layers.rs`
//! checks it):
//!
//! 1. [`file`](mod@file): the TOML structs, as written;
//! 2. [`model`]: the scenario validated once into typed values ([`Scenario`]);
//! 3. [`engine`]: the run: events, the one server model, PARDA hosts and pShift clusters as layers;
//! 4. [`report`]: the run's recording as rein-model's [`RunTotals`];
//! 5. [`check`]: a pure function of the scenario, the totals and an optional baseline run.
//!
//! Each feature keeps one file per layer: `file/parda.rs`, `model/parda.rs`, `engine/parda.rs`,
//! `report/parda.rs`, `check/parda.rs` (and likewise `pshift`). [`bench`](mod@bench) builds the benchmark scenario;
//! [`harness`] holds the file decoders' contracts that the fuzz targets and the corpus test check.

#![forbid(unsafe_code)]

pub mod bench;
pub mod check;
pub mod engine;
pub mod file;
pub mod harness;
pub mod model;
pub mod report;

pub use engine::SimError;
pub use model::{Scenario, ScenarioError};
pub use rein_model::{RunTotals, Summary, Timeseries};

/// Runs `sc` to the end and returns what it measured; `progress` is called now and then with the
/// simulated time reached.
pub fn run(sc: &Scenario, progress: &mut dyn FnMut(rein_core::Nanos)) -> Result<RunTotals, SimError> {
    Ok(report::build(sc, engine::run(sc, progress)?))
}

/// Runs `sc` and checks its expectations, running the baseline the checks ask for (the no-PARDA twin
/// for `uncontrolled` targets) too. With PARDA already off the twin is `sc` itself: its run is the
/// baseline, not run again.
pub fn run_and_check(
    sc: &Scenario,
    progress: &mut dyn FnMut(rein_core::Nanos),
) -> Result<(RunTotals, Vec<check::CheckResult>), SimError> {
    let totals = run(sc, progress)?;
    let twin;
    let baseline = match check::baseline_scenario(sc) {
        None => None,
        // PARDA already off: the twin is `sc` itself, and `totals` its run.
        Some(_) if !sc.parda.as_ref().is_some_and(|p| p.enabled) => Some(&totals),
        Some(b) => {
            twin = run(&b, &mut |_| {})?;
            Some(&twin)
        }
    };
    let results = check::check(sc, &totals, baseline);
    Ok((totals, results))
}
