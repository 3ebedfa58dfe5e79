//! The client side of dmClock (mclock-dmclock.txt §3.2.1) and of RBFQ's distributed Delta
//! (rbfq-repair.txt §3.2): a per-tenant tracker of service received across servers, and of where the
//! tenant's requests go.
//!
//! # Model
//! A tenant's requests go to many servers, each running [`super::Mclock`] (or [`super::Rbfq`]) on its own.
//! For the servers to give the tenant its *global* reservation, limit and weight, each request to server
//! s_j carries a [`Piggyback`] (what the future wire protocol carries):
//! - `delta`: completions at the other servers since the tenant's previous request to s_j (dmClock's
//!   delta_i, RBFQ's Delta less the request itself). P and L tags advance by `(cost + delta)/w` and `/l`.
//! - how the tenant's reservation is charged at s_j, which depends on the [`ReservationSplit`]:
//!   - [`ReservationSplit::Rho`], the paper's rule: `rho`, the part of `delta` served in reservation
//!     phase (dmClock's rho_i); R tags advance by `(cost + rho)/r` (see [`super::mclock`]).
//!   - [`ReservationSplit::Spread`], Rein's default: `share`, the measured fraction s_j of the tenant's
//!     recent requests that went to s_j; R tags advance by `cost/(r s_j)`, so s_j runs a local reservation
//!     clock of rate `r s_j` for the tenant (RBFQ's local/global split, with the local minimum M_ij
//!     derived from the spread instead of configured). `rho` is sent as 0.
//!
//! # Why the spread, not rho (issue 11)
//! dmClock's clients in §4.2 keep "64 concurrent IOs, uniformly distributed over the nodes": one pool of
//! outstanding IOs, each new IO sent to the node its offset maps to. Such a client's rate is the same at
//! each of its servers in the long run (1:1 issuance): the server where it is served slowest bounds its
//! rate everywhere. The rho rule fails such a client twice:
//! 1. *Where the reservation is charged.* rho tells s_j what the tenant got in reservation phase
//!    elsewhere; where the tenant is alone (Fig. 10's S2 for c2) it is served in the weight phase, so the
//!    rho arriving at the contended server stays near zero and the whole reservation is charged there.
//!    Fig. 10 with one pool of 64: c2 takes ~900 of S1's 1,500 in reservation phase, c1 (r = 800 on S1
//!    alone) falls to ~715.
//! 2. *The pool follows the service.* Requests pile up where the tenant is served slowest, so the other
//!    servers often hold no request of it and work conservation hands them to whoever is there (Fig. 9(b):
//!    c1 ~1,290 instead of 800).
//!
//! With the spread, every server guarantees its part r s_j whatever happens elsewhere. If the tenant's
//! requests really go to s_j in proportion s_j, its global rate X satisfies X s_j >= r s_j at every server
//! where it is backlogged, so X >= r: the reservation holds without any server knowing about another.
//! Worked example (Fig. 10): c2 (r = 1,000, shares 1:1) is owed 500 at each server; S1 (1,500 IOPS) gives
//! c1 its 800 and c2 its 500 in reservation phase and splits the last 200 by P tags (which carry delta,
//! so c2's service on S2 counts: c2 gets them), c2's rate on S1 is 700 and, with one pool, so is its rate
//! on S2: c1 800, c2 1,400, the paper's numbers. Measured in the simulator (scenarios
//! `dmclock-fig10-pool` and `-pool-rho`, `dmclock-fig9-resv-pool` and `-pool-rho`, seed 1): Fig. 10 c1
//! 808 / c2 1,390 (rho: 717 / 1,573); Fig. 9(b) 817 / 1,766 / 2,625 (rho: 1,286 / 2,110 / 1,803). With a
//! window per server (the other reading of the paper's clients) the spread changes nothing in Fig. 9 and
//! brings Fig. 10's c1 from 880 to 801.
//!
//! The server turns the share into an estimated rho, `cost (1 - s_j)/s_j`, and treats it as it treats a
//! measured one: it stays in the R tag when the request is served in the weight phase (see
//! [`super::mclock`] for why s_j still gets at least `r s_j`). So weight-phase IOs a tenant gets where its
//! pool leaves it alone count toward its reservation there, which is what keeps Fig. 9(b)'s c1 near 800;
//! the cost is that the reservation-phase share of its IOs no longer means "IOs owed" (c1: 0.78, not 1).
//! The one-pool drift itself (cause 2), where nothing is reserved, is the engine's business: a pool that
//! leaves a server's queue for a moment is not re-based on its return (`SchedConfig::pool_return`,
//! engine "Pools that move"); with it Fig. 9(a) with one pool gives c1 its 1/11 within 0.31% over seeds
//! 1-20 (without it, up to 5.8% above).
//!
//! What the spread gives up: the guarantee holds for the spread the tracker *measured*. A tenant whose
//! spread shifts (a new hot spot) is under-reserved at the new hot server until the window has seen the
//! shift (about one window of requests, [`ReservationSplit::Spread`] `window_ios`). A tenant that stops
//! sending to s_j leaves its part of the reservation unclaimed there rather than moving it to where it
//! now sends; the window moves it within `2 * window_ios` requests. And the servers' reservations
//! must be admitted per server (sum of r_i s_ij <= C_j), while rho lets a tenant claim its whole
//! reservation at one server if the others cannot serve it (rho's strength: it follows the service, the
//! spread follows the demand).
//!
//! # Measuring the spread
//! The tracker counts the requests it prepares per server in windows of `window_ios` requests; the
//! share it sends with a request to s_j is `(sent_prev_j + sent_j) / (sent_prev + sent)`, this window and
//! the previous one, the request itself included (so the share is never 0). Counting requests, not cost:
//! the tracker does not know the server's cost model; with one size per tenant the two agree.
//! The estimate is unbiased for i.i.d. routing with a relative error of about
//! `sqrt((1 - s_j) / (s_j n))` for n between `window_ios` and `2 window_ios` requests (3 servers, 1,024:
//! 3-4 %); the R charge, `1/share`, is convex in the share, so its mean is high by about the square of
//! that (0.1-0.2 %), which costs the tenant that much of its reservation.
//!
//! # The pool flag
//! A server cannot tell a tenant whose queue there emptied because its pool of outstanding IOs moved to
//! the other servers from one that went idle; the tracker can. It counts the tenant's requests in
//! flight (one more per [`ServiceTracker::prepare`], one fewer per [`ServiceTracker::complete`] or
//! [`ServiceTracker::abandon`]) and the times that count fell to zero (`empties`), and stamps each
//! request to s_j with [`Piggyback::pool_busy`]: no empty moment since its previous request to s_j. The
//! server keeps such a tenant's P tag after a short gap instead of re-basing it (`SchedConfig::
//! pool_return`, the engine's "Pools that move"). A request that ends without a completion being reported
//! (an error, a lost session) must be abandoned, or the count stays above zero and the flag stays set: the
//! server then treats a brief idleness as a pool that moved (bounded by `pool_return`, never more).
//!
//! # State and invariants
//! Running totals of completed cost over all servers (`total`, `total_resv`), and per server: the cost
//! completed there (`own`, `own_resv`), the value of `total - own` when the tenant last sent a request
//! there (`seen`, `seen_resv`), and the requests sent there in this window and the previous one (`sent`,
//! `sent_prev`). Then `delta = (total - own) - seen`. All cost counters are fixed-point cost units in
//! wrapping `u64` arithmetic, so differences stay right across wrap-around.
//! 1. `delta` and `rho` never count a completion at the server being addressed.
//! 2. Every completion elsewhere is counted in exactly one later request to each server (none lost, none
//!    counted twice), so over a long run each server sees the tenant's whole service. The one exception
//!    is [`ServiceTracker::forget_server`]: a server that restarted (a gateway's reconnect) has lost its
//!    tags, so the service elsewhere since its last request is dropped for it rather than charged in one
//!    request (which would push the tenant's P tag there far into the future).
//! 3. The shares sent are in `(0, 1]`, and `sum_j sent_j == window_sent < window_ios` (likewise for the
//!    previous window), so the shares of one moment over all servers sum to 1.
//! 4. `outstanding` is the requests prepared less those completed or abandoned (never below zero: an
//!    unmatched completion is ignored), and `empties` grows by one each time it falls to zero; a request
//!    to s_j is `pool_busy` iff a request went to s_j before and `empties` has not grown since.
//!
//! # Paper symbols -> code
//! | paper | code |
//! |---|---|
//! | delta_i, rho_i (dmClock §3.2.1) | [`Piggyback::delta`], [`Piggyback::rho`] |
//! | Delta (RBFQ §3.2) | [`Piggyback::delta`] plus the request's own cost |
//! | M_ij, RBFQ's local minimum | `r_i s_ij`, with s_ij = [`Piggyback::share`] |
//!
//! # Deviations from the paper
//! - [`ReservationSplit::Spread`] is the default; [`ReservationSplit::Rho`] is §3.2.1 as written.
//! - [`ServiceTracker::forget_server`] (not in the paper, whose servers never restart): a reconnected
//!   server starts from the present totals and an empty spread window.
//!
//! Servers are dense indices `0..max_servers`; an index beyond the bound is an error.

use super::Phase;
use crate::units::Cost;

/// Why a tracker call was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrackerError {
    /// A server index at or beyond the number of servers the tracker was built for.
    #[error("server index {index} out of range (tracker holds {max} servers)")]
    ServerOutOfRange {
        /// The index given.
        index: usize,
        /// Servers the tracker holds; valid indices are below it.
        max: usize,
    },
}

/// Default window of [`ReservationSplit::Spread`], in requests.
pub const DEFAULT_SPREAD_WINDOW_IOS: u32 = 1024;

/// Largest window of [`ReservationSplit::Spread`]: two windows of requests stay within the share's
/// resolution (`2 * MAX_SPREAD_WINDOW_IOS <= 1 / ReservationShare::MIN`), so a share is never rounded to 0.
pub const MAX_SPREAD_WINDOW_IOS: u32 = 1 << 15;

/// How a tracker tells each server which part of the tenant's reservation it owes (module comment).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReservationSplit {
    /// dmClock §3.2.1 as written: each request carries rho, the reservation-phase service received at
    /// the other servers, and R tags advance by `(cost + rho)/r`.
    Rho,
    /// Rein's default: each request carries the measured share s_j of the tenant's requests that go to
    /// its server, and R tags there advance by `cost/(r s_j)` (a local reservation of `r s_j`).
    /// `window_ios` (1..=[`MAX_SPREAD_WINDOW_IOS`]): requests per measuring window.
    Spread {
        /// Requests per measuring window; the share covers this window and the previous one.
        window_ios: u32,
    },
}

impl Default for ReservationSplit {
    fn default() -> Self {
        ReservationSplit::Spread { window_ios: DEFAULT_SPREAD_WINDOW_IOS }
    }
}

/// The part of a tenant's reservation one server owes it: a fraction in `(0, 1]` in fixed point with
/// [`ReservationShare::FRAC_BITS`] fractional bits. [`ReservationShare::ONE`] (the whole reservation) is
/// what a request to a single server, or under [`ReservationSplit::Rho`], carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReservationShare(u32);

impl ReservationShare {
    /// Fractional bits.
    pub const FRAC_BITS: u32 = 16;
    /// The whole reservation.
    pub const ONE: ReservationShare = ReservationShare(1 << Self::FRAC_BITS);
    /// The smallest share, 1/65536: a request charges at most 65536 times its cost to the R clock.
    pub const MIN: ReservationShare = ReservationShare(1);

    /// `part / whole`, rounded to nearest and clamped into `[MIN, ONE]`; `whole == 0` gives `ONE`.
    pub fn from_ratio(part: u64, whole: u64) -> ReservationShare {
        if whole == 0 {
            return Self::ONE;
        }
        let v = ((part as u128) << Self::FRAC_BITS).saturating_add(whole as u128 / 2) / whole as u128;
        ReservationShare(v.clamp(Self::MIN.0 as u128, Self::ONE.0 as u128) as u32)
    }

    /// The raw fixed-point value (`ONE` = 65536).
    pub fn raw(self) -> u32 {
        self.0
    }

    /// The share as `f64` (for reports).
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / Self::ONE.0 as f64
    }

    /// The reservation service elsewhere that a request of cost `cost` to this server stands for:
    /// `cost * (1 - s)/s`, so that `cost + elsewhere(cost) = cost/s` (rounded down, saturating).
    pub fn elsewhere(self, cost: Cost) -> Cost {
        debug_assert!(self >= Self::MIN && self <= Self::ONE, "share in (0, 1] (tracker invariant 3)");
        if self == Self::ONE {
            return Cost(0);
        }
        let v = cost.0 as u128 * (Self::ONE.0 - self.0) as u128 / self.0.max(1) as u128;
        Cost(u64::try_from(v).unwrap_or(u64::MAX))
    }
}

impl Default for ReservationShare {
    fn default() -> Self {
        Self::ONE
    }
}

/// What a request to one server carries from its tenant's tracker ([`super::Request::piggyback`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Piggyback {
    /// Completed cost at the other servers since the previous request to this one.
    pub delta: Cost,
    /// The part of `delta` served in reservation phase ([`ReservationSplit::Rho`]; 0 under `Spread`).
    pub rho: Cost,
    /// The part of the reservation this server owes ([`ReservationSplit::Spread`]; `ONE` under `Rho`).
    pub share: ReservationShare,
    /// The tenant had requests in flight at every moment since its previous request to this server
    /// (module comment, "The pool flag"). False for its first request there.
    pub pool_busy: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct PerServer {
    own: u64,
    own_resv: u64,
    seen: u64,
    seen_resv: u64,
    /// Requests prepared for this server in the current window.
    sent: u32,
    /// Requests prepared for this server in the previous window.
    sent_prev: u32,
    /// The boot identity of the server's last session, if it stated one ([`ServiceTracker::session`]).
    boot: Option<u64>,
    /// `empties` when the last request to this server was prepared; `None` before the first.
    empties_at_send: Option<u64>,
}

/// A tenant's service tracker (one per tenant per client/gateway).
#[derive(Debug, Clone)]
pub struct ServiceTracker {
    total: u64,
    total_resv: u64,
    split: ReservationSplit,
    /// Requests prepared in the current window (sum of `sent`) and in the previous one.
    window_sent: u32,
    window_sent_prev: u32,
    servers: Vec<PerServer>,
    /// Requests in flight (invariant 4).
    outstanding: u64,
    /// Times `outstanding` fell to zero.
    empties: u64,
}

impl ServiceTracker {
    /// A tracker for servers `0..servers` with the default [`ReservationSplit`].
    pub fn new(servers: usize) -> Self {
        Self::with_split(servers, ReservationSplit::default())
    }

    /// A tracker for servers `0..servers` that splits the reservation by `split`. A `window_ios` outside
    /// `1..=MAX_SPREAD_WINDOW_IOS` is clamped into it.
    pub fn with_split(servers: usize, split: ReservationSplit) -> Self {
        let split = match split {
            ReservationSplit::Spread { window_ios } => {
                ReservationSplit::Spread { window_ios: window_ios.clamp(1, MAX_SPREAD_WINDOW_IOS) }
            }
            ReservationSplit::Rho => ReservationSplit::Rho,
        };
        ServiceTracker {
            total: 0,
            total_resv: 0,
            split,
            window_sent: 0,
            window_sent_prev: 0,
            servers: vec![PerServer::default(); servers],
            outstanding: 0,
            empties: 0,
        }
    }

    /// Tracks servers `0..servers` from now on, when that is more than it tracks (a gateway's reload that
    /// adds storage nodes); fewer change nothing (indices stay). A server added is one the tenant never
    /// sent to: its account starts now (as [`ServiceTracker::forget_server`]'s), so its first request
    /// carries only what completes elsewhere from now on, and the shares of the other servers are unchanged.
    pub fn add_servers(&mut self, servers: usize) {
        let (total, total_resv) = (self.total, self.total_resv);
        let fresh = PerServer { seen: total, seen_resv: total_resv, ..PerServer::default() };
        if servers > self.servers.len() {
            self.servers.resize(servers, fresh);
        }
    }

    /// Servers tracked; valid indices are `0..servers()`.
    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    /// How this tracker splits the reservation.
    pub fn split(&self) -> ReservationSplit {
        self.split
    }

    fn server(&mut self, index: usize) -> Result<&mut PerServer, TrackerError> {
        let max = self.servers.len();
        self.servers.get_mut(index).ok_or(TrackerError::ServerOutOfRange { index, max })
    }

    /// Call when sending a request to `server`: returns what to piggyback on it.
    pub fn prepare(&mut self, server: usize) -> Result<Piggyback, TrackerError> {
        let (total, total_resv, split, empties) = (self.total, self.total_resv, self.split, self.empties);
        self.server(server)?;
        self.outstanding += 1;
        let s = self.server(server)?;
        let pool_busy = s.empties_at_send == Some(empties);
        s.empties_at_send = Some(empties);
        let elsewhere = total.wrapping_sub(s.own);
        let elsewhere_resv = total_resv.wrapping_sub(s.own_resv);
        let delta = Cost(elsewhere.wrapping_sub(s.seen));
        let rho = Cost(elsewhere_resv.wrapping_sub(s.seen_resv));
        s.seen = elsewhere;
        s.seen_resv = elsewhere_resv;
        match split {
            ReservationSplit::Rho => Ok(Piggyback { delta, rho, share: ReservationShare::ONE, pool_busy }),
            ReservationSplit::Spread { window_ios } => {
                s.sent += 1;
                let s = *s;
                self.window_sent += 1;
                let share = self.spread_share(&s);
                if self.window_sent >= window_ios {
                    for s in &mut self.servers {
                        s.sent_prev = s.sent;
                        s.sent = 0;
                    }
                    self.window_sent_prev = self.window_sent;
                    self.window_sent = 0;
                }
                Ok(Piggyback { delta, rho: Cost(0), share, pool_busy })
            }
        }
    }

    /// The share a request to `server` would carry now, without sending one (for reports and tests);
    /// `ONE` under [`ReservationSplit::Rho`] or before any request was prepared.
    pub fn share(&self, server: usize) -> Result<ReservationShare, TrackerError> {
        let s = self
            .servers
            .get(server)
            .ok_or(TrackerError::ServerOutOfRange { index: server, max: self.servers.len() })?;
        Ok(match self.split {
            ReservationSplit::Rho => ReservationShare::ONE,
            ReservationSplit::Spread { .. } => self.spread_share(s),
        })
    }

    /// The share of `s`: its requests over the tenant's, in this window and the previous one.
    fn spread_share(&self, s: &PerServer) -> ReservationShare {
        let part = u64::from(s.sent) + u64::from(s.sent_prev);
        let whole = u64::from(self.window_sent) + u64::from(self.window_sent_prev);
        // Invariant 3: part <= whole <= 2 * MAX_SPREAD_WINDOW_IOS (and part >= 1 once a request was sent).
        debug_assert!(part <= whole && whole <= 2 * u64::from(MAX_SPREAD_WINDOW_IOS));
        ReservationShare::from_ratio(part, whole)
    }

    /// Call when `server` restarted or its connection was replaced (a gateway's reconnect): the server has
    /// forgotten the tenant, so the backlog of service elsewhere since its last request must not arrive as
    /// one huge delta in its first request. Sets the server's `seen` counters to the present totals (its
    /// next delta and rho count only what completes elsewhere from now on) and drops its requests from
    /// the spread's windows (taken out of the window totals too, so invariant 3 holds). Its own completed
    /// cost stays counted in the totals the other servers see.
    pub fn forget_server(&mut self, server: usize) -> Result<(), TrackerError> {
        let (total, total_resv) = (self.total, self.total_resv);
        let s = self.server(server)?;
        s.seen = total.wrapping_sub(s.own);
        s.seen_resv = total_resv.wrapping_sub(s.own_resv);
        let (sent, sent_prev) = (s.sent, s.sent_prev);
        s.sent = 0;
        s.sent_prev = 0;
        self.window_sent -= sent;
        self.window_sent_prev -= sent_prev;
        Ok(())
    }

    /// Call when a new session with `server` starts (a gateway's first connection or a reconnect), with the
    /// boot identity the server stated, if any (a storage node's welcome from protocol version 2). The
    /// server restarted, and has forgotten the tenant, exactly when `boot` is `None` (it cannot say, so
    /// assume it did) or differs from the last one seen: then its account starts afresh
    /// ([`ServiceTracker::forget_server`]). A session to the same boot (a connection that broke while the
    /// server ran on, another pooled connection) keeps it: the server still holds the tenant's tags, so
    /// what completed elsewhere meanwhile is its delta, as dmClock's rule says. Returns whether the
    /// account was started afresh.
    pub fn session(&mut self, server: usize, boot: Option<u64>) -> Result<bool, TrackerError> {
        let s = self.server(server)?;
        let same = boot.is_some() && s.boot == boot;
        s.boot = boot;
        if !same {
            self.forget_server(server)?;
        }
        Ok(!same)
    }

    /// Call when `server` reports a completion of cost `cost` served in `phase`.
    pub fn complete(&mut self, server: usize, phase: Phase, cost: Cost) -> Result<(), TrackerError> {
        let resv = phase == Phase::Reservation;
        let s = self.server(server)?;
        s.own = s.own.wrapping_add(cost.0);
        if resv {
            s.own_resv = s.own_resv.wrapping_add(cost.0);
        }
        self.total = self.total.wrapping_add(cost.0);
        if resv {
            self.total_resv = self.total_resv.wrapping_add(cost.0);
        }
        self.ended();
        Ok(())
    }

    /// Call when a request prepared for `server` ends without a completion to report (an error reply, a
    /// session lost with the request in flight, a request the server refused): it leaves the pool
    /// (invariant 4) and counts no service.
    pub fn abandon(&mut self, server: usize) -> Result<(), TrackerError> {
        self.server(server)?;
        self.ended();
        Ok(())
    }

    /// Requests in flight: prepared, not yet completed or abandoned.
    pub fn outstanding(&self) -> u64 {
        self.outstanding
    }

    /// One request left the pool (invariant 4).
    fn ended(&mut self) {
        if self.outstanding > 0 {
            self.outstanding -= 1;
            if self.outstanding == 0 {
                self.empties = self.empties.wrapping_add(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rho_tracker(servers: usize) -> ServiceTracker {
        ServiceTracker::with_split(servers, ReservationSplit::Rho)
    }

    fn pair(p: Piggyback) -> (Cost, Cost) {
        (p.delta, p.rho)
    }

    #[test]
    fn counts_only_other_servers_once() {
        let mut t = rho_tracker(2);
        assert_eq!(pair(t.prepare(0).unwrap()), (Cost(0), Cost(0)));
        // Three completions at server 1 (one in reservation phase), one at server 0.
        t.complete(1, Phase::Weight, Cost::ONE).unwrap();
        t.complete(1, Phase::Reservation, Cost::ONE).unwrap();
        t.complete(1, Phase::Weight, Cost::ONE).unwrap();
        t.complete(0, Phase::Weight, Cost::ONE).unwrap();
        assert_eq!(pair(t.prepare(0).unwrap()), (Cost::units(3), Cost::units(1)));
        assert_eq!(pair(t.prepare(0).unwrap()), (Cost(0), Cost(0)), "nothing counted twice");
        // Server 1 sees only server 0's completion.
        assert_eq!(pair(t.prepare(1).unwrap()), (Cost::units(1), Cost(0)));
        assert_eq!(t.prepare(1).unwrap().share, ReservationShare::ONE, "rho mode sends the whole reservation");
        assert!(matches!(t.prepare(2), Err(TrackerError::ServerOutOfRange { index: 2, max: 2 })));
        assert!(t.complete(5, Phase::Weight, Cost::ONE).is_err());
    }

    /// A reconnected server gets no backlog: its next delta counts only completions elsewhere after the
    /// reconnect, and its share restarts from its new requests.
    #[test]
    fn forget_server_drops_the_backlog() {
        for split in [ReservationSplit::Rho, ReservationSplit::Spread { window_ios: 100 }] {
            let mut t = ServiceTracker::with_split(2, split);
            t.prepare(0).unwrap();
            for _ in 0..10 {
                t.prepare(1).unwrap();
                t.complete(1, Phase::Reservation, Cost::ONE).unwrap();
            }
            let mut before = t.clone();
            assert_eq!(before.prepare(0).unwrap().delta, Cost::units(10), "without forgetting: the whole backlog");
            t.forget_server(0).unwrap();
            t.complete(1, Phase::Reservation, Cost::units(2)).unwrap();
            let p = t.prepare(0).unwrap();
            assert_eq!(p.delta, Cost::units(2), "only what completed elsewhere after the reconnect");
            if split == ReservationSplit::Rho {
                assert_eq!(p.rho, Cost::units(2));
            } else {
                // 10 requests to server 1 and, since forgetting, 1 to server 0: 1/11.
                assert_eq!(p.share, ReservationShare::from_ratio(1, 11));
            }
            assert!(matches!(t.forget_server(2), Err(TrackerError::ServerOutOfRange { index: 2, max: 2 })));
        }
    }

    /// A server added later starts its account then: its first delta counts only what completes
    /// elsewhere after it was added; the others' accounts and shares are unchanged.
    #[test]
    fn add_servers_starts_their_accounts_then() {
        for split in [ReservationSplit::Rho, ReservationSplit::Spread { window_ios: 100 }] {
            let mut t = ServiceTracker::with_split(1, split);
            for _ in 0..10 {
                t.prepare(0).unwrap();
                t.complete(0, Phase::Reservation, Cost::ONE).unwrap();
            }
            let before = t.clone();
            t.add_servers(3);
            t.add_servers(2);
            assert_eq!(t.servers(), 3, "never fewer");
            assert_eq!(t.share(0), before.share(0));
            t.complete(0, Phase::Reservation, Cost::units(2)).unwrap();
            let p = t.prepare(2).unwrap();
            assert_eq!(p.delta, Cost::units(2), "only what completed after the server was added");
            assert!(!p.pool_busy, "its first request");
            if split == ReservationSplit::Rho {
                assert_eq!(p.rho, Cost::units(2));
            }
            assert_eq!(t.prepare(1).unwrap().delta, Cost::units(2));
        }
    }

    /// A new session to the same boot keeps the account (the delta of the outage arrives); a new boot, or
    /// a server that states none, starts it afresh.
    #[test]
    fn a_session_forgets_only_a_restarted_server() {
        let backlog = |t: &mut ServiceTracker| {
            for _ in 0..5 {
                t.prepare(1).unwrap();
                t.complete(1, Phase::Weight, Cost::ONE).unwrap();
            }
        };
        let mut t = ServiceTracker::with_split(2, ReservationSplit::Rho);
        assert!(t.session(0, Some(7)).unwrap(), "the first session starts the account");
        t.prepare(0).unwrap();
        backlog(&mut t);
        assert!(!t.session(0, Some(7)).unwrap(), "same boot: kept");
        assert_eq!(t.prepare(0).unwrap().delta, Cost::units(5), "the outage's service elsewhere is the delta");
        backlog(&mut t);
        assert!(t.session(0, Some(8)).unwrap(), "another boot: the server restarted");
        assert_eq!(t.prepare(0).unwrap().delta, Cost(0));
        backlog(&mut t);
        assert!(t.session(0, None).unwrap(), "no boot stated: assume a restart");
        assert_eq!(t.prepare(0).unwrap().delta, Cost(0));
        assert!(t.session(0, None).unwrap(), "and again");
        assert!(t.session(3, Some(1)).is_err());
    }

    #[test]
    fn single_server_delta_is_zero() {
        for split in [ReservationSplit::Rho, ReservationSplit::default()] {
            let mut t = ServiceTracker::with_split(1, split);
            for _ in 0..100 {
                let p = t.prepare(0).unwrap();
                // Each request completes before the next: the pool empties in between.
                let want = Piggyback { delta: Cost(0), rho: Cost(0), share: ReservationShare::ONE, pool_busy: false };
                assert_eq!(p, want);
                t.complete(0, Phase::Reservation, Cost::ONE).unwrap();
            }
        }
    }

    /// Invariant 4: a request is `pool_busy` iff the tenant had requests in flight at every moment since
    /// its previous request to the same server.
    #[test]
    fn pool_flag_says_whether_the_pool_emptied_since_the_last_request_there() {
        let mut t = ServiceTracker::new(2);
        assert!(!t.prepare(0).unwrap().pool_busy, "the first request to a server");
        assert!(!t.prepare(1).unwrap().pool_busy, "the first request to a server");
        t.complete(0, Phase::Weight, Cost::ONE).unwrap();
        // Server 1's request is still in flight: the pool never emptied since the last request to 0.
        assert!(t.prepare(0).unwrap().pool_busy);
        assert_eq!(t.outstanding(), 2);
        t.complete(1, Phase::Weight, Cost::ONE).unwrap();
        t.abandon(0).unwrap(); // an error reply: leaves the pool, counts no service
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.prepare(1).unwrap().delta, Cost::ONE, "abandon counted no service");
        assert!(!t.prepare(0).unwrap().pool_busy, "the pool emptied since the last request to 0");
        assert!(t.prepare(1).unwrap().pool_busy, "in flight throughout since the last request to 1");
        // Unmatched completions are ignored, never below zero.
        for _ in 0..5 {
            t.complete(0, Phase::Weight, Cost::ONE).unwrap();
        }
        assert_eq!(t.outstanding(), 0);
        assert!(t.abandon(2).is_err());
    }

    #[test]
    fn survives_counter_wrap() {
        let mut t = rho_tracker(2);
        t.total = u64::MAX - 1;
        t.servers[0].seen = u64::MAX - 1;
        t.complete(1, Phase::Weight, Cost::units(2)).unwrap();
        assert_eq!(t.prepare(0).unwrap().delta, Cost::units(2));
    }

    #[test]
    fn spread_sends_delta_but_no_rho() {
        let mut t = ServiceTracker::new(2);
        t.prepare(0).unwrap();
        t.complete(1, Phase::Reservation, Cost::ONE).unwrap();
        let p = t.prepare(0).unwrap();
        assert_eq!((p.delta, p.rho), (Cost::ONE, Cost(0)));
    }

    #[test]
    fn round_robin_over_three_gives_a_third_each() {
        let mut t = ServiceTracker::with_split(3, ReservationSplit::Spread { window_ios: 30 });
        let mut last = [ReservationShare::ONE; 3];
        for i in 0..300 {
            last[i % 3] = t.prepare(i % 3).unwrap().share;
        }
        // Within one request of a third, over the 30 to 60 requests measured.
        for s in last {
            assert!(s.raw().abs_diff(ReservationShare::from_ratio(1, 3).raw()) <= ReservationShare::ONE.raw() / 30);
        }
        // At a window's end each server has had exactly its third: a request stands for itself and two
        // elsewhere.
        let mut t = ServiceTracker::with_split(3, ReservationSplit::Spread { window_ios: 30 });
        let shares: Vec<_> = (0..60).map(|i| t.prepare(i % 3).unwrap().share).collect();
        assert_eq!(shares[59], ReservationShare::from_ratio(1, 3));
        assert!(shares[59].elsewhere(Cost::ONE).0.abs_diff(Cost::units(2).0) <= 3);
    }

    #[test]
    fn share_bounds_and_rounding() {
        assert_eq!(ReservationShare::from_ratio(0, 10), ReservationShare::MIN);
        assert_eq!(ReservationShare::from_ratio(10, 10), ReservationShare::ONE);
        assert_eq!(ReservationShare::from_ratio(3, 0), ReservationShare::ONE);
        assert_eq!(ReservationShare::from_ratio(1, 2).raw(), 1 << 15);
        assert_eq!(ReservationShare::ONE.elsewhere(Cost::units(5)), Cost(0));
        assert_eq!(ReservationShare::from_ratio(1, 4).elsewhere(Cost::ONE), Cost::units(3));
        // The largest charge stays finite: 65535 units beyond the request's own at MIN.
        assert_eq!(ReservationShare::MIN.elsewhere(Cost::ONE), Cost::units(65_535));
        assert_eq!(ReservationShare::MIN.elsewhere(Cost(u64::MAX)), Cost(u64::MAX));
    }

    #[test]
    fn window_is_clamped() {
        let t = ServiceTracker::with_split(2, ReservationSplit::Spread { window_ios: 0 });
        assert_eq!(t.split(), ReservationSplit::Spread { window_ios: 1 });
        let t = ServiceTracker::with_split(2, ReservationSplit::Spread { window_ios: u32::MAX });
        assert_eq!(t.split(), ReservationSplit::Spread { window_ios: MAX_SPREAD_WINDOW_IOS });
    }

    /// The reference: the share of a request is its server's count over this window and the previous one
    /// (windows of `w` requests counted from the first), the request included.
    fn reference_shares(route: &[usize], w: usize) -> Vec<ReservationShare> {
        route
            .iter()
            .enumerate()
            .map(|(i, &j)| {
                let start = (i / w).saturating_sub(1) * w;
                let part = route[start..=i].iter().filter(|&&x| x == j).count();
                ReservationShare::from_ratio(part as u64, (i + 1 - start) as u64)
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Invariant 3 and the measuring rule, against a brute-force reference.
        #[test]
        fn shares_match_the_windowed_counts(
            route in prop::collection::vec(0usize..4, 1..600),
            w in 1u32..80,
        ) {
            let mut t = ServiceTracker::with_split(4, ReservationSplit::Spread { window_ios: w });
            let got: Vec<_> = route.iter().map(|&j| t.prepare(j).unwrap().share).collect();
            prop_assert_eq!(&got, &reference_shares(&route, w as usize));
            // The shares of one moment sum to one (within rounding of each).
            let sum: u64 = (0..4).map(|j| {
                let s = t.share(j).unwrap();
                if s == ReservationShare::MIN && !route.contains(&j) { 0 } else { u64::from(s.raw()) }
            }).sum();
            prop_assert!(sum.abs_diff(u64::from(ReservationShare::ONE.raw())) <= 4, "sum {}", sum);
        }

        /// The analytic expectation: with i.i.d. routing by probabilities p_j, the R charge a server
        /// collects per request sent to it is about `1/p_j`, so over n requests each server's charges add
        /// up to about n (each server runs a reservation clock of r p_j, and the parts sum to r), high by
        /// the estimate's convexity bias.
        #[test]
        fn charges_add_up_to_the_whole(
            weights in prop::collection::vec(1u32..10, 2..5),
            seed in any::<u64>(),
        ) {
            let total_w: u32 = weights.iter().sum();
            let n = 40_000usize;
            let mut t = ServiceTracker::with_split(weights.len(), ReservationSplit::Spread { window_ios: 1024 });
            let mut x = seed | 1;
            let mut charge = vec![0u128; weights.len()];
            for _ in 0..n {
                // xorshift64*, drawn into the weights.
                x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
                let mut d = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % u64::from(total_w);
                let mut j = 0;
                while d >= u64::from(weights[j]) { d -= u64::from(weights[j]); j += 1; }
                let p = t.prepare(j).unwrap();
                charge[j] += u128::from(Cost::ONE.0 + p.share.elsewhere(Cost::ONE).0);
            }
            for (j, c) in charge.iter().enumerate() {
                let ios = *c as f64 / Cost::ONE.0 as f64;
                // Convexity bias (1 - p)/(p m) for m >= 1,024 requests measured, twice over, plus noise.
                let p = f64::from(weights[j]) / f64::from(total_w);
                let tol = 0.01 + 2.0 * (1.0 - p) / (p * 1024.0);
                prop_assert!((ios / n as f64 - 1.0).abs() < tol, "server {}: charges {} for {} requests", j, ios, n);
            }
        }
    }
}
