//! The simulator's scenario decoder: never panics, and what it accepts keeps its bounds
//! (`rein_sim::harness::scenario`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_sim::harness::scenario(data));
