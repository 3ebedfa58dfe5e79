//! Tenant QoS specifications, validated on construction.
//!
//! A tenant (a VM, an application, a bucket) has a **reservation** r (minimum rate), a **limit** l
//! (maximum rate), a **weight** w (share of what is left) and an **idle credit** sigma (mClock §3.1,
//! RBFQ §3.3: how many IOs of weight-phase credit it may bank while idle). Rates are in cost units per
//! second of the scheduler's cost model: IOPS under the per-IO model, bytes/s under the per-byte model.
//!
//! Invariants of a `QosSpec` (checked by [`QosSpec::new`], so every value in the program holds them):
//! 1. all numbers finite;
//! 2. reservation is 0 (none) or in `[MIN_RATE, MAX_RATE]`;
//! 3. limit is `None` (unlimited) or in `[MIN_RATE, MAX_RATE]` (not 0), and reservation <= limit;
//! 4. weight in `[MIN_WEIGHT, MAX_WEIGHT]`;
//! 5. idle credit sigma in `[0, MAX_IDLE_CREDIT]` (mClock §4.1.4 caps it at 256 IOs).

use crate::units::{Num, MAX_RATE, MAX_WEIGHT, MIN_RATE, MIN_WEIGHT};
use std::fmt;

/// Largest idle credit, in IOs (mClock §4.1.4: "we limit the setting to a maximum of 256 IOs").
pub const MAX_IDLE_CREDIT: u32 = 256;

/// Why a spec was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// A number is NaN or infinite (invariant 1; an unlimited limit is `None`, not infinity).
    #[error("{field} must be a finite number, got {}", Num(*.value))]
    NotFinite {
        /// Which number: `"reservation"`, `"limit"` or `"weight"`.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// A reservation or limit outside `[MIN_RATE, MAX_RATE]` (invariants 2-3; a reservation may be 0, a
    /// limit may be absent but not 0).
    #[error("{field} must be {}, got {}", allowed(field, *.min, *.max), Num(*.value))]
    RateOutOfRange {
        /// Which rate: `"reservation"` or `"limit"`.
        field: &'static str,
        /// The rate given, cost units per second.
        value: f64,
        /// [`MIN_RATE`].
        min: f64,
        /// [`MAX_RATE`].
        max: f64,
    },
    /// A weight outside `[MIN_WEIGHT, MAX_WEIGHT]` (invariant 4).
    #[error("weight must be between {min} and {max}, got {}", Num(*.value))]
    WeightOutOfRange {
        /// The weight given.
        value: f64,
        /// [`MIN_WEIGHT`].
        min: f64,
        /// [`MAX_WEIGHT`].
        max: f64,
    },
    /// The reservation is above the limit (invariant 3): no schedule can meet both.
    #[error("reservation {} exceeds limit {}", Num(*.reservation), Num(*.limit))]
    ReservationAboveLimit {
        /// The reservation given, cost units per second.
        reservation: f64,
        /// The limit given, cost units per second.
        limit: f64,
    },
    /// An idle credit above [`MAX_IDLE_CREDIT`] (invariant 5).
    #[error("idle credit must be at most {max} IOs, got {value}")]
    IdleCreditTooLarge {
        /// The idle credit given, IOs.
        value: u32,
        /// [`MAX_IDLE_CREDIT`].
        max: u32,
    },
}

/// A validated QoS specification. Construct with [`QosSpec::new`] or the builder-style helpers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QosSpec {
    reservation: f64,
    limit: Option<f64>,
    weight: f64,
    idle_credit: u32,
}

impl QosSpec {
    /// Validates and builds a spec. `reservation` 0 means none; `limit` `None` means unlimited.
    pub fn new(reservation: f64, limit: Option<f64>, weight: f64, idle_credit: u32) -> Result<Self, SpecError> {
        check_rate("reservation", reservation, true)?;
        if let Some(l) = limit {
            check_rate("limit", l, false)?;
            if reservation > l {
                return Err(SpecError::ReservationAboveLimit { reservation, limit: l });
            }
        }
        if !weight.is_finite() {
            return Err(SpecError::NotFinite { field: "weight", value: weight });
        }
        if !(MIN_WEIGHT..=MAX_WEIGHT).contains(&weight) {
            return Err(SpecError::WeightOutOfRange { value: weight, min: MIN_WEIGHT, max: MAX_WEIGHT });
        }
        if idle_credit > MAX_IDLE_CREDIT {
            return Err(SpecError::IdleCreditTooLarge { value: idle_credit, max: MAX_IDLE_CREDIT });
        }
        Ok(QosSpec { reservation, limit, weight, idle_credit })
    }

    /// Weight only: no reservation, no limit, no idle credit.
    pub fn weighted(weight: f64) -> Result<Self, SpecError> {
        Self::new(0.0, None, weight, 0)
    }

    /// r: the minimum rate, cost units per second; 0 means none.
    pub fn reservation(&self) -> f64 {
        self.reservation
    }
    /// l: the maximum rate, cost units per second; `None` means unlimited. At least the reservation.
    pub fn limit(&self) -> Option<f64> {
        self.limit
    }
    /// w: the share of what is left after reservations, relative to the other tenants' weights.
    pub fn weight(&self) -> f64 {
        self.weight
    }
    /// sigma: IOs of weight-phase credit the tenant may bank while idle, at most [`MAX_IDLE_CREDIT`].
    pub fn idle_credit(&self) -> u32 {
        self.idle_credit
    }
    /// The limit, or +infinity when unlimited (for oracles and reports).
    pub fn limit_or_inf(&self) -> f64 {
        self.limit.unwrap_or(f64::INFINITY)
    }
}

impl Default for QosSpec {
    fn default() -> Self {
        QosSpec { reservation: 0.0, limit: None, weight: 1.0, idle_credit: 0 }
    }
}

impl fmt::Display for QosSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r={} l=", self.reservation)?;
        match self.limit {
            Some(l) => write!(f, "{l}")?,
            None => write!(f, "inf")?,
        }
        write!(f, " w={} sigma={}", self.weight, self.idle_credit)
    }
}

/// What a rate `field` may be, for [`SpecError::RateOutOfRange`]: a reservation of 0 means none, a limit of
/// 0 is refused (it would stop the tenant; no limit is its absence: left out of a file, null in JSON).
fn allowed(field: &str, min: f64, max: f64) -> String {
    if field == "limit" {
        format!("between {min} and {max} (no limit: leave it out, or null in JSON)")
    } else {
        format!("0 (none) or between {min} and {max}")
    }
}

fn check_rate(field: &'static str, value: f64, zero_ok: bool) -> Result<(), SpecError> {
    if !value.is_finite() {
        return Err(SpecError::NotFinite { field, value });
    }
    if zero_ok && value == 0.0 {
        return Ok(());
    }
    if !(MIN_RATE..=MAX_RATE).contains(&value) {
        return Err(SpecError::RateOutOfRange { field, value, min: MIN_RATE, max: MAX_RATE });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_paper_settings() {
        // mClock §2.1: RD r=250 l=inf? (RD: r 250, w 1), OLTP w 2, DM w 3 l 1000.
        let rd = QosSpec::new(250.0, None, 1.0, 0).unwrap();
        assert_eq!(rd.reservation(), 250.0);
        assert_eq!(rd.limit_or_inf(), f64::INFINITY);
        assert!(QosSpec::new(0.0, Some(1000.0), 3.0, 256).is_ok());
    }

    #[test]
    fn rejects_bad_specs_with_clear_errors() {
        let e = QosSpec::new(500.0, Some(400.0), 1.0, 0).unwrap_err();
        assert_eq!(e.to_string(), "reservation 500 exceeds limit 400");
        assert!(matches!(QosSpec::new(f64::NAN, None, 1.0, 0), Err(SpecError::NotFinite { .. })));
        assert!(matches!(QosSpec::new(0.0, Some(f64::INFINITY), 1.0, 0), Err(SpecError::NotFinite { .. })));
        assert!(matches!(QosSpec::new(-1.0, None, 1.0, 0), Err(SpecError::RateOutOfRange { .. })));
        assert!(matches!(QosSpec::new(0.0, Some(0.0), 1.0, 0), Err(SpecError::RateOutOfRange { .. })));
        assert!(matches!(QosSpec::new(1e13, None, 1.0, 0), Err(SpecError::RateOutOfRange { .. })));
        assert!(matches!(QosSpec::new(0.0, None, 0.0, 0), Err(SpecError::WeightOutOfRange { .. })));
        assert!(matches!(QosSpec::new(0.0, None, -2.0, 0), Err(SpecError::WeightOutOfRange { .. })));
        assert!(matches!(QosSpec::new(0.0, None, f64::NAN, 0), Err(SpecError::NotFinite { .. })));
        assert!(matches!(QosSpec::new(0.0, None, 1.0, 257), Err(SpecError::IdleCreditTooLarge { .. })));
        let msg = QosSpec::new(0.0, None, 0.0, 0).unwrap_err().to_string();
        assert!(msg.contains("weight"), "{msg}");
        // A limit of 0 is refused, and the message does not offer 0 (a reservation of 0 is none).
        let msg = QosSpec::new(0.0, Some(0.0), 1.0, 0).unwrap_err().to_string();
        assert_eq!(
            msg,
            "limit must be between 0.001 and 1000000000000 (no limit: leave it out, or null in JSON), got 0"
        );
        let msg = QosSpec::new(-1.0, None, 1.0, 0).unwrap_err().to_string();
        assert_eq!(msg, "reservation must be 0 (none) or between 0.001 and 1000000000000, got -1");
    }
}
