//! PARDA's aggregation record and slot decoders: never panic; what decodes re-encodes to the same bytes
//! (`rein_proto::harness::parda`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_proto::harness::parda(data));
