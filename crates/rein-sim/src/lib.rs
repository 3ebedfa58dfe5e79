//! # rein-sim: a deterministic discrete-event simulator for Rein's schedulers
//!
//! Drives the schedulers of `rein-core` unchanged (no copies of their logic) against models of devices,
//! workloads, gateways and networks, from TOML scenario files. A run is a pure function of its scenario
//! and seed: same input, same bytes out (no wall clock, no threads, no hash-map iteration).
//!
//! - [`scenario`]: the TOML format and its validation;
//! - [`engine`]: the event engine ([`Sim`]);
//! - [`metrics`]: summary, timeseries, oracle comparison;
//! - [`check`]: expectations for `rein sim --check`;
//! - [`trace`]: block-IO trace readers;
//! - [`hosts`]: PARDA hosts (flow control in front of an array) and their results and checks;
//!   `array`: the processor-sharing device.
//! - [`pshift`]: pShift clusters (token schedulers, controller) and the paper's synthetic instances.

mod array;
pub mod bench;
pub mod check;
pub mod engine;
mod events;
pub mod hosts;
pub mod metrics;
pub mod pshift;
pub mod scenario;
pub mod trace;

pub use engine::{Sim, SimError};
pub use metrics::{RunTotals, Summary, Timeseries};
pub use scenario::{Scenario, ScenarioError};

/// Loads nothing, runs `sc` to the end and returns what it measured.
pub fn run(sc: &Scenario, progress: &mut dyn FnMut(rein_core::Nanos)) -> Result<RunTotals, SimError> {
    if sc.pshift.is_some() {
        return Ok(pshift::engine::run(sc, progress)?.totals);
    }
    Ok(Sim::new(sc)?.run(progress))
}
