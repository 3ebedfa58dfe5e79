//! The token scheduler's variant as a `[pshift]` table writes it, in a scenario (every server of a pShift
//! cluster) and in `rein serve`'s config (one server): one parser, so `r_order = "round_robin"` means
//! the same to both (as [`crate::sched_settings`] does for `[mclock]`); and the controller's demand
//! estimator, for a scenario's `[pshift]` and `rein pshift controller`'s file ([`estimator`]).
//!
//! ```toml
//! [pshift]
//! r_order = "mixed"   # how R-token holders share a server: mixed (the default: in proportion to their
//!                     #   grants, a grant under r_floor_ios spent at the pace of one of that size) |
//!                     #   round_robin (Algorithm 1 as written) | proportional
//! r_floor_ios = 1000  # with mixed only (1..=1e9)
//! weighted = false    # §V "Local Priorities": weighted round robin by tenant weight
//! ```

use rein_core::pshift::tokens::ROrder;
use rein_core::pshift::{ControllerConfig, DemandEstimator};

/// The controller's demand estimator from `estimator` and `backlog_idle_pct` as written (keys of a
/// scenario's `[pshift]`, `prefix` "pshift.", and of `rein pshift controller`'s file, prefix ""): the
/// estimator and the backlog estimator's idle share in basis points. Errors name the key.
///
/// ```toml
/// estimator = "backlog"      # arrivals (the default: the paper's) | backlog (closed loops)
/// backlog_idle_pct = 1.0     # with backlog only: a queue empty for less than this % of an interval is
///                            #   backlogged (0.01 to 100; default 1)
/// ```
pub fn estimator(
    prefix: &'static str,
    name: Option<&str>,
    idle_pct: Option<f64>,
) -> Result<(DemandEstimator, u32), EstimatorError> {
    let e = match name {
        None | Some("arrivals") => DemandEstimator::Arrivals,
        Some("backlog") => DemandEstimator::Backlog,
        Some(o) => return Err(EstimatorError::Unknown { prefix, got: o.to_string() }),
    };
    let bp = match (e, idle_pct) {
        (_, None) => ControllerConfig::DEFAULT_BACKLOG_IDLE_BP,
        (DemandEstimator::Arrivals, Some(_)) => return Err(EstimatorError::IdlePctWithoutBacklog { prefix }),
        (DemandEstimator::Backlog, Some(p)) if p.is_finite() && (MIN_IDLE_PCT..=MAX_IDLE_PCT).contains(&p) => {
            (p * 100.0).round() as u32
        }
        (DemandEstimator::Backlog, Some(got)) => {
            return Err(EstimatorError::IdlePct { prefix, got, min: MIN_IDLE_PCT, max: MAX_IDLE_PCT })
        }
    };
    Ok((e, bp))
}

/// The smallest `backlog_idle_pct`.
pub const MIN_IDLE_PCT: f64 = 0.01;
/// The largest `backlog_idle_pct`.
pub const MAX_IDLE_PCT: f64 = 100.0;

/// Why `estimator` or `backlog_idle_pct` is refused ([`estimator`]); the message names the key, after
/// the caller's prefix (`pshift.` in a scenario, none in ctl.toml).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EstimatorError {
    /// `estimator` names no estimator.
    #[error("{prefix}estimator {got:?}: expected \"arrivals\" or \"backlog\"")]
    Unknown {
        /// The keys' prefix.
        prefix: &'static str,
        /// The word given.
        got: String,
    },
    /// `backlog_idle_pct` with the arrivals estimator.
    #[error("{prefix}backlog_idle_pct is a setting of estimator = \"backlog\"")]
    IdlePctWithoutBacklog {
        /// The keys' prefix.
        prefix: &'static str,
    },
    /// `backlog_idle_pct` outside `[min, max]` or not finite.
    #[error("{prefix}backlog_idle_pct {got}: expected {min} to {max} (% of an interval)")]
    IdlePct {
        /// The keys' prefix.
        prefix: &'static str,
        /// The value given.
        got: f64,
        /// The smallest accepted ([`MIN_IDLE_PCT`]).
        min: f64,
        /// The largest accepted ([`MAX_IDLE_PCT`]).
        max: f64,
    },
}

/// `estimator` and `backlog_idle_pct` as written for `e` and `bp` (what [`estimator`] reads back).
pub fn estimator_keys(e: DemandEstimator, bp: u32) -> String {
    match e {
        DemandEstimator::Arrivals => "estimator = \"arrivals\"\n".into(),
        DemandEstimator::Backlog => format!("estimator = \"backlog\"\nbacklog_idle_pct = {}\n", f64::from(bp) / 100.0),
    }
}

/// The smallest `r_floor_ios`.
pub const MIN_R_FLOOR_IOS: u64 = 1;
/// The largest `r_floor_ios`.
pub const MAX_R_FLOOR_IOS: u64 = 1_000_000_000;

/// Why `[pshift] r_order` or `r_floor_ios` is refused ([`r_order`]); the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ROrderError {
    /// `r_floor_ios` outside `min..=max`.
    #[error("pshift.r_floor_ios {got}: expected {min} to {max}")]
    Floor {
        /// The value given.
        got: u64,
        /// The smallest accepted ([`MIN_R_FLOOR_IOS`]).
        min: u64,
        /// The largest accepted ([`MAX_R_FLOOR_IOS`]).
        max: u64,
    },
    /// `r_floor_ios` with an `r_order` other than `mixed`.
    #[error("pshift.r_floor_ios is a setting of r_order = \"mixed\"")]
    FloorWithoutMixed,
    /// `r_order` names no order.
    #[error("pshift.r_order {got:?}: expected round_robin, proportional or mixed")]
    Unknown {
        /// The word given.
        got: String,
    },
}

/// The R order from `r_order` and `r_floor_ios` as written; errors name the key.
pub fn r_order(order: Option<&str>, floor: Option<u64>) -> Result<ROrder, ROrderError> {
    Ok(match (order, floor) {
        (None | Some("mixed"), floor) => match floor.unwrap_or(ROrder::DEFAULT_FLOOR) {
            floor @ MIN_R_FLOOR_IOS..=MAX_R_FLOOR_IOS => ROrder::Mixed { floor },
            got => return Err(ROrderError::Floor { got, min: MIN_R_FLOOR_IOS, max: MAX_R_FLOOR_IOS }),
        },
        (_, Some(_)) => return Err(ROrderError::FloorWithoutMixed),
        (Some("round_robin"), None) => ROrder::RoundRobin,
        (Some("proportional"), None) => ROrder::Proportional,
        (Some(o), None) => return Err(ROrderError::Unknown { got: o.to_string() }),
    })
}

/// `r_order` and `r_floor_ios` as written for `o` (what [`r_order`] reads back as `o`).
pub fn r_order_keys(o: ROrder) -> String {
    match o {
        ROrder::RoundRobin => "r_order = \"round_robin\"\n".into(),
        ROrder::Proportional => "r_order = \"proportional\"\n".into(),
        ROrder::Mixed { floor } => format!("r_order = \"mixed\"\nr_floor_ios = {floor}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_order_reads_back_and_bad_keys_are_named() {
        for o in [ROrder::RoundRobin, ROrder::Proportional, ROrder::Mixed { floor: 40 }, ROrder::default()] {
            #[derive(serde::Deserialize)]
            struct T {
                r_order: Option<String>,
                r_floor_ios: Option<u64>,
            }
            let t: T = toml::from_str(&r_order_keys(o)).unwrap();
            assert_eq!(r_order(t.r_order.as_deref(), t.r_floor_ios).unwrap(), o);
        }
        assert_eq!(r_order(None, None).unwrap(), ROrder::default());
        assert!(r_order(Some("fifo"), None).unwrap_err().to_string().contains("pshift.r_order \"fifo\""));
        assert!(r_order(Some("round_robin"), Some(5)).unwrap_err().to_string().contains("r_floor_ios is a setting of"));
        assert!(r_order(None, Some(0)).unwrap_err().to_string().contains("pshift.r_floor_ios 0"));
    }

    /// The refusals are typed: the key's value and its bounds, as the messages of before.
    #[test]
    fn r_order_errors_are_typed_with_the_value_and_bounds() {
        let floor = |got| ROrderError::Floor { got, min: 1, max: 1_000_000_000 };
        assert_eq!(r_order(None, Some(0)), Err(floor(0)));
        assert_eq!(r_order(Some("mixed"), Some(1_000_000_001)), Err(floor(1_000_000_001)));
        assert_eq!(r_order(Some("mixed"), Some(1_000_000_000)), Ok(ROrder::Mixed { floor: 1_000_000_000 }));
        assert_eq!(r_order(Some("proportional"), Some(5)), Err(ROrderError::FloorWithoutMixed));
        assert_eq!(r_order(Some("fifo"), None), Err(ROrderError::Unknown { got: "fifo".into() }));
        assert_eq!(floor(0).to_string(), "pshift.r_floor_ios 0: expected 1 to 1000000000");
        assert_eq!(
            ROrderError::FloorWithoutMixed.to_string(),
            "pshift.r_floor_ios is a setting of r_order = \"mixed\""
        );
        assert_eq!(
            ROrderError::Unknown { got: "fifo".into() }.to_string(),
            "pshift.r_order \"fifo\": expected round_robin, proportional or mixed"
        );
    }

    #[test]
    fn estimators_read_back_and_bad_keys_are_named() {
        #[derive(serde::Deserialize)]
        struct T {
            estimator: Option<String>,
            backlog_idle_pct: Option<f64>,
        }
        for (e, bp) in
            [(DemandEstimator::Arrivals, 100), (DemandEstimator::Backlog, 100), (DemandEstimator::Backlog, 1)]
        {
            let t: T = toml::from_str(&estimator_keys(e, bp)).unwrap();
            assert_eq!(estimator("", t.estimator.as_deref(), t.backlog_idle_pct).unwrap(), (e, bp));
        }
        assert_eq!(estimator("", None, None).unwrap(), (DemandEstimator::Arrivals, 100));
        assert_eq!(estimator("", Some("backlog"), Some(2.5)).unwrap(), (DemandEstimator::Backlog, 250));
        assert!(estimator("pshift.", Some("x"), None).unwrap_err().to_string().contains("pshift.estimator \"x\""));
        assert!(estimator("", None, Some(2.0)).unwrap_err().to_string().contains("backlog_idle_pct is a setting of"));
        assert!(estimator("", Some("backlog"), Some(0.0))
            .unwrap_err()
            .to_string()
            .contains("backlog_idle_pct 0: expected"));
        assert!(estimator("", Some("backlog"), Some(f64::NAN))
            .unwrap_err()
            .to_string()
            .contains("backlog_idle_pct NaN"));
    }

    /// The estimator's refusals are typed: the prefix, the value and the bounds, as the messages of before.
    #[test]
    fn estimator_errors_are_typed_with_the_value_and_bounds() {
        let e = estimator("pshift.", Some("psychic"), None).unwrap_err();
        assert_eq!(e, EstimatorError::Unknown { prefix: "pshift.", got: "psychic".into() });
        assert_eq!(e.to_string(), "pshift.estimator \"psychic\": expected \"arrivals\" or \"backlog\"");
        let e = estimator("", Some("arrivals"), Some(1.0)).unwrap_err();
        assert_eq!(e, EstimatorError::IdlePctWithoutBacklog { prefix: "" });
        assert_eq!(e.to_string(), "backlog_idle_pct is a setting of estimator = \"backlog\"");
        let e = estimator("pshift.", Some("backlog"), Some(100.5)).unwrap_err();
        assert_eq!(e, EstimatorError::IdlePct { prefix: "pshift.", got: 100.5, min: 0.01, max: 100.0 });
        assert_eq!(e.to_string(), "pshift.backlog_idle_pct 100.5: expected 0.01 to 100 (% of an interval)");
        assert_eq!(estimator("", Some("backlog"), Some(0.01)).unwrap(), (DemandEstimator::Backlog, 1), "at the bound");
        assert_eq!(estimator("", Some("backlog"), Some(100.0)).unwrap(), (DemandEstimator::Backlog, 10_000));
    }
}
