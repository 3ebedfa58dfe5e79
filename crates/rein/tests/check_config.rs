//! `--check-config` of `rein serve`, `rein gateway` and `rein pshift controller`: the configuration checked
//! as a start would check it, without starting, and without creating or changing a file, so that it can
//! run beside the server it is about to reload. Exit 0 with what would be served; exit 1 with the error a
//! start would give.
#![cfg(unix)]

mod common;

use common::{config_file, tmpdir, write_file, LoopDev, LoopFs, Rein, MEMORY};
use std::io::BufRead;
use std::path::Path;
use std::process::Command;

/// Runs `rein ARGS --check-config`: (success, stdout, stderr).
fn check(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(args)
        .arg("--check-config")
        .env("NO_COLOR", "1")
        .output()
        .expect("run rein");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Every file under `dir`, with its length and modification time.
fn files(dir: &Path) -> Vec<(String, u64, std::time::SystemTime)> {
    let mut v = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            v.push((e.path().display().to_string(), m.len(), m.modified().unwrap()));
        }
    }
    v.sort();
    v
}

/// A good configuration: each export said, exit 0, nothing created (the data directory and the image a
/// start would create stay missing); then what a start refuses is refused the same way, with exit 1.
#[test]
fn rein_serve_check_config_says_what_a_start_would_and_creates_nothing() {
    let tmp = tmpdir("check-serve");
    let body = "capacity_iops = 1000\n[[exports]]\nname = \"v\"\nsize_mb = 8\n\
                [[exports]]\nname = \"m\"\nbackend = \"memory\"\nsize_mb = 4\n";
    let cfg = config_file(tmp.path(), 170, body);
    let before = files(tmp.path());
    let (ok, out, err) = check(&["serve", "--config", cfg.to_str().unwrap()]);
    assert!(ok, "{err}");
    let v_img = tmp.path().join("data").join("v.img");
    assert!(out.contains(&format!("export v: {} (missing: a start creates it, 8 MiB)", v_img.display())), "{out}");
    assert!(out.contains("export m: memory (4 MiB"), "{out}");
    assert!(out.trim_end().ends_with("rein.toml: configuration OK"), "{out}");
    assert_eq!(files(tmp.path()), before, "--check-config created or changed a file");

    // An existing image of another size: what a start says, naming the export and the file.
    std::fs::create_dir_all(tmp.path().join("data")).unwrap();
    std::fs::write(&v_img, vec![0u8; 4096]).unwrap();
    let (ok, out, err) = check(&["serve", "--config", cfg.to_str().unwrap()]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains(&format!("export v: {}: is 4096 bytes, but size_mb asks for 8388608 bytes", v_img.display())),
        "{err}"
    );
    let started = Rein::serve(&cfg).env("REIN_LOG", "off").fails();
    assert!(started.contains("is 4096 bytes, but size_mb asks for 8388608 bytes"), "a start says the same: {started}");

    // A directory where an image should be.
    std::fs::remove_file(&v_img).unwrap();
    std::fs::create_dir_all(&v_img).unwrap();
    let (ok, _, err) = check(&["serve", "--config", cfg.to_str().unwrap()]);
    assert!(!ok && err.contains("is a directory, not a regular file or a block device"), "{err}");

    // Reservations above the capacity under admission = "refuse" (the default); this rewrites rein.toml.
    let over = config_file(tmp.path(), 170, &format!("{MEMORY}[[tenants]]\nname = \"big\"\nreservation = 2000\n"));
    let (ok, _, err) = check(&["serve", "--config", over.to_str().unwrap()]);
    assert!(!ok && err.contains("reservations total 2010 IOPS, above the reservable capacity of 1000 IOPS"), "{err}");
}

/// Beside a running server on the same data directory (whose lock it holds): the check runs, applies the
/// state file the server wrote (a tenant added at run time) and changes nothing.
#[test]
fn rein_serve_check_config_runs_beside_the_server_and_reads_its_state_file() {
    let tmp = tmpdir("check-beside");
    let cfg = config_file(tmp.path(), 171, MEMORY);
    let server = Rein::serve(&cfg).start();
    let body = r#"{"name":"extra","reservation":5}"#;
    let (code, _, resp) =
        common::http(server.admin, "POST", "/api/tenants", "Content-Type: application/json\r\n", body);
    assert_eq!(code, 201, "{resp}");
    let before = files(tmp.path());
    let (ok, out, err) = check(&["serve", "--config", cfg.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("rein-state.json: 1 entry applied over the file"), "{out}");
    assert!(out.contains("2 tenants, 1 export,"), "the state file's tenant is counted: {out}");
    assert_eq!(files(tmp.path()), before);
    server.stop();
}

/// `rein gateway --check-config` lists the volumes and their nodes without contacting them (the nodes
/// here do not exist); a bad key is the load's error. `rein pshift controller --check-config` lists its
/// servers and buckets; an admin address that is not loopback without a token is refused, as at start.
#[test]
fn the_gateway_and_the_pshift_controller_check_their_files_too() {
    let tmp = tmpdir("check-gw");
    let gw = "listen = \"127.0.0.172:0\"\n[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.173:1\"\n\
              [[nodes]]\nname = \"s2\"\naddress = \"127.0.0.174:1\"\n\
              [[exports]]\nname = \"v\"\nsize_mb = 64\nstripe_kb = 64\nwidths = { s1 = 1, s2 = 2 }\n";
    let path = write_file(tmp.path(), "gw.toml", gw);
    let (ok, out, err) = check(&["gateway", "--config", path.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("volume v: 64 MiB of tenant v, 64 KiB units over s1, s2"), "{out}");
    assert!(out.contains("1 tenant, 1 volume over 2 nodes, NBD on 127.0.0.172:0, 2 node connections"), "{out}");
    let bad = write_file(tmp.path(), "bad.toml", &gw.replace("stripe_kb", "stripe_kib"));
    let (ok, _, err) = check(&["gateway", "--config", bad.to_str().unwrap()]);
    assert!(!ok && err.contains("bad.toml: line 11, column 1: unknown field `stripe_kib`"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    let ctl = "listen = \"127.0.0.175:0\"\nperiod_s = 1\nintervals = 5\n[[servers]]\nname = \"s1\"\n\
               capacity_iops = 1000\n[[buckets]]\nname = \"b1\"\nreservation_iops = 100\n";
    let path = write_file(tmp.path(), "ctl.toml", ctl);
    let (ok, out, err) = check(&["pshift", "controller", "--config", path.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("server s1: 1000 IOPS") && out.contains("bucket b1: reservation 100 IOs"), "{out}");
    assert!(out.contains("1 server, 1 bucket, servers connect on 127.0.0.175:0"), "{out}");
    let exposed = write_file(tmp.path(), "exposed.toml", &format!("admin = \"0.0.0.0:0\"\n{ctl}"));
    let (ok, _, err) = check(&["pshift", "controller", "--config", exposed.to_str().unwrap()]);
    assert!(!ok && err.contains("is not a loopback address and no admin_token_file is set"), "{err}");
}

/// An admin address that is not loopback, without a token, is refused by each role naming what that
/// role's admin API controls (the gateway and the controller once spoke of rein serve's tenants).
#[test]
fn an_exposed_admin_endpoint_is_refused_naming_what_its_role_controls() {
    let tmp = tmpdir("check-exposed");
    let gw = "listen = \"127.0.0.230:0\"\nadmin = \"0.0.0.0:0\"\n[[nodes]]\nname = \"s1\"\n\
              address = \"127.0.0.231:1\"\n[[exports]]\nname = \"v\"\nsize_mb = 64\n";
    let path = write_file(tmp.path(), "gw.toml", gw);
    let (ok, _, err) = check(&["gateway", "--config", path.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("anyone who reaches it could read every volume's nodes and counters and, on a PARDA host"),
        "{err}"
    );
    assert!(!err.contains("tenant"), "the gateway's admin API sets no tenant's QoS: {err}");

    let ctl = "listen = \"127.0.0.232:0\"\nadmin = \"0.0.0.0:0\"\nperiod_s = 1\n[[servers]]\nname = \"s1\"\n\
               capacity_iops = 1000\n[[buckets]]\nname = \"b1\"\n";
    let path = write_file(tmp.path(), "ctl.toml", ctl);
    let (ok, _, err) = check(&["pshift", "controller", "--config", path.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("anyone who reaches it could read every server's and bucket's state and, under hold"),
        "{err}"
    );
    assert!(!err.contains("tenant"), "the controller's admin API sets no tenant's QoS: {err}");

    let serve = common::config_at(tmp.path(), "listen = \"127.0.0.233:0\"\nadmin = \"0.0.0.0:0\"", MEMORY);
    let (ok, _, err) = check(&["serve", "--config", serve.to_str().unwrap()]);
    assert!(!ok && err.contains("anyone who reaches it could change every tenant's QoS"), "{err}");
}

/// `admin_token_file` without `admin` (the gateway, the pShift controller): a warning naming both keys
/// at `--check-config` (which cannot know whether a service manager will pass the admin socket, the
/// token's documented use without `admin`) and at a start that was passed none; either way it starts.
#[test]
fn a_token_file_without_admin_is_warned_of_at_check_and_at_start() {
    let tmp = tmpdir("check-token");
    let token = write_file(tmp.path(), "admin.token", "secret\n");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let gw = "listen = \"127.0.0.234:0\"\nadmin_token_file = \"admin.token\"\n[[nodes]]\nname = \"s1\"\n\
              address = \"127.0.0.235:1\"\n[[exports]]\nname = \"v\"\nsize_mb = 64\n";
    let gw = write_file(tmp.path(), "gw.toml", gw);
    let ctl = "listen = \"127.0.0.236:0\"\nadmin_token_file = \"admin.token\"\nperiod_s = 1\n[[servers]]\n\
               name = \"s1\"\ncapacity_iops = 1000\n[[buckets]]\nname = \"b1\"\n";
    let ctl = write_file(tmp.path(), "ctl.toml", ctl);
    let warned = format!("admin_token_file ({}) is set but admin is not", token.display());
    for args in [
        vec!["gateway", "--config", gw.to_str().unwrap()],
        vec!["pshift", "controller", "--config", ctl.to_str().unwrap()],
    ] {
        let (ok, out, err) = check(&args);
        assert!(ok, "a warning, not an error: {err}");
        assert!(out.trim_end().ends_with("configuration OK"), "{out}");
        assert!(
            err.contains(&warned) && err.contains("the token guards only an admin socket a service manager passes"),
            "{err}"
        );
    }
    // A start with no admin socket passed: the token guards nothing, said once before it listens.
    let mut child = Rein::new(&["pshift", "controller", "--config", ctl.to_str().unwrap()]).spawn();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok);
    let before: Vec<String> = lines.by_ref().take_while(|l| !l.contains("rein pshift controller listening")).collect();
    let _ = child.kill();
    let _ = child.wait();
    let said: Vec<&String> = before.iter().filter(|l| l.contains(&warned)).collect();
    assert_eq!(said.len(), 1, "{before:#?}");
    assert!(said[0].contains("no admin socket was passed: there is no admin endpoint"), "{said:?}");
}

/// `hold = true` without `admin`: a valid file (a service manager may pass the admin socket, which then
/// takes the start request), so `--check-config` passes with a warning; a start passed no admin socket is
/// refused before it serves, naming both ways (the schedule could never start). Before, the file itself
/// was refused, the passed socket's use with it.
#[test]
fn hold_without_admin_is_a_warning_at_check_and_an_error_at_a_start_without_a_passed_socket() {
    let tmp = tmpdir("check-hold");
    let ctl = "listen = \"127.0.0.239:0\"\nhold = true\nperiod_s = 1\n[[servers]]\nname = \"s1\"\n\
               capacity_iops = 1000\n[[buckets]]\nname = \"b1\"\n";
    let ctl = write_file(tmp.path(), "ctl.toml", ctl);
    let (ok, out, err) = check(&["pshift", "controller", "--config", ctl.to_str().unwrap()]);
    assert!(ok, "a warning, not an error: {err}");
    assert!(out.trim_end().ends_with("configuration OK"), "{out}");
    assert!(err.contains("hold = true but admin is not set: only an admin socket a service manager passes"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(["pshift", "controller", "--config", ctl.to_str().unwrap()])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("hold = true needs an admin endpoint") && err.contains("FileDescriptorName=admin"), "{err}");
    assert_eq!(err.matches("hold = true needs").count(), 1, "once: {err}");
}

/// The pShift controller warns of reservations above its servers' capacity and of a file without
/// buckets, naming the numbers, at `--check-config` (which still passes) and at start (before it listens).
#[test]
fn the_pshift_controller_warns_of_reservations_above_capacity_and_of_no_buckets() {
    let tmp = tmpdir("check-ctl-warn");
    let head = "listen = \"127.0.0.238:0\"\nperiod_s = 1\n[[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n\
                [[servers]]\nname = \"s2\"\ncapacity_iops = 500\n";
    let over = write_file(
        tmp.path(),
        "over.toml",
        &format!(
            "{head}[[buckets]]\nname = \"b1\"\nreservation_iops = 1200\n\
        [[buckets]]\nname = \"b2\"\nreservation_iops = 800\n"
        ),
    );
    let above = "[[buckets]]: reservations total 2000 IOPS, above the reservable capacity of 1500 IOPS (the \
                 [[servers]]' capacity_iops summed): not every bucket can get its reservation";
    let (ok, out, err) = check(&["pshift", "controller", "--config", over.to_str().unwrap()]);
    assert!(ok && out.trim_end().ends_with("configuration OK"), "a warning, not an error: {err}");
    assert!(err.contains(above), "{err}");
    let none = write_file(tmp.path(), "none.toml", head);
    let (ok, out, err) = check(&["pshift", "controller", "--config", none.to_str().unwrap()]);
    assert!(ok && out.contains("2 servers, 0 buckets"), "{out}{err}");
    assert!(err.contains("no [[buckets]]: the controller reserves and limits nothing"), "{err}");

    let mut child = Rein::new(&["pshift", "controller", "--config", over.to_str().unwrap()]).spawn();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok);
    let before: Vec<String> = lines.by_ref().take_while(|l| !l.contains("rein pshift controller listening")).collect();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(before.iter().filter(|l| l.contains(above)).count(), 1, "{before:#?}");
}

/// What a start would fail at that `--check-config` passed: `listen_unix` in a missing directory (the
/// docs say it must exist) is an error naming it; a `[[tenants]]` entry no export uses (a typo of an
/// export's name) is a warning line, the check still passing.
#[test]
fn a_missing_unix_socket_directory_fails_and_an_unused_tenant_is_warned_of() {
    let tmp = tmpdir("check-unix-dir");
    let cfg = config_file(tmp.path(), 171, &format!("listen_unix = \"nowhere/nbd.sock\"\n{MEMORY}"));
    let (ok, _, err) = check(&["serve", "--config", cfg.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(err.contains("nbd.sock: its directory") && err.contains("nowhere does not exist (listen_unix)"), "{err}");
    let cfg = config_file(tmp.path(), 171, &format!("{MEMORY}[[tenants]]\nname = \"vm1\"\nreservation = 5\n"));
    let (ok, out, err) = check(&["serve", "--config", cfg.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("warning: tenant vm1 has no export"), "{out}");
}

/// A configuration path that is a FIFO nothing writes to is an error naming it, from each daemon, at
/// once (a blocking open waited for a writer for ever: a start or `--check-config` hung); a pipe with a
/// writer (`--config <(generate)`) is read to its end.
#[test]
fn a_fifo_without_a_writer_is_refused_and_a_pipe_is_read() {
    let tmp = tmpdir("check-fifo");
    let fifo = tmp.path().join("rein.toml");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let fifo = fifo.to_str().unwrap();
    for daemon in [&["serve"][..], &["gateway"], &["pshift", "controller"]] {
        let args: Vec<&str> = daemon.iter().copied().chain(["--config", fifo, "--check-config"]).collect();
        let err = Rein::new(&args).fails();
        assert!(
            err.contains("rein.toml") && err.contains("is a FIFO or pipe that gave nothing: no process writes to it"),
            "{args:?}: {err}"
        );
    }
    let config = format!("listen = \"127.0.0.176:0\"\nadmin = \"127.0.0.176:0\"\n{MEMORY}");
    let script = "\"$0\" serve --config <(printf '%s' \"$1\") --check-config";
    let out = Command::new("bash")
        .args(["-c", script, env!("CARGO_BIN_EXE_rein"), &config])
        .env("NO_COLOR", "1")
        .output()
        .expect("run bash");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("configuration OK"), "{stdout}");
}

/// An ext4 of 16 MiB on a loop device over `dir/dev.img`, mount point `dir/mnt`; unmounted, detached and
/// removed when dropped. `None`, said, where it cannot be made (needs root, loop devices, ext4).
fn loop_fs(dir: &Path) -> Option<LoopFs> {
    LoopFs::make(&dir.join("dev.img"), 16 << 20, "mkfs.ext4", &dir.join("mnt"))
}

/// What a start refuses for a writable export that the system holds, `--check-config` refuses too, with
/// the start's error and exit 1: a block device with a mounted file system (the start's exclusive open
/// fails, EBUSY) and an image file that a loop device is attached to (sysfs). It used to say
/// `configuration OK` for both, and the start that followed failed. Read-only exports of them pass, as a
/// start serves them. Beside a running rein serve that serves the device writable (its own claim, which
/// the check's exclusive open meets too) it passes: the units run it before each reload. Needs root
/// (loop devices, mkfs.ext4, mount); elsewhere skipped.
#[test]
fn rein_serve_check_config_refuses_a_device_in_use_and_a_loop_backing_file() {
    let tmp = tmpdir("check-busy");
    let dir = tmp.path();
    let Some(fs) = loop_fs(dir) else { return };
    assert!(fs.mount(), "mount {}", fs.dev());
    let export = |name: &str, path: &str, read_only: bool| {
        let body = format!("[[exports]]\nname = \"{name}\"\npath = \"{path}\"\nread_only = {read_only}\n");
        config_file(dir, 100, &body).to_str().unwrap().to_string()
    };
    let img = fs.img().to_str().unwrap();
    let (ok, out, err) = check(&["serve", "--config", &export("i", img, false)]);
    assert!(!ok && out.is_empty(), "the backing file of a loop device, writable: {out}");
    let want = format!("export i: {img}: is the backing file of loop device {} (losetup -a lists it)", fs.dev());
    assert!(err.starts_with(&format!("error: {want}")) && err.trim().lines().count() == 1, "{err}");
    let (ok, out, err) = check(&["serve", "--config", &export("i", img, true)]);
    assert!(ok && out.contains(&format!("export i: {img} (16 MiB, read-only)")), "{out}{err}");

    // The device of a mounted file system, writable: named by where it is mounted (it used to list every
    // possible cause: `in use by the system (mounted, swap, ...)`).
    let want = format!(
        "export d: {}: is a block device in use: it is mounted at {}. The kernel refused an exclusive open (EBUSY)",
        fs.dev(),
        fs.mnt().display()
    );
    refused_by_check_and_start(&export("d", fs.dev(), false), &want);
    let (ok, out, err) = check(&["serve", "--config", &export("d", fs.dev(), true)]);
    assert!(ok && out.contains(&format!("export d: {} (16 MiB, read-only)", fs.dev())), "{out}{err}");

    fs.umount();
    let cfg = export("d", fs.dev(), false);
    let (ok, out, err) = check(&["serve", "--config", &cfg]);
    assert!(ok && out.contains(&format!("export d: {} (16 MiB)", fs.dev())), "unmounted: {out}{err}");
    assert!(fs.mount(), "the check's exclusive open is closed at once");
    fs.umount();
    let server = common::Rein::serve(Path::new(&cfg)).start();
    let (ok, out, err) = check(&["serve", "--config", &cfg]);
    assert!(ok, "beside the rein serve that serves it: {err}");
    assert!(out.contains(&format!("export d: {} (16 MiB; claimed by the running rein serve", fs.dev())), "{out}");
    server.stop();
    drop(fs);
}

/// `--check-config` run as another user than the server's (an operator beside the unit's dynamic user)
/// cannot read the server's descriptors, so it cannot tell the server's own claim on a device it serves
/// from another's: the refusal says so and how to run the check, where it said only `in use by the
/// system (mounted, swap, ...)`. As root the same check passes, naming the server's claim. Needs root
/// (a loop device, mknod, setpriv); elsewhere skipped.
#[test]
fn check_config_as_another_user_says_it_cannot_see_the_servers_claim() {
    use std::os::unix::fs::PermissionsExt;
    // The other user must reach the files: the test's directory is made in /tmp, which every user may
    // traverse (scripts/test.sh gives the tests a TMPDIR of their own, mode 0700), and removed as
    // [`tmpdir`]'s are.
    let tmp = tempfile::Builder::new().prefix("rein-check-other-user-").tempdir_in("/tmp").expect("temp dir");
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let img = dir.join("dev.img");
    let Some(lo) = LoopDev::over_new_file(&img, 4 << 20, &[]) else { return };
    // A node the other user may open, as a user of the `disk` group may open /dev/sdX.
    let node = dir.join("node");
    lo.node(&node);
    std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o666)).unwrap();
    let node = node.to_str().unwrap();
    let cfg = config_file(dir, 102, &format!("[[exports]]\nname = \"d\"\npath = \"{node}\"\n"));
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cfg = cfg.to_str().unwrap();
    let server = common::Rein::serve(Path::new(cfg)).start();
    let (ok, out, err) = check(&["serve", "--config", cfg]);
    assert!(ok && out.contains(&format!("export d: {node} (4 MiB; claimed by the running rein serve")), "{out}{err}");
    let other = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_rein")])
        .args(["serve", "--config", cfg, "--check-config"])
        .env("NO_COLOR", "1")
        .output();
    server.stop();
    let Ok(other) = other else {
        eprintln!("skipped: setpriv cannot be run here");
        return;
    };
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success(), "as another user: {err}");
    let want = format!(
        "error: export d: {node}: is a block device in use: no mount, swap, RAID or device-mapper device holds it, \
         so a process opened it exclusively (fuser -v {dev} or lsof {dev} lists those that have it open;",
        dev = lo.dev()
    );
    assert!(err.starts_with(&want) && err.trim().lines().count() == 1, "{err}");
    assert!(
        // With its pid when its lock file may be read (a data_dir made under a umask of 022).
        err.contains("; the rein serve of this data_dir ")
            && err.trim().ends_with(
                "runs as another user, whose lock file or descriptors this user may not read, so whether that \
                 claim is its own cannot be seen: run --check-config as the server's user (or as root)"
            ),
        "{err}"
    );
}

/// Two exports on one block device through two device nodes of it (`/dev/loopN` and a node made with
/// mknod, as a container's /dev has its own): refused at start and by `--check-config`, naming both
/// exports and their paths, as two exports on one file are. Before, the check said OK and the start
/// refused the second as `in use by the system (mounted, swap, ...)`, the kernel's refusal of its own
/// first claim (a writable and a read-only export were both served). Needs root (a loop device,
/// mknod); elsewhere skipped.
#[test]
fn two_exports_on_one_block_device_through_two_nodes_are_refused() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tmpdir("check-two-nodes");
    let dir = tmp.path();
    let img = dir.join("dev.img");
    let Some(lo) = LoopDev::over_new_file(&img, 4 << 20, &[]) else { return };
    let dev = lo.dev().to_string();
    let rdev = std::fs::metadata(&dev).unwrap().rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let node = dir.join("node");
    lo.node(&node);
    let node = node.to_str().unwrap();
    for (ro_a, ro_b) in [(false, false), (false, true), (true, false)] {
        let body = format!(
            "[[exports]]\nname = \"a\"\npath = \"{dev}\"\nread_only = {ro_a}\n\
             [[exports]]\nname = \"b\"\npath = \"{node}\"\nread_only = {ro_b}\n"
        );
        let cfg = config_file(dir, 101, &body);
        let want = format!(
            "error: exports \"a\" and \"b\" are backed by the same block device {major}:{minor} (a: {dev}, b: {node}); \
             each export needs its own (or both read_only = true)"
        );
        let (ok, out, err) = check(&["serve", "--config", cfg.to_str().unwrap()]);
        assert!(!ok && out.is_empty(), "read_only {ro_a}, {ro_b}: {out}");
        assert_eq!(err.trim(), want, "read_only {ro_a}, {ro_b}");
        let started = common::Rein::serve(&cfg).env("REIN_LOG", "off").fails();
        assert!(started.contains(&want), "a start says the same: {started}");
    }
    let body = format!(
        "[[exports]]\nname = \"a\"\npath = \"{dev}\"\nread_only = true\n\
         [[exports]]\nname = \"b\"\npath = \"{node}\"\nread_only = true\n"
    );
    let (ok, out, err) = check(&["serve", "--config", config_file(dir, 101, &body).to_str().unwrap()]);
    assert!(ok, "two read-only exports may share a device: {out}{err}");
}

/// A writable export of `path` named `name` in a configuration in `dir` (address 127.0.0.190): its path.
fn device_export(dir: &Path, name: &str, path: &str) -> String {
    let body = format!("[[exports]]\nname = \"{name}\"\npath = \"{path}\"\n");
    config_file(dir, 190, &body).to_str().unwrap().to_string()
}

/// `--check-config` and a start of `cfg` both fail with one line that starts with `want`.
fn refused_by_check_and_start(cfg: &str, want: &str) {
    let (ok, out, err) = check(&["serve", "--config", cfg]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.starts_with(&format!("error: {want}")) && err.trim().lines().count() == 1, "{err}");
    let started = Rein::serve(Path::new(cfg)).env("REIN_LOG", "off").fails();
    assert!(started.contains(want), "a start says the same: {started}");
}

/// Swap on a loop device (`mkswap`, `swapon`), turned off when dropped (before the device is detached).
struct Swap(String);

impl Swap {
    /// `None`, said, where swap cannot be made or turned on here.
    fn on(dev: &str) -> Option<Swap> {
        let run = |cmd: &str| Command::new(cmd).arg(dev).output().is_ok_and(|o| o.status.success());
        if !run("mkswap") || !run("swapon") {
            eprintln!("skipped: mkswap or swapon failed on {dev}");
            return None;
        }
        Some(Swap(dev.to_string()))
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
    }
}

/// A block device in use as swap is refused, by a start and by `--check-config`, saying it is swap;
/// before, the error listed every possible cause (`in use by the system (mounted, swap, part of a RAID,
/// ...)`). Needs root (a loop device, mkswap, swapon); elsewhere skipped.
#[test]
fn a_device_in_use_as_swap_is_refused_naming_swap() {
    let tmp = tmpdir("check-swap");
    let dir = tmp.path();
    let img = dir.join("swap.img");
    let Some(lo) = LoopDev::over_new_file(&img, 16 << 20, &[]) else { return };
    let Some(_swap) = Swap::on(lo.dev()) else { return };
    let want = format!(
        "export s: {}: is a block device in use: it is swap (/proc/swaps lists it). The kernel refused an exclusive \
         open (EBUSY)",
        lo.dev()
    );
    refused_by_check_and_start(&device_export(dir, "s", lo.dev()), &want);
}

/// A block device that a process claimed (an exclusive open, as a mkfs or a virtual machine takes) is
/// refused naming that process and its pid, found by its descriptors; before, the error sent the
/// operator to `fuser` and `lsof`. Here the claim is this test's own. Needs root (a loop device);
/// elsewhere skipped.
#[test]
fn a_device_claimed_by_a_process_is_refused_naming_the_process() {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = tmpdir("check-claim");
    let dir = tmp.path();
    let img = dir.join("claimed.img");
    let Some(lo) = LoopDev::over_new_file(&img, 16 << 20, &[]) else { return };
    let claim = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(lo.dev()).expect("claimed");
    let cfg = device_export(dir, "c", lo.dev());
    let want = format!(
        "export c: {}: is a block device in use: no mount, swap, RAID or device-mapper device holds it; open in ",
        lo.dev()
    );
    // This test's process among those named (the others are what the machine runs beside it: another
    // test's losetup that looks at every loop device, say); not the rein that asks.
    let this =
        format!("{} (pid {})", std::fs::read_to_string("/proc/self/comm").unwrap().trim_end(), std::process::id());
    let (ok, out, err) = check(&["serve", "--config", &cfg]);
    assert!(!ok && out.is_empty() && err.trim().lines().count() == 1, "{out}{err}");
    assert!(err.starts_with(&format!("error: {want}")) && err.contains(&this), "{err}");
    assert!(!err.contains("rein (pid"), "the asking rein is not named: {err}");
    let started = Rein::serve(Path::new(&cfg)).env("REIN_LOG", "off").fails();
    assert!(started.contains(&want) && started.contains(&this), "a start says the same: {started}");
    drop(claim);
}

/// A disk whose partition is mounted cannot be claimed (the kernel marks the whole disk claimed while a
/// partition is): serving the disk is refused naming the partition and where it is mounted. Here a loop
/// device with a partition table (`losetup -P`, `sfdisk`) and an ext4 on its first partition. Needs root
/// (a loop device, sfdisk, mkfs.ext4, mount); elsewhere skipped.
#[test]
fn a_disk_whose_partition_is_mounted_is_refused_naming_the_partition() {
    let tmp = tmpdir("check-part");
    let dir = tmp.path();
    let img = dir.join("disk.img");
    std::fs::File::create(&img).unwrap().set_len(32 << 20).unwrap();
    let table = format!("echo 'start=2048, size=16384' | sfdisk -q {}", img.display());
    if !Command::new("sh").arg("-c").arg(table).status().is_ok_and(|s| s.success()) {
        eprintln!("skipped: sfdisk cannot write a partition table here");
        return;
    }
    let Some(lo) = LoopDev::attach(&img, &["-P"]) else { return };
    let part = format!("{}p1", lo.dev());
    let _ = Command::new("udevadm").arg("settle").status();
    if !Path::new(&part).exists() {
        eprintln!("skipped: no partition node {part} (this kernel reads no partition table of a loop device)");
        return;
    }
    let mnt = dir.join("part mount");
    std::fs::create_dir(&mnt).unwrap();
    if !Command::new("mkfs.ext4").args(["-q", "-F", &part]).status().is_ok_and(|s| s.success()) {
        eprintln!("skipped: mkfs.ext4 failed");
        return;
    }
    let Some(_mount) = Mount::at(&part, &mnt) else { return };
    let want = format!(
        "export p: {}: is a block device in use: its partition {part} is mounted at {}. The kernel refused",
        lo.dev(),
        mnt.display()
    );
    refused_by_check_and_start(&device_export(dir, "p", lo.dev()), &want);
}

/// A shell in a mount namespace of its own (`unshare -m --propagation private`) that mounted a device
/// there and sleeps: the mount is that namespace's alone, unseen in this process's mountinfo. Killed when
/// dropped; its namespace, and the mount with it, go when it exits.
struct NamespaceMount(std::process::Child);

impl NamespaceMount {
    /// Mounts `dev` at `at` in a new mount namespace; `None`, said, where it cannot be made.
    fn at(dev: &str, at: &Path) -> Option<NamespaceMount> {
        let script = "mount \"$1\" \"$2\" && echo mounted && exec sleep 60";
        let mut child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script, "sh", dev])
            .arg(at)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .inspect_err(|e| eprintln!("skipped: unshare cannot be run here: {e}"))
            .ok()?;
        let mut line = String::new();
        let _ = std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        let ns = NamespaceMount(child);
        if line.trim() != "mounted" {
            eprintln!("skipped: {dev} cannot be mounted in a mount namespace of its own here (unshare -m)");
            return None;
        }
        Some(ns)
    }
}

impl Drop for NamespaceMount {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A block device mounted only in another mount namespace (a container's, `unshare -m`, a unit's
/// `PrivateMounts`) is refused naming that mount, the pid in that namespace and its command, found in
/// the namespace's mountinfo (`/proc/PID/mountinfo`); before, this process's mountinfo did not show it,
/// and the error fell back to the processes that have the device open, or to `fuser`. Needs root (a loop
/// device, mkfs.ext4, unshare, mount); elsewhere skipped.
#[test]
fn a_device_mounted_in_another_mount_namespace_is_refused_naming_that_mount() {
    let tmp = tmpdir("check-mntns");
    let dir = tmp.path();
    let Some(fs) = loop_fs(dir) else { return };
    let Some(ns) = NamespaceMount::at(fs.dev(), fs.mnt()) else { return };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(&format!(" {} ", fs.mnt().display())), "not mounted in this namespace");
    // The shell exec'ed sleep: one process, the namespace's only one.
    let want = format!(
        "export n: {}: is a block device in use: it is mounted at {} in the mount namespace of pid {} (sleep). The \
         kernel refused an exclusive open (EBUSY)",
        fs.dev(),
        fs.mnt().display(),
        ns.0.id()
    );
    let body = format!("[[exports]]\nname = \"n\"\npath = \"{}\"\n", fs.dev());
    let cfg = config_file(dir, 184, &body);
    refused_by_check_and_start(cfg.to_str().unwrap(), &want);
    drop(ns);
    drop(fs);
}

/// A mount, unmounted when dropped.
struct Mount(std::path::PathBuf);

impl Mount {
    /// Mounts `dev` at `at`; `None`, said, where it cannot be mounted.
    fn at(dev: &str, at: &Path) -> Option<Mount> {
        if !Command::new("mount").arg(dev).arg(at).status().is_ok_and(|s| s.success()) {
            eprintln!("skipped: {dev} cannot be mounted here");
            return None;
        }
        Some(Mount(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// An LVM volume group on a loop device with one active logical volume `lv` of 8 MiB; the group is
/// deactivated and removed, and the physical volume wiped, when dropped (before the device is detached).
/// The LVM tools run without udev (`DM_DISABLE_UDEV`: they make the `/dev/mapper` nodes themselves) and
/// without the system's devices file ([`Lvm::run`]).
struct Lvm {
    vg: String,
    pv: String,
}

impl Lvm {
    /// `None`, said, where LVM cannot be used here (its tools, or device-mapper in the kernel, missing).
    fn make(pv: &str, vg: &str) -> Option<Lvm> {
        if !common::installed("pvcreate") {
            eprintln!("skipped: the LVM tools are not installed");
            return None;
        }
        if !std::fs::read_to_string("/proc/misc").is_ok_and(|m| m.contains("device-mapper")) {
            eprintln!("skipped: no device-mapper in this kernel (LVM needs it; modprobe dm_mod)");
            return None;
        }
        let made = Lvm { vg: vg.to_string(), pv: pv.to_string() };
        let ok = made.run(&["pvcreate", "-y", "-ff", pv])
            && made.run(&["vgcreate", vg, pv])
            && made.run(&["lvcreate", "-y", "-L", "8M", "-n", "lv", vg]);
        if !ok {
            eprintln!("skipped: an LVM volume cannot be made on {pv} here");
            return None;
        }
        Some(made)
    }

    /// Runs an LVM command; whether it succeeded. Without the system's devices file (where LVM keeps
    /// one, a physical volume made here would be added to it).
    fn run(&self, args: &[&str]) -> bool {
        let out = Command::new(args[0])
            .args(["--config", "devices { use_devicesfile = 0 }"])
            .args(&args[1..])
            .env("DM_DISABLE_UDEV", "1")
            .env("LVM_SUPPRESS_FD_WARNINGS", "1")
            .output();
        match out {
            Ok(o) if o.status.success() => true,
            Ok(o) => {
                eprintln!("{}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim());
                false
            }
            Err(e) => {
                eprintln!("{}: {e}", args[0]);
                false
            }
        }
    }

    /// The logical volume's device-mapper name (a `-` in the group's name would be doubled).
    fn dm_name(&self) -> String {
        format!("{}-lv", self.vg)
    }
}

impl Drop for Lvm {
    fn drop(&mut self) {
        self.run(&["vgchange", "-an", &self.vg]);
        self.run(&["vgremove", "-ff", "-y", &self.vg]);
        self.run(&["pvremove", "-ff", "-y", &self.pv]);
    }
}

/// A loop device that is an LVM physical volume with an active logical volume is refused, by a start and
/// by `--check-config`, naming the volume (`/dev/mapper/<vg>-lv`, `dm-N`), where the error listed every
/// possible cause; the logical volume itself is served: the check says OK with its size, and a client
/// of the started server reads its size. Needs root (a loop device, the LVM tools, device-mapper in the
/// kernel); elsewhere skipped.
#[test]
fn a_physical_volume_is_refused_naming_its_logical_volume_which_is_served() {
    let tmp = tmpdir("check-lvm");
    let dir = tmp.path();
    let img = dir.join("pv.img");
    let Some(lo) = LoopDev::over_new_file(&img, 32 << 20, &[]) else { return };
    let Some(lvm) = Lvm::make(lo.dev(), &format!("reinlvmtest{}", std::process::id())) else { return };
    let name = lvm.dm_name();
    let want = format!(
        "export pv: {}: is a block device in use: it is under the active LVM logical volume {name} \
         (/dev/mapper/{name}, dm-",
        lo.dev()
    );
    refused_by_check_and_start(&device_export(dir, "pv", lo.dev()), &want);

    let volume = format!("/dev/mapper/{name}");
    let cfg = device_export(dir, "lv", &volume);
    let (ok, out, err) = check(&["serve", "--config", &cfg]);
    assert!(ok && out.contains(&format!("export lv: {volume} (8 MiB)")), "{out}{err}");
    let server = Rein::serve(Path::new(&cfg)).start();
    let open = common::nbd_open(server.nbd, "lv", false, std::time::Duration::from_secs(20));
    server.stop();
    assert_eq!(open.expect("a client of the served volume").size, 8 << 20);
}
