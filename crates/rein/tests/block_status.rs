//! NBD block status (`base:allocation`, NBD_CMD_BLOCK_STATUS) against real clients: a sparse file export's
//! map as nbdinfo and qemu-img see it (the extents expected from what the test wrote, rounded to the file
//! system's block), nbdcopy reading only the data, a memory export's unwritten pages as holes,
//! BLOCK_STATUS without a context refused with EINVAL on a connection that goes on, and a gateway that
//! offers no context.
mod common;

use common::{local, metrics, nbdsh, run_ok, series_value, serve_in, tmpdir, tool, Rein, Server};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;
/// The sparse export's size.
const SIZE: u64 = 64 * MIB;
/// What the test writes into the sparse image: (offset, length), some unaligned.
const WRITES: [(u64, u64); 3] = [(0, MIB), (8 * MIB + 100, 10_000), (40 * MIB - 1, 2)];

/// A `rein serve` on 127.0.0.`host` in `dir/serve` with the file export `sparse` (a sparse image the
/// test made, [`WRITES`] written) and a 16 MiB memory export `m`.
fn sparse_server(dir: &Path, host: u8) -> (Server, PathBuf) {
    let image = dir.join("sparse.img");
    let f = std::fs::File::create(&image).unwrap();
    f.set_len(SIZE).unwrap();
    for (i, (offset, len)) in WRITES.into_iter().enumerate() {
        f.write_all_at(&vec![0x41 + i as u8; len as usize], offset).unwrap();
    }
    f.sync_all().unwrap();
    let body = format!(
        "capacity_iops = 100000\n[[exports]]\nname = \"sparse\"\npath = \"{}\"\ntenant = \"t\"\n\
         [[exports]]\nname = \"m\"\nbackend = \"memory\"\nsize_mb = 16\ntenant = \"t\"\n[[tenants]]\nname = \"t\"\n",
        image.display()
    );
    (serve_in(&dir.join("serve"), &local(host), &body), image)
}

/// The map the writes make: data from each write's start rounded down to `block` to its end rounded up,
/// overlapping or touching runs joined, holes between; (offset, length, is data), covering the export.
fn expected_map(block: u64) -> Vec<(u64, u64, bool)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (offset, len) in WRITES {
        let (start, end) = (offset / block * block, (offset + len).div_ceil(block) * block);
        match runs.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => runs.push((start, end)),
        }
    }
    let mut map = Vec::new();
    let mut at = 0;
    for (start, end) in runs {
        if start > at {
            map.push((at, start - at, false));
        }
        map.push((start, end - start, true));
        at = end;
    }
    if at < SIZE {
        map.push((at, SIZE - at, false));
    }
    map
}

/// `nbdinfo --map` of `uri`: (offset, length, flags) per line.
fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, u32)> {
    let out = run_ok(tool("nbdinfo").args(["--map", uri]));
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect()
}

/// A sparse file export's holes and data, as the writes made them (aligned to the file system's block):
/// nbdinfo lists exactly those extents (holes HOLE|ZERO = 3, data 0), qemu-img map agrees, and nbdcopy
/// to a sparse file reads only the data (the tenant's bytes grow by about the data's size, not the
/// export's) and leaves the copy sparse and equal. Without block status (before this change) nbdinfo
/// `--map` failed: no context to negotiate.
#[test]
fn a_sparse_file_export_maps_and_copies_as_its_extents() {
    let tmp = tmpdir("block-status-file");
    let dir = tmp.path();
    let (s, image) = sparse_server(dir, 103);
    let block = std::fs::metadata(&image).unwrap().blksize();
    let want: Vec<(u64, u64, u32)> =
        expected_map(block).into_iter().map(|(o, l, data)| (o, l, if data { 0 } else { 3 })).collect();
    assert!(want.len() == 6, "three data runs between holes: {want:?}");
    let uri = format!("nbd://{}/sparse", s.nbd);
    assert_eq!(nbdinfo_map(&uri), want, "nbdinfo --map");

    // qemu-img map: the same runs (data, or zero and not data).
    let out = run_ok(tool("qemu-img").args(["map", "--output=json", "-f", "raw", &uri]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let got: Vec<(u64, u64, u32)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let (data, zero) = (e["data"].as_bool().unwrap(), e["zero"].as_bool().unwrap());
            assert_eq!(data, !zero, "{e}");
            (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap(), if data { 0 } else { 3 })
        })
        .collect();
    assert_eq!(got, want, "qemu-img map");

    // nbdcopy to a sparse file: only the data is read, the copy stays sparse and equal.
    let data: u64 = want.iter().filter(|e| e.2 == 0).map(|e| e.1).sum();
    let series = "rein_tenant_bytes_total{tenant=\"t\"}";
    let before = series_value(&metrics(s.admin), series) as u64;
    let copy = dir.join("copy.img");
    std::fs::File::create(&copy).unwrap().set_len(SIZE).unwrap();
    run_ok(tool("nbdcopy").args([&uri, copy.to_str().unwrap()]));
    let read = series_value(&metrics(s.admin), series) as u64 - before;
    assert!(read <= data + MIB, "nbdcopy read {read} bytes for {data} bytes of data of {SIZE}");
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&image).unwrap(), "the copy's bytes");
    let allocated = std::fs::metadata(&copy).unwrap().blocks() * 512;
    assert!(allocated <= data + MIB, "the copy allocated {allocated} bytes for {data} bytes of data");
}

/// A memory export: its pages never written are holes (1 MiB pages), a written one data.
#[test]
fn a_memory_export_maps_its_written_pages_as_data() {
    let tmp = tmpdir("block-status-mem");
    let (s, _) = sparse_server(tmp.path(), 104);
    let uri = format!("nbd://{}/m", s.nbd);
    assert_eq!(nbdinfo_map(&uri), [(0, 16 * MIB, 3)]);
    let out = common::run_ok_with_stderr(tool("qemu-io").args(["-f", "raw", "-c", "write -P 0x11 3000k 8k", &uri]));
    assert!(!out.contains("failed"), "{out}");
    // 3000 KiB and 3008 KiB lie in the third page (2 MiB to 3 MiB).
    assert_eq!(nbdinfo_map(&uri), [(0, 2 * MIB, 3), (2 * MIB, MIB, 0), (3 * MIB, 13 * MIB, 3)]);
}

/// BLOCK_STATUS without a context negotiated (libnbd asking for none, with its own checks off so that
/// it sends the command anyway) is
/// answered EINVAL and the connection goes on (a READ after it succeeds); with the context, libnbd
/// reports its extents. Before this change the server answered EINVAL too (an unknown command), but had
/// no context to negotiate: the second half failed.
#[test]
fn block_status_without_a_context_is_einval_and_the_connection_goes_on() {
    let tmp = tmpdir("block-status-einval");
    let (s, _) = sparse_server(tmp.path(), 105);
    let uri = format!("nbd://{}/sparse", s.nbd);
    let script = format!(
        "h.connect_uri('{uri}')\n\
         h.set_strict_mode(0)\n\
         try:\n    h.block_status(65536, 0, lambda *a: 0)\n    print('no error')\n\
         except nbd.Error as e:\n    print('errno', e.errno)\n\
         assert h.pread(512, 0) == b'A' * 512\n\
         print('read ok')\n\
         g = nbd.NBD()\n\
         g.add_meta_context('base:allocation')\n\
         g.connect_uri('{uri}')\n\
         seen = []\n\
         g.block_status(2 * 1048576, 0, lambda ctx, off, ents, err: seen.append((ctx, off, list(ents))) or 0)\n\
         print(seen)\n"
    );
    let out = run_ok(nbdsh().args(["-c", &script]));
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("errno EINVAL"), "{out}");
    assert_eq!(lines.next(), Some("read ok"), "{out}");
    // 1 MiB of data, then a hole to 2 MiB (8 MiB + 100 is the next data).
    assert_eq!(lines.next(), Some("[('base:allocation', 0, [1048576, 0, 1048576, 3])]"), "{out}");
}

/// A gateway offers no metadata context (it would have to ask every node of a stripe): libnbd asks for
/// `base:allocation` and gets none, and nbdinfo's map cannot be made; its node (a `rein serve`) offers it.
#[test]
fn the_gateway_offers_no_context() {
    let tmp = tmpdir("block-status-gateway");
    let dir = tmp.path();
    let (node, _) = sparse_server(dir, 101);
    let text = format!(
        "{}\nrequest_timeout_s = 2\nconnect_timeout_s = 2\n[[nodes]]\nname = \"s1\"\naddress = \"{}\"\n\
         protocol = \"nbd\"\n[[exports]]\nname = \"sparse\"\nsize_mb = 64\nstripe_kb = 64\n",
        local(102),
        node.nbd
    );
    let gw = Rein::gateway(&common::write_file(dir, "gw.toml", &text)).start();
    let can = |addr| {
        let script = format!(
            "h.add_meta_context('base:allocation')\nh.connect_uri('nbd://{addr}/sparse')\n\
             print(h.can_meta_context('base:allocation'))\n"
        );
        run_ok(nbdsh().args(["-c", &script])).trim().to_string()
    };
    assert_eq!(can(node.nbd), "True", "the node offers it");
    assert_eq!(can(gw.nbd), "False", "the gateway offers none");
    let out = tool("nbdinfo").args(["--map", &format!("nbd://{}/sparse", gw.nbd)]).output().unwrap();
    assert!(!out.status.success(), "nbdinfo --map through the gateway: {out:?}");
}

/// 64 BLOCK_STATUS requests at once on one connection, each over 1,024 extents (4 KiB of data, 4 KiB of
/// hole, 512 times: 2,048 `lseek`s per request), far past the connection's `BLOCK_STATUS_AT_ONCE` (2)
/// lookups at once: every one is answered in full, the connection then reads on (a READ), and no lookup
/// started with more than two of the connection's running (the server's debug line for each lookup says
/// how many; with the cap at 256 they went up to 62, and each took a thread of tokio's blocking pool: 62
/// and 63 more threads, against 3 to 5 with the cap on a quiet machine and 21 in a CI run, where a
/// lookup's thread returns to the pool just after its permit and the next lookup often starts another).
#[test]
fn a_flood_of_block_status_on_one_connection_runs_two_lookups_at_once() {
    let tmp = tmpdir("block-status-flood");
    let dir = tmp.path();
    let image = dir.join("striped.img");
    let f = std::fs::File::create(&image).unwrap();
    f.set_len(16 * MIB).unwrap();
    for i in 0..512u64 {
        f.write_all_at(&[0x5a; 4096], i * 8192).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let body = format!(
        "capacity_iops = 100000\n[[exports]]\nname = \"striped\"\npath = \"{}\"\ntenant = \"t\"\n\
         [[tenants]]\nname = \"t\"\n",
        image.display()
    );
    std::fs::create_dir_all(dir.join("serve")).unwrap();
    let config = common::config_at(&dir.join("serve"), &local(100), &body);
    // Its debug log (a line per lookup), read to the end once it is stopped.
    let (child, nbd, mut log) = Rein::serve(&config).start_keeping_stderr();
    let mut server = common::KillOnDrop(child);
    let uri = format!("nbd://{nbd}/striped");
    let script = format!(
        "h.add_meta_context('base:allocation')\n\
         h.connect_uri('{uri}')\n\
         seen = []\n\
         cookies = [h.aio_block_status(4 * 1048576, 0, lambda ctx, off, ents, err: seen.append(list(ents)) or 0) \
                    for _ in range(64)]\n\
         while h.aio_in_flight() > 0:\n    h.poll(-1)\n\
         assert all(h.aio_command_completed(c) for c in cookies)\n\
         print(len(seen), min(len(e) for e in seen) // 2, max(len(e) for e in seen) // 2, seen[0][:4])\n\
         print(len(h.pread(4096, 0)))\n"
    );
    let rest = run_ok(nbdsh().args(["-c", &script]));
    let mut lines = rest.lines();
    // 64 answers of 1,024 extents each (the cap), data then hole from offset 0; then a READ.
    assert_eq!(lines.next(), Some("64 1024 1024 [4096, 0, 4096, 3]"), "{rest}");
    assert_eq!(lines.next(), Some("4096"), "{rest}");
    let _ = server.0.kill();
    let _ = server.0.wait();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut log, &mut text).unwrap();
    let running: Vec<u32> = text
        .lines()
        .filter(|l| l.contains("block status lookup"))
        .map(|l| {
            let at = l.find("lookups=").unwrap_or_else(|| panic!("no lookups= in {l}")) + "lookups=".len();
            l[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(running.len(), 64, "a debug line per lookup of the flood:\n{text}");
    assert!(running.iter().all(|&n| (1..=2).contains(&n)), "lookups running at a lookup's start: {running:?}");
}
