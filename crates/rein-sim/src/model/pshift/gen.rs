//! The paper's synthetic pShift instances (pshift.txt §IV-B, §IV-C).
//!
//! - Reservations follow a Zipf law (Fig. 3(a)): each bucket draws a rank k in 1..=|B| with probability
//!   proportional to 1/k^s and gets weight 1/k^s; the reserved capacity `r * sum_j C^j` is split in
//!   proportion to the weights. With s = 0.5 and 10,000 buckets on 64 servers of 100,000 IOs this gives
//!   reservations from about 130 to 13,000, the paper's "roughly (120, 13000)".
//! - Each bucket is active on `active` servers drawn uniformly without replacement; its demand
//!   D_i = m * R_i is split over them by a Zipf law too: the k-th drawn server gets a share proportional
//!   to 1/k^s_d.
//! - An optional limit L_i = ratio * R_i.
//!
//! Every split is in whole tokens by largest remainder, so the totals are exact (`sum R_i` is exactly
//! `floor(r * sum C^j)`). One PCG stream seeded from `seed` drives everything: same parameters and seed,
//! same instance.

use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use rand_pcg::Pcg64Mcg;
use rein_core::pshift::{Instance, InstanceBuilder, InstanceError, MAX_BUCKETS, MAX_SERVERS, MAX_TOKENS};
use rein_core::Num;

/// Parameters of a synthetic instance that are refused ([`GenParams::validate`]), or the instance
/// rein-core refuses to build from them.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    /// `servers` or `buckets` outside `1..=max`.
    #[error("{what} must be in 1..={max}, got {got}")]
    Count {
        /// `servers` or `buckets`.
        what: &'static str,
        /// The largest accepted ([`MAX_SERVERS`], [`MAX_BUCKETS`]).
        max: usize,
        /// The value given.
        got: usize,
    },
    /// The active servers per bucket outside `1..=servers`.
    #[error("active servers must be in 1..={servers} (the server count), got {got}")]
    ActiveServers {
        /// The server count.
        servers: usize,
        /// The value given.
        got: usize,
    },
    /// `capacity` above `max` tokens.
    #[error("capacity must be at most {max}, got {got}")]
    Capacity {
        /// [`MAX_TOKENS`].
        max: u64,
        /// The value given.
        got: u64,
    },
    /// A real parameter (a Zipf exponent, `r`, `m`) outside `[min, max]`.
    #[error("{what} must be in [{min}, {max}], got {}", Num(*.got))]
    Range {
        /// Which parameter, as the message names it (`reservation Zipf s`, `demand ratio m`).
        what: &'static str,
        /// The smallest accepted.
        min: f64,
        /// The largest accepted.
        max: f64,
        /// The value given.
        got: f64,
    },
    /// The limit ratio outside [1, 1000].
    #[error("limit ratio must be in [1, 1000], got {got}")]
    LimitRatio {
        /// The value given.
        got: f64,
    },
    /// Capacity x servers x r x m x the limit ratio above `max` tokens.
    #[error("the totals ({total:.3e} tokens) exceed {max}: lower capacity, r, m or the limit ratio")]
    Totals {
        /// The totals, in tokens.
        total: f64,
        /// [`MAX_TOKENS`].
        max: u64,
    },
    /// rein-core refuses the instance.
    #[error("{0}")]
    Instance(#[from] InstanceError),
}

/// Parameters of a synthetic instance (the paper's stress case is the default but for `buckets`).
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// Number of servers, named `s0`, `s1`, ... (1 to [`MAX_SERVERS`]).
    pub servers: usize,
    /// C^j: IOs per server per QoS period (the paper: 100,000).
    pub capacity: u64,
    /// Number of buckets, named `b0`, `b1`, ... (1 to [`MAX_BUCKETS`]).
    pub buckets: usize,
    /// Zipf exponent of the reservations (0 = all equal).
    pub reservation_zipf_s: f64,
    /// r = sum R_i / sum C^j.
    pub reserved_fraction: f64,
    /// m = D_i / R_i.
    pub demand_ratio: f64,
    /// N_A: servers each bucket is active on.
    pub active_servers: usize,
    /// Zipf exponent of the demand split over a bucket's active servers (0 = even).
    pub demand_zipf_s: f64,
    /// L_i = limit_ratio * R_i when set.
    pub limit_ratio: Option<f64>,
    /// The seed of the one PCG stream behind every random choice (reservation ranks, active servers): same
    /// parameters and seed, same instance.
    pub seed: u64,
}

impl Default for GenParams {
    /// §IV-C's stress case: 64 servers x 10,000 buckets, 8 active servers each, r = 1.0, m = 1.1, Zipf
    /// s = 0.5 for reservations and demand splits.
    fn default() -> Self {
        GenParams {
            servers: 64,
            capacity: 100_000,
            buckets: 10_000,
            reservation_zipf_s: 0.5,
            reserved_fraction: 1.0,
            demand_ratio: 1.1,
            active_servers: 8,
            demand_zipf_s: 0.5,
            limit_ratio: None,
            seed: 1,
        }
    }
}

impl GenParams {
    /// Checks every parameter; the message names the one that is out of range.
    pub fn validate(&self) -> Result<(), GenError> {
        for (what, got, max) in [("servers", self.servers, MAX_SERVERS), ("buckets", self.buckets, MAX_BUCKETS)] {
            if got == 0 || got > max {
                return Err(GenError::Count { what, max, got });
            }
        }
        if self.active_servers == 0 || self.active_servers > self.servers {
            return Err(GenError::ActiveServers { servers: self.servers, got: self.active_servers });
        }
        if self.capacity > MAX_TOKENS {
            return Err(GenError::Capacity { max: MAX_TOKENS, got: self.capacity });
        }
        for (what, got, min, max) in [
            ("reservation Zipf s", self.reservation_zipf_s, 0.0, 10.0),
            ("demand Zipf s", self.demand_zipf_s, 0.0, 10.0),
            ("reserved fraction r", self.reserved_fraction, 0.0, 10.0),
            ("demand ratio m", self.demand_ratio, 0.0, 1000.0),
        ] {
            if !(got.is_finite() && (min..=max).contains(&got)) {
                return Err(GenError::Range { what, min, max, got });
            }
        }
        if let Some(l) = self.limit_ratio {
            if !(l.is_finite() && (1.0..=1000.0).contains(&l)) {
                return Err(GenError::LimitRatio { got: l });
            }
        }
        let total = self.capacity as f64
            * self.servers as f64
            * self.reserved_fraction
            * self.demand_ratio.max(1.0)
            * self.limit_ratio.unwrap_or(1.0);
        if total > MAX_TOKENS as f64 {
            return Err(GenError::Totals { total, max: MAX_TOKENS });
        }
        Ok(())
    }
}

/// Splits `total` into whole parts proportional to `weights` (largest remainder; ties to the lower
/// index). The parts sum to `total` exactly. `weights` must be finite, non-negative, not all zero.
pub(crate) fn split_whole(total: u64, weights: &[f64]) -> Vec<u64> {
    let max = weights.iter().cloned().fold(0.0, f64::max);
    assert!(max > 0.0 && max.is_finite(), "split_whole needs a positive weight");
    // Integer weights (2^40 for the largest) so the rest is exact integer arithmetic.
    let w: Vec<u128> = weights.iter().map(|&x| ((x / max) * (1u64 << 40) as f64).round() as u128).collect();
    let sum: u128 = w.iter().sum();
    let mut parts: Vec<u64> = w.iter().map(|&x| (total as u128 * x / sum) as u64).collect();
    let given: u64 = parts.iter().sum();
    let mut rem: Vec<(u128, usize)> = w.iter().enumerate().map(|(k, &x)| (total as u128 * x % sum, k)).collect();
    rem.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, k) in rem.iter().take((total - given) as usize) {
        parts[k] += 1;
    }
    parts
}

/// `k` distinct servers out of `n`, uniformly (partial Fisher-Yates), in draw order.
pub(crate) fn pick_servers<R: Rng>(rng: &mut R, n: usize, k: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in 0..k.min(n) {
        let j = rng.gen_range(i..n);
        v.swap(i, j);
    }
    v.truncate(k.min(n));
    v
}

/// Zipf weights 1/k^s for k = 1..=n (the demand split over active servers in draw order).
pub(crate) fn zipf_weights(n: usize, s: f64) -> Vec<f64> {
    (1..=n).map(|k| 1.0 / (k as f64).powf(s)).collect()
}

/// Reservations of `buckets` buckets summing to `total`, Zipf-distributed with exponent `s` (module
/// comment).
pub(crate) fn zipf_reservations<R: Rng>(rng: &mut R, buckets: usize, s: f64, total: u64) -> Vec<u64> {
    let weights: Vec<f64> = if s == 0.0 {
        vec![1.0; buckets]
    } else {
        // Both callers (crate-private) check buckets >= 1 and s in [0, 10] just before: `GenParams::validate`
        // in `generate`, and the [pshift.generate] checks in `model::pshift`'s `generate`.
        let z = Zipf::new(buckets as u64, s).expect("buckets >= 1 and s >= 0, checked by both callers");
        (0..buckets).map(|_| 1.0 / z.sample(rng).powf(s)).collect()
    };
    split_whole(total, &weights)
}

/// Generates the instance (servers `s0..`, buckets `b0..`).
pub fn generate(p: &GenParams) -> Result<Instance, GenError> {
    p.validate()?;
    let mut rng = Pcg64Mcg::seed_from_u64(p.seed);
    let mut b = InstanceBuilder::new();
    for j in 0..p.servers {
        b.add_named_server(format!("s{j}"), p.capacity)?;
    }
    let total = (p.capacity as f64 * p.servers as f64 * p.reserved_fraction).floor() as u64;
    let res = zipf_reservations(&mut rng, p.buckets, p.reservation_zipf_s, total);
    let shares = zipf_weights(p.active_servers, p.demand_zipf_s);
    let mut demand = Vec::with_capacity(p.active_servers);
    for (i, &r) in res.iter().enumerate() {
        let servers = pick_servers(&mut rng, p.servers, p.active_servers);
        let d_total = (r as f64 * p.demand_ratio).round() as u64;
        demand.clear();
        demand.extend(servers.iter().copied().zip(split_whole(d_total, &shares)));
        let limit = p.limit_ratio.map(|x| ((r as f64 * x).round() as u64).max(r));
        b.add_named_bucket(format!("b{i}"), r, limit, &demand)?;
    }
    Ok(b.build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_exact_and_proportional() {
        assert_eq!(split_whole(10, &[1.0, 1.0, 1.0]), vec![4, 3, 3]);
        assert_eq!(split_whole(0, &[1.0, 2.0]), vec![0, 0]);
        assert_eq!(split_whole(MAX_TOKENS, &[1.0, 0.0, 1.0]), vec![MAX_TOKENS / 2, 0, MAX_TOKENS / 2]);
        let p = split_whole(1000, &zipf_weights(8, 0.5));
        assert_eq!(p.iter().sum::<u64>(), 1000);
        assert!(p.windows(2).all(|w| w[0] >= w[1]), "{p:?}");
    }

    #[test]
    fn stress_instance_matches_the_paper() {
        let inst = generate(&GenParams::default()).unwrap();
        assert_eq!((inst.servers(), inst.buckets(), inst.entries()), (64, 10_000, 80_000));
        let r: Vec<u64> = (0..inst.buckets()).map(|i| inst.reservation(i)).collect();
        assert_eq!(r.iter().sum::<u64>(), 6_400_000, "r = 1.0: fully reserved");
        let (lo, hi) = (*r.iter().min().unwrap(), *r.iter().max().unwrap());
        // Fig. 3(a): "roughly in the range of (120, 13000)", a factor of 100.
        assert!((100..=160).contains(&lo) && (11_000..=15_000).contains(&hi), "{lo}..{hi}");
        for (i, &ri) in r.iter().enumerate() {
            let d = inst.total_demand(i) as f64;
            assert!((d - 1.1 * ri as f64).abs() <= 0.5, "m = 1.1");
        }
        assert_eq!(generate(&GenParams::default()).unwrap(), inst, "seeded: same instance");
        assert_ne!(generate(&GenParams { seed: 2, ..GenParams::default() }).unwrap(), inst);
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = |p: GenParams| generate(&p).unwrap_err();
        let active = e(GenParams { active_servers: 65, ..Default::default() });
        assert!(matches!(active, GenError::ActiveServers { servers: 64, got: 65 }), "{active:?}");
        assert_eq!(active.to_string(), "active servers must be in 1..=64 (the server count), got 65");
        let servers = e(GenParams { servers: 0, ..Default::default() });
        assert!(matches!(servers, GenError::Count { what: "servers", max: MAX_SERVERS, got: 0 }), "{servers:?}");
        assert_eq!(servers.to_string(), format!("servers must be in 1..={MAX_SERVERS}, got 0"));
        let m = e(GenParams { demand_ratio: f64::NAN, ..Default::default() });
        assert!(
            matches!(m, GenError::Range { what: "demand ratio m", min: 0.0, max: 1000.0, got } if got.is_nan()),
            "{m:?}"
        );
        let totals = e(GenParams { capacity: MAX_TOKENS, ..Default::default() });
        assert!(matches!(totals, GenError::Totals { max: MAX_TOKENS, .. }), "{totals:?}");
        assert!(totals.to_string().contains("exceed"), "{totals}");
    }
}
