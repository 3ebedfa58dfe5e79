//! Validated expectations: what `--check` verifies, as typed values (subject and metric resolved, the
//! target one of a closed set), so the check layer never looks names up or matches strings again.

use super::parda::Host;
use super::server::Server;
use super::tenant::Tenant;
use crate::file::ExpectFile;
use rein_model::report::hosts::{HostMetric, HostSubject};
use rein_model::report::{PeriodMetric, ServerMetric, TenantMetric};

/// An `[[expect]]` that is refused: its index in the file, and what is wrong. Its message is
/// `expect[I]: ...`.
#[derive(Debug, thiserror::Error)]
#[error("expect[{index}]: {fault}")]
pub struct ExpectError {
    /// The expectation's index among the file's `[[expect]]`.
    pub index: usize,
    /// What is wrong with it.
    pub fault: ExpectFault,
}

/// What is wrong with an `[[expect]]` ([`ExpectError`] names which).
#[derive(Debug, thiserror::Error)]
pub enum ExpectFault {
    /// More than one of the target keys `kinds` is given.
    #[error("use one of {}", .kinds.join(", "))]
    OneTarget {
        /// The target keys the subject takes.
        kinds: Vec<&'static str>,
    },
    /// A target without `within_pct`.
    #[error("{} need within_pct", .kinds.join("/"))]
    TargetNeedsWithin {
        /// The target keys the subject takes.
        kinds: Vec<&'static str>,
    },
    /// `within_pct` without a target.
    #[error("within_pct = {within_pct} without a target: give one of {}", .kinds.join(", "))]
    WithinWithoutTarget {
        /// The tolerance given.
        within_pct: f64,
        /// The target keys the subject takes.
        kinds: Vec<&'static str>,
    },
    /// Neither a target nor `below` nor `above`.
    #[error("says nothing to check (give {}, below or above)", .kinds.join(", "))]
    NothingToCheck {
        /// The target keys the subject takes.
        kinds: Vec<&'static str>,
    },
    /// `window` is not `[start, end]` with `0 <= start < end`.
    #[error("window must be [start, end] with 0 <= start < end")]
    Window {
        /// The window given (s).
        window: [f64; 2],
    },
    /// `equals`, `below` or `above` is not a finite number.
    #[error("{key} must be a finite number, got {got}")]
    NotFinite {
        /// The key.
        key: &'static str,
        /// The value given.
        got: f64,
    },
    /// `within_pct` is negative or not a number.
    #[error("{key} must be at least 0, got {got}")]
    Negative {
        /// The key.
        key: &'static str,
        /// The value given.
        got: f64,
    },
    /// `ratio` or `band_pct` is not a positive number.
    #[error("{key} must be positive, got {got}")]
    NotPositive {
        /// The key.
        key: &'static str,
        /// The value given.
        got: f64,
    },
    /// `above` at or over `below`.
    #[error("above ({above}) is not below below ({below}): no value could pass")]
    NoValuePasses {
        /// `above`.
        above: f64,
        /// `below`.
        below: f64,
    },
    /// The window ends after the run.
    #[error("window ends at {end} s, after the run's duration_s ({duration_s} s)")]
    WindowAfterEnd {
        /// The window's end (s).
        end: f64,
        /// The run's `duration_s`.
        duration_s: f64,
    },
    /// The window holds no whole timeseries interval.
    #[error(
        "window [{start}, {end}] s holds no whole interval of interval_s ({interval_s} s), which is what windows \
         count: it would measure nothing"
    )]
    WindowHoldsNoInterval {
        /// The window's start (s).
        start: f64,
        /// The window's end (s).
        end: f64,
        /// The run's `interval_s`.
        interval_s: f64,
    },
    /// The default window `[warmup_s, duration_s]` holds no whole timeseries interval.
    #[error(
        "the default window [warmup_s, duration_s] = [{warmup_s}, {duration_s}] s holds no whole interval of \
         interval_s ({interval_s} s), which is what windows count: it would measure nothing (give a window, or a \
         smaller warmup_s)"
    )]
    DefaultWindowHoldsNoInterval {
        /// `warmup_s`.
        warmup_s: f64,
        /// `duration_s`.
        duration_s: f64,
        /// `interval_s`.
        interval_s: f64,
    },
    /// `note` holds a control character.
    #[error("note {text:?} has a control character (a line break, tab or escape)")]
    NoteControl {
        /// The note.
        text: String,
    },
    /// `ratio` without `ratio_to`.
    #[error("ratio = {ratio} without ratio_to: ratio scales the value of the tenant or host ratio_to names")]
    RatioWithoutRatioTo {
        /// The ratio given.
        ratio: f64,
    },
    /// `count` on a host expectation.
    #[error("count is for pShift's period metrics, not host expectations")]
    CountOnHost,
    /// A host target (`equilibrium`, ...) on a tenant or server expectation.
    #[error("equilibrium, threshold, beta_ratio, fixed_point, uncontrolled and band_pct are for host expectations")]
    HostTargetOnTenant,
    /// `metric` names no tenant, server or period metric. Not rein-model's [`UnknownMetric`]
    /// (`rein_model::report::UnknownMetric`), which is one subject's: the name is tried as each of the
    /// three, and the message lists all their names.
    ///
    /// [`UnknownMetric`]: rein_model::report::UnknownMetric
    #[error("metric {metric:?}: expected one of {}", metric_names())]
    UnknownMetric {
        /// The name given.
        metric: String,
    },
    /// A period metric in a scenario without `[pshift]`.
    #[error("{metric} needs a [pshift] section (its QoS periods)")]
    PeriodsNeedPshift {
        /// The metric.
        metric: PeriodMetric,
    },
    /// `count` is neither `load` nor `servers`.
    #[error("count {got:?}: expected load or servers")]
    Count {
        /// The word given.
        got: String,
    },
    /// `count` on a metric other than a period metric.
    #[error("count applies to {} only", PeriodMetric::names().replace(", ", " and "))]
    CountNotPeriods,
    /// `count = "servers"` without a controller.
    #[error("count = \"servers\" reads the controller's tally: it needs [pshift] controller = true")]
    CountServersNeedsController,
    /// `count = "servers"` with a window or `threshold_pct`.
    #[error(
        "count = \"servers\" judges every closed period at exactly the reservation and limit: no window or \
         threshold_pct"
    )]
    CountServersWindow,
    /// `threshold_pct` on a metric other than a period metric, or outside [0, 1000].
    #[error("threshold_pct applies to {} only, in [0, 1000]", PeriodMetric::names().replace(", ", " and "))]
    ThresholdPct {
        /// The value given.
        got: f64,
    },
    /// `tenant` names no tenant.
    #[error("unknown tenant {tenant:?}")]
    UnknownTenant {
        /// The name given.
        tenant: String,
    },
    /// `ratio_to` names no tenant.
    #[error("ratio_to names unknown tenant {tenant:?}")]
    RatioToUnknownTenant {
        /// The name given.
        tenant: String,
    },
    /// `ratio_to` names the subject tenant.
    #[error("ratio_to names tenant {tenant:?} itself: compare it with another tenant")]
    RatioToItself {
        /// The tenant.
        tenant: String,
    },
    /// `rank` is neither `lowest` nor `highest`.
    #[error("rank {got:?}: expected lowest or highest")]
    Rank {
        /// The word given.
        got: String,
    },
    /// `rank` with `within_pct`.
    #[error("rank compares with every other tenant strictly: no within_pct")]
    RankWithin,
    /// `rank` in a scenario of one tenant.
    #[error("rank needs at least two tenants")]
    RankOneTenant,
    /// `oracle` on a metric other than `iops`.
    #[error("oracle gives IOPS (eq. (1)-(2)): it applies to iops, not {metric}")]
    OracleNotIops {
        /// The metric.
        metric: TenantMetric,
    },
    /// `oracle` on a server or period expectation.
    #[error("oracle compares a tenant's metric with the fluid oracle; name a tenant")]
    OracleNotTenant,
    /// `ratio_to` on a server or period expectation.
    #[error("ratio_to compares two tenants' {metric}; name a tenant")]
    RatioToNotTenant {
        /// The metric as written.
        metric: String,
    },
    /// `rank` on a server or period expectation.
    #[error("rank compares tenants' {metric}; name a tenant")]
    RankNotTenant {
        /// The metric as written.
        metric: String,
    },
    /// `limit_exceeded_fraction` of a tenant without a limit.
    #[error("{metric}: tenant {tenant:?} has no limit, so it can never exceed one: the check could not fail")]
    NoLimit {
        /// The metric.
        metric: PeriodMetric,
        /// The tenant.
        tenant: String,
    },
    /// `limit_exceeded_fraction` of all buckets when none has a limit.
    #[error("{metric}: no bucket has a limit, so none can exceed one: the check could not fail")]
    NoBucketLimit {
        /// The metric.
        metric: PeriodMetric,
    },
    /// A window on a tenant metric measured over the whole run.
    #[error("{metric} is measured over the whole run after the warm-up, not over a window: remove window")]
    WholeRunWindow {
        /// The metric.
        metric: TenantMetric,
    },
    /// `utilisation` of a tenant.
    #[error("utilisation is a server metric")]
    UtilisationOfTenant,
    /// `server` names no server.
    #[error("unknown server {server:?}")]
    UnknownServer {
        /// The name given.
        server: String,
    },
    /// A window on `utilisation`.
    #[error("utilisation is measured over the whole run after the warm-up, not over a window: remove window")]
    UtilisationWindow,
    /// A server metric other than `iops` and `utilisation`.
    #[error("servers have only iops and utilisation")]
    ServerMetric,
    /// Neither or both of `tenant` and `server` (without `host`).
    #[error("name exactly one of tenant or server")]
    TenantOrServer,
    /// `host` with `tenant` or `server`.
    #[error("name exactly one of tenant, server or host")]
    TenantServerOrHost,
    /// `rank` on a host expectation.
    #[error("rank is for tenant expectations")]
    RankOnHost,
    /// `host` names no host.
    #[error("unknown host {host:?}")]
    UnknownHost {
        /// The name given.
        host: String,
    },
    /// `metric` names no host metric: rein-model's error, whose message is the whole of this one (the name
    /// given and the host metrics).
    #[error(transparent)]
    UnknownHostMetric(rein_model::report::UnknownMetric),
    /// `ratio_to` names no host.
    #[error("ratio_to names unknown host {host:?}")]
    RatioToUnknownHost {
        /// The name given.
        host: String,
    },
    /// `ratio_to` (or `beta_ratio`) on `host = "all"`.
    #[error("ratio_to compares two hosts, not \"all\"")]
    RatioToAll,
    /// `ratio_to` names the subject host.
    #[error("ratio_to names host {host:?} itself: compare it with another host")]
    RatioToItselfHost {
        /// The host.
        host: String,
    },
    /// `oracle` on a host expectation.
    #[error("oracle is mClock's; for hosts use equilibrium (eq. (3))")]
    OracleOnHost,
    /// `beta_ratio` without `ratio_to`.
    #[error("beta_ratio needs ratio_to")]
    BetaRatioNeedsRatioTo,
    /// Both `ratio` and `beta_ratio`.
    #[error("give ratio or beta_ratio, not both")]
    RatioAndBetaRatio,
    /// `equilibrium` on a metric it does not give.
    #[error("equilibrium (eq. (3)) applies to window, latency_mean_ms and signal_ms")]
    Equilibrium {
        /// The metric.
        metric: HostMetric,
    },
    /// `threshold` on a metric other than a latency.
    #[error("threshold (script-L) applies to latency_mean_ms and signal_ms")]
    Threshold {
        /// The metric.
        metric: HostMetric,
    },
    /// `fixed_point` on a metric it does not give.
    #[error("fixed_point (eq. (2)) applies to window and iops")]
    FixedPoint {
        /// The metric.
        metric: HostMetric,
    },
    /// `band_pct` on a metric other than `convergence_s`.
    #[error("band_pct applies to convergence_s")]
    BandPct {
        /// The metric.
        metric: HostMetric,
    },
    /// A target on `convergence_s`.
    #[error("convergence_s is checked with below/above")]
    ConvergenceTarget,
    /// `fixed_point` on `host = "all"`.
    #[error("fixed_point is one host's (eq. (2)), not \"all\"'s")]
    FixedPointAll,
}

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
fn validate_targets(e: &ExpectFile, kinds: &[(&'static str, bool)]) -> Result<(), ExpectFault> {
    let names = || kinds.iter().map(|k| k.0).collect();
    let given = kinds.iter().filter(|k| k.1).count();
    if given > 1 {
        return Err(ExpectFault::OneTarget { kinds: names() });
    }
    if given == 1 && e.within_pct.is_none() {
        return Err(ExpectFault::TargetNeedsWithin { kinds: names() });
    }
    // A tolerance with nothing to be within would be ignored.
    if let (0, Some(within_pct)) = (given, e.within_pct) {
        return Err(ExpectFault::WithinWithoutTarget { within_pct, kinds: names() });
    }
    if given == 0 && e.below.is_none() && e.above.is_none() {
        return Err(ExpectFault::NothingToCheck { kinds: names() });
    }
    validate_window(e)
}

fn validate_window(e: &ExpectFile) -> Result<(), ExpectFault> {
    if let Some([a, b]) = e.window {
        if !(a.is_finite() && b.is_finite() && 0.0 <= a && a < b) {
            return Err(ExpectFault::Window { window: [a, b] });
        }
    }
    Ok(())
}

/// The numbers every expectation may carry: finite, tolerances and ratios not negative, and a window
/// that lies in the run (a window after the end measured nothing, and a check on 0 could pass).
fn validate_numbers(e: &ExpectFile, duration_s: f64, interval_s: f64) -> Result<(), ExpectFault> {
    for (key, v) in [("equals", e.equals), ("below", e.below), ("above", e.above)] {
        if let Some(got) = v {
            if !got.is_finite() {
                return Err(ExpectFault::NotFinite { key, got });
            }
        }
    }
    for (key, v, zero_ok) in
        [("within_pct", e.within_pct, true), ("ratio", e.ratio, false), ("band_pct", e.band_pct, false)]
    {
        if let Some(got) = v {
            if !(got.is_finite() && (got > 0.0 || (zero_ok && got == 0.0))) {
                return Err(if zero_ok {
                    ExpectFault::Negative { key, got }
                } else {
                    ExpectFault::NotPositive { key, got }
                });
            }
        }
    }
    if let (Some(above), Some(below)) = (e.above, e.below) {
        if above >= below {
            return Err(ExpectFault::NoValuePasses { above, below });
        }
    }
    validate_window(e)?;
    if let Some([start, end]) = e.window {
        if end > duration_s {
            return Err(ExpectFault::WindowAfterEnd { end, duration_s });
        }
        if !holds_an_interval(start, end, interval_s) {
            return Err(ExpectFault::WindowHoldsNoInterval { start, end, interval_s });
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
) -> Result<Expectation, ExpectError> {
    validate_fields(e, tenants, servers, hosts, periods, run).map_err(|fault| ExpectError { index: i, fault })
}

/// [`validate`], its error without the index.
fn validate_fields(
    e: &ExpectFile,
    tenants: &[Tenant],
    servers: &[Server],
    hosts: &[Host],
    periods: Periods,
    run: RunLength,
) -> Result<Expectation, ExpectFault> {
    validate_numbers(e, run.duration_s, run.interval_s)?;
    // A note is printed under its check's line: a line break in it would forge another line.
    if let Some(note) = e.note.as_ref().filter(|n| n.chars().any(char::is_control)) {
        return Err(ExpectFault::NoteControl { text: note.clone() });
    }
    // `ratio` scales the value of what `ratio_to` names: alone it would be ignored.
    if let (Some(ratio), None) = (e.ratio, &e.ratio_to) {
        return Err(ExpectFault::RatioWithoutRatioTo { ratio });
    }
    if e.count.is_some() && e.host.is_some() {
        return Err(ExpectFault::CountOnHost);
    }
    let subject = if e.host.is_some() {
        validate_host(e, hosts)?
    } else {
        validate_tenant_or_server(e, tenants, servers, periods)?
    };
    // The default window, [warmup_s, duration_s], must measure something too.
    if e.window.is_none() && windowed(&subject) && !holds_an_interval(run.warmup_s, run.duration_s, run.interval_s) {
        return Err(ExpectFault::DefaultWindowHoldsNoInterval {
            warmup_s: run.warmup_s,
            duration_s: run.duration_s,
            interval_s: run.interval_s,
        });
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
    e: &ExpectFile,
    tenants: &[Tenant],
    servers: &[Server],
    pshift: Periods,
) -> Result<Subject, ExpectFault> {
    if e.equilibrium || e.threshold || e.beta_ratio || e.fixed_point || e.uncontrolled || e.band_pct.is_some() {
        return Err(ExpectFault::HostTargetOnTenant);
    }
    let name = e.metric.as_str();
    let period: Option<PeriodMetric> = name.parse().ok();
    let known = period.is_some() || name.parse::<TenantMetric>().is_ok() || name.parse::<ServerMetric>().is_ok();
    if !known {
        return Err(ExpectFault::UnknownMetric { metric: e.metric.clone() });
    }
    if let (Some(metric), Periods::None) = (period, pshift) {
        return Err(ExpectFault::PeriodsNeedPshift { metric });
    }
    let at_servers = match e.count.as_deref() {
        None | Some("load") => false,
        Some("servers") => true,
        Some(o) => return Err(ExpectFault::Count { got: o.to_string() }),
    };
    if e.count.is_some() && period.is_none() {
        return Err(ExpectFault::CountNotPeriods);
    }
    if at_servers {
        if pshift != (Periods::Pshift { controller: true }) {
            return Err(ExpectFault::CountServersNeedsController);
        }
        if e.window.is_some() || e.threshold_pct.is_some() {
            return Err(ExpectFault::CountServersWindow);
        }
    }
    if let Some(t) = e.threshold_pct {
        if period.is_none() || !(t.is_finite() && (0.0..=1000.0).contains(&t)) {
            return Err(ExpectFault::ThresholdPct { got: t });
        }
    }
    let tenant_index = |t: &str, unknown: fn(String) -> ExpectFault| -> Result<usize, ExpectFault> {
        tenants.iter().position(|x| x.name == t).ok_or_else(|| unknown(t.to_string()))
    };
    // Named by the target, so resolved after the subject (whose errors come first).
    let ratio_to = || {
        e.ratio_to
            .as_deref()
            .map(|r| tenant_index(r, |tenant| ExpectFault::RatioToUnknownTenant { tenant }))
            .transpose()
    };
    let tenant_target = |metric: TenantMetric| -> Result<Option<TenantTarget>, ExpectFault> {
        let ratio_to = ratio_to()?;
        if let Some(r) = e.rank.as_deref() {
            let rank = match r {
                "lowest" => Rank::Lowest,
                "highest" => Rank::Highest,
                o => return Err(ExpectFault::Rank { got: o.to_string() }),
            };
            if e.equals.is_some() || e.oracle || ratio_to.is_some() {
                return Err(ExpectFault::OneTarget { kinds: vec!["equals", "oracle", "ratio_to", "rank"] });
            }
            if e.within_pct.is_some() {
                return Err(ExpectFault::RankWithin);
            }
            if tenants.len() < 2 {
                return Err(ExpectFault::RankOneTenant);
            }
            validate_window(e)?;
            return Ok(Some(TenantTarget::Rank(rank)));
        }
        validate_targets(e, &[("equals", e.equals.is_some()), ("oracle", e.oracle), ("ratio_to", ratio_to.is_some())])?;
        Ok(if let Some(v) = e.equals {
            Some(TenantTarget::Equals(v))
        } else if e.oracle {
            if metric != TenantMetric::Iops {
                return Err(ExpectFault::OracleNotIops { metric });
            }
            Some(TenantTarget::Oracle)
        } else {
            ratio_to.map(|tenant| TenantTarget::Ratio { tenant, ratio: e.ratio.unwrap_or(1.0) })
        })
    };
    // Subjects other than a tenant's metric take a number only.
    let equals = || -> Result<Option<f64>, ExpectFault> {
        let ratio_to = ratio_to()?;
        if e.oracle {
            return Err(ExpectFault::OracleNotTenant);
        }
        if ratio_to.is_some() {
            return Err(ExpectFault::RatioToNotTenant { metric: e.metric.clone() });
        }
        if e.rank.is_some() {
            return Err(ExpectFault::RankNotTenant { metric: e.metric.clone() });
        }
        validate_targets(e, &[("equals", e.equals.is_some()), ("oracle", false), ("ratio_to", false)])?;
        Ok(e.equals)
    };
    let periods = |tenant: Option<usize>, metric: PeriodMetric| -> Result<Subject, ExpectFault> {
        // A bucket without a limit never exceeds it: a check of its limit would hold whatever the run did.
        if metric == PeriodMetric::LimitExceededFraction {
            match tenant {
                Some(t) if tenants[t].spec.limit().is_none() => {
                    return Err(ExpectFault::NoLimit { metric, tenant: tenants[t].name.clone() })
                }
                None if tenants.iter().all(|t| t.spec.limit().is_none()) => {
                    return Err(ExpectFault::NoBucketLimit { metric })
                }
                _ => {}
            }
        }
        Ok(Subject::Periods { tenant, metric, threshold_pct: threshold(metric, e), at_servers, equals: equals()? })
    };
    match (&e.tenant, &e.server, period) {
        (None, None, Some(metric)) => periods(None, metric),
        (Some(t), None, _) => {
            let tenant = tenant_index(t, |tenant| ExpectFault::UnknownTenant { tenant })?;
            if e.ratio_to.as_deref() == Some(t.as_str()) {
                return Err(ExpectFault::RatioToItself { tenant: t.clone() });
            }
            match period {
                Some(metric) => periods(Some(tenant), metric),
                None => match name.parse::<TenantMetric>() {
                    Ok(metric) if metric.whole_run() && e.window.is_some() => {
                        Err(ExpectFault::WholeRunWindow { metric })
                    }
                    Ok(metric) => Ok(Subject::Tenant { tenant, metric, target: tenant_target(metric)? }),
                    Err(_) => Err(ExpectFault::UtilisationOfTenant),
                },
            }
        }
        (None, Some(s), _) => {
            let server = servers
                .iter()
                .position(|x| &x.name == s)
                .ok_or_else(|| ExpectFault::UnknownServer { server: s.clone() })?;
            match name.parse::<ServerMetric>() {
                Ok(ServerMetric::Utilisation) if e.window.is_some() => Err(ExpectFault::UtilisationWindow),
                Ok(metric) if period.is_none() => Ok(Subject::Server { server, metric, equals: equals()? }),
                _ => Err(ExpectFault::ServerMetric),
            }
        }
        _ => Err(ExpectFault::TenantOrServer),
    }
}

fn threshold(metric: PeriodMetric, e: &ExpectFile) -> f64 {
    e.threshold_pct.unwrap_or(match metric {
        PeriodMetric::ReservationMetFraction => 100.0,
        PeriodMetric::LimitExceededFraction => 0.0,
    })
}

fn validate_host(e: &ExpectFile, hosts: &[Host]) -> Result<Subject, ExpectFault> {
    let h = e.host.as_deref().expect("called for host expectations");
    if e.tenant.is_some() || e.server.is_some() {
        return Err(ExpectFault::TenantServerOrHost);
    }
    if e.rank.is_some() {
        return Err(ExpectFault::RankOnHost);
    }
    let who = if h == "all" {
        HostSubject::All
    } else {
        let host = hosts.iter().position(|x| x.name == h);
        HostSubject::Host(host.ok_or_else(|| ExpectFault::UnknownHost { host: h.to_string() })?)
    };
    let metric: HostMetric = e.metric.parse().map_err(ExpectFault::UnknownHostMetric)?;
    let ratio_to = match &e.ratio_to {
        Some(r) => {
            let o = hosts
                .iter()
                .position(|x| &x.name == r)
                .ok_or_else(|| ExpectFault::RatioToUnknownHost { host: r.clone() })?;
            if h == "all" {
                return Err(ExpectFault::RatioToAll);
            }
            if r == h {
                return Err(ExpectFault::RatioToItselfHost { host: h.to_string() });
            }
            Some(o)
        }
        None => None,
    };
    if e.oracle {
        return Err(ExpectFault::OracleOnHost);
    }
    if e.beta_ratio && e.ratio_to.is_none() {
        return Err(ExpectFault::BetaRatioNeedsRatioTo);
    }
    if e.beta_ratio && e.ratio.is_some() {
        return Err(ExpectFault::RatioAndBetaRatio);
    }
    if e.equilibrium && !matches!(metric, HostMetric::Window | HostMetric::LatencyMeanMs | HostMetric::SignalMs) {
        return Err(ExpectFault::Equilibrium { metric });
    }
    if e.threshold && !matches!(metric, HostMetric::LatencyMeanMs | HostMetric::SignalMs) {
        return Err(ExpectFault::Threshold { metric });
    }
    if e.fixed_point && !matches!(metric, HostMetric::Window | HostMetric::Iops) {
        return Err(ExpectFault::FixedPoint { metric });
    }
    if e.band_pct.is_some() && metric != HostMetric::ConvergenceS {
        return Err(ExpectFault::BandPct { metric });
    }
    if metric == HostMetric::ConvergenceS && (e.equilibrium || e.threshold || e.uncontrolled) {
        return Err(ExpectFault::ConvergenceTarget);
    }
    validate_targets(
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
            (true, HostSubject::All) => return Err(ExpectFault::RatioToAll),
            (false, _) => HostTarget::Ratio { host: other, ratio: e.ratio.unwrap_or(1.0) },
        })
    } else if e.equilibrium {
        Some(HostTarget::Equilibrium)
    } else if e.threshold {
        Some(HostTarget::Threshold)
    } else if e.fixed_point {
        match who {
            HostSubject::Host(host) => Some(HostTarget::FixedPoint { host }),
            HostSubject::All => return Err(ExpectFault::FixedPointAll),
        }
    } else if e.uncontrolled {
        Some(HostTarget::Uncontrolled)
    } else {
        None
    };
    Ok(Subject::Host { who, metric, band_pct: e.band_pct.unwrap_or(10.0), target })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelError, Scenario, ScenarioError};

    /// The error of a scenario of tenants `a` and `b` (`a` with a limit) on server `s`, whose second
    /// `[[expect]]` is `lines`.
    fn refused(lines: &str) -> ExpectError {
        let text = format!(
            "name = \"t\"\nduration_s = 10\n[[servers]]\nname = \"s\"\ncapacity_iops = 100\n[[tenants]]\nname = \
             \"a\"\nlimit = 50\n[tenants.workload]\nkind = \"closed\"\n[[tenants]]\nname = \"b\"\n\
             [tenants.workload]\nkind = \"closed\"\n[[expect]]\ntenant = \"a\"\nmetric = \"iops\"\nbelow = 60\n\
             [[expect]]\n{lines}\n"
        );
        match Scenario::from_toml(&text, None).unwrap_err() {
            ScenarioError::Invalid { error: ModelError::Expect(e), .. } => e,
            e => panic!("not an expectation's error: {e}"),
        }
    }

    #[test]
    fn errors_are_typed_with_the_index_key_and_value() {
        let e = refused("tenant = \"c\"\nmetric = \"iops\"\nbelow = 1");
        assert_eq!(e.index, 1);
        assert!(matches!(&e.fault, ExpectFault::UnknownTenant { tenant } if tenant == "c"), "{e:?}");
        assert_eq!(e.to_string(), "expect[1]: unknown tenant \"c\"");
        let e = refused("tenant = \"a\"\nmetric = \"iops\"\nratio_to = \"a\"\nwithin_pct = 5");
        assert!(matches!(&e.fault, ExpectFault::RatioToItself { tenant } if tenant == "a"), "{e:?}");
        let e = refused("tenant = \"a\"\nmetric = \"iops\"\nequals = 5\noracle = true\nwithin_pct = 5");
        assert!(
            matches!(&e.fault, ExpectFault::OneTarget { kinds } if *kinds == ["equals", "oracle", "ratio_to"]),
            "{e:?}"
        );
        let e = refused("tenant = \"a\"\nmetric = \"iops\"\nabove = 5\nbelow = 5");
        assert!(matches!(e.fault, ExpectFault::NoValuePasses { above: 5.0, below: 5.0 }), "{e:?}");
        let e = refused("tenant = \"a\"\nmetric = \"iops\"\nbelow = 5\nwindow = [2, 12]");
        assert!(matches!(e.fault, ExpectFault::WindowAfterEnd { end: 12.0, duration_s: 10.0 }), "{e:?}");
        let e = refused("tenant = \"a\"\nmetric = \"iops\"\nbelow = 5\nratio = -1");
        assert!(matches!(e.fault, ExpectFault::NotPositive { key: "ratio", got: -1.0 }), "{e:?}");
        let e = refused("tenant = \"a\"\nmetric = \"latency_p99_ms\"\nbelow = 5\nwindow = [1, 2]");
        assert!(matches!(e.fault, ExpectFault::WholeRunWindow { metric: TenantMetric::LatencyP99Ms }), "{e:?}");
        let e = refused("tenant = \"a\"\nmetric = \"mb_s\"\noracle = true\nwithin_pct = 5");
        assert!(matches!(e.fault, ExpectFault::OracleNotIops { metric: TenantMetric::MbS }), "{e:?}");
        let e = refused("tenant = \"a\"\nmetric = \"reservation_met_fraction\"\nbelow = 5");
        assert!(
            matches!(e.fault, ExpectFault::PeriodsNeedPshift { metric: PeriodMetric::ReservationMetFraction }),
            "{e:?}"
        );
        let e = refused("server = \"s\"\nmetric = \"iops\"\nrank = \"lowest\"");
        assert!(matches!(&e.fault, ExpectFault::RankNotTenant { metric } if metric == "iops"), "{e:?}");
        let e = refused("host = \"h\"\nmetric = \"window\"\nbelow = 5");
        assert!(matches!(&e.fault, ExpectFault::UnknownHost { host } if host == "h"), "{e:?}");
        let e = refused("tenant = \"a\"\nmetric = \"iops\"\nbelow = 5\nnote = \"x\\ny\"");
        assert!(matches!(&e.fault, ExpectFault::NoteControl { text } if text == "x\ny"), "{e:?}");
    }

    /// A host expectation's metric that names no host metric is rein-model's [`UnknownMetric`], wrapped
    /// whole: one message (the name and the host metrics), no cause repeated below it. A tenant or server
    /// expectation's keeps its own, listing the three subjects' names it was tried as.
    ///
    /// [`UnknownMetric`]: rein_model::report::UnknownMetric
    #[test]
    fn an_unknown_metric_names_the_choices_once() {
        let text = "name = \"t\"\nduration_s = 10\n[parda]\nlatency_threshold_ms = 30\n[[servers]]\nname = \"s\"\n\
                    capacity_iops = 100\n[[hosts]]\nname = \"h\"\n[[tenants]]\nname = \"a\"\nhost = \"h\"\n\
                    [tenants.workload]\nkind = \"closed\"\n[[expect]]\nhost = \"h\"\nmetric = \"mb_s\"\nabove = 1\n";
        let e = match Scenario::from_toml(text, None).unwrap_err() {
            ScenarioError::Invalid { error: ModelError::Expect(e), .. } => e,
            e => panic!("not an expectation's error: {e}"),
        };
        assert!(
            matches!(&e.fault, ExpectFault::UnknownHostMetric(rein_model::report::UnknownMetric {
                subject: "host metric", got, ..
            }) if got == "mb_s"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "expect[0]: host metric \"mb_s\": expected one of window, beta, iops, latency_mean_ms, signal_ms, \
             convergence_s"
        );
        assert!(std::error::Error::source(&e.fault).is_none(), "the cause is the message, not below it");

        let e = refused("tenant = \"a\"\nmetric = \"window\"\nbelow = 5");
        assert!(matches!(&e.fault, ExpectFault::UnknownMetric { metric } if metric == "window"), "{e:?}");
        assert_eq!(
            e.to_string(),
            "expect[1]: metric \"window\": expected one of iops, mb_s, latency_mean_ms, latency_p50_ms, \
             latency_p95_ms, latency_p99_ms, latency_max_ms, reservation_fraction, utilisation, \
             reservation_met_fraction, limit_exceeded_fraction"
        );
    }
}
