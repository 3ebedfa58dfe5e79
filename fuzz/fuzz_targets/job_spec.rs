//! `rein load --job`'s key=value parser: never panics, and what it accepts keeps the workload's bounds
//! (`rein_runtime::harness::job_spec`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::job_spec(data));
