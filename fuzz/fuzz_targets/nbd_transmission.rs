//! The NBD transmission state machine: one event per request header, the same events however the input is
//! split, bounded buffering, decodable replies (`rein_proto::harness::transmission`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_proto::harness::transmission(data));
