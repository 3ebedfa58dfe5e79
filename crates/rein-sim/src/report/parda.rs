//! What the report says about PARDA hosts besides their cells.

use crate::model::Scenario;
use rein_model::report::hosts::HostsMeta;

/// The scenario's hosts as the report names them (the simulator's and `rein cluster`'s reports); `None`
/// for a scenario without `[parda]`, which has no hosts to report.
pub fn hosts_meta(sc: &Scenario) -> Option<HostsMeta> {
    let p = sc.parda.as_ref()?;
    Some(HostsMeta {
        names: sc.hosts.iter().map(|h| h.name.clone()).collect(),
        controlled: sc.hosts.iter().map(|h| h.runs_parda(p)).collect(),
        threshold_ms: p.config.threshold_ns() / 1e6,
        period_s: p.config.period.as_secs_f64(),
        aggregation: p.aggregation.name().to_string(),
        enabled: p.enabled,
        warmup_s: sc.warmup.as_secs_f64(),
        duration_s: sc.duration.as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "name = \"t\"\nduration_s = 10\nPARDA[[servers]]\nname = \"s\"\ncapacity_iops = 100\n\
                        [[tenants]]\nname = \"a\"\nHOST[tenants.workload]\nkind = \"closed\"\n";

    /// A public function given a scenario without `[parda]` answers `None`, not a panic; with `[parda]`
    /// it names the scenario's hosts.
    #[test]
    fn a_scenario_without_parda_has_no_hosts_meta() {
        let plain = Scenario::from_toml(&BASE.replace("PARDA", "").replace("HOST", ""), None).unwrap();
        assert!(plain.parda.is_none());
        assert!(hosts_meta(&plain).is_none());

        let with = BASE
            .replace("PARDA", "[parda]\nlatency_threshold_ms = 30\n[[hosts]]\nname = \"h0\"\n")
            .replace("HOST", "host = \"h0\"\n");
        let sc = Scenario::from_toml(&with, None).unwrap();
        let meta = hosts_meta(&sc).expect("a [parda] scenario has hosts");
        assert_eq!(meta.names, vec!["h0".to_string()]);
        assert_eq!(meta.threshold_ms, 30.0);
        assert_eq!(meta.duration_s, 10.0);
    }
}
