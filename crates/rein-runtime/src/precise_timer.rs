//! A timer with the kernel's precision for the dispatcher's deadlines and `rein load`'s workload timers
//! (a Linux timerfd).
//!
//! # Why
//! tokio's timer wheel rounds a deadline up to the next millisecond, and its driver then sleeps in
//! `epoll_wait` with a timeout of whole milliseconds, so a `sleep_until` fires 0-2 ms late (straced on
//! this VM: the dispatcher's waits were `epoll_wait(.., 1)` and `epoll_wait(.., 2)`). The dispatcher's
//! deadlines are a device model's next completion and a scheduler's limit or reservation tag, so on
//! tokio's timer alone a modelled device answers in clumps at millisecond ticks, and the order and
//! timing in which the scheduler then sees slots free differ from the model's. On `rein cluster`,
//! mClock Table 5 with locality batching on a position-dependent disk model (mclock-table5-batch)
//! gave vm2 0.843x of the simulator's IOPS on tokio's timer and 0.956x with this one. A completion
//! answered late is also a longer round trip for a closed-loop client, whose queue at the scheduler
//! then stays empty for longer: with the scheduler counting the requests a tenant has at the device
//! (rein-core's `Request::pending_here`), RBFQ Fig. 8's vm1 got 568-571 IOPS before the capacity drop
//! on tokio's timer (two 30 s runs) and 518-624 with this one (eight 128 s runs, median 528.5),
//! against eq. (1)'s 512 and the simulator's 513 (docs/reproductions.md Part 5).
//!
//! `rein load`'s driver waits for its workload's next timer (an open loop's arrival, a trace record, a
//! closed loop's think time ending) the same way. On tokio's timer alone each think time ended about
//! 1 ms late, so a closed loop with think times ran slower than its model on every cycle: PARDA
//! Table 7's host-2 VM (13 IOs, 1.61 ms of think) got 0.936-0.960x of the simulator's IOPS on
//! `rein cluster`.
//!
//! # Model
//! One timerfd on `CLOCK_MONOTONIC` (the clock of `std` and tokio `Instant`s on Linux), registered with
//! tokio's reactor. [`PreciseTimer::arm`] sets it for a deadline (relative to now, at least 1 ns: a zero
//! value would disarm it), or disarms it; arming for the deadline it already holds makes no system call.
//! [`PreciseTimer::fired`] completes once the armed deadline has passed. [`sleep_until`], which the
//! dispatcher and the load call, arms it and waits for it beside tokio's own `sleep_until` for the same
//! deadline, whichever comes first: with tokio's clock
//! paused (tests) the sleep fires at the virtual deadline, and the timerfd's real-time firing is one
//! more wake-up of a loop that treats every wake-up alike (the scheduler and the model are asked what
//! is due at the clock's `now`, which an early or extra wake-up does not change).
//!
//! # Invariants
//! 1. `fired` never completes before the deadline it was armed for (the kernel's guarantee), and after
//!    completing the timer is disarmed until armed again.
//! 2. Where the kernel refuses a timerfd, [`PreciseTimer::new`] fails and the dispatcher keeps tokio's
//!    timer alone.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::Instant;

/// A one-shot timer on a timerfd (module comment).
#[derive(Debug)]
pub(crate) struct PreciseTimer {
    fd: AsyncFd<OwnedFd>,
    /// The deadline it is armed for.
    armed: Option<Instant>,
}

/// A timer where the kernel gives one; else `None`, after a warning that `what` fires up to 2 ms late
/// (invariant 2).
pub(crate) fn optional(what: &str) -> Option<PreciseTimer> {
    PreciseTimer::new().map_err(|e| tracing::warn!("no timerfd ({e}): {what} fire up to 2 ms late")).ok()
}

/// Arms `timer` for `at` (disarms it for `None`) and completes at `at`, on tokio's sleep or the timerfd,
/// whichever fires first; never completes for `None`. Called afresh for each wait of a loop, it keeps the
/// timerfd armed for the loop's current deadline.
pub(crate) async fn sleep_until(timer: &mut Option<PreciseTimer>, at: Option<Instant>) {
    if let Some(t) = timer.as_mut() {
        t.arm(at);
    }
    let Some(at) = at else {
        return std::future::pending().await;
    };
    match timer {
        Some(t) => tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = t.fired() => {}
        },
        None => tokio::time::sleep_until(at).await,
    }
}

impl PreciseTimer {
    /// A disarmed timer, registered with the current tokio runtime's reactor.
    #[allow(unsafe_code)] // timerfd_create(2) has no safe wrapper in std; see the SAFETY comment.
    pub(crate) fn new() -> io::Result<PreciseTimer> {
        // SAFETY: timerfd_create takes only integer flags; a non-negative result is a new descriptor
        // that nothing else owns, so OwnedFd may take it.
        let fd = unsafe {
            let raw = libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC);
            if raw < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(raw)
        };
        // SAFETY: the AsyncFd owns `fd` (an OwnedFd), which stays open and the same until it is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(io::Error::from)?;
        Ok(PreciseTimer { fd, armed: None })
    }

    /// Arms the timer for `at`, or disarms it (`None`). A no-op when it is already armed for `at`.
    #[allow(unsafe_code)] // timerfd_settime(2) has no safe wrapper in std; see the SAFETY comment.
    pub(crate) fn arm(&mut self, at: Option<Instant>) {
        if at == self.armed {
            return;
        }
        self.armed = at;
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let value = match at {
            None => zero,
            Some(t) => {
                let d = t.saturating_duration_since(Instant::now());
                // A zero value disarms a timerfd: a deadline already due fires after 1 ns.
                let nanos = if d.is_zero() { 1 } else { d.subsec_nanos() };
                libc::timespec {
                    tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
                    tv_nsec: nanos as libc::c_long,
                }
            }
        };
        let spec = libc::itimerspec { it_interval: zero, it_value: value };
        // SAFETY: the descriptor is the timerfd this value owns; `spec` is a valid itimerspec that the call
        // only reads; the old value is not asked for (null).
        let r = unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r != 0 {
            // Cannot happen for a valid timerfd and value; tokio's sleep still wakes the dispatcher.
            tracing::debug!("timerfd_settime: {}", io::Error::last_os_error());
        }
    }

    /// Completes once the armed deadline has passed (never, while disarmed); the timer is then disarmed.
    #[allow(unsafe_code)] // read(2) of a timerfd's 8-byte count; see the SAFETY comment.
    pub(crate) async fn fired(&mut self) {
        loop {
            let Ok(mut guard) = self.fd.readable().await else {
                // The reactor is gone (shutdown): never fire.
                return std::future::pending().await;
            };
            let mut count = [0u8; 8];
            // SAFETY: reads at most 8 bytes into `count`, which is 8 bytes long, from the timerfd this value
            // owns (non-blocking: EAGAIN when it has not expired).
            let n = unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
            if n == 8 {
                self.armed = None;
                return;
            }
            guard.clear_ready();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Invariant 1: it fires, not before its deadline, and then stays quiet until armed again; disarmed
    /// or re-armed later, it does not fire at the earlier deadline.
    #[tokio::test]
    async fn fires_at_its_deadline_and_not_before() {
        let mut t = PreciseTimer::new().expect("timerfd");
        let at = Instant::now() + Duration::from_millis(20);
        t.arm(Some(at));
        tokio::time::timeout(Duration::from_secs(10), t.fired()).await.expect("fired");
        assert!(Instant::now() >= at, "fired before its deadline");
        assert!(tokio::time::timeout(Duration::from_millis(50), t.fired()).await.is_err(), "fired twice");
        // Disarmed: nothing.
        t.arm(Some(Instant::now() + Duration::from_millis(10)));
        t.arm(None);
        assert!(tokio::time::timeout(Duration::from_millis(50), t.fired()).await.is_err(), "fired disarmed");
        // Moved later: not at the first deadline.
        let later = Instant::now() + Duration::from_millis(80);
        t.arm(Some(Instant::now() + Duration::from_millis(5)));
        t.arm(Some(later));
        tokio::time::timeout(Duration::from_secs(10), t.fired()).await.expect("fired");
        assert!(Instant::now() >= later, "fired at the old deadline");
        // A deadline already past fires at once.
        t.arm(Some(Instant::now() - Duration::from_millis(1)));
        tokio::time::timeout(Duration::from_secs(10), t.fired()).await.expect("a past deadline fires");
    }
}
