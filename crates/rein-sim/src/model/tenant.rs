//! A validated tenant: a QoS spec (per server where RBFQ's local minimum differs), routing over its
//! servers, and a workload (from rein-model).

use super::server::Server;
use crate::file::{RoutingFile, TenantFile};
use rein_core::sched::dmclock::{DEFAULT_SPREAD_WINDOW_IOS, MAX_SPREAD_WINDOW_IOS};
use rein_core::{Nanos, Num, QosSpec, ReservationSplit};
use rein_model::workload::{TraceCache, WorkloadSpec};
use rein_model::Routing;
use std::path::Path;

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

fn positive(what: &str, v: f64) -> Result<f64, String> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("{what} must be a positive number, got {}", Num(v)))
    }
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
) -> Result<Tenant, String> {
    let n = &t.name;
    let spec = QosSpec::new(t.reservation, t.limit, t.weight, t.idle_credit).map_err(|e| format!("tenant {n}: {e}"))?;
    let find = |s: &str, what: &str| -> Result<usize, String> {
        servers.iter().position(|x| x.name == s).ok_or_else(|| format!("tenant {n}: {what} {s:?}"))
    };
    let idx: Vec<usize> = match &t.servers {
        None => (0..servers.len()).collect(),
        Some(names) => {
            let mut v = Vec::new();
            for s in names {
                let i = find(s, "unknown server")?;
                if v.contains(&i) {
                    return Err(format!("tenant {n}: server {s:?} listed twice"));
                }
                v.push(i);
            }
            if v.is_empty() {
                return Err(format!("tenant {n}: servers must not be empty"));
            }
            v
        }
    };
    let mut server_specs = vec![spec; idx.len()];
    for (s, &r) in &t.server_reservations {
        let i = find(s, "server_reservations names unknown server")?;
        let k = idx
            .iter()
            .position(|&x| x == i)
            .ok_or_else(|| format!("tenant {n}: server_reservations for {s:?}, which the tenant does not use"))?;
        // A minimum above the tenant's limit cannot be met within it: raising the limit to it (as this did)
        // ran a tenant the file does not describe.
        if let Some(l) = spec.limit().filter(|&l| r > l) {
            return Err(format!(
                "tenant {n}: server_reservations for {s:?} ({}) is above the tenant's limit ({}): the server could \
                 not give it without passing the limit",
                Num(r),
                Num(l)
            ));
        }
        server_specs[k] = QosSpec::new(r, spec.limit(), spec.weight(), spec.idle_credit())
            .map_err(|e| format!("tenant {n} on {s}: {e}"))?;
    }
    let routing = match &t.routing {
        None => Routing::default(),
        Some(RoutingFile::Name(s)) if s == "stripe" => Routing::default(),
        Some(RoutingFile::Name(s)) => {
            return Err(format!(
                "tenant {n}: routing {s:?}: expected \"stripe\", {{ stripe_kb = .. }}, {{ shares = {{ .. }} }} or {{ devices = {{ .. }} }}"
            ))
        }
        Some(RoutingFile::Stripe { stripe_kb }) => {
            let bytes = (positive(&format!("tenant {n}: stripe_kb"), *stripe_kb)? * 1024.0) as u64;
            if bytes == 0 {
                return Err(format!("tenant {n}: stripe_kb {stripe_kb} is less than one byte"));
            }
            Routing::Stripe { stripe_bytes: bytes }
        }
        Some(RoutingFile::Shares { shares }) => {
            let mut v = vec![0.0; idx.len()];
            for (s, &w) in shares {
                let i = find(s, "routing share for unknown server")?;
                let k = idx
                    .iter()
                    .position(|&x| x == i)
                    .ok_or_else(|| format!("tenant {n}: routing share for {s:?}, which the tenant does not use"))?;
                if !(w.is_finite() && w >= 0.0) {
                    return Err(format!("tenant {n}: routing share for {s:?} must be non-negative"));
                }
                v[k] = w;
            }
            let sum = v.iter().sum::<f64>();
            if sum <= 0.0 {
                return Err(format!("tenant {n}: routing shares must not all be zero"));
            }
            // Shares are divided by their sum: an infinite one made every share 0, and all the requests
            // went to the last server.
            if !sum.is_finite() {
                return Err(format!(
                    "tenant {n}: routing shares sum to {} (they are divided by their sum): give smaller shares, \
                     e.g. fractions",
                    Num(sum)
                ));
            }
            Routing::Shares(v)
        }
        Some(RoutingFile::Devices { devices }) => {
            if t.workload.kind != "trace" {
                return Err(format!("tenant {n}: routing.devices routes trace records; the workload is {:?}", t.workload.kind));
            }
            let mut map = Vec::new();
            for (s, list) in devices {
                let i = find(s, "routing.devices names unknown server")?;
                let k = idx
                    .iter()
                    .position(|&x| x == i)
                    .ok_or_else(|| format!("tenant {n}: routing.devices for {s:?}, which the tenant does not use"))?;
                for &d in list {
                    if map.iter().any(|&(x, _)| x == d) {
                        return Err(format!("tenant {n}: routing.devices maps trace device {d} twice"));
                    }
                    map.push((d, k));
                }
            }
            if map.is_empty() {
                return Err(format!("tenant {n}: routing.devices maps no device"));
            }
            Routing::Device(map)
        }
    };
    let devices = trace_devices(t)?;
    let workload =
        t.workload.validate_shared(duration, base, &devices, traces).map_err(|e| format!("tenant {n}: {e}"))?;
    let reservation_split = reservation_split(t).map_err(|e| format!("tenant {n}: {e}"))?;
    // How a client splits its reservation over servers is carried by dmClock's and RBFQ's delta/rho: under
    // any other scheduler it would be ignored.
    if (t.reservation_split.is_some() || t.spread_window_ios.is_some()) && !idx.iter().any(|&i| servers[i].distributed)
    {
        let field = if t.reservation_split.is_some() { "reservation_split" } else { "spread_window_ios" };
        return Err(format!(
            "tenant {n}: {field} applies to a tenant of dmclock or rbfq servers (the delta/rho its client \
             sends); its servers run {}",
            servers[idx[0]].scheduler.name()
        ));
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
fn reservation_split(t: &TenantFile) -> Result<ReservationSplit, String> {
    let window = t.spread_window_ios.unwrap_or(DEFAULT_SPREAD_WINDOW_IOS);
    if !(1..=MAX_SPREAD_WINDOW_IOS).contains(&window) {
        return Err(format!("spread_window_ios must be in 1..={MAX_SPREAD_WINDOW_IOS}, got {window}"));
    }
    match t.reservation_split.as_deref() {
        None | Some("spread") => Ok(ReservationSplit::Spread { window_ios: window }),
        Some("rho") if t.spread_window_ios.is_none() => Ok(ReservationSplit::Rho),
        Some("rho") => Err("spread_window_ios applies to reservation_split = \"spread\" only".into()),
        Some(other) => Err(format!("reservation_split {other:?}: expected \"spread\" or \"rho\"")),
    }
}

/// The trace's device filter: `device = d`, `devices = [..]` or the devices `routing.devices` maps (one
/// of the three; no repeats).
fn trace_devices(t: &TenantFile) -> Result<Vec<u32>, String> {
    let n = &t.name;
    let Some(tr) = &t.workload.trace else { return Ok(Vec::new()) };
    if let Some(RoutingFile::Devices { devices }) = &t.routing {
        if tr.device.is_some() || tr.devices.is_some() {
            return Err(format!(
                "tenant {n}: trace.device/trace.devices with routing.devices: the routing already says which devices to keep"
            ));
        }
        return Ok(devices.values().flatten().copied().collect());
    }
    match (tr.device, &tr.devices) {
        (Some(_), Some(_)) => Err(format!("tenant {n}: trace.device and trace.devices are exclusive; give one")),
        (Some(d), None) => Ok(vec![d]),
        (None, Some(v)) => {
            if v.is_empty() {
                return Err(format!("tenant {n}: trace.devices must not be empty"));
            }
            if let Some(d) = v.iter().enumerate().find_map(|(k, d)| v[..k].contains(d).then_some(d)) {
                return Err(format!("tenant {n}: trace.devices lists device {d} twice"));
            }
            Ok(v.clone())
        }
        (None, None) => Ok(Vec::new()),
    }
}
