//! The multi-tenant NBD load generator behind `rein load`.
//!
//! Each job is a tenant's workload against one export: `connections` NBD connections, and either a closed
//! loop of `depth` requests outstanding per connection or an open loop of Poisson arrivals at `rate` IOPS.
//! Requests are `size` bytes, reads with probability `read`, at random offsets with probability `random`
//! (sequential otherwise), within the export. Measured per job: completions, bytes and latency per
//! interval, and a latency histogram after the warm-up: the same quantities as the simulator reports.

use crate::client::NbdClient;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use rein_proto::nbd::Command;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct Job {
    pub name: String,
    pub export: String,
    pub connections: usize,
    /// Closed loop: requests outstanding per connection.
    pub depth: usize,
    /// Open loop: Poisson arrivals at this rate (IOPS), instead of the closed loop.
    pub rate: Option<f64>,
    pub size: u32,
    /// Fraction of reads (0-1).
    pub read: f64,
    /// Fraction of random offsets (0-1).
    pub random: f64,
}

#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub addr: SocketAddr,
    pub jobs: Vec<Job>,
    pub duration: Duration,
    pub warmup: Duration,
    pub interval: Duration,
    pub seed: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("job {job}: cannot connect to export {export:?} at {addr}: {source}")]
    Connect { job: String, export: String, addr: SocketAddr, source: crate::client::ClientError },
    #[error("{0}")]
    Invalid(String),
}

/// One interval of one job.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadCell {
    pub ios: u64,
    pub bytes: u64,
    pub lat_sum_ns: u64,
    pub lat_max_ns: u64,
}

/// Per-job measurements.
#[derive(Debug, Clone)]
pub struct JobResult {
    pub name: String,
    pub cells: Vec<LoadCell>,
    /// Latencies (ns) of completions after the warm-up.
    pub hist: Histogram<u64>,
    pub errors: u64,
}

struct Shared {
    start: Instant,
    interval: Duration,
    warmup: Duration,
    cells: Vec<LoadCell>,
    hist: Histogram<u64>,
    errors: u64,
}

impl Shared {
    fn record(&mut self, done: Instant, lat: Duration, bytes: u64, ok: bool) {
        if !ok {
            self.errors += 1;
            return;
        }
        let since = done.saturating_duration_since(self.start);
        let i = (since.as_nanos() / self.interval.as_nanos().max(1)) as usize;
        let lat_ns = lat.as_nanos().min(u64::MAX as u128) as u64;
        if let Some(c) = self.cells.get_mut(i) {
            c.ios += 1;
            c.bytes += bytes;
            c.lat_sum_ns += lat_ns;
            c.lat_max_ns = c.lat_max_ns.max(lat_ns);
        }
        if since >= self.warmup {
            let _ = self.hist.record(lat_ns.max(1));
        }
    }
}

/// Live progress: per job, IOPS and mean latency (ms) over the last interval.
pub type Live = Vec<(String, f64, f64)>;

impl Job {
    fn validate(&self) -> Result<(), String> {
        if self.connections == 0 || self.connections > 1024 {
            return Err(format!("job {}: connections must be in 1..=1024", self.name));
        }
        if self.rate.is_none() && (self.depth == 0 || self.depth > 1024) {
            return Err(format!("job {}: depth must be in 1..=1024", self.name));
        }
        if let Some(r) = self.rate {
            if !(r.is_finite() && r > 0.0 && r <= 1e7) {
                return Err(format!("job {}: rate must be in (0, 1e7] IOPS", self.name));
            }
        }
        if self.size == 0 || self.size > 32 << 20 {
            return Err(format!("job {}: size must be in 1 B..=32 MiB", self.name));
        }
        if !(0.0..=1.0).contains(&self.read) || !(0.0..=1.0).contains(&self.random) {
            return Err(format!("job {}: read and random must be percentages", self.name));
        }
        Ok(())
    }
}

/// Runs the load; `live` is called once per interval.
pub async fn run(cfg: LoadConfig, mut live: impl FnMut(Duration, &Live) + Send) -> Result<Vec<JobResult>, LoadError> {
    if cfg.jobs.is_empty() {
        return Err(LoadError::Invalid("no jobs".into()));
    }
    for j in &cfg.jobs {
        j.validate().map_err(LoadError::Invalid)?;
    }
    if cfg.interval.is_zero() || cfg.duration.is_zero() || cfg.warmup >= cfg.duration {
        return Err(LoadError::Invalid("need duration > warm-up >= 0 and a positive interval".into()));
    }
    let intervals = (cfg.duration.as_nanos().div_ceil(cfg.interval.as_nanos())) as usize;
    // Connect everything first, so a bad export fails before any load starts.
    let mut clients = Vec::new();
    for j in &cfg.jobs {
        let mut cs = Vec::new();
        for _ in 0..j.connections {
            let c = NbdClient::connect(cfg.addr, &j.export).await.map_err(|source| LoadError::Connect {
                job: j.name.clone(),
                export: j.export.clone(),
                addr: cfg.addr,
                source,
            })?;
            cs.push(c);
        }
        clients.push(cs);
    }
    let start = Instant::now();
    let end = start + cfg.duration;
    let shared: Vec<Arc<Mutex<Shared>>> = cfg
        .jobs
        .iter()
        .map(|_| {
            Arc::new(Mutex::new(Shared {
                start,
                interval: cfg.interval,
                warmup: cfg.warmup,
                cells: vec![LoadCell::default(); intervals],
                hist: Histogram::new(3).expect("valid"),
                errors: 0,
            }))
        })
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (ji, j) in cfg.jobs.iter().enumerate() {
        for (ci, client) in clients[ji].iter().enumerate() {
            let workers = if j.rate.is_some() { 1 } else { j.depth };
            for w in 0..workers {
                let (client, sh, j) = (client.clone(), shared[ji].clone(), j.clone());
                let seed = cfg.seed ^ ((ji as u64) << 40) ^ ((ci as u64) << 20) ^ w as u64;
                tasks.spawn(async move { worker(client, sh, j, seed, w, end).await });
            }
        }
    }
    // Live table once per interval.
    let mut tick = tokio::time::interval_at(start + cfg.interval, cfg.interval);
    let mut shown = 0usize;
    while Instant::now() < end {
        tokio::select! {
            _ = tick.tick() => {
                let i = shown;
                shown += 1;
                let rows: Live = cfg.jobs.iter().zip(&shared).map(|(j, s)| {
                    let c = s.lock().unwrap_or_else(|e| e.into_inner()).cells.get(i).copied().unwrap_or_default();
                    let iops = c.ios as f64 / cfg.interval.as_secs_f64();
                    let lat = if c.ios > 0 { c.lat_sum_ns as f64 / c.ios as f64 / 1e6 } else { 0.0 };
                    (j.name.clone(), iops, lat)
                }).collect();
                live(start.elapsed(), &rows);
            }
            _ = tokio::time::sleep_until(end) => break,
        }
    }
    while tasks.join_next().await.is_some() {}
    for cs in &clients {
        for c in cs {
            c.disconnect().await;
        }
    }
    Ok(cfg
        .jobs
        .iter()
        .zip(shared)
        .map(|(j, s)| {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            JobResult { name: j.name.clone(), cells: s.cells.clone(), hist: s.hist.clone(), errors: s.errors }
        })
        .collect())
}

async fn worker(client: Arc<NbdClient>, sh: Arc<Mutex<Shared>>, j: Job, seed: u64, w: usize, end: Instant) {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let blocks = (client.size / j.size as u64).max(1);
    let mut seq = (w as u64 * 1024) % blocks;
    let payload = vec![0x5au8; j.size as usize];
    let one = |rng: &mut Pcg64Mcg, seq: &mut u64| {
        let off = if rng.gen::<f64>() < j.random { rng.gen_range(0..blocks) } else { *seq % blocks } * j.size as u64;
        *seq += 1;
        (off, rng.gen::<f64>() < j.read)
    };
    match j.rate {
        None => {
            while Instant::now() < end {
                let (off, read) = one(&mut rng, &mut seq);
                let t0 = Instant::now();
                let r = if read {
                    client.request(Command::Read, off, j.size, &[], false).await
                } else {
                    client.request(Command::Write, off, j.size, &payload, false).await
                };
                let done = Instant::now();
                sh.lock().unwrap_or_else(|e| e.into_inner()).record(done, done - t0, j.size as u64, r.is_ok());
                if matches!(r, Err(crate::client::ClientError::Closed)) {
                    return;
                }
            }
        }
        Some(rate) => {
            let mut next = Instant::now();
            let mut inflight = tokio::task::JoinSet::new();
            while next < end {
                tokio::time::sleep_until(next).await;
                let (off, read) = one(&mut rng, &mut seq);
                let (c, s, size, pl) =
                    (client.clone(), sh.clone(), j.size, if read { Vec::new() } else { payload.clone() });
                inflight.spawn(async move {
                    let t0 = Instant::now();
                    let r = if read {
                        c.request(Command::Read, off, size, &[], false).await
                    } else {
                        c.request(Command::Write, off, size, &pl, false).await
                    };
                    let done = Instant::now();
                    s.lock().unwrap_or_else(|e| e.into_inner()).record(done, done - t0, size as u64, r.is_ok());
                });
                while inflight.try_join_next().is_some() {}
                let u: f64 = rng.gen();
                next += Duration::from_secs_f64(-(1.0 - u).ln() / rate);
            }
            while inflight.join_next().await.is_some() {}
        }
    }
}
