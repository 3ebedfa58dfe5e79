//! `[pshift]` as written (pshift.txt §IV; validated by [`crate::model::pshift`]).

use serde::Deserialize;

fn default_intervals() -> u32 {
    5
}
fn default_true() -> bool {
    true
}

/// `[pshift]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PshiftFile {
    /// QoS period (s).
    pub period_s: f64,
    /// Redistribution intervals per period.
    #[serde(default = "default_intervals")]
    pub intervals: u32,
    /// When the first QoS period starts (default: one redistribution interval, during which the servers
    /// run plain round robin and collect the statistics of the first report).
    pub start_s: Option<f64>,
    /// false: no controller, the servers stay plain round robin (the paper's baseline).
    #[serde(default = "default_true")]
    pub controller: bool,
    /// One-way delay between a server and the controller (ms).
    #[serde(default)]
    pub delay_ms: f64,
    /// arrivals (default) | backlog
    pub estimator: Option<String>,
    /// §III-C: the controller solves with only the top M buckets shifting.
    pub approx_top: Option<usize>,
    /// Weighted round robin by tenant weight (§V "Local Priorities").
    #[serde(default)]
    pub weighted: bool,
    /// uniform (default, the paper's "uniform rate") | poisson: open arrivals per server.
    pub arrivals: Option<String>,
    pub generate: Option<GenerateFile>,
}

/// `[pshift.generate]`: synthetic buckets (§IV-B).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateFile {
    pub buckets: usize,
    /// Every bucket reserves this many IOPS ...
    pub reservation_iops: Option<f64>,
    /// ... or the servers' capacity times r is split by a Zipf law of exponent s (default 0.5).
    pub reserved_fraction: Option<f64>,
    pub reservation_zipf_s: Option<f64>,
    /// Limit: a fixed rate, or a multiple of the reservation; none by default.
    pub limit_iops: Option<f64>,
    pub limit_ratio: Option<f64>,
    /// Open arrivals at m x the reservation ...
    pub demand_ratio: Option<f64>,
    /// ... or closed loops keeping this many requests at each active server.
    pub outstanding_per_server: Option<u32>,
    /// N_A: a number, or [min, max] drawn uniformly at each demand phase.
    pub active_servers: ActiveFile,
    /// Zipf exponent of the demand split over the active servers (default 0.5; 0 = even).
    pub demand_zipf_s: Option<f64>,
    /// Demand changes per bucket over the QoS periods of the run, at uniformly random times; each draws
    /// a fresh set of active servers and a fresh split.
    #[serde(default)]
    pub demand_changes: u32,
    #[serde(default = "default_size_kb")]
    pub size_kb: f64,
}

fn default_size_kb() -> f64 {
    4.0
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ActiveFile {
    One(usize),
    Range([usize; 2]),
}
