//! An export's `allow_networks` and `allow_identities` (`rein_runtime::harness::access_list`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::access_list(data));
