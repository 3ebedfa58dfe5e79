//! What an NBD server sends a client: `ClientTransmission` never panics, completes only requests sent,
//! each once and with their length of data, and gives the same replies however the bytes are split
//! (`rein_proto::harness::client_replies`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_proto::harness::client_replies(data));
