//! `rein sim` on a PARDA scenario, as a user would run it: host table, hosts.csv, host plots, checks.
use std::path::PathBuf;
use std::process::Command;

#[test]
fn rein_sim_writes_host_outputs_for_parda_scenarios() {
    let scenario = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/parda-table3.toml");
    let dir = tempfile::Builder::new().prefix("rein-parda-cli-").tempdir().expect("temp dir");
    let out = dir.path();
    let run = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["sim", scenario.to_str().unwrap(), "--check", "--quiet", "--out", out.to_str().unwrap()])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("PARDA on (script-L 30 ms, cluster aggregation)"), "{stdout}");
    assert!(stdout.contains("eq. (3) equilibrium"), "{stdout}");
    assert!(!stdout.contains("MISS"), "{stdout}");
    for f in [
        "hosts.csv",
        "host-window.png",
        "host-window.svg",
        "host-latency.png",
        "host-iops.png",
        "host-beta.png",
        "check.json",
    ] {
        assert!(out.join(f).exists(), "missing {f}");
    }
    let csv = std::fs::read_to_string(out.join("hosts.csv")).unwrap();
    assert!(csv.starts_with("t_s,host,window,beta,iops,latency_mean_ms,signal_ms,estimate_ms\n"));
    assert_eq!(csv.lines().count(), 1 + 4 * 200, "a row per host per second");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let hosts = s["hosts"]["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 4);
    for h in hosts {
        let (w, eq) = (h["window_mean"].as_f64().unwrap(), h["equilibrium_window"].as_f64().unwrap());
        assert!((w - eq).abs() < 0.1 * eq, "{h}");
        assert!(h["convergence_s"].as_f64().unwrap() < 40.0, "{h}");
    }
}

#[test]
fn rein_sim_reports_bad_parda_parameters() {
    let dir = tempfile::Builder::new().prefix("rein-parda-cli-bad-").tempdir().expect("temp dir");
    let good =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/parda-table3.toml"))
            .unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, good.replace("gamma = 0.8", "gamma = 1.8")).unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["sim", bad.to_str().unwrap(), "--quiet"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(stderr.contains("gamma (eq. (2) smoothing) must be in [0, 1], got 1.8"), "{stderr}");
}
