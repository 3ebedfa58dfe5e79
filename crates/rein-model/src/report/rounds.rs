//! A pShift controller's rounds (rounds.csv): what it computed at each interval boundary and early round,
//! simulated (`rein sim`) or read from a `rein pshift controller` (`GET /api/pshift`, `rein cluster
//! run`). One row per round answered, in order.
//!
//! `wanted` is the reservation IOs still wanted for the rest of the period (sum over buckets of
//! min(R_i - done_i, demand)); `r_phi` the R-tokens the solve placed where there is demand and capacity.
//! `wanted - r_phi` is reservation the controller could not place: a predicted miss.
//!
//! [`PeriodCounts`]: per bucket, the QoS periods the controller closed, by the servers' own counts
//! (rein-core's controller, "Periods counted at the servers"); `rein sim` and `rein cluster run` print
//! them after the tenants, and `rein pshift controller`'s `/api/pshift` shows them per bucket.
//!
//! [`PeriodLog`] (periods.csv): the same periods one by one, each bucket's IOs completed in each, judged
//! against its R_i and L_i with its demand in the period by rein-core's rule ([`BucketQos::judge`]);
//! `/api/pshift/periods` serves the real controller's.

use rein_core::pshift::{BucketQos, ClosedPeriod, PeriodDemand, PeriodTally, PeriodVerdict, RoundSummary};
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

/// A bucket's closed QoS periods, counted at the servers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodCounts {
    /// Periods closed.
    pub closed: u64,
    /// Complete periods with fewer IOs completed than the reservation, whatever the demand (the paper's
    /// rule).
    pub below_reservation: u64,
    /// Of those, the periods in which the bucket had the demand for its reservation (it asked for R_i IOs,
    /// or was backlogged through an interval, holding requests from the period's start to its close): the
    /// reservation missed (rein-core's controller, "A period's demand").
    #[serde(default)]
    pub below_reservation_with_demand: u64,
    /// Complete periods with more IOs completed than the limit.
    pub above_limit: u64,
    /// Periods with a server's report missing: counted, not judged.
    pub incomplete: u64,
    /// IOs completed in the last closed period.
    pub last: Option<u64>,
}

impl From<PeriodTally> for PeriodCounts {
    fn from(t: PeriodTally) -> PeriodCounts {
        PeriodCounts {
            closed: t.closed,
            below_reservation: t.below_reservation,
            below_reservation_with_demand: t.below_reservation_with_demand,
            above_limit: t.above_limit,
            incomplete: t.incomplete,
            last: t.last,
        }
    }
}

/// One closed QoS period: each bucket's IOs completed in it, by the servers' counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeriodRecord {
    /// When its record was finished (s from the schedule's origin): the round that closed it was
    /// answered, or, for a period that waited for a late report (rein-core's controller, "Late
    /// reports"), that report came or the next round was answered.
    pub at_s: f64,
    /// The period's number (0 = the first after the controller's `start`).
    pub period: u64,
    /// A server's report of one of its boundaries was still missing an interval after its close: the
    /// counts are not exact (rein-core's `ClosedPeriod`), and not judged.
    pub incomplete: bool,
    /// Per bucket (index order), its IOs completed in the period.
    pub completed: Vec<u64>,
    /// Per bucket (index order), its demand in the period (rein-core's `PeriodDemand`): the IOs it asked
    /// for (those completed plus those still queued at the close), or `null` when it was backlogged
    /// through an interval (its demand not counted: it had the demand). Empty in a record without it (a
    /// controller of an older build): then every period below R_i counts as having the demand.
    #[serde(default)]
    pub demand: Vec<Option<u64>>,
}

impl PeriodRecord {
    /// The record of `c`, finished at `at` (from the schedule's origin).
    pub fn new(at: Nanos, c: &ClosedPeriod) -> PeriodRecord {
        let demand = c.demand.iter().map(|d| match *d {
            PeriodDemand::Asked(n) => Some(n),
            PeriodDemand::Backlogged => None,
        });
        PeriodRecord {
            at_s: at.as_secs_f64(),
            period: c.period,
            incomplete: c.incomplete,
            completed: c.completed.clone(),
            demand: demand.collect(),
        }
    }

    /// Bucket `b`'s demand in the period ([`PeriodRecord::demand`]; backlogged where the record has none).
    pub fn demand_of(&self, b: usize) -> PeriodDemand {
        self.demand.get(b).copied().flatten().map_or(PeriodDemand::Backlogged, PeriodDemand::Asked)
    }
}

/// A pShift run's closed periods one by one (periods.csv).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeriodLog {
    /// Per bucket (index order): its name, and R_i and L_i per period.
    pub buckets: Vec<(String, BucketQos)>,
    /// The closed periods, oldest first.
    pub records: Vec<PeriodRecord>,
}

impl PeriodLog {
    /// Bucket `b`'s IOs in record `r` and their verdict (`None`: incomplete, not judged).
    pub fn cell(&self, r: &PeriodRecord, b: usize) -> Option<(u64, Option<PeriodVerdict>)> {
        let (&c, (_, q)) = (r.completed.get(b)?, self.buckets.get(b)?);
        Some((c, (!r.incomplete).then(|| q.judge(c, r.demand_of(b)))))
    }

    /// periods.csv: a header and one line per bucket and period; `verdict` is `met`,
    /// `below_reservation` (fewer than R_i, with the demand for R_i: the reservation missed),
    /// `low_demand` (fewer than R_i for want of demand: the bucket asked for fewer; the paper's rule
    /// counts it below the reservation too), `above_limit`, or `incomplete` (a report was missing: not
    /// judged).
    pub fn to_csv(&self) -> String {
        let mut out = String::from("period,closed_at_s,bucket,completed,reservation,limit,verdict\n");
        for r in &self.records {
            for (b, (name, q)) in self.buckets.iter().enumerate() {
                let Some((c, verdict)) = self.cell(r, b) else { continue };
                let verdict = match verdict {
                    None => "incomplete",
                    Some(PeriodVerdict::Met) => "met",
                    Some(PeriodVerdict::BelowReservation { with_demand: true }) => "below_reservation",
                    Some(PeriodVerdict::BelowReservation { with_demand: false }) => "low_demand",
                    Some(PeriodVerdict::AboveLimit) => "above_limit",
                };
                let limit = q.limit.map_or(String::new(), |l| l.to_string());
                out.push_str(&format!(
                    "{},{:.6},{},{},{},{},{}\n",
                    r.period,
                    r.at_s,
                    super::csv_field(name),
                    c,
                    q.reservation,
                    limit,
                    verdict
                ));
            }
        }
        out
    }
}

/// One line over every bucket's closed periods, then the buckets that passed their limit or fell short
/// of their reservation (at most `max_named` each); empty without periods.
pub fn periods_text(buckets: &[(String, PeriodCounts)], max_named: usize) -> String {
    let sum = |f: fn(&PeriodCounts) -> u64| buckets.iter().map(|(_, c)| f(c)).sum::<u64>();
    let closed = sum(|c| c.closed);
    if closed == 0 {
        return String::new();
    }
    let mut out = format!(
        "pShift periods by the servers' counts: {closed} bucket-periods closed, {} below the reservation ({} with \
         the demand for it), {} above the limit, {} incomplete\n",
        sum(|c| c.below_reservation),
        sum(|c| c.below_reservation_with_demand),
        sum(|c| c.above_limit),
        sum(|c| c.incomplete)
    );
    for (what, get) in [
        ("above the limit", (|c: &PeriodCounts| c.above_limit) as fn(&PeriodCounts) -> u64),
        ("below the reservation", |c| c.below_reservation),
    ] {
        let named: Vec<String> = buckets
            .iter()
            .filter(|(_, c)| get(c) > 0)
            .map(|(n, c)| format!("{n} ({} of {})", get(c), c.closed))
            .collect();
        if !named.is_empty() {
            out.push_str(&format!("  {what}: {}\n", super::first_names(&named, max_named)));
        }
    }
    out
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

    #[test]
    fn periods_csv_has_a_line_per_bucket_and_period_judged_against_its_bounds() {
        let log = PeriodLog {
            buckets: vec![
                ("b1".into(), BucketQos { reservation: 500, limit: Some(700) }),
                ("b2".into(), BucketQos { reservation: 0, limit: None }),
            ],
            records: vec![
                // A record without demands (an older controller's): judged as having the demand.
                PeriodRecord { at_s: 1.2005, period: 0, incomplete: false, completed: vec![689, 12], demand: vec![] },
                PeriodRecord {
                    at_s: 2.2,
                    period: 1,
                    incomplete: false,
                    completed: vec![404, 0],
                    demand: vec![Some(500), Some(0)],
                },
                PeriodRecord {
                    at_s: 3.2,
                    period: 2,
                    incomplete: false,
                    completed: vec![701, 5],
                    demand: vec![Some(701), None],
                },
                PeriodRecord {
                    at_s: 4.2,
                    period: 3,
                    incomplete: true,
                    completed: vec![10, 5],
                    demand: vec![Some(10), None],
                },
                PeriodRecord {
                    at_s: 5.2,
                    period: 4,
                    incomplete: false,
                    completed: vec![404, 0],
                    demand: vec![Some(499), None],
                },
                PeriodRecord {
                    at_s: 6.2,
                    period: 5,
                    incomplete: false,
                    completed: vec![3, 0],
                    demand: vec![None, Some(0)],
                },
                PeriodRecord { at_s: 7.2, period: 6, incomplete: false, completed: vec![404, 0], demand: vec![] },
            ],
        };
        let csv = log.to_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "period,closed_at_s,bucket,completed,reservation,limit,verdict");
        assert_eq!(lines[1], "0,1.200500,b1,689,500,700,met");
        assert_eq!(lines[2], "0,1.200500,b2,12,0,,met");
        assert_eq!(lines[3], "1,2.200000,b1,404,500,700,below_reservation", "asked for R");
        assert_eq!(lines[5], "2,3.200000,b1,701,500,700,above_limit");
        assert_eq!(lines[7], "3,4.200000,b1,10,500,700,incomplete");
        assert_eq!(lines[9], "4,5.200000,b1,404,500,700,low_demand", "asked for R - 1");
        assert_eq!(lines[11], "5,6.200000,b1,3,500,700,below_reservation", "backlogged");
        assert_eq!(lines[13], "6,7.200000,b1,404,500,700,below_reservation", "no demand recorded");
        assert_eq!(lines.len(), 15);
        let c = ClosedPeriod {
            period: 7,
            incomplete: true,
            completed: vec![3, 4],
            demand: vec![PeriodDemand::Asked(9), PeriodDemand::Backlogged],
        };
        let r = PeriodRecord::new(Nanos::from_millis(8200), &c);
        assert_eq!((r.at_s, r.period, r.incomplete, &r.completed), (8.2, 7, true, &vec![3, 4]));
        assert_eq!(r.demand, [Some(9), None]);
        assert_eq!(
            (r.demand_of(0), r.demand_of(1), r.demand_of(2)),
            (c.demand[0], c.demand[1], PeriodDemand::Backlogged)
        );
        // In JSON (`/api/pshift/periods`) a backlogged bucket's demand is null, and a record without it reads.
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""demand":[9,null]"#), "{json}");
        let old: PeriodRecord =
            serde_json::from_str(r#"{"at_s":1.0,"period":0,"incomplete":false,"completed":[5]}"#).unwrap();
        assert_eq!(old.demand, []);
    }

    #[test]
    fn periods_text_sums_and_names_the_buckets_out_of_bounds() {
        let c = |closed, below, above| PeriodCounts {
            closed,
            below_reservation: below,
            below_reservation_with_demand: below.min(1),
            above_limit: above,
            ..Default::default()
        };
        let text = periods_text(&[("b1".into(), c(4, 0, 0)), ("b4".into(), c(4, 2, 2)), ("b5".into(), c(4, 0, 1))], 1);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "pShift periods by the servers' counts: 12 bucket-periods closed, 2 below the reservation (1 with the demand for it), 3 above the limit, 0 incomplete"
        );
        assert_eq!(lines[1], "  above the limit: b4 (2 of 4) and 1 more");
        assert_eq!(lines[2], "  below the reservation: b4 (2 of 4)");
        assert_eq!(periods_text(&[("b1".into(), c(0, 0, 0))], 8), "");
    }
}
