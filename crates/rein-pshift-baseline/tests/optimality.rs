//! pShift is exact: its effective capacity Phi equals the maximum flow value on random instances (with
//! buckets active on 2-4 servers, many of them unable to meet every reservation), while conserving tokens
//! and holding no strong excess tokens; the approximate mode never beats the optimum and stays prudent;
//! the parallel mode gives the same allocation for any number of threads.

use proptest::prelude::*;
use rein_core::pshift::{solve, Allocation, Instance, InstanceBuilder, SolveOptions};
use rein_pshift_baseline::max_flow;
use rein_sim::model::pshift::gen::{generate, GenParams};

/// The L class as its own instance: residual capacity and demand after the R-tokens, target min(L, D) - A
/// as the "reservation". Its max flow is the best Phi the L-tokens can reach.
fn l_instance(inst: &Instance, sol: &Allocation) -> Instance {
    let mut load = vec![0u64; inst.servers()];
    for e in 0..inst.entries() {
        load[inst.entry_server(e)] += sol.r[e];
    }
    let mut b = InstanceBuilder::new();
    for (j, &r_load) in load.iter().enumerate() {
        b.add_server(inst.capacity(j).saturating_sub(r_load)).unwrap();
    }
    for i in 0..inst.buckets() {
        let d: Vec<(usize, u64)> =
            inst.bucket_entries(i).map(|e| (inst.entry_server(e), inst.entry_demand(e) - sol.r[e])).collect();
        let a = inst.reservation(i).min(inst.total_demand(i));
        let t = inst.limit(i).map_or(0, |l| l.min(inst.total_demand(i)) - a);
        b.add_bucket(t, None, &d).unwrap();
    }
    b.build().unwrap()
}

/// Everything the tests assert about one instance; returns (Phi, sum of A_i).
fn check_exact(inst: &Instance) -> (u64, u64) {
    let sol = solve(inst, &SolveOptions::default());
    // Token conservation (sum_j a_i^j = A_i) and no strong excess tokens (a_i^j <= d_i^j), both classes.
    sol.verify(inst).unwrap();
    let want: u64 = (0..inst.buckets()).map(|i| inst.reservation(i).min(inst.total_demand(i))).sum();
    assert_eq!(sol.r.iter().sum::<u64>(), want);
    let mf = max_flow(inst);
    assert_eq!(sol.phi(), mf, "pShift's Phi must equal the max-flow value");
    assert!(sol.phi() >= sol.r_stats.phi_initial, "Phi never decreases");
    // L-tokens are optimal on the residual problem too.
    assert_eq!(sol.l_stats.phi, max_flow(&l_instance(inst, &sol)), "L class");
    for m in [1, 3, 10] {
        let ap = solve(inst, &SolveOptions { approx_top: Some(m), ..Default::default() });
        ap.verify(inst).unwrap();
        assert!(ap.phi() <= mf, "approximation above the optimum");
    }
    (sol.phi(), want)
}

fn arb_instance() -> impl Strategy<Value = Instance> {
    (2usize..=10)
        .prop_flat_map(|servers| {
            let bucket = (
                0u64..=400,
                proptest::option::of(0u64..=200),
                proptest::sample::subsequence((0..servers).collect::<Vec<_>>(), 2.min(servers)..=4.min(servers)),
                proptest::collection::vec(0u64..=200, 4),
            );
            (proptest::collection::vec(0u64..=300, servers), proptest::collection::vec(bucket, 1..=40))
        })
        .prop_map(|(caps, buckets)| {
            let mut b = InstanceBuilder::new();
            for c in caps {
                b.add_server(c).unwrap();
            }
            for (r, extra, servers, demand) in buckets {
                let d: Vec<(usize, u64)> = servers.into_iter().zip(demand).collect();
                b.add_bucket(r, extra.map(|x| r + x), &d).unwrap();
            }
            b.build().unwrap()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn phi_equals_max_flow_on_random_instances(inst in arb_instance()) {
        check_exact(&inst);
    }
}

/// 600 of the paper's synthetic instances at small scale (4-16 servers, 10-200 buckets, 2-4 active
/// servers per bucket, r from 0.8 to 1.2, m from 1.0 to 1.5, half with limits).
#[test]
fn phi_equals_max_flow_on_600_synthetic_instances() {
    let mut short = 0;
    for seed in 0..600u64 {
        let servers = 4 + (seed % 13) as usize;
        let p = GenParams {
            servers,
            capacity: 1000,
            buckets: 10 + (seed * 7 % 191) as usize,
            reservation_zipf_s: [0.0, 0.5, 1.0][seed as usize % 3],
            reserved_fraction: [0.8, 1.0, 1.2][seed as usize / 3 % 3],
            demand_ratio: [1.0, 1.1, 1.5][seed as usize / 9 % 3],
            active_servers: 2 + (seed % 3) as usize,
            demand_zipf_s: 0.5,
            limit_ratio: (seed % 2 == 0).then_some(1.5),
            seed,
        };
        let (phi, want) = check_exact(&generate(&p).unwrap());
        short += (phi < want) as u32;
    }
    // The set includes plenty of instances where not every reservation can be met.
    assert!(short >= 200, "only {short} of 600 instances were short of their reservations");
}

/// The paper's scale: 64 servers, 1,000 buckets, N_A in {2, 4, 8}, and the 10,000-bucket stress case.
#[test]
fn phi_equals_max_flow_at_paper_scale() {
    for (k, na) in [2usize, 4, 8].into_iter().enumerate() {
        for r in [0.9, 1.0] {
            let p = GenParams {
                buckets: 1000,
                active_servers: na,
                reserved_fraction: r,
                seed: 100 + k as u64,
                ..Default::default()
            };
            check_exact(&generate(&p).unwrap());
        }
    }
    let inst = generate(&GenParams::default()).unwrap();
    let sol = solve(&inst, &SolveOptions::default());
    sol.verify(&inst).unwrap();
    assert_eq!(sol.phi(), max_flow(&inst));
}

/// Invariant 6: the same allocation (not only the same Phi) for 1, 2 and 4 threads.
#[test]
fn parallel_equals_sequential() {
    let insts = [
        generate(&GenParams { buckets: 3000, ..Default::default() }).unwrap(),
        generate(&GenParams {
            buckets: 500,
            active_servers: 3,
            limit_ratio: Some(1.5),
            servers: 16,
            ..Default::default()
        })
        .unwrap(),
    ];
    for inst in &insts {
        let seq = solve(inst, &SolveOptions::default());
        for threads in [1, 2, 4] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            for approx_top in [None, Some(100)] {
                let opts = SolveOptions { parallel: true, approx_top, ..Default::default() };
                let par = pool.install(|| solve(inst, &opts));
                let want = if approx_top.is_none() {
                    seq.clone()
                } else {
                    solve(inst, &SolveOptions { approx_top, ..Default::default() })
                };
                assert_eq!(par, want, "{threads} threads, top {approx_top:?}");
            }
        }
    }
}
