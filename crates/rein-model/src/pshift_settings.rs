//! The token scheduler's variant as a `[pshift]` table writes it, in a scenario (every server of a pShift
//! cluster) and in `rein serve`'s config (one server): one parser, so `r_order = "round_robin"` means
//! the same to both (as [`crate::sched_settings`] does for `[mclock]`).
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

/// The R order from `r_order` and `r_floor_ios` as written; errors name the key.
pub fn r_order(order: Option<&str>, floor: Option<u64>) -> Result<ROrder, String> {
    Ok(match (order, floor) {
        (None | Some("mixed"), floor) => match floor.unwrap_or(ROrder::DEFAULT_FLOOR) {
            floor @ 1..=1_000_000_000 => ROrder::Mixed { floor },
            o => return Err(format!("pshift.r_floor_ios {o}: expected 1 to 1000000000")),
        },
        (_, Some(_)) => return Err("pshift.r_floor_ios is a setting of r_order = \"mixed\"".into()),
        (Some("round_robin"), None) => ROrder::RoundRobin,
        (Some("proportional"), None) => ROrder::Proportional,
        (Some(o), None) => return Err(format!("pshift.r_order {o:?}: expected round_robin, proportional or mixed")),
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
        assert!(r_order(Some("fifo"), None).unwrap_err().contains("pshift.r_order \"fifo\""));
        assert!(r_order(Some("round_robin"), Some(5)).unwrap_err().contains("r_floor_ios is a setting of"));
        assert!(r_order(None, Some(0)).unwrap_err().contains("pshift.r_floor_ios 0"));
    }
}
