//! rein-runtime's decoders of outside input as functions of arbitrary bytes, with their contracts.
//!
//! The fuzz targets `server_config`, `gateway_config`, `pshift_controller_config`, `admin_body`,
//! `admin_response`, `state_file`, `psk_file`, `admin_create`, `access_list`, `listen_env`, `job_spec` and
//! `admin_token`
//! (`fuzz/` at the
//! repository root, cargo-fuzz on a nightly toolchain)
//! are one line each: they call these functions; `tests/corpus.rs`
//! replays the committed corpus through them on stable. Each function panics exactly when a contract is
//! broken. rein-proto's `harness` covers the wire decoders (NBD, the PARDA record and slot that
//! [`crate::aggregate`] reads from its shared file and datagrams).
//!
//! Contracts checked:
//! - [`server_config`]: [`ServerConfig::parse`] (an operator's rein.toml) never panics; a configuration it
//!   accepts keeps every documented bound (exports, names, sizes, queue depth, request size, tenants);
//!   a refusal has a message.
//! - [`admin_bodies`]: the bodies of `PUT /api/tenants/{name}` and `PUT /api/capacity` decode and
//!   validate as the admin endpoint does them, without panicking; an accepted spec keeps the fields the
//!   body gave and the current values of the others; an accepted capacity is positive and finite.
//! - [`admin_response`]: the admin client's parse of an HTTP response (status, chunked body) never
//!   panics and never returns a body longer than its input.
//! - [`state_file`]: [`state::parse`] (`data_dir/rein-state.json`, read at every start) never panics; a
//!   state it accepts has this server's version, serialises and parses back to the same value, and
//!   [`state::overlay`] of it over a configuration (two tenants, two exports, a default export) never
//!   panics and gives a configuration that keeps the bounds [`server_config`] checks.
//! - [`psk_file`]: [`tls::parse_psk_file`] (`tls.psk_file`, `identity:hexkey` lines) never panics; what it
//!   accepts has 1..=[`MAX_PSK_IDENTITIES`] identities of 1..=[`MAX_IDENTITY_BYTES`] bytes, keys of
//!   1..=[`MAX_PSK_BYTES`] bytes, and each key is exactly the hexadecimal digits written on its line; a
//!   refusal names the file.
//! - [`admin_create`]: the bodies of `POST /api/tenants` and `POST /api/exports`, decoded and validated as
//!   the endpoint does, never panic; an accepted tenant's spec is finite and survives the state file's
//!   form; an accepted export keeps the bounds (name, size, a file inside the data directory, its tenant,
//!   access lists) and reads back from the state file's form as the same export.
//! - [`gateway_config`]: [`GatewayConfig::parse`] (`rein gateway`'s gw.toml) never panics; a refusal has
//!   a message; a configuration it accepts keeps the gateway's bounds: 1..=[`MAX_NODES`] nodes and
//!   1..=[`MAX_VOLUMES`] volumes with distinct non-empty names, tenants with distinct names the
//!   storage-node protocol can carry, every index (a volume's tenant, the default export) in range, one
//!   stripe width, node export and local reservation per node, node export names within NBD's limit,
//!   timeouts, pool size and request size within their ranges, the tenant budget within the total.
//! - [`pshift_controller_config`]: `rein pshift controller`'s ctl.toml, through
//!   [`ControllerSettings::parse`], never panics; a refusal has a message; what it accepts has 1..=[`MAX_SERVERS`] servers and at most
//!   [`MAX_BUCKETS`] buckets with distinct names of 1..=[`MAX_NAME_LEN`] bytes (the frames carry them),
//!   positive finite capacities, each bucket's limit at or above its reservation, and a period that
//!   splits into whole-nanosecond intervals.
//! - [`access_list`]: [`config::parse_access`] (`allow_networks`, `allow_identities` of rein.toml, the state
//!   file and `POST /api/exports`) never panics; an accepted list keeps [`MAX_ALLOW_ENTRIES`] and has no
//!   empty entry, each network written back (as the state file does) parses to the same network, and a
//!   client at an address an entry names (a bare address, or a network's first address) is allowed; a
//!   refusal names the export and the key.
//! - [`listen_env`]: the socket-activation variables (`$LISTEN_FDS`, `$LISTEN_PID`, `$LISTEN_FDNAMES`,
//!   read at every start under a service manager) never panic and never make a list longer than
//!   [`MAX_PASSED`]; what they pass is for this process only, descriptors from 3 on, each with its name
//!   from `$LISTEN_FDNAMES` in order (none without it); a refusal names the variable at fault.
//! - [`job_spec()`]: [`job_spec::parse`] (`rein load --job`, a command line) never panics; a refusal starts
//!   by naming the job as written and says more; a job it accepts has a name, an export and a tenant,
//!   1..=[`job_spec::MAX_CONNECTIONS`] connections, and a workload the simulator's rules accept: a size of
//!   1 byte to [`MAX_SIZE_BYTES`], fractions in [0, 1], a start before its stop within the run, a closed
//!   window or burst of 1..=[`MAX_OUTSTANDING`], a rate within [`MAX_RATE_IOPS`]. A `trace=` value is
//!   replaced by a path that does not exist (the fuzzer must not read the machine's files), so its keys
//!   are checked up to the read.
//! - [`admin_token`]: [`AdminToken::parse`] (`admin_token_file`, read at every start and reload of each
//!   daemon) never panics; a refusal says what is wrong; a token it accepts is the input without its
//!   surrounding whitespace, 1..=[`MAX_TOKEN_BYTES`] visible ASCII characters, and matches itself and
//!   nothing a byte longer, shorter or different.

use crate::activation::{self, MAX_PASSED};
use crate::admin::{CapacityBody, SpecUpdate};
use crate::admin_client::parse_response;
use crate::admin_guard::{AdminToken, MAX_TOKEN_BYTES};
use crate::config::{self, BackendKind, ServerConfig, MAX_ALLOW_ENTRIES, MAX_EXPORTS, MAX_EXPORT_BYTES};
use crate::gateway::{GatewayConfig, MAX_NODES, MAX_VOLUMES};
use crate::job_spec;
use crate::live::MAX_TENANT_NAME;
use crate::pshift_controller::ControllerSettings;
use crate::state::{self, ExportJson, ExportOrigin, SpecJson};
use crate::tls::{self, MAX_IDENTITY_BYTES, MAX_PSK_BYTES, MAX_PSK_IDENTITIES};
use rein_core::pshift::{MAX_BUCKETS, MAX_NAME_LEN, MAX_SERVERS};
use rein_core::spec::MAX_IDLE_CREDIT;
use rein_core::units::{MAX_WEIGHT, MIN_RATE};
use rein_core::{Nanos, QosSpec};
use rein_model::workload::{WorkloadKind, MAX_OUTSTANDING, MAX_RATE_IOPS, MAX_SIZE_BYTES};
use rein_proto::nbd::node::MAX_NODE_NAME_LEN;
use std::net::IpAddr;
use std::path::{Component, Path};
use std::sync::OnceLock;

/// Parses `data` (if UTF-8: a file that is not is refused before parsing) as a server configuration;
/// panics if a contract is broken (module comment).
pub fn server_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let cfg = match ServerConfig::parse(text, Path::new("fuzz.toml")) {
        Ok(cfg) => cfg,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "a refusal without a message");
            return;
        }
    };
    check_config(&cfg, 1);
}

/// A Unix socket path a `sockaddr_un` holds: 1..=107 bytes, no NUL.
fn unix_path_ok(p: &Path) -> bool {
    let b = p.as_os_str().as_encoded_bytes();
    (1..=crate::sock::MAX_UNIX_PATH).contains(&b.len()) && !b.contains(&0)
}

/// `listen_unix`: a path the system can bind and a file mode.
fn check_unix(u: Option<&crate::sock::UnixListen>) {
    if let Some(u) = u {
        assert!(unix_path_ok(&u.path), "a listen_unix path the system cannot bind accepted");
        assert!(u.mode <= 0o777, "a listen_unix_mode above 0777 accepted");
    }
}

/// The bounds every configuration the server runs keeps (module comment: [`server_config`]), with at
/// least `min_exports` exports (a file needs one; the admin API may delete them all at run time).
fn check_config(cfg: &ServerConfig, min_exports: usize) {
    assert!((min_exports..=MAX_EXPORTS).contains(&cfg.exports.len()), "export count out of bounds");
    check_unix(cfg.listen_unix.as_ref());
    for (name, x) in cfg.device.iter().flat_map(|d| &d.service_scale) {
        assert!(x.is_finite() && (1e-3..=1e3).contains(x), "a service_scale out of range accepted");
        assert!(cfg.tenants.iter().any(|t| &t.name == name), "a service_scale for no tenant accepted");
    }
    assert!((1..=4096).contains(&cfg.queue_depth), "queue_depth out of bounds");
    assert!((1024..=128 << 20).contains(&cfg.max_request), "max_request out of bounds");
    assert!(cfg.probe_capacity_s.is_finite() && (0.0..=60.0).contains(&cfg.probe_capacity_s));
    if let Some(c) = cfg.capacity_iops {
        assert!(c.is_finite() && c > 0.0, "capacity_iops {c} accepted");
    }
    for (i, t) in cfg.tenants.iter().enumerate() {
        assert!(!t.name.is_empty(), "an empty tenant name accepted");
        assert!(cfg.tenants[..i].iter().all(|o| o.name != t.name), "a repeated tenant name accepted");
    }
    for (i, e) in cfg.exports.iter().enumerate() {
        assert!(e.name.len() <= 4096, "an export name above 4096 bytes accepted");
        assert!(cfg.exports[..i].iter().all(|o| o.name != e.name), "a repeated export name accepted");
        if let Some(size) = e.size {
            assert!((1..=MAX_EXPORT_BYTES).contains(&size), "export size {size} accepted");
        }
        assert!(
            e.size.is_some() || e.backend != crate::config::BackendKind::Memory,
            "a memory export without a size accepted"
        );
        assert!(e.tenant < cfg.tenants.len(), "an export's tenant index out of range");
    }
    if let Some(d) = cfg.default_export {
        assert!(d < cfg.exports.len(), "default_export index out of range");
    }
    let caps = cfg.caps;
    assert!(caps.total >= 1 && caps.per_client >= 1 && caps.per_tenant >= 1, "a connection cap of 0 accepted");
    if let Some(p) = &cfg.pshift {
        assert_eq!(cfg.scheduler, rein_core::SchedulerKind::Token, "[pshift] without the token scheduler accepted");
        assert!((1..=MAX_NAME_LEN).contains(&p.name.len()), "a [pshift] name the frames cannot carry accepted");
    }
}

/// Parses `data` (if UTF-8) as `rein pshift controller`'s configuration; panics if a contract is broken
/// (module comment).
pub fn pshift_controller_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let s = match ControllerSettings::parse(text, Path::new("ctl.toml")) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "a refusal without a message");
            return;
        }
    };
    assert!((1..=MAX_SERVERS).contains(&s.servers.len()), "server count out of bounds");
    assert!(s.buckets.len() <= MAX_BUCKETS, "bucket count out of bounds");
    assert!(s.access.identities.is_none() || s.tls.is_some(), "allow_identities accepted without [tls]");
    assert!(!s.hold || s.admin.is_some(), "hold accepted without an admin endpoint to start it");
    for (i, (name, cap)) in s.servers.iter().enumerate() {
        assert!((1..=MAX_NAME_LEN).contains(&name.len()), "a server name the frames cannot carry accepted");
        assert!(s.servers[..i].iter().all(|o| &o.0 != name), "a repeated server name accepted");
        assert!(cap.is_finite() && *cap > 0.0, "a capacity of {cap} accepted");
    }
    for (i, (name, q)) in s.buckets.iter().enumerate() {
        assert!((1..=MAX_NAME_LEN).contains(&name.len()), "a bucket name the frames cannot carry accepted");
        assert!(s.buckets[..i].iter().all(|o| &o.0 != name), "a repeated bucket name accepted");
        assert!(q.limit.is_none_or(|l| l >= q.reservation), "a limit below the reservation accepted");
    }
    let c = s.config;
    assert!(c.intervals >= 1 && c.period.0 % u64::from(c.intervals) == 0, "a period that does not split accepted");
}

/// Parses `data` (if UTF-8) as a gateway configuration; panics if a contract is broken (module comment).
pub fn gateway_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let cfg = match GatewayConfig::parse(text, Path::new("gw.toml")) {
        Ok(cfg) => cfg,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "a refusal without a message");
            return;
        }
    };
    let n = cfg.nodes.len();
    assert!((1..=MAX_NODES).contains(&n), "node count out of bounds");
    check_unix(cfg.listen_unix.as_ref());
    for (i, node) in cfg.nodes.iter().enumerate() {
        if let crate::sock::NodeAddress::Unix(p) = &node.address {
            assert!(unix_path_ok(p), "a node's Unix socket path the system cannot bind accepted");
        }
        assert!(!node.name.is_empty(), "an empty node name accepted");
        assert!(node.name.len() <= MAX_NODE_NAME_LEN, "a node name of {} bytes accepted", node.name.len());
        assert!(cfg.nodes[..i].iter().all(|o| o.name != node.name), "a repeated node name accepted");
        if let Some(tls) = &node.tls {
            assert!((1..=253).contains(&tls.name.len()) && !tls.name.contains('\0'), "a bad tls_name accepted");
        }
    }
    for (i, t) in cfg.tenants.iter().enumerate() {
        assert!(
            (1..=rein_proto::nbd::MAX_NODE_NAME_LEN).contains(&t.name.len()) && !t.name.contains('\0'),
            "a tenant name the storage-node protocol cannot carry accepted"
        );
        assert!(cfg.tenants[..i].iter().all(|o| o.name != t.name), "a repeated tenant name accepted");
        assert_eq!(t.server_reservations.len(), n, "one local reservation per node");
        assert!(t.server_reservations.iter().all(|r| r.is_finite() && *r >= 0.0), "a bad local reservation");
        assert!(t.spec.reservation().is_finite() && t.spec.weight().is_finite() && t.spec.weight() > 0.0);
    }
    assert!((1..=MAX_VOLUMES).contains(&cfg.exports.len()), "volume count out of bounds");
    for (i, v) in cfg.exports.iter().enumerate() {
        assert!((1..=4096).contains(&v.name.len()), "a volume name out of bounds accepted");
        assert!(cfg.exports[..i].iter().all(|o| o.name != v.name), "a repeated volume name accepted");
        assert!(v.tenant < cfg.tenants.len(), "a volume's tenant index out of range");
        assert!((1..=MAX_EXPORT_BYTES).contains(&v.size), "volume size {} accepted", v.size);
        assert_eq!(v.stripe.nodes(), n, "one stripe width per node");
        assert_eq!(v.node_exports.len(), n, "one node export per node");
        for (j, e) in v.node_exports.iter().enumerate() {
            assert!(e.len() <= rein_proto::nbd::MAX_NAME_LEN, "a node export name above NBD's limit accepted");
            // Every piece of the volume fits the layout's arithmetic.
            let _ = v.stripe.node_bytes(j, v.size);
        }
    }
    if let Some(d) = cfg.default_export {
        assert!(d < cfg.exports.len(), "default_export index out of range");
    }
    let link = &cfg.link;
    assert!(link.request_timeout >= std::time::Duration::from_millis(100), "request_timeout below its range");
    assert!(link.connect_timeout >= std::time::Duration::from_millis(100), "connect_timeout below its range");
    assert!((1..=crate::remote::MAX_CONNECTIONS_PER_NODE).contains(&link.connections), "pool size out of range");
    assert!((1024..=128 << 20).contains(&cfg.max_request), "max_request out of bounds");
    assert!(cfg.max_inflight_per_tenant <= cfg.max_inflight && cfg.max_inflight_per_tenant > 0);
    let caps = cfg.caps;
    assert!(caps.total >= 1 && caps.per_client >= 1 && caps.per_tenant >= 1, "a connection cap of 0 accepted");
    if let Some(host) = &cfg.parda {
        // What was accepted starts a host: the controller takes the settings and every tenant as a VM.
        let mut ctl =
            rein_core::parda::HostController::new(host.parda.config, host.host_config(1), rein_core::Nanos(0))
                .expect("accepted PARDA settings the controller refuses");
        for t in &cfg.tenants {
            ctl.add_vm(t.spec).expect("a tenant the PARDA host refuses as a VM");
        }
        if let crate::parda_host::ReportTransport::Udp { peers, .. } = &host.transport {
            for (k, (id, _)) in peers.iter().enumerate() {
                assert!(*id != host.id && peers[..k].iter().all(|p| p.0 != *id), "a repeated or own peer id accepted");
            }
        }
    }
}

/// Tenant specs a body is applied to: the default, a limited one, and the extremes of each field.
fn current_specs() -> [QosSpec; 3] {
    [
        QosSpec::default(),
        QosSpec::new(250.0, Some(1000.0), 2.0, 4).expect("a valid spec"),
        QosSpec::new(MIN_RATE, Some(MIN_RATE), MAX_WEIGHT, MAX_IDLE_CREDIT).expect("a valid spec"),
    ]
}

/// Decodes `data` as the body of a tenant change (applied to a few current specs) and of a capacity
/// change, as the admin endpoint does; panics if a contract is broken (module comment).
pub fn admin_bodies(data: &[u8]) {
    if let Ok(update) = serde_json::from_slice::<SpecUpdate>(data) {
        for current in current_specs() {
            let Ok(spec) = update.apply(current) else { continue };
            // What the endpoint answers and what admission sums must be numbers.
            assert!(spec.reservation().is_finite() && spec.weight().is_finite());
            assert!(spec.limit().is_none_or(f64::is_finite));
            let again = update.apply(spec).expect("an update applied twice is the same spec");
            assert_eq!(again, spec, "an update is idempotent");
        }
    }
    if let Ok(body) = serde_json::from_slice::<CapacityBody>(data) {
        if let Ok(iops) = rein_model::device::check_capacity("iops", body.iops) {
            assert!(iops.is_finite() && iops > 0.0, "capacity {iops} accepted");
        }
    }
}

/// Parses `data` as a whole HTTP response, as the admin client does, and its body as a `/metrics` text
/// (`rein admin status`); panics if a contract is broken (module comment).
pub fn admin_response(data: &[u8]) {
    if let Ok((_, body)) = parse_response(data) {
        assert!(body.len() <= data.len(), "a body longer than the response");
        let text = String::from_utf8_lossy(&body);
        for s in crate::prom::samples(&text) {
            assert!(!s.name.is_empty() && s.labels.len() <= text.len(), "a sample out of nothing: {s:?}");
        }
    }
}

/// The configuration a fuzzed state file is applied to: two tenants, two exports (the second the default
/// export), a capacity.
const STATE_BASE: &str = "data_dir = \"/nonexistent/rein-fuzz\"\ncapacity_iops = 1000\ndefault_export = \"b\"\n\
[[tenants]]\nname = \"t\"\nreservation = 10\n[[exports]]\nname = \"a\"\nbackend = \"memory\"\nsize_mb = 1\n\
[[exports]]\nname = \"b\"\nbackend = \"memory\"\nsize_mb = 2\ntenant = \"t\"\n";

fn state_base() -> &'static ServerConfig {
    static BASE: OnceLock<ServerConfig> = OnceLock::new();
    BASE.get_or_init(|| ServerConfig::parse(STATE_BASE, Path::new("fuzz.toml")).expect("the base parses"))
}

/// Parses `data` as a state file and applies it over a configuration; panics if a contract is broken
/// (module comment).
pub fn state_file(data: &[u8]) {
    let Ok(st) = state::parse(data) else { return };
    assert_eq!(st.version, state::STATE_VERSION, "another version accepted");
    let text = serde_json::to_vec_pretty(&st).expect("a state serialises");
    let again = state::parse(&text).unwrap_or_else(|e| panic!("a state written back does not parse: {e}"));
    assert_eq!(again, st, "a state written back parses to another value");
    let base = state_base();
    let over = state::overlay(base, &st);
    check_config(&over.config, 0);
    for t in over.config.tenants.iter().filter(|t| base.tenants.iter().all(|b| b.name != t.name)) {
        // Only `POST /api/tenants` adds a tenant the file does not have.
        assert!((1..=MAX_TENANT_NAME).contains(&t.name.len()), "a state file's tenant {:?} applied", t.name);
    }
    if let Some(c) = over.capacity {
        assert!(c.iops.is_finite() && c.iops > 0.0, "a state file's capacity {} applied", c.iops);
    }
}

/// Parses `data` as `rein gateway`'s layout file (`layout_file`, [`crate::gateway::layouts`], read at
/// every start); panics if a contract is broken: only this version accepted, every layout within its
/// bounds (1..=256 nodes of width at least 1, distinct names, widths summing to at most 4,096), and what
/// parses is written back and parses to the same value, with no difference from itself.
pub fn gateway_layouts(data: &[u8]) {
    use crate::gateway::layouts;
    let Ok(f) = layouts::parse(data) else { return };
    assert_eq!(f.version, layouts::VERSION, "another version accepted");
    for (name, l) in &f.volumes {
        assert!(!name.is_empty(), "a volume without a name");
        assert!((1..=crate::gateway::MAX_NODES).contains(&l.nodes.len()), "volume {name}: {} nodes", l.nodes.len());
        assert!(l.nodes.iter().all(|n| n.width >= 1), "volume {name}: a node of width 0");
        let widths: Vec<u32> = l.nodes.iter().map(|n| n.width).collect();
        rein_model::stripe::Stripe::new(l.unit, &widths)
            .unwrap_or_else(|e| panic!("volume {name}: a layout no stripe has: {e}"));
    }
    let text = serde_json::to_vec(&f).expect("a layout file serialises");
    let again = layouts::parse(&text).unwrap_or_else(|e| panic!("a layout file written back does not parse: {e}"));
    assert_eq!(again, f, "a layout file written back parses to another value");
    let now = f.volumes.iter().map(|(n, l)| (n.as_str(), l.clone()));
    assert!(layouts::differences(&f, now, Path::new("gw.toml")).is_empty(), "a layout differs from itself");
}

/// Applies `data` as a state file's journal (`data_dir/rein-state.journal`) over an empty state, as
/// [`state::Store::open`] does; panics if a contract is broken: what it accepts is whole lines of this
/// version, at most one cut last line, and a state that [`state_file`]'s checks accept when written as a
/// state file.
pub fn state_journal(data: &[u8]) {
    let mut st = None;
    let Ok(read) = state::apply_journal(&mut st, data) else { return };
    assert!(read.bytes <= data.len());
    assert_eq!(read.bytes + read.cut.map_or(0, |_| data.len() - read.bytes), data.len(), "a line neither read nor cut");
    assert!(data[..read.bytes].is_empty() || data[read.bytes - 1] == b'\n', "a record without its newline applied");
    if let Some(st) = st {
        state_file(&serde_json::to_vec(&st).expect("a state serialises"));
    }
}

/// Reads `data` as the three socket-activation variables as [`activation::from_env`] does, for a
/// process whose id is 4242; panics if a contract is broken (module comment). Layout: the first byte's
/// low three bits say which of `$LISTEN_FDS`, `$LISTEN_PID`, `$LISTEN_FDNAMES` are set; the rest, split
/// at NUL bytes, gives their values in that order (lossy UTF-8, as `from_env` reads them).
pub fn listen_env(data: &[u8]) {
    const ME: u32 = 4242;
    let Some((&set, rest)) = data.split_first() else { return };
    let mut values = rest.split(|&b| b == 0).map(|v| String::from_utf8_lossy(v).into_owned());
    let mut var = |bit: u8| {
        let v = values.next().unwrap_or_default();
        (set & bit != 0).then_some(v)
    };
    let (fds, pid, names) = (var(1), var(2), var(4));
    match activation::listed(fds.as_deref(), pid.as_deref(), names.as_deref(), ME) {
        Ok(list) => {
            let count = fds.as_deref().and_then(|f| f.trim().parse::<u32>().ok()).unwrap_or(0);
            assert_eq!(list.len() as u64, u64::from(count), "LISTEN_FDS={fds:?} but {} descriptors", list.len());
            assert!(list.len() <= MAX_PASSED as usize, "{} descriptors accepted", list.len());
            if count > 0 {
                let for_me = pid.as_deref().and_then(|p| p.trim().parse::<u32>().ok()) == Some(ME);
                assert!(for_me, "LISTEN_PID={pid:?}: passed to another process");
            }
            for (k, (fd, name)) in list.iter().enumerate() {
                assert_eq!(*fd, activation::FIRST_FD + k as i32, "descriptor {k}");
                let want = names.as_deref().map_or("", |n| n.split(':').nth(k).unwrap_or("?"));
                assert_eq!(name, want, "descriptor {fd}'s name");
            }
        }
        Err(e) => assert!(e.to_string().starts_with("LISTEN_"), "a refusal that does not name the variable: {e}"),
    }
}

/// Parses `data` (if UTF-8) as a PSK file; panics if a contract is broken (module comment).
pub fn psk_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let keys = match tls::parse_psk_file(text, Path::new("fuzz.psk")) {
        Ok(keys) => keys,
        Err(e) => {
            let named = match &e {
                tls::CredentialError::PskLine { path, .. } | tls::CredentialError::File { path, .. } => {
                    path == Path::new("fuzz.psk")
                }
                _ => false,
            };
            assert!(named && e.to_string().contains("fuzz.psk"), "a refusal that does not name the file: {e}");
            return;
        }
    };
    assert!((1..=MAX_PSK_IDENTITIES).contains(&keys.len()), "{} identities accepted", keys.len());
    for (identity, key) in &keys {
        assert!((1..=MAX_IDENTITY_BYTES).contains(&identity.len()), "an identity of {} bytes", identity.len());
        assert!((1..=MAX_PSK_BYTES).contains(&key.len()), "a key of {} bytes", key.len());
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        let written = text.lines().any(|line| {
            line.trim_end_matches('\r')
                .rsplit_once(':')
                .is_some_and(|(i, h)| i == identity && h.trim().eq_ignore_ascii_case(&hex))
        });
        assert!(written, "identity {identity:?}: key {hex} is not the hexadecimal written on its line");
    }
}

/// Parses `data` as an admin token file; panics if a contract is broken (module comment).
pub fn admin_token(data: &[u8]) {
    let token = match AdminToken::parse(data) {
        Ok(token) => token,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "a refusal without a message");
            return;
        }
    };
    let text = token.as_str().as_bytes();
    assert_eq!(text, data.trim_ascii(), "the token is not the file's text without its surrounding whitespace");
    assert!((1..=MAX_TOKEN_BYTES).contains(&text.len()), "a token of {} bytes", text.len());
    assert!(text.iter().all(u8::is_ascii_graphic), "a token with a byte that is not visible ASCII: {text:?}");
    assert!(token.matches(text), "a token that does not match itself");
    let mut longer = text.to_vec();
    longer.push(b'x');
    assert!(!token.matches(&longer), "a token matches itself with a byte more");
    assert!(!token.matches(&text[..text.len() - 1]), "a token matches itself with a byte less");
    let mut other = text.to_vec();
    other[text.len() / 2] ^= 1;
    assert!(!token.matches(&other), "a token matches another of its length");
}

/// Decodes `data` as the body of `POST /api/tenants` and of `POST /api/exports` as the endpoint does;
/// panics if a contract is broken (module comment).
pub fn admin_create(data: &[u8]) {
    if let Ok((_, spec)) = crate::admin::new_tenant(data) {
        assert!(spec.reservation().is_finite() && spec.weight().is_finite());
        assert!(spec.limit().is_none_or(f64::is_finite));
        let json = serde_json::to_vec(&SpecJson::from(spec)).expect("a spec serialises");
        let back: SpecJson = serde_json::from_slice(&json).expect("a spec written back parses");
        assert_eq!(back.spec().ok(), Some(spec), "a spec does not survive the state file");
    }
    let Ok(j) = crate::admin::new_export(data) else { return };
    let base = state_base();
    // A relative data directory too (the default `rein-data` is one): its exports' paths must not take it
    // twice on the way back.
    for data_dir in [base.data_dir.as_path(), Path::new("rein-fuzz-data")] {
        admin_export(&j, base, data_dir);
    }
}

/// `POST /api/exports`'s export `j` on a server with `base`'s tenants and data directory `data_dir`: its
/// bounds, and that the state file keeps it as it is.
fn admin_export(j: &ExportJson, base: &ServerConfig, data_dir: &Path) {
    let Ok(e) = j.to_config(data_dir, &base.tenants, ExportOrigin::Admin) else { return };
    assert!((1..=4096).contains(&e.name.len()), "an export name of {} bytes accepted", e.name.len());
    assert!(e.tenant < base.tenants.len(), "an export's tenant index out of range");
    if let Some(size) = e.size {
        assert!((1..=MAX_EXPORT_BYTES).contains(&size), "export size {size} accepted");
    }
    match &e.backend {
        BackendKind::File { path } => {
            let inside = path.strip_prefix(data_dir).expect("a file inside the data directory");
            assert!(inside.components().all(|c| matches!(c, Component::Normal(_))), "{} accepted", path.display());
        }
        BackendKind::Memory => assert!(e.size.is_some() && !e.direct, "a memory export without a size or direct"),
    }
    check_access(&e.access.networks.as_ref().map(|n| n.len()), &e.access.identities);
    // What the state file keeps of it reads back, at the next start, as the same export.
    let kept = ExportJson::from_config(&e, &base.tenants[e.tenant].name);
    let text = serde_json::to_vec(&kept).expect("an export serialises");
    let read: ExportJson = serde_json::from_slice(&text).expect("an export written back parses");
    let again =
        read.to_config(data_dir, &base.tenants, ExportOrigin::StateFile).expect("an export written back is valid");
    assert_eq!(format!("{again:?}"), format!("{e:?}"), "an export does not survive the state file");
}

/// The bounds of an accepted access list: at most [`MAX_ALLOW_ENTRIES`] networks and identities, no
/// empty identity.
fn check_access(networks: &Option<usize>, identities: &Option<Vec<String>>) {
    assert!(networks.is_none_or(|n| n <= MAX_ALLOW_ENTRIES), "more than {MAX_ALLOW_ENTRIES} networks");
    if let Some(ids) = identities {
        assert!(ids.len() <= MAX_ALLOW_ENTRIES, "more than {MAX_ALLOW_ENTRIES} identities");
        assert!(ids.iter().all(|i| !i.is_empty()), "an empty identity accepted");
    }
}

/// Reads `data` (if UTF-8) as access-list lines and parses them as an export's `allow_networks` and
/// `allow_identities`; panics if a contract is broken (module comment). Lines: `n` or `i` alone makes the
/// list present (empty); `n:ENTRY` adds ENTRY to `allow_networks`, `i:ENTRY` to `allow_identities`;
/// other lines are ignored.
pub fn access_list(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (mut networks, mut identities): (Option<Vec<String>>, Option<Vec<String>>) = (None, None);
    for line in text.split('\n') {
        let (list, entry) = match line.split_at_checked(1) {
            Some(("n", rest)) => (&mut networks, rest),
            Some(("i", rest)) => (&mut identities, rest),
            _ => continue,
        };
        let list = list.get_or_insert_with(Vec::new);
        if let Some(entry) = entry.strip_prefix(':') {
            list.push(entry.to_string());
        }
    }
    let access = match config::parse_access("x", &networks, &identities) {
        Ok(access) => access,
        Err(e) => {
            let named = matches!(&e, config::SettingError::Export { export, error: config::ExportError::Access(_) } if export == "x");
            let text = e.to_string();
            let keyed = text.contains("allow_networks") || text.contains("allow_identities");
            assert!(
                named && keyed && text.starts_with("export x: "),
                "a refusal that does not name the export and key: {e}"
            );
            return;
        }
    };
    check_access(&access.networks.as_ref().map(|n| n.len()), &access.identities);
    assert_eq!(access.identities, identities, "identities changed");
    let written = networks.unwrap_or_default();
    let nets = access.networks.clone().unwrap_or_default();
    assert_eq!(nets.len(), written.len(), "a network entry lost or added");
    for (net, entry) in nets.iter().zip(&written) {
        assert!(!entry.is_empty(), "an empty network entry accepted");
        // The state file writes a network with `to_string` and parses it at the next start.
        let kept = config::parse_access("x", &Some(vec![net.to_string()]), &None).expect("a network written back");
        assert_eq!(kept.networks.as_deref(), Some(&[*net][..]), "{entry:?} does not survive the state file");
        // A client at the address an entry names (or at a network's first address) is allowed.
        let ip = entry.parse::<IpAddr>().unwrap_or(net.network());
        // (An empty `allow_identities` admits nobody.)
        let identity = access.identities.as_ref().map(|ids| ids.first().map(String::as_str));
        if let Some(identity) = identity.unwrap_or(Some("anyone")) {
            assert!(access.allows(ip, Some(identity)), "{entry:?}: a client at {ip} refused");
        } else {
            assert!(!access.allows(ip, Some("anyone")), "an empty allow_identities admitted a client");
        }
    }
}

/// A path no machine has: what a fuzzed `trace=` names instead (module comment).
const NO_TRACE: &str = "/nonexistent/rein-fuzz/job.trace";

/// Parses `data` (if UTF-8) as a `--job` value of a 60 s run; panics if a contract is broken (module
/// comment).
pub fn job_spec(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let spec: String = text
        .split(',')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.trim() == "trace" => format!("{k}={NO_TRACE}"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",");
    let run = Nanos::from_secs(60);
    let job = match job_spec::parse(&spec, run) {
        Ok(job) => job,
        Err(e) => {
            let e = e.to_string();
            let named = format!("job {spec:?}: ");
            assert!(e.starts_with(&named) && e.len() > named.len(), "a refusal that does not name the job: {e}");
            return;
        }
    };
    assert!(!job.name.is_empty() && !job.export.is_empty() && !job.tenant.is_empty(), "an empty name accepted");
    assert!(!job.name.chars().any(char::is_control), "a name with a control character accepted");
    assert!((1..=job_spec::MAX_CONNECTIONS).contains(&job.connections), "{} connections accepted", job.connections);
    let w = &job.workload;
    assert!((1..=MAX_SIZE_BYTES).contains(&w.size_bytes), "a size of {} bytes accepted", w.size_bytes);
    assert!((0.0..=1.0).contains(&w.read_frac) && (0.0..=1.0).contains(&w.random_frac), "a fraction out of range");
    assert!(w.span_bytes >= 1 << 20, "a span below 1 MiB");
    assert!(w.start < w.stop, "a start at or after the stop accepted");
    assert!(w.stop <= Nanos::from_secs_f64(rein_model::workload::MAX_SECONDS), "a stop beyond the bound accepted");
    assert!(w.start < run, "a start at or after the run's end accepted");
    fn check(kind: &WorkloadKind) {
        match kind {
            WorkloadKind::Closed { outstanding, .. } => {
                assert!((1..=MAX_OUTSTANDING).contains(outstanding), "a window of {outstanding} accepted")
            }
            WorkloadKind::Open { iops } => {
                assert!(iops.is_finite() && *iops > 0.0 && *iops <= MAX_RATE_IOPS, "a rate of {iops} accepted")
            }
            WorkloadKind::OnOff { on, inner, .. } => {
                assert!(*on > Nanos::ZERO, "an on period of no time accepted");
                check(&inner.kind())
            }
            WorkloadKind::Burst { count, period } => {
                assert!((1..=MAX_OUTSTANDING).contains(count), "a burst of {count} accepted");
                assert!(*count as f64 / period.as_secs_f64() <= MAX_RATE_IOPS, "a burst rate above the bound");
            }
            WorkloadKind::Trace { .. } => panic!("a trace read from {NO_TRACE}"),
        }
    }
    check(&w.kind);
}
