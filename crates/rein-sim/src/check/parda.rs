//! PARDA host expectations: windows against eq. (3) or eq. (2)'s fixed point, latency against script-L,
//! ratios of betas, convergence times, and comparisons with the uncontrolled (no-PARDA) run.

use super::{judge, window, CheckResult};
use crate::model::expect::{Expectation, HostTarget};
use crate::model::Scenario;
use rein_model::report::hosts::{HostMetric, HostSubject};
use rein_model::RunTotals;

/// A host expectation's subject and target (the fields of [`crate::model::expect::Subject::Host`]).
pub(super) struct HostCheck {
    pub(super) who: HostSubject,
    pub(super) metric: HostMetric,
    pub(super) band_pct: f64,
    pub(super) target: Option<HostTarget>,
}

/// Evaluates a host expectation `e` (subject and target `h`); `baseline` is the uncontrolled run, if the
/// caller made it.
pub(super) fn check_one(
    sc: &Scenario,
    run: &RunTotals,
    e: &Expectation,
    h: HostCheck,
    baseline: Option<&RunTotals>,
) -> CheckResult {
    let HostCheck { who, metric, band_pct, target } = h;
    let [a, b] = window(sc, e);
    let name = match who {
        HostSubject::Host(h) => sc.hosts[h].name.as_str(),
        HostSubject::All => "all",
    };
    let Some(ht) = &run.hosts else {
        return CheckResult {
            ok: false,
            description: format!("host {name}: the run has no hosts"),
            measured: f64::NAN,
            note: e.note.clone(),
        };
    };
    let band = band_pct;
    let measured = ht.metric(who, metric, a, b, band);
    let other = |o: usize, r: f64, how: &str| {
        let v = ht.metric(HostSubject::Host(o), metric, a, b, band) * r;
        (v, format!("{r:.3}{how} x {}'s = {v:.3}", sc.hosts[o].name))
    };
    let target: Option<(f64, String)> = match target {
        None => None,
        Some(HostTarget::Equals(v)) => Some((v, format!("{v}"))),
        Some(HostTarget::Ratio { host: o, ratio }) => Some(other(o, ratio, "")),
        Some(HostTarget::BetaRatio { host: h, other: o }) => {
            let r = ht.metric(HostSubject::Host(h), HostMetric::Beta, a, b, band)
                / ht.metric(HostSubject::Host(o), HostMetric::Beta, a, b, band).max(1e-12);
            Some(other(o, r, " (beta ratio)"))
        }
        Some(HostTarget::Equilibrium) => {
            let v = match (metric, who) {
                (HostMetric::Window, HostSubject::Host(h)) => ht.equilibrium_window(h, a, b),
                (HostMetric::Window, HostSubject::All) => {
                    ht.active(a, b).0.iter().map(|&h| ht.equilibrium_window(h, a, b)).sum()
                }
                _ => ht.equilibrium_latency_ms(a, b),
            };
            Some((v, format!("eq. (3)'s {v:.3}")))
        }
        Some(HostTarget::Threshold) => Some((ht.threshold_ms, format!("script-L = {} ms", ht.threshold_ms))),
        Some(HostTarget::FixedPoint { host }) => {
            let m = |metric| ht.metric(HostSubject::Host(host), metric, a, b, band);
            let (beta, l) = (m(HostMetric::Beta), m(HostMetric::SignalMs));
            let w = rein_core::parda::fixed_point_window(beta, l, ht.threshold_ms);
            Some(if metric == HostMetric::Window {
                (w, format!("eq. (2)'s fixed point beta L / (L - script-L) with beta {beta:.3}, L {l:.3} ms = {w:.3}"))
            } else {
                // Little's law over the IOs the host has issued: its window, each for its own latency.
                let own = m(HostMetric::LatencyMeanMs);
                let x = w * 1e3 / own;
                (x, format!("eq. (2)'s fixed point window {w:.3} (beta {beta:.3}, L {l:.3} ms) / the host's latency {own:.3} ms = {x:.3}"))
            })
        }
        Some(HostTarget::Uncontrolled) => {
            let v =
                baseline.and_then(|base| base.hosts.as_ref()).map_or(f64::NAN, |bh| bh.metric(who, metric, a, b, band));
            Some((v, format!("the uncontrolled run's {v:.3}")))
        }
    };
    let (ok, expected) = judge(measured, target, e);
    let ok = ok && (measured.is_finite() || metric == HostMetric::ConvergenceS);
    let what = if metric == HostMetric::ConvergenceS {
        format!("convergence_s (to within {band}%)")
    } else {
        metric.name().to_string()
    };
    CheckResult {
        ok,
        description: format!("host {name}: {what} in [{a}, {b}] s = {measured:.3}, expected {expected}"),
        measured,
        note: e.note.clone(),
    }
}
