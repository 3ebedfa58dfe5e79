//! An async NBD client (for `rein load` and tests): one connection, many requests in flight.
//!
//! A reader task decodes replies and completes the matching request by handle; callers await their own
//! request. Bounds: at most [`MAX_IN_FLIGHT`] requests per connection (callers beyond it wait).

use rein_proto::nbd::{self as p, ClientHandshake, ClientProgress, Command, ReplyHeader, RequestHeader};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Semaphore};

/// Requests one connection has in flight at most; a caller beyond it waits for one to be answered.
pub const MAX_IN_FLIGHT: usize = 1024;

/// Why a connection or a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket failed: connecting, reading or writing.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The server broke the protocol, in the handshake (or refused the export there) or in a reply.
    #[error("protocol: {0}")]
    Proto(#[from] p::ProtoError),
    /// The connection ended before the answer arrived.
    #[error("server closed the connection")]
    Closed,
    /// The server answered the request with this NBD error number (`NBD_EINVAL`, `NBD_EPERM`,
    /// `NBD_ENOSPC`, ...).
    #[error("server answered error {0}")]
    Errno(u32),
}

type Pending = Arc<Mutex<HashMap<u64, (oneshot::Sender<Result<Vec<u8>, ClientError>>, u32)>>>;

/// A connected, negotiated NBD client.
pub struct NbdClient {
    writer: tokio::sync::Mutex<tokio::net::tcp::OwnedWriteHalf>,
    pending: Pending,
    next: std::sync::atomic::AtomicU64,
    slots: Semaphore,
    /// The export's size in bytes, as the handshake announced it.
    pub size: u64,
    /// The export's transmission flags from the handshake (`NBD_FLAG_*`: read-only, flush, FUA, trim,
    /// ...).
    pub flags: u16,
}

impl NbdClient {
    /// Connects to `addr` and negotiates `export` (fixed newstyle, asking for structured replies), then
    /// starts the task that reads replies. Errors: [`ClientError::Io`] from the socket,
    /// [`ClientError::Proto`] from the handshake (an unknown export among them), [`ClientError::Closed`]
    /// if the server hangs up during it.
    pub async fn connect(addr: SocketAddr, export: &str) -> Result<Arc<NbdClient>, ClientError> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        let (mut rd, mut wr) = s.into_split();
        let mut hs = ClientHandshake::new(export, true);
        let mut buf = Vec::new();
        let (size, flags, structured) = loop {
            let mut out = Vec::new();
            let (used, prog) = hs.feed(&buf, &mut out)?;
            buf.drain(..used);
            wr.write_all(&out).await?;
            match prog {
                ClientProgress::Ready { size, flags, structured } => break (size, flags, structured),
                // Only a handshake made with `ClientHandshake::with_node` reports these; this one is plain.
                ClientProgress::NodeReady { .. } | ClientProgress::NodeRefused(..) => {
                    return Err(p::ProtoError::Malformed("a storage-node answer to a plain handshake").into())
                }
                ClientProgress::NeedMore => {
                    let mut chunk = [0u8; 4096];
                    let n = rd.read(&mut chunk).await?;
                    if n == 0 {
                        return Err(ClientError::Closed);
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        };
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let pend = pending.clone();
        tokio::spawn(async move {
            let err = reader(&mut rd, buf, &pend, structured).await;
            // Fail everything still waiting.
            let mut g = pend.lock().unwrap_or_else(|e| e.into_inner());
            for (_, (tx, _)) in g.drain() {
                let _ = tx.send(Err(match &err {
                    Err(ClientError::Errno(e)) => ClientError::Errno(*e),
                    _ => ClientError::Closed,
                }));
            }
        });
        Ok(Arc::new(NbdClient {
            writer: tokio::sync::Mutex::new(wr),
            pending,
            next: std::sync::atomic::AtomicU64::new(1),
            slots: Semaphore::new(MAX_IN_FLIGHT),
            size,
            flags,
        }))
    }

    /// Sends one request and waits for its reply (read data for READ).
    pub async fn request(
        &self,
        command: Command,
        offset: u64,
        length: u32,
        payload: &[u8],
        fua: bool,
    ) -> Result<Vec<u8>, ClientError> {
        let _slot = self.slots.acquire().await.map_err(|_| ClientError::Closed)?;
        let handle = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let read_len = if command == Command::Read { length } else { 0 };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(handle, (tx, read_len));
        let mut msg = Vec::with_capacity(p::REQUEST_LEN + payload.len());
        RequestHeader { flags: if fua { p::CMD_FLAG_FUA } else { 0 }, command, handle, offset, length }
            .encode(&mut msg);
        msg.extend_from_slice(payload);
        {
            let mut w = self.writer.lock().await;
            w.write_all(&msg).await?;
        }
        rx.await.map_err(|_| ClientError::Closed)?
    }

    /// Sends `NBD_CMD_DISC` and closes the sending side; errors are ignored (the server may be gone).
    /// Requests still in flight get their replies if the server sends them before closing, else
    /// [`ClientError::Closed`].
    pub async fn disconnect(&self) {
        let mut msg = Vec::new();
        RequestHeader { flags: 0, command: Command::Disc, handle: 0, offset: 0, length: 0 }.encode(&mut msg);
        let mut w = self.writer.lock().await;
        let _ = w.write_all(&msg).await;
        let _ = w.shutdown().await;
    }
}

async fn fill(rd: &mut tokio::net::tcp::OwnedReadHalf, buf: &mut Vec<u8>, n: usize) -> Result<(), ClientError> {
    while buf.len() < n {
        let mut chunk = vec![0u8; (n - buf.len()).clamp(4096, 1 << 20)];
        let k = rd.read(&mut chunk).await?;
        if k == 0 {
            return Err(ClientError::Closed);
        }
        buf.extend_from_slice(&chunk[..k]);
    }
    Ok(())
}

async fn reader(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    mut buf: Vec<u8>,
    pending: &Pending,
    structured: bool,
) -> Result<(), ClientError> {
    loop {
        fill(rd, &mut buf, if structured { 20 } else { 16 }).await?;
        let Some((hdr, n)) = ReplyHeader::decode(&buf)? else { continue };
        buf.drain(..n);
        let (handle, result) = match hdr {
            ReplyHeader::Simple { error, handle } => {
                let len = pending.lock().unwrap_or_else(|e| e.into_inner()).get(&handle).map_or(0, |x| x.1) as usize;
                if error != 0 {
                    (handle, Err(ClientError::Errno(error)))
                } else {
                    fill(rd, &mut buf, len).await?;
                    (handle, Ok(buf.drain(..len).collect()))
                }
            }
            ReplyHeader::Chunk { flags, kind, handle, length } => {
                fill(rd, &mut buf, length as usize).await?;
                let payload: Vec<u8> = buf.drain(..length as usize).collect();
                if flags & p::REPLY_FLAG_DONE == 0 {
                    continue; // multi-chunk replies are not produced by rein serve; ignore partials
                }
                match kind {
                    p::REPLY_TYPE_OFFSET_DATA if payload.len() >= 8 => (handle, Ok(payload[8..].to_vec())),
                    p::REPLY_TYPE_ERROR if payload.len() >= 4 => {
                        (handle, Err(ClientError::Errno(u32::from_be_bytes(payload[..4].try_into().expect("4")))))
                    }
                    _ => (handle, Ok(Vec::new())),
                }
            }
        };
        if let Some((tx, _)) = pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&handle) {
            let _ = tx.send(result);
        }
    }
}
