//! pShift expectations: shares of (bucket, QoS period) pairs that met their reservation or exceeded their
//! limit (the rule is rein-model's reservation meter), as the load saw them in each QoS period of the
//! run's clock, or (`count = "servers"`) as the controller tallied the periods it closed by the servers'
//! own counts (rein-core's controller, "Periods counted at the servers"): there a period is met when the
//! bucket completed at least R_i and exceeded when more than L_i, and a period with a report missing
//! (not judged by the tally) counts as neither met nor within its limit.

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
    let who = who(sc, tenant);
    let what = match metric {
        PeriodMetric::ReservationMetFraction => format!(">= {threshold_pct}% of the reservation"),
        PeriodMetric::LimitExceededFraction => format!("> limit + {threshold_pct}%"),
    };
    (format!("{who}: share of {n} bucket-periods with {what}"), f)
}

/// A period metric over the controller's tally of closed periods (`count = "servers"`): (who, in words;
/// the share). No closed period (a run without the controller's tally) gives NaN, which no bound admits.
pub(super) fn servers_period_metric(
    sc: &Scenario,
    run: &RunTotals,
    tenant: Option<usize>,
    metric: PeriodMetric,
) -> (String, f64) {
    let tallies: Vec<&rein_model::report::rounds::PeriodCounts> = match tenant {
        Some(t) => run.periods.iter().filter(|(n, _)| *n == sc.tenants[t].name).map(|(_, c)| c).collect(),
        None => run.periods.iter().map(|(_, c)| c).collect(),
    };
    let n: u64 = tallies.iter().map(|c| c.closed).sum();
    let hit: u64 = match metric {
        PeriodMetric::ReservationMetFraction => {
            tallies.iter().map(|c| c.closed.saturating_sub(c.below_reservation + c.incomplete)).sum()
        }
        PeriodMetric::LimitExceededFraction => tallies.iter().map(|c| c.above_limit + c.incomplete).sum(),
    };
    let who = who(sc, tenant);
    let what = match metric {
        PeriodMetric::ReservationMetFraction => "the reservation met",
        PeriodMetric::LimitExceededFraction => "the limit passed",
    };
    let share = if n > 0 { hit as f64 / n as f64 } else { f64::NAN };
    (format!("{who}: share of {n} bucket-periods with {what}, by the servers' counts"), share)
}

/// Who a period metric is about, in words: one tenant, or every bucket.
fn who(sc: &Scenario, tenant: Option<usize>) -> String {
    match tenant {
        Some(t) => format!("tenant {}", sc.tenants[t].name),
        None => format!("{} buckets", sc.tenants.len()),
    }
}
