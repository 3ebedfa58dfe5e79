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
    assert_eq!(sc.servers()[0].queue_depth, 32);
    assert_eq!(sc.tenants()[0].workload.size_bytes, 4096);
}

#[test]
fn rejects_bad_fields_with_clear_messages() {
    let typo = err(&BASE.replace("capacity_iops = 1000", "capacity_iops = 1000\ncapcity = 3"));
    // Where, on one line (rein-model's parse_toml, as the daemons' configuration files).
    let line = BASE.lines().position(|l| l.starts_with("capacity_iops = 1000")).unwrap() + 2;
    assert!(typo.contains(&format!("line {line}, column 1: unknown field `capcity`")), "{typo}");
    assert_eq!(typo.lines().count(), 1, "{typo}");
    assert!(err(&BASE.replace("capacity_iops = 1000", "capacity_iops = -5"))
        .contains("capacity_iops must be a positive number"));
    assert!(err(&BASE.replace("duration_s = 10", "duration_s = 10\nwarmup_s = 20")).contains("warmup_s"));
    for d in ["0", "-1", "1e9"] {
        assert!(err(&BASE.replace("duration_s = 10", &format!("duration_s = {d}"))).ends_with(&format!(
            "duration_s must be more than 0 and at most 604800 s, got {}",
            d.replace("1e9", "1000000000")
        )));
    }
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
    // Removed when dropped, also when an assertion fails.
    let tmp = tempfile::Builder::new().prefix("rein-sim-validation-").tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
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

/// A name with a control character is refused (a line break split the CSV rows, an escape rewrote the
/// terminal's table); one with a comma or a quote runs and is quoted in the CSV (RFC 4180).
#[test]
fn names_cannot_break_the_csv_or_the_terminal() {
    for bad in ["new\\nline", "tab\\there", "red\\u001b[31m"] {
        let e = err(&BASE.replace("name = \"a\"", &format!("name = \"{bad}\"")));
        assert!(e.contains("tenant name") && e.contains("has a control character"), "{e}");
    }
    let e = err(&BASE
        .replace("name = \"s1\"", "name = \"s\\r1\"")
        .replace("[[tenants]]", "[[tenants]]\nservers = [\"s\\r1\"]"));
    assert!(e.contains("server name \"s\\r1\" has a control character"), "{e}");
    let sc = Scenario::from_toml(&BASE.replace("name = \"a\"", "name = \"a,\\\"b\\\"\""), None).unwrap();
    let totals = rein_sim::run(&sc, &mut |_| {}).unwrap();
    let csv = totals.timeseries.to_csv();
    let row = csv.lines().nth(1).unwrap();
    assert!(row.starts_with("0.000,\"a,\"\"b\"\"\","), "{row}");
    // Every row has the header's eleven fields once the quoted name is taken as one.
    for line in csv.lines() {
        let unquoted = line.replace("\"a,\"\"b\"\"\"", "n");
        assert_eq!(unquoted.split(',').count(), 11, "{line}");
    }
}

/// Asserts that `toml` is refused with a message holding `want`.
fn has(toml: &str, want: &str) {
    let e = err(toml);
    assert!(e.contains(want), "{want:?} not in {e:?}");
}

/// A setting the run would not use is refused, naming it, not ignored (each of these ran unchanged
/// before: a review of `rein sim` found them by running each with and without the setting).
#[test]
fn settings_the_run_would_ignore_are_refused() {
    // A service model's parameter with another model.
    has(
        &BASE.replace("capacity_iops = 1000", "capacity_iops = 1000\nuniform_spread = 0.9"),
        "uniform_spread is for service",
    );
    has(
        &BASE.replace("capacity_iops = 1000", "capacity_iops = 1000\ndisk = { seek_ms = 40 }"),
        "disk is for service = \"disk\", not \"exponential\"",
    );
    // A workload field for another kind.
    has(&BASE.replace("kind = \"closed\"", "kind = \"closed\"\niops = 5"), "iops is not used by a closed workload");
    has(
        &BASE.replace("kind = \"closed\"", "kind = \"open\"\niops = 5\nthink_ms = 1"),
        "think_ms is not used by an open",
    );
    has(
        &BASE.replace("kind = \"closed\"", "kind = \"closed\"\noutstanding = 4\noutstanding_per_server = 30"),
        "outstanding and outstanding_per_server are both given",
    );
    // dmClock's reservation split under mClock.
    has(
        &BASE.replace("name = \"a\"", "name = \"a\"\nreservation_split = \"rho\""),
        "reservation_split applies to a tenant of dmclock or rbfq servers",
    );
    // The token scheduler outside pShift (plain round robin, labelled token).
    has(&BASE.replace("duration_s = 10", "duration_s = 10\nscheduler = \"token\""), "scheduler \"token\" is pShift's");
    // A capacity step after the run.
    has(
        &BASE.replace("capacity_iops = 1000", "capacity_iops = 1000\ncapacity_schedule = [{ at_s = 10, iops = 5 }]"),
        "capacity_schedule has a step at 10 s, not before the run's end",
    );
    // Expectations that could never pass, measure nothing or ignore their window.
    let expect = |e: &str| format!("{BASE}[[expect]]\n{e}\n");
    has(&expect("tenant = \"a\"\nmetric = \"iops\"\nabove = 100\nbelow = 50"), "no value could pass");
    has(&expect("tenant = \"a\"\nmetric = \"iops\"\nabove = 1\nwindow = [2.2, 2.4]"), "holds no whole interval");
    has(&expect("tenant = \"a\"\nmetric = \"iops\"\nratio_to = \"a\"\nwithin_pct = 5"), "names tenant \"a\" itself");
    has(&expect("server = \"s1\"\nmetric = \"utilisation\"\nabove = 0.1\nwindow = [2, 5]"), "remove window");
    has(&expect("tenant = \"a\"\nmetric = \"latency_p99_ms\"\nbelow = 100\nwindow = [2, 5]"), "remove window");
    // A window of whole intervals still counts.
    let ok = expect("tenant = \"a\"\nmetric = \"iops\"\nabove = 1\nwindow = [2, 3]");
    assert!(Scenario::from_toml(&ok, None).is_ok());
}

/// pShift scenarios: the token scheduler runs whatever a server names, mClock's settings do not apply,
/// a generated limit below the one reservation and a period longer than the run are refused; the
/// repository's pShift files (scheduler = "token") still load.
#[test]
fn pshift_settings_the_run_would_ignore_are_refused() {
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios/pshift-exp4-small.toml"))
        .unwrap();
    assert!(Scenario::from_toml(&base, None).is_ok());
    has(&base.replace("scheduler = \"token\"", "scheduler = \"mclock\""), "run pShift's token scheduler");
    assert!(Scenario::from_toml(&base.replace("scheduler = \"token\"\n", ""), None).is_ok(), "token by default");
    has(&base.replacen("queue_depth = 1", "queue_depth = 1\nbatch = 8", 1), "do not apply to pShift's token scheduler");
    has(&base.replace("limit_iops = 2000", "limit_iops = 100"), "limit_iops 100 is below reservation_iops 1200");
    // Zipf reservations too small to give every bucket one, under limit_ratio: the cause named, not a
    // limit of 0 refused as if written.
    has(
        &base
            .replace("reservation_iops = 1200", "reserved_fraction = 0.0001")
            .replace("limit_iops = 2000", "limit_ratio = 1.5"),
        "'s reservation comes to 0 IOs per period (the reservations split 1 IO a period over 10 buckets), so \
         limit_ratio 1.5 gives it a limit of 0",
    );
    has(&base.replace("duration_s = 4.2", "duration_s = 1.0"), "outlasts the run");
    has(
        &base.replace("delay_ms = 0.5", "delay_ms = 10001"),
        "pshift.delay_ms must be between 0 and 10000 ms, got 10001",
    );
}

/// PARDA: a VM's reservation under a local scheduler that only knows weights, and a control period
/// longer than the run.
#[test]
fn parda_settings_the_run_would_ignore_are_refused() {
    let base =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios/parda-fig2.toml")).unwrap();
    assert!(Scenario::from_toml(&base, None).is_ok());
    has(&base.replace("period_s = 1.0", "period_s = 1000"), "parda: period_s (1000 s) is longer than the run");
    let vm = base.find("host = ").expect("a VM");
    let with_resv = format!("{}reservation = 300\n{}", &base[..vm], &base[vm..]);
    has(&with_resv, "a VM's reservation and limit need [parda] local_scheduler = \"mclock\"");
}

/// The default window, [warmup_s, duration_s], is held to what a given window is: it must hold a whole
/// interval, or a windowed check reads 0 and `below` passes (a review's f1_window: warmup_s 9.5 of 10).
/// Whole-run metrics (percentile latencies, utilisation) do not count intervals and keep the warm-up.
#[test]
fn a_default_window_that_holds_no_interval_is_refused() {
    let late = BASE.replace("duration_s = 10", "duration_s = 10\nwarmup_s = 9.5");
    let expect = |e: &str| format!("{late}[[expect]]\n{e}\n");
    has(
        &expect("tenant = \"a\"\nmetric = \"iops\"\nbelow = 1"),
        "expect[0]: the default window [warmup_s, duration_s] = [9.5, 10] s holds no whole interval of interval_s (1 s)",
    );
    has(&expect("server = \"s1\"\nmetric = \"iops\"\nbelow = 1"), "the default window [warmup_s, duration_s]");
    assert!(Scenario::from_toml(&expect("tenant = \"a\"\nmetric = \"latency_p99_ms\"\nbelow = 100"), None).is_ok());
    assert!(
        Scenario::from_toml(&expect("tenant = \"a\"\nmetric = \"iops\"\nbelow = 1e9\nwindow = [8, 9]"), None).is_ok()
    );
    let whole = BASE.replace("duration_s = 10", "duration_s = 10\nwarmup_s = 9");
    assert!(Scenario::from_toml(&format!("{whole}[[expect]]\ntenant = \"a\"\nmetric = \"iops\"\nabove = 1\n"), None)
        .is_ok());
}

/// `ratio` without `ratio_to`, and `within_pct` without a target, were ignored: the check ran without
/// them (a review's f10_rate passed `below` alone). Both are refused, naming the key and its value.
#[test]
fn a_ratio_or_tolerance_with_nothing_to_apply_to_is_refused() {
    let expect = |e: &str| format!("{BASE}[[expect]]\n{e}\n");
    has(
        &expect("tenant = \"a\"\nmetric = \"iops\"\nratio = 2\nbelow = 100000"),
        "expect[0]: ratio = 2 without ratio_to",
    );
    has(
        &expect("tenant = \"a\"\nmetric = \"iops\"\nwithin_pct = 1\nbelow = 100000"),
        "expect[0]: within_pct = 1 without a target: give one of equals, oracle, ratio_to",
    );
    has(&expect("server = \"s1\"\nmetric = \"iops\"\nwithin_pct = 1\nabove = 1"), "within_pct = 1 without a target");
}

/// A tenant that completes nothing (one 1 GiB request at 10 MB/s, 100 s, in a 3 s run beside a closed
/// loop) has no latency: a latency bound on it fails, saying so, where it passed
/// on the empty histogram's 0. The oracle owes it its share (it has a request waiting all run), where it
/// left it out and a check at its 0 IOPS passed (a review's f2_starved).
#[test]
fn a_tenant_with_no_completions_fails_its_latency_and_oracle_checks() {
    let text = r#"
name = "starved"
duration_s = 3
[[servers]]
name = "s1"
capacity_iops = 1000
transfer_mb_s = 10
[[tenants]]
name = "hog"
[tenants.workload]
kind = "closed"
[[tenants]]
name = "victim"
[tenants.workload]
kind = "closed"
outstanding = 1
size_kb = 1048576
[[expect]]
tenant = "victim"
metric = "latency_p99_ms"
below = 1
[[expect]]
tenant = "victim"
metric = "latency_mean_ms"
below = 1
[[expect]]
tenant = "victim"
metric = "iops"
oracle = true
within_pct = 1
"#;
    let sc = Scenario::from_toml(text, None).unwrap();
    let (totals, results) = rein_sim::run_and_check(&sc, &mut |_| {}).unwrap();
    assert_eq!(totals.summary.tenants[1].completed, 0);
    for r in &results[..2] {
        assert!(!r.ok && r.description.contains("NaN (no completions to measure)"), "{}", r.description);
    }
    assert!(!results[2].ok, "{}", results[2].description);
    assert!(results[2].description.contains("the oracle's"), "{}", results[2].description);
    // Its request holds the device, so the hog completes little; the victim is owed half of it.
    let (oracle, hog) = (totals.oracle_iops(0.0, 3.0)[1], totals.summary.tenants[0].iops);
    assert!(oracle > 0.0 && (oracle - hog / 2.0).abs() < 0.01 * hog, "the victim is owed a share: {oracle} of {hog}");
}

/// pShift's limit checks on a bucket without a limit could never fail: refused at load, naming the
/// bucket (or saying that no bucket has one).
#[test]
fn a_limit_check_without_a_limit_is_refused() {
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios/pshift-exp4-small.toml"))
        .unwrap()
        .replace("limit_iops = 2000\n", "");
    let checks = base.find("[[expect]]").unwrap();
    let without = |e: &str| format!("{}[[expect]]\n{e}\n", &base[..checks]);
    has(
        &without("tenant = \"b3\"\nmetric = \"limit_exceeded_fraction\"\nbelow = 0.5"),
        "expect[0]: limit_exceeded_fraction: tenant \"b3\" has no limit",
    );
    has(&without("metric = \"limit_exceeded_fraction\"\nbelow = 0.5"), "no bucket has a limit");
    has(&without("metric = \"limit_exceeded_fraction\"\ncount = \"servers\"\nbelow = 0.5"), "no bucket has a limit");
    assert!(Scenario::from_toml(&without("metric = \"reservation_met_fraction\"\nabove = 0.5"), None).is_ok());
}

/// A share of no bucket-periods (a window that holds no whole QoS period) is NaN and fails, as the
/// controller's tally of no closed period does, where it read 0 and `below` passed.
#[test]
fn a_period_check_over_no_period_fails() {
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios/pshift-exp4-small.toml"))
        .unwrap()
        .replace("duration_s = 4.2", "duration_s = 1.4");
    let checks = base.find("[[expect]]").unwrap();
    let text = format!(
        "{}[[expect]]\nmetric = \"limit_exceeded_fraction\"\nwindow = [0.2, 1.0]\nbelow = 0.5\n",
        &base[..checks]
    );
    let sc = Scenario::from_toml(&text, None).unwrap();
    let (_, results) = rein_sim::run_and_check(&sc, &mut |_| {}).unwrap();
    assert!(!results[0].ok, "{}", results[0].description);
    assert!(results[0].description.contains("share of 0 bucket-periods"), "{}", results[0].description);
    assert!(results[0].description.contains("NaN (no bucket-period to judge)"), "{}", results[0].description);
}

/// `server_reservations` above the tenant's limit raised the limit at that server (`l.max(r)`): the run
/// was of another tenant than the file's. Refused, naming the tenant, the server and both values.
#[test]
fn a_server_reservation_above_the_limit_is_refused() {
    let two = BASE.replace("[[tenants]]", "[[servers]]\nname = \"s2\"\ncapacity_iops = 1000\n[[tenants]]");
    has(
        &two.replace("name = \"a\"", "name = \"a\"\nlimit = 100\nserver_reservations = { s2 = 300 }"),
        "tenant a: server_reservations for \"s2\" (300) is above the tenant's limit (100)",
    );
    let ok = two.replace("name = \"a\"", "name = \"a\"\nlimit = 300\nserver_reservations = { s2 = 300 }");
    assert!(Scenario::from_toml(&ok, None).is_ok());
}

/// Routing shares whose sum overflows (1e308 + 1e308) made every share 0 after the division, and every
/// request went to the last server: refused, naming the tenant and the sum.
#[test]
fn routing_shares_whose_sum_overflows_are_refused() {
    let two = BASE.replace("[[tenants]]", "[[servers]]\nname = \"s2\"\ncapacity_iops = 1000\n[[tenants]]");
    has(
        &two.replace("name = \"a\"", "name = \"a\"\nrouting = { shares = { s1 = 1e308, s2 = 1e308 } }"),
        "tenant a: routing shares sum to inf",
    );
}

/// `[pshift.generate]` skipped the bounds of written workloads: a `size_kb` of 10^12 KiB (above 1 GiB) or
/// 10^-9 KiB (no byte), and a `demand_ratio` of 10^12 (10^15 IOPS a bucket) ran. Refused, naming the key.
#[test]
fn generated_buckets_keep_to_the_workload_bounds() {
    let gen = |extra: &str| {
        format!(
            "name = \"psgen\"\nduration_s = 6.0\n[pshift]\nperiod_s = 5.0\nstart_s = 1.0\n[pshift.generate]\n\
             buckets = 4\nactive_servers = 2\n{extra}\n[[servers]]\nname = \"s0\"\ncapacity_iops = 500\n\
             queue_depth = 1\n[[servers]]\nname = \"s1\"\ncapacity_iops = 500\nqueue_depth = 1\n"
        )
    };
    has(&gen("demand_ratio = 1.5\nsize_kb = 1e12"), "pshift.generate.size_kb must be at most 1 GiB");
    has(&gen("demand_ratio = 1.5\nsize_kb = 1e-9"), "pshift.generate.size_kb 1e-9 is less than one byte");
    has(&gen("demand_ratio = 1e12"), "pshift.generate.demand_ratio 1000000000000 x a reservation of");
    has(&gen("demand_ratio = 1e12"), "is above the bound of 10000000 IOPS");
    assert!(Scenario::from_toml(&gen("demand_ratio = 1.5\nsize_kb = 1048576"), None).is_ok());
}

/// The scenario's `name` and an expectation's `note` are printed in the report (the name heads it, a note
/// follows its check's line): a line break or escape in either forged a line (`ok` under a miss). Refused
/// as in tenant names, naming the key.
#[test]
fn a_scenario_name_or_note_cannot_forge_output_lines() {
    let e = err(&BASE.replace("name = \"t\"", "name = \"t\\nall 3 expectations met\""));
    assert!(e.contains("name \"t\\nall 3 expectations met\" has a control character"), "{e}");
    has(&BASE.replace("name = \"t\"", "name = \"t\\u001b[2K\""), "has a control character");
    let expect =
        format!("{BASE}[[expect]]\ntenant = \"a\"\nmetric = \"iops\"\nabove = 1\nnote = \"x\\n  ok   forged\"\n");
    has(&expect, "expect[0]: note \"x\\n  ok   forged\" has a control character");
    assert!(Scenario::from_toml(&expect.replace("\\n", " "), None).is_ok());
}

/// Tenants naming one trace share one copy of its records (a review's f6_trace: seventy tenants on one
/// 50 MB trace loaded it seventy times, gigabytes).
#[test]
fn tenants_on_one_trace_share_its_records() {
    // Removed when dropped, also when an assertion fails.
    let tmp = tempfile::Builder::new().prefix("rein-sim-shared-trace-").tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::write(dir.join("t.trace"), "0 0 0 8 1\n1000000 0 8 8 1\n").unwrap();
    let mut text =
        String::from("name = \"shared\"\nduration_s = 1\n[[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n");
    for t in 0..3 {
        text += &format!(
            "[[tenants]]\nname = \"t{t}\"\n[tenants.workload]\nkind = \"trace\"\ntrace = {{ path = \"t.trace\" }}\n"
        );
    }
    let sc = Scenario::from_toml(&text, Some(&dir)).unwrap();
    let records = |t: usize| match &sc.tenants()[t].workload.kind {
        rein_model::WorkloadKind::Trace { records, .. } => std::sync::Arc::clone(records),
        _ => unreachable!(),
    };
    assert!(std::sync::Arc::ptr_eq(&records(0), &records(1)) && std::sync::Arc::ptr_eq(&records(0), &records(2)));
}

/// A FIFO as a scenario's or a trace's path hung `rein sim` in its open (a review's f9_fifo): refused,
/// naming the file and what it is. Each load runs apart, so a regression fails rather than hangs.
#[test]
fn a_fifo_as_a_scenario_or_trace_is_refused_not_waited_on() {
    // Removed when dropped, also when an assertion fails.
    let tmp = tempfile::Builder::new().prefix("rein-sim-fifo-").tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let fifo = dir.join("fifo.trace");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let scenario = dir.join("fifo.toml");
    std::fs::write(&scenario, BASE.replace("kind = \"closed\"", "kind = \"trace\"\ntrace = { path = \"fifo.trace\" }"))
        .unwrap();
    let load = |path: std::path::PathBuf| {
        let (tx, rx) = std::sync::mpsc::channel();
        // The error and its causes, as `rein` prints them.
        let chain = |e: rein_sim::model::ScenarioError| {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text += &format!(": {c}");
                cause = c.source();
            }
            text
        };
        std::thread::spawn(move || tx.send(Scenario::load(&path).map(|_| ()).map_err(chain)));
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        if got.is_err() {
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        got.expect("the load returned: it did not wait on the FIFO").unwrap_err()
    };
    let e = load(scenario.clone());
    assert!(e.contains("cannot read trace") && e.contains("fifo.trace: it is a FIFO, not a regular file"), "{e}");
    let e = load(fifo.clone());
    assert!(e.contains("cannot read scenario") && e.contains("fifo.trace: it is a FIFO, not a regular file"), "{e}");
}

/// An open loop behind a long network delay held every request on its way in memory (a review's
/// f3_net: 10^7 IOPS x 10 s, 10^8 requests): the open loops' rate x delay is bounded, naming the tenant
/// and the product; a closed loop's window bounds its own.
#[test]
fn requests_on_the_network_at_once_are_bounded() {
    let net = |delay: &str, workload: &str| {
        BASE.replace("duration_s = 10", &format!("duration_s = 10\nnetwork = {{ delay_ms = {delay} }}"))
            .replace("kind = \"closed\"", workload)
    };
    let e = err(&net("10000", "kind = \"open\"\niops = 1e7"));
    assert!(
        e.contains("network.delay_ms 10000 x the open loops' rates: 100000000 requests would be on the network at once (tenant a's 100000000,"),
        "{e}"
    );
    assert!(e.contains("above the bound of 1000000"), "{e}");
    let e = err(&net("10000", "kind = \"burst\"\nburst_count = 1000\nburst_period_ms = 1"));
    assert!(e.contains("tenant a's 10000000,"), "{e}");
    assert!(Scenario::from_toml(&net("100", "kind = \"open\"\niops = 1e7"), None).is_ok(), "the bound itself");
    assert!(Scenario::from_toml(&net("10000", "kind = \"closed\"\noutstanding = 65536"), None).is_ok());
}
