//! The admin HTTP endpoint over a real loopback socket.
use rein_core::QosSpec;
use rein_model::device::{DeviceSpec, ServiceModel};
use rein_runtime::admin::{router, AdminState};
use rein_runtime::config::Admission;
use rein_runtime::live::Registry;
use rein_runtime::{DeviceConfig, DispatchConfig, Dispatcher, IoRequest, MemStorage, Op, Storage};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (code, body)
}

async fn start(with_model: bool, admission: Admission) -> (std::net::SocketAddr, Dispatcher, Vec<rein_core::TenantId>) {
    let device = with_model.then(|| DeviceConfig {
        spec: DeviceSpec::new(1000.0, ServiceModel::Deterministic).unwrap(),
        seed: 1,
        stream: 0,
        service_scale: Vec::new(),
    });
    let (d, _join) = Dispatcher::spawn(device, DispatchConfig::default());
    let (sa, sb) = (QosSpec::new(300.0, None, 1.0, 0).unwrap(), QosSpec::new(0.0, Some(500.0), 2.0, 0).unwrap());
    let a = d.add_tenant(sa).await.unwrap();
    let b = d.add_tenant(sb).await.unwrap();
    let capacity = with_model.then_some(1000.0);
    let tenants = vec![("rd".into(), sa, a), ("dm \"x\"".into(), sb, b)];
    let state = AdminState {
        registry: Arc::new(Registry::for_tenants(d.clone(), tenants, admission, capacity)),
        reloads: Arc::new(rein_runtime::reloads::Reloads::new("serve")),
        connections: rein_runtime::access::ConnLimits::new(Default::default()),
        node: None,
        pshift_link: None,
        admin_accepts: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await.unwrap() });
    (addr, d, vec![a, b])
}

#[tokio::test]
async fn metrics_and_tenants() {
    let (addr, d, ids) = start(true, Admission::Refuse).await;
    let st: Arc<dyn Storage> = Arc::new(MemStorage::new(1 << 20));
    for _ in 0..5 {
        d.io(IoRequest {
            storage: st.clone(),
            tenant: ids[0],
            offset: 0,
            op: Op::read(4096),
            fua: false,
            piggyback: None,
        })
        .await
        .unwrap();
    }
    let (code, m) = http(addr, "GET", "/metrics", "").await;
    assert_eq!(code, 200);
    for needle in [
        "rein_tenant_completed_total{tenant=\"rd\",phase=\"reservation\"}",
        "rein_tenant_latency_seconds_bucket{tenant=\"rd\",le=\"+Inf\"} 5",
        "rein_tenant_latency_seconds_count{tenant=\"rd\"} 5",
        "rein_tenant_bytes_total{tenant=\"rd\"} 20480",
        "rein_tenant_limit_iops{tenant=\"dm \\\"x\\\"\"} 500",
        "rein_backend_queue_depth 32",
        "rein_device_capacity_iops 1000",
        "rein_tenant_queued{tenant=\"rd\"} 0",
        "rein_tenant_enqueued_total{tenant=\"rd\"} 5",
        "rein_tenant_iops{tenant=\"rd\"}",
        "rein_tenant_below_reservation_seconds_total{tenant=\"rd\"} 0",
        "rein_backend_latency_seconds_count 5",
        "rein_worker_busy_seconds_total{worker=\"0\"} ",
        "io_engine=\"uring\"",
    ] {
        assert!(m.contains(needle), "missing {needle} in\n{m}");
    }
    let (code, t) = http(addr, "GET", "/api/tenants", "").await;
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
    assert_eq!(v[0]["name"], "rd");
    assert_eq!(v[0]["completed"], 5);
    assert_eq!(v[1]["limit"], 500.0);
}

#[tokio::test]
async fn spec_changes_are_validated_and_applied() {
    let (addr, d, ids) = start(true, Admission::Refuse).await;
    // Valid change (limit removed with null).
    let (code, body) =
        http(addr, "PUT", "/api/tenants/rd", r#"{"reservation": 200, "weight": 3, "limit": null}"#).await;
    assert_eq!(code, 200, "{body}");
    let snap = d.snapshot().await.unwrap();
    let rd = snap.tenants.iter().find(|t| t.id == ids[0]).unwrap();
    assert_eq!((rd.spec.reservation(), rd.spec.weight(), rd.spec.limit()), (200.0, 3.0, None));
    // Invalid values: 400 with the reason; nothing changes.
    let (code, body) = http(addr, "PUT", "/api/tenants/rd", r#"{"reservation": 900, "limit": 100}"#).await;
    assert_eq!(code, 400);
    assert!(body.contains("reservation 900 exceeds limit 100"), "{body}");
    let (code, body) = http(addr, "PUT", "/api/tenants/rd", r#"{"weight": -1}"#).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = http(addr, "PUT", "/api/tenants/rd", r#"{"wieght": 2}"#).await;
    assert!(code == 400 && body.contains("unknown field"), "{body}");
    let (code, _) = http(addr, "PUT", "/api/tenants/rd", "not json").await;
    assert_eq!(code, 400);
    let snap = d.snapshot().await.unwrap();
    assert_eq!(snap.tenants.iter().find(|t| t.id == ids[0]).unwrap().spec.reservation(), 200.0, "no silent change");
    // Unknown tenant.
    assert_eq!(http(addr, "PUT", "/api/tenants/nobody", r#"{"weight": 2}"#).await.0, 404);
    // Admission: 1,000 IOPS device, reservations above it are refused with 409.
    let (code, body) = http(addr, "PUT", "/api/tenants/rd", r#"{"reservation": 1200}"#).await;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("above the reservable capacity"), "{body}");
    // Capacity change.
    assert_eq!(http(addr, "PUT", "/api/capacity", r#"{"iops": 500}"#).await.0, 200);
    assert_eq!(d.snapshot().await.unwrap().capacity_iops, Some(500.0));
    assert_eq!(http(addr, "PUT", "/api/capacity", r#"{"iops": -5}"#).await.0, 400);
}

#[tokio::test]
async fn admission_warn_applies_with_a_warning() {
    let (addr, _d, _) = start(true, Admission::Warn).await;
    let (code, body) = http(addr, "PUT", "/api/tenants/rd", r#"{"reservation": 1200}"#).await;
    assert_eq!(code, 200);
    assert!(body.contains("warning") && body.contains("above the reservable capacity"), "{body}");
    // A capacity below the reservations: applied, with a warning.
    let (code, body) = http(addr, "PUT", "/api/capacity", r#"{"iops": 500}"#).await;
    assert!(code == 200 && body.contains("above the new capacity of 500"), "{code} {body}");
}

/// Issue 12, point 5: with no capacity known, admission fails closed and says how to set one; the capacity
/// can be set without a device model; a capacity below the reservations is refused; `GET /api/capacity`
/// says what is in use and where it came from. Before: a reservation raised with no capacity was accepted
/// unchecked, `PUT /api/capacity` was 404 without a model and accepted any value with one (an unreserved
/// tenant then got 2 IOPS), and `GET /api/capacity` was 405.
#[tokio::test]
async fn capacity_is_reported_checked_and_needed() {
    let (addr, d, _) = start(false, Admission::Refuse).await;
    let (code, body) = http(addr, "GET", "/api/capacity", "").await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["iops"].clone(), v["source"].as_str(), v["reserved_iops"].as_f64()),
        (serde_json::Value::Null, Some("none"), Some(300.0))
    );
    let (code, body) = http(addr, "PUT", "/api/tenants/rd", r#"{"reservation": 400}"#).await;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("no capacity is known") && body.contains("PUT /api/capacity"), "{body}");
    // A change that does not raise the reservations is never refused.
    assert_eq!(http(addr, "PUT", "/api/tenants/rd", r#"{"reservation": 250}"#).await.0, 200);
    let (code, body) = http(addr, "PUT", "/api/capacity", r#"{"iops": 200}"#).await;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("250") && body.contains("200"), "{body}");
    assert_eq!(http(addr, "PUT", "/api/capacity", r#"{"iops": 1000}"#).await.0, 200);
    let v: serde_json::Value = serde_json::from_str(&http(addr, "GET", "/api/capacity", "").await.1).unwrap();
    assert_eq!((v["iops"].as_f64(), v["source"].as_str()), (Some(1000.0), Some("admin")));
    assert_eq!(d.snapshot().await.unwrap().capacity_iops, None, "no device model to change");
    assert_eq!(http(addr, "PUT", "/api/tenants/rd", r#"{"reservation": 400}"#).await.0, 200);
    for bad in [r#"{"iops": 0}"#, r#"{"iops": -5}"#, r#"{"iops": "x"}"#, r#"{}"#] {
        assert_eq!(http(addr, "PUT", "/api/capacity", bad).await.0, 400, "{bad}");
    }
}

/// Issue 12, point 5: tenants and exports added and deleted at run time, with the documented refusals.
#[tokio::test]
async fn tenants_and_exports_are_added_and_deleted_live() {
    let (addr, d, _) = start(true, Admission::Refuse).await;
    let post = |path: &'static str, body: &'static str| http(addr, "POST", path, body);
    let (code, body) = post("/api/tenants", r#"{"name": "new", "reservation": 100, "weight": 2}"#).await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = http(addr, "GET", "/api/tenants/new", "").await;
    assert!(code == 200 && body.contains("\"reservation\":100.0"), "{body}");
    assert_eq!(post("/api/tenants", r#"{"name": "new"}"#).await.0, 409);
    let (code, body) = post("/api/tenants", r#"{"name": "big", "reservation": 700}"#).await;
    assert!(code == 409 && body.contains("above the reservable capacity"), "{body}");
    assert_eq!(post("/api/tenants", r#"{"name": ""}"#).await.0, 400);
    assert_eq!(post("/api/tenants", r#"{"name": "x", "weight": 0}"#).await.0, 400);
    let long = format!(r#"{{"name": "{}"}}"#, "n".repeat(257));
    assert_eq!(http(addr, "POST", "/api/tenants", &long).await.0, 400);
    let (code, body) =
        post("/api/exports", r#"{"name": "e", "backend": "memory", "size_mb": 1, "tenant": "new"}"#).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(
        post("/api/exports", r#"{"name": "e", "backend": "memory", "size_mb": 1, "tenant": "new"}"#).await.0,
        409
    );
    assert_eq!(
        post("/api/exports", r#"{"name": "f", "backend": "memory", "size_mb": 1, "tenant": "nobody"}"#).await.0,
        400
    );
    let (code, body) =
        post("/api/exports", r#"{"name": "f", "path": "../f.img", "size_mb": 1, "tenant": "new"}"#).await;
    assert!(code == 400 && body.contains("must be relative"), "{body}");
    // A memory export that fits the RAM alone but not with the running one (e, 1 MiB).
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let body = format!(r#"{{"name": "f", "backend": "memory", "size_mb": {}, "tenant": "new"}}"#, kib / 1024);
    let (code, answer) = http(addr, "POST", "/api/exports", &body).await;
    assert!(code == 400 && answer.contains(&format!("(e = 1 MiB, f = {} MiB)", kib / 1024)), "{answer}");
    let (code, body) = http(addr, "GET", "/api/exports", "").await;
    assert!(code == 200 && body.contains("\"name\":\"e\"") && body.contains("\"tenant\":\"new\""), "{body}");
    let (code, body) = http(addr, "DELETE", "/api/tenants/new", "").await;
    assert!(code == 409 && body.contains("used by export"), "{body}");
    assert_eq!(http(addr, "DELETE", "/api/exports/e", "").await.0, 204);
    assert_eq!(http(addr, "DELETE", "/api/exports/e", "").await.0, 404);
    assert_eq!(http(addr, "DELETE", "/api/tenants/new", "").await.0, 204);
    assert_eq!(http(addr, "GET", "/api/tenants/new", "").await.0, 404);
    assert_eq!(http(addr, "DELETE", "/api/tenants/new", "").await.0, 404);
    assert_eq!(d.snapshot().await.unwrap().tenants.len(), 2);
}

/// Validation, admission and apply are one step (issue "A server you can expose", point 4): two PUTs that
/// each fit the capacity alone but not together are never both accepted, and concurrent partial updates
/// of one tenant never lose a field. Before the change, concurrent PUTs validated against the same
/// snapshot: both reservations were accepted, and a weight update was overwritten by an idle-credit one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_puts_never_exceed_the_capacity_or_lose_an_update() {
    let (addr, d, ids) = start(true, Admission::Refuse).await;
    for round in 0..40 {
        for name in ["rd", "dm%20%22x%22"] {
            let (code, body) = http(addr, "PUT", &format!("/api/tenants/{name}"), r#"{"reservation": 0}"#).await;
            assert_eq!(code, 200, "{body}");
        }
        // 600 + 450 > 1,000 (the model's capacity; dm's limit is 500): exactly one may be accepted.
        let a = tokio::spawn(async move { http(addr, "PUT", "/api/tenants/rd", r#"{"reservation": 600}"#).await });
        let b = tokio::spawn(
            async move { http(addr, "PUT", "/api/tenants/dm%20%22x%22", r#"{"reservation": 450}"#).await },
        );
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        let mut codes = [a.0, b.0];
        codes.sort();
        assert_eq!(codes, [200, 409], "round {round}: {a:?} {b:?}");
        let snap = d.snapshot().await.unwrap();
        let total: f64 = snap.tenants.iter().map(|t| t.spec.reservation()).sum();
        assert!(total <= 1000.0, "round {round}: reservations total {total}");
    }
    // Two writers of different fields of one tenant, 50 updates each, interleaved.
    let w = tokio::spawn(async move {
        for k in 1..=50 {
            let (code, body) = http(addr, "PUT", "/api/tenants/rd", &format!(r#"{{"weight": {k}}}"#)).await;
            assert_eq!(code, 200, "{body}");
        }
    });
    let c = tokio::spawn(async move {
        for k in 1..=50 {
            let (code, body) = http(addr, "PUT", "/api/tenants/rd", &format!(r#"{{"idle_credit": {k}}}"#)).await;
            assert_eq!(code, 200, "{body}");
        }
    });
    w.await.unwrap();
    c.await.unwrap();
    let snap = d.snapshot().await.unwrap();
    let rd = snap.tenants.iter().find(|t| t.id == ids[0]).unwrap().spec;
    assert_eq!((rd.weight(), rd.idle_credit()), (50.0, 50), "an update was lost: {rd}");
}

/// The export table's bound: `POST /api/exports` stops at `MAX_EXPORTS` with a 409.
#[tokio::test]
async fn exports_stop_at_their_bound() {
    use rein_runtime::config::MAX_EXPORTS;
    use rein_runtime::live::ChangeError;
    use rein_runtime::state::ExportJson;
    let (d, _join) = Dispatcher::spawn(None, DispatchConfig::default());
    let spec = QosSpec::default();
    let id = d.add_tenant(spec).await.unwrap();
    let r = std::sync::Arc::new(Registry::for_tenants(d, vec![("t".into(), spec, id)], Admission::Refuse, None));
    let export = |i: usize| ExportJson {
        name: format!("e{i}"),
        backend: "memory".into(),
        path: None,
        size_mb: Some(1),
        tenant: "t".into(),
        read_only: false,
        direct: false,
        readahead: true,
        allow_networks: None,
        allow_identities: None,
    };
    for i in 0..MAX_EXPORTS {
        r.add_export(export(i)).await.unwrap();
    }
    assert_eq!(r.exports().snapshot().len(), MAX_EXPORTS);
    match r.add_export(export(MAX_EXPORTS)).await {
        Err(ChangeError::Conflict(m)) => assert!(m.contains("at most 4096 exports"), "{m}"),
        other => panic!("{other:?}"),
    }
}
