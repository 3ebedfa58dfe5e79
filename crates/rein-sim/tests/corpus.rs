//! Replays the committed fuzz corpus of the simulator's file decoders (`fuzz/corpus/<target>/` and
//! `fuzz/seeds/<target>/` at the repository root) through the `rein_sim::harness` functions the fuzz
//! targets call, so CI checks every input the fuzzer kept without a nightly toolchain.
#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;

#[test]
fn scenario_corpus() {
    replay("scenario", rein_sim::harness::scenario);
}

#[test]
fn trace_corpus() {
    replay("trace", rein_sim::harness::trace);
}

#[test]
fn pshift_instance_corpus() {
    replay("pshift_instance", rein_sim::harness::pshift_instance);
}

/// The scenario inputs kept out of short fuzz runs (`fuzz/corpus-slow/scenario`, fuzz/README.md) are
/// replayed here with the rest.
#[test]
fn the_slow_scenario_inputs_are_replayed_too() {
    let all = replay::inputs("scenario");
    let slow = all.iter().filter(|(p, _)| p.components().any(|c| c.as_os_str() == "corpus-slow")).count();
    assert!(slow > 100, "{slow} inputs of fuzz/corpus-slow/scenario among the {} replayed", all.len());
}
