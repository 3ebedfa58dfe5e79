//! Replays the committed fuzz corpus of rein-runtime's targets (`fuzz/corpus/<target>/` and
//! `fuzz/seeds/<target>/` at the repository root) through the same `rein_runtime::harness` functions the
//! fuzz targets call, so CI checks every input the fuzzer kept without a nightly toolchain (rein-proto's
//! `tests/corpus.rs` does the wire decoders').
use std::path::{Path, PathBuf};

/// Every file of `fuzz/corpus/<target>` and `fuzz/seeds/<target>`, with its path.
fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut out = Vec::new();
    for dir in ["corpus", "seeds"] {
        let d = fuzz.join(dir).join(target);
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((path, bytes));
        }
    }
    out.sort();
    out
}

/// Runs `check` on every input of `target`, naming the input that breaks a contract.
fn replay(target: &str, check: fn(&[u8])) {
    let all = inputs(target);
    assert!(all.len() > 1, "fuzz/corpus/{target} is empty: run `scripts/fuzz.sh` and commit the corpus");
    for (path, bytes) in &all {
        if std::panic::catch_unwind(|| check(bytes)).is_err() {
            panic!(
                "{target}: {} breaks a contract (reproduce: cargo +nightly fuzz run {target} <that file>)",
                path.display()
            );
        }
    }
}

#[test]
fn server_config_corpus() {
    replay("server_config", rein_runtime::harness::server_config);
}

#[test]
fn admin_body_corpus() {
    replay("admin_body", rein_runtime::harness::admin_bodies);
}

#[test]
fn admin_response_corpus() {
    replay("admin_response", rein_runtime::harness::admin_response);
}

/// The seeds are what they claim: the documented and built-in configurations parse, the bodies decode.
#[test]
fn seeds_are_valid() {
    use rein_runtime::config::ServerConfig;
    for (path, bytes) in inputs("server_config").iter().filter(|(p, _)| p.to_string_lossy().contains("/seeds/")) {
        let text = std::str::from_utf8(bytes).expect("UTF-8");
        if let Err(e) = ServerConfig::parse(text, path) {
            panic!("seed {}: {e}", path.display());
        }
    }
}

/// Found by `server_config` (artifact crash-29aa5f3e9f5a17c7ff78c8f4da37baec701e065e, after 829,195 runs):
/// an export named `""` without a `tenant` was accepted, and made a default tenant with an empty name
/// (which `[[tenants]]` refuses), reachable by nobody's `PUT /api/tenants/{name}`. Now refused, naming why.
#[test]
fn crash_29aa5f3e_an_export_with_an_empty_name() {
    let input = b"\n[[exports]]\nname = \"\"\n\t\t\t#eigm\t\t\t\t\t\tpreset = \t\t\t\t\t\t\t\t\t\tht = 3\n";
    rein_runtime::harness::server_config(input);
    let e = rein_runtime::config::ServerConfig::parse("[[exports]]\nname = \"\"", Path::new("x.toml")).unwrap_err();
    assert_eq!(e.to_string(), "config: an [[exports]] entry has an empty name");
}
