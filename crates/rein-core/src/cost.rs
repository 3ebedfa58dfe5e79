//! Request cost models (mClock §3.1 "IO size").
//!
//! Tags advance by `cost / rate`, so the cost model decides what a reservation, limit or weight
//! counts. Three models:
//! - [`CostModel::PerIo`]: every request costs one unit; rates are IOPS.
//! - [`CostModel::PerByte`]: a request costs `size / unit_bytes` units; with `unit_bytes = 1` rates are
//!   bytes/s (RBFQ §3.4's upper bound B_i is in this model).
//! - [`CostModel::SeekTransfer`]: mClock eq. (4)-(5): a request of size S costs `1 + S / (Tm * Bpeak)`
//!   IOs, where Tm is the positioning time and Bpeak the peak transfer rate. The paper's values (Tm = 5 ms,
//!   Bpeak = 60 MB/s) make the knee Tm*Bpeak = 300 KB: an 8 KB IO costs 1.027 IOs, a 300 KB IO costs 2.
//!
//! Costs are clamped to `[Cost::MIN, Cost::MAX]` (see [`crate::units`]): a zero-size request still costs
//! 1/65536 unit, and an absurd size cannot overflow a tag.

use crate::units::Cost;

/// Why a cost model was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CostModelError {
    /// A per-byte model with a unit of 0 bytes (every cost would divide by zero).
    #[error("per-byte cost unit must be at least 1 byte")]
    ZeroUnit,
    /// Tm is zero, or Bpeak (or the knee Tm * Bpeak) is not a positive finite number.
    #[error("seek/transfer cost model needs positive finite Tm and Bpeak (got Tm = {tm_ns} ns, Bpeak = {bpeak} B/s)")]
    BadSeekTransfer {
        /// The positioning time Tm given, nanoseconds.
        tm_ns: u64,
        /// The peak transfer rate Bpeak given, bytes per second.
        bpeak: f64,
    },
}

/// How a request's size becomes a cost. Build the seek/transfer model with [`CostModel::seek_transfer`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum CostModel {
    /// Every request costs one unit, whatever its size: rates are IOPS.
    #[default]
    PerIo,
    /// A request of `size` bytes costs `size / unit_bytes` units: rates are multiples of `unit_bytes` per
    /// second (bytes per second with [`CostModel::BYTES`]).
    PerByte {
        /// Bytes per unit of cost, at least 1 ([`CostModel::per_byte`] checks it; 0 is treated as 1).
        unit_bytes: u64,
    },
    /// mClock eq. (4)-(5): a request of `size` bytes costs `1 + size / knee_bytes` IOs.
    SeekTransfer {
        /// Tm * Bpeak in bytes, the size at which a request costs two IOs; positive and finite.
        knee_bytes: f64,
    },
}

impl CostModel {
    /// Rates in bytes per second.
    pub const BYTES: CostModel = CostModel::PerByte { unit_bytes: 1 };

    /// The per-byte model with `unit_bytes` bytes per unit of cost; 0 is refused
    /// ([`CostModelError::ZeroUnit`]).
    pub fn per_byte(unit_bytes: u64) -> Result<Self, CostModelError> {
        if unit_bytes == 0 {
            return Err(CostModelError::ZeroUnit);
        }
        Ok(CostModel::PerByte { unit_bytes })
    }

    /// mClock eq. (4)-(5) with positioning time `tm_ns` and peak bandwidth `bpeak_bytes_per_s`.
    pub fn seek_transfer(tm_ns: u64, bpeak_bytes_per_s: f64) -> Result<Self, CostModelError> {
        let knee = tm_ns as f64 * 1e-9 * bpeak_bytes_per_s;
        if tm_ns == 0 || !bpeak_bytes_per_s.is_finite() || !knee.is_finite() || knee <= 0.0 {
            return Err(CostModelError::BadSeekTransfer { tm_ns, bpeak: bpeak_bytes_per_s });
        }
        Ok(CostModel::SeekTransfer { knee_bytes: knee })
    }

    /// The paper's example disk: Tm = 5 ms, Bpeak = 60 MB/s.
    pub fn paper_disk() -> Self {
        CostModel::SeekTransfer { knee_bytes: 0.005 * 60e6 }
    }

    /// Cost of a request of `size` bytes.
    #[inline]
    pub fn cost(&self, size: u64) -> Cost {
        match *self {
            CostModel::PerIo => Cost::ONE,
            CostModel::PerByte { unit_bytes } => {
                let units_fp = ((size as u128) << Cost::FRAC_BITS) / unit_bytes.max(1) as u128;
                Cost(u64::try_from(units_fp).unwrap_or(u64::MAX)).clamped()
            }
            CostModel::SeekTransfer { knee_bytes } => Cost::from_f64(1.0 + size as f64 / knee_bytes),
        }
    }

    /// The cost, in units, of `ios` requests totalling `bytes` bytes: every model is linear in the count
    /// and the bytes, so this is the sum of their [`CostModel::cost`]s up to its fixed-point rounding (and
    /// its minimum for empty requests). Reports use it to turn counted IOs into the rates specs are in.
    pub fn units_of(&self, ios: u64, bytes: u64) -> f64 {
        match *self {
            CostModel::PerIo => ios as f64,
            CostModel::PerByte { unit_bytes } => bytes as f64 / unit_bytes.max(1) as f64,
            CostModel::SeekTransfer { knee_bytes } => ios as f64 + bytes as f64 / knee_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_io_and_per_byte() {
        assert_eq!(CostModel::PerIo.cost(1 << 20), Cost::ONE);
        assert_eq!(CostModel::BYTES.cost(4096), Cost::units(4096));
        assert_eq!(CostModel::per_byte(4096).unwrap().cost(8192), Cost::units(2));
        assert_eq!(CostModel::BYTES.cost(0), Cost::MIN);
        assert_eq!(CostModel::BYTES.cost(u64::MAX), Cost::MAX);
        assert_eq!(CostModel::per_byte(0), Err(CostModelError::ZeroUnit));
    }

    #[test]
    fn units_of_sums_the_requests_costs() {
        let sizes = [4096u64, 8192, 16384, 300_000, 512];
        let bytes: u64 = sizes.iter().sum();
        for m in [CostModel::PerIo, CostModel::BYTES, CostModel::per_byte(4096).unwrap(), CostModel::paper_disk()] {
            let sum: f64 = sizes.iter().map(|&s| m.cost(s).as_f64()).sum();
            let got = m.units_of(sizes.len() as u64, bytes);
            // Each request's cost is rounded to 2^-16 units (Cost::FRAC_BITS).
            let rounding = sizes.len() as f64 / f64::from(1u32 << Cost::FRAC_BITS);
            assert!((got - sum).abs() <= rounding, "{m:?}: {got} against {sum}");
        }
    }

    #[test]
    fn seek_transfer_matches_paper() {
        // §3.1: with Tm = 5 ms and Bpeak = 60 MB/s, an 8 KB IO costs 1 + 8/300 IOs.
        let m = CostModel::seek_transfer(5_000_000, 60e6).unwrap();
        assert_eq!(m, CostModel::paper_disk());
        let c = m.cost(8_000).as_f64();
        assert!((c - (1.0 + 8.0 / 300.0)).abs() < 1e-4, "{c}");
        assert!((m.cost(300_000).as_f64() - 2.0).abs() < 1e-4);
        assert!(CostModel::seek_transfer(0, 60e6).is_err());
        assert!(CostModel::seek_transfer(5, f64::NAN).is_err());
        assert!(CostModel::seek_transfer(5, -1.0).is_err());
    }
}
