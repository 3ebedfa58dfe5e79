//! What a run measures, and the summary and timeseries built from it.
//!
//! Per tenant: a latency histogram (HdrHistogram, 2 significant digits (1% resolution), nanoseconds, 32-bit counts to keep 10,000 tenants in cache) of requests that
//! complete after the warm-up, and per timeseries interval: completions, bytes, latency sum and maximum,
//! and completions by scheduling phase. Per server: completions and busy time. Memory is bounded: the
//! tenants x intervals product is limited to [`MAX_CELLS`].
//!
//! # Deferred recording
//! With thousands of tenants the histograms and cells do not fit in cache, and recording each completion
//! where it belongs cost a cache miss per completion (17% of a 1,000-tenant run). So a completion is first
//! appended to a log ([`Pending`], 12 bytes, sequential writes), and the log is applied in batches grouped
//! by tenant (a counting sort), so each tenant's histogram and cell are fetched once per batch. Everything
//! recorded is commutative (counts, sums, maxima), so the results are identical to recording at once. A
//! batch never spans an interval boundary or the end of the warm-up; it is applied when it is full, at
//! those boundaries, and at the end of the run.

use crate::scenario::Scenario;
use hdrhistogram::Histogram;
use rein_core::oracle::{allocate, OracleTenant};
use rein_core::{Nanos, Phase};
use serde::Serialize;

/// Largest tenants x intervals (timeseries cells) a run may keep.
pub const MAX_CELLS: usize = 50_000_000;

#[derive(Clone, Copy, Debug, Default)]
pub struct Cell {
    pub ios: u32,
    pub bytes: u64,
    pub lat_sum_ns: u64,
    pub lat_max_ns: u64,
    pub phase: [u32; 3],
}

/// Completions logged and not yet applied (see the module comment). An entry packs tenant (24 bits),
/// phase (2 bits) and latency (38 bits, ns); `bytes` is parallel. Entries that do not fit are applied at
/// once.
#[derive(Default)]
struct Pending {
    packed: Vec<u64>,
    bytes: Vec<u32>,
    /// Interval index and whether after the warm-up, shared by every entry of the batch.
    interval: usize,
    measured: bool,
    /// Counting-sort scratch.
    sorted: Vec<u64>,
    sorted_bytes: Vec<u32>,
    starts: Vec<u32>,
}

/// Entries per batch: 3 MiB of log, about 256 completions per tenant at 1,000 tenants.
const BATCH: usize = 1 << 18;
const LAT_BITS: u32 = 38;
const TENANT_BITS: u32 = 24;

pub(crate) struct Metrics {
    pending: Pending,
    interval: u64,
    warmup: Nanos,
    cells: Vec<Cell>,
    intervals: usize,
    hist: Vec<Histogram<u32>>,
    rejected: Vec<u64>,
    server_done: Vec<u64>,
    server_cells: Vec<u32>,
    server_busy_ns: Vec<u64>,
}

impl Metrics {
    pub(crate) fn new(sc: &Scenario) -> Result<Metrics, String> {
        let intervals = sc.duration.0.div_ceil(sc.interval.0) as usize;
        let cells = intervals.checked_mul(sc.tenants.len()).filter(|&c| c <= MAX_CELLS).ok_or_else(|| {
            format!(
                "{} tenants x {intervals} intervals exceeds {MAX_CELLS} timeseries cells: raise interval_s",
                sc.tenants.len()
            )
        })?;
        Ok(Metrics {
            pending: Pending { starts: vec![0; sc.tenants.len() + 1], ..Pending::default() },
            interval: sc.interval.0,
            warmup: sc.warmup,
            cells: vec![Cell::default(); cells],
            intervals,
            hist: (0..sc.tenants.len()).map(|_| Histogram::new(2).expect("2 significant digits is valid")).collect(),
            rejected: vec![0; sc.tenants.len()],
            server_done: vec![0; sc.servers.len()],
            server_cells: vec![0; intervals * sc.servers.len()],
            server_busy_ns: vec![0; sc.servers.len()],
        })
    }

    #[inline]
    pub(crate) fn completion(
        &mut self,
        tenant: usize,
        _server: usize,
        issued: Nanos,
        now: Nanos,
        bytes: u64,
        phase: Phase,
    ) {
        let i = ((now.0 / self.interval) as usize).min(self.intervals - 1);
        let lat = now.0 - issued.0;
        let measured = now >= self.warmup;
        let p = &mut self.pending;
        if !p.packed.is_empty() && (p.interval != i || p.measured != measured) {
            self.apply_pending();
        }
        let p = &mut self.pending;
        if lat >> LAT_BITS != 0 || (tenant as u64) >> TENANT_BITS != 0 || bytes >> 32 != 0 {
            self.record(tenant, i, measured, lat, bytes, phase.index());
            return;
        }
        if p.packed.is_empty() {
            p.interval = i;
            p.measured = measured;
        }
        p.packed.push((tenant as u64) << (64 - TENANT_BITS) | (phase.index() as u64) << LAT_BITS | lat);
        p.bytes.push(bytes as u32);
        if p.packed.len() >= BATCH {
            self.apply_pending();
        }
    }

    /// Records one completion in its cell and (after the warm-up) its tenant's histogram.
    #[inline]
    fn record(&mut self, tenant: usize, i: usize, measured: bool, lat: u64, bytes: u64, phase: usize) {
        let c = &mut self.cells[tenant * self.intervals + i];
        c.ios += 1;
        c.bytes += bytes;
        c.lat_sum_ns += lat;
        c.lat_max_ns = c.lat_max_ns.max(lat);
        c.phase[phase] += 1;
        if measured {
            // Auto-resizing histogram: `record` grows it; it can only fail beyond u64 range.
            let _ = self.hist[tenant].record(lat.max(1));
        }
    }

    /// Applies the logged completions, grouped by tenant.
    fn apply_pending(&mut self) {
        let mut p = std::mem::take(&mut self.pending);
        let n = p.packed.len();
        if n > 0 {
            p.starts.iter_mut().for_each(|c| *c = 0);
            for &e in &p.packed {
                p.starts[(e >> (64 - TENANT_BITS)) as usize + 1] += 1;
            }
            for k in 1..p.starts.len() {
                p.starts[k] += p.starts[k - 1];
            }
            p.sorted.resize(n, 0);
            p.sorted_bytes.resize(n, 0);
            // `starts[t]` walks through tenant t's range; afterwards it holds the range's end.
            for (&e, &b) in p.packed.iter().zip(&p.bytes) {
                let t = (e >> (64 - TENANT_BITS)) as usize;
                let at = p.starts[t] as usize;
                p.sorted[at] = e;
                p.sorted_bytes[at] = b;
                p.starts[t] += 1;
            }
            let (i, measured) = (p.interval, p.measured);
            let mut from = 0;
            for t in 0..p.starts.len() - 1 {
                let to = p.starts[t] as usize;
                for k in from..to {
                    let e = p.sorted[k];
                    let lat = e & ((1 << LAT_BITS) - 1);
                    let phase = ((e >> LAT_BITS) & 3) as usize;
                    self.record(t, i, measured, lat, p.sorted_bytes[k] as u64, phase);
                }
                from = to;
            }
            p.packed.clear();
            p.bytes.clear();
        }
        self.pending = p;
    }

    pub(crate) fn rejected(&mut self, tenant: usize) {
        self.rejected[tenant] += 1;
    }

    #[inline]
    pub(crate) fn server_completion(&mut self, server: usize, now: Nanos) {
        if now >= self.warmup {
            self.server_done[server] += 1;
        }
        let i = ((now.0 / self.interval) as usize).min(self.intervals - 1);
        self.server_cells[server * self.intervals + i] += 1;
    }

    pub(crate) fn server_busy(&mut self, server: usize, from: Nanos, to: Nanos) {
        let from = from.max(self.warmup);
        if to > from {
            self.server_busy_ns[server] += to.0 - from.0;
        }
    }

    pub(crate) fn finish(mut self, sc: &Scenario) -> RunTotals {
        self.apply_pending();
        let measured = sc.duration.saturating_sub(sc.warmup).as_secs_f64();
        let first = (sc.warmup.0.div_ceil(self.interval)) as usize;
        let mut tenants = Vec::with_capacity(sc.tenants.len());
        for (ti, t) in sc.tenants.iter().enumerate() {
            let row = &self.cells[ti * self.intervals..(ti + 1) * self.intervals];
            // Completions after warm-up: whole intervals from the first one starting at or after it, plus
            // the histogram count (which is exact) for the total.
            let h = &self.hist[ti];
            let completed = h.len();
            let bytes: u64 = row[first.min(row.len())..].iter().map(|c| c.bytes).sum();
            let mut phase = [0u64; 3];
            for c in &row[first.min(row.len())..] {
                for p in 0..3 {
                    phase[p] += c.phase[p] as u64;
                }
            }
            let ms = |v: u64| v as f64 / 1e6;
            tenants.push(TenantSummary {
                name: t.name.clone(),
                reservation: t.spec.reservation(),
                limit: t.spec.limit(),
                weight: t.spec.weight(),
                completed,
                iops: completed as f64 / measured,
                // Bytes are kept per interval: rate over the intervals that start after the warm-up.
                mb_s: bytes as f64
                    / 1e6
                    / (sc.duration.as_secs_f64() - first as f64 * self.interval as f64 / 1e9).max(1e-9),
                latency_ms: LatencySummary {
                    mean: if completed > 0 { h.mean() / 1e6 } else { 0.0 },
                    p50: ms(h.value_at_quantile(0.50)),
                    p95: ms(h.value_at_quantile(0.95)),
                    p99: ms(h.value_at_quantile(0.99)),
                    max: ms(h.max()),
                },
                phase: PhaseCounts { reservation: phase[0], weight: phase[1], over_limit: phase[2] },
                rejected: self.rejected[ti],
            });
        }
        let servers = sc
            .servers
            .iter()
            .enumerate()
            .map(|(si, s)| ServerSummary {
                name: s.name.clone(),
                scheduler: s.scheduler.name().to_string(),
                distributed: s.distributed,
                completed: self.server_done[si],
                iops: self.server_done[si] as f64 / measured,
                utilisation: self.server_busy_ns[si] as f64 / 1e9 / measured,
            })
            .collect();
        RunTotals {
            summary: Summary {
                name: sc.name.clone(),
                scheduler: sc.scheduler_name.clone(),
                seed: sc.seed,
                duration_s: sc.duration.as_secs_f64(),
                warmup_s: sc.warmup.as_secs_f64(),
                tenants,
                servers,
                hosts: None,
            },
            timeseries: Timeseries {
                interval_s: self.interval as f64 / 1e9,
                intervals: self.intervals,
                tenant_names: sc.tenants.iter().map(|t| t.name.clone()).collect(),
                server_names: sc.servers.iter().map(|s| s.name.clone()).collect(),
                cells: self.cells,
                server_cells: self.server_cells,
                capacity: sc
                    .servers
                    .iter()
                    .map(|s| {
                        (0..self.intervals)
                            .map(|i| {
                                let t = Nanos(i as u64 * self.interval);
                                s.capacity_schedule.iter().rev().find(|c| c.0 <= t).map_or(s.capacity_iops, |c| c.1)
                            })
                            .collect()
                    })
                    .collect(),
            },
            events: 0,
            time_regressions: 0,
            hosts: None,
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LatencySummary {
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PhaseCounts {
    pub reservation: u64,
    pub weight: u64,
    pub over_limit: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TenantSummary {
    pub name: String,
    pub reservation: f64,
    pub limit: Option<f64>,
    pub weight: f64,
    /// Completions after the warm-up.
    pub completed: u64,
    pub iops: f64,
    pub mb_s: f64,
    pub latency_ms: LatencySummary,
    pub phase: PhaseCounts,
    /// Requests refused at a full scheduler queue.
    pub rejected: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ServerSummary {
    pub name: String,
    pub scheduler: String,
    pub distributed: bool,
    pub completed: u64,
    pub iops: f64,
    /// Fraction of the measured time the device was busy.
    pub utilisation: f64,
}

/// The summary written as summary.json and printed by `--json`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    pub name: String,
    pub scheduler: String,
    pub seed: u64,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub tenants: Vec<TenantSummary>,
    pub servers: Vec<ServerSummary>,
    /// PARDA hosts (scenarios with `[[hosts]]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<crate::hosts::HostsSummary>,
}

/// Per-interval measurements (for timeseries.csv, plots and windowed checks).
#[derive(Clone, Debug)]
pub struct Timeseries {
    pub interval_s: f64,
    pub intervals: usize,
    pub tenant_names: Vec<String>,
    pub server_names: Vec<String>,
    /// `cells[tenant * intervals + i]`.
    pub cells: Vec<Cell>,
    /// `server_cells[server * intervals + i]`: completions.
    pub server_cells: Vec<u32>,
    /// Configured capacity (IOPS) per server per interval.
    pub capacity: Vec<Vec<f64>>,
}

impl Timeseries {
    pub fn cell(&self, tenant: usize, i: usize) -> &Cell {
        &self.cells[tenant * self.intervals + i]
    }

    /// Interval indices fully inside [a, b] seconds.
    pub fn window(&self, a: f64, b: f64) -> std::ops::Range<usize> {
        let first = (a / self.interval_s - 1e-9).ceil().max(0.0) as usize;
        let last = ((b / self.interval_s + 1e-9).floor() as usize).min(self.intervals);
        first..last.max(first)
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
            "t_s,tenant,iops,mb_s,latency_mean_ms,latency_max_ms,reservation_ios,weight_ios,over_limit_ios\n",
        );
        for i in 0..self.intervals {
            for (ti, name) in self.tenant_names.iter().enumerate() {
                let c = self.cell(ti, i);
                let mean = if c.ios > 0 { c.lat_sum_ns as f64 / c.ios as f64 / 1e6 } else { 0.0 };
                s.push_str(&format!(
                    "{:.3},{},{:.3},{:.4},{:.4},{:.4},{},{},{}\n",
                    i as f64 * self.interval_s,
                    name,
                    c.ios as f64 / self.interval_s,
                    c.bytes as f64 / 1e6 / self.interval_s,
                    mean,
                    c.lat_max_ns as f64 / 1e6,
                    c.phase[0],
                    c.phase[1],
                    c.phase[2]
                ));
            }
        }
        s
    }
}

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct RunTotals {
    pub summary: Summary,
    pub timeseries: Timeseries,
    pub events: u64,
    pub time_regressions: u64,
    /// PARDA hosts' timeseries and summary (scenarios with `[[hosts]]`).
    pub hosts: Option<crate::hosts::HostTotals>,
}

impl RunTotals {
    /// Completions after warm-up, all tenants.
    pub fn completions(&self) -> u64 {
        self.summary.tenants.iter().map(|t| t.completed).sum()
    }

    /// The fluid oracle's IOPS for each tenant over a window: for each interval in it, mClock eq. (1)-(2)
    /// among the tenants that completed IOs in that interval (taken as backlogged) with T = their measured
    /// total, averaged over the window. So tenants joining or leaving mid-run are judged against the
    /// allocation of the intervals they were there.
    pub fn oracle_iops(&self, sc: &Scenario, a: f64, b: f64) -> Vec<f64> {
        let ts = &self.timeseries;
        let w = ts.window(a, b);
        let n = w.len().max(1) as f64;
        let mut out = vec![0.0; sc.tenants.len()];
        let mut active = Vec::new();
        let mut specs = Vec::new();
        for i in w {
            active.clear();
            specs.clear();
            let mut total = 0.0;
            for t in 0..sc.tenants.len() {
                let ios = ts.cell(t, i).ios;
                if ios > 0 {
                    active.push(t);
                    specs.push(OracleTenant::from(&sc.tenants[t].spec));
                    total += ios as f64 / ts.interval_s;
                }
            }
            let alloc = allocate(&specs, total);
            for (k, &t) in active.iter().enumerate() {
                out[t] += alloc.rates[k] / n;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The deferred log gives exactly what recording each completion at once gives: over batch sizes,
    /// interval boundaries, the warm-up and entries too large to pack.
    #[test]
    fn deferred_recording_equals_immediate() {
        let toml = "name = \"m\"\nduration_s = 2000\nwarmup_s = 250\ninterval_s = 10\n[[servers]]\nname = \"s\"\ncapacity_iops = 100\n[[tenants]]\nname = \"a\"\n[tenants.workload]\nkind = \"closed\"\n[[tenants]]\nname = \"b\"\n[tenants.workload]\nkind = \"closed\"\n[[tenants]]\nname = \"c\"\n[tenants.workload]\nkind = \"closed\"\n";
        let sc = Scenario::from_toml(toml, None).unwrap();
        let mut deferred = Metrics::new(&sc).unwrap();
        let mut direct = Metrics::new(&sc).unwrap();
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(3);
        let n = BATCH * 2 + 1000;
        for k in 0..n {
            let now = Nanos(k as u64 * sc.duration.0 / n as u64);
            let lat = if k % 1000 == 7 { 1u64 << 40 } else { rng.gen_range(1..50_000_000) };
            let bytes = if k % 5000 == 11 { 8u64 << 30 } else { 4096 };
            let tenant = rng.gen_range(0..3);
            let phase = [Phase::Reservation, Phase::Weight, Phase::OverLimit][rng.gen_range(0..3)];
            let issued = Nanos(now.0.saturating_sub(lat));
            deferred.completion(tenant, 0, issued, now, bytes, phase);
            let i = ((now.0 / direct.interval) as usize).min(direct.intervals - 1);
            direct.record(tenant, i, now >= direct.warmup, now.0 - issued.0, bytes, phase.index());
        }
        assert!(direct.pending.packed.is_empty());
        let (a, b) = (deferred.finish(&sc), direct.finish(&sc));
        assert_eq!(a.summary, b.summary);
        assert_eq!(a.timeseries.to_csv(), b.timeseries.to_csv());
        assert!(a.summary.tenants.iter().all(|t| t.completed > BATCH as u64 / 3));
        // Some latencies were too long to pack, and were recorded at once.
        assert!(a.summary.tenants.iter().any(|t| t.latency_ms.max > (1u64 << LAT_BITS) as f64 / 1e6));
    }
}
