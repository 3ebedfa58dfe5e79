//! Writing a batch of NBD messages to a connection, for the server's reply writer ([`crate::nbd`]) and
//! the gateway's node links ([`crate::remote`]).
//!
//! A plain socket takes the batch in vectored writes (one `writev` for up to [`MAX_SLICES`] messages),
//! resuming after a short write. A writer that takes one buffer at a time (TLS: each write is a record
//! and a `write` of its own) gets the messages coalesced into buffers of up to [`COALESCE_BYTES`], so a
//! batch of small replies goes out in a few records and writes instead of one per message; a message as
//! large as that is written on its own, uncopied, so the copy never holds more than [`COALESCE_BYTES`].

use std::io::{self, IoSlice};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Most messages in one vectored write.
pub(crate) const MAX_SLICES: usize = 128;

/// Largest buffer small messages are coalesced into for a writer without vectored writes.
pub(crate) const COALESCE_BYTES: usize = 64 << 10;

/// Writes every byte of `parts`, in order (see the module comment).
pub(crate) async fn write_all<W: AsyncWrite + Unpin>(wr: &mut W, parts: &[&[u8]]) -> io::Result<()> {
    if let [one] = parts {
        // One message (a connection at iodepth 1): one plain write, no slice table.
        return wr.write_all(one).await;
    }
    if !wr.is_write_vectored() {
        return write_coalesced(wr, parts).await;
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

async fn write_coalesced<W: AsyncWrite + Unpin>(wr: &mut W, parts: &[&[u8]]) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut buf: Vec<u8> = Vec::with_capacity(total.min(COALESCE_BYTES));
    for part in parts {
        if buf.len() + part.len() > COALESCE_BYTES && !buf.is_empty() {
            wr.write_all(&buf).await?;
            buf.clear();
        }
        if part.len() >= COALESCE_BYTES {
            wr.write_all(part).await?;
        } else {
            buf.extend_from_slice(part);
        }
    }
    if !buf.is_empty() {
        wr.write_all(&buf).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A writer that takes at most `max` bytes a call, vectored or not, and records each call's size.
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
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
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

    /// Without vectored writes, small messages go out together, at most COALESCE_BYTES a write, and a
    /// large one on its own.
    #[test]
    fn a_writer_without_vectored_writes_gets_few_large_writes() {
        let small = vec![1u8; 4112];
        let big = vec![2u8; COALESCE_BYTES + 1];
        let mut parts: Vec<&[u8]> = vec![&small; 40];
        parts.insert(20, &big);
        let w = run(&parts, usize::MAX, false);
        assert_eq!(w.out, parts.concat());
        // 20 small (82,240 bytes: 15 fit in 64 KiB, then 5), the big one, 20 small again.
        let c = 15 * 4112;
        assert_eq!(w.calls, [c, 5 * 4112, COALESCE_BYTES + 1, c, 5 * 4112]);
    }
}
