//! `rein pshift solve`, `rein pshift gen` and `rein pshift sweep`, driven as a user would: the paper's
//! Example 1/2 file, a generated instance, thread counts and the approximation, a small sweep, and bad
//! instances with clear errors.
mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn rein(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rein")).args(args).output().expect("runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// A temporary instance file holding `text`, removed when dropped (also on a panic).
fn file(name: &str, text: &str) -> tempfile::TempPath {
    let f = tempfile::Builder::new().prefix(&format!("rein-pshift-{name}-")).suffix(".json").tempfile().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f.into_temp_path()
}

/// A fresh directory under the temp dir, removed with everything in it when dropped (also on a panic).
fn tmpdir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("rein-pshift-{name}-")).tempdir().unwrap()
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

/// Table I of the paper (Examples 1 and 2), in the issue's format, red with a limit.
const TABLE_1: &str = r#"{"servers": [{"name": "s0", "capacity": 100}, {"name": "s1", "capacity": 100}],
 "buckets": [{"name": "red", "reservation": 100, "limit": 150, "demand": {"s0": 150, "s1": 50}},
             {"name": "blue", "reservation": 100, "demand": {"s0": 50, "s1": 50}}]}"#;

#[test]
fn solve_example_2_moves_25_red_tokens() {
    let p = file("table1", TABLE_1);
    let (ok, out, err) = rein(&["pshift", "solve", p.to_str().unwrap()]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(
        (v["phi_initial"].as_u64(), v["phi"].as_u64(), v["max_flow"].as_u64()),
        (Some(175), Some(200), Some(200))
    );
    assert_eq!(v["optimal"], true);
    let red = &v["buckets"][0];
    assert_eq!(red["name"], "red");
    assert_eq!((red["allocation"]["s0"]["r"].as_u64(), red["allocation"]["s1"]["r"].as_u64()), (Some(50), Some(50)));
    // Servers are full after the R-tokens: red's 50 L-tokens stay where its residual demand is (s0).
    assert_eq!(red["l_tokens"].as_u64(), Some(50));
    assert_eq!(red["allocation"]["s0"]["l"].as_u64(), Some(50));
    assert!(v["buckets"][1]["l_tokens"].is_null(), "unlimited: no L-tokens needed");
    assert_eq!(v["servers"][1]["r_tokens"].as_u64(), Some(100));
}

/// `gen -o` writes the instance whole (a temporary renamed into place) and never over something that is
/// not a regular file: a FIFO at the path is refused and left as it was (a rename would have replaced a
/// device node such as /dev/full with the instance).
#[test]
fn gen_out_replaces_only_a_regular_file() {
    let dir = tmpdir("gen-out");
    let fifo = dir.path().join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let (ok, _, err) =
        rein(&["pshift", "gen", "--servers", "2", "--buckets", "4", "--active", "1", "-o", fifo.to_str().unwrap()]);
    assert!(!ok && err.contains("checking what the path names: it is a FIFO, not a regular file"), "{err}");
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&std::fs::symlink_metadata(&fifo).unwrap().file_type()));
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["fifo"], "no temporary left");
}

#[test]
fn gen_then_solve_is_optimal_for_any_thread_count() {
    let dir = tmpdir("gen");
    let p = dir.path().join("gen.json");
    let (ok, _, err) = rein(&[
        "pshift",
        "gen",
        "--servers",
        "16",
        "--buckets",
        "400",
        "--active",
        "3",
        "--limit-ratio",
        "1.5",
        "--seed",
        "3",
        "-o",
        p.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let inst = json(&std::fs::read_to_string(&p).unwrap());
    assert_eq!((inst["servers"].as_array().unwrap().len(), inst["buckets"].as_array().unwrap().len()), (16, 400));
    let total: u64 = inst["buckets"].as_array().unwrap().iter().map(|b| b["reservation"].as_u64().unwrap()).sum();
    assert_eq!(total, 1_600_000, "r = 1.0 of 16 x 100,000");
    let mut outs = vec![];
    for threads in ["1", "2"] {
        let (ok, out, err) = rein(&["pshift", "solve", p.to_str().unwrap(), "--threads", threads]);
        assert!(ok, "{err}");
        let mut v = json(&out);
        assert_eq!(v["optimal"], true, "{threads} threads");
        for k in ["time_ms", "max_flow_time_ms", "threads"] {
            v.as_object_mut().unwrap().remove(k);
        }
        outs.push(v);
    }
    assert_eq!(outs[0], outs[1], "same allocation on 1 and 2 threads");
    let (ok, out, _) = rein(&["pshift", "solve", p.to_str().unwrap(), "--approx-top", "20", "--summary"]);
    assert!(ok);
    let v = json(&out);
    assert!(v["phi"].as_u64() <= v["max_flow"].as_u64() && v["phi"].as_u64() >= v["phi_initial"].as_u64());
    assert!(v.get("buckets").is_none(), "--summary omits the lists");
}

#[test]
fn bad_instances_get_clear_errors() {
    let bad = |name: &str, text: &str, want: &str| {
        let p = file(name, text);
        let (ok, out, err) = rein(&["pshift", "solve", p.to_str().unwrap()]);
        assert!(!ok && out.is_empty(), "{name} should fail");
        assert!(err.contains(want), "{name}: expected {want:?} in {err}");
    };
    bad(
        "negative",
        &TABLE_1.replace("\"capacity\": 100}, {", "\"capacity\": -100}, {"),
        "server \"s0\": capacity must be a whole number of tokens between 0 and",
    );
    bad(
        "fraction",
        &TABLE_1.replace("\"reservation\": 100, \"limit\"", "\"reservation\": 99.5, \"limit\""),
        "bucket \"red\": reservation must be a whole number",
    );
    bad(
        "unknown-server",
        &TABLE_1.replace("\"s1\": 50}}]", "\"s9\": 50}}]"),
        "bucket \"blue\": demand names unknown server \"s9\"",
    );
    bad("dup-server", &TABLE_1.replace("\"name\": \"s1\"", "\"name\": \"s0\""), "two servers are named \"s0\"");
    bad("dup-bucket", &TABLE_1.replace("\"blue\"", "\"red\""), "two buckets are named \"red\"");
    bad(
        "dup-demand",
        &TABLE_1.replace("{\"s0\": 50, \"s1\": 50}", "{\"s0\": 50, \"s0\": 60}"),
        "bucket \"blue\": demand names server \"s0\" twice",
    );
    bad(
        "limit",
        &TABLE_1.replace("\"limit\": 150", "\"limit\": 50"),
        "bucket \"red\": limit 50 is below the reservation 100",
    );
    bad(
        "no-servers",
        r#"{"servers": [], "buckets": [{"name": "b", "reservation": 1}]}"#,
        "the instance has no servers",
    );
    bad("no-buckets", r#"{"servers": [{"name": "s", "capacity": 1}], "buckets": []}"#, "the instance has no buckets");
    bad("empty", "", "is not a valid instance file");
    bad("not-json", "{servers: 1}", "is not a valid instance file");
    bad("typo", &TABLE_1.replace("\"limit\"", "\"limt\""), "unknown field `limt`");
    bad("string", &TABLE_1.replace("\"capacity\": 100}, {", "\"capacity\": \"100\"}, {"), "invalid type: string");
    bad(
        "huge",
        &TABLE_1.replace("\"reservation\": 100, \"limit\"", "\"reservation\": 1e13, \"limit\""),
        "reservation must be a whole number of tokens between 0 and 1000000000000",
    );
    let many: Vec<String> = (0..1025).map(|j| format!("{{\"name\": \"s{j}\", \"capacity\": 1}}")).collect();
    bad(
        "too-many-servers",
        &format!("{{\"servers\": [{}], \"buckets\": [{{\"name\": \"b\", \"reservation\": 1}}]}}", many.join(",")),
        "too many servers: 1025 (at most 1024)",
    );
    let (ok, _, err) = rein(&["pshift", "solve", "/nonexistent/i.json"]);
    assert!(!ok && err.contains("cannot read instance /nonexistent/i.json"), "{err}");
    let p = file("threads", TABLE_1);
    let (ok, _, err) = rein(&["pshift", "solve", p.to_str().unwrap(), "--threads", "0"]);
    assert!(!ok && err.contains("--threads must be in 1..=256"), "{err}");
    let (ok, _, err) = rein(&["pshift", "gen", "--active", "65"]);
    assert!(!ok && err.contains("active servers must be in 1..=64"), "{err}");
    // N_A's default is the paper's 8, or every server when there are fewer: `--servers 4` alone is valid.
    let (ok, out, err) = rein(&["pshift", "gen", "--servers", "4", "--buckets", "3"]);
    assert!(ok, "{err}");
    let inst = json(&out);
    for b in inst["buckets"].as_array().unwrap() {
        assert_eq!(b["demand"].as_object().unwrap().len(), 4, "{b}");
    }
}

#[test]
fn instance_files_above_the_size_bound_are_refused_unread() {
    // A sparse file one byte over the 256 MiB bound: refused from its size, without reading it.
    let f = tempfile::Builder::new().prefix("rein-pshift-big-").suffix(".json").tempfile().unwrap();
    f.as_file().set_len((256 << 20) + 1).unwrap();
    let (ok, _, err) = rein(&["pshift", "solve", f.path().to_str().unwrap()]);
    assert!(!ok && err.contains("larger than the 256 MiB bound"), "{err}");
}

#[test]
fn bench_pshift_reports_against_the_max_flow_baseline() {
    let (ok, out, err) = rein(&[
        "bench",
        "pshift",
        "--buckets",
        "1000",
        "--threads",
        "1,2",
        "--approx",
        "100",
        "--repeat",
        "1",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for r in rows {
        for k in ["ms", "max_flow_ms", "ratio"] {
            assert!(r[k].as_f64().is_some_and(|x| x > 0.0), "{k} in {r}");
        }
        if r["approx_top"].is_null() {
            assert_eq!(r["phi"], r["max_flow"], "exact rows reach the max-flow value");
        } else {
            assert!(r["phi"].as_u64() < r["max_flow"].as_u64(), "top 100 of 1,000 buckets loses some Phi here");
        }
    }
}

#[test]
fn sim_runs_pshift_scenarios_with_checks_and_plots() {
    let sc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/pshift-exp3-limits.toml");
    let dir = tmpdir("sim");
    let out = dir.path();
    let (ok, stdout, stderr) = rein(&["sim", sc.to_str().unwrap(), "--check", "-q", "--out", out.to_str().unwrap()]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("ok   4 buckets: share of 16 bucket-periods with >= 99% of the reservation"), "{stdout}");
    let files =
        ["summary.json", "timeseries.csv", "iops.png", "periods.png", "periods.svg", "intervals.png", "rounds.png"];
    for f in files.into_iter().chain(["periods.csv", "period-verdicts.png", "period-verdicts.svg"]) {
        assert!(out.join(f).exists(), "missing {f}");
    }
    // periods.csv: the 4 periods closed by 4.2 s, each of the 4 buckets within its R and L.
    let periods = std::fs::read_to_string(out.join("periods.csv")).unwrap();
    let lines: Vec<&str> = periods.lines().collect();
    assert_eq!(lines[0], "period,closed_at_s,bucket,completed,reservation,limit,verdict");
    assert_eq!(lines.len(), 1 + 16, "{periods}");
    assert!(lines[1..].iter().all(|l| l.ends_with(",met")), "{periods}");
    assert!(stdout.contains("wrote ") && stdout.contains("periods.csv, period-verdicts"), "{stdout}");
    // rounds.csv: one row per boundary (4 periods of 5 intervals from start_s = 0.2 s to 4.2 s, the last
    // boundary at the run's end not computed), each period's first asking for all four reservations.
    let rounds = std::fs::read_to_string(out.join("rounds.csv")).unwrap();
    let rows: Vec<Vec<f64>> =
        rounds.lines().skip(1).map(|l| l.split(',').map(|x| x.parse().unwrap()).collect()).collect();
    let boundaries: Vec<&Vec<f64>> = rows.iter().filter(|r| r[3] == 0.0).collect();
    assert_eq!(boundaries.len(), 20, "{rounds}");
    for (k, r) in boundaries.iter().enumerate() {
        assert_eq!((r[1], r[2]), ((k / 5) as f64, (k % 5) as f64), "period and interval of boundary {k}: {rounds}");
        let at = 0.2 + 0.2 * k as f64;
        assert!(r[0] >= at && r[0] < at + 0.01, "boundary {k} answered at {} s: {rounds}", r[0]);
    }
    for r in boundaries.iter().step_by(5) {
        assert!((r[5] - 4.0 * 30_000.0).abs() <= 4.0 * 30_000.0 * 0.02, "a period starts wanting 4 x R: {rounds}");
    }
    let (ok, _, stderr) = rein(&["sim", sc.to_str().unwrap(), "--scheduler", "fifo"]);
    assert!(!ok && stderr.contains("pShift scenarios run token schedulers"), "{stderr}");
}

/// A small cluster with generated buckets (3 servers, 40 buckets) for `rein pshift sweep`.
const SWEEP: &str = r#"
name = "sweep-small"
duration_s = 2.2
interval_s = 0.2
seed = 3
scheduler = "token"
[pshift]
period_s = 1.0
intervals = 5
delay_ms = 0.2
[pshift.generate]
buckets = 40
reserved_fraction = 0.9
demand_ratio = 1.3
active_servers = 2
[[servers]]
name = "s1"
capacity_iops = 4000
queue_depth = 1
[[servers]]
name = "s2"
capacity_iops = 4000
queue_depth = 1
[[servers]]
name = "s3"
capacity_iops = 4000
queue_depth = 1
[[expect]]
metric = "reservation_met_fraction"
threshold_pct = 95
window = [0.2, 2.2]
above = 0.0
"#;

/// A sweep whose table nobody reads (`rein pshift sweep ... | true`) stops before its next run and ends
/// with status 0, saying why on stderr (it ran all 400 runs here before, 4 s).
#[test]
fn a_sweep_stops_once_its_reader_has_gone() {
    let dir = tmpdir("sweep-unread");
    let p = dir.path().join("small.toml");
    std::fs::write(&p, SWEEP).unwrap();
    let (status, stderr) = common::run_unread(
        Command::new(env!("CARGO_BIN_EXE_rein")).args([
            "pshift",
            "sweep",
            p.to_str().unwrap(),
            "--active",
            "1,2",
            "--changes",
            "0,2",
            "--runs",
            "100",
        ]),
        Duration::from_secs(60),
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("rein pshift sweep: standard output's reader has gone; stopping"), "{stderr}");
    assert!(stderr.matches(": error ").count() <= 1, "runs after the reader had gone: {stderr}");
}

/// The sweep prints one JSON cell per (N_A, N_D); `--early-rounds` overrides the file (0: the paper's
/// controller), and a value out of range is named.
#[test]
fn sweep_runs_the_grid_with_and_without_early_rounds() {
    let dir = tmpdir("sweep");
    let p = dir.path().join("small.toml");
    std::fs::write(&p, SWEEP).unwrap();
    let p = p.to_str().unwrap();
    for early in [None, Some("0")] {
        let mut args = vec!["pshift", "sweep", p, "--active", "1,2", "--changes", "0,2", "--runs", "1", "--json"];
        if let Some(e) = early {
            args.extend(["--early-rounds", e]);
        }
        let (ok, out, err) = rein(&args);
        assert!(ok, "{err}");
        let cells = json(&out);
        let cells = cells.as_array().unwrap();
        assert_eq!(cells.len(), 4, "{out}");
        for c in cells {
            let e = c["error"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&e), "{c}");
        }
    }
    let (ok, _, err) = rein(&["pshift", "sweep", p, "--runs", "1", "--early-rounds", "101"]);
    assert!(!ok);
    assert!(err.contains("pshift.early_rounds must be in 0..=100, got 101"), "{err}");
}
