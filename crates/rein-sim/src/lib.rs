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

/// Runs `sc` a part at a time: its independent groups ([`model::group`]), at most `at_once` of them (at
/// least one) in each part, in order, each part run by `run` (given the part, its number from 0 and the
/// number of parts), and the parts' totals joined in `sc`'s order. A scenario of one group is run once,
/// whole (without its expectations, as every part).
pub fn run_in_parts<E>(
    sc: &Scenario,
    at_once: usize,
    mut run: impl FnMut(&Scenario, usize, usize) -> Result<RunTotals, E>,
) -> Result<RunTotals, E>
where
    E: From<rein_model::report::JoinError>,
{
    let groups = sc.groups();
    let chunks: Vec<Vec<&model::Group>> =
        groups.iter().collect::<Vec<_>>().chunks(at_once.max(1)).map(<[_]>::to_vec).collect();
    let mut parts = Vec::with_capacity(chunks.len());
    for (k, chunk) in chunks.iter().enumerate() {
        let totals = run(&sc.part(chunk), k, chunks.len())?;
        let mut tenants: Vec<usize> = chunk.iter().flat_map(|g| g.tenants.iter().copied()).collect();
        let mut servers: Vec<usize> = chunk.iter().flat_map(|g| g.servers.iter().copied()).collect();
        tenants.sort_unstable();
        servers.sort_unstable();
        parts.push(rein_model::report::Part { totals, tenants, servers });
    }
    // The groups partition the scenario (invariant 1 of model::group); a run that reports other lists or
    // intervals than its part's scenario asks for is an error, not a panic.
    Ok(RunTotals::join(sc.tenants.len(), sc.servers.len(), parts)?)
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
