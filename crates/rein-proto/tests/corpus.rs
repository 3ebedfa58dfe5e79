//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/` and `fuzz/seeds/<target>/` at the repository
//! root) through the same `rein_proto::harness` functions the fuzz targets call, so CI checks every input
//! the fuzzer kept without a nightly toolchain. A crash the fuzzer finds is also a named test below.
#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::{fuzz_dir, replay};

#[test]
fn nbd_handshake_corpus() {
    replay("nbd_handshake", rein_proto::harness::handshake);
}

#[test]
fn nbd_transmission_corpus() {
    replay("nbd_transmission", rein_proto::harness::transmission);
}

#[test]
fn parda_record_corpus() {
    replay("parda_record", rein_proto::harness::parda);
}

#[test]
fn pshift_frame_corpus() {
    replay("pshift_frame", rein_proto::harness::pshift);
}

#[test]
fn nbd_reply_corpus() {
    replay("nbd_reply", rein_proto::harness::replies);
}

#[test]
fn nbd_client_corpus() {
    replay("nbd_client", rein_proto::harness::client_replies);
}

#[test]
fn node_hello_corpus() {
    replay("node_hello", rein_proto::harness::node_hello);
}

/// Every fuzz target has a corpus test: these seven here, `scenario`, `trace` and `pshift_instance` in
/// rein-sim's `tests/corpus.rs`, the rest in rein-runtime's.
#[test]
fn every_fuzz_target_is_replayed() {
    let replayed = [
        "access_list",
        "admin_body",
        "admin_create",
        "admin_response",
        "admin_token",
        "gateway_config",
        "gateway_layouts",
        "job_spec",
        "listen_env",
        "nbd_client",
        "nbd_handshake",
        "nbd_reply",
        "nbd_transmission",
        "node_hello",
        "parda_record",
        "pshift_controller_config",
        "pshift_frame",
        "pshift_instance",
        "psk_file",
        "scenario",
        "server_config",
        "state_file",
        "state_journal",
        "trace",
    ];
    let mut targets: Vec<String> = std::fs::read_dir(fuzz_dir().join("fuzz_targets"))
        .expect("fuzz/fuzz_targets")
        .map(|e| e.expect("an entry").path().file_stem().expect("a name").to_string_lossy().into_owned())
        .collect();
    targets.sort();
    assert_eq!(targets, replayed, "a fuzz target without a corpus test (or a test for a target that is gone)");
}
