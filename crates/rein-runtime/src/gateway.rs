//! `rein gateway`: NBD volumes striped over storage nodes, served with `rein serve`'s own connection code.
//!
//! # Model
//! A VM opens a volume (`[[exports]]` here) on the gateway as it would an export of `rein serve`: the same
//! handshake, STARTTLS, access lists, connection caps, byte budget, idle timeout and shutdown deadline
//! ([`crate::nbd`]). Its requests do not go to a local dispatcher but to a [`RemoteVolume`]
//! ([`crate::remote`]): cut at stripe units ([`rein_model::stripe::Stripe`]) and sent at once, each piece
//! to its node. The gateway keeps no queue or window of its own: a VM's outstanding requests are one pool
//! that the nodes schedule.
//!
//! # Configuration
//! `gw.toml`, validated once by [`GatewayConfig::parse`] into typed values; every error is one line naming
//! the key (docs/gateway.md has the reference):
//!
//! ```toml
//! listen = "127.0.0.1:10810"
//! listen_unix = "gw.sock"           # optional: the front on a Unix socket as well; listen_unix_mode = "0600"
//! admin = "127.0.0.1:9190"          # optional: /healthz, /metrics, /api/nodes
//! # and for it, as in rein serve: admin_token_file, admin_insecure, max_admin_connections,
//! # admin_idle_timeout_s
//! request_timeout_s = 30            # 0.1..=3600
//! connect_timeout_s = 5             # 0.1..=3600
//! reconnect_max_backoff_ms = 2000   # 50..=600000
//! connections_per_node = 1          # 1..=64
//! read_only_check_s = 10            # 0 (off) or 0.1..=3600: each node export's read-only flag, read anew
//! worker_threads = 1                # 1..=1024
//! layout_file = "gw-layouts.json"   # optional: the volumes' layouts, recorded; a start that would lay
//!                                   # a volume out otherwise is refused (`layouts`)
//! # and, as in rein serve: [tls], max_connections*, max_inflight_mb*, idle_timeout_s,
//! # stall_timeout_s, shutdown_timeout_s, max_request_kb, default_export
//! [node_tls]                        # optional: STARTTLS on every node link, never plain
//! ca = "ca-cert.pem"                # x509 (with cert/key to present, crl to revoke), or psk_file (+ psk_identity)
//! [[nodes]]
//! name = "s1"
//! address = "127.0.0.11:10809"      # or "unix:PATH": a node on this host, over a Unix socket
//! protocol = "auto"                 # rein | nbd | auto
//! export = "c2"                     # optional: the export on this node for every volume
//! tls = true                        # default: whether [node_tls] is given; tls_name = "s1.example"
//! [[tenants]]
//! name = "c2"
//! reservation = 1000
//! limit = 2000
//! weight = 4
//! idle_credit = 0
//! reservation_split = "spread"      # spread | rho
//! server_reservations = { s1 = 50 }
//! [[exports]]
//! name = "c2"
//! tenant = "c2"                     # default: the export's name
//! size_mb = 1024
//! stripe_kb = 64
//! widths = { s1 = 1, s2 = 1 }       # default: width 1 on every node
//! node_export = "c2"                # default: the node's `export`, else this export's name
//! allow_networks = ["10.0.0.0/8"]; allow_identities = ["alice"]
//! ```
//!
//! With `[parda]` (and `[parda_host]`) the gateway is a PARDA host: every request passes the host's window
//! first ([`crate::parda_host`]; docs/gateway.md, "A PARDA host").
//!
//! # Reload
//! SIGHUP (the binary; [`GatewayReload`] in [`run_with`]) reads gw.toml again, on a thread of its own
//! ([`crate::server::read_apart`]: a file that never reads holds up neither clients nor a stop), validated
//! as a whole (a file that does not load changes nothing, logged once), and applies the difference to the
//! tenants and volumes; each change is logged:
//! - a tenant's spec or `server_reservations` changed: its volumes state the new entry to their nodes
//!   ([`RemoteVolume::respec`]): each node session ends once its pieces are answered and says hello
//!   again at once (pieces sent meanwhile wait); a node applies it as its `[node] specs` says, and the
//!   tracker keeps its account (the same node boot);
//! - a volume added: opened (its node connections, `OPEN_AT_ONCE` (64) volumes together as at start; the
//!   reload runs beside the accept loop, which goes on serving new clients, and a SIGHUP meanwhile waits
//!   for it); one that cannot be opened (a node answers wrongly) fails the reload as soon as that node
//!   answers (the opens still waiting for silent nodes dropped, [`RemoteVolume::open`]), which then
//!   changes nothing;
//! - a volume removed: gone from the list for new connections; connections that opened it keep it until
//!   they close;
//! - a volume added on a node export that a running volume holds with another layout (one kept as it
//!   runs, one this reload removes, or one removed earlier whose connections are still open) fails the
//!   reload, naming both (invariant 3 across reloads: two layouts on one node export scramble each
//!   other's data); remove the old volume first, and add the new one once its connections have closed;
//! - a volume's access lists changed: new connections see the new lists;
//! - a volume's `read_only` changed: new connections see the volume read-only or writable, and its own
//!   write gate ([`RemoteVolume::set_read_only`]) refuses the writes of every connection with EPERM while
//!   it is set (those told writable at their handshake write again once it is cleared);
//! - a volume's `size_mb` raised, its stripe_kb, widths, node order, node exports and tenant the same
//!   (`Growth`): the stripe maps offsets whatever the size ([`rein_model::stripe`], invariant 6), so
//!   its bytes stay where they are and the new part lands on each node after its old part. Each node
//!   export is asked its size first ([`crate::remote::export_size`]: NBD_OPT_INFO on a side connection;
//!   a node session's size is its handshake's, the old one if the node's image grew since), all at once
//!   within `connect_timeout`, after the nodes moved by the reload are set; if each holds its part of
//!   the new size ([`Stripe::node_bytes`]; invariant 2), the volume's export is replaced for the
//!   connections opened from then on (those open keep their size: NBD fixes it per connection), and
//!   once the reload completes its node sessions opened for a smaller export end once their pieces are
//!   answered and say hello again ([`RemoteVolume::grow`]; a node that checks requests against its
//!   session's size would refuse the new part otherwise). A node export too small, or a node that
//!   cannot be asked, leaves the volume at its size, named (node, its export's size, what is needed);
//!   the rest of the reload applies;
//! - a PARDA host's `[mclock]` changed: its local scheduler takes the new settings at once (queued
//!   requests stay; `[parda]` and `[parda_host]` need a restart);
//! - `[tls]` and `[node_tls]`: read again from their files (renewed certificates under the same names
//!   too) and used for the connections opened from then on, on the front and to the nodes; connections
//!   open keep their sessions ([`crate::tls`], "Reload"), but for node links whose node's certificate
//!   a new `[node_tls] crl` lists: cut;
//! - a node's `address` or `tls_name` changed (the node moved: a replacement host with the same data
//!   behind it): every link to it, of every volume, connects to the new place from then on (new volumes
//!   too), and once the reload completes the sessions still open at the old place end once their pieces
//!   are answered and reconnect there, pieces sent meanwhile waiting ([`crate::remote::NodeRoute`]); a
//!   move to the address another node is at now fails the reload;
//! - a node's `protocol` changed, or TLS on its link turned on or off (`tls`, or `[node_tls]` added or
//!   removed, which sets every node's default): applied as a move is (`NodeMoves`; the route's
//!   [`crate::remote::Place`] carries the protocol and TLS, which every connection to the node, a
//!   session's or a check's, reads): its sessions end once their pieces are answered and reconnect at
//!   once with the new settings, and the VMs' connections stay. A node turned to TLS takes the
//!   running TLS nodes' one `[node_tls]` cell (whose context each reload sets), or the file's; one turned
//!   to `nbd` carries no tags from then on (its tenants' trackers keep their account, and one turned back
//!   to `rein` starts afresh there unless the node's boot is the same). A file that turns TLS on without
//!   credentials does not load (`tls = true needs a [node_tls] table`, naming the node), which changes
//!   nothing; the nodes whose place or settings change are tried there first, all at once
//!   (`NodeMoves::try_places`: a session as a running volume on it would open one, the storage-node
//!   hello included, ended at once; else a side connection), and those that answer and refuse it (no TLS
//!   offered, TLS required, credentials refused, the storage-node protocol refused) fail the reload,
//!   each named; one down (silent ones cost the reload one `connect_timeout` together) is a warning of
//!   the reload's report, and fails its reconnects until it is up;
//! - a node added: it takes the next place after the running nodes (a place is an index of the running
//!   list, by which the volumes' layouts, node links and the tenants' trackers know their nodes; the
//!   trackers grow by it, [`ServiceTracker::add_servers`]), and volumes added by the same reload or a
//!   later one can use it; one added at the address a running node is at now fails the reload;
//! - a node removed (not named any more): new volumes cannot use it; the volumes a reload removed whose
//!   connections are still open keep it until they close; its place stays (the same name in a later
//!   file takes it back); one that a volume the reload keeps uses stays, named as needing a restart
//!   (`NodePlan`);
//! - the file's node order is the layout's: a volume added whose nodes the file lists in another order
//!   than their places fails the reload (a restart would lay it out otherwise), and a kept one is warned
//!   of (reordering the nodes of a running volume scrambles its data at the next restart);
//! - whatever else it changes, the node sessions of the running volumes that refuse writes (remote.rs,
//!   "Read-only node exports") renew, to learn whether the node exports are writable again (a reload of
//!   a node ends none of the gateway's sessions);
//! - what needs a restart is named and left as it runs: a node removed while a volume kept uses it, the
//!   front's settings (listen, admin, caps, budgets, timeouts, request size, default export), the links'
//!   timeouts and pool size,
//!   `worker_threads`, a tenant's `reservation_split`, and a volume's stripe, widths, node export or
//!   tenant (its data is laid out by them), or its size lowered (in its own words: the restart cuts off
//!   the data past the new end); a volume whose layout would change also hears what the
//!   restart does to its data (`lays_out_anew`): without `layout_file` it scrambles it, unchecked (a
//!   start and `--check-config` warn of a gateway without one, [`GatewayConfig::unrecorded_layouts`]);
//!   with one, it is refused.
//!
//! # A hint at start
//! On a Linux guest whose idle vCPUs halt at once (cpuidle-haltpoll loaded, [`HALT_POLL_NS`] at 0) the
//! gateway logs one line saying so: every request that finds a vCPU halted waits for the hypervisor to
//! wake it, and the gateway's path (fio, the gateway and the nodes waking each other) pays it where a
//! direct server, busy all the time, does not (docs/gateway.md, "On a virtual machine": 0.52-0.54x of
//! direct without polling, 0.58-0.60x with 200 us). The setting is the machine's; the gateway only reads it.
//!
//! # Invariants
//! 1. Every node named in a tenant's `server_reservations` or an export's `widths` is a configured node.
//! 2. A volume starts only if every node it uses answered the handshake with an export at least as large
//!    as its piece ([`rein_model::stripe::Stripe::node_bytes`]), and a reload grows one only if every
//!    such export, asked then, holds its piece of the new size (`Growth`).
//! 3. No two volumes, and no volume twice, use one node export (address and export name): each lays its
//!    units out from the export's offset 0. (Two addresses of one machine cannot be told apart here.)
//!
//! # Deviations
//! Tenants' specs, splits and `server_reservations` are validated and kept for the storage-node protocol
//! (docs/node-protocol.md); over plain NBD the nodes schedule by their own configuration.

use crate::access::{ConnCaps, ConnLimits, ExportAccess};
use crate::budget::Budget;
use crate::config::{conn_caps, in_range, parse_access, tls_config, Overrides, SettingError, TlsFile};
use crate::live::ReloadReport;
use crate::nbd::{spawn_accepted, Backend, Export, ExportTable, Limits, NbdContext, Policy};
use crate::parda_host::{HostGate, HostedVolume, VmLease};
use crate::remote::{
    LinkConfig, NodeProtocol, NodeSpec, NodeTls, OpenError, RemoteVolume, VolumeQos, MAX_CONNECTIONS_PER_NODE,
};
use crate::sock::NodeAddress;
use crate::tls::{LiveTls, TlsConfig};
use rein_core::{Count, Num, QosSpec, ReservationSplit, ServiceTracker};
use rein_model::stripe::Stripe;
use rein_proto::nbd::node::{NodeSplit, NodeTenant, MAX_NODE_NAME_LEN};
use rein_proto::nbd::ExportInfo;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

pub mod layouts;

/// Where a Linux guest's halt polling is set (the cpuidle-haltpoll driver's `guest_halt_poll_ns`: how long
/// an idle vCPU polls before it halts). Absent on hosts and on guests without the driver.
pub const HALT_POLL_NS: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";

/// The start-up hint (module comment, "A hint at start") for [`HALT_POLL_NS`]'s content, if it calls for
/// one: polling off. `None` when the file is absent, unreadable or polling is on.
pub fn halt_poll_hint(content: Option<&str>) -> Option<String> {
    let ns: u64 = content?.trim().parse().ok()?;
    (ns == 0).then(|| {
        format!(
            "this virtual machine halts idle vCPUs at once ({HALT_POLL_NS} is 0): a request that finds one halted \
             waits for the hypervisor to wake it; with 200 us of polling (echo 200000 as root) a gateway kept \
             0.58-0.60x of a direct server's IOPS against 0.52-0.54x (docs/gateway.md, \"On a virtual machine\")"
        )
    })
}

/// Most nodes in one gateway.
pub const MAX_NODES: usize = 256;
/// Most volumes in one gateway.
pub const MAX_VOLUMES: usize = 1024;
/// Largest stripe unit of a volume (`stripe_kb`, KiB): 1 GiB (a larger unit leaves most volumes on one node).
pub const MAX_STRIPE_KB: u64 = 1 << 20;
/// Most node connections in one gateway: each volume's nodes times `connections_per_node` (each a task,
/// buffers and a descriptor, about 11 KB: 256 nodes x 1,024 volumes took 3.0 GB and 2 min to start).
pub const MAX_NODE_SESSIONS: usize = 16_384;

/// Each volume's layout, by the volume's name (what `layout_file` holds).
type Layouts = BTreeMap<String, layouts::Layout>;

/// Writes `layouts` ([`Live::layouts_now`]) to `layout_file` ([`layouts`]), on a thread of its own (a
/// file system that stalls, a hung mount, holds up the reload that waits for it, not the requests the
/// runtime serves meanwhile), and keeps them in `recorded` once written.
async fn record_layouts(
    recorded: &mut Option<Layouts>,
    layouts: Option<(std::path::PathBuf, Layouts)>,
) -> Result<(), layouts::LayoutWriteError> {
    let Some((path, volumes)) = layouts else { return Ok(()) };
    let writer = tokio::task::spawn_blocking(move || layouts::write(&path, volumes.clone()).map(|()| volumes));
    let written = layouts::writer_answer(writer).await?;
    *recorded = Some(written);
    Ok(())
}

/// Whether a volume laid out as `new` finds the data written as `old` elsewhere: another export on a node
/// it uses (`same_exports` false), or another layout over more than one node. Over one node (the same in
/// both) the unit moves no byte: a node offset is the volume offset.
fn lays_out_anew(old: &Stripe, new: &Stripe, same_exports: bool) -> bool {
    if !same_exports {
        return true;
    }
    if old.same_layout(new) {
        return false;
    }
    let used = |s: &Stripe| (0..s.nodes()).filter(|&j| s.uses(j)).collect::<Vec<_>>();
    let (before, after) = (used(old), used(new));
    !(before.len() == 1 && before == after)
}

/// Volume `v`'s layout over `nodes` (by place), as the layout file records it: the nodes it uses, in
/// layout order.
fn layout_of(v: &GatewayVolume, nodes: &[NodeSpec]) -> layouts::Layout {
    let used = (0..nodes.len()).filter(|&j| v.stripe.uses(j));
    layouts::Layout {
        unit: v.stripe.unit(),
        nodes: used
            .map(|j| layouts::LayoutNode {
                node: nodes[j].name.clone(),
                export: v.node_exports[j].clone(),
                width: v.stripe.widths()[j],
            })
            .collect(),
    }
}

/// The `[node_tls]` cell of `nodes`, which all their TLS nodes share (one context for every node: parsed
/// so, and a reload's nodes take the running cell, [`NodePlan::new`]).
fn node_tls_cell(nodes: &[NodeSpec]) -> Option<crate::tls::LiveTlsClient> {
    nodes.iter().find_map(|n| n.tls.as_ref()).map(|t| t.client.clone())
}

/// Node connections the gateway holds: each export's nodes times `connections` (per node and volume).
fn node_sessions(exports: &[GatewayVolume], nodes: usize, connections: usize) -> usize {
    exports.iter().map(|v| (0..nodes).filter(|&j| v.stripe.uses(j)).count()).sum::<usize>() * connections
}

/// A tenant as the gateway keeps it (one dmClock/RBFQ tracker each, with the storage-node protocol).
#[derive(Debug, Clone)]
pub struct GatewayTenant {
    /// Its name.
    pub name: String,
    /// Reservation, limit, weight and idle credit.
    pub spec: QosSpec,
    /// `reservation_split = "rho"` (the paper); false: spread (Rein's default).
    pub rho: bool,
    /// RBFQ's local minimum per node (index = node), 0 where none.
    pub server_reservations: Vec<f64>,
}

/// A volume as configured.
#[derive(Debug, Clone)]
pub struct GatewayVolume {
    /// The export name VMs open.
    pub name: String,
    /// Index into [`GatewayConfig::tenants`].
    pub tenant: usize,
    /// Bytes.
    pub size: u64,
    /// The layout over [`GatewayConfig::nodes`].
    pub stripe: Stripe,
    /// The export to open on each node (index = node).
    pub node_exports: Vec<String>,
    /// Who may see and open it.
    pub access: ExportAccess,
    /// `read_only`: advertised read-only, and every connection's writes refused (EPERM) while it is set
    /// ([`RemoteVolume::set_read_only`]).
    pub read_only: bool,
}

/// `rein gateway`'s configuration, validated.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The NBD front's address.
    pub listen: SocketAddr,
    /// The front on a Unix socket as well (`listen_unix`, `listen_unix_mode`; [`crate::sock`]).
    pub listen_unix: Option<crate::sock::UnixListen>,
    /// The HTTP endpoint's address (`/healthz`, `/api/nodes`), if any.
    pub admin: Option<SocketAddr>,
    /// Who may use the HTTP endpoint and how many connections it holds, as `rein serve`'s admin endpoint
    /// (`admin_token_file`, `admin_insecure`, `max_admin_connections`, `admin_idle_timeout_s`;
    /// [`crate::admin_guard`]).
    pub admin_access: crate::admin_guard::AdminAccess,
    /// STARTTLS on the front.
    pub tls: Option<TlsConfig>,
    /// Connection caps of the front.
    pub caps: ConnCaps,
    /// Byte budget, all connections (bytes).
    pub max_inflight: u64,
    /// Byte budget per tenant (bytes).
    pub max_inflight_per_tenant: u64,
    /// Close a front connection idle this long.
    pub idle_timeout: Option<Duration>,
    /// Close a front connection whose client leaves a WRITE's payload or its replies unmoved this long.
    pub stall_timeout: Option<Duration>,
    /// After shutdown is asked, answer what is in flight this long.
    pub shutdown_timeout: Duration,
    /// Largest READ or WRITE from a VM (bytes).
    pub max_request: u32,
    /// Index of the volume the empty name opens.
    pub default_export: Option<usize>,
    /// Node timeouts and pool size.
    pub link: LinkConfig,
    /// The runtime's worker threads (`worker_threads`, default [`DEFAULT_WORKER_THREADS`]). The binary
    /// builds its runtime with it; [`run`] does not read it.
    pub worker_threads: usize,
    /// `layout_file`: where the volumes' layouts are recorded, so that a start with another layout for
    /// a volume is refused ([`layouts`]).
    pub layout_file: Option<std::path::PathBuf>,
    /// The nodes, in config order.
    pub nodes: Vec<NodeSpec>,
    /// The tenants.
    pub tenants: Vec<GatewayTenant>,
    /// The volumes.
    pub exports: Vec<GatewayVolume>,
    /// `[parda]` and `[parda_host]`: the gateway is a PARDA host in front of its nodes (the array), and
    /// every request passes the host's window ([`crate::parda_host`]).
    pub parda: Option<crate::parda_host::HostSettings>,
    /// The file it was read from, as given (`--config`): the errors that ask to change it name it.
    pub file: PathBuf,
}

/// Why the configuration could not be loaded (one line, naming the key).
#[derive(Debug, thiserror::Error)]
pub enum GatewayConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Not TOML, or not the schema (an unknown key, a wrong type).
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// Where and what ([`crate::config::parse_toml`]).
        source: rein_model::input::TomlError,
    },
    /// A value is out of range or inconsistent: [`GatewaySettingError`] names the key.
    #[error("gateway config: {0}")]
    Invalid(GatewaySettingError),
}

impl From<SettingError> for GatewaySettingError {
    fn from(e: SettingError) -> Self {
        GatewaySettingError::Setting(e)
    }
}

/// A value in gw.toml (or given on the command line over it) that is out of range or inconsistent with
/// another: which key, the value, and the bound. Its message names the key once. The keys gw.toml shares
/// with rein.toml (the fronts, the admin keys, the connection caps, in-flight bytes, timeouts, `[tls]`,
/// tenant names and specs, access lists) are refused as rein.toml refuses them ([`SettingError`]).
#[derive(Debug, thiserror::Error)]
pub enum GatewaySettingError {
    /// A key rein.toml has too, refused as there.
    #[error("{0}")]
    Setting(SettingError),
    /// The admin endpoint's keys are refused.
    #[error("{0}")]
    AdminAccess(crate::admin_guard::AdminAccessError),
    /// `[parda_host]` without `[parda]`.
    #[error("[parda_host] needs a [parda] table (latency_threshold_ms at least)")]
    PardaHostWithoutParda,
    /// `[parda]` or `[parda_host]` is refused; the message names the key.
    #[error("{0}")]
    Parda(crate::parda_host::PardaHostError),
    /// `[mclock]` without `[parda]`.
    #[error(
        "[mclock] sets a PARDA host's local scheduler, and this gateway has no [parda] table (a gateway \
         schedules nothing itself: its nodes do, with their own [mclock])"
    )]
    MclockWithoutParda,
    /// A duration in seconds outside `min..=max` or not finite (`read_only_check_s` may also be 0: no
    /// check).
    #[error(
        "{key} must be in {min}..={max} seconds, got {}{}",
        Num(*got),
        if *zero_is_off { " (or 0: no check)" } else { "" }
    )]
    Seconds {
        /// The key.
        key: &'static str,
        /// The shortest accepted.
        min: f64,
        /// The longest accepted.
        max: f64,
        /// The value given.
        got: f64,
        /// Whether 0 turns the setting off (said in the message).
        zero_is_off: bool,
    },
    /// No `[[nodes]]`.
    #[error("at least one [[nodes]] is needed")]
    NoNodes,
    /// More than `max` `[[nodes]]`.
    #[error("at most {max} [[nodes]], got {got}")]
    TooManyNodes {
        /// The most accepted ([`MAX_NODES`]).
        max: usize,
        /// How many there are.
        got: usize,
    },
    /// `[node_tls] name`: a gateway names each node's certificate in its `[[nodes]]` entry.
    #[error("node_tls.name: a gateway names each node's certificate in [[nodes]] tls_name")]
    NodeTlsName,
    /// `[node_tls]`'s credentials cannot be read or do not fit together; the message names the key.
    #[error("{0}")]
    NodeTls(Box<crate::tls::CredentialError>),
    /// A `[[nodes]]` entry without a name.
    #[error("a [[nodes]] entry has an empty name")]
    EmptyNodeName,
    /// A node name longer than `max` bytes (the message shows its first 16 characters).
    #[error("node {:?}...: name must be at most {max} bytes, got {}", name.chars().take(16).collect::<String>(), name.len())]
    NodeNameLength {
        /// The name.
        name: String,
        /// The longest accepted ([`MAX_NODE_NAME_LEN`]).
        max: usize,
    },
    /// Two `[[nodes]]` of one name.
    #[error("node name {name:?} is repeated")]
    RepeatedNode {
        /// The name.
        name: String,
    },
    /// A node's setting is refused.
    #[error("node {node}: {error}")]
    Node {
        /// The node's name.
        node: String,
        /// What is wrong with it.
        error: NodeSettingError,
    },
    /// A tenant name longer than `max` bytes or with NUL.
    #[error("tenant {name:?}: name must be at most {max} bytes without NUL (the storage-node protocol's limit)")]
    TenantName {
        /// The name.
        name: String,
        /// The longest accepted ([`MAX_NODE_NAME_LEN`]).
        max: usize,
    },
    /// A tenant's setting is refused.
    #[error("tenant {tenant}: {error}")]
    Tenant {
        /// The tenant's name.
        tenant: String,
        /// What is wrong with it.
        error: TenantSettingError,
    },
    /// More than `max` `[[exports]]`.
    #[error("at most {max} [[exports]], got {got}")]
    TooManyExports {
        /// The most accepted ([`MAX_VOLUMES`]).
        max: usize,
        /// How many there are.
        got: usize,
    },
    /// An `[[exports]]` name that is empty or longer than NBD allows.
    #[error("an [[exports]] entry has an empty name or one longer than 4096 bytes (NBD's limit)")]
    ExportName,
    /// Two `[[exports]]` of one name.
    #[error("export name {name:?} is repeated")]
    RepeatedExport {
        /// The name.
        name: String,
    },
    /// A volume's setting is refused.
    #[error("export {export}: {error}")]
    Volume {
        /// The volume's name.
        export: String,
        /// What is wrong with it (boxed: a node export held twice names two volumes and two nodes).
        error: Box<VolumeSettingError>,
    },
    /// The volumes' nodes times `connections_per_node` above `max`.
    #[error(
        "the exports' nodes times connections_per_node make {sessions} node connections, above the bound of \
         {max} (each a task, buffers and a descriptor)"
    )]
    Sessions {
        /// The node connections the configuration makes.
        sessions: usize,
        /// The most accepted ([`MAX_NODE_SESSIONS`]).
        max: usize,
    },
    /// A volume's own tenant (its name) longer than `max` bytes.
    #[error("tenant {name:?} (an export's own): name must be at most {max} bytes (the storage-node protocol's limit)")]
    ExportTenantName {
        /// The name.
        name: String,
        /// The longest accepted ([`MAX_NODE_NAME_LEN`]).
        max: usize,
    },
    /// `default_export` names no volume.
    #[error("default_export names unknown export {name:?}")]
    DefaultExport {
        /// The name given.
        name: String,
    },
}

/// What is wrong with one `[[nodes]]` entry ([`GatewaySettingError::Node`] names the node).
#[derive(Debug, thiserror::Error)]
pub enum NodeSettingError {
    /// `address` is neither `ADDRESS:PORT` nor `unix:PATH`.
    #[error("address {text:?}: {error}")]
    Address {
        /// The text given.
        text: String,
        /// Why it is no node address.
        error: crate::sock::NodeAddressError,
    },
    /// `protocol` is none of the three.
    #[error("protocol {got:?}: expected rein, nbd or auto")]
    Protocol {
        /// The word given.
        got: String,
    },
    /// `tls_name` on a link without TLS.
    #[error("tls_name needs TLS on the link ([node_tls], tls = true)")]
    TlsNameWithoutTls,
    /// `tls = true` without `[node_tls]`.
    #[error("tls = true needs a [node_tls] table")]
    TlsWithoutNodeTls,
    /// `tls_name` empty, longer than `max` bytes or with NUL.
    #[error("tls_name must have 1..={max} bytes without NUL")]
    TlsName {
        /// The longest accepted (253: a DNS name's limit).
        max: usize,
    },
    /// The address is the gateway's own front (`listen` or `listen_unix`).
    #[error(
        "address {address} is this gateway's own front ({front}): its pieces would come back to the gateway as \
         requests (a node's address, or the gateway's listen, mistyped?)"
    )]
    OwnFront {
        /// The node's address.
        address: NodeAddress,
        /// The front it is, as shown.
        front: String,
    },
}

/// What is wrong with one `[[tenants]]` entry ([`GatewaySettingError::Tenant`] names the tenant).
#[derive(Debug, thiserror::Error)]
pub enum TenantSettingError {
    /// `reservation_split` is neither `spread` nor `rho`.
    #[error("reservation_split {got:?}: expected spread or rho")]
    ReservationSplit {
        /// The word given.
        got: String,
    },
    /// `server_reservations` names no node.
    #[error("server_reservations names unknown node {node:?}")]
    UnknownNode {
        /// The name given.
        node: String,
    },
    /// A `server_reservations` value that is negative or not finite.
    #[error("server_reservations.{node} must be finite and >= 0, got {got}")]
    ServerReservation {
        /// The node.
        node: String,
        /// The value given.
        got: f64,
    },
}

/// What is wrong with one `[[exports]]` entry ([`GatewaySettingError::Volume`] names the volume).
#[derive(Debug, thiserror::Error)]
pub enum VolumeSettingError {
    /// `size_mb` is 0 or makes more than [`crate::config::MAX_EXPORT_BYTES`].
    #[error("size_mb must be in 1..=2^30, got {got}")]
    Size {
        /// The value given.
        got: u64,
    },
    /// `stripe_kb` outside `1..=max`.
    #[error("stripe_kb must be in 1..={max}, got {got}")]
    StripeKb {
        /// The value given.
        got: u64,
        /// The largest accepted ([`MAX_STRIPE_KB`]).
        max: u64,
    },
    /// `widths` names no node.
    #[error("widths names unknown node {node:?}")]
    UnknownNode {
        /// The name given.
        node: String,
    },
    /// The widths make no layout.
    #[error("{0}")]
    Stripe(rein_model::stripe::StripeError),
    /// `tenant` names no `[[tenants]]` entry.
    #[error("tenant names unknown tenant {tenant:?}")]
    UnknownTenant {
        /// The name given.
        tenant: String,
    },
    /// A node export name longer than NBD allows (the message shows its first 16 characters).
    #[error(
        "the node export name {:?}... has {} bytes; NBD allows at most {max}",
        name.chars().take(16).collect::<String>(),
        name.len()
    )]
    NodeExportName {
        /// The name.
        name: String,
        /// The longest accepted.
        max: usize,
    },
    /// A node export another volume (or this one, through a second node entry) lays its units on too
    /// (invariant 3).
    #[error(
        "node {node}'s export {node_export:?} at {address} is {} (through node {other_node}): two layouts on one \
         node export would overwrite each other's data",
        match other { None => "this export's too".to_string(), Some(o) => format!("export {o}'s") }
    )]
    SharedNodeExport {
        /// The node.
        node: String,
        /// Its export.
        node_export: String,
        /// The node's address.
        address: NodeAddress,
        /// The other volume holding it (`None`: this one, through another node entry).
        other: Option<String>,
        /// The node entry the other holder reaches it through.
        other_node: String,
    },
}

fn d_listen() -> String {
    "127.0.0.1:10810".into()
}
/// The default `request_timeout_s`.
pub const DEFAULT_REQUEST_TIMEOUT_S: f64 = 30.0;
/// The longest `request_timeout_s` and `connect_timeout_s`.
pub const MAX_TIMEOUT_S: f64 = 3600.0;

fn d_request_timeout() -> f64 {
    DEFAULT_REQUEST_TIMEOUT_S
}
fn d_connect_timeout() -> f64 {
    5.0
}
fn d_backoff() -> u64 {
    2000
}
/// The default `read_only_check_s`.
fn d_read_only_check() -> f64 {
    10.0
}
fn d_conns() -> usize {
    DEFAULT_CONNECTIONS_PER_NODE
}
fn d_threads() -> usize {
    DEFAULT_WORKER_THREADS
}
fn d_weight() -> f64 {
    1.0
}
fn d_stripe_kb() -> u64 {
    64
}

/// Most runtime worker threads (`worker_threads`).
pub const MAX_WORKER_THREADS: usize = 1024;

/// Runtime worker threads when the file does not say (`worker_threads`). One: per IO the gateway's work is
/// a few microseconds of system calls on two sockets, and every further thread adds hand-offs between
/// threads (a task woken on one, its socket written on another) that cost more than they share out on a
/// small machine. On the 2-core development VM one thread (with one connection per node) gave 1.18-1.26x
/// the IOPS of one per CPU (with two) in three sittings, 0.52-0.63x of direct `rein serve`'s
/// (docs/gateway.md, Speed), at about 9 us of CPU per 4 KiB IO. A gateway in front of more IO than one
/// core carries sets more.
pub const DEFAULT_WORKER_THREADS: usize = 1;

/// Pooled connections to each node per volume when the file does not say (`connections_per_node`). One
/// carries up to [`crate::remote::MAX_PENDING_PER_CONN`] pieces (a `rein serve` node takes 256 per
/// connection); a second one splits a round of pieces into more, smaller writes (docs/gateway.md, Speed).
pub const DEFAULT_CONNECTIONS_PER_NODE: usize = 1;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default = "d_listen")]
    listen: String,
    listen_unix: Option<String>,
    listen_unix_mode: Option<String>,
    admin: Option<String>,
    layout_file: Option<String>,
    admin_token_file: Option<String>,
    #[serde(default)]
    admin_insecure: bool,
    #[serde(default = "crate::config::d_admin_conns")]
    max_admin_connections: usize,
    #[serde(default = "crate::config::d_admin_idle")]
    admin_idle_timeout_s: f64,
    #[serde(default = "d_request_timeout")]
    request_timeout_s: f64,
    #[serde(default = "d_connect_timeout")]
    connect_timeout_s: f64,
    #[serde(default = "d_backoff")]
    reconnect_max_backoff_ms: u64,
    #[serde(default = "d_conns")]
    connections_per_node: usize,
    #[serde(default = "d_read_only_check")]
    read_only_check_s: f64,
    #[serde(default = "d_threads")]
    worker_threads: usize,
    tls: Option<TlsFile>,
    node_tls: Option<crate::tls::ClientTlsTable>,
    max_connections: Option<usize>,
    max_connections_per_client: Option<usize>,
    max_connections_per_tenant: Option<usize>,
    #[serde(default = "crate::config::d_inflight_mb")]
    max_inflight_mb: u64,
    #[serde(default = "crate::config::d_inflight_mb_per_tenant")]
    max_inflight_mb_per_tenant: u64,
    #[serde(default = "crate::config::d_idle_timeout_s")]
    idle_timeout_s: u64,
    #[serde(default = "crate::config::d_stall_timeout_s")]
    stall_timeout_s: u64,
    #[serde(default = "crate::config::d_shutdown_timeout_s")]
    shutdown_timeout_s: f64,
    #[serde(default = "crate::config::d_max_kb")]
    max_request_kb: u64,
    default_export: Option<String>,
    #[serde(default)]
    nodes: Vec<NodeFile>,
    #[serde(default)]
    tenants: Vec<TenantFile>,
    #[serde(default)]
    exports: Vec<ExportFile>,
    parda: Option<rein_model::parda_settings::PardaFile>,
    parda_host: Option<crate::parda_host::PardaHostFile>,
    mclock: Option<rein_model::sched_settings::SchedSettingsFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    name: String,
    address: String,
    protocol: Option<String>,
    export: Option<String>,
    tls: Option<bool>,
    tls_name: Option<String>,
}

/// Longest `tls_name` (a DNS name's limit).
const MAX_TLS_NAME: usize = 253;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantFile {
    name: String,
    #[serde(default)]
    reservation: f64,
    limit: Option<f64>,
    #[serde(default = "d_weight")]
    weight: f64,
    #[serde(default)]
    idle_credit: u32,
    reservation_split: Option<String>,
    #[serde(default)]
    server_reservations: BTreeMap<String, f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportFile {
    name: String,
    tenant: Option<String>,
    size_mb: u64,
    #[serde(default = "d_stripe_kb")]
    stripe_kb: u64,
    widths: Option<BTreeMap<String, u32>>,
    node_export: Option<String>,
    allow_networks: Option<Vec<String>>,
    allow_identities: Option<Vec<String>>,
    #[serde(default)]
    read_only: bool,
}

fn seconds(key: &'static str, got: f64, min: f64, max: f64) -> Result<Duration, GatewaySettingError> {
    if got.is_finite() && (min..=max).contains(&got) {
        Ok(Duration::from_secs_f64(got))
    } else {
        Err(GatewaySettingError::Seconds { key, min, max, got, zero_is_off: false })
    }
}

impl GatewayConfig {
    /// `rein gateway --check-config`: what a start would refuse before it contacts its nodes, without
    /// starting (the file was validated by [`GatewayConfig::load`]; here the admin endpoint's token file);
    /// returns a line per volume and a summary to print. The nodes are not contacted: a node that is down
    /// or serves another size shows at start.
    pub fn check(&self) -> Result<Vec<String>, GatewayError> {
        let layouts = self.check_layouts()?;
        if let Some(addr) = self.admin {
            crate::admin_guard::prepare(addr, &self.admin_access, ADMIN_POWERS)?;
        }
        if let Some(w) = crate::admin_guard::unused_admin_keys(&self.admin_access, self.admin, false) {
            tracing::warn!("{w}");
        }
        let mut lines: Vec<String> = self
            .exports
            .iter()
            .map(|v| {
                let on: Vec<&str> =
                    (0..self.nodes.len()).filter(|&j| v.stripe.uses(j)).map(|j| self.nodes[j].name.as_str()).collect();
                format!(
                    "volume {}: {} MiB of tenant {}, {} KiB units over {}{}",
                    v.name,
                    v.size >> 20,
                    self.tenants[v.tenant].name,
                    v.stripe.unit() >> 10,
                    on.join(", "),
                    if v.read_only { ", read-only" } else { "" }
                )
            })
            .collect();
        lines.extend(layouts);
        lines.extend(self.unrecorded_layouts().map(|w| format!("warning: {w}")));
        if let Some(p) = &self.parda {
            lines.push(format!("a PARDA host, id {}", p.id));
        }
        if let Some(t) = &self.tls {
            lines.extend(t.describe(crate::tls::unix_now()));
        }
        lines.push(format!(
            "{}, {} over {}, NBD on {}, {}",
            Count(self.tenants.len(), "tenant"),
            Count(self.exports.len(), "volume"),
            Count(self.nodes.len(), "node"),
            self.listen,
            Count(self.node_sessions(), "node connection")
        ));
        Ok(lines)
    }

    /// Refuses a node at this gateway's own front: `listen` (or, when `listen` is an unspecified address,
    /// a loopback address at its port) or `listen_unix`. Its pieces would come back through the front as
    /// requests for the same volume, nested until `request_timeout_s` failed them all with EIO. Called with
    /// the command line's `--listen` and `--listen-unix` applied.
    fn check_no_node_at_the_front(&self) -> Result<(), GatewayConfigError> {
        for n in &self.nodes {
            let front = match &n.address {
                NodeAddress::Tcp(a) => {
                    let unspecified = self.listen.ip().is_unspecified() && a.ip().is_loopback();
                    (*a == self.listen || (unspecified && a.port() == self.listen.port()))
                        .then(|| self.listen.to_string())
                }
                NodeAddress::Unix(p) => {
                    self.listen_unix.as_ref().filter(|u| u.path == *p).map(|u| u.path.display().to_string())
                }
            };
            if let Some(front) = front {
                return Err(GatewayConfigError::Invalid(GatewaySettingError::Node {
                    node: n.name.clone(),
                    error: NodeSettingError::OwnFront { address: n.address.clone(), front },
                }));
            }
        }
        Ok(())
    }

    /// Without `layout_file`, the warning that nothing checks the layouts of the volumes over several
    /// nodes (a start and `--check-config` say it): a start with gw.toml's layout keys changed scrambles
    /// their data unchecked. A volume over one node has no unit to get wrong.
    pub fn unrecorded_layouts(&self) -> Option<String> {
        if self.layout_file.is_some() {
            return None;
        }
        let v = self.exports.iter().find(|v| (0..self.nodes.len()).filter(|&j| v.stripe.uses(j)).count() > 1)?;
        Some(format!(
            "layout_file is not set: the layouts of volumes over several nodes (export {} among them) are not \
             recorded, so a start with [[nodes]] reordered, or a volume's widths, stripe_kb or node_export changed, \
             would lay their data out anew unchecked, scrambling it (set layout_file: docs/gateway.md, \"Layout\")",
            v.name
        ))
    }

    /// Refuses volumes whose layout differs from the one `layout_file` recorded (their data was written
    /// in it), all named in one error ([`layouts`]); nothing to check without a `layout_file` or before
    /// it is first written. Returns, for `--check-config`, a line saying what was checked.
    pub fn check_layouts(&self) -> Result<Option<String>, GatewayError> {
        let Some(path) = &self.layout_file else { return Ok(None) };
        let Some(recorded) = layouts::read(path)? else {
            return Ok(Some(format!("layout_file {}: no record yet (a start writes it)", path.display())));
        };
        let now = self.exports.iter().map(|v| (v.name.as_str(), layout_of(v, &self.nodes)));
        let differ = layouts::differences(&recorded, now, &self.file);
        if differ.is_empty() {
            let known = self.exports.iter().filter(|v| recorded.volumes.contains_key(&v.name)).count();
            return Ok(Some(format!(
                "layout_file {}: {} as recorded, {} new",
                path.display(),
                Count(known, "volume"),
                self.exports.len() - known
            )));
        }
        Err(GatewayError::Layout(format!(
            "{}; a start would read and write their units in other places, scrambling their data: restore {}'s \
             [[nodes]] order, widths, stripe_kb and node_export for them, or, to lay a volume out anew (its data \
             then lost to the gateway), remove its entry from {}",
            differ.join("; "),
            self.file.display(),
            path.display()
        )))
    }

    /// The node connections this configuration holds (each export's nodes times `connections_per_node`;
    /// at most [`MAX_NODE_SESSIONS`]).
    pub fn node_sessions(&self) -> usize {
        node_sessions(&self.exports, self.nodes.len(), self.link.connections)
    }

    /// Reads and validates `path` (relative TLS paths are relative to its directory).
    pub fn load(path: &Path) -> Result<GatewayConfig, GatewayConfigError> {
        GatewayConfig::load_with(path, &Overrides::default())
    }

    /// [`GatewayConfig::load`] with the command line's `--listen` and `--listen-unix`, validated with the
    /// file ([`Overrides`]; its other fields are `rein serve`'s).
    pub fn load_with(path: &Path, overrides: &Overrides) -> Result<GatewayConfig, GatewayConfigError> {
        let text = crate::durable::read_config(path, crate::config::MAX_CONFIG_BYTES)
            .map_err(|source| GatewayConfigError::Read { path: path.display().to_string(), source })?;
        GatewayConfig::parse_with(&text, path, overrides)
    }

    /// Validates `text` (read from `path`).
    pub fn parse(text: &str, path: &Path) -> Result<GatewayConfig, GatewayConfigError> {
        GatewayConfig::parse_with(text, path, &Overrides::default())
    }

    /// [`GatewayConfig::parse`] with the command line's overrides.
    pub fn parse_with(text: &str, path: &Path, overrides: &Overrides) -> Result<GatewayConfig, GatewayConfigError> {
        let file: File = crate::config::parse_toml(text)
            .map_err(|source| GatewayConfigError::Parse { path: path.display().to_string(), source })?;
        let cfg = validate(file, path, overrides).map_err(GatewayConfigError::Invalid)?;
        cfg.check_no_node_at_the_front()?;
        Ok(cfg)
    }
}

fn validate(f: File, path: &Path, o: &Overrides) -> Result<GatewayConfig, GatewaySettingError> {
    let base = path.parent().unwrap_or(Path::new("."));
    let parda = match (&f.parda, &f.parda_host) {
        (None, None) => None,
        (None, Some(_)) => return Err(GatewaySettingError::PardaHostWithoutParda),
        (Some(p), h) => {
            // `[mclock]` is rein serve's (and a scenario's) table; here it sets the host's local scheduler.
            let sched = match &f.mclock {
                Some(m) => m.resolve().map_err(|e| GatewaySettingError::Setting(SettingError::Sched(e)))?,
                None => rein_core::SchedConfig::default(),
            };
            Some(crate::parda_host::validate(p, h.as_ref(), sched, base).map_err(GatewaySettingError::Parda)?)
        }
    };
    if f.mclock.is_some() && parda.is_none() {
        return Err(GatewaySettingError::MclockWithoutParda);
    }
    let keys = crate::config::FrontKeys {
        listen: &f.listen,
        listen_unix: f.listen_unix.as_deref(),
        listen_unix_mode: f.listen_unix_mode.as_deref(),
        admin: f.admin.as_deref(),
    };
    let (listen, listen_unix, admin) = o.fronts(keys, base)?;
    let admin_access = crate::admin_guard::AdminAccess::new(
        f.admin_token_file.as_ref().map(|p| base.join(p)),
        f.admin_insecure,
        f.max_admin_connections,
        f.admin_idle_timeout_s,
    )
    .map_err(GatewaySettingError::AdminAccess)?;
    let request_timeout = seconds("request_timeout_s", f.request_timeout_s, 0.1, MAX_TIMEOUT_S)?;
    let connect_timeout = seconds("connect_timeout_s", f.connect_timeout_s, 0.1, MAX_TIMEOUT_S)?;
    // 0: no check (remote.rs, "Read-only node exports").
    let read_only_check = if f.read_only_check_s == 0.0 {
        None
    } else {
        let check = seconds("read_only_check_s", f.read_only_check_s, 0.1, MAX_TIMEOUT_S);
        Some(check.map_err(|e| match e {
            GatewaySettingError::Seconds { key, min, max, got, .. } => {
                GatewaySettingError::Seconds { key, min, max, got, zero_is_off: true }
            }
            e => e,
        })?)
    };
    in_range("reconnect_max_backoff_ms", f.reconnect_max_backoff_ms, 50, 600_000)?;
    in_range("connections_per_node", f.connections_per_node as u64, 1, MAX_CONNECTIONS_PER_NODE as u64)?;
    in_range("worker_threads", f.worker_threads as u64, 1, MAX_WORKER_THREADS as u64)?;
    let tls =
        f.tls.as_ref().map(|t| tls_config(t, base)).transpose()?.filter(|t| t.mode != rein_proto::nbd::TlsMode::Off);
    let caps = conn_caps(f.max_connections, f.max_connections_per_client, f.max_connections_per_tenant)?;
    in_range("max_inflight_mb", f.max_inflight_mb, 1, crate::budget::MAX_INFLIGHT_MB)?;
    in_range("max_inflight_mb_per_tenant", f.max_inflight_mb_per_tenant, 1, crate::budget::MAX_INFLIGHT_MB)?;
    let (idle_timeout, stall_timeout) = crate::config::conn_timeouts(f.idle_timeout_s, f.stall_timeout_s)?;
    let shutdown_timeout = if f.shutdown_timeout_s == 0.0 {
        Duration::ZERO
    } else {
        seconds("shutdown_timeout_s", f.shutdown_timeout_s, 0.0, 3600.0)?
    };
    in_range("max_request_kb", f.max_request_kb, 1, 128 * 1024)?;
    // Nodes.
    if f.nodes.is_empty() {
        return Err(GatewaySettingError::NoNodes);
    }
    if f.nodes.len() > MAX_NODES {
        return Err(GatewaySettingError::TooManyNodes { max: MAX_NODES, got: f.nodes.len() });
    }
    let node_tls = match &f.node_tls {
        None => None,
        Some(t) if t.name.is_some() => return Err(GatewaySettingError::NodeTlsName),
        // One context for every node, which a reload replaces for all of them at once.
        Some(t) => Some(crate::tls::LiveTlsClient::new(
            t.build(base, "node_tls").map_err(|e| GatewaySettingError::NodeTls(Box::new(e)))?,
        )),
    };
    let mut nodes: Vec<NodeSpec> = Vec::new();
    for n in &f.nodes {
        if n.name.is_empty() {
            return Err(GatewaySettingError::EmptyNodeName);
        }
        if n.name.len() > MAX_NODE_NAME_LEN {
            return Err(GatewaySettingError::NodeNameLength { name: n.name.clone(), max: MAX_NODE_NAME_LEN });
        }
        if nodes.iter().any(|x| x.name == n.name) {
            return Err(GatewaySettingError::RepeatedNode { name: n.name.clone() });
        }
        let node_error = |error| GatewaySettingError::Node { node: n.name.clone(), error };
        let address = NodeAddress::parse(&n.address, base)
            .map_err(|error| node_error(NodeSettingError::Address { text: n.address.clone(), error }))?;
        let protocol = match n.protocol.as_deref() {
            None | Some("auto") => NodeProtocol::Auto,
            Some("nbd") => NodeProtocol::Nbd,
            Some("rein") => NodeProtocol::Rein,
            Some(o) => return Err(node_error(NodeSettingError::Protocol { got: o.to_string() })),
        };
        let tls = match (n.tls.unwrap_or(node_tls.is_some()), &node_tls) {
            (false, _) => {
                if n.tls_name.is_some() {
                    return Err(node_error(NodeSettingError::TlsNameWithoutTls));
                }
                None
            }
            (true, None) => return Err(node_error(NodeSettingError::TlsWithoutNodeTls)),
            (true, Some(client)) => {
                let name = match &n.tls_name {
                    None => address.default_tls_name(),
                    Some(t) if t.is_empty() || t.len() > MAX_TLS_NAME || t.contains('\0') => {
                        return Err(node_error(NodeSettingError::TlsName { max: MAX_TLS_NAME }))
                    }
                    Some(t) => t.clone(),
                };
                Some(NodeTls { client: client.clone(), name })
            }
        };
        nodes.push(NodeSpec::new(n.name.clone(), address, protocol, tls));
    }
    let node_index = |name: &str| nodes.iter().position(|n| n.name == name);
    // Tenants.
    let mut tenants: Vec<GatewayTenant> = Vec::new();
    // A set for the repeat check (as rein serve's): the file's tenants are not bounded by its volumes.
    let mut names = std::collections::HashSet::with_capacity(f.tenants.len());
    for t in &f.tenants {
        if t.name.is_empty() {
            return Err(SettingError::EmptyTenantName.into());
        }
        if !names.insert(t.name.as_str()) {
            return Err(SettingError::RepeatedTenant { name: t.name.clone() }.into());
        }
        if t.name.len() > MAX_NODE_NAME_LEN || t.name.contains('\0') {
            return Err(GatewaySettingError::TenantName { name: t.name.clone(), max: MAX_NODE_NAME_LEN });
        }
        let spec = QosSpec::new(t.reservation, t.limit, t.weight, t.idle_credit)
            .map_err(|error| SettingError::TenantSpec { tenant: t.name.clone(), error })?;
        let tenant_error = |error| GatewaySettingError::Tenant { tenant: t.name.clone(), error };
        let rho = match t.reservation_split.as_deref() {
            None | Some("spread") => false,
            Some("rho") => true,
            Some(o) => return Err(tenant_error(TenantSettingError::ReservationSplit { got: o.to_string() })),
        };
        let mut server_reservations = vec![0.0; nodes.len()];
        for (node, &r) in &t.server_reservations {
            let j =
                node_index(node).ok_or_else(|| tenant_error(TenantSettingError::UnknownNode { node: node.clone() }))?;
            if !(r.is_finite() && r >= 0.0) {
                return Err(tenant_error(TenantSettingError::ServerReservation { node: node.clone(), got: r }));
            }
            server_reservations[j] = r;
        }
        tenants.push(GatewayTenant { name: t.name.clone(), spec, rho, server_reservations });
    }
    // Volumes.
    if f.exports.is_empty() {
        return Err(SettingError::NoExports.into());
    }
    if f.exports.len() > MAX_VOLUMES {
        return Err(GatewaySettingError::TooManyExports { max: MAX_VOLUMES, got: f.exports.len() });
    }
    let mut exports: Vec<GatewayVolume> = Vec::new();
    for e in &f.exports {
        if e.name.is_empty() || e.name.len() > 4096 {
            return Err(GatewaySettingError::ExportName);
        }
        if exports.iter().any(|x| x.name == e.name) {
            return Err(GatewaySettingError::RepeatedExport { name: e.name.clone() });
        }
        let volume_error = |error| GatewaySettingError::Volume { export: e.name.clone(), error: Box::new(error) };
        let size = e
            .size_mb
            .checked_mul(1 << 20)
            .filter(|&s| s > 0 && s <= crate::config::MAX_EXPORT_BYTES)
            .ok_or_else(|| volume_error(VolumeSettingError::Size { got: e.size_mb }))?;
        if e.stripe_kb == 0 || e.stripe_kb > MAX_STRIPE_KB {
            return Err(volume_error(VolumeSettingError::StripeKb { got: e.stripe_kb, max: MAX_STRIPE_KB }));
        }
        let widths = match &e.widths {
            None => vec![1; nodes.len()],
            Some(map) => {
                let mut w = vec![0; nodes.len()];
                for (node, &width) in map {
                    let j = node_index(node)
                        .ok_or_else(|| volume_error(VolumeSettingError::UnknownNode { node: node.clone() }))?;
                    w[j] = width;
                }
                w
            }
        };
        let stripe =
            Stripe::new(e.stripe_kb << 10, &widths).map_err(|error| volume_error(VolumeSettingError::Stripe(error)))?;
        let tname = e.tenant.clone().unwrap_or_else(|| e.name.clone());
        let tenant = match tenants.iter().position(|t| t.name == tname) {
            Some(i) => i,
            None if e.tenant.is_none() => {
                tenants.push(GatewayTenant {
                    name: tname,
                    spec: QosSpec::default(),
                    rho: false,
                    server_reservations: vec![0.0; nodes.len()],
                });
                tenants.len() - 1
            }
            None => return Err(volume_error(VolumeSettingError::UnknownTenant { tenant: tname })),
        };
        let node_exports: Vec<String> = f
            .nodes
            .iter()
            .map(|n| e.node_export.clone().or_else(|| n.export.clone()).unwrap_or_else(|| e.name.clone()))
            .collect();
        if let Some(long) = node_exports.iter().find(|x| x.len() > rein_proto::nbd::MAX_NAME_LEN) {
            return Err(volume_error(VolumeSettingError::NodeExportName {
                name: long.clone(),
                max: rein_proto::nbd::MAX_NAME_LEN,
            }));
        }
        let access = parse_access(&e.name, &e.allow_networks, &e.allow_identities)?;
        let read_only = e.read_only;
        exports.push(GatewayVolume { name: e.name.clone(), tenant, size, stripe, node_exports, access, read_only });
    }
    let sessions = node_sessions(&exports, nodes.len(), f.connections_per_node);
    if sessions > MAX_NODE_SESSIONS {
        return Err(GatewaySettingError::Sessions { sessions, max: MAX_NODE_SESSIONS });
    }
    // Invariant 3: a node export holds one volume's units, from its offset 0; a second user (another
    // volume, or the same volume through a second entry for that node) would overwrite them.
    let mut holders: HashMap<(&NodeAddress, &str), (&str, &str)> = HashMap::new();
    for v in &exports {
        for (j, n) in nodes.iter().enumerate().filter(|&(j, _)| v.stripe.uses(j)) {
            let key = (&n.address, v.node_exports[j].as_str());
            if let Some((other, other_node)) = holders.insert(key, (&v.name, &n.name)) {
                return Err(GatewaySettingError::Volume {
                    export: v.name.clone(),
                    error: Box::new(VolumeSettingError::SharedNodeExport {
                        node: n.name.clone(),
                        node_export: key.1.to_string(),
                        address: n.address.clone(),
                        other: (other != v.name).then(|| other.to_string()),
                        other_node: other_node.to_string(),
                    }),
                });
            }
        }
    }
    if let Some(t) = tenants.iter().find(|t| t.name.len() > MAX_NODE_NAME_LEN) {
        return Err(GatewaySettingError::ExportTenantName { name: t.name.clone(), max: MAX_NODE_NAME_LEN });
    }
    let default_export = match &f.default_export {
        None => None,
        Some(d) => Some(
            exports
                .iter()
                .position(|e| e.name == *d)
                .ok_or_else(|| GatewaySettingError::DefaultExport { name: d.clone() })?,
        ),
    };
    Ok(GatewayConfig {
        listen,
        listen_unix,
        admin,
        admin_access,
        tls,
        caps,
        max_inflight: f.max_inflight_mb << 20,
        max_inflight_per_tenant: f.max_inflight_mb_per_tenant.min(f.max_inflight_mb) << 20,
        idle_timeout,
        stall_timeout,
        shutdown_timeout,
        max_request: (f.max_request_kb << 10) as u32,
        default_export,
        link: LinkConfig {
            request_timeout,
            connect_timeout,
            max_backoff: Duration::from_millis(f.reconnect_max_backoff_ms),
            connections: f.connections_per_node,
            read_only_check,
        },
        worker_threads: f.worker_threads,
        layout_file: f.layout_file.as_ref().map(|p| base.join(p)),
        nodes,
        tenants,
        exports,
        parda,
        file: path.to_path_buf(),
    })
}

/// How long the gateway's shutdown waits for its node sessions to end with NBD_CMD_DISC.
const NODE_CLOSE: Duration = Duration::from_secs(2);

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The admin endpoint cannot be served as configured (its token, or an exposed address).
    #[error(transparent)]
    Admin(#[from] crate::admin_guard::AdminGuardError),
    /// A node answered but could not be opened for a volume (export or protocol refused, too small); names
    /// the node. A node that cannot be reached does not stop the start ([`RemoteVolume::open`]).
    #[error("export {volume}: {source}")]
    Node {
        /// The volume.
        volume: String,
        /// What failed.
        source: OpenError,
    },
    /// A listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The Unix socket (`listen_unix`) could not be bound; the error names the path and why.
    #[error("cannot listen on the Unix socket {0}")]
    BindUnix(crate::sock::UnixBindError),
    /// A socket the service manager passed cannot be used ([`crate::activation`]); the error names the
    /// descriptor and why.
    #[error("socket activation: {0}")]
    Activation(crate::activation::ActivationError),
    /// The PARDA host could not start (its UDP socket or board file); the error names the part.
    #[error("{0}")]
    HostStart(crate::parda_host::StartError),
    /// A volume's tenant, added by a reload, cannot join the PARDA host as a VM.
    #[error("export {export}: tenant {tenant}: {source}")]
    HostVm {
        /// The volume's export.
        export: String,
        /// Its tenant.
        tenant: String,
        /// Why the host refuses it.
        source: crate::parda_host::GateError,
    },
    /// A volume's layout differs from the one recorded in `layout_file` ([`layouts`]); the message names
    /// the volumes and the file.
    #[error("{0}")]
    Layout(String),
    /// `layout_file` cannot be written ([`layouts::write()`]); the error names the file.
    #[error(transparent)]
    LayoutWrite(#[from] layouts::LayoutWriteError),
    /// `layout_file` is there but cannot be read, or does not parse ([`layouts::read`]); the message names
    /// the file.
    #[error(transparent)]
    LayoutFile(#[from] layouts::LayoutReadError),
}

impl From<crate::admin_guard::AdminListenError> for GatewayError {
    fn from(e: crate::admin_guard::AdminListenError) -> Self {
        use crate::admin_guard::AdminListenError as E;
        match e {
            E::Guard(e) => e.into(),
            E::Activation(e) => GatewayError::Activation(e),
            E::Bind { addr, source } => GatewayError::Bind { addr, source },
        }
    }
}

impl From<crate::sock::NbdListenError> for GatewayError {
    fn from(e: crate::sock::NbdListenError) -> Self {
        use crate::sock::NbdListenError as E;
        match e {
            E::Bind(addr, source) => GatewayError::Bind { addr, source },
            E::BindUnix(e) => GatewayError::BindUnix(e),
            E::Activation(e) => GatewayError::Activation(e),
        }
    }
}

/// Addresses the gateway listens on.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The NBD front (the first TCP listener, with several passed by a service manager; the unspecified
    /// `0.0.0.0:0` when it is on passed Unix sockets only).
    pub nbd: SocketAddr,
    /// The HTTP endpoint, if configured.
    pub admin: Option<SocketAddr>,
}

/// Runs the gateway until `shutdown` resolves; `ready` gets the bound addresses once it listens. At start
/// every volume opens its node connections (invariant 2); a node that cannot be opened is an error naming
/// it. Shutdown as `rein serve`'s: stop accepting, answer what is in flight within `shutdown_timeout`.
pub async fn run(
    cfg: GatewayConfig,
    shutdown: impl Future<Output = ()>,
    ready: Option<tokio::sync::oneshot::Sender<Bound>>,
) -> Result<(), GatewayError> {
    run_with(cfg, shutdown, ready, None, crate::activation::Passed::none()).await
}

/// Reads gw.toml again (with the command line's overrides), for a reload.
pub type GatewayLoader = Box<dyn FnMut() -> Result<GatewayConfig, String> + Send>;

/// Reloads on demand (module comment, "Reload"): each message on `requests` (SIGHUP in the binary, or a
/// test) reads the configuration with `load` and applies the difference.
pub struct GatewayReload {
    /// One message per reload.
    pub requests: tokio::sync::mpsc::Receiver<()>,
    /// Reads and validates the configuration.
    pub load: GatewayLoader,
}

/// The NodeTenant entries a tenant's hello states, one per node (RBFQ's local reservation differs).
fn node_tenants(t: &GatewayTenant) -> Vec<NodeTenant> {
    t.server_reservations
        .iter()
        .map(|&local_reservation| NodeTenant {
            name: t.name.clone(),
            reservation: t.spec.reservation(),
            limit: t.spec.limit(),
            weight: t.spec.weight(),
            local_reservation,
            idle_credit: t.spec.idle_credit(),
            split: if t.rho { NodeSplit::Rho } else { NodeSplit::Spread },
        })
        .collect()
}

/// A volume as it runs: its configuration (its tenant by name), the volume, and the export VMs open.
#[derive(Clone)]
struct LiveVolume {
    cfg: GatewayVolume,
    tenant: String,
    volume: Arc<RemoteVolume>,
    export: Arc<Export>,
}

/// What the gateway runs now: the settings it started with (nodes, front, links: a reload does not change
/// them), its tenants and volumes as last applied, and the per-tenant state they share.
/// A PARDA host's VMs by tenant name; a lease dropped here leaves its VM to the volumes still open.
type HostVms = BTreeMap<String, Arc<VmLease>>;

struct Live {
    base: GatewayConfig,
    tenants: Vec<GatewayTenant>,
    volumes: Vec<LiveVolume>,
    /// Tenant ids for the budget and the caps, handed out by a throw-away scheduler's table (the gateway
    /// schedules nothing itself).
    ids: Box<dyn rein_core::Scheduler>,
    tenant_ids: BTreeMap<String, rein_core::TenantId>,
    /// One tracker per tenant over every node, shared by the tenant's volumes.
    trackers: BTreeMap<String, Arc<Mutex<ServiceTracker>>>,
    /// A PARDA host's gate and its VMs by tenant name (the tenants it started with, and those a reload
    /// added, from their first volume on).
    host: Option<(Arc<HostGate>, HostVms)>,
    /// Volumes a reload removed, while connections that opened them may still use them: their layouts
    /// hold their node exports until the last connection closes (module comment, "Reload").
    retired: Vec<(GatewayVolume, std::sync::Weak<RemoteVolume>)>,
    /// The places (in `base.nodes`) of the nodes a reload removed: no new volume uses them ([`NodePlan`]).
    gone: std::collections::BTreeSet<usize>,
    /// What was last written to `layout_file` ([`record_layouts`]).
    recorded: Option<Layouts>,
    /// Whether the NBD front and the admin endpoint listen on sockets a service manager passed
    /// ([`crate::activation`]): a reload's change of `listen`/`listen_unix` or `admin` is then not used,
    /// now or after a restart, and is named so.
    passed: (bool, bool),
    /// The front's TLS context (`[tls]`), which a reload replaces ([`crate::tls`], "Reload").
    tls: LiveTls,
    /// The `[node_tls]` cell that the TLS nodes the file names share (a reload's TLS nodes take it), and
    /// that `/metrics`' certificate gauge reads: empty while no node named uses TLS (none yet, or a reload
    /// turned it off everywhere: the certificate is then presented to no node, and its expiry must not
    /// raise an alert).
    node_tls: crate::tls::ClientSlot,
}

impl Live {
    fn new(cfg: &GatewayConfig) -> Live {
        Live {
            base: cfg.clone(),
            tenants: Vec::new(),
            volumes: Vec::new(),
            ids: rein_core::SchedulerKind::Fifo.build(Default::default()),
            tenant_ids: BTreeMap::new(),
            trackers: BTreeMap::new(),
            host: None,
            retired: Vec::new(),
            gone: Default::default(),
            recorded: None,
            passed: (false, false),
            tls: LiveTls::new(cfg.tls.clone()),
            node_tls: Arc::new(std::sync::RwLock::new(node_tls_cell(&cfg.nodes))),
        }
    }

    /// The id and tracker of tenant `t` (over `nodes` places), made on first use.
    fn tenant_state(&mut self, t: &GatewayTenant, nodes: usize) -> (rein_core::TenantId, Arc<Mutex<ServiceTracker>>) {
        let id = *self
            .tenant_ids
            .entry(t.name.clone())
            .or_insert_with(|| self.ids.add_tenant(t.spec).expect("the table takes every configured tenant"));
        let tracker = self
            .trackers
            .entry(t.name.clone())
            .or_insert_with(|| {
                let split = if t.rho { ReservationSplit::Rho } else { ReservationSplit::default() };
                Arc::new(Mutex::new(ServiceTracker::with_split(nodes, split)))
            })
            .clone();
        (id, tracker)
    }

    /// The tenant id and the QoS state a volume of tenant `t` opens with, over `nodes` places.
    fn volume_qos(&mut self, t: &GatewayTenant, nodes: usize) -> (rein_core::TenantId, VolumeQos) {
        let (id, tracker) = self.tenant_state(t, nodes);
        (id, VolumeQos { tenants: node_tenants(t), tracker })
    }

    /// Each volume of `cfg` with its tenant's scheduler id and QoS ([`Live::volume_qos`]), to open.
    fn prepare<'c>(&mut self, cfg: &'c GatewayConfig) -> Vec<(&'c GatewayVolume, rein_core::TenantId, VolumeQos)> {
        cfg.exports
            .iter()
            .map(|v| {
                let (id, qos) = self.volume_qos(&cfg.tenants[v.tenant], cfg.nodes.len());
                (v, id, qos)
            })
            .collect()
    }

    /// Volume `v`'s export over its opened node connections (on a PARDA host, its tenant's VM).
    async fn make(
        &mut self,
        v: &GatewayVolume,
        t: &GatewayTenant,
        id: rein_core::TenantId,
        volume: Arc<RemoteVolume>,
    ) -> Result<LiveVolume, GatewayError> {
        let backend = match &mut self.host {
            None => Backend::Remote(volume.clone()),
            Some((gate, vms)) => {
                let lease = match vms.get(&t.name) {
                    Some(lease) => lease.clone(),
                    // A tenant a reload added joins the host with its first volume.
                    None => {
                        let vm = gate.add_vm(t.spec).await.map_err(|source| GatewayError::HostVm {
                            export: v.name.clone(),
                            tenant: t.name.clone(),
                            source,
                        })?;
                        let lease = Arc::new(VmLease { gate: gate.clone(), vm });
                        vms.insert(t.name.clone(), lease.clone());
                        lease
                    }
                };
                Backend::Hosted(Arc::new(HostedVolume { volume: volume.clone(), lease }))
            }
        };
        let export = Arc::new(Export {
            info: ExportInfo {
                name: v.name.clone(),
                description: format!("tenant {} via rein gateway", t.name),
                size: v.size,
                // Its own `read_only`; a handshake advertises it read-only too while one of its node exports
                // refuses writes, as its node sessions learn it ([`Export::advertised`]).
                read_only: v.read_only,
                volatile: false,
                // The largest of its nodes' minimum blocks (as those up at its opening say), so that
                // clients align their requests to every node (remote.rs, "Size constraints"); at most the
                // largest power of two a request may be.
                min_block: volume.min_block().min(1 << self.base.max_request.ilog2()),
            },
            backend,
            tenant: id,
            tenant_name: t.name.clone(),
            access: v.access.clone(),
        });
        volume.set_read_only(v.read_only);
        Ok(LiveVolume { cfg: v.clone(), tenant: t.name.clone(), volume, export })
    }

    /// The layouts the volumes run, for `layout_file` ([`record_layouts`]): none without one, or when
    /// they are what was last written there (a reload that changes no volume writes nothing).
    fn layouts_now(&self) -> Option<(std::path::PathBuf, Layouts)> {
        let path = self.base.layout_file.clone()?;
        let volumes = self.volumes.iter().map(|v| (v.cfg.name.clone(), layout_of(&v.cfg, &self.base.nodes)));
        let volumes: Layouts = volumes.collect();
        (self.recorded.as_ref() != Some(&volumes)).then_some((path, volumes))
    }

    /// Whether a running volume, or one a reload removed whose connections are still open, uses place `j`.
    fn place_in_use(&self, j: usize) -> bool {
        self.volumes.iter().any(|v| v.cfg.stripe.uses(j)) || self.retired.iter().any(|(v, _)| v.stripe.uses(j))
    }

    /// How many nodes a running volume has a session with now.
    fn nodes_connected(&self) -> usize {
        let reports = self.volumes.iter().flat_map(|v| v.volume.node_report());
        let up: std::collections::BTreeSet<String> = reports.filter(|r| r.up > 0).map(|r| r.name.to_string()).collect();
        up.len()
    }

    fn exports(&self) -> Vec<Arc<Export>> {
        self.volumes.iter().map(|v| v.export.clone()).collect()
    }

    fn shown(&self) -> ShownVolumes {
        ShownVolumes {
            volumes: self.volumes.iter().map(|v| v.volume.clone()).collect(),
            removed: self.retired.iter().map(|(_, w)| w.clone()).collect(),
        }
    }
}

/// Opens volume `v`'s node connections over `nodes` (by place) and `link`'s settings.
async fn open_remote(
    nodes: &[NodeSpec],
    link: LinkConfig,
    v: &GatewayVolume,
    qos: VolumeQos,
) -> Result<Arc<RemoteVolume>, GatewayError> {
    RemoteVolume::open(&v.name, v.size, v.stripe.clone(), nodes, &v.node_exports, Some(qos), link)
        .await
        .map_err(|source| GatewayError::Node { volume: v.name.clone(), source })
}

/// Volumes opened at once, at start and by a reload: a node that is down or silent costs each volume a
/// connect timeout, paid by this many volumes together (one after another, 1,024 volumes on a silent node
/// took 85 min).
const OPEN_AT_ONCE: usize = 64;

/// Opens the node connections of `volumes` ([`OPEN_AT_ONCE`] at a time), each with its tenant id and QoS
/// state; the result is in `volumes`' order. The first error to come ends it at once, whatever the opens
/// before it in that order still wait for (a volume on a silent node waits its `connect_timeout`): the
/// opens under way are dropped, and what was opened too (its connections close).
async fn open_remotes<'a>(
    nodes: &[NodeSpec],
    link: LinkConfig,
    volumes: Vec<(&'a GatewayVolume, rein_core::TenantId, VolumeQos)>,
) -> Result<Vec<(&'a GatewayVolume, rein_core::TenantId, Arc<RemoteVolume>)>, GatewayError> {
    use futures_util::stream::{StreamExt, TryStreamExt};
    // The futures are made before the stream (a closure in the stream's type is not `Send` enough for
    // the reload's boxed future).
    let opens: Vec<_> = volumes
        .into_iter()
        .enumerate()
        .map(|(i, (v, id, qos))| async move { open_remote(nodes, link, v, qos).await.map(|vol| (i, (v, id, vol))) })
        .collect();
    // Taken as they complete (`buffered` yields them in order: an error waited for every open before it,
    // one on a silent node its `connect_timeout`), then put back in order.
    let mut opened: Vec<_> = futures_util::stream::iter(opens).buffer_unordered(OPEN_AT_ONCE).try_collect().await?;
    opened.sort_unstable_by_key(|(i, _)| *i);
    Ok(opened.into_iter().map(|(_, o)| o).collect())
}

/// Why a reload is refused ([`apply_reload`], module comment "Reload"): nothing changed, the running
/// configuration goes on. Its text, logged and given as the service manager's status
/// ([`crate::reloads::reload_refused`]), names what to change.
#[derive(Debug, thiserror::Error)]
enum ReloadError {
    /// The file's nodes new to the gateway would take the places past [`MAX_NODES`] ([`NodePlan::new`]).
    #[error(
        "[[nodes]]: {} new to this gateway would make {places} places, past the {max} a gateway keeps over its run \
         ({gone} of them for nodes removed since it started): restart it to add them",
        Count(*added, "node")
    )]
    TooManyPlaces {
        /// The nodes the file names that the gateway has not run.
        added: usize,
        /// The places they would make, with the running ones.
        places: usize,
        /// The most a gateway keeps ([`MAX_NODES`]).
        max: usize,
        /// The places of nodes removed since the start (kept, as every place is).
        gone: usize,
    },
    /// A volume the reload adds lists its nodes in another order than the gateway runs them
    /// ([`NodePlan::misordered`]): a restart would lay it out otherwise.
    #[error("{0}; list the nodes it runs in their order, new ones after them")]
    Misordered(Misordered),
    /// A node export of a volume the reload adds is held by a volume with another layout ([`held_clash`]).
    #[error("{0}")]
    NodeExportHeld(Box<HeldExport>),
    /// A node moved to the address a running node is at ([`NodeMoves::clash`]).
    #[error(
        "node {node} cannot move to {to}: node {there} is there now (move {there} away first, in a reload of its own)"
    )]
    MoveOntoNode {
        /// The node moved.
        node: String,
        /// Its new address.
        to: NodeAddress,
        /// The node at that address.
        there: String,
    },
    /// A node moved to the address of a node the file no longer names that a volume still uses
    /// ([`NodeMoves::clash`]).
    #[error(
        "node {node} cannot move to {to}: node {there} is there now: {} no longer names it, but a volume still \
         uses it (one this reload removes, or one removed earlier that VMs hold: /api/nodes); move {node} in a later \
         reload, once none does",
        .file.display()
    )]
    MoveOntoRemovedNode {
        /// The node moved.
        node: String,
        /// The configuration file the reload read.
        file: PathBuf,
        /// Its new address.
        to: NodeAddress,
        /// The removed node at that address.
        there: String,
    },
    /// Nodes whose place or settings the reload changes answered there and refused the link
    /// ([`NodeMoves::try_places`]): every one, in the nodes' order.
    #[error("{}", NodeRefusal::list(.0))]
    NodesRefuse(Vec<NodeRefusal>),
    /// A volume the reload adds cannot open (a node answers wrongly), as at start.
    #[error(transparent)]
    Open(Box<GatewayError>),
}

impl From<GatewayError> for ReloadError {
    fn from(e: GatewayError) -> ReloadError {
        ReloadError::Open(Box::new(e))
    }
}

/// A node export that a volume a reload adds would share with a volume of another layout
/// ([`ReloadError::NodeExportHeld`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "export {export}: node {node}'s export {node_export:?} at {address} is held by export {holder} ({held}) with \
     another layout: two layouts on one node export would overwrite each other's data; remove that export first, \
     and add this one once its connections have closed"
)]
struct HeldExport {
    /// The volume added.
    export: String,
    /// The node.
    node: String,
    /// The node export both use.
    node_export: String,
    /// The node's address.
    address: NodeAddress,
    /// The volume that holds it.
    holder: String,
    /// How that volume holds it.
    held: Held,
}

/// An export whose nodes the reload's file lists in another order than the gateway runs them
/// ([`NodePlan::misordered`]); its text is the refusal's or the warning's start.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Misordered {
    /// The export.
    export: String,
    /// Its nodes as the file lists them.
    in_file: Vec<String>,
    /// Its nodes in the order the gateway runs them (of their places).
    by_place: Vec<String>,
    /// The configuration file the reload read.
    file: PathBuf,
}

impl std::fmt::Display for Misordered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "export {}: {} lists its nodes as {}, the gateway runs them as {}: a restart would lay its data out \
             in the file's order, which is another layout",
            self.export,
            self.file.display(),
            self.in_file.join(", "),
            self.by_place.join(", ")
        )
    }
}

/// How a volume holds its node exports during a reload ([`ReloadError::NodeExportHeld`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// A volume the reload keeps, as it runs.
    Running,
    /// A volume this reload removes, whose connections may be open.
    RemovedNow,
    /// A volume an earlier reload removed, with connections still open.
    RemovedEarlier,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Held::Running => "as it runs",
            Held::RemovedNow => "which this reload removes; its connections may be open",
            Held::RemovedEarlier => "removed earlier, with connections still open",
        })
    }
}

/// A node that answered at the place a reload sets and refused the link ([`NodeMoves::try_places`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeRefusal {
    /// The node.
    node: String,
    /// Its new address.
    address: NodeAddress,
    /// The protocol the link speaks there.
    protocol: crate::remote::NodeProtocol,
    /// Whether the link is TLS there.
    tls: bool,
    /// Why the node refused it.
    why: String,
}

impl NodeRefusal {
    /// `refusals` one after another, as the reload's error says them.
    fn list(refusals: &[NodeRefusal]) -> String {
        refusals.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    }
}

impl std::fmt::Display for NodeRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node {}: the node at {} refuses the link as this reload sets it (protocol {}, TLS {}): {}",
            self.node,
            self.address,
            self.protocol.name(),
            if self.tls { "on" } else { "off" },
            self.why
        )
    }
}

/// How a reload's `[[nodes]]` land on the places the gateway runs its nodes in (module comment,
/// "Reload"). A place is an index in the running list, which every running volume's layout, node links
/// and tenant trackers use, so a node keeps its place for the gateway's run: the file's node of a
/// running node's name is that node (moved, if its address or `tls_name` differs: [`NodeMoves`]); a
/// node new to the gateway takes the next free place; a running node the file no longer names keeps
/// its place, unused by new volumes, while the volumes that use it run (its name in a later file takes
/// it back). The file's order is the layout's (docs/gateway.md, "Layout"): a volume's nodes must be in
/// the file in the order of their places ([`Stripe::placed`]), or a restart would lay it out otherwise.
struct NodePlan {
    /// The place of each of the file's nodes, by the file's index.
    place: Vec<usize>,
    /// The nodes by place as the reload leaves them: the running list's specs (each shared by every
    /// link to it), then the nodes added. New volumes open over this list.
    nodes: Vec<NodeSpec>,
    /// The file's nodes by place, for [`NodeMoves`]: the file's spec where it names a running node
    /// that may change live, the running spec at the other running places, then the nodes added.
    next: Vec<NodeSpec>,
    /// Places of running nodes the file no longer names and no volume it keeps uses: removed.
    dropped: Vec<usize>,
    /// Places of nodes an earlier reload removed that the file names again.
    back: Vec<usize>,
    /// Lines for the reload's report: what needs a restart.
    restart: Vec<String>,
}

impl NodePlan {
    /// Places `file`'s nodes over `running` (whose places in `gone` were removed by earlier reloads);
    /// `kept_use(j)` names a volume that the reload keeps and that uses place `j`, if any (its node cannot
    /// go). `cell` is the running TLS nodes' `[node_tls]` cell, if any runs: every TLS node of the file,
    /// running or added, takes it (a reload sets the file's context in it, [`NodeTlsSwap`]), so that the
    /// gateway's node links share one context as at start. Fails when the places would pass
    /// [`MAX_NODES`].
    fn new(
        running: &[NodeSpec],
        gone: &std::collections::BTreeSet<usize>,
        file: &[NodeSpec],
        cell: Option<&crate::tls::LiveTlsClient>,
        kept_use: impl Fn(usize) -> Option<String>,
    ) -> Result<NodePlan, ReloadError> {
        let at: HashMap<&str, usize> = running.iter().enumerate().map(|(j, n)| (n.name.as_str(), j)).collect();
        let mut plan = NodePlan {
            place: Vec::with_capacity(file.len()),
            nodes: running.to_vec(),
            next: running.to_vec(),
            dropped: Vec::new(),
            back: Vec::new(),
            restart: Vec::new(),
        };
        for n in file {
            // One `[node_tls]` cell for every node, which a reload sets for all of them at once (and the
            // admin's certificate gauge reads): a node added, or one whose TLS a reload turns on, shares
            // the running one.
            let mut n = n.clone();
            if let (Some(t), Some(cell)) = (&mut n.tls, cell) {
                t.client = cell.clone();
            }
            match at.get(n.name.as_str()) {
                Some(&j) => {
                    plan.place.push(j);
                    if gone.contains(&j) {
                        plan.back.push(j);
                    }
                    // Its address, `tls_name`, protocol and TLS on or off may change live ([`NodeMoves`]).
                    plan.next[j] = n;
                }
                None => {
                    plan.place.push(plan.nodes.len());
                    plan.nodes.push(n.clone());
                    plan.next.push(n);
                }
            }
        }
        if plan.nodes.len() > MAX_NODES {
            return Err(ReloadError::TooManyPlaces {
                added: plan.nodes.len() - running.len(),
                places: plan.nodes.len(),
                max: MAX_NODES,
                gone: gone.len(),
            });
        }
        let named: std::collections::HashSet<usize> = plan.place.iter().copied().collect();
        for (j, n) in running.iter().enumerate().filter(|&(j, _)| !named.contains(&j) && !gone.contains(&j)) {
            match kept_use(j) {
                Some(v) => plan.restart.push(format!(
                    "node {} removed while export {v} uses it: needs a restart (the export's data is laid out over it)",
                    n.name
                )),
                None => plan.dropped.push(j),
            }
        }
        Ok(plan)
    }

    /// The file's exports whose nodes the file lists in another order than their places: (export, what
    /// the reload says of it, the places of its nodes in order).
    fn misordered<'a>(&self, file: &'a GatewayConfig) -> Vec<(&'a str, Misordered, Vec<usize>)> {
        let names = |js: &[usize]| js.iter().map(|&i| file.nodes[i].name.clone()).collect();
        file.exports
            .iter()
            .filter(|v| v.stripe.placed(&self.place, self.next.len()).is_none())
            .map(|v| {
                let in_file: Vec<usize> = (0..file.nodes.len()).filter(|&i| v.stripe.uses(i)).collect();
                let mut by_place = in_file.clone();
                by_place.sort_by_key(|&i| self.place[i]);
                let what = Misordered {
                    export: v.name.clone(),
                    in_file: names(&in_file),
                    by_place: names(&by_place),
                    file: file.file.clone(),
                };
                (v.name.as_str(), what, by_place.iter().map(|&i| self.place[i]).collect())
            })
            .collect()
    }

    /// `file` by place: its nodes are [`NodePlan::next`], and its volumes' widths, node exports and
    /// tenants' `server_reservations` are indexed by place. A volume's layout is then the file's exactly
    /// when it is not [`NodePlan::misordered`] ([`Stripe::placed`]); a misordered one gets another layout,
    /// which the reload names or refuses.
    fn by_place(&self, file: &GatewayConfig) -> GatewayConfig {
        let mut c = file.clone();
        c.nodes = self.next.clone();
        for v in &mut c.exports {
            let widths = self.at_places(v.stripe.widths(), 0);
            v.stripe = Stripe::new(v.stripe.unit(), &widths).expect("the same widths");
            v.node_exports = self.at_places(&v.node_exports, String::new());
        }
        for t in &mut c.tenants {
            t.server_reservations = self.at_places(&t.server_reservations, 0.0);
        }
        c
    }

    /// `by_file` (one value per node of the file) by place, `none` at the places the file does not name.
    fn at_places<T: Clone>(&self, by_file: &[T], none: T) -> Vec<T> {
        let mut out = vec![none; self.next.len()];
        for (i, x) in by_file.iter().enumerate() {
            out[self.place[i]] = x.clone();
        }
        out
    }
}

/// Whether two tenants' per-node reservations agree (a list that grew by nodes without one is the same).
fn same_server_reservations(a: &[f64], b: &[f64]) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    long[..short.len()] == *short && long[short.len()..].iter().all(|&x| x == 0.0)
}

/// Applies `file` over `live` (module comment, "Reload"): nodes added and removed, volumes added, removed,
/// re-listed with new access lists; tenants' specs restated to their nodes; the rest named as needing a
/// restart. Opening a new volume can fail (a node answers wrongly): then nothing changes and the error is
/// returned.
async fn apply_reload(live: &mut Live, file: &GatewayConfig) -> Result<ReloadReport, ReloadError> {
    let mut r = ReloadReport::default();
    // The file's nodes in the places the gateway runs them (`NodePlan`); from here on `new` is the file
    // by place.
    live.retired.retain(|(_, w)| w.strong_count() > 0);
    let plan = {
        let kept: std::collections::HashSet<&str> = file.exports.iter().map(|v| v.name.as_str()).collect();
        let kept_use = |j: usize| {
            live.volumes
                .iter()
                .find(|o| o.cfg.stripe.uses(j) && kept.contains(o.cfg.name.as_str()))
                .map(|o| o.cfg.name.clone())
        };
        let cell = live.node_tls.read().unwrap_or_else(|e| e.into_inner()).clone();
        NodePlan::new(&live.base.nodes, &live.gone, &file.nodes, cell.as_ref(), kept_use)?
    };
    for (v, what, places) in plan.misordered(file) {
        let Some(running) = live.volumes.iter().find(|o| o.cfg.name == v) else {
            return Err(ReloadError::Misordered(what));
        };
        // A running volume over the same nodes, reordered: warned of (its data would scramble at a
        // restart). Over other nodes (one renamed, say) its layout changed anyway: named below.
        if (0..running.cfg.stripe.nodes()).filter(|&j| running.cfg.stripe.uses(j)).eq(places) {
            r.applied.push(format!("warning: {what} (put them back in order before a restart)"));
        }
    }
    r.needs_restart.extend(plan.restart.iter().cloned());
    let new = &plan.by_place(file);
    let base = &live.base;
    let restart = |r: &mut ReloadReport, key: &str| r.needs_restart.push(format!("{key} changed: needs a restart"));
    let dbg = |x: &dyn std::fmt::Debug| format!("{x:?}");
    // Addresses the service manager's sockets stand in for (as rein serve's reload says them).
    let unit = "the service manager passes (change the socket unit to move it)";
    let (nbd_passed, admin_passed) = live.passed;
    if nbd_passed && (base.listen != new.listen || base.listen_unix != new.listen_unix) {
        r.needs_restart.push(format!("listen, listen_unix: not used: NBD listens on the sockets {unit}"));
    }
    if admin_passed && base.admin != new.admin {
        r.needs_restart.push(format!("admin: not used: the admin endpoint listens on the socket {unit}"));
    }
    for (key, same) in [
        ("listen", nbd_passed || base.listen == new.listen),
        ("listen_unix", nbd_passed || base.listen_unix == new.listen_unix),
        ("admin", admin_passed || base.admin == new.admin),
        ("admin_token_file, admin_insecure or the admin caps", base.admin_access == new.admin_access),
        ("max_connections*", base.caps == new.caps),
        (
            "max_inflight_mb*",
            (base.max_inflight, base.max_inflight_per_tenant) == (new.max_inflight, new.max_inflight_per_tenant),
        ),
        ("idle_timeout_s", base.idle_timeout == new.idle_timeout),
        ("stall_timeout_s", base.stall_timeout == new.stall_timeout),
        ("shutdown_timeout_s", base.shutdown_timeout == new.shutdown_timeout),
        ("max_request_kb", base.max_request == new.max_request),
        (
            "request_timeout_s, connect_timeout_s, reconnect_max_backoff_ms, connections_per_node or read_only_check_s",
            dbg(&base.link) == dbg(&new.link),
        ),
        ("worker_threads", base.worker_threads == new.worker_threads),
        ("layout_file", base.layout_file == new.layout_file),
        ("[parda] or [parda_host]", parda_but_sched(&base.parda) == parda_but_sched(&new.parda)),
        (
            "default_export",
            base.default_export.map(|i| &base.exports[i].name) == new.default_export.map(|i| &new.exports[i].name),
        ),
    ] {
        if !same {
            restart(&mut r, key);
        }
    }
    // Tenants: the spec and the local reservations apply live; the split needs a restart (the tracker's).
    let mut tenants: Vec<GatewayTenant> = Vec::new();
    let mut respec: Vec<String> = Vec::new();
    for t in &new.tenants {
        match live.tenants.iter().find(|o| o.name == t.name) {
            Some(old) if old.rho != t.rho => {
                restart(&mut r, &format!("tenant {}: reservation_split", t.name));
                // As it runs, over the places this reload may have added (none of them reserved).
                let mut kept = old.clone();
                kept.server_reservations.resize(new.nodes.len(), 0.0);
                tenants.push(kept);
            }
            Some(old)
                if old.spec != t.spec
                    || !same_server_reservations(&old.server_reservations, &t.server_reservations) =>
            {
                r.applied.push(format!(
                    "tenant {}: {} -> {} (stated to its nodes in a new hello)",
                    t.name, old.spec, t.spec
                ));
                respec.push(t.name.clone());
                tenants.push(t.clone());
            }
            _ => tenants.push(t.clone()),
        }
    }
    let tenant_of = |name: &str| tenants.iter().find(|t| t.name == name).expect("a volume's tenant is configured");
    // The node exports running volumes hold, with the layout they hold them by (module comment, "Reload").
    let nodes = &plan.nodes;
    let mut held: HeldExports = HashMap::new();
    {
        let mut hold = |cfg: &GatewayVolume, how: Held| {
            for (j, n) in nodes.iter().enumerate().filter(|&(j, _)| cfg.stripe.uses(j)) {
                let key = (n.address.clone(), cfg.node_exports[j].clone());
                held.entry(key).or_insert_with(|| (cfg.name.clone(), how, cfg.stripe.clone(), j));
            }
        };
        for o in &live.volumes {
            let kept = new.exports.iter().any(|v| v.name == o.cfg.name);
            hold(&o.cfg, if kept { Held::Running } else { Held::RemovedNow });
        }
        for (cfg, _) in &live.retired {
            hold(cfg, Held::RemovedEarlier);
        }
    }
    // Volumes: in the new file's order; a kept volume whose layout changed stays as it runs. New ones
    // (`None` here) open together once every one has passed the layout check.
    let mut volumes: Vec<Option<LiveVolume>> = Vec::new();
    let mut to_open = Vec::new();
    // Kept volumes whose size_mb the file raises, their layout otherwise the same: (index in `volumes`,
    // the file's volume). They run at their old size until their node exports are found large enough.
    let mut grows: Vec<Growth> = Vec::new();
    // Whether the layouts are recorded: a restart that would lay a volume out anew is then refused.
    let recorded = live.base.layout_file.is_some();
    for v in &new.exports {
        let tname = &new.tenants[v.tenant].name;
        match live.volumes.iter().position(|o| o.cfg.name == v.name) {
            Some(i) => {
                let old = &live.volumes[i];
                let same_exports = (0..nodes.len())
                    .filter(|&j| v.stripe.uses(j))
                    .all(|j| old.cfg.node_exports.get(j) == v.node_exports.get(j));
                let same_layout = old.cfg.stripe.same_layout(&v.stripe) && same_exports && &old.tenant == tname;
                if same_layout && v.size < old.cfg.size {
                    r.needs_restart.push(shrink_line(&v.name, old.cfg.size, v.size));
                    volumes.push(Some(old.clone()));
                } else if !same_layout {
                    let hint = if (live.base.nodes.len()..nodes.len()).any(|j| v.stripe.uses(j)) {
                        " (an export without widths spans every node, so a node added changes it: give it the widths \
                         it runs)"
                    } else {
                        ""
                    };
                    // The restart this calls for would move the volume's data: say so where the operator
                    // reads that a restart is needed (docs/gateway.md, "Layout").
                    let scrambles = if !lays_out_anew(&old.cfg.stripe, &v.stripe, same_exports) {
                        ""
                    } else if recorded {
                        "; a restart with this file is refused: layout_file records the layout it runs, and the \
                         new stripe_kb, widths, node order or node_export would read and write its units in other \
                         places (docs/gateway.md, \"Layout\")"
                    } else {
                        "; a restart with this file would lay its data out anew, scrambling it: the new stripe_kb, \
                         widths, node order or node_export read and write its units in other places, and without \
                         layout_file nothing refuses that start (put them back before a restart, or see \
                         docs/gateway.md, \"Layout\")"
                    };
                    r.needs_restart.push(format!(
                        "export {}: size_mb, stripe_kb, widths, node_export or tenant{hint} changed: needs a \
                         restart{scrambles}",
                        v.name
                    ));
                    volumes.push(Some(old.clone()));
                } else if old.cfg.access != v.access || old.cfg.read_only != v.read_only {
                    if v.size > old.cfg.size {
                        grows.push(Growth { at: volumes.len(), from: old.cfg.size, v });
                    }
                    if old.cfg.access != v.access {
                        r.applied.push(format!(
                            "export {}: access lists changed (for connections opened from now on)",
                            v.name
                        ));
                    }
                    if old.cfg.read_only != v.read_only {
                        r.applied.push(if v.read_only {
                            format!(
                                "export {}: read-only now; the writes of the connections opened before fail (EPERM) \
                                 from now on",
                                v.name
                            )
                        } else {
                            format!(
                                "export {}: writable again, for the connections opened from now on and those opened \
                                 while it was writable before",
                                v.name
                            )
                        });
                    }
                    // An export is shared by the connections that opened it: a change is a new one. (The
                    // volume's own write gate is set once the reload is applied, below.)
                    let info = ExportInfo { read_only: v.read_only, ..old.export.info.clone() };
                    let export = Arc::new(Export { access: v.access.clone(), info, ..(*old.export).clone() });
                    // At its old size until a growth is applied (below).
                    let cfg = GatewayVolume { size: old.cfg.size, ..v.clone() };
                    volumes.push(Some(LiveVolume { cfg, export, ..old.clone() }));
                } else {
                    if v.size > old.cfg.size {
                        grows.push(Growth { at: volumes.len(), from: old.cfg.size, v });
                    }
                    volumes.push(Some(old.clone()));
                }
            }
            None => {
                if let Some(e) = held_clash(nodes, &held, v) {
                    return Err(e);
                }
                let (id, qos) = live.volume_qos(tenant_of(tname), nodes.len());
                to_open.push((v, id, qos));
                volumes.push(None);
            }
        }
    }
    // Nodes moved (another address or tls_name, protocol, TLS on or off) and `[node_tls]` first: new volumes
    // connect with them, and renewed sessions below.
    // A node removed now or earlier: still there while volumes use it, else nowhere.
    let removed = |j: usize| (plan.dropped.contains(&j) || live.gone.contains(&j)).then(|| live.place_in_use(j));
    if let Some(e) = NodeMoves::clash(&live.base.nodes, &new.nodes, &new.file, removed) {
        return Err(e);
    }
    let moves = NodeMoves::set(&live.base.nodes, &new.nodes);
    let cell = live.node_tls.read().unwrap_or_else(|e| e.into_inner()).clone();
    let (node_tls, changed) = NodeTlsSwap::set(cell.as_ref(), &file.nodes);
    // Each node moved is tried at its new place first, with the new `[node_tls]`: one that answers and
    // refuses the link fails the reload, which changes nothing (the moves and the context are put back).
    // A node a running volume uses is tried with its session; one only the file's new volumes use, with one
    // of their node exports.
    let running_at = |j: usize| live.volumes.iter().find(|v| v.cfg.stripe.uses(j)).map(|v| v.volume.clone());
    let export_at =
        |j: usize| new.exports.iter().filter(|c| c.stripe.uses(j)).find_map(|c| c.node_exports.get(j).cloned());
    let unreached = moves.try_places(&live.base.nodes, running_at, export_at, live.base.link.connect_timeout).await?;
    r.applied.extend(unreached);
    // Volumes grown: each node export is asked its size now (at the node's place as this reload sets it),
    // all at once; a volume whose node exports all hold their part of the new size takes it below, for
    // new connections. (`Growth`, module comment "Reload".)
    let mut grown: Vec<(usize, u64)> = Vec::new();
    for (g, short) in grows.iter().zip(Growth::check(nodes, &grows, live.base.link.connect_timeout).await) {
        let (i, v) = (g.at, g.v);
        if !short.is_empty() {
            r.needs_restart.extend(short);
            continue;
        }
        let old = volumes[i].as_ref().expect("a kept volume");
        let info = ExportInfo { size: v.size, ..old.export.info.clone() };
        let export = Arc::new(Export { info, ..(*old.export).clone() });
        let cfg = GatewayVolume { size: v.size, ..old.cfg.clone() };
        grown.push((i, old.cfg.size));
        volumes[i] = Some(LiveVolume { cfg, export, ..old.clone() });
    }
    // The tenants' trackers count the places added (a tracker is shared by its tenant's volumes).
    for t in live.trackers.values() {
        t.lock().unwrap_or_else(|e| e.into_inner()).add_servers(nodes.len());
    }
    if changed {
        r.applied.push(
            "[node_tls]: new credentials (the ca, cert, key, crl, psk_file or psk_identity, or their contents): for node \
             connections from now on (sessions up keep theirs)"
                .to_string(),
        );
    }
    // What was opened is dropped on an error: its connections close, and nothing changed.
    let opened = open_remotes(nodes, live.base.link, to_open).await?;
    let mut slots = volumes.iter_mut().filter(|v| v.is_none());
    for (v, id, volume) in opened {
        let lv = live.make(v, tenant_of(&new.tenants[v.tenant].name), id, volume).await?;
        r.applied.push(format!("export {} added", v.name));
        *slots.next().expect("a slot for each new volume") = Some(lv);
    }
    let volumes: Vec<LiveVolume> = volumes.into_iter().map(|v| v.expect("every new volume opened")).collect();
    for old in &live.volumes {
        if !volumes.iter().any(|v| v.cfg.name == old.cfg.name) {
            r.applied
                .push(format!("export {} removed (connections open on it keep it until they close)", old.cfg.name));
            live.retired.push((old.cfg.clone(), Arc::downgrade(&old.volume)));
        }
    }
    // Restate changed specs to the nodes of every volume of those tenants (new volumes already have them),
    // and on a PARDA host to its local scheduler (at once) and beta (from the next period).
    for name in &respec {
        let t = tenant_of(name);
        for v in volumes.iter().filter(|v| &v.tenant == name) {
            v.volume.respec(&node_tenants(t));
        }
        if let Some((gate, vms)) = &live.host {
            if let Some(vm) = vms.get(name).map(|l| l.vm) {
                match gate.set_vm_spec(vm, t.spec).await {
                    Ok(()) => r.applied.push(format!(
                        "tenant {name}: the PARDA host's local scheduler uses the new spec, and beta from the next period"
                    )),
                    Err(e) => r.needs_restart.push(format!("tenant {name}: {e}")),
                }
            }
        }
    }
    if let Some((_, vms)) = &mut live.host {
        let removed: Vec<String> = vms.keys().filter(|n| !tenants.iter().any(|t| &t.name == *n)).cloned().collect();
        for name in removed {
            // The volumes still open hold the VM; it leaves the host when the last of them closes.
            vms.remove(&name);
            r.applied.push(format!(
                "tenant {name} removed: its VM leaves the PARDA host (and beta) when the last connection to its \
                 volumes closes"
            ));
        }
    }
    // The node sessions of the volumes kept that refuse writes learn again whether they do (remote.rs,
    // "Read-only node exports"): a reload of a node that makes its export writable again ends none of
    // them. (A volume this reload opened has just learnt it.)
    let kept = volumes.iter().filter(|v| live.volumes.iter().any(|old| Arc::ptr_eq(&old.volume, &v.volume)));
    for v in kept {
        let nodes = v.volume.recheck_read_only();
        if nodes.is_empty() {
            continue;
        }
        let (names, one) = (nodes.join(", "), nodes.len() == 1);
        r.applied.push(if v.volume.checks_read_only() {
            format!(
                "export {}: a check of the flags of {names}'s {} runs now; the sessions that refuse writes renew \
                 if it finds {} writable (until then the volume is advertised read-only)",
                v.cfg.name,
                if one { "export" } else { "exports" },
                if one { "it" } else { "one" }
            )
        } else {
            format!(
                "export {}: the sessions with {names} renew to learn whether {} still read-only (until then the \
                 volume is advertised read-only)",
                v.cfg.name,
                if one { "its export is" } else { "their exports are" }
            )
        });
    }
    live.tenants = tenants;
    live.volumes = volumes;
    // Volumes grown: their node sessions opened for a smaller piece renew ([`RemoteVolume::grow`], which
    // returns once they have: the front's table, and so the new size, is set after this returns).
    for &(i, from) in &grown {
        let v = &live.volumes[i];
        let renewed = v.volume.grow(v.cfg.size).await;
        r.applied.push(Growth::applied(&v.cfg.name, from, v.cfg.size, &renewed));
    }
    // Each volume's own write gate, as its `read_only` says now (a volume this reload opened has it).
    for v in &live.volumes {
        v.volume.set_read_only(v.cfg.read_only);
    }
    // The gateway's `[mclock]`: the PARDA host's local scheduler takes it at once (queued requests stay).
    if let (Some((gate, _)), Some(now), Some(next)) = (&live.host, &mut live.base.parda, &new.parda) {
        let changed = crate::live::sched_changes(&now.sched, &next.sched);
        if !changed.is_empty() {
            now.sched = next.sched;
            gate.set_sched(now);
            r.applied.push(format!("[mclock] of the PARDA host's local scheduler: {}", changed.join(", ")));
        }
    }
    // The front's TLS, read again from its files (renewed certificates under the same names too): for the
    // connections opened from now on; those open keep their sessions unless it revokes their client.
    // (`[node_tls]` was set above, before the new volumes opened.)
    if let Some(w) = new.tls.as_ref().and_then(|t| t.expiry_warning(crate::tls::unix_now())) {
        r.applied.push(format!("warning: {w}"));
    }
    if let Some(what) = TlsConfig::change(live.base.tls.as_ref(), new.tls.as_ref()) {
        r.applied.push(format!("[tls]: {what}: for NBD connections from now on (connections open keep their session)"));
    }
    let cut = live.tls.set(new.tls.clone());
    if !cut.is_empty() {
        r.applied.push(format!(
            "[tls]: {} closed: the new credentials revoke their client (each logged)",
            rein_core::Count(cut.len(), "open connection")
        ));
    }
    live.base.tls = new.tls.clone();
    r.applied.extend(moves.keep(&mut live.base.nodes));
    for n in &plan.nodes[live.base.nodes.len()..] {
        r.applied.push(format!("node {} added at {} (for volumes from now on)", n.name, n.address));
    }
    live.base.nodes.extend_from_slice(&plan.nodes[live.base.nodes.len()..]);
    for &j in &plan.back {
        live.gone.remove(&j);
        r.applied.push(format!("node {} back (for volumes from now on)", live.base.nodes[j].name));
    }
    for &j in &plan.dropped {
        live.gone.insert(j);
        let still = if live.place_in_use(j) {
            "; connections open on removed volumes that use it keep it until they close"
        } else {
            ""
        };
        r.applied.push(format!("node {} removed (no new volume can use it){still}", live.base.nodes[j].name));
    }
    // The cell of the TLS nodes the file names (the first one a reload adds gives it; none once no node
    // named uses TLS).
    let named = live.base.nodes.iter().enumerate().filter(|(j, _)| !live.gone.contains(j));
    let cell = named.filter_map(|(_, n)| n.tls.as_ref()).map(|t| t.client.clone()).next();
    *live.node_tls.write().unwrap_or_else(|e| e.into_inner()) = cell;
    let now = live.layouts_now();
    if let Err(e) = record_layouts(&mut live.recorded, now).await {
        r.applied.push(format!("warning: {e} (the volumes' layouts are not recorded; a start checks the last record)"));
    }
    let cut = node_tls.keep();
    if !cut.is_empty() {
        r.applied.push(format!(
            "[node_tls]: {} closed: the new crl revokes its node's certificate (each logged); it reconnects and \
             is refused",
            rein_core::Count(cut.len(), "node link")
        ));
    }
    Ok(r)
}

/// What a reload says of a running volume whose `size_mb` it lowers, its layout otherwise the same: a
/// restart, which cuts off the data past the new end (nothing is moved or kept).
fn shrink_line(name: &str, from: u64, to: u64) -> String {
    format!(
        "export {name}: size_mb lowered from {} to {}: needs a restart, and the restart cuts off the volume's last \
         {} MiB (its data from byte {to} on; put size_mb back to keep them)",
        from >> 20,
        to >> 20,
        (from - to) >> 20
    )
}

/// A running volume whose `size_mb` a reload raises, its layout (stripe_kb, widths, node order,
/// node_export, tenant) otherwise the same (module comment, "Reload"). The stripe maps a volume offset to
/// its node and node offset whatever the volume's size ([`Stripe::map`]), so the bytes it holds stay
/// where they are and the new part lands on each node past its old piece: each node export must hold
/// [`Stripe::node_bytes`] of the new size. The node sessions know their export's size from their
/// handshakes (fixed per session: a node image grown since is not in it), so the nodes are asked now
/// ([`crate::remote::export_size`]).
struct Growth<'a> {
    /// The volume's index in the reload's list.
    at: usize,
    /// Its size as it runs (bytes).
    from: u64,
    /// The file's volume (by place), with the new size.
    v: &'a GatewayVolume,
}

impl Growth<'_> {
    /// Asks every node export of `grows` its size (all at once, each within `connect_timeout`, at its
    /// node's place as the reload sets it) and returns, per growth in order, the lines of the node
    /// exports that refuse it ([`Growth::short`]; none: it applies).
    async fn check(nodes: &[NodeSpec], grows: &[Growth<'_>], connect_timeout: Duration) -> Vec<Vec<String>> {
        let asks = grows.iter().enumerate().flat_map(|(g, grow)| {
            (0..nodes.len()).filter(|&j| grow.v.stripe.uses(j)).map(move |j| async move {
                (g, j, crate::remote::export_size(&nodes[j], &grow.v.node_exports[j], connect_timeout).await)
            })
        });
        let sizes = futures_util::future::join_all(asks).await;
        let mut short = vec![Vec::new(); grows.len()];
        for (g, grow) in grows.iter().enumerate() {
            let mine: Vec<_> = sizes.iter().filter(|s| s.0 == g).map(|(_, j, size)| (*j, size.clone())).collect();
            short[g] = grow.short(nodes, &mine);
        }
        short
    }

    /// The lines of the node exports that refuse the growth, given their `sizes` (node place, its
    /// export's size now or why it could not be read): one too small, or one whose size could not be
    /// read (the node down), names the node, its export, what it has and what the new size needs there.
    fn short(&self, nodes: &[NodeSpec], sizes: &[(usize, Result<u64, String>)]) -> Vec<String> {
        let v = self.v;
        let (to, from) = (v.size >> 20, self.from >> 20);
        let mut lines = Vec::new();
        for (j, size) in sizes {
            let needed = v.stripe.node_bytes(*j, v.size);
            let (node, export) = (&nodes[*j].name, &v.node_exports[*j]);
            let what = format!("export {}: size_mb {to} needs {needed} bytes of node {node}'s export {export}", v.name);
            match size {
                Ok(size) if *size >= needed => {}
                Ok(size) => lines.push(format!(
                    "{what}, which has {size} (grow it on the node first, then reload the gateway); the volume stays \
                     at size_mb {from}"
                )),
                Err(why) => lines.push(format!(
                    "{what}, whose size could not be read: {why} (reload the gateway once the node answers); the \
                     volume stays at size_mb {from}"
                )),
            }
        }
        lines
    }

    /// The reload's line for a growth applied, `renewed` the nodes whose sessions renew
    /// ([`RemoteVolume::grow`]).
    fn applied(name: &str, from: u64, to: u64, renewed: &[String]) -> String {
        let sessions = if renewed.is_empty() {
            "its node sessions already see exports that large".to_string()
        } else {
            format!(
                "its sessions with {} end once their pieces are answered and renew for the new size",
                renewed.join(", ")
            )
        };
        format!(
            "export {name}: size_mb {} -> {} for connections opened from now on (those open keep their size: NBD \
             fixes it per connection); {sessions}",
            from >> 20,
            to >> 20
        )
    }
}

/// The node exports running volumes hold, by node address and node export: the volume that holds it and
/// how (for the refusal), by which layout, at which place.
type HeldExports = HashMap<(NodeAddress, String), (String, Held, Stripe, usize)>;

/// Why volume `v`, which a reload adds over `nodes` (by place), cannot open: one of its node exports is
/// `held` by a volume with another layout (module comment, "Reload"), if one is.
fn held_clash(nodes: &[NodeSpec], held: &HeldExports, v: &GatewayVolume) -> Option<ReloadError> {
    nodes.iter().enumerate().filter(|&(j, _)| v.stripe.uses(j)).find_map(|(j, n)| {
        let (holder, how, stripe, at) = held.get(&(n.address.clone(), v.node_exports[j].clone()))?;
        (!stripe.same_layout(&v.stripe) || *at != j).then(|| {
            ReloadError::NodeExportHeld(Box::new(HeldExport {
                export: v.name.clone(),
                node: n.name.clone(),
                node_export: v.node_exports[j].clone(),
                address: n.address.clone(),
                holder: holder.clone(),
                held: *how,
            }))
        })
    })
}

/// `[node_tls]` as a reload replaces it (module `tls`, "Reload"): the new context is set in the gateway's
/// cell (which every TLS node shares) before the reload opens new volumes (they connect with it) and
/// renews sessions, and put back by `Drop` unless the reload completes ([`NodeTlsSwap::keep`]).
struct NodeTlsSwap {
    cell: Option<crate::tls::LiveTlsClient>,
    old: Option<crate::tls::TlsClient>,
}

impl NodeTlsSwap {
    /// Sets the `[node_tls]` context of `new` (the file's nodes) in `cell` (the running TLS nodes', if any
    /// runs; [`NodePlan::new`] gives it to the file's TLS nodes), when both are there: a gateway without
    /// one takes the file's (its TLS nodes hold it), and a file without TLS nodes leaves the cell as it is
    /// (its links turn plain, and the gateway has no cell after the reload). Built anew from
    /// the files, it is set whatever the comparison says; whether it differs is returned, for the log.
    fn set(cell: Option<&crate::tls::LiveTlsClient>, new: &[NodeSpec]) -> (NodeTlsSwap, bool) {
        let mut swap = NodeTlsSwap { cell: None, old: None };
        let (Some(cell), Some(next)) = (cell, new.iter().find_map(|n| n.tls.as_ref()).map(|t| t.client.get())) else {
            return (swap, false);
        };
        let old = cell.get();
        cell.set(next.clone());
        let changed = old.changed(&next);
        swap.cell = Some(cell.clone());
        swap.old = Some(old);
        (swap, changed)
    }

    /// The reload completed: the new context stays, and the links it revokes are cut (one line each).
    fn keep(mut self) -> Vec<String> {
        self.old = None;
        self.cell.iter().flat_map(|c| c.cut_revoked()).collect()
    }
}

impl Drop for NodeTlsSwap {
    fn drop(&mut self) {
        if let (Some(old), Some(cell)) = (self.old.take(), &self.cell) {
            cell.set(old);
        }
    }
}

/// Whether `b` (a reload's nodes by place, [`NodePlan::next`]) names `a`'s nodes (the running ones) at
/// their places, whatever their addresses, `tls_name`s, protocols and TLS on or off (a reload changes
/// them live, [`NodeMoves`]) and `[node_tls]`'s credentials (a reload replaces them, [`crate::tls`],
/// "Reload"), with nodes added after them.
fn same_nodes(a: &[NodeSpec], b: &[NodeSpec]) -> bool {
    a.len() <= b.len() && a.iter().zip(b).all(|(x, y)| x.name == y.name)
}

/// Nodes a reload moves (module comment, "Reload"): the new place (`address`, `tls_name`, `protocol`, TLS
/// on or off) is set in the node's route before the reload opens new volumes (they connect there, and
/// every link that reconnects does, as does the check of its exports' flags), and put back by `Drop`
/// unless the reload completes ([`NodeMoves::keep`]), which tells the sessions still open at the old
/// place to move ([`crate::remote::NodeRoute`]).
struct NodeMoves {
    /// The running nodes' routes moved, with what each held before.
    moved: Vec<(Arc<crate::remote::NodeRoute>, Option<crate::remote::Place>)>,
    /// The new places, by the running list's index.
    to: Vec<(usize, crate::remote::Place)>,
}

impl NodeMoves {
    /// Moves the nodes of `running` whose place differs in `new`, when the two lists name the same nodes
    /// ([`same_nodes`]; else nothing moves).
    fn set(running: &[NodeSpec], new: &[NodeSpec]) -> NodeMoves {
        let mut m = NodeMoves { moved: Vec::new(), to: Vec::new() };
        if !same_nodes(running, new) {
            return m;
        }
        for (i, (old, next)) in running.iter().zip(new).enumerate() {
            let place = next.place();
            if old.place() != place {
                m.moved.push((Arc::clone(&old.route), old.route.set(Some(place.clone()))));
                m.to.push((i, place));
            }
        }
        m
    }

    /// Why `new` (by place) cannot move `running`'s nodes, if it cannot: a node moved to the address
    /// another node is at now. Its sessions there would run beside the new ones until they drain, each
    /// writing its own layout to that node's exports (two nodes trading places, for one); one move per
    /// reload, the place freed first, keeps every node export to one writer. `removed(j)` says whether
    /// the node at place `j` was removed, and if so whether volumes still use it: one that none uses is
    /// nowhere. (A node added at a running node's address is no such case: it has no sessions yet, and
    /// the volumes' layouts are checked by node export, as two nodes at one address are at start.)
    fn clash(
        running: &[NodeSpec],
        new: &[NodeSpec],
        file: &Path,
        removed: impl Fn(usize) -> Option<bool>,
    ) -> Option<ReloadError> {
        if !same_nodes(running, new) {
            return None;
        }
        let now: Vec<NodeAddress> = running.iter().map(|n| n.place().address).collect();
        running.iter().zip(new).enumerate().find_map(|(i, (n, next))| {
            let to = next.place().address;
            if now[i] == to {
                return None;
            }
            let j = (0..now.len()).find(|&j| now[j] == to && removed(j) != Some(false))?;
            let (node, there) = (n.name.clone(), running[j].name.clone());
            Some(match removed(j) {
                Some(_) => ReloadError::MoveOntoRemovedNode { node, to, there, file: file.to_path_buf() },
                None => ReloadError::MoveOntoNode { node, to, there },
            })
        })
    }

    /// Tries each node moved at its new place, all at once (at most [`MAX_NODES`]: a reload waits one
    /// `connect_timeout` for the nodes that are silent together, not one each), with the `[node_tls]`
    /// context set by then: a session as a running volume on it (`running_at(place)`) would open one now
    /// ([`RemoteVolume::try_session`]: TLS as the new place says, the storage-node hello under `rein` or
    /// `auto`, the export and its size), ended at once; where only volumes this reload adds use it, a side
    /// connection as a check of `export_at(place)`'s flags makes ([`crate::remote::try_place`]). Each node
    /// that answers and refuses it (TLS turned on at a node that does not offer it, or off at one that
    /// requires it; credentials or a `tls_name` it does not take; the storage-node protocol refused under
    /// `rein`) fails the reload, named with its reason (all of them, in the nodes' order), before its
    /// sessions are told to move there. A node that cannot be reached does not (its sessions reconnect
    /// once it is up): it gets a warning line for the reload's report, returned; a node no volume uses is
    /// not tried (nothing to break).
    async fn try_places(
        &self,
        running: &[NodeSpec],
        running_at: impl Fn(usize) -> Option<Arc<RemoteVolume>>,
        export_at: impl Fn(usize) -> Option<String>,
        connect_timeout: Duration,
    ) -> Result<Vec<String>, ReloadError> {
        use crate::remote::Tried;
        let tries: Vec<_> = self
            .to
            .iter()
            .filter_map(|(i, place)| {
                let node = &running[*i];
                let how = match running_at(*i) {
                    Some(volume) => Ok(volume),
                    None => Err(export_at(*i)?),
                };
                let tls = if place.tls.is_some() { "TLS on" } else { "TLS off" };
                Some(async move {
                    let tried = match how {
                        Ok(volume) => volume.try_session(*i).await.unwrap_or(Tried::Reached),
                        Err(export) => crate::remote::try_place(node, &export, connect_timeout).await,
                    };
                    let (name, address, protocol) = (&node.name, &place.address, place.protocol.name());
                    match tried {
                        Tried::Reached => Ok(None),
                        Tried::Down(why) => Ok(Some(format!(
                            "warning: node {name}: not reached at {address} (protocol {protocol}, {tls}): {why}; not \
                             tried: its sessions reconnect with the new settings once it answers"
                        ))),
                        Tried::Refused(why) => Err(NodeRefusal {
                            node: name.clone(),
                            address: address.clone(),
                            protocol: place.protocol,
                            tls: place.tls.is_some(),
                            why,
                        }),
                    }
                })
            })
            .collect();
        // Every try to its end, so that a refusal names every node that refuses, not the first to answer.
        let (mut unreached, mut refused) = (Vec::new(), Vec::new());
        for t in futures_util::future::join_all(tries).await {
            match t {
                Ok(line) => unreached.extend(line),
                Err(e) => refused.push(e),
            }
        }
        if refused.is_empty() {
            Ok(unreached)
        } else {
            Err(ReloadError::NodesRefuse(refused))
        }
    }

    /// The reload completed: the moves stay, the running list says where the nodes are and how they are
    /// spoken to, and the sessions still open at a node's old place end once their pieces are answered
    /// and reconnect to the new one. One line per node moved, for the reload's report.
    fn keep(mut self, running: &mut [NodeSpec]) -> Vec<String> {
        self.moved.clear();
        let mut lines = Vec::new();
        for (i, place) in std::mem::take(&mut self.to) {
            let n = &mut running[i];
            // As it ran (the route holds the new place already).
            let before = n.configured_place();
            let tls = |p: &crate::remote::Place| if p.tls.is_some() { "on" } else { "off" };
            let mut what = Vec::new();
            let renamed = before.tls.is_some() && place.tls.is_some() && before.tls_name() != place.tls_name();
            let moved = before.address != place.address || renamed;
            if moved {
                what.push(format!("moved from {} to {}", before.address, place.address));
            }
            if before.protocol != place.protocol {
                what.push(format!("protocol {} -> {}", before.protocol.name(), place.protocol.name()));
            }
            if before.tls.is_some() != place.tls.is_some() {
                what.push(format!("TLS on the link {} -> {}", tls(&before), tls(&place)));
            }
            n.address = place.address.clone();
            n.protocol = place.protocol;
            n.tls = place.tls.clone();
            n.route.announce();
            let there = if before.address == place.address { "with the new settings" } else { "there" };
            lines.push(format!(
                "node {}{}{}: its sessions end once their pieces are answered and reconnect {there}",
                n.name,
                if moved { " " } else { ": " },
                what.join(", ")
            ));
        }
        lines
    }
}

impl Drop for NodeMoves {
    fn drop(&mut self) {
        for (route, before) in self.moved.drain(..) {
            route.set(before);
            // A session that connected to the new place meanwhile (a renewal) goes back.
            route.announce();
        }
    }
}

/// A PARDA host's settings less its local scheduler's (which a reload changes live), for comparison.
fn parda_but_sched(p: &Option<crate::parda_host::HostSettings>) -> Option<String> {
    p.as_ref().map(|h| format!("{:?}", crate::parda_host::HostSettings { sched: Default::default(), ..h.clone() }))
}

/// [`run`], reloading the volumes and tenants when `reload` asks (module comment, "Reload").
///
/// `passed`: the listening sockets a service manager passed ([`crate::activation`], roles
/// [`crate::activation::NBD`] and [`crate::activation::ADMIN`]), served in place of `listen` and
/// `listen_unix`, or of `admin` (also without an `admin` in gw.toml); [`crate::activation::Passed::none`]
/// binds the configuration's.
pub async fn run_with(
    cfg: GatewayConfig,
    shutdown: impl Future<Output = ()>,
    ready: Option<tokio::sync::oneshot::Sender<Bound>>,
    reload: Option<GatewayReload>,
    mut passed: crate::activation::Passed,
) -> Result<(), GatewayError> {
    crate::stall::watch_process();
    let passed_nbd = passed.take(&crate::activation::NBD);
    let passed_admin = passed.take_one(&crate::activation::ADMIN);
    let passed_any = (!passed_nbd.is_empty(), passed_admin.is_some());
    // A volume laid out otherwise than its data was written stops the start, before anything listens
    // (`layouts`).
    cfg.check_layouts()?;
    // The front and the admin endpoint are bound first, before the PARDA host starts and before the node
    // handshakes (which take up to connect_timeout_s each): a busy port fails the start at once, and
    // clients that connect meanwhile wait in the listen queue until the volumes are open, as they do
    // in a passed socket's.
    let nbd = crate::sock::NbdListeners::open(cfg.listen, cfg.listen_unix.as_ref(), passed_nbd).await?;
    let admin_listener =
        crate::admin_guard::admin_listener(passed_admin, cfg.admin, &cfg.admin_access, ADMIN_POWERS).await?;
    let mut live = Live::new(&cfg);
    live.passed = passed_any;
    live.tenants = cfg.tenants.clone();
    if let Some(settings) = &cfg.parda {
        let specs: Vec<QosSpec> = cfg.tenants.iter().map(|t| t.spec).collect();
        let (gate, ids) = HostGate::start(settings, &specs).await.map_err(GatewayError::HostStart)?;
        let vms = (cfg.tenants.iter().zip(ids))
            .map(|(t, vm)| (t.name.clone(), Arc::new(VmLease { gate: gate.clone(), vm })))
            .collect();
        tracing::info!(
            host = settings.id,
            controlled = settings.runs,
            aggregation = gate.status().aggregation,
            vms = cfg.tenants.len(),
            signed_reports = settings.key.as_ref().map(|k| k.identity()),
            "PARDA host: every request passes the host's window"
        );
        live.host = Some((gate, vms));
    }
    if let Some(w) = cfg.unrecorded_layouts() {
        tracing::warn!("{w}");
    }
    // The volumes' node connections open together (OPEN_AT_ONCE at a time), and a stop signal meanwhile
    // ends the start at once (it was heard only once the gateway listened).
    tokio::pin!(shutdown);
    let prepared = live.prepare(&cfg);
    let opened = tokio::select! {
        r = open_remotes(&cfg.nodes, cfg.link, prepared) => r?,
        _ = &mut shutdown => {
            tracing::info!("stopped while opening the volumes' node connections");
            return Ok(());
        }
    };
    for (v, id, volume) in opened {
        let lv = live.make(v, &cfg.tenants[v.tenant], id, volume).await?;
        live.volumes.push(lv);
    }
    let now = live.layouts_now();
    record_layouts(&mut live.recorded, now).await?;
    let limits = ConnLimits::new(cfg.caps);
    let policy = Arc::new(Policy {
        tls: live.tls.clone(),
        default_export: cfg.default_export.map(|i| cfg.exports[i].name.clone()),
        cap_tenants: true,
        limits: limits.clone(),
        // A gateway is not a storage node: NBD_OPT_REIN_NODE from a VM is an unknown option.
        node: None,
    });
    let ctx = Arc::new(NbdContext {
        exports: Arc::new(ExportTable::new(live.exports())),
        dispatcher: None,
        max_payload: cfg.max_request,
        limits: Limits {
            budget: Budget::new(cfg.max_inflight, cfg.max_inflight_per_tenant),
            idle_timeout: cfg.idle_timeout,
            stall_timeout: cfg.stall_timeout,
            handshake_timeout: crate::nbd::HANDSHAKE_TIMEOUT,
            ..Limits::default()
        },
    });
    let shown: Shown = Arc::new(std::sync::RwLock::new(live.shown()));
    let reloads = Arc::new(crate::reloads::Reloads::new("gateway"));
    let gate = live.host.as_ref().map(|(g, _)| g.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let admin = match admin_listener {
        None => None,
        Some((l, token)) => {
            let bound = l.local_addr().expect("bound");
            let accepts = Arc::new(crate::access::AcceptPacing::default());
            let l = crate::admin_guard::CappedListener::new(l, &cfg.admin_access, None, accepts.clone());
            let presented = crate::tls::Presented::default()
                .server("nbd", Some(live.tls.clone()))
                .client_slot("node_tls", live.node_tls.clone());
            let router = crate::admin_guard::protect(
                admin_router(shown.clone(), gate.clone(), reloads.clone(), presented, limits.clone(), accepts),
                token,
            );
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                let _ = axum::serve(l, router)
                    .with_graceful_shutdown(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await;
            });
            Some(bound)
        }
    };
    let bound = Bound { nbd: nbd.tcp_addr().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))), admin };
    let admin_addr = bound.admin.map_or_else(|| "none".to_string(), |a| a.to_string());
    // The nodes gw.toml names, and those a volume has a session with now: a node down at start (logged
    // before this line) or used by no volume is configured, not connected.
    let connected = live.nodes_connected();
    tracing::info!(
        nbd = %nbd.tcp_shown(),
        nbd_unix = %nbd.unix_shown(),
        admin = %admin_addr,
        nodes_configured = cfg.nodes.len(),
        nodes_connected = connected,
        exports = cfg.exports.len(),
        worker_threads = cfg.worker_threads,
        connections_per_node = cfg.link.connections,
        "rein gateway listening"
    );
    if let Some(w) = cfg.tls.as_ref().and_then(|t| t.expiry_warning(crate::tls::unix_now())) {
        tracing::warn!("{w}");
    }
    crate::notify::ready(&format!(
        "listening: NBD on {}, admin on {admin_addr}, {}, {} configured ({connected} connected)",
        nbd.shown(),
        Count(cfg.exports.len(), "volume"),
        Count(cfg.nodes.len(), "node")
    ));
    let mut watchdog = crate::notify::Watchdog::from_env();
    if let Some(hint) = halt_poll_hint(std::fs::read_to_string(HALT_POLL_NS).ok().as_deref()) {
        tracing::info!("{hint}");
    }
    if let Some(r) = ready {
        let _ = r.send(bound);
    }
    let (mut reload_rx, load) = match reload {
        Some(GatewayReload { requests, load }) => (Some(requests), Some(Arc::new(std::sync::Mutex::new(load)))),
        None => (None, None),
    };
    let mut tasks = tokio::task::JoinSet::new();
    // A reload runs beside the accept loop (opening a volume waits for its nodes, up to a connect timeout
    // each: a reload adding 10 volumes on a silent node once held new connections for 19 s); it holds the
    // running state meanwhile, and one more SIGHUP waits for it. So does the read of gw.toml, on a thread
    // of its own (`read_apart`: a FIFO or a hung mount in its place once blocked the loop for good).
    let mut live = Some(live);
    let mut reloading: Option<Reloading> = None;
    let mut reading = None;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            acc = nbd.accept() => spawn_accepted(acc, &mut tasks, &ctx, &policy, &stop_rx).await,
            Some(()) = async { reload_rx.as_mut().expect("guarded").recv().await }, if reload_rx.is_some() && reloading.is_none() && reading.is_none() => {
                crate::notify::reloading();
                reading = Some(crate::server::read_apart(load.as_ref().expect("with reload_rx")));
            }
            read = async { reading.as_mut().expect("guarded").await }, if reading.is_some() => {
                reading = None;
                match read {
                    Err(e) => {
                        reloads.record(false);
                        crate::notify::ready(&crate::reloads::reload_refused(&e));
                    }
                    Ok(new) => {
                        let mut l = live.take().expect("no reload in progress");
                        reloading = Some(Box::pin(async move {
                            let r = apply_reload(&mut l, &new).await;
                            (l, r)
                        }));
                    }
                }
            }
            (l, r) = async { reloading.as_mut().expect("guarded").await }, if reloading.is_some() => {
                reloading = None;
                match r {
                    Err(e) => {
                        reloads.record(false);
                        crate::notify::ready(&crate::reloads::reload_refused(&e));
                    }
                    Ok(r) => {
                        ctx.exports.set(l.exports());
                        *shown.write().unwrap_or_else(|e| e.into_inner()) = l.shown();
                        crate::notify::ready(&r.log(&reloads));
                    }
                }
                live = Some(l);
            }
            () = watchdog.tick() => watchdog.ping(),
        }
    }
    crate::notify::stopping();
    if reloading.take().is_some() {
        tracing::warn!("stopping: the reload in progress is abandoned (the volumes it opened close)");
    }
    if reading.is_some() {
        tracing::warn!("stopping: {} is still being read for a reload; that reload is abandoned", cfg.file.display());
    }
    let _ = stop_tx.send(true);
    // Connections that ended since the last accept are still in the set: not counted as open.
    while tasks.try_join_next().is_some() {}
    tracing::info!(connections = tasks.len(), "shutting down: answering the requests in flight");
    // The Unix socket's file goes with its listener.
    drop(nbd);
    let drained =
        tokio::time::timeout(cfg.shutdown_timeout, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(connections = tasks.len(), "shutdown deadline passed: closing connections");
        // One still waiting to hand a piece to a node that holds its pieces (a limited tenant's queue).
        let cut = crate::nbd::close_connections(&mut tasks, &ctx.limits).await;
        if cut > 0 {
            tracing::warn!(connections = cut, "connections still waiting for their nodes: cut");
        }
    }
    // Every node session ends with NBD_CMD_DISC, as the spec asks of a client (bounded: a node that is
    // down or does not take it is cut).
    // The volumes running (the last reload's list: a reload abandoned above took the state with it).
    let volumes = shown.read().unwrap_or_else(|e| e.into_inner()).volumes.clone();
    let mut closing = tokio::task::JoinSet::new();
    for v in volumes {
        closing.spawn(async move { v.close(NODE_CLOSE).await });
    }
    while closing.join_next().await.is_some() {}
    tracing::info!("stopped");
    Ok(())
}

/// A reload in progress: it gives the running state back with what it did.
type Reloading = std::pin::Pin<Box<dyn Future<Output = (Live, Result<ReloadReport, ReloadError>)> + Send>>;

/// The volumes `/metrics` and `/api/nodes` show (replaced whole by a reload).
type Shown = Arc<std::sync::RwLock<ShownVolumes>>;

/// The running volumes, and those a reload removed while connections still use them (`/api/nodes` lists
/// them as `"removed": true`: the sessions they keep open to nodes, a removed node's among them, end with
/// their last connection).
#[derive(Clone, Default)]
struct ShownVolumes {
    volumes: Vec<Arc<RemoteVolume>>,
    removed: Vec<std::sync::Weak<RemoteVolume>>,
}

/// A volume counter `/metrics` shows.
type VolumeCounter = fn(&crate::remote::VolumeStats) -> u64;
/// A node series `/metrics` shows.
type NodeValue = fn(&crate::remote::NodeReport<'_>) -> u64;

/// The Prometheus text of `/metrics`: per volume its requests (by kind), errors, bytes and latency
/// histogram; per volume and node the pooled connections, how many are up, pieces in flight, sent and
/// failed, sessions lost and FLUSHes failed for lost writes.
fn metrics_text(volumes: &[Arc<RemoteVolume>]) -> String {
    use crate::remote::REQUEST_KINDS;
    use std::fmt::Write;
    use std::sync::atomic::Ordering::Relaxed;
    let mut o = String::new();
    let head = |o: &mut String, metric: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {metric} {help}\n# TYPE {metric} {kind}");
    };
    head(&mut o, "rein_gateway_requests_total", "counter", "Requests from VMs answered, by kind.");
    for v in volumes {
        for (k, name) in REQUEST_KINDS.iter().enumerate() {
            let n = v.stats().requests[k].load(Relaxed);
            let _ = writeln!(o, "rein_gateway_requests_total{{export=\"{}\",kind=\"{name}\"}} {n}", v.name());
        }
    }
    let volume_counters: [(&str, &str, VolumeCounter); 3] = [
        ("rein_gateway_request_errors_total", "Requests answered with an error.", |s| s.errors.load(Relaxed)),
        ("rein_gateway_read_bytes_total", "Bytes of successful READs.", |s| s.read_bytes.load(Relaxed)),
        ("rein_gateway_write_bytes_total", "Bytes of successful WRITEs.", |s| s.write_bytes.load(Relaxed)),
    ];
    for (metric, help, f) in volume_counters {
        head(&mut o, metric, "counter", help);
        for v in volumes {
            let _ = writeln!(o, "{metric}{{export=\"{}\"}} {}", v.name(), f(v.stats()));
        }
    }
    head(
        &mut o,
        "rein_gateway_request_latency_seconds",
        "histogram",
        "Request latency through the gateway, from submit to answer.",
    );
    for v in volumes {
        let s = v.stats();
        let buckets: Vec<u64> = s.latency_buckets.iter().map(|b| b.load(Relaxed)).collect();
        crate::admin::histogram(
            &mut o,
            "rein_gateway_request_latency_seconds",
            &format!("export=\"{}\"", v.name()),
            &buckets,
            u128::from(s.latency_sum_ns.load(Relaxed)),
        );
    }
    let node_series: [(&str, &str, &str, NodeValue); 9] = [
        ("rein_gateway_node_connections", "gauge", "Pooled connections to a node for a volume.", |r| {
            r.connections as u64
        }),
        ("rein_gateway_node_connections_up", "gauge", "Of those, the ones with a session up.", |r| r.up as u64),
        ("rein_gateway_node_pieces_in_flight", "gauge", "Pieces sent to the node and not yet answered.", |r| {
            r.in_flight as u64
        }),
        ("rein_gateway_node_pieces_total", "counter", "Pieces sent to the node.", |r| r.stats.pieces.load(Relaxed)),
        (
            "rein_gateway_node_piece_errors_total",
            "counter",
            "Pieces failed: node errors, timeouts, lost sessions, node down.",
            |r| r.stats.piece_errors.load(Relaxed),
        ),
        ("rein_gateway_node_sessions_lost_total", "counter", "Node sessions that ended in failure.", |r| {
            r.stats.sessions_lost.load(Relaxed)
        }),
        (
            "rein_gateway_node_flush_lost_total",
            "counter",
            "FLUSHes failed because a session was lost with writes not yet flushed.",
            |r| r.stats.flush_lost.load(Relaxed),
        ),
        (
            "rein_gateway_node_read_only_checks_total",
            "counter",
            "Checks of the node export's read-only flag (read_only_check_s), failed ones included.",
            |r| r.stats.checks.load(Relaxed),
        ),
        (
            "rein_gateway_node_read_only_checks_failed_total",
            "counter",
            "Of those, the ones that failed (the node down or slow, or not answering NBD_OPT_INFO).",
            |r| r.stats.checks_failed.load(Relaxed),
        ),
    ];
    let reports: Vec<(&str, Vec<crate::remote::NodeReport<'_>>)> =
        volumes.iter().map(|v| (v.name(), v.node_report())).collect();
    for (metric, kind, help, f) in node_series {
        head(&mut o, metric, kind, help);
        for (export, nodes) in &reports {
            for r in nodes {
                let _ = writeln!(o, "{metric}{{export=\"{export}\",node=\"{}\"}} {}", r.name, f(r));
            }
        }
    }
    o
}

/// A PARDA host's `PUT` route: the gate (404 on a gateway without `[parda]`) and the JSON body as `T`
/// (400 naming what is wrong).
fn host_put<T: serde::de::DeserializeOwned>(
    gate: Option<Arc<HostGate>>,
    body: &[u8],
) -> Result<(Arc<HostGate>, T), (axum::http::StatusCode, String)> {
    use axum::http::StatusCode;
    let gate = gate.ok_or_else(|| (StatusCode::NOT_FOUND, "not a PARDA host (no [parda] table)\n".to_string()))?;
    let b = serde_json::from_slice(body).map_err(|e| (StatusCode::BAD_REQUEST, format!("bad JSON body: {e}\n")))?;
    Ok((gate, b))
}

/// The answer to a PARDA host's `PUT`: `ok` as JSON, or the gate's refusal (409).
fn host_put_answer(r: Result<(), crate::parda_host::GateError>, ok: serde_json::Value) -> axum::response::Response {
    use axum::response::IntoResponse;
    match r {
        Ok(()) => axum::Json(ok).into_response(),
        Err(e) => (axum::http::StatusCode::CONFLICT, format!("{e}\n")).into_response(),
    }
}

/// `PUT /api/parda/window` with `{"window": N}`: resizes an uncontrolled PARDA host's fixed issue queue.
async fn put_window(gate: Option<Arc<HostGate>>, body: &[u8]) -> axum::response::Response {
    use axum::response::IntoResponse;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        window: f64,
    }
    let (gate, b) = match host_put::<Body>(gate, body) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    host_put_answer(gate.set_fixed_window(b.window).await, serde_json::json!({ "window": b.window }))
}

/// `PUT /api/parda/period` with `{"ends_in_s": X}`: the host's current control period ends X seconds from
/// now (at most two periods), the next ones a period apart from there.
async fn put_period(gate: Option<Arc<HostGate>>, body: &[u8]) -> axum::response::Response {
    use axum::response::IntoResponse;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        ends_in_s: f64,
    }
    let (gate, b) = match host_put::<Body>(gate, body) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let Ok(ends_in) = std::time::Duration::try_from_secs_f64(b.ends_in_s) else {
        let e = format!("ends_in_s must be a non-negative number of seconds, got {}\n", b.ends_in_s);
        return (axum::http::StatusCode::BAD_REQUEST, e).into_response();
    };
    host_put_answer(gate.set_period_end_in(ends_in).await, serde_json::json!({ "ends_in_s": b.ends_in_s }))
}

/// What the gateway's admin API controls, as the refusal of an address without a token says it.
pub const ADMIN_POWERS: crate::admin_guard::Powers = crate::admin_guard::Powers(
    "read every volume's nodes and counters and, on a PARDA host, resize its window or move its control periods",
);

/// `/metrics` and `/api/nodes` (per volume and node: connections up); `/healthz` comes with
/// [`crate::admin_guard::protect`].
fn admin_router(
    shown: Shown,
    gate: Option<Arc<HostGate>>,
    reloads: Arc<crate::reloads::Reloads>,
    presented: crate::tls::Presented,
    connections: Arc<ConnLimits>,
    admin_accepts: Arc<crate::access::AcceptPacing>,
) -> axum::Router {
    let for_metrics = shown.clone();
    let snapshot = |s: &Shown| s.read().unwrap_or_else(|e| e.into_inner()).clone();
    let gate_metrics = gate.clone();
    let gate_window = gate.clone();
    let gate_period = gate.clone();
    axum::Router::new()
        .route(
            "/api/parda/period",
            axum::routing::put(move |body: axum::body::Bytes| {
                let gate = gate_period.clone();
                async move { put_period(gate, &body).await }
            }),
        )
        .route(
            "/api/parda/window",
            axum::routing::put(move |body: axum::body::Bytes| {
                let gate = gate_window.clone();
                async move { put_window(gate, &body).await }
            }),
        )
        .route(
            "/api/parda",
            axum::routing::get(move || {
                let status = gate.as_ref().map(|g| g.status());
                async move {
                    match status {
                        Some(s) => Ok(axum::Json(s)),
                        None => Err((axum::http::StatusCode::NOT_FOUND, "not a PARDA host (no [parda] table)\n")),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(move || {
                let volumes = snapshot(&for_metrics).volumes;
                let host = gate_metrics.as_ref().map(|g| g.status());
                async move {
                    let mut text = metrics_text(&volumes);
                    if let Some(h) = host {
                        crate::parda_host::metrics_text(&mut text, &h);
                    }
                    let rt = tokio::runtime::Handle::current().metrics();
                    crate::admin::runtime_metrics(&mut text, "rein_gateway", &rt);
                    crate::stall::metrics(&mut text);
                    admin_accepts.admin_metrics(&mut text);
                    reloads.metrics(&mut text, true);
                    connections.metrics(&mut text);
                    presented.metrics(&mut text);
                    text
                }
            }),
        )
        .route(
            "/api/nodes",
            axum::routing::get(move || {
                let shown = snapshot(&shown);
                let removed = shown.removed.iter().filter_map(|w| w.upgrade()).map(|v| (v, true));
                let volumes: Vec<(Arc<RemoteVolume>, bool)> =
                    shown.volumes.into_iter().map(|v| (v, false)).chain(removed).collect();
                async move {
                    use std::sync::atomic::Ordering::Relaxed;
                    let list: Vec<serde_json::Value> = volumes
                        .iter()
                        .map(|(v, removed)| {
                            let nodes: Vec<serde_json::Value> = v
                                .node_report()
                                .into_iter()
                                .map(|r| {
                                    serde_json::json!({
                                        "node": r.name,
                                        "address": r.address.to_string(),
                                        "connections": r.connections,
                                        "connected": r.up,
                                        "tls": r.tls,
                                        "protocol": r.protocol,
                                        "read_only": r.read_only,
                                        "in_flight": r.in_flight,
                                        "pieces": r.stats.pieces.load(Relaxed),
                                        "piece_errors": r.stats.piece_errors.load(Relaxed),
                                        "sessions_lost": r.stats.sessions_lost.load(Relaxed),
                                        "flush_lost": r.stats.flush_lost.load(Relaxed),
                                        "read_only_checks": r.stats.checks.load(Relaxed),
                                        "read_only_checks_failed": r.stats.checks_failed.load(Relaxed),
                                    })
                                })
                                .collect();
                            let read_only = v.read_only();
                            serde_json::json!({ "export": v.name(), "removed": removed, "read_only": read_only, "nodes": nodes })
                        })
                        .collect();
                    axum::Json(serde_json::Value::Array(list))
                }
            }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_guard::AdminAccessError;
    use crate::config::{AccessError, ExportError};
    use crate::sock::NodeAddressError;

    fn parse(top: &str) -> Result<GatewayConfig, GatewayConfigError> {
        let text = format!(
            "{top}\n[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:1\"\n[[exports]]\nname = \"v\"\nsize_mb = 1\n"
        );
        GatewayConfig::parse(&text, Path::new("gw.toml"))
    }

    /// The front and the HTTP endpoint on one port are refused, from the file and with `--listen` (which
    /// was applied after validation, so nothing checked it: both passed `--check-config` and the start
    /// failed with "Address already in use"); so is `--listen` at a node's address.
    #[test]
    fn the_command_line_listen_is_validated_with_the_file() {
        let text = "listen = \"127.0.0.1:10809\"\nadmin = \"127.0.0.1:9180\"\n[[nodes]]\nname = \"s1\"\n\
                    address = \"127.0.0.2:10809\"\n[[exports]]\nname = \"v\"\nsize_mb = 1\n";
        let with = |listen: &str| {
            let o = Overrides { listen: Some(listen.parse().unwrap()), ..Default::default() };
            GatewayConfig::parse_with(text, Path::new("gw.toml"), &o).map(|c| c.listen).map_err(|e| e.to_string())
        };
        let e = parse("listen = \"127.0.0.1:9180\"\nadmin = \"127.0.0.1:9180\"").unwrap_err().to_string();
        assert!(e.contains("take the same port"), "{e}");
        assert!(with("127.0.0.1:9180").unwrap_err().contains("take the same port"));
        assert!(with("0.0.0.0:9180").unwrap_err().contains("take the same port"));
        assert!(with("127.0.0.2:10809").unwrap_err().contains("this gateway's own front"));
        assert_eq!(with("127.0.0.1:7000").unwrap(), "127.0.0.1:7000".parse().unwrap());
    }

    /// A reload's restart warning is for changes that move a volume's data: another layout over several
    /// nodes, another node, or another export; not another unit over the one same node, nor nodes of
    /// width 0 added at the end.
    #[test]
    fn lays_out_anew_only_when_the_data_would_move() {
        let s = |unit: u64, w: &[u32]| Stripe::new(unit, w).unwrap();
        assert!(lays_out_anew(&s(65536, &[1, 1]), &s(131072, &[1, 1]), true), "stripe_kb over two nodes");
        assert!(lays_out_anew(&s(65536, &[1, 1]), &s(65536, &[1, 2]), true), "widths");
        assert!(lays_out_anew(&s(65536, &[1, 0]), &s(65536, &[0, 1]), true), "another node");
        assert!(lays_out_anew(&s(65536, &[1]), &s(65536, &[1]), false), "another node export");
        assert!(!lays_out_anew(&s(65536, &[1]), &s(131072, &[1]), true), "a unit over one node moves no byte");
        assert!(!lays_out_anew(&s(65536, &[1, 1]), &s(65536, &[1, 1, 0]), true), "a node of width 0 added");
    }

    /// `[node_tls]` in a reload: set in the running nodes' cells at once, put back when the reload does
    /// not complete (dropped without `keep`), kept when it does, also from a file with other nodes (added
    /// and removed at a reload); not set at all when the file has no TLS (a restart). Told apart by the
    /// PSK identity each file offers.
    #[test]
    fn a_reload_sets_node_tls_and_puts_it_back_if_it_fails() {
        let tmp = tempfile::tempdir().unwrap();
        let psk = |name: &str, id: &str| {
            let p = tmp.path().join(name);
            std::fs::write(&p, format!("{id}:00112233445566778899aabbccddeeff\n")).unwrap();
            p
        };
        let (old, new) = (psk("old.psk", "gw-old"), psk("new.psk", "gw-new"));
        let config = |file: &Path, name: &str| {
            let text = format!(
                "[node_tls]\npsk_file = {file:?}\n[[nodes]]\nname = \"{name}\"\naddress = \"127.0.0.1:1\"\n\
                 [[exports]]\nname = \"v\"\nsize_mb = 1\n"
            );
            GatewayConfig::parse(&text, Path::new("gw.toml")).unwrap().nodes
        };
        let offered = |nodes: &[NodeSpec]| nodes[0].tls.as_ref().unwrap().client.get().psk_identity().map(String::from);
        let running = config(&old, "s1");
        let (swap, changed) = NodeTlsSwap::set(node_tls_cell(&running).as_ref(), &config(&new, "s1"));
        assert!(changed);
        assert_eq!(offered(&running).as_deref(), Some("gw-new"), "set before the reload opens anything");
        drop(swap);
        assert_eq!(offered(&running).as_deref(), Some("gw-old"), "a failed reload puts it back");
        let (swap, _) = NodeTlsSwap::set(node_tls_cell(&running).as_ref(), &config(&new, "s1"));
        swap.keep();
        assert_eq!(offered(&running).as_deref(), Some("gw-new"), "a completed reload keeps it");
        let (swap, changed) = NodeTlsSwap::set(node_tls_cell(&running).as_ref(), &config(&old, "s2"));
        assert!(changed && offered(&running).as_deref() == Some("gw-old"), "another node's file: its context too");
        drop(swap);
        let plain = GatewayConfig::parse(
            "[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:1\"\n[[exports]]\nname = \"v\"\nsize_mb = 1\n",
            Path::new("gw.toml"),
        )
        .unwrap()
        .nodes;
        let (swap, changed) = NodeTlsSwap::set(node_tls_cell(&running).as_ref(), &plain);
        drop(swap);
        assert!(!changed && offered(&running).as_deref() == Some("gw-new"), "TLS turned off: the cell stays as it is");
        let (_, changed) = NodeTlsSwap::set(node_tls_cell(&running).as_ref(), &config(&new, "s1"));
        assert!(!changed, "the same file and bytes: nothing to say");
        // A node a reload adds shares the running cell: what the reload sets (or puts back) is its too.
        let text = format!(
            "[node_tls]\npsk_file = {old:?}\n[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:1\"\n\
             [[nodes]]\nname = \"s2\"\naddress = \"127.0.0.1:2\"\n[[exports]]\nname = \"v\"\nsize_mb = 1\n"
        );
        let grown = GatewayConfig::parse(&text, Path::new("gw.toml")).unwrap().nodes;
        let plan =
            NodePlan::new(&running, &Default::default(), &grown, node_tls_cell(&running).as_ref(), |_| None).unwrap();
        assert_eq!(offered(&plan.nodes[1..]).as_deref(), Some("gw-new"), "the running context, not the file's");
        let (swap, _) = NodeTlsSwap::set(node_tls_cell(&running).as_ref(), &grown);
        assert_eq!(offered(&plan.nodes[1..]).as_deref(), Some("gw-old"));
        drop(swap);
        assert_eq!(offered(&plan.nodes[1..]).as_deref(), Some("gw-new"));
    }

    /// A reload that moves a node (another address or tls_name) sets its new place in the route every
    /// clone of the node shares, before anything opens; a failed reload puts the old place back; a
    /// completed one keeps it and records it in the running list, and the next reload of the same file
    /// moves nothing. Another node name is a restart, not a move.
    #[test]
    fn a_reload_moves_a_node_and_puts_it_back_if_it_fails() {
        let config = |name: &str, address: &str, tls_name: &str| {
            let text = format!(
                "[node_tls]\npsk_file = \"k.psk\"\n[[nodes]]\nname = \"{name}\"\naddress = \"{address}\"\n\
                 {tls_name}[[exports]]\nname = \"v\"\nsize_mb = 1\n"
            );
            let tmp = tempfile::tempdir().unwrap();
            std::fs::write(tmp.path().join("k.psk"), "gw:00112233445566778899aabbccddeeff\n").unwrap();
            GatewayConfig::parse(&text, &tmp.path().join("gw.toml")).unwrap().nodes
        };
        let mut running = config("s1", "127.0.0.1:1", "");
        let link = running[0].clone();
        let at = |n: &NodeSpec| (n.place().address.to_string(), n.place().tls_name().unwrap().to_string());
        let moved = config("s1", "127.0.0.2:3", "");
        let m = NodeMoves::set(&running, &moved);
        assert_eq!(
            at(&link),
            ("127.0.0.2:3".into(), "127.0.0.2".into()),
            "a link's clone follows, before anything opens"
        );
        drop(m);
        assert_eq!(at(&link), ("127.0.0.1:1".into(), "127.0.0.1".into()), "a failed reload puts it back");
        let lines = NodeMoves::set(&running, &moved).keep(&mut running);
        assert_eq!(
            lines,
            ["node s1 moved from 127.0.0.1:1 to 127.0.0.2:3: its sessions end once their pieces are answered and \
              reconnect there"]
        );
        assert_eq!(at(&link), ("127.0.0.2:3".into(), "127.0.0.2".into()));
        assert_eq!(running[0].address.to_string(), "127.0.0.2:3", "the running list says where it is");
        assert!(NodeMoves::set(&running, &moved).to.is_empty(), "the same file again: no move");
        let renamed = config("s1", "127.0.0.2:3", "tls_name = \"s1.example\"\n");
        assert_eq!(NodeMoves::set(&running, &renamed).keep(&mut running).len(), 1, "a tls_name alone moves it too");
        assert_eq!(at(&link).1, "s1.example");
        assert!(NodeMoves::set(&running, &config("s9", "127.0.0.9:9", "")).to.is_empty(), "another node: a restart");
        // Two nodes trading places: refused, the first named.
        let two = |a: &str, b: &str| {
            let text = format!(
                "[[nodes]]\nname = \"s1\"\naddress = \"{a}\"\n[[nodes]]\nname = \"s2\"\naddress = \"{b}\"\n\
                 [[exports]]\nname = \"v\"\nsize_mb = 1\n"
            );
            GatewayConfig::parse(&text, Path::new("gw.toml")).unwrap().nodes
        };
        let pair = two("127.0.0.1:1", "127.0.0.1:2");
        let e = NodeMoves::clash(&pair, &two("127.0.0.1:2", "127.0.0.1:1"), Path::new("gw.toml"), |_| None).unwrap();
        assert_eq!(
            e.to_string(),
            "node s1 cannot move to 127.0.0.1:2: node s2 is there now (move s2 away first, in a reload of its own)"
        );
        assert!(
            NodeMoves::clash(&pair, &two("127.0.0.1:3", "127.0.0.1:2"), Path::new("gw.toml"), |_| None).is_none(),
            "to a free address"
        );
        assert!(NodeMoves::clash(&pair, &pair, Path::new("gw.toml"), |_| None).is_none());
        // s2 removed: in use, it is still there (named so); out of use, its address is free.
        // (By place, a removed node's place holds its running spec.)
        let onto_s2 = vec![two("127.0.0.1:2", "127.0.0.1:3")[0].clone(), pair[1].clone()];
        let e = NodeMoves::clash(&pair, &onto_s2, Path::new("gw.toml"), |j| (j == 1).then_some(true)).unwrap();
        assert!(e.to_string().contains("node s2 is there now: gw.toml no longer names it, but a volume still uses it"));
        assert!(NodeMoves::clash(&pair, &onto_s2, Path::new("gw.toml"), |j| (j == 1).then_some(false)).is_none());
        assert_eq!(at(&link), ("127.0.0.2:3".into(), "s1.example".into()));
    }

    /// A reload's nodes by place (`NodePlan`): a running node keeps its place whatever the file's order,
    /// a node new to the gateway takes the next place, one the file drops is removed unless a volume the
    /// reload keeps uses it, and a removed one named again takes its place back; the volumes' layouts,
    /// node exports and server reservations follow the places; a volume whose nodes the file lists in
    /// another order than their places is found; the places are bounded.
    #[test]
    fn a_reload_places_nodes_added_and_removed() {
        let config = |nodes: &[&str], exports: &str| {
            let mut text = String::new();
            for (i, n) in nodes.iter().enumerate() {
                text.push_str(&format!("[[nodes]]\nname = \"{n}\"\naddress = \"127.0.0.1:{}\"\n", i + 1));
            }
            text.push_str(exports);
            GatewayConfig::parse(&text, Path::new("gw.toml")).unwrap()
        };
        let running = config(&["s1", "s2", "s3"], "[[exports]]\nname = \"v\"\nsize_mb = 1\n").nodes;
        let none = std::collections::BTreeSet::new();
        // s2 dropped, s4 added before s3 in the file: s4 takes place 3.
        let file = config(
            &["s1", "s4", "s3"],
            "[[tenants]]\nname = \"t\"\nserver_reservations = { s4 = 5 }\n\
             [[exports]]\nname = \"w\"\ntenant = \"t\"\nsize_mb = 1\nwidths = { s1 = 1, s4 = 2 }\nnode_export = \"x\"\n\
             [[exports]]\nname = \"u\"\ntenant = \"t\"\nsize_mb = 1\nwidths = { s4 = 1, s3 = 1 }\n",
        );
        let plan = NodePlan::new(&running, &none, &file.nodes, None, |_| None).unwrap();
        assert_eq!(plan.place, [0, 3, 2]);
        assert_eq!(plan.dropped, [1]);
        assert!(plan.back.is_empty() && plan.restart.is_empty());
        let names = |n: &[NodeSpec]| n.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&plan.nodes), ["s1", "s2", "s3", "s4"]);
        assert_eq!(plan.nodes[0].address, running[0].address, "the running spec, shared by its links");
        assert_eq!(names(&plan.next), ["s1", "s2", "s3", "s4"]);
        // u lists s4 before s3, whose place comes first: another layout.
        let misordered = plan.misordered(&file);
        assert_eq!((misordered.len(), misordered[0].0, &misordered[0].2), (1, "u", &vec![2, 3]));
        assert!(misordered[0].1.to_string().contains("lists its nodes as s4, s3, the gateway runs them as s3, s4"));
        let c = plan.by_place(&file);
        assert_eq!(c.exports[0].stripe.widths(), &[1, 0, 0, 2]);
        assert!(c.exports[0].stripe.same_layout(&file.exports[0].stripe.placed(&[0, 3, 2], 4).unwrap()));
        assert_eq!(c.exports[0].node_exports[3], "x");
        assert_eq!(c.tenants[0].server_reservations, [0.0, 0.0, 0.0, 5.0]);
        // A volume the reload keeps on s2: s2 stays, named.
        let plan = NodePlan::new(&running, &none, &file.nodes, None, |j| (j == 1).then(|| "v".to_string())).unwrap();
        assert!(plan.dropped.is_empty());
        assert_eq!(
            plan.restart,
            ["node s2 removed while export v uses it: needs a restart (the export's data is laid out over it)"]
        );
        // s2 removed earlier and named again: back at its place; s4 (never seen) after the running ones.
        let gone = std::collections::BTreeSet::from([1]);
        let again = config(&["s1", "s2", "s3", "s4"], "[[exports]]\nname = \"v\"\nsize_mb = 1\n");
        let plan = NodePlan::new(&running, &gone, &again.nodes, None, |_| None).unwrap();
        assert_eq!((plan.place.clone(), plan.back.clone(), plan.dropped.clone()), (vec![0, 1, 2, 3], vec![1], vec![]));
        // A node removed earlier and not named again is not removed twice.
        let plan = NodePlan::new(
            &running,
            &gone,
            &config(&["s1", "s3"], "[[exports]]\nname = \"v\"\nsize_mb = 1\n").nodes,
            None,
            |_| None,
        )
        .unwrap();
        assert!(plan.dropped.is_empty());
        // A protocol changed: no restart; the file's spec is the next one at its place (`NodeMoves` moves it).
        let text = "[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.9:9\"\nprotocol = \"nbd\"\n[[exports]]\nname = \"v\"\nsize_mb = 1\n";
        let nbd = GatewayConfig::parse(text, Path::new("gw.toml")).unwrap();
        let plan = NodePlan::new(&running, &none, &nbd.nodes, None, |_| Some("v".into())).unwrap();
        assert!(!plan.restart.iter().any(|l| l.contains("node s1")), "{:?}", plan.restart);
        assert_eq!(plan.next[0].protocol, NodeProtocol::Nbd);
        // The places are bounded over the gateway's run.
        let many: Vec<String> = (0..MAX_NODES - 2).map(|i| format!("n{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let file = config(&many, "[[exports]]\nname = \"v\"\nsize_mb = 1\nwidths = { n0 = 1 }\n");
        let e = NodePlan::new(&running, &none, &file.nodes, None, |_| None).err().unwrap();
        assert!(e.to_string().contains("254 nodes new to this gateway would make 257 places, past the 256"), "{e}");
    }

    /// A reload that changes a node's protocol or turns TLS on its link on or off changes it live, as a
    /// move does: the route every clone of the node shares carries the new protocol and TLS (the
    /// gateway's one `[node_tls]` cell, whose context the reload sets), a failed reload puts them back,
    /// a completed one records them in the running list and says what changed. Before, the plan named
    /// the node as needing a restart and nothing moved.
    #[test]
    fn a_reload_changes_a_nodes_protocol_and_tls_live() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("k.psk"), "gw:00112233445566778899aabbccddeeff\n").unwrap();
        let config = |top: &str, node: &str| {
            let text = format!(
                "{top}[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:1\"\n{node}[[exports]]\nname = \"v\"\nsize_mb = 1\n"
            );
            GatewayConfig::parse(&text, &tmp.path().join("gw.toml")).unwrap().nodes
        };
        let mut running = config("", "protocol = \"nbd\"\n");
        let link = running[0].clone();
        let how = |n: &NodeSpec| (n.place().protocol, n.place().tls_name().map(String::from));
        let plan = |running: &[NodeSpec], file: &[NodeSpec]| {
            NodePlan::new(running, &Default::default(), file, node_tls_cell(running).as_ref(), |_| None).unwrap()
        };
        // nbd -> rein with TLS on: both follow, before anything opens; put back by a failed reload.
        let file = config("[node_tls]\npsk_file = \"k.psk\"\n", "protocol = \"rein\"\n");
        let p = plan(&running, &file);
        assert!(p.restart.is_empty(), "{:?}", p.restart);
        let m = NodeMoves::set(&running, &p.next);
        assert_eq!(how(&link), (NodeProtocol::Rein, Some("127.0.0.1".into())), "a link's clone follows");
        drop(m);
        assert_eq!(how(&link), (NodeProtocol::Nbd, None), "a failed reload puts it back");
        let lines = NodeMoves::set(&running, &p.next).keep(&mut running);
        assert_eq!(
            lines,
            ["node s1: protocol nbd -> rein, TLS on the link off -> on: its sessions end once their pieces are \
              answered and reconnect with the new settings"]
        );
        assert_eq!((running[0].protocol, running[0].tls.is_some()), (NodeProtocol::Rein, true), "the running list");
        assert_eq!(how(&link), (NodeProtocol::Rein, Some("127.0.0.1".into())));
        assert!(NodeMoves::set(&running, &plan(&running, &file).next).to.is_empty(), "the same file again");
        // TLS off again (the [node_tls] table gone), the protocol kept.
        let plain = config("", "protocol = \"rein\"\n");
        let lines = NodeMoves::set(&running, &plan(&running, &plain).next).keep(&mut running);
        assert_eq!(
            lines,
            ["node s1: TLS on the link on -> off: its sessions end once their pieces are answered and reconnect \
              with the new settings"]
        );
        assert_eq!(how(&link), (NodeProtocol::Rein, None));
    }

    /// A name given twice is named (the tenants' check is a set, the others compare pairs: at most
    /// MAX_NODES nodes and MAX_VOLUMES exports).
    #[test]
    fn repeated_names_are_named() {
        let t = |n: &str| format!("[[tenants]]\nname = \"{n}\"\n");
        let e = parse(&format!("{}{}{}", t("x"), t("y"), t("x"))).unwrap_err().to_string();
        assert!(e.contains("tenant name \"x\" is repeated"), "{e}");
        let e = parse("[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:2\"").unwrap_err().to_string();
        assert!(e.contains("node name \"s1\" is repeated"), "{e}");
        let e = parse("[[exports]]\nname = \"v\"\nsize_mb = 1").unwrap_err().to_string();
        assert!(e.contains("export name \"v\" is repeated"), "{e}");
    }

    /// Each refusal's whole message, as operators saw it when validation returned strings: the keys gw.toml
    /// shares with rein.toml (ranges, timeouts, the front, the admin keys, `[tls]`, tenants, access lists)
    /// word for word as rein serve says them, then the gateway's own (nodes, tenants' node keys, volumes).
    #[test]
    fn refusals_read_as_before() {
        let node = "[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:1\"\n";
        let export = "[[exports]]\nname = \"v\"\nsize_mb = 1\n";
        let tenant = "[[tenants]]\nname = \"t\"\n";
        let long = "n".repeat(300);
        let mb = crate::budget::MAX_INFLIGHT_MB;
        for (text, want) in [
            (format!("reconnect_max_backoff_ms = 49\n{node}{export}"), "reconnect_max_backoff_ms must be in 50..=600000, got 49".to_string()),
            (format!("max_connections_per_client = 0\n{node}{export}"), "max_connections_per_client must be in 1..=65536, got 0".into()),
            (format!("max_connections = 70000\n{node}{export}"), "max_connections must be in 1..=65536, got 70000".into()),
            (format!("max_inflight_mb_per_tenant = 0\n{node}{export}"), format!("max_inflight_mb_per_tenant must be in 1..={mb}, got 0")),
            (format!("max_request_kb = 0\n{node}{export}"), "max_request_kb must be in 1..=131072, got 0".into()),
            (format!("worker_threads = 0\n{node}{export}"), "worker_threads must be in 1..=1024, got 0".into()),
            (format!("read_only_check_s = 0.05\n{node}{export}"), "read_only_check_s must be in 0.1..=3600 seconds, got 0.05 (or 0: no check)".into()),
            (format!("request_timeout_s = 3600.5\n{node}{export}"), "request_timeout_s must be in 0.1..=3600 seconds, got 3600.5".into()),
            (format!("shutdown_timeout_s = 3601\n{node}{export}"), "shutdown_timeout_s must be in 0..=3600 seconds, got 3601".into()),
            (format!("stall_timeout_s = 604801\n{node}{export}"), "stall_timeout_s must be in 0..=604800 (0: never), got 604801".into()),
            (format!("listen = \"nowhere\"\n{node}{export}"), "listen \"nowhere\": invalid socket address syntax (expected address:port)".into()),
            (format!("max_admin_connections = 0\n{node}{export}"), "max_admin_connections must be in 1..=4096, got 0".into()),
            (format!("[tls]\nmode = \"always\"\n{node}{export}"), "tls.mode \"always\": expected off, on or require".into()),
            (format!("[node_tls]\nname = \"x\"\n{node}{export}"), "node_tls.name: a gateway names each node's certificate in [[nodes]] tls_name".into()),
            (export.to_string(), "at least one [[nodes]] is needed".into()),
            (format!("[[nodes]]\nname = \"\"\naddress = \"127.0.0.1:1\"\n{export}"), "a [[nodes]] entry has an empty name".into()),
            (format!("[[nodes]]\nname = \"{long}\"\naddress = \"127.0.0.1:1\"\n{export}"), "node \"nnnnnnnnnnnnnnnn\"...: name must be at most 255 bytes, got 300".into()),
            (format!("{node}protocol = \"tcp\"\n{export}"), "node s1: protocol \"tcp\": expected rein, nbd or auto".into()),
            (format!("{node}tls_name = \"x\"\n{export}"), "node s1: tls_name needs TLS on the link ([node_tls], tls = true)".into()),
            (format!("{node}tls = true\n{export}"), "node s1: tls = true needs a [node_tls] table".into()),
            (format!("[[nodes]]\nname = \"s1\"\naddress = \"nowhere\"\n{export}"), "node s1: address \"nowhere\": invalid socket address syntax (expected an IP address and port, such as 10.0.0.11:10809, or unix:PATH for a local socket; host names are not resolved)".into()),
            (format!("[[nodes]]\nname = \"s1\"\naddress = \"unix:\"\n{export}"), "node s1: address \"unix:\": an empty Unix socket path".into()),
            (format!("{node}{tenant}{tenant}{export}"), "tenant name \"t\" is repeated".into()),
            (format!("{node}[[tenants]]\nname = \"\"\n{export}"), "a [[tenants]] entry has an empty name".into()),
            (format!("{node}{tenant}reservation = 10\nlimit = 5\n{export}"), "tenant t: reservation 10 exceeds limit 5".into()),
            (format!("{node}{tenant}reservation_split = \"x\"\n{export}"), "tenant t: reservation_split \"x\": expected spread or rho".into()),
            (format!("{node}{tenant}server_reservations = {{ s9 = 1 }}\n{export}"), "tenant t: server_reservations names unknown node \"s9\"".into()),
            (format!("{node}{tenant}server_reservations = {{ s1 = -1 }}\n{export}"), "tenant t: server_reservations.s1 must be finite and >= 0, got -1".into()),
            (node.to_string(), "at least one [[exports]] is needed".into()),
            (format!("{node}[[exports]]\nname = \"\"\nsize_mb = 1\n"), "an [[exports]] entry has an empty name or one longer than 4096 bytes (NBD's limit)".into()),
            (format!("{node}[[exports]]\nname = \"v\"\nsize_mb = 0\n"), "export v: size_mb must be in 1..=2^30, got 0".into()),
            (format!("{node}{export}stripe_kb = 0\n"), format!("export v: stripe_kb must be in 1..={MAX_STRIPE_KB}, got 0")),
            (format!("{node}{export}widths = {{ s9 = 1 }}\n"), "export v: widths names unknown node \"s9\"".into()),
            (format!("{node}{export}tenant = \"zz\"\n"), "export v: tenant names unknown tenant \"zz\"".into()),
            (format!("{node}{export}node_export = \"{}\"\n", "e".repeat(5000)), "export v: the node export name \"eeeeeeeeeeeeeeee\"... has 5000 bytes; NBD allows at most 4096".into()),
            (format!("{node}{export}allow_networks = [\"x\"]\n"), "export v: allow_networks entry \"x\" is not a CIDR network (e.g. 10.0.0.0/8)".into()),
            (format!("default_export = \"w\"\n{node}{export}"), "default_export names unknown export \"w\"".into()),
            (format!("[parda_host]\n{node}{export}"), "[parda_host] needs a [parda] table (latency_threshold_ms at least)".into()),
        ] {
            let e = GatewayConfig::parse(&text, Path::new("gw.toml")).map(|_| ()).expect_err(&text).to_string();
            assert_eq!(e, format!("gateway config: {want}"), "{text}");
        }
    }

    /// The refusals are typed: the keys gw.toml shares with rein.toml are rein.toml's [`SettingError`]
    /// (one range check, one message), the gateway's own carry the node, tenant or volume, the value and
    /// the bound.
    #[test]
    fn refusals_are_typed_with_the_key_value_and_bound() {
        let invalid = |text: &str| match GatewayConfig::parse(text, Path::new("gw.toml")) {
            Err(GatewayConfigError::Invalid(e)) => e,
            other => panic!("not refused as invalid: {:?}", other.map(|_| ())),
        };
        let node = "[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:1\"\n";
        let export = "[[exports]]\nname = \"v\"\nsize_mb = 1\n";
        let e = invalid(&format!("reconnect_max_backoff_ms = 49\n{node}{export}"));
        assert!(
            matches!(
                e,
                GatewaySettingError::Setting(SettingError::Range {
                    key: "reconnect_max_backoff_ms",
                    min: 50,
                    max: 600_000,
                    got: 49
                })
            ),
            "{e:?}"
        );
        let e = invalid(&format!("max_connections_per_tenant = 0\n{node}{export}"));
        assert!(
            matches!(
                e,
                GatewaySettingError::Setting(SettingError::Range { key: "max_connections_per_tenant", got: 0, .. })
            ),
            "{e:?}"
        );
        let e = invalid(&format!("idle_timeout_s = 604801\n{node}{export}"));
        assert!(
            matches!(e, GatewaySettingError::Setting(SettingError::Timeout { key: "idle_timeout_s", got: 604801, .. })),
            "{e:?}"
        );
        let e = invalid(&format!("read_only_check_s = 0.05\n{node}{export}"));
        assert!(
            matches!(e, GatewaySettingError::Seconds { key: "read_only_check_s", got, zero_is_off: true, .. } if got == 0.05),
            "{e:?}"
        );
        let e = invalid(&format!("connect_timeout_s = 0.05\n{node}{export}"));
        assert!(
            matches!(e, GatewaySettingError::Seconds { key: "connect_timeout_s", min, zero_is_off: false, .. } if min == 0.1),
            "{e:?}"
        );
        let e = invalid(&format!("admin_idle_timeout_s = 0\n{node}{export}"));
        assert!(matches!(e, GatewaySettingError::AdminAccess(AdminAccessError::IdleTimeout { .. })), "{e:?}");
        // A node's refusal names the node, then what is wrong with it.
        let e = invalid(&format!("{node}protocol = \"tcp\"\n{export}"));
        assert!(
            matches!(&e, GatewaySettingError::Node { node, error: NodeSettingError::Protocol { got } } if node == "s1" && got == "tcp"),
            "{e:?}"
        );
        let e = invalid(&format!("[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:0\"\n{export}"));
        assert!(
            matches!(&e, GatewaySettingError::Node { error: NodeSettingError::Address { text, error: NodeAddressError::PortZero }, .. } if text == "127.0.0.1:0"),
            "{e:?}"
        );
        let e = invalid(&format!("listen = \"127.0.0.1:1\"\n{node}{export}"));
        assert!(
            matches!(&e, GatewaySettingError::Node { node, error: NodeSettingError::OwnFront { front, .. } } if node == "s1" && front == "127.0.0.1:1"),
            "{e:?}"
        );
        let e = invalid(&format!("{node}[[tenants]]\nname = \"t\"\nserver_reservations = {{ s9 = 1 }}\n{export}"));
        assert!(
            matches!(&e, GatewaySettingError::Tenant { tenant, error: TenantSettingError::UnknownNode { node } } if tenant == "t" && node == "s9"),
            "{e:?}"
        );
        // A volume's: its name, then the key, the value and the bound.
        let e = invalid(&format!("{node}{export}stripe_kb = 0\n"));
        assert!(
            matches!(&e, GatewaySettingError::Volume { export, error } if export == "v" && matches!(**error, VolumeSettingError::StripeKb { got: 0, max: MAX_STRIPE_KB })),
            "{e:?}"
        );
        let e = invalid(&format!("{node}{export}widths = {{ s9 = 1 }}\n"));
        assert!(
            matches!(&e, GatewaySettingError::Volume { error, .. } if matches!(&**error, VolumeSettingError::UnknownNode { node } if node == "s9")),
            "{e:?}"
        );
        let e = invalid(&format!("{node}{export}allow_identities = [\"\"]\n"));
        assert!(
            matches!(
                &e,
                GatewaySettingError::Setting(SettingError::Export {
                    export,
                    error: ExportError::Access(AccessError::EmptyEntry { key: "allow_identities" })
                }) if export == "v"
            ),
            "{e:?}"
        );
        let twice = format!("{node}[[nodes]]\nname = \"s2\"\naddress = \"127.0.0.1:1\"\n{export}");
        let e = invalid(&twice);
        assert!(
            matches!(&e, GatewaySettingError::Volume { export, error } if export == "v" && matches!(&**error, VolumeSettingError::SharedNodeExport { node, other: None, other_node, .. } if node == "s2" && other_node == "s1")),
            "{e:?}"
        );
        let e = invalid(&format!("{node}{export}[[exports]]\nname = \"w\"\nsize_mb = 1\nnode_export = \"v\"\n"));
        assert!(
            matches!(&e, GatewaySettingError::Volume { export, error } if export == "w" && matches!(&**error, VolumeSettingError::SharedNodeExport { other: Some(other), .. } if other == "v")),
            "{e:?}"
        );
    }

    /// `[parda]` and `[parda_host]`'s refusals, whole, as operators saw them when the host's validation
    /// returned strings.
    #[test]
    fn parda_host_refusals_read_as_before() {
        let cluster = "[parda]\nlatency_threshold_ms = 10\naggregation = \"cluster\"\n";
        let local = "[parda]\nlatency_threshold_ms = 10\naggregation = \"local\"\n";
        let peer = |id: u32, address: &str| format!("{{ id = {id}, address = \"{address}\" }}");
        for (top, want) in [
            (format!("{local}period_phase = \"staggered\"\n"), "parda: period_phase places the simulator's hosts' periods; a real host's periods tick from its start, or where PUT /api/parda/period puts them (remove the key)".to_string()),
            (format!("{local}aggregation_delay_ms = 5\n"), "parda: aggregation_delay_ms models the shared board's delay in the simulator; a real host's reports take as long as their transport does (remove the key)".to_string()),
            (format!("{local}[parda_host]\nid = 5000\n"), "parda_host: id must be below 4096, got 5000".into()),
            (format!("{local}[parda_host]\nwindow = 8\n"), "parda_host: window is the fixed issue queue of an uncontrolled host (controlled = false, or [parda] enabled = false); a PARDA host's window is bounded by [parda] w_min / w_max".into()),
            (format!("{local}[parda_host]\nbeta = -1\n"), "parda_host: beta must be a positive number at most 1000000, got -1".into()),
            (format!("{cluster}[parda_host]\nudp = \"127.0.0.1:1\"\nboard = \"b\"\n"), "parda_host: give udp (with peers) or board, not both".into()),
            (format!("{cluster}[parda_host]\npeers = [{}]\n", peer(1, "127.0.0.1:2")), "parda_host: peers are the other hosts' UDP sockets; give this host's as udp".into()),
            (format!("{local}[parda_host]\nboard = \"b\"\n"), "parda_host: udp / board are the cluster aggregation's transport, but [parda] aggregation = \"local\" uses the host's own latency".into()),
            (format!("{cluster}[parda_host]\ncontrolled = false\nboard = \"b\"\n"), "parda_host: udp / board are the cluster aggregation's transport, but an uncontrolled host publishes nothing".into()),
            (format!("{cluster}[parda_host]\nudp = \"x\"\n"), "parda_host: udp \"x\" is not an address (ip:port)".into()),
            (format!("{cluster}[parda_host]\nudp = \"127.0.0.1:1\"\npeers = [{}]\n", peer(5000, "127.0.0.1:2")), "parda_host: peers[0].id must be below 4096, got 5000".into()),
            (format!("{cluster}[parda_host]\nudp = \"127.0.0.1:1\"\npeers = [{}, {}]\n", peer(1, "127.0.0.1:2"), peer(2, "y")), "parda_host: peers[1].address \"y\" is not an address (ip:port)".into()),
            (format!("{cluster}[parda_host]\nudp = \"127.0.0.1:1\"\npeers = [{}, {}]\n", peer(1, "127.0.0.1:2"), peer(1, "127.0.0.1:3")), "parda_host: two peers have id 1".into()),
            (format!("{cluster}[parda_host]\nboard = \"b\"\nboard_slots = 0\n"), "parda_host: board_slots must be in 1..=4096, got 0".into()),
            (format!("{cluster}[parda_host]\nboard = \"b\"\nid = 70\n"), "parda_host: id 70 has no slot in a board of 64 (raise board_slots)".into()),
            (cluster.to_string(), "parda_host: [parda] aggregation = \"cluster\" needs the reports' transport: udp = \"ip:port\" with peers = [{ id, address }], or board = \"PATH\" (a file every host can read and write)".into()),
            (format!("{local}[parda_host]\nkey_file = \"k\"\n"), "parda_host: key_file signs the reports of the cluster aggregation, which this host does not publish (no udp or board)".into()),
            (format!("{cluster}[parda_host]\nboard = \"b\"\nkey_identity = \"i\"\n"), "parda_host: key_identity needs key_file".into()),
        ] {
            let e = parse(&top).map(|_| ()).expect_err(&top).to_string();
            assert_eq!(e, format!("gateway config: {want}"), "{top}");
        }
    }

    /// The start-up hint: only for a guest whose vCPUs halt at once (polling 0), never for an absent or
    /// unreadable setting.
    #[test]
    fn the_halt_poll_hint_is_for_polling_off_only() {
        let hint = halt_poll_hint(Some("0\n")).expect("polling off: a hint");
        assert!(hint.contains(HALT_POLL_NS) && hint.contains("echo 200000"), "{hint}");
        for content in [Some("200000\n"), Some("1"), Some(""), Some("off"), None] {
            assert_eq!(halt_poll_hint(content), None, "{content:?}");
        }
    }

    /// Every documented bound, at the bound and one step past it.
    #[test]
    fn bounds_at_the_limit() {
        for (ok, bad, key) in [
            ("connections_per_node = 64", "connections_per_node = 65", "connections_per_node"),
            ("connections_per_node = 1", "connections_per_node = 0", "connections_per_node"),
            ("worker_threads = 1", "worker_threads = 0", "worker_threads"),
            ("worker_threads = 1024", "worker_threads = 1025", "worker_threads"),
            ("request_timeout_s = 0.1", "request_timeout_s = 0.09", "request_timeout_s"),
            ("request_timeout_s = 3600", "request_timeout_s = 3600.5", "request_timeout_s"),
            ("connect_timeout_s = 0.1", "connect_timeout_s = 0.05", "connect_timeout_s"),
            ("read_only_check_s = 0.1", "read_only_check_s = 0.05", "read_only_check_s"),
            ("read_only_check_s = 3600", "read_only_check_s = 3601", "read_only_check_s"),
            ("read_only_check_s = 0", "read_only_check_s = -1", "read_only_check_s"),
            ("reconnect_max_backoff_ms = 50", "reconnect_max_backoff_ms = 49", "reconnect_max_backoff_ms"),
            ("reconnect_max_backoff_ms = 600000", "reconnect_max_backoff_ms = 600001", "reconnect_max_backoff_ms"),
        ] {
            assert!(parse(ok).is_ok(), "{ok}");
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(key), "{bad}: {err}");
        }
        let c = parse("request_timeout_s = 0.1").unwrap();
        assert_eq!(c.link.request_timeout, Duration::from_millis(100));
        assert_eq!(c.link.read_only_check, Some(Duration::from_secs(10)), "read_only_check_s defaults to 10");
        assert_eq!(parse("read_only_check_s = 0").unwrap().link.read_only_check, None, "0: no check");
        assert_eq!(c.exports[0].stripe.unit(), 64 << 10, "stripe_kb defaults to 64");
        assert_eq!((c.worker_threads, c.link.connections), (1, 1), "one thread, one connection per node");
        let c = parse("worker_threads = 3\nconnections_per_node = 5").unwrap();
        assert_eq!((c.worker_threads, c.link.connections), (3, 5));
    }

    #[test]
    fn node_and_volume_counts_at_the_limit() {
        let nodes = |n: usize| {
            (0..n)
                .map(|i| format!("[[nodes]]\nname = \"s{i}\"\naddress = \"127.0.0.1:{}\"\n", i + 1))
                .collect::<String>()
        };
        let volume = "[[exports]]\nname = \"v\"\nsize_mb = 1\n";
        assert!(GatewayConfig::parse(&format!("{}{volume}", nodes(MAX_NODES)), Path::new("g")).is_ok());
        // Nodes x volumes x connections: 256 x 64 x 1 is the bound, one more volume is above it.
        let many = |n: usize, conns: usize| {
            let vols = (0..n).map(|i| format!("[[exports]]\nname = \"v{i}\"\nsize_mb = 1\n")).collect::<String>();
            GatewayConfig::parse(&format!("connections_per_node = {conns}\n{}{vols}", nodes(MAX_NODES)), Path::new("g"))
        };
        assert!(many(64, 1).is_ok());
        let err = many(65, 1).unwrap_err().to_string();
        assert!(err.contains("make 16640 node connections, above the bound of 16384"), "{err}");
        assert!(many(2, 64).is_err());
        let err = GatewayConfig::parse(&format!("{}{volume}", nodes(MAX_NODES + 1)), Path::new("g")).unwrap_err();
        assert!(err.to_string().contains("at most 256 [[nodes]]"), "{err}");
        let volumes =
            |n: usize| (0..n).map(|i| format!("[[exports]]\nname = \"v{i}\"\nsize_mb = 1\n")).collect::<String>();
        assert!(GatewayConfig::parse(&format!("{}{}", nodes(1), volumes(MAX_VOLUMES)), Path::new("g")).is_ok());
        let err =
            GatewayConfig::parse(&format!("{}{}", nodes(1), volumes(MAX_VOLUMES + 1)), Path::new("g")).unwrap_err();
        assert!(err.to_string().contains("at most 1024 [[exports]]"), "{err}");
        let long = "t".repeat(MAX_NODE_NAME_LEN);
        let tenant = |name: &str| format!("{}[[tenants]]\nname = \"{name}\"\n{volume}", nodes(1));
        assert!(GatewayConfig::parse(&tenant(&long), Path::new("g")).is_ok());
        let err = GatewayConfig::parse(&tenant(&format!("{long}t")), Path::new("g")).unwrap_err();
        assert!(err.to_string().contains("at most 255 bytes"), "{err}");
    }

    /// Layouts that would overwrite each other on a node export are refused (invariant 3); the same node
    /// with other exports, or a node a volume does not use, is fine.
    #[test]
    fn two_layouts_on_one_node_export_are_refused() {
        let p = |text: &str| GatewayConfig::parse(text, Path::new("g")).map(|_| ()).map_err(|e| e.to_string());
        let node = |name: &str, addr: &str| format!("[[nodes]]\nname = \"{name}\"\naddress = \"{addr}\"\n");
        let vol = |name: &str, extra: &str| format!("[[exports]]\nname = \"{name}\"\nsize_mb = 1\n{extra}");
        let one = node("s1", "127.0.0.1:10809");
        let err = p(&format!("{one}{}{}", vol("v", ""), vol("w", "node_export = \"v\"\n"))).unwrap_err();
        assert!(err.contains("export w: node s1's export \"v\" at 127.0.0.1:10809 is export v's"), "{err}");
        let twice = format!("{one}{}", node("s2", "127.0.0.1:10809"));
        let err = p(&format!("{twice}{}", vol("v", ""))).unwrap_err();
        assert!(err.contains("export v: node s2's export \"v\" at 127.0.0.1:10809 is this export's too"), "{err}");
        assert!(p(&format!("{twice}{}", vol("v", "widths = { s1 = 1 }\n"))).is_ok(), "s2 unused");
        assert!(p(&format!("{one}{}{}", vol("v", ""), vol("w", ""))).is_ok(), "exports v and w of s1");
        let err = p(&format!("{}{}", node("s1", "127.0.0.1:0"), vol("v", ""))).unwrap_err();
        assert!(err.contains("node s1: address \"127.0.0.1:0\": port 0"), "{err}");
    }
    /// `[mclock]` sets a PARDA host's local scheduler (with `[parda]`'s batching over it), as a scenario's
    /// sets its hosts'; without `[parda]` it is refused: the gateway schedules nothing itself.
    #[test]
    fn mclock_sets_a_parda_hosts_local_scheduler_only() {
        let parda = "[parda]\nlatency_threshold_ms = 10\naggregation = \"local\"\nbatch = 4\n";
        let host = |text: &str| parse(text).unwrap().parda.expect("a PARDA host").host_config(1).sched;
        let paper = host(&format!("[mclock]\npreset = \"paper\"\nbatch = 8\n{parda}"));
        assert_eq!(paper, rein_core::SchedConfig { batch: 4, ..rein_core::SchedConfig::paper() });
        let default = host(parda);
        assert_eq!(default, rein_core::SchedConfig { batch: 4, ..rein_core::SchedConfig::default() });
        let err = parse("[mclock]\npreset = \"paper\"").unwrap_err().to_string();
        assert!(err.contains("[mclock] sets a PARDA host's local scheduler, and this gateway has no [parda]"), "{err}");
        let err = parse(&format!("[mclock]\nlimit_burst_ios = -1\n{parda}")).unwrap_err().to_string();
        assert!(err.contains("mclock.limit_burst_ios = -1"), "{err}");
    }

    /// A reload compares the PARDA settings as written out (`apply_reload`): a key file whose key changed
    /// under the same name and identity reads as a change (the key's fingerprint), the same key as none,
    /// and the key itself never appears.
    #[test]
    fn a_changed_parda_key_reads_as_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("parda.psk");
        let text = "[parda]\nlatency_threshold_ms = 10\n[parda_host]\nboard = \"b\"\nkey_file = \"parda.psk\"\n\
                    [[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:1\"\n[[exports]]\nname = \"v\"\nsize_mb = 1\n";
        let settings = |hex: &str| {
            std::fs::write(&key, format!("parda:{hex}\n")).unwrap();
            let cfg = GatewayConfig::parse(text, &dir.path().join("gw.toml")).unwrap();
            format!("{:?}", cfg.parda.expect("a PARDA host"))
        };
        let (a, b, a2) = (settings(&"11".repeat(32)), settings(&"22".repeat(32)), settings(&"11".repeat(32)));
        assert_ne!(a, b, "a new key is a change");
        assert_eq!(a, a2, "the same key is none");
        assert!(!a.contains(&"11".repeat(16)) && a.contains("fingerprint"), "{a}");
    }

    /// The gateway `cfg` starts as, its volumes opened (over nodes that may be down: a node that is down is
    /// no error at open), for `apply_reload`.
    async fn live_over(cfg: &GatewayConfig) -> Live {
        let mut live = Live::new(cfg);
        live.tenants = cfg.tenants.clone();
        let prepared = live.prepare(cfg);
        for (v, id, volume) in open_remotes(&cfg.nodes, cfg.link, prepared).await.unwrap() {
            let lv = live.make(v, &cfg.tenants[v.tenant], id, volume).await.unwrap();
            live.volumes.push(lv);
        }
        live
    }

    /// A reload that raises a volume's `size_mb`, its layout otherwise the same, asks each node export its
    /// size now and grows the volume only if every one holds its part (`Growth`): a node that cannot be
    /// asked (down here) refuses it, named with what is needed there, and the volume keeps its size for
    /// new connections; a lowered `size_mb` needs a restart, in its own words (the data past the new end
    /// is cut off); a size changed with the stripe is named as before. (Before, every one of them was
    /// `size_mb, stripe_kb, widths, node_export or tenant changed: needs a restart`.)
    #[tokio::test]
    async fn a_reload_grows_a_volume_only_over_node_exports_that_hold_it() {
        let file = |size_mb: u32, stripe_kb: u32| {
            let text = format!(
                "[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:1\"\n[[nodes]]\nname = \"s2\"\naddress = \"127.0.0.1:2\"\n\
                 [[exports]]\nname = \"v\"\nsize_mb = {size_mb}\nstripe_kb = {stripe_kb}\n"
            );
            GatewayConfig::parse(&text, Path::new("gw.toml")).unwrap()
        };
        let running = file(2, 64);
        let mut live = live_over(&running).await;
        let size = |live: &Live| (live.volumes[0].cfg.size, live.volumes[0].export.info.size);
        // Raised: each node export asked; both down, so both named, and the volume keeps its size.
        let r = apply_reload(&mut live, &file(4, 64)).await.unwrap();
        assert_eq!(r.needs_restart.len(), 2, "{:?}", r.needs_restart);
        for (line, node) in r.needs_restart.iter().zip(["s1", "s2"]) {
            let want = format!(
                "export v: size_mb 4 needs 2097152 bytes of node {node}'s export v, whose size could not be read: "
            );
            assert!(line.starts_with(&want), "{line}");
            assert!(
                line.ends_with("(reload the gateway once the node answers); the volume stays at size_mb 2"),
                "{line}"
            );
        }
        assert!(r.applied.is_empty(), "{:?}", r.applied);
        assert_eq!(size(&live), (2 << 20, 2 << 20));
        // Lowered: a restart, which cuts the data off.
        let r = apply_reload(&mut live, &file(1, 64)).await.unwrap();
        assert_eq!(
            r.needs_restart,
            ["export v: size_mb lowered from 2 to 1: needs a restart, and the restart cuts off the volume's last 1 MiB \
              (its data from byte 1048576 on; put size_mb back to keep them)"]
        );
        assert_eq!(size(&live), (2 << 20, 2 << 20));
        // With another stripe: the layout's words, as before.
        let r = apply_reload(&mut live, &file(4, 128)).await.unwrap();
        assert_eq!(r.needs_restart.len(), 1, "{:?}", r.needs_restart);
        assert!(
            r.needs_restart[0]
                .starts_with("export v: size_mb, stripe_kb, widths, node_export or tenant changed: needs a restart"),
            "{:?}",
            r.needs_restart
        );
        assert_eq!(size(&live), (2 << 20, 2 << 20));
        for v in &live.volumes {
            v.volume.close(Duration::from_secs(1)).await;
        }
    }

    /// What a growth's node exports say (`Growth::short`): one that holds its part of the new size says
    /// nothing, one too small is named with its size and what the new size needs there, one that could not
    /// be asked with why; the stripe's part per node ([`Stripe::node_bytes`]), by the node's place.
    #[test]
    fn a_growth_names_the_node_exports_too_small() {
        let text = "[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:1\"\n[[nodes]]\nname = \"s2\"\naddress = \"127.0.0.1:2\"\n\
                    [[nodes]]\nname = \"s3\"\naddress = \"127.0.0.1:3\"\n\
                    [[exports]]\nname = \"v\"\nsize_mb = 2048\nwidths = { s1 = 1, s2 = 1, s3 = 2 }\nnode_export = \"x\"\n";
        let c = GatewayConfig::parse(text, Path::new("gw.toml")).unwrap();
        let v = &c.exports[0];
        let g = Growth { at: 0, from: 1 << 30, v };
        assert_eq!(v.stripe.node_bytes(2, v.size), 1 << 30, "s3 holds half");
        let fits = [(0, Ok(512 << 20)), (1, Ok(600 << 20)), (2, Ok(1 << 30))];
        assert!(g.short(&c.nodes, &fits).is_empty());
        let short = [(0, Ok(512 << 20)), (1, Ok(256 << 20)), (2, Err("connection refused".to_string()))];
        assert_eq!(
            g.short(&c.nodes, &short),
            [
                "export v: size_mb 2048 needs 536870912 bytes of node s2's export x, which has 268435456 (grow it on \
                 the node first, then reload the gateway); the volume stays at size_mb 1024",
                "export v: size_mb 2048 needs 1073741824 bytes of node s3's export x, whose size could not be read: \
                 connection refused (reload the gateway once the node answers); the volume stays at size_mb 1024",
            ]
        );
        assert_eq!(
            Growth::applied("v", 1 << 30, 2 << 30, &["s1".into(), "s2".into()]),
            "export v: size_mb 1024 -> 2048 for connections opened from now on (those open keep their size: NBD \
             fixes it per connection); its sessions with s1, s2 end once their pieces are answered and renew for \
             the new size"
        );
    }

    /// A reload's refusal is typed (`ReloadError`): each kind is its own variant with what it names, and
    /// its text is the one the reload said when it returned `String`s (the texts were pinned on that code
    /// first): a volume added whose nodes the file lists out of order, the places past [`MAX_NODES`], two
    /// nodes trading addresses (these through `apply_reload` itself, which refuses each before any
    /// connection), a node moved onto a removed node still in use, a node export held by another layout,
    /// nodes that refuse the link, a volume that cannot open.
    #[tokio::test]
    async fn a_reload_refusal_is_typed() {
        let parse = |text: &str| GatewayConfig::parse(text, Path::new("gw.toml")).unwrap();
        let nodes = |list: &[(&str, &str)]| {
            list.iter().map(|(n, a)| format!("[[nodes]]\nname = \"{n}\"\naddress = \"{a}\"\n")).collect::<String>()
        };
        let volume = "[[exports]]\nname = \"v\"\nsize_mb = 1\n";
        let running = parse(&format!("{}{volume}", nodes(&[("s1", "127.0.0.1:1"), ("s2", "127.0.0.1:2")])));
        let refusal = |file: GatewayConfig| {
            let running = running.clone();
            async move { apply_reload(&mut Live::new(&running), &file).await.expect_err("refused") }
        };
        let addr = |a: &str| NodeAddress::Tcp(a.parse().unwrap());
        // Out of order.
        let file = format!(
            "{}[[exports]]\nname = \"d\"\nsize_mb = 1\n",
            nodes(&[("s2", "127.0.0.1:2"), ("s1", "127.0.0.1:1")])
        );
        let e = refusal(parse(&file)).await;
        assert!(
            matches!(&e, ReloadError::Misordered(m) if m.export == "d" && m.in_file == ["s2", "s1"] && m.by_place == ["s1", "s2"]),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "export d: gw.toml lists its nodes as s2, s1, the gateway runs them as s1, s2: a restart would lay its \
             data out in the file's order, which is another layout; list the nodes it runs in their order, new ones \
             after them"
        );
        // Past the places.
        let many: Vec<(String, String)> =
            (0..MAX_NODES - 1).map(|i| (format!("n{i}"), format!("127.0.1.{}:{}", i % 250 + 1, i + 1))).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(n, a)| (n.as_str(), a.as_str())).collect();
        let e = refusal(parse(&format!("{}{volume}widths = {{ n0 = 1 }}\n", nodes(&many)))).await;
        assert!(matches!(e, ReloadError::TooManyPlaces { added: 255, places: 257, max: MAX_NODES, gone: 0 }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "[[nodes]]: 255 nodes new to this gateway would make 257 places, past the 256 a gateway keeps over its \
             run (0 of them for nodes removed since it started): restart it to add them"
        );
        // Two nodes trading addresses.
        let e = refusal(parse(&format!("{}{volume}", nodes(&[("s1", "127.0.0.1:2"), ("s2", "127.0.0.1:1")])))).await;
        assert!(
            matches!(&e, ReloadError::MoveOntoNode { node, to, there } if node == "s1" && *to == addr("127.0.0.1:2") && there == "s2"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "node s1 cannot move to 127.0.0.1:2: node s2 is there now (move s2 away first, in a reload of its own)"
        );
        // Onto a removed node still in use.
        let moved = parse(&format!("{}{volume}", nodes(&[("s1", "127.0.0.1:2"), ("s2", "127.0.0.1:3")])));
        let onto_s2 = vec![moved.nodes[0].clone(), running.nodes[1].clone()];
        let e = NodeMoves::clash(&running.nodes, &onto_s2, Path::new("gw.toml"), |j| (j == 1).then_some(true))
            .expect("refused");
        assert!(
            matches!(&e, ReloadError::MoveOntoRemovedNode { node, to, there, .. } if node == "s1" && *to == addr("127.0.0.1:2") && there == "s2"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "node s1 cannot move to 127.0.0.1:2: node s2 is there now: gw.toml no longer names it, but a volume \
             still uses it (one this reload removes, or one removed earlier that VMs hold: /api/nodes); move s1 in \
             a later reload, once none does"
        );
        // A node export held with another layout, however it is held.
        let two = nodes(&[("s1", "127.0.0.1:1"), ("s2", "127.0.0.1:2")]);
        let v = parse(&format!("{two}{volume}node_export = \"x\"\n")).exports.remove(0);
        let w = parse(&format!(
            "{two}[[exports]]\nname = \"w\"\nsize_mb = 1\nwidths = {{ s1 = 1 }}\nnode_export = \"x\"\n"
        ))
        .exports
        .remove(0);
        for (held, how) in [
            (Held::Running, "as it runs"),
            (Held::RemovedNow, "which this reload removes; its connections may be open"),
            (Held::RemovedEarlier, "removed earlier, with connections still open"),
        ] {
            let map: HeldExports =
                HashMap::from([((addr("127.0.0.1:1"), "x".to_string()), ("v".to_string(), held, v.stripe.clone(), 0))]);
            assert!(held_clash(&running.nodes, &map, &v).is_none(), "its own layout");
            let e = held_clash(&running.nodes, &map, &w).expect("held");
            let want = HeldExport {
                export: "w".into(),
                node: "s1".into(),
                node_export: "x".into(),
                address: addr("127.0.0.1:1"),
                holder: "v".into(),
                held,
            };
            assert!(matches!(&e, ReloadError::NodeExportHeld(h) if **h == want), "{e:?}");
            assert_eq!(
                e.to_string(),
                format!(
                    "export w: node s1's export \"x\" at 127.0.0.1:1 is held by export v ({how}) with another layout: \
                     two layouts on one node export would overwrite each other's data; remove that export first, and \
                     add this one once its connections have closed"
                )
            );
        }
        // Nodes that refuse the link as the reload sets it: every one, in order.
        let refused = |node: &str, address: &str, protocol, tls, why: &str| NodeRefusal {
            node: node.into(),
            address: addr(address),
            protocol,
            tls,
            why: why.into(),
        };
        let e = ReloadError::NodesRefuse(vec![
            refused("s1", "127.0.0.1:1", crate::remote::NodeProtocol::Auto, true, "the node does not offer TLS"),
            refused("s2", "127.0.0.1:2", crate::remote::NodeProtocol::Rein, false, "refused"),
        ]);
        assert_eq!(
            e.to_string(),
            "node s1: the node at 127.0.0.1:1 refuses the link as this reload sets it (protocol auto, TLS on): the \
             node does not offer TLS; node s2: the node at 127.0.0.1:2 refuses the link as this reload sets it \
             (protocol rein, TLS off): refused"
        );
        // A volume that cannot open: the gateway's error, as it says it.
        let open = GatewayError::Bind { addr: "127.0.0.1:1".parse().unwrap(), source: std::io::Error::other("no") };
        let text = open.to_string();
        let e = ReloadError::from(open);
        assert!(matches!(&e, ReloadError::Open(g) if matches!(**g, GatewayError::Bind { .. })), "{e:?}");
        assert_eq!(e.to_string(), text);
    }
}
