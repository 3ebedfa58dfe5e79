//! A scenario's independent groups (rein-sim's `model::group`): which tenants and servers form one, and
//! that running the groups apart and joining the totals gives the whole run byte for byte, so that
//! `rein cluster run --groups-at-once N` is checked on what the whole run would have measured.
use rein_model::report::{JoinError, Part};
use rein_sim::model::Group;
use rein_sim::{run, run_in_parts, RunTotals, Scenario};

/// Five servers, five tenants, four groups (the file's comment says which), random draws everywhere; shared
/// with `model::group`'s unit test, which shows the check below can fail.
const FIVE: &str = include_str!("common/groups-five.toml");

fn five() -> Scenario {
    Scenario::from_toml(FIVE, None).unwrap()
}

fn bytes(t: &RunTotals) -> (String, String) {
    (t.summary.to_json(), t.timeseries.to_csv())
}

#[test]
fn tenants_that_share_a_server_are_one_group() {
    let g = five().groups();
    assert_eq!(
        g,
        vec![
            Group { tenants: vec![0, 1], servers: vec![0, 1] },
            Group { tenants: vec![2], servers: vec![2] },
            Group { tenants: vec![3, 4], servers: vec![3] },
            Group { tenants: vec![], servers: vec![4] },
        ]
    );
    let part = five().part(&[&g[0], &g[2]]);
    let names = |v: Vec<&str>| v.into_iter().map(String::from).collect::<Vec<_>>();
    assert_eq!(part.tenants().iter().map(|t| t.name.clone()).collect::<Vec<_>>(), names(vec!["t1", "t2", "t4", "t5"]));
    assert_eq!(part.servers().iter().map(|s| s.name.clone()).collect::<Vec<_>>(), names(vec!["s1", "s2", "s4"]));
    // t2 lists s2 first: its indices follow the part's server list, its streams the whole's.
    assert_eq!(part.tenants()[1].servers, vec![1, 0]);
    assert_eq!(part.tenants()[3].servers, vec![2]);
    assert_eq!(part.tenants().iter().map(|t| t.stream).collect::<Vec<_>>(), vec![0, 1, 3, 4]);
    assert_eq!(part.servers().iter().map(|s| s.stream).collect::<Vec<_>>(), vec![0, 1, 3]);
}

#[test]
fn groups_run_apart_and_joined_are_the_whole_run() {
    let sc = five();
    let whole = bytes(&run(&sc, &mut |_| {}).unwrap());
    for at_once in [1, 2, 3, 4, 9] {
        let mut seen = Vec::new();
        let joined = run_in_parts(&sc, at_once, |part, k, n| {
            seen.push((part.tenants().len(), k, n));
            run(part, &mut |_| {})
        })
        .unwrap();
        assert_eq!(bytes(&joined), whole, "{at_once} groups at once");
        assert_eq!(seen.len(), 4_usize.div_ceil(at_once), "{at_once} at once: {seen:?}");
    }
    // The same under another seed: the streams, not the seed's value, keep the groups apart.
    let sc = sc.with_seed(7).unwrap();
    let whole = bytes(&run(&sc, &mut |_| {}).unwrap());
    assert_eq!(bytes(&run_in_parts(&sc, 1, |p, _, _| run(p, &mut |_| {})).unwrap()), whole);
}

#[test]
fn hosts_and_pshift_clusters_are_one_group() {
    let parda = r#"
name = "p"
duration_s = 10
[parda]
latency_threshold_ms = 30
[[servers]]
name = "a1"
capacity_iops = 1000
[[servers]]
name = "a2"
capacity_iops = 1000
[[hosts]]
name = "h1"
server = "a1"
[[hosts]]
name = "h2"
server = "a2"
[[tenants]]
name = "vm1"
host = "h1"
servers = ["a1"]
workload = { kind = "closed", outstanding = 8 }
[[tenants]]
name = "vm2"
host = "h2"
servers = ["a2"]
workload = { kind = "closed", outstanding = 8 }
"#;
    let sc = Scenario::from_toml(parda, None).unwrap();
    assert_eq!(sc.groups(), vec![Group { tenants: vec![0, 1], servers: vec![0, 1] }]);
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios/pshift-exp3-resv.toml")).unwrap();
    let sc = Scenario::from_toml(&text, None).unwrap();
    assert_eq!(sc.groups().len(), 1);
}

#[test]
fn a_join_refuses_parts_that_do_not_cover_the_whole() {
    let sc = five();
    let g = sc.groups();
    let part = |gs: &[&Group]| {
        let p = sc.part(gs);
        let totals = run(&p, &mut |_| {}).unwrap();
        let mut tenants: Vec<usize> = gs.iter().flat_map(|g| g.tenants.clone()).collect();
        let mut servers: Vec<usize> = gs.iter().flat_map(|g| g.servers.clone()).collect();
        tenants.sort_unstable();
        servers.sort_unstable();
        Part { totals, tenants, servers }
    };
    // Group 1 (t3 on s3) missing.
    let e = RunTotals::join(5, 5, vec![part(&[&g[0]]), part(&[&g[2], &g[3]])]).unwrap_err();
    assert_eq!(e, JoinError::Cover { what: "tenant", position: 2, count: 0 });
    // Group 2 twice.
    let e = RunTotals::join(5, 5, vec![part(&[&g[0], &g[1], &g[2]]), part(&[&g[2], &g[3]])]).unwrap_err();
    assert_eq!(e, JoinError::Cover { what: "tenant", position: 3, count: 2 });
    assert_eq!(e.to_string(), "tenant 3 is in 2 parts, not one");
    // Positions that do not match the part's run.
    let mut p = part(&[&g[1]]);
    p.tenants.push(3);
    let e = RunTotals::join(5, 5, vec![part(&[&g[0]]), p, part(&[&g[2], &g[3]])]);
    assert!(matches!(e, Err(JoinError::Cover { .. })), "{e:?}");
    let mut q = part(&[&g[2], &g[3]]);
    q.tenants.pop();
    let mut p = part(&[&g[1]]);
    p.tenants.push(4);
    let e = RunTotals::join(5, 5, vec![part(&[&g[0]]), p, q]).unwrap_err();
    assert_eq!(e, JoinError::Shape { part: 1, what: "1 tenants run, 2 positions given".into() });
}

/// A part whose run reports other intervals than the first part's (a real run cut short, say) makes
/// `run_in_parts` return an error naming the part, not panic.
#[test]
fn parts_whose_runs_do_not_fit_together_are_an_error() {
    let sc = five();
    let e = run_in_parts(&sc, 2, |part, k, _| {
        let mut t = run(part, &mut |_| {})?;
        if k == 1 {
            t.timeseries.intervals -= 1;
        }
        Ok::<_, rein_sim::SimError>(t)
    })
    .unwrap_err();
    assert_eq!(e.to_string(), "joining the parts' runs: part 1: its intervals differ from the first part's");
}
