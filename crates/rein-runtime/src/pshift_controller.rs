//! `rein pshift controller`: pShift's controller as a daemon (pshift.txt §III-D; docs/pshift-daemons.md).
//!
//! # Model
//! The controller is rein-core's [`Controller`], unchanged, the one the simulator's pShift clusters run,
//! on a real clock. Servers (`rein serve` with a `[pshift]` table) connect over TCP and say hello with
//! their name; the controller answers with the server's index and the bucket names (rein-proto's
//! [`crate::pshift_link`] frames: `rein_proto::pshift`). At every redistribution boundary it asks every
//! connected server for its report; when all are in (or half an interval has passed: the missing ones
//! count as idle at their last capacity estimate) it computes the tokens for the rest of the period and
//! sends each server its message. A server's note of a stray arrival may start an early round (rein-core's
//! controller, "Early rounds"), whose reports and answer go the same way. A server's ping is answered
//! with this clock, the next boundary whose report is not yet asked for (on this clock; none while
//! held) and the interval, from which the server cuts that report at the boundary itself.
//!
//! The first QoS period starts `start_s` after the controller starts (default: one redistribution
//! interval, whose report is the first statistics; as in the simulator). With `hold = true` the schedule
//! waits for `PUT /api/pshift/start` instead and runs from then on (its boundaries `start_s + k x interval`
//! after the request): `rein cluster run` starts it when its load starts, so the QoS periods fall where the
//! simulator's do. Servers keep plain round robin until their first answer, and go back to it when their
//! link to the controller breaks.
//!
//! # Invariants
//! 1. One connection per server name: a new hello for a server whose connection is live (a frame within
//!    [`LIVE_WITHIN`]: it pings every 100 ms) is refused, naming the live one (two servers configured with
//!    one name); a new hello for one whose connection went silent (a half-open link) replaces it.
//! 2. A server gets only messages for its own index, and a report or note naming another index closes
//!    its connection.
//! 3. Bounded: at most `servers + 16` connections at once, only from `allow_networks` (default loopback),
//!    each a hello of at most [`HELLO_MAX_BODY`] bytes within 5 s, then frames of at most a report's size
//!    for the configured buckets, at least one every 5 s ([`crate::pshift_link::SILENCE_TIMEOUT`]: a
//!    server pings every 100 ms, so a silent one is gone or hung, and its connection is closed, logged
//!    once, rather than keep its place), each frame to it (the welcome first) written within
//!    [`WRITE_TIMEOUT`]; the controller's task takes at most [`EVENT_QUEUE`] waiting events; the status
//!    keeps the last [`MAX_ROUNDS_KEPT`] rounds, and `/api/pshift/periods` the newest closed periods up
//!    to [`MAX_PERIOD_CELLS_KEPT`] bucket-periods.
//!    Connections refused or cut (outside `allow_networks`, a failed TLS handshake, no or a bad hello, an
//!    unknown name, a server connected already, a broken frame) are logged at most once a second for each of these kinds (`Cut`), the
//!    next line with the number not logged (`unlogged`): a peer that connects in a loop cannot flood the
//!    log. A welcomed server's refused reports and notes likewise, per server, and so are its connections
//!    welcomed, ended, and closed by the controller (a frame it does not take from a server, a
//!    connection that does not read): a peer that says hello as a server, is cut, and says hello again
//!    as fast as it can logs at most a line of each kind a second (`ServerLogs`).
//!
//! # Security
//! Only `allow_networks` may connect (loopback by default). With a `[tls]` table every connection is TLS
//! from its first byte (x509 with client certificates verified against `ca`, or TLS-PSK; never plain),
//! and with `allow_identities` only those identities (PSK identity or certificate CN) may say hello;
//! a server's `identity` binds it to one (another admitted identity may not say hello as it).
//! Without `[tls]` the link is plain TCP: whoever is admitted by `allow_networks` can say hello as a
//! server and report for it, so keep the port on the storage network.
//!
//! # Reload
//! SIGHUP reads ctl.toml again ([`ControllerReload`], on a thread of its own) and takes its `[tls]`
//! (renewed certificates and keys under the same names too; `crl` revokes servers' certificates) for the
//! connections from then on, cutting the open ones whose server it revokes ([`crate::tls`], "Reload");
//! the rest keeps its running value and is named as needing a restart (`apply_reload`).

use crate::config::{AccessError, SettingError};
use crate::dispatch::Clock;
use rein_core::pshift::{
    BucketQos, ClosedPeriod, Controller, ControllerConfig, RoundSummary, SolveOptions, MAX_BUCKETS, MAX_ENTRIES,
    MAX_NAME_LEN, MAX_SERVERS,
};
use rein_core::{Count, Nanos};
use rein_model::report::rounds::{PeriodCounts, PeriodRecord};
use rein_proto::pshift::Message;
use serde::Deserialize;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Rounds kept for `/api/pshift`.
pub const MAX_ROUNDS_KEPT: usize = 1024;
/// Bucket-periods (closed periods x buckets) kept for `/api/pshift/periods`: the newest periods that fit,
/// and always the last one.
pub const MAX_PERIOD_CELLS_KEPT: usize = 1 << 18;
/// A connection must say hello within this.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest hello body accepted (a name of at most 256 bytes and its length).
pub const HELLO_MAX_BODY: usize = 512;
/// A server's connection that sent a frame within this is live: a second hello with its name is refused,
/// not taken as its replacement (servers ping every 100 ms, so this is ten pings).
pub const LIVE_WITHIN: Duration = Duration::from_secs(1);
/// Networks allowed to connect when `allow_networks` is absent.
pub const DEFAULT_NETWORKS: [&str; 2] = ["127.0.0.0/8", "::1/128"];
/// Frames queued for one server's connection. The controller sends a few per period (a report request,
/// tokens, a pong per ping); a server this far behind is not reading, and its connection is closed (so a
/// peer that pings and never reads cannot grow the controller's memory).
pub const WRITER_QUEUE: usize = 256;
/// A frame not written to a server within this ends its connection (a peer that stopped reading).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Events (frames read, joins, leaves) waiting for the controller's task; a connection's reader waits
/// while it is full, so a peer that sends faster than the controller handles is slowed, not buffered.
pub const EVENT_QUEUE: usize = 1024;

fn d_intervals() -> u32 {
    5
}
fn d_early() -> u32 {
    rein_core::pshift::EarlyRounds::DEFAULT_PER_INTERVAL
}
fn d_delay_ms() -> f64 {
    1.0
}

/// ctl.toml as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: String,
    admin: Option<String>,
    admin_token_file: Option<String>,
    #[serde(default)]
    admin_insecure: bool,
    allow_networks: Option<Vec<String>>,
    period_s: f64,
    #[serde(default = "d_intervals")]
    intervals: u32,
    start_s: Option<f64>,
    estimator: Option<String>,
    backlog_idle_pct: Option<f64>,
    approx_top: Option<usize>,
    #[serde(default = "crate::config::d_true")]
    exact_limits: bool,
    #[serde(default = "d_early")]
    early_rounds: u32,
    #[serde(default = "d_delay_ms")]
    message_delay_ms: f64,
    #[serde(default)]
    hold: bool,
    allow_identities: Option<Vec<String>>,
    tls: Option<TlsFile>,
    #[serde(default)]
    servers: Vec<ServerFile>,
    #[serde(default)]
    buckets: Vec<BucketFile>,
}

/// `[tls]`: the servers' links (always TLS with it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert: Option<String>,
    key: Option<String>,
    ca: Option<String>,
    psk_file: Option<String>,
    crl: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    name: String,
    capacity_iops: f64,
    /// With `[tls]`: the identity (PSK identity or certificate CN) a hello naming this server must come
    /// with.
    identity: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketFile {
    name: String,
    #[serde(default)]
    reservation_iops: f64,
    limit_iops: Option<f64>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct ControllerSettings {
    /// Where servers connect.
    pub listen: SocketAddr,
    /// The admin endpoint (`/api/pshift`, `/metrics`), if any.
    pub admin: Option<SocketAddr>,
    /// Who may use it.
    pub admin_access: crate::admin_guard::AdminAccess,
    /// Who may connect as a server (`allow_networks`, default loopback only; `allow_identities`, checked
    /// after the TLS handshake).
    pub access: crate::access::ExportAccess,
    /// `[tls]`: TLS on every server link.
    pub tls: Option<crate::tls::TlsConfig>,
    /// The servers: (name, nominal capacity in IOPS), in index order.
    pub servers: Vec<(String, f64)>,
    /// Per server, in index order: the TLS identity (PSK identity or certificate CN) its hello must come
    /// with (`identity`), if given. Without it any identity `allow_identities` admits may say hello as
    /// the server, and report for it.
    pub identities: Vec<Option<String>>,
    /// The buckets: (name, QoS per period), in index order.
    pub buckets: Vec<(String, BucketQos)>,
    /// rein-core's controller configuration (times from the schedule's origin: the daemon's start, or
    /// the start request under `hold`).
    pub config: ControllerConfig,
    /// Whether the schedule waits for `PUT /api/pshift/start` (module comment).
    pub hold: bool,
    /// A frame (the welcome included) not written to a server within this ends its connection:
    /// [`WRITE_TIMEOUT`] (a field so that a test need not wait that long).
    pub write_timeout: Duration,
    /// A welcomed server that sends no frame for this long loses its connection:
    /// [`crate::pshift_link::SILENCE_TIMEOUT`] (a field, as `write_timeout`).
    pub silence_timeout: Duration,
    /// What the file asks that the controller cannot give, logged as warnings at start and by
    /// `--check-config`: reservations above the servers' capacity, no buckets.
    pub warnings: Vec<String>,
    /// The file it was read from, as given (`--config`): the messages about it name it.
    pub file: std::path::PathBuf,
}

/// Why ctl.toml was refused.
#[derive(Debug, thiserror::Error)]
pub enum ControllerConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// Where and what ([`crate::config::parse_toml`]).
        source: rein_model::input::TomlError,
    },
    /// A value is out of range or inconsistent with another: [`ControllerSettingError`] names the key.
    #[error("{path}: {error}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        error: ControllerSettingError,
    },
}

/// A value in ctl.toml that is refused: which key, the value, and the bound. Its message names the key
/// once; `listen` and `admin` on one port and the access lists are refused as rein.toml refuses them.
#[derive(Debug, thiserror::Error)]
pub enum ControllerSettingError {
    /// `listen` or `admin` is not an address.
    #[error("{key} {text:?} is not an address (ip:port)")]
    Address {
        /// The key.
        key: &'static str,
        /// The text given.
        text: String,
    },
    /// A key rein.toml has too, refused as there (`listen` and `admin` on one port, `intervals`,
    /// `early_rounds`).
    #[error("{0}")]
    Setting(SettingError),
    /// `allow_networks` or `allow_identities` is refused.
    #[error("{0}")]
    Access(AccessError),
    /// `allow_identities` without `[tls]`.
    #[error("allow_identities needs a [tls] table (an identity is a PSK identity or a client certificate's CN)")]
    IdentitiesWithoutTls,
    /// `[tls]`'s credentials cannot be read or do not fit together; the message names the key.
    #[error("{0}")]
    Tls(Box<crate::tls::CredentialError>),
    /// `admin_token_file` is refused.
    #[error("{0}")]
    AdminAccess(crate::admin_guard::AdminAccessError),
    /// A number outside `[min, max]` or not finite (`period_s`, `start_s`, `message_delay_ms`).
    #[error("{key} must be in [{min}, {max}], got {got}")]
    Interval {
        /// The key.
        key: &'static str,
        /// The smallest accepted.
        min: f64,
        /// The largest accepted.
        max: f64,
        /// The value given.
        got: f64,
    },
    /// `period_s / intervals` is no whole number of nanoseconds.
    #[error("period_s / intervals must be a whole number of nanoseconds ({period_s} s / {intervals})")]
    IntervalTicks {
        /// `period_s` given.
        period_s: f64,
        /// `intervals` given.
        intervals: u32,
    },
    /// `estimator` or `backlog_idle_pct` is refused.
    #[error("{0}")]
    Estimator(rein_model::pshift_settings::EstimatorError),
    /// `approx_top = 0`.
    #[error("approx_top must be at least 1 (leave it out to solve exactly)")]
    ApproxTop,
    /// No `[[servers]]`, or more than `max`.
    #[error("[[servers]]: between 1 and {max} servers, got {got}")]
    Servers {
        /// The most accepted ([`MAX_SERVERS`]).
        max: usize,
        /// How many there are.
        got: usize,
    },
    /// A server's or bucket's name that is empty or longer than `max` bytes.
    #[error("{what} name {name:?} must be 1 to {max} bytes")]
    Name {
        /// `server` or `bucket`.
        what: &'static str,
        /// The name.
        name: String,
        /// The longest accepted ([`MAX_NAME_LEN`]).
        max: usize,
    },
    /// Two servers of one name.
    #[error("two servers are named {name:?}")]
    RepeatedServer {
        /// The name.
        name: String,
    },
    /// A server's setting is refused.
    #[error("server {server}: {error}")]
    Server {
        /// The server's name.
        server: String,
        /// What is wrong with it.
        error: ServerSettingError,
    },
    /// More than `max` `[[buckets]]`.
    #[error("[[buckets]]: at most {max}, got {got}")]
    Buckets {
        /// The most accepted ([`MAX_BUCKETS`]).
        max: usize,
        /// How many there are.
        got: usize,
    },
    /// More (bucket, server) pairs than a round takes.
    #[error(
        "{servers} servers x {buckets} buckets: at most {max} (bucket, server) pairs, which a round with demand \
         everywhere would need"
    )]
    Pairs {
        /// The servers.
        servers: usize,
        /// The buckets.
        buckets: usize,
        /// The most pairs accepted ([`MAX_ENTRIES`]).
        max: usize,
    },
    /// Two buckets of one name.
    #[error("two buckets are named {name:?}")]
    RepeatedBucket {
        /// The name.
        name: String,
    },
    /// A bucket's setting is refused.
    #[error("bucket {bucket}: {error}")]
    Bucket {
        /// The bucket's name.
        bucket: String,
        /// What is wrong with it.
        error: BucketSettingError,
    },
    /// rein-core's controller refuses the servers, buckets or limits.
    #[error("{0}")]
    Controller(rein_core::pshift::ControllerError),
}

/// What is wrong with one `[[servers]]` entry ([`ControllerSettingError::Server`] names the server).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ServerSettingError {
    /// `capacity_iops` outside (0, 1e9].
    #[error("capacity_iops must be in (0, 1e9], got {got}")]
    Capacity {
        /// The value given.
        got: f64,
    },
    /// `identity` without `[tls]`.
    #[error("identity needs a [tls] table (it is checked on TLS links)")]
    IdentityWithoutTls,
    /// `identity` empty or longer than `max` bytes.
    #[error("identity must have 1..={max} bytes")]
    IdentityLength {
        /// The longest accepted.
        max: usize,
    },
}

/// What is wrong with one `[[buckets]]` entry ([`ControllerSettingError::Bucket`] names the bucket).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BucketSettingError {
    /// `reservation_iops` outside [0, 1e9].
    #[error("reservation_iops must be in [0, 1e9], got {got}")]
    Reservation {
        /// The value given.
        got: f64,
    },
    /// `limit_iops` below `reservation_iops` or above 1e9.
    #[error("limit_iops must be in [reservation_iops, 1e9], got {got} (reservation {reservation})")]
    Limit {
        /// The value given.
        got: f64,
        /// The bucket's `reservation_iops`.
        reservation: f64,
    },
}

impl From<SettingError> for ControllerSettingError {
    fn from(e: SettingError) -> Self {
        ControllerSettingError::Setting(e)
    }
}

impl ControllerSettings {
    /// Reads and validates `path` (relative paths in it are taken from its directory).
    pub fn load(path: &Path) -> Result<ControllerSettings, ControllerConfigError> {
        let shown = path.display().to_string();
        let text = crate::durable::read_config(path, crate::config::MAX_CONFIG_BYTES)
            .map_err(|source| ControllerConfigError::Read { path: shown.clone(), source })?;
        Self::parse(&text, path)
    }

    /// Validates `text` as if read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<ControllerSettings, ControllerConfigError> {
        let shown = path.display().to_string();
        let f: File = crate::config::parse_toml(text)
            .map_err(|source| ControllerConfigError::Parse { path: shown.clone(), source })?;
        validate(f, path).map_err(|error| ControllerConfigError::Invalid { path: shown, error })
    }
}

fn name_ok(what: &'static str, n: &str) -> Result<(), ControllerSettingError> {
    if n.is_empty() || n.len() > MAX_NAME_LEN {
        return Err(ControllerSettingError::Name { what, name: n.to_string(), max: MAX_NAME_LEN });
    }
    Ok(())
}

fn validate(f: File, path: &Path) -> Result<ControllerSettings, ControllerSettingError> {
    let base = path.parent().unwrap_or(Path::new("."));
    let addr = |key: &'static str, v: &str| -> Result<SocketAddr, ControllerSettingError> {
        v.parse().map_err(|_| ControllerSettingError::Address { key, text: v.to_string() })
    };
    let interval = |key: &'static str, got: f64, min: f64, max: f64| {
        if got.is_finite() && (min..=max).contains(&got) {
            Ok(got)
        } else {
            Err(ControllerSettingError::Interval { key, min, max, got })
        }
    };
    let listen = addr("listen", &f.listen)?;
    let admin = f.admin.as_deref().map(|a| addr("admin", a)).transpose()?;
    // One port for both passed --check-config and failed the start with "Address already in use".
    if let Some(admin) = admin {
        crate::config::distinct_fronts("the pShift link", listen, admin)?;
    }
    let networks = f.allow_networks.clone().or_else(|| Some(DEFAULT_NETWORKS.iter().map(|n| n.to_string()).collect()));
    let access = crate::config::access_lists(&networks, &f.allow_identities).map_err(ControllerSettingError::Access)?;
    let tls = match &f.tls {
        None if f.allow_identities.is_some() => return Err(ControllerSettingError::IdentitiesWithoutTls),
        None => None,
        Some(t) => {
            let path = |p: &Option<String>| p.as_ref().map(|p| base.join(p));
            let files = crate::tls::TlsFiles {
                cert: path(&t.cert),
                key: path(&t.key),
                ca: path(&t.ca),
                psk_file: path(&t.psk_file),
                crl: path(&t.crl),
            };
            Some(
                crate::tls::TlsConfig::build(rein_proto::nbd::TlsMode::Require, files)
                    .map_err(|e| ControllerSettingError::Tls(Box::new(e)))?,
            )
        }
    };
    let admin_access = crate::admin_guard::AdminAccess::new(
        f.admin_token_file.as_ref().map(|p| base.join(p)),
        f.admin_insecure,
        crate::config::d_admin_conns(),
        crate::config::d_admin_idle(),
    )
    .map_err(ControllerSettingError::AdminAccess)?;
    interval("period_s", f.period_s, 0.001, 86_400.0)?;
    crate::config::in_range("intervals", f.intervals.into(), 1, 1000)?;
    let period = Nanos::from_secs_f64(f.period_s);
    if !period.0.is_multiple_of(u64::from(f.intervals)) {
        return Err(ControllerSettingError::IntervalTicks { period_s: f.period_s, intervals: f.intervals });
    }
    let tau = period.0 / u64::from(f.intervals);
    let start = match f.start_s {
        None => Nanos(tau),
        Some(s) => Nanos::from_secs_f64(interval("start_s", s, 0.0, 86_400.0)?),
    };
    let (estimator, backlog_idle_bp) =
        rein_model::pshift_settings::estimator("", f.estimator.as_deref(), f.backlog_idle_pct)
            .map_err(ControllerSettingError::Estimator)?;
    if f.approx_top == Some(0) {
        return Err(ControllerSettingError::ApproxTop);
    }
    crate::config::in_range("early_rounds", f.early_rounds.into(), 0, 100)?;
    interval("message_delay_ms", f.message_delay_ms, 0.0, 10_000.0)?;
    if f.servers.is_empty() || f.servers.len() > MAX_SERVERS {
        return Err(ControllerSettingError::Servers { max: MAX_SERVERS, got: f.servers.len() });
    }
    let mut servers: Vec<(String, f64)> = Vec::with_capacity(f.servers.len());
    // Names seen, for the duplicate checks: a set, since a file may name up to MAX_BUCKETS buckets (by
    // pairs, a million of them took about 5e11 comparisons).
    let mut seen = std::collections::HashSet::with_capacity(f.servers.len());
    for s in &f.servers {
        name_ok("server", &s.name)?;
        if !seen.insert(s.name.as_str()) {
            return Err(ControllerSettingError::RepeatedServer { name: s.name.clone() });
        }
        let server_error = |error| ControllerSettingError::Server { server: s.name.clone(), error };
        if !(s.capacity_iops.is_finite() && s.capacity_iops > 0.0 && s.capacity_iops <= 1e9) {
            return Err(server_error(ServerSettingError::Capacity { got: s.capacity_iops }));
        }
        if let Some(id) = &s.identity {
            if f.tls.is_none() {
                return Err(server_error(ServerSettingError::IdentityWithoutTls));
            }
            if id.is_empty() || id.len() > 255 {
                return Err(server_error(ServerSettingError::IdentityLength { max: 255 }));
            }
        }
        servers.push((s.name.clone(), s.capacity_iops));
    }
    let identities = f.servers.iter().map(|s| s.identity.clone()).collect();
    if f.buckets.len() > MAX_BUCKETS {
        return Err(ControllerSettingError::Buckets { max: MAX_BUCKETS, got: f.buckets.len() });
    }
    // A round's instance takes at most MAX_ENTRIES (bucket, server) pairs with demand; past it the
    // buckets beyond get no tokens that round.
    if f.servers.len().saturating_mul(f.buckets.len()) > MAX_ENTRIES {
        return Err(ControllerSettingError::Pairs {
            servers: f.servers.len(),
            buckets: f.buckets.len(),
            max: MAX_ENTRIES,
        });
    }
    let mut buckets: Vec<(String, BucketQos)> = Vec::with_capacity(f.buckets.len());
    seen.clear();
    for b in &f.buckets {
        name_ok("bucket", &b.name)?;
        if !seen.insert(b.name.as_str()) {
            return Err(ControllerSettingError::RepeatedBucket { name: b.name.clone() });
        }
        let bucket_error = |error| ControllerSettingError::Bucket { bucket: b.name.clone(), error };
        let rate_ok = |v: f64| v.is_finite() && (0.0..=1e9).contains(&v);
        if !rate_ok(b.reservation_iops) {
            return Err(bucket_error(BucketSettingError::Reservation { got: b.reservation_iops }));
        }
        if let Some(l) = b.limit_iops {
            if !rate_ok(l) || l < b.reservation_iops {
                return Err(bucket_error(BucketSettingError::Limit { got: l, reservation: b.reservation_iops }));
            }
        }
        buckets.push((b.name.clone(), BucketQos::per_period(b.reservation_iops, b.limit_iops, f.period_s)));
    }
    let solve = SolveOptions { approx_top: f.approx_top, ..SolveOptions::default() };
    let delay = Nanos::from_secs_f64(f.message_delay_ms / 1e3);
    let config = ControllerConfig::for_delay(
        period,
        f.intervals,
        start,
        estimator,
        solve,
        f.exact_limits,
        f.early_rounds,
        delay,
    );
    let config = ControllerConfig { backlog_idle_bp, ..config };
    // The controller's own checks (servers, buckets, limits), once, here.
    let caps: Vec<f64> = servers.iter().map(|s| s.1).collect();
    Controller::new(config, &caps, buckets.iter().map(|b| b.1).collect())
        .map_err(ControllerSettingError::Controller)?;
    let warnings = warnings(&f);
    Ok(ControllerSettings {
        listen,
        admin,
        admin_access,
        access,
        tls,
        servers,
        identities,
        buckets,
        config,
        hold: f.hold,
        write_timeout: WRITE_TIMEOUT,
        silence_timeout: crate::pshift_link::SILENCE_TIMEOUT,
        warnings,
        file: path.to_path_buf(),
    })
}

/// What a valid file asks that the controller cannot give ([`ControllerSettings::warnings`]): not errors,
/// since a capacity is a nominal estimate (servers report what they actually complete) and buckets with
/// nothing to schedule harm no one, but each is most likely a mistake.
fn warnings(f: &File) -> Vec<String> {
    let mut w = Vec::new();
    if f.buckets.is_empty() {
        w.push(
            "no [[buckets]]: the controller reserves and limits nothing; every tenant at the servers is served \
             round robin, unlimited"
                .to_string(),
        );
    }
    let reserved: f64 = f.buckets.iter().map(|b| b.reservation_iops).sum();
    let capacity: f64 = f.servers.iter().map(|s| s.capacity_iops).sum();
    if let Some(s) = crate::config::Shortfall::of(reserved, Some(capacity)) {
        w.push(format!(
            "[[buckets]]: {s} (the [[servers]]' capacity_iops summed): not every bucket can get its reservation"
        ));
    }
    w
}

/// One round as `/api/pshift` lists it: rein-model's row of rounds.csv, the simulator's too.
pub type RoundRecord = rein_model::report::rounds::ControllerRound;

/// What `/api/pshift` shows.
#[derive(Clone, Debug, Default, serde::Serialize, Deserialize)]
pub struct ControllerStatus {
    /// The next boundary's number.
    pub round: u64,
    /// When this was read (s since the controller started).
    pub now_s: f64,
    /// When the schedule started (s since the controller started: 0, or the start request under `hold`);
    /// `None` while it waits for one.
    pub origin_s: Option<f64>,
    /// Per server (index order): name, and whether it is connected.
    pub servers: Vec<(String, bool)>,
    /// Per bucket (index order): name, reservation and limit per period, IOs done in the period so far.
    pub buckets: Vec<BucketStatus>,
    /// Reports, notes or frames refused (wrong server index, a bad frame, an unknown name).
    pub refused: u64,
    /// Reports that came after their round was computed and were counted then (rein-core's controller,
    /// "Late reports"): for the current period, or for the period closed at the latest boundary while
    /// its record waits for them (an interval); later ones are not counted here.
    #[serde(default)]
    pub late_reports: u64,
    /// The newest rounds, oldest first.
    pub rounds: VecDeque<RoundRecord>,
}

/// One more connection, report or note refused (`/api/pshift`'s `refused`).
fn count_refused(status: &Mutex<ControllerStatus>) {
    status.lock().unwrap_or_else(|e| e.into_inner()).refused += 1;
}

impl ControllerStatus {
    /// Adds a round, dropping the oldest past [`MAX_ROUNDS_KEPT`].
    fn push_round(&mut self, r: RoundRecord) {
        crate::bounded::push(&mut self.rounds, r, MAX_ROUNDS_KEPT);
    }
}

/// What `/api/pshift/periods` shows: the closed QoS periods one by one, each bucket's IOs completed in it
/// by the servers' counts (rein-core's controller, "Periods counted at the servers"; periods.csv of
/// `rein cluster run`).
#[derive(Clone, Debug, Default, serde::Serialize, Deserialize)]
pub struct PeriodsStatus {
    /// The oldest closed periods, dropped to keep at most [`MAX_PERIOD_CELLS_KEPT`] bucket-periods.
    pub dropped: u64,
    /// The newest closed periods, oldest first; `completed` in the bucket order of `/api/pshift`.
    pub periods: VecDeque<PeriodRecord>,
}

impl PeriodsStatus {
    /// Adds a closed period, dropping the oldest ones past the bound.
    fn push(&mut self, r: PeriodRecord) {
        let per = r.completed.len().max(1);
        while !self.periods.is_empty() && (self.periods.len() + 1) * per > MAX_PERIOD_CELLS_KEPT {
            self.periods.pop_front();
            self.dropped += 1;
        }
        self.periods.push_back(r);
    }
}

/// One bucket in [`ControllerStatus`].
#[derive(Clone, Debug, serde::Serialize, Deserialize)]
pub struct BucketStatus {
    /// Its name.
    pub name: String,
    /// R_i (IOs per period).
    pub reservation: u64,
    /// L_i (IOs per period), if limited.
    pub limit: Option<u64>,
    /// IOs done in the current period, as of the last round.
    pub done: u64,
    /// Its closed QoS periods, as the servers counted them (rein-core's controller, "Periods counted at
    /// the servers").
    #[serde(default)]
    pub periods: PeriodCounts,
}

/// The channel of [`Event`]s to the controller's task: [`EVENT_QUEUE`] of them wait at most.
fn event_channel() -> (mpsc::Sender<Event>, mpsc::Receiver<Event>) {
    mpsc::channel(EVENT_QUEUE)
}

/// What the connection tasks tell the controller's task.
enum Event {
    /// Server `index` said hello from `peer`; its frames would go out on `tx` (connection `conn`). The
    /// answer: welcomed, or refused with the reason (its name is live on another connection).
    Joined {
        index: usize,
        conn: u64,
        peer: SocketAddr,
        tx: mpsc::Sender<Message>,
        verdict: tokio::sync::oneshot::Sender<Result<(), Taken>>,
    },
    /// Connection `conn` of server `index` ended.
    Left { index: usize, conn: u64 },
    /// A frame from server `index`.
    Frame { index: usize, conn: u64, m: Message },
    /// `PUT /api/pshift/start` under `hold`: the schedule starts at this time (on the controller's clock,
    /// read before the request is answered, so the origin is never after the answer).
    Start(Nanos),
}

/// A start under `hold` with no admin endpoint, configured or passed: the schedule would never start.
const HOLD_NEEDS_ADMIN: &str = "hold = true needs an admin endpoint: the schedule starts on PUT /api/pshift/start; \
                                set admin = \"ip:port\", or pass the admin socket (FileDescriptorName=admin)";

impl ControllerSettings {
    /// `rein pshift controller --check-config`: what a start would refuse before it listens, without
    /// starting (the file was validated by [`ControllerSettings::load`]; here the admin endpoint's token
    /// file); returns the lines to print.
    pub fn check(&self) -> Result<Vec<String>, crate::admin_guard::AdminGuardError> {
        if let Some(addr) = self.admin {
            crate::admin_guard::prepare(addr, &self.admin_access, ADMIN_POWERS)?;
        }
        if let Some(w) = crate::admin_guard::unused_admin_keys(&self.admin_access, self.admin, false) {
            tracing::warn!("{w}");
        }
        if self.hold && self.admin.is_none() {
            tracing::warn!(
                "hold = true but admin is not set: only an admin socket a service manager passes can take the \
                 PUT /api/pshift/start the schedule waits for; a start passed none is refused"
            );
        }
        for w in &self.warnings {
            tracing::warn!("{w}");
        }
        let mut lines: Vec<String> =
            self.servers.iter().map(|(name, cap)| format!("server {name}: {cap} IOPS")).collect();
        lines.extend(self.buckets.iter().map(|(name, q)| {
            let limit = q.limit.map_or_else(|| "none".to_string(), |l| l.to_string());
            format!("bucket {name}: reservation {} IOs per QoS period, limit {limit}", q.reservation)
        }));
        if let Some(t) = &self.tls {
            lines.extend(t.describe(crate::tls::unix_now()));
        }
        lines.push(format!(
            "{}, {}, servers connect on {}",
            Count(self.servers.len(), "server"),
            Count(self.buckets.len(), "bucket"),
            self.listen
        ));
        Ok(lines)
    }
}

/// What a reload needs: one message per SIGHUP, and the reader of ctl.toml (run on a thread of its own).
pub struct ControllerReload {
    /// One message per reload.
    pub requests: tokio::sync::mpsc::Receiver<()>,
    /// Reads and validates ctl.toml.
    pub load: Box<dyn FnMut() -> Result<ControllerSettings, String> + Send>,
}

/// Applies a reload of ctl.toml over `running`: `[tls]` (read again from its files, renewed certificates
/// under the same names too) for the connections from then on, those open keeping their session; the
/// rest, which the schedule and the servers' welcomes are built from, is named as needing a restart and
/// keeps its running value.
fn apply_reload(
    running: &mut ControllerSettings,
    new: ControllerSettings,
    live: &crate::tls::LiveTls,
) -> crate::live::ReloadReport {
    let mut r = crate::live::ReloadReport::default();
    let but_tls =
        |c: &ControllerSettings| format!("{:?}", ControllerSettings { tls: None, warnings: Vec::new(), ..c.clone() });
    if but_tls(running) != but_tls(&new) {
        r.needs_restart.push(format!(
            "{}'s servers, buckets, periods, addresses or access changed: needs a restart (the schedule and the \
             servers' welcomes are built from them)",
            new.file.display()
        ));
    }
    if let Some(w) = new.tls.as_ref().and_then(|t| t.expiry_warning(crate::tls::unix_now())) {
        r.applied.push(format!("warning: {w}"));
    }
    if let Some(what) = crate::tls::TlsConfig::change(running.tls.as_ref(), new.tls.as_ref()) {
        r.applied.push(format!("[tls]: {what}: for server connections from now on (those open keep their session)"));
    }
    // Built anew from the files, so replaced whatever the comparison says; the server connections it
    // revokes are cut (each logged).
    let cut = live.set(new.tls.clone());
    if !cut.is_empty() {
        r.applied.push(format!(
            "[tls]: {} closed: the new credentials revoke their server (each logged)",
            rein_core::Count(cut.len(), "server connection")
        ));
    }
    running.tls = new.tls;
    r
}

/// Runs the controller until `shutdown` resolves. `passed`: the listening sockets a service manager
/// passed ([`crate::activation`], roles [`crate::activation::PSHIFT`] and [`crate::activation::ADMIN`]),
/// served in place of `listen`, or of `admin` (also without one in the file);
/// [`crate::activation::Passed::none`] binds the configuration's.
pub async fn run(
    s: ControllerSettings,
    shutdown: impl std::future::Future<Output = ()>,
    ready: Option<tokio::sync::oneshot::Sender<(SocketAddr, Option<SocketAddr>)>>,
    mut passed: crate::activation::Passed,
    reload: Option<ControllerReload>,
) -> Result<(), String> {
    crate::stall::watch_process();
    let activation = |e: crate::activation::ActivationError| format!("socket activation: {e}");
    let listener = match passed.take_one(&crate::activation::PSHIFT) {
        Some(p) => {
            p.log_use("the pShift link", &format!("listen = {}", s.listen));
            p.into_tcp().map_err(activation)?
        }
        None => crate::sock::bind_tcp(s.listen).map_err(|e| format!("listen {}: {e}", s.listen))?,
    };
    let passed_admin = passed.take_one(&crate::activation::ADMIN);
    let listen = listener.local_addr().map_err(|e| e.to_string())?;
    for w in &s.warnings {
        tracing::warn!("{w}");
    }
    let caps: Vec<f64> = s.servers.iter().map(|x| x.1).collect();
    let qos: Vec<BucketQos> = s.buckets.iter().map(|b| b.1).collect();
    let ctl = Controller::new(s.config, &caps, qos).map_err(|e| e.to_string())?;
    let status = Arc::new(Mutex::new(ControllerStatus {
        round: 0,
        now_s: 0.0,
        origin_s: if s.hold { None } else { Some(0.0) },
        servers: s.servers.iter().map(|x| (x.0.clone(), false)).collect(),
        buckets: s
            .buckets
            .iter()
            .map(|(n, q)| BucketStatus {
                name: n.clone(),
                reservation: q.reservation,
                limit: q.limit,
                done: 0,
                periods: PeriodCounts::default(),
            })
            .collect(),
        refused: 0,
        late_reports: 0,
        rounds: VecDeque::new(),
    }));
    let periods = Arc::new(Mutex::new(PeriodsStatus::default()));
    let clock = Clock::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (ev_tx, ev_rx) = event_channel();
    // `[tls]`, which a reload replaces for the connections from then on.
    let tls = crate::tls::LiveTls::new(s.tls.clone());
    let reloads = Arc::new(crate::reloads::Reloads::new("pshift_controller"));
    if s.hold && passed_admin.is_none() && s.admin.is_none() {
        return Err(HOLD_NEEDS_ADMIN.into());
    }
    let admin_listener = crate::admin_guard::admin_listener(passed_admin, s.admin, &s.admin_access, ADMIN_POWERS)
        .await
        .map_err(|e| match e {
            crate::admin_guard::AdminListenError::Bind { addr, source } => format!("admin {addr}: {source}"),
            e => e.to_string(),
        })?;
    let admin = match admin_listener {
        None => None,
        Some((l, token)) => {
            let bound = l.local_addr().map_err(|e| e.to_string())?;
            let accepts = Arc::new(crate::access::AcceptPacing::default());
            let l = crate::admin_guard::CappedListener::new(l, &s.admin_access, None, accepts.clone());
            let router = crate::admin_guard::protect(
                admin_router(
                    status.clone(),
                    periods.clone(),
                    clock,
                    ev_tx.clone(),
                    s.hold,
                    MetricsParts {
                        started: reloads.clone(),
                        presented: crate::tls::Presented::default().server("controller", Some(tls.clone())),
                        admin_accepts: accepts,
                    },
                ),
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
    tracing::info!(
        listen = %listen,
        admin = %admin.map_or_else(|| "none".to_string(), |a| a.to_string()),
        servers = s.servers.len(),
        buckets = s.buckets.len(),
        "rein pshift controller listening"
    );
    if let Some(w) = s.tls.as_ref().and_then(|t| t.expiry_warning(crate::tls::unix_now())) {
        tracing::warn!("{w}");
    }
    crate::notify::ready(&format!(
        "listening: servers connect on {listen}, {}, {}",
        Count(s.servers.len(), "server"),
        Count(s.buckets.len(), "bucket")
    ));
    if let Some(r) = ready {
        let _ = r.send((listen, admin));
    }
    let names: Arc<Vec<String>> = Arc::new(s.servers.iter().map(|x| x.0.clone()).collect());
    let buckets: Arc<Vec<String>> = Arc::new(s.buckets.iter().map(|x| x.0.clone()).collect());
    // The welcome says which buckets are limited, so a server leaves a limited bucket no L-tokens when an
    // answer does not list it (its own tenant has no limit: the limit is the controller's).
    // (rein-proto writes the flags only when a bucket is limited.)
    let limited: Arc<Vec<bool>> = Arc::new(s.buckets.iter().map(|b| b.1.limit.is_some()).collect());
    let strays = s.config.early.per_interval > 0;
    // A report holds at most a line per bucket.
    let max_body = rein_proto::pshift::server_body_max(s.buckets.len());
    let access = Arc::new(s.access.clone());
    let refused = status.clone();
    let accept = tokio::spawn(accept_loop(
        listener,
        Admit {
            names: names.clone(),
            identities: Arc::new(s.identities.clone()),
            buckets,
            limited,
            strays,
            max_body,
            write_timeout: s.write_timeout,
            silence_timeout: s.silence_timeout,
            access,
            tls: tls.clone(),
            refused,
            log: Arc::default(),
        },
        ev_tx,
        stop_rx.clone(),
    ));
    let origin = if s.hold { None } else { Some(Nanos::ZERO) };
    let logs = (0..names.len()).map(|_| ServerLogs::default()).collect();
    let task = Task {
        ctl,
        clock,
        origin,
        conns: (0..names.len()).map(|_| None).collect(),
        status,
        periods,
        requested: None,
        names,
        logs,
    };
    let mut watchdog = crate::notify::Watchdog::from_env();
    let run = task.run(ev_rx);
    tokio::pin!(run, shutdown);
    let (mut reload_rx, load) = match reload {
        Some(ControllerReload { requests, load }) => (Some(requests), Some(Arc::new(std::sync::Mutex::new(load)))),
        None => (None, None),
    };
    // ctl.toml is read on a thread of its own ([`crate::server::read_apart`]): a file that never reads
    // holds up neither the controller nor a stop.
    let mut reading = None;
    let mut running = s;
    loop {
        tokio::select! {
            _ = &mut run => break,
            _ = &mut shutdown => break,
            () = watchdog.tick() => watchdog.ping(),
            Some(()) = async { reload_rx.as_mut().expect("guarded").recv().await }, if reload_rx.is_some() && reading.is_none() => {
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
                        let report = apply_reload(&mut running, new, &tls);
                        crate::notify::ready(&report.log(&reloads));
                    }
                }
            }
        }
    }
    if reading.is_some() {
        tracing::warn!(
            "stopping: {} is still being read for a reload; that reload is abandoned",
            running.file.display()
        );
    }
    crate::notify::stopping();
    let _ = stop_tx.send(true);
    accept.abort();
    tracing::info!("pShift controller stopped");
    Ok(())
}

/// What a new connection is checked against and told.
#[derive(Clone)]
struct Admit {
    names: Arc<Vec<String>>,
    /// [`ControllerSettings::identities`].
    identities: Arc<Vec<Option<String>>>,
    buckets: Arc<Vec<String>>,
    /// Per bucket, whether it is limited.
    limited: Arc<Vec<bool>>,
    strays: bool,
    /// The largest frame body after the hello.
    max_body: usize,
    /// [`ControllerSettings::write_timeout`].
    write_timeout: Duration,
    /// [`ControllerSettings::silence_timeout`].
    silence_timeout: Duration,
    access: Arc<crate::access::ExportAccess>,
    /// `[tls]`, as a reload replaces it (a connection's handshake, run as it comes in, takes the one
    /// current then, and is refused at registration if a reload revoked its server meanwhile).
    tls: crate::tls::LiveTls,
    /// Where refusals are counted.
    refused: Arc<Mutex<ControllerStatus>>,
    /// Connections refused or cut, each [`Cut`] logged at most once a second (a peer can make them as fast
    /// as it connects).
    log: Arc<[crate::access::SparseLog; Cut::KINDS]>,
}

/// Why a connection was refused or cut, for its log line: each kind is logged at most once a second
/// ([`Admit::log`]), so that a flood of one kind leaves the others' first lines in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Outside `allow_networks`, or an `accept` that failed.
    Network,
    /// The TLS handshake failed, or no hello (or a bad one) came in time.
    Opening,
    /// The TLS identity is not in `allow_identities`.
    Identity,
    /// A hello naming no configured server.
    UnknownName,
    /// A hello the controller refused for its server: connected already, or revoked by a reload. A kind
    /// of its own, so that a peer repeating a connected server's hello does not hide, in the same second,
    /// the line of a server whose name is wrong.
    Taken,
    /// A welcomed server's connection broke (a bad or oversized frame, the socket).
    Welcomed,
}

impl Cut {
    const KINDS: usize = 6;
}

impl Admit {
    /// Logs a connection refused or cut, at most once a second per kind (module comment, invariant 3).
    fn log_cut(&self, cut: Cut, peer: Option<SocketAddr>, what: &str) {
        if let Some(unlogged) = self.log[cut as usize].due() {
            match peer {
                Some(peer) => tracing::warn!(%peer, unlogged, "pShift controller: {what}"),
                None => tracing::warn!(unlogged, "pShift controller: {what}"),
            }
        }
    }
}

/// Connections from one address that have not been welcomed yet, at most: this many or one per configured
/// server, whichever is more (all the servers may run on one host, as under `rein cluster`). The
/// controller has a slot for each server and 16 more, taken at the accept and held through the TLS
/// handshake and the hello (up to [`HELLO_TIMEOUT`]), so silent connections from one address that
/// reconnected when cut held every slot, and the servers waited for ever (a reviewer's run: 80 of them,
/// a server not welcomed in 66 s); now one address leaves at least 16 slots to the others.
pub const OPENING_PER_ADDRESS: usize = 2;

/// The connections from each address not welcomed yet, at most `.1` ([`OPENING_PER_ADDRESS`]).
#[derive(Clone, Default)]
struct Opening(Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>, usize);

/// One connection's place in [`Opening`], given back when dropped (welcomed, or ended).
struct OpeningSlot(Opening, std::net::IpAddr);

impl Opening {
    fn take(&self, ip: std::net::IpAddr) -> Option<OpeningSlot> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= self.1.max(OPENING_PER_ADDRESS) {
            return None;
        }
        *n += 1;
        Some(OpeningSlot(self.clone(), ip))
    }
}

impl Drop for OpeningSlot {
    fn drop(&mut self) {
        let mut m = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    admit: Admit,
    ev: mpsc::Sender<Event>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(admit.names.len() + 16));
    let opening = Opening(Arc::default(), admit.names.len());
    // The network at accept; an identity after the TLS handshake (`connection`).
    let networks = crate::access::ExportAccess { networks: admit.access.networks.clone(), identities: None };
    let mut conn = 0u64;
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let (sock, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                admit.log_cut(Cut::Network, None, &format!("accept: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if !networks.allows(peer.ip(), None) {
            count_refused(&admit.refused);
            let why = format!("connection refused: {} is not in allow_networks", peer.ip());
            admit.log_cut(Cut::Network, Some(peer), &why);
            continue;
        }
        let Some(slot) = opening.take(peer.ip()) else {
            count_refused(&admit.refused);
            let why = format!("connection refused: {} has as many connections not welcomed yet as it may", peer.ip());
            admit.log_cut(Cut::Opening, Some(peer), &why);
            continue;
        };
        conn += 1;
        let (admit, ev, stop) = (admit.clone(), ev.clone(), stop.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = connection(sock, conn, &admit, ev, stop, slot).await {
                admit.log_cut(e.cut(), Some(peer), &format!("connection closed: {e}"));
            }
        });
    }
}

/// Why the controller refused a server's hello ([`Event::Joined`]'s verdict): its name is live on another
/// connection. Its text is the Refuse frame's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "server {name:?} is connected already, from {from} (are two servers configured with this name?); a second \
     connection is taken only once the first has been silent for {} s",
    live_within.as_secs()
)]
struct Taken {
    /// The server's name.
    name: String,
    /// The live connection's peer.
    from: SocketAddr,
    /// How recent its last frame is, at most, for it to count as live ([`LIVE_WITHIN`]).
    live_within: Duration,
}

/// Why a server's connection ended ([`connection`]); the accept loop logs it as "connection closed:
/// {this}", under its kind of cut ([`ConnectionError::cut`]). A refused hello's text is also the Refuse
/// frame's reason.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    /// The peer's address could not be read.
    #[error(transparent)]
    Peer(std::io::Error),
    /// The TLS handshake failed.
    #[error("TLS handshake: {0}")]
    TlsHandshake(#[source] crate::tls::TlsError),
    /// A reload revoked the peer's credential while its handshake ran (as `crate::tls` words it).
    #[error("{why}")]
    TlsRevoked {
        /// Why, as the TLS layer says it.
        why: String,
    },
    /// The TLS identity is not in `allow_identities`.
    #[error("identity {identity:?} is not in allow_identities")]
    IdentityNotAllowed {
        /// The identity presented.
        identity: String,
    },
    /// The TLS peer presented no identity, and `allow_identities` is set.
    #[error("the TLS peer has no identity (PSK identity or certificate CN) for allow_identities")]
    NoIdentity,
    /// The hello could not be read.
    #[error(transparent)]
    Hello(crate::pshift_link::ReadFrameError),
    /// No hello (with the TLS handshake) within [`HELLO_TIMEOUT`].
    #[error("no hello within {} s", timeout.as_secs())]
    HelloTimeout {
        /// The bound ([`HELLO_TIMEOUT`]).
        timeout: Duration,
    },
    /// The first frame was not a hello.
    #[error("expected a hello, got a {got}")]
    NotHello {
        /// The frame's name ([`Message::name`]).
        got: &'static str,
    },
    /// A hello naming no configured server.
    #[error("no server named {name:?} in the controller's configuration")]
    UnknownName {
        /// The name in the hello.
        name: String,
    },
    /// A hello for a server bound to an identity (`identity`) from a peer presenting another, or none.
    #[error("server {name} connects with identity {want:?} only, not {}", shown(presented.as_deref()))]
    WrongIdentity {
        /// The server's name.
        name: String,
        /// The identity it is bound to.
        want: String,
        /// The identity presented, if any.
        presented: Option<String>,
    },
    /// The controller refused the hello: the server's name is live on another connection.
    #[error(transparent)]
    Taken(Taken),
    /// A frame to the welcomed server was not written.
    #[error(transparent)]
    Send(FrameSendError),
    /// A frame from the welcomed server could not be read (bad, over the bound, the socket, closed).
    #[error(transparent)]
    Read(crate::pshift_link::ReadFrameError),
    /// The welcomed server sent no frame within the silence timeout.
    #[error(
        "server {name:?} sent no frame within {} s (a server pings every {} ms)",
        silence.as_secs_f64(),
        crate::pshift_link::PING_EVERY.as_millis()
    )]
    Silent {
        /// The server's name.
        name: String,
        /// The silence timeout (`silence_timeout_ms`).
        silence: Duration,
    },
}

/// An identity as [`ConnectionError::WrongIdentity`] names it: quoted, or "none".
fn shown(identity: Option<&str>) -> String {
    identity.map_or_else(|| "none".to_string(), |p| format!("{p:?}"))
}

impl ConnectionError {
    /// The kind of cut it is logged under.
    fn cut(&self) -> Cut {
        match self {
            ConnectionError::Peer(_)
            | ConnectionError::TlsHandshake(_)
            | ConnectionError::TlsRevoked { .. }
            | ConnectionError::Hello(_)
            | ConnectionError::HelloTimeout { .. }
            | ConnectionError::NotHello { .. } => Cut::Opening,
            ConnectionError::IdentityNotAllowed { .. }
            | ConnectionError::NoIdentity
            | ConnectionError::WrongIdentity { .. } => Cut::Identity,
            ConnectionError::UnknownName { .. } => Cut::UnknownName,
            ConnectionError::Taken(_) => Cut::Taken,
            ConnectionError::Send(_) | ConnectionError::Read(_) | ConnectionError::Silent { .. } => Cut::Welcomed,
        }
    }
}

/// One server's connection: (TLS,) hello, welcome, then frames both ways.
async fn connection(
    sock: TcpStream,
    conn: u64,
    admit: &Admit,
    ev: mpsc::Sender<Event>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    not_welcomed: OpeningSlot,
) -> Result<(), ConnectionError> {
    let (names, buckets, limited, strays) = (&admit.names, &admit.buckets, &admit.limited, admit.strays);
    let _ = sock.set_nodelay(true);
    let peer = sock.peer_addr().map_err(ConnectionError::Peer)?;
    let mut buf = Vec::new();
    // The TLS handshake (with `[tls]`) and the hello within HELLO_TIMEOUT.
    // Listed with `[tls]` while the connection lives, so that a reload that revokes its server cuts it.
    let mut registration: Option<crate::tls::Registration> = None;
    let opened = async {
        let mut presented = None;
        let stream: crate::pshift_link::Stream = match &admit.tls.get() {
            None => Box::new(sock),
            Some(tls) => {
                let (stream, identity) = tls.accept(sock).await.map_err(ConnectionError::TlsHandshake)?;
                // A duplicate of the socket to cut it by (its own descriptor stays with the stream).
                let fd = std::os::fd::AsFd::as_fd(stream.get_ref()).try_clone_to_owned().ok();
                // Refused if a reload revoked the server while its handshake ran (crate::tls, "Reload").
                if let Some(fd) = fd {
                    registration = admit
                        .tls
                        .register(stream.ssl(), peer.to_string(), fd)
                        .map_err(|why| ConnectionError::TlsRevoked { why })?;
                }
                if !admit.access.allows(peer.ip(), identity.as_deref()) {
                    count_refused(&admit.refused);
                    return Err(match identity {
                        Some(identity) => ConnectionError::IdentityNotAllowed { identity },
                        None => ConnectionError::NoIdentity,
                    });
                }
                presented = identity;
                Box::new(stream)
            }
        };
        let (mut rd, wr) = tokio::io::split(stream);
        let hello = crate::pshift_link::read_frame_within(&mut rd, &mut buf, HELLO_MAX_BODY)
            .await
            .map_err(ConnectionError::Hello)?;
        Ok::<_, ConnectionError>((rd, wr, hello, presented))
    };
    let (mut rd, mut wr, hello, presented) = tokio::time::timeout(HELLO_TIMEOUT, opened)
        .await
        .map_err(|_| ConnectionError::HelloTimeout { timeout: HELLO_TIMEOUT })??;
    let _registration = registration;
    let Message::Hello { name } = hello else {
        return Err(ConnectionError::NotHello { got: hello.name() });
    };
    let Some(index) = names.iter().position(|n| *n == name) else {
        count_refused(&admit.refused);
        let e = ConnectionError::UnknownName { name };
        let _ = crate::pshift_link::write_frame(&mut wr, &Message::Refuse { reason: e.to_string() }).await;
        return Err(e);
    };
    // A server bound to an identity (`identity`): another identity that `allow_identities` admits may not
    // say hello as it (and report for it, or keep it out as "connected already").
    if let Some(want) = &admit.identities[index] {
        if presented.as_deref() != Some(want.as_str()) {
            count_refused(&admit.refused);
            let e = ConnectionError::WrongIdentity { name, want: want.clone(), presented };
            let _ = crate::pshift_link::write_frame(&mut wr, &Message::Refuse { reason: e.to_string() }).await;
            return Err(e);
        }
    }
    // The controller's verdict before the welcome (frames it queues meanwhile wait in `rx`).
    let (tx, mut rx) = mpsc::channel::<Message>(WRITER_QUEUE);
    let (verdict_tx, verdict) = tokio::sync::oneshot::channel();
    if ev.send(Event::Joined { index, conn, peer, tx, verdict: verdict_tx }).await.is_err() {
        return Ok(());
    }
    match verdict.await {
        Ok(Ok(())) => {}
        Ok(Err(taken)) => {
            count_refused(&admit.refused);
            let _ = crate::pshift_link::write_frame(&mut wr, &Message::Refuse { reason: taken.to_string() }).await;
            return Err(ConnectionError::Taken(taken));
        }
        Err(_) => return Ok(()),
    }
    // Welcomed: no more one of its address's connections not welcomed yet.
    drop(not_welcomed);
    let welcome =
        Message::Welcome { server: index as u32, strays, buckets: buckets.to_vec(), limited: limited.to_vec() };
    // The welcome first, then what the controller queued: each frame within the write timeout (a peer
    // that does not read, the welcome included, which may be larger than the socket's buffers).
    let write_timeout = admit.write_timeout;
    let mut writer = tokio::spawn(async move {
        write_within(&mut wr, &welcome, write_timeout).await?;
        while let Some(m) = rx.recv().await {
            write_within(&mut wr, &m, write_timeout).await?;
        }
        Ok::<(), FrameSendError>(())
    });
    let silence = admit.silence_timeout;
    let mut heard = tokio::time::Instant::now();
    let r = loop {
        let m = tokio::select! {
            // In this order: frames that came are read before silence is judged (after a stall of this
            // process, the server's pings wait in the socket).
            biased;
            // The controller dropped this connection (a refusal, a replacement): the connection ends here,
            // which closes the socket (the halves of a split stream close it only when both are gone); or
            // a write failed.
            w = &mut writer => break match w {
                Ok(Err(e)) => Err(ConnectionError::Send(e)),
                _ => Ok(()),
            },
            f = crate::pshift_link::read_frame_within(&mut rd, &mut buf, admit.max_body) => match f {
                Ok(m) => m,
                Err(e) => break Err(ConnectionError::Read(e)),
            },
            _ = stop.wait_for(|s| *s) => break Ok(()),
            // A server pings every PING_EVERY (100 ms): one silent this long is gone or hung, and gives
            // its place up (its status shows it disconnected; its index gets no report requests).
            _ = tokio::time::sleep_until(heard + silence) => break Err(ConnectionError::Silent { name: name.clone(), silence }),
        };
        // Waits while the controller's queue is full: this peer is read no faster than it is handled.
        if ev.send(Event::Frame { index, conn, m }).await.is_err() {
            break Ok(());
        }
        heard = tokio::time::Instant::now();
    };
    let _ = ev.send(Event::Left { index, conn }).await;
    writer.abort();
    r
}

/// Why a frame did not reach a server ([`write_within`]); its connection ends naming it.
#[derive(Debug, thiserror::Error)]
enum FrameSendError {
    /// The frame could not be written (the socket failed, or it does not encode).
    #[error("{frame} to the server: {source}")]
    Failed {
        /// The frame's name ([`Message::name`]).
        frame: &'static str,
        /// Why not.
        source: crate::pshift_link::WriteFrameError,
    },
    /// The server did not read it within the write timeout.
    #[error("a frame ({frame}) not written to the server within {} s (it does not read)", timeout.as_secs_f64())]
    NotRead {
        /// The frame's name ([`Message::name`]).
        frame: &'static str,
        /// The write timeout.
        timeout: Duration,
    },
}

/// Writes `m` within `timeout`; the error names the frame and the bound.
async fn write_within<W: tokio::io::AsyncWrite + Unpin>(
    wr: &mut W,
    m: &Message,
    timeout: Duration,
) -> Result<(), FrameSendError> {
    crate::pshift_link::write_frame_within(wr, m, timeout).await.map_err(|e| match e {
        Some(source) => FrameSendError::Failed { frame: m.name(), source },
        None => FrameSendError::NotRead { frame: m.name(), timeout },
    })
}

/// Why the controller's task closes a welcomed server's connection ([`Task::refuse`]), logged as
/// "pShift controller: {this}; closing its connection".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum CutFrame {
    /// Its writer's queue is full: the server does not read.
    #[error("its connection is {frames} frames behind (not reading)")]
    Behind {
        /// The queue's bound ([`WRITER_QUEUE`]).
        frames: usize,
    },
    /// A report naming another server.
    #[error("a report naming server {named} on server {on}'s connection")]
    ReportForAnother {
        /// The server the report names.
        named: u32,
        /// The server whose connection it came on.
        on: usize,
    },
    /// A stray note naming another server.
    #[error("a stray note naming server {named} on server {on}'s connection")]
    StrayForAnother {
        /// The server the note names.
        named: u32,
        /// The server whose connection it came on.
        on: usize,
    },
    /// A hello after the welcome.
    #[error("a second hello (a server says hello once, before its welcome)")]
    SecondHello,
    /// A frame only a controller sends.
    #[error("a {frame} frame, which only a controller sends")]
    ControllerFrame {
        /// The frame's name ([`Message::name`]).
        frame: &'static str,
    },
}

impl CutFrame {
    /// Why frame `m`, which the controller does not take from server `index` (a report or a stray note
    /// naming another server, or a frame a server does not send), closes its connection.
    fn of(index: usize, m: &Message) -> CutFrame {
        match m {
            Message::Report(r) => CutFrame::ReportForAnother { named: r.server, on: index },
            Message::Stray(s) => CutFrame::StrayForAnother { named: s.server, on: index },
            Message::Hello { .. } => CutFrame::SecondHello,
            m => CutFrame::ControllerFrame { frame: m.name() },
        }
    }
}

/// A server's connection, as the controller's task holds it.
struct Conn {
    /// The connection's number.
    id: u64,
    /// Its writer's queue.
    tx: mpsc::Sender<Message>,
    peer: SocketAddr,
    /// When its last frame (or its hello) came, on the controller's clock.
    heard: Nanos,
}

struct Task {
    ctl: Controller,
    clock: Clock,
    /// When the schedule started on `clock` (`None`: held, waiting for a start request). The controller's
    /// times are from here.
    origin: Option<Nanos>,
    /// Per server: its connection.
    conns: Vec<Option<Conn>>,
    status: Arc<Mutex<ControllerStatus>>,
    periods: Arc<Mutex<PeriodsStatus>>,
    /// The boundary whose reports were asked for.
    requested: Option<u64>,
    names: Arc<Vec<String>>,
    /// Per server, the lines its peer can repeat as fast as it writes or reconnects, each kind at most
    /// once a second.
    logs: Vec<ServerLogs>,
}

/// One server's lines that its peer can repeat at will (module comment, invariant 3), each kind logged at
/// most once a second, the next line with the number not logged (`unlogged`). A peer that said hello as a
/// server and then sent a frame the controller cuts it for (a second hello, a note naming another
/// server), or a broken one, and said hello again at once, logged two or three lines a connection:
/// 15,884 connections in 5 s, as many warnings and as many lines more.
#[derive(Default)]
struct ServerLogs {
    /// A report refused (a round or bucket the controller does not have).
    report: crate::access::SparseLog,
    /// A note refused.
    note: crate::access::SparseLog,
    /// The connection closed by the controller ([`Task::refuse`]: a frame it does not take from a server,
    /// a connection that does not read).
    cut: crate::access::SparseLog,
    /// A connection welcomed.
    joined: crate::access::SparseLog,
    /// A welcomed connection ended.
    left: crate::access::SparseLog,
}

impl Task {
    /// The controller's time: since the schedule's origin.
    fn now(&self, origin: Nanos) -> Nanos {
        self.clock.now().saturating_sub(origin)
    }

    async fn run(mut self, mut ev: mpsc::Receiver<Event>) {
        loop {
            let Some(origin) = self.origin else {
                // Held: nothing is due until the start request.
                match ev.recv().await {
                    Some(e) => self.event(e),
                    None => return,
                }
                continue;
            };
            let due = match self.requested {
                // Half an interval after the boundary, polling lets the controller compute without the
                // missing reports.
                Some(r) if r == self.ctl.round() => {
                    self.ctl.boundary().saturating_add(self.ctl.config().report_timeout)
                }
                _ => self.ctl.boundary(),
            };
            tokio::select! {
                e = ev.recv() => match e {
                    Some(e) => self.event(e),
                    None => return,
                },
                _ = tokio::time::sleep_until(self.clock.instant(due.saturating_add(origin))) => {}
            }
            let Some(origin) = self.origin else { continue };
            let now = self.now(origin);
            let round = self.ctl.round();
            if now >= self.ctl.boundary() && self.requested != Some(round) {
                self.requested = Some(round);
                self.broadcast(&Message::ReportRequest { round, early: 0 });
            }
            self.answer(now);
        }
    }

    fn broadcast(&mut self, m: &Message) {
        for index in 0..self.conns.len() {
            self.send(index, m.clone());
        }
    }

    /// Queues `m` for server `index`'s connection, if it has one; a connection [`WRITER_QUEUE`] frames
    /// behind is closed.
    fn send(&mut self, index: usize, m: Message) {
        let Some(Some(Conn { tx, .. })) = self.conns.get(index) else { return };
        if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(m) {
            self.refuse(index, CutFrame::Behind { frames: WRITER_QUEUE });
        }
    }

    fn refuse(&mut self, index: usize, why: CutFrame) {
        if let Some(unlogged) = self.logs[index].cut.due() {
            tracing::warn!(server = %self.names[index], unlogged, "pShift controller: {why}; closing its connection");
        }
        self.conns[index] = None;
        count_refused(&self.status);
    }

    fn event(&mut self, e: Event) {
        match e {
            Event::Start(at) => {
                if self.origin.is_none() {
                    self.origin = Some(at);
                    self.status.lock().unwrap_or_else(|e| e.into_inner()).origin_s = Some(at.as_secs_f64());
                    tracing::info!("pShift controller: schedule started");
                }
            }
            Event::Joined { index, conn, peer, tx, verdict } => {
                let now = self.clock.now();
                if let Some(old) = &self.conns[index] {
                    if now.saturating_sub(old.heard) < Nanos::from_duration(LIVE_WITHIN) {
                        let _ = verdict.send(Err(Taken {
                            name: self.names[index].clone(),
                            from: old.peer,
                            live_within: LIVE_WITHIN,
                        }));
                        return;
                    }
                    tracing::warn!(server = %self.names[index], old = %old.peer, new = %peer, "pShift server connected again: the new connection replaces the old, silent one");
                }
                if verdict.send(Ok(())).is_err() {
                    return; // the connection is gone
                }
                self.conns[index] = Some(Conn { id: conn, tx, peer, heard: now });
                if let Some(unlogged) = self.logs[index].joined.due() {
                    tracing::info!(server = %self.names[index], index, %peer, unlogged, "pShift server connected");
                }
                // A server that joins after this boundary's request still reports it.
                if let Some(round) = self.requested.filter(|&r| r == self.ctl.round()) {
                    self.send(index, Message::ReportRequest { round, early: 0 });
                }
                self.status.lock().unwrap_or_else(|e| e.into_inner()).servers[index].1 = true;
            }
            Event::Left { index, conn } => {
                if self.conns[index].as_ref().is_some_and(|c| c.id == conn) {
                    self.conns[index] = None;
                    if let Some(unlogged) = self.logs[index].left.due() {
                        tracing::warn!(server = %self.names[index], unlogged, "pShift server disconnected");
                    }
                    self.status.lock().unwrap_or_else(|e| e.into_inner()).servers[index].1 = false;
                }
            }
            Event::Frame { index, conn, m } => {
                let now = self.clock.now();
                match &mut self.conns[index] {
                    Some(c) if c.id == conn => c.heard = now,
                    _ => return, // a replaced connection's late frame
                }
                if let Message::Ping { t0 } = m {
                    let pong = self.pong(t0);
                    self.send(index, pong);
                    return;
                }
                let Some(origin) = self.origin else {
                    // Held: no report was asked for and no early round can start; the frame is dropped.
                    return;
                };
                let now = self.now(origin);
                match m {
                    Message::Report(r) if r.server as usize == index => {
                        let late = self.ctl.late_reports_counted();
                        if let Err(e) = self.ctl.handle_report(r) {
                            if let Some(unlogged) = self.logs[index].report.due() {
                                tracing::warn!(server = %self.names[index], unlogged, "pShift controller: report refused: {e}");
                            }
                            count_refused(&self.status);
                        } else if self.ctl.late_reports_counted() > late {
                            tracing::debug!(server = %self.names[index], "pShift controller: a late report counted");
                            self.sync_status(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
                            // It may have finished a period that waited for it.
                            let closed = self.ctl.take_closed();
                            self.keep_periods(now, &closed);
                        }
                    }
                    Message::Stray(s) if s.server as usize == index => match self.ctl.handle_stray(now, s) {
                        Ok(Some((round, early))) => self.broadcast(&Message::ReportRequest { round, early }),
                        Ok(None) => {}
                        Err(e) => {
                            if let Some(unlogged) = self.logs[index].note.due() {
                                tracing::warn!(server = %self.names[index], unlogged, "pShift controller: note refused: {e}");
                            }
                            count_refused(&self.status);
                        }
                    },
                    other => {
                        // Named: "unexpected report (or one naming another server)" left the reader to guess
                        // which, and whose.
                        self.refuse(index, CutFrame::of(index, &other))
                    }
                }
            }
        }
    }

    /// Sends every answer the controller has now.
    ///
    /// Rounds answered in one call (the rounds a stall of this process missed, computed one after
    /// another with their reports missing) send each server only its newest message: a message sets the
    /// server's tokens whole (a bucket it does not list has none), so an older one would be overwritten
    /// on arrival. Before, each missed round sent its own, and a stall of more than [`WRITER_QUEUE`]
    /// intervals closed every server's connection as not reading.
    fn answer(&mut self, now: Nanos) {
        let mut newest = std::collections::BTreeMap::new();
        let mut rounds = 0u64;
        while let Some((msgs, summary)) = self.ctl.poll(now) {
            for m in msgs {
                newest.insert(m.server, m);
            }
            self.record(now, &summary);
            rounds += 1;
        }
        if rounds > 2 {
            tracing::warn!(
                rounds,
                "pShift controller: {rounds} rounds were due at once (this process did not run for their \
                 intervals: stopped, or a paused VM); they were computed with the reports they had, and each \
                 server gets the newest answer only"
            );
        }
        for (server, m) in newest {
            self.send(server as usize, Message::Tokens(m));
        }
        let mut st = self.status.lock().unwrap_or_else(|e| e.into_inner());
        st.round = self.ctl.round();
    }

    /// The answer to a ping sent at `t0`: this clock now, and the next boundary whose report is not
    /// asked for yet (on this clock; none while the schedule is held).
    fn pong(&self, t0: u64) -> Message {
        let tau = self.ctl.boundary_of(1).0 - self.ctl.boundary_of(0).0;
        let (next_round, next_ns) = match self.origin {
            None => (0, 0),
            Some(origin) => {
                let round = self.ctl.round() + u64::from(self.requested == Some(self.ctl.round()));
                (round, origin.0 + self.ctl.boundary_of(round).0)
            }
        };
        Message::Pong { t0, t1: self.clock.now().0, next_round, next_ns, interval_ns: tau }
    }

    /// The status's view of the controller: each bucket's IOs in the period and closed periods, and the
    /// late reports counted (after a round, and after a late report changed them).
    fn sync_status(&self, st: &mut ControllerStatus) {
        for ((b, &d), t) in st.buckets.iter_mut().zip(self.ctl.done()).zip(self.ctl.periods()) {
            b.done = d;
            b.periods = (*t).into();
        }
        st.late_reports = self.ctl.late_reports_counted();
    }

    fn record(&mut self, now: Nanos, r: &RoundSummary) {
        tracing::debug!(
            round = r.round,
            early = r.early,
            wanted = r.wanted,
            missing = r.reports_missing,
            "pShift round"
        );
        let mut st = self.status.lock().unwrap_or_else(|e| e.into_inner());
        self.sync_status(&mut st);
        st.push_round(RoundRecord::new(now, r));
        drop(st);
        self.keep_periods(now, &r.closed);
    }

    /// Adds closed periods' records to `/api/pshift/periods`.
    fn keep_periods(&self, now: Nanos, closed: &[ClosedPeriod]) {
        if closed.is_empty() {
            return;
        }
        let mut periods = self.periods.lock().unwrap_or_else(|e| e.into_inner());
        for c in closed {
            periods.push(PeriodRecord::new(now, c));
        }
    }
}

/// What the controller's admin API controls, as the refusal of an address without a token says it.
pub const ADMIN_POWERS: crate::admin_guard::Powers =
    crate::admin_guard::Powers("read every server's and bucket's state and, under hold, start the schedule");

/// What the controller's `/metrics` shows beside its own status: the build, the start and the reloads
/// (of `[tls]`), the certificates it presents, the admin listener's failed accepts.
struct MetricsParts {
    started: Arc<crate::reloads::Reloads>,
    presented: crate::tls::Presented,
    admin_accepts: Arc<crate::access::AcceptPacing>,
}

/// `hold`: whether the schedule waits for `PUT /api/pshift/start` (the file's `hold`).
fn admin_router(
    status: Arc<Mutex<ControllerStatus>>,
    periods: Arc<Mutex<PeriodsStatus>>,
    clock: Clock,
    ev: mpsc::Sender<Event>,
    hold: bool,
    parts: MetricsParts,
) -> axum::Router {
    let for_metrics = status.clone();
    let for_start = status.clone();
    axum::Router::new()
        .route(
            "/api/pshift/start",
            axum::routing::put(move || {
                // Under `hold`, the first request starts the schedule; later ones are refused, naming when
                // it started, and any without hold saying that it is not held.
                let mut s = for_start.lock().unwrap_or_else(|e| e.into_inner());
                let (r, start) = match s.origin_s {
                    Some(_) if !hold => (
                        Err((
                            axum::http::StatusCode::CONFLICT,
                            "this controller is not held (no hold = true in its file): its schedule started with \
                             it and runs; there is nothing to start (to start a schedule on request, set hold = true \
                             and restart the controller)\n"
                                .to_string(),
                        )),
                        None,
                    ),
                    Some(at) => (
                        Err((
                            axum::http::StatusCode::CONFLICT,
                            format!(
                                "the schedule started {at:.3} s after the controller; it cannot start again (a new \
                                 schedule needs a restart of the controller)\n"
                            ),
                        )),
                        None,
                    ),
                    None => {
                        let at = clock.now();
                        s.origin_s = Some(at.as_secs_f64());
                        (Ok(axum::Json(serde_json::json!({ "started": true, "origin_s": at.as_secs_f64() }))), Some(at))
                    }
                };
                drop(s);
                let ev = ev.clone();
                async move {
                    if let Some(at) = start {
                        // In a task of its own: a client that hangs up while the queue is full does not
                        // lose the start its request recorded.
                        let _ = tokio::spawn(async move { ev.send(Event::Start(at)).await }).await;
                    }
                    r
                }
            }),
        )
        .route(
            "/api/pshift",
            axum::routing::get(move || {
                let mut s = status.lock().unwrap_or_else(|e| e.into_inner()).clone();
                s.now_s = clock.now().as_secs_f64();
                async move { axum::Json(s) }
            }),
        )
        .route(
            "/api/pshift/periods",
            axum::routing::get(move || {
                // Serialized under the lock: the record can be a quarter-million counts.
                let body = serde_json::to_string(&*periods.lock().unwrap_or_else(|e| e.into_inner()));
                async move {
                    match body {
                        Ok(b) => Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], b)),
                        Err(e) => Err((axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(move || {
                let s = for_metrics.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let mut text = metrics_text(&s);
                parts.started.metrics(&mut text, true);
                parts.presented.metrics(&mut text);
                crate::stall::metrics(&mut text);
                parts.admin_accepts.admin_metrics(&mut text);
                async move { text }
            }),
        )
}

/// The controller's `/metrics`: rounds, connected servers, each bucket's IOs in the period and its closed
/// periods.
pub fn metrics_text(s: &ControllerStatus) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let connected = s.servers.iter().filter(|x| x.1).count();
    let _ = writeln!(o, "# HELP rein_pshift_round The next redistribution boundary's number.\n# TYPE rein_pshift_round gauge\nrein_pshift_round {}", s.round);
    let _ = writeln!(o, "# HELP rein_pshift_servers_connected Servers connected.\n# TYPE rein_pshift_servers_connected gauge\nrein_pshift_servers_connected {connected}");
    let _ = writeln!(
        o,
        "# HELP rein_pshift_servers Servers configured.\n# TYPE rein_pshift_servers gauge\nrein_pshift_servers {}",
        s.servers.len()
    );
    let _ = writeln!(o, "# HELP rein_pshift_refused_total Reports, notes or frames refused.\n# TYPE rein_pshift_refused_total counter\nrein_pshift_refused_total {}", s.refused);
    let _ = writeln!(o, "# HELP rein_pshift_late_reports_total Reports counted after their round was computed.\n# TYPE rein_pshift_late_reports_total counter\nrein_pshift_late_reports_total {}", s.late_reports);
    let _ = writeln!(o, "# HELP rein_pshift_bucket_done IOs of the bucket in the current QoS period (as of the last round).\n# TYPE rein_pshift_bucket_done gauge");
    for b in &s.buckets {
        let _ = writeln!(o, "rein_pshift_bucket_done{{bucket=\"{}\"}} {}", crate::prom::label(&b.name), b.done);
    }
    // Per bucket, its bounds and its last closed period's IOs, to graph one against the others.
    type Gauge = (&'static str, &'static str, fn(&BucketStatus) -> Option<u64>);
    let gauges: [Gauge; 3] = [
        ("reservation_ios", "R_i: IOs per QoS period.", |b| Some(b.reservation)),
        ("limit_ios", "L_i: IOs per QoS period (absent: unlimited).", |b| b.limit),
        (
            "last_period_ios",
            "IOs the bucket completed in the last closed QoS period, by the servers' counts (absent: none closed).",
            |b| b.periods.last,
        ),
    ];
    for (name, help, get) in gauges {
        let _ = writeln!(o, "# HELP rein_pshift_bucket_{name} {help}\n# TYPE rein_pshift_bucket_{name} gauge");
        for b in &s.buckets {
            if let Some(v) = get(b) {
                let _ = writeln!(o, "rein_pshift_bucket_{name}{{bucket=\"{}\"}} {v}", crate::prom::label(&b.name));
            }
        }
    }
    // The closed periods, as the servers counted them: alert on the rate of those below the reservation
    // with the demand for it, and above the limit.
    type Series = (&'static str, &'static str, fn(&BucketStatus) -> u64);
    let series: [Series; 5] = [
        ("periods_total", "QoS periods closed.", |b| b.periods.closed),
        (
            "periods_below_reservation_total",
            "Closed periods in which the bucket completed fewer IOs than its reservation, whatever its demand.",
            |b| b.periods.below_reservation,
        ),
        (
            "periods_below_reservation_with_demand_total",
            "Closed periods in which the bucket completed fewer IOs than its reservation though it asked for as many \
             (or was backlogged through an interval, holding requests from the period's start to its close): the \
             reservation missed.",
            |b| b.periods.below_reservation_with_demand,
        ),
        ("periods_above_limit_total", "Closed periods in which the bucket completed more IOs than its limit.", |b| {
            b.periods.above_limit
        }),
        ("periods_incomplete_total", "Closed periods with a server's report missing (not judged).", |b| {
            b.periods.incomplete
        }),
    ];
    for (name, help, get) in series {
        let _ = writeln!(o, "# HELP rein_pshift_bucket_{name} {help}\n# TYPE rein_pshift_bucket_{name} counter");
        for b in &s.buckets {
            let _ = writeln!(o, "rein_pshift_bucket_{name}{{bucket=\"{}\"}} {}", crate::prom::label(&b.name), get(b));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_model::pshift_settings::EstimatorError;

    /// `/api/pshift/periods` keeps the newest periods within its bound, and always the last one.
    #[test]
    fn closed_periods_are_kept_within_the_bound() {
        let rec = |period, buckets| PeriodRecord {
            at_s: 0.0,
            period,
            incomplete: false,
            completed: vec![7; buckets],
            demand: vec![Some(7); buckets],
        };
        let mut p = PeriodsStatus::default();
        let per = MAX_PERIOD_CELLS_KEPT / 4;
        for n in 0..10 {
            p.push(rec(n, per));
        }
        let kept: Vec<u64> = p.periods.iter().map(|r| r.period).collect();
        assert_eq!((kept, p.dropped), (vec![6, 7, 8, 9], 6));
        p.push(rec(10, MAX_PERIOD_CELLS_KEPT * 2));
        assert_eq!((p.periods.len(), p.periods[0].period, p.dropped), (1, 10, 10), "a period past the bound alone");
        p.push(rec(11, 0));
        assert_eq!(p.periods.len(), 2, "no buckets: counted as one cell");
    }
    /// ctl.toml's refusals, whole, as operators saw them when its validation returned strings.
    #[test]
    fn refusals_read_as_before() {
        let std = "listen = \"127.0.0.1:0\"\nperiod_s = 1\nintervals = 1\n";
        let server = "[[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n";
        let bucket = "[[buckets]]\nname = \"a\"\n";
        for (text, want) in [
            (
                format!("listen = \"x\"\nperiod_s = 1\nintervals = 1\n{server}"),
                "listen \"x\" is not an address (ip:port)".to_string(),
            ),
            (format!("{std}admin = \"y\"\n{server}"), "admin \"y\" is not an address (ip:port)".into()),
            (format!("{std}allow_networks = [\"\"]\n{server}"), "allow_networks has an empty entry".into()),
            (
                format!("{std}allow_networks = [\"z\"]\n{server}"),
                "allow_networks entry \"z\" is not a CIDR network (e.g. 10.0.0.0/8)".into(),
            ),
            (
                format!("{std}allow_identities = [\"i\"]\n{server}"),
                "allow_identities needs a [tls] table (an identity is a PSK identity or a client certificate's CN)"
                    .into(),
            ),
            (
                format!("{std}[tls]\n{server}"),
                "tls.mode = \"on\" or \"require\" needs tls.cert and tls.key, or tls.psk_file".into(),
            ),
            (format!("{std}admin_token_file = \"\"\n{server}"), "admin_token_file is empty".into()),
            (
                format!("listen = \"127.0.0.1:0\"\nperiod_s = 0\nintervals = 1\n{server}"),
                "period_s must be in [0.001, 86400], got 0".into(),
            ),
            (
                format!("listen = \"127.0.0.1:0\"\nperiod_s = 1\nintervals = 0\n{server}"),
                "intervals must be in 1..=1000, got 0".into(),
            ),
            (
                format!("listen = \"127.0.0.1:0\"\nperiod_s = 1\nintervals = 3\n{server}"),
                "period_s / intervals must be a whole number of nanoseconds (1 s / 3)".into(),
            ),
            (format!("{std}start_s = -1\n{server}"), "start_s must be in [0, 86400], got -1".into()),
            (
                format!("{std}estimator = \"x\"\n{server}"),
                "estimator \"x\": expected \"arrivals\" or \"backlog\"".into(),
            ),
            (
                format!("{std}approx_top = 0\n{server}"),
                "approx_top must be at least 1 (leave it out to solve exactly)".into(),
            ),
            (format!("{std}early_rounds = 101\n{server}"), "early_rounds must be in 0..=100, got 101".into()),
            (
                format!("{std}message_delay_ms = 10001\n{server}"),
                "message_delay_ms must be in [0, 10000], got 10001".into(),
            ),
            (std.to_string(), format!("[[servers]]: between 1 and {MAX_SERVERS} servers, got 0")),
            (
                format!("{std}[[servers]]\nname = \"\"\ncapacity_iops = 1\n"),
                format!("server name \"\" must be 1 to {MAX_NAME_LEN} bytes"),
            ),
            (format!("{std}{server}{server}"), "two servers are named \"s1\"".into()),
            (
                format!("{std}[[servers]]\nname = \"s1\"\ncapacity_iops = 0\n"),
                "server s1: capacity_iops must be in (0, 1e9], got 0".into(),
            ),
            (
                format!("{std}{server}identity = \"i\"\n"),
                "server s1: identity needs a [tls] table (it is checked on TLS links)".into(),
            ),
            (
                format!("{std}{server}[[buckets]]\nname = \"\"\n"),
                format!("bucket name \"\" must be 1 to {MAX_NAME_LEN} bytes"),
            ),
            (format!("{std}{server}{bucket}{bucket}"), "two buckets are named \"a\"".into()),
            (
                format!("{std}{server}{bucket}reservation_iops = -1\n"),
                "bucket a: reservation_iops must be in [0, 1e9], got -1".into(),
            ),
            (
                format!("{std}{server}{bucket}reservation_iops = 10\nlimit_iops = 5\n"),
                "bucket a: limit_iops must be in [reservation_iops, 1e9], got 5 (reservation 10)".into(),
            ),
        ] {
            let e = ControllerSettings::parse(&text, Path::new("ctl.toml")).map(|_| ()).expect_err(&text).to_string();
            assert_eq!(e, format!("ctl.toml: {want}"), "{text}");
        }
    }

    /// ctl.toml's refusals are typed: the key, the value and the bound; a server's or bucket's carries its
    /// name; the keys rein.toml has too are its [`SettingError`].
    #[test]
    fn refusals_are_typed_with_the_key_value_and_bound() {
        let invalid = |text: &str| match ControllerSettings::parse(text, Path::new("ctl.toml")) {
            Err(ControllerConfigError::Invalid { path, error }) => {
                assert_eq!(path, "ctl.toml");
                error
            }
            other => panic!("not refused as invalid: {:?}", other.map(|_| ())),
        };
        let std = "listen = \"127.0.0.1:0\"\nperiod_s = 1\nintervals = 1\n";
        let server = "[[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n";
        let bucket = "[[buckets]]\nname = \"a\"\n";
        let e = invalid(&format!("{std}admin = \"y\"\n{server}"));
        assert!(matches!(&e, ControllerSettingError::Address { key: "admin", text } if text == "y"), "{e:?}");
        let e = invalid(&format!(
            "listen = \"127.0.0.1:7800\"\nadmin = \"0.0.0.0:7800\"\nperiod_s = 1\nintervals = 1\n{server}"
        ));
        assert!(
            matches!(e, ControllerSettingError::Setting(SettingError::SamePort { what: "the pShift link", .. })),
            "{e:?}"
        );
        let e = invalid(&format!("listen = \"127.0.0.1:0\"\nperiod_s = 1\nintervals = 1001\n{server}"));
        assert!(
            matches!(
                e,
                ControllerSettingError::Setting(SettingError::Range { key: "intervals", min: 1, max: 1000, got: 1001 })
            ),
            "{e:?}"
        );
        let e = invalid(&format!("{std}allow_networks = [\"z\"]\n{server}"));
        assert!(matches!(&e, ControllerSettingError::Access(AccessError::Network { entry }) if entry == "z"), "{e:?}");
        let e = invalid(&format!("listen = \"127.0.0.1:0\"\nperiod_s = 86401\nintervals = 1\n{server}"));
        assert!(
            matches!(e, ControllerSettingError::Interval { key: "period_s", min, max, got } if min == 0.001 && max == 86_400.0 && got == 86_401.0),
            "{e:?}"
        );
        let e = invalid(&format!("{std}message_delay_ms = -1\n{server}"));
        assert!(matches!(e, ControllerSettingError::Interval { key: "message_delay_ms", .. }), "{e:?}");
        let e = invalid(&format!("listen = \"127.0.0.1:0\"\nperiod_s = 1\nintervals = 3\n{server}"));
        assert!(
            matches!(e, ControllerSettingError::IntervalTicks { period_s, intervals: 3 } if period_s == 1.0),
            "{e:?}"
        );
        let e = invalid(&format!("{std}estimator = \"psychic\"\n{server}"));
        assert!(
            matches!(&e, ControllerSettingError::Estimator(EstimatorError::Unknown { prefix: "", got }) if got == "psychic"),
            "{e:?}"
        );
        let e = invalid(std);
        assert!(matches!(e, ControllerSettingError::Servers { max: MAX_SERVERS, got: 0 }), "{e:?}");
        let e = invalid(&format!("{std}{server}[[buckets]]\nname = \"{}\"\n", "b".repeat(MAX_NAME_LEN + 1)));
        assert!(
            matches!(&e, ControllerSettingError::Name { what: "bucket", name, max: MAX_NAME_LEN } if name.len() == MAX_NAME_LEN + 1),
            "{e:?}"
        );
        let e = invalid(&format!("{std}[[servers]]\nname = \"s1\"\ncapacity_iops = 2e9\n"));
        assert!(
            matches!(&e, ControllerSettingError::Server { server, error: ServerSettingError::Capacity { got } } if server == "s1" && *got == 2e9),
            "{e:?}"
        );
        let e = invalid(&format!("{std}{server}identity = \"i\"\n"));
        assert!(
            matches!(&e, ControllerSettingError::Server { error: ServerSettingError::IdentityWithoutTls, .. }),
            "{e:?}"
        );
        let e = invalid(&format!("{std}{server}{bucket}reservation_iops = 10\nlimit_iops = 5\n"));
        assert!(
            matches!(&e, ControllerSettingError::Bucket { bucket, error: BucketSettingError::Limit { got, reservation } } if bucket == "a" && *got == 5.0 && *reservation == 10.0),
            "{e:?}"
        );
        let e = invalid(&format!("{std}{server}{bucket}{bucket}"));
        assert!(matches!(&e, ControllerSettingError::RepeatedBucket { name } if name == "a"), "{e:?}");
    }

    /// More servers x buckets than a round's instance takes is a configuration error: a round with demand
    /// for every bucket at every server panicked the controller (1,024 x 8,193 was accepted).
    #[test]
    fn servers_times_buckets_is_bounded() {
        let mut text = "listen = \"127.0.0.1:0\"\nperiod_s = 1\nintervals = 1\n".to_string();
        for i in 0..1024 {
            text.push_str(&format!("[[servers]]\nname = \"s{i}\"\ncapacity_iops = 1000\n"));
        }
        let per = MAX_ENTRIES / 1024;
        for i in 0..=per {
            text.push_str(&format!("[[buckets]]\nname = \"b{i}\"\n"));
        }
        let e = ControllerSettings::parse(&text, Path::new("ctl.toml")).unwrap_err().to_string();
        assert!(e.contains("1024 servers x 8193 buckets: at most 8388608"), "{e}");
        let cut = text.rfind("[[buckets]]").unwrap();
        assert!(ControllerSettings::parse(&text[..cut], Path::new("ctl.toml")).is_ok(), "8,192 buckets fit");
    }

    /// `--check-config`'s refusal (an admin token file that cannot be read) and a frame not written to a
    /// server (the socket failed; the server does not read) name what is wrong once, as before.
    #[tokio::test(start_paused = true)]
    async fn check_and_write_refusals_read_as_before() {
        let text = format!("admin = \"127.0.0.225:0\"\nadmin_token_file = \"missing.token\"\n{CTL}");
        let e = ControllerSettings::parse(&text, Path::new("ctl.toml")).unwrap().check().unwrap_err();
        let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert!(matches!(e, crate::admin_guard::AdminGuardError::TokenRead { .. }), "{e:?}");
        assert_eq!(e.to_string(), format!("admin token file missing.token: {enoent}"));
        let ping = Message::Ping { t0: 1 };
        let e = write_within(&mut crate::testkit::Failing, &ping, Duration::from_secs(2)).await.unwrap_err();
        assert!(matches!(e, FrameSendError::Failed { frame: "ping", .. }), "{e:?}");
        assert_eq!(e.to_string(), "ping to the server: write: the socket failed");
        let (mut full, _reader) = tokio::io::duplex(8);
        let e = write_within(&mut full, &ping, Duration::from_millis(2500)).await.unwrap_err();
        assert!(matches!(e, FrameSendError::NotRead { frame: "ping", timeout } if timeout.as_millis() == 2500));
        assert_eq!(e.to_string(), "a frame (ping) not written to the server within 2.5 s (it does not read)");
    }

    /// `listen` and `admin` on one port are refused, as rein serve's and rein gateway's are (a wildcard
    /// covering the other address too): before, both passed `--check-config` and the start failed with
    /// "Address already in use".
    #[test]
    fn listen_and_admin_on_one_port_are_refused() {
        let with = |listen: &str, admin: &str| {
            let text = CTL.replace("127.0.0.1:0", listen);
            ControllerSettings::parse(&format!("admin = \"{admin}\"\n{text}"), Path::new("ctl.toml"))
        };
        let e = with("127.0.0.1:7800", "127.0.0.1:7800").unwrap_err().to_string();
        assert!(
            e.contains("listen 127.0.0.1:7800 and admin 127.0.0.1:7800 take the same port: the pShift link"),
            "{e}"
        );
        assert!(with("0.0.0.0:7800", "127.0.0.1:7800").unwrap_err().to_string().contains("take the same port"));
        assert!(with("127.0.0.1:7800", "127.0.0.1:7801").is_ok());
        assert!(with("127.0.0.1:0", "127.0.0.1:0").is_ok(), "port 0 is a free port each");
    }
    use crate::pshift_link::{read_frame, write_frame};
    use rein_core::pshift::{BucketReport, ServerReport, Tokens};

    const CTL: &str = "listen = \"127.0.0.1:0\"\nperiod_s = 0.5\nintervals = 5\nstart_s = 0.1\nearly_rounds = 0\n\
                       [[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n[[servers]]\nname = \"s2\"\ncapacity_iops = 1000\n\
                       [[buckets]]\nname = \"a\"\nreservation_iops = 200\n[[buckets]]\nname = \"b\"\nlimit_iops = 100\n";

    /// Starts a controller with `s`: its address, the sender that stops it, and its task.
    async fn start(
        s: ControllerSettings,
    ) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), String>>) {
        let (addr, _, stop_tx, task) = start_admin(s).await;
        (addr, stop_tx, task)
    }

    /// As [`start`], with the admin address.
    async fn start_admin(
        s: ControllerSettings,
    ) -> (SocketAddr, Option<SocketAddr>, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), String>>)
    {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let stop = async move {
            let _ = stop_rx.await;
        };
        let task = tokio::spawn(run(s, stop, Some(ready_tx), crate::activation::Passed::none(), None));
        let (addr, admin) = ready_rx.await.unwrap();
        (addr, admin, stop_tx, task)
    }

    /// Under `hold`, no boundary comes (no report request for three of its intervals) until
    /// `PUT /api/pshift/start`; the first boundary then follows `start_s` after it, and a second start is
    /// refused (409). Without an admin endpoint, configured or passed, a start under `hold` is refused
    /// before it serves (a file without `admin` is valid: a service manager may pass the admin socket).
    #[tokio::test]
    async fn a_held_schedule_starts_on_request() {
        let alone = ControllerSettings::parse(&format!("hold = true\n{CTL}"), Path::new("ctl.toml")).unwrap();
        let e = run(alone, std::future::pending(), None, crate::activation::Passed::none(), None).await.unwrap_err();
        assert!(e.contains("hold = true needs an admin endpoint"), "{e}");
        let text = format!("hold = true\nadmin = \"127.0.0.1:0\"\nadmin_insecure = true\n{CTL}");
        let s = ControllerSettings::parse(&text, Path::new("ctl.toml")).unwrap();
        let (addr, admin, stop_tx, task) = start_admin(s).await;
        let admin: crate::admin_client::AdminEndpoint = admin.unwrap().into();
        let (mut rd, _wr, mut buf, m) = hello(addr, "s1").await;
        assert!(matches!(m, Message::Welcome { server: 0, .. }), "{m:?}");
        // start_s = 0.1: unheld, the first request would come at 0.1 s.
        let early = tokio::time::timeout(Duration::from_millis(300), read_frame(&mut rd, &mut buf)).await;
        assert!(early.is_err(), "a held controller asked for a report: {early:?}");
        let st: ControllerStatus = crate::admin_client::get_json(&admin, None, "/api/pshift").await.unwrap();
        assert_eq!(st.origin_s, None);
        let asked = std::time::Instant::now();
        let body = serde_json::json!({});
        crate::admin_client::put_json(&admin, None, "/api/pshift/start", &body).await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut rd, &mut buf)).await.unwrap().unwrap();
        assert_eq!(m, Message::ReportRequest { round: 0, early: 0 });
        let waited = asked.elapsed();
        assert!(waited >= Duration::from_millis(95), "the first boundary came {waited:?} after the start, not 0.1 s");
        let again = crate::admin_client::put_json(&admin, None, "/api/pshift/start", &body).await.unwrap_err();
        assert!(again.to_string().contains("cannot start again"), "{again}");
        let st: ControllerStatus = crate::admin_client::get_json(&admin, None, "/api/pshift").await.unwrap();
        assert!(st.origin_s.is_some_and(|o| o > 0.25), "{:?}", st.origin_s);
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
    }

    /// `PUT /api/pshift/start` on a controller that is not held says so, and what to do, rather than
    /// when its schedule started (as if a start had come before); it starts nothing.
    #[tokio::test]
    async fn a_start_request_to_a_controller_not_held_says_it_is_not_held() {
        let text = CTL.replace("127.0.0.1:0", "127.0.0.237:0");
        let s =
            ControllerSettings::parse(&format!("admin = \"127.0.0.237:0\"\n{text}"), Path::new("ctl.toml")).unwrap();
        let (_, admin, stop_tx, task) = start_admin(s).await;
        let admin: crate::admin_client::AdminEndpoint = admin.unwrap().into();
        let body = serde_json::json!({});
        let e = crate::admin_client::put_json(&admin, None, "/api/pshift/start", &body).await.unwrap_err().to_string();
        assert!(e.contains("409") && e.contains("this controller is not held (no hold = true in its file)"), "{e}");
        assert!(e.contains("set hold = true and restart the controller") && !e.contains("started 0.000 s"), "{e}");
        let st: ControllerStatus = crate::admin_client::get_json(&admin, None, "/api/pshift").await.unwrap();
        assert_eq!(st.origin_s, Some(0.0));
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
    }

    /// Reservations above the servers' capacity and a file without buckets are valid, with a warning
    /// naming the numbers; reservations within it are not warned of.
    #[test]
    fn reservations_above_the_capacity_and_no_buckets_are_warned_of() {
        let parse = |t: &str| ControllerSettings::parse(t, Path::new("ctl.toml")).unwrap().warnings;
        assert!(parse(CTL).is_empty(), "{:?}", parse(CTL));
        let over = CTL.replace("reservation_iops = 200", "reservation_iops = 2500");
        assert_eq!(
            parse(&over),
            ["[[buckets]]: reservations total 2500 IOPS, above the reservable capacity of 2000 IOPS (the [[servers]]' \
              capacity_iops summed): not every bucket can get its reservation"]
        );
        let none = CTL.split("[[buckets]]").next().unwrap().to_string();
        let w = parse(&none);
        assert!(
            w.len() == 1 && w[0].starts_with("no [[buckets]]: the controller reserves and limits nothing"),
            "{w:?}"
        );
    }

    async fn hello(
        addr: SocketAddr,
        name: &str,
    ) -> (tokio::net::tcp::OwnedReadHalf, tokio::net::tcp::OwnedWriteHalf, Vec<u8>, Message) {
        let (mut rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
        write_frame(&mut wr, &Message::Hello { name: name.into() }).await.unwrap();
        let mut buf = Vec::new();
        let m = read_frame(&mut rd, &mut buf).await.unwrap();
        (rd, wr, buf, m)
    }

    /// A stall of the controller's process (the test holds the runtime's only thread for 2 s, 20
    /// intervals): the rounds it missed are computed at once, and the server gets the newest answer only.
    /// Before, each missed round sent its own (20 in a burst here), and a stall of more than
    /// `WRITER_QUEUE` intervals closed every connection as not reading.
    #[tokio::test]
    async fn rounds_missed_in_a_stall_send_the_newest_answer_only() {
        let s = ControllerSettings::parse(CTL, Path::new("ctl.toml")).unwrap();
        let (addr, stop_tx, task) = start(s).await;
        let (mut rd, _wr, mut buf, _) = hello(addr, "s1").await;
        // Two rounds at the usual pace (this server does not report: each is answered after half an
        // interval with its reports missing).
        let mut before = Vec::new();
        while before.len() < 2 {
            if let Message::Tokens(t) = read_frame(&mut rd, &mut buf).await.unwrap() {
                before.push(t.round);
            }
        }
        std::thread::sleep(Duration::from_secs(2));
        let mut after = Vec::new();
        let until = tokio::time::Instant::now() + Duration::from_millis(250);
        while let Ok(m) = tokio::time::timeout_at(until, read_frame(&mut rd, &mut buf)).await {
            if let Message::Tokens(t) = m.unwrap() {
                after.push(t.round);
            }
        }
        // The first answer after the stall is for a round near its end (20 intervals on), and at most a
        // round or two at the usual pace follow it in 250 ms.
        assert!(after.first().is_some_and(|&r| r >= before[1] + 15), "before {before:?}, after {after:?}");
        assert!(after.len() <= 4, "one answer per missed round: before {before:?}, after {after:?}");
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
    }

    /// A server says hello and is welcomed with its index and the buckets; at the boundary it is asked
    /// for its report, and the answer gives bucket a (demand here) its reservation's R-tokens for the
    /// period and the limited bucket b (no demand) nothing. An unknown name is refused by name; a report
    /// naming another server's index closes the connection and is counted.
    #[tokio::test]
    async fn reports_in_tokens_out_and_bad_peers_refused() {
        let s = ControllerSettings::parse(CTL, Path::new("ctl.toml")).unwrap();
        let (addr, stop_tx, task) = start(s).await;
        let (_, _, _, m) = hello(addr, "s9").await;
        assert!(matches!(&m, Message::Refuse { reason } if reason.contains("no server named \"s9\"")), "{m:?}");
        let (mut rd, mut wr, mut buf, m) = hello(addr, "s1").await;
        let limited = vec![false, true];
        assert_eq!(m, Message::Welcome { server: 0, strays: false, buckets: vec!["a".into(), "b".into()], limited });
        // The second server never connects: its report counts as missing after half an interval.
        let m = read_frame(&mut rd, &mut buf).await.unwrap();
        assert_eq!(m, Message::ReportRequest { round: 0, early: 0 });
        let line = BucketReport { bucket: 0, arrivals: 20, queued: 5, ..Default::default() };
        let report = ServerReport {
            server: 0,
            round: 0,
            early: 0,
            elapsed_ns: 100_000_000,
            completed: 0,
            busy_ns: 0,
            buckets: vec![line],
        };
        write_frame(&mut wr, &Message::Report(report)).await.unwrap();
        let m = read_frame(&mut rd, &mut buf).await.unwrap();
        let Message::Tokens(t) = m else { panic!("expected tokens, got {m:?}") };
        assert_eq!((t.server, t.round, t.early), (0, 0, 0));
        // 200 IOPS over a 0.5 s period: 100 R-tokens, all here (the only server with demand).
        assert_eq!(t.tokens, vec![(0, 100, Tokens::Unlimited)]);
        // A report naming server 1 on server 0's connection closes it.
        let m = read_frame(&mut rd, &mut buf).await.unwrap();
        let Message::ReportRequest { round, .. } = m else { panic!("{m:?}") };
        let bad = ServerReport { server: 1, round, ..Default::default() };
        write_frame(&mut wr, &Message::Report(bad)).await.unwrap();
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match read_frame(&mut rd, &mut buf).await {
                    Err(e) => return e.to_string(),
                    Ok(_) => continue,
                }
            }
        })
        .await
        .expect("the connection closes");
        assert!(closed.contains("closed"), "{closed}");
        // A peer announcing a hello larger than a name can be is cut before its body is read.
        let (mut rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
        let mut big = rein_proto::pshift::MAGIC.to_le_bytes().to_vec();
        big.extend_from_slice(&rein_proto::pshift::VERSION.to_le_bytes());
        big.extend_from_slice(&[1, 0]);
        big.extend_from_slice(&(32u32 << 20).to_le_bytes());
        tokio::io::AsyncWriteExt::write_all(&mut wr, &big).await.unwrap();
        let mut buf = Vec::new();
        let e = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut rd, &mut buf))
            .await
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.contains("closed"), "{e}");
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
    }

    /// Reads frames from a server's connection until a pong (report requests may come first).
    async fn pong(rd: &mut tokio::net::tcp::OwnedReadHalf, buf: &mut Vec<u8>) {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(5), read_frame(rd, buf)).await.unwrap().unwrap();
            if matches!(m, Message::Pong { .. }) {
                return;
            }
        }
    }

    /// Two servers configured with one name: a hello with the name of a server whose connection is live
    /// (it pings) is refused, naming the live one, which keeps its place; once that one is gone, the name
    /// is welcomed again. Before, each hello replaced the other's connection, and two such servers took
    /// turns every 100 ms for ever (20 log lines a second at the controller, no stable link for either).
    #[tokio::test]
    async fn a_hello_with_a_live_servers_name_is_refused() {
        let s = ControllerSettings::parse(CTL, Path::new("ctl.toml")).unwrap();
        let (addr, stop_tx, task) = start(s).await;
        let (mut rd, mut wr, mut buf, m) = hello(addr, "s1").await;
        assert!(matches!(m, Message::Welcome { server: 0, .. }), "{m:?}");
        write_frame(&mut wr, &Message::Ping { t0: 1 }).await.unwrap();
        pong(&mut rd, &mut buf).await;
        let (_, _, _, m) = hello(addr, "s1").await;
        let mine = wr.local_addr().unwrap().to_string();
        let want = format!(
            "server \"s1\" is connected already, from {mine} (are two servers configured with this name?); a second \
             connection is taken only once the first has been silent for 1 s"
        );
        assert!(matches!(&m, Message::Refuse { reason } if *reason == want), "{m:?}");
        // The first is still served.
        write_frame(&mut wr, &Message::Ping { t0: 2 }).await.unwrap();
        pong(&mut rd, &mut buf).await;
        drop((rd, wr));
        let welcomed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match hello(addr, "s1").await.3 {
                    m @ Message::Welcome { .. } => return m,
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        })
        .await;
        assert!(welcomed.is_ok(), "the name is not taken again once its connection is gone");
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
    }

    /// `/metrics` has a counter per bucket for each kind of closed period, named as `/api/pshift` names it.
    #[test]
    fn metrics_count_each_buckets_closed_periods() {
        let bucket = |name: &str, closed, below_reservation, above_limit, incomplete| BucketStatus {
            name: name.into(),
            reservation: 100,
            limit: Some(200),
            done: 7,
            periods: PeriodCounts {
                closed,
                below_reservation,
                below_reservation_with_demand: below_reservation / 2,
                above_limit,
                incomplete,
                last: Some(150),
            },
        };
        let st = ControllerStatus {
            round: 12,
            now_s: 3.0,
            origin_s: Some(0.0),
            servers: vec![("s1".into(), true)],
            buckets: vec![bucket("a", 5, 3, 0, 0), bucket("b\"x", 5, 0, 2, 1)],
            refused: 0,
            late_reports: 3,
            rounds: VecDeque::new(),
        };
        let text = metrics_text(&st);
        for line in [
            "rein_pshift_late_reports_total 3",
            "rein_pshift_bucket_periods_total{bucket=\"a\"} 5",
            "rein_pshift_bucket_periods_below_reservation_total{bucket=\"a\"} 3",
            "rein_pshift_bucket_periods_below_reservation_with_demand_total{bucket=\"a\"} 1",
            "# TYPE rein_pshift_bucket_periods_below_reservation_with_demand_total counter",
            "rein_pshift_bucket_periods_above_limit_total{bucket=\"a\"} 0",
            "rein_pshift_bucket_periods_above_limit_total{bucket=\"b\\\"x\"} 2",
            "rein_pshift_bucket_periods_incomplete_total{bucket=\"b\\\"x\"} 1",
            "# TYPE rein_pshift_bucket_periods_above_limit_total counter",
            "rein_pshift_bucket_reservation_ios{bucket=\"a\"} 100",
            "rein_pshift_bucket_limit_ios{bucket=\"a\"} 200",
            "rein_pshift_bucket_last_period_ios{bucket=\"b\\\"x\"} 150",
            "# TYPE rein_pshift_bucket_last_period_ios gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        let mut unlimited = st.clone();
        unlimited.buckets[0].limit = None;
        unlimited.buckets[0].periods.last = None;
        let text = metrics_text(&unlimited);
        assert!(!text.contains("rein_pshift_bucket_limit_ios{bucket=\"a\"}"), "no limit, no series:\n{text}");
        assert!(!text.contains("rein_pshift_bucket_last_period_ios{bucket=\"a\"}"), "no period closed:\n{text}");
        let json: serde_json::Value = serde_json::to_value(&st).unwrap();
        assert_eq!(json["buckets"][1]["periods"]["above_limit"], 2);
        assert_eq!(json["buckets"][0]["periods"]["below_reservation_with_demand"], 1);
        assert_eq!(json["buckets"][0]["periods"]["last"], 150);
    }

    /// A server that pings and never reads its pongs: once its writer is [`WRITER_QUEUE`] frames behind,
    /// its connection is closed and counted as refused (it was queued without bound before, 10 MB to 347 MB
    /// of controller memory in 15 s). What it then reads ends in the connection's close, not more pongs.
    #[tokio::test]
    async fn a_server_that_pings_and_never_reads_is_cut() {
        let text = format!("admin = \"127.0.0.1:0\"\nadmin_insecure = true\n{CTL}");
        let s = ControllerSettings::parse(&text, Path::new("ctl.toml")).unwrap();
        let (addr, admin, stop_tx, task) = start_admin(s).await;
        let admin: crate::admin_client::AdminEndpoint = admin.unwrap().into();
        let (mut rd, mut wr, mut buf, m) = hello(addr, "s1").await;
        assert!(matches!(m, Message::Welcome { server: 0, .. }), "{m:?}");
        let mut batch = Vec::new();
        for t0 in 0..10_000u64 {
            rein_proto::pshift::encode(&Message::Ping { t0 }, &mut batch).unwrap();
        }
        let mut sent = 0u64;
        let refused = loop {
            // Up to 400 MB of pings: far more than the socket buffers hold.
            assert!(sent < 400 << 20, "still not cut after {sent} bytes of pings");
            tokio::io::AsyncWriteExt::write_all(&mut wr, &batch).await.unwrap();
            sent += batch.len() as u64;
            let st: ControllerStatus = crate::admin_client::get_json(&admin, None, "/api/pshift").await.unwrap();
            if st.refused > 0 {
                break st.refused;
            }
        };
        assert_eq!(refused, 1);
        let mut pongs = 0u64;
        let end = loop {
            match tokio::time::timeout(Duration::from_secs(20), read_frame(&mut rd, &mut buf)).await {
                Ok(Ok(Message::Pong { .. })) => pongs += 1,
                Ok(Ok(_)) => {} // the schedule's report requests
                Ok(Err(e)) => break e.to_string(),
                Err(_) => panic!("the connection is still open after {pongs} pongs"),
            }
        };
        assert!(end.contains("closed") || end.contains("reset"), "{end}");
        assert!(pongs < sent, "{pongs} pongs");
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
    }

    /// A welcomed server that sends nothing for the silence timeout (5 s in the controller, 400 ms here)
    /// loses its connection at the deadline, not before: closed by the controller, shown disconnected,
    /// and its name welcomed again at once; a server that pings all the while keeps its connection.
    /// Before, a silent server kept its place until its TCP connection died.
    #[tokio::test]
    async fn a_silent_server_loses_its_connection() {
        let text = CTL.replace("127.0.0.1:0", "127.0.0.213:0");
        let text = format!("admin = \"127.0.0.213:0\"\nadmin_insecure = true\n{text}");
        let mut s = ControllerSettings::parse(&text, Path::new("ctl.toml")).unwrap();
        assert_eq!(s.silence_timeout, crate::pshift_link::SILENCE_TIMEOUT);
        let silence = Duration::from_millis(400);
        s.silence_timeout = silence;
        let (addr, admin, stop_tx, task) = start_admin(s).await;
        let admin: crate::admin_client::AdminEndpoint = admin.unwrap().into();
        let (mut quiet_rd, _quiet_wr, mut quiet_buf, m) = hello(addr, "s1").await;
        let welcomed = std::time::Instant::now();
        assert!(matches!(m, Message::Welcome { server: 0, .. }), "{m:?}");
        let (mut rd, mut wr, mut buf, m) = hello(addr, "s2").await;
        assert!(matches!(m, Message::Welcome { server: 1, .. }), "{m:?}");
        // s2 pings every 50 ms and is answered; s1 says nothing and reads what comes until the close.
        let pinging = async {
            for t0 in 0..20 {
                write_frame(&mut wr, &Message::Ping { t0 }).await.unwrap();
                pong(&mut rd, &mut buf).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        // Closed within 4 s: by the test's 400 ms, not the controller's 5 s.
        let quiet = async {
            let end = tokio::time::timeout(Duration::from_secs(4), async {
                loop {
                    if let Err(e) = read_frame(&mut quiet_rd, &mut quiet_buf).await {
                        return e.to_string(); // (report requests before)
                    }
                }
            });
            (end.await.expect("the silent server's connection is still open after 4 s"), welcomed.elapsed())
        };
        let ((), (end, after)) = tokio::join!(pinging, quiet);
        assert!(end.contains("closed") || end.contains("reset"), "{end}");
        assert!(after >= silence, "cut after {after:?}, before the silence timeout");
        let st: ControllerStatus = crate::admin_client::get_json(&admin, None, "/api/pshift").await.unwrap();
        assert_eq!(st.servers, [("s1".to_string(), false), ("s2".to_string(), true)]);
        let (_, _, _, m) = hello(addr, "s1").await;
        assert!(matches!(m, Message::Welcome { server: 0, .. }), "{m:?}");
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
    }

    /// The write timeout at its bound (10 s in the controller, 300 ms here): a server that says hello and
    /// never reads, with a welcome larger than the sockets' buffers (400 buckets of 250-byte names, about
    /// 100 KB; the controller's send buffer and the server's receive buffer at 4 KiB), has its connection
    /// closed with the welcome cut short; before, the welcome's write had no deadline and held the
    /// connection for ever. Another server, which reads, is welcomed whole and answered.
    #[tokio::test]
    async fn a_server_that_does_not_read_its_welcome_is_cut_at_the_write_timeout() {
        let mut text = CTL.replace("127.0.0.1:0", "127.0.0.214:0");
        for k in 0..400 {
            text.push_str(&format!("[[buckets]]\nname = \"{k:x>250}\"\n"));
        }
        let mut s = ControllerSettings::parse(&text, Path::new("ctl.toml")).unwrap();
        assert_eq!(s.write_timeout, WRITE_TIMEOUT);
        s.write_timeout = Duration::from_millis(300);
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(4096).unwrap();
        socket.bind(s.listen).unwrap();
        let listener = socket.listen(16).unwrap().into_std().unwrap();
        let addr = listener.local_addr().unwrap();
        let passed = crate::activation::Passed::tcp(&crate::activation::PSHIFT, listener);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(s, async move { drop(stop_rx.await) }, Some(ready_tx), passed, None));
        assert_eq!(ready_rx.await.unwrap().0, addr);
        let client = tokio::net::TcpSocket::new_v4().unwrap();
        client.set_recv_buffer_size(4096).unwrap();
        let (mut rd, mut wr) = client.connect(addr).await.unwrap().into_split();
        write_frame(&mut wr, &Message::Hello { name: "s1".into() }).await.unwrap();
        // Read nothing for three times the timeout, then what the socket holds, to its close.
        tokio::time::sleep(Duration::from_millis(900)).await;
        let mut got = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), tokio::io::AsyncReadExt::read_to_end(&mut rd, &mut got));
        assert!(read.await.is_ok(), "the connection is still open");
        let whole = rein_proto::pshift::frame_len(&got).unwrap().expect("a welcome's header");
        assert!(got.len() < whole, "the welcome came whole ({whole} bytes) from a server that did not read");
        let (mut rd, _wr, mut buf, m) = hello(addr, "s2").await;
        assert!(matches!(&m, Message::Welcome { server: 1, buckets, .. } if buckets.len() == 402), "{m:?}");
        let m = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut rd, &mut buf)).await.unwrap().unwrap();
        assert!(matches!(m, Message::ReportRequest { .. }), "{m:?}");
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
    }

    /// What a connection of server `s1` (bucket `a`, plain TCP) is admitted by, as the controller makes it
    /// from [`CTL`].
    fn admit_of_s1() -> Admit {
        let s = ControllerSettings::parse(CTL, Path::new("ctl.toml")).unwrap();
        Admit {
            names: Arc::new(vec!["s1".into()]),
            identities: Arc::new(vec![None]),
            buckets: Arc::new(vec!["a".into()]),
            limited: Arc::new(vec![false]),
            strays: false,
            max_body: 1024,
            write_timeout: s.write_timeout,
            silence_timeout: s.silence_timeout,
            access: Arc::new(s.access.clone()),
            tls: crate::tls::LiveTls::default(),
            refused: Arc::new(Mutex::new(ControllerStatus::default())),
            log: Arc::default(),
        }
    }

    /// A hello with a name the controller does not have, and one for a server it refuses (connected
    /// already), end as two kinds of cut, each logged at most once a second on its own: a peer repeating
    /// a connected server's hello does not hide, in the same second, the line of a server named wrong.
    #[tokio::test]
    async fn a_wrong_name_and_a_taken_server_are_cut_as_two_kinds() {
        let admit = Arc::new(admit_of_s1());
        let listener = TcpListener::bind("127.0.0.215:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        for (name, want) in [("s9", Cut::UnknownName), ("s1", Cut::Taken)] {
            let (ev_tx, mut ev_rx) = event_channel();
            let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let a = admit.clone();
            let accept = listener.accept();
            let (_, accepted) = tokio::join!(
                async {
                    let (_rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
                    write_frame(&mut wr, &Message::Hello { name: name.into() }).await.unwrap();
                    if let Some(Event::Joined { verdict, .. }) = ev_rx.recv().await {
                        let from = "127.0.0.1:1".parse().unwrap();
                        verdict.send(Err(Taken { name: "s1".into(), from, live_within: LIVE_WITHIN })).unwrap();
                    }
                },
                async move {
                    let (sock, _) = accept.await.unwrap();
                    let slot = Opening::default().take("127.0.0.1".parse().unwrap()).unwrap();
                    connection(sock, 1, &a, ev_tx, stop_rx, slot).await
                }
            );
            let e = accepted.unwrap_err();
            let (cut, reason) = (e.cut(), e.to_string());
            assert_eq!(cut, want, "{name}: {reason}");
            // As the accept loop does with the cut.
            admit.log_cut(cut, None, &format!("connection closed: {reason}"));
        }
        // Both lines logged within the second: none held back, in either kind.
        assert_eq!(admit.log[Cut::UnknownName as usize].unlogged(), 0);
        assert_eq!(admit.log[Cut::Taken as usize].unlogged(), 0);
    }

    /// A connection's end as the accept loop logs it: its kind of cut and its text.
    fn cut_text(e: &ConnectionError) -> (Cut, String) {
        (e.cut(), e.to_string())
    }

    /// Runs one connection of `admit` from `listener` against `client` (given its socket and the events
    /// the connection sends; what it returns is kept until the connection ends); returns how it ended.
    async fn connection_against<F, Fut, T>(admit: &Admit, listener: &TcpListener, client: F) -> ConnectionError
    where
        F: FnOnce(TcpStream, mpsc::Receiver<Event>) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let addr = listener.local_addr().unwrap();
        let (ev_tx, ev_rx) = event_channel();
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let (_kept, r) = tokio::join!(async { client(TcpStream::connect(addr).await.unwrap(), ev_rx).await }, async {
            let (sock, _) = listener.accept().await.unwrap();
            let slot = Opening::default().take("127.0.0.1".parse().unwrap()).unwrap();
            connection(sock, 1, admit, ev_tx, stop_rx, slot).await
        });
        r.expect_err("every case ends the connection")
    }

    /// A server connection's ends, exactly as the controller logs them ("pShift controller: connection
    /// closed: {e}") and, for a refused hello, as the Refuse frame tells the server: a first frame that is
    /// not a hello, a peer that closes before it, a name not configured, a server bound to an identity the
    /// peer does not present, a bad frame after the welcome, and a welcomed server that falls silent.
    #[tokio::test]
    async fn connection_ends_read_as_before() {
        let listener = TcpListener::bind("127.0.0.235:0").await.unwrap();
        let admit = admit_of_s1();
        let end = connection_against(&admit, &listener, |mut sock, ev| async move {
            write_frame(&mut sock, &Message::Ping { t0: 1 }).await.unwrap();
            (sock, ev)
        })
        .await;
        assert!(matches!(end, ConnectionError::NotHello { got: "ping" }), "{end:?}");
        let (cut, e) = cut_text(&end);
        assert_eq!((cut, e.as_str()), (Cut::Opening, "expected a hello, got a ping"));
        let end = connection_against(&admit, &listener, |mut sock, ev| async move {
            tokio::io::AsyncWriteExt::shutdown(&mut sock).await.unwrap();
            (sock, ev)
        })
        .await;
        assert!(matches!(end, ConnectionError::Hello(crate::pshift_link::ReadFrameError::Closed)), "{end:?}");
        let (cut, e) = cut_text(&end);
        assert_eq!((cut, e.as_str()), (Cut::Opening, "the peer closed the connection"));
        // A refused hello: the server is told the same text.
        let refused = |name: &'static str| {
            move |mut sock: TcpStream, ev| async move {
                write_frame(&mut sock, &Message::Hello { name: name.into() }).await.unwrap();
                let m = read_frame(&mut sock, &mut Vec::new()).await.unwrap();
                (sock, ev, m)
            }
        };
        let end = connection_against(&admit, &listener, |sock, ev| async {
            let (sock, ev, m) = refused("s9")(sock, ev).await;
            let want = "no server named \"s9\" in the controller's configuration";
            assert!(matches!(&m, Message::Refuse { reason } if reason == want), "{m:?}");
            (sock, ev)
        })
        .await;
        assert!(matches!(&end, ConnectionError::UnknownName { name } if name == "s9"), "{end:?}");
        let (cut, e) = cut_text(&end);
        assert_eq!((cut, e.as_str()), (Cut::UnknownName, "no server named \"s9\" in the controller's configuration"));
        let mut bound = admit_of_s1();
        bound.identities = Arc::new(vec![Some("alice".into())]);
        let end = connection_against(&bound, &listener, |sock, ev| async {
            let (sock, ev, m) = refused("s1")(sock, ev).await;
            let want = "server s1 connects with identity \"alice\" only, not none";
            assert!(matches!(&m, Message::Refuse { reason } if reason == want), "{m:?}");
            (sock, ev)
        })
        .await;
        assert!(
            matches!(&end, ConnectionError::WrongIdentity { name, want, presented: None } if name == "s1" && want == "alice"),
            "{end:?}"
        );
        let (cut, e) = cut_text(&end);
        assert_eq!((cut, e.as_str()), (Cut::Identity, "server s1 connects with identity \"alice\" only, not none"));
        // Welcomed (its writer's queue kept, as the controller's task keeps it), then a frame that is none.
        let welcomed = |mut sock: TcpStream, mut ev: mpsc::Receiver<Event>| async move {
            write_frame(&mut sock, &Message::Hello { name: "s1".into() }).await.unwrap();
            let Some(Event::Joined { verdict, tx, .. }) = ev.recv().await else { panic!("no join") };
            verdict.send(Ok(())).unwrap();
            let mut buf = Vec::new();
            let m = read_frame(&mut sock, &mut buf).await.unwrap();
            assert!(matches!(m, Message::Welcome { server: 0, .. }), "{m:?}");
            (sock, (ev, tx))
        };
        let garbage = [0xffu8; rein_proto::pshift::HEADER_BYTES];
        let end = connection_against(&admit, &listener, |sock, ev| async {
            let (mut sock, ev) = welcomed(sock, ev).await;
            tokio::io::AsyncWriteExt::write_all(&mut sock, &garbage).await.unwrap();
            (sock, ev)
        })
        .await;
        let bad = rein_proto::pshift::frame_len(&garbage).unwrap_err();
        assert!(
            matches!(&end, ConnectionError::Read(crate::pshift_link::ReadFrameError::Bad(b)) if *b == bad),
            "{end:?}"
        );
        assert_eq!(cut_text(&end), (Cut::Welcomed, format!("bad pShift frame: {bad}")));
        // Welcomed, then silent past the silence timeout.
        let mut quick = admit_of_s1();
        quick.silence_timeout = Duration::from_millis(200);
        let end = connection_against(&quick, &listener, welcomed).await;
        assert!(
            matches!(&end, ConnectionError::Silent { name, silence } if name == "s1" && silence.as_millis() == 200),
            "{end:?}"
        );
        let (cut, e) = cut_text(&end);
        let want = "server \"s1\" sent no frame within 0.2 s (a server pings every 100 ms)";
        assert_eq!((cut, e.as_str()), (Cut::Welcomed, want));
        // The ends no plain peer here makes (TLS, the hello's timeout), and the refusal of a live name.
        let texts: [(ConnectionError, Cut, &str); 6] = [
            (
                ConnectionError::TlsHandshake(crate::tls::TlsError("x".into())),
                Cut::Opening,
                "TLS handshake: TLS handshake failed: x",
            ),
            (ConnectionError::TlsRevoked { why: "revoked".into() }, Cut::Opening, "revoked"),
            (ConnectionError::HelloTimeout { timeout: HELLO_TIMEOUT }, Cut::Opening, "no hello within 5 s"),
            (
                ConnectionError::IdentityNotAllowed { identity: "bob".into() },
                Cut::Identity,
                "identity \"bob\" is not in allow_identities",
            ),
            (
                ConnectionError::NoIdentity,
                Cut::Identity,
                "the TLS peer has no identity (PSK identity or certificate CN) for allow_identities",
            ),
            (
                ConnectionError::Taken(Taken {
                    name: "s1".into(),
                    from: "192.0.2.1:7".parse().unwrap(),
                    live_within: LIVE_WITHIN,
                }),
                Cut::Taken,
                "server \"s1\" is connected already, from 192.0.2.1:7 (are two servers configured with this \
                 name?); a second connection is taken only once the first has been silent for 1 s",
            ),
        ];
        for (e, cut, want) in texts {
            assert_eq!(cut_text(&e), (cut, want.to_string()));
        }
    }

    /// The frames the controller closes a welcomed server's connection for, exactly as it logs them
    /// ("pShift controller: {why}; closing its connection"): a second hello, a report or a stray note
    /// naming another server, and a frame only a controller sends. One server each: each server's cuts
    /// are logged at most once a second.
    #[tokio::test]
    async fn cut_frames_read_as_before() {
        let logs = rein_testkit::Logs::new();
        // This test's runtime runs every task on this thread, where the subscriber is the default.
        let _default = tracing::subscriber::set_default(logs.subscriber());
        let servers: String =
            (1..=4).map(|k| format!("[[servers]]\nname = \"s{k}\"\ncapacity_iops = 1000\n")).collect();
        let text = format!(
            "listen = \"127.0.0.236:0\"\nperiod_s = 0.5\nintervals = 5\nstart_s = 0.1\nearly_rounds = 0\n{servers}\
             [[buckets]]\nname = \"a\"\nreservation_iops = 200\n"
        );
        let s = ControllerSettings::parse(&text, Path::new("ctl.toml")).unwrap();
        let (addr, stop_tx, task) = start(s).await;
        let frames = [
            Message::Hello { name: "s1".into() },
            Message::Report(ServerReport { server: 3, ..Default::default() }),
            Message::Stray(rein_core::pshift::StrayArrival { server: 7, bucket: 0, heard: (0, 0) }),
            Message::Pong { t0: 1, t1: 1, next_round: 0, next_ns: 0, interval_ns: 0 },
        ];
        let wants = [
            "pShift controller: a second hello (a server says hello once, before its welcome); closing its connection \
             server=s1",
            "pShift controller: a report naming server 3 on server 1's connection; closing its connection server=s2",
            "pShift controller: a stray note naming server 7 on server 2's connection; closing its connection \
             server=s3",
            "pShift controller: a pong frame, which only a controller sends; closing its connection server=s4",
        ];
        let frames_again = frames.clone();
        for (k, m) in frames.into_iter().enumerate() {
            let (mut rd, mut wr, mut buf, welcome) = hello(addr, &format!("s{}", k + 1)).await;
            assert!(matches!(welcome, Message::Welcome { .. }), "{welcome:?}");
            write_frame(&mut wr, &m).await.unwrap();
            // Closed: every frame up to the close is read, then the end.
            let end = tokio::time::timeout(Duration::from_secs(5), async {
                while read_frame(&mut rd, &mut buf).await.is_ok() {}
            });
            assert!(end.await.is_ok(), "server {} not cut", k + 1);
        }
        let said = || logs.text();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !wants.iter().all(|w| said().contains(w)) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let said = said();
        for want in wants {
            assert!(said.contains(want), "{want}\nnot in\n{said}");
        }
        // Typed: the variant each of those frames is cut as (on the connection of server k), with what it
        // names, and its text the line's; and the text of a connection that does not read.
        let whys: Vec<CutFrame> = frames_again.iter().enumerate().map(|(k, m)| CutFrame::of(k, m)).collect();
        assert!(matches!(whys[0], CutFrame::SecondHello), "{:?}", whys[0]);
        assert!(matches!(whys[1], CutFrame::ReportForAnother { named: 3, on: 1 }), "{:?}", whys[1]);
        assert!(matches!(whys[2], CutFrame::StrayForAnother { named: 7, on: 2 }), "{:?}", whys[2]);
        assert!(matches!(whys[3], CutFrame::ControllerFrame { frame: "pong" }), "{:?}", whys[3]);
        for (why, want) in whys.iter().zip(wants) {
            let line = format!("pShift controller: {why}; closing its connection");
            assert!(want.starts_with(&line), "{line} / {want}");
        }
        assert_eq!(
            CutFrame::Behind { frames: WRITER_QUEUE }.to_string(),
            "its connection is 256 frames behind (not reading)"
        );
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
    }

    /// The event queue at its bound: with the controller's task taking no events, a server's reader
    /// stops once [`EVENT_QUEUE`] of its frames wait (the rest stay in the socket: the peer is slowed,
    /// not buffered, and not cut); once they are taken, every frame follows, in order.
    #[tokio::test]
    async fn a_full_event_queue_slows_the_reader() {
        let admit = admit_of_s1();
        let listener = TcpListener::bind("127.0.0.215:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ev_tx, mut ev_rx) = event_channel();
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let conn = tokio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            let slot = Opening::default().take("127.0.0.1".parse().unwrap()).unwrap();
            connection(sock, 1, &admit, ev_tx, stop_rx, slot).await.map_err(|e| e.to_string())
        });
        let (mut sock_rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
        write_frame(&mut wr, &Message::Hello { name: "s1".into() }).await.unwrap();
        // The writer's queue is kept (dropped, the connection would end: the controller let it go).
        let Some(Event::Joined { verdict, tx: _writer, .. }) = ev_rx.recv().await else { panic!("no join") };
        verdict.send(Ok(())).unwrap();
        let mut buf = Vec::new();
        assert!(matches!(read_frame(&mut sock_rd, &mut buf).await.unwrap(), Message::Welcome { .. }));
        let n = 2 * EVENT_QUEUE as u64;
        let mut pings = Vec::new();
        for t0 in 0..n {
            rein_proto::pshift::encode(&Message::Ping { t0 }, &mut pings).unwrap();
        }
        tokio::io::AsyncWriteExt::write_all(&mut wr, &pings).await.unwrap();
        // Wait until the queue stops growing (200 ms without a change), then it holds exactly the bound.
        let mut last = (usize::MAX, std::time::Instant::now());
        while last.1.elapsed() < Duration::from_millis(200) {
            if ev_rx.len() != last.0 {
                last = (ev_rx.len(), std::time::Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(ev_rx.len(), EVENT_QUEUE);
        assert!(!conn.is_finished(), "the reader waits, it does not end the connection");
        for want in 0..n {
            match tokio::time::timeout(Duration::from_secs(5), ev_rx.recv()).await.unwrap() {
                Some(Event::Frame { m: Message::Ping { t0 }, .. }) => assert_eq!(t0, want),
                _ => panic!("expected ping {want}"),
            }
        }
        drop(wr);
        let end = tokio::time::timeout(Duration::from_secs(5), conn).await.unwrap().unwrap();
        assert!(end.as_ref().is_err_and(|e| e.contains("closed")), "{end:?}");
    }

    /// The status keeps the newest [`MAX_ROUNDS_KEPT`] rounds: at the bound all of them, one more drops
    /// the oldest.
    #[test]
    fn the_status_keeps_the_newest_rounds() {
        let mut st = ControllerStatus::default();
        let round = |round| RoundRecord {
            at_s: 0.0,
            round,
            period: 0,
            interval: 0,
            early: 0,
            wanted: 0,
            r_phi: 0,
            l_phi: 0,
            reports_missing: 0,
        };
        for r in 0..MAX_ROUNDS_KEPT as u64 {
            st.push_round(round(r));
        }
        assert_eq!((st.rounds.len(), st.rounds[0].round), (MAX_ROUNDS_KEPT, 0));
        st.push_round(round(MAX_ROUNDS_KEPT as u64));
        assert_eq!((st.rounds.len(), st.rounds[0].round), (MAX_ROUNDS_KEPT, 1));
        assert_eq!(st.rounds.back().unwrap().round, MAX_ROUNDS_KEPT as u64);
    }

    /// Silent connections from one address hold at most as many of the controller's slots as it has
    /// servers (two here): a third from 127.0.0.1 is cut at once, and a server from another address is welcomed beside them,
    /// as is one from 127.0.0.1 once a silent one has gone.
    #[tokio::test]
    async fn silent_connections_from_one_address_hold_two_slots_at_most() {
        let s = ControllerSettings::parse(CTL, Path::new("ctl.toml")).unwrap();
        let (addr, stop_tx, task) = start(s).await;
        let silent1 = TcpStream::connect(addr).await.unwrap();
        let _silent2 = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (mut rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
        let _ = write_frame(&mut wr, &Message::Hello { name: "s1".into() }).await;
        let mut buf = Vec::new();
        let e = tokio::time::timeout(Duration::from_secs(2), read_frame(&mut rd, &mut buf))
            .await
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.contains("closed") || e.contains("reset"), "the third is cut at once: {e}");
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let (mut rd, mut wr) = sock.connect(addr).await.unwrap().into_split();
        write_frame(&mut wr, &Message::Hello { name: "s1".into() }).await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(2), read_frame(&mut rd, &mut buf)).await.unwrap().unwrap();
        assert!(matches!(m, Message::Welcome { server: 0, .. }), "{m:?}");
        drop(silent1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (_, _, _, m) = hello(addr, "s2").await;
        assert!(matches!(m, Message::Welcome { server: 1, .. }), "{m:?}");
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
    }

    /// Only `allow_networks` may connect (default loopback): a peer outside it is cut at once and counted.
    #[tokio::test]
    async fn peers_outside_allow_networks_are_refused() {
        let text = CTL.replace("early_rounds = 0\n", "early_rounds = 0\nallow_networks = [\"10.0.0.0/8\"]\n");
        let s = ControllerSettings::parse(&text, Path::new("ctl.toml")).unwrap();
        assert!(!s.access.allows("127.0.0.1".parse().unwrap(), None));
        let (addr, stop_tx, task) = start(s).await;
        let (mut rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
        let _ = write_frame(&mut wr, &Message::Hello { name: "s1".into() }).await;
        let mut buf = Vec::new();
        let e = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut rd, &mut buf))
            .await
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.contains("closed") || e.contains("reset"), "{e}");
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
        // The default admits loopback; a bad entry is named.
        let s = ControllerSettings::parse(CTL, Path::new("ctl.toml")).unwrap();
        assert!(s.access.allows("127.0.0.1".parse().unwrap(), None));
        let bad = CTL.replace("early_rounds = 0\n", "early_rounds = 0\nallow_networks = [\"x\"]\n");
        let e = ControllerSettings::parse(&bad, Path::new("ctl.toml")).unwrap_err().to_string();
        assert!(e.contains("allow_networks entry \"x\" is not a CIDR network"), "{e}");
    }
}
