//! A `[pshift]` scenario as processes: one `rein serve` node per server with pShift's token scheduler,
//! a `rein pshift controller` (when the scenario has one), and each bucket's load reaching its servers
//! directly (docs/pshift-daemons.md; the simulator's side is rein-sim's `model::pshift`).
//!
//! # Model
//! Server i is node i (`scheduler = "token"`, the server's queue depth and device model, `[pshift]` with
//! the token scheduler's R order and weighting, naming the controller and the server). Every bucket is a tenant with an export on each node its demand ever
//! reaches. The controller gets the scenario's period, intervals, start, estimator, `approx_top`,
//! `exact_limits`, `early_rounds`, the delay as `message_delay_ms`, each server's nominal capacity and
//! each bucket's reservation and limit, and `hold = true`: its schedule starts when the load starts
//! (`PUT /api/pshift/start`), so its QoS periods are the report's. A bucket's load is one job with a
//! window per server it uses, each on that node (no gateway: a pShift client talks to each server), and
//! the bucket's demand phases as the windows' shares: a closed bucket's windows are filled where active,
//! an open bucket's streams run at its rate times each active server's share.
//!
//! # Invariants
//! 1. What the daemons are told, read back by their own parsers, is what the simulator runs: the
//!    controller's `ControllerConfig`, server capacities and bucket QoS, and each node's token scheduler
//!    (R order, weighted), or planning fails naming it.
//! 2. A bucket's load is the simulator's: closed windows of `per_server` at each active server, or open
//!    streams at `iops x share` per active server (evenly spaced from a random phase, or Poisson), moving
//!    with its demand phases.
//!
//! # Deviations
//! The scenario's `delay_ms` is not added to the messages: the controller and the nodes talk over
//! loopback (tens of microseconds); the controller still uses the delay where its rules assume one (limits
//! kept for tokens in flight, when an early round may start).

use super::{
    budget_lines, device_table, export_mb, f, mclock_table, q, tenant_entry, ExportsError, Invalid, NodePlan,
    PlanError, ServerTableError,
};
use rein_core::Nanos;
use rein_sim::model::pshift::{BucketLoad, BucketPlan, PshiftSection};
use rein_sim::Scenario;
use std::fmt::Write as _;
use std::net::SocketAddr;

/// The controller of a pShift plan.
#[derive(Debug, Clone)]
pub struct ControllerPlan {
    /// Where the servers connect.
    pub listen: SocketAddr,
    /// Its admin endpoint (`/api/pshift`, the start request).
    pub admin: SocketAddr,
    /// Its ctl.toml.
    pub config: String,
}

/// The servers bucket `b`'s demand ever reaches, in index order.
pub fn bucket_servers(b: &BucketPlan) -> Vec<usize> {
    let mut s: Vec<usize> = b.phases.iter().flat_map(|p| p.servers.iter().map(|x| x.0)).collect();
    s.sort_unstable();
    s.dedup();
    s
}

/// Bucket `b`'s demand phases over `servers` ([`bucket_servers`]): from each phase's time on, each one's
/// share of the bucket's demand (0 where it is not active).
pub fn phases(b: &BucketPlan, servers: &[usize]) -> Vec<(Nanos, Vec<f64>)> {
    b.phases
        .iter()
        .map(|p| (p.at, servers.iter().map(|s| p.servers.iter().find(|x| x.0 == *s).map_or(0.0, |x| x.1)).collect()))
        .collect()
}

/// Bucket `b`'s open arrivals per server, if it is open (the load's streams at `iops x share`).
pub fn arrivals(ps: &PshiftSection, b: &BucketPlan) -> Option<rein_runtime::load::WindowArrivals> {
    match b.load {
        BucketLoad::Open { iops } => Some(rein_runtime::load::WindowArrivals {
            iops,
            uniform: ps.arrivals == rein_sim::model::pshift::Arrivals::Uniform,
        }),
        BucketLoad::Closed { .. } => None,
    }
}

/// Why the controller's ctl.toml cannot be written ([`controller_config`]): it does not read back as the
/// simulator's controller (invariant 1); the message names the server or bucket once, the plan the
/// scenario.
#[derive(Debug, thiserror::Error)]
pub enum ControllerWriteError {
    /// `rein pshift controller`'s parser refuses the ctl.toml as written.
    #[error("the controller's configuration as written: {0}")]
    Parse(Box<rein_runtime::pshift_controller::ControllerConfigError>),
    /// The controller's settings read back as others.
    #[error("the controller's configuration reads back as {back:?}, not {want:?}")]
    Back {
        /// As read back.
        back: Box<rein_core::pshift::ControllerConfig>,
        /// The simulator's.
        want: Box<rein_core::pshift::ControllerConfig>,
    },
    /// A server reads back under another name or capacity.
    #[error("server {server} reads back as {name:?} at {capacity_iops} IOPS")]
    Server {
        /// The scenario's server.
        server: String,
        /// Its name as read back.
        name: String,
        /// Its capacity as read back.
        capacity_iops: f64,
    },
    /// A bucket reads back under another name or QoS.
    #[error("bucket {bucket} reads back as {name:?} {back:?}, not {want:?}")]
    Bucket {
        /// The scenario's bucket.
        bucket: String,
        /// Its name as read back.
        name: String,
        /// Its QoS as read back.
        back: rein_core::pshift::BucketQos,
        /// The simulator's.
        want: rein_core::pshift::BucketQos,
    },
}

/// Why a pShift node's rein.toml cannot be written (`node_config`); the message names the server or
/// bucket once, the plan the scenario.
#[derive(Debug, thiserror::Error)]
pub enum NodeWriteError {
    /// The server's `[mclock]` or `[device_model]` table.
    #[error(transparent)]
    Table(#[from] ServerTableError),
    /// A bucket's node-local QoS (its weight alone) is refused.
    #[error("bucket {bucket}: {source}")]
    Bucket {
        /// The bucket.
        bucket: String,
        /// Why.
        source: rein_core::SpecError,
    },
    /// More buckets on the node than it takes exports (it names the server).
    #[error(transparent)]
    Exports(#[from] ExportsError),
    /// `rein serve`'s parser refuses the rein.toml as written.
    #[error("server {server}: its rein.toml as written: {source}")]
    Parse {
        /// The server.
        server: String,
        /// The parser's error.
        source: Box<rein_runtime::config::ConfigError>,
    },
    /// The token scheduler reads back as another (invariant 1).
    #[error("server {server}: the token scheduler reads back as {back:?}, not {want:?}")]
    TokenBack {
        /// The server.
        server: String,
        /// As read back.
        back: rein_runtime::dispatch::TokenVariant,
        /// The scenario's.
        want: rein_runtime::dispatch::TokenVariant,
    },
}

/// The controller's ctl.toml, checked to read back as the simulator's controller (invariant 1).
pub fn controller_config(
    sc: &Scenario,
    ps: &PshiftSection,
    listen: SocketAddr,
    admin: SocketAddr,
) -> Result<String, ControllerWriteError> {
    let period_s = ps.period.as_secs_f64();
    let mut t = format!(
        "# rein cluster: the pShift controller of scenario {}\nlisten = {}\nadmin = {}\nhold = true\n\
         period_s = {}\nintervals = {}\nstart_s = {}\n{}exact_limits = {}\nearly_rounds = {}\n\
         message_delay_ms = {}\n",
        sc.name(),
        q(&listen.to_string()),
        q(&admin.to_string()),
        f(period_s),
        ps.intervals,
        f(ps.start.as_secs_f64()),
        rein_model::pshift_settings::estimator_keys(ps.estimator, ps.backlog_idle_bp),
        ps.exact_limits,
        ps.early_rounds,
        f(ps.delay.0 as f64 / 1e6)
    );
    if let Some(m) = ps.approx_top {
        let _ = writeln!(t, "approx_top = {m}");
    }
    for s in sc.servers() {
        let _ = write!(t, "\n[[servers]]\nname = {}\ncapacity_iops = {}\n", q(&s.name), f(s.device.capacity_iops));
    }
    for b in sc.tenants() {
        let _ = write!(t, "\n[[buckets]]\nname = {}\nreservation_iops = {}\n", q(&b.name), f(b.spec.reservation()));
        if let Some(l) = b.spec.limit() {
            let _ = writeln!(t, "limit_iops = {}", f(l));
        }
    }
    let back = rein_runtime::pshift_controller::ControllerSettings::parse(&t, std::path::Path::new("ctl.toml"))
        .map_err(|e| ControllerWriteError::Parse(Box::new(e)))?;
    let want = ps.controller_config();
    if back.config != want {
        return Err(ControllerWriteError::Back { back: Box::new(back.config), want: Box::new(want) });
    }
    for (s, (name, cap)) in sc.servers().iter().zip(&back.servers) {
        if *name != s.name || *cap != s.device.capacity_iops {
            return Err(ControllerWriteError::Server {
                server: s.name.clone(),
                name: name.clone(),
                capacity_iops: *cap,
            });
        }
    }
    for (b, (name, qos)) in sc.tenants().iter().zip(&back.buckets) {
        let want = ps.bucket_qos(b);
        if *name != b.name || *qos != want {
            return Err(ControllerWriteError::Bucket { bucket: b.name.clone(), name: name.clone(), back: *qos, want });
        }
    }
    Ok(t)
}

/// Node `i`'s rein.toml: the server's header, `[mclock]` and device model (as every node's), an export
/// and tenant per bucket that uses it (with the bucket's weight only), and `[pshift]` naming the
/// controller (none: plain round robin).
pub(super) fn node_config(
    sc: &Scenario,
    ps: &PshiftSection,
    i: usize,
    nbd: SocketAddr,
    admin: SocketAddr,
    controller: Option<SocketAddr>,
) -> Result<String, NodeWriteError> {
    let s = &sc.servers()[i];
    let users: Vec<&rein_sim::model::Tenant> =
        sc.tenants().iter().zip(&ps.buckets).filter(|(_, p)| bucket_servers(p).contains(&i)).map(|(t, _)| t).collect();
    let mut t = format!(
        "# rein cluster: pShift server {} of scenario {}\nlisten = {}\nadmin = {}\ndata_dir = {}\nscheduler = \"token\"\n\
         queue_depth = {}\nadmission = \"warn\"\nshutdown_timeout_s = 2\n{}",
        s.name,
        sc.name(),
        q(&nbd.to_string()),
        q(&admin.to_string()),
        q(&format!("node-{}", s.name)),
        s.queue_depth,
        budget_lines(&users, sc.duration()),
    );
    t.push('\n');
    let table = |table| ServerTableError { server: s.name.clone(), table };
    t.push_str(&mclock_table(&s.sched).map_err(table)?);
    t.push('\n');
    t.push_str(&device_table(&s.device, sc.seed(), i as u64).map_err(table)?);
    let mut exports = 0;
    for (b, plan) in sc.tenants().iter().zip(&ps.buckets) {
        if !bucket_servers(plan).contains(&i) {
            continue;
        }
        exports += 1;
        let _ = write!(
            t,
            "\n[[exports]]\nname = {0}\npath = {1}\nsize_mb = {2}\ntenant = {0}\n\n",
            q(&b.name),
            q(&format!("{}.img", b.name)),
            export_mb(b)
        );
        // The bucket's reservation and limit are the controller's (per period over all servers); a node's
        // token scheduler uses only the weight, and its admission control would count the reservation
        // once per node.
        let local = rein_core::QosSpec::new(0.0, None, b.spec.weight(), b.spec.idle_credit())
            .map_err(|source| NodeWriteError::Bucket { bucket: b.name.clone(), source })?;
        t.push_str(&tenant_entry(&b.name, &local));
    }
    super::end_exports(&mut t, &s.name, exports)?;
    let _ =
        write!(t, "\n[pshift]\nweighted = {}\n{}", ps.weighted, rein_model::pshift_settings::r_order_keys(ps.r_order));
    if let Some(c) = controller {
        let _ = write!(t, "controller = {}\nname = {}\n", q(&c.to_string()), q(&s.name));
    }
    let back = rein_runtime::config::ServerConfig::parse(&t, std::path::Path::new("rein.toml"))
        .map_err(|e| NodeWriteError::Parse { server: s.name.clone(), source: Box::new(e) })?;
    let want = rein_runtime::dispatch::TokenVariant { weighted: ps.weighted, r_order: ps.r_order };
    if back.token != want {
        return Err(NodeWriteError::TokenBack { server: s.name.clone(), back: back.token, want });
    }
    Ok(t)
}

/// The nodes and the controller of a pShift scenario (the controller at the address after the nodes'),
/// given each process's (NBD or listen, admin) addresses by `addrs(i)`.
pub(super) fn processes(
    sc: &Scenario,
    ps: &PshiftSection,
    mut addrs: impl FnMut(usize) -> Result<(SocketAddr, SocketAddr), PlanError>,
) -> Result<(Vec<NodePlan>, Option<ControllerPlan>), PlanError> {
    let invalid = |reason: Invalid| PlanError::Invalid { scenario: sc.label(), reason: Box::new(reason) };
    let controller = if ps.controller {
        let (listen, admin) = addrs(sc.servers().len())?;
        let config = controller_config(sc, ps, listen, admin).map_err(|e| invalid(Invalid::PshiftController(e)))?;
        Some(ControllerPlan { listen, admin, config })
    } else {
        None
    };
    let mut nodes = Vec::with_capacity(sc.servers().len());
    for (i, s) in sc.servers().iter().enumerate() {
        let (nbd, admin) = addrs(i)?;
        let config = node_config(sc, ps, i, nbd, admin, controller.as_ref().map(|c| c.listen))
            .map_err(|e| invalid(Invalid::PshiftNode(e)))?;
        nodes.push(NodePlan { name: s.name.clone(), nbd, admin, config });
    }
    // The controller is at the address after the last node's.
    debug_assert!(controller.as_ref().zip(nodes.last()).is_none_or(|(c, n)| match (c.listen.ip(), n.nbd.ip()) {
        (std::net::IpAddr::V4(c), std::net::IpAddr::V4(n)) => u32::from(c) == u32::from(n) + 1,
        _ => false,
    }));
    Ok((nodes, controller))
}

#[cfg(test)]
mod tests {
    use super::super::Plan;
    use rein_sim::Scenario;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::path::{Path, PathBuf};

    fn fixed_ports(_: Ipv4Addr, k: u16) -> std::io::Result<u16> {
        Ok(20_000 + k)
    }

    fn scenario(name: &str) -> Scenario {
        Scenario::load(&path(name)).unwrap()
    }

    fn path(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios").join(name)
    }

    /// Scenario file `name` with its `[pshift]` section changed by `edit`, validated as a file saying so.
    fn scenario_with(name: &str, edit: impl FnOnce(&mut rein_sim::file::pshift::PshiftFile)) -> Scenario {
        let mut f = rein_sim::file::ScenarioFile::read(&path(name)).unwrap();
        edit(f.pshift.as_mut().expect("a [pshift] scenario"));
        f.validate_at(&path(name)).unwrap()
    }

    /// A node's refusals are typed, naming the server or bucket once; they and the read-backs are
    /// invariant 1's checks (no scenario reaches them), their texts checked on the values.
    #[test]
    fn refusals_are_typed_naming_the_server_or_bucket_once() {
        use super::super::{ServerTableError, TableError};
        use super::{ControllerWriteError, NodeWriteError};
        let per_byte = rein_core::CostModel::PerByte { unit_bytes: 4096 };
        // A validated scenario's tables are those a file can write (and cannot be changed into others),
        // so the table's refusal is checked on the value.
        let e = NodeWriteError::Table(ServerTableError { server: "s3".into(), table: TableError::CostModel(per_byte) });
        assert_eq!(e.to_string(), "server s3: cost model PerByte { unit_bytes: 4096 } has no rein.toml form");
        let source = rein_core::QosSpec::new(0.0, None, -1.0, 0).unwrap_err();
        let e = NodeWriteError::Bucket { bucket: "b1".into(), source: source.clone() };
        assert_eq!(e.to_string(), format!("bucket b1: {source}"));
        let e = ControllerWriteError::Server { server: "s1".into(), name: "s2".into(), capacity_iops: 100.0 };
        assert_eq!(e.to_string(), "server s1 reads back as \"s2\" at 100 IOPS");
    }

    /// Experiment 4 (generated buckets with demand changes): a controller after the nodes, whose ctl.toml
    /// (read back when planned) holds the scenario's servers and buckets; each node's rein.toml, read by
    /// `rein serve`'s parser, runs the token scheduler linked to the controller under its own name and
    /// holds every bucket that ever reaches it, without a node-local reservation; each bucket's endpoint
    /// reaches each of its servers directly, with the demand phases the simulator runs.
    #[test]
    fn a_pshift_scenario_plans_a_controller_token_nodes_and_direct_buckets() {
        let sc = scenario("pshift-exp4-small.toml");
        let ps = sc.pshift().unwrap();
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        let ctl = plan.controller.as_ref().expect("a controller");
        assert_eq!(ctl.listen, SocketAddr::from(([127, 0, 0, 18], 20_000)), "after the 8 nodes");
        // From another first address: the controller still after the nodes; the 9 processes need room.
        let from = Plan::at(&sc, Ipv4Addr::new(127, 0, 0, 184), fixed_ports).unwrap();
        let ctl_from = from.controller.as_ref().expect("a controller");
        assert_eq!(from.nodes[0].nbd, SocketAddr::from(([127, 0, 0, 184], 20_000)));
        assert_eq!(ctl_from.listen, SocketAddr::from(([127, 0, 0, 192], 20_000)));
        let e = Plan::at(&sc, Ipv4Addr::new(127, 0, 0, 247), fixed_ports).unwrap_err().to_string();
        assert!(
            e.ends_with(
                "8 servers and a controller need 9 processes, each on its own address; from 127.0.0.247 \
             (--first-address) to 127.0.0.254 at most 8 fit"
            ),
            "{e}"
        );
        let back =
            rein_runtime::pshift_controller::ControllerSettings::parse(&ctl.config, Path::new("ctl.toml")).unwrap();
        assert!(back.hold, "the schedule waits for the load");
        assert_eq!(back.servers.len(), 8);
        assert_eq!(
            back.buckets.iter().map(|b| b.0.clone()).collect::<Vec<_>>(),
            (0..10).map(|i| format!("b{i}")).collect::<Vec<_>>()
        );
        // 1,200 IOPS over a 1 s period: 1,200 R-tokens; the limit 2,000.
        assert_eq!((back.buckets[3].1.reservation, back.buckets[3].1.limit), (1200, Some(2000)));
        assert!(plan.gateways.is_empty());
        for (i, n) in plan.nodes.iter().enumerate() {
            let c = rein_runtime::config::ServerConfig::parse(&n.config, Path::new("rein.toml")).unwrap();
            assert_eq!(c.scheduler, rein_core::SchedulerKind::Token);
            assert_eq!(c.queue_depth, 1);
            let link = c.pshift.as_ref().expect("linked");
            assert_eq!((link.controller, link.name.as_str()), (ctl.listen, sc.servers()[i].name.as_str()));
            let want: Vec<String> = ps
                .buckets
                .iter()
                .enumerate()
                .filter(|(_, b)| super::bucket_servers(b).contains(&i))
                .map(|(j, _)| format!("b{j}"))
                .collect();
            assert_eq!(c.tenants.iter().map(|t| t.name.clone()).collect::<Vec<_>>(), want, "node {i}");
            assert!(c.tenants.iter().all(|t| t.spec.reservation() == 0.0 && t.spec.limit().is_none()));
        }
        let mut changes = 0;
        for (e, b) in plan.endpoints.iter().zip(&ps.buckets) {
            let servers = super::bucket_servers(b);
            assert_eq!(e.servers, servers);
            assert_eq!(e.direct, servers.iter().map(|&i| plan.nodes[i].nbd).collect::<Vec<_>>());
            assert_eq!(e.phases.len(), b.phases.len());
            for (p, d) in e.phases.iter().zip(&b.phases) {
                assert_eq!(p.0, d.at);
                let active: Vec<usize> = servers.iter().zip(&p.1).filter(|x| *x.1 > 0.0).map(|x| *x.0).collect();
                let mut want: Vec<usize> = d.servers.iter().map(|x| x.0).collect();
                want.sort_unstable();
                assert_eq!(active, want);
            }
            changes += e.phases.len() - 1;
        }
        assert_eq!(changes, 50, "5 demand changes per bucket");
    }

    /// The backlog estimator's idle share reaches the controller as set (the plan checks that the file reads
    /// back as the simulator's controller).
    #[test]
    fn the_backlog_idle_share_reaches_the_controller() {
        let sc = scenario_with("pshift-exp3-limits-small.toml", |p| p.backlog_idle_pct = Some(2.5));
        assert_eq!(sc.pshift().unwrap().backlog_idle_bp, 250);
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        let ctl = plan.controller.as_ref().expect("a controller");
        assert!(ctl.config.contains("estimator = \"backlog\"\nbacklog_idle_pct = 2.5\n"), "{}", ctl.config);
        let back =
            rein_runtime::pshift_controller::ControllerSettings::parse(&ctl.config, Path::new("ctl.toml")).unwrap();
        assert_eq!(back.config.backlog_idle_bp, 250);
    }

    /// Without a controller (the round-robin baseline) the nodes run the token scheduler unlinked.
    #[test]
    fn a_baseline_without_a_controller_plans_plain_round_robin_nodes() {
        // The file as the round-robin baseline: no controller, and none of the checks that read its tally.
        let path = path("pshift-exp3-limits-small.toml");
        let mut f = rein_sim::file::ScenarioFile::read(&path).unwrap();
        f.pshift.as_mut().unwrap().controller = false;
        f.expect.retain(|e| e.count.as_deref() != Some("servers"));
        let sc = f.validate_at(&path).unwrap();
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        assert!(plan.controller.is_none());
        for n in &plan.nodes {
            let c = rein_runtime::config::ServerConfig::parse(&n.config, Path::new("rein.toml")).unwrap();
            assert!(c.pshift.is_none());
            assert_eq!(c.scheduler, rein_core::SchedulerKind::Token);
        }
    }
}
