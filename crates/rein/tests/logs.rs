//! `--log-format json` (or `REIN_LOG_FORMAT=json`): every line a daemon writes to stderr is one JSON object,
//! its last words too, for a log collector; text stays the default.
#![cfg(unix)]

mod common;

use common::{config_file, tmpdir, KillOnDrop, MEMORY};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// `rein serve` with JSON logs: each line parses, the listening line carries its addresses as fields, a
/// SIGTERM's lines follow; a failing start's error is the last object, at ERROR.
#[test]
fn json_logs_are_one_object_per_line_to_the_last() {
    let tmp = tmpdir("logs-json");
    let cfg = config_file(tmp.path(), 176, MEMORY);
    // Killed and waited for if an assertion fails (it ran on otherwise).
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["--log-format", "json", "serve", "--config", cfg.to_str().unwrap()])
            .env("REIN_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id().to_string();
    let mut lines = BufReader::new(child.0.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let listening = loop {
        let line = lines.next().expect("a line before the listening one").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["fields"]["message"] == "rein serve listening" {
            break v;
        }
        seen.push(v);
    };
    assert_eq!(listening["level"], "INFO");
    assert!(listening["fields"]["nbd"].as_str().unwrap().starts_with("127.0.0.176:"), "{listening}");
    assert!(listening["timestamp"].is_string() && listening["target"] == "rein_runtime::server", "{listening}");
    assert!(seen.iter().any(|v| v["level"] == "WARN" && v["fields"]["export"] == "m"), "the RAM warning: {seen:?}");
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let rest: Vec<serde_json::Value> =
        lines.map(|l| l.unwrap()).map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert!(child.0.wait().unwrap().success());
    assert_eq!(rest.last().unwrap()["fields"]["message"], "stopped", "{rest:?}");

    // The last words of a failed start, as an object (text: `error: ...`).
    let out = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["serve", "--config", "/nonexistent/rein.toml"])
        .env("REIN_LOG_FORMAT", "json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    let last: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    assert_eq!(last["level"], "ERROR");
    assert!(last["fields"]["message"].as_str().unwrap().contains("/nonexistent/rein.toml"), "{err}");

    // A format that does not exist is refused, naming the values there are.
    let out = Command::new(env!("CARGO_BIN_EXE_rein")).args(["--log-format", "yaml", "sim", "x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("invalid value 'yaml'") && err.contains("text, json"), "{err}");
}
