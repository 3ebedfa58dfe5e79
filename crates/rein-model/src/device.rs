//! The device model: a storage device of a given capacity, as the simulator runs it and as `rein serve`
//! puts it in front of real storage for repeatable experiments.
//!
//! # Model
//! A device completes requests at `capacity_iops` on average. Each request's *service time* is drawn from
//! the device's [`ServiceModel`] with mean `1 / capacity_iops` (nominal capacity C0), plus `size / rate`
//! when a transfer rate is given, times the request's own `scale` (a host's placement skew, 1 otherwise),
//! times `C0 / C(t)` when the capacity schedule (or an operator) has changed the capacity to C(t). How the
//! device serves the requests present is its [`Discipline`]:
//! - **FIFO**: one request at a time in arrival order. A request's service time is drawn when its
//!   service starts, so a capacity change applies to every request not yet started. Latency grows with
//!   the queue and hardly depends on the request itself.
//! - **Processor sharing** ([`Ps`]): all requests are served at once, each at `1/n` of the device's speed
//!   with `n` present. A request's latency scales with its own service demand, as on an array with
//!   internal parallelism (parda.txt §4.1, Table 3). The service time is drawn on arrival.
//! - **Array** ([`crate::array`]): a RAID-0 or RAID-5 group of disks, each a FIFO queue with its own
//!   head; a request is split by the stripe layout into disk accesses and completes with its last one.
//!   Throughput grows with the requests present until every disk is busy (parda.txt §5.2). An access's
//!   mean service time is `disks / capacity_iops` (positionless models) or the disk model's.
//!
//! The *disk* service model ([`crate::service`]) is position dependent: an access farther than
//! `sequential_bytes` from where the previous one ended pays a seek and a rotational delay, then the
//! transfer.
//!
//! # Time and precision
//! Times are integer nanoseconds. A drawn service time is an `f64` of nanoseconds, at least 1 ns; the one
//! rounding rule ([`round_ns`]) turns it into [`Nanos`] for a FIFO device: round half away from zero.
//! Processor sharing keeps finer precision (2^-20 ns, see [`Ps`]) since its completions are computed from
//! the sum of many shares.
//!
//! # Randomness
//! One PCG stream per device ([`crate::seed`]), consumed only by service-time draws (exponential,
//! uniform, the disk's rotational delay), in the order services start (FIFO, a disk of an array) or
//! requests arrive (PS): the same requests in the same order give the same times.
//!
//! # Driving it (sans-IO)
//! The device never reads a clock. A FIFO device is driven by [`Device::fifo_arrive`] (returns the
//! completion time if the request starts at once) and [`Device::fifo_finish`] (called at that time:
//! returns the finished request and when the next one completes). A PS device or an array (the
//! *concurrent* disciplines: many requests in service) by [`Device::concurrent_admit`],
//! [`Device::concurrent_rearm`] (the next completion, with a generation number; earlier ones are stale)
//! and [`Device::concurrent_take_done`]. Daemons use the discipline-neutral [`Device::arrive`] /
//! [`Device::wake`].
//! Busy periods (for utilisation) are reported to the caller when they end.
//!
//! # Invariants
//! 1. A FIFO device has a request in service iff it is busy; its queue is empty when it is idle.
//! 2. Every admitted request finishes exactly once, in FIFO order for FIFO devices.
//! 3. `busy_since` is set iff requests are present.

use crate::array::Array;
pub use crate::array::{ArrayParams, ArraySpec, Raid};
use crate::service::Draw;
pub use crate::service::{round_ns, DiskModel, Job, ServiceModel};
use rand_pcg::Pcg64Mcg;
use rein_core::{Nanos, Num};
use serde::Deserialize;
use std::collections::VecDeque;

pub use crate::ps::Ps;

/// Largest capacity a device may have (IOPS).
pub const MAX_CAPACITY_IOPS: f64 = 1e9;
/// Latest capacity change a schedule may name (seconds: a week).
pub const MAX_SCHEDULE_S: f64 = 7.0 * 86_400.0;

/// How a device serves the requests at it (module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Discipline {
    /// One at a time, in arrival order.
    #[default]
    Fifo,
    /// All at once, sharing the device equally.
    Ps,
    /// A RAID group of FIFO disks ([`crate::array`]).
    Array(ArraySpec),
}

impl Discipline {
    /// The discipline's name as configuration files write it.
    pub fn name(&self) -> &'static str {
        match self {
            Discipline::Fifo => "fifo",
            Discipline::Ps => "ps",
            Discipline::Array(_) => "array",
        }
    }
}

/// A validated device: what it is, not its state.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSpec {
    /// Nominal capacity C0 (IOPS): the mean service time is 1/C0 before any capacity change.
    pub capacity_iops: f64,
    /// The service-time distribution.
    pub service: ServiceModel,
    /// Extra service time per byte (ns), from a transfer rate; 0 without one.
    pub ns_per_byte: f64,
    /// FIFO or processor sharing.
    pub discipline: Discipline,
    /// Capacity over time: `(from, IOPS)`, sorted by time, the first at 0.
    pub schedule: Vec<(Nanos, f64)>,
}

/// `disk = { .. }`: the disk model's parameters as configuration files write them (a scenario's
/// `[[servers]]`, rein.toml's `[device_model]`); every field optional, defaulting to
/// [`DiskParams::default`]'s.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiskParams {
    /// Average seek time for a random access (ms); scaled by sqrt(distance / span).
    pub seek_ms: f64,
    /// Full rotation time (ms); a random access waits a uniform fraction of it.
    pub rotation_ms: f64,
    /// Media transfer rate (MB/s).
    pub transfer_mb_s: f64,
    /// Accesses closer than this to the previous one are sequential: no seek, no rotation (KiB).
    pub sequential_kb: f64,
}

/// A step of `capacity_schedule` as configuration files write it: `{ at_s = 60, iops = 600 }`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacityStep {
    /// From when (s from the start).
    pub at_s: f64,
    /// The capacity from then on (IOPS).
    pub iops: f64,
}

impl Default for DiskParams {
    /// A 7,200 rpm class disk: 4 ms seek, 4 ms rotation, 100 MB/s, 64 KiB sequential distance.
    fn default() -> Self {
        DiskParams { seek_ms: 4.0, rotation_ms: 4.0, transfer_mb_s: 100.0, sequential_kb: 64.0 }
    }
}

/// A device as configuration files write it (the simulator's `[[servers]]`, `rein serve`'s
/// `[device_model]`): validated once into a [`DeviceSpec`] by [`DeviceParams::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceParams<'a> {
    /// `capacity_iops`: the nominal capacity C0 (IOPS, positive, at most [`MAX_CAPACITY_IOPS`]).
    pub capacity_iops: f64,
    /// `service`: exponential, uniform, deterministic or disk.
    pub service: &'a str,
    /// `uniform_spread` (uniform only; default 0.5).
    pub uniform_spread: Option<f64>,
    /// `disk` (disk only; default [`DiskParams::default`]).
    pub disk: Option<DiskParams>,
    /// `transfer_mb_s`: adds size / rate to every service time.
    pub transfer_mb_s: Option<f64>,
    /// `discipline`: fifo (default), ps or array.
    pub discipline: Option<&'a str>,
    /// `array` (array only; default [`ArrayParams::default`]).
    pub array: Option<ArrayParams>,
    /// `capacity_schedule`: capacity steps, sorted by time.
    pub capacity_schedule: Vec<CapacityStep>,
}

/// What is wrong with a device's parameters (the message names the field).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeviceError {
    /// A field that must be a positive number is not.
    #[error("{field} must be a positive number, got {}", Num(*.value))]
    NotPositive {
        /// The field's name.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// A capacity above [`MAX_CAPACITY_IOPS`].
    #[error("{field} {} is above the bound of {} IOPS", Num(*.value), Num(MAX_CAPACITY_IOPS))]
    CapacityTooLarge {
        /// The field's name (`capacity_iops`, `capacity_schedule.iops`, ...).
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// An unknown service model.
    #[error("service {0:?}: expected exponential, uniform, deterministic or disk")]
    Service(String),
    /// A service model's parameter given with another service model (`field`, the model it is for, the
    /// model given).
    #[error("{field} is for service = {for_service:?}, not {service:?}: remove it, or set service = {for_service:?}")]
    ServiceParam {
        /// `uniform_spread` or `disk`.
        field: &'static str,
        /// The model the parameter belongs to.
        for_service: &'static str,
        /// The model given.
        service: String,
    },
    /// `uniform_spread` outside [0, 1].
    #[error("uniform_spread must be in [0, 1], got {}", Num(*.0))]
    Spread(f64),
    /// A disk time or distance that is negative, not finite, or above its bound ([`MAX_DISK_MS`],
    /// [`MAX_DISK_SEQUENTIAL_KB`]).
    #[error("{field} must be a number from 0 to {max}, got {}", Num(*.value))]
    DiskParam {
        /// The field's name (`disk.seek_ms`, `disk.rotation_ms`, `disk.sequential_kb`).
        field: &'static str,
        /// The value given.
        value: f64,
        /// Its bound.
        max: f64,
    },
    /// A capacity step at a bad time.
    #[error("capacity_schedule.at_s must be between 0 and {MAX_SCHEDULE_S} s, got {}", Num(*.0))]
    ScheduleTime(f64),
    /// Capacity steps out of order, or two at one time.
    #[error("capacity_schedule must be sorted by at_s, each time named once (at_s {} follows {})", Num(*.at_s), Num(*.after))]
    ScheduleOrder {
        /// The step's time.
        at_s: f64,
        /// The time of the step before it.
        after: f64,
    },
    /// An unknown discipline.
    #[error("discipline {0:?}: expected fifo, ps or array")]
    Discipline(String),
    /// A bad `array` table.
    #[error("array: {0}")]
    Array(crate::array::ArrayError),
    /// An `array` table without `discipline = "array"`.
    #[error("array: given with discipline = {discipline:?}; an array needs discipline = \"array\"")]
    ArrayWithoutDiscipline {
        /// The discipline given (its name).
        discipline: &'static str,
    },
}

/// Largest seek or rotation time a disk model takes (ms): a minute, far beyond any disk, and small
/// enough that a service time stays exact in nanoseconds.
pub const MAX_DISK_MS: f64 = 60_000.0;
/// Largest sequential distance (KiB): 1 TiB.
pub const MAX_DISK_SEQUENTIAL_KB: f64 = 1024.0 * 1024.0 * 1024.0;

/// A disk parameter: finite, from 0 to `max` ([`DeviceError::DiskParam`] naming `field`).
fn in_range(field: &'static str, value: f64, max: f64) -> Result<f64, DeviceError> {
    if (0.0..=max).contains(&value) {
        Ok(value)
    } else {
        Err(DeviceError::DiskParam { field, value, max })
    }
}

fn positive(field: &'static str, value: f64) -> Result<f64, DeviceError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(DeviceError::NotPositive { field, value })
    }
}

/// Checks a capacity (IOPS) from outside: `capacity_iops`, a `capacity_schedule` step, an operator's
/// change. It must be a positive number ([`DeviceError::NotPositive`] naming `field`) and at most
/// [`MAX_CAPACITY_IOPS`] ([`DeviceError::CapacityTooLarge`]); [`Device::set_capacity`] asserts it.
pub fn check_capacity(field: &'static str, iops: f64) -> Result<f64, DeviceError> {
    positive(field, iops)?;
    if iops > MAX_CAPACITY_IOPS {
        return Err(DeviceError::CapacityTooLarge { field, value: iops });
    }
    Ok(iops)
}

impl DeviceParams<'_> {
    /// Validates the parameters into a [`DeviceSpec`].
    pub fn validate(&self) -> Result<DeviceSpec, DeviceError> {
        let capacity_iops = check_capacity("capacity_iops", self.capacity_iops)?;
        // A parameter of a model not in use would be ignored: refused, as an array without its discipline.
        for (field, for_service, given) in
            [("uniform_spread", "uniform", self.uniform_spread.is_some()), ("disk", "disk", self.disk.is_some())]
        {
            if given && self.service != for_service {
                return Err(DeviceError::ServiceParam { field, for_service, service: self.service.to_string() });
            }
        }
        let service = match self.service {
            "exponential" => ServiceModel::Exponential,
            "deterministic" => ServiceModel::Deterministic,
            "uniform" => {
                let spread = self.uniform_spread.unwrap_or(0.5);
                if !(0.0..=1.0).contains(&spread) {
                    return Err(DeviceError::Spread(spread));
                }
                ServiceModel::Uniform { spread }
            }
            "disk" => {
                let d = self.disk.unwrap_or_default();
                in_range("disk.seek_ms", d.seek_ms, MAX_DISK_MS)?;
                in_range("disk.rotation_ms", d.rotation_ms, MAX_DISK_MS)?;
                in_range("disk.sequential_kb", d.sequential_kb, MAX_DISK_SEQUENTIAL_KB)?;
                positive("disk.transfer_mb_s", d.transfer_mb_s)?;
                ServiceModel::Disk(DiskModel {
                    seek_ns: d.seek_ms * 1e6,
                    rotation_ns: d.rotation_ms * 1e6,
                    transfer_bytes_per_ns: d.transfer_mb_s * 1e6 / 1e9,
                    sequential_bytes: (d.sequential_kb * 1024.0) as u64,
                })
            }
            other => return Err(DeviceError::Service(other.to_string())),
        };
        let ns_per_byte = match self.transfer_mb_s {
            None => 0.0,
            Some(t) => 1e9 / (positive("transfer_mb_s", t)? * 1e6),
        };
        let mut schedule = vec![(Nanos::ZERO, capacity_iops)];
        let mut last: Option<f64> = None;
        for &CapacityStep { at_s, iops } in &self.capacity_schedule {
            if !(at_s.is_finite() && (0.0..=MAX_SCHEDULE_S).contains(&at_s)) {
                return Err(DeviceError::ScheduleTime(at_s));
            }
            let at = Nanos::from_secs_f64(at_s);
            check_capacity("capacity_schedule.iops", iops)?;
            if let Some(after) = last.filter(|&l| at_s <= l) {
                return Err(DeviceError::ScheduleOrder { at_s, after });
            }
            last = Some(at_s);
            if at == Nanos::ZERO {
                schedule[0].1 = iops;
            } else {
                schedule.push((at, iops));
            }
        }
        let discipline = match self.discipline {
            None | Some("fifo") => Discipline::Fifo,
            Some("ps") => Discipline::Ps,
            Some("array") => Discipline::Array(self.array.unwrap_or_default().validate().map_err(DeviceError::Array)?),
            Some(o) => return Err(DeviceError::Discipline(o.to_string())),
        };
        if self.array.is_some() && !matches!(discipline, Discipline::Array(_)) {
            return Err(DeviceError::ArrayWithoutDiscipline { discipline: discipline.name() });
        }
        Ok(DeviceSpec { capacity_iops, service, ns_per_byte, discipline, schedule })
    }
}

impl DeviceSpec {
    /// A device of `capacity_iops` with `service` times, FIFO, no transfer term, no schedule.
    pub fn new(capacity_iops: f64, service: ServiceModel) -> Result<DeviceSpec, DeviceError> {
        Self::scheduled(capacity_iops, service, &[])
    }

    /// A device of nominal capacity `capacity_iops` with `service` times whose capacity changes at
    /// `steps`; FIFO, no transfer term.
    pub fn scheduled(
        capacity_iops: f64,
        service: ServiceModel,
        steps: &[CapacityStep],
    ) -> Result<DeviceSpec, DeviceError> {
        DeviceParams {
            capacity_iops,
            service: service.name(),
            uniform_spread: match service {
                ServiceModel::Uniform { spread } => Some(spread),
                _ => None,
            },
            // The caller's disk model is checked as a configuration file's would be (it is kept as given).
            disk: match service {
                ServiceModel::Disk(d) => Some(DiskParams {
                    seek_ms: d.seek_ns / 1e6,
                    rotation_ms: d.rotation_ns / 1e6,
                    transfer_mb_s: d.transfer_bytes_per_ns * 1e3,
                    sequential_kb: d.sequential_bytes as f64 / 1024.0,
                }),
                _ => None,
            },
            transfer_mb_s: None,
            discipline: None,
            array: None,
            capacity_schedule: steps.to_vec(),
        }
        .validate()
        .map(|mut s| {
            s.service = service;
            s
        })
    }

    /// The scheduled capacity (IOPS) at time `t`.
    pub fn capacity_at(&self, t: Nanos) -> f64 {
        capacity_at(&self.schedule, t)
    }
}

/// The capacity (IOPS) of `schedule` at time `t`: that of the last step at or before `t` (the first step's
/// before it). `schedule` is a [`DeviceSpec::schedule`] (or a report's copy of one): sorted by time, not
/// empty, its first step at 0.
pub fn capacity_at(schedule: &[(Nanos, f64)], t: Nanos) -> f64 {
    schedule.iter().rev().find(|c| c.0 <= t).map_or(schedule[0].1, |c| c.1)
}

/// What [`Device::fifo_finish`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FifoDone {
    /// The job that finished.
    pub id: u32,
    /// When the next job (now in service) completes, if one started.
    pub next: Option<Nanos>,
    /// The device went idle: its busy period began here and ended now.
    pub busy_from: Option<Nanos>,
}

/// A device's next completion as the discipline-neutral API reports it: call [`Device::wake`] at `at`
/// with `generation`; earlier wakes are stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    /// When the next job completes.
    pub at: Nanos,
    /// Which arming this is (wakes with an older generation are ignored).
    pub generation: u32,
}

/// The state of a device's discipline beyond FIFO's (whose queue the device holds itself).
#[derive(Debug)]
enum Concurrent {
    /// FIFO: none.
    No,
    Ps(Ps),
    Array(Array),
}

/// A device in operation (module comment).
#[derive(Debug)]
pub struct Device {
    draw: Draw,
    nominal_iops: f64,
    capacity: f64,
    /// Where the last access ended (the disk's head; FIFO and PS).
    last_offset: u64,
    queue: VecDeque<Job>,
    in_service: Option<u32>,
    concurrent: Concurrent,
    busy_since: Option<Nanos>,
    /// The armed completion's generation: the concurrent disciplines' next-completion events, and FIFO's
    /// in the discipline-neutral API.
    generation: u32,
}

impl Device {
    /// A device per `spec` at its time-0 capacity, drawing from the PCG stream seeded by `seed` (see
    /// [`crate::seed`]).
    pub fn new(spec: &DeviceSpec, seed: u128) -> Device {
        let capacity = spec.schedule.first().map_or(spec.capacity_iops, |c| c.1);
        // An array's disks each serve 1/D of the nominal capacity (module comment).
        let servers = match spec.discipline {
            Discipline::Array(a) => a.disks as f64,
            _ => 1.0,
        };
        Device {
            draw: Draw {
                service: spec.service,
                mean_ns: servers * 1e9 / spec.capacity_iops,
                ns_per_byte: spec.ns_per_byte,
                slow: spec.capacity_iops / capacity,
                rng: Pcg64Mcg::new(seed),
            },
            nominal_iops: spec.capacity_iops,
            capacity,
            last_offset: 0,
            queue: VecDeque::new(),
            in_service: None,
            concurrent: match spec.discipline {
                Discipline::Fifo => Concurrent::No,
                Discipline::Ps => Concurrent::Ps(Ps::default()),
                Discipline::Array(a) => Concurrent::Array(Array::new(a)),
            },
            busy_since: None,
            generation: 0,
        }
    }

    /// The current capacity (IOPS).
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// Changes the capacity; it applies to services that start from now on (FIFO, an array's disk
    /// accesses) or to requests that arrive from now on (PS). The caller validates `iops` with
    /// [`check_capacity`].
    pub fn set_capacity(&mut self, iops: f64) {
        debug_assert!(iops > 0.0 && iops <= MAX_CAPACITY_IOPS);
        self.capacity = iops;
        self.draw.slow = self.nominal_iops / iops;
    }

    /// The discipline.
    #[inline]
    pub fn discipline(&self) -> Discipline {
        match &self.concurrent {
            Concurrent::No => Discipline::Fifo,
            Concurrent::Ps(_) => Discipline::Ps,
            Concurrent::Array(a) => Discipline::Array(a.spec()),
        }
    }

    /// Requests at the device (in service or queued).
    #[inline]
    pub fn len(&self) -> usize {
        match &self.concurrent {
            Concurrent::No => self.queue.len() + self.in_service.is_some() as usize,
            Concurrent::Ps(ps) => ps.len(),
            Concurrent::Array(a) => a.len(),
        }
    }

    /// True when no request is at the device.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Since when the device has been busy (requests present), if it is.
    #[inline]
    pub fn busy_since(&self) -> Option<Nanos> {
        self.busy_since
    }

    #[inline]
    fn start_busy(&mut self, now: Nanos) {
        if self.busy_since.is_none() {
            self.busy_since = Some(now);
        }
    }

    // ---- FIFO --------------------------------------------------------------------------------------

    /// A job reaches a FIFO device at `now`. If the device was idle it starts at once: returns when it
    /// completes (call [`Device::fifo_finish`] then).
    #[inline]
    pub fn fifo_arrive(&mut self, now: Nanos, job: Job) -> Option<Nanos> {
        debug_assert!(matches!(self.concurrent, Concurrent::No), "a FIFO call on a concurrent device");
        self.queue.push_back(job);
        if self.in_service.is_none() {
            self.fifo_start(now)
        } else {
            None
        }
    }

    #[inline]
    fn fifo_start(&mut self, now: Nanos) -> Option<Nanos> {
        let job = self.queue.pop_front()?;
        let ns = self.draw.ns(&mut self.last_offset, job.offset, job.size, job.scale);
        self.in_service = Some(job.id);
        self.start_busy(now);
        Some(now.saturating_add(Nanos(round_ns(ns))))
    }

    /// The job in service completes at `now` (the time [`Device::fifo_arrive`] or the previous
    /// `fifo_finish` returned); the next one starts.
    #[inline]
    pub fn fifo_finish(&mut self, now: Nanos) -> FifoDone {
        let id = self.in_service.take().expect("invariant 1: fifo_finish with a job in service");
        let next = self.fifo_start(now);
        let busy_from = if next.is_none() { self.busy_since.take() } else { None };
        FifoDone { id, next, busy_from }
    }

    // ---- Processor sharing and arrays (concurrent) -------------------------------------------------

    /// A job reaches a processor-sharing device or an array at `now`; call [`Device::concurrent_rearm`]
    /// afterwards.
    #[inline]
    pub fn concurrent_admit(&mut self, now: Nanos, job: Job) {
        self.start_busy(now);
        match &mut self.concurrent {
            Concurrent::No => panic!("a concurrent call on a FIFO device"),
            Concurrent::Ps(ps) => {
                ps.admit(now, job.id, self.draw.ns(&mut self.last_offset, job.offset, job.size, job.scale))
            }
            Concurrent::Array(a) => a.admit(now, job, &mut self.draw),
        }
    }

    /// The next completion after arrivals or departures: `(time, generation)`; completions armed
    /// before are stale.
    pub fn concurrent_rearm(&mut self) -> Option<(Nanos, u32)> {
        self.generation = self.generation.wrapping_add(1);
        let next = match &self.concurrent {
            Concurrent::No => panic!("a concurrent call on a FIFO device"),
            Concurrent::Ps(ps) => ps.next_completion(),
            Concurrent::Array(a) => a.next_completion(),
        };
        next.map(|t| (t, self.generation))
    }

    /// The completion armed as `generation` is due at `now`: appends the finished jobs to `out` in finish
    /// order. False (and nothing done) if `generation` is stale.
    pub fn concurrent_take_done(&mut self, now: Nanos, generation: u32, out: &mut Vec<u32>) -> bool {
        if generation != self.generation {
            return false;
        }
        match &mut self.concurrent {
            Concurrent::No => panic!("a concurrent call on a FIFO device"),
            Concurrent::Ps(ps) => ps.pop_done(now, out),
            Concurrent::Array(a) => a.pop_done(now, out, &mut self.draw),
        }
        true
    }

    /// If the device is empty, ends its busy period: returns when it began.
    #[inline]
    pub fn end_busy_if_idle(&mut self) -> Option<Nanos> {
        if self.is_empty() {
            self.busy_since.take()
        } else {
            None
        }
    }

    // ---- Discipline-neutral (daemons) --------------------------------------------------------------

    /// A job arrives at `now`. Returns the device's next wake if it changed (arm a timer for it).
    pub fn arrive(&mut self, now: Nanos, job: Job) -> Option<Wake> {
        if !matches!(self.concurrent, Concurrent::No) {
            self.concurrent_admit(now, job);
            return self.concurrent_rearm().map(|(at, generation)| Wake { at, generation });
        }
        let at = self.fifo_arrive(now, job)?;
        self.generation = self.generation.wrapping_add(1);
        Some(Wake { at, generation: self.generation })
    }

    /// A wake armed as `generation` fires at `now`: appends the jobs finished by now to `done` and returns
    /// the next wake, if any. A stale wake does nothing and returns `None` (a newer one is armed).
    pub fn wake(&mut self, now: Nanos, generation: u32, done: &mut Vec<u32>) -> Option<Wake> {
        if !matches!(self.concurrent, Concurrent::No) {
            if !self.concurrent_take_done(now, generation, done) {
                return None;
            }
            self.end_busy_if_idle();
            return self.concurrent_rearm().map(|(at, generation)| Wake { at, generation });
        }
        if generation != self.generation || self.in_service.is_none() {
            return None;
        }
        let f = self.fifo_finish(now);
        done.push(f.id);
        let at = f.next?;
        self.generation = self.generation.wrapping_add(1);
        Some(Wake { at, generation: self.generation })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u32) -> Job {
        Job { id, size: 4096, offset: 0, scale: 1.0, write: false }
    }

    #[test]
    fn fifo_device_at_its_rate_and_capacity_changes_apply_to_later_starts() {
        let spec = DeviceSpec::new(1000.0, ServiceModel::Deterministic).unwrap();
        let mut d = Device::new(&spec, 1);
        // Ten jobs at t = 0 complete 1 ms apart.
        assert_eq!(d.fifo_arrive(Nanos(0), job(0)), Some(Nanos::from_millis(1)));
        for i in 1..10 {
            assert_eq!(d.fifo_arrive(Nanos(0), job(i)), None);
        }
        let mut t = Nanos::from_millis(1);
        for i in 0..9 {
            let f = d.fifo_finish(t);
            assert_eq!(f.id, i);
            assert_eq!(f.busy_from, None);
            t = f.next.unwrap();
            if i == 4 {
                // Halving the capacity doubles the service time of jobs that start from now on; the one in
                // service (started at 5 ms) keeps its 1 ms.
                d.set_capacity(500.0);
            }
        }
        assert_eq!(t, Nanos::from_millis(5 + 1 + 2 * 4));
        let f = d.fifo_finish(t);
        assert_eq!((f.id, f.next, f.busy_from), (9, None, Some(Nanos(0))));
        assert!(d.is_empty() && d.busy_since().is_none());
    }

    #[test]
    fn exponential_mean_is_one_over_capacity() {
        let spec = DeviceSpec::new(2000.0, ServiceModel::Exponential).unwrap();
        let mut d = Device::new(&spec, 7);
        let mut t = d.fifo_arrive(Nanos(0), job(0)).unwrap();
        for i in 1..100_000 {
            d.fifo_arrive(Nanos(0), job(i));
        }
        for _ in 1..100_000 {
            t = d.fifo_finish(t).next.unwrap();
        }
        let per = t.0 as f64 / 100_000.0;
        assert!((per - 500_000.0).abs() < 10_000.0, "{per} ns");
    }

    #[test]
    fn the_neutral_api_drives_both_disciplines() {
        let array = Discipline::Array(ArraySpec { disks: 1, stripe_bytes: 4096, raid: Raid::Zero });
        for discipline in [Discipline::Fifo, Discipline::Ps, array] {
            let mut spec = DeviceSpec::new(1000.0, ServiceModel::Deterministic).unwrap();
            spec.discipline = discipline;
            let mut d = Device::new(&spec, 1);
            let mut wake = None;
            for i in 0..4 {
                if let Some(w) = d.arrive(Nanos(0), job(i)) {
                    wake = Some(w);
                }
            }
            let mut done = Vec::new();
            while let Some(w) = wake {
                wake = d.wake(w.at, w.generation, &mut done);
                if discipline == Discipline::Fifo {
                    // A stale generation is ignored.
                    assert_eq!(d.wake(w.at, w.generation.wrapping_sub(1), &mut Vec::new()), None);
                }
            }
            assert_eq!(done, vec![0, 1, 2, 3], "{discipline:?}");
            assert!(d.is_empty() && d.busy_since().is_none(), "{discipline:?}");
        }
    }

    #[test]
    fn a_disk_table_defaults_each_field_it_omits() {
        let d: DiskParams = toml::from_str("seek_ms = 8").unwrap();
        assert_eq!(d, DiskParams { seek_ms: 8.0, ..DiskParams::default() });
        assert!(toml::from_str::<DiskParams>("seek = 8").unwrap_err().to_string().contains("unknown field `seek`"));
        let c: CapacityStep = toml::from_str("at_s = 60\niops = 600").unwrap();
        assert_eq!(c, CapacityStep { at_s: 60.0, iops: 600.0 });
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let p = |service: &'static str| DeviceParams {
            capacity_iops: 100.0,
            service,
            uniform_spread: None,
            disk: None,
            transfer_mb_s: None,
            discipline: None,
            array: None,
            capacity_schedule: vec![],
        };
        assert!(p("exponential").validate().is_ok());
        assert_eq!(
            p("gamma").validate().unwrap_err().to_string(),
            "service \"gamma\": expected exponential, uniform, deterministic or disk"
        );
        let e = DeviceParams { capacity_iops: -5.0, ..p("exponential") }.validate().unwrap_err();
        assert_eq!(e.to_string(), "capacity_iops must be a positive number, got -5");
        let e = DeviceParams { uniform_spread: Some(2.0), ..p("uniform") }.validate().unwrap_err();
        assert!(e.to_string().contains("uniform_spread"));
        // A model's parameter with another model was ignored; refused as an array without its discipline.
        let e = DeviceParams { uniform_spread: Some(0.9), ..p("exponential") }.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "uniform_spread is for service = \"uniform\", not \"exponential\": remove it, or set service = \"uniform\""
        );
        let e = DeviceParams { disk: Some(DiskParams::default()), ..p("uniform") }.validate().unwrap_err();
        assert!(e.to_string().starts_with("disk is for service = \"disk\", not \"uniform\""), "{e}");
        assert!(DeviceParams { disk: Some(DiskParams::default()), ..p("disk") }.validate().is_ok());
        let e = DeviceParams {
            capacity_schedule: vec![CapacityStep { at_s: 5.0, iops: 10.0 }, CapacityStep { at_s: 2.0, iops: 10.0 }],
            ..p("exponential")
        }
        .validate()
        .unwrap_err();
        assert_eq!(e, DeviceError::ScheduleOrder { at_s: 2.0, after: 5.0 });
        let e = DeviceParams {
            capacity_schedule: vec![CapacityStep { at_s: 5.0, iops: 10.0 }, CapacityStep { at_s: 5.0, iops: 20.0 }],
            ..p("exponential")
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("each time named once (at_s 5 follows 5)"), "{e}");
        let e = DeviceParams { capacity_schedule: vec![CapacityStep { at_s: 5.0, iops: 2e9 }], ..p("exponential") }
            .validate()
            .unwrap_err();
        assert_eq!(e.to_string(), "capacity_schedule.iops 2000000000 is above the bound of 1000000000 IOPS");
        let e = DeviceParams { capacity_iops: 1e10, ..p("exponential") }.validate().unwrap_err();
        assert!(e.to_string().starts_with("capacity_iops 10000000000 is above"), "{e}");
        let e = DeviceParams { discipline: Some("lifo"), ..p("exponential") }.validate().unwrap_err();
        assert!(e.to_string().contains("lifo"));
        let e = DeviceParams { array: Some(ArrayParams::default()), ..p("exponential") }.validate().unwrap_err();
        assert_eq!(e, DeviceError::ArrayWithoutDiscipline { discipline: "fifo" });
        assert_eq!(e.to_string(), "array: given with discipline = \"fifo\"; an array needs discipline = \"array\"");
        let e = DeviceParams {
            discipline: Some("array"),
            array: Some(ArrayParams { raid: 1, ..Default::default() }),
            ..p("exponential")
        };
        let e = e.validate().unwrap_err();
        assert_eq!(e, DeviceError::Array(crate::array::ArrayError::Raid { got: 1 }));
        assert_eq!(e.to_string(), "array: raid must be 0 or 5, got 1");
        let a = DeviceParams { discipline: Some("array"), ..p("exponential") }.validate().unwrap();
        assert_eq!(a.discipline, Discipline::Array(ArraySpec { disks: 10, stripe_bytes: 64 << 10, raid: Raid::Zero }));
        let s = DeviceParams {
            capacity_schedule: vec![CapacityStep { at_s: 0.0, iops: 50.0 }, CapacityStep { at_s: 10.0, iops: 20.0 }],
            ..p("exponential")
        }
        .validate()
        .unwrap();
        assert_eq!(s.schedule, vec![(Nanos::ZERO, 50.0), (Nanos::from_secs(10), 20.0)]);
        assert_eq!(s.capacity_at(Nanos::from_secs(11)), 20.0);
        let d = Device::new(&s, 1);
        assert_eq!(d.capacity(), 50.0);
        // Disk parameters: each names its field; infinities and values past the bound are refused too.
        let disk = |d: DiskParams| DeviceParams { disk: Some(d), ..p("disk") }.validate();
        assert!(disk(DiskParams::default()).is_ok());
        let e = disk(DiskParams { seek_ms: f64::INFINITY, ..DiskParams::default() }).unwrap_err();
        assert_eq!(e.to_string(), "disk.seek_ms must be a number from 0 to 60000, got inf");
        let e = disk(DiskParams { seek_ms: 1e308, ..DiskParams::default() }).unwrap_err();
        assert_eq!(e.to_string(), "disk.seek_ms must be a number from 0 to 60000, got 1e308");
        let e = disk(DiskParams { rotation_ms: -1.0, ..DiskParams::default() }).unwrap_err();
        assert_eq!(e, DeviceError::DiskParam { field: "disk.rotation_ms", value: -1.0, max: MAX_DISK_MS });
        let e = disk(DiskParams { sequential_kb: f64::NAN, ..DiskParams::default() }).unwrap_err();
        assert!(e.to_string().starts_with("disk.sequential_kb must be"), "{e}");
        let e = disk(DiskParams { transfer_mb_s: 0.0, ..DiskParams::default() }).unwrap_err();
        assert_eq!(e.to_string(), "disk.transfer_mb_s must be a positive number, got 0");
    }

    /// `DeviceSpec::new` checks a disk model given in code as a configuration file's is checked, and keeps
    /// it exactly as given.
    #[test]
    fn a_disk_model_from_code_is_checked() {
        let good = DiskModel { seek_ns: 4e6, rotation_ns: 4e6, transfer_bytes_per_ns: 0.1, sequential_bytes: 65536 };
        let s = DeviceSpec::new(100.0, ServiceModel::Disk(good)).unwrap();
        assert_eq!(s.service, ServiceModel::Disk(good));
        let e = DeviceSpec::new(100.0, ServiceModel::Disk(DiskModel { seek_ns: -1.0, ..good })).unwrap_err();
        assert_eq!(e, DeviceError::DiskParam { field: "disk.seek_ms", value: -1e-6, max: MAX_DISK_MS });
        let e = DeviceSpec::new(100.0, ServiceModel::Disk(DiskModel { transfer_bytes_per_ns: f64::NAN, ..good }));
        assert!(e.unwrap_err().to_string().starts_with("disk.transfer_mb_s must be a positive number"));
        let e = DeviceSpec::new(100.0, ServiceModel::Disk(DiskModel { rotation_ns: 1e15, ..good })).unwrap_err();
        assert!(matches!(e, DeviceError::DiskParam { field: "disk.rotation_ms", .. }), "{e}");
    }
}
