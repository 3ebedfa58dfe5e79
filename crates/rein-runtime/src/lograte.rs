//! One rule for log lines that peers or failures can cause as often as they like: the first is logged at
//! once, then at most one line per interval, each saying how many events were not logged since the line
//! before. Sans-IO: the caller passes the time, on whichever clock it keeps (std's monotonic
//! [`Instant`] for refusals, tokio's for the node links, a PARDA host's own [`Nanos`] clock, which its
//! tests drive).
//!
//! Used by [`crate::access::SparseLog`] (refused connections, bad frames: once a second), the PARDA host
//! (failed report exchanges, another host with this host's id, two incarnations of one peer: once a
//! minute) and the gateway's node links (lost sessions and failed reconnects: once a minute, or at once
//! when the reason changes: [`ByReason`]).
//!
//! Counting: a line stands for one event; the other events of the batch it was logged for (`n - 1`) and
//! every event not logged after it count as unlogged, and the next line reports them
//! ([`LogRate::due`]'s answer) and starts the count again.

use rein_core::Nanos;
use std::time::{Duration, Instant};

/// A point in time on some clock.
pub trait Moment: Copy {
    /// The time from `earlier` to `self` (zero if `earlier` is later).
    fn since(self, earlier: Self) -> Duration;
}

impl Moment for Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// tokio's clock (the gateway's node links: a test with paused time drives it).
impl Moment for tokio::time::Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl Moment for Nanos {
    fn since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.saturating_sub(earlier).0)
    }
}

/// The state of one rate-limited line (module comment).
#[derive(Debug, Clone, Copy)]
pub struct LogRate<T> {
    /// When the last line was logged (`None`: never).
    last: Option<T>,
    /// Events not logged since that line.
    unlogged: u64,
}

impl<T> Default for LogRate<T> {
    fn default() -> Self {
        LogRate { last: None, unlogged: 0 }
    }
}

impl<T: Moment> LogRate<T> {
    /// `n` events at `now`: `Some(the events not logged since the last line)` when a line is due (the
    /// first ever, or `every` after the last), else `None` (counted).
    pub fn due(&mut self, now: T, every: Duration, n: u64) -> Option<u64> {
        self.due_or(now, every, n, false)
    }

    /// As [`LogRate::due`], and due at once when `force` (a line that says something new).
    fn due_or(&mut self, now: T, every: Duration, n: u64, force: bool) -> Option<u64> {
        if !force && self.last.is_some_and(|last| now.since(last) < every) {
            self.unlogged = self.unlogged.saturating_add(n);
            return None;
        }
        self.last = Some(now);
        Some(std::mem::replace(&mut self.unlogged, n.saturating_sub(1)))
    }

    /// Whether a line was ever logged.
    pub fn started(&self) -> bool {
        self.last.is_some()
    }

    /// Events not logged since the last line.
    pub fn unlogged(&self) -> u64 {
        self.unlogged
    }
}

/// A [`LogRate`] whose line also comes at once when its reason changes (a node link lost for another
/// reason than the last line said).
#[derive(Debug, Clone)]
pub struct ByReason<T> {
    /// The reason the last line gave.
    reason: Option<String>,
    rate: LogRate<T>,
}

impl<T> Default for ByReason<T> {
    fn default() -> Self {
        ByReason { reason: None, rate: LogRate::default() }
    }
}

impl<T: Moment> ByReason<T> {
    /// One event for `why` at `now`: as [`LogRate::due`], and due at once when `why` is not the last
    /// line's reason (which it then becomes).
    pub fn due(&mut self, now: T, every: Duration, why: &str) -> Option<u64> {
        let changed = self.reason.as_deref() != Some(why);
        let unlogged = self.rate.due_or(now, every, 1, changed)?;
        if changed {
            self.reason = Some(why.to_string());
        }
        Some(unlogged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn at(s: u64) -> Nanos {
        Nanos::from_secs(s)
    }

    /// One event at a time (a refusal): the first at once, the rest of the interval counted, the next line
    /// says how many were not logged.
    #[test]
    fn one_line_per_interval_with_the_count_between() {
        let mut r = LogRate::default();
        assert!(!r.started());
        assert_eq!(r.due(at(0), MINUTE, 1), Some(0), "the first at once");
        assert!(r.started());
        assert_eq!(r.due(at(1), MINUTE, 1), None);
        assert_eq!(r.due(at(59), MINUTE, 1), None);
        assert_eq!(r.unlogged(), 2);
        assert_eq!(r.due(at(60), MINUTE, 1), Some(2), "a minute on: the two between");
        assert_eq!(r.unlogged(), 0);
        assert_eq!(r.due(at(200), MINUTE, 1), Some(0));
    }

    /// Batches: a line stands for one event of its batch, the others count toward the next line.
    #[test]
    fn a_batch_counts_all_but_the_one_its_line_stands_for() {
        let mut r = LogRate::default();
        assert_eq!(r.due(at(0), MINUTE, 3), Some(0));
        assert_eq!(r.due(at(30), MINUTE, 2), None);
        assert_eq!(r.due(at(59), MINUTE, 1), None);
        assert_eq!(r.due(at(60), MINUTE, 1), Some(2 + 2 + 1), "3 - 1, then 2 and 1");
        assert_eq!(r.due(at(61), MINUTE, 1), None);
        assert_eq!(r.due(at(120), MINUTE, 0), Some(1));
        assert_eq!(r.unlogged(), 0, "an empty batch leaves nothing");
    }

    /// Another reason's line is logged at once and takes the count with it; the same reason waits.
    #[test]
    fn another_reason_comes_at_once_with_the_count() {
        let mut r = ByReason::default();
        let t = Instant::now();
        assert_eq!(r.due(t, MINUTE, "refused"), Some(0));
        assert_eq!(r.due(t, MINUTE, "refused"), None);
        assert_eq!(r.due(t, MINUTE, "reset"), Some(1));
        assert_eq!(r.due(t + Duration::from_secs(1), MINUTE, "reset"), None);
        assert_eq!(r.due(t + MINUTE, MINUTE, "reset"), Some(1), "a minute on");
    }
}
