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
    let who = who(sc, tenant);
    // Validation takes period metrics only in a [pshift] scenario, but `check` is public and a scenario's
    // fields are too: one changed since has no QoS periods, judged as none (NaN, a miss), not a panic.
    let Some(ps) = sc.pshift.as_ref() else {
        return (format!("{who}: no QoS periods (the scenario has no [pshift])"), f64::NAN);
    };
    let (n, f) = run.tenant_periods(&tenants, &ps.periods_in(a, b), metric, threshold_pct);
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

#[cfg(test)]
mod tests {
    use crate::Scenario;

    /// A period expectation checked against a scenario whose [pshift] was taken away after validation
    /// (a public field) is a miss that says why; it was a panic.
    #[test]
    fn a_period_metric_without_pshift_is_a_miss() {
        let text = "name = \"p\"\nduration_s = 2.2\ninterval_s = 0.2\n[pshift]\nperiod_s = 1.0\n[pshift.generate]\n\
                    buckets = 4\nreserved_fraction = 0.5\ndemand_ratio = 1.0\nactive_servers = 1\n[[servers]]\n\
                    name = \"s1\"\ncapacity_iops = 400\n[[expect]]\nmetric = \"reservation_met_fraction\"\n\
                    above = 0.0\n";
        let mut sc = Scenario::from_toml(text, None).unwrap();
        let run = crate::run(&sc, &mut |_| {}).unwrap();
        assert!(crate::check::check(&sc, &run, None)[0].measured.is_finite());
        sc.pshift = None;
        let results = crate::check::check(&sc, &run, None);
        assert!(!results[0].ok && results[0].measured.is_nan(), "{:?}", results[0]);
        assert!(results[0].description.contains("no QoS periods (the scenario has no [pshift])"), "{:?}", results[0]);
    }
}
