//! The admin endpoint's JSON bodies (tenant spec and capacity changes): decoded and validated without a
//! panic, accepted values are numbers within bounds (`rein_runtime::harness::admin_bodies`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::admin_bodies(data));
