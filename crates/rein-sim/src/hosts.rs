//! PARDA hosts in the simulator (issue 5; parda.txt §3-5).
//!
//! # Model
//! A *host* sits between its VMs (tenants with `host = "..."`) and one server, *the array*. It runs
//! rein-core's [`HostController`] unchanged: VMs' requests queue in its local scheduler (SFQ with optional
//! locality batching, or mClock), and the host releases them to the array while fewer than its window are
//! outstanding. Once per control period each PARDA host publishes a report (its eq. (1) estimate and IO
//! count), reads the others', and updates its window by eq. (2) from the signal:
//! - `aggregation = "cluster"` (§4.2): each host has a rein-core [`Aggregator`] fed from a modelled shared
//!   board: a report becomes visible to the others `aggregation_delay_ms` after its host publishes it
//!   (the shared file's write-then-read latency; 0 = at once), and each host reads the newest visible
//!   report of every other host at its own period tick. Duplicates, staleness and the timeout are the
//!   aggregator's.
//! - `aggregation = "local"` (§4.1): each host uses only its own estimate.
//!
//! Periods are staggered (host i ticks first at `period * (1 + i / hosts)`), as independent hosts are.
//! An *uncontrolled* host (`controlled = false`, or `[parda] enabled = false` for all) keeps a fixed
//! issue queue (`window`, default `w_max`) and does not publish: an external host (§5.3.4) or the
//! no-PARDA baseline.
//!
//! The array is any server; for PARDA scenarios a `fifo` scheduler with a deep `queue_depth` so every
//! issued IO is at the device and latency grows with the array's queue (Little's law). Each host may have
//! a `service_scale`: a multiplier on its requests' service times at the array (placement skew, §4.1).
//! With `discipline = "ps"` (processor sharing, `array.rs`) a host's latency follows its own
//! service demand, which is how placement made the paper's hosts see different latencies.
//!
//! # Measured
//! Per host per interval ([`HostCell`]): completions and their latency (issue at the host to completion,
//! the device latency PARDA sees; the tenants' own latencies also include the time queued at the host),
//! and at each period's end the window, beta, signal and own estimate (carried forward through
//! intervals without a period end). [`HostTotals`] turns them into `hosts.csv`, the `hosts` section of
//! summary.json, plots, and `--check` expectations (see `check_one`; metrics in [`HOST_METRICS`]).

use crate::check::CheckResult;
use crate::metrics::RunTotals;
use crate::scenario::{parse_scheduler, ExpectFile, Scenario, Server, Tenant, TenantFile};
use rein_core::parda::{
    equilibrium_latency, equilibrium_windows, Aggregator, HostConfig, HostController, HostReport, PardaConfig,
    SizeModel,
};
use rein_core::{Nanos, Poll, Request, SchedConfig, SchedulerKind, TenantId};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Largest number of hosts in a scenario.
pub const MAX_HOSTS: usize = rein_core::parda::MAX_HOSTS as usize;

fn d_alpha() -> f64 {
    0.002
}
fn d_gamma() -> f64 {
    0.8
}
fn d_period() -> f64 {
    2.0
}
fn d_w_min() -> f64 {
    1.0
}
fn d_w_max() -> f64 {
    64.0
}
fn d_one() -> f64 {
    1.0
}
fn d_true() -> bool {
    true
}
fn d_cluster() -> String {
    "cluster".into()
}
fn d_sfq() -> String {
    "sfq".into()
}

/// `[parda]`: parameters shared by every host.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PardaFile {
    /// script-L.
    pub latency_threshold_ms: f64,
    /// eq. (1): weight of the past, per period.
    #[serde(default = "d_alpha")]
    pub alpha: f64,
    /// eq. (2): smoothing.
    #[serde(default = "d_gamma")]
    pub gamma: f64,
    #[serde(default = "d_period")]
    pub period_s: f64,
    #[serde(default = "d_w_min")]
    pub w_min: f64,
    #[serde(default = "d_w_max")]
    pub w_max: f64,
    /// Window before the first update (default w_max).
    pub initial_window: Option<f64>,
    /// "cluster" (§4.2) or "local" (§4.1).
    #[serde(default = "d_cluster")]
    pub aggregation: String,
    #[serde(default)]
    pub aggregation_delay_ms: f64,
    /// Hosts silent this long drop out of the average (default 3 periods).
    pub aggregation_timeout_s: Option<f64>,
    /// K of §3.4: a host's beta is K times the sum of its VMs' weights unless the host sets `beta`.
    #[serde(default = "d_one")]
    pub beta_per_share: f64,
    /// §3.4 eq. (4): scale under-using VMs' shares.
    #[serde(default = "d_true")]
    pub adjust_beta: bool,
    /// The hosts' local scheduler: sfq (default) or mclock (or fifo).
    #[serde(default = "d_sfq")]
    pub local_scheduler: String,
    /// Local locality batching (§3.3): batch size (1 = off) and distance (KiB).
    pub batch: Option<u32>,
    pub batch_distance_kb: Option<f64>,
    /// Latency normalisation per 8 KiB: cost(size) = fixed_ms + size / transfer_mb_s.
    pub size_model: Option<SizeModelFile>,
    /// false: every host is uncontrolled (the no-PARDA baseline of the same scenario).
    #[serde(default = "d_true")]
    pub enabled: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SizeModelFile {
    pub fixed_ms: f64,
    pub transfer_mb_s: f64,
}

/// `[[hosts]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFile {
    pub name: String,
    /// beta; default: `beta_per_share` times the sum of the host's VMs' weights.
    pub beta: Option<f64>,
    #[serde(default = "d_true")]
    pub controlled: bool,
    /// Uncontrolled hosts: the fixed issue queue (default w_max).
    pub window: Option<f64>,
    /// Multiplier on this host's service times at the array (placement skew).
    #[serde(default = "d_one")]
    pub service_scale: f64,
    /// The array (default: the only server).
    pub server: Option<String>,
}

/// Which latency signal the hosts use.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Aggregation {
    Cluster,
    Local,
}

/// The validated `[parda]` table.
#[derive(Debug, Clone)]
pub struct Parda {
    pub config: PardaConfig,
    pub aggregation: Aggregation,
    pub delay: Nanos,
    pub timeout: Nanos,
    pub beta_per_share: f64,
    pub local_scheduler: SchedulerKind,
    pub batch: u32,
    pub batch_distance: u64,
    pub enabled: bool,
}

/// A validated host.
#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    pub beta: Option<f64>,
    pub controlled: bool,
    pub window: Option<f64>,
    pub service_scale: f64,
    /// Index of the array in `Scenario::servers`.
    pub server: usize,
    /// Indices of its VMs in `Scenario::tenants`.
    pub vms: Vec<usize>,
}

impl Host {
    /// Whether this host runs PARDA in a scenario with `parda`.
    pub fn runs_parda(&self, parda: &Parda) -> bool {
        self.controlled && parda.enabled
    }
}

fn in_range(what: &str, v: f64, lo: f64, hi: f64) -> Result<f64, String> {
    if v.is_finite() && v >= lo && v <= hi {
        Ok(v)
    } else {
        Err(format!("{what} must be between {lo} and {hi}, got {v}"))
    }
}

fn validate_parda(p: &PardaFile) -> Result<Parda, String> {
    let at = |e: rein_core::parda::PardaError| format!("parda: {e}");
    if !(p.latency_threshold_ms.is_finite() && p.latency_threshold_ms > 0.0 && p.latency_threshold_ms <= 3.6e6) {
        return Err(format!(
            "parda: latency_threshold_ms (script-L) must be positive and at most an hour, got {}",
            p.latency_threshold_ms
        ));
    }
    let period = in_range("parda: period_s", p.period_s, 0.001, 3600.0)?;
    let size_model = match &p.size_model {
        None => SizeModel::NONE,
        Some(m) => {
            if !(m.fixed_ms.is_finite() && m.fixed_ms >= 0.0) {
                return Err(format!("parda: size_model.fixed_ms must be non-negative, got {}", m.fixed_ms));
            }
            SizeModel::from_rate(Nanos::from_secs_f64(m.fixed_ms / 1e3), m.transfer_mb_s)
                .map_err(|_| format!("parda: size_model.transfer_mb_s must be positive, got {}", m.transfer_mb_s))?
        }
    };
    let config = PardaConfig {
        latency_threshold: Nanos::from_secs_f64(p.latency_threshold_ms / 1e3),
        alpha: p.alpha,
        gamma: p.gamma,
        period: Nanos::from_secs_f64(period),
        w_min: p.w_min,
        w_max: p.w_max,
        initial_window: p.initial_window,
        size_model,
        adjust_beta: p.adjust_beta,
    };
    config.validate().map_err(at)?;
    let aggregation = match p.aggregation.as_str() {
        "cluster" => Aggregation::Cluster,
        "local" => Aggregation::Local,
        o => return Err(format!("parda: aggregation {o:?}: expected \"cluster\" or \"local\"")),
    };
    let delay = in_range("parda: aggregation_delay_ms", p.aggregation_delay_ms, 0.0, 3.6e6)?;
    let timeout =
        in_range("parda: aggregation_timeout_s", p.aggregation_timeout_s.unwrap_or(3.0 * period), 0.001, 86_400.0)?;
    if !(p.beta_per_share.is_finite() && p.beta_per_share > 0.0 && p.beta_per_share <= 1e6) {
        return Err(format!("parda: beta_per_share must be positive, got {}", p.beta_per_share));
    }
    let (local_scheduler, distributed) =
        parse_scheduler(&p.local_scheduler).map_err(|e| format!("parda: local_scheduler: {e}"))?;
    if distributed {
        return Err(format!(
            "parda: local_scheduler {:?} is a distributed scheduler; use sfq, mclock or fifo",
            p.local_scheduler
        ));
    }
    let batch = p.batch.unwrap_or(1);
    if batch == 0 || batch > 1024 {
        return Err(format!("parda: batch must be in 1..=1024, got {batch}"));
    }
    let bd = p.batch_distance_kb.unwrap_or(4096.0);
    if !(bd.is_finite() && bd >= 0.0) {
        return Err("parda: batch_distance_kb must be non-negative".into());
    }
    Ok(Parda {
        config,
        aggregation,
        delay: Nanos::from_secs_f64(delay / 1e3),
        timeout: Nanos::from_secs_f64(timeout),
        beta_per_share: p.beta_per_share,
        local_scheduler,
        batch,
        batch_distance: (bd * 1024.0) as u64,
        enabled: p.enabled,
    })
}

/// Validates `[parda]` and `[[hosts]]` and attaches each VM (tenant with `host`) to its host: a VM sends
/// only to its host's array.
pub(crate) fn validate(
    parda: Option<&PardaFile>,
    files: &[HostFile],
    tenant_files: &[TenantFile],
    tenants: &mut [Tenant],
    servers: &[Server],
) -> Result<(Option<Parda>, Vec<Host>), String> {
    let uses_host = tenant_files.iter().any(|t| t.host.is_some());
    if files.is_empty() {
        if let Some(t) = tenant_files.iter().find(|t| t.host.is_some()) {
            return Err(format!(
                "tenant {}: host {:?} but no [[hosts]] are defined",
                t.name,
                t.host.as_deref().unwrap_or_default()
            ));
        }
        if parda.is_some() {
            return Err("[parda] needs [[hosts]] to control".into());
        }
        return Ok((None, Vec::new()));
    }
    let parda = parda.ok_or(
        "[[hosts]] need a [parda] table (latency_threshold_ms at least; enabled = false for a baseline without PARDA)",
    )?;
    let parda = validate_parda(parda)?;
    if files.len() > MAX_HOSTS {
        return Err(format!("at most {MAX_HOSTS} hosts"));
    }
    let mut hosts = Vec::with_capacity(files.len());
    let mut by_name = std::collections::BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        let n = &f.name;
        if n.trim().is_empty() {
            return Err("a host has an empty name".into());
        }
        if n == "all" {
            return Err("a host may not be named \"all\" (expectations use it for the whole cluster)".into());
        }
        if by_name.insert(n.as_str(), i).is_some() {
            return Err(format!("two hosts are named {n:?}"));
        }
        let server = match &f.server {
            Some(s) => {
                servers.iter().position(|x| &x.name == s).ok_or_else(|| format!("host {n}: unknown server {s:?}"))?
            }
            None if servers.len() == 1 => 0,
            None => {
                return Err(format!(
                    "host {n}: name its array with server = \"...\" (the scenario has several servers)"
                ))
            }
        };
        let hc = HostConfig {
            id: i as u32,
            beta: f.beta,
            beta_per_share: parda.beta_per_share,
            fixed_window: f.window,
            ..HostConfig::default()
        };
        hc.validate().map_err(|e| format!("host {n}: {e}"))?;
        if f.window.is_some() && f.controlled && parda.enabled {
            return Err(format!("host {n}: window is the fixed issue queue of an uncontrolled host; a PARDA host's window is bounded by [parda] w_min / w_max"));
        }
        let scale = in_range(&format!("host {n}: service_scale"), f.service_scale, 1e-3, 1e3)?;
        hosts.push(Host {
            name: n.clone(),
            beta: f.beta,
            controlled: f.controlled,
            window: f.window,
            service_scale: scale,
            server,
            vms: Vec::new(),
        });
    }
    debug_assert!(uses_host || !hosts.is_empty());
    for (ti, (tf, t)) in tenant_files.iter().zip(tenants.iter_mut()).enumerate() {
        let Some(hn) = &tf.host else { continue };
        let h = *by_name.get(hn.as_str()).ok_or_else(|| format!("tenant {}: unknown host {hn:?}", t.name))?;
        let server = hosts[h].server;
        if let Some(list) = &tf.servers {
            if list.len() != 1 || list[0] != servers[server].name {
                return Err(format!(
                    "tenant {}: a VM on host {hn} sends only to its host's array {:?}; drop servers",
                    t.name, servers[server].name
                ));
            }
        }
        if !tf.server_reservations.is_empty() || tf.routing.is_some() {
            return Err(format!("tenant {}: server_reservations and routing do not apply to a VM on a host", t.name));
        }
        t.servers = vec![server];
        t.server_specs = vec![t.spec];
        t.host = Some(h);
        hosts[h].vms.push(ti);
    }
    if let Some(h) = hosts.iter().find(|h| h.vms.is_empty()) {
        return Err(format!("host {}: no tenants name it (give VMs host = {:?})", h.name, h.name));
    }
    Ok((Some(parda), hosts))
}

// ----------------------------------------------------------------------------------------------------
// Run-time state
// ----------------------------------------------------------------------------------------------------

/// One host per interval.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostCell {
    /// Completions at this host in the interval and their summed latency (host issue to completion).
    pub ios: u32,
    pub lat_sum_ns: u64,
    /// At the end of the interval (the last period end in or before it).
    pub window: f64,
    pub beta: f64,
    /// The latency signal used (cluster average or own estimate), ns; 0 if none.
    pub signal_ns: f64,
    /// The host's own eq. (1) estimate, ns.
    pub estimate_ns: f64,
    set: bool,
}

struct HostRt {
    ctl: HostController,
    agg: Aggregator,
    /// Runs PARDA (publishes and updates its window).
    parda: bool,
    wake_at: Option<u64>,
}

/// The hosts of a running simulation (owned by the engine).
pub(crate) struct HostLayer {
    aggregation: Aggregation,
    delay: Nanos,
    hosts: Vec<HostRt>,
    /// Per tenant: (host, the VM's id in the host's scheduler).
    vm: Vec<Option<(u32, TenantId)>>,
    /// Per tenant: service-time multiplier at the array.
    scale: Vec<f64>,
    /// Published reports per host, oldest first: (visible from, report).
    board: Vec<VecDeque<(Nanos, HostReport)>>,
    interval: u64,
    intervals: usize,
    cells: Vec<HostCell>,
}

impl HostLayer {
    pub(crate) fn new(sc: &Scenario) -> Result<Option<HostLayer>, String> {
        let Some(p) = &sc.parda else { return Ok(None) };
        let intervals = sc.duration.0.div_ceil(sc.interval.0) as usize;
        let cells = intervals
            .checked_mul(sc.hosts.len())
            .filter(|&c| c <= crate::metrics::MAX_CELLS)
            .ok_or("hosts x intervals exceeds the timeseries bound: raise interval_s")?;
        let mut layer = HostLayer {
            aggregation: p.aggregation,
            delay: p.delay,
            hosts: Vec::with_capacity(sc.hosts.len()),
            vm: vec![None; sc.tenants.len()],
            scale: vec![1.0; sc.tenants.len()],
            board: vec![VecDeque::new(); sc.hosts.len()],
            interval: sc.interval.0,
            intervals,
            cells: vec![HostCell::default(); cells],
        };
        let n = sc.hosts.len() as u64;
        for (i, h) in sc.hosts.iter().enumerate() {
            let runs = h.runs_parda(p);
            let sched = SchedConfig {
                batch: p.batch,
                batch_distance: p.batch_distance,
                cost_model: sc.cost_model,
                ..SchedConfig::default()
            };
            let hc = HostConfig {
                id: i as u32,
                epoch: 1,
                beta: h.beta,
                beta_per_share: p.beta_per_share,
                scheduler: p.local_scheduler,
                sched,
                fixed_window: if runs { None } else { Some(h.window.unwrap_or(p.config.w_max)) },
            };
            // Periods are staggered: host i's first ends at period * (1 + i / n).
            let start = Nanos(p.config.period.0 * i as u64 / n);
            let mut ctl = HostController::new(p.config, hc, start).map_err(|e| format!("host {}: {e}", h.name))?;
            for &t in &h.vms {
                let id = ctl
                    .add_vm(sc.tenants[t].spec)
                    .map_err(|e| format!("host {}: VM {}: {e}", h.name, sc.tenants[t].name))?;
                layer.vm[t] = Some((i as u32, id));
                layer.scale[t] = h.service_scale;
            }
            let agg = Aggregator::new(p.timeout).map_err(|e| e.to_string())?;
            layer.hosts.push(HostRt { ctl, agg, parda: runs, wake_at: None });
            layer.record(i, Nanos::ZERO, None);
        }
        Ok(Some(layer))
    }

    pub(crate) fn len(&self) -> usize {
        self.hosts.len()
    }

    /// When host `h`'s first period ends.
    pub(crate) fn first_period(&self, h: usize) -> Nanos {
        self.hosts[h].ctl.poll_timeout()
    }

    /// The host of tenant `t`, if it is a VM.
    #[inline]
    pub(crate) fn host_of(&self, t: usize) -> Option<usize> {
        self.vm[t].map(|(h, _)| h as usize)
    }

    /// Service-time multiplier of tenant `t`'s requests at the array.
    #[inline]
    pub(crate) fn scale(&self, t: usize) -> f64 {
        self.scale[t]
    }

    /// A VM's request reaches its host. False if the host's queue is full (the request is rejected).
    pub(crate) fn enqueue(&mut self, now: Nanos, t: usize, handle: u64, size: u64, offset: u64) -> bool {
        let (h, id) = self.vm[t].expect("tenant is a VM");
        let req = Request { tenant: id, handle, size, offset, delta: rein_core::Cost(0), rho: rein_core::Cost(0) };
        self.hosts[h as usize].ctl.enqueue(now, req).is_ok()
    }

    pub(crate) fn poll(&mut self, h: usize, now: Nanos) -> Poll {
        self.hosts[h].ctl.poll(now)
    }

    pub(crate) fn wake_at(&mut self, h: usize) -> &mut Option<u64> {
        &mut self.hosts[h].wake_at
    }

    /// A request of VM `t` issued by its host at `issued` completed (reached the host) at `now`.
    pub(crate) fn complete(&mut self, now: Nanos, t: usize, issued: Nanos, size: u64) {
        let (h, id) = self.vm[t].expect("tenant is a VM");
        let lat = now.saturating_sub(issued);
        self.hosts[h as usize]
            .ctl
            .on_complete(now, id, lat, size)
            .expect("the engine completes only what the host issued");
        let i = ((now.0 / self.interval) as usize).min(self.intervals - 1);
        let c = &mut self.cells[h as usize * self.intervals + i];
        c.ios += 1;
        c.lat_sum_ns += lat.0;
    }

    /// A request of VM `t` that its host released was refused by the array (full scheduler queue).
    pub(crate) fn failed(&mut self, now: Nanos, t: usize) {
        let (h, id) = self.vm[t].expect("tenant is a VM");
        self.hosts[h as usize].ctl.on_issue_failed(now, id).expect("the engine fails only what the host issued");
    }

    fn record(&mut self, h: usize, now: Nanos, signal: Option<f64>) {
        let st = self.hosts[h].ctl.stats();
        let i = ((now.0 / self.interval) as usize).min(self.intervals - 1);
        let c = &mut self.cells[h * self.intervals + i];
        c.window = st.window;
        c.beta = st.beta;
        c.signal_ns = signal.unwrap_or(0.0);
        c.estimate_ns = st.estimate_ns.unwrap_or(0.0);
        c.set = true;
    }

    /// Host `h`'s period ends at `now`: publish, aggregate, update. Returns when the next one ends.
    pub(crate) fn period(&mut self, h: usize, now: Nanos) -> Nanos {
        let signal = if self.hosts[h].parda {
            let own = self.hosts[h].ctl.close_period(now);
            match self.aggregation {
                Aggregation::Local => self.hosts[h].ctl.local_estimate_ns(),
                Aggregation::Cluster => {
                    self.board[h].push_back((now.saturating_add(self.delay), own));
                    let HostRt { agg, .. } = &mut self.hosts[h];
                    agg.accept(now, own).expect("host ids are below MAX_HOSTS");
                    for (g, board) in self.board.iter_mut().enumerate() {
                        // Reports superseded by a newer visible one are never read again.
                        while board.len() >= 2 && board[1].0 <= now {
                            board.pop_front();
                        }
                        if g == h {
                            continue;
                        }
                        if let Some(&(at, r)) = board.front() {
                            if at <= now {
                                agg.accept(now, r).expect("host ids are below MAX_HOSTS");
                            }
                        }
                    }
                    agg.cluster(now).map(|c| c.latency_ns)
                }
            }
        } else {
            None
        };
        self.hosts[h].ctl.on_period(now, signal);
        self.record(h, now, signal);
        self.hosts[h].ctl.poll_timeout()
    }

    pub(crate) fn finish(mut self, sc: &Scenario) -> HostTotals {
        let n = self.hosts.len();
        for h in 0..n {
            let mut last = self.cells[h * self.intervals];
            for i in 0..self.intervals {
                let c = &mut self.cells[h * self.intervals + i];
                if c.set {
                    last = *c;
                } else {
                    c.window = last.window;
                    c.beta = last.beta;
                    c.signal_ns = last.signal_ns;
                    c.estimate_ns = last.estimate_ns;
                }
            }
        }
        let p = sc.parda.as_ref().expect("a host layer exists only with [parda]");
        let mut t = HostTotals {
            names: sc.hosts.iter().map(|h| h.name.clone()).collect(),
            controlled: sc.hosts.iter().map(|h| h.runs_parda(p)).collect(),
            interval_s: self.interval as f64 / 1e9,
            intervals: self.intervals,
            cells: self.cells,
            threshold_ms: p.config.threshold_ns() / 1e6,
            period_s: p.config.period.as_secs_f64(),
            summary: HostsSummary::default(),
        };
        t.summary = t.summarise(sc);
        t
    }
}

// ----------------------------------------------------------------------------------------------------
// Results
// ----------------------------------------------------------------------------------------------------

/// Host-level results of a run.
#[derive(Clone, Debug)]
pub struct HostTotals {
    pub names: Vec<String>,
    /// Whether each host ran PARDA.
    pub controlled: Vec<bool>,
    pub interval_s: f64,
    pub intervals: usize,
    /// `cells[host * intervals + i]`.
    pub cells: Vec<HostCell>,
    /// script-L (ms).
    pub threshold_ms: f64,
    /// The control period (s).
    pub period_s: f64,
    pub summary: HostsSummary,
}

/// Convergence times judge the window averaged over this many control periods either side: enough to
/// damp one period's noise, short enough not to hide a step (eq. (2) moves 80% of the way per period).
pub const SMOOTH_PERIODS: f64 = 2.0;

/// The `hosts` section of summary.json.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct HostsSummary {
    pub latency_threshold_ms: f64,
    pub aggregation: String,
    /// false: the no-PARDA baseline (`[parda] enabled = false`).
    pub enabled: bool,
    /// All hosts after warm-up: completions per second, IO-weighted mean latency (issue at the host to
    /// completion), and eq. (3)'s equilibrium latency for the PARDA hosts' mean betas and throughput
    /// (`None` without PARDA hosts).
    pub iops: f64,
    pub latency_mean_ms: f64,
    pub equilibrium_latency_ms: Option<f64>,
    pub hosts: Vec<HostSummary>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HostSummary {
    pub name: String,
    pub controlled: bool,
    /// After warm-up: means over intervals.
    pub beta_mean: f64,
    pub window_mean: f64,
    /// eq. (3) for this host from the PARDA hosts' mean betas and measured throughput after warm-up
    /// (`None` for an uncontrolled host).
    pub equilibrium_window: Option<f64>,
    pub iops: f64,
    pub latency_mean_ms: f64,
    pub signal_mean_ms: f64,
    /// Time from the start until the window (averaged over 2 control periods either side) stays within
    /// 10% of its final value (mean over the last tenth of the run); `None` if it never settles.
    pub convergence_s: Option<f64>,
}

/// Who an expectation is about.
#[derive(Copy, Clone, Debug)]
enum Who {
    Host(usize),
    All,
}

impl HostTotals {
    pub fn cell(&self, h: usize, i: usize) -> &HostCell {
        &self.cells[h * self.intervals + i]
    }

    fn window(&self, a: f64, b: f64) -> std::ops::Range<usize> {
        let first = (a / self.interval_s - 1e-9).ceil().max(0.0) as usize;
        let last = ((b / self.interval_s + 1e-9).floor() as usize).min(self.intervals);
        first..last.max(first)
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
    fn active(&self, a: f64, b: f64) -> (Vec<usize>, Vec<f64>, f64) {
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

    fn metric(&self, who: Who, metric: &str, a: f64, b: f64, band_pct: f64) -> f64 {
        let all: Vec<usize> = (0..self.names.len()).collect();
        let hs: &[usize] = match who {
            Who::Host(h) => std::slice::from_ref(&all[h]),
            Who::All => &all,
        };
        match metric {
            "window" => hs
                .iter()
                .filter(|&&h| matches!(who, Who::Host(_)) || self.controlled[h])
                .map(|&h| self.mean_of(h, a, b, |c| c.window))
                .sum(),
            "beta" => hs.iter().map(|&h| self.mean_of(h, a, b, |c| c.beta)).sum(),
            "iops" => hs.iter().map(|&h| self.iops(h, a, b)).sum(),
            "latency_mean_ms" => {
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
            "signal_ms" => {
                let v: Vec<f64> = hs
                    .iter()
                    .filter(|&&h| self.controlled[h])
                    .map(|&h| self.mean_of(h, a, b, |c| c.signal_ns / 1e6))
                    .collect();
                v.iter().sum::<f64>() / v.len().max(1) as f64
            }
            "convergence_s" => hs
                .iter()
                .filter(|&&h| matches!(who, Who::Host(_)) || self.controlled[h])
                .map(|&h| self.convergence(h, a, b, band_pct, 0.25).unwrap_or(f64::INFINITY))
                .fold(0.0, f64::max),
            other => unreachable!("validated host metric {other}"),
        }
    }

    fn summarise(&self, sc: &Scenario) -> HostsSummary {
        let (a, b) = (sc.warmup.as_secs_f64(), sc.duration.as_secs_f64());
        let p = sc.parda.as_ref().expect("hosts have [parda]");
        let hosts = (0..self.names.len())
            .map(|h| HostSummary {
                name: self.names[h].clone(),
                controlled: self.controlled[h],
                beta_mean: self.metric(Who::Host(h), "beta", a, b, 10.0),
                window_mean: self.metric(Who::Host(h), "window", a, b, 10.0),
                equilibrium_window: self.controlled[h].then(|| self.equilibrium_window(h, a, b)),
                iops: self.metric(Who::Host(h), "iops", a, b, 10.0),
                latency_mean_ms: self.metric(Who::Host(h), "latency_mean_ms", a, b, 10.0),
                signal_mean_ms: self.mean_of(h, a, b, |c| c.signal_ns / 1e6),
                convergence_s: self.convergence(h, 0.0, b, 10.0, 0.1),
            })
            .collect();
        HostsSummary {
            latency_threshold_ms: self.threshold_ms,
            aggregation: match p.aggregation {
                Aggregation::Cluster => "cluster".into(),
                Aggregation::Local => "local".into(),
            },
            enabled: p.enabled,
            iops: self.metric(Who::All, "iops", a, b, 10.0),
            latency_mean_ms: self.metric(Who::All, "latency_mean_ms", a, b, 10.0),
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
                    name,
                    c.window,
                    c.beta,
                    c.ios as f64 / self.interval_s,
                    lat,
                    c.signal_ns / 1e6,
                    c.estimate_ns / 1e6
                ));
            }
        }
        s
    }
}

// ----------------------------------------------------------------------------------------------------
// Expectations about hosts
// ----------------------------------------------------------------------------------------------------

/// Metrics a host expectation may name.
pub const HOST_METRICS: [&str; 6] = ["window", "beta", "iops", "latency_mean_ms", "signal_ms", "convergence_s"];

/// Validates an expectation with `host = "..."` (or `"all"`).
pub(crate) fn validate_expect(at: &str, e: &ExpectFile, hosts: &[Host]) -> Result<(), String> {
    let h = e.host.as_deref().expect("called for host expectations");
    if e.tenant.is_some() || e.server.is_some() {
        return Err(format!("{at}: name exactly one of tenant, server or host"));
    }
    if h != "all" && !hosts.iter().any(|x| x.name == h) {
        return Err(format!("{at}: unknown host {h:?}"));
    }
    if !HOST_METRICS.contains(&e.metric.as_str()) {
        return Err(format!("{at}: host metric {:?}: expected one of {}", e.metric, HOST_METRICS.join(", ")));
    }
    if let Some(r) = &e.ratio_to {
        if !hosts.iter().any(|x| &x.name == r) {
            return Err(format!("{at}: ratio_to names unknown host {r:?}"));
        }
        if h == "all" {
            return Err(format!("{at}: ratio_to compares two hosts, not \"all\""));
        }
    }
    if e.oracle {
        return Err(format!("{at}: oracle is mClock's; for hosts use equilibrium (eq. (3))"));
    }
    if e.beta_ratio && e.ratio_to.is_none() {
        return Err(format!("{at}: beta_ratio needs ratio_to"));
    }
    if e.beta_ratio && e.ratio.is_some() {
        return Err(format!("{at}: give ratio or beta_ratio, not both"));
    }
    if e.equilibrium && !matches!(e.metric.as_str(), "window" | "latency_mean_ms" | "signal_ms") {
        return Err(format!("{at}: equilibrium (eq. (3)) applies to window, latency_mean_ms and signal_ms"));
    }
    if e.threshold && !matches!(e.metric.as_str(), "latency_mean_ms" | "signal_ms") {
        return Err(format!("{at}: threshold (script-L) applies to latency_mean_ms and signal_ms"));
    }
    if e.band_pct.is_some() && e.metric != "convergence_s" {
        return Err(format!("{at}: band_pct applies to convergence_s"));
    }
    if e.metric == "convergence_s" && (e.equilibrium || e.threshold || e.uncontrolled) {
        return Err(format!("{at}: convergence_s is checked with below/above"));
    }
    crate::scenario::validate_targets(
        at,
        e,
        &[
            ("equals", e.equals.is_some()),
            ("ratio_to", e.ratio_to.is_some()),
            ("equilibrium", e.equilibrium),
            ("threshold", e.threshold),
            ("uncontrolled", e.uncontrolled),
        ],
    )
}

/// Evaluates a host expectation. `baseline` caches the no-PARDA run for `uncontrolled` targets.
pub(crate) fn check_one(
    sc: &Scenario,
    run: &RunTotals,
    e: &ExpectFile,
    baseline: &mut Option<RunTotals>,
) -> CheckResult {
    let [a, b] = e.window.unwrap_or([sc.warmup.as_secs_f64(), sc.duration.as_secs_f64()]);
    let name = e.host.as_deref().unwrap_or_default();
    let Some(ht) = &run.hosts else {
        return CheckResult {
            ok: false,
            description: format!("host {name}: the run has no hosts"),
            measured: f64::NAN,
            note: e.note.clone(),
        };
    };
    let who = match ht.names.iter().position(|n| n == name) {
        Some(h) => Who::Host(h),
        None => Who::All,
    };
    let band = e.band_pct.unwrap_or(10.0);
    let measured = ht.metric(who, &e.metric, a, b, band);
    let target: Option<(f64, String)> = if let Some(v) = e.equals {
        Some((v, format!("{v}")))
    } else if let Some(other) = &e.ratio_to {
        let o = ht.names.iter().position(|n| n == other).expect("validated");
        let r = if e.beta_ratio {
            let h = match who {
                Who::Host(h) => h,
                Who::All => unreachable!("validated"),
            };
            ht.metric(Who::Host(h), "beta", a, b, band) / ht.metric(Who::Host(o), "beta", a, b, band).max(1e-12)
        } else {
            e.ratio.unwrap_or(1.0)
        };
        let v = ht.metric(Who::Host(o), &e.metric, a, b, band) * r;
        Some((v, format!("{r:.3}{} x {other}'s = {v:.3}", if e.beta_ratio { " (beta ratio)" } else { "" })))
    } else if e.equilibrium {
        let v = match (e.metric.as_str(), who) {
            ("window", Who::Host(h)) => ht.equilibrium_window(h, a, b),
            ("window", Who::All) => ht.active(a, b).0.iter().map(|&h| ht.equilibrium_window(h, a, b)).sum(),
            _ => ht.equilibrium_latency_ms(a, b),
        };
        Some((v, format!("eq. (3)'s {v:.3}")))
    } else if e.threshold {
        Some((ht.threshold_ms, format!("script-L = {} ms", ht.threshold_ms)))
    } else if e.uncontrolled {
        let base = baseline.get_or_insert_with(|| {
            crate::run(&sc.without_parda(), &mut |_| {}).expect("the baseline of a valid scenario builds")
        });
        let v = base.hosts.as_ref().map_or(f64::NAN, |bh| bh.metric(who, &e.metric, a, b, band));
        Some((v, format!("the uncontrolled run's {v:.3}")))
    } else {
        None
    };
    let (ok, expected) = crate::check::judge(measured, target, e);
    let ok = ok && (measured.is_finite() || e.metric == "convergence_s");
    let what =
        if e.metric == "convergence_s" { format!("convergence_s (to within {band}%)") } else { e.metric.clone() };
    CheckResult {
        ok,
        description: format!("host {name}: {what} in [{a}, {b}] s = {measured:.3}, expected {expected}"),
        measured,
        note: e.note.clone(),
    }
}
