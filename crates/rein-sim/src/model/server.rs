//! A validated server: a scheduler (from rein-core) in front of a device (from rein-model).

use crate::file::ServerFile;
use rein_core::{Num, SchedConfig, SchedulerKind};
use rein_model::device::{DeviceError, DeviceParams, DeviceSpec};
use rein_model::sched_settings::{SchedSettingsFile, SettingsError};

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

pub use rein_model::sched_settings::{parse_scheduler, NamedScheduler};

/// A `[[servers]]` entry that is refused: the server, and what is wrong. Its message is `server NAME:
/// ...`.
#[derive(Debug, thiserror::Error)]
#[error("server {server}: {fault}")]
pub struct ServerError {
    /// The server's name.
    pub server: String,
    /// What is wrong with it.
    pub fault: ServerFault,
}

/// What is wrong with a `[[servers]]` entry ([`ServerError`] names the server).
#[derive(Debug, thiserror::Error)]
pub enum ServerFault {
    /// A device field is refused.
    #[error("{0}")]
    Device(DeviceError),
    /// `queue_depth` outside `1..=max`.
    #[error("queue_depth must be in 1..={max}, got {got}")]
    QueueDepth {
        /// The deepest queue accepted ([`MAX_QUEUE_DEPTH`]).
        max: u32,
        /// The value given.
        got: u32,
    },
    /// `scheduler` names no scheduler.
    #[error("{0}")]
    Scheduler(rein_model::sched_settings::UnknownSimScheduler),
    /// A shorthand (`limit_mode`, `batch`, `batch_distance_kb`) given also in the server's `mclock` table.
    #[error("{key} is given twice (as {key} and as mclock.{key})")]
    GivenTwice {
        /// The key.
        key: &'static str,
    },
    /// `mclock.cost_model` in a server's table.
    #[error(
        "mclock.cost_model is scenario-wide (the units of every reservation and limit): set it in the \
         scenario's [mclock] or cost_model"
    )]
    OwnCostModel,
    /// The server's `[mclock]` settings (over the scenario's) are refused.
    #[error("{0}")]
    Sched(SettingsError),
    /// A `capacity_schedule` step at or after the run's end.
    #[error(
        "capacity_schedule has a step at {} s, not before the run's end (duration_s {})",
        Num(*.at_s),
        Num(*.duration_s)
    )]
    StepAfterEnd {
        /// When the step is (s).
        at_s: f64,
        /// The run's `duration_s`.
        duration_s: f64,
    },
    /// `scheduler = "token"` in a scenario without `[pshift]`.
    #[error(
        "scheduler \"token\" is pShift's, whose controller hands out the tokens: it needs a [pshift] table \
         (without one it would be plain round robin); otherwise use mclock, dmclock, rbfq, sfq, lfq, dtfq or fifo"
    )]
    TokenWithoutPshift,
    /// A scheduler other than the token scheduler in a `[pshift]` scenario.
    #[error(
        "scheduler {:?}: a [pshift] scenario's servers run pShift's token scheduler; leave scheduler out or \
         write \"token\"",
        .scheduler.name()
    )]
    NotTokenInPshift {
        /// The scheduler named.
        scheduler: SchedulerKind,
    },
    /// mClock settings on a server of a `[pshift]` scenario.
    #[error("mClock settings (mclock, limit_mode, batch, batch_distance_kb) do not apply to pShift's token scheduler")]
    MclockInPshift,
    /// `capacity_schedule` in a `[pshift]` scenario.
    #[error("capacity_schedule is not supported in pshift scenarios")]
    ScheduleInPshift,
}

impl ServerError {
    /// `fault` of server `server`.
    pub(crate) fn new(server: &str, fault: ServerFault) -> ServerError {
        ServerError { server: server.to_string(), fault }
    }
}

/// Validates a `[[servers]]` entry; `default_sched` is the scenario's scheduler (parsed once, for every
/// server that names none), `scenario_settings` its `[mclock]` table (with the top-level `cost_model`
/// folded in).
pub(crate) fn validate_server(
    index: usize,
    s: &ServerFile,
    default_sched: &NamedScheduler,
    scenario_settings: &SchedSettingsFile,
) -> Result<Server, ServerError> {
    let n = &s.name;
    let err = |fault: ServerFault| ServerError::new(n, fault);
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
    .map_err(|e| err(ServerFault::Device(e)))?;
    if s.queue_depth == 0 || s.queue_depth > MAX_QUEUE_DEPTH {
        return Err(err(ServerFault::QueueDepth { max: MAX_QUEUE_DEPTH, got: s.queue_depth }));
    }
    let (scheduler, distributed) = match s.scheduler.as_deref() {
        Some(own) => parse_scheduler(own).map_err(|e| err(ServerFault::Scheduler(e)))?,
        None => (default_sched.kind(), default_sched.distributed()),
    };
    // The server's own table, with the shorthands `limit_mode`, `batch` and `batch_distance_kb` folded in
    // (each may be given once), over the scenario's.
    let mut own = s.mclock.clone().unwrap_or_default();
    fold(&mut own.limit_mode, &s.limit_mode, "limit_mode").map_err(err)?;
    fold(&mut own.batch, &s.batch, "batch").map_err(err)?;
    fold(&mut own.batch_distance_kb, &s.batch_distance_kb, "batch_distance_kb").map_err(err)?;
    if own.cost_model.is_some() {
        return Err(err(ServerFault::OwnCostModel));
    }
    let sched = scenario_settings.overlay(&own).resolve().map_err(|e| err(ServerFault::Sched(e)))?;
    Ok(Server { name: n.clone(), device, queue_depth: s.queue_depth, scheduler, distributed, sched, stream: index })
}

/// Moves a shorthand key's value into the server's table, refusing it when the table gives it too.
fn fold<T: Clone>(table: &mut Option<T>, shorthand: &Option<T>, key: &'static str) -> Result<(), ServerFault> {
    if let Some(v) = shorthand {
        if table.is_some() {
            return Err(ServerFault::GivenTwice { key });
        }
        *table = Some(v.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::ScenarioFile;

    /// The error of server `s` (`lines` after its name).
    fn refused(lines: &str) -> ServerError {
        let text = format!(
            "name = \"t\"\nduration_s = 1\n[[servers]]\nname = \"s\"\ncapacity_iops = 100\n{lines}\n[[tenants]]\n\
             name = \"x\"\n[tenants.workload]\nkind = \"closed\"\n"
        );
        let file = ScenarioFile::parse(&text).unwrap();
        validate_server(0, &file.servers[0], &"mclock".parse().unwrap(), &SchedSettingsFile::default()).unwrap_err()
    }

    #[test]
    fn errors_are_typed_with_the_server_key_and_bound() {
        let e = refused("queue_depth = 0");
        assert_eq!(e.server, "s");
        assert!(matches!(e.fault, ServerFault::QueueDepth { max: MAX_QUEUE_DEPTH, got: 0 }), "{e:?}");
        assert_eq!(e.to_string(), format!("server s: queue_depth must be in 1..={MAX_QUEUE_DEPTH}, got 0"));
        let e = refused("batch = 2\nmclock = { batch = 3 }");
        assert!(matches!(e.fault, ServerFault::GivenTwice { key: "batch" }), "{e:?}");
        let e = refused("limit_mode = \"break_when_idle\"\nmclock = { limit_mode = \"strict\" }");
        assert!(matches!(e.fault, ServerFault::GivenTwice { key: "limit_mode" }), "{e:?}");
        let e = refused("mclock = { cost_model = \"bytes\" }");
        assert!(matches!(e.fault, ServerFault::OwnCostModel), "{e:?}");
        let e = refused("scheduler = \"nope\"");
        assert!(matches!(e.fault, ServerFault::Scheduler(_)), "{e:?}");
        let e = refused("discipline = \"nope\"");
        assert!(matches!(e.fault, ServerFault::Device(_)), "{e:?}");
    }
}
