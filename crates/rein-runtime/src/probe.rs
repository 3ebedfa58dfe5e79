//! The capacity probe: measures a backend the way `rein serve` will use it.
//!
//! Requests go through a [`Dispatcher`] with the server's IO engine, device model and queue depth D (FIFO
//! order, one tenant, unless asked otherwise), from closed-loop workers (`depth` of them unless asked
//! otherwise) issuing random, size-aligned IOs over the whole export. `rein bench dispatch` runs the same
//! load with mClock and many tenants to measure the scheduler's cost. The result (IOPS, MB/s, latency
//! percentiles) is what admission control compares reservations with (`probe_capacity_s` in the server
//! config, or `rein probe` to print a `capacity_iops` line). Reads only, unless writes are asked for
//! explicitly (they overwrite the export with random bytes).

use crate::devmodel::DeviceConfig;
use crate::dispatch::{DispatchConfig, Dispatcher, IoEngine, IoRequest, Op};
use crate::storage::Storage;
use rand::{Rng, SeedableRng};
use rein_core::{QosSpec, SchedulerKind};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// Longest probe, in seconds.
pub const MAX_PROBE_S: f64 = 600.0;
/// Largest probe IO, in bytes (16 MiB).
pub const MAX_PROBE_IO: u32 = 16 << 20;
/// Most requests the probe keeps outstanding (`depth`).
pub const MAX_PROBE_DEPTH: usize = 4096;
/// Most bytes the probe's requests hold at once (`depth` x IO size): 1 GiB.
pub const MAX_PROBE_BYTES_IN_FLIGHT: u64 = 1 << 30;

/// What to measure and how. [`Default`]: 5 s of random 4 KiB reads at D = 32 through FIFO, one tenant; the
/// server's start-up probe takes its seconds, D and IO engine from the server's configuration.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// How long the workers issue requests, in seconds: in (0, [`MAX_PROBE_S`]] (default 5).
    pub seconds: f64,
    /// Bytes per IO (offsets are multiples of it): 1..=[`MAX_PROBE_IO`] and at most the export's size
    /// (default 4096).
    pub io_size: u32,
    /// Workers (requests outstanding); also the dispatcher's D.
    pub depth: usize,
    /// Share of reads, 0..=100. Below 100 the probe writes random data over the export.
    pub read_pct: f64,
    /// How the dispatcher runs the IO, as the server would (default io_uring).
    pub io_engine: IoEngine,
    /// Seed of the workers' offsets, read/write draws and write data (each worker mixes in its index;
    /// default 1).
    pub seed: u64,
    /// The dispatcher's scheduler (the probe: FIFO).
    pub scheduler: SchedulerKind,
    /// Default-spec tenants the workers are spread over, round robin.
    pub tenants: usize,
    /// Closed-loop workers; `None`: `depth`.
    pub workers: Option<usize>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            seconds: 5.0,
            io_size: crate::config::ADMISSION_IO_SIZE as u32,
            depth: 32,
            read_pct: 100.0,
            io_engine: IoEngine::Uring,
            seed: 1,
            scheduler: SchedulerKind::Fifo,
            tenants: 1,
            workers: None,
        }
    }
}

/// Why the probe could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A setting is out of range, or writes were asked of a read-only export; the message names which.
    #[error("probe: {0}")]
    Invalid(String),
    /// A request failed or the dispatcher stopped; the message is the error. One failed IO ends the probe.
    #[error("probe IO failed: {0}")]
    Io(String),
}

/// What the probe measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeResult {
    /// Seconds from the start until every worker's last request was answered (a little more than
    /// [`ProbeConfig::seconds`]).
    pub seconds: f64,
    /// Requests answered, all successfully.
    pub completed: u64,
    /// Throughput in IOPS: `completed / seconds`.
    pub iops: f64,
    /// Throughput in MB/s (10^6 bytes): `completed * io_size / seconds`.
    pub mb_s: f64,
    /// Mean latency in ms, from a worker's submission to its answer (queueing in the dispatcher, any
    /// device model, and the IO).
    pub latency_mean_ms: f64,
    /// Median latency in ms (histogram with 3 significant digits, as the other percentiles).
    pub latency_p50_ms: f64,
    /// 99th-percentile latency in ms.
    pub latency_p99_ms: f64,
    /// Largest latency in ms.
    pub latency_max_ms: f64,
    /// Bytes per IO, as configured.
    pub io_size: u32,
    /// The dispatcher's D, as configured.
    pub depth: usize,
    /// Share of reads asked for, in percent.
    pub read_pct: f64,
    /// The engine that actually ran (uring falls back to threads where the kernel refuses it).
    pub io_engine: &'static str,
}

impl ProbeConfig {
    /// Checks the settings for an export of `size` bytes ([`probe`] does too; a caller checks first to
    /// refuse bad settings before it opens anything). The error names the setting and its range.
    pub fn validate(&self, size: u64) -> Result<(), ProbeError> {
        let bad = |m: String| Err(ProbeError::Invalid(m));
        if !(self.seconds.is_finite() && self.seconds > 0.0 && self.seconds <= MAX_PROBE_S) {
            return bad(format!("seconds must be in (0, {MAX_PROBE_S}], got {}", self.seconds));
        }
        if self.io_size == 0 || self.io_size > MAX_PROBE_IO {
            return bad(format!("IO size must be in 1..={MAX_PROBE_IO} bytes, got {}", self.io_size));
        }
        if self.io_size as u64 > size {
            return bad(format!("IO size {} is larger than the export ({size} bytes)", self.io_size));
        }
        if self.depth == 0 || self.depth > MAX_PROBE_DEPTH {
            return bad(format!("depth must be in 1..={MAX_PROBE_DEPTH}, got {}", self.depth));
        }
        // Each request in flight holds its buffer: depth x IO size is the probe's memory.
        if self.depth as u64 * self.io_size as u64 > MAX_PROBE_BYTES_IN_FLIGHT {
            return bad(format!(
                "depth x IO size is {} bytes in flight, above the bound of {MAX_PROBE_BYTES_IN_FLIGHT} (1 GiB)",
                self.depth as u64 * self.io_size as u64
            ));
        }
        if self.tenants == 0 || self.tenants > 1 << 20 || self.workers.is_some_and(|w| w == 0 || w > 1 << 20) {
            return bad(format!(
                "tenants and workers must be in 1..=2^20, got {} and {:?}",
                self.tenants, self.workers
            ));
        }
        if !(0.0..=100.0).contains(&self.read_pct) {
            return bad(format!("read share must be in 0..=100 %, got {}", self.read_pct));
        }
        Ok(())
    }
}

/// Runs the probe on `storage` (see the module comment).
pub async fn probe(
    storage: Arc<dyn Storage>,
    device: Option<DeviceConfig>,
    cfg: &ProbeConfig,
) -> Result<ProbeResult, ProbeError> {
    cfg.validate(storage.size())?;
    if cfg.read_pct < 100.0 && storage.read_only() {
        return Err(ProbeError::Invalid("the export is read-only: probe with reads only".into()));
    }
    let dcfg = DispatchConfig {
        scheduler: cfg.scheduler,
        depth: cfg.depth,
        io_engine: cfg.io_engine,
        // The probe keeps the device saturated, so a late timer costs it nothing (the model backdates
        // admissions: devmodel, "Late timers"); and its test runs on tokio's paused clock.
        precise_timer: false,
        ..DispatchConfig::default()
    };
    let (d, join) = Dispatcher::spawn(device, dcfg);
    let mut tenants = Vec::with_capacity(cfg.tenants);
    for _ in 0..cfg.tenants {
        tenants.push(d.add_tenant(QosSpec::default()).await.map_err(|e| ProbeError::Io(e.to_string()))?);
    }
    let engine = d.snapshot().await.map_err(|e| ProbeError::Io(e.to_string()))?.io_engine;
    let hist = Arc::new(Mutex::new(hdrhistogram::Histogram::<u64>::new(3).expect("3 significant digits is valid")));
    let slots = storage.size() / cfg.io_size as u64;
    let start = tokio::time::Instant::now();
    let end = start + Duration::from_secs_f64(cfg.seconds);
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..cfg.workers.unwrap_or(cfg.depth) {
        let (d, st, hist, tenant) = (d.clone(), storage.clone(), hist.clone(), tenants[w % tenants.len()]);
        let (size, read_pct, seed) = (cfg.io_size, cfg.read_pct, cfg.seed);
        workers.spawn(async move {
            let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed ^ (w as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut local = hdrhistogram::Histogram::<u64>::new(3).expect("valid");
            let mut n = 0u64;
            while tokio::time::Instant::now() < end {
                let offset = rng.gen_range(0..slots) * size as u64;
                let op = if read_pct >= 100.0 || rng.gen::<f64>() * 100.0 < read_pct {
                    Op::read(size)
                } else {
                    Op::Write { data: (0..size).map(|_| rng.gen()).collect() }
                };
                let t0 = tokio::time::Instant::now();
                d.io(IoRequest { storage: st.clone(), tenant, offset, op, fua: false, piggyback: None })
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = local.record(t0.elapsed().as_nanos().max(1) as u64);
                n += 1;
            }
            hist.lock().await.add(&local).map_err(|e| e.to_string())?;
            Ok::<u64, String>(n)
        });
    }
    let mut completed = 0;
    while let Some(r) = workers.join_next().await {
        completed += r.map_err(|e| ProbeError::Io(e.to_string()))?.map_err(ProbeError::Io)?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    drop(d);
    let _ = join.await;
    let h = hist.lock().await;
    let ms = |ns: u64| ns as f64 / 1e6;
    Ok(ProbeResult {
        seconds: elapsed,
        completed,
        iops: completed as f64 / elapsed,
        mb_s: completed as f64 * cfg.io_size as f64 / elapsed / 1e6,
        latency_mean_ms: h.mean() / 1e6,
        latency_p50_ms: ms(h.value_at_quantile(0.5)),
        latency_p99_ms: ms(h.value_at_quantile(0.99)),
        latency_max_ms: ms(h.max()),
        io_size: cfg.io_size,
        depth: cfg.depth,
        read_pct: cfg.read_pct,
        io_engine: engine.name(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;

    /// depth x IO size is bounded together (each bounded alone allowed 4,096 x 16 MiB = 64 GiB).
    #[test]
    fn bytes_in_flight_are_bounded() {
        let cfg = |depth, io_size| ProbeConfig { depth, io_size, ..ProbeConfig::default() };
        assert!(cfg(64, 16 << 20).validate(1 << 40).is_ok()); // exactly 1 GiB
        let e = cfg(65, 16 << 20).validate(1 << 40).unwrap_err().to_string();
        assert!(e.contains("depth x IO size is 1090519040 bytes in flight, above the bound"), "{e}");
        assert!(cfg(4096, 16 << 20).validate(1 << 40).is_err());
    }

    #[test]
    fn median_and_spread() {
        assert_eq!(median(&[157.0, 120.0, 130.0]), Some(130.0));
        assert_eq!(median(&[]), None);
        let p = StartupProbe { iops: 100.0, runs: vec![90.0, 100.0, 120.0], direct: true };
        assert!((p.spread_pct() - 30.0).abs() < 1e-9);
    }

    #[tokio::test]
    async fn the_startup_probe_reads_a_file_with_o_direct_where_it_can() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "data_dir = \"{}\"\nprobe_capacity_s = 0.2\n[[exports]]\nname = \"a\"\nsize_mb = 4\n",
            dir.path().display()
        );
        let cfg = crate::config::ServerConfig::parse(&text, std::path::Path::new("t")).unwrap();
        let st = crate::preflight::open_export(&cfg.exports[0]).unwrap();
        let r = probe_export(&cfg.exports[0], st, None, &cfg).await.unwrap();
        assert_eq!(r.runs.len(), STARTUP_RUNS);
        assert!(r.iops > 0.0 && r.runs.contains(&r.iops));
        // tmpfs refuses O_DIRECT; a disk file system takes it.
        let fs_direct =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(dir.path().join("a.img")).is_ok();
        assert_eq!(r.direct, fs_direct);
    }
    use rein_model::device::{DeviceSpec, ServiceModel};

    #[tokio::test(start_paused = true)]
    async fn measures_the_modelled_device() {
        let st: Arc<dyn Storage> = Arc::new(MemStorage::new(64 << 20));
        let dev = DeviceConfig {
            spec: DeviceSpec::new(2000.0, ServiceModel::Exponential).unwrap(),
            seed: 7,
            stream: 0,
            service_scale: Vec::new(),
        };
        let r = probe(st, Some(dev), &ProbeConfig { seconds: 10.0, ..Default::default() }).await.unwrap();
        assert!((r.iops - 2000.0).abs() < 2000.0 * 0.05, "{r:?}");
        assert!((r.mb_s - 2000.0 * 4096.0 / 1e6).abs() < 0.5, "{r:?}");
        // 32 outstanding on a 2000 IOPS FIFO device: about 32 / 2000 s = 16 ms each (Little's law).
        assert!((r.latency_mean_ms - 16.0).abs() < 1.6, "{r:?}");
        assert!(r.latency_p99_ms >= r.latency_p50_ms && r.latency_max_ms >= r.latency_p99_ms);
    }

    #[tokio::test]
    async fn bad_settings_are_clear_errors() {
        let st: Arc<dyn Storage> = Arc::new(MemStorage::new(1 << 20));
        for (cfg, needle) in [
            (ProbeConfig { seconds: 0.0, ..Default::default() }, "seconds"),
            (ProbeConfig { io_size: 0, ..Default::default() }, "IO size"),
            (ProbeConfig { io_size: 2 << 20, ..Default::default() }, "larger than the export"),
            (ProbeConfig { depth: 0, ..Default::default() }, "depth"),
            (ProbeConfig { read_pct: 101.0, ..Default::default() }, "read share"),
        ] {
            let e = probe(st.clone(), None, &cfg).await.unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}

/// Runs of the server's start-up probe; their median is the capacity.
pub const STARTUP_RUNS: usize = 3;

/// `PATH is mostly holes (N of its M MiB written), whose reads never reach the device` when the regular
/// file at `path` has less than half its size allocated, with the allocated bytes and the size: a probe of
/// it measures the file system (the start-up probe and `rein probe` both say so).
pub fn mostly_holes(path: &std::path::Path) -> Option<(String, u64, u64)> {
    let (allocated, size) = allocation(path).filter(|&(allocated, size)| allocated < size / 2)?;
    let written = if allocated == 0 { "none".to_string() } else { format!("{:.1} MiB", allocated as f64 / 1048576.0) };
    let holes = format!(
        "{} is mostly holes ({written} of its {} MiB written), whose reads never reach the device",
        path.display(),
        size >> 20
    );
    Some((holes, allocated, size))
}

/// The bytes of the regular file at `path` that hold data (its allocated blocks), and its size; `None`
/// for anything else (a block device has no holes to speak of).
fn allocation(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
    Some((m.blocks().saturating_mul(512), m.len()))
}

/// What the start-up probe found: the median of [`STARTUP_RUNS`] runs.
#[derive(Clone, Debug)]
pub struct StartupProbe {
    /// The median run's IOPS.
    pub iops: f64,
    /// Each run's IOPS, in the order run.
    pub runs: Vec<f64>,
    /// Whether the reads bypassed the page cache (O_DIRECT).
    pub direct: bool,
}

impl StartupProbe {
    /// `(max - min) / median` of the runs, in percent.
    pub fn spread_pct(&self) -> f64 {
        let max = self.runs.iter().cloned().fold(f64::MIN, f64::max);
        let min = self.runs.iter().cloned().fold(f64::MAX, f64::min);
        if self.iops > 0.0 {
            (max - min) / self.iops * 100.0
        } else {
            0.0
        }
    }
}

/// The median of `v` (the lower middle for an even count); `None` when empty.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get((s.len().max(1) - 1) / 2).copied()
}

/// The server's start-up probe (`probe_capacity_s`) of export `e` (opened as `storage`): random 4 KiB reads
/// at the server's D and IO engine, [`STARTUP_RUNS`] runs of `probe_capacity_s` seconds each, the median
/// kept and logged with every run and the spread. A file export is read with O_DIRECT where the file
/// system allows, so that the page cache does not inflate the result; where it does not (tmpfs, some
/// network file systems), the probe says so in the log and measures through the cache.
pub async fn probe_export(
    e: &crate::config::ExportConfig,
    storage: Arc<dyn Storage>,
    device: Option<DeviceConfig>,
    cfg: &crate::config::ServerConfig,
) -> Result<StartupProbe, ProbeError> {
    let (storage, direct) = match &e.backend {
        crate::config::BackendKind::File { path } => {
            match crate::storage::FileStorage::open_with(
                path,
                None,
                crate::storage::FileMode { read_only: true, direct: true, readahead: e.readahead },
            ) {
                Ok(f) => (Arc::new(f) as Arc<dyn Storage>, true),
                Err(err) => {
                    tracing::warn!(
                        export = %e.name,
                        "capacity probe: O_DIRECT is not available on {} ({err}); the result includes the page cache",
                        path.display()
                    );
                    (storage, false)
                }
            }
        }
        crate::config::BackendKind::Memory => (storage, false),
    };
    // Reads of a hole never reach the device (the file system answers zeros, O_DIRECT or not): a sparse
    // image, such as one this start created, measures the file system (341,000 IOPS on this project's
    // VM) and admission control then admits against it. Said before the runs, with how much is data.
    if let crate::config::BackendKind::File { path } = &e.backend {
        if let Some((holes, allocated, size)) = mostly_holes(path) {
            tracing::warn!(
                export = %e.name,
                allocated_bytes = allocated,
                size_bytes = size,
                "capacity probe: {holes}: the probe measures the file system, and admission control trusts it; \
                 once the image holds data, set capacity_iops or measure it again (PUT /api/capacity, rein probe)"
            );
        }
    }
    let pc = ProbeConfig {
        seconds: cfg.probe_capacity_s,
        depth: cfg.queue_depth,
        io_engine: cfg.io_engine,
        ..ProbeConfig::default()
    };
    tracing::info!(
        export = %e.name,
        "capacity probe: {STARTUP_RUNS} runs of {} s of random 4 KiB reads; the server listens after them",
        cfg.probe_capacity_s
    );
    let mut runs = Vec::with_capacity(STARTUP_RUNS);
    let mut p99 = Vec::with_capacity(STARTUP_RUNS);
    for i in 0..STARTUP_RUNS {
        let r = probe(storage.clone(), device.clone(), &ProbeConfig { seed: pc.seed + i as u64, ..pc.clone() }).await?;
        runs.push(r.iops);
        p99.push(r.latency_p99_ms);
    }
    let iops = median(&runs).expect("STARTUP_RUNS > 0");
    let out = StartupProbe { iops, runs, direct };
    tracing::info!(
        export = %e.name,
        iops = iops.round(),
        runs = ?out.runs.iter().map(|r| r.round()).collect::<Vec<_>>(),
        spread_pct = (out.spread_pct() * 10.0).round() / 10.0,
        p99_ms = median(&p99).unwrap_or(0.0),
        o_direct = direct,
        "capacity probe: the median of {STARTUP_RUNS} runs is the capacity for admission control"
    );
    Ok(out)
}
