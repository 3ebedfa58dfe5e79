//! Test support shared by the unit tests of the NBD client and the gateway's node links: a fake NBD
//! server's side of the handshake, over a real socket.

use rein_proto::nbd::{ExportInfo, Negotiated, NodeHello, NodeWelcome, ServerHandshake, ServerProgress};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The one export the fake servers offer: "v", 1 MiB, writable.
pub(crate) fn export_v() -> ExportInfo {
    ExportInfo { name: "v".into(), description: String::new(), size: 1 << 20, read_only: false, volatile: false }
}

/// Runs the server's handshake over `s` for the export `info` until the client opens it; the
/// storage-node option is offered when `welcome` is given, and a hello gets what it returns. Returns what
/// was agreed and the bytes read past the handshake, or `None` if the client left.
pub(crate) async fn serve_handshake(
    s: &mut TcpStream,
    info: &ExportInfo,
    welcome: Option<&(dyn Fn(&NodeHello) -> NodeWelcome + Sync)>,
) -> Option<(Negotiated, Vec<u8>)> {
    let mut out = Vec::new();
    let mut hs = ServerHandshake::new(vec![info.clone()], &mut out);
    hs.set_node(welcome.is_some());
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
