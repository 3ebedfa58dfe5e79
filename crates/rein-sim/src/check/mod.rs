//! The check layer: a run judged against its scenario's expectations (`rein sim --check`).
//!
//! [`check`] is a pure function of the scenario, the run's totals and, for expectations that compare a
//! PARDA scenario with its no-PARDA twin (`uncontrolled = true`), that twin's totals: the caller asks
//! [`baseline_scenario`] whether one is needed and runs it. Each expectation yields one [`CheckResult`]
//! with the measured and expected values and a one-line description; a run passes when every result
//! does. [`Sabotage`] runs a scenario with a deliberately wrong scheduler, to show its checks can fail.

mod parda;
mod pshift;
pub mod sabotage;

pub use sabotage::{Sabotage, UnknownSabotage};

use crate::model::expect::{Expectation, Rank, Subject, TenantTarget};
use crate::model::Scenario;
use rein_model::RunTotals;
use serde::Serialize;

/// The verdict on one expectation.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CheckResult {
    /// Whether it holds.
    pub ok: bool,
    /// What was measured and expected, in one line.
    pub description: String,
    /// The measured value.
    pub measured: f64,
    /// What the paper says (the expectation's note).
    pub note: Option<String>,
}

/// The run an expectation needs besides the scenario's own: the scenario without PARDA, if any
/// expectation compares with the uncontrolled run.
pub fn baseline_scenario(sc: &Scenario) -> Option<Scenario> {
    sc.expect.iter().any(Expectation::needs_uncontrolled).then(|| sc.without_parda())
}

/// Evaluates every expectation of `sc` against `run`; `baseline` is the run of
/// [`baseline_scenario`]`(sc)` when it asks for one (expectations that need it fail without it).
pub fn check(sc: &Scenario, run: &RunTotals, baseline: Option<&RunTotals>) -> Vec<CheckResult> {
    sc.expect.iter().map(|e| check_one(sc, run, e, baseline)).collect()
}

/// The window an expectation is judged over: its own, or from the warm-up to the end.
fn window(sc: &Scenario, e: &Expectation) -> [f64; 2] {
    e.window.unwrap_or([sc.warmup.as_secs_f64(), sc.duration.as_secs_f64()])
}

fn check_one(sc: &Scenario, run: &RunTotals, e: &Expectation, baseline: Option<&RunTotals>) -> CheckResult {
    let [a, b] = window(sc, e);
    let equals = |v: Option<f64>| v.map(|v| (v, format!("{v}")));
    // What the measurement covers when it is not a window.
    let mut over: Option<&str> = None;
    // A rank: (holds, in words) beside the judged bounds.
    let mut ranked: Option<(bool, String)> = None;
    // Why a measurement is NaN (a miss whatever the bounds), in words.
    let mut nan_means = "nothing to measure";
    let (who, metric, whole_run, measured, target) = match e.subject {
        Subject::Tenant { tenant, metric, target } => {
            let target = match target {
                None => None,
                Some(TenantTarget::Rank(rank)) => {
                    ranked = Some(rank_among(sc, run, tenant, metric, rank, a, b));
                    None
                }
                Some(TenantTarget::Equals(v)) => equals(Some(v)),
                Some(TenantTarget::Oracle) => {
                    let v = run.oracle_iops(a, b)[tenant];
                    Some((v, format!("the oracle's {v:.1}")))
                }
                Some(TenantTarget::Ratio { tenant: other, ratio }) => {
                    let v = run.tenant_metric(other, metric, a, b) * ratio;
                    Some((v, format!("{ratio} x {}'s = {v:.2}", sc.tenants[other].name)))
                }
            };
            let who = format!("tenant {}", sc.tenants[tenant].name);
            nan_means = "no completions to measure";
            (who, metric.name(), metric.whole_run(), run.tenant_metric(tenant, metric, a, b), target)
        }
        Subject::Server { server, metric, equals: v } => (
            format!("server {}", sc.servers[server].name),
            metric.name(),
            metric == rein_model::report::ServerMetric::Utilisation,
            run.server_metric(server, metric, a, b),
            equals(v),
        ),
        Subject::Periods { tenant, metric, at_servers: true, equals: v, .. } => {
            let (who, m) = pshift::servers_period_metric(sc, run, tenant, metric);
            over = Some("over the closed periods");
            nan_means = "no closed period to judge";
            (who, metric.name(), false, m, equals(v))
        }
        Subject::Periods { tenant, metric, threshold_pct, at_servers: false, equals: v } => {
            let (who, m) = pshift::period_metric(sc, run, tenant, metric, threshold_pct, a, b);
            nan_means = "no bucket-period to judge";
            (who, metric.name(), false, m, equals(v))
        }
        Subject::Host { who, metric, band_pct, target } => {
            return parda::check_one(sc, run, e, parda::HostCheck { who, metric, band_pct, target }, baseline)
        }
    };
    let window = match over {
        Some(o) => o.to_string(),
        None if whole_run => String::from("after warm-up"),
        None => format!("in [{a}, {b}] s"),
    };
    let (mut ok, mut expected) = judge(measured, target, e);
    if let Some((holds, words)) = ranked {
        ok &= holds;
        expected = if expected.is_empty() { words } else { format!("{words} and {expected}") };
    }
    // No bound admits NaN, but a check must not pass on it whatever it asks, and says why.
    ok &= !measured.is_nan();
    let measured_text = if measured.is_nan() { format!("NaN ({nan_means})") } else { format!("{measured:.3}") };
    CheckResult {
        ok,
        description: format!("{who}: {metric} {window} = {measured_text}, expected {expected}"),
        measured,
        note: e.note.clone(),
    }
}

/// [`TenantTarget::Rank`]: whether `tenant`'s `metric` over `[a, b]` is strictly below (above) every other
/// tenant's, and the nearest other tenant in words. A value that is not a number ranks nowhere.
fn rank_among(
    sc: &Scenario,
    run: &RunTotals,
    tenant: usize,
    metric: rein_model::report::TenantMetric,
    rank: Rank,
    a: f64,
    b: f64,
) -> (bool, String) {
    let v = run.tenant_metric(tenant, metric, a, b);
    let others = (0..sc.tenants.len()).filter(|&i| i != tenant).map(|i| (i, run.tenant_metric(i, metric, a, b)));
    // The nearest competitor: the smallest other value for `Lowest`, the largest for `Highest`; the rank
    // holds only between numbers.
    let key = |x: f64| match rank {
        Rank::Lowest => x,
        Rank::Highest => -x,
    };
    let next = others.min_by(|x, y| key(x.1).total_cmp(&key(y.1)).then(x.0.cmp(&y.0)));
    let Some((i, n)) = next else {
        return (false, String::from("a rank among tenants (there is no other tenant)"));
    };
    let (word, holds) = match rank {
        Rank::Lowest => ("lowest", v < n),
        Rank::Highest => ("highest", v > n),
    };
    (
        holds && v.is_finite() && n.is_finite(),
        format!("the {word} of every tenant's (the next: {}'s {n:.3})", sc.tenants[i].name),
    )
}

/// Judges a measurement against an expectation: within `within_pct` of the target (value, how to name
/// it), below `below`, above `above`. Returns the verdict and what was expected, in words.
fn judge(measured: f64, target: Option<(f64, String)>, e: &Expectation) -> (bool, String) {
    let mut ok = true;
    let mut parts = Vec::new();
    if let (Some((v, label)), Some(pct)) = (target, e.within_pct) {
        // A target or measurement that is not a number (an eq. (3) latency with no capacity left, a
        // convergence that never came) is a miss: inf is "within any percent" of inf.
        ok &= v.is_finite() && measured.is_finite() && (measured - v).abs() <= v.abs() * pct / 100.0 + 1e-9;
        parts.push(format!("within {pct}% of {label}"));
    }
    if let Some(x) = e.below {
        ok &= measured < x;
        parts.push(format!("below {x}"));
    }
    if let Some(x) = e.above {
        ok &= measured > x;
        parts.push(format!("above {x}"));
    }
    (ok, parts.join(" and "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::expect::Subject;
    use rein_model::report::TenantMetric;

    fn within(pct: f64) -> Expectation {
        Expectation {
            subject: Subject::Tenant { tenant: 0, metric: TenantMetric::Iops, target: Some(TenantTarget::Equals(0.0)) },
            window: None,
            within_pct: Some(pct),
            below: None,
            above: None,
            note: None,
        }
    }

    #[test]
    fn a_target_or_measurement_that_is_not_finite_is_a_miss() {
        let e = within(3.0);
        assert!(judge(100.0, Some((101.0, "x".into())), &e).0);
        assert!(!judge(0.0, Some((f64::INFINITY, "x".into())), &e).0, "inf target, 0 measured");
        assert!(!judge(f64::INFINITY, Some((f64::INFINITY, "x".into())), &e).0, "inf within 3% of inf");
        assert!(!judge(f64::NAN, Some((1.0, "x".into())), &e).0);
    }

    /// `rank`: three open tenants at 100, 200 and 300 IOPS on a device with room for all: the first is
    /// the lowest, the third the highest, and every other claim fails; `below` still applies beside it.
    #[test]
    fn a_rank_holds_only_at_the_end_it_names() {
        let mut text = String::from(
            "name = \"rank\"\nduration_s = 10.0\nwarmup_s = 1.0\nscheduler = \"fifo\"\n\
             [[servers]]\nname = \"s\"\ncapacity_iops = 10000\n",
        );
        for (t, iops) in [("a", 100), ("b", 200), ("c", 300)] {
            text += &format!("[[tenants]]\nname = \"{t}\"\n[tenants.workload]\nkind = \"open\"\niops = {iops}\n");
        }
        let claims = [("a", "lowest", true), ("c", "highest", true), ("b", "lowest", false), ("b", "highest", false)];
        for (t, rank, _) in claims {
            text += &format!("[[expect]]\ntenant = \"{t}\"\nmetric = \"iops\"\nrank = \"{rank}\"\n");
        }
        text += "[[expect]]\ntenant = \"a\"\nmetric = \"iops\"\nrank = \"lowest\"\nbelow = 50\n";
        let sc = Scenario::from_toml(&text, None).unwrap();
        let (_, results) = crate::run_and_check(&sc, &mut |_| {}).unwrap();
        for ((t, rank, holds), r) in claims.iter().zip(&results) {
            assert_eq!(r.ok, *holds, "{t} {rank}: {}", r.description);
        }
        assert!(
            results[0].description.contains("the lowest of every tenant's (the next: b's"),
            "{}",
            results[0].description
        );
        assert!(!results[4].ok, "the lowest, but not below 50: {}", results[4].description);
        // What the file may say.
        let bad = |extra: &str| {
            let t = format!("{text}[[expect]]\ntenant = \"a\"\nmetric = \"iops\"\n{extra}\n");
            Scenario::from_toml(&t, None).unwrap_err().to_string()
        };
        assert!(bad("rank = \"least\"").contains("rank \"least\": expected lowest or highest"));
        assert!(bad("rank = \"lowest\"\nwithin_pct = 5").contains("no within_pct"));
        assert!(
            bad("rank = \"lowest\"\nequals = 5\nwithin_pct = 5").contains("use one of equals, oracle, ratio_to, rank")
        );
        let t = format!("{text}[[expect]]\nserver = \"s\"\nmetric = \"iops\"\nrank = \"lowest\"\n");
        assert!(Scenario::from_toml(&t, None).unwrap_err().to_string().contains("rank compares tenants'"));
    }
}
