//! A validated server: a scheduler (from rein-core) in front of a device (from rein-model).

use crate::file::ServerFile;
use rein_core::{SchedConfig, SchedulerKind};
use rein_model::device::{DeviceParams, DeviceSpec};
use rein_model::sched_settings::SchedSettingsFile;

/// Largest queue depth D.
pub const MAX_QUEUE_DEPTH: u32 = 65_536;

/// A server of the scenario.
#[derive(Debug, Clone)]
pub struct Server {
    /// Its name.
    pub name: String,
    /// The device behind the scheduler.
    pub device: DeviceSpec,
    /// D: requests the scheduler keeps outstanding at the device.
    pub queue_depth: u32,
    /// The scheduler.
    pub scheduler: SchedulerKind,
    /// Whether gateways piggyback delta/rho to this server (dmclock, rbfq, dtfq).
    pub distributed: bool,
    /// The scheduler's settings: the scenario's `[mclock]` with this server's own table over it
    /// ([`SchedConfig::limits`] is set by the engine).
    pub sched: SchedConfig,
    /// Its device's random stream (rein-model's `seed::server_stream` of this): its index in the file,
    /// kept when the scenario is cut into groups ([`crate::Scenario::part`]).
    pub stream: usize,
}

pub use rein_model::sched_settings::parse_scheduler;

/// Validates a `[[servers]]` entry; `default_sched` is the scenario's scheduler, `scenario_settings` its
/// `[mclock]` table (with the top-level `cost_model` folded in).
pub(crate) fn validate_server(
    index: usize,
    s: &ServerFile,
    default_sched: &str,
    scenario_settings: &SchedSettingsFile,
) -> Result<Server, String> {
    let n = &s.name;
    let device = DeviceParams {
        capacity_iops: s.capacity_iops,
        service: &s.service,
        uniform_spread: s.uniform_spread,
        disk: s.disk,
        transfer_mb_s: s.transfer_mb_s,
        discipline: s.discipline.as_deref(),
        array: s.array,
        capacity_schedule: s.capacity_schedule.clone(),
    }
    .validate()
    .map_err(|e| format!("server {n}: {e}"))?;
    if s.queue_depth == 0 || s.queue_depth > MAX_QUEUE_DEPTH {
        return Err(format!("server {n}: queue_depth must be in 1..={MAX_QUEUE_DEPTH}, got {}", s.queue_depth));
    }
    let (scheduler, distributed) =
        parse_scheduler(s.scheduler.as_deref().unwrap_or(default_sched)).map_err(|e| format!("server {n}: {e}"))?;
    // The server's own table, with the shorthands `limit_mode`, `batch` and `batch_distance_kb` folded in
    // (each may be given once), over the scenario's.
    let mut own = s.mclock.clone().unwrap_or_default();
    fold(&mut own.limit_mode, &s.limit_mode, n, "limit_mode")?;
    fold(&mut own.batch, &s.batch, n, "batch")?;
    fold(&mut own.batch_distance_kb, &s.batch_distance_kb, n, "batch_distance_kb")?;
    if own.cost_model.is_some() {
        return Err(format!(
            "server {n}: mclock.cost_model is scenario-wide (the units of every reservation and limit): set it \
             in the scenario's [mclock] or cost_model"
        ));
    }
    let sched = scenario_settings.overlay(&own).resolve().map_err(|e| format!("server {n}: {e}"))?;
    Ok(Server { name: n.clone(), device, queue_depth: s.queue_depth, scheduler, distributed, sched, stream: index })
}

/// Moves a shorthand key's value into the server's table, refusing it when the table gives it too.
fn fold<T: Clone>(table: &mut Option<T>, shorthand: &Option<T>, server: &str, field: &str) -> Result<(), String> {
    if let Some(v) = shorthand {
        if table.is_some() {
            return Err(format!("server {server}: {field} is given twice (as {field} and as mclock.{field})"));
        }
        *table = Some(v.clone());
    }
    Ok(())
}
