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
use rein_core::parda::{check_fixed_window, HostConfig, PardaError};
use rein_core::Nanos;
use rein_core::Num;
use rein_core::SchedulerKind;

pub use rein_model::parda_settings::{Aggregation, Parda, PardaSettingsError};

/// Largest number of hosts in a scenario.
pub const MAX_HOSTS: usize = rein_core::parda::MAX_HOSTS as usize;

/// The smallest `service_scale` a host may have.
pub const MIN_SERVICE_SCALE: f64 = 1e-3;
/// The largest `service_scale` a host may have.
pub const MAX_SERVICE_SCALE: f64 = 1e3;

/// What is wrong with `[parda]` or `[[hosts]]` (or a VM's `host`): the key, the value and the bound, or
/// the host or tenant and what is wrong with it. Its message names them once.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// A tenant names a host in a scenario without `[[hosts]]`.
    #[error("tenant {tenant}: host {host:?} but no [[hosts]] are defined")]
    NoHosts {
        /// The tenant.
        tenant: String,
        /// The host it names.
        host: String,
    },
    /// `[parda]` without `[[hosts]]`.
    #[error("[parda] needs [[hosts]] to control")]
    PardaWithoutHosts,
    /// `[[hosts]]` without `[parda]`.
    #[error(
        "[[hosts]] need a [parda] table (latency_threshold_ms at least; enabled = false for a baseline without \
         PARDA)"
    )]
    HostsWithoutParda,
    /// A `[parda]` setting is refused.
    #[error("{0}")]
    Parda(PardaSettingsError),
    /// PARDA's control period is longer than the run.
    #[error(
        "parda: period_s ({} s) is longer than the run ({} s): no host would end a control period",
        Num(*.period_s),
        Num(*.duration_s)
    )]
    PeriodAfterEnd {
        /// `[parda] period_s`.
        period_s: f64,
        /// The run's duration (s).
        duration_s: f64,
    },
    /// More than `max` hosts.
    #[error("at most {max} hosts")]
    TooManyHosts {
        /// [`MAX_HOSTS`].
        max: usize,
    },
    /// The hosts' names are refused.
    #[error("{0}")]
    Name(super::NameError),
    /// A host named `all`.
    #[error("a host may not be named \"all\" (expectations use it for the whole cluster)")]
    NamedAll,
    /// A host's setting is refused.
    #[error("host {host}: {fault}")]
    Host {
        /// The host.
        host: String,
        /// What is wrong with it.
        fault: HostFault,
    },
    /// A VM names a host the scenario does not have.
    #[error("tenant {tenant}: unknown host {host:?}")]
    UnknownHost {
        /// The tenant.
        tenant: String,
        /// The name given.
        host: String,
    },
    /// A VM's `servers` name other than its host's array.
    #[error("tenant {tenant}: a VM on host {host} sends only to its host's array {array:?}; drop servers")]
    VmServers {
        /// The tenant.
        tenant: String,
        /// Its host.
        host: String,
        /// The host's array.
        array: String,
    },
    /// A VM with `server_reservations` or `routing`.
    #[error("tenant {tenant}: server_reservations and routing do not apply to a VM on a host")]
    VmRouting {
        /// The tenant.
        tenant: String,
    },
    /// A VM with a reservation or limit under a local scheduler other than mClock.
    #[error(
        "tenant {tenant}: a VM's reservation and limit need [parda] local_scheduler = \"mclock\"; {} divides the \
         host's window by weight only",
        .scheduler.name()
    )]
    VmReservation {
        /// The tenant.
        tenant: String,
        /// The local scheduler.
        scheduler: SchedulerKind,
    },
}

/// What is wrong with a `[[hosts]]` entry ([`HostsError::Host`] names the host).
#[derive(Debug, thiserror::Error)]
pub enum HostFault {
    /// `server` names a server the scenario does not have.
    #[error("unknown server {server:?}")]
    UnknownServer {
        /// The name given.
        server: String,
    },
    /// No `server` in a scenario of several servers.
    #[error("name its array with server = \"...\" (the scenario has several servers)")]
    NoServer,
    /// rein-core refuses the host's beta or window.
    #[error("{0}")]
    Config(PardaError),
    /// `window` on a host that runs PARDA.
    #[error(
        "window is the fixed issue queue of an uncontrolled host; a PARDA host's window is bounded by [parda] \
         w_min / w_max"
    )]
    WindowOnParda,
    /// `service_scale` outside [min, max].
    #[error("service_scale must be between {min} and {max}, got {}", Num(*.got))]
    ServiceScale {
        /// [`MIN_SERVICE_SCALE`].
        min: f64,
        /// [`MAX_SERVICE_SCALE`].
        max: f64,
        /// The value given.
        got: f64,
    },
    /// `window_schedule` on a host that runs PARDA.
    #[error(
        "window_schedule changes the fixed issue queue of an uncontrolled host (controlled = false, or [parda] \
         enabled = false); a PARDA host's window follows eq. (2)"
    )]
    ScheduleOnParda,
    /// A `window_schedule` step outside the run.
    #[error("window_schedule[{step}].at_s = {at_s}: must be inside the run (0, {end_s}) s")]
    StepOutside {
        /// The step's index.
        step: usize,
        /// When it is (s).
        at_s: f64,
        /// The run's end (s).
        end_s: f64,
    },
    /// A `window_schedule` step not after the one before.
    #[error(
        "window_schedule[{step}].at_s = {at_s}: steps must be in increasing time order (the one before is at \
         {previous_s} s)"
    )]
    StepOrder {
        /// The step's index.
        step: usize,
        /// When it is (s).
        at_s: f64,
        /// When the step before is (s).
        previous_s: f64,
    },
    /// A `window_schedule` step's window is refused.
    #[error("window_schedule[{step}].window = {window}: {error}")]
    StepWindow {
        /// The step's index.
        step: usize,
        /// The window given.
        window: f64,
        /// Why rein-core refuses it.
        error: PardaError,
    },
    /// No VM names the host.
    #[error("no tenants name it (give VMs host = {host:?})")]
    NoVms {
        /// The host (named again in the hint).
        host: String,
    },
}

/// `fault` of host `host`.
fn host_error(host: &str, fault: HostFault) -> HostsError {
    HostsError::Host { host: host.to_string(), fault }
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

/// A host's `window_schedule`: only for a host that keeps a fixed issue queue; steps strictly later than
/// the one before, within the run; windows as for `window`.
fn validate_window_schedule(f: &HostFile, parda: &Parda, duration: Nanos) -> Result<Vec<(Nanos, f64)>, HostFault> {
    if f.window_schedule.is_empty() {
        return Ok(Vec::new());
    }
    if f.controlled && parda.enabled {
        return Err(HostFault::ScheduleOnParda);
    }
    let end = duration.as_secs_f64();
    let mut steps: Vec<(Nanos, f64)> = Vec::with_capacity(f.window_schedule.len());
    for (k, step) in f.window_schedule.iter().enumerate() {
        let at = step.at_s;
        if !(at.is_finite() && at > 0.0 && at < end) {
            return Err(HostFault::StepOutside { step: k, at_s: at, end_s: end });
        }
        let at = Nanos::from_secs_f64(at);
        if let Some(&(prev, _)) = steps.last() {
            if at <= prev {
                return Err(HostFault::StepOrder { step: k, at_s: step.at_s, previous_s: prev.as_secs_f64() });
            }
        }
        check_fixed_window(step.window).map_err(|error| HostFault::StepWindow {
            step: k,
            window: step.window,
            error,
        })?;
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
) -> Result<(Option<Parda>, Vec<Host>), HostsError> {
    if files.is_empty() {
        if let Some(t) = tenant_files.iter().find(|t| t.host.is_some()) {
            let host = t.host.clone().unwrap_or_default();
            return Err(HostsError::NoHosts { tenant: t.name.clone(), host });
        }
        if parda.is_some() {
            return Err(HostsError::PardaWithoutHosts);
        }
        return Ok((None, Vec::new()));
    }
    let parda = parda.ok_or(HostsError::HostsWithoutParda)?;
    let parda = parda.validate().map_err(HostsError::Parda)?;
    // A host adjusts its window at the end of each period: a period longer than the run never does.
    if parda.enabled && parda.config.period > duration {
        return Err(HostsError::PeriodAfterEnd {
            period_s: parda.config.period.as_secs_f64(),
            duration_s: duration.as_secs_f64(),
        });
    }
    if files.len() > MAX_HOSTS {
        return Err(HostsError::TooManyHosts { max: MAX_HOSTS });
    }
    super::check_unique(files.iter().map(|f| f.name.as_str()), "host").map_err(HostsError::Name)?;
    let mut hosts = Vec::with_capacity(files.len());
    let mut by_name = std::collections::BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        let n = &f.name;
        if n == "all" {
            return Err(HostsError::NamedAll);
        }
        let err = |fault: HostFault| host_error(n, fault);
        by_name.insert(n.as_str(), i);
        let server = match &f.server {
            Some(s) => {
                let server = servers.iter().position(|x| &x.name == s);
                server.ok_or_else(|| err(HostFault::UnknownServer { server: s.clone() }))?
            }
            None if servers.len() == 1 => 0,
            None => return Err(err(HostFault::NoServer)),
        };
        let hc = HostConfig {
            id: i as u32,
            beta: f.beta,
            beta_per_share: parda.beta_per_share,
            fixed_window: f.window,
            ..HostConfig::default()
        };
        hc.validate().map_err(|e| err(HostFault::Config(e)))?;
        if f.window.is_some() && f.controlled && parda.enabled {
            return Err(err(HostFault::WindowOnParda));
        }
        let scale = f.service_scale;
        if !(scale.is_finite() && (MIN_SERVICE_SCALE..=MAX_SERVICE_SCALE).contains(&scale)) {
            let fault = HostFault::ServiceScale { min: MIN_SERVICE_SCALE, max: MAX_SERVICE_SCALE, got: scale };
            return Err(err(fault));
        }
        let window_schedule = validate_window_schedule(f, &parda, duration).map_err(err)?;
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
        let h = *by_name
            .get(hn.as_str())
            .ok_or_else(|| HostsError::UnknownHost { tenant: t.name.clone(), host: hn.clone() })?;
        let server = hosts[h].server;
        if let Some(list) = &tf.servers {
            if list.len() != 1 || list[0] != servers[server].name {
                return Err(HostsError::VmServers {
                    tenant: t.name.clone(),
                    host: hn.clone(),
                    array: servers[server].name.clone(),
                });
            }
        }
        if !tf.server_reservations.is_empty() || tf.routing.is_some() {
            return Err(HostsError::VmRouting { tenant: t.name.clone() });
        }
        // The host's local scheduler divides its window; only mClock knows reservations and limits.
        if parda.local_scheduler != rein_core::sched::SchedulerKind::Mclock
            && (tf.reservation > 0.0 || tf.limit.is_some())
        {
            return Err(HostsError::VmReservation { tenant: t.name.clone(), scheduler: parda.local_scheduler });
        }
        t.servers = vec![server];
        t.server_specs = vec![t.spec];
        t.host = Some(h);
        hosts[h].vms.push(ti);
    }
    if let Some(h) = hosts.iter().find(|h| h.vms.is_empty()) {
        return Err(host_error(&h.name, HostFault::NoVms { host: h.name.clone() }));
    }
    Ok((Some(parda), hosts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelError, NameError, Scenario, ScenarioError};

    const BASE: &str = "name = \"p\"\nduration_s = 150\n[parda]\nlatency_threshold_ms = 30\n[[servers]]\nname = \
                        \"array\"\ncapacity_iops = 2000\n[[hosts]]\nname = \"h1\"\nbeta = 1\n[[hosts]]\nname = \
                        \"h2\"\nbeta = 2\n[[tenants]]\nname = \"vm1\"\nhost = \"h1\"\n[tenants.workload]\nkind = \
                        \"closed\"\n[[tenants]]\nname = \"vm2\"\nhost = \"h2\"\n[tenants.workload]\nkind = \"closed\"\n";

    /// The error of `BASE` with `from` replaced by `to`.
    fn refused(from: &str, to: &str) -> HostsError {
        assert!(BASE.contains(from), "{from}");
        match Scenario::from_toml(&BASE.replacen(from, to, 1), None).unwrap_err() {
            ScenarioError::Invalid { error: ModelError::Parda(e), .. } => *e,
            e => panic!("not a [parda] or [[hosts]] error: {e}"),
        }
    }

    #[test]
    fn errors_are_typed_with_the_host_key_and_value() {
        assert!(Scenario::from_toml(BASE, None).is_ok());
        let e = refused("beta = 1", "beta = 1\nservice_scale = 2000");
        assert!(
            matches!(&e, HostsError::Host { host, fault: HostFault::ServiceScale { got, .. } } if host == "h1" && *got == 2000.0),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "host h1: service_scale must be between 0.001 and 1000, got 2000");
        let e = refused(
            "beta = 2",
            "beta = 2\ncontrolled = false\nwindow_schedule = [{ at_s = 5, window = 4 }, { at_s = 5, window = 8 }]",
        );
        assert!(
            matches!(&e, HostsError::Host { host, fault: HostFault::StepOrder { step: 1, at_s, previous_s } }
                if host == "h2" && *at_s == 5.0 && *previous_s == 5.0),
            "{e:?}"
        );
        let e = refused("host = \"h2\"", "host = \"h3\"");
        assert!(matches!(&e, HostsError::UnknownHost { tenant, host } if tenant == "vm2" && host == "h3"), "{e:?}");
        let e = refused("name = \"h2\"", "name = \"h1\"");
        assert!(matches!(&e, HostsError::Name(NameError::Repeated { what: "host", name }) if name == "h1"), "{e:?}");
        let e = refused("name = \"h2\"", "name = \"all\"");
        assert!(matches!(e, HostsError::NamedAll), "{e:?}");
        let e = refused("latency_threshold_ms = 30", "latency_threshold_ms = 30\nperiod_s = 5000");
        assert!(
            matches!(
                e,
                HostsError::Parda(PardaSettingsError::Range { key: "period_s", min: 0.001, max: 3600.0, got: 5000.0 })
            ),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "parda: period_s must be between 0.001 and 3600, got 5000");
        let e = refused("latency_threshold_ms = 30", "latency_threshold_ms = 30\nperiod_s = 200");
        assert!(matches!(e, HostsError::PeriodAfterEnd { period_s: 200.0, duration_s: 150.0 }), "{e:?}");
        let e = refused("host = \"h1\"", "host = \"h1\"\nrouting = \"stripe\"");
        assert!(matches!(&e, HostsError::VmRouting { tenant } if tenant == "vm1"), "{e:?}");
    }
}
