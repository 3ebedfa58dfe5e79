//! A validated tenant: a QoS spec (per server where RBFQ's local minimum differs), routing over its
//! servers, and a workload (from rein-model).

use super::server::Server;
use crate::file::{RoutingFile, TenantFile};
use rein_core::sched::dmclock::{DEFAULT_SPREAD_WINDOW_IOS, MAX_SPREAD_WINDOW_IOS};
use rein_core::{Nanos, Num, QosSpec, ReservationSplit, SchedulerKind, SpecError};
use rein_model::workload::{KindName, TraceCache, WorkloadError, WorkloadSpec};
use rein_model::Routing;
use std::fmt;
use std::path::Path;

/// A `[[tenants]]` entry that is refused: the tenant, and what is wrong ([`TenantFault`]). Its message
/// is `tenant NAME: ...` (`tenant NAME on SERVER: ...` for a per-server spec).
#[derive(Debug)]
pub struct TenantError {
    /// The tenant's name.
    pub tenant: String,
    /// What is wrong with it.
    pub fault: TenantFault,
}

impl fmt::Display for TenantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.fault {
            TenantFault::ServerSpec { server, error } => write!(f, "tenant {} on {server}: {error}", self.tenant),
            fault => write!(f, "tenant {}: {fault}", self.tenant),
        }
    }
}

impl std::error::Error for TenantError {}

/// What is wrong with a `[[tenants]]` entry ([`TenantError`] names the tenant).
#[derive(Debug, thiserror::Error)]
pub enum TenantFault {
    /// Its reservation, limit, weight or idle credit is refused.
    #[error("{0}")]
    Spec(SpecError),
    /// `servers` names a server the scenario does not have.
    #[error("unknown server {server:?}")]
    UnknownServer {
        /// The name given.
        server: String,
    },
    /// `servers` names a server twice.
    #[error("server {server:?} listed twice")]
    ServerTwice {
        /// The name.
        server: String,
    },
    /// `servers = []`.
    #[error("servers must not be empty")]
    NoServers,
    /// `server_reservations` names a server the scenario does not have.
    #[error("server_reservations names unknown server {server:?}")]
    ReservationUnknownServer {
        /// The name given.
        server: String,
    },
    /// `routing.shares` names a server the scenario does not have.
    #[error("routing share for unknown server {server:?}")]
    ShareUnknownServer {
        /// The name given.
        server: String,
    },
    /// `routing.devices` names a server the scenario does not have.
    #[error("routing.devices names unknown server {server:?}")]
    DevicesUnknownServer {
        /// The name given.
        server: String,
    },
    /// `server_reservations`, `routing.shares` or `routing.devices` names a server of the scenario that
    /// the tenant's `servers` leave out.
    #[error("{key} for {server:?}, which the tenant does not use")]
    UnusedServer {
        /// The key, as the message names it (`server_reservations`, `routing share`, `routing.devices`).
        key: &'static str,
        /// The server.
        server: String,
    },
    /// A `server_reservations` entry above the tenant's limit.
    #[error(
        "server_reservations for {server:?} ({}) is above the tenant's limit ({}): the server could not give it \
         without passing the limit",
        Num(*.reservation),
        Num(*.limit)
    )]
    ReservationAboveLimit {
        /// The server.
        server: String,
        /// The reservation given for it (IOPS).
        reservation: f64,
        /// The tenant's limit (IOPS).
        limit: f64,
    },
    /// The spec a `server_reservations` entry makes is refused.
    #[error("{error}")]
    ServerSpec {
        /// The server.
        server: String,
        /// What is wrong with the spec.
        error: SpecError,
    },
    /// `routing` is a word other than `stripe`.
    #[error(
        "routing {got:?}: expected \"stripe\", {{ stripe_kb = .. }}, {{ shares = {{ .. }} }} or {{ devices = {{ .. }} }}"
    )]
    Routing {
        /// The word given.
        got: String,
    },
    /// `routing.stripe_kb` is not a positive number.
    #[error("stripe_kb must be a positive number, got {}", Num(*.got))]
    StripeKb {
        /// The value given.
        got: f64,
    },
    /// `routing.stripe_kb` comes to less than a byte.
    #[error("stripe_kb {got} is less than one byte")]
    StripeBelowByte {
        /// The value given.
        got: f64,
    },
    /// A `routing.shares` entry that is negative or not a number.
    #[error("routing share for {server:?} must be non-negative")]
    ShareNegative {
        /// The server.
        server: String,
    },
    /// Every `routing.shares` entry is 0.
    #[error("routing shares must not all be zero")]
    SharesZero,
    /// `routing.shares` sum to infinity.
    #[error(
        "routing shares sum to {} (they are divided by their sum): give smaller shares, e.g. fractions",
        Num(*.sum)
    )]
    SharesInfinite {
        /// Their sum.
        sum: f64,
    },
    /// `routing.devices` with a workload other than a trace.
    #[error("routing.devices routes trace records; the workload is {workload:?}")]
    DevicesNotTrace {
        /// The workload's kind as written.
        workload: String,
    },
    /// `routing.devices` maps one trace device to two servers (or twice to one).
    #[error("routing.devices maps trace device {device} twice")]
    DeviceTwice {
        /// The trace device.
        device: u32,
    },
    /// `routing.devices` maps no device.
    #[error("routing.devices maps no device")]
    DevicesEmpty,
    /// `trace.device` or `trace.devices` with `routing.devices`.
    #[error("trace.device/trace.devices with routing.devices: the routing already says which devices to keep")]
    TraceDevicesWithRouting,
    /// Both `trace.device` and `trace.devices`.
    #[error("trace.device and trace.devices are exclusive; give one")]
    TraceDeviceAndDevices,
    /// `trace.devices = []`.
    #[error("trace.devices must not be empty")]
    TraceDevicesEmpty,
    /// `trace.devices` lists a device twice.
    #[error("trace.devices lists device {device} twice")]
    TraceDeviceTwice {
        /// The trace device.
        device: u32,
    },
    /// The workload is refused (boxed: the largest of these faults, which a scenario's every error
    /// would carry).
    #[error("{0}")]
    Workload(Box<WorkloadError>),
    /// `spread_window_ios` outside `1..=max`.
    #[error("spread_window_ios must be in 1..={max}, got {got}")]
    SpreadWindow {
        /// The largest window accepted ([`MAX_SPREAD_WINDOW_IOS`]).
        max: u32,
        /// The value given.
        got: u32,
    },
    /// `spread_window_ios` with `reservation_split = "rho"`.
    #[error("spread_window_ios applies to reservation_split = \"spread\" only")]
    SpreadWindowWithRho,
    /// `reservation_split` is neither `spread` nor `rho`.
    #[error("reservation_split {got:?}: expected \"spread\" or \"rho\"")]
    ReservationSplit {
        /// The word given.
        got: String,
    },
    /// `reservation_split` or `spread_window_ios` on a tenant none of whose servers is distributed.
    #[error(
        "{key} applies to a tenant of dmclock or rbfq servers (the delta/rho its client sends); its servers \
         run {}",
        .scheduler.name()
    )]
    SplitNotDistributed {
        /// `reservation_split` or `spread_window_ios`.
        key: &'static str,
        /// The scheduler of the tenant's first server.
        scheduler: SchedulerKind,
    },
}

/// A tenant of the scenario.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    /// Its QoS spec.
    pub spec: QosSpec,
    /// Indices into `Scenario::servers`.
    pub servers: Vec<usize>,
    /// Spec per entry of `servers` (differs from `spec` only where `server_reservations` says so).
    pub server_specs: Vec<QosSpec>,
    /// How requests pick a server of `servers`.
    pub routing: Routing,
    /// When and what it issues.
    pub workload: WorkloadSpec,
    /// Index into `Scenario::hosts` for a VM on a PARDA host.
    pub host: Option<usize>,
    /// How its gateway's tracker splits the reservation over its servers (distributed schedulers).
    pub reservation_split: ReservationSplit,
    /// Its random stream (rein-model's `seed::stream_seed`): its index in the file, kept when the
    /// scenario is cut into groups ([`crate::Scenario::part`]), so a group run alone draws what it draws
    /// in the whole run.
    pub stream: u64,
}

/// Validates a `[[tenants]]` entry against the servers; trace paths resolve against `base`, and a trace
/// is loaded through `traces` (shared with the scenario's other tenants that name it).
pub(crate) fn validate_tenant(
    index: usize,
    t: &TenantFile,
    servers: &[Server],
    base: Option<&Path>,
    duration: Nanos,
    traces: &mut TraceCache,
) -> Result<Tenant, TenantError> {
    let n = &t.name;
    let err = |fault: TenantFault| TenantError { tenant: n.clone(), fault };
    let spec = QosSpec::new(t.reservation, t.limit, t.weight, t.idle_credit).map_err(|e| err(TenantFault::Spec(e)))?;
    let find = |s: &str, unknown: fn(String) -> TenantFault| -> Result<usize, TenantError> {
        servers.iter().position(|x| x.name == s).ok_or_else(|| err(unknown(s.to_string())))
    };
    let unused = |key: &'static str, s: &str| err(TenantFault::UnusedServer { key, server: s.to_string() });
    let idx: Vec<usize> = match &t.servers {
        None => (0..servers.len()).collect(),
        Some(names) => {
            let mut v = Vec::new();
            for s in names {
                let i = find(s, |server| TenantFault::UnknownServer { server })?;
                if v.contains(&i) {
                    return Err(err(TenantFault::ServerTwice { server: s.clone() }));
                }
                v.push(i);
            }
            if v.is_empty() {
                return Err(err(TenantFault::NoServers));
            }
            v
        }
    };
    let mut server_specs = vec![spec; idx.len()];
    for (s, &r) in &t.server_reservations {
        let i = find(s, |server| TenantFault::ReservationUnknownServer { server })?;
        let k = idx.iter().position(|&x| x == i).ok_or_else(|| unused("server_reservations", s))?;
        // A minimum above the tenant's limit cannot be met within it: raising the limit to it (as this did)
        // ran a tenant the file does not describe.
        if let Some(l) = spec.limit().filter(|&l| r > l) {
            return Err(err(TenantFault::ReservationAboveLimit { server: s.clone(), reservation: r, limit: l }));
        }
        server_specs[k] = QosSpec::new(r, spec.limit(), spec.weight(), spec.idle_credit())
            .map_err(|error| err(TenantFault::ServerSpec { server: s.clone(), error }))?;
    }
    let routing = match &t.routing {
        None => Routing::default(),
        Some(RoutingFile::Name(s)) if s == "stripe" => Routing::default(),
        Some(RoutingFile::Name(s)) => return Err(err(TenantFault::Routing { got: s.clone() })),
        Some(RoutingFile::Stripe { stripe_kb }) => {
            if !(stripe_kb.is_finite() && *stripe_kb > 0.0) {
                return Err(err(TenantFault::StripeKb { got: *stripe_kb }));
            }
            let bytes = (stripe_kb * 1024.0) as u64;
            if bytes == 0 {
                return Err(err(TenantFault::StripeBelowByte { got: *stripe_kb }));
            }
            Routing::Stripe { stripe_bytes: bytes }
        }
        Some(RoutingFile::Shares { shares }) => {
            let mut v = vec![0.0; idx.len()];
            for (s, &w) in shares {
                let i = find(s, |server| TenantFault::ShareUnknownServer { server })?;
                let k = idx.iter().position(|&x| x == i).ok_or_else(|| unused("routing share", s))?;
                if !(w.is_finite() && w >= 0.0) {
                    return Err(err(TenantFault::ShareNegative { server: s.clone() }));
                }
                v[k] = w;
            }
            let sum = v.iter().sum::<f64>();
            if sum <= 0.0 {
                return Err(err(TenantFault::SharesZero));
            }
            // Shares are divided by their sum: an infinite one made every share 0, and all the requests
            // went to the last server.
            if !sum.is_finite() {
                return Err(err(TenantFault::SharesInfinite { sum }));
            }
            Routing::Shares(v)
        }
        Some(RoutingFile::Devices { devices }) => {
            if KindName::parse(&t.workload.kind) != Some(KindName::Trace) {
                return Err(err(TenantFault::DevicesNotTrace { workload: t.workload.kind.clone() }));
            }
            let mut map = Vec::new();
            for (s, list) in devices {
                let i = find(s, |server| TenantFault::DevicesUnknownServer { server })?;
                let k = idx.iter().position(|&x| x == i).ok_or_else(|| unused("routing.devices", s))?;
                for &d in list {
                    if map.iter().any(|&(x, _)| x == d) {
                        return Err(err(TenantFault::DeviceTwice { device: d }));
                    }
                    map.push((d, k));
                }
            }
            if map.is_empty() {
                return Err(err(TenantFault::DevicesEmpty));
            }
            Routing::Device(map)
        }
    };
    let devices = trace_devices(t).map_err(err)?;
    let workload = t
        .workload
        .validate_shared(duration, base, &devices, traces)
        .map_err(|e| err(TenantFault::Workload(Box::new(e))))?;
    let reservation_split = reservation_split(t).map_err(err)?;
    // How a client splits its reservation over servers is carried by dmClock's and RBFQ's delta/rho: under
    // any other scheduler it would be ignored.
    if (t.reservation_split.is_some() || t.spread_window_ios.is_some()) && !idx.iter().any(|&i| servers[i].distributed)
    {
        let key = if t.reservation_split.is_some() { "reservation_split" } else { "spread_window_ios" };
        return Err(err(TenantFault::SplitNotDistributed { key, scheduler: servers[idx[0]].scheduler }));
    }
    Ok(Tenant {
        name: n.clone(),
        spec,
        servers: idx,
        server_specs,
        routing,
        workload,
        host: None,
        reservation_split,
        stream: index as u64,
    })
}

/// `reservation_split` and `spread_window_ios`.
fn reservation_split(t: &TenantFile) -> Result<ReservationSplit, TenantFault> {
    let window = t.spread_window_ios.unwrap_or(DEFAULT_SPREAD_WINDOW_IOS);
    if !(1..=MAX_SPREAD_WINDOW_IOS).contains(&window) {
        return Err(TenantFault::SpreadWindow { max: MAX_SPREAD_WINDOW_IOS, got: window });
    }
    match t.reservation_split.as_deref() {
        None | Some("spread") => Ok(ReservationSplit::Spread { window_ios: window }),
        Some("rho") if t.spread_window_ios.is_none() => Ok(ReservationSplit::Rho),
        Some("rho") => Err(TenantFault::SpreadWindowWithRho),
        Some(other) => Err(TenantFault::ReservationSplit { got: other.to_string() }),
    }
}

/// The trace's device filter: `device = d`, `devices = [..]` or the devices `routing.devices` maps (one
/// of the three; no repeats).
fn trace_devices(t: &TenantFile) -> Result<Vec<u32>, TenantFault> {
    let Some(tr) = &t.workload.trace else { return Ok(Vec::new()) };
    if let Some(RoutingFile::Devices { devices }) = &t.routing {
        if tr.device.is_some() || tr.devices.is_some() {
            return Err(TenantFault::TraceDevicesWithRouting);
        }
        return Ok(devices.values().flatten().copied().collect());
    }
    match (tr.device, &tr.devices) {
        (Some(_), Some(_)) => Err(TenantFault::TraceDeviceAndDevices),
        (Some(d), None) => Ok(vec![d]),
        (None, Some(v)) => {
            if v.is_empty() {
                return Err(TenantFault::TraceDevicesEmpty);
            }
            if let Some(d) = v.iter().enumerate().find_map(|(k, d)| v[..k].contains(d).then_some(d)) {
                return Err(TenantFault::TraceDeviceTwice { device: *d });
            }
            Ok(v.clone())
        }
        (None, None) => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::ScenarioFile;
    use rein_model::sched_settings::SchedSettingsFile;

    /// The error of tenant `x` (`lines` after its name) on servers `a` (mclock) and `b` (dmclock).
    fn refused(lines: &str) -> TenantError {
        let text = format!(
            "name = \"t\"\nduration_s = 1\n[[servers]]\nname = \"a\"\ncapacity_iops = 100\n[[servers]]\nname = \
             \"b\"\ncapacity_iops = 100\nscheduler = \"dmclock\"\n[[tenants]]\nname = \"x\"\n{lines}\n"
        );
        let file = ScenarioFile::parse(&text).unwrap();
        let settings = SchedSettingsFile::default();
        let servers: Vec<Server> = file
            .servers
            .iter()
            .enumerate()
            .map(|(i, s)| super::super::server::validate_server(i, s, &"mclock".parse().unwrap(), &settings).unwrap())
            .collect();
        let tenant = &file.tenants[0];
        validate_tenant(0, tenant, &servers, None, Nanos::from_secs(1), &mut TraceCache::new()).unwrap_err()
    }

    #[test]
    fn errors_are_typed_with_the_tenant_server_and_value() {
        let closed = "[tenants.workload]\nkind = \"closed\"";
        let e = refused(&format!("servers = [\"a\", \"c\"]\n{closed}"));
        assert!(matches!(&e.fault, TenantFault::UnknownServer { server } if server == "c"), "{e:?}");
        assert_eq!((e.tenant.as_str(), e.to_string().as_str()), ("x", "tenant x: unknown server \"c\""));
        let e = refused(&format!("servers = [\"a\"]\nserver_reservations = {{ b = 5 }}\n{closed}"));
        assert!(
            matches!(&e.fault, TenantFault::UnusedServer { key: "server_reservations", server } if server == "b"),
            "{e:?}"
        );
        let e = refused(&format!("limit = 10\nserver_reservations = {{ b = 20 }}\n{closed}"));
        assert!(
            matches!(&e.fault, TenantFault::ReservationAboveLimit { server, reservation, limit }
                if server == "b" && *reservation == 20.0 && *limit == 10.0),
            "{e:?}"
        );
        let e = refused(&format!("weight = 0\n{closed}"));
        assert!(matches!(e.fault, TenantFault::Spec(_)), "{e:?}");
        let e = refused(&format!("routing = {{ shares = {{ a = 0, b = 0 }} }}\n{closed}"));
        assert!(matches!(e.fault, TenantFault::SharesZero), "{e:?}");
        let e = refused(&format!("routing = {{ stripe_kb = -1 }}\n{closed}"));
        assert!(matches!(e.fault, TenantFault::StripeKb { got } if got == -1.0), "{e:?}");
        let e = refused(&format!("spread_window_ios = 0\n{closed}"));
        assert!(matches!(e.fault, TenantFault::SpreadWindow { max: MAX_SPREAD_WINDOW_IOS, got: 0 }), "{e:?}");
        let e = refused(&format!("servers = [\"a\"]\nreservation_split = \"rho\"\n{closed}"));
        assert!(
            matches!(
                e.fault,
                TenantFault::SplitNotDistributed { key: "reservation_split", scheduler: SchedulerKind::Mclock }
            ),
            "{e:?}"
        );
        assert!(e.to_string().ends_with("its servers run mclock"), "{e}");
        // Only a trace routes by device: a kind cased otherwise is not one, and is named as written.
        let e = refused("routing = { devices = { a = [0] } }\n[tenants.workload]\nkind = \"Trace\"");
        assert!(matches!(&e.fault, TenantFault::DevicesNotTrace { workload } if workload == "Trace"), "{e:?}");
        assert!(e.to_string().ends_with("routing.devices routes trace records; the workload is \"Trace\""), "{e}");
    }

    #[test]
    fn a_per_server_spec_names_the_server_after_the_tenant() {
        // A reservation that makes the spec invalid only at `b` (reservation above the limit is caught first,
        // so a NaN one).
        let e = refused("server_reservations = { b = nan }\n[tenants.workload]\nkind = \"closed\"");
        assert!(matches!(&e.fault, TenantFault::ServerSpec { server, .. } if server == "b"), "{e:?}");
        assert!(e.to_string().starts_with("tenant x on b: "), "{e}");
    }
}
