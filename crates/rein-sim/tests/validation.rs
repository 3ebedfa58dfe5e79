//! Bad scenarios get clear errors naming what is wrong.
mod common;

use common::err;
use rein_sim::Scenario;

const BASE: &str = r#"
name = "t"
duration_s = 10
[[servers]]
name = "s1"
capacity_iops = 1000
[[tenants]]
name = "a"
[tenants.workload]
kind = "closed"
"#;

#[test]
fn accepts_the_minimal_scenario() {
    let sc = Scenario::from_toml(BASE, None).unwrap();
    assert_eq!(sc.servers[0].queue_depth, 32);
    assert_eq!(sc.tenants[0].workload.size_bytes, 4096);
}

#[test]
fn rejects_bad_fields_with_clear_messages() {
    assert!(err(&BASE.replace("capacity_iops = 1000", "capacity_iops = 1000\ncapcity = 3"))
        .contains("unknown field `capcity`"));
    assert!(err(&BASE.replace("capacity_iops = 1000", "capacity_iops = -5"))
        .contains("capacity_iops must be a positive number"));
    assert!(err(&BASE.replace("duration_s = 10", "duration_s = 10\nwarmup_s = 20")).contains("warmup_s"));
    assert!(err(&BASE.replace("kind = \"closed\"", "kind = \"sometimes\"")).contains("workload kind \"sometimes\""));
    assert!(err(&BASE.replace("kind = \"closed\"", "kind = \"open\"")).contains("open workload needs iops"));
    assert!(err(&BASE.replace("name = \"a\"", "name = \"a\"\nreservation = 500\nlimit = 100"))
        .contains("reservation 500 exceeds limit 100"));
    assert!(
        err(&BASE.replace("name = \"a\"", "name = \"a\"\nservers = [\"nope\"]")).contains("unknown server \"nope\"")
    );
    assert!(
        err(&format!("{BASE}\nscheduler = \"wfq\"")).contains("unknown field")
            || err(&BASE.replace("duration_s = 10", "duration_s = 10\nscheduler = \"wfq\""))
                .contains("unknown scheduler")
    );
    assert!(err(&BASE.replace("duration_s = 10", "duration_s = 10\nscheduler = \"wfq\""))
        .contains("unknown scheduler \"wfq\""));
    let dup = format!("{BASE}\n[[tenants]]\nname = \"a\"\n[tenants.workload]\nkind = \"closed\"\n");
    assert!(err(&dup).contains("two tenants are named \"a\""));
    let exp = format!("{BASE}\n[[expect]]\ntenant = \"a\"\nmetric = \"iops\"\n");
    assert!(err(&exp).contains("says nothing to check"));
    let exp = format!("{BASE}\n[[expect]]\ntenant = \"zz\"\nmetric = \"iops\"\nabove = 1\n");
    assert!(err(&exp).contains("unknown tenant \"zz\""));
    let tr = BASE.replace("kind = \"closed\"", "kind = \"trace\"\ntrace = { path = \"/nonexistent.trace\" }");
    assert!(err(&tr).contains("cannot read trace"));
    assert!(err("name = \"x\"").contains("missing field"));
    let tiny = BASE.replace("name = \"a\"", "name = \"a\"\nrouting = { stripe_kb = 0.0001 }");
    assert!(err(&tiny).contains("stripe_kb 0.0001 is less than one byte"), "{}", err(&tiny));
}

/// Each of a review's findings (2026-12-04), as a file: before, the first spun for ever, the pairs and
/// cells asked for gigabytes, and the rest ran and reported numbers that meant nothing.
#[test]
fn refuses_what_would_spin_or_exhaust_memory_or_check_nothing() {
    let at = |what: &str, with: &str| BASE.replace(what, with);
    let e = err(&at("kind = \"closed\"", "kind = \"open\"\niops = 1e9"));
    assert!(e.contains("iops 1000000000 is above the bound of 10000000 IOPS"), "{e}");
    let e = err(&at("kind = \"closed\"", "kind = \"on_off\"\non_s = 1e-9\noff_s = 1e-9"));
    assert!(e.contains("on_s + off_s must be at least"), "{e}");
    let e = err(&at("kind = \"closed\"", "kind = \"closed\"\nsize_kb = 1e-4"));
    assert!(e.contains("size_kb 0.0001 is less than one byte"), "{e}");
    let e = err(&at("capacity_iops = 1000", "capacity_iops = 1000\ncapacity_schedule = [{ at_s = 1, iops = 2e9 }]"));
    assert!(e.contains("capacity_schedule.iops 2000000000 is above the bound"), "{e}");
    let twice = "capacity_iops = 1000\ncapacity_schedule = [{ at_s = 1, iops = 5 }, { at_s = 1, iops = 9 }]";
    assert!(err(&at("capacity_iops = 1000", twice)).contains("each time named once"));
    let e = err(&at("duration_s = 10", "duration_s = 10\ninterval_s = 20"));
    assert!(e.contains("interval_s (20) must not exceed duration_s (10)"), "{e}");
    // Expectations: a window after the run, the oracle on a metric that is not IOPS, numbers that are not.
    let expect = |body: &str| format!("{BASE}\n[[expect]]\ntenant = \"a\"\n{body}\n");
    let e = err(&expect("metric = \"iops\"\nwindow = [20, 30]\nbelow = 1"));
    assert!(e.contains("expect[0]: window ends at 30 s, after the run's duration_s (10 s)"), "{e}");
    let e = err(&expect("metric = \"mb_s\"\noracle = true\nwithin_pct = 5"));
    assert!(e.contains("oracle gives IOPS (eq. (1)-(2)): it applies to iops, not mb_s"), "{e}");
    let e = err(&expect("metric = \"latency_mean_ms\"\noracle = true\nwithin_pct = 5"));
    assert!(e.contains("not latency_mean_ms"), "{e}");
    let e = err(&expect("metric = \"iops\"\nequals = nan\nwithin_pct = 5"));
    assert!(e.contains("expect[0]: equals must be a finite number, got NaN"), "{e}");
    let e = err(&expect("metric = \"iops\"\nequals = 100\nwithin_pct = -5"));
    assert!(e.contains("within_pct must be at least 0, got -5"), "{e}");
    let e = err(&format!("{BASE}\n[[tenants]]\nname = \"b\"\n[tenants.workload]\nkind = \"closed\"\n[[expect]]\ntenant = \"a\"\nmetric = \"iops\"\nratio_to = \"b\"\nratio = -1\nwithin_pct = 5\n"));
    assert!(e.contains("ratio must be positive, got -1"), "{e}");
}

/// Traces: a repeated trace that spans no time (once: `rein sim` spun for ever and `rein cluster run`
/// ignored SIGTERM for 14 minutes), record sizes past the bound, a type that is neither read nor write.
#[test]
fn refuses_traces_that_would_spin_or_overflow() {
    let dir = std::env::temp_dir().join(format!("rein-sim-validation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let with_trace = |text: &str, extra: &str| {
        std::fs::write(dir.join("t.trace"), text).unwrap();
        let sc =
            BASE.replace("kind = \"closed\"", &format!("kind = \"trace\"\ntrace = {{ path = \"t.trace\"{extra} }}"));
        Scenario::from_toml(&sc, Some(&dir)).map(|_| ()).map_err(|e| e.to_string())
    };
    let e = with_trace("0 0 0 8 1\n", ", repeat = true").unwrap_err();
    assert!(e.contains("trace.repeat") && e.contains("records that span time"), "{e}");
    let e = with_trace("0 0 0 8 1\n1000 0 8 8 1\n", ", repeat = true, time_scale = 1e-300").unwrap_err();
    assert!(e.contains("above the bound of 10000000 IOPS"), "{e}");
    assert!(with_trace("0 0 0 8 1\n1000000 0 8 8 1\n", ", repeat = true").is_ok());
    let e = with_trace("0 0 0 18446744073709551615 1\n", "").unwrap_err();
    assert!(e.contains("t.trace line 1: size in sectors overflows"), "{e}");
    let e = with_trace("0 0 0 8 7\n", "").unwrap_err();
    assert!(e.contains("t.trace line 1: type must be 1 (read) or 0 (write)"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The bound on tenant-server pairs is applied to the scenario as written: 1,024 servers and 1,954
/// tenants on all of them are 2,000,896 pairs, one tenant fewer is under the bound.
#[test]
fn refuses_more_tenant_server_pairs_than_the_bound() {
    let mut text = String::from("name = \"pairs\"\nduration_s = 1\n");
    for k in 0..1024 {
        text.push_str(&format!("[[servers]]\nname = \"s{k}\"\ncapacity_iops = 1000\n"));
    }
    for t in 0..1954 {
        text.push_str(&format!(
            "[[tenants]]\nname = \"t{t}\"\n[tenants.workload]\nkind = \"closed\"\noutstanding = 1\n"
        ));
    }
    let e = err(&text);
    assert!(e.contains("2000896 tenant-server pairs"), "{e}");
}
