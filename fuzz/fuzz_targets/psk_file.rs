//! The TLS PSK file (`identity:hexkey` lines): bounds kept, keys as written (`rein_runtime::harness::psk_file`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::psk_file(data));
