//! A scenario's independent groups: the parts that can run apart and be put together again.
//!
//! # Model
//! Two tenants are in one group when they share a server, directly or through other tenants; a group
//! holds its tenants and every server they use; a server no tenant uses is a group of its own. A
//! scenario with PARDA hosts or a pShift cluster is one group: its hosts' latency aggregation and its
//! controller tie every server together.
//!
//! Nothing passes between groups in a run (each server's scheduler and device see only the tenants on
//! it), so a group run alone measures what it measures in the whole run. [`Scenario::part`] cuts a
//! scenario down to some of its groups, keeping each tenant's and server's random stream (their
//! `stream`), and rein-model's `RunTotals::join` puts the parts' totals together in the scenario's
//! order: for the simulator the joined totals equal the whole run's byte for byte (`tests/groups.rs`).
//!
//! # Why
//! A sweep that runs its points side by side (PARDA Fig. 5's 36 workloads, each on an array of its
//! own) asks a real cluster for all its points' rates at once; on a small machine the points then
//! share its CPUs, which the simulated arrays do not. `rein cluster run --groups-at-once N` runs N
//! groups at a time instead and joins the results, so the checks see the same totals.
//!
//! # Invariants
//! 1. The groups partition the tenants and the servers: each index is in exactly one group.
//! 2. Within a group, and in a part, tenants and servers keep the scenario's order.

use super::Scenario;

/// One independent group of a scenario ([`Scenario::groups`]): indices into its lists, ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Indices into `Scenario::tenants`.
    pub tenants: Vec<usize>,
    /// Indices into `Scenario::servers`.
    pub servers: Vec<usize>,
}

/// Root of `i` in a union-find forest, halving the path on the way.
fn root(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

impl Scenario {
    /// The scenario's independent groups (module comment), ordered by their first server.
    pub fn groups(&self) -> Vec<Group> {
        let n = self.servers.len();
        if self.pshift.is_some() || !self.hosts.is_empty() || n == 1 {
            return vec![Group { tenants: (0..self.tenants.len()).collect(), servers: (0..n).collect() }];
        }
        let mut parent: Vec<usize> = (0..n).collect();
        for t in &self.tenants {
            if let Some((&first, rest)) = t.servers.split_first() {
                for &s in rest {
                    let (a, b) = (root(&mut parent, first), root(&mut parent, s));
                    parent[a.max(b)] = a.min(b);
                }
            }
        }
        // Group k is the k-th distinct root met in server order.
        let mut slot = vec![usize::MAX; n];
        let mut groups: Vec<Group> = Vec::new();
        for s in 0..n {
            let r = root(&mut parent, s);
            if slot[r] == usize::MAX {
                slot[r] = groups.len();
                groups.push(Group { tenants: Vec::new(), servers: Vec::new() });
            }
            groups[slot[r]].servers.push(s);
        }
        for (i, t) in self.tenants.iter().enumerate() {
            // Validation gives every tenant at least one server.
            if let Some(&s) = t.servers.first() {
                let r = root(&mut parent, s);
                groups[slot[r]].tenants.push(i);
            }
        }
        groups
    }

    /// The scenario cut down to `groups`' tenants and servers, in the scenario's order, without its
    /// expectations (they are checked on the joined totals). Tenants and servers keep their random
    /// streams. The groups must be the scenario's own ([`Scenario::groups`]).
    pub fn part(&self, groups: &[&Group]) -> Scenario {
        let mut servers: Vec<usize> = groups.iter().flat_map(|g| g.servers.iter().copied()).collect();
        let mut tenants: Vec<usize> = groups.iter().flat_map(|g| g.tenants.iter().copied()).collect();
        servers.sort_unstable();
        tenants.sort_unstable();
        let mut sc = self.clone();
        sc.expect.clear();
        if servers.len() == self.servers.len() && tenants.len() == self.tenants.len() {
            return sc;
        }
        // Only scenarios without hosts or a pShift cluster have more than one group.
        assert!(sc.hosts.is_empty() && sc.pshift.is_none(), "a part of a scenario that is one group");
        let mut new_index = vec![usize::MAX; self.servers.len()];
        for (k, &s) in servers.iter().enumerate() {
            new_index[s] = k;
        }
        sc.servers = servers.iter().map(|&s| self.servers[s].clone()).collect();
        sc.tenants = tenants
            .iter()
            .map(|&i| {
                let mut t = self.tenants[i].clone();
                for s in &mut t.servers {
                    assert!(new_index[*s] != usize::MAX, "tenant {} uses a server outside its group", t.name);
                    *s = new_index[*s];
                }
                t
            })
            .collect();
        sc
    }
}

#[cfg(test)]
mod tests {
    use crate::{run, run_in_parts, RunTotals, Scenario};

    /// The scenario of `tests/groups.rs`, whose check that parts run apart and joined are the whole run this
    /// test shows can fail. (Here, not there: it edits a part's streams, which only this crate can.)
    const FIVE: &str = include_str!("../../tests/common/groups-five.toml");

    fn bytes(t: &RunTotals) -> (String, String) {
        (t.summary.to_json(), t.timeseries.to_csv())
    }

    /// Without the streams kept (each part's tenants and servers drawing by their index in the part) the
    /// joined run differs: the check of `tests/groups.rs` can fail.
    #[test]
    fn a_part_that_draws_by_its_own_indices_differs() {
        let sc = Scenario::from_toml(FIVE, None).unwrap();
        let whole = bytes(&run(&sc, &mut |_| {}).unwrap());
        let joined = run_in_parts(&sc, 1, |part, _, _| {
            let mut p = part.clone();
            p.tenants.iter_mut().enumerate().for_each(|(i, t)| t.stream = i as u64);
            p.servers.iter_mut().enumerate().for_each(|(i, s)| s.stream = i);
            run(&p, &mut |_| {})
        })
        .unwrap();
        assert_ne!(bytes(&joined), whole);
    }
}
