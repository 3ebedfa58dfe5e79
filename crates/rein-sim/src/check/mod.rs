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

pub use sabotage::Sabotage;

use crate::model::expect::{Expectation, Subject, TenantTarget};
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
    let (who, metric, whole_run, measured, target) = match e.subject {
        Subject::Tenant { tenant, metric, target } => {
            let target = match target {
                None => None,
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
            (who, metric.name(), false, m, equals(v))
        }
        Subject::Periods { tenant, metric, threshold_pct, at_servers: false, equals: v } => {
            let (who, m) = pshift::period_metric(sc, run, tenant, metric, threshold_pct, a, b);
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
    let (ok, expected) = judge(measured, target, e);
    CheckResult {
        ok,
        description: format!("{who}: {metric} {window} = {measured:.3}, expected {expected}"),
        measured,
        note: e.note.clone(),
    }
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
}
