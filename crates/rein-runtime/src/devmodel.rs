//! A modelled device in front of real storage, for repeatable QoS experiments.
//!
//! # Model
//! The device is rein-model's [`Device`], the simulator's own: its service-time distribution, FIFO or
//! processor-sharing discipline, transfer term and capacity schedule mean the same here as in a
//! scenario's `[[servers]]`. The dispatcher admits each request it starts to the model at that moment, and
//! the request completes at the later of its real IO and its modelled completion. So a fast SSD can stand
//! in for "a 1,200 IOPS array", the capacity can follow a schedule or be changed at run time
//! (`ModelledDevice::set_capacity`, behind [`crate::Dispatcher::set_capacity`]), and the same seed gives
//! the same service times as the simulator's server `stream` (default 0; [`rein_model::seed`]).
//!
//! # Driving it (sans-IO)
//! `ModelledDevice` never reads a clock: the dispatcher passes its `now`, arms one timer for
//! `ModelledDevice::next_deadline` and calls `ModelledDevice::advance` when it fires. The model runs on
//! its own time: a completion due at `t` is processed at `t` even if the timer fired late, so a busy
//! dispatcher delays answers but never shifts the modelled schedule.
//!
//! # Late timers do not cost capacity
//! The dispatcher's timer is coarse (tokio rounds up to the millisecond) and a busy machine adds its
//! own delay, so a slot freed by a modelled completion at `t` is refilled at some later real time. Admitting
//! the next job at that real time would leave the modelled device idle in between: at queue depth 1 a
//! 250 IOPS device (4 ms per IO) lost about a fifth of its capacity to ~1 ms of lateness per IO. So a job
//! is admitted at the model time it would have started had the dispatcher been punctual: the later of
//! its arrival at the dispatcher and the model's last event (a completion, a capacity step or an
//! admission), but never earlier than `MAX_BACKDATE` (5 ms) before the real `now` (so a long stall of the
//! process is not replayed as a burst) and never after `now`. Admission times stay non-decreasing, which
//! the device model requires.
//!
//! # Busy time
//! The model counts the time it holds requests (its busy periods, on its own time), as the simulator's
//! server does for utilisation: `ModelledDevice::busy_ns`, read by the dispatcher's snapshot
//! (`GET /api/device`, `rein_device_busy_seconds_total`).
//!
//! # Invariants
//! 1. Every admitted job is answered exactly once: when both its real IO and its modelled service are done.
//! 2. A job's slot is reused only after it is answered.

use rein_core::Nanos;
use rein_model::device::{check_capacity, DeviceError, DeviceSpec, Job, Wake};
use rein_model::seed::{server_stream, stream_seed};
use rein_model::Device;

/// How far before the real `now` a job may be admitted to the model (module comment, "Late timers").
pub(crate) const MAX_BACKDATE: Nanos = Nanos(5_000_000);

/// A device model as configured (`[device_model]` in rein.toml).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    /// The device (capacity, service model, discipline, capacity schedule from server start).
    pub spec: DeviceSpec,
    /// The seed of its service-time stream.
    pub seed: u64,
    /// Which of the simulator's per-server streams it draws from (`server_stream(stream)`): a scenario's
    /// server index, so that node i of `rein cluster` draws the service times of the simulator's server i.
    pub stream: usize,
    /// Multipliers on the service times of named tenants' requests (`service_scale = { vm1 = 1.4 }`):
    /// where a tenant's data lies on the device (placement skew, parda.txt §4.1; a scenario host's
    /// `service_scale`), each in [0.001, 1000]. Tenants not named: 1.
    pub service_scale: Vec<(String, f64)>,
}

/// Where a job stands.
enum Slot<T> {
    Free,
    /// Neither the real IO nor the model is done.
    Running,
    /// The model is done; the real IO is not.
    ModelDone,
    /// The real IO is done (its outcome parked here); the model is not.
    RealDone(T),
}

/// The model driven on the dispatcher's clock; `T` is what waits for a job's answer.
pub(crate) struct ModelledDevice<T> {
    device: Device,
    wake: Option<Wake>,
    schedule: Vec<(Nanos, f64)>,
    next_step: usize,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    finished: Vec<u32>,
    /// The model time of its last event (completion, capacity step, admission): admissions never go
    /// before it.
    last_event: Nanos,
    /// Busy periods that have ended, summed (ns of model time).
    busy_ended_ns: u64,
}

impl<T> ModelledDevice<T> {
    pub(crate) fn new(cfg: &DeviceConfig) -> ModelledDevice<T> {
        ModelledDevice {
            device: Device::new(&cfg.spec, stream_seed(cfg.seed, server_stream(cfg.stream))),
            wake: None,
            schedule: cfg.spec.schedule.clone(),
            next_step: 1,
            slots: Vec::new(),
            free: Vec::new(),
            finished: Vec::new(),
            last_event: Nanos::ZERO,
            busy_ended_ns: 0,
        }
    }

    /// The time the model has held requests since it started, up to `now` (a busy period still open counts
    /// up to `now`).
    pub(crate) fn busy_ns(&self, now: Nanos) -> u64 {
        self.busy_ended_ns + self.device.busy_since().map_or(0, |since| now.0.saturating_sub(since.0))
    }

    /// The current capacity (IOPS).
    pub(crate) fn capacity(&self) -> f64 {
        self.device.capacity()
    }

    /// Changes the capacity until the schedule's next step (if any).
    pub(crate) fn set_capacity(&mut self, iops: f64) -> Result<(), DeviceError> {
        self.device.set_capacity(check_capacity("iops", iops)?);
        Ok(())
    }

    /// A request of `size` bytes at `offset` that reached the dispatcher at `arrived` starts now (real
    /// time `now`): admitted at the model time of the module comment ("Late timers"); returns its job id.
    pub(crate) fn admit(&mut self, now: Nanos, arrived: Nanos, size: u64, offset: u64, write: bool, scale: f64) -> u32 {
        let at = arrived.max(self.last_event).max(now.saturating_sub(MAX_BACKDATE)).min(now);
        self.last_event = at;
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = Slot::Running;
                id
            }
            None => {
                self.slots.push(Slot::Running);
                (self.slots.len() - 1) as u32
            }
        };
        if let Some(w) = self.device.arrive(at, Job { id, size, offset, scale, write }) {
            self.wake = Some(w);
        }
        id
    }

    /// Job `id`'s real IO is done with `outcome`: returned if the model is done too (answer it now), else
    /// kept until it is.
    pub(crate) fn real_done(&mut self, id: u32, outcome: T) -> Option<T> {
        let slot = &mut self.slots[id as usize];
        match std::mem::replace(slot, Slot::Free) {
            Slot::ModelDone => {
                self.free.push(id);
                Some(outcome)
            }
            Slot::Running => {
                *slot = Slot::RealDone(outcome);
                None
            }
            Slot::Free | Slot::RealDone(_) => unreachable!("invariant 1: a job's real IO finishes once"),
        }
    }

    /// When [`ModelledDevice::advance`] has something to do: the next modelled completion or capacity step.
    pub(crate) fn next_deadline(&self) -> Option<Nanos> {
        let step = self.schedule.get(self.next_step).map(|s| s.0);
        match (self.wake.map(|w| w.at), step) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the model up to `now`: capacity steps that are due, then modelled completions; appends the
    /// outcomes of jobs now done on both sides to `ready`, in completion order.
    pub(crate) fn advance(&mut self, now: Nanos, ready: &mut Vec<T>) {
        loop {
            let step = self.schedule.get(self.next_step).copied().filter(|s| s.0 <= now);
            let wake = self.wake.filter(|w| w.at <= now);
            match (step, wake) {
                // Whichever comes first, on the model's own time; a step at the same time as a completion
                // applies to the service that completion starts.
                (Some((at, iops)), w) if w.is_none_or(|w| at <= w.at) => {
                    self.device.set_capacity(iops);
                    self.last_event = self.last_event.max(at);
                    self.next_step += 1;
                }
                (_, Some(w)) => {
                    self.finished.clear();
                    let mut finished = std::mem::take(&mut self.finished);
                    let since = self.device.busy_since();
                    self.wake = self.device.wake(w.at, w.generation, &mut finished);
                    if let (Some(since), None) = (since, self.device.busy_since()) {
                        self.busy_ended_ns += w.at.0.saturating_sub(since.0);
                    }
                    self.last_event = self.last_event.max(w.at);
                    for &id in &finished {
                        let slot = &mut self.slots[id as usize];
                        match std::mem::replace(slot, Slot::Free) {
                            Slot::Running => *slot = Slot::ModelDone,
                            Slot::RealDone(outcome) => {
                                self.free.push(id);
                                ready.push(outcome);
                            }
                            Slot::Free | Slot::ModelDone => unreachable!("invariant 1: a modelled job finishes once"),
                        }
                    }
                    self.finished = finished;
                }
                _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_model::device::{CapacityStep, ServiceModel};

    fn deterministic(iops: f64) -> DeviceConfig {
        DeviceConfig {
            spec: DeviceSpec::new(iops, ServiceModel::Deterministic).unwrap(),
            seed: 1,
            stream: 0,
            service_scale: Vec::new(),
        }
    }

    #[test]
    fn a_job_is_answered_when_both_sides_are_done() {
        let mut d: ModelledDevice<&str> = ModelledDevice::new(&deterministic(1000.0));
        let a = d.admit(Nanos(0), Nanos(0), 4096, 0, false, 1.0);
        let b = d.admit(Nanos(0), Nanos(0), 4096, 0, false, 1.0);
        assert_eq!(d.next_deadline(), Some(Nanos::from_millis(1)));
        // a's real IO is fast: it waits for the model.
        assert_eq!(d.real_done(a, "a"), None);
        let mut ready = Vec::new();
        d.advance(Nanos::from_micros(999), &mut ready);
        assert!(ready.is_empty());
        // The timer fires late (at 2.5 ms): both modelled completions (1 ms and 2 ms) are processed on the
        // model's time; a is ready, b's real IO is still running.
        d.advance(Nanos::from_micros(2500), &mut ready);
        assert_eq!(ready, vec!["a"]);
        assert_eq!(d.next_deadline(), None);
        // b's real IO ends after its model: answered at once.
        assert_eq!(d.real_done(b, "b"), Some("b"));
        // Slots are reused.
        assert_eq!(d.admit(Nanos::from_millis(3), Nanos::from_millis(3), 1, 0, false, 1.0), b);
    }

    /// Busy time is the model's: from the first admission to the last modelled completion of a busy period,
    /// however late the timer fires; idle gaps do not count.
    #[test]
    fn busy_time_counts_the_models_busy_periods() {
        let mut d: ModelledDevice<&str> = ModelledDevice::new(&deterministic(1000.0));
        assert_eq!(d.busy_ns(Nanos::from_millis(5)), 0);
        let a = d.admit(Nanos(0), Nanos(0), 4096, 0, false, 1.0);
        let b = d.admit(Nanos(0), Nanos(0), 4096, 0, false, 1.0);
        d.real_done(a, "a");
        d.real_done(b, "b");
        assert_eq!(d.busy_ns(Nanos::from_micros(1500)), 1_500_000, "an open period counts up to now");
        let mut ready = Vec::new();
        d.advance(Nanos::from_millis(7), &mut ready); // late: the period ended at the model's 2 ms
        assert_eq!(d.busy_ns(Nanos::from_millis(7)), 2_000_000);
        let c = d.admit(Nanos::from_millis(10), Nanos::from_millis(10), 4096, 0, false, 1.0);
        d.real_done(c, "c");
        d.advance(Nanos::from_millis(11), &mut ready);
        assert_eq!(d.busy_ns(Nanos::from_millis(20)), 3_000_000, "the 2-10 ms gap is idle");
    }

    /// rein serve's model of a disk array: reads on different disks complete together; a RAID-5 small write
    /// is a read-modify-write of its data and its parity (two accesses each on two disks).
    #[test]
    fn an_array_model_serves_its_disks_side_by_side() {
        let mut spec = DeviceSpec::new(1000.0, ServiceModel::Deterministic).unwrap();
        spec.discipline = rein_model::Discipline::Array(rein_model::device::ArraySpec {
            disks: 4,
            stripe_bytes: 4096,
            raid: rein_model::device::Raid::Five,
        });
        // 4 disks at 1,000 IOPS in all: 4 ms per access.
        let mut d: ModelledDevice<&str> =
            ModelledDevice::new(&DeviceConfig { spec, seed: 1, stream: 0, service_scale: Vec::new() });
        let a = d.admit(Nanos(0), Nanos(0), 4096, 0, false, 1.0); // unit 0: disk 0
        let b = d.admit(Nanos(0), Nanos(0), 4096, 4096, false, 1.0); // unit 1: disk 1
        let w = d.admit(Nanos(0), Nanos(0), 4096, 8192, true, 1.0); // unit 2: disk 2, its parity on disk 3
        for (j, name) in [(a, "a"), (b, "b"), (w, "w")] {
            assert_eq!(d.real_done(j, name), None);
        }
        assert_eq!(d.next_deadline(), Some(Nanos::from_millis(4)));
        let mut ready = Vec::new();
        d.advance(Nanos::from_millis(4), &mut ready);
        assert_eq!(ready, vec!["a", "b"], "two disks, two reads at once");
        assert_eq!(d.next_deadline(), Some(Nanos::from_millis(8)));
        d.advance(Nanos::from_millis(8), &mut ready);
        assert_eq!(ready, vec!["a", "b", "w"], "the write read and rewrote data and parity");
        assert_eq!(d.busy_ns(Nanos::from_millis(9)), 8_000_000);
    }

    #[test]
    fn the_capacity_follows_its_schedule_and_an_operator() {
        let spec =
            DeviceSpec::scheduled(1000.0, ServiceModel::Deterministic, &[CapacityStep { at_s: 0.010, iops: 500.0 }])
                .unwrap();
        let mut d: ModelledDevice<u32> =
            ModelledDevice::new(&DeviceConfig { spec, seed: 1, stream: 0, service_scale: Vec::new() });
        assert_eq!(d.next_deadline(), Some(Nanos::from_millis(10)), "the step");
        let mut ready = Vec::new();
        d.advance(Nanos::from_millis(10), &mut ready);
        assert_eq!(d.capacity(), 500.0);
        let j = d.admit(Nanos::from_millis(10), Nanos::from_millis(10), 1, 0, false, 1.0);
        assert_eq!(d.next_deadline(), Some(Nanos::from_millis(12)), "half the capacity, twice the time");
        d.real_done(j, 7);
        d.advance(Nanos::from_millis(12), &mut ready);
        assert_eq!(ready, vec![7]);
        assert!(d.set_capacity(-1.0).is_err() && d.set_capacity(f64::NAN).is_err());
        d.set_capacity(2000.0).unwrap();
        assert_eq!(d.capacity(), 2000.0);
    }

    #[test]
    fn a_late_timer_does_not_idle_the_model() {
        // Queue depth 1 on a 1,000 IOPS deterministic device: job a completes at 1 ms, but the timer fires
        // at 1.7 ms. b, waiting since 0.5 ms, starts at the model's 1 ms (not at 1.7 ms) and completes at
        // 2 ms, as with a punctual dispatcher.
        let mut d: ModelledDevice<&str> = ModelledDevice::new(&deterministic(1000.0));
        let a = d.admit(Nanos(0), Nanos(0), 4096, 0, false, 1.0);
        d.real_done(a, "a");
        let mut ready = Vec::new();
        d.advance(Nanos::from_micros(1700), &mut ready);
        assert_eq!(ready, vec!["a"]);
        let b = d.admit(Nanos::from_micros(1700), Nanos::from_micros(500), 4096, 0, false, 1.0);
        assert_eq!(d.next_deadline(), Some(Nanos::from_millis(2)));
        d.real_done(b, "b");
        // A job that arrives after the slot freed starts at its arrival (2.3 ms), not earlier.
        d.advance(Nanos::from_micros(2600), &mut ready);
        let c = d.admit(Nanos::from_micros(2600), Nanos::from_micros(2300), 4096, 0, false, 1.0);
        assert_eq!(d.next_deadline(), Some(Nanos::from_micros(3300)));
        d.real_done(c, "c");
        // A stall longer than MAX_BACKDATE is not replayed: admitted MAX_BACKDATE before now.
        d.advance(Nanos::from_millis(4), &mut ready);
        let now = Nanos::from_millis(100);
        let e = d.admit(now, Nanos::from_millis(4), 4096, 0, false, 1.0);
        assert_eq!(d.next_deadline(), Some(now.saturating_sub(MAX_BACKDATE).saturating_add(Nanos::from_millis(1))));
        d.real_done(e, "e");
    }
}
