//! The NBD handshake, server and client: never panic, never over-consume, same result however the input
//! is split (`rein_proto::harness::handshake`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_proto::harness::handshake(data));
