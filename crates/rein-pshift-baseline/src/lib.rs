//! # rein-pshift-baseline: pShift's exact baseline, token allocation as a maximum flow
//!
//! The bQueue formulation (pshift.txt §I, \[22\]) of the R-token problem: a flow network with a source, one
//! node per bucket, one per server and a sink; source -> bucket i with capacity A_i = min(R_i, D_i),
//! bucket i -> server j with capacity d_i^j, server j -> sink with capacity C^j. A flow is a prudent
//! allocation with every token consumed, and every prudent allocation's consumed tokens form a flow, so
//! the maximum flow value equals the best effective capacity Phi. pShift must reach it exactly
//! (`tests/optimality.rs`) and is benchmarked against it (`rein bench pshift`).
//!
//! Why a separate crate: the solver is a dependency (ac-library-rs, the Rust port of the AtCoder Library:
//! CC0, a plain Dinic over an adjacency array) that `rein-core` must not carry; only the tests, the
//! benchmark and `rein pshift solve` (which prints the max-flow value next to Phi) need it. Of the
//! maintained Rust max-flow implementations it was the fastest on the paper's stress instance (64 servers
//! x 10,000 buckets, 8 active servers each: about 25 ms, against about 330 ms for petgraph 0.8's `dinics`
//! on the same machine); GPL-licensed `rs_graph` was not an option for this Apache-2.0 project.

#![forbid(unsafe_code)]

use ac_library::MfGraph;
use rein_core::pshift::Instance;

/// The maximum flow value of the instance's R-token network: the optimal Phi.
pub fn max_flow(inst: &Instance) -> u64 {
    max_flow_allocation(inst).0
}

/// The maximum flow value and the flow on each (bucket, server) entry (a prudent allocation reaching it
/// where the server does not overflow; aligned with the instance's entries).
pub fn max_flow_allocation(inst: &Instance) -> (u64, Vec<u64>) {
    let (nb, ns) = (inst.buckets(), inst.servers());
    let (src, snk) = (0, 1);
    let bucket = |i: usize| 2 + i;
    let server = |j: usize| 2 + nb + j;
    let mut g = MfGraph::<u64>::new(2 + nb + ns);
    for i in 0..nb {
        let a = inst.reservation(i).min(inst.total_demand(i));
        if a > 0 {
            g.add_edge(src, bucket(i), a);
        }
    }
    let mut edge_of_entry = Vec::with_capacity(inst.entries());
    for i in 0..nb {
        for e in inst.bucket_entries(i) {
            edge_of_entry.push(g.add_edge(bucket(i), server(inst.entry_server(e)), inst.entry_demand(e)));
        }
    }
    for j in 0..ns {
        if inst.capacity(j) > 0 {
            g.add_edge(server(j), snk, inst.capacity(j));
        }
    }
    let value = g.flow(src, snk);
    let flow = edge_of_entry.iter().map(|&k| g.get_edge(k).flow).collect();
    (value, flow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_core::pshift::InstanceBuilder;

    #[test]
    fn example_3_max_flow_is_300() {
        let mut b = InstanceBuilder::new();
        for _ in 0..3 {
            b.add_server(100).unwrap();
        }
        b.add_bucket(100, None, &[(0, 150), (1, 50)]).unwrap();
        b.add_bucket(100, None, &[(1, 150), (2, 50)]).unwrap();
        b.add_bucket(100, None, &[(0, 50), (2, 50)]).unwrap();
        let inst = b.build().unwrap();
        let (v, f) = max_flow_allocation(&inst);
        assert_eq!(v, 300);
        assert_eq!(f.iter().sum::<u64>(), 300);
    }

    #[test]
    fn intrinsic_error_two_buckets_on_one_server() {
        // §IV-B Exp. 2's example: two buckets reserving 100 with demand only on one server of capacity 100.
        let mut b = InstanceBuilder::new();
        b.add_server(100).unwrap();
        b.add_server(100).unwrap();
        b.add_bucket(100, None, &[(0, 200)]).unwrap();
        b.add_bucket(100, None, &[(0, 200)]).unwrap();
        assert_eq!(max_flow(&b.build().unwrap()), 100);
    }
}
