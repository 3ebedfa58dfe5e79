//! What the report says about PARDA hosts besides their cells.

use crate::model::Scenario;
use rein_model::report::hosts::HostsMeta;

/// The scenario's hosts as the report names them (the simulator's and `rein cluster`'s reports).
pub fn hosts_meta(sc: &Scenario) -> HostsMeta {
    let p = sc.parda.as_ref().expect("a host recording exists only with [parda]");
    HostsMeta {
        names: sc.hosts.iter().map(|h| h.name.clone()).collect(),
        controlled: sc.hosts.iter().map(|h| h.runs_parda(p)).collect(),
        threshold_ms: p.config.threshold_ns() / 1e6,
        period_s: p.config.period.as_secs_f64(),
        aggregation: p.aggregation.name().to_string(),
        enabled: p.enabled,
        warmup_s: sc.warmup.as_secs_f64(),
        duration_s: sc.duration.as_secs_f64(),
    }
}
