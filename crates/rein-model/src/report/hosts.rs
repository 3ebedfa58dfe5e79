//! PARDA hosts' report (parda.txt §3-5): per host per interval its completions, latency, window, beta and
//! latency signal, and what expectations check about them (eq. (3)'s equilibrium, convergence times).
//!
//! A [`HostRecorder`] collects [`HostCell`]s while a run goes (completions as they happen, the
//! controller's state at each period end); [`HostRecorder::finish`] carries each host's state forward
//! through intervals without a period end and summarises. Metrics over `[a, b]` seconds use the
//! intervals fully inside it.

use rein_core::parda::{equilibrium_latency, equilibrium_windows};
use rein_core::Nanos;
use serde::Serialize;

/// One host per interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostCell {
    /// Completions at this host in the interval.
    pub ios: u32,
    /// Their summed latency, host issue to completion (ns).
    pub lat_sum_ns: u64,
    /// The window at the end of the interval (the last period end in or before it).
    pub window: f64,
    /// beta, likewise.
    pub beta: f64,
    /// The latency signal used (cluster average or own estimate), ns; 0 if none.
    pub signal_ns: f64,
    /// The host's own eq. (1) estimate, ns.
    pub estimate_ns: f64,
}

/// What the report says about the hosts besides their cells.
#[derive(Clone, Debug)]
pub struct HostsMeta {
    /// Host names, in order.
    pub names: Vec<String>,
    /// Whether each host runs PARDA.
    pub controlled: Vec<bool>,
    /// script-L (ms).
    pub threshold_ms: f64,
    /// The control period (s).
    pub period_s: f64,
    /// cluster or local.
    pub aggregation: String,
    /// false: the no-PARDA baseline.
    pub enabled: bool,
    /// Warm-up (s): the summary covers [warm-up, end].
    pub warmup_s: f64,
    /// Length of the run (s).
    pub duration_s: f64,
}

/// Collects host cells during a run.
#[derive(Clone, Debug)]
pub struct HostRecorder {
    interval: u64,
    intervals: usize,
    cells: Vec<HostCell>,
    /// Whether a period ended in the interval (else its state is carried forward).
    set: Vec<bool>,
}

/// The hosts' recorder was asked for more than its bound of timeseries cells (hosts x intervals).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{hosts} hosts x {intervals} intervals exceeds {max} host timeseries cells: raise interval_s")]
pub struct TooManyHostCells {
    /// Hosts asked for.
    pub hosts: usize,
    /// Intervals asked for.
    pub intervals: usize,
    /// The bound (a run's is [`crate::recorder::MAX_CELLS`]).
    pub max: usize,
}

impl TooManyHostCells {
    /// Whether `hosts` over `intervals` fit within `max` cells; counts the cells, does not allocate them
    /// ([`HostRecorder::new`] allocates what this allows; a scenario's validation calls it first).
    pub fn check(hosts: usize, intervals: usize, max: usize) -> Result<(), TooManyHostCells> {
        if intervals.checked_mul(hosts).is_some_and(|c| c <= max) {
            Ok(())
        } else {
            Err(TooManyHostCells { hosts, intervals, max })
        }
    }
}

impl HostRecorder {
    /// A recorder for `hosts` hosts over `intervals` intervals of `interval`; refused if the cells would
    /// exceed `max_cells` ([`TooManyHostCells::check`]).
    pub fn new(
        hosts: usize,
        interval: Nanos,
        intervals: usize,
        max_cells: usize,
    ) -> Result<HostRecorder, TooManyHostCells> {
        TooManyHostCells::check(hosts, intervals, max_cells)?;
        // Within max_cells (checked just above), so no overflow.
        let cells = intervals * hosts;
        Ok(HostRecorder {
            interval: interval.0,
            intervals,
            cells: vec![HostCell::default(); cells],
            set: vec![false; cells],
        })
    }

    fn index(&self, host: usize, now: Nanos) -> usize {
        host * self.intervals + ((now.0 / self.interval) as usize).min(self.intervals - 1)
    }

    /// A request host `host` issued completed at `now` after `latency`.
    pub fn completion(&mut self, host: usize, now: Nanos, latency: Nanos) {
        let i = self.index(host, now);
        let c = &mut self.cells[i];
        c.ios += 1;
        c.lat_sum_ns += latency.0;
    }

    /// `ios` requests host `host` issued completed in the interval holding `now`, their latencies summing
    /// to `lat_sum_ns` (a measured run reads a host's counters once per interval).
    pub fn completions(&mut self, host: usize, now: Nanos, ios: u32, lat_sum_ns: u64) {
        let i = self.index(host, now);
        let c = &mut self.cells[i];
        c.ios = c.ios.saturating_add(ios);
        c.lat_sum_ns = c.lat_sum_ns.saturating_add(lat_sum_ns);
    }

    /// Host `host`'s state at a period end at `now` (signal and estimate in ns, 0 if none).
    pub fn period(&mut self, host: usize, now: Nanos, window: f64, beta: f64, signal_ns: f64, estimate_ns: f64) {
        let i = self.index(host, now);
        let c = &mut self.cells[i];
        c.window = window;
        c.beta = beta;
        c.signal_ns = signal_ns;
        c.estimate_ns = estimate_ns;
        self.set[i] = true;
    }

    /// The totals: state carried forward, summary computed.
    pub fn finish(mut self, meta: HostsMeta) -> HostTotals {
        for h in 0..meta.names.len() {
            let row = h * self.intervals;
            let mut last = self.cells[row];
            for i in row..row + self.intervals {
                if self.set[i] {
                    last = self.cells[i];
                } else {
                    let c = &mut self.cells[i];
                    c.window = last.window;
                    c.beta = last.beta;
                    c.signal_ns = last.signal_ns;
                    c.estimate_ns = last.estimate_ns;
                }
            }
        }
        let mut t = HostTotals {
            names: meta.names,
            controlled: meta.controlled,
            interval_s: self.interval as f64 / 1e9,
            intervals: self.intervals,
            last_interval_s: super::last_interval_s(self.interval as f64 / 1e9, self.intervals, meta.duration_s),
            cells: self.cells,
            threshold_ms: meta.threshold_ms,
            period_s: meta.period_s,
            summary: HostsSummary::default(),
        };
        t.summary = t.summarise(meta.warmup_s, meta.duration_s, &meta.aggregation, meta.enabled);
        t
    }
}

/// Host-level results of a run.
#[derive(Clone, Debug)]
pub struct HostTotals {
    /// Host names, in order.
    pub names: Vec<String>,
    /// Whether each host ran PARDA.
    pub controlled: Vec<bool>,
    /// Interval length (s).
    pub interval_s: f64,
    /// Number of intervals.
    pub intervals: usize,
    /// The last interval's length (s), short when the run ends inside it ([`HostTotals::interval_len`]).
    pub last_interval_s: f64,
    /// `cells[host * intervals + i]`.
    pub cells: Vec<HostCell>,
    /// script-L (ms).
    pub threshold_ms: f64,
    /// The control period (s).
    pub period_s: f64,
    /// The `hosts` section of summary.json.
    pub summary: HostsSummary,
}

/// Convergence times judge the window averaged over this many control periods either side: enough to
/// damp one period's noise, short enough not to hide a step (eq. (2) moves 80% of the way per period).
pub const SMOOTH_PERIODS: f64 = 2.0;

/// The `hosts` section of summary.json.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct HostsSummary {
    /// script-L (ms).
    pub latency_threshold_ms: f64,
    /// cluster or local.
    pub aggregation: String,
    /// false: the no-PARDA baseline (`[parda] enabled = false`).
    pub enabled: bool,
    /// All hosts' completions per second after the warm-up.
    pub iops: f64,
    /// All hosts' IO-weighted mean latency after the warm-up, issue at the host to completion (ms).
    pub latency_mean_ms: f64,
    /// eq. (3)'s equilibrium latency `script_L + sum beta / C` for the active PARDA hosts' mean betas and
    /// their throughput C after the warm-up (ms); `None` when it is not finite (no PARDA host completed
    /// an IO).
    pub equilibrium_latency_ms: Option<f64>,
    /// Per host.
    pub hosts: Vec<HostSummary>,
}

/// One host after the warm-up.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HostSummary {
    /// Its name.
    pub name: String,
    /// Whether it ran PARDA.
    pub controlled: bool,
    /// Mean beta over intervals.
    pub beta_mean: f64,
    /// Mean window over intervals.
    pub window_mean: f64,
    /// eq. (3) for this host from the PARDA hosts' mean betas and measured throughput after warm-up
    /// (`None` for an uncontrolled host).
    pub equilibrium_window: Option<f64>,
    /// Completions per second.
    pub iops: f64,
    /// Mean latency, issue at the host to completion (ms).
    pub latency_mean_ms: f64,
    /// Mean latency signal (ms).
    pub signal_mean_ms: f64,
    /// Time from the start until the window (averaged over 2 control periods either side) stays within
    /// 10% of its final value (mean over the last tenth of the run); `None` if it never settles.
    pub convergence_s: Option<f64>,
}

/// Which hosts a host metric is about.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HostSubject {
    /// One host (by index).
    Host(usize),
    /// The whole cluster.
    All,
}

/// A host metric an expectation can name (means and rates over a window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostMetric {
    /// The window (the sum over PARDA hosts for the cluster).
    Window,
    /// beta (the sum over PARDA hosts for the cluster, as for the window: eq. (3)'s sum of betas).
    Beta,
    /// Completions per second.
    Iops,
    /// IO-weighted mean latency, issue at the host to completion (ms).
    LatencyMeanMs,
    /// The latency signal PARDA hosts used (cluster average or own estimate; the mean over PARDA hosts
    /// for the cluster) (ms).
    SignalMs,
    /// Time until the window settles within a band (the slowest PARDA host for the cluster) (s).
    ConvergenceS,
}

super::metric_names!(
    HostMetric,
    "host metric",
    [
        Window = "window",
        Beta = "beta",
        Iops = "iops",
        LatencyMeanMs = "latency_mean_ms",
        SignalMs = "signal_ms",
        ConvergenceS = "convergence_s",
    ]
);

impl HostTotals {
    /// The length (s) of interval `i`, over which its IOs are a rate.
    pub fn interval_len(&self, i: usize) -> f64 {
        super::interval_len(self.interval_s, self.intervals, self.last_interval_s, i)
    }

    /// Host `h`'s interval `i`.
    pub fn cell(&self, h: usize, i: usize) -> &HostCell {
        &self.cells[h * self.intervals + i]
    }

    fn window(&self, a: f64, b: f64) -> std::ops::Range<usize> {
        super::interval_window(self.interval_s, self.intervals, a, b)
    }

    fn mean_of(&self, h: usize, a: f64, b: f64, f: impl Fn(&HostCell) -> f64) -> f64 {
        let w = self.window(a, b);
        let n = w.len();
        if n == 0 {
            return 0.0;
        }
        w.map(|i| f(self.cell(h, i))).sum::<f64>() / n as f64
    }

    fn ios(&self, h: usize, a: f64, b: f64) -> (u64, u64) {
        self.window(a, b).fold((0, 0), |(n, s), i| (n + self.cell(h, i).ios as u64, s + self.cell(h, i).lat_sum_ns))
    }

    fn iops(&self, h: usize, a: f64, b: f64) -> f64 {
        let secs = self.window(a, b).len() as f64 * self.interval_s;
        if secs > 0.0 {
            self.ios(h, a, b).0 as f64 / secs
        } else {
            0.0
        }
    }

    /// PARDA hosts active (completing IOs) in [a, b], their mean betas, and their total throughput.
    pub fn active(&self, a: f64, b: f64) -> (Vec<usize>, Vec<f64>, f64) {
        let hosts: Vec<usize> =
            (0..self.names.len()).filter(|&h| self.controlled[h] && self.ios(h, a, b).0 > 0).collect();
        let betas = hosts.iter().map(|&h| self.mean_of(h, a, b, |c| c.beta)).collect();
        let c = hosts.iter().map(|&h| self.iops(h, a, b)).sum();
        (hosts, betas, c)
    }

    /// eq. (3) for host `h` over [a, b] (0 if it is not an active PARDA host).
    pub fn equilibrium_window(&self, h: usize, a: f64, b: f64) -> f64 {
        let (hosts, betas, c) = self.active(a, b);
        let w = equilibrium_windows(&betas, c, self.threshold_ms / 1e3);
        hosts.iter().position(|&x| x == h).map_or(0.0, |k| w[k])
    }

    /// `script_L + sum beta / C` over [a, b], ms.
    pub fn equilibrium_latency_ms(&self, a: f64, b: f64) -> f64 {
        let (_, betas, c) = self.active(a, b);
        equilibrium_latency(&betas, c, self.threshold_ms / 1e3) * 1e3
    }

    /// Host `h`'s window averaged over `SMOOTH_PERIODS` control periods either side of interval `i`
    /// (within `range`): centred, so the average does not lag a step.
    fn smoothed_window(&self, h: usize, range: &std::ops::Range<usize>, i: usize) -> f64 {
        let k = (SMOOTH_PERIODS * self.period_s / self.interval_s).round() as usize;
        let lo = i.saturating_sub(k).max(range.start);
        let hi = (i + k + 1).min(range.end);
        (lo..hi).map(|j| self.cell(h, j).window).sum::<f64>() / (hi - lo) as f64
    }

    /// Convergence time: seconds from `a` until host `h`'s window, smoothed over `SMOOTH_PERIODS`
    /// control periods either side (one period's window moves with the noise of one period's
    /// latencies: about 15% at windows of 4 with exponential service), stays within `band_pct` of its
    /// settled value (the mean over the last `tail` fraction of [a, b]) up to `b`. `None` if it is
    /// outside the band at the end.
    pub fn convergence(&self, h: usize, a: f64, b: f64, band_pct: f64, tail: f64) -> Option<f64> {
        let w = self.window(a, b);
        if w.is_empty() {
            return None;
        }
        let settle = self.mean_of(h, b - (b - a) * tail, b, |c| c.window);
        let ok = |i: usize| (self.smoothed_window(h, &w, i) - settle).abs() <= settle * band_pct / 100.0;
        let mut first = None;
        for i in w.clone().rev() {
            if ok(i) {
                first = Some(i);
            } else {
                break;
            }
        }
        first.map(|i| (i as f64 * self.interval_s - a).max(0.0))
    }

    /// `metric` over [a, b] seconds for one host or the cluster (see [`HostMetric`] for how the cluster
    /// combines its hosts: sums, IO-weighted means, or the slowest to converge); `band_pct` is the
    /// convergence band and matters only for [`HostMetric::ConvergenceS`], which is infinite for a host
    /// whose window has not settled by `b`.
    pub fn metric(&self, who: HostSubject, metric: HostMetric, a: f64, b: f64, band_pct: f64) -> f64 {
        let all: Vec<usize> = (0..self.names.len()).collect();
        let hs: &[usize] = match who {
            HostSubject::Host(h) => std::slice::from_ref(&all[h]),
            HostSubject::All => &all,
        };
        // The cluster's window and beta are the PARDA hosts' sums (an uncontrolled host has neither).
        let parda = |h: &&usize| matches!(who, HostSubject::Host(_)) || self.controlled[**h];
        match metric {
            HostMetric::Window => hs.iter().filter(parda).map(|&h| self.mean_of(h, a, b, |c| c.window)).sum(),
            HostMetric::Beta => hs.iter().filter(parda).map(|&h| self.mean_of(h, a, b, |c| c.beta)).sum(),
            HostMetric::Iops => hs.iter().map(|&h| self.iops(h, a, b)).sum(),
            HostMetric::LatencyMeanMs => {
                let (n, s) = hs.iter().fold((0u64, 0u64), |(n, s), &h| {
                    let (a2, b2) = self.ios(h, a, b);
                    (n + a2, s + b2)
                });
                if n > 0 {
                    s as f64 / n as f64 / 1e6
                } else {
                    0.0
                }
            }
            HostMetric::SignalMs => {
                let v: Vec<f64> = hs
                    .iter()
                    .filter(|&&h| self.controlled[h])
                    .map(|&h| self.mean_of(h, a, b, |c| c.signal_ns / 1e6))
                    .collect();
                v.iter().sum::<f64>() / v.len().max(1) as f64
            }
            HostMetric::ConvergenceS => hs
                .iter()
                .filter(parda)
                .map(|&h| self.convergence(h, a, b, band_pct, 0.25).unwrap_or(f64::INFINITY))
                .fold(0.0, f64::max),
        }
    }

    fn summarise(&self, a: f64, b: f64, aggregation: &str, enabled: bool) -> HostsSummary {
        let hosts = (0..self.names.len())
            .map(|h| HostSummary {
                name: self.names[h].clone(),
                controlled: self.controlled[h],
                beta_mean: self.metric(HostSubject::Host(h), HostMetric::Beta, a, b, 10.0),
                window_mean: self.metric(HostSubject::Host(h), HostMetric::Window, a, b, 10.0),
                equilibrium_window: self.controlled[h].then(|| self.equilibrium_window(h, a, b)),
                iops: self.metric(HostSubject::Host(h), HostMetric::Iops, a, b, 10.0),
                latency_mean_ms: self.metric(HostSubject::Host(h), HostMetric::LatencyMeanMs, a, b, 10.0),
                signal_mean_ms: self.mean_of(h, a, b, |c| c.signal_ns / 1e6),
                convergence_s: self.convergence(h, 0.0, b, 10.0, 0.1),
            })
            .collect();
        HostsSummary {
            latency_threshold_ms: self.threshold_ms,
            aggregation: aggregation.to_string(),
            enabled,
            iops: self.metric(HostSubject::All, HostMetric::Iops, a, b, 10.0),
            latency_mean_ms: self.metric(HostSubject::All, HostMetric::LatencyMeanMs, a, b, 10.0),
            equilibrium_latency_ms: Some(self.equilibrium_latency_ms(a, b)).filter(|l| l.is_finite()),
            hosts,
        }
    }

    /// hosts.csv: one row per host per interval.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("t_s,host,window,beta,iops,latency_mean_ms,signal_ms,estimate_ms\n");
        for i in 0..self.intervals {
            for (h, name) in self.names.iter().enumerate() {
                let c = self.cell(h, i);
                let lat = if c.ios > 0 { c.lat_sum_ns as f64 / c.ios as f64 / 1e6 } else { 0.0 };
                s.push_str(&format!(
                    "{:.3},{},{:.4},{:.4},{:.3},{:.4},{:.4},{:.4}\n",
                    i as f64 * self.interval_s,
                    super::csv_field(name),
                    c.window,
                    c.beta,
                    c.ios as f64 / self.interval_len(i),
                    lat,
                    c.signal_ns / 1e6,
                    c.estimate_ns / 1e6
                ));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cluster's window and beta are sums over the same hosts: the PARDA ones. A host without PARDA
    /// (window 32, beta 5 as recorded) adds to neither; on its own it reports both.
    #[test]
    fn the_host_cell_bound_holds_at_its_edge() {
        let max = crate::recorder::MAX_CELLS;
        assert_eq!(TooManyHostCells::check(50, 1_000_000, max), Ok(()));
        let e = TooManyHostCells::check(51, 1_000_000, max).unwrap_err();
        assert_eq!(e, TooManyHostCells { hosts: 51, intervals: 1_000_000, max });
        assert_eq!(
            e.to_string(),
            "51 hosts x 1000000 intervals exceeds 50000000 host timeseries cells: raise interval_s"
        );
        assert!(TooManyHostCells::check(usize::MAX, 2, max).is_err(), "an overflowing product is refused");
        assert_eq!(HostRecorder::new(11, Nanos::from_secs(1), 100, 1000).unwrap_err().hosts, 11);
    }

    #[test]
    fn the_clusters_window_and_beta_sum_the_parda_hosts() {
        let mut r = HostRecorder::new(3, Nanos::from_secs(1), 10, 1000).unwrap();
        for (h, (w, beta)) in [(10.0, 1.0), (20.0, 2.0), (32.0, 5.0)].into_iter().enumerate() {
            r.period(h, Nanos::ZERO, w, beta, 0.0, 0.0);
        }
        let t = r.finish(HostsMeta {
            names: vec!["a".into(), "b".into(), "plain".into()],
            controlled: vec![true, true, false],
            threshold_ms: 25.0,
            period_s: 1.0,
            aggregation: "cluster".into(),
            enabled: true,
            warmup_s: 0.0,
            duration_s: 10.0,
        });
        let m = |who, metric| t.metric(who, metric, 0.0, 10.0, 10.0);
        assert_eq!(m(HostSubject::All, HostMetric::Window), 30.0);
        assert_eq!(m(HostSubject::All, HostMetric::Beta), 3.0);
        assert_eq!(m(HostSubject::Host(2), HostMetric::Window), 32.0);
        assert_eq!(m(HostSubject::Host(2), HostMetric::Beta), 5.0);
    }
}
