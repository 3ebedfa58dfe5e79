//! What `rein load` says during a run about the errors each job's server answers, decided from the run's
//! time passed in (no clock, no IO: the load's driver logs the lines and calls [`JobWatch::check`] once
//! per interval).
//!
//! # Errors
//! A request the server answers with an error is said at once the first time (which request, which
//! error), and then at most once per [`ERRORS_EVERY`] (crate::lograte's rule): how many failed since
//! the line before, how many in all, and the last one; a check says the count once [`ERRORS_EVERY`]
//! has passed without a failure to carry it. A server failing every request was said only at the
//! run's end (96,828 requests failed in a 5 s run, the live table reading `0.0 IOPS`).
//!
//! # Bounds
//! A job's watch holds a few words and one request's description; a check's lines are at most one per
//! job.

use crate::lograte::LogRate;
use rein_core::Nanos;
use std::time::Duration;

/// At most one line per job this often about the errors its server answers, after the first.
pub(crate) const ERRORS_EVERY: Duration = Duration::from_secs(5);

/// A request the server answered with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answered {
    /// A READ (else a WRITE).
    pub(crate) read: bool,
    /// Its length.
    pub(crate) bytes: u64,
    /// Its offset.
    pub(crate) offset: u64,
    /// The NBD error number the server answered.
    pub(crate) errno: u32,
}

impl std::fmt::Display for Answered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server answered a {} of {} bytes at offset {} with error {} ({})",
            if self.read { "read" } else { "write" },
            self.bytes,
            self.offset,
            self.errno,
            rein_proto::nbd::errno_name(self.errno)
        )
    }
}

/// What one job's errors have said (module comment).
#[derive(Debug, Default)]
pub(crate) struct JobWatch {
    errors: LogRate<Nanos>,
    /// When the last errors line was said.
    errors_said: Nanos,
    /// Errors answered in all, and the last one.
    errors_total: u64,
    last_error: Option<Answered>,
}

impl JobWatch {
    /// The server answered `what` with an error at `now`: the line to log now (at WARN), if one is due
    /// (the first at once; then at most one per [`ERRORS_EVERY`], with the count since the last).
    pub(crate) fn failed(&mut self, job: &str, now: Nanos, what: Answered) -> Option<String> {
        self.errors_total += 1;
        self.last_error = Some(what);
        let first = !self.errors.started();
        let unsaid = self.errors.due(now, ERRORS_EVERY, 1)?;
        let since = now.saturating_sub(self.errors_said);
        self.errors_said = now;
        Some(if first {
            format!("job {job}: {what}; its further errors are counted here every {} s", ERRORS_EVERY.as_secs())
        } else {
            self.count_line(job, unsaid + 1, since)
        })
    }

    /// `n` errors in `since`: the count line.
    fn count_line(&self, job: &str, n: u64, since: Nanos) -> String {
        let last = self.last_error.map_or_else(String::new, |a| format!("; the last: {a}"));
        format!(
            "job {job}: {n} more request{} failed in {:.1} s ({} in all){last}",
            if n == 1 { "" } else { "s" },
            since.as_secs_f64(),
            self.errors_total
        )
    }

    /// The line due at `now` for job `job` (at WARN), if any: the errors not yet counted once
    /// [`ERRORS_EVERY`] has passed.
    pub(crate) fn check(&mut self, job: &str, now: Nanos) -> Option<String> {
        if self.errors.unlogged() == 0 || now.saturating_sub(self.errors_said) < Nanos::from_duration(ERRORS_EVERY) {
            return None;
        }
        let since = now.saturating_sub(self.errors_said);
        let n = self.errors.due(now, ERRORS_EVERY, 0).filter(|&n| n > 0)?;
        self.errors_said = now;
        Some(self.count_line(job, n, since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: f64) -> Nanos {
        Nanos::from_secs_f64(x)
    }

    /// Errors: the first at once, then one count line per ERRORS_EVERY at most (on an error, or at a
    /// check once the interval has passed), each with the count since the last line and in all.
    #[test]
    fn errors_are_said_once_then_counted() {
        let mut w = JobWatch::default();
        let eio = |offset| Answered { read: true, bytes: 4096, offset, errno: 5 };
        let first = w.failed("x", s(0.0), eio(0));
        assert_eq!(
            first.as_deref(),
            Some(
                "job x: the server answered a read of 4096 bytes at offset 0 with error 5 (EIO); its further \
                 errors are counted here every 5 s"
            )
        );
        for k in 1..1000 {
            assert_eq!(w.failed("x", s(k as f64 * 0.004), eio(k * 4096)), None, "{k}");
        }
        assert_eq!(w.check("x", s(4.9)), None);
        let line = w.failed("x", s(5.0), eio(8192)).expect("a count line is due");
        assert_eq!(
            line,
            "job x: 1000 more requests failed in 5.0 s (1001 in all); the last: the server answered a read of 4096 \
             bytes at offset 8192 with error 5 (EIO)"
        );
        // Three more, and then none: the check counts them once the interval has passed.
        for k in 0..3 {
            assert_eq!(w.failed("x", s(6.0 + k as f64), eio(0)), None);
        }
        assert_eq!(w.check("x", s(9.0)), None);
        let said = w.check("x", s(10.0)).expect("due");
        assert!(said.starts_with("job x: 3 more requests failed in 5.0 s (1004 in all)"), "{said}");
        assert_eq!(w.check("x", s(30.0)), None, "nothing left to count");
    }
}
