//! Log lines to stderr that never stop a daemon: a bounded queue and a thread of their own.
//!
//! # Model
//! Each event (`tracing`'s fmt layer formats one into a [`LineWriter`]) becomes one message on a bounded
//! queue of [`QUEUE_LINES`]; one thread writes the messages to stderr in order. The daemon's threads only
//! ever `try_send`: a line that finds the queue full is dropped and counted, and the writer says how many
//! were dropped (`rein: N log lines dropped: stderr was not read`) when it can write again.
//!
//! # Invariants
//! 1. Logging never blocks a caller: stderr that is a pipe nobody reads (`rein serve 2>&1 | sleep 1000`)
//!    blocks the writer thread only; the server keeps serving and stops on SIGTERM. (With the write on
//!    the caller's thread a worker blocked in the pipe held stderr's lock, the others waited for it, new
//!    connections hung and SIGTERM was never acted on.)
//! 2. Logging never panics a caller: a failed write (EPIPE once the reader is gone, ENOSPC for a log on
//!    a full disk) is dropped by the writer thread. (`eprintln!`, which tracing-subscriber uses to report
//!    its own write errors, panics when stderr fails: each new connection's task died at its first log
//!    line, and the SIGTERM's "shutting down" line killed the server with status 101 before its drain.)
//! 3. Bounded memory: at most [`QUEUE_LINES`] lines wait, each cut at [`MAX_LINE_BYTES`].
//! 4. [`LogGuard::finish`] waits at most its deadline for the queue to be written (at exit), so an exit
//!    never hangs on a stuck stderr.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Lines that wait for stderr at most.
pub(crate) const QUEUE_LINES: usize = 16_384;
/// A longer line is cut here (a log line is short; a runaway field must not hold megabytes).
pub(crate) const MAX_LINE_BYTES: usize = 64 << 10;

enum Msg {
    Line(Vec<u8>),
    /// Answer once every line before it is written.
    Flush(SyncSender<()>),
}

/// The fmt layer's writer factory: cheap to clone, one [`LineWriter`] per event.
#[derive(Clone)]
pub(crate) struct LogSink {
    tx: SyncSender<Msg>,
    dropped: Arc<AtomicU64>,
}

/// Kept by `main` to flush the queue at exit.
pub(crate) struct LogGuard {
    sink: LogSink,
}

/// Starts the writer thread over `out` (stderr in the binary).
pub(crate) fn start(out: impl Write + Send + 'static) -> (LogSink, LogGuard) {
    let (tx, rx) = sync_channel(QUEUE_LINES);
    let dropped = Arc::new(AtomicU64::new(0));
    let sink = LogSink { tx, dropped: dropped.clone() };
    std::thread::Builder::new()
        .name("rein-log".into())
        .spawn(move || write_lines(rx, out, dropped))
        .expect("starting the log thread");
    (sink.clone(), LogGuard { sink })
}

fn write_lines(rx: Receiver<Msg>, mut out: impl Write, dropped: Arc<AtomicU64>) {
    let mut said = 0u64;
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Line(line) => {
                // Errors are dropped (invariant 2): there is nowhere else to say them.
                let _ = out.write_all(&line);
                let now = dropped.load(Ordering::Relaxed);
                if now > said {
                    let _ = writeln!(out, "rein: {} log lines dropped: stderr was not read", now - said);
                    said = now;
                }
            }
            Msg::Flush(ack) => {
                let _ = out.flush();
                let _ = ack.try_send(());
            }
        }
    }
}

impl LogSink {
    fn send(&self, msg: Msg) {
        match self.tx.try_send(msg) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Queues one line as it is (for `main`'s own last words, which go after the log lines).
    pub(crate) fn line(&self, text: &str) {
        self.send(Msg::Line(text.as_bytes().to_vec()));
    }

    /// Lines dropped so far.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl LogGuard {
    /// The sink, for lines `main` writes itself.
    pub(crate) fn sink(&self) -> &LogSink {
        &self.sink
    }

    /// Waits until every line queued so far is written, at most `within` (invariant 4); false if the
    /// time ran out.
    pub(crate) fn finish(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let (ack_tx, ack_rx) = sync_channel(1);
        let mut msg = Msg::Flush(ack_tx);
        loop {
            match self.sink.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return false,
            }
        }
        ack_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_ok()
    }
}

/// One event's bytes, sent as one line when the fmt layer drops it.
pub(crate) struct LineWriter {
    sink: LogSink,
    buf: Vec<u8>,
}

impl Write for LineWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let room = MAX_LINE_BYTES.saturating_sub(self.buf.len());
        self.buf.extend_from_slice(&b[..b.len().min(room)]);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            if self.buf.len() == MAX_LINE_BYTES && self.buf.last() != Some(&b'\n') {
                self.buf.push(b'\n');
            }
            self.sink.send(Msg::Line(std::mem::take(&mut self.buf)));
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogSink {
    type Writer = LineWriter;
    fn make_writer(&'a self) -> LineWriter {
        LineWriter { sink: self.clone(), buf: Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A writer that blocks until released, then records.
    struct Gate {
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
        seen: Arc<Mutex<Vec<u8>>>,
    }
    impl Write for Gate {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let (m, cv) = &*self.open;
            let mut g = m.lock().unwrap();
            while !*g {
                g = cv.wait(g).unwrap();
            }
            self.seen.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Invariants 1, 3 and 4: with stderr stuck, lines beyond the queue are dropped and counted at once
    /// (the caller never waits), `finish` gives up at its deadline, and once stderr moves again the
    /// queued lines come out in order, followed by the count of those dropped.
    #[test]
    fn a_stuck_stderr_drops_lines_instead_of_blocking() {
        let open = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (sink, guard) = start(Gate { open: open.clone(), seen: seen.clone() });
        let t0 = Instant::now();
        for i in 0..QUEUE_LINES + 100 {
            sink.line(&format!("line {i}\n"));
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "the caller waited {:?}", t0.elapsed());
        // The writer holds one line in its stuck write; the queue holds QUEUE_LINES more.
        assert!((99..=100).contains(&sink.dropped()), "dropped {}", sink.dropped());
        let t1 = Instant::now();
        assert!(!guard.finish(Duration::from_millis(200)), "a flush through a stuck stderr");
        assert!(t1.elapsed() < Duration::from_secs(2));
        *open.0.lock().unwrap() = true;
        open.1.notify_all();
        assert!(guard.finish(Duration::from_secs(10)));
        let text = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
        assert!(text.starts_with("line 0\n") && text.contains("line 1\nline 2\n"), "{text:.200}");
        assert!(
            text.contains(&format!("rein: {} log lines dropped: stderr was not read", sink.dropped())),
            "{text:.200}"
        );
    }

    /// Invariant 2: a stderr whose writes fail (a closed pipe, a full disk) costs the caller nothing.
    #[test]
    fn a_failing_stderr_is_ignored() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::from_raw_os_error(32)) // EPIPE
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Err(std::io::Error::from_raw_os_error(28)) // ENOSPC
            }
        }
        let (sink, guard) = start(Broken);
        let mut w = tracing_subscriber::fmt::MakeWriter::make_writer(&sink);
        w.write_all(&vec![b'x'; 2 * MAX_LINE_BYTES]).unwrap();
        drop(w);
        sink.line("after\n");
        assert!(guard.finish(Duration::from_secs(5)));
    }
}
