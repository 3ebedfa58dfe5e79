//! mClock and dmClock (mclock-dmclock.txt §2-3).
//!
//! # Model
//! Each tenant (the paper's VM v_i) has a reservation r_i, a limit l_i and a weight w_i. Over any interval
//! in which the tenants are backlogged and the device does T IOPS, mClock aims at the allocation of
//! eq. (1)-(2) (computed by [`crate::oracle::allocate`]): reservation-clamped tenants get r_i,
//! limit-clamped ones l_i, and the rest split what is left in proportion to w_i. It does so without
//! knowing T, with three real-time clocks per tenant (Algorithm 1):
//! - R tags, spaced cost/r_i: a request whose R tag is due (`<= now`) is served first, smallest R tag
//!   first (the *constraint-based phase*, [`Phase::Reservation`]);
//! - L tags, spaced cost/l_i: a tenant whose head L tag is in the future has had its limit and is
//!   skipped by the weight phase;
//! - P tags, spaced cost/w_i: when no R tag is due, the smallest P tag among tenants under their limit is
//!   served (the *weight-based phase*, [`Phase::Weight`]), and the served tenant's R tags move back by
//!   cost/r_i so that weight-phase service does not count toward its reservation.
//!
//! # Paper symbols -> code
//! | paper | code |
//! |---|---|
//! | r_i, l_i, w_i, sigma_i | [`QosSpec`] `reservation`, `limit`, `weight`, `idle_credit` |
//! | R_i^r, L_i^r, P_i^r | `head_r`, `head_l`, `head_p` of the tenant whose head request is r |
//! | 1/r_i, 1/l_i, 1/w_i | `r_step`, `l_step`, `p_step` (per unit cost, 2^-32 ns) |
//! | Max_QueueDepth, Active_IOs | the caller (keeps D outstanding, passes `device_idle`) |
//! | Tag Adjustment (minPtag offset) | `vnow` (engine module comment) |
//! | IO size cost 1 + S/(Tm Bpeak) | [`crate::CostModel::SeekTransfer`] |
//! | batch of 8 within 4 MB | [`SchedConfig::batch`], [`SchedConfig::batch_distance`] (off by default) |
//! | dmClock delta_i, rho_i | [`super::Request::delta`], [`super::Request::rho`] |
//!
//! # dmClock (§3.2.1)
//! Each server runs mClock with one change in tag assignment:
//! `R = max(R' + rho/r, t)`, `L = max(L' + delta/l, t)`, `P = max(P' + delta/w, t)`, where delta counts the
//! tenant's completions at all servers and rho the reservation-phase ones since its previous request to
//! this server. We count the request's own cost separately (`R = max(R' + (cost + rho)/r, t)` with rho
//! counting completions at *other* servers), so on one server delta = rho = 0 and dmClock is exactly
//! mClock; the paper's delta includes the previous request here, which is the same quantity. The client
//! side is [`super::ServiceTracker`].
//!
//! # Deviations from the paper, and why
//! - Tags are computed when a request reaches the head of its tenant's queue (same values for a backlogged
//!   tenant; makes the R-tag reduction O(1)). The `max(., t)` uses the request's arrival time.
//! - P tags live in virtual time (engine comment): a newly active tenant starts at the smallest eligible
//!   P tag (minus its idle credit) rather than at wall time. Backlogged tenants' P tags are never clamped
//!   to wall time, which keeps weights exact when P tags run behind wall time (large weights).
//! - With [`LimitMode::BreakWhenIdle`] the over-limit tenant served is the one with the earliest L tag.
//!
//! # Known property (not a bug): reservation lead
//! A tenant held at its reservation (r_i above its weight share) advances its P tags faster than the others,
//! exactly as in the paper. If capacity later rises so that its weight share exceeds r_i, it gets only r_i
//! until the others' P tags catch up. `SchedConfig::idle_age` resets the lead of a tenant that goes idle.

use super::engine::{delegate_scheduler, Engine, Flavor};
use super::{SchedConfig, SchedError, SchedulerKind, TenantId};
use crate::units::Tag;
#[allow(unused_imports)]
use super::{LimitMode, Phase};
#[allow(unused_imports)]
use crate::QosSpec;

/// mClock (single server) or dmClock (per server of a cluster); see the module comment.
#[derive(Debug, Clone)]
pub struct Mclock(Engine);

impl Mclock {
    pub fn new(config: SchedConfig) -> Self {
        Mclock(Engine::new(
            Flavor { kind: SchedulerKind::Mclock, rho_in_r: true, delta_in_l: true, limit_cost: None },
            config,
        ))
    }

    /// The server side of dmClock: the same algorithm, reporting its kind as dmclock.
    pub fn dmclock(config: SchedConfig) -> Self {
        Mclock(Engine::new(
            Flavor { kind: SchedulerKind::Dmclock, rho_in_r: true, delta_in_l: true, limit_cost: None },
            config,
        ))
    }

    /// The (R, L, P) tags of a tenant's head request, if it has one. Tags without a clock (no reservation,
    /// no limit) are zero.
    pub fn head_tags(&self, id: TenantId) -> Result<Option<(Tag, Tag, Tag)>, SchedError> {
        self.0.head_tags(id)
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        self.0.check()
    }
}

delegate_scheduler!(Mclock);
