//! `rein pshift solve`'s instance file decoder: never panics, what it accepts keeps the core's bounds and
//! writes back to itself (`rein_sim::harness::pshift_instance`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_sim::harness::pshift_instance(data));
