//! Checking a run against the expectations written in its scenario (`rein sim --check`).
//!
//! Each `[[expect]]` yields one [`CheckResult`] with the measured and expected values and a one-line
//! description; a run passes when every result does.

use crate::metrics::RunTotals;
use crate::scenario::{ExpectFile, Scenario};
use serde::Serialize;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CheckResult {
    pub ok: bool,
    pub description: String,
    pub measured: f64,
    pub note: Option<String>,
}

fn tenant_metric(run: &RunTotals, sc: &Scenario, t: usize, metric: &str, a: f64, b: f64) -> f64 {
    let ts = &run.timeseries;
    let s = &run.summary.tenants[t];
    match metric {
        "iops" => ts.iops(t, a, b),
        "mb_s" => {
            let w = ts.window(a, b);
            let secs = w.len() as f64 * ts.interval_s;
            let bytes: u64 = w.map(|i| ts.cell(t, i).bytes).sum();
            if secs > 0.0 {
                bytes as f64 / 1e6 / secs
            } else {
                0.0
            }
        }
        "latency_mean_ms" => {
            let w = ts.window(a, b);
            let (n, sum) =
                w.fold((0u64, 0u64), |(n, s), i| (n + ts.cell(t, i).ios as u64, s + ts.cell(t, i).lat_sum_ns));
            if n > 0 {
                sum as f64 / n as f64 / 1e6
            } else {
                0.0
            }
        }
        "latency_p50_ms" => s.latency_ms.p50,
        "latency_p95_ms" => s.latency_ms.p95,
        "latency_p99_ms" => s.latency_ms.p99,
        "latency_max_ms" => s.latency_ms.max,
        "reservation_fraction" => {
            let w = ts.window(a, b);
            let (r, n) =
                w.fold((0u64, 0u64), |(r, n), i| (r + ts.cell(t, i).phase[0] as u64, n + ts.cell(t, i).ios as u64));
            if n > 0 {
                r as f64 / n as f64
            } else {
                0.0
            }
        }
        other => unreachable!("validated metric {other} ({})", sc.name),
    }
}

fn server_metric(run: &RunTotals, s: usize, metric: &str, a: f64, b: f64) -> f64 {
    let ts = &run.timeseries;
    match metric {
        "iops" => {
            let w = ts.window(a, b);
            let secs = w.len() as f64 * ts.interval_s;
            let n: u64 = w.map(|i| ts.server_cells[s * ts.intervals + i] as u64).sum();
            if secs > 0.0 {
                n as f64 / secs
            } else {
                0.0
            }
        }
        "utilisation" => run.summary.servers[s].utilisation,
        other => unreachable!("validated server metric {other}"),
    }
}

/// Evaluates every expectation of `sc` against `run`.
pub fn check(sc: &Scenario, run: &RunTotals) -> Vec<CheckResult> {
    // PARDA's `uncontrolled` targets need the scenario's no-PARDA run: made once, on first use.
    let mut baseline = None;
    sc.expect
        .iter()
        .map(
            |e| {
                if e.host.is_some() {
                    crate::hosts::check_one(sc, run, e, &mut baseline)
                } else {
                    check_one(sc, run, e)
                }
            },
        )
        .collect()
}

/// pShift metrics: the fraction of (bucket, QoS period) pairs, over the periods inside [a, b], in which a
/// bucket met its reservation (`reservation_met_fraction`: at least `threshold_pct`% of R x period,
/// default 100) or exceeded its limit (`limit_exceeded_fraction`: more than (1 + `threshold_pct`/100) x L
/// x period, default 0). Buckets without a reservation always meet it; without a limit never exceed it.
fn period_metric(run: &RunTotals, sc: &Scenario, e: &ExpectFile, a: f64, b: f64) -> (String, f64) {
    let tenants: Vec<usize> = match &e.tenant {
        Some(t) => vec![sc.tenant_index(t).expect("validated")],
        None => (0..sc.tenants.len()).collect(),
    };
    let met = e.metric == "reservation_met_fraction";
    let thr = e.threshold_pct.unwrap_or(if met { 100.0 } else { 0.0 });
    let (n, f) = bucket_periods(run, sc, &tenants, met, thr, a, b);
    let who = match &e.tenant {
        Some(t) => format!("tenant {t}"),
        None => format!("{} buckets", tenants.len()),
    };
    let what = if met { format!(">= {thr}% of the reservation") } else { format!("> limit + {thr}%") };
    (format!("{who}: share of {n} bucket-periods with {what}"), f)
}

/// Over the QoS periods inside [a, b] s and the given buckets: (number of bucket-periods, share of them
/// in which the bucket did at least `threshold_pct`% of its reservation (`met`), or more than its limit
/// plus `threshold_pct`% (`!met`)). A pShift scenario's periods; 0 when there are none.
pub fn bucket_periods(
    run: &RunTotals,
    sc: &Scenario,
    tenants: &[usize],
    met: bool,
    thr: f64,
    a: f64,
    b: f64,
) -> (u64, f64) {
    let ps = sc.pshift.as_ref().expect("validated: period metrics need [pshift]");
    let ts = &run.timeseries;
    let periods = ps.periods_in(a, b);
    let (mut n, mut hit) = (0u64, 0u64);
    for &(p0, p1) in &periods {
        let w = ts.window(p0, p1);
        for &t in tenants {
            let ios: u64 = w.clone().map(|i| ts.cell(t, i).ios as u64).sum();
            let spec = &sc.tenants[t].spec;
            let secs = p1 - p0;
            let yes = if met {
                ios as f64 + 1e-9 >= spec.reservation() * secs * thr / 100.0
            } else {
                spec.limit().is_some_and(|l| ios as f64 > l * secs * (1.0 + thr / 100.0) + 1e-9)
            };
            n += 1;
            hit += yes as u64;
        }
    }
    (n, if n > 0 { hit as f64 / n as f64 } else { 0.0 })
}

fn check_one(sc: &Scenario, run: &RunTotals, e: &ExpectFile) -> CheckResult {
    let [a, b] = e.window.unwrap_or([sc.warmup.as_secs_f64(), sc.duration.as_secs_f64()]);
    let (who, measured) = match (&e.tenant, &e.server) {
        _ if crate::scenario::PERIOD_METRICS.contains(&e.metric.as_str()) => period_metric(run, sc, e, a, b),
        (Some(t), _) => {
            let ti = sc.tenant_index(t).expect("validated");
            (format!("tenant {t}"), tenant_metric(run, sc, ti, &e.metric, a, b))
        }
        (_, Some(s)) => {
            let si = sc.server_index(s).expect("validated");
            (format!("server {s}"), server_metric(run, si, &e.metric, a, b))
        }
        _ => unreachable!("validated"),
    };
    let window = if e.metric.starts_with("latency_p") || e.metric == "latency_max_ms" || e.metric == "utilisation" {
        String::from("after warm-up")
    } else {
        format!("in [{a}, {b}] s")
    };
    let target = if let Some(v) = e.equals {
        Some((v, format!("{v}")))
    } else if e.oracle {
        let ti = sc.tenant_index(e.tenant.as_deref().unwrap_or_default()).expect("validated");
        let v = run.oracle_iops(sc, a, b)[ti];
        Some((v, format!("the oracle's {v:.1}")))
    } else if let Some(other) = &e.ratio_to {
        let oi = sc.tenant_index(other).expect("validated");
        let r = e.ratio.unwrap_or(1.0);
        let v = tenant_metric(run, sc, oi, &e.metric, a, b) * r;
        Some((v, format!("{r} x {other}'s = {v:.2}")))
    } else {
        None
    };
    let (ok, expected) = judge(measured, target, e);
    CheckResult {
        ok,
        description: format!("{who}: {} {window} = {measured:.3}, expected {expected}", e.metric),
        measured,
        note: e.note.clone(),
    }
}

/// Judges a measurement against an expectation: within `within_pct` of the target (value, how to name
/// it), below `below`, above `above`. Returns the verdict and what was expected, in words.
pub(crate) fn judge(measured: f64, target: Option<(f64, String)>, e: &ExpectFile) -> (bool, String) {
    let mut ok = true;
    let mut parts = Vec::new();
    if let (Some((v, label)), Some(pct)) = (target, e.within_pct) {
        ok &= (measured - v).abs() <= v.abs() * pct / 100.0 + 1e-9;
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
