//! Helpers shared by the scenario-validation tests (`mod common;` in each).

use rein_sim::Scenario;

/// The error a scenario's text is rejected with (panics if it is accepted).
pub(crate) fn err(toml: &str) -> String {
    Scenario::from_toml(toml, None).expect_err("should be rejected").to_string()
}
