//! PARDA's validated `[parda]` and `[[hosts]]` (parda.txt §3-5; the run layer is
//! [`crate::engine`]'s host layer).
//!
//! A *host* sits between its VMs (tenants with `host = "..."`) and one server, *the array*, and runs
//! rein-core's `HostController`: VMs' requests queue in its local scheduler and the host releases them
//! while fewer than its window are outstanding; PARDA hosts adjust the window each control period from
//! the cluster's (or their own) latency. An *uncontrolled* host keeps a fixed issue queue.

use super::server::Server;
use super::tenant::Tenant;
use crate::file::parda::{HostFile, PardaFile};
use crate::file::TenantFile;
use rein_core::parda::{check_fixed_window, HostConfig};
use rein_core::Nanos;
use rein_core::Num;
use rein_model::parda_settings::in_range;

pub use rein_model::parda_settings::{Aggregation, Parda};

/// Largest number of hosts in a scenario.
pub const MAX_HOSTS: usize = rein_core::parda::MAX_HOSTS as usize;

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
    let parda = parda.validate().map_err(|e| e.to_string())?;
    // A host adjusts its window at the end of each period: a period longer than the run never does.
    if parda.enabled && parda.config.period > duration {
        return Err(format!(
            "parda: period_s ({} s) is longer than the run ({} s): no host would end a control period",
            Num(parda.config.period.as_secs_f64()),
            Num(duration.as_secs_f64())
        ));
    }
    if files.len() > MAX_HOSTS {
        return Err(format!("at most {MAX_HOSTS} hosts"));
    }
    super::check_unique(files.iter().map(|f| f.name.as_str()), "host").map_err(|e| e.to_string())?;
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
        // The host's local scheduler divides its window; only mClock knows reservations and limits.
        if parda.local_scheduler != rein_core::sched::SchedulerKind::Mclock
            && (tf.reservation > 0.0 || tf.limit.is_some())
        {
            return Err(format!(
                "tenant {}: a VM's reservation and limit need [parda] local_scheduler = \"mclock\"; {} divides the \
                 host's window by weight only",
                t.name,
                parda.local_scheduler.name()
            ));
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
