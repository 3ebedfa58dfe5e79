//! pShift: reservation and limit tokens for bucket QoS across servers (pshift.txt, MSST 2019).
//!
//! # Modules
//! - [`instance`]: the validated problem (servers, buckets, sparse demand) and its bounds;
//! - this module and [`alloc`]: the allocation (Algorithms 2-5) and its invariants;
//! - [`tokens`]: the per-server Token Scheduler (Algorithm 1) and its weighted variant (§V);
//! - [`server`]: a server's side: its reports and how it applies the controller's answers;
//! - [`controller`]: QoS periods, redistribution intervals, server reports, estimates (§III-D), and the
//!   early rounds that answer a demand move before the next boundary (beyond the paper).
//!
//! # Model (§II, §III-A)
//! A bucket's objects live on many servers and its requests go straight to them. QoS is per bucket and
//! per *QoS period*: at least R_i and at most L_i IOs in total over all servers. A controller hands each
//! server *tokens* for the rest of the period: a server's [`TokenScheduler`] (Algorithm 1) serves buckets
//! holding R-tokens first, round robin, then buckets holding L-tokens, round robin, and never a bucket
//! without L-tokens. So the controller's problem is where to put each bucket's tokens. With demand
//! d_i^j (requests bucket i will bring to server j) and capacity C^j (IOs server j can do), server j
//! consumes `phi^j = min(C^j, sum_i min(a_i^j, d_i^j))` tokens, and the goal is an allocation maximising
//! the *effective capacity* `Phi = sum_j phi^j` subject to `sum_j a_i^j = A_i = min(R_i, D_i)`.
//!
//! # Algorithm (§III-B, Algorithms 2-5)
//! 1. *Initial prudent allocation* (Alg. 3, [`initial_allocation`]): A_i in proportion to demand. We
//!    allocate whole tokens: floors of `A_i d_i^j / D_i`, then the leftover tokens (fewer than the
//!    bucket's server count) one each to the largest remainders, ties to the lower server index. Whole
//!    tokens keep the allocation exact (no drift between controller and servers, which count IOs) and
//!    remainders are < 1 so `a_i^j <= d_i^j` still holds.
//! 2. *Token movement map* (Alg. 4, [`token_movement`]): `TM_{j,k}[i] = min(a_i^j, d_i^k - a_i^k)`, what
//!    bucket i can move from j to k without exceeding its demand at k; `TMS_{j,k} = sum_i TM_{j,k}[i]`.
//! 3. *Progressive shifting* (Alg. 5): in the token transfer graph (servers; an edge j -> k when
//!    TMS_{j,k} > 0) look, for each overloaded server P, for a breadth-first shortest path to an
//!    underloaded server Q, shortest paths first (length 1, then 2, ...); move
//!    `Omega = min(gamma^P, delta^Q, min edge weight)` tokens along it, which raises Phi by Omega and
//!    leaves the brokers' loads unchanged. Stop when no overloaded server has such a path: the allocation
//!    is then optimal (§III-B and \[23\]); our tests check Phi against the max-flow value on random
//!    instances (crate `rein-pshift-baseline`).
//! 4. *L-tokens* (§III-D, last paragraph): the same algorithm on what is left: demand
//!    `d_i^j - r_i^j`, capacity `max(0, C^j - sum_i r_i^j)` and, for limited buckets, target
//!    `min(L_i, D_i) - A_i` (the IOs above the reservation the limit still allows, where there is demand).
//!    Unlimited buckets need no L-tokens: the scheduler serves them without (`Tokens::Unlimited`).
//!
//! # Paper symbols -> code
//! | paper | code |
//! |---|---|
//! | S, B | [`Instance::servers`], [`Instance::buckets`] (indices) |
//! | C^j | [`Instance::capacity`] (tokens for the rest of the QoS period) |
//! | R_i, L_i | [`Instance::reservation`], [`Instance::limit`] |
//! | d_i^j, D_i | `entry_demand[e]` for entry e = (i, j) ([`Instance::demand`]); [`Instance::total_demand`] |
//! | A_i = min(R_i, D_i) | the R-class target (`Problem::target`) |
//! | a_i^j | [`Allocation::r`]`[e]` (R-tokens), [`Allocation::l`]`[e]` (L-tokens) |
//! | `TM_{j,k}[i]`, `TMS_{j,k}` | [`token_movement`]; inside the solver only the sums `tms[j * S + k]` |
//! | gamma^P, delta^Q | `load[P] - cap[P]`, `cap[Q] - load[Q]` |
//! | Omega, w_min | `omega` in `Shifter::shift` |
//! | phi^j, Phi | [`phi`], [`ClassStats::phi`] |
//! | top M (§III-C) | [`SolveOptions::approx_top`] |
//!
//! # Invariants (numbers referenced from the asserts)
//! 1. Token conservation: `sum_j a_i^j = A_i` for every bucket, after Alg. 3 and after every shift.
//! 2. Prudence: `a_i^j <= d_i^j` (no strong excess tokens), always.
//! 3. Phi never decreases: a shift raises it by exactly Omega > 0.
//! 4. The token movement sums are exact: `tms[j][k] = sum_i min(a_i^j, d_i^k - a_i^k)` over the
//!    participating buckets (so a path of weight w can carry w tokens: `move_edge` asserts it).
//! 5. A shift leaves the load of every broker (intermediate server) unchanged.
//! 6. The result does not depend on the number of threads: parallel work is split by disjoint bucket
//!    ranges and combined with integer sums; the shifting itself is sequential and ordered by index.
//!
//! # Complexity, and why it is fast
//! The paper stores TM as a dense |S| x |S| x |B| array (41 M entries at 64 x 10,000) and refreshes all
//! vectors of the servers on a path after each shift, O(|S| |B|) per shift. But `TM_{j,k}[i]` is non-zero
//! only if bucket i is active on both j and k, and a shift changes only the buckets whose tokens moved. So
//! we keep only the sums (|S|^2) and per-server bucket lists; initialising them costs
//! O(sum_i deg_i^2) (560,000 pair updates at 10,000 buckets on 8 servers each), a shift costs a merge of
//! two server lists per edge plus O(deg) per bucket moved, and a search costs O(|S|^2). See `alloc.rs`.
//!
//! # Parallel and approximate modes (§III-C)
//! With the `parallel` feature and [`SolveOptions::parallel`], the initial allocation and the token
//! movement sums (the O(|B| deg^2) part) are computed on rayon's *current* thread pool in disjoint bucket
//! ranges: the caller owns the pool and its size (`ThreadPool::install`); this crate never spawns.
//! Shifting stays sequential: with incremental updates a shift touches a few hundred numbers, too little
//! to split (the paper parallelises its O(|S||B|) refresh, which we do not have). With
//! [`SolveOptions::approx_top`] = M only the top M buckets by tokens and the top M by spare demand take
//! part in shifting; the others keep their initial allocation. Phi can only be lower than optimal, and
//! prudence and conservation hold as always. The paper's sentence ("retain only the top M buckets with
//! most tokens and the top M buckets with the highest spare demands") does not say whether the lists are
//! over the cluster or per server; [`SolveOptions::approx_per_server`] takes the second reading: the top M
//! entries of each server by its demand there (to which the initial tokens and the spare demand on that
//! server are both proportional). On §IV-D's instance (64 servers, 10,000 buckets, 1,174-1,337 buckets per
//! server) the cluster-wide reading removes 87% of the removable weak excess at M = 2,000 and s = 0.5, the
//! per-server one all of it (every bucket takes part), as the paper's Fig. 6(a) reports; docs/
//! reproductions.md has both readings side by side.
//!
//! # Deviations from the paper, and why
//! - Whole tokens with largest-remainder rounding (the paper's `A_i d_i^j / D_i` is fractional).
//! - Levels: Alg. 5 tries every length l = 1 .. |S|-1 for every overloaded server. We skip levels at
//!   which no overloaded server has a path (jumping to the shortest distance seen) and stop searching
//!   from a server once nothing underloaded is reachable from it at all (it never becomes reachable
//!   again: a shift elsewhere cannot create an edge out of that server's reachable set). Same paths,
//!   same result; fewer searches.
//! - Tokens along an edge are taken from buckets in index order (the paper leaves the choice open).

pub mod alloc;
pub mod controller;
pub mod instance;
pub mod server;
/// pShift's token scheduler (Algorithm 1) lives with the other schedulers; this is its pShift name.
pub use crate::sched::tokens;

pub use alloc::ClassStats;
pub use controller::{
    BucketQos, BucketReport, ClosedPeriod, ConfigError, Controller, ControllerConfig, ControllerError, DemandEstimator,
    EarlyRounds, PeriodDemand, PeriodTally, PeriodVerdict, RoundSummary, ServerReport, StrayArrival, TokenMessage,
};
pub use instance::{
    Instance, InstanceBuilder, InstanceError, RawBucket, RawServer, MAX_BUCKETS, MAX_ENTRIES, MAX_NAME_LEN,
    MAX_SERVERS, MAX_TOKENS,
};
pub use server::TokenServer;
pub use tokens::{BucketInterval, IntervalCounters, TokenScheduler, Tokens};

use alloc::{apportion, phi_of, Problem, Shifter};

/// How to solve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SolveOptions {
    /// §III-C approximation: only the top M buckets by tokens and the top M by spare demand shift.
    /// `None` (default): exact.
    pub approx_top: Option<usize>,
    /// With `approx_top` = M: choose the top M per server (each server's M entries with the most demand,
    /// hence the most initial tokens and the most spare demand there) instead of the top M buckets of the
    /// cluster. A bucket takes part if any of its entries is chosen.
    pub approx_per_server: bool,
    /// Compute the initial allocation and the token movement sums on rayon's current thread pool
    /// (feature `parallel`; without it this is ignored and the result is the same, invariant 6).
    pub parallel: bool,
    /// Skip the L-token class (every `l` is 0).
    pub reservations_only: bool,
}

/// The tokens of one solve: R- and L-tokens per entry (aligned with the instance's entries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// R-tokens r_i^j per entry.
    pub r: Vec<u64>,
    /// L-tokens l_i^j per entry; always 0 for unlimited buckets (they are served without L-tokens).
    pub l: Vec<u64>,
    /// The R-token solve's counters (its `phi` is the paper's objective).
    pub r_stats: ClassStats,
    /// The L-token solve's counters (all zero when no L-tokens were computed).
    pub l_stats: ClassStats,
    /// Whether L-tokens were computed (false with [`SolveOptions::reservations_only`]).
    pub l_solved: bool,
}

impl Allocation {
    /// Phi of the R-tokens: the reservation IOs the servers can do (the paper's objective).
    pub fn phi(&self) -> u64 {
        self.r_stats.phi
    }

    /// R-tokens of a bucket on a server (0 where it has no demand).
    pub fn r_tokens(&self, inst: &Instance, bucket: usize, server: usize) -> u64 {
        inst.find_entry(bucket, server).map_or(0, |e| self.r[e])
    }

    /// L-tokens of a bucket on a server.
    pub fn l_tokens(&self, inst: &Instance, bucket: usize, server: usize) -> u64 {
        inst.find_entry(bucket, server).map_or(0, |e| self.l[e])
    }

    /// Checks invariants 1 and 2 for both classes and that the reported Phi is the allocation's. For tests
    /// and for callers who want to audit a result; O(entries).
    pub fn verify(&self, inst: &Instance) -> Result<(), String> {
        if self.r.len() != inst.entries() || self.l.len() != inst.entries() {
            return Err("allocation does not match the instance's entries".into());
        }
        let rt = r_targets(inst);
        let mut load = vec![0u64; inst.servers()];
        for (i, &r_target) in rt.iter().enumerate() {
            let e = inst.bucket_entries(i);
            let r: u64 = self.r[e.clone()].iter().sum();
            if r != r_target {
                return Err(format!("invariant 1: bucket {i} holds {r} R-tokens, A_i = {r_target}"));
            }
            let d = inst.total_demand(i);
            let lt = match inst.limit(i) {
                Some(l) if self.l_solved => l.min(d) - r_target,
                _ => 0,
            };
            let l: u64 = self.l[e.clone()].iter().sum();
            if l != lt {
                return Err(format!("invariant 1: bucket {i} holds {l} L-tokens, target {lt}"));
            }
            for k in e {
                if self.r[k] + self.l[k] > inst.entry_demand(k) {
                    return Err(format!(
                        "invariant 2: bucket {i} on server {} holds {} + {} tokens for a demand of {}",
                        inst.entry_server(k),
                        self.r[k],
                        self.l[k],
                        inst.entry_demand(k)
                    ));
                }
                load[inst.entry_server(k)] += self.r[k];
            }
        }
        let p = phi_of(&inst.capacity, &load);
        if p != self.r_stats.phi {
            return Err(format!("reported Phi {} but the allocation's is {p}", self.r_stats.phi));
        }
        Ok(())
    }
}

/// A_i = min(R_i, D_i) per bucket.
fn r_targets(inst: &Instance) -> Vec<u64> {
    (0..inst.buckets()).map(|i| inst.reservation(i).min(inst.total_demand(i))).collect()
}

/// Algorithm 3 alone: the initial prudent R-token allocation, per entry.
pub fn initial_allocation(inst: &Instance) -> Vec<u64> {
    let target = r_targets(inst);
    let mut a = vec![0u64; inst.entries()];
    let mut scratch = Vec::new();
    for (i, &r_target) in target.iter().enumerate() {
        let e = inst.bucket_entries(i);
        apportion(r_target, &inst.entry_demand[e.clone()], &mut a[e], &mut scratch);
    }
    a
}

/// Algorithm 4 for one pair of servers, dense: `(TM_{j,k}, TMS_{j,k})` for the allocation `a` (per entry).
/// For tests and explanations; the solver keeps only the sums.
pub fn token_movement(inst: &Instance, a: &[u64], j: usize, k: usize) -> (Vec<u64>, u64) {
    let tm: Vec<u64> = (0..inst.buckets())
        .map(|i| match (inst.find_entry(i, j), inst.find_entry(i, k)) {
            (Some(ej), Some(ek)) if j != k => a[ej].min(inst.entry_demand(ek).saturating_sub(a[ek])),
            _ => 0,
        })
        .collect();
    let sum = tm.iter().sum();
    (tm, sum)
}

/// Phi of any allocation `a` (per entry): `sum_j min(C^j, sum_i min(a_i^j, d_i^j))`.
pub fn phi(inst: &Instance, a: &[u64]) -> u64 {
    let mut used = vec![0u64; inst.servers()];
    for e in 0..inst.entries() {
        used[inst.entry_server(e)] += a[e].min(inst.entry_demand(e));
    }
    phi_of(&inst.capacity, &used)
}

/// pShift (Algorithm 2): R-tokens by Algorithms 3-5, then L-tokens on the residual demand and capacity.
pub fn solve(inst: &Instance, opts: &SolveOptions) -> Allocation {
    let rp = Problem { inst, cap: inst.capacity.clone(), demand: inst.entry_demand.clone(), target: r_targets(inst) };
    let mut sr = Shifter::new(&rp, opts);
    sr.progressive_shifting();
    let r_stats = sr.stats;
    let r = std::mem::take(&mut sr.a);
    let load_r = std::mem::take(&mut sr.load);
    drop(sr);
    if opts.reservations_only {
        return Allocation { l: vec![0; r.len()], r, r_stats, l_stats: ClassStats::default(), l_solved: false };
    }
    let l_target: Vec<u64> = (0..inst.buckets())
        .map(|i| match inst.limit(i) {
            Some(l) => l.min(inst.total_demand(i)) - rp.target[i],
            None => 0,
        })
        .collect();
    if l_target.iter().all(|&t| t == 0) {
        // No limited bucket has room above its reservation: no L-tokens anywhere.
        return Allocation { l: vec![0; r.len()], r, r_stats, l_stats: ClassStats::default(), l_solved: true };
    }
    let lp = Problem {
        inst,
        cap: inst.capacity.iter().zip(&load_r).map(|(&c, &l)| c.saturating_sub(l)).collect(),
        demand: inst.entry_demand.iter().zip(&r).map(|(&d, &a)| d - a).collect(),
        target: l_target,
    };
    let mut sl = Shifter::new(&lp, opts);
    sl.progressive_shifting();
    let l_stats = sl.stats;
    Allocation { r, l: std::mem::take(&mut sl.a), r_stats, l_stats, l_solved: true }
}

#[cfg(test)]
mod tests;
