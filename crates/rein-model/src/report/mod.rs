//! What a run reports, simulated (`rein sim`) or measured (`rein load`, `rein demo`): the same types, the
//! same files.
//!
//! - [`Summary`] (summary.json): per tenant its spec, completions, IOPS, MB/s, latency percentiles and
//!   completions by scheduling phase; per server its completions and utilisation; PARDA hosts.
//! - [`Timeseries`] (timeseries.csv): per tenant per interval a [`Cell`].
//! - [`hosts::HostTotals`] (hosts.csv): PARDA hosts per interval.
//! - [`rounds::ControllerRound`] (rounds.csv): a pShift controller's rounds.
//! - [`RunTotals`]: all of it, plus the metrics expectations are checked against ([`TenantMetric`],
//!   [`ServerMetric`], [`PeriodMetric`], [`hosts::HostMetric`]: each subject's metrics named once).
//!
//! Fields a measured run cannot know are `null` in the JSON rather than made up: a tenant's spec when
//! `rein load` has no admin endpoint to ask, a server's utilisation when its device is not observed.
//! Simulated runs always know them.
//!
//! Windows: metrics over `[a, b]` seconds use the timeseries intervals lying fully inside it
//! ([`Timeseries::window`]); latency percentiles and utilisation are over the whole run after warm-up.

pub mod hosts;
pub mod rounds;

use crate::meter::ReservationMeter;
use rein_core::oracle::{allocate, OracleTenant};
use serde::Serialize;

/// One tenant in one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cell {
    /// Completions.
    pub ios: u32,
    /// Bytes completed.
    pub bytes: u64,
    /// Sum of the completions' latencies (ns).
    pub lat_sum_ns: u64,
    /// Largest latency (ns).
    pub lat_max_ns: u64,
    /// Completions by scheduling phase ([`rein_core::Phase::index`]).
    pub phase: [u32; 3],
    /// Requests issued (arrived at the tenant's gateway or server) in the interval.
    pub arrivals: u32,
    /// Requests refused or failed in the interval (they left without a completion).
    pub rejected: u32,
}

/// Latency after the warm-up (ms).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// Completions by scheduling phase.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PhaseCounts {
    /// Served by reservation (mClock's R tags, RBFQ's local tags, pShift's R-tokens).
    pub reservation: u64,
    /// Served by weight.
    pub weight: u64,
    /// Served above the limit (a limit mode that breaks limits when the device idles).
    pub over_limit: u64,
}

impl PhaseCounts {
    /// The share of IOs served by reservation (0 when none was served).
    pub fn reservation_fraction(&self) -> f64 {
        self.reservation as f64 / (self.reservation + self.weight + self.over_limit).max(1) as f64
    }
}

/// One tenant over the run after the warm-up.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TenantSummary {
    /// Its name.
    pub name: String,
    /// Reservation (IOPS, or the cost model's units); `null` when the spec is unknown.
    pub reservation: Option<f64>,
    /// Limit; `null` when unlimited or unknown.
    pub limit: Option<f64>,
    /// Weight; `null` when the spec is unknown.
    pub weight: Option<f64>,
    /// Completions after the warm-up.
    pub completed: u64,
    /// Completions per second after the warm-up.
    pub iops: f64,
    /// MB (10^6 bytes) per second, over the intervals after the warm-up.
    pub mb_s: f64,
    /// Latency (issue to completion) after the warm-up.
    pub latency_ms: LatencySummary,
    /// Completions by phase; `null` when the server's phases are unknown.
    pub phase: Option<PhaseCounts>,
    /// Requests refused (at a full scheduler queue, or answered with an error).
    pub rejected: u64,
    /// Whether its requests arrive whatever its service (an open workload, a burst, a trace): then what
    /// it offers is its demand, and the fluid oracle gives it no more than that ([`RunTotals::oracle_iops`]).
    /// A closed loop's arrivals follow its completions, so it counts as asking for its whole share.
    pub open_loop: bool,
}

impl TenantSummary {
    /// The spec as the fluid oracle wants it, if known.
    pub fn oracle_tenant(&self) -> Option<OracleTenant> {
        Some(OracleTenant {
            reservation: self.reservation?,
            limit: self.limit.unwrap_or(f64::INFINITY),
            weight: self.weight?,
        })
    }
}

/// One server over the run after the warm-up.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ServerSummary {
    /// Its name.
    pub name: String,
    /// Its scheduler.
    pub scheduler: String,
    /// Whether gateways piggyback delta/rho (dmClock, RBFQ, DTFQ).
    pub distributed: bool,
    /// Completions after the warm-up.
    pub completed: u64,
    /// Completions per second after the warm-up.
    pub iops: f64,
    /// Fraction of the measured time the device was busy; `null` when not observed.
    pub utilisation: Option<f64>,
}

/// The summary written as summary.json and printed by `--json`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    /// The run's (scenario's) name.
    pub name: String,
    /// The default scheduler as written, or what a measured run saw.
    pub scheduler: String,
    /// The sabotage the run was under (`rein sim --sabotage`), absent from the JSON without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sabotage: Option<String>,
    /// The seed.
    pub seed: u64,
    /// Length of the run (s).
    pub duration_s: f64,
    /// Warm-up excluded from the totals (s).
    pub warmup_s: f64,
    /// Tenants, in scenario order.
    pub tenants: Vec<TenantSummary>,
    /// Servers, in scenario order.
    pub servers: Vec<ServerSummary>,
    /// PARDA hosts (scenarios with `[[hosts]]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<hosts::HostsSummary>,
}

impl Summary {
    /// summary.json's text (pretty JSON and a newline).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a summary always serialises") + "\n"
    }
}

/// Per-interval measurements (for timeseries.csv, plots and windowed checks).
#[derive(Clone, Debug)]
pub struct Timeseries {
    /// Interval length (s).
    pub interval_s: f64,
    /// Number of intervals.
    pub intervals: usize,
    /// The last interval's length (s): `interval_s` unless the run is not a whole number of intervals,
    /// when it is cut short at the run's end ([`Timeseries::interval_len`]).
    pub last_interval_s: f64,
    /// Tenant names, in order.
    pub tenant_names: Vec<String>,
    /// Server names, in order.
    pub server_names: Vec<String>,
    /// `cells[tenant * intervals + i]`.
    pub cells: Vec<Cell>,
    /// `server_cells[server * intervals + i]`: completions.
    pub server_cells: Vec<u32>,
    /// Configured capacity (IOPS) per server per interval; empty for a server whose capacity is unknown.
    pub capacity: Vec<Vec<f64>>,
    /// Whether the cells' phase counts are known (else timeseries.csv leaves them empty).
    pub phases_known: bool,
}

impl Timeseries {
    /// The length (s) of interval `i`, over which its counts are rates.
    pub fn interval_len(&self, i: usize) -> f64 {
        interval_len(self.interval_s, self.intervals, self.last_interval_s, i)
    }

    /// Tenant `tenant`'s interval `i`.
    pub fn cell(&self, tenant: usize, i: usize) -> &Cell {
        &self.cells[tenant * self.intervals + i]
    }

    /// Server `server`'s completions in interval `i`.
    pub fn server_cell(&self, server: usize, i: usize) -> u32 {
        self.server_cells[server * self.intervals + i]
    }

    /// Server `server`'s completions over the intervals fully inside [a, b] seconds.
    pub fn server_ios(&self, server: usize, a: f64, b: f64) -> u64 {
        self.window(a, b).map(|i| self.server_cell(server, i) as u64).sum()
    }

    /// Interval indices fully inside [a, b] seconds.
    pub fn window(&self, a: f64, b: f64) -> std::ops::Range<usize> {
        interval_window(self.interval_s, self.intervals, a, b)
    }

    /// A tenant's IOPS over a window.
    pub fn iops(&self, tenant: usize, a: f64, b: f64) -> f64 {
        let w = self.window(a, b);
        let n = w.len() as f64 * self.interval_s;
        let ios: u64 = w.map(|i| self.cell(tenant, i).ios as u64).sum();
        if n > 0.0 {
            ios as f64 / n
        } else {
            0.0
        }
    }

    /// The timeseries as CSV: one row per tenant per interval.
    pub fn to_csv(&self) -> String {
        let mut s = String::from(
            "t_s,tenant,iops,mb_s,latency_mean_ms,latency_max_ms,reservation_ios,weight_ios,over_limit_ios,arrivals,\
             refused\n",
        );
        for i in 0..self.intervals {
            for (ti, name) in self.tenant_names.iter().enumerate() {
                let c = self.cell(ti, i);
                let len = self.interval_len(i);
                let mean = if c.ios > 0 { c.lat_sum_ns as f64 / c.ios as f64 / 1e6 } else { 0.0 };
                s.push_str(&format!(
                    "{:.3},{},{:.3},{:.4},{:.4},{:.4},",
                    i as f64 * self.interval_s,
                    csv_field(name),
                    c.ios as f64 / len,
                    c.bytes as f64 / 1e6 / len,
                    mean,
                    c.lat_max_ns as f64 / 1e6,
                ));
                if self.phases_known {
                    s.push_str(&format!("{},{},{},", c.phase[0], c.phase[1], c.phase[2]));
                } else {
                    s.push_str(",,,");
                }
                s.push_str(&format!("{},{}\n", c.arrivals, c.rejected));
            }
        }
        s
    }
}

/// The length (s) of interval `i` of `intervals` of `interval_s`, the last `last_s` long.
pub fn interval_len(interval_s: f64, intervals: usize, last_s: f64, i: usize) -> f64 {
    if i + 1 == intervals {
        last_s
    } else {
        interval_s
    }
}

/// The last interval's length (s) of a run of `duration_s` in `intervals` intervals of `interval_s`: the
/// rest after the whole ones, or a whole interval when the run ends on a boundary (or says no duration).
pub fn last_interval_s(interval_s: f64, intervals: usize, duration_s: f64) -> f64 {
    let rest = duration_s - (intervals.saturating_sub(1)) as f64 * interval_s;
    if rest > 0.0 && rest < interval_s {
        rest
    } else {
        interval_s
    }
}

/// `names` joined with `, `, at most `max` of them, then ` and N more`: a list in a line of text (a
/// report's buckets, a configuration's tenants), bounded however many there are.
pub fn first_names<S: AsRef<str>>(names: &[S], max: usize) -> String {
    let shown: Vec<&str> = names.iter().take(max).map(AsRef::as_ref).collect();
    let mut line = shown.join(", ");
    if names.len() > max {
        line.push_str(&format!(" and {} more", names.len() - max));
    }
    line
}

/// A name as a CSV field (RFC 4180): as it is, unless it holds a comma, a double quote or a line break;
/// then in double quotes, each double quote doubled. The scenario names the reports carry are checked
/// for control characters before a run, but a name may still hold a comma or a quote.
pub fn csv_field(name: &str) -> std::borrow::Cow<'_, str> {
    if name.contains([',', '"', '\n', '\r']) {
        std::borrow::Cow::Owned(format!("\"{}\"", name.replace('"', "\"\"")))
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

/// Interval indices fully inside [a, b] seconds, for `intervals` intervals of `interval_s`.
pub(crate) fn interval_window(interval_s: f64, intervals: usize, a: f64, b: f64) -> std::ops::Range<usize> {
    let first = (a / interval_s - 1e-9).ceil().max(0.0) as usize;
    let last = ((b / interval_s + 1e-9).floor() as usize).min(intervals);
    first..last.max(first)
}

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct RunTotals {
    /// summary.json.
    pub summary: Summary,
    /// timeseries.csv.
    pub timeseries: Timeseries,
    /// Events the simulator ran (0 for measured runs).
    pub events: u64,
    /// Times a scheduler was given a time earlier than one it had seen (clamped; 0 in a sound run).
    pub time_regressions: u64,
    /// PARDA hosts' timeseries and summary (scenarios with `[[hosts]]`).
    pub hosts: Option<hosts::HostTotals>,
    /// A pShift controller's rounds (scenarios with `[pshift]` and a controller; empty otherwise).
    pub rounds: Vec<rounds::ControllerRound>,
    /// Per pShift bucket (name), its closed periods by the servers' counts (empty without a controller).
    pub periods: Vec<(String, rounds::PeriodCounts)>,
    /// The same periods one by one (periods.csv; empty without a controller).
    pub period_log: rounds::PeriodLog,
    /// The unit of the specs' rates ([`crate::recorder::RunMeta::cost_model`]).
    pub cost_model: rein_core::CostModel,
}

/// A tenant metric an expectation can name (over a window unless said otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantMetric {
    /// Completions per second.
    Iops,
    /// MB per second.
    MbS,
    /// Mean latency (ms).
    LatencyMeanMs,
    /// Median latency after warm-up (ms).
    LatencyP50Ms,
    /// 95th percentile after warm-up (ms).
    LatencyP95Ms,
    /// 99th percentile after warm-up (ms).
    LatencyP99Ms,
    /// Largest latency after warm-up (ms).
    LatencyMaxMs,
    /// Share of completions served in the reservation phase.
    ReservationFraction,
}

/// A server metric an expectation can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerMetric {
    /// Completions per second over a window.
    Iops,
    /// Fraction of the time after warm-up the device was busy.
    Utilisation,
}

/// A metric over tenants and QoS periods (pShift): the share of (tenant, period) pairs in which ...
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeriodMetric {
    /// ... the tenant did at least a threshold percentage of its reservation.
    ReservationMetFraction,
    /// ... the tenant did more than its limit plus a threshold percentage.
    LimitExceededFraction,
}

/// A metric name that names no metric of its subject (`metric "iop": expected one of iops, mb_s, ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{subject} {got:?}: expected one of {expected}")]
pub struct UnknownMetric {
    /// What the metric is of: "metric" (a tenant's), "server metric", "period metric", "host metric".
    pub subject: &'static str,
    /// The name given.
    pub got: String,
    /// The subject's metric names, comma-separated.
    pub expected: String,
}

/// Names and parsing for a metric enum (one table per subject).
macro_rules! metric_names {
    ($t:ty, $what:literal, [$($v:ident = $n:literal),+ $(,)?]) => {
        impl $t {
            /// Every metric, in documentation order.
            pub const ALL: &'static [$t] = &[$(<$t>::$v),+];
            /// The metric's name in scenario files.
            pub fn name(self) -> &'static str {
                match self { $(<$t>::$v => $n),+ }
            }
            /// Every name, comma-separated (for error messages).
            pub fn names() -> String {
                Self::ALL.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
            }
        }
        impl std::str::FromStr for $t {
            type Err = $crate::report::UnknownMetric;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL.iter().copied().find(|m| m.name() == s).ok_or_else(|| $crate::report::UnknownMetric {
                    subject: $what,
                    got: s.to_string(),
                    expected: Self::names(),
                })
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}
pub(crate) use metric_names;

metric_names!(
    TenantMetric,
    "metric",
    [
        Iops = "iops",
        MbS = "mb_s",
        LatencyMeanMs = "latency_mean_ms",
        LatencyP50Ms = "latency_p50_ms",
        LatencyP95Ms = "latency_p95_ms",
        LatencyP99Ms = "latency_p99_ms",
        LatencyMaxMs = "latency_max_ms",
        ReservationFraction = "reservation_fraction",
    ]
);
metric_names!(ServerMetric, "server metric", [Iops = "iops", Utilisation = "utilisation"]);
metric_names!(
    PeriodMetric,
    "period metric",
    [ReservationMetFraction = "reservation_met_fraction", LimitExceededFraction = "limit_exceeded_fraction",]
);

impl TenantMetric {
    /// Whether the metric is over the whole run after warm-up rather than a window.
    pub fn whole_run(self) -> bool {
        matches!(
            self,
            TenantMetric::LatencyP50Ms
                | TenantMetric::LatencyP95Ms
                | TenantMetric::LatencyP99Ms
                | TenantMetric::LatencyMaxMs
        )
    }
}

/// What keeps [`RunTotals::join`] from putting runs together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    /// A position of the whole is given by no part, or by two.
    #[error("{what} {position} is in {count} parts, not one")]
    Cover {
        /// "tenant" or "server".
        what: &'static str,
        /// The position in the whole's list.
        position: usize,
        /// How many parts give it.
        count: usize,
    },
    /// A part's lists do not match the positions given for it.
    #[error("part {part}: {what}")]
    Shape {
        /// The part's index.
        part: usize,
        /// What differs.
        what: String,
    },
}

/// One run of a part of a scenario, for [`RunTotals::join`]: its totals and where its tenants and servers
/// are in the whole's lists.
#[derive(Debug)]
pub struct Part {
    /// The part's run.
    pub totals: RunTotals,
    /// Position in the whole of each of its tenants, in its order.
    pub tenants: Vec<usize>,
    /// Position in the whole of each of its servers, in its order.
    pub servers: Vec<usize>,
}

impl RunTotals {
    /// The totals of runs of disjoint parts of one scenario (its independent groups), put together in the
    /// whole's order: `tenants` and `servers` are the whole's counts, and every position must come from
    /// exactly one part. The parts must have the same duration, warm-up and intervals, and no PARDA hosts
    /// or pShift controller (such a scenario is one group). The summary's name, scheduler and seed are the
    /// first part's; event counts add up.
    pub fn join(tenants: usize, servers: usize, parts: Vec<Part>) -> Result<RunTotals, JoinError> {
        let cover = |what: &'static str, n: usize, of: &dyn Fn(&Part) -> &Vec<usize>| {
            let mut count = vec![0usize; n];
            for p in &parts {
                for &i in of(p) {
                    if i < n {
                        count[i] += 1;
                    } else {
                        return Err(JoinError::Cover { what, position: i, count: 0 });
                    }
                }
            }
            match count.iter().position(|&c| c != 1) {
                Some(position) => Err(JoinError::Cover { what, position, count: count[position] }),
                None => Ok(()),
            }
        };
        cover("tenant", tenants, &|p| &p.tenants)?;
        cover("server", servers, &|p| &p.servers)?;
        let first = &parts.first().ok_or(JoinError::Cover { what: "tenant", position: 0, count: 0 })?.totals;
        let (interval_s, intervals) = (first.timeseries.interval_s, first.timeseries.intervals);
        let (duration_s, warmup_s) = (first.summary.duration_s, first.summary.warmup_s);
        for (k, p) in parts.iter().enumerate() {
            let t = &p.totals;
            let shape = |what: String| Err(JoinError::Shape { part: k, what });
            if t.timeseries.interval_s != interval_s || t.timeseries.intervals != intervals {
                return shape("its intervals differ from the first part's".into());
            }
            if t.summary.duration_s != duration_s || t.summary.warmup_s != warmup_s {
                return shape("its duration or warm-up differs from the first part's".into());
            }
            if t.summary.tenants.len() != p.tenants.len() || t.timeseries.tenant_names.len() != p.tenants.len() {
                return shape(format!("{} tenants run, {} positions given", t.summary.tenants.len(), p.tenants.len()));
            }
            if t.summary.servers.len() != p.servers.len() || t.timeseries.server_names.len() != p.servers.len() {
                return shape(format!("{} servers run, {} positions given", t.summary.servers.len(), p.servers.len()));
            }
            if t.hosts.is_some() || !t.rounds.is_empty() || !t.periods.is_empty() || !t.period_log.buckets.is_empty() {
                return shape("PARDA hosts or a pShift controller (one group, never cut)".into());
            }
            if t.cost_model != first.cost_model {
                return shape("its cost model differs from the first part's".into());
            }
        }
        let mut tenant_at: Vec<(usize, usize)> = vec![(0, 0); tenants];
        let mut server_at: Vec<(usize, usize)> = vec![(0, 0); servers];
        for (k, p) in parts.iter().enumerate() {
            for (j, &i) in p.tenants.iter().enumerate() {
                tenant_at[i] = (k, j);
            }
            for (j, &i) in p.servers.iter().enumerate() {
                server_at[i] = (k, j);
            }
        }
        let tot = |k: usize| &parts[k].totals;
        let capacity_known = parts.iter().all(|p| p.totals.timeseries.capacity.len() == p.servers.len());
        let timeseries = Timeseries {
            interval_s,
            intervals,
            last_interval_s: parts[0].totals.timeseries.last_interval_s,
            tenant_names: tenant_at.iter().map(|&(k, j)| tot(k).timeseries.tenant_names[j].clone()).collect(),
            server_names: server_at.iter().map(|&(k, j)| tot(k).timeseries.server_names[j].clone()).collect(),
            cells: tenant_at
                .iter()
                .flat_map(|&(k, j)| tot(k).timeseries.cells[j * intervals..(j + 1) * intervals].iter().copied())
                .collect(),
            server_cells: server_at
                .iter()
                .flat_map(|&(k, j)| tot(k).timeseries.server_cells[j * intervals..(j + 1) * intervals].iter().copied())
                .collect(),
            capacity: if capacity_known {
                server_at.iter().map(|&(k, j)| tot(k).timeseries.capacity[j].clone()).collect()
            } else {
                Vec::new()
            },
            phases_known: parts.iter().all(|p| p.totals.timeseries.phases_known),
        };
        let summary = Summary {
            name: first.summary.name.clone(),
            scheduler: first.summary.scheduler.clone(),
            sabotage: first.summary.sabotage.clone(),
            seed: first.summary.seed,
            duration_s,
            warmup_s,
            tenants: tenant_at.iter().map(|&(k, j)| tot(k).summary.tenants[j].clone()).collect(),
            servers: server_at.iter().map(|&(k, j)| tot(k).summary.servers[j].clone()).collect(),
            hosts: None,
        };
        Ok(RunTotals {
            summary,
            timeseries,
            events: parts.iter().map(|p| p.totals.events).sum(),
            time_regressions: parts.iter().map(|p| p.totals.time_regressions).sum(),
            hosts: None,
            rounds: Vec::new(),
            periods: Vec::new(),
            period_log: rounds::PeriodLog::default(),
            cost_model: first.cost_model,
        })
    }

    /// Completions after warm-up, all tenants.
    pub fn completions(&self) -> u64 {
        self.summary.tenants.iter().map(|t| t.completed).sum()
    }

    /// Tenant `t`'s `metric` over [a, b] seconds. A metric of completions (a latency, the reservation
    /// fraction) is NaN where there were none (in the window, or after the warm-up for the whole-run
    /// latencies): no bound admits it, so a check on a tenant that completed nothing fails rather than
    /// reading 0.
    pub fn tenant_metric(&self, t: usize, metric: TenantMetric, a: f64, b: f64) -> f64 {
        let ts = &self.timeseries;
        let s = &self.summary.tenants[t];
        let ratio = |num: u64, den: u64, scale: f64| if den > 0 { num as f64 / den as f64 / scale } else { f64::NAN };
        // An empty histogram reads 0 at every quantile.
        let if_completed = |v: f64| if s.completed > 0 { v } else { f64::NAN };
        match metric {
            TenantMetric::Iops => ts.iops(t, a, b),
            TenantMetric::MbS => {
                let w = ts.window(a, b);
                let secs = w.len() as f64 * ts.interval_s;
                let bytes: u64 = w.map(|i| ts.cell(t, i).bytes).sum();
                if secs > 0.0 {
                    bytes as f64 / 1e6 / secs
                } else {
                    0.0
                }
            }
            TenantMetric::LatencyMeanMs => {
                let (n, sum) = ts
                    .window(a, b)
                    .fold((0u64, 0u64), |(n, s), i| (n + ts.cell(t, i).ios as u64, s + ts.cell(t, i).lat_sum_ns));
                ratio(sum, n, 1e6)
            }
            TenantMetric::LatencyP50Ms => if_completed(s.latency_ms.p50),
            TenantMetric::LatencyP95Ms => if_completed(s.latency_ms.p95),
            TenantMetric::LatencyP99Ms => if_completed(s.latency_ms.p99),
            TenantMetric::LatencyMaxMs => if_completed(s.latency_ms.max),
            TenantMetric::ReservationFraction => {
                let (r, n) = ts
                    .window(a, b)
                    .fold((0u64, 0u64), |(r, n), i| (r + ts.cell(t, i).phase[0] as u64, n + ts.cell(t, i).ios as u64));
                ratio(r, n, 1.0)
            }
        }
    }

    /// Server `s`'s `metric` over [a, b] seconds (utilisation: after warm-up; NaN when not observed).
    pub fn server_metric(&self, s: usize, metric: ServerMetric, a: f64, b: f64) -> f64 {
        let ts = &self.timeseries;
        match metric {
            ServerMetric::Iops => {
                let secs = ts.window(a, b).len() as f64 * ts.interval_s;
                let n = ts.server_ios(s, a, b);
                if secs > 0.0 {
                    n as f64 / secs
                } else {
                    0.0
                }
            }
            ServerMetric::Utilisation => self.summary.servers[s].utilisation.unwrap_or(f64::NAN),
        }
    }

    /// The fluid oracle's IOPS for each tenant over a window: for each interval in it, mClock eq. (1)-(2)
    /// among the tenants active in that interval with T = their measured total, averaged over the window.
    /// A tenant is active when it completed IOs in the interval or had requests waiting in it (outstanding
    /// when it began, or arriving in it): so tenants joining or leaving mid-run are judged against the
    /// allocation of the intervals they were there, and a tenant the scheduler serves nothing at all is
    /// still owed its share (it was ignored before, and a check of it passed at 0). NaN for a tenant whose
    /// spec is unknown, and under a size cost model for one that completed nothing in the whole run (its
    /// cost per IO is unknown).
    ///
    /// Demand: a closed loop is taken as backlogged (it asks for its whole share: its arrivals follow
    /// its completions, so they say nothing of what it would take). An open loop
    /// ([`TenantSummary::open_loop`]) asks for what it has outstanding when the interval starts plus what
    /// arrives in it, D = backlog + arrivals (at least its completions), and gets no more: its
    /// reservation and limit are capped at D per interval, and the capacity it leaves goes to the
    /// others (eq. (1) over min(r, D), min(l, D)). The backlog is counted from the run's start: every
    /// arrival less every completion and every refusal before the interval. A tenant served below its
    /// share keeps a growing backlog, so its demand grows and the oracle still asks its share for it: the
    /// cap cannot hide a tenant the scheduler starves. Each interval is judged from the backlog the run
    /// had (not from the oracle's own service in the intervals before), so a tenant kept waiting is owed
    /// its backlog in every interval it waits: over a window the oracle can exceed what it offered.
    ///
    /// Under a size cost model the specs are in cost units per second: the allocation is made in cost
    /// units (T the measured cost rate) and each tenant's share turned back into IOPS by its own cost per
    /// IO in that interval.
    pub fn oracle_iops(&self, a: f64, b: f64) -> Vec<f64> {
        let ts = &self.timeseries;
        let tenants = &self.summary.tenants;
        let w = ts.window(a, b);
        let n = w.len().max(1) as f64;
        let mut out: Vec<f64> =
            tenants.iter().map(|t| if t.oracle_tenant().is_some() { 0.0 } else { f64::NAN }).collect();
        // IOs per cost unit of a tenant over the whole run, for intervals in which it completed nothing
        // (1 under the IO cost model; NaN when it completed nothing under a size model).
        let run_ios_per_unit: Vec<f64> = (0..tenants.len())
            .map(|t| {
                let (ios, bytes) = (0..ts.intervals)
                    .map(|i| ts.cell(t, i))
                    .fold((0u64, 0u64), |(n, b), c| (n + u64::from(c.ios), b + c.bytes));
                match self.cost_model {
                    rein_core::CostModel::PerIo => 1.0,
                    m if ios > 0 && m.units_of(ios, bytes) > 0.0 => ios as f64 / m.units_of(ios, bytes),
                    _ => f64::NAN,
                }
            })
            .collect();
        // Each tenant's requests outstanding at the start of interval `i` (from the run's start).
        let mut backlog = vec![0u64; tenants.len()];
        let mut active = Vec::new();
        let mut specs = Vec::new();
        for i in 0..w.end {
            let measured = w.contains(&i);
            active.clear();
            specs.clear();
            let mut total = 0.0;
            for (t, summary) in tenants.iter().enumerate() {
                let cell = ts.cell(t, i);
                let outstanding = backlog[t];
                let left = u64::from(cell.ios) + u64::from(cell.rejected);
                backlog[t] = (outstanding + u64::from(cell.arrivals)).saturating_sub(left);
                if !measured {
                    continue;
                }
                let units = self.cost_model.units_of(cell.ios as u64, cell.bytes);
                let served = cell.ios > 0 && units > 0.0;
                // Waiting for service all interval without a completion: active, and owed its share.
                let waiting = outstanding + u64::from(cell.arrivals) > 0;
                if served || waiting {
                    if let Some(mut spec) = summary.oracle_tenant() {
                        let ios_per_unit = if served { cell.ios as f64 / units } else { run_ios_per_unit[t] };
                        if summary.open_loop {
                            let demand_ios = (outstanding + u64::from(cell.arrivals)).max(u64::from(cell.ios));
                            let demand = demand_ios as f64 / ios_per_unit / ts.interval_s;
                            spec.reservation = spec.reservation.min(demand);
                            spec.limit = spec.limit.min(demand);
                        }
                        active.push((t, ios_per_unit));
                        specs.push(spec);
                        total += units / ts.interval_s;
                    }
                }
            }
            if !measured {
                continue;
            }
            let alloc = allocate(&specs, total);
            for (k, &(t, ios_per_unit)) in active.iter().enumerate() {
                out[t] += alloc.rates[k] * ios_per_unit / n;
            }
        }
        out
    }

    /// Over the given QoS periods (`(start, end)` seconds) and tenants: (number of tenant-periods, the
    /// share of them in which the tenant met its reservation (`metric` ReservationMetFraction: at least
    /// `threshold_pct`% of R x period, [`ReservationMeter`]) or exceeded its limit (more than
    /// (1 + `threshold_pct`/100) x L x period)). Tenants without a reservation always meet it; without a
    /// limit (or an unknown spec) never exceed it. Every tenant-period counts, whatever the tenant's
    /// demand (pShift's measure). No tenant-period (no QoS period in the window) gives NaN, which no
    /// bound admits, as the controller's tally does: a share of nothing is not 0.
    pub fn tenant_periods(
        &self,
        tenants: &[usize],
        periods: &[(f64, f64)],
        metric: PeriodMetric,
        threshold_pct: f64,
    ) -> (u64, f64) {
        let ts = &self.timeseries;
        let (mut n, mut hit) = (0u64, 0u64);
        for &(p0, p1) in periods {
            let w = ts.window(p0, p1);
            for &t in tenants {
                let ios: u64 = w.clone().map(|i| ts.cell(t, i).ios as u64).sum();
                let spec = &self.summary.tenants[t];
                let secs = p1 - p0;
                let yes = match metric {
                    PeriodMetric::ReservationMetFraction => {
                        ReservationMeter::periodic(spec.reservation.unwrap_or(0.0), threshold_pct).met(ios as f64, secs)
                    }
                    PeriodMetric::LimitExceededFraction => {
                        spec.limit.is_some_and(|l| ios as f64 > l * secs * (1.0 + threshold_pct / 100.0) + 1e-9)
                    }
                };
                n += 1;
                hit += yes as u64;
            }
        }
        (n, if n > 0 { hit as f64 / n as f64 } else { f64::NAN })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metric name of no metric is an [`UnknownMetric`] naming the subject, the name and the choices,
    /// with the message the `String` error had (the strings below are that error's text).
    #[test]
    fn an_unknown_metric_name_is_typed_and_names_the_choices() {
        let e = "iop".parse::<TenantMetric>().unwrap_err();
        assert!(matches!(&e, UnknownMetric { subject: "metric", got, .. } if got == "iop"), "{e:?}");
        assert_eq!(
            e.to_string(),
            "metric \"iop\": expected one of iops, mb_s, latency_mean_ms, latency_p50_ms, latency_p95_ms, \
             latency_p99_ms, latency_max_ms, reservation_fraction"
        );
        let e = "busy".parse::<ServerMetric>().unwrap_err();
        assert!(matches!(&e, UnknownMetric { subject: "server metric", got, .. } if got == "busy"), "{e:?}");
        assert_eq!(e.to_string(), "server metric \"busy\": expected one of iops, utilisation");
        let e = "met".parse::<PeriodMetric>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "period metric \"met\": expected one of reservation_met_fraction, limit_exceeded_fraction"
        );
        let e = "Window".parse::<hosts::HostMetric>().unwrap_err();
        assert!(matches!(&e, UnknownMetric { subject: "host metric", got, .. } if got == "Window"), "{e:?}");
        assert_eq!(
            e.to_string(),
            "host metric \"Window\": expected one of window, beta, iops, latency_mean_ms, signal_ms, convergence_s"
        );
        for m in TenantMetric::ALL {
            assert_eq!(m.name().parse::<TenantMetric>(), Ok(*m));
        }
    }
}
