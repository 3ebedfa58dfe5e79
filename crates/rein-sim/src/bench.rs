//! The simulator's speed benchmark scenario: N tenants over S servers running mClock.
//!
//! Each tenant keeps 4 requests outstanding, spread over all servers by offset striping; half the tenants
//! reserve half of their fair share, weights are 1-4 and a quarter of the tenants are limited to 1.5x
//! their fair share. Each server does 100,000 IOPS (exponential service) at queue depth 32.

use crate::model::Scenario;

/// Builds the benchmark scenario.
pub fn scenario(tenants: usize, servers: usize, duration_s: f64, scheduler: &str) -> Scenario {
    let capacity = 100_000.0;
    let total = capacity * servers as f64;
    let wsum: f64 = (0..tenants).map(|i| 1.0 + (i % 4) as f64).sum();
    let mut s = format!(
        "name = \"bench-{tenants}x{servers}\"\nduration_s = {duration_s}\nwarmup_s = 0\nseed = 7\nscheduler = \"{scheduler}\"\ninterval_s = {duration_s}\n"
    );
    for j in 0..servers {
        s.push_str(&format!("[[servers]]\nname = \"s{j}\"\ncapacity_iops = {capacity}\nqueue_depth = 32\n"));
    }
    for i in 0..tenants {
        let w = 1.0 + (i % 4) as f64;
        let fair = total * w / wsum;
        let r = if i % 2 == 0 { fair * 0.5 } else { 0.0 };
        let l = if i % 4 == 1 { format!("limit = {}\n", fair * 1.5) } else { String::new() };
        s.push_str(&format!(
            "[[tenants]]\nname = \"t{i}\"\nreservation = {r}\nweight = {w}\n{l}routing = {{ stripe_kb = 64 }}\n[tenants.workload]\nkind = \"closed\"\noutstanding = 4\nsize_kb = 4\n"
        ));
    }
    Scenario::from_toml(&s, None).expect("benchmark scenario is valid")
}

#[cfg(test)]
mod tests {
    #[test]
    fn bench_scenario_runs() {
        let sc = super::scenario(100, 4, 0.05, "mclock");
        let r = crate::run(&sc, &mut |_| {}).unwrap();
        assert!(r.completions() > 10_000, "{}", r.completions());
    }
}
