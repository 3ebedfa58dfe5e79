//! The NBD server: connections, handshake and transmission over rein-proto's codec, requests through the
//! QoS dispatcher.
//!
//! Each connection runs the fixed newstyle handshake (bounded in time and bytes), then reads requests in a
//! loop. Every request becomes a task that submits it to the dispatcher (so one connection can have many
//! in flight, up to [`MAX_IN_FLIGHT_PER_CONN`]) and hands the encoded reply to the connection's writer
//! task. All connections of an export share its tenant, hence its queue and QoS.
//!
//! Errors are per request where the spec allows: an out-of-range offset, an oversize request or an
//! unknown command gets EINVAL and the connection stays usable; a write to a read-only export gets EPERM.
//! A malformed handshake, a bad request magic, or an oversize WRITE too large to skip closes the connection
//! (the stream cannot be resynchronised); other connections are unaffected. A client that disappears
//! mid-request only loses its own replies.

use crate::dispatch::{Dispatcher, IoRequest, Op};
use crate::storage::Storage;
use rein_core::TenantId;
use rein_proto::nbd::{self as p, Command, ExportInfo, RequestHeader, ServerHandshake, ServerProgress};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Semaphore};

/// Requests one connection may have in flight before the server stops reading from it.
pub const MAX_IN_FLIGHT_PER_CONN: usize = 256;
/// Time allowed for the whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// An export as the server runs it.
pub struct Export {
    pub info: ExportInfo,
    pub storage: Arc<dyn Storage>,
    pub tenant: TenantId,
}

/// What every connection shares.
pub struct NbdContext {
    pub exports: Vec<Export>,
    pub dispatcher: Dispatcher,
    pub max_payload: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] p::ProtoError),
    #[error("handshake timed out")]
    Timeout,
}

/// Serves one connection until the client disconnects, errs, or `shutdown` turns true (then in-flight
/// requests are answered before closing).
pub async fn serve_connection(stream: TcpStream, ctx: Arc<NbdContext>, mut shutdown: watch::Receiver<bool>) -> Result<(), ConnError> {
    stream.set_nodelay(true)?;
    let (mut rd, mut wr) = stream.into_split();
    let infos: Vec<ExportInfo> = ctx.exports.iter().map(|e| e.info.clone()).collect();
    let mut out = Vec::new();
    let mut hs = ServerHandshake::new(infos, &mut out);
    wr.write_all(&out).await?;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let negotiated = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = rd.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.extend_from_slice(&chunk[..n]);
            out.clear();
            let (used, progress) = hs.feed(&buf, &mut out)?;
            buf.drain(..used);
            wr.write_all(&out).await?;
            match progress {
                ServerProgress::NeedMore => continue,
                ServerProgress::Aborted => return Ok(None),
                ServerProgress::Done(n) => return Ok::<_, ConnError>(Some(n)),
            }
        }
    })
    .await
    .map_err(|_| ConnError::Timeout)??;
    let Some(neg) = negotiated else { return Ok(()) };
    let export_idx = neg.export;
    let structured = neg.structured;
    tracing::debug!(export = %ctx.exports[export_idx].info.name, structured, "NBD connection ready");

    // Writer task: replies in completion order.
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(MAX_IN_FLIGHT_PER_CONN);
    let writer = tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if wr.write_all(&msg).await.is_err() {
                // Client gone: drain the channel so request tasks are not blocked, then stop.
                while rx.recv().await.is_some() {}
                return;
            }
        }
        let _ = wr.shutdown().await;
    });
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONN));
    let result = transmission(&mut rd, buf, &ctx, export_idx, structured, &tx, &permits, &mut shutdown).await;
    // Wait for in-flight requests to be answered, then let the writer finish.
    let _ = permits.acquire_many(MAX_IN_FLIGHT_PER_CONN as u32).await;
    drop(tx);
    let _ = writer.await;
    result
}

async fn read_exact_buffered(rd: &mut tokio::net::tcp::OwnedReadHalf, buf: &mut Vec<u8>, n: usize) -> std::io::Result<bool> {
    while buf.len() < n {
        let mut chunk = vec![0u8; (n - buf.len()).clamp(4096, 1 << 20)];
        let k = rd.read(&mut chunk).await?;
        if k == 0 {
            return Ok(false);
        }
        buf.extend_from_slice(&chunk[..k]);
    }
    Ok(true)
}

#[allow(clippy::too_many_arguments)]
async fn transmission(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    mut buf: Vec<u8>,
    ctx: &Arc<NbdContext>,
    export_idx: usize,
    structured: bool,
    tx: &mpsc::Sender<Vec<u8>>,
    permits: &Arc<Semaphore>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), ConnError> {
    let export = &ctx.exports[export_idx];
    loop {
        let more = tokio::select! {
            r = read_exact_buffered(rd, &mut buf, p::REQUEST_LEN) => r?,
            _ = shutdown.wait_for(|s| *s) => return Ok(()),
        };
        if !more {
            return Ok(()); // client closed (with or without NBD_CMD_DISC)
        }
        let hdr = RequestHeader::decode(&buf)?.expect("have a full header");
        buf.drain(..p::REQUEST_LEN);
        let reply_err = |code: u32| encode_reply(hdr.handle, hdr.offset, code, hdr.command == Command::Read, structured, &[]);
        // WRITE payload comes first, whatever we decide about the request.
        let mut payload = Vec::new();
        if hdr.command == Command::Write {
            if hdr.length > ctx.max_payload && hdr.length > p::MAX_DISCARD {
                return Err(p::ProtoError::Unrecoverable(hdr.length).into());
            }
            if !read_exact_buffered(rd, &mut buf, hdr.length as usize).await? {
                return Ok(());
            }
            payload = buf.drain(..hdr.length as usize).collect();
        }
        let op = match hdr.command {
            Command::Disc => return Ok(()),
            Command::Read if hdr.length > ctx.max_payload => None,
            Command::Write if hdr.length > ctx.max_payload => None,
            Command::Read => Some(Op::Read { len: hdr.length }),
            Command::Write => Some(Op::Write { data: std::mem::take(&mut payload) }),
            Command::Flush => Some(Op::Flush),
            Command::Trim => Some(Op::Trim { len: hdr.length }),
            Command::WriteZeroes => Some(Op::WriteZeroes { len: hdr.length }),
            Command::Other(_) => None,
        };
        let Some(op) = op else {
            let _ = tx.send(reply_err(p::EINVAL)).await;
            continue;
        };
        let writes = matches!(op, Op::Write { .. } | Op::Trim { .. } | Op::WriteZeroes { .. });
        if writes && export.info.read_only {
            let _ = tx.send(reply_err(p::EPERM)).await;
            continue;
        }
        let permit = permits.clone().acquire_owned().await.expect("semaphore never closed");
        let (ctx2, tx2) = (ctx.clone(), tx.clone());
        let req = IoRequest { storage: export.storage.clone(), tenant: export.tenant, offset: hdr.offset, op, fua: hdr.fua() };
        tokio::spawn(async move {
            let res = ctx2.dispatcher.io(req).await;
            let msg = match res {
                Ok(data) => encode_reply(hdr.handle, hdr.offset, 0, hdr.command == Command::Read, structured, &data),
                Err(e) => {
                    tracing::debug!(handle = hdr.handle, command = %hdr.command, error = %e, "request failed");
                    encode_reply(hdr.handle, hdr.offset, e.errno(), hdr.command == Command::Read, structured, &[])
                }
            };
            let _ = tx2.send(msg).await;
            drop(permit);
        });
    }
}

/// Encodes a reply: simple, or structured (one chunk with DONE) when negotiated.
fn encode_reply(handle: u64, offset: u64, error: u32, is_read: bool, structured: bool, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + data.len());
    if !structured {
        p::simple_reply(&mut out, handle, error);
        if error == 0 && is_read {
            out.extend_from_slice(data);
        }
    } else if error != 0 {
        p::structured_error(&mut out, handle, error, "");
    } else if is_read && !data.is_empty() {
        // One chunk covering the whole read, at the request's offset.
        p::structured_chunk(&mut out, handle, p::REPLY_FLAG_DONE, p::REPLY_TYPE_OFFSET_DATA, &[&offset.to_be_bytes(), data]);
    } else {
        p::structured_chunk(&mut out, handle, p::REPLY_FLAG_DONE, p::REPLY_TYPE_NONE, &[]);
    }
    out
}
