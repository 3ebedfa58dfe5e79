//! The state file's journal (data_dir/rein-state.journal) applied over an empty state, and what it makes
//! checked as a state file (`rein_runtime::harness::state_journal`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::state_journal(data));
