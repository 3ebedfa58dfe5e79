//! The storage-node messages (hello, welcome, tag, reply trailer, node reply): never panic, what decodes
//! passes the encoder's checks and re-encodes to the same bytes (`rein_proto::harness::node_hello`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_proto::harness::node_hello(data));
