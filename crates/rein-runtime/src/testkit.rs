//! Test support shared by the unit tests of the NBD client and the gateway's node links: a fake NBD
//! server's side of the handshake, over a real socket; the names in a directory, for the tests of
//! the file writers (`durable`, `state`); and a socket whose every read and write fails ([`Failing`],
//! for the pShift link's and controller's frame writers).

use rein_proto::nbd::{
    Event, ExportInfo, Negotiated, NodeHello, NodeWelcome, Request, ServerHandshake, ServerProgress, ServerTransmission,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The one export the fake servers offer: "v", 1 MiB, writable.
pub(crate) fn export_v() -> ExportInfo {
    ExportInfo {
        name: "v".into(),
        description: String::new(),
        size: 1 << 20,
        read_only: false,
        volatile: false,
        min_block: 1,
    }
}

/// A fake NBD server's next connection on `listener`: the client accepted, its handshake served for
/// [`export_v`], and the transmission state for what follows (requests of up to 1 MiB) with the bytes
/// read past the handshake; `None` if the client left during it.
pub(crate) async fn accept_v(listener: &tokio::net::TcpListener) -> Option<(TcpStream, ServerTransmission, Vec<u8>)> {
    let (mut s, _) = listener.accept().await.ok()?;
    let info = export_v();
    let (negotiated, buf) = serve_handshake(&mut s, &info, None).await?;
    let machine = ServerTransmission::new(rein_proto::nbd::TransmissionConfig::new(&info, &negotiated, 1 << 20));
    Some((s, machine, buf))
}

/// Runs the server's handshake over `s` for the export `info` until the client opens it; the
/// storage-node option is offered when `welcome` is given, and a hello gets what it returns. Returns what
/// was agreed and the bytes read past the handshake, or `None` if the client left.
pub(crate) async fn serve_handshake(
    s: &mut TcpStream,
    info: &ExportInfo,
    welcome: Option<&(dyn Fn(&NodeHello) -> NodeWelcome + Sync)>,
) -> Option<(Negotiated, Vec<u8>)> {
    serve_handshake_clearing(s, info, welcome, 0).await
}

/// [`serve_handshake`] advertising the export's transmission flags without those of `clear` (a node
/// unlike any rein-proto serves, e.g. one with FLUSH but not FUA): the flags are cleared in the
/// NBD_REP_INFO / NBD_INFO_EXPORT reply on its way out.
pub(crate) async fn serve_handshake_clearing(
    s: &mut TcpStream,
    info: &ExportInfo,
    welcome: Option<&(dyn Fn(&NodeHello) -> NodeWelcome + Sync)>,
    clear: u16,
) -> Option<(Negotiated, Vec<u8>)> {
    serve_handshake_with(s, info, welcome, clear, false).await
}

/// [`serve_handshake_clearing`], the export offering `base:allocation` if `block_status`.
pub(crate) async fn serve_handshake_with(
    s: &mut TcpStream,
    info: &ExportInfo,
    welcome: Option<&(dyn Fn(&NodeHello) -> NodeWelcome + Sync)>,
    clear: u16,
    block_status: bool,
) -> Option<(Negotiated, Vec<u8>)> {
    let mut out = Vec::new();
    let mut hs = ServerHandshake::new(vec![info.clone()], &mut out);
    hs.set_node(welcome.is_some());
    hs.set_block_status(vec![block_status]);
    s.write_all(&out).await.unwrap();
    let mut buf = Vec::new();
    loop {
        if s.read_buf(&mut buf).await.unwrap() == 0 {
            return None;
        }
        loop {
            out.clear();
            let (used, progress) = hs.feed(&buf, &mut out).unwrap();
            buf.drain(..used);
            let progress = match (progress, welcome) {
                (ServerProgress::NodeHello(h), Some(welcome)) => hs.node_verdict(Ok(welcome(&h)), &mut out),
                (other, _) => other,
            };
            clear_export_flags(&mut out, clear);
            s.write_all(&out).await.unwrap();
            match progress {
                ServerProgress::Done(n) => return Some((n, buf)),
                // More options already received: go on; else (nothing, or a partial one) read.
                ServerProgress::NeedMore if used > 0 && !buf.is_empty() => continue,
                ServerProgress::NeedMore => break,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

/// Clears `clear` in the transmission flags of every NBD_INFO_EXPORT reply in `out` (option reply magic,
/// option, NBD_REP_INFO, length 12, NBD_INFO_EXPORT, size, flags).
fn clear_export_flags(out: &mut [u8], clear: u16) {
    const MAGIC: [u8; 8] = 0x0003_e889_0455_65a9u64.to_be_bytes();
    if clear == 0 {
        return;
    }
    let mut i = 0;
    while i + 32 <= out.len() {
        let head = &out[i..];
        if head[..8] == MAGIC && head[12..16] == [0, 0, 0, 3] && head[16..20] == [0, 0, 0, 12] && head[20..22] == [0, 0]
        {
            let flags = u16::from_be_bytes([head[30], head[31]]) & !clear;
            out[i + 30..i + 32].copy_from_slice(&flags.to_be_bytes());
            i += 32;
        } else {
            i += 1;
        }
    }
}

/// The next request a fake server reads on `s` through `machine` (`buf`: bytes read and not yet used), or
/// `None` once the client has closed; anything but a request is a test failure.
pub(crate) async fn next_request(
    s: &mut TcpStream,
    machine: &mut ServerTransmission,
    buf: &mut Vec<u8>,
) -> Option<Request> {
    loop {
        let (used, event) = machine.feed(buf).unwrap();
        let request = match event {
            Event::NeedMore { .. } => None,
            Event::Request { request, .. } => Some(request),
            other => panic!("unexpected {other:?}"),
        };
        buf.drain(..used);
        match request {
            Some(r) => return Some(r),
            None if s.read_buf(buf).await.unwrap() == 0 => return None,
            None => {}
        }
    }
}

/// The names of the entries in `dir`, sorted.
pub(crate) fn dir_names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// A reader and a writer whose socket fails: every read and write is an error ("the socket failed").
pub(crate) struct Failing;

impl tokio::io::AsyncRead for Failing {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Err(std::io::Error::other("the socket failed")))
    }
}

impl tokio::io::AsyncWrite for Failing {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Err(std::io::Error::other("the socket failed")))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
