//! Trace devices mapped to servers (`routing = { devices = { .. } }`, `trace.devices`): RBFQ §4.2's
//! mapping of a trace's devices to flows and storage servers. Errors name the field.
use rein_model::report::TenantMetric;
use rein_sim::{run, Scenario};
use std::io::Write;

/// Device 0 every 10 ms, device 1 every 5 ms, device 2 every 20 ms, over 1 s.
fn trace_text() -> String {
    let mut s = String::new();
    for k in 0..200u64 {
        let t = k * 5_000_000;
        if k % 2 == 0 {
            s.push_str(&format!("{t} 0 {} 8 1\n", k * 8));
        }
        s.push_str(&format!("{t} 1 {} 8 1\n", k * 8));
        if k % 4 == 0 {
            s.push_str(&format!("{t} 2 {} 8 1\n", k * 8));
        }
    }
    s
}

fn scenario(dir: &std::path::Path, tenant: &str) -> String {
    format!(
        r#"
name = "t"
duration_s = 1.0
[[servers]]
name = "s1"
capacity_iops = 10000
[[servers]]
name = "s2"
capacity_iops = 10000
[[tenants]]
name = "f1"
{tenant}
[tenants.workload]
kind = "trace"
[tenants.workload.trace]
path = "{}"
format = "disksim"
"#,
        dir.join("t.trace").display()
    )
}

fn with_trace<T>(f: impl FnOnce(&std::path::Path) -> T) -> T {
    let dir = tempfile::tempdir().unwrap();
    std::fs::File::create(dir.path().join("t.trace")).unwrap().write_all(trace_text().as_bytes()).unwrap();
    f(dir.path())
}

#[test]
fn each_device_goes_to_its_server() {
    with_trace(|dir| {
        let text = scenario(dir, "routing = { devices = { s1 = [0, 2], s2 = [1] } }");
        let sc = Scenario::from_toml(&text, None).unwrap();
        let r = run(&sc, &mut |_| {}).unwrap();
        // s1: devices 0 and 2 (100 + 50 requests), s2: device 1 (200).
        let s1 = r.summary.servers[0].completed;
        let s2 = r.summary.servers[1].completed;
        assert_eq!((s1, s2), (150, 200));
        let iops = r.tenant_metric(0, TenantMetric::Iops, 0.0, 1.0);
        assert!((iops - 350.0).abs() < 1.0, "{iops}");
    });
}

#[test]
fn devices_filter_without_routing() {
    with_trace(|dir| {
        let sc = Scenario::from_toml(
            &scenario(dir, "servers = [\"s2\"]").replace("format", "devices = [2, 0]\nformat"),
            None,
        )
        .unwrap();
        let r = run(&sc, &mut |_| {}).unwrap();
        assert_eq!(r.summary.servers[1].completed, 150);
    });
}

#[test]
fn bad_device_maps_name_the_field() {
    with_trace(|dir| {
        let err = |tenant: &str| Scenario::from_toml(&scenario(dir, tenant), None).unwrap_err().to_string();
        assert!(err("routing = { devices = { s3 = [0] } }").contains("routing.devices names unknown server \"s3\""));
        assert!(err("routing = { devices = { s1 = [0], s2 = [0] } }").contains("maps trace device 0 twice"));
        assert!(
            err("servers = [\"s1\"]\nrouting = { devices = { s2 = [1] } }").contains("which the tenant does not use")
        );
        assert!(
            err("routing = { devices = { s1 = [0], s2 = [7] } }").contains("trace.devices: device 7 has no records")
        );
        assert!(err("routing = { devices = { s1 = [7] } }").contains("has no records (device filter [7])"));
        let both = scenario(dir, "routing = { devices = { s1 = [0] } }").replace("format", "device = 0\nformat");
        assert!(Scenario::from_toml(&both, None).unwrap_err().to_string().contains("the routing already says"));
        let twice = scenario(dir, "").replace("format", "device = 0\ndevices = [1]\nformat");
        assert!(Scenario::from_toml(&twice, None).unwrap_err().to_string().contains("exclusive"));
        let repeated = scenario(dir, "").replace("format", "devices = [1, 1]\nformat");
        assert!(Scenario::from_toml(&repeated, None).unwrap_err().to_string().contains("lists device 1 twice"));
    });
    let closed = "name = \"t\"\nduration_s = 1\n[[servers]]\nname = \"s1\"\ncapacity_iops = 10\n[[tenants]]\nname = \"a\"\nrouting = { devices = { s1 = [0] } }\n[tenants.workload]\nkind = \"closed\"\n";
    assert!(Scenario::from_toml(closed, None)
        .unwrap_err()
        .to_string()
        .contains("routing.devices routes trace records"));
}
