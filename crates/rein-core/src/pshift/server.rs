//! A pShift server's side of the protocol (pshift.txt §III-D), sans-IO: what a server running the Token
//! Scheduler (Algorithm 1) reports to the controller and how it applies the controller's answer. The
//! simulator's pShift servers and `rein serve` with `[pshift]` both use it; the scheduler itself stays
//! the caller's ([`TokenScheduler`], passed to each call).
//!
//! # Model
//! A server's scheduler knows each bucket as a tenant; this module maps scheduler slots to the
//! controller's bucket indices and keeps what a report needs besides the scheduler's own per-bucket
//! counters ([`TokenScheduler::take_interval`]):
//! - the device's completions and busy time since the last boundary's report;
//! - per bucket, the IOs dispatched whose completion has not been counted yet
//!   ([`BucketReport::in_flight`]): the controller charges those to the period they complete in;
//! - the latest token message applied, and per bucket whether the server already told the controller
//!   about an arrival the message did not plan for (a stray: [`StrayArrival`], once per message).
//!
//! A boundary's report ([`TokenServer::report`] with `early = 0`) covers the interval since the previous
//! boundary and restarts the counters; an early round's report covers the interval so far and leaves
//! them running (the boundary's report still covers the whole interval). Applying a message
//! ([`TokenServer::apply`]) grants each listed bucket its tokens with [`TokenScheduler::grant`] (which
//! deducts what was served since the report) and leaves every bucket the message does not list with no
//! R-tokens and, if it is limited, no L-tokens. Before the first message the scheduler serves plain round
//! robin (every bucket starts with no R-tokens and, limited or not, unbounded L-tokens).
//!
//! Every call that takes a `now` passes it through a [`LatestTime`], as the schedulers do: one earlier
//! than the latest seen (a caller with several clock sources) counts as the latest and is counted
//! ([`TokenServer::time_regressions`]), so intervals and busy times are never negative; a busy period
//! said to begin after `now` counts as none.
//!
//! # Invariants
//! 1. A slot is mapped to at most one bucket; a report has at most one line per bucket, sorted by bucket.
//! 2. `in_flight` of a bucket is the IOs dispatched (counted at boundaries) less the completions counted:
//!    never negative at a boundary (a completion is counted after its dispatch).
//! 3. After [`TokenServer::apply`], a mapped bucket holds exactly the tokens the message gives it (less
//!    what `grant` deducts), or none.
//! 4. `last_report <= time.now()`: the time of the latest boundary's report is a time the clock returned.

use super::controller::{BucketReport, ServerReport, StrayArrival, TokenMessage};
use crate::sched::tokens::{TokenScheduler, Tokens};
use crate::sched::Scheduler;
use crate::spec::QosSpec;
use crate::units::{LatestTime, Nanos};
use crate::TenantId;

/// No bucket at a slot.
const NONE: u32 = u32::MAX;

/// The server side of pShift; see the module comment.
#[derive(Debug, Clone)]
pub struct TokenServer {
    /// This server's index at the controller.
    server: u32,
    /// Whether stray arrivals are noted (the controller runs early rounds).
    strays: bool,
    /// Device completions and busy time since the last boundary's report.
    completed: u64,
    busy_ns: u64,
    /// When the last boundary's report was taken (invariant 4).
    last_report: Nanos,
    /// The latest `now` seen, and how often an earlier one came.
    time: LatestTime,
    /// Per scheduler slot: the IOs dispatched whose completion has not been counted, as of the last
    /// boundary, less the completions counted since (negative between boundaries when IOs both went and
    /// came back). With the interval's dispatches added at a boundary it is the bucket's `in_flight`.
    unrecorded: Vec<i64>,
    /// The latest token message applied: (round, early).
    heard: Option<(u64, u32)>,
    /// The latest report taken: (round, early).
    reported: Option<(u64, u32)>,
    /// Per bucket number: the controller limits it ([`Self::set_limited`]; empty: only the tenants' own
    /// specs say).
    limited: Vec<bool>,
    /// Scheduler slot -> bucket index ([`NONE`]: no bucket).
    bucket_of_slot: Vec<u32>,
    /// Per slot: an arrival of the bucket needs no note to the controller (the latest message listed it,
    /// or a stray was noted since).
    quiet: Vec<bool>,
}

impl TokenServer {
    /// Server `server` (its index at the controller), its first interval starting at `now`; `strays`: note
    /// stray arrivals for early rounds.
    pub fn new(server: u32, strays: bool, now: Nanos) -> TokenServer {
        TokenServer {
            server,
            strays,
            completed: 0,
            busy_ns: 0,
            last_report: now,
            time: LatestTime::starting_at(now),
            unrecorded: Vec::new(),
            heard: None,
            reported: None,
            limited: Vec::new(),
            bucket_of_slot: Vec::new(),
            quiet: Vec::new(),
        }
    }

    /// How many times a `now` earlier than the latest seen was clamped (module comment).
    pub fn time_regressions(&self) -> u64 {
        self.time.regressions()
    }

    /// This server's index at the controller.
    pub fn index(&self) -> u32 {
        self.server
    }

    /// The latest token message applied, as (round, early).
    pub fn heard(&self) -> Option<(u64, u32)> {
        self.heard
    }

    /// The bucket at scheduler tenant `id`, if one is mapped.
    pub fn bucket_of(&self, id: TenantId) -> Option<u32> {
        self.bucket_of_slot.get(id.index()).copied().filter(|&b| b != NONE)
    }

    /// Adds bucket `bucket` to the scheduler with `spec` and maps it. Once a message has been applied, a
    /// new bucket starts with no tokens (R = 0 and, if limited, L = 0) until a message gives it some.
    pub fn add_bucket(&mut self, ts: &mut TokenScheduler, bucket: u32, spec: QosSpec) -> TenantId {
        let id = ts.add_tenant(spec).expect("bounded by the bucket count");
        if self.heard.is_some() {
            no_tokens(ts, id, self.limited_by_controller(bucket));
        }
        self.map(id, bucket);
        id
    }

    /// Maps the scheduler's tenant `id` (added by the caller) to bucket `bucket`, as [`Self::add_bucket`]
    /// does for the tenants it adds.
    pub fn map(&mut self, id: TenantId, bucket: u32) {
        let slot = id.index();
        if self.bucket_of_slot.len() <= slot {
            self.bucket_of_slot.resize(slot + 1, NONE);
            self.unrecorded.resize(slot + 1, 0);
            self.quiet.resize(slot + 1, false);
        }
        self.bucket_of_slot[slot] = bucket;
    }

    /// Maps the scheduler's tenant `id`, added while this server runs, to bucket `bucket` (a tenant created
    /// at run time whose name is a bucket's). `at_device`: its IOs at the device now (dispatched, not
    /// completed); its dispatches in the current interval count in the next report, and its completions
    /// from here on with [`Self::recorded`], so its `in_flight` is exact from this call on. Once a message
    /// has been applied it starts with no tokens (R = 0 and, if limited, L = 0), as [`Self::add_bucket`].
    pub fn adopt(&mut self, ts: &mut TokenScheduler, id: TenantId, bucket: u32, at_device: u64) {
        self.map(id, bucket);
        let slot = id.index();
        let n = ts.interval(id).expect("adopted tenants are live");
        self.unrecorded[slot] = at_device as i64 - (n.dispatched_r + n.dispatched_l) as i64;
        self.quiet[slot] = false;
        if self.heard.is_some() {
            no_tokens(ts, id, self.limited_by_controller(bucket));
        }
    }

    /// The mapped tenants and their buckets, in slot order.
    pub fn mapped(&self, ts: &TokenScheduler) -> Vec<(TenantId, u32)> {
        (self.bucket_of_slot.iter().enumerate())
            .filter(|&(_, &b)| b != NONE)
            .filter_map(|(slot, &b)| ts.id_at_slot(slot).map(|id| (id, b)))
            .collect()
    }

    /// Forgets the bucket at tenant `id` (the tenant is being removed, or renamed away from the bucket):
    /// reports no longer list it, and a tenant that later takes its scheduler slot starts unmapped.
    pub fn release(&mut self, id: TenantId) {
        let slot = id.index();
        if let Some(b) = self.bucket_of_slot.get_mut(slot) {
            *b = NONE;
            self.unrecorded[slot] = 0;
            self.quiet[slot] = false;
        }
    }

    /// Starts counting at `now` on a scheduler that served before this server existed: a node whose
    /// controller link came up after its first requests, or came back after a break. The scheduler's
    /// interval counters restart at `now`, and each mapped bucket's IOs at the device, `at_device(id)`
    /// (dispatched before `now`, not completed), count as in flight. Without it the first report counts
    /// every dispatch since the scheduler's last report while [`Self::recorded`] counts only completions
    /// from here on, and the difference stays in [`BucketReport::in_flight`] for good: the controller then
    /// counts it as done at every period's start, and a limited bucket ends each period that many IOs
    /// under its limit (measured on real daemons: 22-45 phantom IOs per bucket and server, b3 and b4 of
    /// pshift-exp3-limits-small 60-75 IOs short per period, when two of four nodes reached the controller
    /// 100 ms after the load began).
    pub fn resume(&mut self, ts: &mut TokenScheduler, now: Nanos, at_device: impl Fn(TenantId) -> u64) {
        let now = self.time.advance(now);
        let _ = ts.take_interval(now);
        self.last_report = now;
        self.completed = 0;
        self.busy_ns = 0;
        for (slot, &b) in self.bucket_of_slot.iter().enumerate() {
            if b == NONE {
                continue;
            }
            let id = ts.id_at_slot(slot).expect("mapped slots are live");
            self.unrecorded[slot] = at_device(id) as i64;
        }
    }

    /// A request of the bucket at tenant `id` reached the scheduler. If the latest message did not list
    /// the bucket here and no note was sent since, returns the note for the controller (once per message).
    pub fn arrived(&mut self, id: TenantId) -> Option<StrayArrival> {
        let heard = self.heard?;
        let slot = id.index();
        if !self.strays || self.quiet.get(slot).copied().unwrap_or(true) {
            return None;
        }
        let bucket = self.bucket_of(id)?;
        self.quiet[slot] = true;
        Some(StrayArrival { server: self.server, bucket, heard })
    }

    /// The completion of an IO this server dispatched for tenant `id` was counted.
    pub fn recorded(&mut self, id: TenantId) {
        if let Some(u) = self.unrecorded.get_mut(id.index()) {
            *u -= 1;
        }
    }

    /// The device completed an IO.
    pub fn device_completed(&mut self) {
        self.completed += 1;
    }

    /// The device went idle at `now`, busy since `from` (only the part after the last report counts).
    pub fn device_idle(&mut self, from: Nanos, now: Nanos) {
        let now = self.time.advance(now);
        self.busy_ns = self.busy_ns.saturating_add(now.saturating_sub(from.max(self.last_report)).0);
    }

    /// Adds `ns` of device busy time to the interval (for a caller that measures busy time itself rather
    /// than by [`Self::device_idle`] and `busy_since`).
    pub fn add_busy(&mut self, ns: u64) {
        self.busy_ns = self.busy_ns.saturating_add(ns);
    }

    /// Which buckets the controller limits (per bucket number; the welcome says). A bucket an answer does
    /// not list then gets no L-tokens even if its tenant here has no limit of its own: on real daemons the
    /// limit is the controller's alone, and an unlisted bucket (an answer computed without this server's
    /// report, or a bucket that had no demand here) was otherwise served without bound until the next
    /// answer.
    pub fn set_limited(&mut self, limited: Vec<bool>) {
        self.limited = limited;
    }

    fn limited_by_controller(&self, bucket: u32) -> bool {
        self.limited.get(bucket as usize).copied().unwrap_or(false)
    }

    /// The controller is gone: every mapped bucket goes back to plain round robin (no R-tokens, unbounded
    /// L-tokens), as before the first message, and no message counts as heard. Limits are not enforced
    /// until a controller answers again.
    pub fn detach(&mut self, ts: &mut TokenScheduler) {
        self.heard = None;
        self.reported = None;
        self.quiet.fill(false);
        for (slot, &b) in self.bucket_of_slot.iter().enumerate() {
            if b == NONE {
                continue;
            }
            let id = ts.id_at_slot(slot).expect("mapped slots are live");
            ts.set_tokens(id, 0, Tokens::Unlimited).expect("live");
        }
    }

    /// The report for boundary `round` (`early` = 0: the interval since the previous boundary, and the
    /// counters restart) or for early round `early` after it (the interval so far; the counters go on).
    /// `busy_since`: when the device's current busy period began, if it is busy now.
    pub fn report(
        &mut self,
        ts: &mut TokenScheduler,
        now: Nanos,
        round: u64,
        early: u32,
        busy_since: Option<Nanos>,
    ) -> ServerReport {
        let now = self.time.advance(now);
        let busy_now = busy_since.map_or(0, |since| now.saturating_sub(since.max(self.last_report)).0);
        let intervals = if early == 0 { ts.take_interval(now) } else { ts.peek_interval(now) };
        let mut lines = Vec::new();
        for b in intervals {
            let slot = b.id.index();
            let Some(&bucket) = self.bucket_of_slot.get(slot).filter(|&&x| x != NONE) else { continue };
            let n = b.counters;
            let dispatched = n.dispatched_r + n.dispatched_l;
            let unrecorded = self.unrecorded[slot] + dispatched as i64;
            debug_assert!(unrecorded >= 0, "invariant 2: a completion counted before its dispatch");
            if early == 0 {
                self.unrecorded[slot] = unrecorded;
            }
            let in_flight = unrecorded.max(0) as u64;
            let held = b.held();
            if n.arrivals + dispatched + b.queued + in_flight + held > 0 {
                lines.push(BucketReport {
                    bucket,
                    arrivals: n.arrivals,
                    dispatched,
                    queued: b.queued,
                    idle_ns: n.idle_ns,
                    in_flight,
                    held,
                });
            }
        }
        lines.sort_unstable_by_key(|l| l.bucket);
        let report = ServerReport {
            server: self.server,
            round,
            early,
            // Invariant 4: `now` is at least the last report's time.
            elapsed_ns: now.saturating_sub(self.last_report).0,
            completed: self.completed,
            busy_ns: self.busy_ns.saturating_add(busy_now),
            buckets: lines,
        };
        if early == 0 {
            self.last_report = now;
            self.completed = 0;
            self.busy_ns = 0;
        }
        self.reported = self.reported.max(Some((round, early)));
        report
    }

    /// Applies the answer `(round, early)`: `grants` are the message's lines with each bucket resolved to
    /// its tenant here (a line whose bucket has no tenant here is left out by the caller). Every mapped
    /// bucket not granted is left with no tokens (invariant 3). Returns false, and changes nothing, for a
    /// *stale* answer: one to a report older than the latest this server took (it arrived after the next
    /// boundary's cut, on a late link or a stalled process). `grant` deducts what was served since the
    /// latest report, so a stale answer's tokens would come on top of what the server spent since the
    /// report it answers, which the controller already counted against the limit; the server keeps its
    /// tokens, which the controller counted as held at the newer report, and the answer to that report
    /// replaces them.
    pub fn apply(
        &mut self,
        ts: &mut TokenScheduler,
        round: u64,
        early: u32,
        grants: &[(TenantId, u64, Tokens)],
    ) -> bool {
        if self.reported.is_some_and(|r| (round, early) < r) {
            return false;
        }
        let mut listed = vec![false; self.bucket_of_slot.len()];
        for &(id, r, l) in grants {
            if listed.len() <= id.index() {
                listed.resize(id.index() + 1, false);
            }
            listed[id.index()] = true;
            ts.grant(id, r, l).expect("a granted bucket is live");
        }
        self.heard = Some((round, early));
        let n = self.quiet.len();
        self.quiet.iter_mut().zip(&listed).for_each(|(a, &b)| *a = b);
        self.quiet[listed.len().min(n)..].fill(false);
        for (slot, &b) in self.bucket_of_slot.iter().enumerate() {
            if b == NONE || listed.get(slot).copied().unwrap_or(false) {
                continue;
            }
            let id = ts.id_at_slot(slot).expect("mapped slots are live");
            no_tokens(ts, id, self.limited_by_controller(b));
        }
        true
    }

    /// [`Self::apply`] for a whole message, resolving each line's bucket with `resolve` (which may add it).
    pub fn apply_message(
        &mut self,
        ts: &mut TokenScheduler,
        msg: &TokenMessage,
        mut resolve: impl FnMut(&mut TokenServer, &mut TokenScheduler, u32) -> Option<TenantId>,
    ) -> bool {
        let mut grants = Vec::with_capacity(msg.tokens.len());
        for &(b, r, l) in &msg.tokens {
            if let Some(id) = resolve(self, ts, b) {
                grants.push((id, r, l));
            }
        }
        self.apply(ts, msg.round, msg.early, &grants)
    }
}

/// Leaves tenant `id` with no tokens: R = 0 and, if it is limited (by its spec or by the controller), L = 0.
fn no_tokens(ts: &mut TokenScheduler, id: TenantId, by_controller: bool) {
    let limited = by_controller || ts.spec(id).expect("live").limit().is_some();
    let l = if limited { Tokens::Count(0) } else { Tokens::Unlimited };
    ts.set_tokens(id, 0, l).expect("live");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::{Poll, Request, SchedConfig};

    fn spec(limit: Option<f64>) -> QosSpec {
        QosSpec::new(0.0, limit, 1.0, 0).unwrap()
    }

    /// A `now` earlier than one seen before (a caller with several clock sources) is clamped to the latest
    /// and counted, as the schedulers do, and a busy period that begins after `now` counts as none.
    /// Review 1: `report` subtracted unchecked, so a report at 999 after the server started at 1,000
    /// panicked (debug) or reported an interval of 584 years (release).
    #[test]
    fn a_now_before_the_last_report_is_clamped_and_counted() {
        let mut ts = TokenScheduler::new(SchedConfig::default());
        let mut s = TokenServer::new(0, false, Nanos(1_000));
        let r = s.report(&mut ts, Nanos(999), 0, 0, Some(Nanos(2_000)));
        assert_eq!((r.elapsed_ns, r.busy_ns), (0, 0));
        assert_eq!(s.time_regressions(), 1);
        s.device_idle(Nanos(1_500), Nanos(1_200));
        s.device_idle(Nanos(900), Nanos(1_250));
        let r = s.report(&mut ts, Nanos(1_300), 1, 0, None);
        assert_eq!((r.elapsed_ns, r.busy_ns), (300, 250), "busy from the last report (1,000) to 1,250 only");
        s.device_idle(Nanos(1_250), Nanos(1_280));
        let r = s.report(&mut ts, Nanos(1_290), 2, 0, None);
        assert_eq!((r.elapsed_ns, r.busy_ns), (0, 0), "1,290 and 1,280 came after 1,300: both clamped to it");
        assert_eq!(s.time_regressions(), 3);
    }

    /// A report counts what the scheduler saw; in-flight IOs carry over a boundary until counted; a
    /// message's unlisted buckets lose their tokens; a stray arrival is noted once per message.
    #[test]
    fn reports_in_flight_tokens_and_strays() {
        let mut ts = TokenScheduler::new(SchedConfig::default());
        let mut s = TokenServer::new(3, true, Nanos::ZERO);
        let a = s.add_bucket(&mut ts, 10, spec(None));
        let b = s.add_bucket(&mut ts, 20, spec(Some(100.0)));
        for h in 0..3 {
            ts.enqueue(Nanos(h), Request::new(a, h)).unwrap();
        }
        assert_eq!(s.arrived(a), None, "no message yet: nothing is a stray");
        let mut served = 0;
        while let Poll::Dispatch(_) = ts.poll(Nanos(10), true) {
            served += 1;
        }
        assert_eq!(served, 3, "round robin before the first message");
        s.device_completed();
        s.recorded(a);
        s.device_idle(Nanos(0), Nanos(50));
        let r = s.report(&mut ts, Nanos(100), 0, 0, None);
        assert_eq!((r.server, r.completed, r.busy_ns, r.elapsed_ns), (3, 1, 50, 100));
        assert_eq!(r.buckets.len(), 1, "{r:?}");
        assert_eq!((r.buckets[0].bucket, r.buckets[0].dispatched, r.buckets[0].in_flight), (10, 3, 2));
        // The next boundary: nothing dispatched, two still in flight until counted.
        s.recorded(a);
        let r = s.report(&mut ts, Nanos(200), 1, 0, Some(Nanos(150)));
        assert_eq!((r.buckets[0].in_flight, r.busy_ns), (1, 50));
        // A message listing only bucket 10 (a): b (limited) gets nothing, and its arrival is a stray once.
        s.apply(&mut ts, 1, 0, &[(a, 5, Tokens::Unlimited)]);
        assert_eq!(ts.tokens(a).unwrap(), (5, Tokens::Unlimited));
        assert_eq!(ts.tokens(b).unwrap(), (0, Tokens::Count(0)));
        ts.enqueue(Nanos(210), Request::new(b, 9)).unwrap();
        assert_eq!(s.arrived(b), Some(StrayArrival { server: 3, bucket: 20, heard: (1, 0) }));
        assert_eq!(s.arrived(b), None, "once per message");
        assert_eq!(s.arrived(a), None, "listed");
        assert!(matches!(ts.poll(Nanos(220), true), Poll::Empty), "b holds no L-tokens");
        ts.enqueue(Nanos(230), Request::new(a, 10)).unwrap();
        assert!(matches!(ts.poll(Nanos(230), true), Poll::Dispatch(d) if d.tenant == a));
        // A bucket added after the first message starts without tokens.
        let c = s.add_bucket(&mut ts, 30, spec(Some(5.0)));
        assert_eq!(ts.tokens(c).unwrap(), (0, Tokens::Count(0)));
        assert_eq!(s.bucket_of(c), Some(30));
    }

    /// On real daemons a bucket's tenant has no limit of its own (the limit is the controller's): a bucket
    /// the welcome calls limited gets no L-tokens when an answer does not list it, not unbounded ones. An
    /// answer to a report older than the latest taken (stale) changes nothing.
    #[test]
    fn the_controllers_limits_hold_for_unlisted_buckets_and_stale_answers_are_dropped() {
        let mut ts = TokenScheduler::new(SchedConfig::default());
        let mut s = TokenServer::new(0, false, Nanos::ZERO);
        s.set_limited(vec![false, true]);
        let a = s.add_bucket(&mut ts, 0, spec(None));
        let b = s.add_bucket(&mut ts, 1, spec(None));
        s.report(&mut ts, Nanos(100), 0, 0, None);
        assert!(s.apply(&mut ts, 0, 0, &[(a, 0, Tokens::Unlimited), (b, 0, Tokens::Count(7))]));
        assert_eq!(ts.tokens(b).unwrap(), (0, Tokens::Count(7)));
        // An answer computed without this server's report lists nothing here.
        s.report(&mut ts, Nanos(200), 1, 0, None);
        assert!(s.apply(&mut ts, 1, 0, &[]));
        assert_eq!(ts.tokens(a).unwrap(), (0, Tokens::Unlimited), "not limited: round robin");
        assert_eq!(ts.tokens(b).unwrap(), (0, Tokens::Count(0)), "limited by the controller: nothing");
        ts.enqueue(Nanos(210), Request::new(b, 1)).unwrap();
        assert!(matches!(ts.poll(Nanos(220), true), Poll::Empty), "b is not served without tokens");
        // Reports of boundaries 2 and 3 taken, then the answer to 2 comes: stale, dropped.
        s.report(&mut ts, Nanos(300), 2, 0, None);
        s.report(&mut ts, Nanos(400), 3, 0, None);
        assert!(!s.apply(&mut ts, 2, 0, &[(b, 0, Tokens::Count(50))]));
        assert_eq!(ts.tokens(b).unwrap(), (0, Tokens::Count(0)));
        assert_eq!(s.heard(), Some((1, 0)));
        assert!(s.apply(&mut ts, 3, 0, &[(b, 0, Tokens::Count(5))]));
        assert_eq!(ts.tokens(b).unwrap(), (0, Tokens::Count(5)));
        // Without the welcome's flags only the tenant's own spec says.
        let mut t = TokenServer::new(0, false, Nanos::ZERO);
        let mut ts2 = TokenScheduler::new(SchedConfig::default());
        let c = t.add_bucket(&mut ts2, 1, spec(None));
        assert!(t.apply(&mut ts2, 0, 0, &[]));
        assert_eq!(ts2.tokens(c).unwrap(), (0, Tokens::Unlimited));
    }

    /// A server that starts on a scheduler that has served already counts only what follows, and the IOs
    /// at the device then are in flight: their completions bring `in_flight` to zero, not below what the
    /// report saw dispatched.
    #[test]
    fn a_server_resumed_on_a_busy_scheduler_counts_from_then() {
        let mut ts = TokenScheduler::new(SchedConfig::default());
        let a = ts.add_tenant(spec(None)).unwrap();
        for h in 0..40 {
            ts.enqueue(Nanos(h), Request::new(a, h)).unwrap();
        }
        // 30 dispatched before the server exists; 28 of them complete before it starts, 2 after.
        for _ in 0..30 {
            assert!(matches!(ts.poll(Nanos(50), true), Poll::Dispatch(_)));
        }
        let mut s = TokenServer::new(0, false, Nanos(100));
        s.map(a, 7);
        s.resume(&mut ts, Nanos(100), |id| if id == a { 2 } else { 0 });
        for _ in 0..5 {
            assert!(matches!(ts.poll(Nanos(150), true), Poll::Dispatch(_)));
        }
        for _ in 0..7 {
            s.recorded(a); // the 2 old ones and 5 new ones
        }
        let r = s.report(&mut ts, Nanos(200), 0, 0, None);
        assert_eq!(r.elapsed_ns, 100);
        let b = &r.buckets[0];
        assert_eq!((b.bucket, b.dispatched, b.in_flight, b.queued), (7, 5, 0, 5), "{b:?}");
    }

    /// A tenant adopted as a bucket mid-interval counts its whole interval's dispatches and only the IOs
    /// then at the device as in flight; a released one leaves the reports, and its slot comes back
    /// unmapped.
    #[test]
    fn a_tenant_adopted_mid_interval_counts_exactly_and_a_released_one_leaves() {
        let mut ts = TokenScheduler::new(SchedConfig::default());
        let mut s = TokenServer::new(0, true, Nanos::ZERO);
        let a = s.add_bucket(&mut ts, 1, spec(None));
        s.apply(&mut ts, 0, 0, &[(a, 0, Tokens::Unlimited)]);
        // A tenant added at run time, served before it is known as bucket 2: 6 dispatched, 4 completed.
        let c = ts.add_tenant(spec(Some(1000.0))).unwrap();
        for h in 0..10 {
            ts.enqueue(Nanos(10 + h), Request::new(c, h)).unwrap();
        }
        for _ in 0..6 {
            assert!(matches!(ts.poll(Nanos(30), true), Poll::Dispatch(d) if d.tenant == c));
        }
        s.adopt(&mut ts, c, 2, 2);
        assert_eq!(s.bucket_of(c), Some(2));
        assert_eq!(ts.tokens(c).unwrap(), (0, Tokens::Count(0)), "a message was applied: no tokens yet");
        ts.enqueue(Nanos(40), Request::new(c, 99)).unwrap();
        assert!(s.arrived(c).is_some(), "its arrival is a stray until a message lists it");
        s.recorded(c); // one of the two at the device completes
        let r = s.report(&mut ts, Nanos(50), 1, 0, None);
        let line = r.buckets.iter().find(|l| l.bucket == 2).expect("listed");
        assert_eq!((line.dispatched, line.in_flight, line.queued), (6, 1, 5), "{line:?}");
        assert_eq!(s.mapped(&ts), vec![(a, 1), (c, 2)]);
        s.release(c);
        assert_eq!(s.bucket_of(c), None);
        assert_eq!(s.mapped(&ts), vec![(a, 1)]);
        let r = s.report(&mut ts, Nanos(60), 2, 0, None);
        assert!(r.buckets.iter().all(|l| l.bucket != 2), "released: {r:?}");
    }
}
