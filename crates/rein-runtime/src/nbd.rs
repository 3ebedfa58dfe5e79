//! The NBD server: connections, handshake and transmission over rein-proto's codec, requests through the
//! QoS dispatcher.
//!
//! Each connection runs the fixed newstyle handshake (bounded in time and bytes), then reads requests in a
//! loop. Every request goes to the dispatcher with a completion callback that encodes the reply and hands
//! it to the connection's writer task (so one connection can have many in flight, up to
//! [`MAX_IN_FLIGHT_PER_CONN`]); the writer coalesces ready replies into one socket write. All connections
//! of an export share its tenant, hence its queue and QoS.
//!
//! Errors are per request where the spec allows: an out-of-range offset, an oversize request or an
//! unknown command gets EINVAL and the connection stays usable; a write to a read-only export gets EPERM.
//! A malformed handshake, a bad request magic, or an oversize WRITE too large to skip closes the connection
//! (the stream cannot be resynchronised); other connections are unaffected. A client that disappears
//! mid-request only loses its own replies.

use crate::dispatch::{Dispatcher, IoRequest, IoResult, Op};
use crate::storage::Storage;
use rein_core::TenantId;
use rein_proto::nbd::{self as p, Command, ExportInfo, RequestHeader, ServerHandshake, ServerProgress};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

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
pub async fn serve_connection(
    stream: TcpStream,
    ctx: Arc<NbdContext>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnError> {
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

    // Writer task: replies in completion order, coalesced into one write when several are ready. Every
    // message holds one of the connection's permits until it is written, which bounds both requests in
    // flight and replies waiting (MAX_IN_FLIGHT_PER_CONN).
    let (tx, mut rx) = mpsc::unbounded_channel::<(Vec<u8>, OwnedSemaphorePermit)>();
    let writer = tokio::spawn(async move {
        let mut batch: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut held: Vec<OwnedSemaphorePermit> = Vec::new();
        let mut broken = false;
        while let Some((msg, permit)) = rx.recv().await {
            if broken {
                continue; // client gone: keep draining so permits are released
            }
            held.push(permit);
            // One reply ready: write it as it is. More: copy them into one buffer, one write.
            let out = match rx.try_recv() {
                Err(_) => msg,
                Ok((m, p)) => {
                    batch.clear();
                    batch.extend_from_slice(&msg);
                    batch.extend_from_slice(&m);
                    held.push(p);
                    while batch.len() < WRITE_BATCH_BYTES {
                        let Ok((m, p)) = rx.try_recv() else { break };
                        batch.extend_from_slice(&m);
                        held.push(p);
                    }
                    std::mem::take(&mut batch)
                }
            };
            if wr.write_all(&out).await.is_err() {
                broken = true;
            }
            if out.capacity() >= batch.capacity() {
                batch = out; // keep the larger buffer for the next batch
            }
            held.clear();
        }
        if !broken {
            let _ = wr.shutdown().await;
        }
    });
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONN));
    let result = transmission(&mut rd, buf, &ctx, export_idx, structured, &tx, &permits, &mut shutdown).await;
    // Wait for in-flight requests to be answered and written, then let the writer finish.
    let _ = permits.acquire_many(MAX_IN_FLIGHT_PER_CONN as u32).await;
    drop(tx);
    let _ = writer.await;
    result
}

/// Replies coalesced into one socket write, at most (roughly) this many bytes.
const WRITE_BATCH_BYTES: usize = 256 * 1024;

/// Reads until `buf` holds at least `n` bytes; false if the peer closed first.
async fn read_exact_buffered(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut Vec<u8>,
    n: usize,
) -> std::io::Result<bool> {
    while buf.len() < n {
        // Read straight into the buffer's spare capacity: no allocation or copy per read.
        buf.reserve((n - buf.len()).max(16 * 1024));
        if rd.read_buf(buf).await? == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

type ReplyTx = mpsc::UnboundedSender<(Vec<u8>, OwnedSemaphorePermit)>;

#[allow(clippy::too_many_arguments)]
async fn transmission(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    mut buf: Vec<u8>,
    ctx: &Arc<NbdContext>,
    export_idx: usize,
    structured: bool,
    tx: &ReplyTx,
    permits: &Arc<Semaphore>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), ConnError> {
    let export = &ctx.exports[export_idx];
    let mut consumed = 0usize;
    loop {
        // Drop what earlier requests consumed only when it is worth moving the rest.
        if consumed > 0 && (consumed >= 64 * 1024 || consumed == buf.len()) {
            buf.drain(..consumed);
            consumed = 0;
        }
        if buf.len() - consumed < p::REQUEST_LEN {
            buf.drain(..consumed);
            consumed = 0;
            let more = tokio::select! {
                r = read_exact_buffered(rd, &mut buf, p::REQUEST_LEN) => r?,
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            };
            if !more {
                return Ok(()); // client closed (with or without NBD_CMD_DISC)
            }
        }
        let hdr = RequestHeader::decode(&buf[consumed..])?.expect("have a full header");
        consumed += p::REQUEST_LEN;
        // Every request, answered with data or an error, takes a permit until its reply is written.
        let permit = permits.clone().acquire_owned().await.expect("semaphore never closed");
        let reply_err =
            |code: u32| encode_reply(hdr.handle, hdr.offset, code, hdr.command == Command::Read, structured, &[]);
        // WRITE payload comes first, whatever we decide about the request.
        let mut payload = Vec::new();
        if hdr.command == Command::Write {
            if hdr.length > ctx.max_payload && hdr.length > p::MAX_DISCARD {
                return Err(p::ProtoError::Unrecoverable(hdr.length).into());
            }
            let need = consumed + hdr.length as usize;
            if !read_exact_buffered(rd, &mut buf, need).await? {
                return Ok(());
            }
            payload = buf[consumed..need].to_vec();
            consumed = need;
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
            let _ = tx.send((reply_err(p::EINVAL), permit));
            continue;
        };
        let writes = matches!(op, Op::Write { .. } | Op::Trim { .. } | Op::WriteZeroes { .. });
        if writes && export.info.read_only {
            let _ = tx.send((reply_err(p::EPERM), permit));
            continue;
        }
        let req = IoRequest {
            storage: export.storage.clone(),
            tenant: export.tenant,
            offset: hdr.offset,
            op,
            fua: hdr.fua(),
        };
        let tx2 = tx.clone();
        // The reply is encoded where the result appears (on the dispatcher) and goes straight to the
        // writer: no task or channel per request.
        let done = Box::new(move |res: IoResult| {
            let msg = match res {
                Ok(data) => encode_reply(hdr.handle, hdr.offset, 0, hdr.command == Command::Read, structured, &data),
                Err(e) => {
                    tracing::debug!(handle = hdr.handle, command = %hdr.command, error = %e, "request failed");
                    encode_reply(hdr.handle, hdr.offset, e.errno(), hdr.command == Command::Read, structured, &[])
                }
            };
            let _ = tx2.send((msg, permit));
        });
        ctx.dispatcher.submit(req, done).await;
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
        p::structured_chunk(
            &mut out,
            handle,
            p::REPLY_FLAG_DONE,
            p::REPLY_TYPE_OFFSET_DATA,
            &[&offset.to_be_bytes(), data],
        );
    } else {
        p::structured_chunk(&mut out, handle, p::REPLY_FLAG_DONE, p::REPLY_TYPE_NONE, &[]);
    }
    out
}
