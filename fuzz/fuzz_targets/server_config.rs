//! rein.toml as an operator writes it: `ServerConfig::parse` never panics, and what it accepts keeps
//! every documented bound (`rein_runtime::harness::server_config`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::server_config(data));
