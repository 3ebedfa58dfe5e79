//! A pShift controller's rounds (rounds.csv): what it computed at each interval boundary and early round,
//! simulated (`rein sim`) or read from a `rein pshift controller` (`GET /api/pshift`, `rein cluster
//! run`). One row per round answered, in order.
//!
//! `wanted` is the reservation IOs still wanted for the rest of the period (sum over buckets of
//! min(R_i - done_i, demand)); `r_phi` the R-tokens the solve placed where there is demand and capacity.
//! `wanted - r_phi` is reservation the controller could not place: a predicted miss.

use rein_core::pshift::RoundSummary;
use rein_core::Nanos;
use serde::{Deserialize, Serialize};

/// One round as the controller answered it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControllerRound {
    /// When it was answered (s from the schedule's origin: the run's start).
    pub at_s: f64,
    /// The boundary's number.
    pub round: u64,
    /// The QoS period.
    pub period: u64,
    /// The interval in the period.
    pub interval: u32,
    /// 0, or the early round's number.
    pub early: u32,
    /// Reservation IOs still wanted.
    pub wanted: u64,
    /// R-tokens placed where there is demand and capacity (the effective capacity Phi of the R class).
    pub r_phi: u64,
    /// The same for L-tokens.
    pub l_phi: u64,
    /// Servers whose report was missing.
    pub reports_missing: u32,
}

impl ControllerRound {
    /// The row for `r`, answered at `at` (from the schedule's origin).
    pub fn new(at: Nanos, r: &RoundSummary) -> ControllerRound {
        ControllerRound {
            at_s: at.as_secs_f64(),
            round: r.round,
            period: r.period,
            interval: r.interval,
            early: r.early,
            wanted: r.wanted,
            r_phi: r.r_stats.phi,
            l_phi: r.l_stats.phi,
            reports_missing: r.reports_missing,
        }
    }
}

/// rounds.csv: a header and one line per round.
pub fn to_csv(rounds: &[ControllerRound]) -> String {
    let mut out = String::from("at_s,period,interval,early,round,wanted,r_phi,l_phi,reports_missing\n");
    for r in rounds {
        out.push_str(&format!(
            "{:.6},{},{},{},{},{},{},{},{}\n",
            r.at_s, r.period, r.interval, r.early, r.round, r.wanted, r.r_phi, r.l_phi, r.reports_missing
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_csv_has_a_header_and_a_line_per_round() {
        let r = ControllerRound {
            at_s: 0.2005,
            round: 0,
            period: 0,
            interval: 0,
            early: 0,
            wanted: 4800,
            r_phi: 4700,
            l_phi: 9000,
            reports_missing: 1,
        };
        let csv = to_csv(&[r.clone(), ControllerRound { early: 1, at_s: 0.25, ..r }]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "at_s,period,interval,early,round,wanted,r_phi,l_phi,reports_missing");
        assert_eq!(lines[1], "0.200500,0,0,0,0,4800,4700,9000,1");
        assert_eq!(lines[2], "0.250000,0,0,1,0,4800,4700,9000,1");
        assert_eq!(lines.len(), 3);
    }
}
