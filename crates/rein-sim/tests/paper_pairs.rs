//! Paper claims that compare two runs, which one scenario's `[[expect]]` checks cannot say: each test runs a
//! scenario and its twin (the same workload with one setting changed) and compares what the paper compares.
//! The numbers the papers give for these claims are in figure images only; the tests check the direction
//! and, where the text says "much", a margin, and print both runs' numbers.
use rein_model::report::TenantMetric;
use rein_sim::{run, RunTotals, Scenario};
use std::path::Path;

fn run_file(name: &str) -> (Scenario, RunTotals) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios").join(name);
    let sc = Scenario::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let r = run(&sc, &mut |_| {}).unwrap();
    (sc, r)
}

fn metric(sc: &Scenario, r: &RunTotals, tenant: &str, m: TenantMetric, a: f64, b: f64) -> f64 {
    r.tenant_metric(sc.tenant_index(tenant).unwrap(), m, a, b)
}

/// RBFQ §4.2 websearch1 (rbfq-repair.txt): "f2 sees much higher latencies when reservation for f1 is
/// increased to 100 IOPS. This is because most of the server capacity is dedicated to f1 and RBFQ prefers
/// meeting local guarantees over global fairness." Fig. 10(c)'s values are in the image only.
///
/// Also, with f1's local requirement at 20, RBFQ's global fairness (f1's service at s2 carried to s1 by
/// delta, equal weights) puts f1's requests at s1 behind f2's: f1's mean latency is above f2's although
/// half of f1's requests go to the idle-ish s2. Without delta both flows would be equal at s1, and f1's
/// mean (half of it at s2) would be below f2's.
#[test]
fn websearch1_f2_waits_longer_when_f1_reserves_100() {
    let (sc20, r20) = run_file("rbfq-sec4-2-websearch1-r20.toml");
    let (sc100, r100) = run_file("rbfq-sec4-2-websearch1-r100.toml");
    let (a, b) = (1.0, 22.0); // the files' warm-up and duration
    let f2_20 = metric(&sc20, &r20, "f2", TenantMetric::LatencyMeanMs, a, b);
    let f2_100 = metric(&sc100, &r100, "f2", TenantMetric::LatencyMeanMs, a, b);
    let f2_p99_20 = metric(&sc20, &r20, "f2", TenantMetric::LatencyP99Ms, a, b);
    let f2_p99_100 = metric(&sc100, &r100, "f2", TenantMetric::LatencyP99Ms, a, b);
    let f1_20 = metric(&sc20, &r20, "f1", TenantMetric::LatencyMeanMs, a, b);
    eprintln!(
        "f2 mean {f2_20:.2} -> {f2_100:.2} ms, p99 {f2_p99_20:.1} -> {f2_p99_100:.1} ms; f1 mean (r=20) {f1_20:.2}"
    );
    assert!(f2_100 > 1.1 * f2_20, "f2 mean latency {f2_100:.2} ms with f1 at 100, {f2_20:.2} ms at 20");
    assert!(f2_p99_100 > 1.1 * f2_p99_20, "f2 p99 {f2_p99_100:.1} ms with f1 at 100, {f2_p99_20:.1} ms at 20");
    assert!(f1_20 > 1.5 * f2_20, "r = 20: f1 {f1_20:.2} ms, f2 {f2_20:.2} ms: f1's s2 service should count at s1");
}

/// mClock Fig. 8(c) (mclock-dmclock.txt §4.1.5): "mClock was able to provide higher operations/sec and
/// lower latency per operation in OLTP VMs, even with an increase in the overall IO contention." The
/// Filebench numbers are in the figure image only, and the simulator has no Filebench: an OLTP "operation"
/// here is one IO of the VM's closed loop, so ops/s is its IOPS and latency per operation its mean IO
/// latency, both after the Iometer VM starts (125-240 s), mClock (`mclock-fig8`) against SFQ
/// (`mclock-fig8-sfq`).
///
/// Where the model differs: OLTP1 (weight 2) gets 526 IOPS under SFQ at 1,050 IOPS (2/4 of the
/// capacity) and 500 under mClock (eq. (1): OLTP2's reservation of 500 leaves OLTP1 and the Iometer VM
/// 550, split 2:1 below OLTP1's own reservation, so OLTP1 is held at 500 and the Iometer VM gets 50), so
/// OLTP1 alone does slightly worse under mClock; the claim holds for OLTP2 and for the OLTP VMs together.
#[test]
fn fig8c_oltp_ops_higher_and_latency_lower_with_mclock() {
    let (sm, rm) = run_file("mclock-fig8.toml");
    let (ss, rs) = run_file("mclock-fig8-sfq.toml");
    let (a, b) = (125.0, 240.0);
    let get = |sc: &Scenario, r: &RunTotals, t: &str| {
        (metric(sc, r, t, TenantMetric::Iops, a, b), metric(sc, r, t, TenantMetric::LatencyMeanMs, a, b))
    };
    let (m1, m2) = (get(&sm, &rm, "oltp1"), get(&sm, &rm, "oltp2"));
    let (s1, s2) = (get(&ss, &rs, "oltp1"), get(&ss, &rs, "oltp2"));
    eprintln!("mClock oltp1 {m1:?} oltp2 {m2:?}; SFQ oltp1 {s1:?} oltp2 {s2:?} (IOPS, mean ms)");
    assert!(m2.0 > 1.5 * s2.0, "OLTP2 ops/s: mClock {:.0}, SFQ {:.0}", m2.0, s2.0);
    assert!(m2.1 < 0.75 * s2.1, "OLTP2 latency: mClock {:.1} ms, SFQ {:.1} ms", m2.1, s2.1);
    let ops = |x: (f64, f64), y: (f64, f64)| x.0 + y.0;
    // IO-weighted mean latency of the two OLTP VMs.
    let lat = |x: (f64, f64), y: (f64, f64)| (x.0 * x.1 + y.0 * y.1) / (x.0 + y.0);
    assert!(ops(m1, m2) > 1.1 * ops(s1, s2), "OLTP ops/s: mClock {:.0}, SFQ {:.0}", ops(m1, m2), ops(s1, s2));
    assert!(lat(m1, m2) < 0.9 * lat(s1, s2), "OLTP latency: mClock {:.1}, SFQ {:.1} ms", lat(m1, m2), lat(s1, s2));
}

/// RBFQ §4.2 oltp1 (rbfq-repair.txt), on the stand-in TPC-C sample: "Note that the latency is reduced when
/// we provide better isolation by doubling the weight and adding a reservation. Also RBFQ is very effective
/// in absorbing bursts compared to the case with no differentiation." Fig. 9(c)'s values are in the image
/// only: the test asks for f1's mean and p99 latency to fall by at least a fifth from setting (a) (w1 = 1,
/// M = 10) to (b) (w1 = 2, M = 200).
#[test]
fn oltp_f1_latency_falls_with_weight_and_reservation() {
    let (sa, ra) = run_file("rbfq-sec4-2-oltp-a.toml");
    let (sb, rb) = run_file("rbfq-sec4-2-oltp-b.toml");
    let (a, b) = (1.0, 21.8); // the files' warm-up and duration
    let mean_a = metric(&sa, &ra, "f1", TenantMetric::LatencyMeanMs, a, b);
    let mean_b = metric(&sb, &rb, "f1", TenantMetric::LatencyMeanMs, a, b);
    let p99_a = metric(&sa, &ra, "f1", TenantMetric::LatencyP99Ms, a, b);
    let p99_b = metric(&sb, &rb, "f1", TenantMetric::LatencyP99Ms, a, b);
    eprintln!("f1 mean {mean_a:.2} -> {mean_b:.2} ms, p99 {p99_a:.1} -> {p99_b:.1} ms");
    assert!(mean_b < 0.8 * mean_a, "f1 mean latency: (a) {mean_a:.2} ms, (b) {mean_b:.2} ms");
    assert!(p99_b < 0.8 * p99_a, "f1 p99 latency: (a) {p99_a:.1} ms, (b) {p99_b:.1} ms");
}
