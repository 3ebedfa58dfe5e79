//! Replays a fuzz target's committed inputs (`fuzz/corpus/<target>/`, `fuzz/corpus-slow/<target>/` where
//! there is one, and `fuzz/seeds/<target>/`) through
//! a harness function on stable Rust: the one copy that the corpus tests of rein-proto and rein-runtime
//! include (`#[path = ...] mod replay;`), since it lives with the corpus it reads.
use std::path::{Path, PathBuf};

/// The repository's `fuzz/` directory.
pub(crate) fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// Every file of `fuzz/corpus/<target>`, `fuzz/corpus-slow/<target>` (optional: the inputs short fuzz
/// runs leave out, fuzz/README.md) and `fuzz/seeds/<target>`, with its path.
pub(crate) fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for dir in ["corpus", "corpus-slow", "seeds"] {
        let d = fuzz_dir().join(dir).join(target);
        if dir == "corpus-slow" && !d.exists() {
            continue;
        }
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
pub(crate) fn replay(target: &str, check: fn(&[u8])) {
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
