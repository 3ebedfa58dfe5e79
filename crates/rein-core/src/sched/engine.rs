//! The dual-clock tag engine behind [`super::Mclock`] (mClock, dmClock) and [`super::Rbfq`].
//!
//! mClock (mclock-dmclock.txt §3, Algorithm 1) and RBFQ (rbfq-repair.txt §3.1, Fig. 5) are the same
//! machine under different names: a *reservation clock* (mClock's R tags, RBFQ's local tags) served first
//! whenever a tag is due, a *proportional clock* (P tags, global tags) that orders the rest, and an
//! optional *limit clock* (L tags; RBFQ's upper-bound tag u). The flavours differ only in which cost feeds
//! which clock; see [`Flavor`]. The public modules carry the paper-facing design notes; this one says how
//! the machine is built.
//!
//! # State
//! Per tenant: a FIFO of queued requests (`first`, then `rest`; requests of one tenant are never
//! reordered, §3.1 "Request Type"), the tags of its head request (`head_r`, `head_l`, `head_p`) and the tags of the request
//! it dispatched last (`last_r`, `last_l`, `last_p`). Tags are computed when a request becomes the head,
//! from the last dispatched request's tags: `head_x = max(last_x + cost_x * step_x, arrival)`. For a
//! backlogged tenant this equals Algorithm 1's tags assigned at arrival, and it makes "subtract 1/r from
//! the R tags of v_k" (weight-phase dispatch) O(1): we subtract it from `last_r` alone, since no later tag
//! exists yet. (ceph/dmclock walks the tenant's whole queue for this.)
//!
//! Three indexed heaps over tenant slots, each tenant with queued requests in:
//! - `resv`: keyed by `head_r`, every backlogged tenant with a reservation not held back by its limit;
//! - exactly one of `ready` (keyed by `head_p`; `head_l <= now` or no limit) and `limited` (keyed by
//!   `head_l`; `head_l > now`).
//!
//! `poll(now)`: move every tenant whose limit tag has come due from `limited` to `ready` (and `resv`); if
//! `resv`'s minimum is due (`<= now`) serve it in the reservation phase; otherwise serve `ready`'s minimum P
//! tag in the weight phase; otherwise wait for the earliest R or L tag. One dispatch changes one tenant's head, so it
//! costs O(log n) heap work: the 60 ns / 400 ns targets at 10 / 10,000 tenants come from this.
//!
//! # Virtual time for P tags (Tag Adjustment)
//! P tags are spaced by weight, not by real time, so they drift from it. The paper re-bases: when a VM
//! becomes active, "the smallest P tag matches the time of arrival of the new VM" (mClock; RBFQ does it at
//! every arrival). Shifting every tag by the same amount changes no decision, so instead of shifting all
//! tags we keep them in a *virtual* frame and give a newly active tenant `vnow`, the smallest P tag among
//! tenants eligible for the weight phase (monotone: we keep the maximum seen; only the renormalisation
//! below lowers it, with every P tag). This is the paper's "offset" implementation, O(1) per activation.
//! With idle credit sigma the tenant may start `sigma * step_p` behind `vnow` (§3.1 Burst Handling, RBFQ
//! §3.3); it never starts ahead of its own history (`last_p + cost * step_p`), so going idle cannot erase
//! a lead it earned.
//!
//! # Virtual time's range (renormalisation)
//! `vnow` only rises, and nothing ties it to real time. One unit of cost moves a P tag by `step_p` =
//! 2^32 * 1e9 / w tag units (2^-32 ns): 4.3e18 (2^62) at w = 1, 4.3e21 (under 2^72) at [`MIN_WEIGHT`].
//! With the device serving C cost units per second to backlogged tenants of weights summing W, `vnow`
//! advances by about 2^62 C / W tag units per second, and a `u128` ends at 2^128 (3.4e38):
//! - per IO at 10^6 IOPS and W = 1: 2^82 per second, 2.5 million years to the end;
//! - per byte (unit 1 byte) at 10 GB/s and W = 0.001 (a tenant at [`MIN_WEIGHT`] alone): 2^105 per
//!   second, 92 days; at [`MAX_RATE`] (1 TB/s), 22 hours;
//! - a peer's delta of u64::MAX (the wire's largest; 2^48 units) at w = 1: 2^110 per request, 2^18
//!   requests.
//!
//! Past the end every P tag saturated at `u128::MAX`, all keys tied, and the lowest slot took the whole
//! weight phase for good (review 1: weights 1 and 9 got 1,000 and 0 dispatches). Two rules keep `vnow`
//! in range:
//! - **One request's increment is bounded.** A request's delta and rho count as at most [`Cost::MAX`]
//!   (2^40 units; a request's own cost is at most that), so one request moves a P tag by less than
//!   2^41 units * 2^72 = 2^113 tag units. (A larger delta is a peer's nonsense or more than 2^40 units,
//!   a TiB under the per-byte cost, served elsewhere between two requests here; counted as 2^40 it
//!   still puts the tenant 2^40 of its own units further on, which orders it the same way.)
//! - **Renormalisation** (invariant 9). When `vnow` reaches [`VTIME_CEILING`] = 2^127, every value in
//!   the P frame is lowered by `vnow - VTIME_REBASED` ([`VTIME_REBASED`] = 2^126), saturating at 0:
//!   `vnow`, every tenant's `head_p` and `last_p` (idle, limited and ready alike), the `ready` heap's keys
//!   and the `away` entries' `last_p` (with the tenants' own, so [`AwayEntry::counts`] still matches
//!   them). Idle credit, the pool floor's slack and the lead bound are differences, not positions, and
//!   R and L tags are in real time: they stay. `vnow` rises at a tenant's activation and in the weight
//!   phase, and only there is it compared with the ceiling: one comparison on the hot path.
//!
//! Why it changes no decision: the weight phase compares P-frame values with each other and adds
//! differences to them (increments, credit, slack, lead); lowering all of them by one constant changes
//! none of that, as long as no value is clipped at 0, that is, none lies more than 2^126 behind `vnow`
//! (tested against a twin that never renormalises, many times per run). Legitimate gaps are far smaller:
//! idle credit at most [`crate::spec::MAX_IDLE_CREDIT`] (256) units * 2^72 < 2^80, the pool floor's slack
//! `lag_ios` (a `u32`) units * 2^72 < 2^104. A returning tenant whose `last_p` was clipped starts at its
//! floor, as it would have (its history was further behind than the floor). What can lie further behind
//! is credit banked without bound, which the defaults refuse (invariant 6): a tenant held by its limit
//! under the paper's re-entry rule (`limited_reenter_at_vnow: false`), or under a pool return whose
//! window outlasts 2^126 of virtual time, a tenant returning behind one that left long ago; such a
//! tenant keeps 2^126 of it, at the fastest virtual time the bounds allow (1 TB/s per byte, W = 0.001)
//! 5.5 hours of the device. Why the ceiling is at 2^127: the 2^127 above it hold 2^14 of the largest
//! increments, so no tag computed from values below it overflows, and a tenant's lead over `vnow` is at
//! most `weight_lead_ios` (default 16) increments or that many times T <= 64 ms of its reservation
//! (invariant 8): under 2^117, and under 2^112 for the second (64 ms at [`MAX_RATE`] is 2^36 units, at
//! 2^72 each at [`MIN_WEIGHT`]). A tenant exempt from that
//! bound (a distributed one, or with `weight_lead_ios: None`) may lead by more than 2^127 and saturate:
//! it sorts last, as it would anyway, and when it becomes the smallest P tag `vnow` reaches the ceiling
//! and is renormalised. At the fastest virtual time above, a renormalisation comes every 5.5 hours (at
//! 10^6 IOPS per IO and W = 1, once in a million years); it walks every tenant and rebuilds the `ready`
//! and `away` heaps, O(n) and without allocating. It depends on the inputs alone, so runs stay
//! deterministic.
//!
//! # Invariants (asserted in debug builds and by `check()` in tests)
//! 1. A tenant is in `resv` iff it has queued requests, a reservation, and is not in `limited`. Limits are
//!    hard even against reservations (Algorithm 1's constraint phase does not look at L tags, which lets a
//!    tenant served up to its limit in the weight phase go one IO over it when an R tag falls due); since
//!    r <= l, holding R-phase service until the L tag is due still meets the reservation.
//! 2. A tenant with queued requests is in exactly one of `ready`, `limited`; a tenant without is in none.
//! 3. A tenant in `limited` has a limit and `head_l > now` at the time it was placed there.
//! 4. `now` never decreases; `vnow` decreases only in a renormalisation, which lowers every P-frame value
//!    with it (invariant 9).
//! 5. `queued` equals the sum of the tenants' queue lengths.
//! 6. No tenant enters the weight race (`ready`) with a P tag below `vnow - its idle credit`: neither an
//!    idle period nor a period held back by its limit banks weight-phase credit beyond sigma. (The paper
//!    says this for idle VMs; for limited ones it is our addition: without it a tenant limit-clamped for
//!    a minute would, once the capacity falls below its limit, take a minute of banked share from the
//!    others. The property tests with halving capacity catch exactly this.) One exception, a pool that
//!    moved or stayed (below): a distributed tenant whose pool stayed busy, or a tenant with requests at
//!    this server's device, back within [`super::PoolReturn::window`], may enter up to
//!    `lag_ios` of its own IOs below the smallest P tag of the tenants it competes with here.
//! 7. R tags of a backlogged tenant are never moved forward one tenant at a time; only a tenant becoming
//!    active is (`max(., t)` of Algorithm 1 applies to requests arriving at an empty queue). Algorithm 1
//!    clamps every request to its arrival time; when capacity falls below the sum of reservations that
//!    forgives the lag of tenants whose queued requests are young (the high-rate ones) first, and service
//!    stops being proportional to reservations, which §2.1 promises. Kept lag means a backlogged tenant
//!    that was under-served is paid back in the reservation phase once capacity returns; how much is kept
//!    is bounded for all tenants at once (see "Bounded repayment"). L tags are clamped
//!    differently from Algorithm 1 too: not to the request's arrival, which lets a backlogged tenant
//!    running below its limit bank a queue's worth of limit credit and burst over its limit when capacity
//!    rises (15 IOs over in the first second in `tests/features.rs`), but to `limit_burst_ios` of its own
//!    limit steps before the time the request becomes its head: a token bucket of that depth. The slack
//!    keeps the limit rate exact when dispatches come late (a device only asks for work when a slot
//!    frees): clamping to that time itself lost 15% of a 1,000 IOPS limit on a 2,400 IOPS device, and 2
//!    steps of slack still lost 2%. A limit holds in every window W to l*W + `limit_burst_ios` + 1 IOs.
//! 8. After a reservation-phase dispatch a tenant's P tag is ahead of `vnow` by at most `weight_lead_ios`
//!    times the larger of one of its own IOs and T of its reservation (r * T / w of P; unless it already
//!    was, from before: tags never move back). T is the same for every tenant: the longest w / (r *
//!    w_min) of the tenants with a reservation (w_min the smallest weight of all the tenants here),
//!    rounded up to 4, 8, 16, 32 or 64 ms ([`RESERVATION_LEAD_PER_IO`] to [`RESERVATION_LEAD_MAX`],
//!    [`lead_time`]); of equal weights, one IO of the smallest reservation. In the paper the P
//!    tag of a tenant held at its reservation runs ahead without bound, so when capacity later rises it
//!    gets only r until the others catch up, which can take minutes (mClock §2.1 with T going from 1,200
//!    to 2,400: RD stayed at 250 for 12 s in our simulator). Steady state is unchanged: a tenant that
//!    keeps hitting the bound either is reservation-clamped (and gets exactly r) or advances its P tag as
//!    fast as vnow (and gets exactly its weight share); the bound only limits how much lead is banked.
//!    Why the time term: two tenants can ride the bound at once, and the weight race then orders them by
//!    their bounds, where the paper orders them by how fast reservation service pushes their P tags (r /
//!    w). With the bound in own IOs alone (16 / w) a tenant whose reservation was most of the device
//!    (r / w = 1,655 a second, w = 4.46) sat below one a little under its weight share (875, w = 2.66),
//!    took the spare the paper gives the second, and the second got its reservation alone (2,328 of the
//!    oracle's 2,449 IOPS; `tests/features.rs`). `16 * r * T / w` orders such riders as the paper does
//!    wherever r * T is at least one IO, and T >= w / (r * w_min) >= 1 / r for every reserved tenant. With
//!    a fixed T of 4 ms (until 2026-12-07) riders under 250 IOPS were ordered by 16 / w instead: the
//!    same three tenants at 1/100 of the rates (A 73.8 IOPS, B 23.3, C = 113.8) gave B 5 % under its
//!    share. Why w / w_min: the bound must also be longer than a few of the largest P step in the weight
//!    race, the lightest tenant's IO (1 / w_min), or it forgives reservation service to a tenant whose P
//!    tag only wobbles around vnow, whenever that step jumps past it. Seen twice: r = 13,010 IOPS, w =
//!    4.66, beside a tenant of w = 0.64 on 14,828 IOPS (the other got 4.9 % under its share of 1,783
//!    IOPS, the reason for the time term), and r = 250.6, w = 7.74, beside an unreserved tenant of w =
//!    0.61 on 347.5 IOPS (which got 2.8 % under its 20.1 IOPS with T = 4 ms; T = 64 ms now). T >= w /
//!    (r * w_min) makes every reserved tenant's bound at least 16 of those steps. T is at most 64 ms,
//!    so where w / (r * w_min) is longer (riders under 15.6 IOPS, or weights far apart) the own-IO term
//!    or a shorter bound rules. The lead banked is at most 16 * T of a tenant's reservation (1.02 s at
//!    64 ms): after a capacity rise that lifts its share above r, it is held at r until virtual time has
//!    caught up, and gets 16 * T * r IOs fewer than its new share in all (mClock §2.1's RD, T = 8 ms for
//!    OLTP's 2 / 250: 32 IOs, 444 instead of 467 in the first second after the rise; over 16 * T if the
//!    rise doubles its share, longer if it lifts it less). T changes only when tenants or specs do, and
//!    then every tenant's bound is set again (O(n)); its five values keep that to four times while
//!    tenants with ever smaller reservations are added one by one (it was once per tenant, O(n^2):
//!    minutes for a scenario of 10^6 such tenants).
//!    Tenants whose requests carry a distributed delta are exempt: their P tags include service received
//!    at other servers, so a lead over this server's vnow is legitimate global accounting, and bounding
//!    it skewed the RBFQ Fig. 11 reproduction (a flow got 94 instead of 100 IOPS).
//! 9. `vnow < VTIME_CEILING` between calls: where it rises it is compared with the ceiling, and on
//!    reaching it every P-frame value is lowered by `vnow - VTIME_REBASED`, saturating at 0 ("Virtual
//!    time's range").
//!
//! # Pools that move ([`SchedConfig::pool_return`])
//! A dmClock or RBFQ client that keeps one pool of outstanding IOs over several servers (a gateway in front
//! of a VM; mclock-dmclock.txt §4.2's "64 concurrent IOs, uniformly distributed over the nodes") leaves a
//! server's queue whenever its IOs happen to be at the other servers, for milliseconds at a time. Tag
//! Adjustment treats each such gap as idleness and re-bases the tenant to `vnow`. That forgives lag the
//! tenant really has: its P tags carry its service everywhere (delta), so a tag behind `vnow` means it
//! got less than its weight share overall. Worse, `vnow` runs ahead whenever a tenant far ahead is alone
//! in the queue (a low-weight tenant's tags grow fastest), and the tenants that come back then are
//! forgiven most. In Fig. 9(a) with one pool (weights 1:4:6, no reservations) c1 got 3.1-5.8% above its
//! 1/11 share over seeds 1-20.
//!
//! With `pool_return`, a tenant whose requests carry a delta, whose returning request says its pool
//! never emptied since its previous request here ([`super::Request::pool_busy`], the gateway tracker's
//! pool flag), and whose queue here emptied less than `window` ago (its pool moved; it did not go idle)
//! starts from its own history, `last_p + cost`, with a
//! floor of `lag_ios` of its own IOs behind the smallest P tag among the tenants it competes with: those
//! ready here now and those whose pools left less than `window` ago (the `away` heap, keyed by their last
//! P tag). The floor is taken against the competitors and not against `vnow`, because `vnow` can be
//! dragged far ahead by one tenant: in Fig. 9(b) c1's reservation (800 IOPS at weight 1, counted in its
//! P tags through delta) puts its P tags tens of thousands of c2's IOs ahead of c2's and c3's, and a bound
//! against `vnow` forgave c2 and c3 unevenly (a bound of 1,024 own IOs against `vnow` missed Fig. 9(b)
//! in 19 of 20 seeds). Against the competitors, the lag a returning tenant brings is small: in Fig. 9(a)
//! and 9(b) at most 157 of its own IOs (median 30), so the default 256 never binds there and the floor
//! only stops a tenant that trickles requests here while it is crowded elsewhere from banking lag without
//! end. A pool that emptied (the client went idle, however briefly) or a gap longer than `window`:
//! the paper's re-base, with the idle credit.
//! Results (seeds 1-20, docs/reproductions.md): Fig. 9(a) with one pool c1 within 0.31% of its share
//! (was up to 5.8%), Fig. 9(b) with one pool c3 : c2 = 1.4995-1.5005 (1.486 with seed 1 before).
//! `None` is the paper: every return re-based.
//!
//! # A pool still here ([`super::Request::pending_here`])
//! The same gap opens on one server. A closed-loop client whose IOs are at the device and on their way
//! back (a network round trip, a client's turnaround) has an empty queue here for a moment after each
//! completion, and the re-base takes from it what the others got in that moment. With a device queue of
//! 32 and 64 IOs outstanding (RBFQ Fig. 8: vm1 r = 512 w = 1 and vm2 w = 4 on 2,510 IOPS), eq. (1) gives
//! vm1 512. In the simulator, with each IO's return delayed by a think time of 1 / 2 ms (30 s runs), vm1
//! got 560 / 649 under the re-base and 536 / 621 with this rule; real daemons, whose round trip is such
//! a delay, in docs/reproductions.md Part 5. By mClock §2's own definition the client never went idle: the
//! active VMs are "those with at least one pending IO". So under `pool_return` a tenant whose returning
//! request says it has requests at this server's device (`pending_here`, set by the server, which
//! counts them) is treated as a pool that stayed busy: own history, the same `window` and the same
//! floor against the competitors (the `away` heap holds every tenant whose queue emptied less than
//! `window` ago). What it cannot undo is work conservation: a slot that frees while the client's queue
//! is empty goes to another tenant, so the rule helps as far as the client's lag is repaid, not more
//! (vm1 536 at 1 ms above). A client with nothing at the device (an open-loop flow between bursts, a
//! closed loop behind a long think time) is re-based as in the paper.
//!
//! Why the flag: the engine sees no completions, so by itself it cannot tell a pool that moved from a
//! client that went idle for a moment. Without the flag (a first version keyed on the gap alone) a
//! bursty open-loop flow idle for milliseconds kept its lag as well, an idle credit the paper's re-base
//! exists to refuse: RBFQ §4.2's trace flows (`rbfq-sec4-2-oltp-b`) moved from f1 19.8 / f2 31.5 ms to
//! 11.3 / 44.7 ms mean latency. The tracker knows when the pool empties (it counts prepared requests
//! against completed and abandoned ones); requests that do not carry the flag (a v2 gateway) are
//! re-based as in the paper.
//!
//! # Bounded repayment (the reservation clock's slip)
//! When the capacity C falls below the sum of reservations, every backlogged reserved tenant's R tag falls
//! behind real time at the same rate, 1 - C/sum(r) seconds per second: choosing the smallest R tag keeps
//! their head tags within one reservation step (1/r_i) of each other, so each gets C * r_i / sum(r) (§2.1).
//! Kept without bound (invariant 7), that lag is repaid when capacity returns: after 60 s at 300 IOPS
//! against 600 reserved, the reserved tenants are owed 30 s of reservation and take the whole device in the
//! reservation phase for seconds, while a tenant with no reservation gets nothing. The paper's per-request
//! clamp bounds the lag but forgives it unevenly (invariant 7).
//!
//! [`ReservationLag::Bounded`]`(b)` bounds it evenly. R tags live on a *reservation clock*, real time minus
//! `r_slip`; `poll` serves the reservation phase when the smallest R tag is at most `now - r_slip`, and
//! when that tag is more than `b` plus one reservation step of its tenant (`s_i`, 1/r_i for one IO) behind,
//! `r_slip` grows until it is exactly `b + s_i` behind. (The step: a tenant held by a limit just above its
//! reservation is in no reservation race while it waits for its L tag, and comes back with its R tag up to
//! a step overdue; without the step, such a tenant with r_i < 1/b moved the clock for everyone and the
//! other tenants lost a fraction of an IO of reservation each time.) Growing `r_slip`
//! moves every R tag forward by the same time, so it forgives every tenant the same time: relative order,
//! and with it service in proportion to reservations under overload, is unchanged. Bound: at any moment a
//! backlogged tenant is owed at most `b + 2 s_i` of its reservation (band width plus the step allowance),
//! about `r_i * b + 2` IOs. After capacity C > sum(r) returns, the reservation phase needs about
//! `b * sum(r) / (C - sum(r))` seconds to repay everyone (plus one step), after which every tenant is at
//! its eq. (1) share; with the default `b` = 100 ms and C >= 1.25 sum(r) that is under 0.5 s.
//! Tenants becoming active (and R clocks switched on by `set_spec`) start at `now - r_slip`. Under a
//! continuing overload a newcomer therefore waits about `b * sum(r) / C` before it joins the band, as
//! under the paper's rule it would wait behind the others' queued tags. `r_slip` never shrinks; without
//! overload it stays where it is and costs one subtraction and one comparison per poll.

use super::heap::IndexedHeap;
use super::slab::Slab;
use super::{
    Dispatch, LimitMode, Phase, Poll, QosSpec, Request, ReservationLag, SchedConfig, SchedError, SchedulerKind,
    TenantId, TenantStats,
};
use crate::cost::CostModel;
use crate::units::{step_for_rate, Cost, LatestTime, Nanos, Tag};
#[cfg(doc)]
use crate::units::{MAX_RATE, MIN_WEIGHT};
use std::collections::VecDeque;

/// Virtual time is renormalised when it reaches this (invariant 9; module comment, "Virtual time's
/// range"): 2^127 tag units, leaving 2^14 of the largest one-request increments (2^113) above it.
pub(crate) const VTIME_CEILING: u128 = 1 << 127;
/// ... to this: 2^126 tag units, so every gap up to 2^126 behind virtual time survives a renormalisation.
pub(crate) const VTIME_REBASED: u128 = 1 << 126;

/// Where virtual time is renormalised and to what (module comment, "Virtual time's range"), for the
/// engine and SFQ alike: [`VTIME_CEILING`] and [`VTIME_REBASED`], which tests move (to renormalise
/// often). Empty outside tests: the constants are used in place.
#[derive(Copy, Clone, Debug)]
pub(crate) struct VtimeRange {
    #[cfg(test)]
    ceiling: u128,
    #[cfg(test)]
    rebased: u128,
}

impl VtimeRange {
    /// The range of every scheduler outside tests.
    pub(crate) const DEFAULT: VtimeRange = VtimeRange {
        #[cfg(test)]
        ceiling: VTIME_CEILING,
        #[cfg(test)]
        rebased: VTIME_REBASED,
    };

    /// Whether virtual time `v` has reached the ceiling (one comparison where it rises).
    #[inline(always)]
    pub(crate) fn reached(self, v: Tag) -> bool {
        #[cfg(test)]
        return v.0 >= self.ceiling;
        #[cfg(not(test))]
        return v.0 >= VTIME_CEILING;
    }

    /// Lowers virtual time `v` to the rebased value; returns by how much, the offset every other value
    /// of the frame is then lowered by (saturating at 0).
    pub(crate) fn rebase(self, v: &mut Tag) -> u128 {
        #[cfg(test)]
        let rebased = self.rebased;
        #[cfg(not(test))]
        let rebased = VTIME_REBASED;
        let by = v.0 - rebased;
        *v = Tag(rebased);
        by
    }

    /// Tests: renormalise when virtual time reaches `ceiling`, down to `rebased` (below it).
    #[cfg(test)]
    pub(crate) fn set(&mut self, ceiling: u128, rebased: u128) {
        assert!(rebased < ceiling, "a renormalisation lowers virtual time");
        (self.ceiling, self.rebased) = (ceiling, rebased);
    }
}

/// Which inputs feed which clock.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) struct Flavor {
    pub(crate) kind: SchedulerKind,
    /// dmClock: R tags advance by `(cost + rho) / r`, where a request's rho includes the estimate
    /// `cost (1 - share)/share` from its reservation share (see [`super::dmclock`]), so that with a share
    /// the advance is `cost/(r share) + rho/r`. RBFQ and mClock: `cost / r` (RBFQ's local tags use
    /// the per-server minimum M_ij, so service elsewhere does not count toward them).
    pub(crate) rho_in_r: bool,
    /// dmClock: L tags advance by `(cost + delta) / l`. RBFQ's upper bound is per server: `cost / l`.
    pub(crate) delta_in_l: bool,
    /// The cost model of the limit clock (RBFQ §3.4's upper bound is in bytes/s), or `None` to use the
    /// configuration's cost model.
    pub(crate) limit_cost: Option<CostModel>,
}

#[derive(Copy, Clone, Debug, Default)]
struct Queued {
    handle: u64,
    arrival: Nanos,
    cost: Cost,
    lcost: Cost,
    offset: u64,
    delta: Cost,
    rho: Cost,
}

/// Per-tenant state, laid out for the cache: a server with thousands of tenants touches a different
/// tenant on nearly every request, so each touch is a cache miss per line. The fields are grouped into
/// 64-byte lines by use (the struct is line-aligned), and the tenant's first queued request is stored
/// inline: on a busy server most backlogged tenants have one request queued, and then enqueue and dispatch
/// never touch a separately allocated queue buffer. Five lines are hot; the spec, read only by
/// `set_spec` and queries, fills the rest (the layout is checked by a test).
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct Tenant {
    // Line 0: the tags the heaps are keyed by.
    head_r: Tag,
    head_p: Tag,
    head_l: Tag,
    last_p: Tag,
    // Line 1.
    last_r: Tag,
    last_l: Tag,
    /// Tag units per unit cost; 0 = clock not in use (no reservation / unlimited).
    r_step: u128,
    l_step: u128,
    // Line 2: the rest of what every dispatch reads or writes.
    p_step: u128,
    /// Requests dispatched, by [`Phase::index`].
    dispatched: [u64; 3],
    /// Cost dispatched by phase (saturating; widened in [`TenantStats`]).
    cost: [u64; 3],
    // Line 3: the queue's head and length.
    /// The first queued request (valid when `len > 0`).
    first: Queued,
    len: u32,
    /// False for a new tenant or one whose history `maintain` forgot.
    history: bool,
    /// Set once a request of this tenant carried a distributed delta: it is served by several servers, and
    /// its P tags include service elsewhere (exempt from the lead bound, invariant 8).
    distributed: bool,
    // Line 4: touched when the tenant becomes active or idle, or has more than one request queued.
    /// Queued requests after `first`, oldest first.
    rest: VecDeque<Queued>,
    /// Idle credit in P-tag units: sigma * p_step.
    credit: u128,
    idle_since: Nanos,
    /// Service elsewhere charged to its reservation clock (the requests' rho, with the estimate from a
    /// reservation share; fixed point, saturating): touched only by requests that carry one.
    rho: u64,
    // Cold.
    spec: QosSpec,
    /// The lead bound's time term (invariant 8): how far `weight_lead_ios` times the engine's lead time T
    /// ([`lead_time`]) of reservation-phase service moves its P tag (`cap * r * T / w` in
    /// P-tag units, saturating; 0 without a reservation or a bound). Read only when the bound in its own
    /// IOs would cut a P tag; set with the spec and with the configuration ([`Tenant::apply_lead`]).
    resv_lead: u128,
}

/// The placeholder a free slab slot holds.
impl Default for Tenant {
    fn default() -> Self {
        Tenant::new(QosSpec::default(), Nanos::ZERO)
    }
}

impl Tenant {
    fn new(spec: QosSpec, now: Nanos) -> Self {
        let mut t = Tenant {
            head_r: Tag::ZERO,
            head_p: Tag::ZERO,
            head_l: Tag::ZERO,
            last_p: Tag::ZERO,
            last_r: Tag::ZERO,
            last_l: Tag::ZERO,
            r_step: 0,
            l_step: 0,
            p_step: 0,
            dispatched: [0; 3],
            cost: [0; 3],
            first: Queued::default(),
            len: 0,
            history: false,
            distributed: false,
            rest: VecDeque::new(),
            credit: 0,
            idle_since: now,
            rho: 0,
            spec,
            resv_lead: 0,
        };
        t.apply_spec(spec);
        t
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn queue_len(&self) -> usize {
        self.len as usize
    }

    #[inline]
    fn push(&mut self, q: Queued) {
        if self.len == 0 {
            self.first = q;
        } else {
            self.rest.push_back(q);
        }
        self.len += 1;
    }

    /// Removes the head request; the queue must not be empty.
    #[inline]
    fn pop(&mut self) -> Queued {
        debug_assert!(self.len > 0, "pop from an empty tenant queue");
        let q = self.first;
        self.len -= 1;
        if self.len > 0 {
            self.first = self.rest.pop_front().expect("len counts rest");
        }
        q
    }

    #[inline]
    fn front(&self) -> Option<&Queued> {
        (self.len > 0).then_some(&self.first)
    }

    /// Queued requests, oldest first.
    fn queued_requests(&self) -> impl Iterator<Item = &Queued> {
        self.front().into_iter().chain(self.rest.iter())
    }

    /// Sets the lead bound's time term for `weight_lead_ios` = `cap` and lead time `time` (invariant 8),
    /// from the spec's reservation and the P step [`Tenant::apply_spec`] set.
    fn apply_lead(&mut self, cap: Option<u32>, time: Nanos) {
        self.resv_lead =
            cap.map_or(0, |cap| times_u32(reservation_lead(self.spec.reservation(), self.p_step, time), cap));
    }

    fn apply_spec(&mut self, spec: QosSpec) {
        self.spec = spec;
        self.r_step = if spec.reservation() > 0.0 { step_for_rate(spec.reservation()) } else { 0 };
        self.l_step = spec.limit().map_or(0, step_for_rate);
        self.p_step = step_for_rate(spec.weight());
        self.credit = Cost::units(spec.idle_credit() as u64).times_step(self.p_step);
    }

    #[inline]
    fn r_inc(&self, q: &Queued, flavor: &Flavor) -> u128 {
        let c = if flavor.rho_in_r { q.cost.saturating_add(q.rho) } else { q.cost };
        c.times_step(self.r_step)
    }

    /// Computes the head tags for `self.queue[0]`. `idle_floor` is `Some` when the tenant was idle: the
    /// lowest P tag it may start from (invariant 6). `vnow` bounds the P lead after a reservation-phase
    /// dispatch (`lead_cap`: IOs, invariant 8). `rules` carries the configured R and L clamps and the
    /// reservation clock's slip.
    ///
    /// Inlined into its callers in every build: in builds with debug assertions (the test profile,
    /// where the one-hour test runs) its assertions and overflow checks took it, and `place`, past the
    /// inliner's threshold, and the calls cost 56 of 989 instructions per request in that test's loop.
    /// Release builds inline both by themselves (their code is unchanged by the attribute).
    #[cfg_attr(debug_assertions, inline(always))]
    #[cfg_attr(not(debug_assertions), inline)]
    fn compute_head(
        &mut self,
        flavor: &Flavor,
        idle_floor: Option<Tag>,
        vnow: Tag,
        lead_cap: Option<u32>,
        now: Tag,
        rules: Rules,
    ) {
        let q = self.first;
        let was_idle = idle_floor.is_some();
        let arrival = Tag::from_nanos(q.arrival);
        if self.r_step != 0 {
            // Invariant 7: only a tenant that was idle is clamped to its arrival time, on the reservation
            // clock (real time minus the slip); with the paper's rule every request is.
            let arrival_r = arrival.saturating_sub(rules.r_slip.0);
            let next = self.last_r.saturating_add(self.r_inc(&q, flavor));
            self.head_r = match (self.history, was_idle || rules.r_at_arrival) {
                (false, _) => arrival_r,
                (true, true) => next.max(arrival_r),
                (true, false) => next,
            };
        }
        if self.l_step != 0 {
            let c = if flavor.delta_in_l { q.lcost.saturating_add(q.delta) } else { q.lcost };
            // Clamped to `limit_burst_ios` of its own steps before the time the request becomes the head
            // (invariant 7), or with the paper's rule to the request's arrival.
            let inc = c.times_step(self.l_step);
            let floor = match rules.limit_burst {
                Some(burst) => now.saturating_sub(times_u32(inc, burst)),
                None => arrival,
            };
            self.head_l = if self.history { self.last_l.saturating_add(inc).max(floor) } else { now };
        }
        let p_inc = q.cost.saturating_add(q.delta).times_step(self.p_step);
        self.head_p = match idle_floor {
            None => {
                let next = self.last_p.saturating_add(p_inc);
                match lead_cap {
                    // Invariant 8: no further than `cap` of its own IOs ahead of vnow (never moving back).
                    Some(cap) if !self.distributed => {
                        let own = times_u32(p_inc, cap);
                        if next <= vnow.saturating_add(own) {
                            next
                        } else {
                            // Past the bound in own IOs: only then is the time term's line read.
                            next.min(vnow.saturating_add(own.max(self.resv_lead))).max(self.last_p)
                        }
                    }
                    _ => next,
                }
            }
            Some(floor) if self.history => self.last_p.saturating_add(p_inc).max(floor),
            Some(floor) => floor,
        };
    }
}

/// Reservation-phase service per IO of [`SchedConfig::weight_lead_ios`] that a tenant's P tag may lead
/// `vnow` by, at the least (invariant 8): the lead time T where every reserved tenant's w / (r * w_min)
/// is at most this (of equal weights, where every reservation is 250 IOPS or more).
pub(crate) const RESERVATION_LEAD_PER_IO: Nanos = Nanos::from_millis(4);

/// The longest lead time T (invariant 8): of equal weights, riders are ordered by r / w down to 1 / this
/// (15.6 IOPS).
pub(crate) const RESERVATION_LEAD_MAX: Nanos = Nanos::from_millis(64);

/// The lead time T for a need of `need` seconds ([`LeadSpecs::need`], invariant 8), rounded up to
/// [`RESERVATION_LEAD_PER_IO`] times a power of two (4, 8, 16, 32 or 64 ms), at most
/// [`RESERVATION_LEAD_MAX`]; [`RESERVATION_LEAD_PER_IO`] without reservations. Five values, so tenants
/// added one by one with ever smaller reservations change T (and set every bound again) at most four
/// times, not once each.
fn lead_time(need: Option<f64>) -> Nanos {
    let need = need.unwrap_or(0.0);
    let mut t = RESERVATION_LEAD_PER_IO;
    while t < RESERVATION_LEAD_MAX && t.as_secs_f64() < need {
        t = Nanos(t.0 * 2);
    }
    t
}

/// The tenants' specs as the lead time needs them (invariant 8): every tenant's weight, and each reserved
/// tenant's weight per unit of reservation, counted (keys are `f64` bits, which order as the positive
/// values do).
#[derive(Debug, Clone, Default, PartialEq)]
struct LeadSpecs {
    /// w, of every tenant.
    weights: std::collections::BTreeMap<u64, u32>,
    /// w / r, of every tenant with a reservation.
    per_unit: std::collections::BTreeMap<u64, u32>,
}

impl LeadSpecs {
    /// Counts `spec` in (`by` = 1) or out (-1).
    fn count(&mut self, spec: QosSpec, by: i32) {
        fn tally(map: &mut std::collections::BTreeMap<u64, u32>, v: f64, by: i32) {
            let key = v.to_bits();
            if by > 0 {
                *map.entry(key).or_insert(0) += 1;
            } else if let Some(n) = map.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
        tally(&mut self.weights, spec.weight(), by);
        if spec.reservation() > 0.0 {
            tally(&mut self.per_unit, spec.weight() / spec.reservation(), by);
        }
    }

    /// The longest of w / (r * w_min) over the reserved tenants, in seconds (`None` without one): T at
    /// least this gives each of them a time term (16 * T * r / w of P) of at least 16 IOs of the
    /// lightest tenant's (16 / w_min), and of its own (w >= w_min).
    fn need(&self) -> Option<f64> {
        let top = f64::from_bits(*self.per_unit.keys().next_back()?);
        let w_min = f64::from_bits(*self.weights.keys().next()?);
        Some(top / w_min)
    }
}

/// The P-tag advance of `time` of service at `reservation` (cost units per second)
/// for a tenant whose P step (per cost unit) is `p_step`: `reservation * T` cost units at one step each,
/// in tag units (saturating; 0 without a reservation).
fn reservation_lead(reservation: f64, p_step: u128, time: Nanos) -> u128 {
    if reservation <= 0.0 {
        return 0;
    }
    let units = reservation * time.as_secs_f64();
    let tags = units * p_step as f64;
    if tags >= u128::MAX as f64 {
        u128::MAX
    } else {
        tags as u128
    }
}

/// `x * k`, saturating at `u128::MAX`: `u128::saturating_mul`'s value, with one 64-bit multiply when `x`
/// fits 64 bits (every step of a rate above 0.24 per second, times a cost of one unit).
#[inline(always)]
fn times_u32(x: u128, k: u32) -> u128 {
    if x >> 64 == 0 {
        u128::from(x as u64) * u128::from(k)
    } else {
        x.saturating_mul(u128::from(k))
    }
}

/// The configured clamps of R and L tags and the reservation clock's slip, as `compute_head` needs them
/// (kept in the engine, so a dispatch copies them instead of deriving them from the configuration).
#[derive(Copy, Clone, Debug)]
struct Rules {
    /// How far the reservation clock has slipped behind real time ([`ReservationLag::Bounded`]).
    r_slip: Tag,
    /// [`ReservationLag::Arrival`]: every R tag is at least its request's arrival.
    r_at_arrival: bool,
    /// [`SchedConfig::limit_burst_ios`].
    limit_burst: Option<u32>,
}

/// [`ReservationLag::Bounded`]'s bound in tag units; `u128::MAX` (never slips) for the other rules.
fn lag_bound(lag: ReservationLag) -> u128 {
    match lag {
        ReservationLag::Bounded(b) => Tag::from_nanos(b).0,
        ReservationLag::Arrival | ReservationLag::Unbounded => u128::MAX,
    }
}

/// The engine. See the module comment.
#[derive(Debug, Clone)]
pub(crate) struct Engine {
    flavor: Flavor,
    config: SchedConfig,
    tenants: Slab<Tenant>,
    resv: IndexedHeap,
    ready: IndexedHeap,
    limited: IndexedHeap,
    /// Under [`SchedConfig::pool_return`]: tenants whose queue here is empty, keyed by their last P tag
    /// (invariant 6, "Pools that move", "A pool still here"). See [`Away`].
    away: Away,
    time: LatestTime,
    vnow: Tag,
    /// The R and L clamps, and `rules.r_slip`: how far the reservation clock runs behind real time (R tags
    /// are compared with `now - r_slip`). It grows only under [`ReservationLag::Bounded`], when the
    /// most-owed tenant would be owed more than the bound (see "Bounded repayment" in the module comment).
    rules: Rules,
    /// [`ReservationLag::Bounded`]'s bound in tag units; `u128::MAX` for the other rules (never slips).
    lag_bound: u128,
    queued: usize,
    /// Locality batch in progress: (slot, remaining, last offset, phase).
    batch: Option<(u32, u32, u64, Phase)>,
    /// Where virtual time is renormalised (tests move it).
    vtime: VtimeRange,
    /// What sets `lead_time`: the tenants' weights and their weights per reservation.
    lead_specs: LeadSpecs,
    /// The lead bound's reservation time T (invariant 8): [`lead_time`] of `lead_specs`' need.
    lead_time: Nanos,
    /// How many times `lead_time` changed, each setting every tenant's bound again (tests bound it).
    lead_changes: u64,
}

/// One tenant's entry in [`Away`]: its last P tag when its queue emptied, and which emptying it was.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct AwayEntry {
    last_p: Tag,
    slot: u32,
    /// The slab generation of the tenant that emptied (a slot reused by another tenant does not match).
    gen: u32,
    idle_since: Nanos,
}

impl AwayEntry {
    /// Tenant `id`'s entry for its latest emptying (its `last_p` and `idle_since` as they are now).
    fn of(id: TenantId, t: &Tenant) -> AwayEntry {
        AwayEntry { last_p: t.last_p, slot: id.slot, gen: id.gen, idle_since: t.idle_since }
    }

    /// Whether the entry counts at `now`: the tenant emptied less than `window` ago and is still away
    /// since this emptying (the same tenant, still idle with its history, not active again, nor emptied
    /// again since, which pushed a newer entry). A freed or reused slot fails on its generation before
    /// the tenant is read.
    #[inline]
    fn counts(&self, tenants: &Slab<Tenant>, now: Nanos, window: Nanos) -> bool {
        if now.saturating_sub(self.idle_since) >= window || tenants.id_of(self.slot).gen != self.gen {
            return false;
        }
        let t = tenants.at(self.slot);
        t.is_empty() && t.history && t.idle_since == self.idle_since && t.last_p == self.last_p
    }
}

/// The tenants away from this server (invariant 6): a min-heap of [`AwayEntry`] by last P tag, with lazy
/// deletion. A tenant that returns, is removed or forgotten leaves its entry behind; a query drops stale
/// and expired entries from the top until the top is current, so the answer is the smallest last P tag of
/// the tenants away now and within the window, as an indexed heap with eager removal would give. The
/// engine compacts it when it holds more than twice the tenants (plus 64), so its memory stays bounded.
/// Why lazy: a closed-loop tenant empties and returns once per request; removal from an indexed heap on
/// every return cost the simulator about 6 % of its speed at 1,000 tenants (`rein bench sim`).
#[derive(Debug, Clone, Default)]
struct Away {
    heap: std::collections::BinaryHeap<std::cmp::Reverse<AwayEntry>>,
}

impl Away {
    /// Most entries kept for `tenants` live tenants before a compaction.
    fn bound(tenants: usize) -> usize {
        2 * tenants + 64
    }

    /// Adds `e`; past [`Away::bound`], first drops every entry that no longer counts at `now`.
    #[inline]
    fn push(&mut self, e: AwayEntry, tenants: &Slab<Tenant>, now: Nanos, window: Nanos) {
        if self.heap.len() >= Away::bound(tenants.len()) {
            self.heap.retain(|std::cmp::Reverse(x)| x.counts(tenants, now, window));
        }
        self.heap.push(std::cmp::Reverse(e));
    }

    fn clear(&mut self) {
        self.heap.clear();
    }

    /// Lowers every entry's last P tag by `by`, saturating at 0, as the renormalisation lowers the
    /// tenants' own (so [`AwayEntry::counts`] still matches an entry with its tenant), and re-heaps them:
    /// entries taken to 0 tie and order by slot. O(n), no allocation.
    fn lower(&mut self, by: u128) {
        let mut entries = std::mem::take(&mut self.heap).into_vec();
        for std::cmp::Reverse(e) in &mut entries {
            e.last_p = e.last_p.saturating_sub(by);
        }
        self.heap = entries.into();
    }

    /// The smallest last P tag among the entries that count at `now` ([`AwayEntry::counts`]); those that
    /// do not and sort before it are dropped.
    #[inline]
    fn min(&mut self, tenants: &Slab<Tenant>, now: Nanos, window: Nanos) -> Option<Tag> {
        while let Some(std::cmp::Reverse(e)) = self.heap.peek() {
            if e.counts(tenants, now, window) {
                return Some(e.last_p);
            }
            self.heap.pop();
        }
        None
    }
}

impl Engine {
    pub(crate) fn new(flavor: Flavor, config: SchedConfig) -> Self {
        let mut e = Engine {
            flavor,
            config,
            tenants: Slab::default(),
            resv: IndexedHeap::new(),
            ready: IndexedHeap::new(),
            limited: IndexedHeap::new(),
            away: Away::default(),
            time: LatestTime::default(),
            vnow: Tag::ZERO,
            rules: Rules { r_slip: Tag::ZERO, r_at_arrival: false, limit_burst: None },
            lag_bound: u128::MAX,
            queued: 0,
            batch: None,
            vtime: VtimeRange::DEFAULT,
            lead_specs: LeadSpecs::default(),
            lead_time: RESERVATION_LEAD_PER_IO,
            lead_changes: 0,
        };
        // The rules and the lag bound are derived from the settings in one place.
        e.set_config(config);
        e
    }

    /// [`super::Scheduler::set_config`]: the clamps and the lag bound follow the new settings at once;
    /// the reservation clock's slip so far stays (every R tag is on it); a tenant that stops being
    /// "away" (pool return turned off) is re-based as the paper says when it returns, and with pool
    /// return turned on the tenants idle at that moment are away from their own emptying.
    pub(crate) fn set_config(&mut self, config: SchedConfig) {
        self.rules.r_at_arrival = config.reservation_lag == ReservationLag::Arrival;
        self.rules.limit_burst = config.limit_burst_ios;
        self.lag_bound = lag_bound(config.reservation_lag);
        if config.pool_return.is_none() {
            self.away.clear();
        } else if self.config.pool_return.is_none() {
            // Pool return switched on: the tenants idle now are away from now on, as if they had emptied
            // under it (each with its own emptying time, so the window still counts from then). The set
            // was empty, so this stays within its bound.
            for (id, t) in self.tenants.iter() {
                if t.is_empty() && t.history {
                    self.away.heap.push(std::cmp::Reverse(AwayEntry::of(id, t)));
                }
            }
        }
        if config.weight_lead_ios != self.config.weight_lead_ios {
            self.apply_leads(config.weight_lead_ios);
        }
        self.batch = None;
        self.config = config;
    }

    pub(crate) fn kind(&self) -> SchedulerKind {
        self.flavor.kind
    }

    pub(crate) fn add_tenant(&mut self, spec: QosSpec) -> Result<TenantId, SchedError> {
        let mut t = Tenant::new(spec, self.time.now());
        t.apply_lead(self.config.weight_lead_ios, self.lead_time);
        let id = self.tenants.insert(self.config.limits.max_tenants, t)?;
        self.lead_specs.count(spec, 1);
        self.refresh_lead_time();
        let n = self.tenants.slots();
        self.resv.grow_slots(n);
        self.ready.grow_slots(n);
        self.limited.grow_slots(n);
        Ok(id)
    }

    pub(crate) fn set_spec(&mut self, id: TenantId, spec: QosSpec) -> Result<(), SchedError> {
        let now = Tag::from_nanos(self.time.now());
        let r_slip = self.rules.r_slip;
        let t = self.tenants.get_mut(id)?;
        let had_r = t.r_step != 0;
        let had_l = t.l_step != 0;
        let old = t.spec;
        t.apply_spec(spec);
        self.lead_specs.count(old, -1);
        self.lead_specs.count(spec, 1);
        self.refresh_lead_time();
        let (lead_ios, lead_time) = (self.config.weight_lead_ios, self.lead_time);
        let t = self.tenants.get_mut(id)?;
        t.apply_lead(lead_ios, lead_time);
        if t.is_empty() {
            return Ok(());
        }
        // Clocks switched on start at `now`; clocks switched off leave their heaps.
        if t.r_step != 0 && !had_r {
            t.head_r = now.saturating_sub(r_slip.0);
            t.last_r = t.head_r;
        }
        if t.l_step != 0 && !had_l {
            t.head_l = now;
            t.last_l = now;
        }
        if self.tenants.at(id.slot).r_step == 0 {
            self.resv.remove(id.slot);
        }
        self.place(id.slot, now);
        Ok(())
    }

    /// Sets the lead bound's time from the counted specs (invariant 8); when it changes, every tenant's
    /// bound follows: O(n), on a change of tenants or specs only.
    fn refresh_lead_time(&mut self) {
        let time = lead_time(self.lead_specs.need());
        if time != self.lead_time {
            self.lead_time = time;
            self.lead_changes += 1;
            self.apply_leads(self.config.weight_lead_ios);
        }
    }

    /// Sets every tenant's lead bound for `weight_lead_ios` = `cap` and the current lead time (invariant
    /// 8): O(n), when either changes.
    fn apply_leads(&mut self, cap: Option<u32>) {
        let time = self.lead_time;
        for t in self.tenants.values_mut() {
            t.apply_lead(cap, time);
        }
    }

    pub(crate) fn remove_tenant(&mut self, id: TenantId) -> Result<Vec<u64>, SchedError> {
        let t = self.tenants.remove(id)?;
        self.lead_specs.count(t.spec, -1);
        self.refresh_lead_time();
        self.resv.remove(id.slot);
        self.ready.remove(id.slot);
        self.limited.remove(id.slot);
        if self.batch.is_some_and(|b| b.0 == id.slot) {
            self.batch = None;
        }
        self.queued -= t.queue_len();
        Ok(t.queued_requests().map(|q| q.handle).collect())
    }

    pub(crate) fn enqueue(&mut self, now: Nanos, req: Request) -> Result<(), SchedError> {
        let now = self.time.advance(now);
        if self.queued >= self.config.limits.max_queued {
            return Err(SchedError::QueueFull { max: self.config.limits.max_queued });
        }
        let max_t = self.config.limits.max_queued_per_tenant;
        let cost = self.config.cost_model.cost(req.size);
        let lcost = match self.flavor.limit_cost {
            Some(m) => m.cost(req.size),
            None => cost,
        };
        let t = self.tenants.get_mut(req.tenant)?;
        if t.queue_len() >= max_t {
            return Err(SchedError::TenantQueueFull { tenant: req.tenant, max: max_t });
        }
        t.push(Queued {
            handle: req.handle,
            arrival: now,
            cost,
            lcost,
            offset: req.offset,
            // A peer's delta and rho count as at most `Cost::MAX` ("Virtual time's range").
            delta: req.delta.min(Cost::MAX),
            // A share below one is an estimated rho (dmclock module comment): the request charges the R
            // clock `cost/share`, of which `cost` is its own and undone if it is served in the weight phase.
            rho: req.rho.min(Cost::MAX).saturating_add(req.share.elsewhere(cost)),
        });
        t.distributed |= req.delta != Cost(0);
        let became_active = t.len == 1;
        self.queued += 1;
        if became_active {
            // Becoming active: Tag Adjustment through vnow (module comment).
            if let Some((p, _)) = self.ready.peek() {
                self.raise_vnow(p);
            }
            let vnow = self.vnow;
            let floor = self.idle_floor(req.tenant.slot, now, req.pool_busy, req.pending_here);
            let flavor = self.flavor;
            let rules = self.rules;
            let t = self.tenants.at_mut(req.tenant.slot);
            t.compute_head(&flavor, Some(floor), vnow, None, Tag::from_nanos(now), rules);
            self.place(req.tenant.slot, Tag::from_nanos(now));
        }
        Ok(())
    }

    /// The lowest P tag the tenant in `slot`, becoming active at `now`, may start from (invariant 6):
    /// virtual time less its idle credit; or, for a distributed tenant whose pool stayed busy
    /// (`pool_busy`) or a tenant with requests at this device (`pending_here`) that is back within the
    /// pool window, up to `lag_ios` of its own IOs behind the smallest P tag of the tenants it competes
    /// with here (those ready now and those away less than the window).
    #[inline]
    fn idle_floor(&mut self, slot: u32, now: Nanos, pool_busy: bool, pending_here: bool) -> Tag {
        let t = self.tenants.at(slot);
        let paper = self.vnow.saturating_sub(t.credit);
        let Some(pool) = self.config.pool_return else {
            return paper;
        };
        let moved = ((pool_busy && t.distributed) || pending_here)
            && t.history
            && now.saturating_sub(t.idle_since) < pool.window;
        let slack = Cost::units(u64::from(pool.lag_ios)).times_step(t.p_step);
        if !moved {
            return paper;
        }
        let mut reference = self.vnow;
        if let Some((p, _)) = self.ready.peek() {
            reference = reference.min(p);
        }
        // The tenant itself is active now, so its own entry no longer counts.
        if let Some(p) = self.away.min(&self.tenants, now, pool.window) {
            reference = reference.min(p);
        }
        paper.min(reference.saturating_sub(slack))
    }

    /// Puts a tenant whose head just changed into the right heaps (invariants 1-3). Inlined in every
    /// build, as `Tenant::compute_head` is (see there).
    #[cfg_attr(debug_assertions, inline(always))]
    #[cfg_attr(not(debug_assertions), inline)]
    fn place(&mut self, slot: u32, now: Tag) {
        let t = self.tenants.at(slot);
        if t.l_step == 0 || t.head_l <= now {
            let (p, r, has_r) = (t.head_p, t.head_r, t.r_step != 0);
            self.limited.remove(slot);
            self.ready.set(slot, p);
            if has_r {
                self.resv.set(slot, r);
            }
        } else {
            let l = t.head_l;
            self.ready.remove(slot);
            self.resv.remove(slot);
            self.limited.set(slot, l);
        }
    }

    pub(crate) fn poll(&mut self, now: Nanos, device_idle: bool) -> Poll {
        let now = self.time.advance(now);
        if self.queued == 0 {
            self.batch = None;
            return Poll::Empty;
        }
        let now_tag = Tag::from_nanos(now);
        if let Some(d) = self.continue_batch(now_tag) {
            return Poll::Dispatch(d);
        }
        // Tenants whose limit tag has come due rejoin the reservation and weight races.
        while let Some((l, slot)) = self.limited.peek() {
            if l > now_tag {
                break;
            }
            self.limited.pop();
            // A tenant held back by its limit could not use its weight share, so like an idle tenant it
            // must not bank it: it re-enters the weight race no earlier than vnow (invariant 6).
            let vnow = self.vnow;
            let reenter_at_vnow = self.config.limited_reenter_at_vnow;
            let t = self.tenants.at_mut(slot);
            if reenter_at_vnow {
                t.head_p = t.head_p.max(vnow);
            }
            let (p, r, has_r) = (t.head_p, t.head_r, t.r_step != 0);
            self.ready.set(slot, p);
            if has_r {
                self.resv.set(slot, r);
            }
        }
        // Constraint-based (reservation / local) phase, on the reservation clock.
        if let Some((r, slot)) = self.resv.peek() {
            let now_r = now_tag.saturating_sub(self.rules.r_slip.0);
            if r <= now_r {
                if now_r.0 - r.0 > self.lag_bound {
                    self.slip(r, slot, now_r);
                }
                return Poll::Dispatch(self.dispatch(slot, Phase::Reservation, now_tag));
            }
        }
        // Weight-based (global) phase among tenants under their limit.
        if let Some((p, slot)) = self.ready.peek() {
            self.raise_vnow(p);
            return Poll::Dispatch(self.dispatch(slot, Phase::Weight, now_tag));
        }
        if device_idle && self.config.limit_mode == LimitMode::BreakWhenIdle {
            if let Some((_, slot)) = self.limited.peek() {
                return Poll::Dispatch(self.dispatch(slot, Phase::OverLimit, now_tag));
            }
        }
        let next_r = self.resv.peek().map(|(r, _)| r.saturating_add(self.rules.r_slip.0));
        let next_l = self.limited.peek().map(|(l, _)| l);
        match (next_r, next_l) {
            (Some(a), Some(b)) => Poll::Wait(a.min(b).ceil_nanos()),
            (Some(a), None) | (None, Some(a)) => Poll::Wait(a.ceil_nanos()),
            (None, None) => unreachable!("queued requests but no tenant in any heap (invariant 2)"),
        }
    }

    /// Virtual time is at least `p`, the smallest eligible P tag (Tag Adjustment); on reaching the
    /// ceiling it is renormalised (invariant 9).
    #[inline]
    fn raise_vnow(&mut self, p: Tag) {
        self.vnow = self.vnow.max(p);
        if self.vtime.reached(self.vnow) {
            self.renormalise();
        }
    }

    /// Invariant 9: lowers every value in the P frame by `vnow - rebased`, saturating at 0 (module comment,
    /// "Virtual time's range").
    #[cold]
    #[inline(never)]
    fn renormalise(&mut self) {
        let by = self.vtime.rebase(&mut self.vnow);
        for t in self.tenants.values_mut() {
            t.head_p = t.head_p.saturating_sub(by);
            t.last_p = t.last_p.saturating_sub(by);
        }
        self.ready.lower_keys(by);
        self.away.lower(by);
    }

    /// Tests: renormalise when virtual time reaches `ceiling`, down to `rebased` (below it).
    #[cfg(test)]
    pub(crate) fn set_vtime_range(&mut self, ceiling: u128, rebased: u128) {
        self.vtime.set(ceiling, rebased);
    }

    /// Tests: starts virtual time at `v` instead of 0, before any tenant has a history (then nothing else
    /// is in the P frame yet), so that nothing is clipped at 0 in a run of bounded length.
    #[cfg(test)]
    pub(crate) fn start_vtime_at(&mut self, v: Tag) {
        assert!(self.tenants.iter().all(|(_, t)| !t.history && t.is_empty()), "a fresh engine");
        self.vnow = v;
    }

    /// Virtual time (tests).
    #[cfg(test)]
    pub(crate) fn vnow(&self) -> Tag {
        self.vnow
    }

    /// Bounded repayment: the most-owed tenant (`slot`, head tag `r`) is owed more than the bound; the
    /// reservation clock slips for all until it is owed the bound beyond one of its own reservation steps
    /// (a tenant held by a limit close to its reservation waits up to a step with its R tag due).
    #[cold]
    #[inline(never)]
    fn slip(&mut self, r: Tag, slot: u32, now_r: Tag) {
        let t = self.tenants.at(slot);
        let owed = r.saturating_add(t.r_inc(&t.first, &self.flavor)).saturating_add(self.lag_bound);
        if owed < now_r {
            self.rules.r_slip = Tag(self.rules.r_slip.0 + (now_r.0 - owed.0));
        }
    }

    fn continue_batch(&mut self, now: Tag) -> Option<Dispatch> {
        let (slot, remaining, last_off, phase) = self.batch?;
        let t = self.tenants.at(slot);
        let ok = remaining > 0
            && t.front().is_some_and(|q| q.offset.abs_diff(last_off) <= self.config.batch_distance)
            && (t.l_step == 0 || t.head_l <= now);
        if !ok {
            self.batch = None;
            return None;
        }
        Some(self.dispatch(slot, phase, now))
    }

    /// Serves `slot`'s head request in `phase` and recomputes its head.
    #[inline]
    fn dispatch(&mut self, slot: u32, phase: Phase, now: Tag) -> Dispatch {
        let flavor = self.flavor;
        let vnow = self.vnow;
        let rules = self.rules;
        let t = self.tenants.at_mut(slot);
        let q = t.pop();
        if t.r_step != 0 {
            t.last_r = match phase {
                Phase::Reservation => t.head_r,
                // Weight-phase service must not count toward the reservation: undo this request's own
                // cost (not rho: that reservation service happened elsewhere and still counts).
                Phase::Weight | Phase::OverLimit => t.head_r.saturating_sub(q.cost.times_step(t.r_step)),
            };
        }
        t.last_l = t.head_l;
        t.last_p = t.head_p;
        t.history = true;
        t.dispatched[phase.index()] += 1;
        t.cost[phase.index()] = t.cost[phase.index()].saturating_add(q.cost.0);
        if flavor.rho_in_r && q.rho != Cost(0) {
            t.rho = t.rho.saturating_add(q.rho.0);
        }
        let more = !t.is_empty();
        if more {
            let cap = if phase == Phase::Reservation { self.config.weight_lead_ios } else { None };
            t.compute_head(&flavor, None, vnow, cap, now, rules);
        } else {
            t.idle_since = self.time.now();
        }
        self.queued -= 1;
        if more {
            self.place(slot, now);
        } else {
            self.resv.remove(slot);
            self.ready.remove(slot);
            self.limited.remove(slot);
            if let Some(pool) = self.config.pool_return {
                let e = AwayEntry::of(self.tenants.id_of(slot), self.tenants.at(slot));
                self.away.push(e, &self.tenants, self.time.now(), pool.window);
            }
        }
        self.batch = match self.batch {
            Some((s, rem, _, ph)) if s == slot => Some((slot, rem.saturating_sub(1), q.offset, ph)),
            _ if self.config.batch > 1 => Some((slot, self.config.batch - 1, q.offset, phase)),
            _ => None,
        };
        Dispatch { tenant: self.tenants.id_of(slot), handle: q.handle, phase, cost: q.cost }
    }

    pub(crate) fn maintain(&mut self, now: Nanos) -> usize {
        let now = self.time.advance(now);
        let (idle_age, erase_age) = (self.config.idle_age, self.config.erase_age);
        if idle_age.is_none() && erase_age.is_none() {
            return 0;
        }
        let mut erase = Vec::new();
        for (id, t) in self.tenants.iter() {
            if !t.is_empty() {
                continue;
            }
            let idle = now.saturating_sub(t.idle_since);
            if erase_age.is_some_and(|a| idle >= a) {
                erase.push(id);
            }
        }
        for id in &erase {
            let _ = self.remove_tenant(*id);
        }
        if let Some(a) = idle_age {
            let ids: Vec<TenantId> = self
                .tenants
                .iter()
                .filter(|(_, t)| t.is_empty() && t.history && now.saturating_sub(t.idle_since) >= a)
                .map(|(id, _)| id)
                .collect();
            for id in ids {
                self.tenants.get_mut(id).expect("live").history = false;
            }
        }
        erase.len()
    }

    pub(crate) fn queued(&self) -> usize {
        self.queued
    }
    pub(crate) fn tenant_count(&self) -> usize {
        self.tenants.len()
    }
    pub(crate) fn stats(&self, id: TenantId) -> Result<TenantStats, SchedError> {
        let t = self.tenants.get(id)?;
        let dispatched = t.dispatched;
        Ok(TenantStats {
            dispatched,
            cost: t.cost.map(u128::from),
            // Requests leave a queue only by dispatch (or with the tenant).
            enqueued: dispatched.iter().sum::<u64>() + t.len as u64,
            queued: t.queue_len(),
            rho: u128::from(t.rho),
        })
    }
    pub(crate) fn spec(&self, id: TenantId) -> Result<QosSpec, SchedError> {
        Ok(self.tenants.get(id)?.spec)
    }
    pub(crate) fn time_regressions(&self) -> u64 {
        self.time.regressions()
    }

    /// Head tags of a tenant (R, L, P) if it has queued requests; for tests, tools and the paper examples.
    pub(crate) fn head_tags(&self, id: TenantId) -> Result<Option<(Tag, Tag, Tag)>, SchedError> {
        let t = self.tenants.get(id)?;
        Ok((!t.is_empty()).then_some((t.head_r, t.head_l, t.head_p)))
    }

    /// Checks invariants 1, 2 and 5 (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut total = 0;
        for (id, t) in self.tenants.iter() {
            let s = id.slot;
            total += t.queue_len();
            assert_eq!(t.queue_len(), t.queued_requests().count(), "queue length for {id}");
            let active = !t.is_empty();
            let limited = self.limited.contains(s);
            assert_eq!(self.resv.contains(s), active && t.r_step != 0 && !limited, "invariant 1 for {id}");
            let n = self.ready.contains(s) as u8 + self.limited.contains(s) as u8;
            assert_eq!(n, active as u8, "invariant 2 for {id}");
            if self.limited.contains(s) {
                assert!(t.l_step != 0, "invariant 3 for {id}");
            }
        }
        assert_eq!(total, self.queued, "invariant 5");
        assert!(!self.vtime.reached(self.vnow), "invariant 9");
        // Invariant 8's T: the counted specs are the tenants', and every bound is set from T.
        let mut counted = LeadSpecs::default();
        for (_, t) in self.tenants.iter() {
            counted.count(t.spec, 1);
        }
        assert_eq!(counted, self.lead_specs, "invariant 8: the specs counted");
        assert_eq!(self.lead_time, lead_time(counted.need()), "invariant 8: T");
        for (id, t) in self.tenants.iter() {
            let want = self
                .config
                .weight_lead_ios
                .map_or(0, |cap| times_u32(reservation_lead(t.spec.reservation(), t.p_step, self.lead_time), cap));
            assert_eq!(t.resv_lead, want, "invariant 8: the bound of {id}");
        }
        self.resv.check();
        self.ready.check();
        self.limited.check();
        assert!(self.away.heap.len() <= Away::bound(self.tenants.len()), "the away heap is bounded");
        if let Some(pool) = self.config.pool_return {
            // Every tenant idle within the window, with a history, has its current entry, so the lazy
            // minimum is the eager one.
            let now = self.time.now();
            let within = |since: Nanos| now.saturating_sub(since) < pool.window;
            for (id, t) in self.tenants.iter() {
                if t.is_empty() && t.history && within(t.idle_since) {
                    let e = AwayEntry::of(id, t);
                    assert!(self.away.heap.iter().any(|x| x.0 == e), "{id} is idle but not away");
                }
            }
            let eager = self
                .tenants
                .iter()
                .filter(|(_, t)| t.is_empty() && t.history && within(t.idle_since))
                .map(|(_, t)| t.last_p)
                .min();
            let mut lazy = self.away.clone();
            assert_eq!(lazy.min(&self.tenants, now, pool.window), eager, "the away minimum");
        }
    }
}

/// Implements [`super::Scheduler`] for a newtype around [`Engine`].
macro_rules! delegate_scheduler {
    ($t:ty) => {
        impl $crate::sched::Scheduler for $t {
            fn kind(&self) -> $crate::sched::SchedulerKind {
                self.0.kind()
            }
            fn add_tenant(
                &mut self,
                spec: $crate::QosSpec,
            ) -> Result<$crate::sched::TenantId, $crate::sched::SchedError> {
                self.0.add_tenant(spec)
            }
            fn set_spec(
                &mut self,
                id: $crate::sched::TenantId,
                spec: $crate::QosSpec,
            ) -> Result<(), $crate::sched::SchedError> {
                self.0.set_spec(id, spec)
            }
            fn set_config(&mut self, config: $crate::sched::SchedConfig) {
                self.0.set_config(config)
            }
            fn remove_tenant(&mut self, id: $crate::sched::TenantId) -> Result<Vec<u64>, $crate::sched::SchedError> {
                self.0.remove_tenant(id)
            }
            fn enqueue(
                &mut self,
                now: $crate::Nanos,
                req: $crate::sched::Request,
            ) -> Result<(), $crate::sched::SchedError> {
                self.0.enqueue(now, req)
            }
            #[inline]
            fn poll(&mut self, now: $crate::Nanos, device_idle: bool) -> $crate::sched::Poll {
                self.0.poll(now, device_idle)
            }
            fn maintain(&mut self, now: $crate::Nanos) -> usize {
                self.0.maintain(now)
            }
            fn queued(&self) -> usize {
                self.0.queued()
            }
            fn tenant_count(&self) -> usize {
                self.0.tenant_count()
            }
            fn stats(
                &self,
                id: $crate::sched::TenantId,
            ) -> Result<$crate::sched::TenantStats, $crate::sched::SchedError> {
                self.0.stats(id)
            }
            fn spec(&self, id: $crate::sched::TenantId) -> Result<$crate::QosSpec, $crate::sched::SchedError> {
                self.0.spec(id)
            }
            fn time_regressions(&self) -> u64 {
                self.0.time_regressions()
            }
        }
    };
}
pub(crate) use delegate_scheduler;

/// Virtual time's range (module comment): the clamp of a request's delta and rho, and renormalisations
/// that change no decision.
#[cfg(test)]
mod vtime {
    use super::*;
    use crate::sched::{PoolReturn, Request};
    use proptest::prelude::*;

    const MCLOCK: Flavor = Flavor { kind: SchedulerKind::Mclock, rho_in_r: true, delta_in_l: true, limit_cost: None };
    const RBFQ: Flavor = Flavor { kind: SchedulerKind::Rbfq, rho_in_r: false, delta_in_l: false, limit_cost: None };

    /// A delta or rho above `Cost::MAX` moves the tags as `Cost::MAX` does.
    #[test]
    fn a_delta_and_rho_above_cost_max_count_as_cost_max() {
        let mut e = Engine::new(MCLOCK, SchedConfig::default());
        let spec = QosSpec::new(10.0, Some(20.0), 1.0, 0).unwrap();
        let id = e.add_tenant(spec).unwrap();
        for handle in 0..2 {
            let mut r = Request::new(id, handle);
            (r.delta, r.rho) = (Cost(u64::MAX), Cost(u64::MAX));
            e.enqueue(Nanos(0), r).unwrap();
        }
        let (r0, l0, p0) = e.head_tags(id).unwrap().unwrap();
        assert!(matches!(e.poll(Nanos(0), true), Poll::Dispatch(d) if d.handle == 0 && d.phase == Phase::Reservation));
        let (r1, l1, p1) = e.head_tags(id).unwrap().unwrap();
        let charged = Cost::ONE.saturating_add(Cost::MAX);
        assert_eq!(p1.0 - p0.0, charged.times_step(step_for_rate(1.0)), "P: cost + Cost::MAX");
        assert_eq!(r1.0 - r0.0, charged.times_step(step_for_rate(10.0)), "R: cost + Cost::MAX");
        assert_eq!(l1.0 - l0.0, charged.times_step(step_for_rate(20.0)), "L: cost + Cost::MAX");
    }

    /// Invariant 8's bound, exactly where it binds and at the range's edge: a tenant served only in the
    /// reservation phase (nothing else queued, so `vnow` stays at 0) leads `vnow` by at most 16 times the
    /// larger of one own IO and 4 ms of its reservation (T for a smallest reservation of 1,000): r =
    /// 1,000 IOPS, w = 2 is 16 * 4 IOs of 1/2 each (the own-IO term alone would be 16 IOs); at `MAX_RATE`
    /// and `MIN_WEIGHT`, and the longest T, it stays under 2^112 (module comment, "Virtual time's range").
    #[test]
    fn the_lead_bound_is_its_reservation_time_and_stays_in_range() {
        use crate::units::{MAX_RATE, MIN_WEIGHT};
        let mut edge = Tenant::new(QosSpec::new(MAX_RATE, None, MIN_WEIGHT, 0).unwrap(), Nanos(0));
        edge.apply_lead(SchedConfig::default().weight_lead_ios, RESERVATION_LEAD_MAX);
        assert!((1 << 111..1 << 112).contains(&edge.resv_lead), "2^{:.1}", (edge.resv_lead as f64).log2());
        let (r, w, lead) = (1000.0, 2.0, 64 * step_for_rate(2.0));
        let mut e = Engine::new(MCLOCK, SchedConfig::default());
        let id = e.add_tenant(QosSpec::new(r, None, w, 0).unwrap()).unwrap();
        let mut now = Nanos(0);
        e.enqueue(now, Request::new(id, 0)).unwrap();
        for handle in 1..200 {
            e.enqueue(now, Request::new(id, handle)).unwrap();
            // Polled when the head's R tag is due, it is served in the reservation phase.
            let (r_tag, _, _) = e.head_tags(id).unwrap().unwrap();
            now = now.max(r_tag.ceil_nanos());
            assert!(matches!(e.poll(now, true), Poll::Dispatch(d) if d.phase == Phase::Reservation));
            let (_, _, p) = e.head_tags(id).unwrap().unwrap();
            assert_eq!(e.vnow(), Tag::ZERO, "no weight-phase dispatch");
            assert!(p.0 <= lead, "{r}/{w}: lead {} over {lead}", p.0);
        }
        let (_, _, p) = e.head_tags(id).unwrap().unwrap();
        assert!(p.0 + step_for_rate(w) > lead, "{r}/{w}: the bound is reached, {} of {lead}", p.0);
    }

    /// Invariant 8's T is the longest w / (r * w_min) of the reserved tenants, rounded up to 4, 8, 16,
    /// 32 or 64 ms, and every tenant's bound follows it as tenants come, change and go. Of equal weights
    /// it is one IO of the smallest reservation: a tenant of 1,000 IOPS banks 16 * 4 ms of its reservation
    /// alone, 16 * 16 ms beside one of 100 IOPS, 16 * 64 ms beside one of 5, and 16 * 4 ms again once the
    /// small ones have gone or grown; a tenant without a reservation counts by its weight only (one of
    /// weight 1/8 beside tenants of 1,000 and 500 IOPS makes the second's w / (r * w_min) 16 ms).
    #[test]
    fn the_lead_time_follows_the_specs() {
        assert_eq!(lead_time(None), RESERVATION_LEAD_PER_IO);
        for (need_ms, want_ms) in [(4.0, 4), (0.1, 4), (10.0, 16), (8.0, 8), (8.1, 16), (64.0, 64), (1e6, 64)] {
            assert_eq!(lead_time(Some(need_ms / 1e3)), Nanos::from_millis(want_ms), "{need_ms} ms");
        }
        let mut e = Engine::new(MCLOCK, SchedConfig::default());
        let big = e.add_tenant(QosSpec::new(1000.0, None, 1.0, 0).unwrap()).unwrap();
        let lead = |e: &Engine| e.tenants.at(big.slot).resv_lead;
        let of = |ms: u64| 16 * reservation_lead(1000.0, step_for_rate(1.0), Nanos::from_millis(ms));
        assert_eq!(lead(&e), of(4));
        let small = e.add_tenant(QosSpec::new(100.0, None, 1.0, 0).unwrap()).unwrap();
        assert_eq!(lead(&e), of(16));
        let tiny = e.add_tenant(QosSpec::new(5.0, None, 1.0, 0).unwrap()).unwrap();
        assert_eq!(lead(&e), of(64));
        e.add_tenant(QosSpec::new(0.0, None, 1.0, 0).unwrap()).unwrap();
        assert_eq!(lead(&e), of(64), "a tenant of the same weight without a reservation changes nothing");
        e.remove_tenant(tiny).unwrap();
        assert_eq!(lead(&e), of(16));
        e.set_spec(small, QosSpec::new(500.0, None, 1.0, 0).unwrap()).unwrap();
        assert_eq!(lead(&e), of(4));
        let light = e.add_tenant(QosSpec::new(0.0, None, 0.125, 0).unwrap()).unwrap();
        assert_eq!(lead(&e), of(16), "the 500 IOPS tenant's 1 / (500 * 1/8)");
        e.remove_tenant(light).unwrap();
        assert_eq!(lead(&e), of(4));
        e.set_config(SchedConfig { weight_lead_ios: None, ..SchedConfig::default() });
        assert_eq!(lead(&e), 0, "no bound");
    }

    /// Tenants added one by one with ever smaller reservations (250 down to 15.6 IOPS, each a new smallest)
    /// change T at most four times, so every bound is set again four times, not once a tenant (O(n^2)).
    #[test]
    fn tenants_of_ever_smaller_reservations_change_the_lead_time_four_times() {
        let mut e = Engine::new(MCLOCK, SchedConfig::default());
        let n = 10_000;
        for i in 0..n {
            let r = 250.0 - (250.0 - 15.625) * i as f64 / (n - 1) as f64;
            e.add_tenant(QosSpec::new(r, None, 1.0, 0).unwrap()).unwrap();
        }
        assert_eq!(e.lead_time, RESERVATION_LEAD_MAX);
        assert_eq!(e.lead_changes, 4);
        e.check();
    }

    /// `TenantStats::rho` sums what the reservation clock was charged for service elsewhere: a request
    /// to a server owed half the reservation stands for as much again elsewhere, served in either phase;
    /// RBFQ's local tags do not count it, and neither do its stats.
    #[test]
    fn stats_sum_the_rho_charged_to_the_reservation_clock() {
        let half = crate::sched::ReservationShare::from_ratio(1, 2);
        for (flavor, want) in [(MCLOCK, 2 * Cost::ONE.0 as u128), (RBFQ, 0)] {
            let mut e = Engine::new(flavor, SchedConfig::default());
            let id = e.add_tenant(QosSpec::new(10.0, None, 1.0, 0).unwrap()).unwrap();
            for handle in 0..2 {
                let mut r = Request::new(id, handle);
                r.share = half;
                e.enqueue(Nanos(0), r).unwrap();
            }
            // The first in the reservation phase, the second (its R tag not due) by weight.
            assert!(matches!(e.poll(Nanos(0), true), Poll::Dispatch(d) if d.phase == Phase::Reservation));
            assert!(matches!(e.poll(Nanos(0), true), Poll::Dispatch(d) if d.phase == Phase::Weight));
            let st = e.stats(id).unwrap();
            assert_eq!(st.rho, want, "{:?}", flavor.kind);
            assert_eq!(st.cost.iter().sum::<u128>(), 2 * Cost::ONE.0 as u128);
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Add(f64, Option<f64>, f64, u32),
        /// Tenant, size, delta in units, pool busy, pending here.
        Enqueue(usize, u64, u64, bool, bool),
        Poll(u64, bool),
        SetSpec(usize, f64, Option<f64>, f64),
        Remove(usize),
        Maintain(u64),
        SetConfig(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => (0.0f64..50.0, proptest::option::of(50.0f64..200.0), 0.1f64..10.0, 0u32..8)
                .prop_map(|(r, l, w, s)| Op::Add(r, l, w, s)),
            3 => (0usize..8, 0u64..1_000_000, prop_oneof![Just(0u64), 0u64..16], any::<bool>(), any::<bool>())
                .prop_map(|(t, size, delta, busy, here)| Op::Enqueue(t, size, delta, busy, here)),
            3 => (0u64..20_000_000, any::<bool>()).prop_map(|(dt, idle)| Op::Poll(dt, idle)),
            1 => (0usize..8, 0.0f64..50.0, proptest::option::of(50.0f64..200.0), 0.1f64..10.0)
                .prop_map(|(t, r, l, w)| Op::SetSpec(t, r, l, w)),
            1 => (0usize..8).prop_map(Op::Remove),
            1 => (0u64..2_000_000_000).prop_map(Op::Maintain),
            1 => (0usize..4).prop_map(Op::SetConfig),
        ]
    }

    /// The paper's rules (credit banked while limited), pool return, per-byte cost with age limits.
    fn configs() -> [SchedConfig; 4] {
        [
            SchedConfig::default(),
            SchedConfig { weight_lead_ios: None, ..SchedConfig::paper() },
            SchedConfig { pool_return: Some(PoolReturn::default()), ..SchedConfig::default() },
            SchedConfig {
                cost_model: CostModel::BYTES,
                idle_age: Some(Nanos::from_millis(100)),
                erase_age: Some(Nanos::from_secs(1)),
                batch: 2,
                ..SchedConfig::default()
            },
        ]
    }

    /// Where both twins start virtual time: far above every gap a run opens behind it (at most a few
    /// hundred requests of 2^20 units at weight 0.1, under 2^90), so nothing is clipped at 0.
    const ORIGIN: u128 = 1 << 100;
    /// The twin renormalises whenever virtual time rises this far above the origin: at weights up to 4,
    /// every few requests (one IO at weight 1 is 2^62).
    const STRIDE: u128 = 1 << 62;

    proptest! {
        /// Two engines fed the same operations, one renormalising whenever virtual time rises 2^62 above
        /// the origin (every request or few), the other never in the run: the same answer to every call,
        /// and the same tags but for the renormalisations' total offset in the P frame.
        #[test]
        fn renormalising_changes_no_decision(
            ops in proptest::collection::vec(op(), 1..300), rbfq in any::<bool>(), cfg in 0usize..4,
        ) {
            let flavor = if rbfq { RBFQ } else { MCLOCK };
            let mut plain = Engine::new(flavor, configs()[cfg]);
            let mut renormalised = plain.clone();
            renormalised.set_vtime_range(ORIGIN + STRIDE, ORIGIN);
            plain.start_vtime_at(Tag(ORIGIN));
            renormalised.start_vtime_at(Tag(ORIGIN));
            let mut ids = vec![];
            let (mut now, mut handle) = (0u64, 0u64);
            for op in ops {
                match op {
                    Op::Add(r, l, w, sigma) => {
                        if let Ok(spec) = QosSpec::new(r, l, w, sigma) {
                            let id = plain.add_tenant(spec).unwrap();
                            prop_assert_eq!(renormalised.add_tenant(spec).unwrap(), id);
                            ids.push(id);
                        }
                    }
                    Op::Enqueue(t, size, delta, busy, here) => {
                        if let Some(&id) = ids.get(t) {
                            let mut req = Request::new(id, handle).size(size).pending_here(here);
                            (req.delta, req.pool_busy) = (Cost::units(delta), busy);
                            handle += 1;
                            prop_assert_eq!(plain.enqueue(Nanos(now), req), renormalised.enqueue(Nanos(now), req));
                        }
                    }
                    Op::Poll(dt, idle) => {
                        now += dt;
                        prop_assert_eq!(plain.poll(Nanos(now), idle), renormalised.poll(Nanos(now), idle));
                    }
                    Op::SetSpec(t, r, l, w) => {
                        if let (Some(&id), Ok(spec)) = (ids.get(t), QosSpec::new(r, l, w, 0)) {
                            prop_assert_eq!(plain.set_spec(id, spec), renormalised.set_spec(id, spec));
                        }
                    }
                    Op::Remove(t) => {
                        if let Some(&id) = ids.get(t) {
                            prop_assert_eq!(plain.remove_tenant(id), renormalised.remove_tenant(id));
                        }
                    }
                    Op::Maintain(dt) => {
                        now += dt;
                        prop_assert_eq!(plain.maintain(Nanos(now)), renormalised.maintain(Nanos(now)));
                    }
                    Op::SetConfig(c) => {
                        plain.set_config(configs()[c]);
                        renormalised.set_config(configs()[c]);
                    }
                }
                plain.check();
                renormalised.check();
                let offset = plain.vnow().0 - renormalised.vnow().0;
                for &id in &ids {
                    let (Ok(Some((r, l, p))), Ok(Some((r2, l2, p2)))) = (plain.head_tags(id), renormalised.head_tags(id)) else {
                        continue;
                    };
                    prop_assert_eq!((r, l), (r2, l2), "real-time tags are not renormalised");
                    prop_assert_eq!(p.0 - p2.0, offset, "P tags are lowered with virtual time");
                }
            }
        }
    }

    /// A run that crosses the ceiling many times: the twins above on one fixed workload of three
    /// backlogged tenants (one returning from idle with credit every so often), checking that it does
    /// renormalise, and does not decide differently.
    #[test]
    fn a_long_run_renormalises_often_and_decides_alike() {
        for flavor in [MCLOCK, RBFQ] {
            let mut plain =
                Engine::new(flavor, SchedConfig { pool_return: Some(PoolReturn::default()), ..Default::default() });
            let mut renormalised = plain.clone();
            renormalised.set_vtime_range(ORIGIN + STRIDE, ORIGIN);
            plain.start_vtime_at(Tag(ORIGIN));
            renormalised.start_vtime_at(Tag(ORIGIN));
            // A reservation, a limit, idle credit.
            let specs = [(100.0, None, 1.0, 0), (0.0, Some(400.0), 4.0, 0), (0.0, None, 2.0, 4)]
                .map(|(r, l, w, sigma)| QosSpec::new(r, l, w, sigma).unwrap());
            let ids: Vec<TenantId> = specs.iter().map(|&s| plain.add_tenant(s).unwrap()).collect();
            for s in specs {
                renormalised.add_tenant(s).unwrap();
            }
            let (mut now, mut handle, mut renormalisations, mut last) = (0u64, 0u64, 0, renormalised.vnow());
            for step in 0..5_000u64 {
                for (k, &id) in ids.iter().enumerate() {
                    // The third tenant goes idle for 20 of every 50 steps.
                    if k < 2 || step % 50 < 30 {
                        let req = Request::new(id, handle).pending_here(step % 3 == 0);
                        handle += 1;
                        assert_eq!(plain.enqueue(Nanos(now), req), renormalised.enqueue(Nanos(now), req));
                    }
                }
                for _ in 0..3 {
                    assert_eq!(plain.poll(Nanos(now), true), renormalised.poll(Nanos(now), true), "step {step}");
                    renormalisations += (renormalised.vnow() < last) as u32;
                    last = renormalised.vnow();
                }
                now += 1_000_000;
            }
            renormalised.check();
            assert!(renormalisations > 1_000, "{renormalisations} renormalisations");
        }
    }
}

#[cfg(test)]
mod layout {
    /// The hot lines of a tenant (see `Tenant`): five 64-byte lines, then the cold spec.
    #[test]
    fn tenant_is_line_aligned_and_six_lines() {
        assert_eq!(std::mem::align_of::<super::Tenant>(), 64);
        assert_eq!(std::mem::size_of::<super::Tenant>(), 6 * 64);
        assert_eq!(std::mem::offset_of!(super::Tenant, first), 3 * 64);
        assert_eq!(std::mem::offset_of!(super::Tenant, rest), 4 * 64);
        assert!(std::mem::offset_of!(super::Tenant, rho) + 8 <= 5 * 64);
    }
}

#[cfg(test)]
mod arith {
    use proptest::prelude::*;

    proptest! {
        /// `times_u32` is `u128::saturating_mul` by a `u32`: below 2^64, across it, and where it saturates.
        #[test]
        fn times_u32_is_saturating_mul(
            x in prop_oneof![0u128..(1 << 64), (1u128 << 64)..(1 << 100), any::<u128>()],
            k in any::<u32>(),
        ) {
            prop_assert_eq!(super::times_u32(x, k), x.saturating_mul(u128::from(k)));
        }
    }

    #[test]
    fn times_u32_at_the_edges() {
        for x in [0, 1, u128::from(u64::MAX), 1 << 64, (1 << 96) - 1, 1 << 96, u128::MAX] {
            for k in [0, 1, 2, u32::MAX] {
                assert_eq!(super::times_u32(x, k), x.saturating_mul(u128::from(k)), "{x} * {k}");
            }
        }
    }
}
