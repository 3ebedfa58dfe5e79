//! # Telling a service manager where a daemon is (systemd's `sd_notify` protocol)
//!
//! A daemon that a service manager starts with `Type=notify` (systemd; contrib/systemd has units) is
//! "started" only once it says so, and can tell it more as it runs. Each of `rein serve`, `rein gateway`
//! and `rein pshift controller` says:
//! - `READY=1` with a `STATUS=` line once it listens (its listening log line, as its own log says it):
//!   units that come after it (`After=`, `Requires=`) start only then, and `systemctl start` returns
//!   then, so a client started next never meets a refused connection;
//! - `RELOADING=1` (with `MONOTONIC_USEC=`, as `Type=notify-reload` asks) when a SIGHUP's reload begins,
//!   and `READY=1` again when it has ended, applied or refused, with the outcome in `STATUS=` (a reload
//!   that failed keeps the running configuration; `systemctl status` shows why);
//! - `EXTEND_TIMEOUT_USEC=` before a start-up step that may take long (`rein serve`'s capacity probe,
//!   up to 3 x 60 s): the unit's start timeout then counts from there;
//! - `STOPPING=1` when its graceful stop begins (the stop answers the requests in flight within
//!   `shutdown_timeout_s`: a unit's `TimeoutStopSec` should be longer);
//! - `WATCHDOG=1` at half the unit's `WatchdogSec`, from the daemon's accept loop itself (a loop that
//!   stops turning stops the pings, and the service manager restarts the daemon).
//!
//! Without `$NOTIFY_SOCKET` (started from a shell, by `rein cluster`, by a test) every call is a no-op,
//! and without `$WATCHDOG_USEC` (or with a `$WATCHDOG_PID` of another process) there are no pings. A
//! message that cannot be sent (the socket gone) is logged once, as a warning, and the daemon runs on:
//! telling the manager is never a reason to stop serving. The protocol's datagrams are written by the
//! `sd-notify` crate (no libsystemd).
//!
//! `rein cluster` removes these variables from the daemons it starts: under a unit of its own, its
//! children are not the unit's main process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The environment variables of the protocol, removed from the environment of the daemons `rein cluster`
/// starts (module comment).
pub const ENV: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// Set once a message could not be sent (logged once).
static FAILED: AtomicBool = AtomicBool::new(false);

fn send(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        if !FAILED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "could not tell the service manager ($NOTIFY_SOCKET): {e}; the daemon runs on (logged once)"
            );
        }
    }
}

/// A `STATUS=` text on one line (the protocol's lines end at a newline).
fn one_line(status: &str) -> String {
    status.replace(['\n', '\r'], " ")
}

/// `READY=1`: the daemon listens, or a reload has ended; `status` says what it is doing.
pub fn ready(status: &str) {
    let status = one_line(status);
    send(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status(&status)]);
}

/// `RELOADING=1`: a reload (SIGHUP) has begun; [`ready`] follows when it has ended.
pub fn reloading() {
    let mut states = vec![sd_notify::NotifyState::Reloading, sd_notify::NotifyState::Status("reloading")];
    if let Ok(now) = sd_notify::NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    send(&states);
}

/// `EXTEND_TIMEOUT_USEC=`: the start takes `longer` more than it has so far (a capacity probe of
/// minutes outlasted a unit's default 90 s start timeout, and `Restart=on-failure` started it over for
/// good); `status` says why.
pub fn extend_start(longer: Duration, status: &str) {
    let usec = u32::try_from(longer.as_micros()).unwrap_or(u32::MAX);
    let status = one_line(status);
    send(&[sd_notify::NotifyState::ExtendTimeoutUsec(usec), sd_notify::NotifyState::Status(&status)]);
}

/// `STOPPING=1`: the graceful stop has begun.
pub fn stopping() {
    send(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping: answering the requests in flight"),
    ]);
}

/// The unit's watchdog, pinged from a daemon's accept loop: a `tokio::select!` branch on
/// [`Watchdog::tick`] followed by [`Watchdog::ping`]. Without a watchdog, `tick` never resolves.
#[derive(Debug)]
pub struct Watchdog {
    every: Option<tokio::time::Interval>,
}

impl Watchdog {
    /// The watchdog the environment asks for (`$WATCHDOG_USEC`, for this process): pinged at half its
    /// timeout, as sd_watchdog_enabled(3) advises. Must be called inside the runtime.
    pub fn from_env() -> Watchdog {
        Watchdog::every(sd_notify::watchdog_enabled().map(|t| t / 2))
    }

    fn every(period: Option<Duration>) -> Watchdog {
        Watchdog {
            every: period.filter(|p| !p.is_zero()).map(|p| {
                let mut i = tokio::time::interval(p);
                // A loop that was held up pings once when it turns again, not once per missed period.
                i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                i
            }),
        }
    }

    /// Resolves when the next ping is due; never without a watchdog.
    pub async fn tick(&mut self) {
        match &mut self.every {
            Some(i) => {
                i.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    /// `WATCHDOG=1`.
    pub fn ping(&self) {
        send(&[sd_notify::NotifyState::Watchdog]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_stays_on_one_line() {
        assert_eq!(one_line("reload failed: a\nb\r\nc"), "reload failed: a b  c");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_watchdog_tick_never_resolves_and_with_one_it_ticks_at_its_period() {
        let mut none = Watchdog::every(None);
        assert!(tokio::time::timeout(Duration::from_secs(3600), none.tick()).await.is_err());
        let mut zero = Watchdog::every(Some(Duration::ZERO));
        assert!(tokio::time::timeout(Duration::from_secs(3600), zero.tick()).await.is_err(), "0 is no watchdog");
        let mut w = Watchdog::every(Some(Duration::from_millis(500)));
        let t0 = tokio::time::Instant::now();
        w.tick().await; // the first tick is at once
        w.tick().await;
        w.tick().await;
        assert_eq!(t0.elapsed(), Duration::from_millis(1000));
    }
}
