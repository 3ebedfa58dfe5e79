//! The bodies of `POST /api/tenants` and `POST /api/exports`, validated as the endpoint does, kept through the
//! state file (`rein_runtime::harness::admin_create`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::admin_create(data));
