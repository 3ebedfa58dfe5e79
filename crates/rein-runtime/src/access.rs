//! Who may reach what: per-export access lists and connection caps, as facts for rein-proto's handshake.
//!
//! The handshake ([`ServerHandshake`](rein_proto::nbd::ServerHandshake)) decides what to answer; this
//! module computes what it needs from the connection: which exports the client may see (from its address
//! and, after TLS, its identity), and whether a connection or an export opening is over a cap.
//!
//! # Access lists (`allow_networks`, `allow_identities` per export)
//! An export is visible to a client when its address is in one of `allow_networks` (CIDR; absent: any
//! address) and its identity ([`crate::tls`]: PSK identity or certificate CN) is one of
//! `allow_identities` (absent: anyone, with or without TLS). A client without an identity (no TLS, or
//! TLS without a PSK or a client certificate) never matches `allow_identities`. IPv4-mapped IPv6
//! addresses are compared as IPv4, and a mapped network in `allow_networks` is kept as IPv4.
//!
//! # Connection caps
//! Three counters, each checked where it can be answered at the NBD level:
//! - `max_connections` (all clients) and `max_connections_per_client` (one peer address; for IPv6 one
//!   /64, the block a single host or subscriber is given, so a client cannot pass the cap by cycling
//!   through its own addresses; [`client_of`]): at accept. A
//!   client over either cap still gets the greeting, and every option is answered NBD_REP_ERR_POLICY with
//!   a message naming the cap (so nbdinfo prints it); such refusals are themselves bounded:
//!   [`MAX_REFUSING`] at once, each for at most [`REFUSAL_TIMEOUT`]; beyond that the socket is closed.
//! - `max_connections_per_tenant`: when the client opens an export (GO or EXPORT_NAME), counted over all
//!   exports of the tenant; over it, GO gets NBD_REP_ERR_POLICY (EXPORT_NAME, which has no error reply,
//!   closes).
//!
//! Each counter is held by a guard ([`ClientSlot`], [`TenantSlot`]) for the life of the connection. The
//! per-client map holds only addresses with a live connection, so it has at most `max_connections`
//! entries.
//!
//! # Metrics
//! [`ConnLimits::metrics`] gives `/metrics` of both daemons (`rein serve`, `rein gateway`) the same series:
//! the connections counted now against `max_connections` and the cap, the refusals at each cap (by the
//! cap's key: a refusal is logged at most once a second, so the count is where an operator sees how many
//! clients a cap turned away), failed handshakes and failed accepts, and the BLOCK_STATUS requests taken
//! (they pass no tenant's scheduler, so its counters do not show them: a client flooding them shows here).

use crate::lograte::LogRate;
use ipnet::IpNet;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections being refused (answered with NBD_REP_ERR_POLICY) at once; more are closed at once.
pub const MAX_REFUSING: usize = 256;
/// How long a refused connection may take to read its refusal before it is closed.
pub const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Refusals are logged at most once per this interval (with the number left unlogged), so a flood of
/// connections cannot flood the log.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// A warning that peers can cause as often as they like (a refused connection, a bad frame): logged at
/// most once per [`REFUSAL_LOG_INTERVAL`], the next line saying how many were not (`unlogged`): a
/// [`LogRate`] on the monotonic clock (std's `Instant`), shared by the tasks that may log it.
#[derive(Debug, Default)]
pub struct SparseLog(Mutex<LogRate<Instant>>);

impl SparseLog {
    /// Whether to log now: `Some(the number not logged since the last line)`, else `None` (counted).
    pub fn due(&self) -> Option<u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).due(Instant::now(), REFUSAL_LOG_INTERVAL, 1)
    }

    /// How many were not logged since the last line.
    pub fn unlogged(&self) -> u64 {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).unlogged()
    }
}

/// One export's access list (`allow_networks`, `allow_identities`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExportAccess {
    /// Networks whose clients may see the export; `None`: any.
    pub networks: Option<Vec<IpNet>>,
    /// Identities that may see the export; `None`: anyone.
    pub identities: Option<Vec<String>>,
}

/// An address as access lists compare it (IPv4-mapped IPv6 as IPv4).
fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// The client `max_connections_per_client` counts a peer address as: an IPv4 address (also when mapped
/// into IPv6) is itself; an IPv6 address is its /64 (shown as that network).
pub fn client_of(ip: IpAddr) -> IpNet {
    match canonical(ip) {
        IpAddr::V4(v4) => IpNet::V4(ipnet::Ipv4Net::new(v4, 32).expect("32 is a valid IPv4 prefix")),
        IpAddr::V6(v6) => IpNet::V6(ipnet::Ipv6Net::new(v6, 64).expect("64 is a valid IPv6 prefix").trunc()),
    }
}

/// A network as access lists keep it: an IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`, or the bare
/// address `::ffff:10.0.0.1`) as the IPv4 network it maps, since clients are compared as IPv4 when
/// mapped ([`ExportAccess::allows`]); otherwise no client could ever match it.
pub fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => IpNet::V4(ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).expect("a prefix of at most 32")),
            None => net,
        },
        _ => net,
    }
}

impl ExportAccess {
    /// Whether a client at `ip` with `identity` may see the export.
    pub fn allows(&self, ip: IpAddr, identity: Option<&str>) -> bool {
        let ip = canonical(ip);
        let network_ok = self.networks.as_ref().is_none_or(|nets| nets.iter().any(|n| n.contains(&ip)));
        let identity_ok =
            self.identities.as_ref().is_none_or(|ids| identity.is_some_and(|i| ids.iter().any(|x| x == i)));
        network_ok && identity_ok
    }
}

/// The connection caps (module comment), from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnCaps {
    /// All NBD connections (`max_connections`).
    pub total: usize,
    /// Connections from one peer address (`max_connections_per_client`).
    pub per_client: usize,
    /// Connections that opened an export of one tenant (`max_connections_per_tenant`).
    pub per_tenant: usize,
}

impl Default for ConnCaps {
    /// 4,096 in all, 128 per client address (the project's 100-tenant benchmark, `scripts/bench-nbd.sh`,
    /// opens 100 connections from one address; qemu's multi-conn uses up to 16), 256 per tenant: one
    /// address holds at most 1/32 of the server.
    fn default() -> ConnCaps {
        ConnCaps { total: 4096, per_client: 128, per_tenant: 256 }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_client: HashMap<IpNet, usize>,
    per_tenant: HashMap<usize, usize>,
}

/// The live connection counts against [`ConnCaps`].
#[derive(Debug)]
pub struct ConnLimits {
    caps: ConnCaps,
    counts: Mutex<Counts>,
    refusing: Arc<Semaphore>,
    /// When a refusal was last logged, and how many have not been logged since.
    refusal_log: SparseLog,
    /// Failed accepts (out of descriptors, say): their pause, log and count.
    accepts: AcceptPacing,
    /// Failed handshakes, logged at most once per [`REFUSAL_LOG_INTERVAL`].
    handshake_log: SparseLog,
    /// Connections refused at each cap, in [`CAP_KEYS`]'s order; failed handshakes; failed accepts
    /// (module comment, "Metrics").
    refused: [AtomicU64; 3],
    handshakes_failed: AtomicU64,
    /// BLOCK_STATUS requests taken (module comment, "Metrics").
    block_status: AtomicU64,
}

/// What a listener does when `accept` fails (descriptors run out, say): waits 10 ms, doubling with each
/// failure in a row up to 1 s, logs at most once per [`REFUSAL_LOG_INTERVAL`] with the count left
/// unlogged, and counts every failure. One rule for the NBD listeners ([`ConnLimits::accept_failed`]) and
/// the admin endpoint's (it logged each failure, ten lines a second while descriptors stayed out).
#[derive(Debug, Default)]
pub struct AcceptPacing {
    log: SparseLog,
    streak: std::sync::atomic::AtomicU32,
    failed: AtomicU64,
}

impl AcceptPacing {
    /// An `accept` of `listener` (the log line's words) failed with `e`: returns how long to wait before
    /// the next, and whether it logged.
    pub fn failed(&self, listener: &str, e: &std::io::Error) -> (Duration, bool) {
        self.failed.fetch_add(1, Relaxed);
        let streak = self.streak.fetch_add(1, Relaxed).min(7);
        let pause = (Duration::from_millis(10) * (1 << streak)).min(Duration::from_secs(1));
        let Some(unlogged) = self.log.due() else { return (pause, false) };
        tracing::warn!(unlogged, pause_ms = pause.as_millis() as u64, "{listener}: accept failed: {e}");
        (pause, true)
    }

    /// An `accept` succeeded: the next failure waits 10 ms again.
    pub fn succeeded(&self) {
        if self.streak.load(Relaxed) != 0 {
            self.streak.store(0, Relaxed);
        }
    }

    /// Failed accepts so far.
    pub fn count(&self) -> u64 {
        self.failed.load(Relaxed)
    }

    /// The admin endpoint's series of them (`rein_admin_accepts_failed_total`), the same for every daemon.
    pub fn admin_metrics(&self, o: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            o,
            "# HELP rein_admin_accepts_failed_total Accepts on the admin endpoint that failed (descriptors run out, \
             say).\n# TYPE rein_admin_accepts_failed_total counter\nrein_admin_accepts_failed_total {}",
            self.count()
        );
    }
}

/// The caps' keys, as the metrics name them: `max_connections`, `max_connections_per_client`,
/// `max_connections_per_tenant` (indices [`TOTAL`], [`PER_CLIENT`], [`PER_TENANT`]).
const CAP_KEYS: [&str; 3] = ["max_connections", "max_connections_per_client", "max_connections_per_tenant"];
const TOTAL: usize = 0;
const PER_CLIENT: usize = 1;
const PER_TENANT: usize = 2;

/// What to do with a new connection.
#[derive(Debug)]
pub enum Admit {
    /// Serve it; the slot is held until it ends.
    Serve(ClientSlot),
    /// Greet it and refuse every option with this reason's text (the permit bounds refusals in progress).
    Refuse(ConnRefusal, OwnedSemaphorePermit),
    /// Over a cap with too many refusals in progress: close it now (the reason is for the log).
    Close(ConnRefusal),
}

/// Why a new connection is refused at accept ([`ConnLimits::admit`]): the cap it is over, with the cap
/// and the count. Its text is the message every option is refused with (NBD_REP_ERR_POLICY; nbdinfo
/// prints it, docs/serve.md quotes it) and the log line's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnRefusal {
    /// All connections counted reached `max_connections`.
    #[error("server has reached its maximum of {max} connections (max_connections); try later")]
    Total {
        /// The cap (`max_connections`).
        max: usize,
        /// The connections counted.
        open: usize,
    },
    /// The client's connections reached `max_connections_per_client`.
    #[error(
        "client {} has reached its maximum of {max} connections (max_connections_per_client)",
        client_name(client)
    )]
    PerClient {
        /// The client ([`client_of`]).
        client: IpNet,
        /// The cap (`max_connections_per_client`).
        max: usize,
        /// The client's connections counted.
        open: usize,
    },
}

/// A client ([`client_of`]) as a refusal names it: an IPv4 client by its address, an IPv6 one as its /64.
fn client_name(client: &IpNet) -> String {
    match client {
        IpNet::V4(v4) => v4.addr().to_string(),
        IpNet::V6(_) => client.to_string(),
    }
}

/// Takes one connection off `key`'s count; a count that reaches 0 leaves the map (so the maps hold only
/// keys with connections).
fn uncount<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: &K) {
    let n = counts.get_mut(key).expect("a slot's key is counted");
    *n -= 1;
    if *n == 0 {
        counts.remove(key);
    }
}

/// A connection counted against `max_connections` and `max_connections_per_client`.
#[derive(Debug)]
pub struct ClientSlot {
    limits: Arc<ConnLimits>,
    client: IpNet,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut c = self.limits.counts.lock().expect("the counts lock is not poisoned");
        c.total -= 1;
        uncount(&mut c.per_client, &self.client);
    }
}

/// Why a connection may not open an export of its tenant ([`ConnLimits::open_tenant`]): the tenant has
/// reached `max_connections_per_tenant`. The client is told, as the refusal's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tenant {tenant} has reached its maximum of {max} connections (max_connections_per_tenant)")]
pub struct TenantCapError {
    /// The tenant's name.
    pub tenant: String,
    /// Its cap (`max_connections_per_tenant`).
    pub max: usize,
}

/// A connection counted against its tenant's `max_connections_per_tenant`.
#[derive(Debug)]
pub struct TenantSlot {
    limits: Arc<ConnLimits>,
    tenant: usize,
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut c = self.limits.counts.lock().expect("the counts lock is not poisoned");
        uncount(&mut c.per_tenant, &self.tenant);
    }
}

impl ConnLimits {
    /// Counters for `caps`, all zero.
    pub fn new(caps: ConnCaps) -> Arc<ConnLimits> {
        Arc::new(ConnLimits {
            caps,
            counts: Mutex::default(),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            refusal_log: SparseLog::default(),
            accepts: AcceptPacing::default(),
            handshake_log: SparseLog::default(),
            refused: Default::default(),
            handshakes_failed: AtomicU64::new(0),
            block_status: AtomicU64::new(0),
        })
    }

    /// The connection series of `/metrics` (module comment, "Metrics"), the same for both daemons.
    pub fn metrics(&self, o: &mut String) {
        use std::fmt::Write;
        let open = self.counts.lock().expect("the counts lock is not poisoned").total;
        let _ = writeln!(
            o,
            "# HELP rein_nbd_connections NBD connections open now (counted against max_connections).\n\
             # TYPE rein_nbd_connections gauge\nrein_nbd_connections {open}\n\
             # HELP rein_nbd_connections_max The cap on open NBD connections (max_connections).\n\
             # TYPE rein_nbd_connections_max gauge\nrein_nbd_connections_max {}\n\
             # HELP rein_nbd_connections_refused_total NBD connections refused at a cap, by the cap's key.\n\
             # TYPE rein_nbd_connections_refused_total counter",
            self.caps.total
        );
        for (key, n) in CAP_KEYS.iter().zip(&self.refused) {
            let _ = writeln!(o, "rein_nbd_connections_refused_total{{cap=\"{key}\"}} {}", n.load(Relaxed));
        }
        let _ = writeln!(
            o,
            "# HELP rein_nbd_handshakes_failed_total NBD handshakes that failed (a protocol error, TLS, a \
             timeout, the client gone).\n# TYPE rein_nbd_handshakes_failed_total counter\n\
             rein_nbd_handshakes_failed_total {}\n\
             # HELP rein_nbd_accepts_failed_total Accepts of a new connection that failed (descriptors run \
             out, say).\n# TYPE rein_nbd_accepts_failed_total counter\nrein_nbd_accepts_failed_total {}\n\
             # HELP rein_nbd_block_status_total BLOCK_STATUS requests taken (answered without the tenants' \
             schedulers).\n# TYPE rein_nbd_block_status_total counter\nrein_nbd_block_status_total {}",
            self.handshakes_failed.load(Relaxed),
            self.accepts.count(),
            self.block_status.load(Relaxed)
        );
    }

    /// The caps.
    pub fn caps(&self) -> ConnCaps {
        self.caps
    }

    /// Counts a new connection from `ip`, or says why it is refused.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Admit {
        let client = client_of(ip);
        let refusal = {
            let mut c = self.counts.lock().expect("the counts lock is not poisoned");
            let from_client = c.per_client.get(&client).copied().unwrap_or(0);
            if c.total >= self.caps.total {
                self.refused[TOTAL].fetch_add(1, Relaxed);
                ConnRefusal::Total { max: self.caps.total, open: c.total }
            } else if from_client >= self.caps.per_client {
                self.refused[PER_CLIENT].fetch_add(1, Relaxed);
                ConnRefusal::PerClient { client, max: self.caps.per_client, open: from_client }
            } else {
                c.total += 1;
                *c.per_client.entry(client).or_insert(0) += 1;
                return Admit::Serve(ClientSlot { limits: self.clone(), client });
            }
        };
        match self.refusing.clone().try_acquire_owned() {
            Ok(permit) => Admit::Refuse(refusal, permit),
            Err(_) => Admit::Close(refusal),
        }
    }

    /// Counts a connection opening an export of tenant `tenant` (the dispatcher's slot,
    /// [`rein_core::TenantId::index`], named `name`), or says why not.
    pub fn open_tenant(self: &Arc<Self>, tenant: usize, name: &str) -> Result<TenantSlot, TenantCapError> {
        let mut c = self.counts.lock().expect("the counts lock is not poisoned");
        let n = c.per_tenant.entry(tenant).or_insert(0);
        if *n >= self.caps.per_tenant {
            self.refused[PER_TENANT].fetch_add(1, Relaxed);
            return Err(TenantCapError { tenant: name.to_string(), max: self.caps.per_tenant });
        }
        *n += 1;
        Ok(TenantSlot { limits: self.clone(), tenant })
    }

    /// Logs a refused connection (a warning), at most once per [`REFUSAL_LOG_INTERVAL`]; the next line
    /// says how many were not logged. Returns whether it logged.
    pub fn log_refusal(&self, peer: crate::sock::Peer, why: &ConnRefusal, closed: bool) -> bool {
        let Some(unlogged) = self.refusal_log.due() else { return false };
        let action = if closed { "closing (too many refusals in progress)" } else { "refusing" };
        tracing::warn!(%peer, unlogged, "{action} connection: {why}");
        true
    }

    /// An NBD `accept` failed ([`AcceptPacing::failed`]; a listener out of descriptors once logged 89
    /// lines a second): how long to wait before the next accept, and whether it logged.
    pub fn accept_failed(&self, e: &std::io::Error) -> (Duration, bool) {
        self.accepts.failed("NBD listener", e)
    }

    /// A BLOCK_STATUS was taken on a connection (`rein_nbd_block_status_total`).
    pub fn block_status_taken(&self) {
        self.block_status.fetch_add(1, Relaxed);
    }

    /// Logs a failed handshake (at INFO), at most once per [`REFUSAL_LOG_INTERVAL`]; the next line says
    /// how many were not logged. A client can fail handshakes as fast as it connects. Returns whether it
    /// logged.
    pub fn log_failed_handshake(&self, peer: crate::sock::Peer, why: &dyn std::fmt::Display) -> bool {
        self.handshakes_failed.fetch_add(1, Relaxed);
        let Some(unlogged) = self.handshake_log.due() else { return false };
        tracing::info!(%peer, unlogged, "NBD handshake failed: {why}");
        true
    }

    /// An `accept` succeeded: the next failure waits 10 ms again.
    pub fn accept_succeeded(&self) {
        self.accepts.succeeded();
    }

    /// Connections counted now: all, and from `ip`'s client ([`client_of`]).
    pub fn counted(&self, ip: IpAddr) -> (usize, usize) {
        let c = self.counts.lock().expect("the counts lock is not poisoned");
        (c.total, c.per_client.get(&client_of(ip)).copied().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failed accepts are logged at most once per interval and paced by a doubling pause up to 1 s; a
    /// success resets the pause.
    #[test]
    fn failed_accepts_are_paced_and_their_log_bounded() {
        let limits = ConnLimits::new(ConnCaps::default());
        let e = std::io::Error::from_raw_os_error(24); // EMFILE
        let got: Vec<(Duration, bool)> = (0..10).map(|_| limits.accept_failed(&e)).collect();
        let ms: Vec<u128> = got.iter().map(|g| g.0.as_millis()).collect();
        assert_eq!(ms, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        assert_eq!(got.iter().filter(|g| g.1).count(), 1, "one line per interval");
        assert_eq!(limits.accepts.log.unlogged(), 9);
        limits.accept_succeeded();
        assert_eq!(limits.accept_failed(&e).0, Duration::from_millis(10));
        // Each failure counted, logged or not.
        let mut o = String::new();
        limits.metrics(&mut o);
        assert!(o.contains("rein_nbd_accepts_failed_total 11\n"), "{o}");
        // The admin endpoint's, counted apart.
        let admin = AcceptPacing::default();
        admin.failed("admin endpoint", &e);
        let mut o = String::new();
        admin.admin_metrics(&mut o);
        assert!(o.ends_with("rein_admin_accepts_failed_total 1\n"), "{o}");
    }

    #[test]
    fn networks_and_identities() {
        let a = ExportAccess {
            networks: Some(vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]),
            identities: Some(vec!["alice".into()]),
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(a.allows(ip("10.1.2.3"), Some("alice")));
        assert!(a.allows(ip("::ffff:10.1.2.3"), Some("alice")), "IPv4-mapped addresses compare as IPv4");
        assert!(!a.allows(ip("10.1.2.3"), Some("bob")));
        assert!(!a.allows(ip("10.1.2.3"), None));
        assert!(!a.allows(ip("11.0.0.1"), Some("alice")));
        assert!(ExportAccess::default().allows(ip("192.0.2.1"), None));
    }

    #[test]
    fn caps_at_their_bounds() {
        let limits = ConnLimits::new(ConnCaps { total: 3, per_client: 2, per_tenant: 1 });
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let s1 = limits.admit(a);
        let s2 = limits.admit(a);
        assert!(matches!((&s1, &s2), (Admit::Serve(_), Admit::Serve(_))));
        match limits.admit(a) {
            Admit::Refuse(m, _) => {
                let m = m.to_string();
                assert!(m.contains("client 127.0.0.2") && m.contains("max_connections_per_client"))
            }
            o => panic!("{o:?}"),
        }
        let s3 = limits.admit(b);
        assert!(matches!(s3, Admit::Serve(_)));
        match limits.admit(b) {
            Admit::Refuse(m, _) => assert!(m.to_string().contains("max_connections)")),
            o => panic!("{o:?}"),
        }
        drop(s1);
        assert_eq!(limits.counted(a), (2, 1));
        assert!(matches!(limits.admit(a), Admit::Serve(_)));
        drop((s2, s3));
        let t = limits.open_tenant(0, "rd").unwrap();
        let e = limits.open_tenant(0, "rd").unwrap_err();
        assert_eq!(e, TenantCapError { tenant: "rd".into(), max: 1 });
        assert_eq!(e.to_string(), "tenant rd has reached its maximum of 1 connections (max_connections_per_tenant)");
        assert!(limits.open_tenant(1, "oltp").is_ok());
        drop(t);
        assert!(limits.open_tenant(0, "rd").is_ok());
        assert_eq!(limits.counts.lock().unwrap().per_tenant.len(), 0, "empty entries are removed");
        // Each refusal counted at its cap, the open connections and the cap as gauges.
        let held = limits.admit(a);
        let mut o = String::new();
        limits.metrics(&mut o);
        for line in [
            "rein_nbd_connections 1\n",
            "rein_nbd_connections_max 3\n",
            "rein_nbd_connections_refused_total{cap=\"max_connections\"} 1\n",
            "rein_nbd_connections_refused_total{cap=\"max_connections_per_client\"} 1\n",
            "rein_nbd_connections_refused_total{cap=\"max_connections_per_tenant\"} 1\n",
            "rein_nbd_handshakes_failed_total 0\n",
            "rein_nbd_block_status_total 0\n",
        ] {
            assert!(o.contains(line), "{line}in\n{o}");
        }
        drop(held);
    }

    /// IPv6 addresses of one /64 are one client: the cap cannot be passed by cycling through them.
    #[test]
    fn an_ipv6_client_is_its_64() {
        let limits = ConnLimits::new(ConnCaps { total: 10, per_client: 2, per_tenant: 1 });
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let s1 = limits.admit(ip("2001:db8:0:7::1"));
        let s2 = limits.admit(ip("2001:db8:0:7:ffff::2"));
        assert!(matches!((&s1, &s2), (Admit::Serve(_), Admit::Serve(_))));
        match limits.admit(ip("2001:db8:0:7:abcd::3")) {
            Admit::Refuse(m, _) => {
                assert!(m.to_string().contains("client 2001:db8:0:7::/64 has reached its maximum of 2"), "{m}")
            }
            o => panic!("{o:?}"),
        }
        let s3 = limits.admit(ip("2001:db8:0:8::1"));
        assert!(matches!(s3, Admit::Serve(_)), "the next /64 is another client");
        assert_eq!(limits.counted(ip("2001:db8:0:7::9")), (3, 2));
        // IPv4, also mapped into IPv6, is counted by address.
        let v4 = limits.admit(ip("192.0.2.1"));
        let mapped = limits.admit(ip("::ffff:192.0.2.1"));
        assert!(matches!((&v4, &mapped), (Admit::Serve(_), Admit::Serve(_))));
        match limits.admit(ip("192.0.2.1")) {
            Admit::Refuse(m, _) => assert!(m.to_string().contains("client 192.0.2.1 has"), "{m}"),
            o => panic!("{o:?}"),
        }
        assert!(matches!(limits.admit(ip("192.0.2.2")), Admit::Serve(_)));
        drop((s1, s2));
        assert_eq!(limits.counted(ip("2001:db8:0:7::1")), (3, 0));
        drop((s3, v4, mapped));
    }

    /// The lines logged by `f` while it runs (a subscriber on this thread only).
    fn logged(f: impl FnOnce()) -> String {
        let logs = rein_testkit::Logs::new();
        tracing::subscriber::with_default(logs.subscriber(), f);
        logs.text()
    }

    /// The refusals' exact texts: what the client is told (every option's NBD_REP_ERR_POLICY message, as
    /// docs/serve.md quotes them) and what the log says, at each cap, refused or closed.
    #[test]
    fn refusal_texts() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let limits = ConnLimits::new(ConnCaps { total: 3, per_client: 1, per_tenant: 1 });
        let v4 = limits.admit(ip("192.0.2.1"));
        let v6 = limits.admit(ip("2001:db8:0:7::1"));
        let refused = |a: Admit| match a {
            Admit::Refuse(why, _) => why,
            o => panic!("{o:?}"),
        };
        let per_client_v4 = refused(limits.admit(ip("::ffff:192.0.2.1")));
        assert_eq!(
            per_client_v4.to_string(),
            "client 192.0.2.1 has reached its maximum of 1 connections (max_connections_per_client)"
        );
        let want: IpNet = "192.0.2.1/32".parse().unwrap();
        assert!(
            matches!(per_client_v4, ConnRefusal::PerClient { client, max: 1, open: 1 } if client == want),
            "{per_client_v4:?}"
        );
        let per_client_v6 = refused(limits.admit(ip("2001:db8:0:7::2")));
        assert_eq!(
            per_client_v6.to_string(),
            "client 2001:db8:0:7::/64 has reached its maximum of 1 connections (max_connections_per_client)"
        );
        let want: IpNet = "2001:db8:0:7::/64".parse().unwrap();
        assert!(
            matches!(per_client_v6, ConnRefusal::PerClient { client, max: 1, open: 1 } if client == want),
            "{per_client_v6:?}"
        );
        let third = limits.admit(ip("192.0.2.3"));
        let total = refused(limits.admit(ip("192.0.2.4")));
        assert_eq!(total.to_string(), "server has reached its maximum of 3 connections (max_connections); try later");
        assert_eq!(total, ConnRefusal::Total { max: 3, open: 3 });
        // The log lines (each from counters of its own: one line per interval).
        let peer = crate::sock::Peer::Tcp("192.0.2.4:7".parse().unwrap());
        let text = logged(|| {
            assert!(ConnLimits::new(ConnCaps::default()).log_refusal(peer, &total, false));
            assert!(ConnLimits::new(ConnCaps::default()).log_refusal(peer, &per_client_v6, true));
        });
        assert!(
            text.contains(
                "refusing connection: server has reached its maximum of 3 connections (max_connections); try later \
                 peer=192.0.2.4:7 unlogged=0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "closing (too many refusals in progress) connection: client 2001:db8:0:7::/64 has reached its \
                 maximum of 1 connections (max_connections_per_client) peer=192.0.2.4:7 unlogged=0\n"
            ),
            "{text}"
        );
        // Closed beyond the refusal bound, with the same reason.
        let refusing: Vec<Admit> = (0..MAX_REFUSING).map(|_| limits.admit(ip("192.0.2.1"))).collect();
        match limits.admit(ip("192.0.2.1")) {
            Admit::Close(why) => {
                assert_eq!(why, ConnRefusal::Total { max: 3, open: 3 });
                assert_eq!(
                    why.to_string(),
                    "server has reached its maximum of 3 connections (max_connections); try later"
                )
            }
            o => panic!("{o:?}"),
        }
        drop((refusing, v4, v6, third));
    }

    #[test]
    fn refusals_are_bounded() {
        let limits = ConnLimits::new(ConnCaps { total: 0, per_client: 1, per_tenant: 1 });
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        let held: Vec<Admit> = (0..MAX_REFUSING).map(|_| limits.admit(ip)).collect();
        assert!(held.iter().all(|a| matches!(a, Admit::Refuse(..))));
        assert!(matches!(limits.admit(ip), Admit::Close(_)));
        drop(held);
        assert!(matches!(limits.admit(ip), Admit::Refuse(..)));
        // One log line per interval.
        let peer = crate::sock::Peer::Tcp("127.0.0.2:1".parse().unwrap());
        let why = ConnRefusal::Total { max: 0, open: 0 };
        assert!(limits.log_refusal(peer, &why, false));
        assert!(!limits.log_refusal(peer, &why, false));
        assert_eq!(limits.refusal_log.unlogged(), 1);
    }
}
