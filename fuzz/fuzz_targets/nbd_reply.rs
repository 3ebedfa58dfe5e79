//! The client's decoders of what a server sends: transmission reply headers and option replies; never
//! panic, never over-consume, re-encode to the same bytes (`rein_proto::harness::replies`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_proto::harness::replies(data));
