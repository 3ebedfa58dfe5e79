//! The state file (data_dir/rein-state.json) parsed, written back and applied over a configuration
//! (`rein_runtime::harness::state_file`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::state_file(data));
