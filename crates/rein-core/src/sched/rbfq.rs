//! RBFQ, the scheduler of RePAIR (rbfq-repair.txt §3).
//!
//! # Model
//! Clients c_i have a minimum service demand M_i (a reservation) and a global weight w_i. With capacity C
//! between the critical capacities C_k and C_{k+1} ([`crate::oracle::critical_capacities`]), the clients
//! with the k smallest M_i/w_i share in proportion to w_i and the rest get exactly M_i; below
//! sum(M_i) service is split in proportion to M_i ("the RBFQ Scheduling Property", §3).
//!
//! Fig. 5's algorithm: each request gets a *local* tag `l = max(l' + 1/M_i, t)` and a *global* tag
//! `g = max(g' + 1/w_i, t)`; a request whose local tag is due is served first (local phase, reported as
//! [`super::Phase::Reservation`]); otherwise the smallest global tag is served (global phase,
//! [`super::Phase::Weight`]) and the client's local tags move back by 1/M_i. Global tags are re-based at
//! every arrival so the smallest equals t ("Tag-Adjustment").
//!
//! This is mClock's machine (see the engine module comment for the shared implementation); what differs:
//! - **Tag adjustment** at every arrival (Fig. 5) vs. only on activation (mClock). Shifting all global tags
//!   by one constant changes no decision, so both are the engine's virtual-time `vnow`: a client that
//!   becomes active starts at the smallest eligible global tag. Fig. 14's starvation without adjustment
//!   cannot happen (tested in `tests/idle_return.rs`).
//! - **Distributed Delta** (§3.2): the gateway piggybacks a running completion count; the difference Delta
//!   between two successive counts seen by a server advances the global tag: `g = max(g' + Delta/w, t)`.
//!   We carry `Delta - own cost` as [`super::Request::delta`] (completions at other servers, from
//!   [`super::ServiceTracker`]); local tags use the per-server M_ij and ignore it.
//! - **Idle credits** (§3.3): the global tag of a client returning from idle may lag t by sigma/w.
//! - **Upper bound** (§3.4): tag u advances by iosize/B_i; a client with u > now is not served. It is the
//!   engine's limit clock, counting the configured cost (see the deviations below) or bytes.
//!
//! # Deviations from the paper, and why
//! - **The upper bound is in the configured cost units** ([`Rbfq::new`], and what
//!   [`SchedulerKind::build`] gives), as mClock's limit is, not in bytes per second: a tenant's spec
//!   then means the same under every scheduler of a deployment, which picks its cost model once
//!   ([`SchedConfig::cost_model`]; with [`CostModel::BYTES`] the two agree). §3.4's B_i in bytes per
//!   second, whatever the cost model, is [`Rbfq::with_byte_limit`].
//! - The engine's deviations from the tag algorithm (module comment of [`super::mclock`]) hold here too.
//!
//! # Paper symbols -> code
//! | paper | code |
//! |---|---|
//! | M_i (M_ij per server), w_i, sigma_i, B_i | [`crate::QosSpec`] `reservation`, `weight`, `idle_credit`, `limit` |
//! | l_i^r, g_i^r, u_i | `head_r`, `head_p`, `head_l` |
//! | Delta | [`super::Request::delta`] + own cost |

use super::engine::{delegate_scheduler, Engine, Flavor};
use super::{SchedConfig, SchedError, SchedulerKind, TenantId};
use crate::cost::CostModel;
use crate::units::Tag;

/// RBFQ; see the module comment.
#[derive(Debug, Clone)]
pub struct Rbfq(Engine);

impl Rbfq {
    /// RBFQ whose upper bound, a spec's `limit`, is in the configured cost units (IOPS under the per-IO
    /// model), like mClock's limit. What [`SchedulerKind::build`] gives.
    pub fn new(config: SchedConfig) -> Self {
        Self::with_limit_cost(config, None)
    }

    /// RBFQ with §3.4's upper bound: a spec's `limit` is B_i in bytes per second, whatever the configured
    /// cost model (which still prices the local and global tags).
    pub fn with_byte_limit(config: SchedConfig) -> Self {
        Self::with_limit_cost(config, Some(CostModel::BYTES))
    }

    fn with_limit_cost(config: SchedConfig, limit_cost: Option<CostModel>) -> Self {
        Rbfq(Engine::new(Flavor { kind: SchedulerKind::Rbfq, rho_in_r: false, delta_in_l: false, limit_cost }, config))
    }

    /// (local, upper-bound, global) tags of a client's head request, if any.
    /// Global tags are virtual time, which is lowered for all clients at once when it nears the end of a
    /// `u128` (the engine's renormalisation): compare them with each other, not across calls far apart.
    pub fn head_tags(&self, id: TenantId) -> Result<Option<(Tag, Tag, Tag)>, SchedError> {
        self.0.head_tags(id)
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        self.0.check()
    }
}

delegate_scheduler!(Rbfq);
