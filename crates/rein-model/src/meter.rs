//! The reservation meter: did a tenant get its reservation? One rule for the simulator's checks and
//! `rein serve`'s `/metrics`.
//!
//! # Rule
//! Over a period of `secs` seconds a tenant with reservation `r` (IOPS, or the cost model's units per
//! second) *met* it when it was served at least `threshold_pct`% of `r x secs`, up to a slack for
//! rounding: `served + slack >= r * secs * threshold_pct / 100`. A tenant without a reservation always
//! meets it.
//!
//! Two settings of the rule:
//! - [`ReservationMeter::periodic`]: pShift's measure (pshift.txt §IV): every (tenant, QoS period) pair
//!   counts, whatever the tenant asked for; slack 1e-9 (floating-point only). The simulator's
//!   `reservation_met_fraction` expectations use it.
//! - [`ReservationMeter::per_second`]: the operator's measure: one-second periods, threshold 100%, slack
//!   one IO (a period boundary can fall inside an IO), and a period counts as *below* only if the tenant
//!   was backlogged (had requests waiting or in service) when it began and when it ended: a tenant that
//!   asks for less than its reservation is not short-changed. `rein serve` reports the length of such
//!   periods as `rein_tenant_below_reservation_seconds_total` ([`ReservationMeter::below_seconds`]: a
//!   period that a stall of the server stretched counts its whole length).
//!
//! # Driving it (sans-IO)
//! [`ReservationMeter::observe`] at each period boundary, with the time, the tenant's cumulative served
//! amount and whether it is backlogged; the meter closes the period since the previous call.

use rein_core::Nanos;

/// Whether a period closed by [`ReservationMeter::observe`] met the reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Served at least the reservation (or no reservation).
    Met,
    /// Served less while backlogged at both ends of the period.
    Below,
    /// Served less, but the tenant was not backlogged throughout: it asked for less.
    Idle,
}

/// A tenant's reservation meter (module comment).
#[derive(Debug, Clone, PartialEq)]
pub struct ReservationMeter {
    reservation: f64,
    threshold_pct: f64,
    slack: f64,
    /// The previous boundary: (time, cumulative served, backlogged).
    last: Option<(Nanos, f64, bool)>,
    periods: u64,
    met: u64,
    below: u64,
    /// The length of the periods counted in `below` (seconds).
    below_s: f64,
}

impl ReservationMeter {
    /// pShift's measure: met when served `>= threshold_pct`% of the reservation over the period.
    pub fn periodic(reservation: f64, threshold_pct: f64) -> ReservationMeter {
        ReservationMeter { threshold_pct, slack: 1e-9, ..Self::per_second(reservation) }
    }

    /// The operator's per-second measure (module comment).
    pub fn per_second(reservation: f64) -> ReservationMeter {
        ReservationMeter {
            reservation,
            threshold_pct: 100.0,
            slack: 1.0,
            last: None,
            periods: 0,
            met: 0,
            below: 0,
            below_s: 0.0,
        }
    }

    /// Changes the reservation (a runtime spec change); applies to periods closed from now on.
    pub fn set_reservation(&mut self, reservation: f64) {
        self.reservation = reservation;
    }

    /// The rule: was `served` over `secs` seconds enough?
    pub fn met(&self, served: f64, secs: f64) -> bool {
        self.reservation <= 0.0 || served + self.slack >= self.reservation * secs * self.threshold_pct / 100.0
    }

    /// A period boundary at `now`: `served_total` is the tenant's cumulative service, `backlogged`
    /// whether it has requests waiting or in service. Closes the period since the previous boundary and
    /// returns its outcome (`None` at the first boundary, or when no time passed).
    pub fn observe(&mut self, now: Nanos, served_total: f64, backlogged: bool) -> Option<Outcome> {
        let last = self.last.replace((now, served_total, backlogged));
        let (t0, served0, backlogged0) = last?;
        let secs = now.saturating_sub(t0).as_secs_f64();
        if secs <= 0.0 {
            return None;
        }
        self.periods += 1;
        let outcome = if self.met((served_total - served0).max(0.0), secs) {
            self.met += 1;
            Outcome::Met
        } else if backlogged0 && backlogged {
            self.below += 1;
            self.below_s += secs;
            Outcome::Below
        } else {
            Outcome::Idle
        };
        Some(outcome)
    }

    /// Periods closed so far.
    pub fn periods(&self) -> u64 {
        self.periods
    }

    /// Periods that met the reservation.
    pub fn met_periods(&self) -> u64 {
        self.met
    }

    /// Periods below the reservation while backlogged throughout.
    pub fn below_periods(&self) -> u64 {
        self.below
    }

    /// Their length in seconds: a period is a second when its boundaries come on time, and longer when
    /// they do not (a stall of the process that drives the meter: 30 s without a boundary, and without
    /// service, are 30 seconds below the reservation, not one).
    pub fn below_seconds(&self) -> f64 {
        self.below_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_counts_only_backlogged_shortfalls() {
        let mut m = ReservationMeter::per_second(100.0);
        let s = Nanos::from_secs;
        assert_eq!(m.observe(s(0), 0.0, true), None);
        assert_eq!(m.observe(s(1), 100.0, true), Some(Outcome::Met));
        assert_eq!(m.observe(s(2), 199.0, true), Some(Outcome::Met), "one IO of slack");
        assert_eq!(m.observe(s(3), 250.0, true), Some(Outcome::Below));
        assert_eq!(m.observe(s(4), 260.0, false), Some(Outcome::Idle), "it asked for less");
        assert_eq!(m.observe(s(4), 260.0, false), None, "no time passed");
        assert_eq!((m.periods(), m.met_periods(), m.below_periods(), m.below_seconds()), (4, 2, 1, 1.0));
        assert_eq!(m.observe(s(5), 260.0, true), Some(Outcome::Idle), "backlogged from now on");
        // A boundary 30 s late (the process stalled), nothing served: one period, 30 seconds.
        assert_eq!(m.observe(s(35), 260.0, true), Some(Outcome::Below));
        assert_eq!((m.below_periods(), m.below_seconds()), (2, 31.0));
        m.set_reservation(0.0);
        assert_eq!(m.observe(s(36), 260.0, true), Some(Outcome::Met), "no reservation is always met");
    }

    #[test]
    fn periodic_uses_the_threshold() {
        let m = ReservationMeter::periodic(1000.0, 95.0);
        assert!(m.met(950.0, 1.0));
        assert!(!m.met(949.0, 1.0));
        assert!(ReservationMeter::periodic(0.0, 100.0).met(0.0, 1.0));
    }
}
