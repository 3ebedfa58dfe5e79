//! Scheduler settings (`[mclock]`) in scenarios: parsing, inheritance from the scenario to its servers,
//! errors naming the field, and a setting that changes what a run does (issue 11, point 3).
mod common;

use common::err;
use rein_core::{CostModel, LimitMode, ReservationLag, SchedConfig};
use rein_sim::{run, Scenario};
use std::path::Path;

const BASE: &str = r#"
name = "t"
duration_s = 10
[[servers]]
name = "s1"
capacity_iops = 1000
[[servers]]
name = "s2"
capacity_iops = 1000
[[tenants]]
name = "a"
[tenants.workload]
kind = "closed"
"#;

/// `BASE` with `top` after `duration_s` and `s2` lines after its name.
fn with(top: &str, s2: &str) -> String {
    BASE.replace("duration_s = 10\n", &format!("duration_s = 10\n{top}\n"))
        .replace("name = \"s2\"\n", &format!("name = \"s2\"\n{s2}\n"))
}

#[test]
fn defaults_without_a_table() {
    let sc = Scenario::from_toml(BASE, None).unwrap();
    assert_eq!(sc.sched(), SchedConfig::default());
    assert!(sc.servers().iter().all(|s| s.sched == SchedConfig::default()));
}

#[test]
fn servers_inherit_the_scenario_table_field_by_field() {
    let top = "[mclock]\npreset = \"paper\"\nbatch = 8\ncost_model = { tm_ms = 5, bpeak_mb_s = 60 }\n";
    // A top-level table ends at the next table header, so the server's table is written inline.
    let text = with("", "mclock = { batch = 2, limit_mode = \"break_when_idle\" }")
        .replace("[[servers]]\nname = \"s1\"", &format!("{top}\n[[servers]]\nname = \"s1\""));
    let sc = Scenario::from_toml(&text, None).unwrap();
    let paper = SchedConfig { batch: 8, cost_model: CostModel::paper_disk(), ..SchedConfig::paper() };
    assert_eq!(sc.sched(), paper);
    assert_eq!(sc.servers()[0].sched, paper);
    let s2 = sc.servers()[1].sched;
    assert_eq!((s2.batch, s2.limit_mode), (2, LimitMode::BreakWhenIdle));
    assert_eq!(s2.reservation_lag, ReservationLag::Arrival);
    assert_eq!(s2.cost_model, CostModel::paper_disk());
}

#[test]
fn shorthands_fold_into_the_table() {
    let sc = Scenario::from_toml(&with("cost_model = \"bytes\"", "batch = 8\nlimit_mode = \"break_when_idle\""), None)
        .unwrap();
    assert_eq!(sc.servers()[1].sched.cost_model, CostModel::BYTES);
    assert_eq!((sc.servers()[1].sched.batch, sc.servers()[1].sched.limit_mode), (8, LimitMode::BreakWhenIdle));
    assert_eq!(sc.servers()[0].sched.batch, 1);
}

#[test]
fn errors_name_the_field_and_the_value() {
    let e = err(&with("", "mclock = { weight_lead_ios = -1 }"));
    assert!(e.contains("server s2: mclock.weight_lead_ios = -1: expected an IO count"), "{e}");
    let e = err(&with("[mclock]\nreservation_lag = \"later\"", ""));
    assert!(e.contains("mclock.reservation_lag = \"later\": expected \"arrival\""), "{e}");
    let e = err(&with("[mclock]\nlimit_mode = \"soft\"", ""));
    assert!(e.contains("mclock.limit_mode = \"soft\""), "{e}");
    let e = err(&with("", "batch = 0"));
    assert!(e.contains("server s2: mclock.batch = 0: expected 1..=1024"), "{e}");
    let e = err(&with("", "batch = 4\nmclock = { batch = 8 }"));
    assert!(e.contains("server s2: batch is given twice"), "{e}");
    let e = err(&with("", "mclock = { cost_model = \"bytes\" }"));
    assert!(e.contains("mclock.cost_model is scenario-wide"), "{e}");
    let e = err(&with("cost_model = \"io\"\n[mclock]\ncost_model = \"io\"", ""));
    assert!(e.contains("cost_model is given twice"), "{e}");
    let e = err(&with("[mclock]\npreset = \"paper2009\"", ""));
    assert!(e.contains("mclock.preset = \"paper2009\""), "{e}");
    let e = err(&with("[mclock]\nlag = \"1s\"", ""));
    assert!(e.contains("unknown field `lag`"), "{e}");
}

/// The overload scenario (capacity at half the reservations for 60 s, then above them): with the default
/// bound the unreserved t2 gets its eq. (1) rate (800) right after the overload; with
/// `reservation_lag = "unbounded"` the whole debt (about 18,000 IOs) is repaid first and t2 is starved for
/// seconds. Targets from eq. (1) and from the size of the debt, not from a run.
#[test]
fn reservation_lag_changes_recovery_after_overload() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/mclock-overload-recovery.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let t2_after = |text: &str| {
        let sc = Scenario::from_toml(text, None).unwrap();
        let t2 = sc.tenant_index("t2").unwrap();
        let r = run(&sc, &mut |_| {}).unwrap();
        (r.timeseries.iops(t2, 71.0, 73.0), r.timeseries.iops(t2, 90.0, 100.0))
    };
    let unbounded = text.replace("[[servers]]", "[mclock]\nreservation_lag = \"unbounded\"\n\n[[servers]]");
    assert_ne!(unbounded, text);
    let (bounded_early, bounded_late) = t2_after(&text);
    let (unbounded_early, unbounded_late) = t2_after(&unbounded);
    assert!((bounded_early - 800.0).abs() < 40.0, "default: t2 at {bounded_early} IOPS just after the overload");
    // 18,000 IOs owed at 2,500 IOPS minus t3's 250: more than 7 s of repayment, t2 gets nothing meanwhile.
    assert!(unbounded_early < 40.0, "unbounded: t2 at {unbounded_early} IOPS just after the overload");
    // Both recover to eq. (1) once the debt is paid.
    assert!((bounded_late - 800.0).abs() < 40.0 && (unbounded_late - 800.0).abs() < 40.0);
}

/// mClock §3.1: batching "improves the overall efficiency of the system by scheduling IOs with high
/// locality as a batch", and "the delay in meeting reservations can be 8N IOs" only. On the disk model of
/// `mclock-table5-batch` (positioning times fitted to Table 5 with batching on), the same file with
/// `batch = 1` must lose throughput, and the bursty VM1 must still get its bounded demand either way.
/// Fails if batching does nothing (both runs equal) or if it starves the other tenant.
#[test]
fn batching_gains_throughput_on_the_disk_model() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/mclock-table5-batch.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let unbatched = text.replace("batch = 8\n", "batch = 1\n");
    assert_ne!(unbatched, text);
    let iops = |text: &str| {
        let sc = Scenario::from_toml(text, None).unwrap();
        let r = run(&sc, &mut |_| {}).unwrap();
        let (vm1, vm2) = (sc.tenant_index("vm1").unwrap(), sc.tenant_index("vm2").unwrap());
        (r.timeseries.iops(vm1, 10.0, 120.0), r.timeseries.iops(vm2, 10.0, 120.0))
    };
    let (b1, b2) = iops(&text);
    let (u1, u2) = iops(&unbatched);
    assert!(b2 > 1.15 * u2, "VM2 with batching {b2:.0} IOPS, without {u2:.0}: expected a locality gain");
    // VM1's demand: 128 IOs every 400 ms = 320 IOPS.
    for got in [b1, u1] {
        assert!((got - 320.0).abs() < 0.03 * 320.0, "VM1 {got:.0} IOPS, its demand is 320");
    }
}

/// Runs a Fig. 9(a) scenario (weights 1:4:6, no reservations) with `seed`: how far c1's IOPS are above 1/11
/// of the measured total (a fraction), and whether the file's check on c1 passed.
/// [`c1_excess_of_its_weight_share`] for `scenarios/<file>` as written (the default `pool_return`) and
/// with `pool_return = "off"` (the paper's re-base at every return).
fn c1_excess_with_and_without_pool_return(file: &str, seed: u64) -> ((f64, bool), (f64, bool)) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let off = text.replacen("[[servers]]", "[mclock]\npool_return = \"off\"\n\n[[servers]]", 1);
    assert_ne!(off, text);
    (c1_excess_of_its_weight_share(&text, seed), c1_excess_of_its_weight_share(&off, seed))
}

fn c1_excess_of_its_weight_share(text: &str, seed: u64) -> (f64, bool) {
    let sc = Scenario::from_toml(text, None).unwrap().with_seed(seed).unwrap();
    let (totals, checks) = rein_sim::run_and_check(&sc, &mut |_| {}).unwrap();
    let summary = &totals.summary;
    let total: f64 = summary.tenants.iter().map(|t| t.iops).sum();
    let c1 = summary.tenants.iter().find(|t| t.name == "c1").unwrap().iops;
    let c1_check = checks.iter().find(|c| c.description.starts_with("tenant c1")).unwrap().ok;
    (c1 / (total / 11.0) - 1.0, c1_check)
}

/// dmClock Fig. 9(a) with one pool of 64 IOs per client (`dmclock-fig9-noresv-pool`): "each client received
/// total service in proportion to its weight", so c1 gets 1/11 of the total (eq. (1), no reservations).
/// With the default `pool_return` a client whose pool moves between servers keeps its P tag and c1 is
/// within 1% of 1/11; with `pool_return = "off"` (the paper's re-base at every return) c1 is more than 3%
/// above it (seed 12: the worst of seeds 1-20 before the setting existed, 5.8%), and the file's 5% check
/// on c1 fails. Fails if the setting does nothing, or if the default loses the split.
#[test]
fn pool_return_keeps_the_weight_split_with_one_pool_per_client() {
    let ((rein, rein_ok), (paper, paper_ok)) =
        c1_excess_with_and_without_pool_return("dmclock-fig9-noresv-pool.toml", 12);
    assert!(rein.abs() < 0.01 && rein_ok, "default: c1 {:+.2}% of its 1/11 share", rein * 100.0);
    assert!(paper > 0.03 && !paper_ok, "pool_return off: c1 {:+.2}% of its 1/11 share", paper * 100.0);
}

/// The same with a hot spot that moves (`dmclock-fig9-noresv-pool-seq`): c1 reads sequentially over 1 MiB
/// stripes, so its pool of 64 sits on one server for about 128 IOs and then moves on, s1, s2, s3, s1, ...
/// By symmetry c1 still gets 1/11 of the total (its rate is the same at every server in the long run). With
/// the default `pool_return` c1 is within 1% of it (seeds 1-20: 0.4-0.8% below); with the paper's re-base
/// at every return it is 5.7% above on seed 1 (3.1-6.7% over seeds 1-20) and the file's 5% check fails.
#[test]
fn pool_return_keeps_the_weight_split_when_a_pool_moves_from_server_to_server() {
    let ((rein, rein_ok), (paper, paper_ok)) =
        c1_excess_with_and_without_pool_return("dmclock-fig9-noresv-pool-seq.toml", 1);
    assert!(rein.abs() < 0.01 && rein_ok, "default: c1 {:+.2}% of its 1/11 share", rein * 100.0);
    assert!(paper > 0.04 && !paper_ok, "pool_return off: c1 {:+.2}% of its 1/11 share", paper * 100.0);
}

/// RBFQ Fig. 8 (`rbfq-fig8-capacity`) with each IO's return to its closed loop delayed by 0.75 ms (a think
/// time standing in for a real client's round trip, which `rein cluster` runs have). vm2's queue at the
/// server then empties for a moment after completions while its other IOs are still at the device. With
/// the default `pool_return` the server counts them (`Request::pending_here`) and vm2 keeps its P tag: every
/// one of the file's checks holds (vm1 at eq. (1)'s 512 within 3 % before the drop). With
/// `pool_return = "off"` (the paper's re-base whenever the queue empties) vm1 takes the slots vm2's
/// returns are forgiven and misses that check (542.9 IOPS). Fails if the server stops counting, or if the
/// engine ignores the count.
#[test]
fn a_closed_loop_behind_a_round_trip_keeps_its_weight_share() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/rbfq-fig8-capacity.toml");
    let text = std::fs::read_to_string(&path).unwrap().replace("random_pct = 100", "random_pct = 100\nthink_ms = 0.75");
    let off = text.replacen("[[servers]]", "[mclock]\npool_return = \"off\"\n\n[[servers]]", 1);
    assert_ne!(off, text);
    let misses = |text: &str| {
        let sc = Scenario::from_toml(text, None).unwrap();
        let (_, checks) = rein_sim::run_and_check(&sc, &mut |_| {}).unwrap();
        checks.iter().filter(|c| !c.ok).map(|c| c.description.clone()).collect::<Vec<_>>()
    };
    let rein = misses(&text);
    assert!(rein.is_empty(), "default pool_return: {rein:?}");
    let paper = misses(&off);
    assert!(
        paper.iter().any(|d| d.starts_with("tenant vm1: iops in [4, 64]")),
        "pool_return off: vm1 should miss its reservation-level check, misses {paper:?}"
    );
}
