//! Validated expectations: what `--check` verifies, as typed values (subject and metric resolved, the
//! target one of a closed set), so the check layer never looks names up or matches strings again.

use super::parda::Host;
use super::server::Server;
use super::tenant::Tenant;
use crate::file::ExpectFile;
use rein_model::report::hosts::{HostMetric, HostSubject};
use rein_model::report::{PeriodMetric, ServerMetric, TenantMetric};

/// What an expectation measures, and what it compares with (with `within_pct`): each subject has its
/// own closed set of targets, so a target that does not fit its subject cannot be built.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    /// A tenant's metric (index into `Scenario::tenants`).
    Tenant {
        /// The tenant.
        tenant: usize,
        /// The metric.
        metric: TenantMetric,
        /// What it compares with.
        target: Option<TenantTarget>,
    },
    /// A server's metric.
    Server {
        /// The server.
        server: usize,
        /// The metric.
        metric: ServerMetric,
        /// A number it compares with.
        equals: Option<f64>,
    },
    /// A share of (tenant, QoS period) pairs (pShift): one tenant's, or all tenants' (`None`).
    Periods {
        /// The tenant, or all.
        tenant: Option<usize>,
        /// The metric.
        metric: PeriodMetric,
        /// The threshold (percent): 100 by default for reservations, 0 for limits.
        threshold_pct: f64,
        /// Judged on the controller's tally of closed periods (the servers' counts) rather than on what
        /// the load saw per period (then `threshold_pct` is the default and the window is the run).
        at_servers: bool,
        /// A number it compares with.
        equals: Option<f64>,
    },
    /// A PARDA host's (or the cluster's) metric.
    Host {
        /// A host or all.
        who: HostSubject,
        /// The metric.
        metric: HostMetric,
        /// Convergence band (percent, default 10).
        band_pct: f64,
        /// What it compares with.
        target: Option<HostTarget>,
    },
}

/// What a tenant's metric compares with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TenantTarget {
    /// A number.
    Equals(f64),
    /// The fluid oracle's IOPS (mClock eq. (1)-(2)) for the window's measured total throughput.
    Oracle,
    /// Another tenant's value of the same metric, times `ratio`.
    Ratio {
        /// The other tenant.
        tenant: usize,
        /// The ratio.
        ratio: f64,
    },
    /// Every other tenant's value of the same metric: the subject's must be strictly below all of them
    /// (`Lowest`) or above all of them (`Highest`), as a paper's "the minimum happens for ..." says.
    Rank(Rank),
}

/// Where a tenant's value must stand among every tenant's ([`TenantTarget::Rank`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rank {
    /// Below every other tenant's.
    Lowest,
    /// Above every other tenant's.
    Highest,
}

/// What a host's (or the cluster's) metric compares with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HostTarget {
    /// A number.
    Equals(f64),
    /// Another host's value of the same metric, times a fixed ratio (the subject is a host, not "all").
    Ratio {
        /// The other host.
        host: usize,
        /// The ratio.
        ratio: f64,
    },
    /// Another host's value of the same metric, times the ratio of the two hosts' betas (means over the
    /// window).
    BetaRatio {
        /// The subject's host (the numerator's beta).
        host: usize,
        /// The other host (the denominator's beta, and the value scaled).
        other: usize,
    },
    /// eq. (3)'s equilibrium window, or latency `script_L + sum beta / C`.
    Equilibrium,
    /// PARDA's latency threshold script-L (for latency metrics).
    Threshold,
    /// eq. (2)'s fixed point with the host's own mean beta and mean latency signal L over the window: the
    /// window `w = beta L / (L - script_L)`, or (Little's law, for a host that keeps its window full) the
    /// IOPS `w` over the host's own mean latency.
    FixedPoint {
        /// The host.
        host: usize,
    },
    /// The same metric in the same scenario without PARDA (the check asks for that run).
    Uncontrolled,
}

/// One validated `[[expect]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    /// What is measured, and its target.
    pub subject: Subject,
    /// `[a, b]` seconds; `None`: from the warm-up to the end.
    pub window: Option<[f64; 2]>,
    /// Tolerance of the target (percent).
    pub within_pct: Option<f64>,
    /// The value must be below this.
    pub below: Option<f64>,
    /// The value must be above this.
    pub above: Option<f64>,
    /// What the paper says.
    pub note: Option<String>,
}

impl Expectation {
    /// Whether the check compares with the scenario's run without PARDA.
    pub fn needs_uncontrolled(&self) -> bool {
        matches!(self.subject, Subject::Host { target: Some(HostTarget::Uncontrolled), .. })
    }
}

/// Checks what every expectation shares: at most one of its target kinds (`kinds`: name, given) is
/// given, a target comes with `within_pct`, there is something to check, and the window is sane.
fn validate_targets(at: &str, e: &ExpectFile, kinds: &[(&str, bool)]) -> Result<(), String> {
    let names: Vec<&str> = kinds.iter().map(|k| k.0).collect();
    let given = kinds.iter().filter(|k| k.1).count();
    if given > 1 {
        return Err(format!("{at}: use one of {}", names.join(", ")));
    }
    if given == 1 && e.within_pct.is_none() {
        return Err(format!("{at}: {} need within_pct", names.join("/")));
    }
    // A tolerance with nothing to be within would be ignored.
    if let (0, Some(pct)) = (given, e.within_pct) {
        return Err(format!("{at}: within_pct = {pct} without a target: give one of {}", names.join(", ")));
    }
    if given == 0 && e.below.is_none() && e.above.is_none() {
        return Err(format!("{at}: says nothing to check (give {}, below or above)", names.join(", ")));
    }
    validate_window(at, e)
}

fn validate_window(at: &str, e: &ExpectFile) -> Result<(), String> {
    if let Some([a, b]) = e.window {
        if !(a.is_finite() && b.is_finite() && 0.0 <= a && a < b) {
            return Err(format!("{at}: window must be [start, end] with 0 <= start < end"));
        }
    }
    Ok(())
}

/// The numbers every expectation may carry: finite, tolerances and ratios not negative, and a window
/// that lies in the run (a window after the end measured nothing, and a check on 0 could pass).
fn validate_numbers(at: &str, e: &ExpectFile, duration_s: f64, interval_s: f64) -> Result<(), String> {
    for (field, v) in [("equals", e.equals), ("below", e.below), ("above", e.above)] {
        if let Some(v) = v {
            if !v.is_finite() {
                return Err(format!("{at}: {field} must be a finite number, got {v}"));
            }
        }
    }
    for (field, v, zero_ok) in
        [("within_pct", e.within_pct, true), ("ratio", e.ratio, false), ("band_pct", e.band_pct, false)]
    {
        if let Some(v) = v {
            if !(v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0))) {
                let what = if zero_ok { "at least 0" } else { "positive" };
                return Err(format!("{at}: {field} must be {what}, got {v}"));
            }
        }
    }
    if let (Some(above), Some(below)) = (e.above, e.below) {
        if above >= below {
            return Err(format!("{at}: above ({above}) is not below below ({below}): no value could pass"));
        }
    }
    validate_window(at, e)?;
    if let Some([a, b]) = e.window {
        if b > duration_s {
            return Err(format!("{at}: window ends at {b} s, after the run's duration_s ({duration_s} s)"));
        }
        if !holds_an_interval(a, b, interval_s) {
            return Err(format!(
                "{at}: window [{a}, {b}] s holds no whole interval of interval_s ({interval_s} s), which is what \
                 windows count: it would measure nothing"
            ));
        }
    }
    Ok(())
}

/// Whether `[a, b]` seconds holds a whole timeseries interval: windowed metrics count the intervals lying
/// wholly inside their window ([`rein_model::report::Timeseries::window`]), so one that holds none
/// measures nothing (and a check on the 0 it reads could pass).
fn holds_an_interval(a: f64, b: f64, interval_s: f64) -> bool {
    let first = (a / interval_s - 1e-9).ceil();
    let end = (b / interval_s + 1e-9).floor();
    end > first
}

/// Whether `subject` is measured over its expectation's window (the default one when it gives none):
/// whole-run metrics (percentile and maximum latencies, utilisation) and the controller's tally of closed
/// periods are not.
fn windowed(subject: &Subject) -> bool {
    match subject {
        Subject::Tenant { metric, .. } => !metric.whole_run(),
        Subject::Server { metric, .. } => *metric != ServerMetric::Utilisation,
        Subject::Periods { at_servers, .. } => !at_servers,
        Subject::Host { .. } => true,
    }
}

/// Every tenant and server metric name, in documentation order (for the error message).
fn metric_names() -> String {
    let mut names: Vec<&str> = TenantMetric::ALL.iter().map(|m| m.name()).collect();
    for m in ServerMetric::ALL.iter().map(|m| m.name()).chain(PeriodMetric::ALL.iter().map(|m| m.name())) {
        if !names.contains(&m) {
            names.push(m);
        }
    }
    names.join(", ")
}

/// Whether a scenario has pShift's QoS periods, and a controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Periods {
    /// No `[pshift]` section.
    None,
    /// QoS periods; `controller`: a controller that tallies them.
    Pshift {
        /// `[pshift] controller = true`.
        controller: bool,
    },
}

/// The run's length, warm-up and timeseries interval (s), which windows must fit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunLength {
    /// `duration_s`.
    pub duration_s: f64,
    /// `warmup_s`: where the default window starts.
    pub warmup_s: f64,
    /// `interval_s`.
    pub interval_s: f64,
}

/// Validates `expect[i]`.
pub(crate) fn validate(
    i: usize,
    e: &ExpectFile,
    tenants: &[Tenant],
    servers: &[Server],
    hosts: &[Host],
    periods: Periods,
    run: RunLength,
) -> Result<Expectation, String> {
    let at = format!("expect[{i}]");
    validate_numbers(&at, e, run.duration_s, run.interval_s)?;
    // A note is printed under its check's line: a line break in it would forge another line.
    if let Some(note) = &e.note {
        super::no_control(&format!("{at}: note"), note).map_err(|e| e.to_string())?;
    }
    // `ratio` scales the value of what `ratio_to` names: alone it would be ignored.
    if let (Some(r), None) = (e.ratio, &e.ratio_to) {
        return Err(format!(
            "{at}: ratio = {r} without ratio_to: ratio scales the value of the tenant or host ratio_to names"
        ));
    }
    if e.count.is_some() && e.host.is_some() {
        return Err(format!("{at}: count is for pShift's period metrics, not host expectations"));
    }
    let subject = if e.host.is_some() {
        validate_host(&at, e, hosts)?
    } else {
        validate_tenant_or_server(&at, e, tenants, servers, periods)?
    };
    // The default window, [warmup_s, duration_s], must measure something too.
    if e.window.is_none() && windowed(&subject) && !holds_an_interval(run.warmup_s, run.duration_s, run.interval_s) {
        return Err(format!(
            "{at}: the default window [warmup_s, duration_s] = [{}, {}] s holds no whole interval of interval_s \
             ({} s), which is what windows count: it would measure nothing (give a window, or a smaller warmup_s)",
            run.warmup_s, run.duration_s, run.interval_s
        ));
    }
    Ok(Expectation {
        subject,
        window: e.window,
        within_pct: e.within_pct,
        below: e.below,
        above: e.above,
        note: e.note.clone(),
    })
}

fn validate_tenant_or_server(
    at: &str,
    e: &ExpectFile,
    tenants: &[Tenant],
    servers: &[Server],
    pshift: Periods,
) -> Result<Subject, String> {
    if e.equilibrium || e.threshold || e.beta_ratio || e.fixed_point || e.uncontrolled || e.band_pct.is_some() {
        return Err(format!(
            "{at}: equilibrium, threshold, beta_ratio, fixed_point, uncontrolled and band_pct are for host \
             expectations"
        ));
    }
    let name = e.metric.as_str();
    let period: Option<PeriodMetric> = name.parse().ok();
    let known = period.is_some() || name.parse::<TenantMetric>().is_ok() || name.parse::<ServerMetric>().is_ok();
    if !known {
        return Err(format!("{at}: metric {:?}: expected one of {}", e.metric, metric_names()));
    }
    if period.is_some() && pshift == Periods::None {
        return Err(format!("{at}: {} needs a [pshift] section (its QoS periods)", e.metric));
    }
    let at_servers = match e.count.as_deref() {
        None | Some("load") => false,
        Some("servers") => true,
        Some(o) => return Err(format!("{at}: count {o:?}: expected load or servers")),
    };
    if e.count.is_some() && period.is_none() {
        return Err(format!("{at}: count applies to {} only", PeriodMetric::names().replace(", ", " and ")));
    }
    if at_servers {
        if pshift != (Periods::Pshift { controller: true }) {
            return Err(format!(
                "{at}: count = \"servers\" reads the controller's tally: it needs [pshift] controller = true"
            ));
        }
        if e.window.is_some() || e.threshold_pct.is_some() {
            return Err(format!(
                "{at}: count = \"servers\" judges every closed period at exactly the reservation and limit: \
                 no window or threshold_pct"
            ));
        }
    }
    if let Some(t) = e.threshold_pct {
        if period.is_none() || !(t.is_finite() && (0.0..=1000.0).contains(&t)) {
            return Err(format!(
                "{at}: threshold_pct applies to {} only, in [0, 1000]",
                PeriodMetric::names().replace(", ", " and ")
            ));
        }
    }
    let tenant_index = |t: &str, what: &str| -> Result<usize, String> {
        tenants.iter().position(|x| x.name == t).ok_or_else(|| format!("{at}: {what} {t:?}"))
    };
    // Named by the target, so resolved after the subject (whose errors come first).
    let ratio_to = || e.ratio_to.as_deref().map(|r| tenant_index(r, "ratio_to names unknown tenant")).transpose();
    let tenant_target = |metric: TenantMetric| -> Result<Option<TenantTarget>, String> {
        let ratio_to = ratio_to()?;
        if let Some(r) = e.rank.as_deref() {
            let rank = match r {
                "lowest" => Rank::Lowest,
                "highest" => Rank::Highest,
                o => return Err(format!("{at}: rank {o:?}: expected lowest or highest")),
            };
            if e.equals.is_some() || e.oracle || ratio_to.is_some() {
                return Err(format!("{at}: use one of equals, oracle, ratio_to, rank"));
            }
            if e.within_pct.is_some() {
                return Err(format!("{at}: rank compares with every other tenant strictly: no within_pct"));
            }
            if tenants.len() < 2 {
                return Err(format!("{at}: rank needs at least two tenants"));
            }
            validate_window(at, e)?;
            return Ok(Some(TenantTarget::Rank(rank)));
        }
        validate_targets(
            at,
            e,
            &[("equals", e.equals.is_some()), ("oracle", e.oracle), ("ratio_to", ratio_to.is_some())],
        )?;
        Ok(if let Some(v) = e.equals {
            Some(TenantTarget::Equals(v))
        } else if e.oracle {
            if metric != TenantMetric::Iops {
                return Err(format!("{at}: oracle gives IOPS (eq. (1)-(2)): it applies to iops, not {}", e.metric));
            }
            Some(TenantTarget::Oracle)
        } else {
            ratio_to.map(|tenant| TenantTarget::Ratio { tenant, ratio: e.ratio.unwrap_or(1.0) })
        })
    };
    // Subjects other than a tenant's metric take a number only.
    let equals = || -> Result<Option<f64>, String> {
        let ratio_to = ratio_to()?;
        if e.oracle {
            return Err(format!("{at}: oracle compares a tenant's metric with the fluid oracle; name a tenant"));
        }
        if ratio_to.is_some() {
            return Err(format!("{at}: ratio_to compares two tenants' {}; name a tenant", e.metric));
        }
        if e.rank.is_some() {
            return Err(format!("{at}: rank compares tenants' {}; name a tenant", e.metric));
        }
        validate_targets(at, e, &[("equals", e.equals.is_some()), ("oracle", false), ("ratio_to", false)])?;
        Ok(e.equals)
    };
    let periods = |tenant: Option<usize>, metric: PeriodMetric| -> Result<Subject, String> {
        // A bucket without a limit never exceeds it: a check of its limit would hold whatever the run did.
        if metric == PeriodMetric::LimitExceededFraction {
            match tenant {
                Some(t) if tenants[t].spec.limit().is_none() => {
                    return Err(format!(
                        "{at}: {metric}: tenant {:?} has no limit, so it can never exceed one: the check could not \
                         fail",
                        tenants[t].name
                    ))
                }
                None if tenants.iter().all(|t| t.spec.limit().is_none()) => {
                    return Err(format!(
                        "{at}: {metric}: no bucket has a limit, so none can exceed one: the check could not fail"
                    ))
                }
                _ => {}
            }
        }
        Ok(Subject::Periods { tenant, metric, threshold_pct: threshold(metric, e), at_servers, equals: equals()? })
    };
    match (&e.tenant, &e.server, period) {
        (None, None, Some(metric)) => periods(None, metric),
        (Some(t), None, _) => {
            let tenant = tenant_index(t, "unknown tenant")?;
            if e.ratio_to.as_deref() == Some(t.as_str()) {
                return Err(format!("{at}: ratio_to names tenant {t:?} itself: compare it with another tenant"));
            }
            match period {
                Some(metric) => periods(Some(tenant), metric),
                None => match name.parse::<TenantMetric>() {
                    Ok(metric) if metric.whole_run() && e.window.is_some() => Err(format!(
                        "{at}: {} is measured over the whole run after the warm-up, not over a window: remove \
                         window",
                        metric.name()
                    )),
                    Ok(metric) => Ok(Subject::Tenant { tenant, metric, target: tenant_target(metric)? }),
                    Err(_) => Err(format!("{at}: utilisation is a server metric")),
                },
            }
        }
        (None, Some(s), _) => {
            let server =
                servers.iter().position(|x| &x.name == s).ok_or_else(|| format!("{at}: unknown server {s:?}"))?;
            match name.parse::<ServerMetric>() {
                Ok(ServerMetric::Utilisation) if e.window.is_some() => Err(format!(
                    "{at}: utilisation is measured over the whole run after the warm-up, not over a window: \
                     remove window"
                )),
                Ok(metric) if period.is_none() => Ok(Subject::Server { server, metric, equals: equals()? }),
                _ => Err(format!("{at}: servers have only iops and utilisation")),
            }
        }
        _ => Err(format!("{at}: name exactly one of tenant or server")),
    }
}

fn threshold(metric: PeriodMetric, e: &ExpectFile) -> f64 {
    e.threshold_pct.unwrap_or(match metric {
        PeriodMetric::ReservationMetFraction => 100.0,
        PeriodMetric::LimitExceededFraction => 0.0,
    })
}

fn validate_host(at: &str, e: &ExpectFile, hosts: &[Host]) -> Result<Subject, String> {
    let h = e.host.as_deref().expect("called for host expectations");
    if e.tenant.is_some() || e.server.is_some() {
        return Err(format!("{at}: name exactly one of tenant, server or host"));
    }
    if e.rank.is_some() {
        return Err(format!("{at}: rank is for tenant expectations"));
    }
    let who = if h == "all" {
        HostSubject::All
    } else {
        HostSubject::Host(hosts.iter().position(|x| x.name == h).ok_or_else(|| format!("{at}: unknown host {h:?}"))?)
    };
    let metric: HostMetric = e.metric.parse().map_err(|m| format!("{at}: {m}"))?;
    let ratio_to = match &e.ratio_to {
        Some(r) => {
            let o = hosts
                .iter()
                .position(|x| &x.name == r)
                .ok_or_else(|| format!("{at}: ratio_to names unknown host {r:?}"))?;
            if h == "all" {
                return Err(format!("{at}: ratio_to compares two hosts, not \"all\""));
            }
            if r == h {
                return Err(format!("{at}: ratio_to names host {h:?} itself: compare it with another host"));
            }
            Some(o)
        }
        None => None,
    };
    if e.oracle {
        return Err(format!("{at}: oracle is mClock's; for hosts use equilibrium (eq. (3))"));
    }
    if e.beta_ratio && e.ratio_to.is_none() {
        return Err(format!("{at}: beta_ratio needs ratio_to"));
    }
    if e.beta_ratio && e.ratio.is_some() {
        return Err(format!("{at}: give ratio or beta_ratio, not both"));
    }
    if e.equilibrium && !matches!(metric, HostMetric::Window | HostMetric::LatencyMeanMs | HostMetric::SignalMs) {
        return Err(format!("{at}: equilibrium (eq. (3)) applies to window, latency_mean_ms and signal_ms"));
    }
    if e.threshold && !matches!(metric, HostMetric::LatencyMeanMs | HostMetric::SignalMs) {
        return Err(format!("{at}: threshold (script-L) applies to latency_mean_ms and signal_ms"));
    }
    if e.fixed_point && !matches!(metric, HostMetric::Window | HostMetric::Iops) {
        return Err(format!("{at}: fixed_point (eq. (2)) applies to window and iops"));
    }
    if e.band_pct.is_some() && metric != HostMetric::ConvergenceS {
        return Err(format!("{at}: band_pct applies to convergence_s"));
    }
    if metric == HostMetric::ConvergenceS && (e.equilibrium || e.threshold || e.uncontrolled) {
        return Err(format!("{at}: convergence_s is checked with below/above"));
    }
    validate_targets(
        at,
        e,
        &[
            ("equals", e.equals.is_some()),
            ("ratio_to", e.ratio_to.is_some()),
            ("equilibrium", e.equilibrium),
            ("threshold", e.threshold),
            ("fixed_point", e.fixed_point),
            ("uncontrolled", e.uncontrolled),
        ],
    )?;
    let target = if let Some(v) = e.equals {
        Some(HostTarget::Equals(v))
    } else if let Some(other) = ratio_to {
        Some(match (e.beta_ratio, who) {
            (true, HostSubject::Host(host)) => HostTarget::BetaRatio { host, other },
            (true, HostSubject::All) => return Err(format!("{at}: ratio_to compares two hosts, not \"all\"")),
            (false, _) => HostTarget::Ratio { host: other, ratio: e.ratio.unwrap_or(1.0) },
        })
    } else if e.equilibrium {
        Some(HostTarget::Equilibrium)
    } else if e.threshold {
        Some(HostTarget::Threshold)
    } else if e.fixed_point {
        match who {
            HostSubject::Host(host) => Some(HostTarget::FixedPoint { host }),
            HostSubject::All => return Err(format!("{at}: fixed_point is one host's (eq. (2)), not \"all\"'s")),
        }
    } else if e.uncontrolled {
        Some(HostTarget::Uncontrolled)
    } else {
        None
    };
    Ok(Subject::Host { who, metric, band_pct: e.band_pct.unwrap_or(10.0), target })
}
