//! The admin client's parse of an HTTP response (status, chunked body), and of its body as a `/metrics`
//! text: never panics, never grows (`rein_runtime::harness::admin_response`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::admin_response(data));
