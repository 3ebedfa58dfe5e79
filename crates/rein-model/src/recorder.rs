//! What a run measures while it goes, and the [`RunTotals`] built from it at the end.
//!
//! Per tenant: a latency histogram (HdrHistogram, 2 significant digits (1% resolution), nanoseconds,
//! 32-bit counts to keep 10,000 tenants in cache) of requests that complete after the warm-up, the bytes
//! and completions by scheduling phase of those requests (32 bytes), and per timeseries interval a
//! [`Cell`]: completions, bytes, latency sum and maximum, and completions by scheduling phase. Per
//! server: completions per interval and busy time. Memory is bounded: (tenants + servers) x intervals is
//! limited to [`MAX_CELLS`].
//!
//! # Totals after the warm-up
//! The summary's totals count exactly the completions at or after the warm-up's end, wherever it falls
//! in an interval: `completed`, IOPS and the latencies from the histogram, MB/s (over duration - warm-up,
//! as IOPS) and the phases from the per-tenant totals, both added to as each completion is recorded. (They
//! were summed over the whole intervals from the first starting at or after the warm-up, so a warm-up
//! ending inside an interval left that interval's later completions out of MB/s and the phases but not
//! out of IOPS.) Phases known only per interval ([`Recorder::set_phases`]) cannot be split at the
//! warm-up: the interval holding its end counts in proportion to its completions after it. The
//! timeseries, and every metric measured over a window from it, keep whole intervals.
//!
//! # Deferred recording
//! With thousands of tenants the histograms and cells do not fit in cache, and recording each completion
//! where it belongs cost a cache miss per completion (17% of a 1,000-tenant simulation). So a completion
//! is first appended to a log (`Pending`, 12 bytes, sequential writes), and the log is applied in
//! batches grouped by tenant (a counting sort), so each tenant's histogram and cell are fetched once per
//! batch. Everything recorded is commutative (counts, sums, maxima), so the results are identical to
//! recording at once. A batch never spans an interval boundary or the end of the warm-up; it is applied
//! when it is full, at those boundaries, and at the end of the run.

use crate::report::{Cell, LatencySummary, PhaseCounts, RunTotals, ServerSummary, Summary, TenantSummary, Timeseries};
use hdrhistogram::Histogram;
use rein_core::{Nanos, Phase, QosSpec};

/// Largest tenants x intervals (timeseries cells) a run may keep.
pub const MAX_CELLS: usize = 50_000_000;

/// Completions logged and not yet applied (see the module comment). An entry packs tenant (24 bits),
/// phase (2 bits) and latency (38 bits, ns); `bytes` is parallel. Entries that do not fit are applied at
/// once.
#[derive(Default, Debug)]
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
/// The packed phase of a completion whose phase is unknown (phases use 0..=2).
const UNKNOWN_PHASE: usize = 3;
const TENANT_BITS: u32 = 24;

/// The recorder was asked for more than [`MAX_CELLS`] timeseries cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "({tenants} tenants + {servers} servers) x {intervals} intervals exceeds {MAX_CELLS} timeseries cells: raise \
     interval_s"
)]
pub struct TooManyCells {
    /// Tenants asked for.
    pub tenants: usize,
    /// Servers asked for (each has a completion count per interval).
    pub servers: usize,
    /// Intervals asked for.
    pub intervals: usize,
}

impl TooManyCells {
    /// Whether `tenants` and `servers` over `intervals` fit within [`MAX_CELLS`]; counts the cells, does
    /// not allocate them ([`Recorder::new`] allocates what this allows; a scenario's validation calls it
    /// first, so a file asking for more is refused when it is loaded).
    pub fn check(tenants: usize, servers: usize, intervals: usize) -> Result<(), TooManyCells> {
        let fits = intervals.checked_mul(tenants.saturating_add(servers)).is_some_and(|c| c <= MAX_CELLS);
        if fits {
            Ok(())
        } else {
            Err(TooManyCells { tenants, servers, intervals })
        }
    }
}

/// The timeseries intervals of a run of `duration` in steps of `interval` (positive): the last may be
/// partial, and there is at least one. What [`Recorder::new`] (and the hosts' recorder) keep cells for.
pub fn intervals(duration: Nanos, interval: Nanos) -> usize {
    assert!(interval > Nanos::ZERO, "a positive interval");
    (duration.0.div_ceil(interval.0) as usize).max(1)
}

/// A tenant's bytes and completions by phase after the warm-up (module comment): with its histogram, its
/// totals.
#[derive(Debug, Clone, Copy, Default)]
struct AfterWarmup {
    bytes: u64,
    phase: [u64; 3],
}

/// Records completions during a run (module comment).
#[derive(Debug)]
pub struct Recorder {
    pending: Pending,
    interval: u64,
    warmup: Nanos,
    duration: Nanos,
    cells: Vec<Cell>,
    intervals: usize,
    hist: Vec<Histogram<u32>>,
    after_warmup: Vec<AfterWarmup>,
    /// Some phases were set per interval ([`Recorder::set_phases`]): the phase totals come from the cells.
    phases_per_interval: bool,
    rejected: Vec<u64>,
    server_done: Vec<u64>,
    server_cells: Vec<u32>,
    server_busy_ns: Vec<u64>,
}

/// What a report says about a tenant besides its measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantMeta {
    /// Its name.
    pub name: String,
    /// Its spec, if known.
    pub spec: Option<QosSpec>,
    /// Whether its arrivals do not wait for its completions ([`crate::report::TenantSummary::open_loop`];
    /// [`crate::workload::WorkloadKind::open_loop`]).
    pub open_loop: bool,
}

/// What a report says about a server besides its measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerMeta {
    /// Its name.
    pub name: String,
    /// Its scheduler.
    pub scheduler: String,
    /// Whether gateways piggyback delta/rho to it.
    pub distributed: bool,
    /// Its capacity over time (`(from, IOPS)`, sorted, the first at 0); empty when unknown.
    pub capacity: Vec<(Nanos, f64)>,
    /// Whether its busy time was recorded (else utilisation is unknown).
    pub busy_observed: bool,
}

/// What a report says besides its measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct RunMeta {
    /// The run's name.
    pub name: String,
    /// The scheduler (as written, or as observed).
    pub scheduler: String,
    /// The seed.
    pub seed: u64,
    /// Tenants, in recording order.
    pub tenants: Vec<TenantMeta>,
    /// Servers, in recording order.
    pub servers: Vec<ServerMeta>,
    /// Phases are known: the scheduler told the recorder each completion's phase, or the caller set
    /// them per interval ([`Recorder::set_phases`]). Else they are `null` in summary.json and empty in
    /// timeseries.csv.
    pub phases_known: bool,
    /// How the specs' rates count requests (their unit): the fluid oracle allocates in it.
    pub cost_model: rein_core::CostModel,
}

impl Recorder {
    /// A recorder for `tenants` and `servers` over `duration` in intervals of `interval`; completions
    /// before `warmup` count in the timeseries but not in the totals.
    pub fn new(
        tenants: usize,
        servers: usize,
        duration: Nanos,
        interval: Nanos,
        warmup: Nanos,
    ) -> Result<Recorder, TooManyCells> {
        let intervals = intervals(duration, interval);
        TooManyCells::check(tenants, servers, intervals)?;
        // Within MAX_CELLS (checked just above), so no overflow.
        let cells = intervals * tenants;
        Ok(Recorder {
            pending: Pending { starts: vec![0; tenants + 1], ..Pending::default() },
            interval: interval.0,
            warmup,
            duration,
            cells: vec![Cell::default(); cells],
            intervals,
            hist: (0..tenants).map(|_| Histogram::new(2).expect("2 significant digits is valid")).collect(),
            after_warmup: vec![AfterWarmup::default(); tenants],
            phases_per_interval: false,
            rejected: vec![0; tenants],
            server_done: vec![0; servers],
            server_cells: vec![0; intervals * servers],
            server_busy_ns: vec![0; servers],
        })
    }

    /// Number of timeseries intervals.
    pub fn intervals(&self) -> usize {
        self.intervals
    }

    #[inline]
    fn interval_of(&self, now: Nanos) -> usize {
        ((now.0 / self.interval) as usize).min(self.intervals - 1)
    }

    /// Tenant `tenant`'s cell of interval `i`.
    #[inline]
    fn cell_mut(&mut self, tenant: usize, i: usize) -> &mut Cell {
        &mut self.cells[tenant * self.intervals + i]
    }

    /// A request of `tenant` issued at `issued` completed at `now`: `bytes`, served in `phase`.
    #[inline]
    pub fn completion(&mut self, tenant: usize, issued: Nanos, now: Nanos, bytes: u64, phase: Phase) {
        self.log(tenant, issued, now, bytes, phase.index());
    }

    /// As [`Recorder::completion`], for a request whose scheduling phase the recorder cannot know (a
    /// client of a remote server); see [`Recorder::set_phases`].
    pub fn completion_phase_unknown(&mut self, tenant: usize, issued: Nanos, now: Nanos, bytes: u64) {
        self.log(tenant, issued, now, bytes, UNKNOWN_PHASE);
    }

    #[inline(always)]
    fn log(&mut self, tenant: usize, issued: Nanos, now: Nanos, bytes: u64, phase: usize) {
        let i = self.interval_of(now);
        let lat = now.0 - issued.0;
        let measured = now >= self.warmup;
        let p = &mut self.pending;
        if !p.packed.is_empty() && (p.interval != i || p.measured != measured) {
            self.apply_pending();
        }
        let p = &mut self.pending;
        if lat >> LAT_BITS != 0 || (tenant as u64) >> TENANT_BITS != 0 || bytes >> 32 != 0 {
            self.record(tenant, i, measured, lat, bytes, phase);
            return;
        }
        if p.packed.is_empty() {
            p.interval = i;
            p.measured = measured;
        }
        p.packed.push((tenant as u64) << (64 - TENANT_BITS) | (phase as u64) << LAT_BITS | lat);
        p.bytes.push(bytes as u32);
        if p.packed.len() >= BATCH {
            self.apply_pending();
        }
    }

    /// Records one completion in its cell and (after the warm-up) its tenant's histogram and totals.
    #[inline]
    fn record(&mut self, tenant: usize, i: usize, measured: bool, lat: u64, bytes: u64, phase: usize) {
        let c = self.cell_mut(tenant, i);
        c.ios += 1;
        c.bytes += bytes;
        c.lat_sum_ns += lat;
        c.lat_max_ns = c.lat_max_ns.max(lat);
        if let Some(n) = c.phase.get_mut(phase) {
            *n += 1;
        }
        if measured {
            // Auto-resizing histogram: `record` grows it; it can only fail beyond u64 range.
            let _ = self.hist[tenant].record(lat.max(1));
            let a = &mut self.after_warmup[tenant];
            a.bytes += bytes;
            if let Some(n) = a.phase.get_mut(phase) {
                *n += 1;
            }
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

    /// A request of `tenant` was issued at `now` (the fluid oracle's demand: [`RunTotals::oracle_iops`]).
    #[inline]
    pub fn arrival(&mut self, tenant: usize, now: Nanos) {
        let c = self.cell_mut(tenant, self.interval_of(now));
        c.arrivals = c.arrivals.saturating_add(1);
    }

    /// A request of `tenant` was refused or failed at `now`: it leaves without a completion.
    #[inline]
    pub fn rejected(&mut self, tenant: usize, now: Nanos) {
        self.rejected[tenant] += 1;
        let c = self.cell_mut(tenant, self.interval_of(now));
        c.rejected = c.rejected.saturating_add(1);
    }

    /// Server `server`'s device completed a request at `now`.
    #[inline]
    pub fn server_completion(&mut self, server: usize, now: Nanos) {
        if now >= self.warmup {
            self.server_done[server] += 1;
        }
        let i = self.interval_of(now);
        self.server_cells[server * self.intervals + i] += 1;
    }

    /// Server `server`'s device was busy from `from` to `to` (the part after the warm-up counts).
    pub fn server_busy(&mut self, server: usize, from: Nanos, to: Nanos) {
        let from = from.max(self.warmup);
        if to > from {
            self.server_busy_ns[server] += to.0 - from.0;
        }
    }

    /// Phase counts of `tenant` in interval `i` (for a run whose phases are known only in aggregate:
    /// `rein load` reads the server's counters once per interval). The totals' phases then come from the
    /// intervals (module comment).
    pub fn set_phases(&mut self, tenant: usize, i: usize, phase: [u32; 3]) {
        if i < self.intervals {
            self.cell_mut(tenant, i).phase = phase;
            self.phases_per_interval = true;
        }
    }

    /// Completions by phase after the warm-up of a tenant whose phases were set per interval (its row of
    /// cells, `completed` after the warm-up): the intervals from the first starting at or after the
    /// warm-up, and of the interval holding the warm-up's end the share of its completions after it.
    fn phases_from_intervals(&self, row: &[Cell], completed: u64) -> [u64; 3] {
        let first = (self.warmup.0.div_ceil(self.interval) as usize).min(row.len());
        let mut phase = [0u64; 3];
        for c in &row[first..] {
            for (total, &n) in phase.iter_mut().zip(&c.phase) {
                *total += u64::from(n);
            }
        }
        let whole: u64 = row[first..].iter().map(|c| u64::from(c.ios)).sum();
        // The interval holding the warm-up's end, unless it ends on a boundary.
        let straddling =
            (!self.warmup.0.is_multiple_of(self.interval)).then_some((self.warmup.0 / self.interval) as usize);
        if let Some(c) = straddling.and_then(|i| row.get(i)).filter(|c| c.ios > 0) {
            // Completions after the warm-up not in the whole intervals: those of this interval.
            let share = completed.saturating_sub(whole).min(u64::from(c.ios)) as f64 / f64::from(c.ios);
            for (total, &n) in phase.iter_mut().zip(&c.phase) {
                *total += (f64::from(n) * share).round() as u64;
            }
        }
        phase
    }

    /// Ends the run at `at`, before the duration it was made for (a run that stopped early: `rein load`
    /// once every job has stopped): the totals' rates count the time up to `at` (none, if it ends within
    /// the warm-up), `duration_s` says `at`, and the timeseries ends with the interval that holds it. Call
    /// it after the run's last record; an `at` at or past the duration changes nothing.
    pub fn end_at(&mut self, at: Nanos) {
        if at >= self.duration {
            return;
        }
        // Pending completions name their interval in the layout they were logged in.
        self.apply_pending();
        let intervals = (at.0.div_ceil(self.interval) as usize).max(1);
        // Each row (a tenant's, a server's) keeps its first `intervals` cells.
        fn keep<T: Copy>(cells: &[T], old: usize, new: usize) -> Vec<T> {
            cells.chunks(old).flat_map(|row| row[..new].iter().copied()).collect()
        }
        self.cells = keep(&self.cells, self.intervals, intervals);
        self.server_cells = keep(&self.server_cells, self.intervals, intervals);
        self.intervals = intervals;
        self.duration = at;
    }

    /// The run's totals.
    pub fn finish(mut self, meta: &RunMeta) -> RunTotals {
        self.apply_pending();
        // A run ended within its warm-up ([`Recorder::end_at`]) measured nothing: its rates are 0.
        let measured = self.duration.saturating_sub(self.warmup).as_secs_f64().max(1e-9);
        let mut tenants = Vec::with_capacity(meta.tenants.len());
        for (ti, t) in meta.tenants.iter().enumerate() {
            // Every total counts exactly the completions after the warm-up (module comment).
            let h = &self.hist[ti];
            let completed = h.len();
            let AfterWarmup { bytes, phase } = self.after_warmup[ti];
            let phase = if self.phases_per_interval {
                self.phases_from_intervals(&self.cells[ti * self.intervals..(ti + 1) * self.intervals], completed)
            } else {
                phase
            };
            let ms = |v: u64| v as f64 / 1e6;
            tenants.push(TenantSummary {
                name: t.name.clone(),
                reservation: t.spec.map(|s| s.reservation()),
                limit: t.spec.and_then(|s| s.limit()),
                weight: t.spec.map(|s| s.weight()),
                completed,
                iops: completed as f64 / measured,
                mb_s: bytes as f64 / 1e6 / measured,
                latency_ms: LatencySummary {
                    mean: if completed > 0 { h.mean() / 1e6 } else { 0.0 },
                    p50: ms(h.value_at_quantile(0.50)),
                    p95: ms(h.value_at_quantile(0.95)),
                    p99: ms(h.value_at_quantile(0.99)),
                    max: ms(h.max()),
                },
                phase: meta.phases_known.then_some(PhaseCounts {
                    reservation: phase[0],
                    weight: phase[1],
                    over_limit: phase[2],
                }),
                rejected: self.rejected[ti],
                open_loop: t.open_loop,
            });
        }
        let servers = meta
            .servers
            .iter()
            .enumerate()
            .map(|(si, s)| ServerSummary {
                name: s.name.clone(),
                scheduler: s.scheduler.clone(),
                distributed: s.distributed,
                completed: self.server_done[si],
                iops: self.server_done[si] as f64 / measured,
                utilisation: s.busy_observed.then(|| self.server_busy_ns[si] as f64 / 1e9 / measured),
            })
            .collect();
        RunTotals {
            summary: Summary {
                name: meta.name.clone(),
                scheduler: meta.scheduler.clone(),
                sabotage: None,
                seed: meta.seed,
                duration_s: self.duration.as_secs_f64(),
                warmup_s: self.warmup.as_secs_f64(),
                tenants,
                servers,
                hosts: None,
            },
            timeseries: Timeseries {
                interval_s: self.interval as f64 / 1e9,
                intervals: self.intervals,
                last_interval_s: crate::report::last_interval_s(
                    self.interval as f64 / 1e9,
                    self.intervals,
                    self.duration.as_secs_f64(),
                ),
                tenant_names: meta.tenants.iter().map(|t| t.name.clone()).collect(),
                server_names: meta.servers.iter().map(|s| s.name.clone()).collect(),
                cells: self.cells,
                server_cells: self.server_cells,
                phases_known: meta.phases_known,
                capacity: meta
                    .servers
                    .iter()
                    .map(|s| {
                        if s.capacity.is_empty() {
                            return Vec::new();
                        }
                        (0..self.intervals)
                            .map(|i| crate::device::capacity_at(&s.capacity, Nanos(i as u64 * self.interval)))
                            .collect()
                    })
                    .collect(),
            },
            events: 0,
            time_regressions: 0,
            hosts: None,
            rounds: Vec::new(),
            periods: Vec::new(),
            period_log: Default::default(),
            cost_model: meta.cost_model,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn meta(tenants: usize) -> RunMeta {
        RunMeta {
            name: "m".into(),
            scheduler: "mclock".into(),
            seed: 1,
            tenants: (0..tenants).map(|i| TenantMeta { name: format!("t{i}"), spec: None, open_loop: false }).collect(),
            servers: vec![],
            phases_known: true,
            cost_model: rein_core::CostModel::PerIo,
        }
    }

    /// The deferred log gives exactly what recording each completion at once gives: over batch sizes,
    /// interval boundaries, the warm-up and entries too large to pack.
    /// A run ended early ([`Recorder::end_at`]) counts its rates over the time it ran, not the duration it
    /// was made for, and its timeseries ends with the interval that holds its end; one ended within its
    /// warm-up measured nothing (rates 0, not NaN).
    #[test]
    fn a_run_ended_early_counts_its_rates_over_the_time_it_ran() {
        let sec = 1_000_000_000;
        let run = |end: Nanos| {
            let mut r = Recorder::new(2, 1, Nanos(10 * sec), Nanos(sec), Nanos(sec)).unwrap();
            // 100 completions a second for each tenant until 2.5 s (or the end), each one at the server too.
            for now in (0..250u64).map(|k| Nanos(k * sec / 100)).filter(|&now| now < end) {
                r.completion(0, now, now, 4096, Phase::Reservation);
                r.completion(1, now, now, 4096, Phase::Weight);
                r.server_completion(0, now);
            }
            r.end_at(end);
            r.finish(&meta(2))
        };
        let t = run(Nanos(5 * sec / 2));
        assert_eq!(t.summary.duration_s, 2.5);
        for tenant in &t.summary.tenants {
            // 150 completions in the 1.5 s after the warm-up.
            assert_eq!(tenant.completed, 150);
            assert!((tenant.iops - 100.0).abs() < 1e-9, "{}", tenant.iops);
            assert!((tenant.mb_s - 100.0 * 4096.0 / 1e6).abs() < 1e-9, "{}", tenant.mb_s);
        }
        assert_eq!(t.timeseries.intervals, 3);
        assert!((t.timeseries.last_interval_s - 0.5).abs() < 1e-9);
        let ios: Vec<u32> = t.timeseries.cells.iter().map(|c| c.ios).collect();
        assert_eq!(ios, [100, 100, 50, 100, 100, 50], "each tenant's row keeps its own cells");
        assert_eq!(t.timeseries.server_cells, [100, 100, 50]);
        let within = run(Nanos(sec / 2));
        assert_eq!(within.summary.tenants[0].iops, 0.0);
        assert_eq!(within.timeseries.intervals, 1);
        // An end at or past the duration changes nothing.
        let whole = run(Nanos(10 * sec));
        assert!((whole.summary.tenants[0].iops - 150.0 / 9.0).abs() < 1e-9);
        assert_eq!(whole.timeseries.intervals, 10);
    }

    /// A warm-up ending inside an interval (2.5 s, in 1 s intervals): every total after it counts exactly
    /// the completions after it, as the histogram does. MB/s and the phases were summed over the whole
    /// intervals from 3 s (MB/s over 7 s), so the 50 completions in [2.5, 3) counted in `completed` and
    /// IOPS but not in MB/s or the phases, whose sum fell short of `completed`. Phases known only per
    /// interval ([`Recorder::set_phases`]) count the interval holding the warm-up's end in proportion to
    /// its completions after it.
    #[test]
    fn totals_after_a_warm_up_ending_inside_an_interval_count_every_completion_after_it() {
        let sec = 1_000_000_000;
        let (duration, interval, warmup) = (Nanos(10 * sec), Nanos(sec), Nanos(5 * sec / 2));
        let phases = [Phase::Reservation, Phase::Weight, Phase::OverLimit];
        // 100 completions a second, of 4-16 KiB, in phases taking turns.
        let at = |k: u64| Nanos(k * sec / 100);
        let size = |k: u64| 4096 * (1 + k % 4);
        let mut r = Recorder::new(1, 1, duration, interval, warmup).unwrap();
        for k in 0..1000 {
            r.completion(0, at(k), at(k), size(k), phases[(k % 3) as usize]);
        }
        let t = r.finish(&meta(1)).summary.tenants.remove(0);
        let after = 250..1000u64;
        assert_eq!(t.completed, 750);
        assert!((t.iops - 100.0).abs() < 1e-9, "{}", t.iops);
        let bytes: u64 = after.clone().map(size).sum();
        assert!((t.mb_s - bytes as f64 / 1e6 / 7.5).abs() < 1e-9, "{} MB/s, {bytes} B over 7.5 s", t.mb_s);
        let by_phase = |p: u64| after.clone().filter(|k| k % 3 == p).count() as u64;
        let phase = t.phase.expect("phases known");
        assert_eq!([phase.reservation, phase.weight, phase.over_limit], [0, 1, 2].map(by_phase));
        assert_eq!(phase.reservation + phase.weight + phase.over_limit, t.completed);

        // Phases set per interval (`rein load`): 100 reservation IOs in each; half of interval 2's
        // completions come after the warm-up, so half its phases count: 50 + 7 x 100.
        let mut r = Recorder::new(1, 1, duration, interval, warmup).unwrap();
        for k in 0..1000 {
            r.completion_phase_unknown(0, at(k), at(k), 4096);
        }
        (0..10).for_each(|i| r.set_phases(0, i, [100, 0, 0]));
        let t = r.finish(&meta(1)).summary.tenants.remove(0);
        assert!((t.mb_s - 100.0 * 4096.0 / 1e6).abs() < 1e-9, "{}", t.mb_s);
        let phase = t.phase.expect("phases known");
        assert_eq!([phase.reservation, phase.weight, phase.over_limit], [750, 0, 0]);
    }

    #[test]
    fn deferred_recording_equals_immediate() {
        let (duration, interval, warmup) = (Nanos::from_secs(2000), Nanos::from_secs(10), Nanos::from_secs(250));
        let mut deferred = Recorder::new(3, 1, duration, interval, warmup).unwrap();
        let mut direct = Recorder::new(3, 1, duration, interval, warmup).unwrap();
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(3);
        let n = BATCH * 2 + 1000;
        for k in 0..n {
            let now = Nanos(k as u64 * duration.0 / n as u64);
            let lat = if k % 1000 == 7 { 1u64 << 40 } else { rng.gen_range(1..50_000_000) };
            let bytes = if k % 5000 == 11 { 8u64 << 30 } else { 4096 };
            let tenant = rng.gen_range(0..3);
            let phase = [Phase::Reservation, Phase::Weight, Phase::OverLimit][rng.gen_range(0..3)];
            let issued = Nanos(now.0.saturating_sub(lat));
            deferred.completion(tenant, issued, now, bytes, phase);
            let i = direct.interval_of(now);
            direct.record(tenant, i, now >= direct.warmup, now.0 - issued.0, bytes, phase.index());
        }
        assert!(direct.pending.packed.is_empty());
        let m = meta(3);
        let (a, b) = (deferred.finish(&m), direct.finish(&m));
        assert_eq!(a.summary, b.summary);
        assert_eq!(a.timeseries.to_csv(), b.timeseries.to_csv());
        assert!(a.summary.tenants.iter().all(|t| t.completed > BATCH as u64 / 3));
        // Some latencies were too long to pack, and were recorded at once.
        assert!(a.summary.tenants.iter().any(|t| t.latency_ms.max > (1u64 << LAT_BITS) as f64 / 1e6));
    }

    /// Under a size cost model the oracle splits cost, not IOs: two tenants of equal weight, one with
    /// 4 KiB IOs and one with 12 KiB IOs, each completing 100 per second. Counting bytes, the measured
    /// 1,638,400 B/s splits into 819,200 B/s each, i.e. 200 and 66.7 IOPS; counting IOs, 100 each.
    #[test]
    fn the_oracle_allocates_in_the_cost_models_unit() {
        let totals = |cost_model| {
            let mut rec = Recorder::new(2, 1, Nanos::from_secs(10), Nanos::from_secs(1), Nanos::ZERO).unwrap();
            for k in 0..1000u64 {
                let now = Nanos(k * 10_000_000 + 1);
                rec.completion(0, now, now, 4096, Phase::Weight);
                rec.completion(1, now, now, 12288, Phase::Weight);
            }
            let spec = Some(QosSpec::new(0.0, None, 1.0, 0).unwrap());
            let mut m = meta(2);
            m.tenants.iter_mut().for_each(|t| t.spec = spec);
            m.cost_model = cost_model;
            rec.finish(&m).oracle_iops(0.0, 10.0)
        };
        let near = |got: f64, want: f64| (got - want).abs() < 1e-6 * want;
        let ios = totals(rein_core::CostModel::PerIo);
        assert!(near(ios[0], 100.0) && near(ios[1], 100.0), "{ios:?}");
        let bytes = totals(rein_core::CostModel::BYTES);
        assert!(near(bytes[0], 200.0) && near(bytes[1], 200.0 / 3.0), "{bytes:?}");
    }

    /// A 10 s run in 1 s intervals of two tenants of weight 1, no reservation or limit: tenant 0 (open
    /// or closed) with `arrive[s]` arrivals, `done[s]` completions and `refused[s]` refusals in second
    /// `s`; tenant 1 a closed loop completing 1,000 less tenant 0's completions each second (T = 1,000
    /// while tenant 0 has completions). Returns the oracle over `[a, b]`.
    fn oracle_of(open: bool, arrive: &[u64], done: &[u64], refused: &[u64], a: f64, b: f64) -> Vec<f64> {
        let mut rec = Recorder::new(2, 1, Nanos::from_secs(10), Nanos::from_secs(1), Nanos::ZERO).unwrap();
        for s in 0..10u64 {
            let at = |k: u64, n: u64| Nanos(s * 1_000_000_000 + k * (1_000_000_000 / n.max(1)));
            let get = |v: &[u64]| v.get(s as usize).copied().unwrap_or(0);
            let (arrive, done, refused) = (get(arrive), get(done), get(refused));
            (0..arrive).for_each(|k| rec.arrival(0, at(k, arrive)));
            (0..refused).for_each(|k| rec.rejected(0, at(k, refused)));
            (0..done).for_each(|k| rec.completion(0, at(k, done), at(k, done), 4096, Phase::Weight));
            let other = if done > 0 { 1000 - done } else { 900 };
            for k in 0..other {
                rec.arrival(1, at(k, other));
                rec.completion(1, at(k, other), at(k, other), 4096, Phase::Weight);
            }
        }
        let spec = Some(QosSpec::new(0.0, None, 1.0, 0).unwrap());
        let mut m = meta(2);
        m.tenants.iter_mut().for_each(|t| t.spec = spec);
        m.tenants[0].open_loop = open;
        rec.finish(&m).oracle_iops(a, b)
    }

    fn near(got: f64, want: f64) -> bool {
        (got - want).abs() < 1e-9 * want.max(1.0)
    }

    /// The oracle gives an open loop no more than it asks: 100 IOPS offered and served next to a closed
    /// loop taking the other 900 of T = 1,000 is what eq. (1) with the demand cap gives (min(lambda,
    /// 100) + lambda = 1,000: 100 and 900), where the uncapped oracle said 500 and 500. A closed loop
    /// with the same counts is taken as backlogged (500 and 500): its arrivals follow its completions.
    #[test]
    fn the_oracle_caps_an_open_loop_at_its_demand() {
        let o = oracle_of(true, &[100; 10], &[100; 10], &[], 0.0, 10.0);
        assert!(near(o[0], 100.0) && near(o[1], 900.0), "{o:?}");
        let c = oracle_of(false, &[100; 10], &[100; 10], &[], 0.0, 10.0);
        assert!(near(c[0], 500.0) && near(c[1], 500.0), "{c:?}");
    }

    /// The cap cannot hide starvation: an open loop offering 800 IOPS but served 100 keeps a growing
    /// backlog, so it asks for its whole share (500) every second; one offering 300, below its share, but
    /// served 100 asks 300 in the first second and 300 + 200 from the second on (500 and more): the
    /// oracle says (300 + 9 x 500) / 10 = 480, far from the 100 it got.
    #[test]
    fn a_starved_open_loop_still_asks_for_its_share() {
        let o = oracle_of(true, &[800; 10], &[100; 10], &[], 0.0, 10.0);
        assert!(near(o[0], 500.0), "{o:?}");
        let o = oracle_of(true, &[300; 10], &[100; 10], &[], 0.0, 10.0);
        assert!(near(o[0], 480.0), "{o:?}");
    }

    /// A burst's backlog is demand after the second it arrived in: 400 requests at once, served 100 a
    /// second over four seconds, ask 400, 300, 200 and 100 (eq. (1) with T = 1,000: the closed loop
    /// gets 600, 700, 800, 900), so the oracle over the four seconds is 250 and 750. (Counting only each
    /// second's arrivals would cap the burst at its 100 completions in seconds 1-3: 175.)
    #[test]
    fn a_bursts_backlog_is_its_demand_until_served() {
        let o = oracle_of(true, &[400], &[100; 4], &[], 0.0, 4.0);
        assert!(near(o[0], 250.0) && near(o[1], 750.0), "{o:?}");
    }

    /// A tenant served nothing at all is still owed its share: a closed loop with one request waiting
    /// the whole run (no completion) beside one completing 900 a second is owed 450, as an open loop
    /// with 1,000 waiting is; the oracle left both out (0), and a check of their 0 IOPS passed.
    #[test]
    fn a_tenant_served_nothing_is_owed_its_share() {
        let c = oracle_of(false, &[1], &[], &[], 0.0, 10.0);
        assert!(near(c[0], 450.0) && near(c[1], 450.0), "{c:?}");
        let o = oracle_of(true, &[1000], &[], &[], 0.0, 10.0);
        assert!(near(o[0], 450.0) && near(o[1], 450.0), "{o:?}");
        // Idle (nothing waiting, nothing done): not active, the other takes all.
        let idle = oracle_of(false, &[], &[], &[], 0.0, 10.0);
        assert!(near(idle[0], 0.0) && near(idle[1], 900.0), "{idle:?}");
    }

    /// Metrics of completions are NaN without any (a latency of nothing is not 0 ms), and so is a share
    /// of no tenant-periods.
    #[test]
    fn metrics_of_nothing_are_not_numbers() {
        let mut rec = Recorder::new(2, 1, Nanos::from_secs(10), Nanos::from_secs(1), Nanos::ZERO).unwrap();
        rec.arrival(0, Nanos(5));
        let now = Nanos::from_millis(1500);
        rec.completion(1, Nanos(1), now, 4096, Phase::Weight);
        let r = rec.finish(&meta(2));
        use crate::report::{PeriodMetric, TenantMetric};
        for m in TenantMetric::ALL.iter().filter(|m| !matches!(m, TenantMetric::Iops | TenantMetric::MbS)) {
            assert!(r.tenant_metric(0, *m, 0.0, 10.0).is_nan(), "{m}");
            assert!(r.tenant_metric(1, *m, 0.0, 10.0).is_finite(), "{m}");
        }
        assert_eq!(r.tenant_metric(0, TenantMetric::Iops, 0.0, 10.0), 0.0);
        let (n, share) = r.tenant_periods(&[0, 1], &[], PeriodMetric::ReservationMetFraction, 100.0);
        assert!(n == 0 && share.is_nan(), "{n} {share}");
    }

    /// Refused requests leave the backlog: an open loop offering 300 a second, 200 of them refused and
    /// 100 served, asks 300 every second (its backlog stays empty), so the oracle is 300; counting the
    /// refused as outstanding would raise it towards its whole share.
    #[test]
    fn refused_requests_leave_the_backlog() {
        let o = oracle_of(true, &[300; 10], &[100; 10], &[200; 10], 0.0, 10.0);
        assert!(near(o[0], 300.0) && near(o[1], 700.0), "{o:?}");
    }

    /// A run of 10 s in 3 s intervals: the last interval is 1 s long, and its rate is its IOs over 1 s (it
    /// was over 3 s: 333 IOPS for a steady 1,000, a false drop at the end of every plot).
    #[test]
    fn a_last_interval_cut_short_by_the_run_is_a_rate_over_its_own_length() {
        let mut rec = Recorder::new(1, 1, Nanos::from_secs(10), Nanos::from_secs(3), Nanos::ZERO).unwrap();
        for k in 0..10_000u64 {
            let now = Nanos(k * 1_000_000 + 1);
            rec.completion(0, now, now, 1_000_000, Phase::Weight);
        }
        let ts = rec.finish(&meta(1)).timeseries;
        assert_eq!((ts.intervals, ts.last_interval_s), (4, 1.0));
        let csv = ts.to_csv();
        let iops: Vec<&str> = csv.lines().skip(1).map(|l| l.split(',').nth(2).unwrap()).collect();
        let mb_s: Vec<&str> = csv.lines().skip(1).map(|l| l.split(',').nth(3).unwrap()).collect();
        assert_eq!(iops, ["1000.000"; 4]);
        assert_eq!(mb_s, ["1000.0000"; 4]);
        // A run of whole intervals keeps them whole.
        let whole = Recorder::new(1, 1, Nanos::from_secs(9), Nanos::from_secs(3), Nanos::ZERO).unwrap();
        assert_eq!(whole.finish(&meta(1)).timeseries.last_interval_s, 3.0);
    }

    #[test]
    fn the_cell_bound_is_enforced() {
        let e = Recorder::new(1_000_000, 1, Nanos::from_secs(100), Nanos::from_millis(1), Nanos::ZERO).unwrap_err();
        assert!(e.to_string().contains("raise interval_s"), "{e}");
        // The servers' cells count too: 1,024 servers over a million intervals once asked for 8 GB.
        let e = Recorder::new(1, 1024, Nanos::from_secs(1000), Nanos::from_millis(1), Nanos::ZERO).unwrap_err();
        assert!(e.to_string().contains("(1 tenants + 1024 servers) x 1000000 intervals"), "{e}");
        assert!(Recorder::new(1, 1, Nanos::from_secs(1000), Nanos::from_millis(1), Nanos::ZERO).is_ok());
        // The check alone, at the edge (what a scenario's validation asks, allocating nothing).
        assert_eq!(TooManyCells::check(49, 1, 1_000_000), Ok(()));
        assert_eq!(
            TooManyCells::check(50, 1, 1_000_000),
            Err(TooManyCells { tenants: 50, servers: 1, intervals: 1_000_000 })
        );
        assert!(TooManyCells::check(usize::MAX, 1, 2).is_err(), "an overflowing product is refused");
        assert_eq!(intervals(Nanos::from_secs(10), Nanos::from_secs(3)), 4);
        assert_eq!(intervals(Nanos::ZERO, Nanos::from_secs(3)), 1);
    }
}
