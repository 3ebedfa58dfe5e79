//! pShift expectations: shares of (bucket, QoS period) pairs that met their reservation or exceeded their
//! limit (the rule is rein-model's reservation meter).

use crate::model::Scenario;
use rein_model::report::PeriodMetric;
use rein_model::RunTotals;

/// A period metric over the QoS periods inside [a, b]: (who it is about, in words; the share).
pub(super) fn period_metric(
    sc: &Scenario,
    run: &RunTotals,
    tenant: Option<usize>,
    metric: PeriodMetric,
    threshold_pct: f64,
    a: f64,
    b: f64,
) -> (String, f64) {
    let tenants: Vec<usize> = match tenant {
        Some(t) => vec![t],
        None => (0..sc.tenants.len()).collect(),
    };
    let ps = sc.pshift.as_ref().expect("validated: period metrics need [pshift]");
    let (n, f) = run.tenant_periods(&tenants, &ps.periods_in(a, b), metric, threshold_pct);
    let who = match tenant {
        Some(t) => format!("tenant {}", sc.tenants[t].name),
        None => format!("{} buckets", tenants.len()),
    };
    let what = match metric {
        PeriodMetric::ReservationMetFraction => format!(">= {threshold_pct}% of the reservation"),
        PeriodMetric::LimitExceededFraction => format!("> limit + {threshold_pct}%"),
    };
    (format!("{who}: share of {n} bucket-periods with {what}"), f)
}
