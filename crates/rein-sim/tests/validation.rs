//! Bad scenarios get clear errors naming what is wrong.
mod common;

use common::err;
use rein_sim::Scenario;

const BASE: &str = r#"
name = "t"
duration_s = 10
[[servers]]
name = "s1"
capacity_iops = 1000
[[tenants]]
name = "a"
[tenants.workload]
kind = "closed"
"#;

#[test]
fn accepts_the_minimal_scenario() {
    let sc = Scenario::from_toml(BASE, None).unwrap();
    assert_eq!(sc.servers[0].queue_depth, 32);
    assert_eq!(sc.tenants[0].workload.size_bytes, 4096);
}

#[test]
fn rejects_bad_fields_with_clear_messages() {
    assert!(err(&BASE.replace("capacity_iops = 1000", "capacity_iops = 1000\ncapcity = 3"))
        .contains("unknown field `capcity`"));
    assert!(err(&BASE.replace("capacity_iops = 1000", "capacity_iops = -5"))
        .contains("capacity_iops must be a positive number"));
    assert!(err(&BASE.replace("duration_s = 10", "duration_s = 10\nwarmup_s = 20")).contains("warmup_s"));
    assert!(err(&BASE.replace("kind = \"closed\"", "kind = \"sometimes\"")).contains("workload kind \"sometimes\""));
    assert!(err(&BASE.replace("kind = \"closed\"", "kind = \"open\"")).contains("open workload needs iops"));
    assert!(err(&BASE.replace("name = \"a\"", "name = \"a\"\nreservation = 500\nlimit = 100"))
        .contains("reservation 500 exceeds limit 100"));
    assert!(
        err(&BASE.replace("name = \"a\"", "name = \"a\"\nservers = [\"nope\"]")).contains("unknown server \"nope\"")
    );
    assert!(
        err(&format!("{BASE}\nscheduler = \"wfq\"")).contains("unknown field")
            || err(&BASE.replace("duration_s = 10", "duration_s = 10\nscheduler = \"wfq\""))
                .contains("unknown scheduler")
    );
    assert!(err(&BASE.replace("duration_s = 10", "duration_s = 10\nscheduler = \"wfq\""))
        .contains("unknown scheduler \"wfq\""));
    let dup = format!("{BASE}\n[[tenants]]\nname = \"a\"\n[tenants.workload]\nkind = \"closed\"\n");
    assert!(err(&dup).contains("two tenants are named \"a\""));
    let exp = format!("{BASE}\n[[expect]]\ntenant = \"a\"\nmetric = \"iops\"\n");
    assert!(err(&exp).contains("says nothing to check"));
    let exp = format!("{BASE}\n[[expect]]\ntenant = \"zz\"\nmetric = \"iops\"\nabove = 1\n");
    assert!(err(&exp).contains("unknown tenant \"zz\""));
    let tr = BASE.replace("kind = \"closed\"", "kind = \"trace\"\ntrace = { path = \"/nonexistent.trace\" }");
    assert!(err(&tr).contains("cannot read trace"));
    assert!(err("name = \"x\"").contains("missing field"));
    let tiny = BASE.replace("name = \"a\"", "name = \"a\"\nrouting = { stripe_kb = 0.0001 }");
    assert!(err(&tiny).contains("stripe_kb 0.0001 is less than one byte"), "{}", err(&tiny));
}
