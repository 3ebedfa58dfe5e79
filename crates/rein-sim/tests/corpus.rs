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
