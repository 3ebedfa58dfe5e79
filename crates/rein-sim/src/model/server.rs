//! A validated server: a scheduler (from rein-core) in front of a device (from rein-model).

use crate::file::ServerFile;
use rein_core::{LimitMode, SchedulerKind};
use rein_model::device::{DeviceParams, DeviceSpec, DiskParams};

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
    /// How limits are enforced.
    pub limit_mode: LimitMode,
    /// Locality batching: batch size (1 = off).
    pub batch: u32,
    /// Locality batching: distance (bytes).
    pub batch_distance: u64,
}

/// Parses a scheduler name; returns the kind and whether it is distributed (piggybacks delta/rho).
pub fn parse_scheduler(s: &str) -> Result<(SchedulerKind, bool), String> {
    match s.to_ascii_lowercase().as_str() {
        "lfq" => Ok((SchedulerKind::Sfq, false)),
        "dtfq" => Ok((SchedulerKind::Sfq, true)),
        other => {
            let k: SchedulerKind = other.parse().map_err(|e: String| e.replace("fifo)", "fifo, lfq, dtfq)"))?;
            Ok((k, matches!(k, SchedulerKind::Dmclock | SchedulerKind::Rbfq)))
        }
    }
}

/// Validates a `[[servers]]` entry; `default_sched` is the scenario's scheduler.
pub(crate) fn validate_server(s: &ServerFile, default_sched: &str) -> Result<Server, String> {
    let n = &s.name;
    let device = DeviceParams {
        capacity_iops: s.capacity_iops,
        service: &s.service,
        uniform_spread: s.uniform_spread,
        disk: s.disk.as_ref().map(|d| DiskParams {
            seek_ms: d.seek_ms,
            rotation_ms: d.rotation_ms,
            transfer_mb_s: d.transfer_mb_s,
            sequential_kb: d.sequential_kb,
        }),
        transfer_mb_s: s.transfer_mb_s,
        discipline: s.discipline.as_deref(),
        capacity_schedule: s.capacity_schedule.iter().map(|c| (c.at_s, c.iops)).collect(),
    }
    .validate()
    .map_err(|e| format!("server {n}: {e}"))?;
    if s.queue_depth == 0 || s.queue_depth > MAX_QUEUE_DEPTH {
        return Err(format!("server {n}: queue_depth must be in 1..={MAX_QUEUE_DEPTH}, got {}", s.queue_depth));
    }
    let (scheduler, distributed) =
        parse_scheduler(s.scheduler.as_deref().unwrap_or(default_sched)).map_err(|e| format!("server {n}: {e}"))?;
    let limit_mode = match s.limit_mode.as_deref() {
        None | Some("strict") => LimitMode::Strict,
        Some("break_when_idle") => LimitMode::BreakWhenIdle,
        Some(o) => return Err(format!("server {n}: limit_mode {o:?}: expected strict or break_when_idle")),
    };
    let batch = s.batch.unwrap_or(1);
    if batch == 0 || batch > 1024 {
        return Err(format!("server {n}: batch must be in 1..=1024"));
    }
    let bd = s.batch_distance_kb.unwrap_or(4096.0);
    if !(bd.is_finite() && bd >= 0.0) {
        return Err(format!("server {n}: batch_distance_kb must be non-negative"));
    }
    Ok(Server {
        name: n.clone(),
        device,
        queue_depth: s.queue_depth,
        scheduler,
        distributed,
        limit_mode,
        batch,
        batch_distance: (bd * 1024.0) as u64,
    })
}
