//! contrib/prometheus/rein-alerts.yml, the alerting rules for Rein's daemons: promtool validates them and
//! runs their unit tests (each alert fires on its condition, not on the healthy series beside it), and
//! every series an alert uses is one a running daemon exports (a rule on a misspelt or renamed series
//! would never fire, and nothing else would say so).
#![cfg(unix)]

mod common;

use common::{local, serve_in, tmpdir, write_file, Rein, MEMORY};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn contrib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/prometheus")
}

/// The series names in a `/metrics` text (a histogram's `_bucket`, `_sum` and `_count` under its own
/// name too).
fn names(text: &str) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
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
fn the_alerting_rules_pass_promtool_and_use_only_series_the_daemons_export_which_pass_its_lint() {
    let rules = contrib().join("rein-alerts.yml");
    let tests = contrib().join("rein-alerts.test.yml");
    for args in [vec!["check", "rules", rules.to_str().unwrap()], vec!["test", "rules", tests.to_str().unwrap()]] {
        let out = std::process::Command::new("promtool")
            .args(&args)
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
    let gw_text = format!(
        "{}\n[[nodes]]\nname = \"s1\"\naddress = \"{}\"\nprotocol = \"nbd\"\n[[tenants]]\nname = \"vm1\"\n\
         [[exports]]\nname = \"v\"\ntenant = \"vm1\"\nsize_mb = 8\n\
         [parda]\nlatency_threshold_ms = 10\nperiod_s = 0.5\nw_max = 64\naggregation = \"local\"\n[parda_host]\nid = 0\n",
        local(184),
        node.nbd
    );
    let gw = Rein::gateway(&write_file(tmp.path(), "gw.toml", &gw_text)).start();
    let ctl_text = "listen = \"127.0.0.185:0\"\nadmin = \"127.0.0.185:0\"\nperiod_s = 1\nintervals = 5\n\
                    [[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n[[buckets]]\nname = \"b1\"\nreservation_iops = 100\n\
                    limit_iops = 200\n";
    let ctl = Rein::new(&[
        "pshift",
        "controller",
        "--config",
        write_file(tmp.path(), "ctl.toml", ctl_text).to_str().unwrap(),
    ])
    .start();
    let server = serve_in(
        &tmp.path().join("pshift-server"),
        &local(186),
        &format!("scheduler = \"token\"\n{MEMORY}[pshift]\ncontroller = \"{}\"\nname = \"s1\"\n", ctl.nbd),
    );
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
        let mut rest = line;
        while let Some(at) = rest.find("rein_") {
            let name: String =
                rest[at..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
            rest = &rest[at + name.len()..];
            used.insert(name);
        }
    }
    assert!(used.len() >= 10, "the rules' series: {used:?}");
    let missing: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(missing.is_empty(), "alerting rules use series no daemon exports: {missing:?}\n(exported: {exported:?})");
}
