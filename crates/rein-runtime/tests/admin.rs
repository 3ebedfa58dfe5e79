//! The admin HTTP endpoint over a real loopback socket.
use rein_core::QosSpec;
use rein_model::device::{DeviceSpec, ServiceModel};
use rein_runtime::admin::{router, AdminState};
use rein_runtime::config::Admission;
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
    let device = with_model
        .then(|| DeviceConfig { spec: DeviceSpec::new(1000.0, ServiceModel::Deterministic).unwrap(), seed: 1 });
    let (d, _join) = Dispatcher::spawn(device, DispatchConfig::default());
    let a = d.add_tenant(QosSpec::new(300.0, None, 1.0, 0).unwrap()).await.unwrap();
    let b = d.add_tenant(QosSpec::new(0.0, Some(500.0), 2.0, 0).unwrap()).await.unwrap();
    let state = AdminState {
        dispatcher: d.clone(),
        tenants: Arc::new(vec![("rd".into(), a), ("dm \"x\"".into(), b)]),
        admission,
        capacity_iops: None,
        changes: Default::default(),
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
        d.io(IoRequest { storage: st.clone(), tenant: ids[0], offset: 0, op: Op::read(4096), fua: false })
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
        "rein_tenant_iops{tenant=\"rd\"}",
        "rein_tenant_below_reservation_seconds_total{tenant=\"rd\"} 0",
        "rein_backend_latency_seconds_count 5",
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
async fn admission_warn_applies_with_a_warning_and_capacity_needs_a_model() {
    let (addr, _d, _) = start(true, Admission::Warn).await;
    let (code, body) = http(addr, "PUT", "/api/tenants/rd", r#"{"reservation": 1200}"#).await;
    assert_eq!(code, 200);
    assert!(body.contains("warning") && body.contains("above the reservable capacity"), "{body}");
    let (addr, _d, _) = start(false, Admission::Refuse).await;
    assert_eq!(http(addr, "PUT", "/api/capacity", r#"{"iops": 500}"#).await.0, 404);
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
