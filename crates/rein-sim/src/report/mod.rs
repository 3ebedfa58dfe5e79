//! The report layer: a run's recording and its scenario become [`RunTotals`] (rein-model's report
//! types: summary.json, timeseries.csv, hosts.csv).

mod parda;
pub use parda::hosts_meta;

use crate::engine::Recording;
use crate::model::Scenario;
use rein_model::recorder::{RunMeta, ServerMeta, TenantMeta};
use rein_model::RunTotals;

/// What the report says about the scenario's tenants and servers.
pub fn meta(sc: &Scenario) -> RunMeta {
    RunMeta {
        name: sc.name.clone(),
        scheduler: sc.scheduler_name.clone(),
        seed: sc.seed(),
        tenants: sc
            .tenants
            .iter()
            .map(|t| TenantMeta { name: t.name.clone(), spec: Some(t.spec), open_loop: t.workload.kind.open_loop() })
            .collect(),
        servers: sc
            .servers
            .iter()
            .map(|s| ServerMeta {
                name: s.name.clone(),
                scheduler: s.scheduler.name().to_string(),
                distributed: s.distributed,
                capacity: s.device.schedule.clone(),
                busy_observed: true,
            })
            .collect(),
        phases_known: true,
        cost_model: sc.sched.cost_model,
    }
}

/// The totals of a run of `sc`.
pub fn build(sc: &Scenario, recording: Recording) -> RunTotals {
    let mut totals = recording.recorder.finish(&meta(sc));
    totals.summary.sabotage = sc.sabotage.map(String::from);
    // A host recording exists only with [parda], which is what hosts_meta needs.
    if let Some((h, hosts_meta)) = recording.hosts.zip(parda::hosts_meta(sc)) {
        let hosts = h.finish(hosts_meta);
        totals.summary.hosts = Some(hosts.summary.clone());
        totals.hosts = Some(hosts);
    }
    totals.events = recording.events;
    totals.time_regressions = recording.time_regressions;
    totals.rounds = recording.rounds;
    totals.periods = recording.periods;
    totals.period_log = recording.period_log;
    totals
}
