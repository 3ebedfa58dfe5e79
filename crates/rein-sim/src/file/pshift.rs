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
    /// QoS period (s): reservations and limits are per period (rate x `period_s` IOs). In [0.001, 86,400];
    /// a multiple of the scenario's `interval_s`.
    pub period_s: f64,
    /// Redistribution intervals per period (default 5): the controller reallocates tokens at each
    /// interval's boundary. In 1..=1000; `period_s / intervals` must be a whole number of nanoseconds.
    #[serde(default = "default_intervals")]
    pub intervals: u32,
    /// When the first QoS period starts (s; default: one redistribution interval, during which the servers
    /// run plain round robin and collect the statistics of the first report). A multiple of `interval_s`,
    /// before the end of the run.
    pub start_s: Option<f64>,
    /// false: no controller, the servers stay plain round robin (the paper's baseline).
    #[serde(default = "default_true")]
    pub controller: bool,
    /// One-way delay between a server and the controller (ms, at most 10,000): reports take it to reach
    /// the controller, tokens take it again to reach the servers.
    #[serde(default)]
    pub delay_ms: f64,
    /// How the controller estimates a bucket's demand: arrivals (default: queued plus arrivals scaled to
    /// the time left) | backlog (also: a bucket never idle since its first request in the interval can
    /// use the whole server, as closed loops do).
    pub estimator: Option<String>,
    /// With `estimator = "backlog"`: a queue empty for less than this % of an interval counts as
    /// backlogged (0.01 to 100; default 1).
    pub backlog_idle_pct: Option<f64>,
    /// §III-C: the controller solves with only the top M buckets shifting (default: all of them).
    pub approx_top: Option<usize>,
    /// Weighted round robin by tenant weight (§V "Local Priorities").
    #[serde(default)]
    pub weighted: bool,
    /// How a server serves the buckets holding R-tokens: mixed (default: proportional, but a grant under
    /// `r_floor_ios` is spent at the pace of one of that size) | round_robin (Algorithm 1 as written) |
    /// proportional (at the pace of their grants; rein-core's `tokens` module).
    pub r_order: Option<String>,
    /// `r_order = "mixed"` (the default): grants under this many R-tokens are not paced (1..=1e9; default 1,000).
    pub r_floor_ios: Option<u64>,
    /// Keep the tokens a server may spend while the controller's answer is in flight out of a bucket's
    /// remaining limit (default true; rein-core's controller, "Limits across the message delay"). false:
    /// the paper's controller, which does not account for them.
    #[serde(default = "default_true")]
    pub exact_limits: bool,
    /// Early rounds per redistribution interval (0..=100; default 4; 0 is the paper's controller): a
    /// server where a bucket with reservation left arrives without tokens asks the controller for a round
    /// before the next boundary (rein-core's controller, "Early rounds").
    pub early_rounds: Option<u32>,
    /// uniform (default, the paper's "uniform rate") | poisson: open arrivals per server.
    pub arrivals: Option<String>,
    /// `[pshift.generate]`: synthetic buckets, instead of writing them as `[[tenants]]`.
    pub generate: Option<GenerateFile>,
}

/// `[pshift.generate]`: synthetic buckets (§IV-B).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateFile {
    /// Number of buckets, named `b0`, `b1`, ... (1 to [`crate::model::MAX_TENANTS`]).
    pub buckets: usize,
    /// Every bucket reserves this many IOPS ...
    pub reservation_iops: Option<f64>,
    /// ... or the servers' total capacity (IOs per QoS period) times r (default 1, in [0, 10]) is split
    /// among the buckets by a Zipf law.
    pub reserved_fraction: Option<f64>,
    /// The exponent s of that Zipf law (default 0.5, in [0, 10]; 0 gives every bucket the same).
    pub reservation_zipf_s: Option<f64>,
    /// Limit (IOPS), the same for every bucket and raised to a bucket's reservation if below it ...
    pub limit_iops: Option<f64>,
    /// ... or a multiple (at least 1) of each bucket's reservation. Neither: unlimited.
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
    /// Request size (KiB, default 4).
    #[serde(default = "default_size_kb")]
    pub size_kb: f64,
}

fn default_size_kb() -> f64 {
    4.0
}

/// `active_servers`: how many servers a bucket is active on in each demand phase (N_A).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ActiveFile {
    /// Always this many.
    One(usize),
    /// `[min, max]`: drawn uniformly (both ends included) at each demand phase.
    Range([usize; 2]),
}
