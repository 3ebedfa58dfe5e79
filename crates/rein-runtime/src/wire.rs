//! Writing a batch of NBD messages to a connection, for the server's reply writer ([`crate::nbd`]) and
//! the gateway's node links ([`crate::remote`]).
//!
//! The batch goes out in vectored writes (one `writev` for up to [`MAX_SLICES`] messages), resuming after
//! a short write; a single message in one plain write. A TLS stream takes one buffer per write (each a
//! record and a `write` of its own), so its owner wraps it in a `tokio::io::BufWriter`, which is vectored:
//! it gathers a batch's small messages into full records, passes large ones through, and is flushed after
//! each batch (the server's connections and the gateway's node links alike).

use std::io::{self, IoSlice};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Capacity of the `BufWriter` a TLS stream is wrapped in (module comment): about a write batch's bytes.
pub(crate) const TLS_BUFFER_BYTES: usize = 256 * 1024;

/// Most messages in one vectored write.
pub(crate) const MAX_SLICES: usize = 128;

/// Writes every byte of `parts`, in order (see the module comment).
pub(crate) async fn write_all<W: AsyncWrite + Unpin>(wr: &mut W, parts: &[&[u8]]) -> io::Result<()> {
    if let [one] = parts {
        // One message (a connection at iodepth 1): one plain write, no slice table.
        return wr.write_all(one).await;
    }
    // The first byte not yet written: `parts[i][at]`.
    let (mut i, mut at) = (0, 0);
    loop {
        while i < parts.len() && parts[i].len() == at {
            (i, at) = (i + 1, 0);
        }
        if i == parts.len() {
            return Ok(());
        }
        let mut slices = [IoSlice::new(&[]); MAX_SLICES];
        let n = (parts.len() - i).min(MAX_SLICES);
        for (k, s) in slices[..n].iter_mut().enumerate() {
            *s = IoSlice::new(if k == 0 { &parts[i][at..] } else { parts[i + k] });
        }
        let mut written = wr.write_vectored(&slices[..n]).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let left = parts[i].len() - at;
            if written < left {
                at += written;
                break;
            }
            written -= left;
            (i, at) = (i + 1, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A writer that takes at most `max` bytes a call and records each call's size; not `vectored`, it
    /// writes the first non-empty slice of a vectored call only (as TLS does).
    struct Trickle {
        out: Vec<u8>,
        calls: Vec<usize>,
        max: usize,
        vectored: bool,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.max);
            self.out.extend_from_slice(&buf[..n]);
            self.calls.push(n);
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            if !self.vectored {
                let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &b[..]);
                return self.poll_write(cx, first);
            }
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.max - n);
                self.out.extend_from_slice(&b[..take]);
                n += take;
                if n == self.max {
                    break;
                }
            }
            self.calls.push(n);
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            self.vectored
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn run(parts: &[&[u8]], max: usize, vectored: bool) -> Trickle {
        let mut w = Trickle { out: Vec::new(), calls: Vec::new(), max, vectored };
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(write_all(&mut w, parts)).unwrap();
        w
    }

    /// Every byte arrives in order through short writes, empty parts and more parts than one write
    /// takes, vectored or not.
    #[test]
    fn every_byte_in_order() {
        let msgs: Vec<Vec<u8>> = (0..300).map(|k| (0..(k * 37) % 200).map(|b| (b ^ k) as u8).collect()).collect();
        let parts: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
        let want = parts.concat();
        for max in [1, 7, 100, 4096, usize::MAX] {
            for vectored in [true, false] {
                assert_eq!(run(&parts, max, vectored).out, want, "max {max}, vectored {vectored}");
            }
        }
        assert!(run(&[&[], &[]], 5, true).calls.is_empty(), "nothing to write: no write");
    }

    /// The TLS paths' contract (module comment): a writer without vectored writes, wrapped in a
    /// `BufWriter` as their owners wrap TLS and flushed after the batch, gets the small messages
    /// together, at most the buffer a write, and a large one on its own.
    #[test]
    fn a_buffered_writer_without_vectored_writes_gets_few_large_writes() {
        const BUF: usize = 64 << 10;
        let small = vec![1u8; 4112];
        let big = vec![2u8; BUF + 1];
        let mut parts: Vec<&[u8]> = vec![&small; 40];
        parts.insert(20, &big);
        let inner = Trickle { out: Vec::new(), calls: Vec::new(), max: usize::MAX, vectored: false };
        let mut wr = tokio::io::BufWriter::with_capacity(BUF, inner);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            write_all(&mut wr, &parts).await.unwrap();
            wr.flush().await.unwrap();
        });
        let w = wr.into_inner();
        assert_eq!(w.out, parts.concat());
        // 20 small (82,240 bytes: 15 fit in 64 KiB, then 5), the big one, 20 small again.
        let c = 15 * 4112;
        assert_eq!(w.calls, [c, 5 * 4112, BUF + 1, c, 5 * 4112]);
    }
}
