//! The admin token file (`admin_token_file`): a token of visible ASCII, compared whole (`rein_runtime::harness::admin_token`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::admin_token(data));
