//! NBD block status (`base:allocation`, NBD_CMD_BLOCK_STATUS) against real clients: a sparse file export's
//! map as nbdinfo and qemu-img see it (the extents expected from what the test wrote, rounded to the file
//! system's block), nbdcopy reading only the data, a memory export's unwritten pages as holes,
//! BLOCK_STATUS without a context refused with EINVAL on a connection that goes on, and a gateway
//! volume's map from its nodes' (storage-node protocol v4; a plain NBD node's, `rein serve` or qemu-nbd,
//! over its status connection), and floods of it held to the caps on lookups a connection and the server
//! run at once.
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
    let asked = series_value(&metrics(s.admin), "rein_nbd_block_status_total");
    assert!(asked >= 1.0, "the server counts the block status it took: {asked}");

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

/// Storage nodes for the gateway tests: `rein serve` on 127.0.0.`host` (`[node]` on, the gateway's
/// specs) with sparse file exports `v` and `w` of 32 MiB each, made by the test.
fn block_node(dir: &Path, host: u8) -> Server {
    let dir = dir.join(format!("node{host}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut body = String::from("capacity_iops = 100000\nscheduler = \"dmclock\"\n");
    for name in ["v", "w"] {
        let image = dir.join(format!("{name}.img"));
        std::fs::File::create(&image).unwrap().set_len(32 * MIB).unwrap();
        body.push_str(&format!("[[exports]]\nname = \"{name}\"\npath = \"{}\"\n", image.display()));
    }
    body.push_str("[node]\nenabled = true\nspecs = \"gateway\"\n");
    serve_in(&dir, &local(host), &body)
}

/// The file system's block in `dir` (the nodes' files allocate in it).
fn fs_block(dir: &Path) -> u64 {
    let probe = dir.join("block-probe");
    std::fs::write(&probe, b"x").unwrap();
    let block = std::fs::metadata(&probe).unwrap().blksize();
    std::fs::remove_file(&probe).unwrap();
    block
}

/// `runs` (offset, length) rounded out to `block`, joined where they touch, with holes (flags 3) between
/// and data (0) on them, covering `size`; `data(offset)` says whether a hole there is data anyway (a node
/// that cannot answer), each 64 KiB unit at a time.
fn map_of(runs: &[(u64, u64)], block: u64, size: u64, data: impl Fn(u64) -> bool) -> Vec<(u64, u64, u32)> {
    let unit = 64 * 1024;
    let mut bytes = vec![3u32; (size / block) as usize];
    for &(offset, len) in runs {
        for b in offset / block..(offset + len).div_ceil(block) {
            bytes[b as usize] = 0;
        }
    }
    for (b, f) in bytes.iter_mut().enumerate() {
        if data(b as u64 * block / unit * unit) {
            *f = 0;
        }
    }
    let mut map: Vec<(u64, u64, u32)> = Vec::new();
    for (b, f) in bytes.into_iter().enumerate() {
        match map.last_mut() {
            Some(last) if last.2 == f => last.1 += block,
            _ => map.push((b as u64 * block, block, f)),
        }
    }
    map
}

/// Writes `runs` through the gateway's `uri` (bytes 0x61 onwards), one pwrite each.
fn write_runs(uri: &str, runs: &[(u64, u64)]) {
    let mut script = format!("h.connect_uri('{uri}')\n");
    for (i, (offset, len)) in runs.iter().enumerate() {
        script.push_str(&format!("h.pwrite(b'{}' * {len}, {offset})\n", (b'a' + i as u8) as char));
    }
    script.push_str("h.flush()\nprint('written')\n");
    assert_eq!(run_ok(nbdsh().args(["-c", &script])).trim(), "written");
}

/// The bytes the gateway's tenant `c` moved at the nodes (reads and writes), summed over them.
fn node_bytes(nodes: &[&Server]) -> u64 {
    nodes.iter().map(|n| series_value(&metrics(n.admin), "rein_tenant_bytes_total{tenant=\"c\"}") as u64).sum()
}

/// A gateway volume over three `rein serve` nodes (storage-node protocol v4, widths 1, 2, 1 of 64 KiB
/// units): it offers `base:allocation`, and `nbdinfo --map` lists exactly the runs written through it (at
/// the nodes' file-system block), across units of different nodes; `nbdcopy` of it reads about the data
/// only (the nodes' bytes for the gateway's tenant) and the copy is equal and sparse. Before this change
/// the gateway offered no context: `nbdinfo --map` failed and a copy read all 64 MiB.
#[test]
fn a_gateway_volume_maps_and_copies_as_its_nodes_extents() {
    let tmp = tmpdir("block-status-gateway");
    let dir = tmp.path();
    let nodes = [block_node(dir, 107), block_node(dir, 108), block_node(dir, 109)];
    let mut text = format!("{}\nrequest_timeout_s = 5\nconnect_timeout_s = 5\n", local(110));
    for (i, n) in nodes.iter().enumerate() {
        text.push_str(&format!("[[nodes]]\nname = \"s{}\"\naddress = \"{}\"\nprotocol = \"rein\"\n", i + 1, n.nbd));
    }
    text.push_str(
        "[[tenants]]\nname = \"c\"\n[[exports]]\nname = \"v\"\ntenant = \"c\"\nsize_mb = 64\nstripe_kb = 64\n\
         widths = { s1 = 1, s2 = 2, s3 = 1 }\n",
    );
    let gw = Rein::gateway(&common::write_file(dir, "gw.toml", &text)).start();
    for n in &nodes {
        n.wait_line("storage-node session granted");
    }
    let uri = format!("nbd://{}/v", gw.nbd);
    // Units of 64 KiB, a round of 256 KiB: s1 unit 0, s2 units 1-2, s3 unit 3. Runs over s1 and s2
    // (unit 0 into unit 1), a whole unit of s3, part of an s2 unit at an odd place, the volume's end (s3).
    let runs =
        [(0, 100 * 1024), (MIB + 192 * 1024, 64 * 1024), (10 * MIB + 8 * 1024 + 512, 5120), (64 * MIB - 4096, 4096)];
    write_runs(&uri, &runs);
    let block = fs_block(dir);
    let want = map_of(&runs, block, 64 * MIB, |_| false);
    assert_eq!(want.len(), 7, "four data runs, holes between: {want:?}");
    assert_eq!(nbdinfo_map(&uri), want, "nbdinfo --map through the gateway");
    let series = "rein_gateway_requests_total{export=\"v\",kind=\"block_status\"}";
    let asked = series_value(&metrics(gw.admin), series);
    assert!(asked >= 1.0, "the gateway counts the block status it answered: {asked}");

    // nbdcopy to a sparse file: the nodes read about the data, not the volume's 64 MiB.
    let data: u64 = want.iter().filter(|e| e.2 == 0).map(|e| e.1).sum();
    let before = node_bytes(&nodes.iter().collect::<Vec<_>>());
    let copy = dir.join("copy.img");
    std::fs::File::create(&copy).unwrap().set_len(64 * MIB).unwrap();
    run_ok(tool("nbdcopy").args([&uri, copy.to_str().unwrap()]));
    let read = node_bytes(&nodes.iter().collect::<Vec<_>>()) - before;
    assert!(read <= data + MIB, "nbdcopy read {read} bytes at the nodes for {data} bytes of data of 64 MiB");
    let copied = std::fs::read(&copy).unwrap();
    for (i, &(offset, len)) in runs.iter().enumerate() {
        let range = offset as usize..(offset + len) as usize;
        assert!(copied[range].iter().all(|&b| b == b'a' + i as u8), "run {i} copied");
    }
    assert_eq!(copied.iter().filter(|&&b| b != 0).count() as u64, runs.iter().map(|r| r.1).sum::<u64>());
    let allocated = std::fs::metadata(&copy).unwrap().blocks() * 512;
    assert!(allocated <= data + MIB, "the copy allocated {allocated} bytes for {data} bytes of data");
}

/// A volume over a storage node (v4) and a plain NBD session (`protocol = "nbd"`, the same kind of
/// node spoken to without the option, which offers `base:allocation` over structured replies): the plain
/// node is asked on its status connection, so its holes are reported as the storage node's are (holes
/// where nothing was written). Before, the plain node was not asked and its units were reported as data
/// (seen failing so: s2's units data, holes and data alternating unit by unit).
#[test]
fn a_plain_nbd_nodes_holes_are_reported_too() {
    let tmp = tmpdir("block-status-gateway-mixed");
    let dir = tmp.path();
    let nodes = [block_node(dir, 155), block_node(dir, 156)];
    let text = format!(
        "{}\nrequest_timeout_s = 5\nconnect_timeout_s = 5\n[[nodes]]\nname = \"s1\"\naddress = \"{}\"\n\
         protocol = \"rein\"\n[[nodes]]\nname = \"s2\"\naddress = \"{}\"\nprotocol = \"nbd\"\n[[tenants]]\n\
         name = \"c\"\n[[exports]]\nname = \"w\"\ntenant = \"c\"\nsize_mb = 32\nstripe_kb = 64\n",
        local(157),
        nodes[0].nbd,
        nodes[1].nbd
    );
    let gw = Rein::gateway(&common::write_file(dir, "gw.toml", &text)).start();
    nodes[0].wait_line("storage-node session granted");
    let uri = format!("nbd://{}/w", gw.nbd);
    // One run in s1's unit 64, one in s2's unit 129.
    let runs = [(4 * MIB + 4096, 4096), (8 * MIB + 64 * 1024 + 512, 1000)];
    write_runs(&uri, &runs);
    let block = fs_block(dir);
    let want = map_of(&runs, block, 32 * MIB, |_| false);
    assert_eq!(want.len(), 5, "two data runs, holes around them: {want:?}");
    assert_eq!(nbdinfo_map(&uri), want, "nbdinfo --map through the gateway");
}

/// qemu-nbd serving `file` as export `v` on `addr` (`-t`, `-e 4`: the gateway's session, its status
/// connection and nbdinfo's or nbdcopy's own are below it), until dropped.
fn qemu_node(file: &Path, addr: std::net::SocketAddr) -> common::KillOnDrop {
    let port = addr.port().to_string();
    let ip = addr.ip().to_string();
    let args = ["-f", "raw", "-t", "-e", "4", "-x", "v", "-b", &ip, "-p", &port, file.to_str().unwrap()];
    let child = std::process::Command::new("qemu-nbd")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let node = common::KillOnDrop(child);
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(20), "qemu-nbd listens on {addr}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    node
}

/// A file's allocation as `qemu-img map --output=json` sees it: its `base:allocation` flags per
/// 512-byte sector (data 0, a hole HOLE|ZERO = 3; allocated zeroes ZERO = 2).
fn qemu_img_flags(file: &Path, size: u64) -> Vec<u32> {
    let out = run_ok(tool("qemu-img").args(["map", "-f", "raw", "--output=json", file.to_str().unwrap()]));
    let map: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut flags = vec![u32::MAX; (size / 512) as usize];
    for e in map.as_array().unwrap() {
        let (start, length) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
        assert!(start % 512 == 0 && length % 512 == 0, "{e}");
        let f = u32::from(!e["data"].as_bool().unwrap()) | (u32::from(e["zero"].as_bool().unwrap()) << 1);
        flags[(start / 512) as usize..((start + length) / 512) as usize].fill(f);
    }
    assert!(flags.iter().all(|&f| f != u32::MAX), "qemu-img map covers {}", file.display());
    flags
}

/// A gateway volume over two real qemu-nbd nodes (plain NBD, widths 1 and 1 of 64 KiB units) over
/// sparse raw images with known data runs: `nbdinfo --map` through the gateway lists what qemu itself
/// reports of the images (`qemu-img map`, mapped unit by unit to the volume), and `nbdcopy` of the
/// volume is equal to the images' data and reads about the data only (the gateway's READ bytes). Before,
/// the qemu-nbd nodes were never asked: the map was one data extent, and the copy read all 32 MiB.
#[test]
fn a_volume_over_qemu_nbd_nodes_maps_and_copies_as_qemu_sees_its_images() {
    if !common::installed("qemu-nbd") || !common::installed("qemu-img") {
        eprintln!("skipped: qemu-nbd or qemu-img is not installed");
        return;
    }
    let tmp = tmpdir("block-status-qemu-nbd");
    let dir = tmp.path();
    const UNIT: u64 = 64 * 1024;
    // Node runs (offset, length, byte) in each 16 MiB image.
    let images: [&[(u64, u64, u8)]; 2] = [
        &[(0, 100 * 1024, b'a'), (5 * MIB + 4096, 8192, b'b'), (16 * MIB - 4096, 4096, b'c')],
        &[(64 * 1024, 64 * 1024, b'd'), (9 * MIB + 512, 3000, b'e')],
    ];
    let mut files = Vec::new();
    let mut nodes = Vec::new();
    let mut text = format!("{}\nrequest_timeout_s = 5\nconnect_timeout_s = 5\n", local(159));
    for (i, runs) in images.iter().enumerate() {
        let file = dir.join(format!("q{i}.img"));
        let f = std::fs::File::create(&file).unwrap();
        f.set_len(16 * MIB).unwrap();
        for &(offset, len, byte) in runs.iter() {
            f.write_all_at(&vec![byte; len as usize], offset).unwrap();
        }
        f.sync_all().unwrap();
        let addr = common::free_tcp("127.0.0.158");
        nodes.push(qemu_node(&file, addr));
        text.push_str(&format!("[[nodes]]\nname = \"q{i}\"\naddress = \"{addr}\"\nprotocol = \"nbd\"\n"));
        files.push(file);
    }
    text.push_str(
        "[[tenants]]\nname = \"c\"\n[[exports]]\nname = \"v\"\ntenant = \"c\"\nsize_mb = 32\nstripe_kb = 64\n",
    );
    let gw = Rein::gateway(&common::write_file(dir, "gw.toml", &text)).start();
    let uri = format!("nbd://{}/v", gw.nbd);
    // The volume's map from qemu's of the images: unit u at node u % 2, its unit u / 2.
    let size = 32 * MIB;
    let node_flags: Vec<Vec<u32>> = files.iter().map(|f| qemu_img_flags(f, 16 * MIB)).collect();
    let mut want: Vec<(u64, u64, u32)> = Vec::new();
    let mut data = 0;
    for sector in 0..size / 512 {
        let at = sector * 512;
        let unit = at / UNIT;
        let node_at = unit / 2 * UNIT + at % UNIT;
        let f = node_flags[(unit % 2) as usize][(node_at / 512) as usize];
        if f & 1 == 0 {
            data += 512;
        }
        match want.last_mut() {
            Some(last) if last.2 == f => last.1 += 512,
            _ => want.push((at, 512, f)),
        }
    }
    assert!(want.len() >= 9, "data runs and holes between: {want:?}");
    assert_eq!(nbdinfo_map(&uri), want, "nbdinfo --map through the gateway, as qemu-img map of the images");

    // nbdcopy to a sparse file: equal to the images' data, reading about the data only.
    let copy = dir.join("copy.img");
    std::fs::File::create(&copy).unwrap().set_len(size).unwrap();
    run_ok(tool("nbdcopy").args([&uri, copy.to_str().unwrap()]));
    let copied = std::fs::read(&copy).unwrap();
    let contents: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    for unit in 0..size / UNIT {
        let node_at = (unit / 2 * UNIT) as usize;
        let from = &contents[(unit % 2) as usize][node_at..node_at + UNIT as usize];
        assert!(copied[(unit * UNIT) as usize..((unit + 1) * UNIT) as usize] == *from, "unit {unit} copied");
    }
    let read = series_value(&metrics(gw.admin), "rein_gateway_read_bytes_total{export=\"v\"}") as u64;
    assert!(read <= data + MIB, "nbdcopy read {read} bytes through the gateway for {data} bytes of data of 32 MiB");
    drop(nodes);
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
    let (mut server, nbd, mut log) = striped_server(tmp.path());
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
    let text = stop_and_read(&mut server, &mut log);
    let running = lookup_counts(&text, "lookups=");
    assert_eq!(running.len(), 64, "a debug line per lookup of the flood:\n{text}");
    assert!(running.iter().all(|&n| (1..=2).contains(&n)), "lookups running at a lookup's start: {running:?}");
}

/// 16 connections flooding BLOCK_STATUS at once (8 requests each, each over 1,024 extents): every one
/// is answered in full, and no lookup started with more than the server's `BLOCK_STATUS_SERVER_AT_ONCE`
/// (8) of all its connections' running (the server's debug line for each lookup says how many), where
/// the connections' own caps allow about 32 (two each; a lookup gives its permits back as its thread
/// ends, so the next may start just before). With the server's cap at 256 they went up to 32, 50 and 32
/// in three runs, each a thread of the blocking pool.
#[test]
fn a_flood_of_block_status_on_many_connections_runs_eight_lookups_at_once() {
    let tmp = tmpdir("block-status-flood-many");
    let (mut server, nbd, mut log) = striped_server(tmp.path());
    let uri = format!("nbd://{nbd}/striped");
    let script = format!(
        "hs = []\n\
         for _ in range(16):\n    g = nbd.NBD()\n    g.add_meta_context('base:allocation')\n    \
         g.connect_uri('{uri}')\n    hs.append(g)\n\
         seen = []\n\
         cookies = [(g, g.aio_block_status(4 * 1048576, 0, lambda ctx, off, ents, err: seen.append(len(ents)) or 0)) \
                    for _ in range(8) for g in hs]\n\
         while any(g.aio_in_flight() > 0 for g in hs):\n    \
         for g in hs:\n        if g.aio_in_flight() > 0:\n            g.poll(0)\n\
         assert all(g.aio_command_completed(c) for g, c in cookies)\n\
         print(len(seen), min(seen) // 2, max(seen) // 2)\n"
    );
    let rest = run_ok(nbdsh().args(["-c", &script]));
    assert_eq!(rest.lines().next(), Some("128 1024 1024"), "{rest}");
    let text = stop_and_read(&mut server, &mut log);
    let running = lookup_counts(&text, "server_lookups=");
    assert_eq!(running.len(), 128, "a debug line per lookup of the flood:\n{text}");
    assert!(running.iter().all(|&n| (1..=8).contains(&n)), "server's lookups running at a lookup's start: {running:?}");
}

/// A `rein serve` on 127.0.0.100 with the file export `striped` (16 MiB: 4 KiB of data, 4 KiB of hole,
/// 512 times) whose debug log is kept: the server, its NBD address and its stderr.
fn striped_server(dir: &Path) -> (common::KillOnDrop, String, std::io::BufReader<std::process::ChildStderr>) {
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
    let (child, nbd, log) = Rein::serve(&config).start_keeping_stderr();
    (common::KillOnDrop(child), nbd.to_string(), log)
}

/// Stops the server and reads its log to the end.
fn stop_and_read(server: &mut common::KillOnDrop, log: &mut std::io::BufReader<std::process::ChildStderr>) -> String {
    let _ = server.0.kill();
    let _ = server.0.wait();
    let mut text = String::new();
    std::io::Read::read_to_string(log, &mut text).unwrap();
    text
}

/// The number after `key` on each "block status lookup" line of `text`.
fn lookup_counts(text: &str, key: &str) -> Vec<u32> {
    text.lines()
        .filter(|l| l.contains("block status lookup"))
        .map(|l| {
            let at = l.find(key).unwrap_or_else(|| panic!("no {key} in {l}")) + key.len();
            l[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
        })
        .collect()
}
