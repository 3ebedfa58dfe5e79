//! Issue 12, point 2: the admin endpoint over HTTPS (`admin_tls = true`, the `[tls]` table's certificate),
//! driven by curl. The token is still required, a plain HTTP request gets one clear answer, a silent
//! client neither blocks others nor escapes the connection cap, `tls.ca` asks admin clients for a
//! certificate too, and configurations that cannot serve HTTPS are refused at start. Certificates are
//! made with the `openssl` command in a temporary directory; each server runs on its own 127.0.0.x
//! address (port 0).
#![cfg(unix)]

mod common;

use common::tls::{self, make_ca, make_cert};
use common::{config_file, config_text, local, tmpdir, tool, write_file, Rein, Server, MEMORY};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command as Cmd, Output};
use std::time::Duration;

const TOKEN: &str = "https-t0ken";

/// A temporary directory holding a CA (`ca-cert.pem`), a server certificate for 127.0.0.61..=64
/// (`server-cert.pem`, `server-key.pem`), a client certificate (`client-cert.pem`, `client-key.pem`, CN
/// alice) and the token file `admin.token` (mode 600).
fn credentials(name: &str) -> tempfile::TempDir {
    let tmp = tmpdir(&format!("https-{name}"));
    let dir = tmp.path();
    make_ca(dir, "ca", "rein-test-ca");
    let server = tls::server("IP:127.0.0.61,IP:127.0.0.62,IP:127.0.0.63,IP:127.0.0.64");
    make_cert(dir, "ca", "server", "server", &server);
    make_cert(dir, "ca", "client", "alice", tls::CLIENT);
    let token = dir.join("admin.token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    tmp
}

/// `config` with the memory export and its tenant inserted before its `[tls]` table (top-level keys
/// must come before the first table).
fn with_memory(config: &str) -> String {
    let (top, tables) = config.split_at(config.find("[tls]").unwrap_or(config.len()));
    format!("{top}{MEMORY}{tables}")
}

/// `admin_token_file` is relative to the working directory (the `[tls]` files to the config file's).
fn absolute_token(dir: &Path, config: &str) -> String {
    config.replace("\"admin.token\"", &format!("{:?}", dir.join("admin.token")))
}

/// Starts `rein serve` on 127.0.0.`host` with `config` (the memory export added, the token file made
/// absolute); its admin endpoint must be HTTPS.
fn start(dir: &Path, host: u8, config: &str) -> Server {
    let s = Rein::serve(&config_file(dir, host, &absolute_token(dir, &with_memory(config)))).start();
    let line = s.wait_line("rein serve listening");
    assert!(line.contains("admin_https=true"), "{line}");
    s
}

/// `rein serve` must refuse `config` (on 127.0.0.1, or on `head` when given); returns its stderr.
fn start_fails(dir: &Path, head: Option<&str>, config: &str) -> String {
    let head = head.map_or_else(|| local(1), str::to_string);
    let config = absolute_token(dir, &with_memory(config));
    Rein::serve(&write_file(dir, "bad.toml", &config_text(dir, &head, &config))).fails()
}

/// curl with the test CA, giving up after 20 s; `extra` before the URL. Returns the output with the
/// status code appended on its own line.
fn curl(dir: &Path, extra: &[&str], url: &str) -> Output {
    tool("curl")
        .current_dir(dir)
        .args(["-sS", "--max-time", "20", "--cacert", "ca-cert.pem", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .unwrap()
}

/// (status, body) of a curl call that must succeed at the TLS level.
fn curl_ok(dir: &Path, extra: &[&str], url: &str) -> (u16, String) {
    let out = curl(dir, extra, url);
    assert!(out.status.success(), "curl {url}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_string())
}

const HTTPS: &str = "admin_tls = true\nadmin_token_file = \"admin.token\"\n[tls]\ncert = \"server-cert.pem\"\nkey = \"server-key.pem\"\n";

/// Issue 12: `admin_tls = true` serves the endpoint over HTTPS with [tls]'s certificate (curl checks it
/// against the CA); `/healthz` answers without the token, `/api/tenants` needs it, as over HTTP.
#[test]
fn curl_gets_healthz_and_tenants_over_https_with_the_token() {
    let tmp = credentials("curl");
    let dir = tmp.path();
    let s = start(dir, 61, HTTPS);
    let base = format!("https://{}", s.admin);
    assert_eq!(curl_ok(dir, &[], &format!("{base}/healthz")), (200, "ok\n".to_string()));
    let (code, body) = curl_ok(dir, &[], &format!("{base}/api/tenants"));
    assert_eq!(code, 401, "{body}");
    let auth = format!("Authorization: Bearer {TOKEN}");
    let (code, body) = curl_ok(dir, &["-H", &auth], &format!("{base}/api/tenants"));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"name\":\"m\""), "{body}");
    // Two requests on one connection (keep-alive over TLS).
    let out = tool("curl")
        .current_dir(dir)
        .args(["-sS", "--max-time", "20", "--cacert", "ca-cert.pem", "-H", &auth])
        .args([format!("{base}/api/tenants"), format!("{base}/healthz")])
        .output()
        .unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).ends_with("ok\n"));
    // A client that does not trust the CA refuses the server.
    let out = tool("curl").args(["-sS", "--max-time", "20"]).arg(format!("{base}/healthz")).output().unwrap();
    assert!(!out.status.success(), "curl without the CA accepted the server");
}

/// Plain HTTP to the HTTPS port gets one clear answer (400 naming https://) and the connection closes;
/// the server keeps serving HTTPS.
#[test]
fn plain_http_to_the_https_port_is_told_to_use_https() {
    let tmp = credentials("plain");
    let dir = tmp.path();
    let s = start(dir, 62, HTTPS);
    let (code, body) = curl_ok(dir, &[], &format!("http://{}/healthz", s.admin));
    assert_eq!(code, 400, "{body}");
    assert_eq!(body, "this admin endpoint serves HTTPS only (admin_tls): use https://\n");
    // A raw client sees the whole answer, then the end of the stream.
    let mut t = TcpStream::connect(s.admin).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    t.write_all(format!("GET /api/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").as_bytes())
        .unwrap();
    let mut answer = String::new();
    t.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400 Bad Request\r\n") && answer.ends_with("use https://\n"), "{answer}");
    assert_eq!(curl_ok(dir, &[], &format!("https://{}/healthz", s.admin)), (200, "ok\n".to_string()));
}

/// The handshake runs in the connection's own task and holds a slot: with `max_admin_connections = 3`, a
/// silent client (TCP only) and one stalled mid-handshake do not keep curl waiting (the accept loop is
/// not waiting on them); with a third silent client all slots are taken and curl gets no answer; once one
/// is gone, curl is served again.
#[test]
fn a_silent_client_neither_blocks_curl_nor_escapes_the_cap() {
    let tmp = credentials("silent");
    let dir = tmp.path();
    let s = start(dir, 63, &format!("max_admin_connections = 3\nadmin_idle_timeout_s = 3600\n{HTTPS}"));
    let url = format!("https://{}/healthz", s.admin);
    let silent = TcpStream::connect(s.admin).unwrap();
    // Mid-handshake: a TLS record header that promises 200 bytes, and one of them.
    let mut stalled = TcpStream::connect(s.admin).unwrap();
    stalled.write_all(&[22, 3, 1, 0, 200, 1]).unwrap();
    assert_eq!(curl_ok(dir, &[], &url), (200, "ok\n".to_string()), "curl served beside two stalled clients");
    // All three slots held by clients that complete no handshake: curl's connection waits in the
    // kernel's queue.
    let third = TcpStream::connect(s.admin).unwrap();
    let out = tool("curl")
        .current_dir(dir)
        .args(["-sS", "--max-time", "2", "--cacert", "ca-cert.pem"])
        .arg(&url)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a connection beyond the cap got an answer: handshakes do not count");
    drop(third);
    assert_eq!(curl_ok(dir, &[], &url), (200, "ok\n".to_string()), "served once a slot is free");
    drop((silent, stalled));
}

/// The handshake has a deadline: a silent client is closed after `admin_idle_timeout_s` (then its slot
/// serves curl).
#[test]
fn a_silent_client_is_cut_at_the_idle_timeout() {
    let tmp = credentials("deadline");
    let dir = tmp.path();
    let s = start(dir, 64, &format!("max_admin_connections = 1\nadmin_idle_timeout_s = 0.5\n{HTTPS}"));
    let mut silent = TcpStream::connect(s.admin).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(silent.read(&mut b).unwrap_or(0), 0, "the silent connection was closed by the server");
    assert_eq!(curl_ok(dir, &[], &format!("https://{}/healthz", s.admin)), (200, "ok\n".to_string()));
}

/// With `tls.ca`, admin clients need a certificate from that CA too (the token still applies).
#[test]
fn with_a_ca_admin_clients_need_a_certificate() {
    let tmp = credentials("ca");
    let dir = tmp.path();
    let s = start(dir, 61, &format!("{HTTPS}ca = \"ca-cert.pem\"\n"));
    let url = format!("https://{}/api/tenants", s.admin);
    let out = curl(dir, &[], &url);
    assert!(!out.status.success(), "served without a client certificate");
    let auth = format!("Authorization: Bearer {TOKEN}");
    let cert = ["--cert", "client-cert.pem", "--key", "client-key.pem"];
    assert_eq!(curl_ok(dir, &cert, &url).0, 401, "the certificate does not replace the token");
    assert_eq!(curl_ok(dir, &[&cert[..], &["-H", &auth]].concat(), &url).0, 200);
    // rein load presents one with --admin-cert/--admin-key (it could not before).
    let load = |cert: &[&str]| {
        let mut c = Cmd::new(env!("CARGO_BIN_EXE_rein"));
        c.current_dir(dir).args(["load", "--addr", &s.nbd.to_string(), "--admin", &format!("https://{}", s.admin)]);
        c.args(["--admin-ca", "ca-cert.pem", "--admin-token-file", dir.join("admin.token").to_str().unwrap()]);
        c.args(cert).args(["--job", "name=m,depth=1", "--seconds", "1", "--warmup", "0", "--json"]).output().unwrap()
    };
    let out = load(&["--admin-cert", "client-cert.pem", "--admin-key", "client-key.pem"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.to_string().contains("\"reservation\":10"), "the report carries the server's spec: {v}");
    let out = load(&[]);
    assert!(!out.status.success(), "rein load without a client certificate was served");
    let out = load(&["--admin-cert", "client-cert.pem", "--admin-key", "server-key.pem"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--admin-key server-key.pem does not match the certificate in --admin-cert client-cert.pem"),
        "{err}"
    );
}

/// `rein load --admin https://ADDR --admin-ca CA` reads the tenants' specs over HTTPS (the report
/// carries the server's reservation); without the CA the server's certificate is not trusted, and a plain
/// `--admin ADDR` gets the server's "use https://" answer.
#[test]
fn rein_load_reads_the_specs_over_https() {
    let tmp = credentials("load");
    let dir = tmp.path();
    let s = start(dir, 62, HTTPS);
    let load = |admin: &str, ca: Option<&str>| {
        let mut c = Cmd::new(env!("CARGO_BIN_EXE_rein"));
        c.current_dir(dir).args(["load", "--addr", &s.nbd.to_string(), "--admin", admin]);
        c.args(["--admin-token-file", dir.join("admin.token").to_str().unwrap()]);
        if let Some(ca) = ca {
            c.args(["--admin-ca", ca]);
        }
        c.args(["--job", "name=m,depth=1", "--seconds", "1", "--warmup", "0", "--json"]).output().unwrap()
    };
    let https = format!("https://{}", s.admin);
    let out = load(&https, Some("ca-cert.pem"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.to_string().contains("\"reservation\":10"), "the report carries the server's spec: {v}");
    let out = load(&https, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("the server's certificate is not trusted"), "{err}");
    let out = load(&s.admin.to_string(), None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("HTTP 400: this admin endpoint serves HTTPS only"), "{err}");
    let out = load(&s.admin.to_string(), Some("ca-cert.pem"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--admin-ca ca-cert.pem is for an https:// admin endpoint"), "{err}");
}

/// `admin_tls` is read at start only: a reload (SIGHUP) that turns it off reports that it needs a restart
/// and the endpoint stays HTTPS. No reload takes the endpoint's TLS context away (rein-runtime's
/// `AdminTls`, which cannot hold none): `[tls]` removed with `admin_tls` kept refuses the reload,
/// and `[tls]` removed with `admin_tls` is a restart's business; either way a connection opened after
/// the reload (its handshake takes the context then) is served over HTTPS with the certificate it had.
#[test]
fn a_reload_does_not_change_admin_tls() {
    let tmp = credentials("reload");
    let dir = tmp.path();
    let s = start(dir, 64, HTTPS);
    let path = dir.join("rein.toml");
    let started = std::fs::read_to_string(&path).unwrap();
    let healthz = || curl_ok(dir, &[], &format!("https://{}/healthz", s.admin));
    std::fs::write(&path, started.replace("admin_tls = true\n", "")).unwrap();
    s.signal("-HUP");
    s.wait_line("admin_tls (needs a restart)");
    assert_eq!(healthz(), (200, "ok\n".to_string()));
    // [tls] removed, admin_tls kept: refused, naming the key.
    let no_table = started[..started.find("[tls]").unwrap()].to_string(); // [tls] is the last table
    assert!(!no_table.contains("server-cert.pem") && no_table.contains("admin_tls = true"), "{no_table}");
    std::fs::write(&path, &no_table).unwrap();
    s.signal("-HUP");
    let e = s.wait_line("the running configuration is unchanged");
    assert!(e.contains("admin_tls = true needs tls.cert and tls.key"), "{e}");
    assert_eq!(healthz(), (200, "ok\n".to_string()));
    // Both removed: a restart's business; still HTTPS.
    std::fs::write(&path, no_table.replace("admin_tls = true\n", "")).unwrap();
    s.signal("-HUP");
    common::wait_for(
        "a second \"admin_tls (needs a restart)\"",
        Duration::from_secs(30),
        || s.log.lock().unwrap().iter().filter(|l| l.contains("admin_tls (needs a restart)")).count(),
        |n| *n >= 2,
    );
    assert_eq!(healthz(), (200, "ok\n".to_string()));
}

/// Configurations that cannot serve HTTPS stop the server at start, naming the keys.
#[test]
fn admin_tls_without_a_certificate_is_refused() {
    let tmp = credentials("refused");
    let dir = tmp.path();
    let e = start_fails(dir, None, "admin_tls = true\n");
    assert!(
        e.contains("admin_tls = true needs tls.cert and tls.key (the admin endpoint's certificate) in [tls]"),
        "{e}"
    );
    let e = start_fails(dir, None, "admin_tls = true\n[tls]\nmode = \"off\"\n");
    assert!(e.contains("admin_tls = true needs tls.cert and tls.key"), "{e}");
    std::fs::write(dir.join("keys.psk"), "alice:0123456789abcdef\n").unwrap();
    let e = start_fails(dir, None, "admin_tls = true\n[tls]\nmode = \"require\"\npsk_file = \"keys.psk\"\n");
    assert!(e.contains("admin_tls = true needs tls.cert and tls.key: [tls] has only a psk_file"), "{e}");
    // TLS does not replace the token: a non-loopback address without one is still refused.
    let open = "listen = \"127.0.0.1:0\"\nadmin = \"0.0.0.0:0\"";
    let tls = "admin_tls = true\n[tls]\ncert = \"server-cert.pem\"\nkey = \"server-key.pem\"\n";
    let e = start_fails(dir, Some(open), tls);
    assert!(e.contains("is not a loopback address and no admin_token_file is set"), "{e}");
    let e = start_fails(dir, None, "admin_tls = \"yes\"\n");
    assert!(e.contains("admin_tls"), "{e}");
}
