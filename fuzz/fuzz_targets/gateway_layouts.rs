//! `rein gateway`'s layout file (`layout_file`): bounds kept, what parses written back the same
//! (`rein_runtime::harness::gateway_layouts`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::gateway_layouts(data));
