//! `server::run_with` with exports added and deleted at run time and a reload through the API the binary's
//! SIGHUP uses (issue 12, point 5), over real loopback sockets with rein's own NBD client.
use rein_proto::nbd::Command;
use rein_runtime::client::NbdClient;
use rein_runtime::config::ServerConfig;
use rein_runtime::server::{run_with, Bound, Reload};
use rein_testkit::LoopDev;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    (out[9..12].parse().unwrap(), out.split("\r\n\r\n").nth(1).unwrap_or("").to_string())
}

/// A server on 127.0.0.`host` (free ports), its data in `dir`, then `body`.
fn server_at(host: u8, dir: &Path, body: &str) -> ServerConfig {
    let text = format!(
        "listen = \"127.0.0.{host}:0\"\nadmin = \"127.0.0.{host}:0\"\ndata_dir = \"{}\"\n{body}",
        dir.display()
    );
    ServerConfig::parse(&text, Path::new("live.toml")).unwrap()
}

fn config(dir: &Path, extra: &str) -> ServerConfig {
    server_at(
        61,
        dir,
        &format!("capacity_iops = 1000\n[[exports]]\nname = \"a\"\nbackend = \"memory\"\nsize_mb = 1\n{extra}"),
    )
}

/// A server running `first`: `next` is what a reload reads (each `reload.send(())` one, as a SIGHUP
/// asks), `stop` ends it, `server` is its task.
struct Running {
    b: Bound,
    next: Arc<Mutex<ServerConfig>>,
    reload: tokio::sync::mpsc::Sender<()>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), rein_runtime::server::ServeError>>,
}

impl Running {
    async fn start(first: ServerConfig) -> Running {
        let next = Arc::new(Mutex::new(first.clone()));
        let (reload, requests) = tokio::sync::mpsc::channel(1);
        let n2 = next.clone();
        let load = Reload { requests, load: Box::new(move || Ok(n2.lock().unwrap().clone())) };
        let (ready, bound) = tokio::sync::oneshot::channel::<Bound>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(run_with(
            first,
            async move {
                let _ = stopped.await;
            },
            Some(ready),
            Some(load),
            rein_runtime::activation::Passed::none(),
        ));
        Running { b: bound.await.unwrap(), next, reload, stop, server }
    }

    /// Stops the server and waits for it to end cleanly.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.server.await.unwrap().unwrap();
    }
}

/// A new export serves new connections at once; a deleted one refuses new opens while a connection opened
/// before keeps reading and writing; its tenant cannot be deleted until that connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_come_and_go_for_new_connections_only() {
    let tmp = tempfile::tempdir().unwrap();
    let running = Running::start(config(tmp.path(), "")).await;
    let b = running.b;
    assert!(NbdClient::connect(b.nbd, "e").await.is_err(), "no export e yet");
    assert_eq!(http(b.admin, "POST", "/api/tenants", r#"{"name": "t", "reservation": 10}"#).await.0, 201);
    let (code, body) =
        http(b.admin, "POST", "/api/exports", r#"{"name": "e", "backend": "memory", "size_mb": 1, "tenant": "t"}"#)
            .await;
    assert_eq!(code, 201, "{body}");
    let c = NbdClient::connect(b.nbd, "e").await.expect("a new export is visible at once");
    c.request(Command::Write, 0, 4, b"abcd", false).await.unwrap();
    assert_eq!(http(b.admin, "DELETE", "/api/exports/e", "").await.0, 204);
    assert!(NbdClient::connect(b.nbd, "e").await.is_err(), "a deleted export refuses new opens");
    // The connection opened before keeps working.
    assert_eq!(c.request(Command::Read, 0, 4, &[], false).await.unwrap(), b"abcd");
    let (code, body) = http(b.admin, "DELETE", "/api/tenants/t", "").await;
    assert!(code == 409 && body.contains("open connection"), "{code} {body}");
    c.disconnect().await;
    // The server notices the close; bounded wait.
    let mut code = 0;
    for _ in 0..500 {
        code = http(b.admin, "DELETE", "/api/tenants/t", "").await.0;
        if code == 204 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(code, 204);
    running.stop().await;
}

/// A reload applies the file's difference as one change; one that the admission refuses changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_the_difference_or_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let running = Running::start(config(&dir, "")).await;
    let (b, next, tx) = (running.b, running.next.clone(), running.reload.clone());
    let wait_for = |path: &'static str, code: u16| async move {
        for _ in 0..500 {
            if http(b.admin, "GET", path, "").await.0 == code {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("{path} never answered {code}");
    };
    // Too much reserved for the file's 1,000 IOPS: refused as a whole (the export is not added either).
    *next.lock().unwrap() = config(
        &dir,
        "[[exports]]\nname = \"x\"\nbackend = \"memory\"\nsize_mb = 1\n[[tenants]]\nname = \"x\"\nreservation = 1500\n",
    );
    tx.send(()).await.unwrap();
    // Then a good one: applied. Reloads run in order, so once y is there the bad one has been handled.
    *next.lock().unwrap() = config(
        &dir,
        "[[exports]]\nname = \"y\"\nbackend = \"memory\"\nsize_mb = 1\n[[tenants]]\nname = \"y\"\nreservation = 500\n",
    );
    tx.send(()).await.unwrap();
    wait_for("/api/tenants/y", 200).await;
    assert_eq!(http(b.admin, "GET", "/api/tenants/x", "").await.0, 404, "the refused reload applied nothing");
    assert!(NbdClient::connect(b.nbd, "x").await.is_err());
    NbdClient::connect(b.nbd, "y").await.expect("export y after the reload");
    let (_, body) = http(b.admin, "GET", "/api/tenants/y", "").await;
    assert!(body.contains("\"reservation\":500.0"), "{body}");
    running.stop().await;
}

/// A reload that makes an export read-only stops the writes of the connections opened before too (they
/// keep the old export, told writable at their handshake): EPERM from then on, nothing written, and their
/// FLUSH still succeeds (it syncs what they wrote before). Before, their writes went on landing in the
/// image after the reload had said read-only (an image frozen to be copied changed under the copy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_read_only_stops_the_writes_of_open_connections() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let file = |read_only: bool| {
        server_at(150, &dir, &format!("[[exports]]\nname = \"f\"\nsize_mb = 1\nread_only = {read_only}\n"))
    };
    let running = Running::start(file(false)).await;
    let (b, next, tx) = (running.b, running.next.clone(), running.reload.clone());
    let c = NbdClient::connect(b.nbd, "f").await.unwrap();
    c.request(Command::Write, 0, 4, b"abcd", false).await.unwrap();
    *next.lock().unwrap() = file(true);
    tx.send(()).await.unwrap();
    // Applied once a new connection is refused a write (read-only at its handshake; those before it
    // write at 8192).
    let mut applied = false;
    for _ in 0..500 {
        let n = NbdClient::connect(b.nbd, "f").await.unwrap();
        if n.request(Command::Write, 8192, 4, b"zzzz", false).await.is_err() {
            applied = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(applied, "the reload to read_only never applied");
    let e = c.request(Command::Write, 4096, 4, b"late", false).await.expect_err("a write after the reload");
    assert!(e.to_string().contains("EPERM"), "{e}");
    let e = c.request(Command::WriteZeroes, 0, 4, &[], false).await.expect_err("write-zeroes after the reload");
    assert!(e.to_string().contains("EPERM"), "{e}");
    c.request(Command::Flush, 0, 0, &[], false).await.expect("a FLUSH of what came before");
    assert_eq!(c.request(Command::Read, 0, 4, &[], false).await.unwrap(), b"abcd");
    let image = std::fs::read(dir.join("f.img")).unwrap();
    assert_eq!(&image[..4], b"abcd");
    assert_eq!(&image[4096..4100], &[0; 4], "nothing written after the reload");
    c.disconnect().await;
    running.stop().await;
}

/// A memory export changed by a reload (its tenant, then `read_only`) keeps its data: the reload
/// used to give it a new, empty RAM, so that everything written to it was gone for the connections opened
/// from then on (the log said only `export m changed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_a_memory_export_keeps_its_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let file = |extra: &str| {
        let body = format!(
            "[[exports]]\nname = \"m\"\nbackend = \"memory\"\nsize_mb = 1\n{extra}[[tenants]]\nname = \"t2\"\n"
        );
        server_at(150, &dir, &body)
    };
    let running = Running::start(file("")).await;
    let (b, next, tx) = (running.b, running.next.clone(), running.reload.clone());
    let c = NbdClient::connect(b.nbd, "m").await.unwrap();
    let mut writer = None;
    c.request(Command::Write, 0, 4, b"keep", false).await.unwrap();
    // Each reload is applied once a new connection sees its mark (written before it, at 8192, by the
    // connections still on the export as it was).
    for (extra, mark) in [("tenant = \"t2\"\n", b"one!"), ("tenant = \"t2\"\nread_only = true\n", b"two!")] {
        // (A connection of the export as it is: the first reload's tenant change ends tenant m, and the
        // requests of its connections fail.)
        let w = NbdClient::connect(b.nbd, "m").await.unwrap();
        w.request(Command::Write, 8192, 4, mark, false).await.unwrap();
        writer = Some(w);
        *next.lock().unwrap() = file(extra);
        tx.send(()).await.unwrap();
        let mut ok = false;
        for _ in 0..500 {
            let (_, listed) = http(b.admin, "GET", "/api/exports", "").await;
            if !listed.contains("\"t2\"") {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
            // The probe write lands where nothing is read: a connection opened before the second reload
            // applied (t2 is listed since the first) is let write, and its write at 0 overwrote `keep`.
            let n = NbdClient::connect(b.nbd, "m").await.unwrap();
            if n.request(Command::Read, 0, 4, &[], false).await.unwrap() == b"keep"
                && n.request(Command::Read, 8192, 4, &[], false).await.unwrap() == mark
                && (!extra.contains("read_only") || n.request(Command::Write, 12288, 4, b"xxxx", false).await.is_err())
            {
                ok = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(ok, "after the reload with {extra:?} a new connection never read the data written before");
    }
    let w = writer.expect("a writer");
    w.request(Command::Write, 0, 4, b"late", false).await.expect_err("read-only now");
    w.disconnect().await;
    c.disconnect().await;
    running.stop().await;
}

/// A memory export made read-only by a reload and writable again by a later one keeps its data: the
/// second reload used to give it a new, empty RAM (the RAM was kept only from a writable export, and the
/// one made read-only had its writes stopped for good). The connections opened before the first reload
/// stay refused (EPERM): they keep the handle whose writes that reload stopped, as a file export's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_export_made_read_only_then_writable_keeps_its_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let file = |read_only: bool| {
        let body = format!("[[exports]]\nname = \"m\"\nbackend = \"memory\"\nsize_mb = 1\nread_only = {read_only}\n");
        server_at(100, &dir, &body)
    };
    let running = Running::start(file(false)).await;
    let (b, next, tx) = (running.b, running.next.clone(), running.reload.clone());
    let old = NbdClient::connect(b.nbd, "m").await.unwrap();
    old.request(Command::Write, 0, 4, b"keep", false).await.unwrap();
    // Each reload is applied once a new connection is refused a write (read-only), then allowed one
    // (writable again; it writes at 8192, where nothing else does).
    for read_only in [true, false] {
        *next.lock().unwrap() = file(read_only);
        tx.send(()).await.unwrap();
        let mut applied = false;
        for _ in 0..500 {
            let n = NbdClient::connect(b.nbd, "m").await.unwrap();
            let wrote = n.request(Command::Write, 8192, 4, b"new!", false).await.is_ok();
            n.disconnect().await;
            if wrote != read_only {
                applied = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(applied, "the reload to read_only = {read_only} never applied");
    }
    let n = NbdClient::connect(b.nbd, "m").await.unwrap();
    assert_eq!(
        n.request(Command::Read, 0, 4, &[], false).await.unwrap(),
        b"keep",
        "made writable again, the export lost what was written before it was made read-only"
    );
    assert_eq!(n.request(Command::Read, 8192, 4, &[], false).await.unwrap(), b"new!");
    n.request(Command::Write, 4, 4, b"more", false).await.expect("writable again");
    // The connection opened before the first reload: still refused, and nothing of it lands.
    let e = old.request(Command::Write, 4096, 4, b"late", false).await.expect_err("a write of the old connection");
    assert!(e.to_string().contains("EPERM"), "{e}");
    assert_eq!(old.request(Command::Read, 0, 8, &[], false).await.unwrap(), b"keepmore", "the same RAM");
    assert_eq!(n.request(Command::Read, 4096, 4, &[], false).await.unwrap(), [0; 4]);
    n.disconnect().await;
    old.disconnect().await;
    running.stop().await;
}

/// A loop device over a new 4 MiB file `dir/back.img`, detached and the file removed when dropped;
/// [`LoopDev::node`] makes other nodes of it (as a container's /dev has its own). `None`, said, where it
/// cannot be made (needs root).
fn loop_nodes(dir: &Path) -> Option<LoopDev> {
    LoopDev::over_new_file(&dir.join("back.img"), 4 << 20, &[])
}

/// Waits (bounded) until another claimer of `lo` is let in ([`LoopDev::claimed`]): the server stopped,
/// its storage is closed once its last connection's task has ended, and a child that another test of
/// this process is starting holds a copy of every descriptor from its fork to its exec.
async fn until_released(lo: &LoopDev) {
    for _ in 0..500 {
        if !lo.claimed() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{} is still claimed", lo.dev());
}

/// Waits (bounded) until export `name` opens.
async fn until_served(nbd: SocketAddr, name: &str) -> Arc<NbdClient> {
    for _ in 0..500 {
        if let Ok(c) = NbdClient::connect(nbd, name).await {
            return c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("export {name} never served");
}

/// A reload that points a writable block device export at another node of its device (here a node made
/// with mknod; a container's /dev, a udev name that is not a symlink) while a connection holds the old
/// export takes over the old storage's claim on the device: the old connection and the new ones write the
/// one device, and the claim lasts while either does. So does one that renames the export and points it
/// back at the first node (export d removed, e added) while a connection to d is open. Before, the new
/// node's open was a second claim, which the kernel refused while the old storage held the first, and
/// the reload failed with the device `in use by the system (mounted, swap, ...)`, its own claim. Needs
/// root (a loop device, mknod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_another_node_of_a_served_device_keeps_its_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let Some(lo) = loop_nodes(&dir) else { return };
    lo.node(&dir.join("node"));
    // `mark`: a memory export each reload adds, there once the reload is applied (one change). One
    // tenant for all, so that a renamed export's connections keep theirs.
    let file = |name: &str, path: &str, mark: &str| {
        let body = format!(
            "[[tenants]]\nname = \"t\"\n[[exports]]\nname = \"{name}\"\ntenant = \"t\"\npath = \"{path}\"\n{}",
            if mark.is_empty() {
                String::new()
            } else {
                format!("[[exports]]\nname = \"{mark}\"\nbackend = \"memory\"\ntenant = \"t\"\nsize_mb = 1\n")
            }
        );
        server_at(101, &dir, &body)
    };
    let running = Running::start(file("d", lo.dev(), "")).await;
    let (b, next, tx) = (running.b, running.next.clone(), running.reload.clone());
    let old = NbdClient::connect(b.nbd, "d").await.unwrap();
    old.request(Command::Write, 0, 4, b"old!", false).await.unwrap();
    *next.lock().unwrap() = file("d", "node", "mark");
    tx.send(()).await.unwrap();
    until_served(b.nbd, "mark").await;
    let new = NbdClient::connect(b.nbd, "d").await.unwrap();
    assert_eq!(new.request(Command::Read, 0, 4, &[], false).await.unwrap(), b"old!", "the one device");
    new.request(Command::Write, 4096, 4, b"new!", false).await.unwrap();
    assert_eq!(old.request(Command::Read, 4096, 4, &[], false).await.unwrap(), b"new!");
    old.request(Command::Write, 8192, 4, b"late", false).await.expect("the old connection still writes");
    old.disconnect().await;
    // Renamed, back on the first node, while `new` holds d.
    *next.lock().unwrap() = file("e", lo.dev(), "mark2");
    tx.send(()).await.unwrap();
    until_served(b.nbd, "mark2").await;
    let renamed = NbdClient::connect(b.nbd, "e").await.unwrap();
    assert_eq!(renamed.request(Command::Read, 8192, 4, &[], false).await.unwrap(), b"late", "the one device");
    new.request(Command::Write, 12288, 4, b"d...", false).await.expect("d's connection still writes");
    assert_eq!(renamed.request(Command::Read, 12288, 4, &[], false).await.unwrap(), b"d...");
    new.disconnect().await;
    renamed.request(Command::Flush, 0, 0, &[], false).await.unwrap();
    assert!(lo.claimed(), "the device is claimed while the renamed export is served");
    renamed.disconnect().await;
    running.stop().await;
    until_released(&lo).await;
}

/// An export added through the admin API on the block device of a deleted export whose connection is
/// still open: of another tenant, refused (400) naming the deleted export and the device, whether
/// through the same node or another (through the same node it used to be accepted, and two tenants wrote
/// one disk; through another it failed as the device `in use by the system`, this server's own claim);
/// of the deleted export's own tenant, served on its claim, as a file is. Needs root (a loop device,
/// mknod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_added_on_the_device_of_a_deleted_one_still_open_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let Some(lo) = loop_nodes(&dir) else { return };
    lo.node(&dir.join("n1"));
    lo.node(&dir.join("n2"));
    let body = "[[exports]]\nname = \"a\"\npath = \"n1\"\n[[tenants]]\nname = \"other\"\n";
    let running = Running::start(server_at(102, &dir, body)).await;
    let b = running.b;
    let c = NbdClient::connect(b.nbd, "a").await.unwrap();
    c.request(Command::Write, 0, 4, b"mine", false).await.unwrap();
    assert_eq!(http(b.admin, "DELETE", "/api/exports/a", "").await.0, 204);
    let (major, minor) = lo.number();
    for path in ["n1", "n2"] {
        let body = format!(r#"{{"name": "b", "path": "{path}", "tenant": "other"}}"#);
        let (code, said) = http(b.admin, "POST", "/api/exports", &body).await;
        let said = said.replace("\\\"", "\"");
        assert_eq!(code, 400, "{path}: {said}");
        assert!(
            said.contains(&format!(
                "exports \"a (deleted, still open by its connections)\" and \"b\" are backed by the same block \
                 device {major}:{minor}"
            )),
            "{path}: {said}"
        );
    }
    let (code, said) = http(b.admin, "POST", "/api/exports", r#"{"name": "b", "path": "n2", "tenant": "a"}"#).await;
    assert_eq!(code, 201, "the deleted export's own tenant: {said}");
    let n = NbdClient::connect(b.nbd, "b").await.unwrap();
    assert_eq!(n.request(Command::Read, 0, 4, &[], false).await.unwrap(), b"mine");
    n.disconnect().await;
    c.disconnect().await;
    running.stop().await;
    until_released(&lo).await;
}
