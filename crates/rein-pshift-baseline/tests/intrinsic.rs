//! The intrinsic error of pShift's Experiment 2 cell without demand changes (pshift.txt §IV-B: "The bar
//! for N_D = 0 represents intrinsic errors"), computed by max flow on the scenario's own buckets: the
//! first QoS period's reservations, demands (rate x period x share per active server) and capacities.
//! When the maximum flow carries every reservation, the intrinsic error is zero and any bucket missing
//! its reservation is pShift's (or the simulation's) fault: that is what `pshift-exp2-na2-nd0`'s check
//! of less than 0.1% stands on.
use rein_core::pshift::InstanceBuilder;
use rein_pshift_baseline::max_flow;
use rein_sim::model::pshift::BucketLoad;
use rein_sim::Scenario;
use std::path::Path;

#[test]
fn pshift_exp2_na2_nd0_has_no_intrinsic_error() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/pshift-exp2-na2-nd0.toml");
    let sc = Scenario::load(&path).unwrap();
    let ps = sc.pshift.as_ref().unwrap();
    let period_s = ps.period.as_secs_f64();
    let mut b = InstanceBuilder::new();
    for s in &sc.servers {
        b.add_server((s.device.capacity_iops * period_s) as u64).unwrap();
    }
    let mut reserved = 0u64;
    for (t, plan) in sc.tenants.iter().zip(&ps.buckets) {
        assert_eq!(plan.phases.len(), 1, "N_D = 0: one demand phase");
        let BucketLoad::Open { iops } = plan.load else { panic!("Experiment 2's buckets are open") };
        let demand: Vec<(usize, u64)> =
            plan.phases[0].servers.iter().map(|&(j, share)| (j, (iops * share * period_s) as u64)).collect();
        let r = (t.spec.reservation() * period_s) as u64;
        reserved += r.min(demand.iter().map(|d| d.1).sum());
        b.add_bucket(r, None, &demand).unwrap();
    }
    let inst = b.build().unwrap();
    let flow = max_flow(&inst);
    eprintln!("reserved {reserved}, max flow {flow}");
    assert_eq!(flow, reserved, "some reservations cannot be met by any allocation (intrinsic error > 0)");
}
