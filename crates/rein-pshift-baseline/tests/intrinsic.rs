//! The intrinsic error of pShift's Experiment 2 cell without demand changes (pshift.txt §IV-B: "The bar
//! for N_D = 0 represents intrinsic errors"), computed by max flow on the scenario's own buckets: the
//! first QoS period's reservations, demands (rate x period x share per active server) and capacities.
//! The paper's error is the share of buckets that miss 5% or more of their reservation. When the maximum
//! flow carries more than 95% of every bucket's reservation, some allocation gives every bucket that, so
//! the intrinsic error is zero and any bucket missing 5% is pShift's (or the simulation's) fault: that is
//! what `pshift-exp2-na2-nd0`'s check of less than 0.1% stands on. Each seed draws its own buckets, so
//! every seed the scenario runs with (1-20: `scripts/seeds.sh`) is checked. Full reservations are not
//! always carried: the instances of seeds 8 and 14 leave 6,410 and 3,942 of 6,400,000 reserved IOs
//! unplaceable.
use rein_core::pshift::InstanceBuilder;
use rein_pshift_baseline::max_flow;
use rein_sim::model::pshift::BucketLoad;
use rein_sim::Scenario;
use std::path::Path;

#[test]
fn pshift_exp2_na2_nd0_has_no_intrinsic_error() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/pshift-exp2-na2-nd0.toml");
    let file = Scenario::load(&path).unwrap();
    for seed in 1..=20 {
        let sc = file.with_seed(seed).unwrap();
        let (full, all) = flow_and_reserved(&sc, 1.0);
        let (flow, reserved) = flow_and_reserved(&sc, 0.95);
        eprintln!("seed {seed}: full reservations {full} of {all}; more than 95% of each {flow} of {reserved}");
        assert_eq!(
            flow, reserved,
            "seed {seed}: some bucket cannot get more than 95% of its reservation (intrinsic error > 0)"
        );
    }
}

/// The maximum flow of the first period's instance when each bucket asks for more than `share` of its
/// reservation (all of it at 1.0), and what it would carry if every such request were met.
fn flow_and_reserved(sc: &Scenario, share: f64) -> (u64, u64) {
    let ps = sc.pshift().unwrap();
    let period_s = ps.period.as_secs_f64();
    let mut b = InstanceBuilder::new();
    for s in sc.servers() {
        b.add_server((s.device.capacity_iops * period_s) as u64).unwrap();
    }
    let mut reserved = 0u64;
    for (t, plan) in sc.tenants().iter().zip(&ps.buckets) {
        assert_eq!(plan.phases.len(), 1, "N_D = 0: one demand phase");
        let BucketLoad::Open { iops } = plan.load else { panic!("Experiment 2's buckets are open") };
        let demand: Vec<(usize, u64)> =
            plan.phases[0].servers.iter().map(|&(j, share)| (j, (iops * share * period_s) as u64)).collect();
        let full = (t.spec.reservation() * period_s) as u64;
        // More than `share` of it, in whole IOs (at 1.0 that is all of it: the `min`).
        let r = ((full as f64 * share).floor() as u64 + 1).min(full);
        reserved += r.min(demand.iter().map(|d| d.1).sum());
        b.add_bucket(r, None, &demand).unwrap();
    }
    let inst = b.build().unwrap();
    (max_flow(&inst), reserved)
}
