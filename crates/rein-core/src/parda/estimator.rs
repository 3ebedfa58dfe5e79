//! eq. (1): the host's latency estimate, an EWMA over control periods, normalised per 8 KiB.
//!
//! `L(t) = (1 - alpha) * l + alpha * L(t-1)` where `l` is the mean latency of the IOs completed in the
//! period that just ended and alpha is the weight of the past. The observation is a period's mean, not
//! one IO's latency: the paper runs with alpha = 0.002 (§5), which would make a per-IO average follow the
//! last IO alone (exponential service times vary by 100% IO to IO), whereas over 2 s periods it means
//! "the period's average, lightly smoothed", the "average latency values" §4 compares with script-L.
//! A period without completions leaves `L` unchanged.
//!
//! Before averaging, each IO's latency is scaled to what an 8 KiB IO would have taken under a linear
//! cost model `cost(size) = fixed + per_byte * size` (parda.txt §4 "IO Size"; flow-control-position
//! §3.1: "latency = m * size + C"): `l_8k = l * cost(8 KiB) / cost(size)`. With the default
//! [`SizeModel::NONE`] the latency is used as measured (what the paper's experiments, all with one IO
//! size per host, compare with script-L).

use super::{PardaError, NORMALISED_IO_BYTES};
use crate::units::Nanos;

/// The linear IO cost model used to normalise latencies to an 8 KiB IO.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct SizeModel {
    /// Fixed cost per IO (positioning, protocol), nanoseconds.
    pub fixed_ns: f64,
    /// Cost per byte (transfer), nanoseconds. 0 = no normalisation.
    pub per_byte_ns: f64,
}

impl SizeModel {
    /// No normalisation: latencies are taken as measured.
    pub const NONE: SizeModel = SizeModel { fixed_ns: 1.0, per_byte_ns: 0.0 };

    /// A model from a fixed cost and a transfer rate (MB/s = 10^6 bytes per second).
    pub fn from_rate(fixed: Nanos, transfer_mb_s: f64) -> Result<SizeModel, PardaError> {
        let per_byte_ns = if transfer_mb_s > 0.0 { 1e3 / transfer_mb_s } else { f64::NAN };
        let m = SizeModel { fixed_ns: fixed.0 as f64, per_byte_ns };
        m.validate()?;
        Ok(m)
    }

    /// Checks that both costs are finite and non-negative and not both zero ([`PardaError::SizeModel`]).
    pub fn validate(&self) -> Result<(), PardaError> {
        let ok = self.fixed_ns.is_finite()
            && self.per_byte_ns.is_finite()
            && self.fixed_ns >= 0.0
            && self.per_byte_ns >= 0.0
            && (self.fixed_ns > 0.0 || self.per_byte_ns > 0.0);
        if ok {
            Ok(())
        } else {
            Err(PardaError::SizeModel { fixed_ns: self.fixed_ns, per_byte_ns: self.per_byte_ns })
        }
    }

    /// The factor that turns a `size`-byte IO's latency into an 8 KiB IO's: `cost(8 KiB) / cost(size)`.
    pub fn factor(&self, size: u64) -> f64 {
        if self.per_byte_ns == 0.0 {
            return 1.0;
        }
        let cost = |s: u64| self.fixed_ns + self.per_byte_ns * s as f64;
        cost(NORMALISED_IO_BYTES) / cost(size.max(1))
    }
}

/// eq. (1). See the module comment.
#[derive(Clone, Debug)]
pub struct LatencyEstimator {
    alpha: f64,
    size_model: SizeModel,
    latency_ns_ewma: Option<f64>,
    /// The period in progress: normalised latencies summed, and how many.
    period_sum_ns: f64,
    period_ios: u64,
}

impl LatencyEstimator {
    /// `alpha` and `size_model` are assumed validated (by [`super::PardaConfig::validate`]).
    pub fn new(alpha: f64, size_model: SizeModel) -> Self {
        debug_assert!((0.0..=1.0).contains(&alpha));
        LatencyEstimator { alpha, size_model, latency_ns_ewma: None, period_sum_ns: 0.0, period_ios: 0 }
    }

    /// One completed IO of `size` bytes that took `latency`.
    #[inline]
    pub fn observe(&mut self, latency: Nanos, size: u64) {
        self.period_sum_ns += latency.0 as f64 * self.size_model.factor(size);
        self.period_ios += 1;
    }

    /// IOs observed in the period in progress.
    pub fn period_ios(&self) -> u64 {
        self.period_ios
    }

    /// Ends a period: folds its mean latency into L(t) by eq. (1) and returns L(t) (`None` before any
    /// completion).
    pub fn close_period(&mut self) -> Option<f64> {
        if self.period_ios > 0 {
            let l = self.period_sum_ns / self.period_ios as f64;
            self.latency_ns_ewma = Some(match self.latency_ns_ewma {
                // The first period starts the average (module comment of `parda`: deviations).
                None => l,
                Some(prev) => (1.0 - self.alpha) * l + self.alpha * prev,
            });
        }
        self.period_sum_ns = 0.0;
        self.period_ios = 0;
        self.latency_ns_ewma
    }

    /// L(t) in nanoseconds as of the last period's end, or `None` before the first completion.
    pub fn estimate_ns(&self) -> Option<f64> {
        self.latency_ns_ewma
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ewma_of_period_means_follows_eq1() {
        let mut e = LatencyEstimator::new(0.75, SizeModel::NONE);
        assert_eq!(e.close_period(), None, "no IO yet: no estimate");
        e.observe(Nanos(1000), 4096);
        e.observe(Nanos(3000), 4096);
        assert_eq!(e.period_ios(), 2);
        assert_eq!(e.estimate_ns(), None, "the estimate changes at period ends");
        assert_eq!(e.close_period(), Some(2000.0), "the first period's mean starts the average");
        e.observe(Nanos(4000), 4096);
        assert_eq!(e.close_period(), Some(0.25 * 4000.0 + 0.75 * 2000.0));
        // A period without IOs keeps the estimate.
        assert_eq!(e.close_period(), Some(2500.0));
        // alpha = 1: the past is everything; alpha = 0: only the last period.
        let mut one = LatencyEstimator::new(1.0, SizeModel::NONE);
        let mut zero = LatencyEstimator::new(0.0, SizeModel::NONE);
        for l in [5, 7, 100] {
            one.observe(Nanos(l), 1);
            zero.observe(Nanos(l), 1);
            one.close_period();
            zero.close_period();
        }
        assert_eq!(one.estimate_ns(), Some(5.0));
        assert_eq!(zero.estimate_ns(), Some(100.0));
    }

    #[test]
    fn converges_to_a_constant_input() {
        let mut e = LatencyEstimator::new(0.5, SizeModel::NONE);
        e.observe(Nanos(1_000_000), 8192);
        e.close_period();
        for _ in 0..100 {
            e.observe(Nanos(30_000_000), 8192);
            e.close_period();
        }
        assert!((e.estimate_ns().unwrap() - 30e6).abs() < 1.0);
    }

    #[test]
    fn latency_is_normalised_per_8k() {
        // 1 ms fixed + 100 MB/s: 8 KiB costs 1 + 0.08192 ms; 64 KiB costs 1 + 0.65536 ms.
        let m = SizeModel::from_rate(Nanos::from_millis(1), 100.0).unwrap();
        let f = m.factor(65536);
        assert!((f - (1.0 + 0.08192) / (1.0 + 0.65536)).abs() < 1e-12, "{f}");
        assert_eq!(m.factor(8192), 1.0);
        assert!(m.factor(512) > 1.0, "small IOs count as slower per 8 KiB");
        let mut e = LatencyEstimator::new(0.0, m);
        e.observe(Nanos(10_000_000), 65536);
        e.observe(Nanos(10_000_000), 8192);
        assert!((e.close_period().unwrap() - 10e6 * (1.0 + f) / 2.0).abs() < 1e-3);
        // NONE leaves latencies as measured, whatever the size.
        assert_eq!(SizeModel::NONE.factor(1 << 20), 1.0);
        assert!(SizeModel::from_rate(Nanos::ZERO, 0.0).is_err());
        assert!(SizeModel { fixed_ns: -1.0, per_byte_ns: 1.0 }.validate().is_err());
        assert!(SizeModel { fixed_ns: 0.0, per_byte_ns: 0.0 }.validate().is_err());
        SizeModel { fixed_ns: 0.0, per_byte_ns: 1.0 }.validate().unwrap();
    }
}
