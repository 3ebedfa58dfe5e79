//! The configuration examples in the docs load: the `rein.toml` block of docs/serve.md, the `gw.toml`
//! block of docs/gateway.md and its first try's node and gateway, read from the repository's files and
//! parsed by the parsers `rein serve` and `rein gateway` use, in a directory holding the files they name
//! (certificates made with openssl, a PSK file), so an example cannot drift from what the programs accept.
#![cfg(unix)]

mod common;

use common::tls::{make_ca, make_cert, server, CLIENT};
use std::path::{Path, PathBuf};

/// The text of `docs/NAME` in this repository.
fn doc(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The first fenced ```toml block of the section the line `heading` opens in `text`.
fn toml_block(text: &str, heading: &str) -> String {
    let block = toml_blocks(text, heading).into_iter().next();
    block.unwrap_or_else(|| panic!("no ```toml block after {heading:?}"))
}

/// Every fenced ```toml block between the line `heading` and the next `## ` heading in `text`.
fn toml_blocks(text: &str, heading: &str) -> Vec<String> {
    let mut lines = text.lines().skip_while(|l| l.trim() != heading);
    assert!(lines.next().is_some(), "no heading {heading:?}");
    let (mut blocks, mut block): (Vec<String>, Option<Vec<&str>>) = (Vec::new(), None);
    for l in lines.take_while(|l| !l.starts_with("## ")) {
        match (&mut block, l.trim()) {
            (None, "```toml") => block = Some(Vec::new()),
            (Some(b), "```") => {
                blocks.push(b.join("\n") + "\n");
                block = None;
            }
            (Some(b), _) => b.push(l),
            (None, _) => {}
        }
    }
    blocks
}

/// A directory with what the examples name: a CA (`ca-cert.pem`) and its CRL (`ca-crl.pem`), a server's
/// certificate and key (`server-cert.pem`, `server-key.pem`), a gateway's (`gw-cert.pem`, `gw-key.pem`)
/// and a PSK file (`keys.psk`).
fn files() -> tempfile::TempDir {
    let tmp = common::tmpdir("docs-examples");
    let dir = tmp.path();
    make_ca(dir, "ca", "docs CA");
    make_cert(dir, "ca", "server", "s1.example.com", &server("IP:127.0.0.1,DNS:s1.example.com"));
    make_cert(dir, "ca", "gw", "gw-a", CLIENT);
    common::tls::make_crl(dir, "ca", "ca-crl.pem");
    std::fs::write(dir.join("keys.psk"), format!("alice:{}\n", "ab".repeat(32))).unwrap();
    tmp
}

fn config_path(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// docs/serve.md's `rein.toml` example is a configuration `rein serve` accepts.
#[test]
fn the_rein_toml_example_in_serve_md_loads() {
    let tmp = files();
    let text = toml_block(&doc("serve.md"), "## Configuration (`rein.toml`)");
    assert!(text.contains("[[tenants]]") && text.contains("[device_model]"), "the whole example: {text}");
    let path = config_path(tmp.path(), "rein.toml", &text);
    let cfg = rein_runtime::config::ServerConfig::parse(&text, &path).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(cfg.exports[0].name, "rd");
}

/// docs/gateway.md's `gw.toml` example is a configuration `rein gateway` accepts.
#[test]
fn the_gw_toml_example_in_gateway_md_loads() {
    let tmp = files();
    let text = toml_block(&doc("gateway.md"), "## Configuration (`gw.toml`)");
    assert!(text.contains("[[nodes]]") && text.contains("[[exports]]"), "the whole example: {text}");
    let path = config_path(tmp.path(), "gw.toml", &text);
    rein_runtime::gateway::GatewayConfig::parse(&text, &path).unwrap_or_else(|e| panic!("{e}\n{text}"));
}

/// docs/gateway.md's first try: the node's `rein.toml` and the `gw.toml` load, and fit each other (the
/// node takes the gateway's specs and has the volume's export, as large as the volume's part on it).
#[test]
fn the_gateway_md_first_try_loads() {
    let tmp = common::tmpdir("docs-first-try");
    let blocks = toml_blocks(&doc("gateway.md"), "## A first try on one machine");
    assert_eq!(blocks.len(), 2, "a node's rein.toml and a gw.toml: {blocks:?}");
    let path = config_path(tmp.path(), "node1.toml", &blocks[0]);
    let node =
        rein_runtime::config::ServerConfig::parse(&blocks[0], &path).unwrap_or_else(|e| panic!("{e}\n{}", blocks[0]));
    let path = config_path(tmp.path(), "gw.toml", &blocks[1]);
    rein_runtime::gateway::GatewayConfig::parse(&blocks[1], &path).unwrap_or_else(|e| panic!("{e}\n{}", blocks[1]));
    assert_eq!(node.exports.len(), 1);
    assert_eq!(node.exports[0].name, "c2");
    assert_eq!(node.exports[0].size, Some(512 << 20), "half of the 1,024 MiB volume over two nodes");
    assert!(blocks[1].contains("widths = { s1 = 1, s2 = 1 }") && blocks[1].contains("size_mb = 1024"));
}

/// docs/operations.md's first configuration is one `rein serve` accepts, and says what the runbook says
/// of it (two tenants whose reservations fit the capacity, admission refusing beyond it).
#[test]
fn the_runbooks_rein_toml_loads() {
    let tmp = files();
    let text = toml_block(&doc("operations.md"), "## 2. A first configuration");
    let path = config_path(tmp.path(), "rein.toml", &text);
    let cfg = rein_runtime::config::ServerConfig::parse(&text, &path).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(cfg.exports.len(), 2);
    assert_eq!(cfg.admission, rein_runtime::config::Admission::Refuse);
    let reserved: f64 = cfg.tenants.iter().map(|t| t.spec.reservation()).sum();
    assert!(reserved <= cfg.capacity_iops.unwrap(), "{reserved} reserved of {:?}", cfg.capacity_iops);
}
