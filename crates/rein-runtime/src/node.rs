//! The node side of the storage-node protocol (docs/node-protocol.md): what `rein serve` answers to a
//! gateway's hello.
//!
//! # Model
//! A gateway (`rein gateway`) runs one dmClock/RBFQ tracker per tenant and spreads each tenant's IO over
//! storage nodes; each node runs its own scheduler (mclock-dmclock.txt §3.2.1, rbfq-repair.txt §3.2). The
//! hello ([`NodeHello`]) names the gateway's tenants and their specs; this module decides, per tenant,
//! which spec the node's scheduler applies and which dispatcher tenant serves the slot:
//! - `[node] specs = "node"`: the node's own `[[tenants]]` (and admin changes) win. A tenant the node
//!   does not know refuses the whole hello with NBD_REP_ERR_POLICY naming it; a spec that differs from
//!   the gateway's is kept, reported (source 0, the node's spec in the welcome) and logged.
//! - `[node] specs = "gateway"`: the gateway's specs are adopted through [`Registry::adopt`] as `PUT` (a
//!   known tenant whose spec differs) or `POST /api/tenants` (a new one) would, but as one change for the
//!   whole hello: validated, admitted against the capacity as a whole (so their order does not matter),
//!   persisted. A refusal (admission) refuses the hello with NBD_REP_ERR_POLICY and the registry's message,
//!   and changes no tenant; so does a hello that would add tenants beyond `[node] max_tenants` (a
//!   gateway's hellos add tenants and never remove any, so without a bound it could fill the scheduler).
//!
//! # RBFQ's local reservation
//! As rein-sim builds a server's spec from `server_reservations` (rein-sim `model::tenant`), a tenant
//! whose hello carries `local_reservation` M_ij > 0 gets, at this node, the spec (M_ij, max(limit, M_ij),
//! weight, idle credit): the node guarantees M_ij locally, whatever the scheduler. Otherwise the node's
//! spec is the global one, and dmClock's share (spread) or rho splits the reservation per request.
//!
//! # Invariants
//! 1. A granted session has one slot per hello tenant, in the hello's order, slot `i` = index `i`, and
//!    one dispatcher tenant per slot (what the NBD layer indexes with the tag's slot).
//! 2. Only peers that `[node] allow_networks` / `allow_identities` admit get past the first check; the
//!    others change nothing.
//!
//! # Logs
//! INFO once per granted hello: the peer, each tenant with the source of its spec, and the tenants whose
//! specs disagree (named). INFO for a refused hello with its reason, at most once a second
//! ([`crate::access::SparseLog`]; the next line says how many were not logged, `unlogged`): a peer may
//! send hellos as fast as it writes, many on one connection, and need not be admitted to be refused.
//!
//! # Symbol map
//! | paper | here |
//! |---|---|
//! | M_ij, RBFQ's local minimum | [`NodeTenant::local_reservation`] -> the node spec's reservation |
//! | r_i, l_i, w_i (mClock) | [`NodeTenant::reservation`], `limit`, `weight` |
//!
//! # Boot identity
//! From protocol version 2 the welcome carries the node's boot identity, drawn once when the service
//! starts: a gateway that reconnects learns whether it reached the same scheduler (keep the tenant's
//! account: the service elsewhere meanwhile is its delta) or a restarted one (start the account afresh).
//!
//! # Deviations
//! - The hello adopts specs before the gateway opens an export: a gateway that leaves after its hello has
//!   still changed the specs under `specs = "gateway"` (as an admin PUT would have). The welcome, which
//!   answers the hello, states the specs granted, so they are decided then; a hello is all or nothing.

use crate::config::{NodeConfig, NodeSpecs};
use crate::live::Registry;
use crate::nbd::{NodeGate, NodeSession, NodeVerdict};
use crate::sock::Peer;
use rein_core::QosSpec;
use rein_proto::nbd::{
    NodeGranted, NodeHello, NodeTenant, NodeWelcome, SpecSource, NODE_VERSION, REP_ERR_INVALID, REP_ERR_POLICY,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// `rein serve`'s [`NodeGate`]: the `[node]` settings over the server's registry.
pub struct NodeService {
    config: NodeConfig,
    registry: Arc<Registry>,
    /// This node's boot identity (a v2 welcome's `boot`): drawn once, when the service starts.
    boot: u64,
    /// Refused hellos, logged at most once a second (module comment, "Logs").
    refusals: crate::access::SparseLog,
    /// Hellos answered with a welcome, and refused: `/metrics` ([`NodeService::metrics`]).
    hellos: [std::sync::atomic::AtomicU64; 2],
}

impl std::fmt::Debug for NodeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeService").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The spec a hello tenant asks of this node (module comment: the local reservation replaces the global
/// one when set). Errors name the tenant.
pub fn asked_spec(t: &NodeTenant) -> Result<QosSpec, AskedSpecError> {
    let (reservation, limit) = if t.local_reservation > 0.0 {
        (t.local_reservation, t.limit.map(|l| l.max(t.local_reservation)))
    } else {
        (t.reservation, t.limit)
    };
    QosSpec::new(reservation, limit, t.weight, t.idle_credit)
        .map_err(|error| AskedSpecError { tenant: t.name.clone(), error })
}

/// A hello tenant's spec that no scheduler takes ([`asked_spec`]): the tenant and why; the hello's refusal
/// message.
#[derive(Debug, thiserror::Error)]
#[error("tenant {tenant:?}: {error}")]
pub struct AskedSpecError {
    /// The tenant's name as the hello gives it.
    pub tenant: String,
    /// Why the spec is refused.
    #[source]
    pub error: rein_core::SpecError,
}

/// A boot identity: random (std's per-process hash keys, with the time and the process id), never 0.
fn boot_identity() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish() | 1
}

fn granted(slot: usize, source: SpecSource, spec: QosSpec, local_reservation: f64) -> NodeGranted {
    NodeGranted {
        slot: slot as u32,
        source,
        reservation: spec.reservation(),
        limit: spec.limit(),
        weight: spec.weight(),
        local_reservation,
    }
}

impl NodeService {
    /// The gate for `config` (which must be enabled) over `registry`.
    pub fn new(config: NodeConfig, registry: Arc<Registry>) -> NodeService {
        assert!(config.enabled, "a node service only for [node] enabled = true");
        NodeService {
            config,
            registry,
            boot: boot_identity(),
            refusals: Default::default(),
            hellos: Default::default(),
        }
    }

    /// `rein_node_hellos_total{result}`: the storage-node hellos welcomed and refused (a refusal is logged
    /// at most once a second, so the count is what says how many gateways were turned away, by
    /// `allow_networks`/`allow_identities`, a spec out of range, or `max_tenants`).
    pub fn metrics(&self, o: &mut String) {
        use std::fmt::Write;
        let [welcomed, refused] = self.hellos.each_ref().map(|n| n.load(std::sync::atomic::Ordering::Relaxed));
        let _ = writeln!(
            o,
            "# HELP rein_node_hellos_total Storage-node hellos from gateways, by result.\n\
             # TYPE rein_node_hellos_total counter\n\
             rein_node_hellos_total{{result=\"welcomed\"}} {welcomed}\n\
             rein_node_hellos_total{{result=\"refused\"}} {refused}"
        );
    }

    /// The boot identity this node states in v2 welcomes.
    pub fn boot(&self) -> u64 {
        self.boot
    }

    async fn decide(&self, peer: Peer, identity: Option<&str>, hello: NodeHello) -> NodeVerdict {
        if !self.config.access.allows(peer.ip(), identity) {
            let who = identity.map_or(String::new(), |i| format!(" (identity {i:?})"));
            let addr = match peer {
                Peer::Tcp(a) => a.ip().to_string(),
                Peer::Unix { .. } => format!("{peer} (counted as {})", peer.ip()),
            };
            let msg =
                format!("{addr}{who} may not use the storage-node protocol ([node] allow_networks/allow_identities)");
            return Err((REP_ERR_POLICY, msg));
        }
        let asked: Vec<QosSpec> = hello
            .tenants
            .iter()
            .map(|t| asked_spec(t).map_err(|e| (REP_ERR_INVALID, e.to_string())))
            .collect::<Result<_, _>>()?;
        let mut tenants = Vec::with_capacity(hello.tenants.len());
        let mut answer = Vec::with_capacity(hello.tenants.len());
        let mut disagree = Vec::new();
        match self.config.specs {
            NodeSpecs::Node => {
                // One snapshot for the whole hello, of its tenants; each looked up by name, then by id.
                let names = self.registry.tenants();
                let known = hello.tenants.iter().filter_map(|t| names.id(&t.name)).collect();
                let snap =
                    self.registry.dispatcher().snapshot_of(known).await.map_err(|e| (REP_ERR_POLICY, e.to_string()))?;
                let by_id = snap.by_id();
                for (slot, (t, &asked)) in hello.tenants.iter().zip(&asked).enumerate() {
                    let Some(id) = names.id(&t.name) else {
                        let msg = format!("tenant {:?} is not known to this node ([node] specs = \"node\")", t.name);
                        return Err((REP_ERR_POLICY, msg));
                    };
                    let Some(spec) = by_id.get(&id).map(|t| t.spec) else {
                        return Err((REP_ERR_POLICY, format!("tenant {:?} is gone", t.name)));
                    };
                    if spec != asked {
                        disagree.push(format!("{} (node {spec}, gateway {asked})", t.name));
                    }
                    tenants.push(id);
                    answer.push(granted(slot, SpecSource::Node, spec, 0.0));
                }
            }
            NodeSpecs::Gateway => {
                // One change for the whole hello (Registry::adopt): admitted as a whole, or nothing changes.
                let wanted: Vec<(String, QosSpec)> =
                    hello.tenants.iter().zip(&asked).map(|(t, &s)| (t.name.clone(), s)).collect();
                let (ids, _warning) = self.registry.adopt(&wanted, self.config.max_tenants).await.map_err(|e| {
                    let names: Vec<String> = hello.tenants.iter().map(|t| format!("{:?}", t.name)).collect();
                    let which = if names.len() == 1 { "tenant" } else { "tenants" };
                    (REP_ERR_POLICY, format!("the gateway's specs for {which} {}: {e}", names.join(", ")))
                })?;
                tenants = ids;
                for (slot, (t, &asked)) in hello.tenants.iter().zip(&asked).enumerate() {
                    answer.push(granted(slot, SpecSource::Gateway, asked, t.local_reservation));
                }
            }
        }
        let names: Vec<&str> = hello.tenants.iter().map(|t| t.name.as_str()).collect();
        let source = match self.config.specs {
            NodeSpecs::Node => "node",
            NodeSpecs::Gateway => "gateway",
        };
        tracing::info!(%peer, tenants = ?names, specs = source, disagree = ?disagree, "storage-node session granted");
        debug_assert_eq!(tenants.len(), hello.tenants.len(), "invariant 1");
        let version = hello.version.min(NODE_VERSION);
        let welcome = NodeWelcome { version, tenants: answer, boot: (version >= 2).then_some(self.boot) };
        Ok(NodeSession { welcome, tenants })
    }
}

impl NodeGate for NodeService {
    fn hello<'a>(
        &'a self,
        peer: Peer,
        identity: Option<&'a str>,
        hello: NodeHello,
    ) -> Pin<Box<dyn Future<Output = NodeVerdict> + Send + 'a>> {
        Box::pin(async move {
            let verdict = self.decide(peer, identity, hello).await;
            self.hellos[usize::from(verdict.is_err())].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Err((_, msg)) = &verdict {
                if let Some(unlogged) = self.refusals.due() {
                    tracing::info!(%peer, unlogged, "storage-node hello refused: {msg}");
                }
            }
            verdict
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::ExportAccess;
    use crate::config::Admission;
    use crate::dispatch::{DispatchConfig, Dispatcher};
    use rein_proto::nbd::NodeSplit;

    /// A node service over a registry with tenant "t" (reservation 100 of a capacity of 1,000).
    async fn service(specs: NodeSpecs, networks: &[&str], identities: Option<&[&str]>) -> NodeService {
        service_with(DispatchConfig::default(), specs, networks, identities).await
    }

    async fn service_with(
        config: DispatchConfig,
        specs: NodeSpecs,
        networks: &[&str],
        identities: Option<&[&str]>,
    ) -> NodeService {
        let (d, _join) = Dispatcher::spawn(None, config);
        let spec = QosSpec::new(100.0, None, 1.0, 0).unwrap();
        let id = d.add_tenant(spec).await.unwrap();
        let registry = Registry::for_tenants(d, vec![("t".into(), spec, id)], Admission::Refuse, Some(1000.0));
        let access = ExportAccess {
            networks: Some(networks.iter().map(|n| n.parse().unwrap()).collect()),
            identities: identities.map(|ids| ids.iter().map(|i| i.to_string()).collect()),
        };
        NodeService::new(NodeConfig { enabled: true, specs, access, ..NodeConfig::default() }, Arc::new(registry))
    }

    impl NodeService {
        /// The spec tenant `id` has now.
        async fn spec_of(&self, id: rein_core::TenantId) -> QosSpec {
            crate::live::spec_in(&self.registry.dispatcher().snapshot().await.unwrap(), id, "?").unwrap()
        }

        fn id_of(&self, name: &str) -> Option<rein_core::TenantId> {
            self.registry.tenants().id(name)
        }
    }

    fn peer(ip: &str) -> Peer {
        Peer::Tcp(std::net::SocketAddr::new(ip.parse().unwrap(), 40000))
    }

    fn named(name: &str, reservation: f64) -> NodeTenant {
        NodeTenant { name: name.into(), ..tenant(reservation, None, 0.0) }
    }

    /// `allow_networks` and `allow_identities` together: the identity (known after STARTTLS) must be
    /// listed and the address in a listed network; anything else is refused by policy, naming the peer.
    #[tokio::test]
    async fn only_allowed_peers_and_identities_may_speak_it() {
        let node = service(NodeSpecs::Node, &["10.0.0.0/8"], Some(&["gw"])).await;
        let hello = || NodeHello::new(vec![named("t", 100.0)]);
        assert!(node.hello(peer("10.1.2.3"), Some("gw"), hello()).await.is_ok());
        for (ip, identity) in [("10.1.2.3", None), ("10.1.2.3", Some("mallory")), ("192.168.0.1", Some("gw"))] {
            let (code, msg) = node.hello(peer(ip), identity, hello()).await.unwrap_err();
            assert_eq!(code, REP_ERR_POLICY);
            assert!(msg.starts_with(ip) && msg.contains("may not use the storage-node protocol"), "{msg}");
        }
        // A Unix peer counts as 127.0.0.1 (not in 10.0.0.0/8) and is named by its credentials.
        let unix = Peer::Unix { uid: Some(1000), pid: Some(7) };
        let (_, msg) = node.hello(unix, Some("gw"), hello()).await.unwrap_err();
        assert!(msg.starts_with("unix(uid 1000, pid 7) (counted as 127.0.0.1) (identity \"gw\") may not"), "{msg}");
    }

    /// `specs = "node"`: the node's spec wins and is reported with source 0; an unknown tenant refuses.
    #[tokio::test]
    async fn specs_node_keeps_the_nodes_spec() {
        let node = service(NodeSpecs::Node, &["127.0.0.0/8"], None).await;
        let s = node.hello(peer("127.0.0.1"), None, NodeHello::new(vec![named("t", 900.0)])).await.unwrap();
        let g = &s.welcome.tenants[0];
        assert_eq!((g.slot, g.source, g.reservation), (0, SpecSource::Node, 100.0));
        let (code, msg) = node.hello(peer("127.0.0.1"), None, NodeHello::new(vec![named("u", 1.0)])).await.unwrap_err();
        assert_eq!(code, REP_ERR_POLICY);
        assert!(msg.contains("tenant \"u\" is not known"), "{msg}");
    }

    /// `specs = "gateway"`: adopted through the registry, admission included, the hello as one change
    /// (capacity 1,000; t has 100): u at 950 alone is refused (1,050); u at 950 with t lowered to 50 fits
    /// in either order (1,000), though u first would not fit one tenant at a time.
    #[tokio::test]
    async fn specs_gateway_adopts_with_admission() {
        let node = service(NodeSpecs::Gateway, &["127.0.0.0/8"], None).await;
        let (code, msg) =
            node.hello(peer("127.0.0.1"), None, NodeHello::new(vec![named("u", 950.0)])).await.unwrap_err();
        assert_eq!(code, REP_ERR_POLICY);
        assert!(msg.contains("\"u\"") && msg.contains("capacity"), "{msg}");
        let hello = NodeHello::new(vec![named("u", 950.0), named("t", 50.0)]);
        let s = node.hello(peer("127.0.0.1"), None, hello).await.unwrap();
        assert!(s.welcome.tenants.iter().all(|g| g.source == SpecSource::Gateway));
        assert_eq!(s.tenants.len(), 2);
        let names: Vec<String> = node.registry.tenants().iter().map(|t| t.0.clone()).collect();
        assert_eq!(names, ["t", "u"]);
        assert_eq!(node.spec_of(s.tenants[0]).await.reservation(), 950.0, "slot 0 is u");
        assert_eq!(node.spec_of(s.tenants[1]).await.reservation(), 50.0, "slot 1 is t");
    }

    /// A refused hello changes nothing: t raised to 900 would fit alone, but with v at 200 the whole does
    /// not (1,100 > 1,000), so t keeps 100 and v is not added, though t comes first in the hello.
    #[tokio::test]
    async fn a_refused_hello_changes_no_tenant() {
        let node = service(NodeSpecs::Gateway, &["127.0.0.0/8"], None).await;
        let hello = NodeHello::new(vec![named("t", 900.0), named("v", 200.0)]);
        let (code, msg) = node.hello(peer("127.0.0.1"), None, hello).await.unwrap_err();
        assert_eq!(code, REP_ERR_POLICY);
        assert!(msg.contains("1100") && msg.contains("capacity of 1000"), "{msg}");
        let names: Vec<String> = node.registry.tenants().iter().map(|t| t.0.clone()).collect();
        assert_eq!(names, ["t"], "v not added");
        let t = node.id_of("t").unwrap();
        assert_eq!(node.spec_of(t).await.reservation(), 100.0, "t unchanged");
        // The same hello with v at 100 fits (1,000) and changes both.
        let s = node.hello(peer("127.0.0.1"), None, NodeHello::new(vec![named("t", 900.0), named("v", 100.0)])).await;
        assert_eq!(s.unwrap().tenants.len(), 2);
        assert_eq!(node.spec_of(t).await.reservation(), 900.0);
    }

    /// A hello whose apply fails part-way (the scheduler takes 2 tenants: t, then v; w is refused) is
    /// undone: v removed again, t's spec back to 100, and the refusal names the cause.
    #[tokio::test]
    async fn a_hello_that_fails_part_way_is_undone() {
        let mut config = DispatchConfig::default();
        config.sched.limits.max_tenants = 2;
        let node = service_with(config, NodeSpecs::Gateway, &["127.0.0.0/8"], None).await;
        let hello = NodeHello::new(vec![named("t", 50.0), named("v", 10.0), named("w", 10.0)]);
        let (code, msg) = node.hello(peer("127.0.0.1"), None, hello).await.unwrap_err();
        assert_eq!(code, REP_ERR_POLICY);
        assert!(msg.contains("tenant \"w\": ") && msg.contains("too many tenants (limit 2)"), "{msg}");
        let names: Vec<String> = node.registry.tenants().iter().map(|t| t.0.clone()).collect();
        assert_eq!(names, ["t"]);
        let snap = node.registry.dispatcher().snapshot().await.unwrap();
        assert_eq!(snap.tenants.len(), 1, "v removed from the scheduler too");
        assert_eq!(snap.tenants[0].spec.reservation(), 100.0, "t's spec restored");
    }

    /// `[node] max_tenants` at its bound (4; the node holds t): a hello that brings the node to 4 tenants
    /// is granted, one more new tenant is refused naming the bound (and nothing changes), while hellos that
    /// add none (the node's tenants, specs changed or not) are still granted and the tenants served.
    #[tokio::test]
    async fn a_hello_may_not_add_tenants_beyond_max_tenants() {
        let mut node = service(NodeSpecs::Gateway, &["127.0.0.0/8"], None).await;
        node.config.max_tenants = 4;
        let lo = || peer("127.0.0.1");
        let s = node.hello(lo(), None, NodeHello::new(vec![named("u", 10.0), named("v", 10.0)])).await.unwrap();
        assert_eq!(s.tenants.len(), 2, "3 tenants");
        let (code, msg) =
            node.hello(lo(), None, NodeHello::new(vec![named("w", 10.0), named("x", 10.0)])).await.unwrap_err();
        assert_eq!(code, REP_ERR_POLICY);
        let want = "adding 2 would make 5 tenants on this node, above its [node] max_tenants of 4";
        assert!(msg.contains(want) && msg.contains("\"w\", \"x\""), "{msg}");
        // One below the bound, one new tenant passes (4 = the bound) ...
        let s = node.hello(lo(), None, NodeHello::new(vec![named("t", 100.0), named("w", 10.0)])).await.unwrap();
        assert_eq!(s.tenants.len(), 2);
        // ... and at the bound, another is refused; nothing changed (t keeps 100, x not added).
        let (code, msg) =
            node.hello(lo(), None, NodeHello::new(vec![named("t", 200.0), named("x", 10.0)])).await.unwrap_err();
        assert_eq!(code, REP_ERR_POLICY);
        assert!(msg.contains("adding 1 would make 5 tenants") && msg.contains("max_tenants of 4"), "{msg}");
        let names: Vec<String> = node.registry.tenants().iter().map(|t| t.0.clone()).collect();
        assert_eq!(names, ["t", "u", "v", "w"]);
        let t = node.id_of("t").unwrap();
        assert_eq!(node.spec_of(t).await.reservation(), 100.0);
        // The node's tenants are still granted, a spec change included, and their IO served.
        let hello = NodeHello::new(vec![named("t", 200.0), named("u", 10.0), named("v", 10.0), named("w", 10.0)]);
        let s = node.hello(lo(), None, hello).await.unwrap();
        assert_eq!(node.spec_of(t).await.reservation(), 200.0);
        let storage: Arc<dyn crate::storage::Storage> = Arc::new(crate::storage::MemStorage::new(1 << 20));
        for &id in &s.tenants {
            let req = crate::dispatch::IoRequest {
                storage: storage.clone(),
                tenant: id,
                offset: 0,
                op: crate::dispatch::Op::read(4096),
                fua: false,
                piggyback: None,
            };
            let done = node.registry.dispatcher().io(req).await;
            assert!(done.is_ok(), "{:?}", done.err());
        }
    }

    fn tenant(reservation: f64, limit: Option<f64>, local_reservation: f64) -> NodeTenant {
        NodeTenant {
            name: "c".into(),
            reservation,
            limit,
            weight: 2.0,
            local_reservation,
            idle_credit: 1,
            split: NodeSplit::Spread,
        }
    }

    /// As rein-sim's `server_reservations`: M_ij replaces r, and the limit rises to at least M_ij.
    #[test]
    fn the_local_reservation_replaces_the_global_one() {
        assert_eq!(
            asked_spec(&tenant(100.0, Some(300.0), 0.0)).unwrap(),
            QosSpec::new(100.0, Some(300.0), 2.0, 1).unwrap()
        );
        assert_eq!(
            asked_spec(&tenant(100.0, Some(30.0), 50.0)).unwrap(),
            QosSpec::new(50.0, Some(50.0), 2.0, 1).unwrap()
        );
        assert_eq!(asked_spec(&tenant(100.0, None, 50.0)).unwrap(), QosSpec::new(50.0, None, 2.0, 1).unwrap());
        let e = asked_spec(&tenant(100.0, Some(30.0), 0.0)).unwrap_err().to_string();
        assert!(e.contains("tenant \"c\""), "{e}");
        // Typed: the tenant and the spec's error, with the message the String error had.
        let e = asked_spec(&tenant(100.0, Some(30.0), 0.0)).unwrap_err();
        assert!(
            matches!(&e, AskedSpecError { tenant, error: rein_core::SpecError::ReservationAboveLimit { .. } } if tenant == "c"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "tenant \"c\": reservation 100 exceeds limit 30");
    }
}
