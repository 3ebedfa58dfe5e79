//! gw.toml as an operator writes it: `GatewayConfig::parse` never panics, and what it accepts keeps the
//! gateway's bounds (`rein_runtime::harness::gateway_config`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::gateway_config(data));
