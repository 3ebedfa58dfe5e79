//! A validated scenario turned into the processes that run it: one `rein serve` node per server, one
//! `rein gateway` per tenant that stripes over several nodes, and the endpoint each tenant's load opens.
//!
//! # Model
//! The input is rein-sim's [`Scenario`], the value `rein sim` runs: nothing here reads the TOML again, so a
//! scenario means one thing to both. Server i becomes node `127.0.0.(10+i)` (from the first address,
//! [`DEFAULT_FIRST_ADDRESS`] or `rein cluster --first-address`: [`Plan::at`]); each tenant that uses one
//! server opens its export on that node directly; a tenant over several servers opens a gateway at
//! `127.0.0.(10+n+j)` whose stripe widths are its routing shares as small integers ([`widths`]). A node
//! gets the server's scheduler, queue depth, `[mclock]` settings and device model, and one sparse file
//! export per tenant that uses it, sized to the tenant's span, with the kernel's readahead off (the
//! model, not the file, times each IO; readahead would stall the node's dispatcher, `rein_runtime::FileMode`).
//!
//! # Invariants
//! 1. What a node is told equals what the simulator runs: the `[mclock]` table and the `[device_model]`
//!    written for a server are read back by the same validators (`SchedSettingsFile::resolve`,
//!    `DeviceParams::validate`) and must give the server's own values, or planning fails naming it.
//! 2. Every process has its own loopback address, from the first address `127.a.b.c` up, all below
//!    `127.a.b.255`: at most `255 - c` processes ([`MAX_PROCESSES`] from the default, 127.0.0.10), checked
//!    before any address is handed out (`check_room`; [`host`] asserts it).
//! 3. A feature a real cluster cannot run is refused by name ([`PlanError::Unsupported`]), never skipped.
//!
//! # Symbol map
//! | scenario | plan |
//! |---|---|
//! | `[[servers]]` i | [`NodePlan`] i: `rein serve` config text |
//! | tenant's `servers`, routing shares | [`Endpoint::servers`], gateway stripe `widths` |
//! | `server_reservations` | the node tenant's reservation (one server), RBFQ local reservations (gateway) |
//! | `[[hosts]]` h, `[parda]`, `[mclock]` | a gateway `host-NAME` with `[parda]` and `[mclock]` (each read back equal) and `[parda_host]` id h |
//! | a VM (`host = "h"`) | a tenant and volume of host h's gateway, an export on the array's node |
//! | a host's `service_scale` | the array's `[device_model] service_scale` for each of its VMs |
//! | `[pshift]` | token-scheduled nodes, a `rein pshift controller`, buckets reaching their nodes directly ([`pshift`]) |
//!
//! A node that serves a striped tenant has `[node] enabled = true, specs = "node"`: under a distributed
//! scheduler (dmclock, rbfq, dtfq) its gateway speaks the storage-node protocol to it (`protocol =
//! "rein"`), tagging every request with the tenant's delta and rho, and the node's own spec for the tenant
//! (the scenario's for that server) wins, as the simulator's server sees it. Under any other scheduler
//! (lfq, sfq, mclock, fifo) the simulator's gateway attaches no tags, and the gateway speaks plain NBD
//! to the node (`protocol = "nbd"`).
//!
//! # Deviations
//! The simulator routes each request by a draw over the shares; a gateway stripes by offset, so a tenant's
//! requests follow its shares only as far as its offsets are spread over the stripes (uniform random
//! offsets: exactly in expectation). Each node's device model draws from the simulator's stream for its
//! server (the scenario's seed, `stream` = the server's index), so node i's service times are the
//! simulator's server i's, in the order the node admits requests.

pub mod pshift;

use rein_core::{CostModel, LimitMode, Nanos, QosSpec, ReservationLag, SchedConfig};
use rein_model::device::{DeviceParams, DeviceSpec, Discipline, DiskParams, ServiceModel};
use rein_model::sched_settings::SchedSettingsFile;
use rein_model::stripe::Stripe;
use rein_model::workload::WorkloadKind;
use rein_model::Routing;
use rein_sim::model::parda::{Aggregation, Host, Parda};
use rein_sim::model::{Server, Tenant};
use rein_sim::Scenario;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};

/// Processes in a plan at most from [`DEFAULT_FIRST_ADDRESS`]: 127.0.0.10 to 127.0.0.254.
pub const MAX_PROCESSES: usize = 245;
/// The first process's address unless `rein cluster --first-address` gives another: 127.0.0.10 (127.0.0.1
/// to .9 are left to daemons started by hand beside a cluster).
pub const DEFAULT_FIRST_ADDRESS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 10);
/// The index of a PARDA host's UDP port for the other hosts' reports among a process's ports
/// ([`Plan::at`]'s `port(addr, k)`; 0 is its NBD port, 1 its admin port).
pub const UDP_REPORTS_PORT: u16 = 2;
/// The last number a process's address may end in: `127.a.b.255` is the broadcast address of its /24.
pub const LAST_HOST: u8 = 254;
/// A gateway's stripe unit (KiB) under routing shares.
pub const SHARES_STRIPE_KB: u64 = 64;
/// The stripe unit of a volume routed by a trace's devices (KiB): the load aims each record into a unit of
/// its device's server, whole (a record larger than the unit, rare in traces, spans servers).
pub const DEVICE_STRIPE_KB: u64 = 1024;
/// Largest sum of stripe widths of a gateway export.
pub const MAX_WIDTH_SUM: u64 = 1024;
/// Largest export a plan makes (MiB; sparse files).
pub const MAX_EXPORT_MB: u64 = 1 << 20;

/// Requests one NBD connection may have in flight at a `rein serve` node or a gateway's front.
const PER_CONN: u64 = rein_runtime::nbd::MAX_IN_FLIGHT_PER_CONN as u64;
/// Most NBD connections a tenant's load opens (each holds `rein_runtime::nbd::MAX_IN_FLIGHT_PER_CONN` requests
/// in flight).
pub const MAX_LOAD_CONNECTIONS: u64 = 256;
/// Connection caps per client and per tenant written into every node's and gateway's config: the
/// daemons' total (`max_connections`' default), above what a plan opens (a load's connections, a
/// gateway's pool).
const CONN_CAP: usize = rein_runtime::server::MAX_CONNECTIONS;
/// The daemons' default byte budgets (MiB, all tenants and per tenant): a plan raises them, never lowers.
const BUDGET_MB: (u64, u64) =
    (rein_runtime::budget::DEFAULT_INFLIGHT_MB, rein_runtime::budget::DEFAULT_INFLIGHT_MB_PER_TENANT);
/// The most a plan raises them to (MiB, all tenants and per tenant): the room is memory (a gateway holds
/// a READ's reply buffer while the READ waits at a node), so a scenario whose backlog would need more runs
/// into the daemons' backpressure instead of the machine's memory.
pub const MAX_BUDGET_MB: (u64, u64) = (8192, 4096);

/// Requests tenant `t` can have outstanding at once in the simulator over a run of `duration`: a closed
/// loop's window (per server times its servers, where it is one), and for the other kinds every request the
/// run issues (an open loop into an overloaded server queues there without bound), at most the scheduler's
/// `max_queued_per_tenant` per server. It sizes the real run's room ([`load_connections`],
/// [`pool_per_node`], [`budget_mb`]): with less, the requests a tenant has queued at a hot node fill its
/// connections, its load stops sending, and its queues at the other nodes run dry: the open loop turns into
/// one closed pool (head-of-line blocking the simulator does not have; RBFQ Figs. 11(b)(c)).
pub fn in_flight_bound(t: &Tenant, duration: Nanos) -> u64 {
    let secs = duration.as_secs_f64();
    let servers = t.servers.len().max(1) as u64;
    let cap = rein_core::Limits::default().max_queued_per_tenant as u64 * servers;
    fn kind_bound(k: &WorkloadKind, secs: f64, servers: u64) -> u64 {
        match k {
            WorkloadKind::Closed { outstanding, per_server, .. } => {
                u64::from(*outstanding) * if *per_server { servers } else { 1 }
            }
            WorkloadKind::Open { iops } => (iops * secs).ceil() as u64,
            WorkloadKind::OnOff { inner, .. } => kind_bound(&inner.kind(), secs, servers),
            WorkloadKind::Burst { count, period } => {
                u64::from(*count) * ((secs / period.as_secs_f64().max(1e-9)).ceil() as u64 + 1)
            }
            WorkloadKind::Trace { records, repeat, .. } => {
                if *repeat {
                    u64::MAX
                } else {
                    records.len() as u64
                }
            }
        }
    }
    kind_bound(&t.workload.kind, secs, servers).clamp(1, cap)
}

/// NBD connections tenant `t`'s load opens: room for [`in_flight_bound`] requests, at least `min`, at
/// most [`MAX_LOAD_CONNECTIONS`].
pub fn load_connections(t: &Tenant, duration: Nanos, min: usize) -> usize {
    in_flight_bound(t, duration).div_ceil(PER_CONN).clamp(min as u64, MAX_LOAD_CONNECTIONS) as usize
}

/// A gateway's pooled connections per node for tenant `t`: room at each node for all of
/// [`in_flight_bound`] (all of it may queue at one hot node), 4..=[`rein_runtime::remote::MAX_CONNECTIONS_PER_NODE`].
pub fn pool_per_node(t: &Tenant, duration: Nanos) -> u64 {
    pool_for(in_flight_bound(t, duration))
}

/// Pooled connections per node with room for `bound` requests in flight, 4..=[`rein_runtime::remote::MAX_CONNECTIONS_PER_NODE`].
fn pool_for(bound: u64) -> u64 {
    bound.div_ceil(PER_CONN).clamp(4, rein_runtime::remote::MAX_CONNECTIONS_PER_NODE as u64)
}

/// The byte budget (MiB) for tenant `t`'s requests in flight at one daemon: [`in_flight_bound`] requests of
/// its largest size, a quarter more for input buffers, at least the daemons' default (256), at most
/// [`MAX_BUDGET_MB`]'s 4,096.
pub fn budget_mb(t: &Tenant, duration: Nanos) -> u64 {
    let size = match &t.workload.kind {
        WorkloadKind::Trace { records, .. } => records.iter().map(|r| r.size).max().unwrap_or(0),
        _ => 0,
    }
    .max(t.workload.size_bytes)
    .max(512);
    let bytes = in_flight_bound(t, duration).saturating_mul(size).saturating_mul(5) / 4;
    bytes.div_ceil(1 << 20).clamp(BUDGET_MB.1, MAX_BUDGET_MB.1)
}

/// The budget lines of a daemon that serves `tenants`: per tenant the largest of theirs, in all their sum
/// (each at least the default), at most [`MAX_BUDGET_MB`]'s 8,192.
fn budget_lines(tenants: &[&Tenant], duration: Nanos) -> String {
    let each: Vec<u64> = tenants.iter().map(|t| budget_mb(t, duration)).collect();
    let per = each.iter().copied().max().unwrap_or(BUDGET_MB.1);
    let all = each.iter().fold(0u64, |a, &b| a.saturating_add(b)).clamp(BUDGET_MB.0, MAX_BUDGET_MB.0).max(per);
    format!(
        "max_inflight_mb = {all}\nmax_inflight_mb_per_tenant = {per}\n\
         max_connections_per_client = {CONN_CAP}\nmax_connections_per_tenant = {CONN_CAP}\n"
    )
}

/// A gateway's `request_timeout_s` for a run of `duration`: longer than the run (the simulator fails no
/// request however long it queues, and a cluster's nodes are its own children, watched by the supervisor),
/// at least the gateway's default (30 s), at most its largest (3,600 s).
pub fn request_timeout_s(duration: Nanos) -> f64 {
    use rein_runtime::gateway::{DEFAULT_REQUEST_TIMEOUT_S, MAX_TIMEOUT_S};
    (duration.as_secs_f64() + 60.0).ceil().clamp(DEFAULT_REQUEST_TIMEOUT_S, MAX_TIMEOUT_S)
}

/// Why a scenario cannot run on real daemons.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The scenario uses something a real cluster cannot run; the message names the feature.
    #[error("scenario {scenario}: {feature} cannot run on a real cluster{why}")]
    Unsupported {
        /// The scenario as errors name it (rein-sim's `Scenario::label`: its file).
        scenario: String,
        /// The feature, as the scenario file names it.
        feature: String,
        /// More on why (empty or starting with ": ").
        why: String,
    },
    /// A value cannot be carried over (the reason names the server or tenant and the value).
    #[error("scenario {scenario}: {reason}")]
    Invalid {
        /// The scenario as errors name it (rein-sim's `Scenario::label`: its file).
        scenario: String,
        /// What is wrong.
        #[source]
        reason: Box<Invalid>,
    },
    /// The first process's address (`rein cluster --first-address`) is not one a plan can start from.
    #[error("--first-address {first}: {why}")]
    FirstAddress {
        /// The address given.
        first: Ipv4Addr,
        /// Why not.
        why: &'static str,
    },
}

/// One `rein serve` node.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// The server's name.
    pub name: String,
    /// NBD address.
    pub nbd: SocketAddr,
    /// Admin (HTTP) address.
    pub admin: SocketAddr,
    /// Its rein.toml.
    pub config: String,
}

/// One `rein gateway`.
#[derive(Debug, Clone)]
pub struct GatewayPlan {
    /// The tenant it serves.
    pub tenant: String,
    /// NBD address.
    pub nbd: SocketAddr,
    /// Admin (HTTP) address.
    pub admin: SocketAddr,
    /// A PARDA host's UDP socket for the other hosts' reports, when it exchanges them.
    pub udp: Option<SocketAddr>,
    /// Its gw.toml.
    pub config: String,
}

/// Where a tenant's load goes.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The tenant (and export) name.
    pub tenant: String,
    /// The NBD server it opens: its node, or its gateway.
    pub nbd: SocketAddr,
    /// The export name.
    pub export: String,
    /// Indices of the scenario's servers it uses, in its order (per-server window k is at `servers[k]`).
    pub servers: Vec<usize>,
    /// The nodes' admin addresses (phase counters), in the order of `servers`.
    pub node_admins: Vec<SocketAddr>,
    /// Whether it goes through a gateway.
    pub gateway: bool,
    /// The volume's layout over `servers` and its size (bytes), through a gateway.
    pub stripe: Option<(Stripe, u64)>,
    /// Per server of `servers`, the NBD address the load opens the export on directly (a pShift bucket:
    /// no gateway); empty: everything goes to `nbd`.
    pub direct: Vec<SocketAddr>,
    /// Demand phases over `servers` (a pShift bucket's: from when, each one's share, 0 where it is not
    /// active); empty: all, always.
    pub phases: Vec<(Nanos, Vec<f64>)>,
    /// An open pShift bucket's arrivals per server (instead of its workload's own).
    pub arrivals: Option<rein_runtime::load::WindowArrivals>,
}

impl Endpoint {
    /// `nbd://ADDR:PORT/EXPORT`.
    pub fn uri(&self) -> String {
        format!("nbd://{}/{}", self.nbd, self.export)
    }
}

/// The processes of a scenario, in start order (nodes, then gateways).
#[derive(Debug, Clone)]
pub struct Plan {
    /// The scenario's name.
    pub name: String,
    /// One per server.
    pub nodes: Vec<NodePlan>,
    /// One per tenant over several servers, or one per PARDA host (its `tenant` is `host-NAME`).
    pub gateways: Vec<GatewayPlan>,
    /// The admin address of each PARDA host's gateway, in the scenario's host order (`/api/parda`).
    pub host_admins: Vec<SocketAddr>,
    /// One per tenant, in scenario order.
    pub endpoints: Vec<Endpoint>,
    /// A pShift scenario's controller (started before the nodes).
    pub controller: Option<pshift::ControllerPlan>,
    /// The PARDA hosts sign their reports with the key in [`PARDA_KEY_FILE`] in the run's directory,
    /// which the supervisor writes, a new one for every run.
    pub parda_key: bool,
}

/// The PARDA hosts' shared record key, relative to the run's directory (`[parda_host] key_file`).
pub const PARDA_KEY_FILE: &str = "parda.psk";

/// Whether `name` can name a file in the run's directory as it is: letters, digits, '.', '_' and '-', not
/// starting with '.'.
fn file_name_safe(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Ends node `server`'s rein.toml of `exports` exports: refused past what `rein serve` takes, and a
/// node that serves nothing (a server no tenant uses, or only with a zero routing share) gets one unused
/// export, as `rein serve` needs one (the simulator runs such a server idle).
pub(crate) fn end_exports(t: &mut String, server: &str, exports: usize) -> Result<(), ExportsError> {
    let max = rein_runtime::config::MAX_EXPORTS;
    if exports > max {
        return Err(ExportsError { server: server.to_string(), exports, max });
    }
    if exports == 0 {
        t.push_str(
            "\n# No tenant uses this server: an export rein serve needs, unused.\n[[exports]]\nname = \"unused\"\n\
             path = \"unused.img\"\nsize_mb = 1\n",
        );
    }
    Ok(())
}

/// The address of process `i` (nodes first, then gateways or the controller) of a plan whose first
/// process is at `first`: `first` plus `i` in its last number. Invariant 2: `check_room` made room.
pub fn host(first: Ipv4Addr, i: usize) -> Ipv4Addr {
    let [a, b, c, d] = first.octets();
    let last = usize::from(d) + i;
    assert!(last <= usize::from(LAST_HOST), "invariant 2: process {i} from {first} was given room");
    Ipv4Addr::new(a, b, c, last as u8)
}

/// Whether `first` can be a plan's first address: loopback (127.0.0.0/8; the daemons' admin endpoints
/// have no token, and `rein serve` refuses one off loopback without it), and not ending in 0 (the
/// address of its /24) or 255 (its broadcast address).
fn check_first(first: Ipv4Addr) -> Result<(), PlanError> {
    let why = if !first.is_loopback() {
        "not a loopback address; rein cluster's processes listen on 127.0.0.0/8 only (their admin endpoints \
         have no token)"
    } else if first.octets()[3] == 0 || first.octets()[3] == 255 {
        "ends in .0 or .255; give an address ending in .1 to .254"
    } else {
        return Ok(());
    };
    Err(PlanError::FirstAddress { first, why })
}

/// What a scenario asks that a plan cannot carry ([`PlanError::Invalid`], which names the scenario); each
/// names its server, tenant, address or value once.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    /// A server's, tenant's or host's name that cannot be a file name in the run's directory.
    #[error(
        "{what} name {name:?}: rein cluster names files after it in the run's directory; use letters, digits, \
         '.', '_' and '-', not starting with '.'"
    )]
    FileName {
        /// What it names: "server", "tenant" or "host".
        what: &'static str,
        /// The name.
        name: String,
    },
    /// No port for a process at `host` (`--base-port 0`: none free; else past 65535).
    #[error("no free port on {host}: {source} (give --base-port)")]
    Port {
        /// The process's address.
        host: Ipv4Addr,
        /// Why not.
        source: std::io::Error,
    },
    /// The processes do not fit from `--first-address` to its `.254`.
    #[error(transparent)]
    Room(RoomError),
    /// A node's or a PARDA host's config cannot be written.
    #[error(transparent)]
    Config(ConfigWriteError),
    /// A tenant's routing makes no gateway stripe.
    #[error(transparent)]
    Stripe(StripeError),
    /// A tenant's stripe widths make no layout.
    #[error("tenant {tenant}: {source}")]
    Layout {
        /// The tenant.
        tenant: String,
        /// Why not.
        source: rein_model::stripe::StripeError,
    },
    /// A pShift node's config cannot be written.
    #[error(transparent)]
    PshiftNode(pshift::NodeWriteError),
    /// A pShift controller's config cannot be written.
    #[error(transparent)]
    PshiftController(pshift::ControllerWriteError),
}

/// How many processes fit from `first` (checked by [`check_first`]) to its `.254`, each on its own
/// address (invariant 2): a plan's `processes` (the scenario's `what`) must, or it is refused naming
/// `--first-address`.
fn check_room(first: Ipv4Addr, processes: usize, what: &str) -> Result<(), RoomError> {
    let room = usize::from(LAST_HOST) + 1 - usize::from(first.octets()[3]);
    if processes <= room {
        return Ok(());
    }
    Err(RoomError { what: what.to_string(), processes, first, room })
}

/// The last address a plan from `first` can use: its `.254` ([`RoomError`]).
fn last_host(first: &Ipv4Addr) -> Ipv4Addr {
    let [a, b, c, _] = first.octets();
    Ipv4Addr::new(a, b, c, LAST_HOST)
}

/// A plan's processes do not fit from its first address to that address's `.254` (`check_room`;
/// invariant 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} need {processes} processes, each on its own address; from {first} (--first-address) to {} at \
     most {room} fit",
    last_host(.first)
)]
pub struct RoomError {
    /// What the scenario has that needs them (servers, gateways, hosts, a controller).
    pub what: String,
    /// How many processes.
    pub processes: usize,
    /// The first address.
    pub first: Ipv4Addr,
    /// How many fit.
    pub room: usize,
}

/// A server more tenants use than a `rein serve` node takes exports ([`rein_runtime::config::MAX_EXPORTS`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server {server}: {exports} tenants use it, and a rein serve node takes at most {max}")]
pub struct ExportsError {
    /// The server.
    pub server: String,
    /// The exports its node would have.
    pub exports: usize,
    /// The most a node takes.
    pub max: usize,
}

/// Why a table of a node's or gateway's config cannot be written so that it reads back as the value it
/// was written from (invariant 1); the message names the table or the value, the caller the server.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// A cost model `[mclock] cost_model` cannot express.
    #[error("cost model {0:?} has no rein.toml form")]
    CostModel(CostModel),
    /// The table as written does not parse (`table`: `[parda]`, `[mclock]`).
    #[error("{table} as written: {source}")]
    Parse {
        /// The table.
        table: &'static str,
        /// The parser's error.
        source: Box<toml::de::Error>,
    },
    /// The `[parda]` table as written is refused by its validator.
    #[error("[parda] as written: {0}")]
    Parda(rein_model::parda_settings::PardaSettingsError),
    /// The `[mclock]` table as written is refused by its validator.
    #[error("[mclock] as written: {0}")]
    Mclock(rein_model::sched_settings::SettingsError),
    /// The `[device_model]` table as written is refused by its validator.
    #[error("[device_model] as written: {0}")]
    Device(rein_model::device::DeviceError),
    /// The `[parda]` table reads back as other settings.
    #[error("the PARDA settings {written:?} read back as {back:?}")]
    PardaBack {
        /// The scenario's.
        written: Box<Parda>,
        /// As read back.
        back: Box<Parda>,
    },
    /// The `[mclock]` table reads back as other settings.
    #[error("the scheduler settings {written:?} read back as {back:?}")]
    MclockBack {
        /// The server's.
        written: Box<SchedConfig>,
        /// As read back.
        back: Box<SchedConfig>,
    },
    /// The `[device_model]` table reads back as another device.
    #[error("the device {written:?} reads back as {back:?}")]
    DeviceBack {
        /// The server's.
        written: Box<DeviceSpec>,
        /// As read back.
        back: Box<DeviceSpec>,
    },
}

/// A server's own table (its `[mclock]` or `[device_model]`) that cannot be written: the one failure a
/// node's config ([`ConfigWriteError::ServerTable`]) and a pShift node's
/// ([`pshift::NodeWriteError::Table`]) share; the message names the server once, then the table.
#[derive(Debug, thiserror::Error)]
#[error("server {server}: {table}")]
pub struct ServerTableError {
    /// The server.
    pub server: String,
    /// Why its table cannot be written.
    pub table: TableError,
}

/// Routing shares that make no stripe widths ([`widths`]); the caller names the tenant.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SharesError {
    /// A share that is negative or not finite, or all zero.
    #[error("routing shares {shares:?}: need finite non-negative shares, not all zero")]
    Invalid {
        /// The shares.
        shares: Vec<f64>,
    },
    /// No widths within 1% of the ratios sum to at most [`MAX_WIDTH_SUM`].
    #[error(
        "routing shares {shares:?}: no stripe widths summing to at most {MAX_WIDTH_SUM} within 1% of their ratios"
    )]
    TooWide {
        /// The shares.
        shares: Vec<f64>,
    },
}

/// Why a tenant's routing makes no gateway stripe ([`stripe`]); the message names the tenant.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StripeError {
    /// `stripe_kb` above the gateway's largest stripe unit.
    #[error(
        "tenant {tenant}: routing stripe_kb must be at most {max} (1 GiB) for a gateway, the largest stripe \
         unit rein gateway takes"
    )]
    UnitTooLarge {
        /// The tenant.
        tenant: String,
        /// The largest unit (KiB, [`rein_runtime::gateway::MAX_STRIPE_KB`]).
        max: u64,
    },
    /// `stripe_kb` not a whole number of KiB.
    #[error("tenant {tenant}: stripe_kb must be whole KiB for a gateway")]
    NotWholeKib {
        /// The tenant.
        tenant: String,
    },
    /// Its routing shares make no widths.
    #[error("tenant {tenant}: {shares}")]
    Shares {
        /// The tenant.
        tenant: String,
        /// Why not.
        shares: SharesError,
    },
}

/// Why a node's or a PARDA host's config cannot be written (`node_config`, `host_config`; a
/// gateway's refuses only its tenant's [`StripeError`]); the message names the server, tenant or table
/// once, the plan the scenario.
#[derive(Debug, thiserror::Error)]
pub enum ConfigWriteError {
    /// A node's `[mclock]` or `[device_model]` table (the server's own).
    #[error(transparent)]
    ServerTable(#[from] ServerTableError),
    /// A PARDA host's `[parda]` or `[mclock]` table: the scenario's, the same on every host.
    #[error(transparent)]
    Table(TableError),
    /// A tenant's stripe (it names the tenant).
    #[error(transparent)]
    Stripe(#[from] StripeError),
    /// More exports than a node takes (it names the server).
    #[error(transparent)]
    Exports(#[from] ExportsError),
}

impl Plan {
    /// [`Plan::at`] from [`DEFAULT_FIRST_ADDRESS`].
    pub fn new(sc: &Scenario, port: impl FnMut(Ipv4Addr, u16) -> std::io::Result<u16>) -> Result<Plan, PlanError> {
        Plan::at(sc, DEFAULT_FIRST_ADDRESS, port)
    }

    /// Plans `sc` with its processes at `first` and the addresses after it (a loopback address, with room
    /// for them all below its `.255`, or an error naming `--first-address`). `port(addr, k)` gives port
    /// k (0 = NBD, 1 = admin, [`UDP_REPORTS_PORT`] = a PARDA host's UDP port) of the process at `addr`
    /// (fixed ports from a base, or free ones). Nodes keep their data in `node-NAME`, relative to the
    /// directory the supervisor starts them in.
    pub fn at(
        sc: &Scenario,
        first: Ipv4Addr,
        mut port: impl FnMut(Ipv4Addr, u16) -> std::io::Result<u16>,
    ) -> Result<Plan, PlanError> {
        check_first(first)?;
        let unsupported = |feature: &str, why: &str| PlanError::Unsupported {
            scenario: sc.label(),
            feature: feature.into(),
            why: if why.is_empty() { String::new() } else { format!(": {why}") },
        };
        let invalid = |reason: Invalid| PlanError::Invalid { scenario: sc.label(), reason: Box::new(reason) };
        // Names become file names in the run's directory (node-SERVER/, TENANT.img, gateway-TENANT.toml):
        // one with a '/' or a leading '.' reached out of it ("../x" wrote x.img beside the directory).
        let servers = sc.servers().iter().map(|s| ("server", &s.name));
        let tenants = sc.tenants().iter().map(|t| ("tenant", &t.name));
        for (what, name) in servers.chain(tenants).chain(sc.hosts().iter().map(|h| ("host", &h.name))) {
            if !file_name_safe(name) {
                return Err(invalid(Invalid::FileName { what, name: name.clone() }));
            }
        }
        if let Some(p) = sc.parda() {
            check_parda(sc, p).map_err(|(f, why)| unsupported(&f, &why))?;
        }
        if sc.net_delay() > Nanos::ZERO {
            return Err(unsupported("network.delay_ms", "the nodes are on loopback; there is no delay to add"));
        }
        // Process i's NBD and admin addresses, and with `udp` a third port (a PARDA host's reports).
        let mut addr3 = |i: usize, udp: bool| -> Result<(SocketAddr, SocketAddr, SocketAddr), PlanError> {
            let h = host(first, i);
            let mut p = |k| port(h, k).map_err(|source| invalid(Invalid::Port { host: h, source }));
            let (nbd, admin) = (SocketAddr::from((h, p(0)?)), SocketAddr::from((h, p(1)?)));
            Ok((nbd, admin, SocketAddr::from((h, if udp { p(UDP_REPORTS_PORT)? } else { 0 }))))
        };
        if let Some(ps) = sc.pshift() {
            let processes = sc.servers().len() + usize::from(ps.controller);
            let what = match ps.controller {
                true => format!("{} servers and a controller", sc.servers().len()),
                false => format!("{} servers", sc.servers().len()),
            };
            check_room(first, processes, &what).map_err(|e| invalid(Invalid::Room(e)))?;
            let (nodes, controller) =
                pshift::processes(sc, ps, |i| addr3(i, false).map(|(nbd, admin, _)| (nbd, admin)))?;
            let endpoints = sc
                .tenants()
                .iter()
                .zip(&ps.buckets)
                .map(|(t, b)| {
                    let servers = pshift::bucket_servers(b);
                    Endpoint {
                        tenant: t.name.clone(),
                        nbd: nodes[servers[0]].nbd,
                        export: t.name.clone(),
                        node_admins: servers.iter().map(|&i| nodes[i].admin).collect(),
                        gateway: false,
                        stripe: None,
                        direct: servers.iter().map(|&i| nodes[i].nbd).collect(),
                        phases: pshift::phases(b, &servers),
                        arrivals: pshift::arrivals(ps, b),
                        servers,
                    }
                })
                .collect();
            return Ok(Plan {
                name: sc.name().to_string(),
                nodes,
                gateways: Vec::new(),
                host_admins: Vec::new(),
                endpoints,
                controller,
                parda_key: false,
            });
        }
        let multi: Vec<usize> = (0..sc.tenants().len()).filter(|&j| sc.tenants()[j].servers.len() > 1).collect();
        let processes = sc.servers().len() + multi.len() + sc.hosts().len();
        let what = format!(
            "{} servers, {} tenants over several servers and {} PARDA hosts",
            sc.servers().len(),
            multi.len(),
            sc.hosts().len()
        );
        check_room(first, processes, &what).map_err(|e| invalid(Invalid::Room(e)))?;
        let mut nodes = Vec::with_capacity(sc.servers().len());
        for (i, s) in sc.servers().iter().enumerate() {
            let (nbd, admin, _) = addr3(i, false)?;
            let users: Vec<(&Tenant, usize)> =
                sc.tenants().iter().filter_map(|t| t.servers.iter().position(|&x| x == i).map(|k| (t, k))).collect();
            // Only where its gateways speak the storage-node protocol (module comment): under mclock,
            // sfq as LFQ or fifo the node's [node] did nothing but draw a warning.
            let node = !multi.is_empty() && s.distributed;
            let text = node_config(sc, s, nbd, admin, &format!("node-{}", s.name), &users, node)
                .map_err(|e| invalid(Invalid::Config(e)))?;
            nodes.push(NodePlan { name: s.name.clone(), nbd, admin, config: text });
        }
        let mut gateways = Vec::new();
        let mut host_admins = Vec::new();
        // PARDA hosts: a gateway each (after the nodes, at the next addresses), its VMs' endpoints there.
        let mut host_nbd = Vec::with_capacity(sc.hosts().len());
        if let Some(p) = sc.parda() {
            let mut addrs = Vec::with_capacity(sc.hosts().len());
            for h in 0..sc.hosts().len() {
                addrs.push(addr3(sc.servers().len() + h, true)?);
            }
            for (h, hp) in sc.hosts().iter().enumerate() {
                let (nbd, admin, udp) = addrs[h];
                let peers: Vec<(u32, SocketAddr)> = sc
                    .hosts()
                    .iter()
                    .enumerate()
                    .filter(|&(g, o)| g != h && o.runs_parda(p))
                    .map(|(g, _)| (g as u32, addrs[g].2))
                    .collect();
                let text = host_config(sc, p, h, &nodes[hp.server], nbd, admin, udp, &peers)
                    .map_err(|e| invalid(Invalid::Config(e)))?;
                let udp = publishes(hp, p).then_some(udp);
                gateways.push(GatewayPlan { tenant: format!("host-{}", hp.name), nbd, admin, udp, config: text });
                host_admins.push(admin);
                host_nbd.push(nbd);
            }
        }
        let mut endpoints = Vec::with_capacity(sc.tenants().len());
        for t in sc.tenants() {
            let node_admins = t.servers.iter().map(|&i| nodes[i].admin).collect();
            if let Some(h) = t.host {
                // A VM opens its export on its host; the host sends to the array.
                endpoints.push(Endpoint {
                    tenant: t.name.clone(),
                    nbd: host_nbd[h],
                    export: t.name.clone(),
                    servers: t.servers.clone(),
                    node_admins,
                    gateway: true,
                    stripe: None,
                    direct: Vec::new(),
                    phases: Vec::new(),
                    arrivals: None,
                });
                continue;
            }
            if t.servers.len() == 1 {
                endpoints.push(Endpoint {
                    tenant: t.name.clone(),
                    nbd: nodes[t.servers[0]].nbd,
                    export: t.name.clone(),
                    servers: t.servers.clone(),
                    node_admins,
                    gateway: false,
                    stripe: None,
                    direct: Vec::new(),
                    phases: Vec::new(),
                    arrivals: None,
                });
                continue;
            }
            let (nbd, admin, _) = addr3(sc.servers().len() + gateways.len(), false)?;
            debug_assert!(sc.hosts().is_empty(), "a PARDA scenario's tenants are VMs on hosts or on one server");
            let text = gateway_config(sc, t, &nodes, nbd, admin).map_err(|e| invalid(Invalid::Stripe(e)))?;
            let (unit_kb, w) = stripe(t).map_err(|e| invalid(Invalid::Stripe(e)))?;
            let w: Vec<u32> = w.iter().map(|&x| x as u32).collect();
            let layout = Stripe::new(unit_kb * 1024, &w)
                .map_err(|source| invalid(Invalid::Layout { tenant: t.name.clone(), source }))?;
            gateways.push(GatewayPlan { tenant: t.name.clone(), nbd, admin, udp: None, config: text });
            endpoints.push(Endpoint {
                tenant: t.name.clone(),
                nbd,
                export: t.name.clone(),
                servers: t.servers.clone(),
                node_admins,
                gateway: true,
                stripe: Some((layout, export_mb(t) << 20)),
                direct: Vec::new(),
                phases: Vec::new(),
                arrivals: None,
            });
        }
        // Hosts that exchange reports (over UDP) sign them.
        let parda_key = sc.parda().is_some_and(|p| sc.hosts().iter().any(|h| publishes(h, p)));
        Ok(Plan { name: sc.name().to_string(), nodes, gateways, host_admins, endpoints, controller: None, parda_key })
    }
}

/// A PARDA feature a real cluster cannot run: `(feature, why)`.
fn check_parda(sc: &Scenario, p: &Parda) -> Result<(), (String, String)> {
    if p.delay > Nanos::ZERO {
        let why = "the hosts' reports take as long as UDP takes on loopback";
        return Err(("parda.aggregation_delay_ms".into(), why.into()));
    }
    // (The hosts' local scheduler gets the scenario's [mclock] in their gw.toml, [parda]'s batching over
    // it in the gateway as in the simulator.)
    let _ = sc;
    Ok(())
}

/// The `[parda]` table for `p`, checked to read back as `p` (invariant 1).
pub fn parda_table(p: &Parda) -> Result<String, TableError> {
    let c = &p.config;
    let mut t = format!(
        "[parda]\nlatency_threshold_ms = {}\nalpha = {}\ngamma = {}\nperiod_s = {}\nw_min = {}\nw_max = {}\n",
        f(c.latency_threshold.0 as f64 / 1e6),
        f(c.alpha),
        f(c.gamma),
        f(c.period.0 as f64 / 1e9),
        f(c.w_min),
        f(c.w_max)
    );
    if let Some(w) = c.initial_window {
        let _ = writeln!(t, "initial_window = {}", f(w));
    }
    if c.size_model != rein_core::parda::SizeModel::NONE {
        let _ = writeln!(
            t,
            "size_model = {{ fixed_ms = {}, transfer_mb_s = {} }}",
            f(c.size_model.fixed_ns / 1e6),
            f(1e3 / c.size_model.per_byte_ns)
        );
    }
    let _ = write!(
        t,
        "aggregation = {}\naggregation_timeout_s = {}\nbeta_per_share = {}\nadjust_beta = {}\n\
         local_scheduler = {}\nbatch = {}\nbatch_distance_kb = {}\nenabled = {}\n",
        q(p.aggregation.name()),
        f(p.timeout.0 as f64 / 1e9),
        f(p.beta_per_share),
        c.adjust_beta,
        q(p.local_scheduler.name()),
        p.batch,
        f(p.batch_distance as f64 / 1024.0),
        p.enabled
    );
    #[derive(serde::Deserialize)]
    struct Table {
        parda: rein_model::parda_settings::PardaFile,
    }
    let back: Table = toml::from_str(&t).map_err(|e| TableError::Parse { table: "[parda]", source: Box::new(e) })?;
    let back = back.parda.validate().map_err(TableError::Parda)?;
    let near = |a: u64, b: u64| a.abs_diff(b) <= 1;
    let eq = |x: f64, y: f64| (x - y).abs() <= 1e-12 * x.abs().max(y.abs());
    let (b, d) = (&back.config, c);
    let same = near(b.latency_threshold.0, d.latency_threshold.0)
        && near(b.period.0, d.period.0)
        && near(back.timeout.0, p.timeout.0)
        && (b.alpha, b.gamma, b.w_min, b.w_max, b.initial_window, b.adjust_beta)
            == (d.alpha, d.gamma, d.w_min, d.w_max, d.initial_window, d.adjust_beta)
        && eq(b.size_model.fixed_ns, d.size_model.fixed_ns)
        && eq(b.size_model.per_byte_ns, d.size_model.per_byte_ns)
        && (back.aggregation, back.beta_per_share, back.local_scheduler, back.batch, back.batch_distance, back.enabled)
            == (p.aggregation, p.beta_per_share, p.local_scheduler, p.batch, p.batch_distance, p.enabled);
    if !same {
        return Err(TableError::PardaBack { written: Box::new(p.clone()), back: Box::new(back) });
    }
    Ok(t)
}

/// Whether `host` exchanges reports with the other hosts (over UDP, signed with the run's key): it runs
/// PARDA with the cluster's latency.
fn publishes(host: &Host, p: &Parda) -> bool {
    host.runs_parda(p) && p.aggregation == Aggregation::Cluster
}

/// PARDA host `h`'s gw.toml: its VMs as tenants with an export each on `array` (plain NBD), the scenario's
/// `[parda]`, and `[parda_host]` with its UDP socket `udp` and the other PARDA hosts' (`peers`).
#[allow(clippy::too_many_arguments)]
fn host_config(
    sc: &Scenario,
    p: &Parda,
    h: usize,
    array: &NodePlan,
    nbd: SocketAddr,
    admin: SocketAddr,
    udp: SocketAddr,
    peers: &[(u32, SocketAddr)],
) -> Result<String, ConfigWriteError> {
    let host = &sc.hosts()[h];
    let vms: Vec<&Tenant> = host.vms.iter().map(|&t| &sc.tenants()[t]).collect();
    let bound: u64 = vms.iter().map(|t| in_flight_bound(t, sc.duration())).fold(0, u64::saturating_add);
    let mut g = format!(
        "# rein cluster: PARDA host {} of scenario {}\nlisten = {}\nadmin = {}\nshutdown_timeout_s = 2\n\
         connections_per_node = {}\nrequest_timeout_s = {}\n{}",
        host.name,
        sc.name(),
        q(&nbd.to_string()),
        q(&admin.to_string()),
        pool_for(bound),
        request_timeout_s(sc.duration()),
        budget_lines(&vms, sc.duration())
    );
    let _ = write!(
        g,
        "\n[[nodes]]\nname = {}\naddress = {}\nprotocol = \"nbd\"\n",
        q(&array.name),
        q(&array.nbd.to_string())
    );
    for t in &vms {
        g.push('\n');
        g.push_str(&tenant_entry(&t.name, &t.spec));
        let _ = writeln!(
            g,
            "[[exports]]\nname = {}\ntenant = {}\nsize_mb = {}\nnode_export = {}",
            q(&t.name),
            q(&t.name),
            export_mb(t),
            q(&t.name)
        );
    }
    g.push('\n');
    g.push_str(&parda_table(p).map_err(ConfigWriteError::Table)?);
    // The local scheduler's settings: the scenario's, as the simulator's hosts run them.
    g.push('\n');
    g.push_str(&mclock_table(&sc.sched()).map_err(ConfigWriteError::Table)?);
    let _ = write!(g, "\n[parda_host]\nid = {h}\ncontrolled = {}\n", host.controlled);
    if let Some(b) = host.beta {
        let _ = writeln!(g, "beta = {}", f(b));
    }
    if let Some(w) = host.window {
        let _ = writeln!(g, "window = {}", f(w));
    }
    if publishes(host, p) {
        let list: Vec<String> =
            peers.iter().map(|(id, a)| format!("{{ id = {id}, address = {} }}", q(&a.to_string()))).collect();
        let _ = writeln!(g, "udp = {}\npeers = [{}]", q(&udp.to_string()), list.join(", "));
        // Signed reports, as an operator would run them on a real network (Plan::parda_key).
        let _ = writeln!(g, "key_file = {}", q(PARDA_KEY_FILE));
    }
    Ok(g)
}

/// The export size (MiB) a tenant's workload needs: its span (at least its request size), at least 1 MiB.
pub fn export_mb(t: &Tenant) -> u64 {
    let bytes = t.workload.span_bytes.max(t.workload.size_bytes).max(1);
    bytes.div_ceil(1 << 20).clamp(1, MAX_EXPORT_MB)
}

/// Moves a volume `offset` (of a `len`-byte request) into node `k`'s units: the same round and place in
/// the unit, in node k's unit `(u mod W) mod w_k` of that round (u the unit's index), so that offsets
/// drawn uniformly over the volume land uniformly over node k's part; the round before when the request
/// would pass the volume's end. An offset is returned unchanged when node k has no units. A request no
/// longer than the unit that would cross the unit's end is moved back to end with it, so it stays on node
/// k (a trace record's offset keeps no alignment); a longer one still spans nodes.
pub fn aim(stripe: &Stripe, k: usize, offset: u64, len: u64, volume: u64) -> u64 {
    let unit = stripe.unit();
    let widths: Vec<u64> = (0..stripe.nodes()).map(|j| stripe.node_bytes(j, 1) / unit).collect();
    let (w, round): (u64, u64) = (widths[k], widths.iter().sum());
    if w == 0 {
        return offset;
    }
    let start: u64 = widths[..k].iter().sum();
    let u = offset / unit;
    let mut r = u / round;
    let place = if len <= unit { (offset % unit).min(unit - len) } else { offset % unit };
    let at = |r: u64| (r * round + start + (u % round) % w) * unit + place;
    while r > 0 && at(r) + len > volume {
        r -= 1;
    }
    at(r)
}

/// Routing shares as stripe widths: small integers in the same ratios. Integer shares are reduced by
/// their gcd; others are scaled to the smallest integers within 1% of the ratios. A zero share is a
/// zero width (the node is not used). Errors name the shares.
pub fn widths(shares: &[f64]) -> Result<Vec<u64>, SharesError> {
    let min = shares.iter().copied().filter(|&s| s > 0.0).fold(f64::INFINITY, f64::min);
    if !min.is_finite() || shares.iter().any(|s| !(s.is_finite() && *s >= 0.0)) {
        return Err(SharesError::Invalid { shares: shares.to_vec() });
    }
    let ratios: Vec<f64> = shares.iter().map(|s| s / min).collect();
    for m in 1..=1000u64 {
        let w: Vec<u64> = ratios.iter().map(|r| (r * m as f64).round() as u64).collect();
        let close = ratios.iter().zip(&w).all(|(r, &w)| (w as f64 - r * m as f64).abs() <= 0.01 * r * m as f64);
        if close && w.iter().zip(shares).all(|(&w, &s)| (w > 0) == (s > 0.0)) {
            let g = w.iter().copied().fold(0, gcd);
            let w: Vec<u64> = w.iter().map(|x| x / g).collect();
            if w.iter().sum::<u64>() > MAX_WIDTH_SUM {
                break;
            }
            return Ok(w);
        }
    }
    Err(SharesError::TooWide { shares: shares.to_vec() })
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A TOML string literal.
fn q(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A float as TOML writes it (always with a point or exponent; `inf` for infinity).
fn f(x: f64) -> String {
    if x.is_infinite() {
        "inf".into()
    } else if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.1}")
    } else {
        format!("{x:?}")
    }
}

/// The `[mclock]` table for `c`, checked to read back as `c` (invariant 1).
pub fn mclock_table(c: &SchedConfig) -> Result<String, TableError> {
    let count = |v: Option<u32>| v.map_or("\"none\"".to_string(), |n| n.to_string());
    let lag = match c.reservation_lag {
        ReservationLag::Arrival => "arrival".to_string(),
        ReservationLag::Unbounded => "unbounded".to_string(),
        ReservationLag::Bounded(n) => format!("{}ns", n.0),
    };
    let cost = match c.cost_model {
        CostModel::PerIo => "\"io\"".to_string(),
        CostModel::PerByte { unit_bytes: 1 } => "\"bytes\"".to_string(),
        // knee = Tm * Bpeak: Tm = 1 ms, Bpeak = knee / 1 ms (checked below).
        CostModel::SeekTransfer { knee_bytes } => format!("{{ tm_ms = 1.0, bpeak_mb_s = {} }}", f(knee_bytes / 1e3)),
        other => return Err(TableError::CostModel(other)),
    };
    let pool = match c.pool_return {
        None => "pool_return = \"off\"\n".to_string(),
        Some(p) => format!("pool_return = \"{}ns\"\npool_return_lag_ios = {}\n", p.window.0, p.lag_ios),
    };
    let text = format!(
        "[mclock]\npreset = \"rein\"\nweight_lead_ios = {}\nlimit_burst_ios = {}\nreservation_lag = {}\n\
         limited_reenter_at_vnow = {}\nlimit_mode = {}\ncost_model = {cost}\nbatch = {}\nbatch_distance_kb = {}\n\
         {pool}",
        count(c.weight_lead_ios),
        count(c.limit_burst_ios),
        q(&lag),
        c.limited_reenter_at_vnow,
        q(match c.limit_mode {
            LimitMode::Strict => "strict",
            LimitMode::BreakWhenIdle => "break_when_idle",
        }),
        c.batch,
        f(c.batch_distance as f64 / 1024.0),
    );
    #[derive(serde::Deserialize)]
    struct Table {
        mclock: SchedSettingsFile,
    }
    let back: Table =
        toml::from_str(&text).map_err(|e| TableError::Parse { table: "[mclock]", source: Box::new(e) })?;
    let back = back.mclock.resolve().map_err(TableError::Mclock)?;
    if back != *c {
        return Err(TableError::MclockBack { written: Box::new(*c), back: Box::new(back) });
    }
    Ok(text)
}

/// The `[device_model]` table for `d`, checked to read back as `d` (invariant 1).
pub fn device_table(d: &DeviceSpec, seed: u64, stream: u64) -> Result<String, TableError> {
    let mut t = format!("[device_model]\ncapacity_iops = {}\n", f(d.capacity_iops));
    let mut disk = None;
    match d.service {
        ServiceModel::Exponential => t.push_str("service = \"exponential\"\n"),
        ServiceModel::Deterministic => t.push_str("service = \"deterministic\"\n"),
        ServiceModel::Uniform { spread } => {
            let _ = writeln!(t, "service = \"uniform\"\nuniform_spread = {}", f(spread));
        }
        ServiceModel::Disk(m) => {
            let p = DiskParams {
                seek_ms: m.seek_ns / 1e6,
                rotation_ms: m.rotation_ns / 1e6,
                transfer_mb_s: m.transfer_bytes_per_ns * 1e3,
                sequential_kb: m.sequential_bytes as f64 / 1024.0,
            };
            let _ = writeln!(
                t,
                "service = \"disk\"\ndisk = {{ seek_ms = {}, rotation_ms = {}, transfer_mb_s = {}, sequential_kb = {} }}",
                f(p.seek_ms),
                f(p.rotation_ms),
                f(p.transfer_mb_s),
                f(p.sequential_kb)
            );
            disk = Some(p);
        }
    }
    let transfer = (d.ns_per_byte > 0.0).then(|| 1e3 / d.ns_per_byte);
    if let Some(x) = transfer {
        let _ = writeln!(t, "transfer_mb_s = {}", f(x));
    }
    let _ = writeln!(t, "discipline = \"{}\"", d.discipline.name());
    let array = match d.discipline {
        Discipline::Array(a) => {
            let p = a.params();
            let _ = writeln!(t, "array = {{ disks = {}, stripe_kb = {}, raid = {} }}", p.disks, f(p.stripe_kb), p.raid);
            Some(p)
        }
        _ => None,
    };
    let steps: Vec<rein_model::device::CapacityStep> = d
        .schedule
        .iter()
        .skip(1)
        .map(|&(at, iops)| rein_model::device::CapacityStep { at_s: at.as_secs_f64(), iops })
        .collect();
    if !steps.is_empty() {
        let list: Vec<String> =
            steps.iter().map(|s| format!("{{ at_s = {}, iops = {} }}", f(s.at_s), f(s.iops))).collect();
        let _ = writeln!(t, "capacity_schedule = [{}]", list.join(", "));
    }
    let _ = writeln!(t, "seed = {seed}\nstream = {stream}");
    let service = match d.service {
        ServiceModel::Exponential => "exponential",
        ServiceModel::Deterministic => "deterministic",
        ServiceModel::Uniform { .. } => "uniform",
        ServiceModel::Disk(_) => "disk",
    };
    let back = DeviceParams {
        capacity_iops: d.capacity_iops,
        service,
        uniform_spread: match d.service {
            ServiceModel::Uniform { spread } => Some(spread),
            _ => None,
        },
        disk,
        transfer_mb_s: transfer,
        discipline: Some(d.discipline.name()),
        array,
        capacity_schedule: steps,
    }
    .validate()
    .map_err(TableError::Device)?;
    if !same_device(&back, d) {
        return Err(TableError::DeviceBack { written: Box::new(d.clone()), back: Box::new(back) });
    }
    Ok(t)
}

/// Equal up to the last bits of a float written in decimal and read back (a relative 1e-12).
fn same_device(a: &DeviceSpec, b: &DeviceSpec) -> bool {
    let eq = |x: f64, y: f64| (x - y).abs() <= 1e-12 * x.abs().max(y.abs());
    let service = match (a.service, b.service) {
        (ServiceModel::Disk(x), ServiceModel::Disk(y)) => {
            eq(x.seek_ns, y.seek_ns)
                && eq(x.rotation_ns, y.rotation_ns)
                && eq(x.transfer_bytes_per_ns, y.transfer_bytes_per_ns)
                && x.sequential_bytes == y.sequential_bytes
        }
        (x, y) => x == y,
    };
    service
        && eq(a.capacity_iops, b.capacity_iops)
        && eq(a.ns_per_byte, b.ns_per_byte)
        && a.discipline == b.discipline
        && a.schedule.len() == b.schedule.len()
        && a.schedule.iter().zip(&b.schedule).all(|(x, y)| x.0 == y.0 && eq(x.1, y.1))
}

/// A `[[tenants]]` entry of rein.toml.
fn tenant_entry(name: &str, spec: &QosSpec) -> String {
    let mut t = format!("[[tenants]]\nname = {}\nreservation = {}\n", q(name), f(spec.reservation()));
    if let Some(l) = spec.limit() {
        let _ = writeln!(t, "limit = {}", f(l));
    }
    let _ = writeln!(t, "weight = {}\nidle_credit = {}", f(spec.weight()), spec.idle_credit());
    t
}

/// Server `s`'s rein.toml: `users` are the tenants on it with their index into their own server list;
/// `node` switches the storage-node protocol on (for gateways).
fn node_config(
    sc: &Scenario,
    s: &Server,
    nbd: SocketAddr,
    admin: SocketAddr,
    data: &str,
    users: &[(&Tenant, usize)],
    node: bool,
) -> Result<String, ConfigWriteError> {
    let mut t = format!(
        "# rein cluster: server {} of scenario {}\nlisten = {}\nadmin = {}\ndata_dir = {}\nscheduler = {}\n\
         queue_depth = {}\n# The simulator never refuses a scenario's reservations.\nadmission = \"warn\"\n\
         shutdown_timeout_s = 2\n{}",
        s.name,
        sc.name(),
        q(&nbd.to_string()),
        q(&admin.to_string()),
        q(data),
        q(s.scheduler.name()),
        s.queue_depth,
        budget_lines(&users.iter().map(|&(t, _)| t).collect::<Vec<_>>(), sc.duration())
    );
    if node {
        // The node's own specs win ("node"): they are the scenario's for this server (RBFQ's local minimum
        // included), as the simulator's server sees them; the gateway's hello states the same.
        t.push_str("\n[node]\nenabled = true\nspecs = \"node\"\n");
    }
    t.push('\n');
    let server_table = |table| ServerTableError { server: s.name.clone(), table };
    t.push_str(&mclock_table(&s.sched).map_err(server_table)?);
    t.push('\n');
    t.push_str(&device_table(&s.device, sc.seed(), s.stream as u64).map_err(server_table)?);
    // Placement skew: a PARDA host's service_scale multiplies its VMs' service times at the array.
    let skew: Vec<String> = users
        .iter()
        .filter_map(|&(t, _)| t.host.map(|h| (t, sc.hosts()[h].service_scale)))
        .filter(|&(_, x)| x != 1.0)
        .map(|(t, x)| format!("{} = {}", q(&t.name), f(x)))
        .collect();
    if !skew.is_empty() {
        let _ = writeln!(t, "service_scale = {{ {} }}", skew.join(", "));
    }
    let mut exports = 0;
    for &(tenant, k) in users {
        let widths = if tenant.servers.len() == 1 { vec![1] } else { stripe(tenant)?.1 };
        if widths[k] == 0 {
            // A zero share: the tenant's volume has no stripe here.
            continue;
        }
        exports += 1;
        let size = if tenant.servers.len() == 1 { export_mb(tenant) } else { piece_mb(tenant, widths[k])? };
        // No readahead: the device model sets the timing, and the kernel's readahead of a sparse file
        // zero-fills pages in the dispatcher's thread (`FileMode::readahead`: a 1,000 IOPS limit
        // delivered 947 with it on this VM's 8 MiB window).
        let _ = write!(
            t,
            "\n[[exports]]\nname = {0}\npath = {1}\nsize_mb = {size}\ntenant = {0}\nreadahead = false\n\n",
            q(&tenant.name),
            q(&format!("{}.img", tenant.name))
        );
        t.push_str(&tenant_entry(&tenant.name, &tenant.server_specs[k]));
    }
    end_exports(&mut t, &s.name, exports)?;
    Ok(t)
}

/// A tenant's stripe unit (KiB) and widths over its servers.
pub fn stripe(t: &Tenant) -> Result<(u64, Vec<u64>), StripeError> {
    match &t.routing {
        Routing::Stripe { stripe_bytes } => {
            // The gateway's own bound, checked here so that the plan fails before anything starts (the
            // gateway refused its config at its start, after every node had started; a unit of 2^40
            // KiB made the nodes' pieces too large to create, and 1e30 KiB, saturated to 2^64 - 1 bytes,
            // was called "not whole KiB").
            let max = rein_runtime::gateway::MAX_STRIPE_KB;
            if *stripe_bytes > max * 1024 {
                return Err(StripeError::UnitTooLarge { tenant: t.name.clone(), max });
            }
            if stripe_bytes % 1024 != 0 {
                return Err(StripeError::NotWholeKib { tenant: t.name.clone() });
            }
            Ok((stripe_bytes / 1024, vec![1; t.servers.len()]))
        }
        Routing::Shares(s) => {
            let w = widths(s).map_err(|shares| StripeError::Shares { tenant: t.name.clone(), shares })?;
            Ok((SHARES_STRIPE_KB, w))
        }
        // Each device's records are aimed into its server's units by the load (`JobRoute::devices`).
        Routing::Device(_) => Ok((DEVICE_STRIPE_KB, vec![1; t.servers.len()])),
    }
}

/// The size (MiB) of a node's piece of width `w` of a tenant's striped export (node-spec.md's bound:
/// ceil(size / (W U)) * w * U bytes, rounded up to MiB).
fn piece_mb(t: &Tenant, w: u64) -> Result<u64, StripeError> {
    let (unit_kb, widths) = stripe(t)?;
    let unit = unit_kb * 1024;
    let total: u64 = widths.iter().sum();
    let rounds = (export_mb(t) << 20).div_ceil(total * unit);
    Ok((rounds * w * unit).div_ceil(1 << 20).max(1))
}

/// A gateway's gw.toml for tenant `t` (node-spec.md's gateway config).
fn gateway_config(
    sc: &Scenario,
    t: &Tenant,
    nodes: &[NodePlan],
    nbd: SocketAddr,
    admin: SocketAddr,
) -> Result<String, StripeError> {
    let (unit_kb, widths) = stripe(t)?;
    let mut g = format!(
        "# rein cluster: tenant {} of scenario {}\nlisten = {}\nadmin = {}\nshutdown_timeout_s = 2\n",
        t.name,
        sc.name(),
        q(&nbd.to_string()),
        q(&admin.to_string())
    );
    // Room at each node and at the front for everything the tenant can have outstanding (in_flight_bound),
    // and no timeout within the run.
    let _ = write!(
        g,
        "connections_per_node = {}\nrequest_timeout_s = {}\n{}",
        pool_per_node(t, sc.duration()),
        request_timeout_s(sc.duration()),
        budget_lines(&[t], sc.duration())
    );
    for &i in &t.servers {
        // Tags (delta, rho, the pool flag) only where the simulator's gateway sends them: to a server of a
        // distributed scheduler (dmclock, rbfq, dtfq). To any other (lfq, sfq, mclock, fifo) its requests
        // carry none, so the gateway speaks plain NBD there: a node's SFQ given a delta would space its
        // tags by the service elsewhere, and LFQ would run as DT-FQ.
        let protocol = if sc.servers()[i].distributed { "rein" } else { "nbd" };
        let _ = write!(
            g,
            "\n[[nodes]]\nname = {}\naddress = {}\nprotocol = \"{protocol}\"\n",
            q(&nodes[i].name),
            q(&nodes[i].nbd.to_string()),
        );
    }
    let spec = &t.spec;
    let _ = write!(g, "\n[[tenants]]\nname = {}\nreservation = {}\n", q(&t.name), f(spec.reservation()));
    if let Some(l) = spec.limit() {
        let _ = writeln!(g, "limit = {}", f(l));
    }
    let split = match t.reservation_split {
        rein_core::ReservationSplit::Rho => "rho",
        _ => "spread",
    };
    let _ = writeln!(
        g,
        "weight = {}\nidle_credit = {}\nreservation_split = \"{split}\"",
        f(spec.weight()),
        spec.idle_credit()
    );
    let locals: Vec<String> = t
        .servers
        .iter()
        .zip(&t.server_specs)
        .filter(|(_, s)| *s != spec)
        .map(|(&i, s)| format!("{} = {}", q(&sc.servers()[i].name), f(s.reservation())))
        .collect();
    if !locals.is_empty() {
        let _ = writeln!(g, "server_reservations = {{ {} }}", locals.join(", "));
    }
    let ws: Vec<String> = t
        .servers
        .iter()
        .zip(&widths)
        .filter(|(_, &w)| w > 0)
        .map(|(&i, w)| format!("{} = {w}", q(&sc.servers()[i].name)))
        .collect();
    let _ = write!(
        g,
        "\n[[exports]]\nname = {0}\ntenant = {0}\nsize_mb = {1}\nstripe_kb = {unit_kb}\nwidths = {{ {2} }}\n",
        q(&t.name),
        export_mb(t),
        ws.join(", ")
    );
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::Duration;

    /// Every rule a node can be told reads back as itself, `pool_return` on, off and set.
    #[test]
    fn the_mclock_table_reads_back_for_every_pool_rule() {
        use rein_core::PoolReturn;
        let set = PoolReturn { window: rein_core::Nanos(25_000_000), lag_ios: 7 };
        for c in [
            SchedConfig::default(),
            SchedConfig::paper(),
            SchedConfig { pool_return: Some(set), ..SchedConfig::paper() },
        ] {
            let text = mclock_table(&c).unwrap();
            assert_eq!(text.contains("pool_return = \"off\""), c.pool_return.is_none(), "{text}");
        }
    }

    #[test]
    fn integer_shares_reduce_by_their_gcd() {
        assert_eq!(widths(&[1.0, 1.0, 1.0]).unwrap(), vec![1, 1, 1]);
        assert_eq!(widths(&[2.0, 4.0, 6.0]).unwrap(), vec![1, 2, 3]);
        assert_eq!(widths(&[3.0, 0.0, 6.0]).unwrap(), vec![1, 0, 2]);
    }

    #[test]
    fn fractional_shares_scale_within_one_percent() {
        assert_eq!(widths(&[0.5, 0.25, 0.25]).unwrap(), vec![2, 1, 1]);
        // 1/3 : 2/3 -> 1 : 2 (exact ratios, whatever the rounding of 1/3).
        assert_eq!(widths(&[1.0 / 3.0, 2.0 / 3.0]).unwrap(), vec![1, 2]);
        // 1 : 1.005 is within 1% of 1 : 1.
        assert_eq!(widths(&[1.0, 1.005]).unwrap(), vec![1, 1]);
        // 1 : 1.5 is not 1 : 1 or 1 : 2; it is 2 : 3.
        assert_eq!(widths(&[1.0, 1.5]).unwrap(), vec![2, 3]);
    }

    #[test]
    fn shares_that_need_wide_stripes_are_refused_by_name() {
        // 1 : pi: 6 : 19 is the first within 1% (19/6 is 0.8% above pi).
        assert_eq!(widths(&[1.0, std::f64::consts::PI]).unwrap(), vec![6, 19]);
        // 1 : 2000 is exact, but wider than MAX_WIDTH_SUM units a round.
        let e = widths(&[1.0, 2000.0]).unwrap_err().to_string();
        assert!(e.contains("routing shares [1.0, 2000.0]") && e.contains("1024"), "{e}");
        assert!(widths(&[0.0, 0.0]).unwrap_err().to_string().contains("not all zero"));
    }

    /// Each value a node's or gateway's config cannot carry is refused naming it once: the table, the
    /// tenant or the shares (the caller adds the server and the scenario).
    #[test]
    fn values_a_config_cannot_carry_are_refused_naming_them_once() {
        assert_eq!(
            widths(&[1.0, 2000.0]).unwrap_err().to_string(),
            "routing shares [1.0, 2000.0]: no stripe widths summing to at most 1024 within 1% of their ratios"
        );
        assert_eq!(
            widths(&[0.0, -1.0]).unwrap_err().to_string(),
            "routing shares [0.0, -1.0]: need finite non-negative shares, not all zero"
        );
        let c = SchedConfig { cost_model: CostModel::PerByte { unit_bytes: 4096 }, ..SchedConfig::default() };
        assert_eq!(
            mclock_table(&c).unwrap_err().to_string(),
            "cost model PerByte { unit_bytes: 4096 } has no rein.toml form"
        );
        let sc = Scenario::from_toml(RICH, None).unwrap();
        let mut device = sc.servers()[0].device.clone();
        device.capacity_iops = -1.0;
        let e = device_table(&device, 7, 0).unwrap_err().to_string();
        assert!(e.starts_with("[device_model] as written: ") && e.contains("capacity_iops"), "{e}");
        assert_eq!(e.matches("as written").count(), 1, "{e}");
        let base = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let mut parda = Scenario::load(&base.join("parda-table3.toml")).unwrap().parda().unwrap().clone();
        parda.config.alpha = -1.0;
        let e = parda_table(&parda).unwrap_err().to_string();
        assert!(e.starts_with("[parda] as written: ") && e.contains("alpha"), "{e}");
        assert_eq!(e.matches("as written").count(), 1, "{e}");
        // A tenant's stripe unit: named with the tenant, by stripe and by the node's piece of it.
        let unit = |kb: &str| {
            let text = STRIPED.replace(
                "servers = [\"s2\", \"s3\"]\n",
                &format!("servers = [\"s2\", \"s3\"]\nrouting = {{ stripe_kb = {kb} }}\n"),
            );
            Scenario::from_toml(&text, None).unwrap().tenants().last().unwrap().clone()
        };
        let half = unit("1.5");
        let whole = "tenant f1: stripe_kb must be whole KiB for a gateway";
        assert_eq!(stripe(&half).unwrap_err().to_string(), whole);
        assert_eq!(piece_mb(&half, 1).unwrap_err().to_string(), whole);
        let large = unit("1048577");
        let e = piece_mb(&large, 1).unwrap_err().to_string();
        assert_eq!(
            e,
            "tenant f1: routing stripe_kb must be at most 1048576 (1 GiB) for a gateway, the largest stripe unit rein \
             gateway takes"
        );
        let mut shares = unit("64");
        shares.routing = Routing::Shares(vec![1.0, 2000.0]);
        assert_eq!(
            stripe(&shares).unwrap_err().to_string(),
            "tenant f1: routing shares [1.0, 2000.0]: no stripe widths summing to at most 1024 within 1% of their \
             ratios"
        );
    }

    /// Each refusal is its variant, carrying the values it names (the texts are checked above, unchanged
    /// from the `String` errors).
    #[test]
    fn refusals_are_typed_with_what_they_name() {
        assert_eq!(widths(&[1.0, 2000.0]), Err(SharesError::TooWide { shares: vec![1.0, 2000.0] }));
        assert_eq!(widths(&[0.0, 0.0]), Err(SharesError::Invalid { shares: vec![0.0, 0.0] }));
        let per_byte = CostModel::PerByte { unit_bytes: 4096 };
        let c = SchedConfig { cost_model: per_byte, ..SchedConfig::default() };
        assert!(matches!(mclock_table(&c), Err(TableError::CostModel(m)) if m == per_byte));
        let sc = Scenario::from_toml(RICH, None).unwrap();
        let mut device = sc.servers()[0].device.clone();
        device.capacity_iops = -1.0;
        assert!(matches!(device_table(&device, 7, 0), Err(TableError::Device(_))));
        let base = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let mut parda = Scenario::load(&base.join("parda-table3.toml")).unwrap().parda().unwrap().clone();
        parda.config.alpha = -1.0;
        assert!(matches!(parda_table(&parda), Err(TableError::Parda(_))));
        let mut t = Scenario::from_toml(STRIPED, None).unwrap().tenants().last().unwrap().clone();
        t.routing = Routing::Stripe { stripe_bytes: 1536 };
        assert_eq!(stripe(&t), Err(StripeError::NotWholeKib { tenant: "f1".into() }));
        t.routing = Routing::Shares(vec![0.0, 0.0]);
        let shares = SharesError::Invalid { shares: vec![0.0, 0.0] };
        assert_eq!(piece_mb(&t, 1), Err(StripeError::Shares { tenant: "f1".into(), shares }));
        let first = Ipv4Addr::new(127, 0, 0, 251);
        let e = check_room(first, 5, "5 servers").unwrap_err();
        assert_eq!(e, RoomError { what: "5 servers".into(), processes: 5, first, room: 4 });
        assert_eq!(
            e.to_string(),
            "5 servers need 5 processes, each on its own address; from 127.0.0.251 (--first-address) to \
             127.0.0.254 at most 4 fit"
        );
        let max = rein_runtime::config::MAX_EXPORTS;
        let e = end_exports(&mut String::new(), "s1", max + 1).unwrap_err();
        assert_eq!(e, ExportsError { server: "s1".into(), exports: max + 1, max });
        assert!(end_exports(&mut String::new(), "s1", max).is_ok(), "at the bound");
    }

    /// The config builders' refusals name the server or the table once (the plan adds the scenario, as for
    /// every refusal it makes: `PlanError::Invalid`): a node's `[mclock]` and `[device_model]`
    /// (node_config, with the server), a PARDA host's `[parda]` (host_config, the scenario's table, no
    /// server), a gateway's stripe (gateway_config, with the tenant). A validated scenario reaches none
    /// of them (its tables are those a file can write; the builders read them back as invariant checks)
    /// and cannot be changed into one that does, so each builder is given a changed copy of a server, of
    /// the `[parda]` table or of a tenant.
    #[test]
    fn a_config_builders_refusal_names_the_server_or_table_once() {
        let per_byte = CostModel::PerByte { unit_bytes: 4096 };
        let no_form = "cost model PerByte { unit_bytes: 4096 } has no rein.toml form";
        let base = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let sc = Scenario::from_toml(RICH, None).unwrap();
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        let (nbd, admin) = (plan.nodes[0].nbd, plan.nodes[0].admin);
        let mut s1 = sc.servers()[1].clone();
        s1.sched.cost_model = per_byte;
        let e = node_config(&sc, &s1, nbd, admin, "node-s1", &[], false).unwrap_err();
        assert_eq!(e.to_string(), format!("server {}: {no_form}", s1.name));
        assert!(
            matches!(&e, ConfigWriteError::ServerTable(ServerTableError { server, table: TableError::CostModel(m) }) if *server == s1.name && *m == per_byte),
            "{e:?}"
        );
        let mut s0 = sc.servers()[0].clone();
        s0.device.capacity_iops = -1.0;
        let e = node_config(&sc, &s0, nbd, admin, "node-s0", &[], false).unwrap_err().to_string();
        let head = format!("server {}: [device_model] as written: ", s0.name);
        assert!(e.starts_with(&head) && e.contains("capacity_iops"), "{e}");
        assert_eq!((e.matches("as written").count(), e.matches("server ").count()), (1, 1), "{e}");
        let sc = Scenario::load(&base.join("parda-table3.toml")).unwrap();
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        let mut parda = sc.parda().unwrap().clone();
        parda.config.alpha = -1.0;
        let at = SocketAddr::from(([127, 0, 0, 215], 1));
        let e = host_config(&sc, &parda, 0, &plan.nodes[0], at, at, at, &[]).unwrap_err().to_string();
        assert!(e.starts_with("[parda] as written: ") && e.contains("alpha"), "{e}");
        assert_eq!((e.matches("as written").count(), e.matches("server ").count()), (1, 0), "{e}");
        assert_eq!(ConfigWriteError::Table(TableError::CostModel(per_byte)).to_string(), no_form, "no server named");
        // A gateway's stripe.
        let sc = Scenario::from_toml(STRIPED, None).unwrap();
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        let mut t = sc.tenants().last().unwrap().clone();
        t.routing = Routing::Stripe { stripe_bytes: 1536 };
        let (nbd, admin) = (plan.gateways[0].nbd, plan.gateways[0].admin);
        let e = gateway_config(&sc, &t, &plan.nodes, nbd, admin).unwrap_err();
        assert_eq!(e.to_string(), format!("tenant {}: stripe_kb must be whole KiB for a gateway", t.name));
        assert_eq!(e, StripeError::NotWholeKib { tenant: t.name.clone() });
    }

    const RICH: &str = r#"
name = "rich"
duration_s = 10.0
seed = 7
scheduler = "mclock"
cost_model = { tm_ms = 5, bpeak_mb_s = 60 }
[mclock]
preset = "paper"
reservation_lag = "250us"

[[servers]]
name = "disk"
capacity_iops = 300
service = "disk"
disk = { seek_ms = 3.5, rotation_ms = 4, transfer_mb_s = 120, sequential_kb = 32 }
transfer_mb_s = 250
discipline = "ps"
queue_depth = 4
capacity_schedule = [{ at_s = 3, iops = 150 }, { at_s = 6.5, iops = 450 }]
batch = 8
batch_distance_kb = 1024

[[servers]]
name = "flash"
capacity_iops = 5000
service = "uniform"
uniform_spread = 0.3
queue_depth = 32
scheduler = "sfq"

[[tenants]]
name = "a"
reservation = 100
limit = 400
weight = 2
idle_credit = 3
servers = ["disk"]
[tenants.workload]
kind = "closed"
outstanding = 4
span_gb = 2

[[tenants]]
name = "b"
weight = 1
servers = ["disk"]
server_reservations = { disk = 50 }
[tenants.workload]
kind = "open"
iops = 100

[[tenants]]
name = "c"
servers = ["flash"]
[tenants.workload]
kind = "closed"
outstanding = 1
size_kb = 64
span_gb = 0.0001
"#;

    fn fixed_ports(_: Ipv4Addr, k: u16) -> std::io::Result<u16> {
        Ok(20_000 + k)
    }

    /// Each node's rein.toml, read by `rein serve`'s own parser, holds the scenario's server: scheduler,
    /// queue depth, every scheduler setting, the device model, and its tenants' specs on that server.
    #[test]
    fn a_node_config_means_what_the_scenario_says() {
        let sc = Scenario::from_toml(RICH, None).unwrap();
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        assert_eq!(plan.nodes.len(), 2);
        assert!(plan.gateways.is_empty());
        for (i, (node, server)) in plan.nodes.iter().zip(sc.servers()).enumerate() {
            let cfg = rein_runtime::config::ServerConfig::parse(&node.config, Path::new("node.toml"))
                .unwrap_or_else(|e| panic!("{e}\n{}", node.config));
            assert_eq!(cfg.listen, SocketAddr::from(([127, 0, 0, 10 + i as u8], 20_000)));
            assert_eq!(cfg.admin, SocketAddr::from(([127, 0, 0, 10 + i as u8], 20_001)));
            assert_eq!(cfg.scheduler, server.scheduler);
            assert_eq!(cfg.queue_depth, server.queue_depth as usize);
            let mut want = server.sched;
            want.limits = cfg.sched.limits;
            assert_eq!(cfg.sched, want, "server {}", server.name);
            let dev = cfg.device.expect("a device model");
            assert!(same_device(&dev.spec, &server.device), "{:?} vs {:?}", dev.spec, server.device);
            let users: Vec<(usize, usize)> = sc
                .tenants()
                .iter()
                .enumerate()
                .filter_map(|(j, t)| t.servers.iter().position(|&x| x == i).map(|k| (j, k)))
                .collect();
            assert_eq!(cfg.tenants.len(), users.len());
            for (tc, &(j, k)) in cfg.tenants.iter().zip(&users) {
                assert_eq!(tc.name, sc.tenants()[j].name);
                assert_eq!(tc.spec, sc.tenants()[j].server_specs[k]);
            }
            // The files are read without the kernel's readahead (a stall of the node's dispatcher).
            assert!(!cfg.exports.is_empty() && cfg.exports.iter().all(|e| !e.readahead), "{}", node.config);
        }
        // The paper's preset, the lag, the cost model and the batching made it through (not defaults).
        let disk = &sc.servers()[0].sched;
        assert_eq!(disk.batch, 8);
        assert_eq!(disk.reservation_lag, ReservationLag::Bounded(Nanos(250_000)));
        assert!(matches!(disk.cost_model, CostModel::SeekTransfer { .. }));
        assert_eq!(sc.servers()[0].device.schedule.len(), 3);
        // Tenant b's local reservation on its one server is its reservation there.
        assert_eq!(sc.tenants()[1].server_specs[0].reservation(), 50.0);
        // Exports: the span (2 GiB), the default span, and at least 1 MiB.
        assert_eq!(export_mb(&sc.tenants()[0]), 2048);
        assert_eq!(export_mb(&sc.tenants()[2]), 1);
        let e = &plan.endpoints[2];
        assert_eq!(e.uri(), "nbd://127.0.0.11:20000/c");
        assert_eq!(e.node_admins, vec![SocketAddr::from(([127, 0, 0, 11], 20_001))]);
    }

    fn refused(text: &str) -> String {
        let sc = Scenario::from_toml(text, None).unwrap();
        Plan::new(&sc, fixed_ports).unwrap_err().to_string()
    }

    const ONE: &str =
        "name = \"x\"\nduration_s = 2.0\n[[servers]]\nname = \"s1\"\ncapacity_iops = 100\nqueue_depth = 1\n";

    #[test]
    fn what_a_real_cluster_cannot_run_is_refused_by_name() {
        let e = refused(&format!(
            "{ONE}[network]\ndelay_ms = 1\n[[tenants]]\nname = \"t\"\n[tenants.workload]\nkind = \"closed\"\n"
        ));
        assert!(e.contains("network.delay_ms cannot run on a real cluster"), "{e}");
        let base = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        // Placement skew goes to the array's device model, per VM.
        let skew = Scenario::load(&base.join("parda-table3.toml")).unwrap();
        let plan = Plan::new(&skew, fixed_ports).unwrap();
        let node = rein_runtime::config::ServerConfig::parse(&plan.nodes[0].config, Path::new("rein.toml")).unwrap();
        let scales = &node.device.as_ref().unwrap().service_scale;
        for h in skew.hosts() {
            for &t in &h.vms {
                let want = if h.service_scale == 1.0 { None } else { Some(h.service_scale) };
                let got = scales.iter().find(|(n, _)| *n == skew.tenants()[t].name).map(|x| x.1);
                assert_eq!(got, want, "VM {} of host {}", skew.tenants()[t].name, h.name);
            }
        }
        // The paper's round robin (and the controller without early rounds) is one setting on the nodes.
        let paper = Scenario::load(&base.join("pshift-exp4-paper-order.toml")).unwrap();
        let plan = Plan::new(&paper, fixed_ports).unwrap();
        let node = rein_runtime::config::ServerConfig::parse(&plan.nodes[0].config, Path::new("rein.toml")).unwrap();
        assert_eq!(node.token.r_order, rein_core::pshift::tokens::ROrder::RoundRobin);
    }

    /// A file name a scenario's name cannot be and a port the plan cannot find are refused with the
    /// scenario named once, then what is wrong (exact texts, as when `PlanError::Invalid` held a String).
    #[test]
    fn a_name_and_a_port_refusal_read_as_before() {
        let tenant = "[[tenants]]\nname = \"../x\"\n[tenants.workload]\nkind = \"closed\"\n";
        let sc = Scenario::from_toml(&format!("{ONE}{tenant}"), None).unwrap();
        let e = Plan::new(&sc, fixed_ports).unwrap_err();
        let PlanError::Invalid { reason, .. } = &e else { panic!("{e:?}") };
        assert!(matches!(&**reason, Invalid::FileName { what: "tenant", name } if name == "../x"), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "scenario {}: tenant name \"../x\": rein cluster names files after it in the run's directory; use \
                 letters, digits, '.', '_' and '-', not starting with '.'",
                sc.label()
            )
        );
        let tenant = "[[tenants]]\nname = \"t\"\n[tenants.workload]\nkind = \"closed\"\n";
        let sc = Scenario::from_toml(&format!("{ONE}{tenant}"), None).unwrap();
        let no_port = |_: Ipv4Addr, _: u16| Err(std::io::Error::other("none left"));
        let e = Plan::at(&sc, Ipv4Addr::new(127, 0, 0, 226), no_port).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("scenario {}: no free port on 127.0.0.226: none left (give --base-port)", sc.label())
        );
        let PlanError::Invalid { reason, .. } = &e else { panic!("{e:?}") };
        assert!(matches!(&**reason, Invalid::Port { host, .. } if *host == Ipv4Addr::new(127, 0, 0, 226)), "{e:?}");
        let source = std::error::Error::source(&e).expect("the reason is the source");
        assert_eq!(source.to_string(), "no free port on 127.0.0.226: none left (give --base-port)");
    }

    /// Names become file names in the run's directory: one that would reach out of it ("../x" wrote x.img
    /// beside it) is refused by name; a server no tenant uses (or only with a zero share) gets an unused
    /// export, as `rein serve` needs one (it failed to start); a node past `rein serve`'s
    /// exports is refused here, not by the child.
    #[test]
    fn names_files_and_exports_fit_what_a_node_takes() {
        let tenant = |name: &str| format!("[[tenants]]\nname = {name:?}\n[tenants.workload]\nkind = \"closed\"\n");
        for bad in ["../../x", "/tmp/abs", ".hidden", "a b"] {
            let e = refused(&format!("{ONE}{}", tenant(bad)));
            assert!(e.contains(&format!("tenant name {bad:?}")) && e.contains("letters, digits"), "{e}");
        }
        let e = refused(&format!(
            "name = \"x\"\nduration_s = 1.0\n[[servers]]\nname = \"r/s0\"\ncapacity_iops = 100\n{}",
            tenant("t")
        ));
        assert!(e.contains("server name \"r/s0\""), "{e}");
        let idle = format!(
            "{ONE}[[servers]]\nname = \"s2\"\ncapacity_iops = 100\n[[tenants]]\nname = \"t\"\nservers = [\"s1\"]\n\
             [tenants.workload]\nkind = \"closed\"\n"
        );
        let plan = Plan::new(&Scenario::from_toml(&idle, None).unwrap(), fixed_ports).unwrap();
        for n in &plan.nodes {
            let node = rein_runtime::config::ServerConfig::parse(&n.config, Path::new("rein.toml"));
            assert!(node.is_ok(), "node {}: {:?}", n.name, node.err());
        }
        assert!(plan.nodes[1].config.contains("name = \"unused\""), "{}", plan.nodes[1].config);
        let mut many = format!("name = \"m\"\nduration_s = 1.0\n{}", &ONE[ONE.find("[[servers]]").unwrap()..]);
        for i in 0..=rein_runtime::config::MAX_EXPORTS {
            many.push_str(&tenant(&format!("t{i}")));
        }
        let e = refused(&many);
        assert!(e.contains("server s1: 4097 tenants use it, and a rein serve node takes at most 4096"), "{e}");
    }

    #[test]
    fn more_processes_than_loopback_addresses_are_refused() {
        let mut text = String::from("name = \"many\"\nduration_s = 1.0\n");
        for i in 0..=MAX_PROCESSES {
            text.push_str(&format!("[[servers]]\nname = \"s{i}\"\ncapacity_iops = 100\nqueue_depth = 1\n"));
        }
        text.push_str("[[tenants]]\nname = \"t\"\nservers = [\"s0\"]\n[tenants.workload]\nkind = \"closed\"\n");
        let e = refused(&text);
        assert!(e.contains("246 processes") && e.contains("at most 245"), "{e}");
        // At the bound it plans.
        let at = text.replacen(
            &format!("[[servers]]\nname = \"s{MAX_PROCESSES}\"\ncapacity_iops = 100\nqueue_depth = 1\n"),
            "",
            1,
        );
        let sc = Scenario::from_toml(&at, None).unwrap();
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        assert_eq!(plan.nodes.last().unwrap().nbd.ip(), std::net::IpAddr::from([127, 0, 0, 254]));
    }

    /// The processes start at the first address given and follow it, nodes then gateways (each node's
    /// config listens there, each gateway reaches its nodes there), up to the bound: the last process at
    /// .254. Past the bound, off loopback, or at .0 or .255 the first address is refused naming
    /// `--first-address`; elsewhere in 127.0.0.0/8 it plans.
    #[test]
    fn processes_start_at_the_first_address_with_room_up_to_254() {
        let sc = Scenario::from_toml(STRIPED, None).unwrap();
        let plan = Plan::at(&sc, Ipv4Addr::new(127, 0, 0, 184), fixed_ports).unwrap();
        let at = |last: u8| SocketAddr::from(([127, 0, 0, last], 20_000));
        let nbd: Vec<SocketAddr> =
            plan.nodes.iter().map(|n| n.nbd).chain(plan.gateways.iter().map(|g| g.nbd)).collect();
        assert_eq!(nbd, [at(184), at(185), at(186), at(187), at(188)], "3 nodes, then 2 gateways");
        for (node, last) in plan.nodes.iter().zip(184..) {
            let cfg = rein_runtime::config::ServerConfig::parse(&node.config, Path::new("n.toml")).unwrap();
            assert_eq!((cfg.listen, cfg.admin), (at(last), SocketAddr::from(([127, 0, 0, last], 20_001))));
        }
        let g = rein_runtime::gateway::GatewayConfig::parse(&plan.gateways[0].config, Path::new("gw.toml")).unwrap();
        assert_eq!(g.listen, at(187));
        let reached: Vec<_> = g.nodes.iter().map(|n| n.address.clone()).collect();
        assert_eq!(reached, [at(184), at(185), at(186)].map(rein_runtime::sock::NodeAddress::Tcp));
        assert_eq!(plan.endpoints[0].uri(), "nbd://127.0.0.187:20000/c1");
        // At the bound, .250 to .254; one past it, refused.
        let plan = Plan::at(&sc, Ipv4Addr::new(127, 0, 0, 250), fixed_ports).unwrap();
        assert_eq!(plan.gateways[1].nbd, at(254));
        let e = Plan::at(&sc, Ipv4Addr::new(127, 0, 0, 251), fixed_ports).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "scenario {}: 3 servers, 2 tenants over several servers and 0 PARDA hosts need 5 processes, each on \
                 its own address; from 127.0.0.251 (--first-address) to 127.0.0.254 at most 4 fit",
                sc.label()
            )
        );
        // Anywhere in 127.0.0.0/8.
        let plan = Plan::at(&sc, Ipv4Addr::new(127, 1, 2, 3), fixed_ports).unwrap();
        assert_eq!(plan.nodes[0].nbd, SocketAddr::from(([127, 1, 2, 3], 20_000)));
        let loopback = "not a loopback address; rein cluster's processes listen on 127.0.0.0/8 only (their admin \
                        endpoints have no token)";
        let ends = "ends in .0 or .255; give an address ending in .1 to .254";
        for (first, why) in
            [([10, 0, 0, 10], loopback), ([0, 0, 0, 0], loopback), ([127, 0, 0, 0], ends), ([127, 0, 1, 255], ends)]
        {
            let first = Ipv4Addr::from(first);
            let e = Plan::at(&sc, first, fixed_ports).unwrap_err().to_string();
            assert_eq!(e, format!("--first-address {first}: {why}"));
        }
    }

    const STRIPED: &str = r#"
name = "striped"
duration_s = 10.0
scheduler = "dmclock"
[[servers]]
name = "s1"
capacity_iops = 1000
queue_depth = 8
[[servers]]
name = "s2"
capacity_iops = 1000
queue_depth = 8
[[servers]]
name = "s3"
capacity_iops = 1000
queue_depth = 8
[[tenants]]
name = "c1"
reservation = 600
limit = 1200
weight = 2
reservation_split = "rho"
routing = { shares = { s1 = 2, s2 = 4, s3 = 0 } }
[tenants.workload]
kind = "closed"
outstanding_per_server = 4
span_gb = 1
[[tenants]]
name = "f1"
weight = 3
server_reservations = { s2 = 50 }
servers = ["s2", "s3"]
[tenants.workload]
kind = "open"
iops = 100
"#;

    /// A tenant over several servers gets a gateway whose config, read by `rein gateway`'s own parser,
    /// has the tenant's spec, split, local reservations and the shares as stripe widths; each node's
    /// piece is large enough for the layout; each node holds the scenario's spec for its server and
    /// speaks the storage-node protocol.
    #[test]
    fn a_striped_tenant_gets_a_gateway_with_its_shares_as_widths() {
        let sc = Scenario::from_toml(STRIPED, None).unwrap();
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        assert_eq!(plan.gateways.len(), 2);
        let g = rein_runtime::gateway::GatewayConfig::parse(&plan.gateways[0].config, Path::new("gw.toml"))
            .unwrap_or_else(|e| panic!("{e}\n{}", plan.gateways[0].config));
        assert_eq!(g.listen, SocketAddr::from(([127, 0, 0, 13], 20_000)));
        assert_eq!(
            g.nodes.iter().map(|n| n.address.clone()).collect::<Vec<_>>(),
            plan.nodes.iter().map(|n| rein_runtime::sock::NodeAddress::Tcp(n.nbd)).collect::<Vec<_>>()
        );
        assert_eq!(g.tenants[0].spec, sc.tenants()[0].spec);
        assert!(g.tenants[0].rho);
        let v = &g.exports[0];
        assert_eq!(v.size, 1 << 30);
        // Shares 2 : 4 : 0 are widths 1 : 2 : 0 of 64 KiB units: s2 holds units 1 and 2 of each round.
        assert_eq!(v.stripe, Stripe::new(64 << 10, &[1, 2, 0]).unwrap());
        for (j, node) in plan.nodes.iter().enumerate() {
            let cfg = rein_runtime::config::ServerConfig::parse(&node.config, Path::new("n.toml")).unwrap();
            let e = cfg.exports.iter().find(|e| e.name == "c1");
            if j == 2 {
                assert!(e.is_none(), "s3 has no stripe of c1");
                continue;
            }
            assert!(e.unwrap().size.unwrap() >= v.stripe.node_bytes(j, v.size), "node {j}'s piece");
            let t = cfg.tenants.iter().find(|t| t.name == "c1").unwrap();
            // The node's own spec is the scenario's for this server; the gateway tags requests.
            assert_eq!(t.spec, sc.tenants()[0].server_specs[j]);
            assert_eq!(g.nodes[j].protocol, rein_runtime::remote::NodeProtocol::Rein);
            assert!(node.config.contains("[node]\nenabled = true\nspecs = \"node\"\n"), "{}", node.config);
        }
        // f1: its RBFQ local minimum on s2 is its reservation there; default stripes of 1 MiB, width 1.
        let g = rein_runtime::gateway::GatewayConfig::parse(&plan.gateways[1].config, Path::new("gw.toml")).unwrap();
        assert_eq!(g.tenants[0].server_reservations, vec![50.0, 0.0]);
        assert_eq!(g.exports[0].stripe, Stripe::new(1 << 20, &[1, 1]).unwrap());
        let s2 = rein_runtime::config::ServerConfig::parse(&plan.nodes[1].config, Path::new("n.toml")).unwrap();
        assert_eq!(s2.tenants.iter().find(|t| t.name == "f1").unwrap().spec.reservation(), 50.0);
    }

    /// A stripe unit above the gateway's largest is refused by the plan, naming the tenant and the bound,
    /// before any process starts; the largest is planned, and its gateway config reads back.
    #[test]
    fn a_stripe_unit_above_the_gateways_largest_is_refused_when_planning() {
        let with = |kb: &str| {
            let text = STRIPED.replace(
                "servers = [\"s2\", \"s3\"]\n",
                &format!("servers = [\"s2\", \"s3\"]\nrouting = {{ stripe_kb = {kb} }}\n"),
            );
            Plan::new(&Scenario::from_toml(&text, None).unwrap(), fixed_ports)
        };
        for kb in ["1048577", "4194304", "1099511627776", "1e30"] {
            let e = with(kb).err().unwrap_or_else(|| panic!("stripe_kb = {kb} was planned")).to_string();
            assert!(
                e.ends_with(
                    "tenant f1: routing stripe_kb must be at most 1048576 (1 GiB) for a gateway, the largest \
                     stripe unit rein gateway takes"
                ),
                "{kb}: {e}"
            );
        }
        let plan = with("1048576").unwrap();
        let g = rein_runtime::gateway::GatewayConfig::parse(&plan.gateways[1].config, Path::new("gw.toml")).unwrap();
        assert_eq!(g.exports[0].stripe, Stripe::new(1 << 30, &[1, 1]).unwrap());
    }

    /// The same striped tenants under a scheduler that sends no tags (LFQ: SFQ at each server, no global
    /// information; also mClock, SFQ): their gateways speak plain NBD to the nodes, as the simulator's
    /// gateways attach no delta there; DT-FQ (SFQ with the gateway's delta) keeps the storage-node protocol.
    #[test]
    fn a_gateway_tags_requests_only_for_a_distributed_scheduler() {
        for (name, protocol) in [
            ("lfq", rein_runtime::remote::NodeProtocol::Nbd),
            ("mclock", rein_runtime::remote::NodeProtocol::Nbd),
            ("dtfq", rein_runtime::remote::NodeProtocol::Rein),
            ("rbfq", rein_runtime::remote::NodeProtocol::Rein),
        ] {
            let mut text = STRIPED.replace("scheduler = \"dmclock\"", &format!("scheduler = \"{name}\""));
            if !matches!(name, "dtfq" | "rbfq") {
                // dmClock's reservation split is refused for a tenant of servers that send no delta/rho.
                text = text.replace("reservation_split = \"rho\"\n", "");
            }
            let sc = Scenario::from_toml(&text, None).unwrap();
            let plan = Plan::new(&sc, fixed_ports).unwrap();
            for gw in &plan.gateways {
                let g = rein_runtime::gateway::GatewayConfig::parse(&gw.config, Path::new("gw.toml")).unwrap();
                assert!(g.nodes.iter().all(|n| n.protocol == protocol), "{name}: {}", gw.config);
            }
            // A node whose gateways send tags has [node] on; the others have it off, and no warning about it.
            for node in &plan.nodes {
                let cfg = rein_runtime::config::ServerConfig::parse(&node.config, Path::new("n.toml")).unwrap();
                assert_eq!(cfg.node.enabled, protocol == rein_runtime::remote::NodeProtocol::Rein, "{name}");
                let warnings = cfg.warnings();
                assert!(warnings.iter().all(|w| !w.contains("[node]")), "{name}: {warnings:?}");
            }
        }
    }

    /// Aimed offsets land on the node asked for (by the gateway's own layout), stay inside the volume,
    /// and cover each of the node's units of a round.
    #[test]
    fn aimed_offsets_land_on_the_node_asked_for() {
        let stripe = Stripe::new(64 << 10, &[1, 2, 3]).unwrap();
        let volume = 6 * (64 << 10) * 10 + (64 << 10);
        for k in 0..3 {
            let mut units = std::collections::BTreeSet::new();
            for i in 0..2000u64 {
                // The generator's offsets are multiples of the request size (8 KiB, a divisor of the unit).
                let offset = (i * 7919 * 8192) % (volume - 8192);
                let a = aim(&stripe, k, offset, 8192, volume);
                assert_eq!(stripe.locate(a).0, k, "offset {offset} aimed at {k}: {a}");
                assert_eq!(stripe.locate(a + 8191).0, k);
                assert!(a + 8192 <= volume);
                units.insert(stripe.locate(a).1 / (64 << 10) % (k as u64 + 1));
            }
            assert_eq!(units.len(), k + 1, "node {k}'s units of a round are all used");
        }
        // A node of width 0 is not aimed at.
        let stripe = Stripe::new(4096, &[1, 0]).unwrap();
        assert_eq!(aim(&stripe, 1, 12_288, 4096, 1 << 20), 12_288);
        // A trace record's offset has no alignment: one that would cross its unit's end is moved back to
        // end with the unit, so it stays whole on the node asked for; one longer than the unit still spans.
        let stripe = Stripe::new(64 << 10, &[1, 1]).unwrap();
        for (offset, len) in [((64 << 10) - 512, 8192u64), (3 * (64 << 10) + 60_000, 24_576), (512, 64 << 10)] {
            for k in 0..2 {
                let a = aim(&stripe, k, offset, len, 1 << 30);
                assert_eq!((stripe.locate(a).0, stripe.locate(a + len - 1).0), (k, k), "{offset}+{len} at {k}: {a}");
            }
        }
        let a = aim(&stripe, 0, 4096, (64 << 10) + 4096, 1 << 30);
        assert_eq!((stripe.locate(a).0, stripe.locate(a + (64 << 10) + 4095).0), (0, 1));
    }

    /// An open loop into an overloaded server (RBFQ Fig. 11(b): f1 900 IOPS over two servers, f2 600 over
    /// three, for 80 s) can have its whole run outstanding, and a request can queue for most of the run:
    /// the real run gets room for all of it and no timeout within it. Without that room, the load's and
    /// the gateway's bounded connections turn the open loop into one closed pool and f2, f3 fell to 0.60-0.78
    /// of the simulator; with the gateway's default 30 s timeout, f1's pieces queued at its hot nodes failed
    /// and f1 fell to 0.45 (scripts/cluster-vs-sim.sh; docs/reproductions.md Part 4).
    #[test]
    fn open_loops_get_room_for_their_backlog_and_no_timeout_within_the_run() {
        let sc = Scenario::from_toml(include_str!("../../../scenarios/rbfq-fig11b-hotspot2.toml"), None).unwrap();
        let (f1, f2) = (&sc.tenants()[0], &sc.tenants()[1]);
        assert_eq!(in_flight_bound(f2, sc.duration()), 600 * 80);
        assert_eq!(in_flight_bound(f1, sc.duration()), 900 * 80);
        assert_eq!(load_connections(f2, sc.duration(), 4), 48_000usize.div_ceil(256));
        assert_eq!(load_connections(f1, sc.duration(), 4), 256, "at most MAX_LOAD_CONNECTIONS");
        assert_eq!(pool_per_node(f2, sc.duration()), rein_runtime::remote::MAX_CONNECTIONS_PER_NODE as u64);
        // 72,000 requests of 4 KiB, a quarter more: 352 MiB.
        assert_eq!(budget_mb(f1, sc.duration()), (72_000u64 * 4096 * 5 / 4).div_ceil(1 << 20));
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        let g = rein_runtime::gateway::GatewayConfig::parse(&plan.gateways[0].config, Path::new("gw.toml")).unwrap();
        assert_eq!(g.link.connections, 64);
        assert_eq!(g.link.request_timeout, Duration::from_secs(80 + 60));
        assert_eq!(g.max_inflight_per_tenant, budget_mb(f1, sc.duration()) << 20);
        assert!(g.caps.per_tenant >= 256 && g.caps.per_client >= 256, "the load's connections are let in");
        // Each node takes every tenant's budget at once (at least the default 1,024 MiB).
        let n = rein_runtime::config::ServerConfig::parse(&plan.nodes[0].config, Path::new("n.toml")).unwrap();
        let want: u64 = sc.tenants().iter().map(|t| budget_mb(t, sc.duration())).sum();
        assert_eq!(n.max_inflight, want.max(1024) << 20);
        assert_eq!(n.max_inflight_per_tenant, budget_mb(f1, sc.duration()) << 20);
        // A closed loop's window, per server where it is one: the small defaults stay.
        let sc = Scenario::from_toml(include_str!("../../../scenarios/rbfq-fig13-rbfq.toml"), None).unwrap();
        assert_eq!(in_flight_bound(&sc.tenants()[1], sc.duration()), 4 * 2);
        assert_eq!(load_connections(&sc.tenants()[1], sc.duration(), 4), 4);
        assert_eq!(pool_per_node(&sc.tenants()[1], sc.duration()), 4);
        assert_eq!(budget_mb(&sc.tenants()[1], sc.duration()), 256);
        // An open loop of 64 KiB requests at 10,000 IOPS for 10 minutes: its backlog would need 12 GiB at
        // a daemon; the room stops at 4 GiB (memory), where the daemons' backpressure takes over.
        let text = include_str!("../../../scenarios/rbfq-fig11b-hotspot2.toml")
            .replace("duration_s = 80.0", "duration_s = 600.0")
            .replace("iops = 900", "iops = 10000\nsize_kb = 64");
        let sc = Scenario::from_toml(&text, None).unwrap();
        assert_eq!(budget_mb(&sc.tenants()[0], sc.duration()), MAX_BUDGET_MB.1);
        // A run longer than an hour keeps the gateway's largest timeout.
        assert_eq!(request_timeout_s(Nanos::from_secs(7200)), 3600.0);
        assert_eq!(request_timeout_s(Nanos::from_secs(1)), 61.0);
    }

    /// PARDA hosts: one gateway per host after the nodes, each a PARDA host whose `[parda]` reads back as
    /// the scenario's (invariant 1), its VMs' exports on the array over plain NBD, and the other
    /// controlled hosts as its UDP peers; the VMs' endpoints are their hosts.
    #[test]
    fn parda_hosts_become_gateways_with_the_scenarios_control_law() {
        let base = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let sc = Scenario::load(&base.join("parda-fig2.toml")).unwrap();
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        assert_eq!(plan.nodes.len(), 1);
        assert_eq!(plan.gateways.len(), 3);
        assert_eq!(plan.host_admins.len(), 3);
        let p = sc.parda().unwrap();
        // The hosts sign their reports with the key the supervisor writes into the run's directory.
        assert!(plan.parda_key);
        let run = tempfile::tempdir().unwrap();
        let line = rein_runtime::aggregate::RecordKey::generate_line("parda").unwrap();
        std::fs::write(run.path().join(PARDA_KEY_FILE), line).unwrap();
        for (h, g) in plan.gateways.iter().enumerate() {
            assert_eq!(g.tenant, format!("host-{}", sc.hosts()[h].name));
            assert_eq!(g.admin, plan.host_admins[h]);
            let cfg = rein_runtime::gateway::GatewayConfig::parse(&g.config, &run.path().join("gw.toml")).unwrap();
            let host = cfg.parda.expect("a PARDA host");
            assert_eq!(host.key.as_ref().map(|k| k.identity()), Some("parda"));
            assert_eq!(host.id, h as u32);
            assert_eq!(host.beta, sc.hosts()[h].beta);
            assert!(host.runs);
            assert_eq!(format!("{:?}", host.parda.config), format!("{:?}", p.config));
            match &host.transport {
                rein_runtime::parda_host::ReportTransport::Udp { listen, peers } => {
                    // The supervisor checks the port the host binds (`check_ports`).
                    assert_eq!(g.udp, Some(*listen));
                    let ids: Vec<u32> = peers.iter().map(|x| x.0).collect();
                    let want: Vec<u32> = (0..3).filter(|&i| i != h as u32).collect();
                    assert_eq!(ids, want);
                }
                other => panic!("cluster aggregation over UDP, got {other:?}"),
            }
            assert_eq!(cfg.nodes.len(), 1);
            assert_eq!(cfg.nodes[0].protocol, rein_runtime::remote::NodeProtocol::Nbd);
            let vm = &sc.tenants()[sc.hosts()[h].vms[0]];
            assert_eq!(cfg.tenants[0].name, vm.name);
            assert_eq!(cfg.tenants[0].spec, vm.spec);
            assert_eq!(plan.endpoints[sc.hosts()[h].vms[0]].nbd, g.nbd);
        }
        // An aggregation delay is the simulator's model of a board; it is refused by name.
        let text = std::fs::read_to_string(base.join("parda-fig2.toml"))
            .unwrap()
            .replace("aggregation = \"cluster\"", "aggregation = \"cluster\"\naggregation_delay_ms = 5");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.toml");
        std::fs::write(&path, text).unwrap();
        let e = Plan::new(&Scenario::load(&path).unwrap(), fixed_ports).unwrap_err().to_string();
        assert!(e.contains("parda.aggregation_delay_ms cannot run on a real cluster"), "{e}");
        // The scenario's [mclock] reaches the hosts' local schedulers, [parda]'s batching over it, as the
        // simulator's hosts run it.
        let text = std::fs::read_to_string(base.join("parda-fig2.toml")).unwrap();
        std::fs::write(&path, format!("{text}\n[mclock]\npreset = \"paper\"\nweight_lead_ios = 7\n")).unwrap();
        let sc = Scenario::load(&path).unwrap();
        assert_eq!(sc.sched().weight_lead_ios, Some(7));
        let plan = Plan::new(&sc, fixed_ports).unwrap();
        let p = sc.parda().unwrap();
        let want = SchedConfig { batch: p.batch, batch_distance: p.batch_distance, ..sc.sched() };
        for g in &plan.gateways {
            let cfg = rein_runtime::gateway::GatewayConfig::parse(&g.config, &run.path().join("gw.toml")).unwrap();
            assert_eq!(cfg.parda.expect("a PARDA host").host_config(1).sched, want);
        }
    }
}
