//! `rein demo` and `rein probe` around other processes' files: the demo never removes a running
//! server's state, and the probe never creates the image it is to measure.
mod common;

use std::process::Command;

fn rein(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rein")).args(args).output().expect("runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into())
}

/// `rein demo --out DIR` while a `rein serve` runs on `DIR/data`: refused, naming the directory in use,
/// and the server's state file stays (the demo removed it before its own server found the directory
/// locked).
#[test]
fn the_demo_leaves_a_running_servers_state_alone() {
    let tmp = common::tmpdir("demo-locked");
    let dir = tmp.path();
    let s = common::serve(dir, 207, common::MEMORY);
    let (code, _, body) = common::http(s.admin, "PUT", "/api/tenants/m", "", r#"{"reservation": 20}"#);
    assert_eq!(code, 200, "{body}");
    let state = dir.join("data").join("rein-state.json");
    let before = std::fs::read_to_string(&state).expect("the server kept its change");
    let (ok, err) = rein(&["demo", "--out", dir.to_str().unwrap(), "--seconds", "6", "--json"]);
    assert!(!ok);
    assert!(err.contains("is in use by another rein serve") && err.contains("choose another --out"), "{err}");
    assert_eq!(std::fs::read_to_string(&state).ok(), Some(before), "the running server's state stays");
    assert!(dir.join("data").join("rein.lock").exists(), "the running server's lock stays");
    drop(s);
}

/// `rein probe` on an export whose image does not exist is refused and creates nothing (it made a sparse
/// image and measured its holes); bad settings are refused before anything is opened.
#[test]
fn the_probe_measures_only_an_existing_image() {
    let tmp = common::tmpdir("probe-missing");
    let dir = tmp.path();
    let cfg = common::write_file(
        dir,
        "rein.toml",
        &format!("data_dir = \"{}\"\n[[exports]]\nname = \"a\"\nsize_mb = 16\n", dir.join("data").display()),
    );
    let cfg = cfg.to_str().unwrap();
    let (ok, err) = rein(&["probe", "--config", cfg, "--seconds", "1"]);
    assert!(!ok);
    assert!(
        err.contains("export \"a\"") && err.contains("a.img does not exist; rein probe measures an existing image"),
        "{err}"
    );
    assert!(!dir.join("data").exists(), "nothing created");
    let (ok, err) = rein(&["probe", "--config", cfg, "--seconds", "0"]);
    assert!(!ok);
    assert!(err.contains("seconds must be in (0,"), "{err}");
    assert!(!dir.join("data").exists(), "nothing created");
}
