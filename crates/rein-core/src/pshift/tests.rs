//! The paper's Examples 1-3 (Tables I-III) exactly, the solver's invariants audited after every shift
//! on random instances, and its solutions verified on extreme ones. Optimality against the max-flow value
//! is tested in `rein-pshift-baseline`.

use super::alloc::{Problem, Shifter};
use super::*;

/// Table I (Examples 1 and 2): two servers of capacity 100; red and blue reserve 100 each.
fn table_1() -> Instance {
    let mut b = InstanceBuilder::new();
    b.add_server(100).unwrap();
    b.add_server(100).unwrap();
    b.add_bucket(100, None, &[(0, 150), (1, 50)]).unwrap(); // red
    b.add_bucket(100, None, &[(0, 50), (1, 50)]).unwrap(); // blue
    b.build().unwrap()
}

/// Table II (Example 3): three servers of capacity 100; red, blue, green reserve 100 each.
fn table_2() -> Instance {
    let mut b = InstanceBuilder::new();
    for _ in 0..3 {
        b.add_server(100).unwrap();
    }
    b.add_bucket(100, None, &[(0, 150), (1, 50)]).unwrap(); // red
    b.add_bucket(100, None, &[(1, 150), (2, 50)]).unwrap(); // blue
    b.add_bucket(100, None, &[(0, 50), (2, 50)]).unwrap(); // green
    b.build().unwrap()
}

/// Per bucket, tokens on each server (dense) for comparing with the tables.
fn dense(inst: &Instance, a: &[u64]) -> Vec<Vec<u64>> {
    (0..inst.buckets())
        .map(|i| (0..inst.servers()).map(|j| inst.find_entry(i, j).map_or(0, |e| a[e])).collect())
        .collect()
}

fn r_problem(inst: &Instance) -> Problem<'_> {
    Problem { inst, cap: inst.capacity.clone(), demand: inst.entry_demand.clone(), target: r_targets(inst) }
}

#[test]
fn example_1_initial_allocation_and_phi() {
    let inst = table_1();
    let a = initial_allocation(&inst);
    // Table I: red 75 / 25, blue 50 / 50.
    assert_eq!(dense(&inst, &a), vec![vec![75, 25], vec![50, 50]]);
    // "The effective system capacity of the configuration is 175": server 1 min(100, 125) = 100, server 2
    // min(100, 75) = 75.
    assert_eq!(phi(&inst, &a), 175);
}

#[test]
fn example_2_direct_transfer_of_25_red_tokens() {
    let inst = table_1();
    let a = initial_allocation(&inst);
    // Server 1 can donate 75 red tokens, server 2 has a spare demand of 25 red: TM_{1,2} = [25, 0].
    assert_eq!(token_movement(&inst, &a, 0, 1), (vec![25, 0], 25));
    let sol = solve(&inst, &SolveOptions::default());
    // "25 red tokens can be transferred from server 1 to 2 ... Phi increases to 200."
    assert_eq!(dense(&inst, &sol.r), vec![vec![50, 50], vec![50, 50]]);
    assert_eq!((sol.r_stats.phi_initial, sol.phi()), (175, 200));
    assert_eq!((sol.r_stats.shifts, sol.r_stats.tokens_shifted, sol.r_stats.longest_path), (1, 25, 1));
    sol.verify(&inst).unwrap();
}

#[test]
fn example_3_table_2_and_table_3() {
    let inst = table_2();
    let a = initial_allocation(&inst);
    // Table II.
    assert_eq!(dense(&inst, &a), vec![vec![75, 25, 0], vec![0, 75, 25], vec![50, 0, 50]]);
    // Server 1 overloaded (125), server 2 full (100), server 3 underloaded (75): Phi = 275.
    assert_eq!(phi(&inst, &a), 275);
    // Table III: TM_{j,k} / TMS_{j,k} (rows j, columns k; servers 1-3 are 0-2 here).
    let table_3 = [
        [None, Some(([25, 0, 0], 25)), Some(([0, 0, 0], 0))],
        [Some(([25, 0, 0], 25)), None, Some(([0, 25, 0], 25))],
        [Some(([0, 0, 0], 0)), Some(([0, 25, 0], 25)), None],
    ];
    for (j, row) in table_3.iter().enumerate() {
        for (k, cell) in row.iter().enumerate() {
            if let Some((tm, tms)) = cell {
                assert_eq!(token_movement(&inst, &a, j, k), (tm.to_vec(), *tms), "TM_{{{},{}}}", j + 1, k + 1);
            }
        }
    }
    // The solver's incremental sums agree with Table III before any shift.
    let p = r_problem(&inst);
    let sh = Shifter::new(&p, &SolveOptions::default());
    for j in 0..3 {
        for k in 0..3 {
            if j != k {
                assert_eq!(sh.tms(j, k), token_movement(&inst, &a, j, k).1);
            }
        }
    }
    // No direct transfer from 1 to 3; the brokered path 1 -> 2 -> 3 moves 25 red tokens to server 2 and
    // 25 blue tokens to server 3: every reservation is met and Phi = 300.
    let sol = solve(&inst, &SolveOptions::default());
    assert_eq!(dense(&inst, &sol.r), vec![vec![50, 50, 0], vec![0, 50, 50], vec![50, 0, 50]]);
    assert_eq!((sol.r_stats.phi_initial, sol.phi()), (275, 300));
    assert_eq!((sol.r_stats.shifts, sol.r_stats.longest_path), (1, 2));
    sol.verify(&inst).unwrap();
}

#[test]
fn limits_get_l_tokens_on_the_residual_demand_and_capacity() {
    // Table I with limits: red may do 150, blue 120. After the R-tokens (50/50 each) servers are full, so
    // L-tokens go where there is residual demand: red 50 (of its 100 spare on server 1), blue 0 spare.
    let mut b = InstanceBuilder::new();
    b.add_server(100).unwrap();
    b.add_server(150).unwrap();
    b.add_bucket(100, Some(150), &[(0, 150), (1, 50)]).unwrap();
    b.add_bucket(100, Some(120), &[(0, 50), (1, 100)]).unwrap();
    b.add_bucket(10, None, &[(1, 40)]).unwrap();
    let inst = b.build().unwrap();
    let sol = solve(&inst, &SolveOptions::default());
    sol.verify(&inst).unwrap();
    // R: red 100, blue 100, third 10 = 210 tokens on 250 capacity, all met.
    assert_eq!(sol.phi(), 210);
    let l: Vec<u64> = (0..3).map(|i| sol.l[inst.bucket_entries(i)].iter().sum()).collect();
    assert_eq!(l, vec![50, 20, 0], "L_i - R_i where demand allows; none for the unlimited bucket");
    // R after one shift: red 67 / 33, blue 33 / 67, third 10 on server 1; server 0 is full, server 1 has
    // 40 left. L-tokens can use only 17 red (its residual demand on server 1) and 20 blue there: Phi_L =
    // 37, and red keeps its other 33 L-tokens on server 0 (weak excess; prudent, conserved).
    assert_eq!(sol.r, vec![67, 33, 33, 67, 10]);
    assert_eq!(sol.l, vec![33, 17, 0, 20, 0]);
    assert_eq!((sol.l_stats.phi_initial, sol.l_stats.phi), (21, 37));
    let none = solve(&inst, &SolveOptions { reservations_only: true, ..Default::default() });
    assert!(none.l.iter().all(|&x| x == 0) && !none.l_solved);
    none.verify(&inst).unwrap();
}

#[test]
fn demand_below_reservation_caps_the_target() {
    // R = 100 but D = 30: A = 30, all of it allocated where the demand is (§III-A "we temporarily set
    // R_i = D_i").
    let mut b = InstanceBuilder::new();
    b.add_server(10).unwrap();
    b.add_server(100).unwrap();
    b.add_bucket(100, None, &[(0, 20), (1, 10)]).unwrap();
    let inst = b.build().unwrap();
    let sol = solve(&inst, &SolveOptions::default());
    sol.verify(&inst).unwrap();
    assert_eq!(sol.r.iter().sum::<u64>(), 30);
    assert_eq!(sol.phi(), 20, "server 0 can do only 10 of its 20");
}

/// A small deterministic generator (tests only): splitmix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_instance(seed: u64, servers: usize, buckets: usize, max_active: usize) -> Instance {
    let mut g = Rng(seed);
    let mut b = InstanceBuilder::new();
    for _ in 0..servers {
        b.add_server(50 + g.below(200)).unwrap();
    }
    for _ in 0..buckets {
        let n = 1 + g.below(max_active as u64) as usize;
        let mut d = Vec::new();
        for _ in 0..n {
            let j = g.below(servers as u64) as usize;
            if !d.iter().any(|&(x, _)| x == j) {
                d.push((j, g.below(120)));
            }
        }
        let r = g.below(150);
        let l = (g.below(3) > 0).then(|| r + g.below(100));
        b.add_bucket(r, l, &d).unwrap();
    }
    b.build().unwrap()
}

#[test]
fn invariants_hold_after_every_shift_on_random_instances() {
    for seed in 0..200u64 {
        let servers = 2 + (seed % 9) as usize;
        let inst = random_instance(seed, servers, 5 + (seed % 30) as usize, 1 + (seed % 4) as usize);
        let p = r_problem(&inst);
        let mut sh = Shifter::new(&p, &SolveOptions::default());
        sh.check();
        sh.audit = true;
        let before = sh.stats.phi;
        sh.progressive_shifting();
        sh.check();
        assert!(sh.stats.phi >= before, "invariant 3");
        assert_eq!(sh.stats.phi, phi(&inst, &sh.a));
        let sol = solve(&inst, &SolveOptions::default());
        sol.verify(&inst).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(sol.r, sh.a, "deterministic");
        // Approximation never beats the exact result and stays prudent and conserving.
        for m in [0, 1, 3] {
            let ap = solve(&inst, &SolveOptions { approx_top: Some(m), ..Default::default() });
            ap.verify(&inst).unwrap_or_else(|e| panic!("seed {seed} top {m}: {e}"));
            assert!(ap.phi() <= sol.phi() && ap.phi() >= ap.r_stats.phi_initial);
            let per = SolveOptions { approx_top: Some(m), approx_per_server: true, ..Default::default() };
            let ap = solve(&inst, &per);
            ap.verify(&inst).unwrap_or_else(|e| panic!("seed {seed} top {m} per server: {e}"));
            assert!(ap.phi() <= sol.phi() && ap.phi() >= ap.r_stats.phi_initial);
        }
        // Per server, an M at least every server's bucket count lets every bucket take part: exact.
        let all = SolveOptions { approx_top: Some(inst.buckets()), approx_per_server: true, ..Default::default() };
        assert_eq!(solve(&inst, &all), sol, "seed {seed}: per-server top M with M >= buckets is exact");
    }
}

#[test]
fn one_server_and_empty_instances_are_trivial() {
    let mut b = InstanceBuilder::new();
    b.add_server(5).unwrap();
    b.add_bucket(10, Some(20), &[(0, 30)]).unwrap();
    let inst = b.build().unwrap();
    let sol = solve(&inst, &SolveOptions::default());
    assert_eq!((sol.r.clone(), sol.l.clone(), sol.phi()), (vec![10], vec![10], 5));
    let mut b = InstanceBuilder::new();
    b.add_server(5).unwrap();
    let inst = b.build().unwrap();
    let sol = solve(&inst, &SolveOptions::default());
    assert_eq!((sol.r.len(), sol.phi()), (0, 0));
    assert!(InstanceBuilder::new().build().is_err(), "no servers");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 1000, ..Default::default() })]
    /// Review 1's fuzz: degenerate and extreme instances (capacities, reservations, limits and demands of
    /// 0, 1 and `MAX_TOKENS`, buckets without demand, one server) under every solve option; every
    /// solution passes `verify`.
    #[test]
    fn solutions_verify_on_extreme_instances(
        caps in proptest::collection::vec(extreme_tokens(), 1..6),
        buckets in proptest::collection::vec(
            (
                extreme_tokens(),
                proptest::option::of(extreme_tokens()),
                proptest::collection::vec((0usize..6, extreme_tokens()), 0..6),
            ),
            0..8,
        ),
        approx_top in proptest::option::of(0usize..4),
        approx_per_server: bool,
        reservations_only: bool,
    ) {
        let mut b = InstanceBuilder::new();
        for &c in &caps {
            b.add_server(c).unwrap();
        }
        for (r, l, demand) in buckets {
            let mut seen = std::collections::BTreeSet::new();
            let demand: Vec<(usize, u64)> =
                demand.into_iter().filter(|&(j, _)| j < caps.len() && seen.insert(j)).collect();
            b.add_bucket(r, l.map(|l| l.max(r)), &demand).unwrap();
        }
        let inst = b.build().unwrap();
        let opts = SolveOptions { approx_top, approx_per_server, parallel: false, reservations_only };
        solve(&inst, &opts).verify(&inst).map_err(proptest::test_runner::TestCaseError::fail)?;
    }
}

fn extreme_tokens() -> impl proptest::strategy::Strategy<Value = u64> {
    use proptest::prelude::*;
    prop_oneof![Just(0u64), Just(1), Just(MAX_TOKENS), Just(MAX_TOKENS - 1), 0u64..10, 0u64..=MAX_TOKENS]
}
