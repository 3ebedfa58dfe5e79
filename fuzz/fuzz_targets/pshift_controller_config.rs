//! `rein pshift controller`'s ctl.toml: `ControllerSettings::parse` never panics, and what it accepts keeps
//! every documented bound (`rein_runtime::harness::pshift_controller_config`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::pshift_controller_config(data));
