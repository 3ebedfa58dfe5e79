//! What `rein load` says during a run about each job's connections and about the errors its server
//! answers, decided from the run's time passed in (no clock, no IO: the load's driver logs the lines and
//! calls [`JobWatch::check`] once per interval).
//!
//! # Stalls
//! A connection is *stalled* when requests are outstanding on it and none has been answered for
//! [`STALL_AFTER`], counted from the later of its last answer and its first request after none was
//! outstanding, while the connection is open (a connection that breaks is said by the driver, once, as
//! it breaks). Nothing tells a server that stopped answering from one holding the requests back (a
//! tenant far above its limit at a QoS server), so the line says either. Each stall is said once, at
//! the first check past [`STALL_AFTER`]: the connection, the requests outstanding on it and for how
//! long none was answered (a WARN line); and its end once, at the first check after an answer came (an
//! INFO line: how long the connection had been quiet). A
//! job's connections that stalled (or resumed) since the last check share one line, naming at most
//! [`NAMED`] of them, so a job of 1,024 connections to a stopped server says one line, not 1,024.
//! Before, a server that stopped answering (the connection open) was said only at the run's end, as
//! requests still unanswered, or not at all when its answers came before the end: 8 s without an
//! answer showed only as `0.0 IOPS` in the live table.
//!
//! # Errors
//! A request the server answers with an error is said at once the first time (which request, which
//! error), and then at most once per [`ERRORS_EVERY`] (crate::lograte's rule): how many failed since
//! the line before, how many in all, and the last one; a check says the count once [`ERRORS_EVERY`]
//! has passed without a failure to carry it. A server failing every request was said only at the
//! run's end (96,828 requests failed in a 5 s run, the live table reading `0.0 IOPS`).
//!
//! # Bounds
//! A job's watch holds a few words per connection (at most the job's connections, 1,024 per server)
//! and one request's description; a check's lines are at most three per job.

use crate::lograte::LogRate;
use rein_core::Nanos;
use std::net::SocketAddr;
use std::time::Duration;

/// How long requests may be outstanding on an open connection with none answered before it is said.
pub(crate) const STALL_AFTER: Nanos = Nanos::from_secs(5);
/// At most one line per job this often about the errors its server answers, after the first.
pub(crate) const ERRORS_EVERY: Duration = Duration::from_secs(5);
/// Connections named in one line (the rest are counted).
const NAMED: usize = 4;

/// One connection's requests and answers.
#[derive(Debug, Clone, Copy, Default)]
struct Conn {
    /// Requests outstanding on it.
    outstanding: u32,
    /// Its last answer, or its first request after none was outstanding.
    since: Nanos,
    /// Its stall was said (and its end is not yet).
    said: bool,
    /// An answer ended a stall that was said: how long the connection had been quiet (said at the next
    /// check).
    resumed: Option<Nanos>,
}

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

/// A line to log, at its level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Said {
    /// A stall, or errors.
    Warn(String),
    /// A stall's end.
    Info(String),
}

/// What one job's connections and errors have said (module comment).
#[derive(Debug)]
pub(crate) struct JobWatch {
    /// Per connection group (one, or one per window), per connection.
    conns: Vec<Vec<Conn>>,
    errors: LogRate<Nanos>,
    /// When the last errors line was said.
    errors_said: Nanos,
    /// Errors answered in all, and the last one.
    errors_total: u64,
    last_error: Option<Answered>,
}

impl JobWatch {
    /// A job whose connection groups hold `groups[g]` connections each.
    pub(crate) fn new(groups: impl IntoIterator<Item = usize>) -> JobWatch {
        JobWatch {
            conns: groups.into_iter().map(|n| vec![Conn::default(); n]).collect(),
            errors: LogRate::default(),
            errors_said: Nanos::ZERO,
            errors_total: 0,
            last_error: None,
        }
    }

    /// A request went out on connection `conn` (group, index) at `now`.
    pub(crate) fn issued(&mut self, conn: (usize, usize), now: Nanos) {
        let c = &mut self.conns[conn.0][conn.1];
        if c.outstanding == 0 {
            c.since = now;
        }
        c.outstanding += 1;
    }

    /// A request on `conn` ended at `now`: `answered` when the server answered it (with data or an
    /// error), false when it failed with its connection (which answers nothing and ends no stall).
    pub(crate) fn ended(&mut self, conn: (usize, usize), now: Nanos, answered: bool) {
        let c = &mut self.conns[conn.0][conn.1];
        debug_assert!(c.outstanding > 0, "a request ends once, after it was issued");
        c.outstanding = c.outstanding.saturating_sub(1);
        if answered {
            if c.said {
                c.resumed = Some(now.saturating_sub(c.since));
                c.said = false;
            }
            c.since = now;
        } else if c.outstanding == 0 {
            // The connection's end is said by the driver; no stall goes on without requests.
            c.said = false;
        }
    }

    /// The server answered `what` with an error at `now`: the line to log now, if one is due (the first
    /// at once; then at most one per [`ERRORS_EVERY`], with the count since the last). `last`: the job
    /// stops with this error (its `--max-errors`), so the first line promises no count of further ones.
    pub(crate) fn failed(&mut self, job: &str, now: Nanos, what: Answered, last: bool) -> Option<Said> {
        self.errors_total += 1;
        self.last_error = Some(what);
        let first = !self.errors.started();
        let unsaid = self.errors.due(now, ERRORS_EVERY, 1)?;
        let since = now.saturating_sub(self.errors_said);
        self.errors_said = now;
        Some(Said::Warn(if first && last {
            format!("job {job}: {what}")
        } else if first {
            format!("job {job}: {what}; its further errors are counted here every {} s", ERRORS_EVERY.as_secs())
        } else {
            self.count_line(job, unsaid + 1, since)
        }))
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

    /// The lines due at `now` for job `job` whose connection groups go to `addrs`: connections newly
    /// stalled (of those `broken` does not say are broken), connections whose answers resumed, and the
    /// errors not yet counted once [`ERRORS_EVERY`] has passed.
    pub(crate) fn check(
        &mut self,
        job: &str,
        now: Nanos,
        addrs: &[SocketAddr],
        broken: impl Fn((usize, usize)) -> bool,
    ) -> Vec<Said> {
        let mut said = Vec::new();
        let (mut stalled, mut outstanding, mut quiet) = (Vec::new(), 0u64, Nanos::ZERO);
        let (mut resumed, mut longest) = (Vec::new(), Nanos::ZERO);
        for (g, group) in self.conns.iter_mut().enumerate() {
            for (i, c) in group.iter_mut().enumerate() {
                if let Some(q) = c.resumed.take() {
                    resumed.push((g, i));
                    longest = longest.max(q);
                }
                let silent = now.saturating_sub(c.since);
                if c.outstanding > 0 && !c.said && silent >= STALL_AFTER && !broken((g, i)) {
                    c.said = true;
                    stalled.push((g, i));
                    outstanding += u64::from(c.outstanding);
                    quiet = quiet.max(silent);
                }
            }
        }
        if !stalled.is_empty() {
            let (one, are) = if stalled.len() == 1 { ("", "is") } else { ("s", "are") };
            said.push(Said::Warn(format!(
                "job {job}: {}: no answer for {:.1} s{}, {outstanding} request{} outstanding (the connection{one} {are} \
                 open: the server holds them, or has stopped answering); said again when its answers resume",
                names(&stalled, addrs),
                quiet.as_secs_f64(),
                if stalled.len() == 1 { "" } else { " or more" },
                if outstanding == 1 { "" } else { "s" },
            )));
        }
        if !resumed.is_empty() {
            said.push(Said::Info(format!(
                "job {job}: {}: answers resumed after {}{:.1} s without one",
                names(&resumed, addrs),
                if resumed.len() == 1 { "" } else { "up to " },
                longest.as_secs_f64()
            )));
        }
        if self.errors.unlogged() > 0 && now.saturating_sub(self.errors_said) >= Nanos::from_duration(ERRORS_EVERY) {
            let since = now.saturating_sub(self.errors_said);
            if let Some(n) = self.errors.due(now, ERRORS_EVERY, 0).filter(|&n| n > 0) {
                self.errors_said = now;
                said.push(Said::Warn(self.count_line(job, n, since)));
            }
        }
        said
    }
}

/// `connection 1 to ADDR, connection 2 to ADDR and 3 more`: at most [`NAMED`] of `conns` (group, index)
/// by number and their group's address.
fn names(conns: &[(usize, usize)], addrs: &[SocketAddr]) -> String {
    let mut s: Vec<String> = conns
        .iter()
        .take(NAMED)
        .map(|&(g, i)| match addrs.get(g) {
            Some(a) => format!("connection {} to {a}", i + 1),
            None => format!("connection {}", i + 1),
        })
        .collect();
    if conns.len() > NAMED {
        s.push(format!("{} more", conns.len() - NAMED));
    }
    match s.len() {
        1 => s.remove(0),
        n => format!("{} and {}", s[..n - 1].join(", "), s[n - 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> Vec<SocketAddr> {
        vec!["127.0.0.200:10809".parse().unwrap()]
    }

    fn s(x: f64) -> Nanos {
        Nanos::from_secs_f64(x)
    }

    /// A stall is said once, past STALL_AFTER, with the requests outstanding and for how long; its end
    /// once, at the check after an answer; a second stall is said again.
    #[test]
    fn a_stall_is_said_once_and_its_end_once() {
        let mut w = JobWatch::new([1]);
        let check = |w: &mut JobWatch, t| w.check("x", s(t), &addrs(), |_| false);
        for _ in 0..4 {
            w.issued((0, 0), s(0.0));
        }
        w.ended((0, 0), s(1.0), true);
        assert_eq!(check(&mut w, 5.9), vec![], "4.9 s without an answer");
        let said = check(&mut w, 6.0);
        assert_eq!(
            said,
            vec![Said::Warn(
                "job x: connection 1 to 127.0.0.200:10809: no answer for 5.0 s, 3 requests outstanding (the \
                 connection is open: the server holds them, or has stopped answering); said again when its answers resume"
                    .into()
            )]
        );
        assert_eq!(check(&mut w, 20.0), vec![], "once per stall");
        w.ended((0, 0), s(21.0), true);
        assert_eq!(
            check(&mut w, 21.5),
            vec![Said::Info(
                "job x: connection 1 to 127.0.0.200:10809: answers resumed after 20.0 s without one".into()
            )]
        );
        assert_eq!(check(&mut w, 25.0), vec![], "2 outstanding, 4 s since the answer");
        assert!(matches!(&check(&mut w, 26.0)[..], [Said::Warn(l)] if l.contains("2 requests outstanding")));
    }

    /// Without requests outstanding, silence is no stall; a broken connection's is not said here; a
    /// request that failed with its connection ends no stall.
    #[test]
    fn idle_and_broken_connections_are_not_stalled() {
        let mut w = JobWatch::new([2]);
        w.issued((0, 0), s(0.0));
        w.ended((0, 0), s(0.1), true);
        w.issued((0, 1), s(0.0));
        assert_eq!(w.check("x", s(60.0), &addrs(), |c| c == (0, 1)), vec![]);
        w.ended((0, 1), s(61.0), false);
        assert_eq!(w.check("x", s(62.0), &addrs(), |_| false), vec![], "no answer resumed");
    }

    /// Several connections stalled at one check share a line, naming four and counting the rest.
    #[test]
    fn a_jobs_stalled_connections_share_a_line() {
        let mut w = JobWatch::new([6]);
        for i in 0..6 {
            w.issued((0, i), s(i as f64 * 0.1));
        }
        let said = w.check("x", s(10.0), &addrs(), |_| false);
        let a = "127.0.0.200:10809";
        assert_eq!(
            said,
            vec![Said::Warn(format!(
                "job x: connection 1 to {a}, connection 2 to {a}, connection 3 to {a}, connection 4 to {a} and 2 \
                 more: no answer for 10.0 s or more, 6 requests outstanding (the connections are open: the server \
                 holds them, or has stopped answering); said again when its answers resume"
            ))]
        );
    }

    /// Errors: the first at once, then one count line per ERRORS_EVERY at most (on an error, or at a
    /// check once the interval has passed), each with the count since the last line and in all.
    #[test]
    fn errors_are_said_once_then_counted() {
        let mut w = JobWatch::new([1]);
        let eio = |offset| Answered { read: true, bytes: 4096, offset, errno: 5 };
        let first = w.failed("x", s(0.0), eio(0), false);
        assert_eq!(
            first,
            Some(Said::Warn(
                "job x: the server answered a read of 4096 bytes at offset 0 with error 5 (EIO); its further \
                 errors are counted here every 5 s"
                    .into()
            ))
        );
        // A job that stops at its first error (`--max-errors 1`) promises no count.
        let alone = JobWatch::new([1]).failed("x", s(0.0), eio(0), true);
        assert_eq!(
            alone,
            Some(Said::Warn("job x: the server answered a read of 4096 bytes at offset 0 with error 5 (EIO)".into()))
        );
        for k in 1..1000 {
            assert_eq!(w.failed("x", s(k as f64 * 0.004), eio(k * 4096), false), None, "{k}");
        }
        assert_eq!(w.check("x", s(4.9), &addrs(), |_| false), vec![]);
        let line = w.failed("x", s(5.0), eio(8192), false).expect("a count line is due");
        assert_eq!(
            line,
            Said::Warn(
                "job x: 1000 more requests failed in 5.0 s (1001 in all); the last: the server answered a read of \
                 4096 bytes at offset 8192 with error 5 (EIO)"
                    .into()
            )
        );
        // Three more, and then none: the check counts them once the interval has passed.
        for k in 0..3 {
            assert_eq!(w.failed("x", s(6.0 + k as f64), eio(0), false), None);
        }
        assert_eq!(w.check("x", s(9.0), &addrs(), |_| false), vec![]);
        let said = w.check("x", s(10.0), &addrs(), |_| false);
        assert!(
            matches!(&said[..], [Said::Warn(l)] if l.starts_with("job x: 3 more requests failed in 5.0 s (1004 in all)")),
            "{said:?}"
        );
        assert_eq!(w.check("x", s(30.0), &addrs(), |_| false), vec![], "nothing left to count");
    }
}
