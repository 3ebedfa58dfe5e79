//! contrib/prometheus/rein-alerts.yml, the alerting rules for Rein's daemons, and
//! contrib/grafana/rein.json, the dashboard: promtool validates the rules and runs their unit tests (each
//! alert fires on its condition, not on the healthy series beside it) and parses every query of the
//! dashboard; every series a rule or a panel uses is one a running daemon exports (a rule or a panel on a
//! misspelt or renamed series would never fire or show, and nothing else would say so).
#![cfg(unix)]

mod common;

use common::{local, serve_in, tmpdir, write_file, MEMORY};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn contrib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/prometheus")
}

/// The `rein_` series named in a PromQL expression.
fn series_in(expr: &str, into: &mut BTreeSet<String>) {
    let mut rest = expr;
    while let Some(at) = rest.find("rein_") {
        let name: String =
            rest[at..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        into.insert(name);
    }
}

/// Runs promtool with `args`; panics with what it said unless it succeeds.
fn promtool(args: &[&str]) {
    let out = std::process::Command::new("promtool")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("promtool ({e}): scripts/test.sh installs it (package prometheus)"));
    assert!(
        out.status.success(),
        "promtool {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The dashboard's queries, each with its panel's title, after its checks: every panel but a row has a
/// unique id, a title, a description, a unit, a place on the 24-column grid and at least one query with
/// its own refId; the dashboard picks its data source and daemons by variable.
fn dashboard_queries(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let vars: Vec<&str> =
        dash["templating"]["list"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(vars, ["datasource", "instance", "tenant"], "the dashboard's variables");
    let mut ids = BTreeSet::new();
    let mut queries = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        let title =
            p["title"].as_str().filter(|t| !t.is_empty()).unwrap_or_else(|| panic!("a panel without a title: {p}"));
        assert!(ids.insert(p["id"].as_u64().unwrap()), "panel id {} twice ({title})", p["id"]);
        let grid = &p["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(w > 0 && x + w <= 24 && grid["h"].as_u64().unwrap() > 0, "{title}: off the grid ({grid})");
        if p["type"] == "row" {
            continue;
        }
        assert!(p["description"].as_str().is_some_and(|d| d.len() > 20), "{title}: say what it shows");
        assert!(p["fieldConfig"]["defaults"]["unit"].as_str().is_some_and(|u| !u.is_empty()), "{title}: a unit");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}: the data source variable");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty()).unwrap_or_else(|| panic!("{title}: no query"));
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(refs.insert(t["refId"].as_str().unwrap()), "{title}: refId twice");
            let expr = t["expr"].as_str().unwrap();
            assert!(expr.contains("$instance"), "{title}: a query not filtered by the daemon variable: {expr}");
            queries.push((title.to_string(), expr.to_string()));
        }
    }
    assert!(queries.len() >= 30, "the dashboard's queries: {}", queries.len());
    queries
}

/// Every query of the dashboard parses as PromQL: promtool checks them as recording rules, with Grafana's
/// variables put as a query sees them (a regex for each multi-value variable, a range for
/// `$__rate_interval`).
fn promtool_parses(queries: &[(String, String)], dir: &Path) {
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, expr)) in queries.iter().enumerate() {
        let expr = expr.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$tenant", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    let path = write_file(dir, "dashboard-rules.yml", &rules);
    promtool(&["check", "rules", path.to_str().unwrap()]);
}

/// The series names in a `/metrics` text (a histogram's `_bucket`, `_sum` and `_count` under its own
/// name too), and the families it declares (`# TYPE`) with no sample yet, as a pShift bucket's last
/// period before one has closed.
fn names(text: &str) -> BTreeSet<String> {
    let mut set: BTreeSet<String> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next().map(str::to_string)).collect();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let name = line.split(['{', ' ']).next().unwrap().to_string();
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                set.insert(base.to_string());
            }
        }
        set.insert(name);
    }
    set
}

/// `promtool check metrics` on a daemon's `/metrics` text: the exposition parses and its names, types and
/// help follow Prometheus's conventions (counters end in `_total`, base units, a HELP per family), so a
/// scrape and the dashboards built on it see what the names say.
fn lint(who: &str, text: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics on {who}'s /metrics: {said}");
}

#[test]
fn the_alerting_rules_and_the_dashboard_pass_promtool_and_use_only_series_the_daemons_export() {
    let rules = contrib().join("rein-alerts.yml");
    let tests = contrib().join("rein-alerts.test.yml");
    promtool(&["check", "rules", rules.to_str().unwrap()]);
    promtool(&["test", "rules", tests.to_str().unwrap()]);

    // A rein serve node (with a certificate, for its expiry), a PARDA host (a gateway with [parda]) over
    // it, a pShift controller, and a rein serve that is its server.
    let tmp = tmpdir("alerts");
    common::tls::make_ca(tmp.path(), "ca", "ca");
    common::tls::make_cert(tmp.path(), "ca", "node", "127.0.0.183", &common::tls::server("IP:127.0.0.183"));
    let node = serve_in(
        &tmp.path().join("node"),
        &local(183),
        &format!(
            "{MEMORY}[[exports]]\nname = \"v\"\nbackend = \"memory\"\nsize_mb = 8\n[tls]\nmode = \"on\"\ncert = \"{}\"\n\
             key = \"{}\"\n",
            tmp.path().join("node-cert.pem").display(),
            tmp.path().join("node-key.pem").display()
        ),
    );
    let gw = common::parda_gateway(tmp.path(), 184, node.nbd, 0);
    let ctl = common::pshift_controller(tmp.path(), 185);
    let server = common::pshift_server(&tmp.path().join("pshift-server"), 186, ctl.nbd);
    let mut exported = BTreeSet::new();
    for (who, s) in
        [("rein serve", &node), ("rein gateway", &gw), ("the pShift controller", &ctl), ("its server", &server)]
    {
        let text = common::metrics(s.admin);
        lint(who, &text);
        exported.extend(names(&text));
    }

    let text = std::fs::read_to_string(&rules).unwrap();
    let mut used = BTreeSet::new();
    for line in text.lines().filter_map(|l| l.trim().strip_prefix("expr:")) {
        series_in(line, &mut used);
    }
    assert!(used.len() >= 10, "the rules' series: {used:?}");
    let missing: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(missing.is_empty(), "alerting rules use series no daemon exports: {missing:?}\n(exported: {exported:?})");

    // The dashboard: its shape, its queries parsed by promtool, and each panel's series exported.
    let dashboard = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/grafana/rein.json");
    let queries = dashboard_queries(&dashboard);
    promtool_parses(&queries, tmp.path());
    for (title, expr) in &queries {
        let mut used = BTreeSet::new();
        series_in(expr, &mut used);
        assert!(!used.is_empty(), "{title}: a query on no Rein series: {expr}");
        let missing: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
        assert!(missing.is_empty(), "dashboard panel \"{title}\" uses series no daemon exports: {missing:?}");
    }
}
