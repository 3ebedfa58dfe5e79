//! The fluid oracle: the allocation schedulers aim at, computed in closed form.
//!
//! # mClock eq. (1)-(2) (mclock-dmclock.txt §2.1)
//! For capacity T and backlogged tenants with (r_i, l_i, w_i), each tenant gets
//! `gamma_i = clamp(lambda * w_i, r_i, l_i)` where the level `lambda` solves `sum gamma_i = T`. Tenants at
//! r_i are *reservation-clamped*, at l_i *limit-clamped*, the rest *proportional*. Two edge cases:
//! - `T < sum r_i`: reservations cannot all be met; the paper gives each tenant `T * r_i / sum r` (tenants
//!   without a reservation get nothing).
//! - `T > sum l_i`: every tenant is at its limit and `T - sum l_i` stays unused (limits are hard).
//!
//! `sum_i clamp(lambda w_i, r_i, l_i)` is piecewise linear and non-decreasing in lambda, with breakpoints at
//! r_i/w_i and l_i/w_i; [`allocate`] sweeps them in order (O(n log n)).
//!
//! # RBFQ critical capacities (rbfq-repair.txt §3)
//! With minimum demands M_i (reservations, no limits) sorted so M_i/w_i is non-decreasing,
//! `C_k = (M_k/w_k) * sum_{i<=k} w_i + sum_{i>k} M_i`. For C in [C_k, C_{k+1}) the first k clients share in
//! proportion to weight and the rest get M_i: the same allocation as eq. (1) with no limits, which the tests
//! check.

/// Which case of eq. (1) a tenant is in.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Clamp {
    /// Held at its reservation r_i: its weight share `lambda * w_i` is below r_i.
    Reservation,
    /// Held at its limit l_i: its weight share is above l_i.
    Limit,
    /// Gets its weight share `lambda * w_i`, which lies between r_i and l_i.
    Proportional,
    /// Capacity below the sum of reservations: share of T in proportion to reservations.
    Underprovisioned,
}

/// One tenant's parameters for the oracle (rates in cost units per second).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct OracleTenant {
    /// r_i, cost units per second; 0 for none.
    pub reservation: f64,
    /// l_i, cost units per second; `f64::INFINITY` for unlimited.
    pub limit: f64,
    /// w_i, positive.
    pub weight: f64,
}

impl From<&crate::QosSpec> for OracleTenant {
    fn from(s: &crate::QosSpec) -> Self {
        OracleTenant { reservation: s.reservation(), limit: s.limit_or_inf(), weight: s.weight() }
    }
}

/// The oracle's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Allocation {
    /// gamma_i, in the order given.
    pub rates: Vec<f64>,
    /// Which case of eq. (1) each tenant is in, in the order given.
    pub clamps: Vec<Clamp>,
    /// The proportional level lambda (service per unit weight); 0 when under-provisioned.
    pub level: f64,
    /// Capacity nobody may use (all at their limits).
    pub unused: f64,
}

/// Computes eq. (1)-(2) for capacity `t`. Inputs must be valid (as [`crate::QosSpec`] guarantees).
pub fn allocate(tenants: &[OracleTenant], t: f64) -> Allocation {
    let n = tenants.len();
    let t = t.max(0.0);
    let sum_r: f64 = tenants.iter().map(|x| x.reservation).sum();
    if n == 0 {
        return Allocation { rates: vec![], clamps: vec![], level: 0.0, unused: t };
    }
    if t < sum_r {
        let rates = tenants.iter().map(|x| t * x.reservation / sum_r).collect();
        return Allocation { rates, clamps: vec![Clamp::Underprovisioned; n], level: 0.0, unused: 0.0 };
    }
    let sum_l: f64 = tenants.iter().map(|x| x.limit).sum();
    let level = if t >= sum_l {
        f64::INFINITY
    } else {
        // Sweep breakpoints: at r/w a tenant starts growing with slope w; at l/w it stops.
        let mut events: Vec<(f64, f64, f64)> = Vec::with_capacity(2 * n); // (lambda, d_slope, d_const)
        for x in tenants {
            events.push((x.reservation / x.weight, x.weight, -x.reservation));
            if x.limit.is_finite() {
                events.push((x.limit / x.weight, -x.weight, x.limit));
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut constant = sum_r; // f(lambda) = constant + slope * lambda on the current segment
        let mut slope = 0.0;
        let mut level = f64::NAN;
        for (i, &(lam, ds, dc)) in events.iter().enumerate() {
            slope += ds;
            constant += dc;
            let next = events.get(i + 1).map_or(f64::INFINITY, |e| e.0);
            if slope > 0.0 {
                let cand = (t - constant) / slope;
                if cand <= next {
                    level = cand.max(lam);
                    break;
                }
            }
        }
        if level.is_nan() {
            f64::INFINITY
        } else {
            level
        }
    };
    let mut rates = Vec::with_capacity(n);
    let mut clamps = Vec::with_capacity(n);
    for x in tenants {
        let want = level * x.weight;
        let (g, c) = if want <= x.reservation {
            (x.reservation, Clamp::Reservation)
        } else if want >= x.limit {
            (x.limit, Clamp::Limit)
        } else {
            (want, Clamp::Proportional)
        };
        rates.push(g);
        clamps.push(c);
    }
    let used: f64 = rates.iter().sum();
    Allocation { rates, clamps, level: if level.is_finite() { level } else { 0.0 }, unused: (t - used).max(0.0) }
}

/// RBFQ's critical capacities. Returns `(order, c)`: `order[k]` is the index of the client with the k-th
/// smallest M/w (ties by index), `c[k]` is C_{k+1} in the paper's 1-based numbering.
pub fn critical_capacities(min_demand: &[f64], weight: &[f64]) -> (Vec<usize>, Vec<f64>) {
    assert_eq!(min_demand.len(), weight.len(), "one weight per client");
    let n = min_demand.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| (min_demand[a] / weight[a]).total_cmp(&(min_demand[b] / weight[b])).then(a.cmp(&b)));
    let total_m: f64 = min_demand.iter().sum();
    let mut c = Vec::with_capacity(n);
    let mut w_prefix = 0.0;
    let mut m_prefix = 0.0;
    for &i in &order {
        w_prefix += weight[i];
        m_prefix += min_demand[i];
        c.push(min_demand[i] / weight[i] * w_prefix + (total_m - m_prefix));
    }
    (order, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(r: f64, l: f64, w: f64) -> OracleTenant {
        OracleTenant { reservation: r, limit: l, weight: w }
    }

    /// mClock §2.1: RD (r 250, w 1), OLTP (r 250, w 2), DM (l 1000, w 3).
    fn paper() -> Vec<OracleTenant> {
        vec![t(250.0, f64::INFINITY, 1.0), t(250.0, f64::INFINITY, 2.0), t(0.0, 1000.0, 3.0)]
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn mclock_section_2_1() {
        let a = allocate(&paper(), 1200.0);
        assert!(close(&a.rates, &[250.0, 380.0, 570.0]), "{:?}", a.rates);
        assert_eq!(a.clamps, vec![Clamp::Reservation, Clamp::Proportional, Clamp::Proportional]);
    }

    #[test]
    fn mclock_figure_3_breakpoints() {
        // T = 500: exactly the reservations (RD and OLTP 250 each, DM nothing).
        assert!(close(&allocate(&paper(), 500.0).rates, &[250.0, 250.0, 0.0]));
        // T = 875: OLTP's weight share reaches its reservation: 250 / 250 / 375.
        assert!(close(&allocate(&paper(), 875.0).rates, &[250.0, 250.0, 375.0]));
        // T = 1500: RD's weight share reaches its reservation: 1:2:3 from here, 250 / 500 / 750.
        let a = allocate(&paper(), 1500.0);
        assert!(close(&a.rates, &[250.0, 500.0, 750.0]), "{:?}", a.rates);
        // T = 2000: DM reaches its limit of 1000; above it, RD and OLTP split the rest 1:2.
        assert!(close(&allocate(&paper(), 2000.0).rates, &[1000.0 / 3.0, 2000.0 / 3.0, 1000.0]));
        assert!(close(&allocate(&paper(), 2300.0).rates, &[1300.0 / 3.0, 2600.0 / 3.0, 1000.0]));
        // Below 500: split in proportion to reservations.
        let a = allocate(&paper(), 400.0);
        assert!(close(&a.rates, &[200.0, 200.0, 0.0]));
        assert_eq!(a.clamps[0], Clamp::Underprovisioned);
    }

    #[test]
    fn all_limited_leaves_capacity_unused() {
        let a = allocate(&[t(0.0, 100.0, 1.0), t(10.0, 200.0, 5.0)], 1000.0);
        assert!(close(&a.rates, &[100.0, 200.0]));
        assert!((a.unused - 700.0).abs() < 1e-9);
    }

    #[test]
    fn rbfq_section_3_critical_capacities() {
        // M = 120, 75, 50, 25 and w = 20, 5, 10, 1.
        let m = [120.0, 75.0, 50.0, 25.0];
        let w = [20.0, 5.0, 10.0, 1.0];
        let (order, c) = critical_capacities(&m, &w);
        assert_eq!(order, vec![2, 0, 1, 3]);
        assert!(close(&c, &[270.0, 280.0, 550.0, 900.0]), "{c:?}");
        let tenants: Vec<_> = m.iter().zip(&w).map(|(&m, &w)| t(m, f64::INFINITY, w)).collect();
        // C = 900: 500 / 125 / 250 / 25 (normalised service 25 each).
        assert!(close(&allocate(&tenants, 900.0).rates, &[500.0, 125.0, 250.0, 25.0]));
        // C = 725: c4 at its minimum 25, the rest 20 per unit weight.
        assert!(close(&allocate(&tenants, 725.0).rates, &[400.0, 100.0, 200.0, 25.0]));
        // C = 310: c3 and c4 at their minimum, c1 and c2 7 per unit weight.
        assert!(close(&allocate(&tenants, 310.0).rates, &[140.0, 75.0, 70.0, 25.0]));
    }

    #[test]
    fn rbfq_table_3_allocation() {
        let a = allocate(&[t(20.0, f64::INFINITY, 3.0), t(40.0, f64::INFINITY, 1.0)], 100.0);
        assert!(close(&a.rates, &[60.0, 40.0]));
    }

    #[test]
    fn empty_and_zero() {
        assert_eq!(allocate(&[], 10.0).unused, 10.0);
        assert!(close(&allocate(&paper(), 0.0).rates, &[0.0, 0.0, 0.0]));
    }
}
