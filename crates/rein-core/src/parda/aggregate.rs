//! Cluster-wide latency aggregation (§4.2), sans-IO.
//!
//! Hosts publish a [`HostReport`] each period (their eq. (1) estimate and the period's IO count) through
//! some transport: a shared file in which each host owns a block (§4.2 filesystem-based), or UDP
//! datagrams to every peer (network-based); `rein-runtime` has both, the simulator a modelled one. An
//! [`Aggregator`] takes whatever reports arrive and yields the cluster signal: the IO-count-weighted
//! mean of the live hosts' estimates (`parda` module comment: by Little's law that is the array's mean
//! latency, which makes eq. (3) exact).
//!
//! # Robustness (invariant 6 of `parda`)
//! - **Stale and duplicate reports** are ignored: a report is accepted only if its `(epoch, seq)` is new
//!   for its host (same epoch and a higher sequence, or a higher epoch: the host restarted). Re-reading
//!   a shared file returns every host's last block again; those are duplicates and do not count as signs
//!   of life.
//! - **Epochs move forward** (beyond the paper): a lower epoch than the host's last one is a report of an
//!   older incarnation, a late datagram or a replayed one, and is stale while the host is live. Accepting
//!   any other epoch (as this did before) let one replayed old record, even a correctly signed one,
//!   displace the live incarnation, and the next genuine report restore it: a replayer alternating the
//!   two injected old latencies at will. Once the host has been silent for `timeout` a lower epoch is
//!   taken as a restart (a host whose clock went back across its restart rejoins after one timeout),
//!   but never an epoch the host has had before (the last [`EPOCHS_KEPT`]): a restart makes a new one,
//!   and only a replay brings an old one back. Taking it let a captured stream of a host that went down
//!   keep it live, with its old latencies in every peer's signal, for as long as the capture lasted.
//! - **Two incarnations alive at once** (beyond the paper): a host's reports never return to an
//!   incarnation it has left, so when reports of the incarnation a host's live one displaced keep coming
//!   with new sequence numbers, at least `timeout` after the switch (longer than any late datagram of a
//!   host that restarted), two hosts report under one id (or someone replays a past incarnation's
//!   records): [`Accept::Rival`]. The peer cannot tell which host is the real one; it keeps the newer
//!   incarnation and never takes the older back (an epoch the host had before, above), so `taken` is
//!   false there; the verdict lets its caller say so. On a shared board two hosts with
//!   one id overwrite one slot, and their peers see the slot switch between the two incarnations.
//! - **Liveness uses the local clock**: a host is live while its last accepted report was *received*
//!   (the `now` passed to [`Aggregator::accept`]) less than `timeout` ago. The peer's own timestamp is kept
//!   for diagnostics only, so a peer whose clock jumps forward or back neither stays alive forever nor
//!   drops out early; its sequence numbers keep ordering its reports.
//! - **Hosts that stop reporting drop out** of the average after `timeout`, and return with their next
//!   new report.
//! - **Bounded**: host ids are below [`MAX_HOSTS`], so at most that many entries are kept.
//! - Corrupt or torn records never get here: the wire format (rein-proto) checks a checksum first.

use super::{PardaError, MAX_HOSTS};
use crate::units::{LatestTime, Nanos};
use std::collections::BTreeMap;

/// One host's report for one period (the record every transport carries).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostReport {
    /// Below [`MAX_HOSTS`].
    pub host: u32,
    /// The host's incarnation (changes when it restarts).
    pub epoch: u64,
    /// Increases with every report of one incarnation.
    pub seq: u64,
    /// The sender's clock when it made the report (diagnostics only).
    pub timestamp: Nanos,
    /// The host's eq. (1) latency estimate, nanoseconds (0 if it has none yet).
    pub latency_ns: u64,
    /// IOs the host completed in the period.
    pub ios: u64,
}

/// What [`Aggregator::accept`] did with a report.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Accept {
    /// A host seen for the first time.
    First,
    /// A newer report of a known host.
    Newer,
    /// A report from a new incarnation of a known host.
    Restarted,
    /// The same `(epoch, seq)` as the last accepted one: ignored.
    Duplicate,
    /// An older sequence number of the current incarnation, or a report of an older incarnation while
    /// the host is live: ignored.
    Stale,
    /// A new report of the incarnation that the host's live one displaced, at least `timeout` after the
    /// switch: two hosts report under one id, or a past incarnation's records are replayed (module
    /// comment, "Two incarnations alive at once"). `taken`: whether it was accepted all the same, by the
    /// rules that would have made it `Restarted` (a newer epoch, or the live incarnation silent for
    /// `timeout`), or ignored as `Stale` would be.
    Rival {
        /// Accepted (it is now the host's last report) or ignored.
        taken: bool,
    },
}

impl Accept {
    /// Whether the report was taken (`First`, `Newer`, `Restarted`, a `Rival` taken); duplicates and
    /// stale reports are not, and do not count as signs of life.
    pub fn accepted(self) -> bool {
        matches!(self, Accept::First | Accept::Newer | Accept::Restarted | Accept::Rival { taken: true })
    }
}

/// What the aggregator knows about one peer.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PeerState {
    /// The peer's last accepted report.
    pub last: HostReport,
    /// Local time the last accepted report was received.
    pub received: Nanos,
    /// Local time the first report of the last accepted report's incarnation was accepted.
    pub since: Nanos,
    /// The last report seen of another incarnation since `since`: first the report of the incarnation
    /// this one displaced, then any later one of another incarnation (taken or not).
    pub other: Option<HostReport>,
    /// The epochs the host had before its last one, the newest last (at most [`EPOCHS_KEPT`]): never
    /// taken again (module comment, "Epochs move forward").
    pub left: PastEpochs,
}

/// How many of a host's past epochs are remembered (module comment, "Epochs move forward").
pub const EPOCHS_KEPT: usize = 8;

/// A host's past epochs, the newest last, at most [`EPOCHS_KEPT`] (the oldest go).
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct PastEpochs {
    at: [u64; EPOCHS_KEPT],
    len: usize,
}

impl PastEpochs {
    /// Whether the host had `epoch` before.
    pub fn contains(&self, epoch: u64) -> bool {
        self.at[..self.len].contains(&epoch)
    }

    /// The host left `epoch`.
    fn push(&mut self, epoch: u64) {
        if self.contains(epoch) {
            return;
        }
        if self.len == EPOCHS_KEPT {
            self.at.copy_within(1.., 0);
            self.len -= 1;
        }
        self.at[self.len] = epoch;
        self.len += 1;
    }
}

/// The cluster signal.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct ClusterLatency {
    /// IO-weighted mean latency over live hosts that completed IOs (ns).
    pub latency_ns: f64,
    /// IOs behind it.
    pub ios: u64,
    /// Live hosts that contributed (completed at least one IO).
    pub hosts: usize,
}

/// Cluster-wide average latency from per-host reports; see the module comment.
#[derive(Clone, Debug)]
pub struct Aggregator {
    timeout: Nanos,
    peers: BTreeMap<u32, PeerState>,
    time: LatestTime,
}

impl Aggregator {
    /// Hosts whose last new report is older than `timeout` are left out.
    pub fn new(timeout: Nanos) -> Result<Self, PardaError> {
        if timeout == Nanos::ZERO {
            return Err(PardaError::Timeout);
        }
        Ok(Aggregator { timeout, peers: BTreeMap::new(), time: LatestTime::default() })
    }

    /// How long after its last new report (by the local clock) a host stays live.
    pub fn timeout(&self) -> Nanos {
        self.timeout
    }

    /// A report received at local time `now`.
    pub fn accept(&mut self, now: Nanos, r: HostReport) -> Result<Accept, PardaError> {
        let now = self.time.advance(now);
        if r.host >= MAX_HOSTS {
            return Err(PardaError::HostId { id: r.host, max: MAX_HOSTS });
        }
        let verdict = match self.peers.get(&r.host) {
            None => Accept::First,
            Some(p) if r.epoch == p.last.epoch => {
                if r.seq > p.last.seq {
                    Accept::Newer
                } else if r.seq == p.last.seq {
                    Accept::Duplicate
                } else {
                    Accept::Stale
                }
            }
            Some(p) => {
                // A newer incarnation, or an older one's report once the live one has been silent for
                // `timeout` (module comment, "Epochs move forward").
                let returning = p.left.contains(r.epoch);
                let taken = !returning && (r.epoch > p.last.epoch || now.saturating_sub(p.received) >= self.timeout);
                // "Two incarnations alive at once".
                let rival = p.other.is_some_and(|o| o.epoch == r.epoch && r.seq > o.seq)
                    && now.saturating_sub(p.since) >= self.timeout;
                match (rival, taken) {
                    (true, taken) => Accept::Rival { taken },
                    (false, true) => Accept::Restarted,
                    (false, false) => Accept::Stale,
                }
            }
        };
        match self.peers.get_mut(&r.host) {
            None => {
                self.peers.insert(
                    r.host,
                    PeerState { last: r, received: now, since: now, other: None, left: PastEpochs::default() },
                );
            }
            Some(p) if verdict.accepted() && r.epoch == p.last.epoch => {
                p.last = r;
                p.received = now;
            }
            Some(p) if verdict.accepted() => {
                let mut left = p.left;
                left.push(p.last.epoch);
                *p = PeerState { last: r, received: now, since: now, other: Some(p.last), left };
            }
            // Another incarnation's report, not taken: remembered (the newest of one incarnation).
            Some(p) if r.epoch != p.last.epoch => {
                if !p.other.is_some_and(|o| o.epoch == r.epoch && o.seq >= r.seq) {
                    p.other = Some(r);
                }
            }
            Some(_) => {}
        }
        Ok(verdict)
    }

    fn live(&self, p: &PeerState) -> bool {
        self.time.now().saturating_sub(p.received) < self.timeout
    }

    /// Whether `host` is live at `now`.
    pub fn is_live(&mut self, now: Nanos, host: u32) -> bool {
        self.time.advance(now);
        self.peers.get(&host).is_some_and(|p| self.live(p))
    }

    /// Live hosts at `now`, by id.
    pub fn live_hosts(&mut self, now: Nanos) -> Vec<u32> {
        self.time.advance(now);
        self.peers.iter().filter(|(_, p)| self.live(p)).map(|(h, _)| *h).collect()
    }

    /// Every peer ever accepted (live or not), by id.
    pub fn peers(&self) -> impl Iterator<Item = (&u32, &PeerState)> {
        self.peers.iter()
    }

    /// The cluster signal at `now`, or `None` when no live host completed an IO.
    pub fn cluster(&mut self, now: Nanos) -> Option<ClusterLatency> {
        self.time.advance(now);
        let (mut ios, mut weighted, mut hosts) = (0u128, 0f64, 0usize);
        for p in self.peers.values().filter(|p| self.live(p) && p.last.ios > 0) {
            ios += p.last.ios as u128;
            weighted += p.last.latency_ns as f64 * p.last.ios as f64;
            hosts += 1;
        }
        (ios > 0).then(|| ClusterLatency {
            latency_ns: weighted / ios as f64,
            ios: ios.min(u64::MAX as u128) as u64,
            hosts,
        })
    }

    /// How many times `now` went backwards (and was clamped).
    pub fn time_regressions(&self) -> u64 {
        self.time.regressions()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(host: u32, seq: u64, lat_ms: u64, ios: u64) -> HostReport {
        HostReport { host, epoch: 1, seq, timestamp: Nanos::from_secs(seq), latency_ns: lat_ms * 1_000_000, ios }
    }

    #[test]
    fn io_weighted_average_of_live_hosts() {
        let mut a = Aggregator::new(Nanos::from_secs(5)).unwrap();
        assert_eq!(a.cluster(Nanos(0)), None);
        assert_eq!(a.accept(Nanos(0), rep(1, 1, 40, 100)).unwrap(), Accept::First);
        assert_eq!(a.accept(Nanos(0), rep(2, 1, 20, 300)).unwrap(), Accept::First);
        assert_eq!(a.accept(Nanos(0), rep(3, 1, 1000, 0)).unwrap(), Accept::First);
        let c = a.cluster(Nanos(1)).unwrap();
        assert_eq!((c.latency_ns, c.ios, c.hosts), (25e6, 400, 2), "host 3 had no IOs: weight 0");
    }

    #[test]
    fn duplicates_and_stale_reports_are_ignored_and_do_not_keep_a_host_alive() {
        let mut a = Aggregator::new(Nanos::from_secs(5)).unwrap();
        a.accept(Nanos::from_secs(0), rep(1, 7, 40, 100)).unwrap();
        assert_eq!(a.accept(Nanos::from_secs(4), rep(1, 7, 40, 100)).unwrap(), Accept::Duplicate);
        assert_eq!(a.accept(Nanos::from_secs(4), rep(1, 6, 99, 100)).unwrap(), Accept::Stale);
        assert_eq!(a.cluster(Nanos::from_secs(4)).unwrap().latency_ns, 40e6);
        // Liveness counts from the first receipt of seq 7: at 5 s it is gone.
        assert_eq!(a.cluster(Nanos::from_secs(5)), None);
        assert!(!a.is_live(Nanos::from_secs(5), 1));
        // It comes back with a new report.
        assert_eq!(a.accept(Nanos::from_secs(9), rep(1, 8, 30, 10)).unwrap(), Accept::Newer);
        assert_eq!(a.live_hosts(Nanos::from_secs(9)), vec![1]);
    }

    #[test]
    fn a_restarted_host_is_accepted_from_seq_1() {
        let mut a = Aggregator::new(Nanos::from_secs(5)).unwrap();
        a.accept(Nanos(0), rep(1, 500, 40, 100)).unwrap();
        let r = HostReport { epoch: 2, ..rep(1, 1, 10, 100) };
        assert_eq!(a.accept(Nanos(1), r).unwrap(), Accept::Restarted);
        assert_eq!(a.cluster(Nanos(1)).unwrap().latency_ns, 10e6);
    }

    #[test]
    fn an_older_incarnation_cannot_displace_a_live_one() {
        let mut a = Aggregator::new(Nanos::from_secs(5)).unwrap();
        let old = HostReport { epoch: 1, ..rep(1, 900, 90, 100) };
        let new = |seq| HostReport { epoch: 2, ..rep(1, seq, 10, 100) };
        a.accept(Nanos::from_secs(0), old).unwrap();
        assert_eq!(a.accept(Nanos::from_secs(1), new(1)).unwrap(), Accept::Restarted);
        // A replayed (or late) record of the old incarnation, then the live one's next report: the replay
        // is stale and the signal stays the live host's.
        assert_eq!(a.accept(Nanos::from_secs(2), old).unwrap(), Accept::Stale);
        assert_eq!(a.cluster(Nanos::from_secs(2)).unwrap().latency_ns, 10e6);
        assert_eq!(a.accept(Nanos::from_secs(3), new(2)).unwrap(), Accept::Newer);
        // Silent for the timeout: a lower epoch never seen is a restart (a clock that went back across
        // it); the old incarnation's, replayed, is not: it stays stale, and the host drops out.
        assert_eq!(a.accept(Nanos::from_secs(7), old).unwrap(), Accept::Stale, "live until 8 s");
        assert_eq!(a.accept(Nanos::from_secs(8), old).unwrap(), Accept::Stale, "an epoch the host had");
        // (A replayed stream that advances reads as a rival incarnation, and is not taken either.)
        let next = HostReport { seq: 901, ..old };
        assert_eq!(a.accept(Nanos::from_secs(9), next).unwrap(), Accept::Rival { taken: false });
        assert_eq!(a.cluster(Nanos::from_secs(9)), None, "the host dropped out");
        let back = HostReport { epoch: 0, seq: 1, ..old };
        assert_eq!(a.accept(Nanos::from_secs(9), back).unwrap(), Accept::Restarted);
        assert_eq!(a.cluster(Nanos::from_secs(9)).unwrap().latency_ns, 90e6);
        // And a replay of either earlier incarnation, now that epoch 0 runs, is stale too.
        assert_eq!(a.accept(Nanos::from_secs(9), new(3)).unwrap(), Accept::Stale);
    }

    /// Two hosts with one id (module comment, "Two incarnations alive at once"): their reports switch
    /// between two incarnations, each still advancing. The older one's new reports are `Rival` from one
    /// timeout after the switch on, and never taken again, even once the newer has been silent for the
    /// timeout: an epoch the id had before cannot be told from a replay ("Epochs move forward"). The id
    /// is the operator's to fix; the caller logs the rivals.
    #[test]
    fn two_incarnations_that_both_advance_are_rivals() {
        let mut a = Aggregator::new(Nanos::from_secs(3)).unwrap();
        let e1 = |seq| HostReport { epoch: 1, ..rep(1, seq, 90, 100) };
        let e2 = |seq| HostReport { epoch: 2, ..rep(1, seq, 10, 100) };
        let at = Nanos::from_secs;
        assert_eq!(a.accept(at(0), e1(1)).unwrap(), Accept::First);
        assert_eq!(a.accept(at(1), e2(1)).unwrap(), Accept::Restarted, "a restart, as far as anyone can tell");
        // Within a timeout of the switch it could still be a late datagram of the host that restarted.
        assert_eq!(a.accept(at(2), e1(3)).unwrap(), Accept::Stale);
        assert_eq!(a.accept(at(3), e2(3)).unwrap(), Accept::Newer);
        assert_eq!(a.accept(at(4), e1(5)).unwrap(), Accept::Rival { taken: false });
        assert_eq!(a.accept(at(4), e1(5)).unwrap(), Accept::Stale, "the same report again: nothing new");
        assert_eq!(a.cluster(at(4)).unwrap().latency_ns, 10e6, "the live incarnation's report stands");
        // The newer one silent for the timeout: the older's next report is a rival, not taken.
        assert_eq!(a.accept(at(7), e1(8)).unwrap(), Accept::Rival { taken: false });
        assert_eq!(a.cluster(at(7)), None);
        // The newer one back: its own next report.
        assert_eq!(a.accept(at(8), e2(9)).unwrap(), Accept::Newer);
        assert_eq!(a.accept(at(9), e1(10)).unwrap(), Accept::Rival { taken: false });
        assert_eq!(a.cluster(at(9)).unwrap().latency_ns, 10e6);
    }

    /// What is not a rival: a host that restarted (its old incarnation's late report, or its last one
    /// replayed, after the timeout), one whose clock went back across its restart (a lower epoch never
    /// seen), and a third incarnation.
    #[test]
    fn a_restart_and_late_or_replayed_reports_are_not_rivals() {
        let mut a = Aggregator::new(Nanos::from_secs(3)).unwrap();
        let at = Nanos::from_secs;
        let inc = |epoch, seq| HostReport { epoch, ..rep(1, seq, 10, 100) };
        a.accept(at(0), inc(5, 40)).unwrap();
        assert_eq!(a.accept(at(1), inc(6, 1)).unwrap(), Accept::Restarted);
        assert_eq!(a.accept(at(1), inc(5, 41)).unwrap(), Accept::Stale, "late, within the timeout");
        for t in 2..10 {
            assert_eq!(a.accept(at(t), inc(6, t)).unwrap(), Accept::Newer);
            assert_eq!(a.accept(at(t), inc(5, 41)).unwrap(), Accept::Stale, "replayed: no newer sequence");
        }
        assert_eq!(a.accept(at(20), inc(3, 1)).unwrap(), Accept::Restarted, "a clock gone back, after silence");
        assert_eq!(a.accept(at(30), inc(7, 1)).unwrap(), Accept::Restarted);
        assert_eq!(a.accept(at(31), inc(7, 2)).unwrap(), Accept::Newer);
    }

    #[test]
    fn a_peer_clock_jump_changes_nothing() {
        // Host 2's timestamps leap an hour ahead, then a day back; its sequence numbers keep going.
        let mut a = Aggregator::new(Nanos::from_secs(5)).unwrap();
        let mut t = Nanos::from_secs(100);
        for seq in 1..20u64 {
            let ts = match seq {
                1..=5 => Nanos::from_secs(1000 + seq),
                6..=10 => Nanos::from_secs(1000 + 3600 + seq),
                _ => Nanos::from_secs(seq),
            };
            a.accept(t, rep(1, seq, 30, 100)).unwrap();
            assert!(a.accept(t, HostReport { timestamp: ts, ..rep(2, seq, 10, 100) }).unwrap().accepted());
            assert_eq!(a.cluster(t).unwrap(), ClusterLatency { latency_ns: 20e6, ios: 200, hosts: 2 });
            t = t.saturating_add(Nanos::from_secs(2));
        }
    }

    #[test]
    fn bounds_and_bad_input() {
        assert_eq!(Aggregator::new(Nanos::ZERO).unwrap_err(), PardaError::Timeout);
        let mut a = Aggregator::new(Nanos(1)).unwrap();
        assert!(matches!(a.accept(Nanos(0), rep(MAX_HOSTS, 1, 1, 1)), Err(PardaError::HostId { .. })));
        assert!(a.accept(Nanos(0), rep(MAX_HOSTS - 1, 1, 1, 1)).is_ok());
        // Time going backwards is clamped and counted.
        a.accept(Nanos(100), rep(1, 1, 1, 1)).unwrap();
        a.accept(Nanos(50), rep(2, 1, 1, 1)).unwrap();
        assert_eq!(a.time_regressions(), 1);
        // Huge values do not overflow the average.
        let mut a = Aggregator::new(Nanos::from_secs(1)).unwrap();
        for h in 0..MAX_HOSTS {
            a.accept(Nanos(0), HostReport { latency_ns: u64::MAX, ios: u64::MAX, ..rep(h, 1, 0, 0) }).unwrap();
        }
        let c = a.cluster(Nanos(0)).unwrap();
        assert_eq!(c.hosts, MAX_HOSTS as usize);
        assert!((c.latency_ns - u64::MAX as f64).abs() / (u64::MAX as f64) < 1e-9);
    }
}
