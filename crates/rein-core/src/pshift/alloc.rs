//! The allocation machinery of pShift (§III-B, §III-C): Algorithms 3-5 on one token class. The module
//! comment of [`super`] gives the model, the symbol map and the invariants; this file says how it is
//! built.
//!
//! # State (`Shifter`)
//! - `a[e]`: tokens a_i^j of entry e = (i, j) (CSR, aligned with the instance's entries);
//! - `load[j]`: sum_i a_i^j, every bucket included (participating or not);
//! - `tms[j * S + k]`: TMS_{j,k} = sum over participating buckets of min(a_i^j, d_i^k - a_i^k);
//! - per server j, the participating buckets active on j as (bucket, entry) sorted by bucket
//!   (`list[list_start[j]..list_start[j + 1]]`), so the buckets that can move tokens along an edge
//!   (j, k) are the merge-intersection of two sorted lists.
//!
//! `TM_{j,k}[i]` is never stored: it is non-zero only for buckets active on both j and k, and it changes
//! only for buckets whose allocation changed. A change of a_i^j changes `TM_{j,k}[i]` (a_i^j) and
//! `TM_{k,j}[i]` (the spare demand d_i^j - a_i^j) for the bucket's other servers k, so `Shifter::transfer`
//! (tokens of one bucket from one of its entries to another) updates exactly those 2(deg - 1) sums per
//! entry changed, with before/after deltas: a shift that moves tokens of n buckets along a path of length
//! l costs O(l * (|list_j| + |list_k|) + n * deg) instead of the paper's O(l * |S| * |B|).

use super::instance::Instance;
use super::SolveOptions;

/// Counters of one solve (one token class).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Phi right after the initial allocation (Alg. 3).
    pub phi_initial: u64,
    /// Phi after progressive shifting (Alg. 5).
    pub phi: u64,
    /// Shift paths used.
    pub shifts: u64,
    /// Tokens moved in all (Omega summed over shifts, counted once per path).
    pub tokens_shifted: u64,
    /// Longest shift path used (edges).
    pub longest_path: u32,
    /// Buckets that took part in shifting (all, or the top-M selection).
    pub participating: u32,
    /// Breadth-first searches run.
    pub searches: u64,
}

/// Apportions `target` tokens over `demand` in proportion (Alg. 3), in whole tokens: floors first, then one
/// more token to the entries with the largest remainders (ties: the earlier entry). Keeps
/// `out[k] <= demand[k]` (invariant 2) and `sum(out) == target` (invariant 1) whenever
/// `target <= sum(demand)`.
pub(crate) fn apportion(target: u64, demand: &[u64], out: &mut [u64], scratch: &mut Vec<(u64, usize)>) {
    debug_assert_eq!(demand.len(), out.len());
    // D_i <= MAX_SERVERS * MAX_TOKENS < 2^64.
    let total: u64 = demand.iter().sum();
    if target == 0 || total == 0 {
        out.fill(0);
        return;
    }
    assert!(target <= total, "apportion: target {target} above demand {total}");
    let mut given = 0u64;
    scratch.clear();
    for (k, (&d, o)) in demand.iter().zip(out.iter_mut()).enumerate() {
        // A_i * d_i^j in u64 when it fits (the common case), else u128; the remainder is < D_i either way.
        let (q, rem) = match target.checked_mul(d) {
            Some(prod) => (prod / total, prod % total),
            None => {
                let prod = target as u128 * d as u128;
                ((prod / total as u128) as u64, (prod % total as u128) as u64)
            }
        };
        *o = q;
        given += q;
        if rem > 0 {
            scratch.push((rem, k));
        }
    }
    let left = (target - given) as usize;
    // sum_k rem_k = left * D_i and every rem_k < D_i, so at least `left` entries have a remainder.
    debug_assert!(scratch.len() >= left);
    if left == 0 {
        return;
    }
    if left < scratch.len() && left > 16 {
        scratch.sort_unstable_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
    } else if left < scratch.len() {
        // Few tokens left (a bucket's server count bounds it): select the largest remainders one by one
        // rather than sort (`scratch` is in entry order, so the first maximum is the lower index).
        for n in 0..left {
            let mut best = n;
            for x in n + 1..scratch.len() {
                if scratch[x].0 > scratch[best].0 || (scratch[x].0 == scratch[best].0 && scratch[x].1 < scratch[best].1)
                {
                    best = x;
                }
            }
            scratch.swap(n, best);
        }
    }
    for &(_, k) in &scratch[..left] {
        out[k] += 1;
        // A remainder > 0 means A_i d / D_i is not whole, so its floor is < d.
        debug_assert!(out[k] <= demand[k], "invariant 2");
    }
}

/// Phi = sum_j min(C^j, load^j) for a prudent allocation.
pub(crate) fn phi_of(cap: &[u64], load: &[u64]) -> u64 {
    cap.iter().zip(load).map(|(&c, &l)| c.min(l)).sum()
}

/// One token class's problem: capacities, per-entry demand, per-bucket targets A_i, on the instance's CSR.
pub(crate) struct Problem<'a> {
    pub(crate) inst: &'a Instance,
    pub(crate) cap: Vec<u64>,
    pub(crate) demand: Vec<u64>,
    pub(crate) target: Vec<u64>,
}

/// The allocation of one class, progressively shifted. See the module comment.
pub(crate) struct Shifter<'p> {
    s: usize,
    #[cfg(test)]
    problem: &'p Problem<'p>,
    /// Tests: recompute every sum after every shift.
    #[cfg(test)]
    pub(crate) audit: bool,
    bucket_start: &'p [usize],
    entry_server: &'p [u32],
    demand: &'p [u64],
    cap: &'p [u64],
    pub(crate) a: Vec<u64>,
    pub(crate) load: Vec<u64>,
    tms: Vec<u64>,
    list_start: Vec<usize>,
    list: Vec<(u32, u32)>,
    /// With at most 64 servers: for each `list` entry, its bucket's server bitmask (else empty). Kept
    /// beside the list so that finding the buckets of an edge is a sequential scan.
    list_mask: Vec<u64>,
    pub(crate) stats: ClassStats,
    // BFS scratch.
    dist: Vec<u32>,
    parent: Vec<u32>,
    queue: Vec<u32>,
}

/// What a breadth-first search from an overloaded server found.
enum Search {
    /// A shortest shift path P = `path[0]` -> ... -> `path[l]` = Q, Q underloaded.
    Found(Vec<u32>),
    /// The nearest underloaded server is this many edges away, more than allowed now.
    Farther(u32),
    /// No underloaded server is reachable.
    Unreachable,
}

impl<'p> Shifter<'p> {
    /// Alg. 3 and Alg. 4: the initial prudent allocation, the loads and the token movement sums.
    pub(crate) fn new(p: &'p Problem<'p>, opts: &SolveOptions) -> Shifter<'p> {
        let inst = p.inst;
        let s = inst.servers();
        let part = participants(p, opts.approx_top, opts.approx_per_server);
        let mut a = vec![0u64; inst.entries()];
        let (load, tms) = init_chunks(p, &part, &mut a, opts.parallel);
        // Per-server lists of participating (bucket, entry), by bucket: a counting sort by server.
        let mut count = vec![0usize; s + 1];
        let mut participating = 0u32;
        for (i, _) in part.iter().enumerate().filter(|&(_, &p)| p) {
            participating += 1;
            for e in inst.bucket_entries(i) {
                count[inst.entry_server[e] as usize + 1] += 1;
            }
        }
        for j in 0..s {
            count[j + 1] += count[j];
        }
        let list_start = count.clone();
        let mut fill = count;
        let mut list = vec![(0u32, 0u32); list_start[s]];
        let small = s <= 64;
        let mut list_mask = if small { vec![0u64; list_start[s]] } else { Vec::new() };
        for (i, _) in part.iter().enumerate().filter(|&(_, &p)| p) {
            let r = inst.bucket_entries(i);
            let mask = if small { inst.entry_server[r.clone()].iter().fold(0u64, |m, &j| m | 1 << j) } else { 0 };
            for e in r {
                let j = inst.entry_server[e] as usize;
                list[fill[j]] = (i as u32, e as u32);
                if small {
                    list_mask[fill[j]] = mask;
                }
                fill[j] += 1;
            }
        }
        let phi = phi_of(&p.cap, &load);
        Shifter {
            s,
            #[cfg(test)]
            problem: p,
            #[cfg(test)]
            audit: false,
            bucket_start: &inst.bucket_start,
            entry_server: &inst.entry_server,
            demand: &p.demand,
            cap: &p.cap,
            a,
            load,
            tms,
            list_start,
            list,
            list_mask,
            stats: ClassStats { phi_initial: phi, phi, participating, ..ClassStats::default() },
            dist: vec![u32::MAX; s],
            parent: vec![u32::MAX; s],
            queue: Vec::with_capacity(s),
        }
    }

    #[cfg(test)]
    pub(crate) fn tms(&self, j: usize, k: usize) -> u64 {
        self.tms[j * self.s + k]
    }

    /// Alg. 5: shift along breadth-first shift paths, shortest first, until no overloaded server has a
    /// path to an underloaded one.
    pub(crate) fn progressive_shifting(&mut self) {
        let s = self.s;
        if s < 2 {
            return;
        }
        // `stuck[P]`: no underloaded server is reachable from P. It stays so: an augmentation between
        // other servers cannot create a path out of P's reachable set (a path entering that set could
        // only reach servers inside it), so P is never searched again.
        let mut stuck = vec![false; s];
        let mut l: u32 = 1;
        loop {
            let mut next_l = u32::MAX;
            let mut open = false;
            for (p, stuck_p) in stuck.iter_mut().enumerate() {
                if *stuck_p {
                    continue;
                }
                while self.load[p] > self.cap[p] {
                    match self.search(p, l) {
                        Search::Found(path) => self.shift(&path),
                        Search::Farther(d) => {
                            next_l = next_l.min(d);
                            open = true;
                            break;
                        }
                        Search::Unreachable => {
                            *stuck_p = true;
                            break;
                        }
                    }
                }
            }
            if !open {
                break;
            }
            // Every open server's nearest sink is at least `next_l` away: no level below it finds anything.
            l = (l + 1).max(next_l);
        }
        self.stats.phi = phi_of(self.cap, &self.load);
    }

    fn search(&mut self, p: usize, limit: u32) -> Search {
        self.stats.searches += 1;
        let s = self.s;
        self.dist.fill(u32::MAX);
        self.queue.clear();
        self.dist[p] = 0;
        self.queue.push(p as u32);
        let mut head = 0;
        if s <= 64 {
            // Up to 64 servers: a row's edges as a bitmask (a branch-free pass the compiler vectorises),
            // then only the unvisited successors, in index order.
            let mut seen: u64 = 1 << p;
            while head < self.queue.len() {
                let u = self.queue[head] as usize;
                head += 1;
                let du = self.dist[u];
                let row = &self.tms[u * s..(u + 1) * s];
                let mut out = row.iter().enumerate().fold(0u64, |m, (k, &w)| m | (((w > 0) as u64) << k)) & !seen;
                seen |= out;
                while out != 0 {
                    let k = out.trailing_zeros() as usize;
                    out &= out - 1;
                    self.dist[k] = du + 1;
                    self.parent[k] = u as u32;
                    if self.load[k] < self.cap[k] {
                        return self.found(p, k, du + 1, limit);
                    }
                    self.queue.push(k as u32);
                }
            }
            return Search::Unreachable;
        }
        while head < self.queue.len() {
            let u = self.queue[head] as usize;
            head += 1;
            let du = self.dist[u];
            let row = &self.tms[u * s..(u + 1) * s];
            for (k, &w) in row.iter().enumerate() {
                if w == 0 || self.dist[k] != u32::MAX {
                    continue;
                }
                self.dist[k] = du + 1;
                self.parent[k] = u as u32;
                if self.load[k] < self.cap[k] {
                    return self.found(p, k, du + 1, limit);
                }
                self.queue.push(k as u32);
            }
        }
        Search::Unreachable
    }

    /// The path to the underloaded server k reached at distance d, or how far it is.
    fn found(&self, p: usize, k: usize, d: u32, limit: u32) -> Search {
        if d > limit {
            return Search::Farther(d);
        }
        let mut path = vec![k as u32];
        let mut x = k;
        while x != p {
            x = self.parent[x] as usize;
            path.push(x as u32);
        }
        path.reverse();
        Search::Found(path)
    }

    /// Moves Omega = min(gamma^P, delta^Q, min edge weight) tokens along `path` (Alg. 5's inner loop).
    fn shift(&mut self, path: &[u32]) {
        let s = self.s;
        let (p, q) = (path[0] as usize, path[path.len() - 1] as usize);
        let mut omega = (self.load[p] - self.cap[p]).min(self.cap[q] - self.load[q]);
        for w in path.windows(2) {
            omega = omega.min(self.tms[w[0] as usize * s + w[1] as usize]);
        }
        debug_assert!(omega > 0, "a shift path has positive edges and endpoints");
        let phi_before = if cfg!(debug_assertions) { phi_of(self.cap, &self.load) } else { 0 };
        let middle: Vec<u64> = if cfg!(debug_assertions) {
            path[1..path.len() - 1].iter().map(|&u| self.load[u as usize]).collect()
        } else {
            Vec::new()
        };
        for w in path.windows(2) {
            self.move_edge(w[0] as usize, w[1] as usize, omega);
        }
        if cfg!(debug_assertions) {
            // Invariant 5: brokers keep their load; invariant 3: Phi rises by exactly Omega.
            for (k, &u) in path[1..path.len() - 1].iter().enumerate() {
                debug_assert_eq!(self.load[u as usize], middle[k], "invariant 5");
            }
            debug_assert_eq!(phi_of(self.cap, &self.load), phi_before + omega, "invariant 3");
        }
        #[cfg(test)]
        if self.audit {
            self.check();
        }
        self.stats.shifts += 1;
        self.stats.tokens_shifted += omega;
        self.stats.longest_path = self.stats.longest_path.max(path.len() as u32 - 1);
    }

    /// Moves `amount` tokens from server u to server v in prudent transfers: buckets active on both, in
    /// bucket order, each moving min(left, a_i^u, d_i^v - a_i^v). Walks u's list and finds v among each
    /// bucket's servers through its server bitmask (up to 64 servers) or a scan of its few entries (a
    /// merge with v's list would mispredict a branch on nearly every step).
    fn move_edge(&mut self, u: usize, v: usize, amount: u64) {
        let mut left = amount;
        for x in self.list_start[u]..self.list_start[u + 1] {
            let (i, eu) = self.list[x];
            let (i, eu) = (i as usize, eu as usize);
            // Membership first, from data read in order (the allocations are scattered).
            let ev = if self.list_mask.is_empty() {
                let (b0, b1) = (self.bucket_start[i], self.bucket_start[i + 1]);
                match self.entry_server[b0..b1].iter().position(|&j| j as usize == v) {
                    Some(k) => b0 + k,
                    None => continue,
                }
            } else {
                let mask = self.list_mask[x];
                if mask >> v & 1 == 0 {
                    continue;
                }
                // Entries are sorted by server: an entry's rank in its bucket is the number of the
                // bucket's servers below it, so v's entry is eu - rank(u) + rank(v).
                let below = |j: usize| (mask & ((1u64 << j) - 1)).count_ones() as usize;
                eu - below(u) + below(v)
            };
            let give = self.a[eu];
            let m = left.min(give).min(self.demand[ev] - self.a[ev]);
            if m == 0 {
                continue;
            }
            self.transfer(i, eu, ev, m);
            left -= m;
            if left == 0 {
                break;
            }
        }
        // Invariant 4 (TMS exact) guarantees the edge carries what its weight says.
        assert_eq!(left, 0, "invariant 4: TMS_{{{u},{v}}} promised {amount} tokens");
        self.load[u] -= amount;
        self.load[v] += amount;
    }

    /// Moves m tokens of bucket i from entry eu (server u) to entry ev (server v) and updates the token
    /// movement sums of every pair it touches, in one pass over the bucket's entries: for each other server
    /// k, TM_{u,k} and TM_{v,k} (tokens changed) and TM_{k,u} and TM_{k,v} (spare demand changed); and
    /// TM_{u,v}, TM_{v,u}.
    fn transfer(&mut self, i: usize, eu: usize, ev: usize, m: u64) {
        let s = self.s;
        let (u, v) = (self.entry_server[eu] as usize, self.entry_server[ev] as usize);
        let (au, av) = (self.a[eu], self.a[ev]);
        let (su, sv) = (self.demand[eu] - au, self.demand[ev] - av);
        debug_assert!(m <= au && m <= sv, "invariant 2");
        let (au2, av2, su2, sv2) = (au - m, av + m, su + m, sv - m);
        for f in self.bucket_start[i]..self.bucket_start[i + 1] {
            if f == eu || f == ev {
                continue;
            }
            let k = self.entry_server[f] as usize;
            let af = self.a[f];
            let sf = self.demand[f] - af;
            let t = &mut self.tms;
            t[u * s + k] = t[u * s + k] + au2.min(sf) - au.min(sf);
            t[v * s + k] = t[v * s + k] + av2.min(sf) - av.min(sf);
            t[k * s + u] = t[k * s + u] + af.min(su2) - af.min(su);
            t[k * s + v] = t[k * s + v] + af.min(sv2) - af.min(sv);
        }
        let t = &mut self.tms;
        t[u * s + v] = t[u * s + v] + au2.min(sv2) - au.min(sv);
        t[v * s + u] = t[v * s + u] + av2.min(su2) - av.min(su);
        self.a[eu] = au2;
        self.a[ev] = av2;
    }

    /// Recomputes every sum from scratch and compares (tests; O(entries * deg)).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let p = self.problem;
        let inst = p.inst;
        let mut load = vec![0u64; self.s];
        for i in 0..inst.buckets() {
            let r = inst.bucket_entries(i);
            assert_eq!(self.a[r.clone()].iter().sum::<u64>(), p.target[i], "invariant 1, bucket {i}");
            for e in r {
                assert!(self.a[e] <= p.demand[e], "invariant 2");
                load[inst.entry_server[e] as usize] += self.a[e];
            }
        }
        assert_eq!(load, self.load);
        let mut tms = vec![0u64; self.s * self.s];
        for i in 0..inst.buckets() {
            if !self.list[..].iter().any(|&(b, _)| b as usize == i) {
                continue;
            }
            add_pairs(inst, &p.demand, &self.a, i, self.s, &mut tms);
        }
        assert_eq!(tms, self.tms, "invariant 4");
    }
}

/// Adds bucket i's TM contributions to `tms` (the from-scratch check).
#[cfg(test)]
fn add_pairs(inst: &Instance, demand: &[u64], a: &[u64], i: usize, s: usize, tms: &mut [u64]) {
    let r = inst.bucket_entries(i);
    for e1 in r.clone() {
        let a1 = a[e1];
        if a1 == 0 {
            continue;
        }
        let row = inst.entry_server[e1] as usize * s;
        for e2 in r.clone() {
            let spare = demand[e2] - a[e2];
            if e2 != e1 && spare > 0 {
                tms[row + inst.entry_server[e2] as usize] += a1.min(spare);
            }
        }
    }
}

/// Which buckets take part in shifting: all, or (§III-C) the top M by tokens A_i together with the top M
/// by spare demand D_i - A_i (ties broken by index, so the choice is deterministic); with `per_server`,
/// the buckets of each server's top M entries by demand.
fn participants(p: &Problem<'_>, approx_top: Option<usize>, per_server: bool) -> Vec<bool> {
    let nb = p.inst.buckets();
    let all = || p.target.iter().map(|&t| t > 0).collect();
    if per_server {
        return match approx_top {
            Some(m) => participants_per_server(p, m),
            None => all(),
        };
    }
    // A bucket without tokens has TM_{j,k}[i] = min(0, ..) = 0 everywhere: it never moves.
    let Some(m) = approx_top.filter(|&m| m < nb) else { return all() };
    let mut part = vec![false; nb];
    let spare: Vec<u64> =
        (0..nb).map(|i| p.demand[p.inst.bucket_entries(i)].iter().sum::<u64>() - p.target[i]).collect();
    for key in [&p.target, &spare] {
        let mut idx: Vec<u32> = (0..nb as u32).collect();
        if m > 0 {
            idx.select_nth_unstable_by(m - 1, |&x, &y| key[y as usize].cmp(&key[x as usize]).then(x.cmp(&y)));
            for &i in &idx[..m] {
                part[i as usize] = p.target[i as usize] > 0;
            }
        }
    }
    part
}

/// The per-server reading of §III-C: each server's top `m` entries by demand (ties by bucket index).
fn participants_per_server(p: &Problem<'_>, m: usize) -> Vec<bool> {
    let inst = p.inst;
    let mut by_server: Vec<Vec<(u64, u32)>> = vec![Vec::new(); inst.servers()];
    for i in 0..inst.buckets() {
        if p.target[i] == 0 {
            continue;
        }
        for e in inst.bucket_entries(i) {
            by_server[inst.entry_server[e] as usize].push((p.demand[e], i as u32));
        }
    }
    let mut part = vec![false; inst.buckets()];
    for list in &mut by_server {
        if m == 0 {
            break;
        }
        if list.len() > m {
            list.select_nth_unstable_by(m - 1, |x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
            list.truncate(m);
        }
        for &(_, i) in list.iter() {
            part[i as usize] = true;
        }
    }
    part
}

/// Alg. 3 over buckets `b0..b1` into `a` (that range's entries), returning partial loads and TMS.
fn init_range(p: &Problem<'_>, part: &[bool], b0: usize, b1: usize, a: &mut [u64]) -> (Vec<u64>, Vec<u64>) {
    let inst = p.inst;
    let s = inst.servers();
    let base = inst.bucket_start[b0];
    let mut load = vec![0u64; s];
    let mut tms = vec![0u64; s * s];
    let mut scratch = Vec::new();
    let mut spare = Vec::new();
    for (i, &participates) in (b0..b1).zip(&part[b0..b1]) {
        let r = inst.bucket_entries(i);
        let (lo, hi) = (r.start - base, r.end - base);
        apportion(p.target[i], &p.demand[r.clone()], &mut a[lo..hi], &mut scratch);
        for (k, e) in r.clone().enumerate() {
            load[inst.entry_server[e] as usize] += a[lo + k];
        }
        if participates {
            let srv = &inst.entry_server[r.clone()];
            let al = &a[lo..hi];
            spare.clear();
            spare.extend(p.demand[r.clone()].iter().zip(al).map(|(&d, &x)| d - x));
            for (k1, &a1) in al.iter().enumerate() {
                if a1 == 0 {
                    continue;
                }
                let row = &mut tms[srv[k1] as usize * s..][..s];
                for (k2, (&sp, &j2)) in spare.iter().zip(srv).enumerate() {
                    if k2 != k1 {
                        row[j2 as usize] += a1.min(sp);
                    }
                }
            }
        }
    }
    (load, tms)
}

#[cfg(feature = "parallel")]
fn add_into(acc: &mut (Vec<u64>, Vec<u64>), x: (Vec<u64>, Vec<u64>)) {
    for (a, b) in acc.0.iter_mut().zip(x.0) {
        *a += b;
    }
    for (a, b) in acc.1.iter_mut().zip(x.1) {
        *a += b;
    }
}

/// Alg. 3 + Alg. 4 over all buckets, on rayon's current pool when `parallel` (feature `parallel`). The
/// chunks are disjoint bucket ranges and the sums are integer additions, so the result does not depend on
/// the number of threads (invariant 6).
fn init_chunks(p: &Problem<'_>, part: &[bool], a: &mut [u64], parallel: bool) -> (Vec<u64>, Vec<u64>) {
    let nb = p.inst.buckets();
    #[cfg(feature = "parallel")]
    if parallel && nb >= 2 && rayon::current_num_threads() > 1 {
        use rayon::prelude::*;
        let chunks = rayon::current_num_threads().min(nb);
        let bounds: Vec<usize> = (0..=chunks).map(|c| c * nb / chunks).collect();
        // Split `a` at the chunks' entry boundaries.
        let mut slices = Vec::with_capacity(chunks);
        let mut rest = a;
        let mut at = 0;
        for c in 0..chunks {
            let end = p.inst.bucket_start[bounds[c + 1]];
            let (head, tail) = rest.split_at_mut(end - at);
            slices.push((bounds[c], bounds[c + 1], head));
            rest = tail;
            at = end;
        }
        return slices
            .into_par_iter()
            .map(|(b0, b1, slice)| init_range(p, part, b0, b1, slice))
            .reduce_with(|mut acc, x| {
                add_into(&mut acc, x);
                acc
            })
            .expect("at least one chunk");
    }
    let _ = parallel;
    init_range(p, part, 0, nb, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apportion_is_proportional_whole_and_prudent() {
        let mut out = [0u64; 3];
        let mut sc = Vec::new();
        apportion(100, &[150, 50, 0], &mut out, &mut sc);
        assert_eq!(out, [75, 25, 0]);
        apportion(10, &[10, 10, 10], &mut out, &mut sc);
        assert_eq!(out, [4, 3, 3], "largest remainder, ties to the earlier entry");
        apportion(3, &[1, 1, 1], &mut out, &mut sc);
        assert_eq!(out, [1, 1, 1], "A = D: every token where the demand is");
        apportion(0, &[5, 5, 5], &mut out, &mut sc);
        assert_eq!(out, [0, 0, 0]);
        let mut big = [0u64; 2];
        apportion(super::super::MAX_TOKENS, &[super::super::MAX_TOKENS, super::super::MAX_TOKENS], &mut big, &mut sc);
        assert_eq!(big, [super::super::MAX_TOKENS / 2; 2], "no overflow at the bound (u128 products)");
    }
}
