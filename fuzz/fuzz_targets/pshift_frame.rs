//! pShift's frames between servers and the controller: the decoder never panics, takes only whole frames,
//! and what it accepts re-encodes to the same bytes (`rein_proto::harness::pshift`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_proto::harness::pshift(data));
