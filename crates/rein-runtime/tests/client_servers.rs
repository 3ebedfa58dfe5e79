//! Rein's NBD client (`rein load`'s) against servers no one here wrote: qemu-nbd answers a READ of a
//! sparse image in several structured chunks (data, holes, then the end), which the client must assemble
//! into the request's bytes; nbdkit answers with one data chunk. Skipped when the server is not
//! installed. Each server listens on its own 127.0.0.x address and is stopped at the end.
use rein_proto::nbd::Command;
use rein_runtime::client::NbdClient;
use std::net::SocketAddr;
use std::process::{Child, Command as Cmd};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn installed(tool: &str) -> bool {
    Cmd::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success())
}

fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0)).unwrap().local_addr().unwrap().port()
}

async fn connect(addr: SocketAddr) -> std::sync::Arc<NbdClient> {
    let start = Instant::now();
    loop {
        match NbdClient::connect(addr, "v").await {
            Ok(c) => return c,
            Err(e) if start.elapsed() > Duration::from_secs(20) => panic!("{addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A 4 MiB sparse image with 64 KiB of 0xab at 1 MiB; qemu-nbd serves it; a read from 1 MiB - 8 KiB to
/// 1 MiB + 72 KiB crosses a hole, the data and a hole again.
#[tokio::test]
async fn a_sparse_read_from_qemu_nbd_comes_back_whole() {
    if !installed("qemu-nbd") {
        eprintln!("skipped: qemu-nbd is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("sparse.img");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(4 << 20).unwrap();
        f.write_all_at(&[0xab; 64 << 10], 1 << 20).unwrap();
    }
    let ip = "127.0.0.67";
    let port = free_port(ip);
    let _server = Server(
        Cmd::new("qemu-nbd")
            .args(["-f", "raw", "-r", "-b", ip, "-p", &port.to_string(), "-x", "v", "-t", img.to_str().unwrap()])
            .spawn()
            .unwrap(),
    );
    let client = connect(format!("{ip}:{port}").parse().unwrap()).await;
    let (from, len) = ((1u64 << 20) - (8 << 10), 80u32 << 10);
    let data = client.request(Command::Read, from, len, &[], false).await.unwrap();
    let mut want = vec![0u8; len as usize];
    want[8 << 10..72 << 10].fill(0xab);
    assert_eq!(data.len(), want.len(), "the read's length");
    assert!(data == want, "the read's bytes differ from the image's");
    // All hole, and all data.
    assert_eq!(client.request(Command::Read, 3 << 20, 4096, &[], false).await.unwrap(), vec![0u8; 4096]);
    assert_eq!(client.request(Command::Read, 1 << 20, 4096, &[], false).await.unwrap(), vec![0xab; 4096]);
}

/// nbdkit's memory plugin: a write, then reads across it.
#[tokio::test]
async fn reads_and_writes_through_nbdkit() {
    if !installed("nbdkit") {
        eprintln!("skipped: nbdkit is not installed");
        return;
    }
    let ip = "127.0.0.68";
    let port = free_port(ip);
    let _server = Server(
        Cmd::new("nbdkit").args(["-f", "-i", ip, "-p", &port.to_string(), "-e", "v", "memory", "4M"]).spawn().unwrap(),
    );
    let client = connect(format!("{ip}:{port}").parse().unwrap()).await;
    client.request(Command::Write, 4096, 8192, &[0x5a; 8192], false).await.unwrap();
    let data = client.request(Command::Read, 0, 16384, &[], false).await.unwrap();
    let mut want = vec![0u8; 16384];
    want[4096..12288].fill(0x5a);
    assert!(data == want, "the read's bytes differ from what was written");
}
