//! PARDA's validated `[parda]` and `[[hosts]]` (parda.txt §3-5; the run layer is
//! [`crate::engine`]'s host layer).
//!
//! A *host* sits between its VMs (tenants with `host = "..."`) and one server, *the array*, and runs
//! rein-core's `HostController`: VMs' requests queue in its local scheduler and the host releases them
//! while fewer than its window are outstanding; PARDA hosts adjust the window each control period from
//! the cluster's (or their own) latency. An *uncontrolled* host keeps a fixed issue queue.

use super::server::{parse_scheduler, Server};
use super::tenant::Tenant;
use crate::file::parda::{HostFile, PardaFile};
use crate::file::TenantFile;
use rein_core::parda::{check_fixed_window, HostConfig, PardaConfig, SizeModel};
use rein_core::{Nanos, SchedulerKind};

/// Largest number of hosts in a scenario.
pub const MAX_HOSTS: usize = rein_core::parda::MAX_HOSTS as usize;

/// Which latency signal the hosts use.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Aggregation {
    /// §4.2: the cluster's average latency.
    Cluster,
    /// §4.1: each host's own estimate.
    Local,
}

impl Aggregation {
    /// The name as scenario files write it.
    pub fn name(self) -> &'static str {
        match self {
            Aggregation::Cluster => "cluster",
            Aggregation::Local => "local",
        }
    }
}

/// The validated `[parda]` table.
#[derive(Debug, Clone)]
pub struct Parda {
    /// The control law every PARDA host runs (script-L, alpha, gamma, the period, window bounds, the size
    /// model), validated by rein-core.
    pub config: PardaConfig,
    /// Which latency signal the hosts use.
    pub aggregation: Aggregation,
    /// How long after a host publishes its report the others can read it (cluster aggregation; at most
    /// an hour).
    pub delay: Nanos,
    /// Hosts silent this long drop out of the cluster average (default 3 periods).
    pub timeout: Nanos,
    /// K of §3.4: a host's beta is K times the sum of its VMs' weights unless the host sets its own.
    pub beta_per_share: f64,
    /// The scheduler that divides a host's window among its VMs (sfq, mclock or fifo; never a
    /// distributed one).
    pub local_scheduler: SchedulerKind,
    /// Locality batching in the local scheduler (§3.3): batch size, 1..=1024 (1 = off).
    pub batch: u32,
    /// Locality batching: largest distance (bytes) from one request of a batch to the next (default
    /// 4 MiB).
    pub batch_distance: u64,
    /// false: every host keeps a fixed issue queue (the no-PARDA baseline of the same scenario).
    pub enabled: bool,
}

/// A validated host.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its name (unique, not empty, not `all`).
    pub name: String,
    /// Its beta as written; `None`: [`Parda::beta_per_share`] times the sum of its VMs' weights.
    pub beta: Option<f64>,
    /// Runs PARDA when PARDA is enabled (see [`Host::runs_parda`]); else a fixed issue queue.
    pub controlled: bool,
    /// The fixed issue queue (IOs) of a host that does not run PARDA (`None`: `w_max`). Only an
    /// uncontrolled host, or any host with PARDA disabled, may set it.
    pub window: Option<f64>,
    /// Multiplier on its requests' service times at the array (placement skew), in [0.001, 1000].
    pub service_scale: f64,
    /// Index of the array in `Scenario::servers`.
    pub server: usize,
    /// Indices of its VMs in `Scenario::tenants`.
    pub vms: Vec<usize>,
    /// Changes of the fixed issue queue (a host without PARDA only): (when, IOs), times strictly
    /// increasing and within the run.
    pub window_schedule: Vec<(Nanos, f64)>,
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

/// A host's `window_schedule`: only for a host that keeps a fixed issue queue; steps strictly later than
/// the one before, within the run; windows as for `window`.
fn validate_window_schedule(
    n: &str,
    f: &HostFile,
    parda: &Parda,
    duration: Nanos,
) -> Result<Vec<(Nanos, f64)>, String> {
    if f.window_schedule.is_empty() {
        return Ok(Vec::new());
    }
    if f.controlled && parda.enabled {
        return Err(format!(
            "host {n}: window_schedule changes the fixed issue queue of an uncontrolled host (controlled = false, or [parda] enabled = false); a PARDA host's window follows eq. (2)"
        ));
    }
    let end = duration.as_secs_f64();
    let mut steps: Vec<(Nanos, f64)> = Vec::with_capacity(f.window_schedule.len());
    for (k, step) in f.window_schedule.iter().enumerate() {
        let at = step.at_s;
        if !(at.is_finite() && at > 0.0 && at < end) {
            return Err(format!("host {n}: window_schedule[{k}].at_s = {at}: must be inside the run (0, {end}) s"));
        }
        let at = Nanos::from_secs_f64(at);
        if let Some(&(prev, _)) = steps.last() {
            if at <= prev {
                return Err(format!(
                    "host {n}: window_schedule[{k}].at_s = {}: steps must be in increasing time order (the one before is at {} s)",
                    step.at_s,
                    prev.as_secs_f64()
                ));
            }
        }
        check_fixed_window(step.window)
            .map_err(|e| format!("host {n}: window_schedule[{k}].window = {}: {e}", step.window))?;
        steps.push((at, step.window));
    }
    Ok(steps)
}

/// Validates `[parda]` and `[[hosts]]` and attaches each VM (tenant with `host`) to its host: a VM sends
/// only to its host's array.
pub(crate) fn validate(
    parda: Option<&PardaFile>,
    files: &[HostFile],
    tenant_files: &[TenantFile],
    tenants: &mut [Tenant],
    servers: &[Server],
    duration: Nanos,
) -> Result<(Option<Parda>, Vec<Host>), String> {
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
    super::check_unique(files.iter().map(|f| f.name.as_str()), "host")?;
    let mut hosts = Vec::with_capacity(files.len());
    let mut by_name = std::collections::BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        let n = &f.name;
        if n == "all" {
            return Err("a host may not be named \"all\" (expectations use it for the whole cluster)".into());
        }
        by_name.insert(n.as_str(), i);
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
        let window_schedule = validate_window_schedule(n, f, &parda, duration)?;
        hosts.push(Host {
            name: n.clone(),
            beta: f.beta,
            controlled: f.controlled,
            window: f.window,
            service_scale: scale,
            server,
            vms: Vec::new(),
            window_schedule,
        });
    }
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
