//! Stalls of this process, seen by a thread of its own, for latencies that must not hold them.
//!
//! # Model
//! A latency is a clock read at the reply less one at the send. When the process does not run between
//! the two (SIGSTOP, a paused VM, heavy swapping) the latency holds the pause. A [`StallWatch`] is fed by
//! a plain thread that ticks every [`TICK`]; two ticks more than `TICK` plus `crate::STALLED` apart mean
//! the process did not run (the rule `remote.rs` and `nbd.rs` apply to their timers), and the watch
//! records the stall: its end and its length.
//!
//! # Invariants
//! 1. [`StallWatch::crossed`]`(sent, now)` is true for every interval `(sent, now]` that holds a stall of
//!    more than `TICK + STALLED`, whatever the reader's place in the process: either the thread has ticked
//!    since the process ran again (the stall's end, which is after `sent`, is recorded before the tick
//!    that reports it), or it has not (its last tick is before the stall, more than `TICK + STALLED` ago).
//!    No ordering between the reader and the watch thread is needed.
//! 2. False positives are bounded: an interval that began after the stall ended is crossed only while the
//!    thread has not ticked since (one tick, [`TICK`], after the process runs again).
//! 3. The watch's thread ends at its next tick after the last [`Arc`] to the watch is dropped.
//! 4. [`StallWatch::last_stall`] gives the latest stall's interval, recorded or still in progress (then
//!    from the tick missed to the reader's `now`), for a reader that must take the stall's time out of
//!    a measurement (the pShift server's busy time, `dispatch.rs`).
//!
//! # The process's watch
//! One watch serves the whole process ([`process`]): the daemons start it with their start, and the
//! PARDA host's gate and the pShift server's dispatcher ask it. Each stall is logged once, at WARN, by
//! the watch's thread (`this process did not run for 3.0 s ...`), and counted for `/metrics`
//! ([`metrics`]: `rein_process_stalls_total`, `rein_process_stalled_seconds_total`; alert
//! ReinProcessStalled): a server that was stopped, paused or swapped out shows it there, where before
//! only the latencies its clients saw (and a PARDA host's own counter) did. Readers on clocks of their
//! own convert with [`StallWatch::now`] (the watch's clock, from the watch's start).
//!
//! # Why a thread of its own
//! The PARDA gate first watched its own timers, which saw a stall only while the gate waited: a stop that
//! fell while it ran, or while it awaited a node connection's backpressure in `pump`, was missed, and the
//! IOs in flight brought the pause into the estimate (CI read 1,049 ms once). A thread that does nothing
//! but tick is waiting nearly always, and the reply path asks it, not the gate.

use rein_core::Nanos;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

/// How often the watch's thread ticks.
pub(crate) const TICK: Nanos = Nanos::from_millis(50);

/// The longest gap between ticks that is not a stall: a tick late by more than `crate::STALLED`.
fn gap_max() -> Nanos {
    TICK.saturating_add(Nanos::from_duration(crate::STALLED))
}

/// A process's stalls (module comment). Times are on its own clock ([`StallWatch::now`]).
#[derive(Debug)]
pub(crate) struct StallWatch {
    /// Its clock's zero.
    origin: Instant,
    /// The last tick (ns).
    last_tick: AtomicU64,
    /// When the last stall ended (ns; 0: none yet).
    last_end: AtomicU64,
    /// How long the last stall was (ns).
    last_len: AtomicU64,
    /// Stalls seen.
    stalls: AtomicU64,
    /// Their lengths, summed (ns).
    stalled_ns: AtomicU64,
}

impl Default for StallWatch {
    fn default() -> Self {
        StallWatch {
            origin: Instant::now(),
            last_tick: AtomicU64::new(0),
            last_end: AtomicU64::new(0),
            last_len: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            stalled_ns: AtomicU64::new(0),
        }
    }
}

/// The process's watch, once started ([`process`]).
static PROCESS: Mutex<Option<Arc<StallWatch>>> = Mutex::new(None);

/// Why the process's stall watch cannot start (`stall::process`): its thread did not, for the operating
/// system's reason. The PARDA host's start and the pShift server's welcome carry it as it is.
#[derive(Debug, thiserror::Error)]
#[error("the thread that watches for stalls did not start: {0}")]
pub struct StallWatchError(#[source] std::io::Error);

/// The process's watch (module comment, "The process's watch"), started by the first call; it ticks
/// until the process ends. An error if its thread cannot be started (a later call tries again).
pub(crate) fn process() -> Result<Arc<StallWatch>, StallWatchError> {
    process_in(&PROCESS, StallWatch::start)
}

/// [`process`] on `slot`, starting the watch with `start` if the slot holds none.
fn process_in(
    slot: &Mutex<Option<Arc<StallWatch>>>,
    start: impl FnOnce() -> std::io::Result<Arc<StallWatch>>,
) -> Result<Arc<StallWatch>, StallWatchError> {
    let mut p = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(w) = p.as_ref() {
        return Ok(w.clone());
    }
    let w = start().map_err(StallWatchError)?;
    *p = Some(w.clone());
    Ok(w)
}

/// A daemon's start: the process's watch ([`process`]); a thread that cannot start is logged, and the
/// daemon runs on without (its PARDA host or pShift link then fails to start, naming it).
pub(crate) fn watch_process() {
    if let Err(e) = process() {
        tracing::warn!("{e}: stalls of this process are not watched");
    }
}

/// The process's stalls for `/metrics` (nothing before [`process`] started the watch).
pub(crate) fn metrics(o: &mut String) {
    use std::fmt::Write;
    let Some(w) = PROCESS.lock().unwrap_or_else(|e| e.into_inner()).clone() else { return };
    let _ = writeln!(
        o,
        "# HELP rein_process_stalls_total Times this process did not run for more than a second (stopped, \
         a paused VM, heavy swapping).\n# TYPE rein_process_stalls_total counter\nrein_process_stalls_total {}\n\
         # HELP rein_process_stalled_seconds_total Seconds this process did not run, over those stalls.\n\
         # TYPE rein_process_stalled_seconds_total counter\nrein_process_stalled_seconds_total {}",
        w.stalls(),
        w.stalled_ns.load(Ordering::SeqCst) as f64 / 1e9
    );
}

impl StallWatch {
    /// A watch whose thread ticks until the watch is dropped (invariant 3), logging each stall once. An
    /// error if the thread cannot be started.
    fn start() -> std::io::Result<Arc<StallWatch>> {
        Self::start_joinable().map(|(w, _)| w)
    }

    /// [`StallWatch::start`], with the thread's handle.
    fn start_joinable() -> std::io::Result<(Arc<StallWatch>, std::thread::JoinHandle<()>)> {
        let watch = Arc::new(StallWatch::default());
        watch.tick(watch.now());
        let weak: Weak<StallWatch> = Arc::downgrade(&watch);
        let thread = std::thread::Builder::new().name("rein-stall-watch".into()).spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_nanos(TICK.0));
            let Some(w) = weak.upgrade() else { break };
            if let Some(len) = w.tick(w.now()) {
                tracing::warn!(
                    stalled_s = len.as_secs_f64(),
                    "this process did not run for {:.1} s (stopped, a paused VM, heavy swapping): what came \
                     meanwhile waited that long for it (counted in rein_process_stalls_total)",
                    len.as_secs_f64()
                );
            }
        })?;
        Ok((watch, thread))
    }

    /// Now on the watch's clock (the times it records and is asked about).
    pub(crate) fn now(&self) -> Nanos {
        Nanos::from_duration(self.origin.elapsed())
    }

    /// A tick at `now`: returns the stall's length if the last tick is more than `TICK + STALLED` back.
    pub(crate) fn tick(&self, now: Nanos) -> Option<Nanos> {
        let last = Nanos(self.last_tick.load(Ordering::SeqCst));
        let gap = now.saturating_sub(last);
        let stall = (last.0 > 0 && gap > gap_max()).then(|| gap.saturating_sub(TICK));
        if let Some(len) = stall {
            // The end before the tick (invariant 1): a reader that sees this tick sees the stall.
            self.last_len.store(len.0, Ordering::SeqCst);
            self.last_end.store(now.0.max(1), Ordering::SeqCst);
            self.stalls.fetch_add(1, Ordering::SeqCst);
            self.stalled_ns.fetch_add(len.0, Ordering::SeqCst);
        }
        self.last_tick.store(now.0.max(1), Ordering::SeqCst);
        stall
    }

    /// Whether the interval from `sent` to `now` may hold a stall (invariants 1 and 2).
    pub(crate) fn crossed(&self, sent: Nanos, now: Nanos) -> bool {
        let last = Nanos(self.last_tick.load(Ordering::SeqCst));
        let end = self.last_end.load(Ordering::SeqCst);
        now.saturating_sub(last) > gap_max() || (end > 0 && end >= sent.0)
    }

    /// The latest stall as an interval (start, end), read at `now`: the one recorded, or, while the
    /// thread has not ticked since the process ran again, the one in progress, from one tick after the
    /// last (when the thread would have ticked) to `now`. `None` before any stall.
    pub(crate) fn last_stall(&self, now: Nanos) -> Option<(Nanos, Nanos)> {
        let last = Nanos(self.last_tick.load(Ordering::SeqCst));
        if now.saturating_sub(last) > gap_max() {
            return Some((last.saturating_add(TICK), now));
        }
        let end = Nanos(self.last_end.load(Ordering::SeqCst));
        (end.0 > 0).then(|| (end.saturating_sub(self.last_len()), end))
    }

    /// Stalls seen so far.
    pub(crate) fn stalls(&self) -> u64 {
        self.stalls.load(Ordering::SeqCst)
    }

    /// The last stall's length.
    pub(crate) fn last_len(&self) -> Nanos {
        Nanos(self.last_len.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Nanos {
        Nanos::from_millis(v)
    }

    /// Ticks every 50 ms, then none for 3 s (a SIGSTOP): an IO sent before the stop and answered after
    /// it is crossed whether the reply is read before the next tick or after it; IOs answered before the
    /// stop, or sent after the tick that saw it, are not. (A reply is read at `now`, the present.)
    #[test]
    fn an_interval_across_a_stall_is_crossed_before_and_after_the_watch_sees_it() {
        let w = StallWatch::default();
        for t in (50..=1000).step_by(50) {
            assert_eq!(w.tick(ms(t)), None);
        }
        assert!(!w.crossed(ms(900), ms(1000)), "no stall yet");
        assert_eq!(w.last_stall(ms(1000)), None);
        // Stopped at 1,010 ms, continued at 4,000 ms; the reply is read at 4,001 ms, before a tick.
        assert!(w.crossed(ms(990), ms(4001)), "the watch has not ticked since the stall");
        assert_eq!(w.stalls(), 0);
        assert_eq!(w.last_stall(ms(4001)), Some((ms(1050), ms(4001))), "in progress: from the tick missed");
        assert_eq!(w.tick(ms(4010)), Some(ms(2960)));
        assert_eq!(w.last_stall(ms(4020)), Some((ms(1050), ms(4010))), "recorded");
        assert_eq!((w.stalls(), w.last_len()), (1, ms(2960)));
        assert_eq!(w.stalled_ns.load(Ordering::SeqCst), ms(2960).0);
        assert!(w.crossed(ms(990), ms(4020)), "sent before the stall's end");
        assert!(!w.crossed(ms(4015), ms(4030)), "sent after the stall was seen");
        // A tick late by less than STALLED is no stall.
        assert_eq!(w.tick(ms(4010 + 1040)), None);
        assert_eq!(w.stalls(), 1);
    }

    /// The rule's edge: a gap of exactly `TICK + STALLED` is no stall, one nanosecond more is.
    #[test]
    fn a_gap_just_over_the_rule_is_a_stall_and_just_under_is_not() {
        let w = StallWatch::default();
        w.tick(ms(50));
        let edge = ms(50).saturating_add(gap_max());
        assert_eq!(w.tick(edge), None, "exactly TICK + STALLED");
        let at = edge.saturating_add(gap_max()).saturating_add(Nanos(1));
        assert!(w.crossed(ms(60), at));
        assert_eq!(w.tick(at), Some(gap_max().saturating_add(Nanos(1)).saturating_sub(TICK)));
    }

    /// The process's watch is one, started once; `/metrics` shows its counters.
    #[test]
    fn the_process_has_one_watch_whose_counters_are_metrics() {
        let (a, b) = (process().unwrap(), process().unwrap());
        assert!(Arc::ptr_eq(&a, &b));
        let mut o = String::new();
        metrics(&mut o);
        assert!(o.contains("# TYPE rein_process_stalls_total counter\nrein_process_stalls_total "), "{o}");
        assert!(o.contains("\nrein_process_stalled_seconds_total "), "{o}");
    }

    /// A watch whose thread cannot start is named once, as the PARDA host's start and the pShift
    /// server's welcome say it, and a later call tries again.
    #[test]
    fn a_watch_that_cannot_start_is_named_once_and_tried_again() {
        let slot = Mutex::new(None);
        let refused = || Err(std::io::Error::other("no threads left"));
        let e = process_in(&slot, refused).unwrap_err();
        assert_eq!(e.to_string(), "the thread that watches for stalls did not start: no threads left");
        let source = std::error::Error::source(&e).expect("the operating system's error is the source");
        assert_eq!(source.to_string(), "no threads left");
        let host = crate::parda_host::StartError::StallWatch(process_in(&slot, refused).unwrap_err());
        assert_eq!(host.to_string(), "parda_host: the thread that watches for stalls did not start: no threads left");
        let server = crate::dispatch::PshiftError::StallWatch(process_in(&slot, refused).unwrap_err());
        assert_eq!(server.to_string(), "the thread that watches for stalls did not start: no threads left");
        let w = process_in(&slot, StallWatch::start).unwrap();
        assert!(Arc::ptr_eq(&w, &process_in(&slot, refused).unwrap()), "started once, then kept");
    }

    /// The thread ticks, and ends once the watch is dropped (invariant 3).
    #[test]
    fn the_thread_ticks_and_ends_after_its_watch() {
        let (w, thread) = StallWatch::start_joinable().unwrap();
        let first = w.last_tick.load(Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        while w.last_tick.load(Ordering::SeqCst) == first {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "no tick in 10 s");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(w);
        let t0 = std::time::Instant::now();
        while !thread.is_finished() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the thread outlived its watch by 10 s");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
