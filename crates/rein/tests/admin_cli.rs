//! `rein admin` against a running `rein serve`: each subcommand's effect is read back through the admin
//! API itself (raw HTTP), not through `rein admin`; refusals come back as the endpoint's own message and
//! a failing exit; a token-protected endpoint needs `--admin-token-file`.
#![cfg(unix)]

mod common;

use common::{http, local, serve_in, tmpdir, write_file, Rein};
use std::net::SocketAddr;
use std::process::Command;

/// Runs `rein admin ARGS...`: (success, stdout, stderr).
fn rein_admin(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rein")).arg("admin").args(args).env("NO_COLOR", "1").output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Runs `rein admin --admin ADDR ARGS...`: (success, stdout, stderr).
fn admin(addr: SocketAddr, args: &[&str]) -> (bool, String, String) {
    rein_admin(&[&["--admin", &addr.to_string()], args].concat())
}

/// `rein admin ARGS...`, which must succeed: its stdout.
fn admin_ok(addr: SocketAddr, args: &[&str]) -> String {
    let (ok, out, err) = admin(addr, args);
    assert!(ok, "rein admin {args:?}: {err}");
    out
}

/// The tenants as the endpoint lists them (raw HTTP).
fn tenants(addr: SocketAddr) -> Vec<serde_json::Value> {
    let (status, _, body) = http(addr, "GET", "/api/tenants", "", "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn rein_admin_lists_changes_adds_and_removes_tenants_through_the_endpoint() {
    let tmp = tmpdir("admin-cli");
    let server = serve_in(
        &tmp.path().join("s"),
        &local(87),
        "capacity_iops = 1000\n[[exports]]\nname = \"v\"\nbackend = \"memory\"\nsize_mb = 8\ntenant = \"vm1\"\n\
         [[tenants]]\nname = \"vm1\"\nreservation = 100\nlimit = 500\n",
    );
    let a = server.admin;

    // The table: a header and one line per tenant, with its spec.
    let table = admin_ok(a, &["tenants"]);
    let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0][..4], ["TENANT", "RESERVATION", "LIMIT", "WEIGHT"], "{table}");
    assert_eq!(lines[1][..4], ["vm1", "100", "500", "1"], "{table}");

    // set: only what is given changes; --no-limit removes the limit.
    let said = admin_ok(a, &["set", "vm1", "--limit", "800", "--weight", "2"]);
    assert_eq!(said.trim(), "set vm1: reservation 100, limit 800, weight 2, idle credit 0");
    let t = &tenants(a)[0];
    assert_eq!(
        (t["reservation"].as_f64(), t["limit"].as_f64(), t["weight"].as_f64()),
        (Some(100.0), Some(800.0), Some(2.0))
    );
    admin_ok(a, &["set", "vm1", "--no-limit"]);
    assert!(tenants(a)[0]["limit"].is_null(), "the limit removed");

    // add, with a name that is not a plain path segment; then remove it.
    let said = admin_ok(a, &["add", "db 2/x", "--reservation", "300"]);
    assert!(said.starts_with("added db 2/x: reservation 300, limit none, weight 1"), "{said}");
    let names: Vec<String> = tenants(a).iter().map(|t| t["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["vm1", "db 2/x"]);
    assert_eq!(admin_ok(a, &["remove", "db 2/x"]).trim(), "removed tenant db 2/x");
    assert_eq!(tenants(a).len(), 1);

    // Refusals: the endpoint's message, once, and a failing exit.
    let (ok, _, err) = admin(a, &["add", "big", "--reservation", "950"]);
    assert!(!ok && err.contains("HTTP 409: reservations would total 1050 IOPS"), "{err}");
    assert!(!err.contains("{\""), "the message without its JSON: {err}");
    let (ok, _, err) = admin(a, &["remove", "vm1"]);
    assert!(!ok && err.contains("is used by export \"v\""), "{err}");
    let (ok, _, err) = admin(a, &["set", "nosuch", "--weight", "3"]);
    assert!(!ok && err.contains("HTTP 404: no tenant named \"nosuch\""), "{err}");
    let (ok, _, err) = admin(a, &["set", "vm1"]);
    assert!(!ok && err.contains("nothing to change"), "{err}");
    let (ok, _, err) = admin(a, &["set", "vm1", "--limit", "5", "--no-limit"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");

    // Exports and capacity; --json prints the endpoint's answer.
    let exports = admin_ok(a, &["exports"]);
    assert_eq!(
        exports.lines().nth(1).unwrap().split_whitespace().collect::<Vec<_>>(),
        ["v", "vm1", "8.0", "no"],
        "{exports}"
    );
    let cap = admin_ok(a, &["capacity"]);
    assert_eq!(cap.trim(), "capacity 1000 IOPS (from config), reserved 100 IOPS, admission refuse");
    assert_eq!(admin_ok(a, &["capacity", "2000"]).trim(), "capacity 2000 IOPS");
    let j: serde_json::Value = serde_json::from_str(&admin_ok(a, &["--json", "capacity"])).unwrap();
    assert_eq!((j["iops"].as_f64(), j["source"].as_str()), (Some(2000.0), Some("admin")));
    let (status, _, body) = http(a, "GET", "/api/capacity", "", "");
    assert!(status == 200 && body.contains("\"source\":\"admin\""), "{body}");

    // Exports added and removed (a RAM one; a file one created under the data directory).
    assert_eq!(
        admin_ok(a, &["add-export", "scratch", "--memory", "--size-mb", "4", "--tenant", "vm1"]).trim(),
        "added export scratch"
    );
    admin_ok(a, &["add-export", "disk2", "--size-mb", "2", "--tenant", "vm1"]);
    let (_, _, body) = http(a, "GET", "/api/exports", "", "");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let sizes: Vec<(&str, u64)> =
        listed.iter().map(|e| (e["name"].as_str().unwrap(), e["size"].as_u64().unwrap())).collect();
    assert_eq!(sizes, [("v", 8 << 20), ("scratch", 4 << 20), ("disk2", 2 << 20)]);
    assert!(tmp.path().join("s/data/disk2.img").exists(), "the file export's image, in the data directory");
    let said = admin_ok(a, &["remove-export", "scratch"]);
    assert!(said.starts_with("removed export scratch"), "{said}");
    let (_, _, body) = http(a, "GET", "/api/exports", "", "");
    assert!(!body.contains("scratch") && body.contains("disk2"), "{body}");
    let (ok, _, err) = admin(a, &["add-export", "x", "--tenant", "nosuch", "--memory"]);
    assert!(!ok && err.contains("HTTP 400") && err.contains("nosuch"), "{err}");

    // --watch: the table again every period, each under the time it was read; --count ends it.
    let watched = admin_ok(a, &["tenants", "--watch", "0.1", "--count", "3"]);
    assert_eq!(watched.lines().filter(|l| l.starts_with("at ") && l.ends_with(" s:")).count(), 3, "{watched}");
    assert_eq!(watched.lines().filter(|l| l.starts_with("TENANT ")).count(), 3, "{watched}");
    let lines = admin_ok(a, &["--json", "tenants", "--watch", "0.1", "--count", "2"]);
    for line in lines.lines() {
        let tenants: Vec<serde_json::Value> = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {lines}"));
        assert_eq!(tenants[0]["name"], "vm1", "{lines}");
    }
    assert_eq!(lines.lines().count(), 2, "JSON lines, one an answer: {lines}");
    // A watch nobody reads (`| head` gone) ends, where it would run until interrupted.
    let mut unread = Command::new(env!("CARGO_BIN_EXE_rein"));
    unread.args(["admin", "--admin", &a.to_string(), "tenants", "--watch", "0.1"]);
    let (status, err) = common::run_unread(&mut unread, std::time::Duration::from_secs(20));
    assert!(status.success(), "{err}");
    let (ok, _, err) = admin(a, &["tenants", "--watch", "0"]);
    assert!(!ok && err.contains("--watch 0 is out of range"), "{err}");
    let (ok, _, err) = admin(a, &["tenants", "--count", "2"]);
    assert!(!ok && err.contains("--watch"), "{err}");

    // status: what the daemon is and how it does, from its /metrics; a reload that leaves a setting for
    // a restart makes it fail, naming that.
    let st = admin_ok(a, &["status"]);
    assert!(st.starts_with("rein serve ") && st.contains("no reload since the start"), "{st}");
    assert!(st.contains("tenants: 1; backend: 0 of 32 outstanding"), "{st}");
    let cfg = tmp.path().join("s/rein.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("queue_depth = 8\n{text}")).unwrap();
    server.signal("-HUP");
    let (ok, out, err) =
        common::wait_for("the reload", std::time::Duration::from_secs(20), || admin(a, &["status"]), |(ok, _, _)| !ok);
    assert!(!ok && err.contains("needs attention: 1 setting(s) of the file wait for a restart"), "{err}");
    assert!(out.contains("the last reload applied (1 applied, 0 failed); 1 setting(s) wait for a restart"), "{out}");

    // Nothing listening: named, and a failing exit.
    let (ok, _, err) = admin("127.0.0.87:1".parse().unwrap(), &["tenants"]);
    assert!(!ok && err.contains("admin endpoint 127.0.0.87:1") && err.contains("refused"), "{err}");
}

#[test]
fn rein_admin_sends_the_token_the_endpoint_asks_for() {
    let tmp = tmpdir("admin-cli-token");
    let token = write_file(tmp.path(), "admin.token", "s3cret-token-of-some-length\n");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let server = serve_in(
        &tmp.path().join("s"),
        &local(87),
        &format!(
            "admin_token_file = \"{}\"\n[[exports]]\nname = \"v\"\nbackend = \"memory\"\nsize_mb = 4\n",
            token.display()
        ),
    );
    let (ok, _, err) = admin(server.admin, &["tenants"]);
    assert!(!ok && err.contains("HTTP 401"), "{err}");
    let table = admin_ok(server.admin, &["--admin-token-file", token.to_str().unwrap(), "tenants"]);
    assert!(table.lines().nth(1).is_some_and(|l| l.starts_with("v ")), "{table}");
    let _ = Rein::new(&["admin", "--admin", "not an address", "tenants"]).fails();

    // On the daemon's host, its own configuration file says where to ask and with which token.
    let admin = common::free_tcp("127.0.0.87");
    let cfg = write_file(
        tmp.path(),
        "fixed.toml",
        &format!(
            "listen = \"127.0.0.87:0\"\nadmin = \"{admin}\"\ndata_dir = \"{}\"\nadmin_token_file = \"{}\"\n\
             [[exports]]\nname = \"w\"\nbackend = \"memory\"\nsize_mb = 4\n",
            tmp.path().join("fixed-data").display(),
            token.display()
        ),
    );
    let _fixed = Rein::serve(&cfg).start();
    let (ok, table, err) = rein_admin(&["--config", cfg.to_str().unwrap(), "tenants"]);
    assert!(ok && table.lines().nth(1).is_some_and(|l| l.starts_with("w ")), "{table} {err}");
}

/// A gateway with `[parda]` over a node, a pShift controller and its server: `rein admin nodes`, `parda`
/// and `buckets` read them; a rein serve's command against the gateway says whose it is.
#[test]
fn rein_admin_reads_a_gateways_nodes_and_parda_host_and_a_pshift_controllers_buckets() {
    let tmp = tmpdir("admin-cli-others");
    let node = serve_in(
        &tmp.path().join("node"),
        &local(87),
        "[[exports]]\nname = \"v\"\nbackend = \"memory\"\nsize_mb = 8\n",
    );
    let gw = common::parda_gateway(tmp.path(), 87, node.nbd, 3);
    let nodes = common::wait_for(
        "the gateway's link to s1 up",
        std::time::Duration::from_secs(20),
        || admin_ok(gw.admin, &["nodes"]),
        |t| t.lines().nth(1).is_some_and(|l| l.contains(" 1/1 ")),
    );
    let row: Vec<&str> = nodes.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..6], ["v", "s1", &node.nbd.to_string(), "nbd", "no", "1/1"], "{nodes}");
    let parda = admin_ok(gw.admin, &["parda"]);
    assert!(parda.starts_with("host 3 (PARDA, local aggregation): window "), "{parda}");
    let st = admin_ok(gw.admin, &["status"]);
    assert!(st.starts_with("rein gateway ") && st.contains("node links: 1 of 1 up"), "{st}");
    let (ok, _, err) = admin(gw.admin, &["tenants"]);
    assert!(!ok && err.contains("no /api/tenants there: this command asks a rein serve's admin endpoint"), "{err}");

    let ctl = common::pshift_controller(tmp.path(), 87);
    let before = admin_ok(ctl.admin, &["buckets"]);
    assert!(before.contains(", 0 of 1 servers connected (not: s1)"), "{before}");
    // Its server away, the controller's status needs attention.
    let (ok, out, err) = admin(ctl.admin, &["status"]);
    assert!(!ok && out.contains("pshift: 0 of 1 server(s) connected"), "{out}");
    assert!(err.contains("1 pShift server(s) not connected (rein admin buckets)"), "{err}");
    let _server = common::pshift_server(&tmp.path().join("pshift-server"), 87, ctl.nbd);
    let buckets = common::wait_for(
        "the server welcomed",
        std::time::Duration::from_secs(20),
        || admin_ok(ctl.admin, &["buckets"]),
        |t| t.contains(", 1 of 1 servers connected,"),
    );
    let st = admin_ok(ctl.admin, &["status"]);
    assert!(st.starts_with("rein pshift controller ") && st.contains("pshift: 1 of 1 server(s) connected"), "{st}");
    let row: Vec<&str> = buckets.lines().nth(2).unwrap().split_whitespace().collect();
    assert_eq!(row[..3], ["b1", "100", "200"], "{buckets}");
}

/// An endpoint where nothing listens: the error says what to check (the daemon, its address, the flags
/// that name it), not only `Connection refused (os error 111)`.
#[test]
fn rein_admin_says_what_to_check_when_nothing_listens() {
    let addr = std::net::TcpListener::bind("127.0.0.253:0").unwrap().local_addr().unwrap();
    let (ok, _, err) = admin(addr, &["tenants"]);
    assert!(!ok);
    assert!(err.contains(&format!("admin endpoint {addr}: ")), "{err}");
    assert!(err.contains("nothing listens there (is the daemon running") && err.contains("--admin ADDR"), "{err}");
}

/// A malformed `--admin` is named once (it read `error: --admin foo: --admin "foo": invalid socket address
/// syntax ...`: the endpoint's error names the flag and the value itself). Nothing is asked.
#[test]
fn a_malformed_admin_address_is_named_once() {
    for (given, want) in [
        ("foo", "--admin \"foo\": invalid socket address syntax (expected [http[s]://]address:port)"),
        ("127.0.0.141", "--admin \"127.0.0.141\": invalid socket address syntax (expected [http[s]://]address:port)"),
        (
            "ftp://127.0.0.141:9180",
            "--admin \"ftp://127.0.0.141:9180\": unknown scheme \"ftp\", expected http or https",
        ),
    ] {
        let (ok, _, err) = rein_admin(&["--admin", given, "tenants"]);
        assert!(!ok, "{given}");
        assert_eq!(err.trim_end(), format!("error: {want}"), "{given}");
    }
}

/// `rein admin --config` reads the daemon's file as the daemons do (`durable::read_config`): a FIFO no
/// process writes to is refused at once, and an endless file (/dev/zero) at the configuration's bound. It
/// opened a FIFO blocking (waiting for a writer for ever) and read any file whole into memory.
#[test]
fn rein_admin_config_refuses_a_fifo_without_a_writer_and_an_endless_file() {
    use std::time::{Duration, Instant};
    let tmp = tmpdir("admin-config-fifo");
    let fifo = tmp.path().join("rein.toml");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let fifo = fifo.to_str().unwrap();
    for (config, want) in
        [(fifo, "is a FIFO or pipe that gave nothing: no process writes to it"), ("/dev/zero", "/dev/zero")]
    {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["admin", "--config", config, "status"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("rein admin --config {config} still ran after 20 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{config}: {err}");
        assert!(err.starts_with(&format!("error: cannot read {config}: ")) && err.contains(want), "{config}: {err}");
        assert_eq!(err.lines().count(), 1, "{config}: {err}");
    }
}

/// An endpoint that is not a rein daemon's (127.0.0.226, a port of its own): it answers every request
/// with `answer`, a whole HTTP response, and keeps each request it read (head and body).
fn fake_endpoint(answer: &'static str) -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.226:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            conn.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            // The head, then as many bytes as its Content-Length says.
            while let Ok(n @ 1..) = conn.read(&mut buf) {
                req.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&req).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if body.len() >= len {
                        break;
                    }
                }
            }
            keep.lock().unwrap().push(String::from_utf8_lossy(&req).to_string());
            let _ = conn.write_all(answer.as_bytes());
        }
    });
    (addr, seen)
}

/// An endpoint that is no rein daemon's, or a hostile one: `status` fails on a page without a rein_
/// series (it passed, a health check on another service's page); an error's text reaches the terminal
/// without its escape sequences; a number JSON cannot carry (NaN, inf) is refused before anything is
/// sent (serde_json wrote it as null: `set --limit NaN` removed the limit, `--reservation inf` changed
/// nothing and said "set"); an empty name is refused as such (it asked for the collection, and was
/// answered as another daemon's command).
#[test]
fn rein_admin_gives_one_clear_error_for_an_endpoint_that_is_not_a_daemons_and_for_numbers_json_cannot_carry() {
    let (page, _) = fake_endpoint(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 44\r\n\r\n<html><body>Welcome to nginx</body></html>\n",
    );
    let (ok, out, err) = admin(page, &["status"]);
    assert!(!ok, "a page that is no scrape passed the health check: {out}");
    assert!(err.contains(&format!("admin endpoint {page}: its /metrics has no rein_ series")), "{err}");

    let (hostile, _) =
        fake_endpoint("HTTP/1.1 500 Oops\r\nContent-Length: 36\r\n\r\n{\"error\": \"boom \\u001b[31mred\\u0007\"}");
    let (ok, _, err) = admin(hostile, &["tenants"]);
    assert!(!ok && err.contains("HTTP 500: boom \\u{1b}[31mred\\u{7}"), "{err}");
    assert!(!err.contains('\u{1b}'), "an escape sequence reached the terminal: {err:?}");

    let (spec, seen) = fake_endpoint(
        "HTTP/1.1 200 OK\r\nContent-Length: 69\r\n\r\n{\"name\":\"vm1\",\"reservation\":1,\"limit\":null,\"weight\":1,\"idle_credit\":0}",
    );
    for args in [
        &["set", "vm1", "--limit", "NaN"][..],
        &["set", "vm1", "--reservation", "inf"],
        &["set", "vm1", "--weight=-inf"],
        &["add", "t", "--limit", "NaN"],
        &["capacity", "inf"],
    ] {
        let (ok, _, err) = admin(spec, args);
        assert!(!ok && err.contains("is not a finite number"), "{args:?}: {err}");
    }
    for args in [&["set", "", "--weight", "2"][..], &["remove", ""], &["remove-export", ""]] {
        let (ok, _, err) = admin(spec, args);
        assert!(!ok && err.contains("a name cannot be empty"), "{args:?}: {err}");
    }
    assert_eq!(*seen.lock().unwrap(), Vec::<String>::new(), "nothing sent");
    admin_ok(spec, &["set", "vm1", "--limit", "7.5"]);
    assert!(seen.lock().unwrap()[0].ends_with("{\"limit\":7.5}"), "{:?}", seen.lock().unwrap());
}

/// A watch whose reader goes after the first answer (`rein admin --json tenants --watch 30 | head -1`)
/// ends at once, not at its next write a period later (it waited the whole period, up to an hour).
#[test]
fn a_watch_ends_once_its_reader_has_gone_without_waiting_out_the_period() {
    use std::io::BufRead;
    let (tenants, _) = fake_endpoint("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["admin", "--admin", &tenants.to_string(), "--json", "tenants", "--watch", "30"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert_eq!(first, "[]\n");
    // The reader (and with it the pipe's only read end) is gone here.
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still watching 10 s after its reader had gone");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}
