//! `rein serve` configuration (rein.toml), validated once into a [`ServerConfig`].
//!
//! ```toml
//! listen = "127.0.0.1:10809"     # NBD
//! listen_unix = "nbd.sock"       # optional: NBD on a Unix socket as well (relative to this file's directory;
//!                                #   qemu/libnbd: nbd+unix:///EXPORT?socket=PATH); a stale socket file is replaced
//! listen_unix_mode = "0600"      # its file mode: who may connect (default owner only)
//! admin = "127.0.0.1:9180"       # HTTP: /metrics, /api/tenants, /healthz
//! admin_token_file = "admin.token" # optional: bearer token for every admin request but /healthz
//! admin_insecure = false         # true: allow a non-loopback admin address without a token (warned)
//! max_admin_connections = 64     # admin connections open at once (1..=4096)
//! admin_idle_timeout_s = 60      # an admin connection idle this long is closed
//! admin_tls = false              # true: HTTPS only, with [tls]'s cert/key (and its ca: client certificates)
//! data_dir = "rein-data"         # created if missing; relative to the working directory
//! scheduler = "mclock"           # mclock | dmclock | rbfq | sfq | fifo
//! queue_depth = 32               # D: requests outstanding at the backend
//! cost_model = "io"              # io | bytes | { tm_ms = 5, bpeak_mb_s = 60 }: shorthand for [mclock] cost_model
//! admission = "refuse"           # refuse | warn: when reservations exceed the capacity
//! capacity_iops = 5000           # reservable capacity for admission (default: the device model's), in 4 KiB
//!                                #   IOPS (a reservation under another cost_model counts as r / cost(4 KiB))
//! max_request_kb = 32768
//! io_engine = "uring"            # uring (default; falls back to threads if the kernel refuses it)
//!                                # | threads: IO on a thread pool | inline: small IOs on the dispatcher
//! probe_capacity_s = 0           # > 0: measure the backend at start-up (three runs this long of random
//!                                #   4 KiB reads at queue_depth, O_DIRECT where possible, through the same
//!                                #   dispatcher) and use the median for admission when capacity_iops is not
//!                                #   set; kept in the state file and reused at later starts
//! default_export = "rd"          # what the empty export name opens (default: nothing)
//! max_connections = 4096         # NBD connections in all
//! max_connections_per_client = 128   # from one peer address (IPv6: one /64)
//! max_connections_per_tenant = 256   # open on one tenant's exports
//! max_inflight_mb = 1024         # byte budget of payloads and replies in flight, all connections
//! max_inflight_mb_per_tenant = 256  # the same, per tenant (at most max_inflight_mb)
//! idle_timeout_s = 0             # close a connection idle this long (nothing in flight, no byte in); 0 = never
//! stall_timeout_s = 120          # close a client that leaves a WRITE's payload, or its replies, unmoved this long
//! shutdown_timeout_s = 10        # after SIGTERM: answer what is in flight this long, then fail the rest
//!
//! [tls]                          # optional: STARTTLS; paths relative to this file's directory
//! mode = "require"               # off (default) | on (offer STARTTLS) | require (refuse plain)
//! cert = "server-cert.pem"       # x509 server certificate (PEM); with key
//! key = "server-key.pem"
//! ca = "ca-cert.pem"             # optional: require and verify client certificates
//! crl = "ca-crl.pem"             # optional, with ca: revoked client certificates (PEM CRLs)
//! psk_file = "keys.psk"          # optional: "identity:hexkey" per line (psktool's format)
//!
//! [node]                         # optional: the storage-node protocol for `rein gateway` (docs/node-protocol.md)
//! enabled = false                # true: answer NBD_OPT_REIN_NODE (else it is an unknown option)
//! specs = "node"                 # node: this file's [[tenants]] win, an unknown tenant is refused |
//!                                # gateway: adopt the gateway's specs (as PUT/POST /api/tenants would)
//! allow_networks = ["127.0.0.0/8", "::1/128"]  # who may speak it (the default: loopback only)
//! allow_identities = ["gw"]      # optional: PSK identity or client certificate CN (after STARTTLS)
//!
//! [pshift]                       # optional, with scheduler = "token" (docs/pshift-daemons.md)
//! controller = "127.0.0.30:7800" # report to this pShift controller (with name; neither: plain round robin)
//! name = "s1"                    # this server's name in the controller's [[servers]]
//! r_order = "mixed"              # R-token holders: mixed (default) | round_robin (the paper) | proportional
//! r_floor_ios = 1000             # mixed only: grants under this are spent at the pace of one of this size
//! weighted = false               # weighted round robin by tenant weight (pshift.txt §V)
//! [pshift.tls]                   # optional: TLS to a controller with [tls]: psk_file (+ psk_identity),
//! psk_file = "s1.psk"            #   or ca (+ cert, key; name: what its certificate carries)
//!
//! [mclock]                       # optional: scheduler settings, the same table as a scenario's
//! preset = "rein"                # rein (default) | paper: mClock's Algorithm 1 as written
//! weight_lead_ios = 16           # integer | "none" (the paper)
//! limit_burst_ios = 8            # integer | "none" (the paper: L tags clamped at arrival)
//! reservation_lag = "100ms"      # "arrival" (the paper) | "unbounded" | a duration
//! limited_reenter_at_vnow = true # false: the paper
//! limit_mode = "strict"          # strict (Algorithm 1) | break_when_idle
//! batch = 1                      # locality batching (the paper: 8)
//! batch_distance_kb = 4096       # the paper: 4 MB
//! pool_return = "100ms"          # "off" (the paper) | a duration: a gateway's tenant back within it, pool busy, keeps its P tag
//! pool_return_lag_ios = 256      # ... up to this many of its IOs behind the other tenants here
//!
//! [device_model]                 # optional: the simulator's device model on top of real storage
//! capacity_iops = 1200
//! service = "exponential"        # exponential | deterministic | uniform (uniform_spread) | disk (disk = {..})
//! transfer_mb_s = 200            # optional: size-dependent service time
//! discipline = "fifo"            # fifo | ps (processor sharing) | array (array = { disks, stripe_kb, raid })
//! capacity_schedule = [{ at_s = 60, iops = 600 }]   # optional: capacity changes, from server start
//! seed = 0
//! stream = 0
//!
//! [[exports]]
//! name = "rd"
//! backend = "file"               # file | memory
//! path = "rd.img"                # file backend; relative to data_dir; created only when size_mb is given (never read-only)
//! size_mb = 1024                 # file: the new image's size (an existing one must have it); memory: default 1024
//! tenant = "rd"                  # which tenant's QoS the export's connections share (default: its name)
//! read_only = false
//! direct = false                 # O_DIRECT for 4 KiB-aligned IO (bypass the page cache)
//! readahead = true               # the kernel's readahead (false: POSIX_FADV_RANDOM; docs/serve.md)
//! allow_networks = ["10.0.0.0/8"]    # optional: who may see and open it (CIDR); absent = any address
//! allow_identities = ["alice"]       # optional: PSK identity or client certificate CN; absent = anyone
//!
//! [[tenants]]
//! name = "rd"
//! reservation = 250              # IOPS (or bytes/s with cost_model = "bytes"); 0 = none
//! limit = 1000                   # omitted = unlimited
//! weight = 1
//! idle_credit = 0
//! ```
//!
//! Every error names the field. Without a file, [`ServerConfig::builtin`] is the default: one file-backed
//! export per demo tenant in `rein-data/`, the mClock paper's RD / OLTP / DM.

use crate::access::{ConnCaps, ExportAccess};
use crate::admin_guard::AdminAccessError;
use crate::devmodel::DeviceConfig;
use crate::dispatch::{IoEngine, UnknownIoEngine};
use crate::sock::UnixListenError;
use crate::tls::{CredentialError, TlsConfig, TlsFiles};
use rein_core::{QosSpec, SchedConfig, SchedulerKind, SpecError, UnknownScheduler};
use rein_model::device::{ArrayParams, CapacityStep, DeviceError, DeviceParams, DiskParams};
use rein_model::pshift_settings::ROrderError;
use rein_model::sched_settings::{
    with_cost_model_shorthand, CostModelFile, CostModelTwice, SchedSettingsFile, SettingsError,
};
use rein_proto::nbd::TlsMode;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The text is not TOML, or does not fit the schema (an unknown field, a wrong type).
    #[error("{path}: {source}")]
    Parse {
        /// Where the text came from (`<built-in>` for [`BUILTIN`]).
        path: PathBuf,
        /// Where and what ([`crate::config::parse_toml`]).
        source: rein_model::input::TomlError,
    },
    /// A value is out of range or inconsistent with another: [`SettingError`] names the field.
    #[error("config: {0}")]
    Invalid(SettingError),
}

/// A value in rein.toml (or given on the command line over it) that is out of range or inconsistent with
/// another: which field, the value, and the bound or the choices. Its message names the field once.
#[derive(Debug, thiserror::Error)]
pub enum SettingError {
    /// An integer setting outside `min..=max`.
    #[error("{key} must be in {min}..={max}, got {got}")]
    Range {
        /// The key (`queue_depth`, `node.max_tenants`).
        key: &'static str,
        /// The smallest value accepted.
        min: u64,
        /// The largest value accepted.
        max: u64,
        /// The value given.
        got: u64,
    },
    /// `idle_timeout_s` or `stall_timeout_s` above `max` (0 turns either off).
    #[error("{key} must be in 0..={max} (0: never), got {got}")]
    Timeout {
        /// The key.
        key: &'static str,
        /// The longest timeout accepted, in seconds.
        max: u64,
        /// The value given.
        got: u64,
    },
    /// A duration in seconds (`probe_capacity_s`, `shutdown_timeout_s`) outside `0..=max` or not finite.
    #[error("{key} must be in 0..={max} seconds, got {got}")]
    Seconds {
        /// The key.
        key: &'static str,
        /// The longest duration accepted.
        max: f64,
        /// The value given.
        got: f64,
    },
    /// `capacity_iops` is not a positive number.
    #[error("capacity_iops must be positive, got {got}")]
    CapacityIops {
        /// The value given.
        got: f64,
    },
    /// A key that takes one of a few words was given another (`admission`, `tls.mode`, `node.specs`).
    #[error("{key} {got:?}: expected {expected}")]
    Choice {
        /// The key.
        key: &'static str,
        /// The word given.
        got: String,
        /// The words accepted, as a phrase (`refuse or warn`).
        expected: &'static str,
    },
    /// `listen` or `admin` is not an address and port.
    #[error("{key} {text:?}: {error} (expected address:port)")]
    Address {
        /// The key.
        key: &'static str,
        /// The text given.
        text: String,
        /// Why it is not an address.
        error: std::net::AddrParseError,
    },
    /// A daemon's `listen` and its admin endpoint would bind one port (or a wildcard address covers the
    /// other's).
    #[error("listen {listen} and admin {admin} take the same port: {what} and the admin endpoint need one each")]
    SamePort {
        /// What the daemon serves at `listen` (NBD, the pShift link).
        what: &'static str,
        /// The listening address.
        listen: SocketAddr,
        /// The admin endpoint's address.
        admin: SocketAddr,
    },
    /// `listen_unix` or `listen_unix_mode` (or `--listen-unix`) is refused; the message names which.
    #[error("{0}")]
    UnixSocket(UnixListenError),
    /// The admin endpoint's settings (`admin_token_file`, `max_admin_connections`,
    /// `admin_idle_timeout_s`) are refused; the message names which.
    #[error("{0}")]
    AdminAccess(AdminAccessError),
    /// `scheduler` names no scheduler.
    #[error("scheduler: {0}")]
    Scheduler(UnknownScheduler),
    /// `cost_model` is given both at the top and in `[mclock]`.
    #[error("{0}")]
    CostModelTwice(CostModelTwice),
    /// A `[mclock]` (or `cost_model`) setting is refused.
    #[error("{0}")]
    Sched(SettingsError),
    /// `io_engine` names no engine.
    #[error("{0}")]
    IoEngine(UnknownIoEngine),
    /// A `[device_model]` field is refused.
    #[error("device_model.{0}")]
    DeviceModel(DeviceError),
    /// A `[device_model] service_scale` multiplier outside [0.001, 1000].
    #[error("device_model.service_scale.{tenant} must be in [0.001, 1000], got {got}")]
    ServiceScale {
        /// The tenant it scales.
        tenant: String,
        /// The multiplier given.
        got: f64,
    },
    /// `[device_model] service_scale` names a tenant that does not exist.
    #[error(
        "device_model.service_scale names {tenant:?}, which is no tenant (a [[tenants]] entry or an export's own)"
    )]
    ServiceScaleTenant {
        /// The name given.
        tenant: String,
    },
    /// A `[[tenants]]` entry without a name.
    #[error("a [[tenants]] entry has an empty name")]
    EmptyTenantName,
    /// Two `[[tenants]]` entries of one name.
    #[error("tenant name {name:?} is repeated")]
    RepeatedTenant {
        /// The name.
        name: String,
    },
    /// A tenant's spec (reservation, limit, weight, idle credit) is refused.
    #[error("tenant {tenant}: {error}")]
    TenantSpec {
        /// The tenant.
        tenant: String,
        /// What is wrong with its spec.
        error: SpecError,
    },
    /// No `[[exports]]`.
    #[error("at least one [[exports]] is needed")]
    NoExports,
    /// More than `max` `[[exports]]`.
    #[error("at most {max} exports")]
    TooManyExports {
        /// The most exports a configuration may have.
        max: usize,
    },
    /// An `[[exports]]` entry without a name.
    #[error("an [[exports]] entry has an empty name")]
    EmptyExportName,
    /// An export name longer than NBD allows (4096 bytes); the name itself is not quoted.
    #[error("an [[exports]] entry's name is {len} bytes long, longer than 4096 bytes (NBD's limit)")]
    ExportNameTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// Two `[[exports]]` of one name.
    #[error("export name {name:?} is repeated")]
    RepeatedExport {
        /// The name.
        name: String,
    },
    /// An export's setting is refused.
    #[error("export {export}: {error}")]
    Export {
        /// The export's name.
        export: String,
        /// What is wrong with it.
        error: ExportError,
    },
    /// `default_export` names no export.
    #[error("default_export {name:?}: no export of that name")]
    DefaultExport {
        /// The name given.
        name: String,
    },
    /// `[tls]`'s credentials cannot be read or do not fit together; the message names the key.
    #[error("{0}")]
    Tls(Box<CredentialError>),
    /// `admin_tls = true` with a `[tls]` that has only a PSK file.
    #[error(
        "admin_tls = true needs tls.cert and tls.key: [tls] has only a psk_file, and HTTPS clients (curl, \
         browsers) check a server certificate, not a PSK"
    )]
    AdminTlsPskOnly,
    /// `admin_tls = true` without a certificate in `[tls]`.
    #[error("admin_tls = true needs tls.cert and tls.key (the admin endpoint's certificate) in [tls]")]
    AdminTlsNoCertificate,
    /// `[node] allow_networks` or `allow_identities` is refused.
    #[error("node.{0}")]
    NodeAccess(AccessError),
    /// `[pshift]` under a scheduler other than the token scheduler.
    #[error("[pshift] needs scheduler = \"token\" (pShift's token scheduler), got {got}")]
    PshiftScheduler {
        /// The scheduler configured.
        got: SchedulerKind,
    },
    /// `[pshift] r_order` or `r_floor_ios` is refused; the message names which.
    #[error("{0}")]
    PshiftROrder(ROrderError),
    /// `pshift.controller` is not an address.
    #[error("pshift.controller {text:?} is not an address (ip:port)")]
    PshiftController {
        /// The text given.
        text: String,
    },
    /// `pshift.name` is empty or longer than `max` bytes.
    #[error("pshift.name {name:?} must be 1 to {max} bytes")]
    PshiftName {
        /// The name given.
        name: String,
        /// The longest name accepted, in bytes.
        max: usize,
    },
    /// `[pshift.tls]` is refused; the message names the key.
    #[error("{0}")]
    PshiftTls(Box<CredentialError>),
    /// One of `pshift.controller` and `pshift.name` without the other.
    #[error("pshift.controller and pshift.name go together (neither: plain round robin)")]
    PshiftControllerWithoutName,
    /// `[pshift.tls]` without `pshift.controller`.
    #[error("pshift.tls needs pshift.controller (it secures the link to the controller)")]
    PshiftTlsWithoutController,
}

/// What is wrong with one export's settings ([`SettingError::Export`] names the export).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// `direct = true` on a memory export.
    #[error("direct = true needs backend = \"file\"")]
    DirectNeedsFile,
    /// `readahead = false` on a memory export.
    #[error("readahead = false needs backend = \"file\"")]
    ReadaheadNeedsFile,
    /// `size_mb` is 0 or makes more than [`MAX_EXPORT_BYTES`].
    #[error("size_mb must be in 1..=2^30, got {got}")]
    Size {
        /// The value given.
        got: u64,
    },
    /// `backend` is neither `file` nor `memory`.
    #[error("backend {got:?}: expected file or memory")]
    Backend {
        /// The backend given.
        got: String,
    },
    /// `tenant` names no `[[tenants]]` entry.
    #[error("unknown tenant {tenant:?}")]
    UnknownTenant {
        /// The name given.
        tenant: String,
    },
    /// `allow_networks` or `allow_identities` is refused.
    #[error("{0}")]
    Access(AccessError),
}

/// What is wrong with an access list, `allow_networks` or `allow_identities` ([`access_lists`]); the
/// caller names whose list it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// More than `max` entries.
    #[error("{key} has {entries} entries, above the limit of {max}")]
    TooMany {
        /// `allow_networks` or `allow_identities`.
        key: &'static str,
        /// How many entries it has.
        entries: usize,
        /// The most it may have ([`MAX_ALLOW_ENTRIES`]).
        max: usize,
    },
    /// An empty entry.
    #[error("{key} has an empty entry")]
    EmptyEntry {
        /// `allow_networks` or `allow_identities`.
        key: &'static str,
    },
    /// An entry longer than `max` bytes.
    #[error("{key} has an entry of {bytes} bytes, above the limit of {max}")]
    LongEntry {
        /// `allow_networks` or `allow_identities`.
        key: &'static str,
        /// The longest entry's length, in bytes.
        bytes: usize,
        /// The longest entry accepted ([`MAX_ALLOW_ENTRY_BYTES`]).
        max: usize,
    },
    /// An `allow_networks` entry that is neither a network nor an address.
    #[error("allow_networks entry {entry:?} is not a CIDR network (e.g. 10.0.0.0/8)")]
    Network {
        /// The entry.
        entry: String,
    },
}

fn d_listen() -> String {
    "127.0.0.1:10809".into()
}
fn d_admin() -> String {
    "127.0.0.1:9180".into()
}
pub(crate) fn d_admin_conns() -> usize {
    crate::admin_guard::DEFAULT_MAX_CONNECTIONS
}
pub(crate) fn d_admin_idle() -> f64 {
    crate::admin_guard::DEFAULT_IDLE_TIMEOUT.as_secs_f64()
}
fn d_data() -> String {
    "rein-data".into()
}
fn d_sched() -> String {
    "mclock".into()
}
fn d_depth() -> u32 {
    32
}
fn d_weight() -> f64 {
    1.0
}
/// A memory export's size without `size_mb`, in MiB: in rein.toml and in `POST /api/exports`
/// ([`crate::state::ExportJson::to_config`]).
pub const DEFAULT_MEMORY_MB: u64 = 1024;
fn d_backend() -> String {
    "file".into()
}
/// `true`, as a serde default (every config file of this crate uses this one).
pub(crate) fn d_true() -> bool {
    true
}

/// The export settings only a file has, checked for an export of `backend`: the error names the first
/// one set on a memory export (rein.toml's `[[exports]]` and the admin API's exports alike).
pub(crate) fn file_only_settings(name: &str, backend: &str, direct: bool, readahead: bool) -> Result<(), SettingError> {
    let error = match backend {
        "memory" if direct => ExportError::DirectNeedsFile,
        "memory" if !readahead => ExportError::ReadaheadNeedsFile,
        _ => return Ok(()),
    };
    Err(SettingError::Export { export: name.to_string(), error })
}
fn d_service() -> String {
    "exponential".into()
}
/// The default shared by rein.toml and gw.toml.
pub(crate) fn d_max_kb() -> u64 {
    32 * 1024
}
/// The default shared by rein.toml and gw.toml.
pub(crate) fn d_inflight_mb() -> u64 {
    crate::budget::DEFAULT_INFLIGHT_MB
}
/// The default shared by rein.toml and gw.toml.
pub(crate) fn d_inflight_mb_per_tenant() -> u64 {
    crate::budget::DEFAULT_INFLIGHT_MB_PER_TENANT
}
/// The default shared by rein.toml and gw.toml.
pub(crate) fn d_idle_timeout_s() -> u64 {
    0
}
/// The default shared by rein.toml and gw.toml.
pub(crate) fn d_stall_timeout_s() -> u64 {
    120
}
/// The longest `idle_timeout_s` and `stall_timeout_s` (a week; 0 turns either off).
const MAX_CONN_TIMEOUT_S: u64 = 7 * 24 * 3600;

/// A connection's idle and stall timeouts (`None`: never).
type Timeouts = (Option<std::time::Duration>, Option<std::time::Duration>);

/// `idle_timeout_s` and `stall_timeout_s` as rein.toml and gw.toml give them: each in 0..=604800 (0:
/// never).
pub(crate) fn conn_timeouts(idle_s: u64, stall_s: u64) -> Result<Timeouts, SettingError> {
    for (key, got) in [("idle_timeout_s", idle_s), ("stall_timeout_s", stall_s)] {
        if got > MAX_CONN_TIMEOUT_S {
            return Err(SettingError::Timeout { key, max: MAX_CONN_TIMEOUT_S, got });
        }
    }
    let some = |s: u64| (s > 0).then(|| std::time::Duration::from_secs(s));
    Ok((some(idle_s), some(stall_s)))
}
/// The default shared by rein.toml and gw.toml.
pub(crate) fn d_shutdown_timeout_s() -> f64 {
    10.0
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default = "d_listen")]
    listen: String,
    listen_unix: Option<String>,
    listen_unix_mode: Option<String>,
    #[serde(default = "d_admin")]
    admin: String,
    admin_token_file: Option<String>,
    #[serde(default)]
    admin_insecure: bool,
    #[serde(default = "d_admin_conns")]
    max_admin_connections: usize,
    #[serde(default = "d_admin_idle")]
    admin_idle_timeout_s: f64,
    #[serde(default)]
    admin_tls: bool,
    #[serde(default = "d_data")]
    data_dir: String,
    #[serde(default = "d_sched")]
    scheduler: String,
    #[serde(default = "d_depth")]
    queue_depth: u32,
    cost_model: Option<CostModelFile>,
    mclock: Option<SchedSettingsFile>,
    admission: Option<String>,
    capacity_iops: Option<f64>,
    #[serde(default = "d_max_kb")]
    max_request_kb: u64,
    io_engine: Option<String>,
    #[serde(default)]
    probe_capacity_s: f64,
    #[serde(default = "d_inflight_mb")]
    max_inflight_mb: u64,
    #[serde(default = "d_inflight_mb_per_tenant")]
    max_inflight_mb_per_tenant: u64,
    #[serde(default = "d_idle_timeout_s")]
    idle_timeout_s: u64,
    #[serde(default = "d_stall_timeout_s")]
    stall_timeout_s: u64,
    #[serde(default = "d_shutdown_timeout_s")]
    shutdown_timeout_s: f64,
    device_model: Option<DeviceFile>,
    #[serde(default)]
    exports: Vec<ExportFile>,
    #[serde(default)]
    tenants: Vec<TenantFile>,
    tls: Option<TlsFile>,
    default_export: Option<String>,
    max_connections: Option<usize>,
    max_connections_per_client: Option<usize>,
    max_connections_per_tenant: Option<usize>,
    node: Option<NodeFile>,
    pshift: Option<PshiftFile>,
}

/// `[pshift]`: this server is a pShift server of a controller (docs/pshift-daemons.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PshiftFile {
    controller: Option<String>,
    name: Option<String>,
    r_order: Option<String>,
    r_floor_ios: Option<u64>,
    #[serde(default)]
    weighted: bool,
    /// `[pshift.tls]`: TLS to the controller (the gateway's `[node_tls]` keys, and `name`).
    tls: Option<crate::tls::ClientTlsTable>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    #[serde(default)]
    enabled: bool,
    specs: Option<String>,
    allow_networks: Option<Vec<String>>,
    allow_identities: Option<Vec<String>>,
    max_tenants: Option<usize>,
}

/// What a storage node does with a gateway's spec that disagrees with its own (`[node] specs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeSpecs {
    /// The node's own `[[tenants]]` win; a tenant it does not know is refused (the default).
    #[default]
    Node,
    /// The gateway's spec is adopted (added or changed as the admin API would, admission included).
    Gateway,
}

/// The storage-node protocol's settings (`[node]`; docs/node-protocol.md).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// Whether NBD_OPT_REIN_NODE is answered (default false: it is an unknown option).
    pub enabled: bool,
    /// Whose spec wins (default [`NodeSpecs::Node`]).
    pub specs: NodeSpecs,
    /// Who may speak it (`allow_networks`, default loopback only; `allow_identities`, default anyone).
    pub access: ExportAccess,
    /// Under `specs = "gateway"`, the most tenants the node may hold after a hello that adds tenants
    /// (`max_tenants`, default [`NODE_DEFAULT_MAX_TENANTS`]): a hello that would add more is refused.
    pub max_tenants: usize,
}

/// Networks allowed to speak the storage-node protocol when `[node] allow_networks` is absent.
pub const NODE_DEFAULT_NETWORKS: [&str; 2] = ["127.0.0.0/8", "::1/128"];
/// `[node] max_tenants` when absent: four gateways' worth of tenants (a gateway has at most
/// [`crate::gateway::MAX_VOLUMES`], 1,024 volumes, each one tenant). A gateway's hellos add tenants and
/// never remove any, and each adding hello rewrites the state file with all of them; without a bound a
/// gateway could make a node hold the scheduler's maximum (1,048,576).
pub const NODE_DEFAULT_MAX_TENANTS: usize = 4096;
/// The largest `[node] max_tenants`: the scheduler's own bound on tenants (rein-core's
/// `Limits::max_tenants` default).
pub const NODE_MAX_TENANTS_LIMIT: usize = 1 << 20;

impl Default for NodeConfig {
    fn default() -> NodeConfig {
        let networks = NODE_DEFAULT_NETWORKS.iter().map(|n| n.parse().expect("a valid network")).collect();
        NodeConfig {
            enabled: false,
            specs: NodeSpecs::Node,
            access: ExportAccess { networks: Some(networks), identities: None },
            max_tenants: NODE_DEFAULT_MAX_TENANTS,
        }
    }
}

fn node_config(f: Option<&NodeFile>) -> Result<NodeConfig, SettingError> {
    let Some(f) = f else { return Ok(NodeConfig::default()) };
    let specs = match f.specs.as_deref() {
        None | Some("node") => NodeSpecs::Node,
        Some("gateway") => NodeSpecs::Gateway,
        Some(o) => {
            return Err(SettingError::Choice { key: "node.specs", got: o.to_string(), expected: "node or gateway" })
        }
    };
    let mut access = access_lists(&f.allow_networks, &f.allow_identities).map_err(SettingError::NodeAccess)?;
    if access.networks.is_none() {
        access.networks = NodeConfig::default().access.networks;
    }
    let max_tenants = f.max_tenants.unwrap_or(NODE_DEFAULT_MAX_TENANTS);
    in_range("node.max_tenants", max_tenants as u64, 1, NODE_MAX_TENANTS_LIMIT as u64)?;
    Ok(NodeConfig { enabled: f.enabled, specs, access, max_tenants })
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsFile {
    mode: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    ca: Option<String>,
    psk_file: Option<String>,
    crl: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceFile {
    capacity_iops: f64,
    #[serde(default = "d_service")]
    service: String,
    uniform_spread: Option<f64>,
    disk: Option<DiskParams>,
    transfer_mb_s: Option<f64>,
    discipline: Option<String>,
    array: Option<ArrayParams>,
    #[serde(default)]
    capacity_schedule: Vec<CapacityStep>,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    stream: usize,
    #[serde(default)]
    service_scale: std::collections::BTreeMap<String, f64>,
}

/// An `[[exports]]` entry as written (in rein.toml, or as the body of `POST /api/exports`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExportFile {
    pub(crate) name: String,
    #[serde(default = "d_backend")]
    pub(crate) backend: String,
    pub(crate) path: Option<String>,
    pub(crate) size_mb: Option<u64>,
    pub(crate) tenant: Option<String>,
    #[serde(default)]
    pub(crate) read_only: bool,
    #[serde(default)]
    pub(crate) direct: bool,
    #[serde(default = "d_true")]
    pub(crate) readahead: bool,
    pub(crate) allow_identities: Option<Vec<String>>,
    pub(crate) allow_networks: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
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
}

/// Where an export's bytes live (`backend`).
#[derive(Debug, Clone, PartialEq)]
pub enum BackendKind {
    /// A regular file or block device ([`crate::storage::FileStorage`]); a missing file is created with
    /// the export's size, and only when one is configured.
    File {
        /// The file: `path` (default `<name>.img`), under `data_dir` unless absolute.
        path: PathBuf,
    },
    /// RAM ([`crate::storage::MemStorage`]): zeroes at start, gone at exit.
    Memory,
}

/// One `[[exports]]` entry, validated.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// The name NBD clients ask for: unique, at most 4096 bytes.
    pub name: String,
    /// Where its bytes live (default a file).
    pub backend: BackendKind,
    /// Size in bytes (`size_mb` MiB; at most [`MAX_EXPORT_BYTES`]). A file export without it must exist
    /// (it is never created); with it, a missing file is created with this size and an existing one must
    /// have it (an image is never resized). Always `Some` for a memory export (default 1 GiB).
    pub size: Option<u64>,
    /// Index into `ServerConfig::tenants`.
    pub tenant: usize,
    /// Refuse writes, trims and write-zeroes, and advertise the export as read-only (default false).
    pub read_only: bool,
    /// O_DIRECT for aligned IO (file backend).
    pub direct: bool,
    /// The kernel's readahead on the file (default true; [`crate::storage::FileMode::readahead`]).
    pub readahead: bool,
    /// Who may see and open it (`allow_networks`, `allow_identities`; absent: anyone).
    pub access: ExportAccess,
}

/// A tenant: a `[[tenants]]` entry, or the default-spec tenant made for an export with no tenant of its
/// name.
#[derive(Debug, Clone)]
pub struct TenantConfig {
    /// Its name: unique and not empty; exports and the admin endpoint refer to it by name.
    pub name: String,
    /// Its validated spec: reservation and limit in IOPS (bytes/s with `cost_model = "bytes"`), weight,
    /// idle credit.
    pub spec: QosSpec,
}

/// What happens when the reservations exceed the reservable capacity (`admission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The default: the server does not start, and a spec change through the admin endpoint that would
    /// exceed the capacity is refused (HTTP 409).
    Refuse,
    /// The server starts and the change is applied, with a warning in the log (and in the admin answer).
    Warn,
}

/// A validated server configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The NBD listening address (default 127.0.0.1:10809).
    pub listen: SocketAddr,
    /// A Unix socket to listen on as well (`listen_unix`, `listen_unix_mode`; [`crate::sock`]).
    pub listen_unix: Option<crate::sock::UnixListen>,
    /// The admin HTTP endpoint's address (default 127.0.0.1:9180).
    pub admin: SocketAddr,
    /// Who may use the admin endpoint and how many connections it holds (`admin_token_file`,
    /// `admin_insecure`, `max_admin_connections`, `admin_idle_timeout_s`; [`crate::admin_guard`]).
    pub admin_access: crate::admin_guard::AdminAccess,
    /// `admin_tls = true`: the admin endpoint serves HTTPS only, with this context (the `[tls]` table's,
    /// which has a certificate); `None`: plain HTTP ([`crate::admin_guard`]).
    pub admin_tls: Option<TlsConfig>,
    /// Where file exports with relative paths live (default `rein-data`, relative to the working
    /// directory); created at start if missing.
    pub data_dir: PathBuf,
    /// The scheduling algorithm (default mClock).
    pub scheduler: SchedulerKind,
    /// D: requests outstanding at the backend, 1..=4096 (default 32).
    pub queue_depth: usize,
    /// The scheduler's settings (`[mclock]` and `cost_model`, rein-model's one parser for scenarios and
    /// rein.toml): cost model, tag rules, limit mode, batching. [`SchedConfig::limits`] is the default.
    pub sched: SchedConfig,
    /// What happens when reservations exceed the capacity (default [`Admission::Refuse`]).
    pub admission: Admission,
    /// Capacity used for admission control, in IOPS: configured, else the device model's at start (`None`:
    /// none known, unless `probe_capacity_s` measures one or the state file holds one; then
    /// `admission = "refuse"` with reservations does not start, [`crate::server::run_with`]).
    pub capacity_iops: Option<f64>,
    /// Largest READ or WRITE accepted, in bytes (`max_request_kb` KiB: 1 KiB..=128 MiB, default 32 MiB).
    pub max_request: u64,
    /// How the dispatcher runs file IO (default io_uring, falling back to threads).
    pub io_engine: IoEngine,
    /// Seconds to measure the backend at start-up for admission (0: no probe).
    pub probe_capacity_s: f64,
    /// Byte budget of request payloads and replies in flight, all connections together, in bytes
    /// (`max_inflight_mb` MiB: 1..=[`crate::budget::MAX_INFLIGHT_MB`], default 1024); see [`crate::budget`].
    pub max_inflight: u64,
    /// The same per tenant (`max_inflight_mb_per_tenant`, default 256 MiB; a share above `max_inflight`
    /// acts as `max_inflight`).
    pub max_inflight_per_tenant: u64,
    /// A connection with nothing in flight that receives no byte for this long is closed
    /// (`idle_timeout_s`, default 0 = `None`, never: NBD clients hold a quiet disk's connection).
    pub idle_timeout: Option<std::time::Duration>,
    /// A connection whose client leaves a WRITE's payload unsent, or takes no byte of its replies, this
    /// long is closed (`stall_timeout_s`, default 120 s; 0 = `None`, never): [`crate::nbd::Limits`].
    pub stall_timeout: Option<std::time::Duration>,
    /// After a shutdown begins, how long in-flight and queued requests may still be answered before the
    /// queued ones get errors and connections are closed (`shutdown_timeout_s`, 0..=3600, default 10 s).
    pub shutdown_timeout: std::time::Duration,
    /// The simulator's device model in front of the storage (`[device_model]`); `None`: the storage's own
    /// speed.
    pub device: Option<DeviceConfig>,
    /// The exports, in file order: at least one, at most [`MAX_EXPORTS`].
    pub exports: Vec<ExportConfig>,
    /// The tenants: the `[[tenants]]` in file order, then one default-spec tenant per export that names
    /// none and has no tenant of its own name.
    pub tenants: Vec<TenantConfig>,
    /// TLS (`[tls]`), its credentials read and checked; `None`: off.
    pub tls: Option<TlsConfig>,
    /// The export the empty name opens (`default_export`, an index into `exports`); `None`: the empty
    /// name opens nothing.
    pub default_export: Option<usize>,
    /// The connection caps (`max_connections` 4096, `max_connections_per_client` 128,
    /// `max_connections_per_tenant` 256; each 1..=[`MAX_CONNECTIONS_LIMIT`]).
    pub caps: ConnCaps,
    /// The storage-node protocol (`[node]`); off by default.
    pub node: NodeConfig,
    /// `[pshift]`: the pShift controller this server reports to (with `scheduler = "token"`).
    pub pshift: Option<crate::pshift_link::LinkSettings>,
    /// `[pshift]`'s token scheduler variant (R order, weighted), with `scheduler = "token"`.
    pub token: crate::dispatch::TokenVariant,
}

/// Largest value of `max_connections` and the per-client and per-tenant caps.
pub const MAX_CONNECTIONS_LIMIT: usize = 65_536;
/// Most entries in one export's `allow_networks` or `allow_identities`.
pub const MAX_ALLOW_ENTRIES: usize = 1024;
/// Longest access list entry, in bytes: a network (at most 43 bytes), a PSK identity (at most 128) or a
/// certificate's name (a DNS name has at most 253).
pub const MAX_ALLOW_ENTRY_BYTES: usize = 256;

/// Largest export, in bytes (1 PiB).
pub const MAX_EXPORT_BYTES: u64 = 1 << 50;
/// Most `[[exports]]` in one configuration.
pub const MAX_EXPORTS: usize = 4096;
/// The IO size, in bytes, of the capacity admission uses: the start-up probe's reads, and the size a
/// reservation under a cost model other than `io` is counted in ([`ServerConfig::reservation_iops`]).
pub const ADMISSION_IO_SIZE: u64 = 4096;

/// The built-in default: the mClock paper's §2.1 tenants, each with a 256 MiB file export. Their
/// reservations need a capacity (admission fails closed without one): the first start measures it (three
/// 1 s probe runs, the median) and keeps it in the state file, so later starts reuse it.
pub const BUILTIN: &str = r#"
probe_capacity_s = 1

[[exports]]
name = "rd"
path = "rd.img"
size_mb = 256

[[exports]]
name = "oltp"
path = "oltp.img"
size_mb = 256

[[exports]]
name = "dm"
path = "dm.img"
size_mb = 256

[[tenants]]
name = "rd"
reservation = 250
weight = 1

[[tenants]]
name = "oltp"
reservation = 250
weight = 2

[[tenants]]
name = "dm"
limit = 1000
weight = 3
"#;

/// Largest configuration file `rein serve`, `rein gateway` and the pShift controller read (16 MiB; a
/// longer file, or a device that never ends, is refused before it is parsed).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A configuration file's `text` as `T`: rein-model's [`rein_model::input::parse_toml`], for `rein
/// serve`, `rein gateway` and the pShift controller alike (and the simulator's scenarios).
pub use rein_model::input::parse_toml;

/// A daemon's command-line overrides of its file (`--listen`, `--listen-unix`, `--admin`, `--scheduler`,
/// `--data-dir`; each daemon takes those it has). Applied before validation, so that the file's checks
/// hold for what runs: `--listen` equal to the file's `admin` is refused as the two keys are, `--scheduler
/// fifo` under `[pshift]` as the file's `scheduler` is, and relative export paths follow `--data-dir`.
/// Set after validation (as they were), they bypassed those checks.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--listen-unix` (relative to the working directory, not to the file's directory).
    pub listen_unix: Option<String>,
    /// `--admin`.
    pub admin: Option<SocketAddr>,
    /// `--scheduler`.
    pub scheduler: Option<SchedulerKind>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
}

/// A daemon's listening addresses as its file writes them: `listen`, `listen_unix`, `listen_unix_mode`
/// and `admin` (`None`: the gateway without an HTTP endpoint).
pub(crate) struct FrontKeys<'a> {
    pub(crate) listen: &'a str,
    pub(crate) listen_unix: Option<&'a str>,
    pub(crate) listen_unix_mode: Option<&'a str>,
    pub(crate) admin: Option<&'a str>,
}

/// The NBD address, the Unix socket and the admin address ([`Overrides::fronts`]).
pub(crate) type Fronts = (SocketAddr, Option<crate::sock::UnixListen>, Option<SocketAddr>);

impl Overrides {
    /// The daemon's NBD address, Unix socket and admin address: the file's `keys` (relative socket paths
    /// from `base`, its directory) under the overrides (`--listen-unix` keeps the file's mode), and NBD
    /// and admin not on one port ([`distinct_fronts`]).
    pub(crate) fn fronts(&self, keys: FrontKeys<'_>, base: &Path) -> Result<Fronts, SettingError> {
        let address = |over: Option<SocketAddr>, key: &'static str, text: &str| match over {
            Some(a) => Ok(a),
            None => text.parse().map_err(|error| SettingError::Address { key, text: text.to_string(), error }),
        };
        let listen = address(self.listen, "listen", keys.listen)?;
        let file = crate::sock::UnixListen::from_config(keys.listen_unix, keys.listen_unix_mode, base)
            .map_err(SettingError::UnixSocket)?;
        let listen_unix = match &self.listen_unix {
            Some(p) => {
                Some(crate::sock::UnixListen::from_command_line(p, file.as_ref()).map_err(SettingError::UnixSocket)?)
            }
            None => file,
        };
        let admin = keys.admin.map(|a| address(self.admin, "admin", a)).transpose()?;
        if let Some(admin) = admin {
            distinct_fronts("NBD", listen, admin)?;
        }
        Ok((listen, listen_unix, admin))
    }
}

/// Refuses a daemon's `listen` (`what` it serves there: NBD, the pShift link) and its admin endpoint when
/// they would bind the same port on one address (also a
/// wildcard address and one it covers: 0.0.0.0 takes the port on every IPv4 address, `[::]` on every
/// address; an IPv4-mapped IPv6 address, `[::ffff:127.0.0.1]`, is the IPv4 address it maps, as the
/// kernel binds it): the start failed with "Address already in use", which does not say the daemon is in
/// its own way. Port 0 is a free port each.
pub(crate) fn distinct_fronts(what: &'static str, listen: SocketAddr, admin: SocketAddr) -> Result<(), SettingError> {
    let covers = |wild: std::net::IpAddr, other: std::net::IpAddr| match wild {
        std::net::IpAddr::V4(w) => w.is_unspecified() && other.is_ipv4(),
        std::net::IpAddr::V6(w) => w.is_unspecified(),
    };
    let (a, b) = (listen.ip().to_canonical(), admin.ip().to_canonical());
    if listen.port() == admin.port() && listen.port() != 0 && (a == b || covers(a, b) || covers(b, a)) {
        return Err(SettingError::SamePort { what, listen, admin });
    }
    Ok(())
}

impl ServerConfig {
    /// Reads and validates the file at `path`. Errors: [`ConfigError::Read`] if it cannot be read, else as
    /// [`ServerConfig::parse`].
    pub fn load(path: &Path) -> Result<ServerConfig, ConfigError> {
        Self::load_with(Some(path), &Overrides::default())
    }

    /// The file at `path` (or [`BUILTIN`] without one) with the command line's overrides, validated
    /// together ([`Overrides`]). Errors as [`ServerConfig::load`].
    pub fn load_with(path: Option<&Path>, overrides: &Overrides) -> Result<ServerConfig, ConfigError> {
        match path {
            Some(path) => {
                let text = crate::durable::read_config(path, MAX_CONFIG_BYTES)
                    .map_err(|source| ConfigError::Read { path: path.into(), source })?;
                Self::parse_with(&text, path, overrides)
            }
            None => Self::parse_with(BUILTIN, Path::new("<built-in>"), overrides),
        }
    }

    /// The built-in configuration, [`BUILTIN`]: what `rein serve` runs without a file. It is valid (a test
    /// parses it), so this never fails.
    pub fn builtin() -> ServerConfig {
        Self::parse(BUILTIN, Path::new("<built-in>")).expect("the built-in config is valid")
    }

    /// Parses and validates configuration text; `path` only names the source in errors. Errors:
    /// [`ConfigError::Parse`] for text that is not TOML or fields that do not exist or have the wrong
    /// type, [`ConfigError::Invalid`] (naming the field) for values out of range or inconsistent.
    pub fn parse(text: &str, path: &Path) -> Result<ServerConfig, ConfigError> {
        Self::parse_with(text, path, &Overrides::default())
    }

    /// [`ServerConfig::parse`] with the command line's overrides ([`Overrides`]).
    pub fn parse_with(text: &str, path: &Path, overrides: &Overrides) -> Result<ServerConfig, ConfigError> {
        let f: File = parse_toml(text).map_err(|source| ConfigError::Parse { path: path.into(), source })?;
        // Files named in [tls] are relative to the config file's directory.
        let base = path.parent().unwrap_or(Path::new(""));
        validate(f, base, overrides).map_err(ConfigError::Invalid)
    }

    /// What the configuration asks that nothing will do, each said at start, by `--check-config` and by a
    /// reload that brings it in (it is valid, so not refused): a `[[tenants]]` entry no export uses (a typo
    /// between an export's `tenant` or `name` and the entry leaves the export an unlimited tenant of its
    /// own while the entry's reservation is admitted for nobody; not under `[node]`, whose gateway states
    /// its tenants), reservations or limits under a scheduler that does not keep them, and `[node]`
    /// under one that ignores the gateway's tags.
    pub fn warnings(&self) -> Vec<String> {
        // At most 8 names in a line (a server may hold a million tenants).
        let names = |list: &[&str]| rein_model::report::first_names(list, 8);
        let mut out = Vec::new();
        if !self.node.enabled {
            // One pass over each list: up to 2^20 tenants and 4,096 exports.
            let mut used = vec![false; self.tenants.len()];
            for e in &self.exports {
                used[e.tenant] = true;
            }
            let unused: Vec<&str> =
                self.tenants.iter().zip(&used).filter(|(_, u)| !**u).map(|(t, _)| t.name.as_str()).collect();
            if !unused.is_empty() {
                out.push(format!(
                    "tenant {} has no export (no [[exports]] entry names it): its reservation is admitted for \
                     nobody (an export's `tenant` or `name` mistyped?)",
                    names(&unused)
                ));
            }
        }
        let kept = |s: &QosSpec| s.reservation() > 0.0 || s.limit().is_some();
        let with: Vec<&str> = self.tenants.iter().filter(|t| kept(&t.spec)).map(|t| t.name.as_str()).collect();
        let ignores = match self.scheduler {
            SchedulerKind::Fifo => Some("serves in arrival order"),
            SchedulerKind::Sfq => Some("keeps weights only"),
            SchedulerKind::Token if self.pshift.is_none() => Some("without [pshift] serves plain round robin"),
            _ => None,
        };
        if let (Some(how), false) = (ignores, with.is_empty()) {
            out.push(format!(
                "scheduler {} {how}: the reservations and limits of tenant {} are not kept (mclock keeps them)",
                self.scheduler,
                names(&with)
            ));
        }
        // SFQ counts the gateway's delta in its tags: DT-FQ (`rein_core::sched::sfq`).
        if self.node.enabled
            && !matches!(self.scheduler, SchedulerKind::Dmclock | SchedulerKind::Rbfq | SchedulerKind::Sfq)
        {
            out.push(format!(
                "[node] is on under scheduler {}, which ignores the gateway's delta and rho: use dmclock, rbfq \
                 or sfq (DT-FQ)",
                self.scheduler
            ));
        }
        out
    }

    /// The position in `tenants` of the tenant called `name`, if there is one.
    pub fn tenant_index(&self, name: &str) -> Option<usize> {
        self.tenants.iter().position(|t| t.name == name)
    }

    /// Checks reservations against the configured capacity (none configured: no check); `Err` is the
    /// shortfall ([`Shortfall::Above`]).
    pub fn admission_check(&self, specs: impl Iterator<Item = QosSpec>) -> Result<(), Shortfall> {
        let sum: f64 = specs.map(|s| self.reservation_iops(&s)).sum();
        match Shortfall::of(sum, self.capacity_iops) {
            Some(s @ Shortfall::Above { .. }) => Err(s),
            _ => Ok(()),
        }
    }

    /// The sum of the tenants' reservations, in IOPS ([`ServerConfig::reservation_iops`]).
    pub fn reserved(&self) -> f64 {
        self.tenants.iter().map(|t| self.reservation_iops(&t.spec)).sum()
    }

    /// A reservation in the unit of the capacity admission compares it with: IOPS. Under a cost model
    /// other than `io` a spec's rates are cost units per second (bytes/s with `bytes`); they count as
    /// IOPS of [`ADMISSION_IO_SIZE`] bytes, the IO size the probe measures the capacity with.
    pub fn reservation_iops(&self, spec: &QosSpec) -> f64 {
        spec.reservation() / self.sched.cost_model.cost(ADMISSION_IO_SIZE).as_f64()
    }
}

/// Reservations that the reservable capacity cannot hold: the one rule (and wording) of admission at
/// start, at a reload and in [`ServerConfig::admission_check`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shortfall {
    /// The reservations total more than the capacity.
    Above {
        /// The reservations' total.
        sum: f64,
        /// The capacity.
        capacity: f64,
    },
    /// There are reservations and no capacity is known.
    Unknown {
        /// The reservations' total.
        sum: f64,
    },
}

impl Shortfall {
    /// The shortfall of reservations totalling `sum` against `capacity` (`None`: not known), if any.
    pub fn of(sum: f64, capacity: Option<f64>) -> Option<Shortfall> {
        match capacity {
            Some(capacity) if sum > capacity => Some(Shortfall::Above { sum, capacity }),
            None if sum > 0.0 => Some(Shortfall::Unknown { sum }),
            _ => None,
        }
    }
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shortfall::Above { sum, capacity } => {
                write!(f, "reservations total {sum} IOPS, above the reservable capacity of {capacity} IOPS")
            }
            Shortfall::Unknown { sum } => write!(f, "reservations total {sum} IOPS but no capacity is known"),
        }
    }
}

impl std::error::Error for Shortfall {}

/// An access list entry count within [`MAX_ALLOW_ENTRIES`], each entry within [`MAX_ALLOW_ENTRY_BYTES`].
fn allow_list(key: &'static str, list: &Option<Vec<String>>) -> Result<(), AccessError> {
    match list {
        Some(l) if l.len() > MAX_ALLOW_ENTRIES => {
            Err(AccessError::TooMany { key, entries: l.len(), max: MAX_ALLOW_ENTRIES })
        }
        Some(l) if l.iter().any(|x| x.is_empty()) => Err(AccessError::EmptyEntry { key }),
        Some(l) if l.iter().any(|x| x.len() > MAX_ALLOW_ENTRY_BYTES) => Err(AccessError::LongEntry {
            key,
            bytes: l.iter().map(String::len).max().unwrap_or(0),
            max: MAX_ALLOW_ENTRY_BYTES,
        }),
        _ => Ok(()),
    }
}

fn export_access(e: &ExportFile) -> Result<ExportAccess, SettingError> {
    parse_access(&e.name, &e.allow_networks, &e.allow_identities)
}

/// An export's access list from its `allow_networks` and `allow_identities` as written (in rein.toml, the
/// state file or `POST /api/exports`); errors name the export and the key ([`access_lists`] with the
/// export's name).
pub fn parse_access(
    export: &str,
    allow_networks: &Option<Vec<String>>,
    allow_identities: &Option<Vec<String>>,
) -> Result<ExportAccess, SettingError> {
    access_lists(allow_networks, allow_identities)
        .map_err(|e| SettingError::Export { export: export.to_string(), error: ExportError::Access(e) })
}

/// An access list from `allow_networks` and `allow_identities` as written, for whoever's they are (an
/// export, `[node]`, the pShift controller); errors name the key, the caller whose list it is.
pub fn access_lists(
    allow_networks: &Option<Vec<String>>,
    allow_identities: &Option<Vec<String>>,
) -> Result<ExportAccess, AccessError> {
    allow_list("allow_networks", allow_networks)?;
    allow_list("allow_identities", allow_identities)?;
    let networks = match allow_networks {
        None => None,
        Some(list) => Some(
            list.iter()
                .map(|n| {
                    // A bare address is a network of one.
                    n.parse::<ipnet::IpNet>()
                        .or_else(|_| n.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                        .map(crate::access::canonical_net)
                        .map_err(|_| AccessError::Network { entry: n.clone() })
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(ExportAccess { networks, identities: allow_identities.clone() })
}

pub(crate) fn tls_config(t: &TlsFile, base: &Path) -> Result<TlsConfig, SettingError> {
    let mode = match t.mode.as_deref() {
        None | Some("off") => TlsMode::Off,
        Some("on") => TlsMode::On,
        Some("require") => TlsMode::Require,
        Some(o) => {
            return Err(SettingError::Choice { key: "tls.mode", got: o.to_string(), expected: "off, on or require" })
        }
    };
    let path = |p: &Option<String>| p.as_ref().map(|p| base.join(p));
    let files = TlsFiles {
        cert: path(&t.cert),
        key: path(&t.key),
        ca: path(&t.ca),
        psk_file: path(&t.psk_file),
        crl: path(&t.crl),
    };
    TlsConfig::build(mode, files).map_err(|e| SettingError::Tls(Box::new(e)))
}

/// `admin_tls`: the `[tls]` context if it has a certificate. An HTTPS client (curl, a browser, a
/// Prometheus scraper) authenticates the server by its certificate; none of them speaks TLS-PSK, so a
/// PSK-only `[tls]` is refused rather than served to no one.
fn admin_tls(on: bool, tls: Option<&TlsConfig>) -> Result<Option<TlsConfig>, SettingError> {
    match tls {
        _ if !on => Ok(None),
        Some(t) if t.has_certificate() => Ok(Some(t.clone())),
        Some(t) if t.psk.is_some() => Err(SettingError::AdminTlsPskOnly),
        _ => Err(SettingError::AdminTlsNoCertificate),
    }
}

/// A count setting `got` in `min..=max`, else [`SettingError::Range`] naming `key` (rein.toml's and
/// gw.toml's).
pub(crate) fn in_range(key: &'static str, got: u64, min: u64, max: u64) -> Result<u64, SettingError> {
    if (min..=max).contains(&got) {
        Ok(got)
    } else {
        Err(SettingError::Range { key, min, max, got })
    }
}

fn caps(f: &File) -> Result<ConnCaps, SettingError> {
    conn_caps(f.max_connections, f.max_connections_per_client, f.max_connections_per_tenant)
}

/// The connection caps from `max_connections`, `max_connections_per_client` and
/// `max_connections_per_tenant` as written (rein.toml's and gw.toml's): each in
/// 1..=[`MAX_CONNECTIONS_LIMIT`], the per-client and per-tenant defaults never above the total.
pub(crate) fn conn_caps(
    total: Option<usize>,
    per_client: Option<usize>,
    per_tenant: Option<usize>,
) -> Result<ConnCaps, SettingError> {
    let d = ConnCaps::default();
    let total = total.unwrap_or(d.total);
    let check = |key: &'static str, v: usize| in_range(key, v as u64, 1, MAX_CONNECTIONS_LIMIT as u64).map(|_| v);
    Ok(ConnCaps {
        total: check("max_connections", total)?,
        // Defaults never above the total.
        per_client: check("max_connections_per_client", per_client.unwrap_or(d.per_client.min(total)))?,
        per_tenant: check("max_connections_per_tenant", per_tenant.unwrap_or(d.per_tenant.min(total)))?,
    })
}

fn validate(f: File, base: &Path, o: &Overrides) -> Result<ServerConfig, SettingError> {
    let caps = caps(&f)?;
    let keys = FrontKeys {
        listen: &f.listen,
        listen_unix: f.listen_unix.as_deref(),
        listen_unix_mode: f.listen_unix_mode.as_deref(),
        admin: Some(&f.admin),
    };
    let (listen, listen_unix, admin) = o.fronts(keys, base)?;
    let admin = admin.expect("rein serve's admin has a default");
    let admin_access = crate::admin_guard::AdminAccess::new(
        f.admin_token_file.as_ref().map(PathBuf::from),
        f.admin_insecure,
        f.max_admin_connections,
        f.admin_idle_timeout_s,
    )
    .map_err(SettingError::AdminAccess)?;
    let scheduler: SchedulerKind = match o.scheduler {
        Some(s) => s,
        None => f.scheduler.parse().map_err(SettingError::Scheduler)?,
    };
    in_range("queue_depth", f.queue_depth.into(), 1, 4096)?;
    // `cost_model` at the top is a shorthand for `[mclock] cost_model` (as in a scenario); one of the two.
    let settings =
        with_cost_model_shorthand(f.mclock.as_ref(), f.cost_model.as_ref()).map_err(SettingError::CostModelTwice)?;
    let sched = settings.resolve().map_err(SettingError::Sched)?;
    let admission = match f.admission.as_deref() {
        None | Some("refuse") => Admission::Refuse,
        Some("warn") => Admission::Warn,
        Some(o) => {
            return Err(SettingError::Choice { key: "admission", got: o.to_string(), expected: "refuse or warn" })
        }
    };
    let io_engine: IoEngine = match f.io_engine.as_deref() {
        None => IoEngine::Uring,
        Some(s) => s.parse().map_err(SettingError::IoEngine)?,
    };
    let seconds = |key: &'static str, got: f64, max: f64| {
        if got.is_finite() && (0.0..=max).contains(&got) {
            Ok(got)
        } else {
            Err(SettingError::Seconds { key, max, got })
        }
    };
    seconds("probe_capacity_s", f.probe_capacity_s, 60.0)?;
    in_range("max_inflight_mb", f.max_inflight_mb, 1, crate::budget::MAX_INFLIGHT_MB)?;
    in_range("max_inflight_mb_per_tenant", f.max_inflight_mb_per_tenant, 1, crate::budget::MAX_INFLIGHT_MB)?;
    let (idle_timeout, stall_timeout) = conn_timeouts(f.idle_timeout_s, f.stall_timeout_s)?;
    seconds("shutdown_timeout_s", f.shutdown_timeout_s, 3600.0)?;
    in_range("max_request_kb", f.max_request_kb, 1, 128 * 1024)?;
    let device = match f.device_model {
        None => None,
        Some(d) => {
            // The simulator's device: the same fields, defaults and checks as a scenario's [[servers]].
            let spec = DeviceParams {
                capacity_iops: d.capacity_iops,
                service: &d.service,
                uniform_spread: d.uniform_spread,
                disk: d.disk,
                transfer_mb_s: d.transfer_mb_s,
                discipline: d.discipline.as_deref(),
                array: d.array,
                capacity_schedule: d.capacity_schedule,
            }
            .validate()
            .map_err(SettingError::DeviceModel)?;
            let mut service_scale = Vec::with_capacity(d.service_scale.len());
            for (name, &x) in &d.service_scale {
                if !(x.is_finite() && (1e-3..=1e3).contains(&x)) {
                    return Err(SettingError::ServiceScale { tenant: name.clone(), got: x });
                }
                service_scale.push((name.clone(), x));
            }
            Some(DeviceConfig { spec, seed: d.seed, stream: d.stream, service_scale })
        }
    };
    if let Some(c) = f.capacity_iops {
        if !(c.is_finite() && c > 0.0) {
            return Err(SettingError::CapacityIops { got: c });
        }
    }
    let capacity_iops = f.capacity_iops.or(device.as_ref().map(|d| d.spec.capacity_at(rein_core::Nanos::ZERO)));
    let mut tenants = Vec::new();
    // A set for the repeat check: the file may list as many tenants as the scheduler takes (2^20), which
    // compared in pairs is about 5e11 comparisons.
    let mut names = std::collections::HashSet::with_capacity(f.tenants.len());
    for t in &f.tenants {
        if t.name.is_empty() {
            return Err(SettingError::EmptyTenantName);
        }
        if !names.insert(t.name.as_str()) {
            return Err(SettingError::RepeatedTenant { name: t.name.clone() });
        }
        let spec = QosSpec::new(t.reservation, t.limit, t.weight, t.idle_credit)
            .map_err(|error| SettingError::TenantSpec { tenant: t.name.clone(), error })?;
        tenants.push(TenantConfig { name: t.name.clone(), spec });
    }
    if f.exports.is_empty() {
        return Err(SettingError::NoExports);
    }
    if f.exports.len() > MAX_EXPORTS {
        return Err(SettingError::TooManyExports { max: MAX_EXPORTS });
    }
    let data_dir = o.data_dir.clone().unwrap_or_else(|| PathBuf::from(&f.data_dir));
    let mut exports: Vec<ExportConfig> = Vec::new();
    for e in &f.exports {
        if e.name.is_empty() {
            return Err(SettingError::EmptyExportName);
        }
        if e.name.len() > 4096 {
            return Err(SettingError::ExportNameTooLong { len: e.name.len() });
        }
        if exports.iter().any(|x| x.name == e.name) {
            return Err(SettingError::RepeatedExport { name: e.name.clone() });
        }
        let export_error = |error| SettingError::Export { export: e.name.clone(), error };
        let size_mb = match (e.size_mb, e.backend.as_str()) {
            (Some(mb), _) => Some(mb),
            (None, "memory") => Some(DEFAULT_MEMORY_MB),
            (None, _) => None,
        };
        let size = match size_mb {
            None => None,
            Some(mb) => Some(
                mb.checked_mul(1 << 20)
                    .filter(|&s| s > 0 && s <= MAX_EXPORT_BYTES)
                    .ok_or_else(|| export_error(ExportError::Size { got: mb }))?,
            ),
        };
        file_only_settings(&e.name, &e.backend, e.direct, e.readahead)?;
        let backend = match e.backend.as_str() {
            "file" => {
                let p = PathBuf::from(e.path.clone().unwrap_or_else(|| format!("{}.img", e.name)));
                // An absolute path inside the file's `data_dir` moves with `--data-dir`, as a relative one
                // does (docs/serve.md).
                let moved =
                    o.data_dir.as_ref().filter(|_| p.is_absolute()).and_then(|_| p.strip_prefix(&f.data_dir).ok());
                BackendKind::File {
                    path: match moved {
                        Some(rel) => data_dir.join(rel),
                        None if p.is_absolute() => p,
                        None => data_dir.join(p),
                    },
                }
            }
            "memory" => BackendKind::Memory,
            o => return Err(export_error(ExportError::Backend { got: o.to_string() })),
        };
        let tname = e.tenant.clone().unwrap_or_else(|| e.name.clone());
        let tenant = match tenants.iter().position(|t| t.name == tname) {
            Some(i) => i,
            None if e.tenant.is_none() => {
                // An export without a tenant of its name gets a default-weight tenant of its own.
                tenants.push(TenantConfig { name: tname.clone(), spec: QosSpec::default() });
                tenants.len() - 1
            }
            None => return Err(export_error(ExportError::UnknownTenant { tenant: tname })),
        };
        exports.push(ExportConfig {
            name: e.name.clone(),
            backend,
            size,
            tenant,
            read_only: e.read_only,
            direct: e.direct,
            readahead: e.readahead,
            access: export_access(e)?,
        });
    }
    // Placement skew names tenants: configured ones, or an export's own.
    if let Some(d) = &device {
        if let Some((name, _)) = d.service_scale.iter().find(|(n, _)| !tenants.iter().any(|t| &t.name == n)) {
            return Err(SettingError::ServiceScaleTenant { tenant: name.clone() });
        }
    }
    let default_export = match &f.default_export {
        None => None,
        Some(name) => Some(
            exports
                .iter()
                .position(|e| &e.name == name)
                .ok_or_else(|| SettingError::DefaultExport { name: name.clone() })?,
        ),
    };
    let tls = match &f.tls {
        None => None,
        Some(t) => Some(tls_config(t, base)?),
    };
    let admin_tls = admin_tls(f.admin_tls, tls.as_ref())?;
    let node = node_config(f.node.as_ref())?;
    let mut token = crate::dispatch::TokenVariant::default();
    let pshift = match &f.pshift {
        None => None,
        Some(p) => {
            if scheduler != SchedulerKind::Token {
                return Err(SettingError::PshiftScheduler { got: scheduler });
            }
            token = crate::dispatch::TokenVariant {
                weighted: p.weighted,
                r_order: rein_model::pshift_settings::r_order(p.r_order.as_deref(), p.r_floor_ios)
                    .map_err(SettingError::PshiftROrder)?,
            };
            let link = match (&p.controller, &p.name) {
                (None, None) => None,
                (Some(c), Some(name)) => {
                    let controller: std::net::SocketAddr =
                        c.parse().map_err(|_| SettingError::PshiftController { text: c.clone() })?;
                    if name.is_empty() || name.len() > rein_core::pshift::MAX_NAME_LEN {
                        return Err(SettingError::PshiftName {
                            name: name.clone(),
                            max: rein_core::pshift::MAX_NAME_LEN,
                        });
                    }
                    let tls = match &p.tls {
                        None => None,
                        Some(t) => {
                            let client = crate::tls::LiveTlsClient::new(
                                t.build(base, "pshift.tls").map_err(|e| SettingError::PshiftTls(Box::new(e)))?,
                            );
                            let name = t.name.clone().unwrap_or_else(|| controller.ip().to_string());
                            Some((client, name))
                        }
                    };
                    Some(crate::pshift_link::LinkSettings {
                        controller,
                        name: name.clone(),
                        tls,
                        welcome_timeout: crate::pshift_link::CONNECT_TIMEOUT,
                    })
                }
                _ => return Err(SettingError::PshiftControllerWithoutName),
            };
            if p.tls.is_some() && link.is_none() {
                return Err(SettingError::PshiftTlsWithoutController);
            }
            link
        }
    };
    let cfg = ServerConfig {
        listen,
        listen_unix,
        admin,
        admin_access,
        admin_tls,
        data_dir,
        scheduler,
        queue_depth: f.queue_depth as usize,
        sched,
        admission,
        capacity_iops,
        max_request: f.max_request_kb * 1024,
        io_engine,
        probe_capacity_s: f.probe_capacity_s,
        max_inflight: f.max_inflight_mb << 20,
        max_inflight_per_tenant: f.max_inflight_mb_per_tenant << 20,
        idle_timeout,
        stall_timeout,
        shutdown_timeout: std::time::Duration::from_secs_f64(f.shutdown_timeout_s),
        device,
        exports,
        tenants,
        tls,
        default_export,
        caps,
        node,
        pshift,
        token,
    };
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration path naming a device that never ends (its stated size is 0) is refused at the
    /// bound: `rein gateway --config /dev/zero` grew to 6.2 GB in 8 s before.
    #[test]
    fn config_files_are_read_with_a_bound() {
        let zero = Path::new("/dev/zero");
        let e = ServerConfig::load(zero).unwrap_err().to_string();
        assert!(e.contains("larger than 16777216 bytes"), "{e}");
        let e = crate::gateway::GatewayConfig::load(zero).unwrap_err().to_string();
        assert!(e.contains("larger than 16777216 bytes"), "{e}");
        let e = crate::pshift_controller::ControllerSettings::load(zero).unwrap_err().to_string();
        assert!(e.contains("larger than 16777216 bytes"), "{e}");
    }

    #[test]
    fn warnings_name_what_nothing_will_do() {
        let w = |text: &str| ServerConfig::parse(text, Path::new("t.toml")).unwrap().warnings();
        let export = "[[exports]]\nname = \"vm-1\"\nbackend = \"memory\"\nsize_mb = 1\n";
        assert_eq!(w(export), Vec::<String>::new(), "an export and its own tenant");
        let typo = format!("{export}[[tenants]]\nname = \"vm1\"\nreservation = 500\nlimit = 600\n");
        let got = w(&typo);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].starts_with("tenant vm1 has no export"), "{got:?}");
        let limited = format!("{export}[[tenants]]\nname = \"vm-1\"\nlimit = 1\n");
        assert_eq!(w(&limited), Vec::<String>::new(), "mclock keeps the limit");
        let got = w(&format!("scheduler = \"fifo\"\n{limited}"));
        assert_eq!(got, ["scheduler fifo serves in arrival order: the reservations and limits of tenant vm-1 are not kept (mclock keeps them)"]);
        assert_eq!(w(&format!("scheduler = \"sfq\"\n{limited}")).len(), 1);
        assert_eq!(w(&format!("scheduler = \"fifo\"\n{export}")), Vec::<String>::new(), "nothing to keep");
        let node = format!("[node]\nenabled = true\n{typo}");
        let got = w(&node);
        assert_eq!(got.len(), 1, "a node's tenants need no export: {got:?}");
        assert!(got[0].starts_with("[node] is on under scheduler mclock"), "{got:?}");
        for distributed in ["dmclock", "rbfq", "sfq"] {
            let got = w(&format!("scheduler = \"{distributed}\"\n{node}"));
            assert!(got.iter().all(|w| !w.contains("[node]")), "{distributed} counts the gateway's delta: {got:?}");
        }
    }

    /// The command line's overrides are validated with the file: `--listen` or `--admin` onto the other's
    /// port, `--scheduler` under a table it does not run, and `--data-dir` under relative exports. Set after
    /// validation (before), each passed.
    #[test]
    fn overrides_are_validated_with_the_file() {
        let with = |text: &str, o: Overrides| ServerConfig::parse_with(text, Path::new("x.toml"), &o);
        let export = "[[exports]]\nname = \"a\"\n";
        let file = format!("listen = \"127.0.0.1:9000\"\nadmin = \"127.0.0.1:9180\"\n{export}");
        let a = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
        let e = with(&file, Overrides { listen: a("127.0.0.1:9180"), ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("listen 127.0.0.1:9180 and admin 127.0.0.1:9180 take the same port"), "{e}");
        let e = with(&file, Overrides { admin: a("0.0.0.0:9000"), ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("take the same port"), "a wildcard covers the address: {e}");
        let e = with(&file, Overrides { admin: a("[::]:9000"), ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("take the same port"), "[::] covers IPv4 too: {e}");
        assert!(with(&file, Overrides { admin: a("127.0.0.2:9000"), ..Default::default() }).is_ok(), "other address");
        assert!(with(&file, Overrides { admin: a("[::1]:9000"), ..Default::default() }).is_ok(), "other family");
        // An IPv4-mapped address is the IPv4 address (the kernel binds it so): the start failed with
        // "Address already in use" after --check-config passed.
        for mapped in ["[::ffff:127.0.0.1]:9000", "[::ffff:0.0.0.0]:9000"] {
            let e = with(&file, Overrides { admin: a(mapped), ..Default::default() }).unwrap_err().to_string();
            assert!(e.contains("take the same port"), "{mapped}: {e}");
        }
        let o = Overrides { listen: a("0.0.0.0:9180"), admin: a("[::ffff:127.0.0.1]:9180"), ..Default::default() };
        assert!(with(&file, o).unwrap_err().to_string().contains("take the same port"), "0.0.0.0 covers it");
        assert!(with(&file, Overrides { admin: a("[::ffff:127.0.0.2]:9000"), ..Default::default() }).is_ok());
        let both = Overrides { listen: a("127.0.0.1:0"), admin: a("127.0.0.1:0"), ..Default::default() };
        assert!(with(&file, both).is_ok(), "port 0 is a free port each");
        let c = with(&file, Overrides { listen: a("127.0.0.1:7000"), ..Default::default() }).unwrap();
        assert_eq!((c.listen, c.admin), (a("127.0.0.1:7000").unwrap(), a("127.0.0.1:9180").unwrap()));

        let pshift = format!("scheduler = \"token\"\n[pshift]\n{export}");
        assert!(with(&pshift, Overrides::default()).is_ok());
        let fifo = Overrides { scheduler: Some(SchedulerKind::Fifo), ..Default::default() };
        let e = with(&pshift, fifo).unwrap_err().to_string();
        assert!(e.contains("[pshift] needs scheduler = \"token\""), "{e}");

        let files = format!(
            "data_dir = \"/old\"\n{export}[[exports]]\nname = \"b\"\npath = \"/abs/b.img\"\n[[exports]]\n\
             name = \"c\"\npath = \"/old/c/c.img\"\n"
        );
        let c = with(&files, Overrides { data_dir: Some("new".into()), ..Default::default() }).unwrap();
        assert_eq!(c.data_dir, Path::new("new"));
        let paths: Vec<_> = c
            .exports
            .iter()
            .map(|e| match &e.backend {
                BackendKind::File { path } => path.clone(),
                b => panic!("{b:?}"),
            })
            .collect();
        let want = ["new/a.img", "/abs/b.img", "new/c/c.img"].map(PathBuf::from);
        assert_eq!(paths, want, "paths in the file's data_dir follow, absolute ones elsewhere stay");

        let u = Overrides { listen_unix: Some("s.sock".into()), ..Default::default() };
        let c = with(&format!("listen_unix = \"f.sock\"\nlisten_unix_mode = \"0600\"\n{export}"), u).unwrap();
        let u = c.listen_unix.unwrap();
        assert_eq!((u.path.file_name().unwrap().to_str().unwrap(), u.mode), ("s.sock", 0o600), "the file's mode stays");
    }

    #[test]
    fn builtin_is_the_paper_example() {
        let c = ServerConfig::builtin();
        assert_eq!(c.listen.to_string(), "127.0.0.1:10809");
        assert_eq!(c.admin.to_string(), "127.0.0.1:9180");
        assert_eq!(c.exports.len(), 3);
        assert_eq!(c.tenants[c.exports[0].tenant].spec.reservation(), 250.0);
        assert_eq!(c.tenants[2].spec.limit(), Some(1000.0));
        assert_eq!(c.exports[0].backend, BackendKind::File { path: PathBuf::from("rein-data/rd.img") });
        assert_eq!((c.max_inflight, c.max_inflight_per_tenant), (1 << 30, 256 << 20));
        assert_eq!(c.idle_timeout, None, "quiet disks keep their connections");
        assert_eq!(c.stall_timeout, Some(std::time::Duration::from_secs(120)));
        assert_eq!(c.shutdown_timeout, std::time::Duration::from_secs(10));
    }

    #[test]
    fn errors_name_the_field() {
        let e = |t: &str| ServerConfig::parse(t, Path::new("x.toml")).unwrap_err().to_string();
        assert!(e("listen = \"nowhere\"\n[[exports]]\nname = \"a\"").contains("listen \"nowhere\""));
        assert!(e("queue_depth = 0\n[[exports]]\nname = \"a\"").contains("queue_depth"));
        assert!(e("[[exports]]\nname = \"a\"\ntenant = \"zz\"").contains("unknown tenant \"zz\""));
        assert!(e("[[exports]]\nname = \"a\"\n[[tenants]]\nname = \"a\"\nreservation = 10\nlimit = 5")
            .contains("reservation 10 exceeds limit 5"));
        assert!(e("colour = 1\n[[exports]]\nname = \"a\"").contains("x.toml: line 1, column 1: unknown field `colour`"));
        // The line and column of the key, one line; the column in characters.
        let e2 = e("[[exports]]\nname = \"é\"\nsize_mb = \"x\"");
        assert!(e2.starts_with("x.toml: line 3, column 11: invalid type: string \"x\""), "{e2}");
        assert_eq!(e2.lines().count(), 1, "{e2}");
        let e3 = e("[[exports]]\nname = \"é\" size_mb = 1");
        assert!(e3.starts_with("x.toml: line 2, column 12: "), "{e3}");
        assert!(e("").contains("at least one [[exports]]"));
        let t = |n: &str| format!("[[tenants]]\nname = \"{n}\"\n");
        assert!(e(&format!("[[exports]]\nname = \"a\"\n{}{}{}", t("x"), t("y"), t("x")))
            .contains("tenant name \"x\" is repeated"));
        assert!(e("scheduler = \"wfq\"\n[[exports]]\nname = \"a\"").contains("unknown scheduler"));
        assert!(e("io_engine = \"aio\"\n[[exports]]\nname = \"a\"").contains("io_engine \"aio\""));
        assert!(e("probe_capacity_s = -1\n[[exports]]\nname = \"a\"").contains("probe_capacity_s"));
        assert_eq!(
            e("listen = \"127.0.0.1:9000\"\nadmin = \"127.0.0.1:9000\"\n[[exports]]\nname = \"a\""),
            "config: listen 127.0.0.1:9000 and admin 127.0.0.1:9000 take the same port: NBD and the admin \
             endpoint need one each"
        );
        assert!(e("[[exports]]\nname = \"a\"\nbackend = \"memory\"\ndirect = true").contains("direct = true needs"));
        assert!(
            e("[[exports]]\nname = \"a\"\nbackend = \"memory\"\nreadahead = false").contains("readahead = false needs")
        );
        // Issue 12: empty names are refused, each with its own message.
        assert_eq!(e("[[exports]]\nname = \"\""), "config: an [[exports]] entry has an empty name");
        // A repeated name and a long one, each named as what it is (both said "too long or repeated",
        // the long one quoting all its bytes).
        let two = "[[exports]]\nname = \"a\"\nbackend = \"memory\"\n";
        assert_eq!(e(&format!("{two}{two}")), "config: export name \"a\" is repeated");
        assert_eq!(
            e(&format!("[[exports]]\nname = \"{}\"", "x".repeat(5000))),
            "config: an [[exports]] entry's name is 5000 bytes long, longer than 4096 bytes (NBD's limit)"
        );
        assert_eq!(
            e("[[exports]]\nname = \"a\"\n[[tenants]]\nname = \"\""),
            "config: a [[tenants]] entry has an empty name"
        );
        assert!(e("[[exports]]\nname = \"a\"\nsize_mb = 0").contains("size_mb must be in 1..=2^30, got 0"));
        assert!(e("max_inflight_mb = 0\n[[exports]]\nname = \"a\"").contains("max_inflight_mb must be in 1..="));
        assert!(e("max_inflight_mb_per_tenant = 1048577\n[[exports]]\nname = \"a\"")
            .contains("max_inflight_mb_per_tenant must be in 1..=1048576, got 1048577"));
        assert!(e("idle_timeout_s = 604801\n[[exports]]\nname = \"a\"").contains("idle_timeout_s"));
        assert!(
            e("stall_timeout_s = 604801\n[[exports]]\nname = \"a\"").contains("stall_timeout_s must be in 0..=604800")
        );
        assert!(e("shutdown_timeout_s = -1\n[[exports]]\nname = \"a\"").contains("shutdown_timeout_s"));
        // A disk array as the device model: the scenario's keys and checks.
        let model = |extra: &str| format!("[device_model]\ncapacity_iops = 1000\n{extra}\n[[exports]]\nname = \"a\"");
        assert_eq!(
            e(&model("discipline = \"array\"\narray = { disks = 2, raid = 5 }")),
            "config: device_model.array: disks must be in 3..=1024 for RAID-5, got 2"
        );
        assert!(e(&model("array = { disks = 4 }")).contains("an array needs discipline = \"array\""));
        assert!(e(&model("discipline = \"array\"\narray = { spindles = 4 }")).contains("unknown field `spindles`"));
        // Placement skew: a multiplier per tenant, in range, naming a tenant (here the export's own).
        let c = ServerConfig::parse(&model("service_scale = { a = 1.5 }"), Path::new("x.toml")).unwrap();
        assert_eq!(c.device.unwrap().service_scale, vec![("a".to_string(), 1.5)]);
        assert_eq!(
            e(&model("service_scale = { b = 1.5 }")),
            "config: device_model.service_scale names \"b\", which is no tenant (a [[tenants]] entry or an export's own)"
        );
        assert!(e(&model("service_scale = { a = 0 }"))
            .contains("device_model.service_scale.a must be in [0.001, 1000], got 0"));
        let c = ServerConfig::parse(
            &model("discipline = \"array\"\narray = { disks = 6, stripe_kb = 128, raid = 5 }"),
            Path::new("x.toml"),
        )
        .unwrap();
        assert_eq!(
            c.device.unwrap().spec.discipline,
            rein_model::Discipline::Array(rein_model::device::ArraySpec {
                disks: 6,
                stripe_bytes: 128 << 10,
                raid: rein_model::device::Raid::Five
            })
        );
    }

    #[test]
    fn node_table_defaults_and_errors() {
        let p = |t: &str| ServerConfig::parse(&format!("{t}\n[[exports]]\nname = \"a\""), Path::new("x.toml"));
        let off = p("").unwrap().node;
        assert_eq!(off, NodeConfig::default());
        assert!(!off.enabled);
        assert_eq!(off.specs, NodeSpecs::Node);
        let lo: std::net::IpAddr = "127.0.0.2".parse().unwrap();
        let v6: std::net::IpAddr = "::1".parse().unwrap();
        let other: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        assert!(off.access.allows(lo, None) && off.access.allows(v6, None) && !off.access.allows(other, None));
        let on = p("[node]\nenabled = true\nspecs = \"gateway\"\nallow_networks = [\"10.0.0.0/8\"]\nallow_identities = [\"gw\"]")
            .unwrap()
            .node;
        assert!(on.enabled);
        assert_eq!(on.specs, NodeSpecs::Gateway);
        assert!(
            on.access.allows(other, Some("gw")) && !on.access.allows(other, None) && !on.access.allows(lo, Some("gw"))
        );
        assert_eq!((off.max_tenants, on.max_tenants), (NODE_DEFAULT_MAX_TENANTS, NODE_DEFAULT_MAX_TENANTS));
        assert_eq!(NODE_MAX_TENANTS_LIMIT, rein_core::Limits::default().max_tenants, "the scheduler's bound");
        let max = |n: usize| p(&format!("[node]\nmax_tenants = {n}")).map(|c| c.node.max_tenants);
        assert_eq!(max(1).unwrap(), 1);
        assert_eq!(max(NODE_MAX_TENANTS_LIMIT).unwrap(), NODE_MAX_TENANTS_LIMIT);
        let e = |t: &str| p(t).unwrap_err().to_string();
        for bad in [0, NODE_MAX_TENANTS_LIMIT + 1] {
            let msg = e(&format!("[node]\nmax_tenants = {bad}"));
            assert!(msg.contains(&format!("node.max_tenants must be in 1..=1048576, got {bad}")), "{msg}");
        }
        assert!(e("[node]\nspecs = \"both\"").contains("node.specs \"both\": expected node or gateway"));
        assert!(
            e("[node]\nallow_networks = [\"x\"]").contains("node.allow_networks entry \"x\""),
            "{}",
            e("[node]\nallow_networks = [\"x\"]")
        );
        assert!(e("[node]\nallow_identities = [\"\"]").contains("node.allow_identities has an empty entry"));
        assert!(e("[node]\ncolour = 1").contains("unknown field `colour`"));
    }

    #[test]
    fn size_mb_is_optional_for_files_and_defaults_for_memory() {
        let p = |t: &str| ServerConfig::parse(t, Path::new("x.toml")).unwrap();
        assert_eq!(p("[[exports]]\nname = \"a\"").exports[0].size, None, "a file export is never sized by default");
        assert_eq!(p("[[exports]]\nname = \"a\"\nsize_mb = 2").exports[0].size, Some(2 << 20));
        assert_eq!(p("[[exports]]\nname = \"a\"\nbackend = \"memory\"").exports[0].size, Some(1 << 30));
    }

    #[test]
    fn mclock_table_reaches_the_scheduler_config() {
        let p = |t: &str| ServerConfig::parse(&format!("{t}\n[[exports]]\nname = \"a\""), Path::new("x.toml"));
        assert_eq!(p("").unwrap().sched, SchedConfig::default());
        assert_eq!(p("[mclock]\npreset = \"paper\"").unwrap().sched, SchedConfig::paper());
        let c = p("cost_model = { tm_ms = 5, bpeak_mb_s = 60 }\n[mclock]\nreservation_lag = \"unbounded\"\nbatch = 8")
            .unwrap()
            .sched;
        assert_eq!(c.cost_model, rein_core::CostModel::paper_disk());
        assert_eq!(c.reservation_lag, rein_core::ReservationLag::Unbounded);
        assert_eq!(c.batch, 8);
        assert_eq!(p("cost_model = \"bytes\"").unwrap().sched.cost_model, rein_core::CostModel::BYTES);
        let e = |t: &str| p(t).unwrap_err().to_string();
        assert_eq!(
            e("[mclock]\nlimit_burst_ios = -1"),
            "config: mclock.limit_burst_ios = -1: expected an IO count in 0..=1048576, or \"none\" (L tags clamped \
             at arrival, as in the paper)"
        );
        assert!(e("[mclock]\nreservation_lag = \"10\"").contains("mclock.reservation_lag = \"10\""));
        assert!(e("cost_model = \"lots\"").contains("cost_model = \"lots\": expected"));
        assert!(e("cost_model = \"io\"\n[mclock]\ncost_model = \"io\"").contains("cost_model is given twice"));
        assert!(e("[mclock]\nbatchsize = 8").contains("unknown field `batchsize`"));
    }

    #[test]
    fn access_lists_caps_and_the_default_export() {
        let p = |t: &str| ServerConfig::parse(t, Path::new("x.toml"));
        let list =
            |n: usize| (0..n).map(|i| format!("\"10.{}.{}.0/24\"", i / 256, i % 256)).collect::<Vec<_>>().join(",");
        let c = p(&format!(
            "[[exports]]\nname = \"a\"\nallow_networks = [{}]\nallow_identities = [\"x\"]",
            list(MAX_ALLOW_ENTRIES)
        ))
        .unwrap();
        assert_eq!(c.exports[0].access.networks.as_ref().unwrap().len(), MAX_ALLOW_ENTRIES);
        assert_eq!(c.exports[0].access.identities, Some(vec!["x".to_string()]));
        let e = p(&format!("[[exports]]\nname = \"a\"\nallow_networks = [{}]", list(MAX_ALLOW_ENTRIES + 1)))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "config: export a: allow_networks has 1025 entries, above the limit of 1024");
        let e = p("[[exports]]\nname = \"a\"\nallow_identities = [\"\"]").unwrap_err().to_string();
        assert!(e.contains("allow_identities has an empty entry"), "{e}");
        let long = |n: usize| format!("[[exports]]\nname = \"a\"\nallow_identities = [\"{}\"]", "x".repeat(n));
        assert!(p(&long(MAX_ALLOW_ENTRY_BYTES)).is_ok());
        let e = p(&long(MAX_ALLOW_ENTRY_BYTES + 1)).unwrap_err().to_string();
        assert_eq!(e, "config: export a: allow_identities has an entry of 257 bytes, above the limit of 256");
        // A bare address is a network of one.
        let c = p("[[exports]]\nname = \"a\"\nallow_networks = [\"192.0.2.7\"]").unwrap();
        assert_eq!(c.exports[0].access.networks.as_ref().unwrap()[0].to_string(), "192.0.2.7/32");
        // Caps: defaults, bounds, and per-client/per-tenant defaults never above the total.
        let c = p("[[exports]]\nname = \"a\"").unwrap();
        assert_eq!(c.caps, ConnCaps { total: 4096, per_client: 128, per_tenant: 256 });
        assert_eq!(c.default_export, None);
        let c = p("max_connections = 65536\nmax_connections_per_client = 65536\n[[exports]]\nname = \"a\"").unwrap();
        assert_eq!(c.caps.per_client, MAX_CONNECTIONS_LIMIT);
        let c = p("max_connections = 10\n[[exports]]\nname = \"a\"").unwrap();
        assert_eq!(c.caps, ConnCaps { total: 10, per_client: 10, per_tenant: 10 });
        let e = p("max_connections = 65537\n[[exports]]\nname = \"a\"").unwrap_err().to_string();
        assert_eq!(e, "config: max_connections must be in 1..=65536, got 65537");
        let c = p("default_export = \"b\"\n[[exports]]\nname = \"a\"\n[[exports]]\nname = \"b\"").unwrap();
        assert_eq!(c.default_export, Some(1));
    }

    /// The errors are typed: each refusal is its variant, with the field, the value and the bound, and its
    /// message the one operators saw when validation returned strings.
    #[test]
    fn errors_are_typed_with_the_field_value_and_bound() {
        let invalid = |t: &str| match ServerConfig::parse(t, Path::new("x.toml")) {
            Err(ConfigError::Invalid(e)) => e,
            other => panic!("not refused as invalid: {other:?}"),
        };
        let a = "\n[[exports]]\nname = \"a\"\n";
        let e = invalid(&format!("queue_depth = 5000{a}"));
        assert!(matches!(e, SettingError::Range { key: "queue_depth", min: 1, max: 4096, got: 5000 }), "{e:?}");
        assert_eq!(e.to_string(), "queue_depth must be in 1..=4096, got 5000");
        let e = invalid(&format!("max_connections_per_tenant = 0{a}"));
        assert!(
            matches!(e, SettingError::Range { key: "max_connections_per_tenant", min: 1, max: 65536, got: 0 }),
            "{e:?}"
        );
        let e = invalid(&format!("stall_timeout_s = 604801{a}"));
        assert!(matches!(e, SettingError::Timeout { key: "stall_timeout_s", max: 604800, got: 604801 }), "{e:?}");
        assert_eq!(e.to_string(), "stall_timeout_s must be in 0..=604800 (0: never), got 604801");
        let e = invalid(&format!("shutdown_timeout_s = 3601.5{a}"));
        assert!(
            matches!(e, SettingError::Seconds { key: "shutdown_timeout_s", max, got } if max == 3600.0 && got == 3601.5),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "shutdown_timeout_s must be in 0..=3600 seconds, got 3601.5");
        let e = invalid(&format!("admission = \"maybe\"{a}"));
        assert!(
            matches!(&e, SettingError::Choice { key: "admission", got, expected: "refuse or warn" } if got == "maybe"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "admission \"maybe\": expected refuse or warn");
        let e = invalid(&format!("listen = \"nowhere\"{a}"));
        assert!(matches!(&e, SettingError::Address { key: "listen", text, .. } if text == "nowhere"), "{e:?}");
        assert_eq!(e.to_string(), "listen \"nowhere\": invalid socket address syntax (expected address:port)");
        let e = invalid("listen = \"127.0.0.1:9000\"\nadmin = \"0.0.0.0:9000\"\n[[exports]]\nname = \"a\"");
        let (listen, admin) = ("127.0.0.1:9000".parse().unwrap(), "0.0.0.0:9000".parse().unwrap());
        assert!(
            matches!(e, SettingError::SamePort { what: "NBD", listen: l, admin: d } if l == listen && d == admin),
            "{e:?}"
        );
        // An export's refusal names the export once, then what is wrong with it.
        let e = invalid("[[exports]]\nname = \"a\"\nsize_mb = 0");
        assert!(
            matches!(&e, SettingError::Export { export, error: ExportError::Size { got: 0 } } if export == "a"),
            "{e:?}"
        );
        let e = invalid("[[exports]]\nname = \"a\"\ntenant = \"zz\"");
        assert!(
            matches!(&e, SettingError::Export { export, error: ExportError::UnknownTenant { tenant } }
                if export == "a" && tenant == "zz"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "export a: unknown tenant \"zz\"");
        let e = invalid("[[exports]]\nname = \"a\"\nallow_networks = [\"10.0.0.0/8\", \"x\"]");
        let want = AccessError::Network { entry: "x".into() };
        assert!(
            matches!(&e, SettingError::Export { export, error: ExportError::Access(w) } if export == "a" && *w == want),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "export a: allow_networks entry \"x\" is not a CIDR network (e.g. 10.0.0.0/8)");
        // [node]'s lists: the same check, named as node's keys (no export).
        let e = invalid(&format!("[node]\nallow_identities = [\"\"]{a}"));
        assert!(matches!(e, SettingError::NodeAccess(AccessError::EmptyEntry { key: "allow_identities" })), "{e:?}");
        assert_eq!(e.to_string(), "node.allow_identities has an empty entry");
        let e = invalid(&format!("[[tenants]]\nname = \"a\"\nreservation = 10\nlimit = 5{a}"));
        assert!(matches!(&e, SettingError::TenantSpec { tenant, .. } if tenant == "a"), "{e:?}");
        assert_eq!(e.to_string(), "tenant a: reservation 10 exceeds limit 5");
        let e = invalid(&format!("scheduler = \"fifo\"\n[pshift]{a}"));
        assert!(matches!(e, SettingError::PshiftScheduler { got: SchedulerKind::Fifo }), "{e:?}");
        let e = invalid(&format!("[device_model]\ncapacity_iops = 1000\nservice_scale = {{ b = 1.5 }}{a}"));
        assert!(matches!(&e, SettingError::ServiceScaleTenant { tenant } if tenant == "b"), "{e:?}");
        // [tls]: the word of the mode, then the credentials' own typed refusal.
        let e = invalid(&format!("[tls]\nmode = \"always\"{a}"));
        assert!(matches!(&e, SettingError::Choice { key: "tls.mode", got, .. } if got == "always"), "{e:?}");
        let e = invalid(&format!("[tls]\nmode = \"require\"{a}"));
        assert!(matches!(&e, SettingError::Tls(t) if matches!(**t, CredentialError::NoServerCredentials)), "{e:?}");
        assert_eq!(e.to_string(), "tls.mode = \"on\" or \"require\" needs tls.cert and tls.key, or tls.psk_file");
        // The other modules' refusals, kept typed: the Unix socket's, the admin keys', the scheduler's,
        // the engine's and [pshift]'s R order.
        let e = invalid(&format!("listen_unix_mode = \"0660\"{a}"));
        assert!(matches!(e, SettingError::UnixSocket(UnixListenError::ModeWithoutPath)), "{e:?}");
        assert_eq!(e.to_string(), "listen_unix_mode needs listen_unix");
        let e = invalid(&format!("max_admin_connections = 0{a}"));
        assert!(
            matches!(e, SettingError::AdminAccess(AdminAccessError::MaxConnections { got: 0, max: 4096 })),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "max_admin_connections must be in 1..=4096, got 0");
        let e = invalid(&format!("scheduler = \"wfq\"{a}"));
        assert!(matches!(&e, SettingError::Scheduler(UnknownScheduler { name }) if name == "wfq"), "{e:?}");
        assert_eq!(
            e.to_string(),
            "scheduler: unknown scheduler \"wfq\" (expected one of mclock, dmclock, rbfq, sfq, token, fifo)"
        );
        let e = invalid(&format!("io_engine = \"aio\"{a}"));
        assert!(matches!(&e, SettingError::IoEngine(UnknownIoEngine { got }) if got == "aio"), "{e:?}");
        assert_eq!(e.to_string(), "io_engine \"aio\": expected uring, threads or inline");
        let e = invalid(&format!("scheduler = \"token\"\n[pshift]\nr_order = \"lifo\"{a}"));
        assert!(matches!(&e, SettingError::PshiftROrder(ROrderError::Unknown { got }) if got == "lifo"), "{e:?}");
        let e = invalid(&format!("scheduler = \"token\"\n[pshift]\nr_floor_ios = 0{a}"));
        assert!(matches!(e, SettingError::PshiftROrder(ROrderError::Floor { got: 0, min: 1, .. })), "{e:?}");
        assert_eq!(e.to_string(), "pshift.r_floor_ios 0: expected 1 to 1000000000");
        // The one "config: " of ConfigError, no more.
        let e = ServerConfig::parse(&format!("max_request_kb = 0{a}"), Path::new("x.toml")).unwrap_err().to_string();
        assert_eq!(e, "config: max_request_kb must be in 1..=131072, got 0");
    }

    #[test]
    fn admission() {
        let c = ServerConfig::parse("capacity_iops = 400\n[[exports]]\nname = \"a\"", Path::new("x")).unwrap();
        let r = |x| QosSpec::new(x, None, 1.0, 0).unwrap();
        assert!(c.admission_check([r(100.0), r(200.0)].into_iter()).is_ok());
        let e = c.admission_check([r(300.0), r(200.0)].into_iter()).unwrap_err();
        assert_eq!(e, Shortfall::Above { sum: 500.0, capacity: 400.0 });
        assert_eq!(e.to_string(), "reservations total 500 IOPS, above the reservable capacity of 400 IOPS");
        // Under cost_model = "bytes" reservations are bytes/s, counted as 4 KiB IOPS against the capacity.
        let b = |cap| {
            ServerConfig::parse(
                &format!("cost_model = \"bytes\"\ncapacity_iops = {cap}\n[[exports]]\nname = \"a\""),
                Path::new("x"),
            )
            .unwrap()
        };
        let (k100, k200) = (r(100.0 * 4096.0), r(200.0 * 4096.0));
        assert!(b(400).admission_check([k100, k200].into_iter()).is_ok());
        let e = b(250).admission_check([k100, k200].into_iter()).unwrap_err();
        assert_eq!(e, Shortfall::Above { sum: 300.0, capacity: 250.0 });
        assert_eq!(b(250).reservation_iops(&k200), 200.0);
    }
}
