//! Deliberately wrong schedulers, to show that a scenario's checks can fail.
//!
//! A check that holds whatever the scheduler does (throughput equals the uncontrolled run on a FIFO
//! array, utilisation of a backlogged server) proves nothing. [`Sabotage::apply`] turns a validated
//! scenario into the same scenario run by a scheduler that is wrong in one documented way; the scenario
//! test (`crates/rein-sim/tests/scenarios.rs`) runs every scenario's checks under each sabotage that
//! applies to it and requires at least one check to fail. Nothing here touches rein-core: each sabotage
//! is a setting the scenario files can already express (a scheduler, PARDA on or off, a pShift controller
//! on or off, the §III-C approximation), applied after validation.

use crate::model::expect::Subject;
use crate::model::Scenario;
use rein_core::SchedulerKind;
use std::sync::Arc;

/// A name that is no [`Sabotage`]; says which names are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sabotage {name:?} (expected one of {})", Sabotage::ALL.map(Sabotage::name).join(", "))]
pub struct UnknownSabotage {
    /// The name given.
    pub name: String,
}

impl std::str::FromStr for Sabotage {
    type Err = UnknownSabotage;

    /// The sabotage of this name ([`Sabotage::name`]), as written: `rein sim --sabotage NAME` (clap parses
    /// it with this, before the scenario is read).
    fn from_str(s: &str) -> Result<Sabotage, UnknownSabotage> {
        Sabotage::ALL.into_iter().find(|x| x.name() == s).ok_or_else(|| UnknownSabotage { name: s.to_string() })
    }
}

impl std::fmt::Display for Sabotage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One way of running a scenario with the wrong scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// FIFO in place of every server's scheduler (mClock, dmClock, RBFQ, SFQ, LFQ, DTFQ) and of PARDA
    /// hosts' local scheduler: no reservations, limits, weights or shares anywhere.
    Fifo,
    /// dmClock, RBFQ and DTFQ with delta and rho dropped: the gateways send zeros, so every server
    /// schedules as if each tenant used it alone (mClock, local RBFQ, LFQ).
    NoDeltaRho,
    /// PARDA hosts keep a fixed window (`[parda] enabled = false`): no latency control.
    FixedWindow,
    /// pShift without its controller: the servers run plain round robin (no tokens at all). Checks of
    /// the controller's tally (`count = "servers"`) are dropped: without a controller there is none to
    /// read, and validation refuses them then (they would miss on "no closed period", proving nothing).
    NoController,
    /// pShift's controller without token shifting: each interval's allocation is Algorithm 3's initial
    /// prudent one (the §III-C approximation with M = 0 buckets shifting), a naive split by demand.
    NoShift,
}

impl Sabotage {
    /// Every sabotage, in the order the scenario test tries them.
    pub const ALL: [Sabotage; 5] =
        [Sabotage::Fifo, Sabotage::NoDeltaRho, Sabotage::FixedWindow, Sabotage::NoController, Sabotage::NoShift];

    /// Its name (for test output and reports).
    pub fn name(self) -> &'static str {
        match self {
            Sabotage::Fifo => "fifo",
            Sabotage::NoDeltaRho => "no-delta-rho",
            Sabotage::FixedWindow => "fixed-window",
            Sabotage::NoController => "no-controller",
            Sabotage::NoShift => "no-shift",
        }
    }

    /// `sc` run by the wrong scheduler, or `None` when this sabotage changes nothing in `sc` (a FIFO
    /// scenario run by FIFO, PARDA already off, no distributed server, no pShift controller).
    pub fn apply(self, sc: &Scenario) -> Option<Scenario> {
        let mut s = self.change(sc)?;
        s.sabotage = Some(self.name());
        Some(s)
    }

    /// [`Sabotage::apply`]'s change to the scenario.
    fn change(self, sc: &Scenario) -> Option<Scenario> {
        match self {
            Sabotage::Fifo => {
                if sc.pshift.is_some() {
                    return None;
                }
                let changed = sc.servers.iter().any(|srv| srv.scheduler != SchedulerKind::Fifo)
                    || sc.parda.as_ref().is_some_and(|p| p.local_scheduler != SchedulerKind::Fifo);
                // FIFO fits any scenario without [pshift] (returned above).
                let mut s = sc.with_scheduler(SchedulerKind::Fifo, false).ok()?;
                if let Some(p) = &mut s.parda {
                    p.local_scheduler = SchedulerKind::Fifo;
                }
                changed.then_some(s)
            }
            Sabotage::NoDeltaRho => {
                let mut s = sc.clone();
                let mut changed = false;
                for srv in &mut s.servers {
                    changed |= srv.distributed;
                    srv.distributed = false;
                }
                changed.then_some(s)
            }
            Sabotage::FixedWindow => {
                let on = sc.parda.as_ref().is_some_and(|p| p.enabled) && sc.hosts.iter().any(|h| h.controlled);
                on.then(|| sc.without_parda())
            }
            Sabotage::NoController | Sabotage::NoShift => {
                let mut s = sc.clone();
                let ps = s.pshift.as_mut().filter(|p| p.controller)?;
                let ps = Arc::make_mut(ps);
                if self == Sabotage::NoController {
                    ps.controller = false;
                    s.expect.retain(|e| !matches!(e.subject, Subject::Periods { at_servers: true, .. }));
                } else {
                    ps.approx_top = Some(0);
                }
                Some(s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sabotage parses from its own name (what `rein sim --sabotage` takes) and prints as it;
    /// another name is refused listing them all, and names are not folded to lower case.
    #[test]
    fn a_sabotage_parses_from_its_name_only() {
        for s in Sabotage::ALL {
            assert_eq!(s.name().parse::<Sabotage>(), Ok(s));
            assert_eq!(s.to_string(), s.name());
        }
        let e = "FIFO".parse::<Sabotage>().unwrap_err();
        assert_eq!(e, UnknownSabotage { name: "FIFO".into() });
        assert_eq!(
            e.to_string(),
            "unknown sabotage \"FIFO\" (expected one of fifo, no-delta-rho, fixed-window, no-controller, no-shift)"
        );
    }
}
