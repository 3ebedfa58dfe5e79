//! Standard output for the commands' results (`outln!`, `out!`), in place of `println!`, which
//! panics when stdout is a pipe its reader has closed (`rein sim --json | head -c 100`: EPIPE, since Rust
//! programs ignore SIGPIPE).
//!
//! A reader that stops reading is not an error: once a write fails with EPIPE, the rest of the command's
//! output is dropped, the command still does the rest of its work (writes `--out`, checks), and its exit
//! status is its own (0 when it succeeded). A command whose output is its only product (`rein bench`,
//! `rein probe`, `rein pshift sweep`) asks [`closed`] between its measurements (the probe every 100 ms)
//! and stops once the reader has gone, seen without a write.
//! Any other failure to write stdout (a full disk under `> file`) also drops the rest, and fails the
//! command at its end ([`finish`]). SIGPIPE stays ignored, so the daemons' sockets never kill them.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A write to stdout failed: write nothing more.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// The first failure other than EPIPE.
static FAILED: Mutex<Option<std::io::Error>> = Mutex::new(None);

/// Writes to stdout (see the module comment).
pub(crate) fn write(args: std::fmt::Arguments) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        failed(e);
    }
}

/// Whether the output has nowhere to go any more: a write to stdout failed, or stdout is a pipe (or a
/// socket) whose reader has gone, which a poll of it shows without writing (POLLERR, POLLHUP). A file
/// or a terminal never shows either.
pub(crate) fn closed() -> bool {
    if CLOSED.load(Ordering::Relaxed) {
        return true;
    }
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let stdout = std::io::stdout();
    let mut fds = [PollFd::new(&stdout, PollFlags::OUT)];
    let gone = poll(&mut fds, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })).is_ok()
        && fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP);
    if gone {
        CLOSED.store(true, Ordering::Relaxed);
    }
    gone
}

fn failed(e: std::io::Error) {
    CLOSED.store(true, Ordering::Relaxed);
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        FAILED.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
    }
}

/// Flushes stdout at the command's end; an error if a write failed other than by EPIPE.
pub(crate) fn finish() -> anyhow::Result<()> {
    if !CLOSED.load(Ordering::Relaxed) {
        if let Err(e) = std::io::stdout().lock().flush() {
            failed(e);
        }
    }
    match FAILED.lock().unwrap_or_else(|p| p.into_inner()).take() {
        Some(e) => Err(anyhow::Error::from(e).context("writing standard output")),
        None => Ok(()),
    }
}

/// `println!` to stdout without a panic on a closed pipe (the module comment).
macro_rules! outln {
    () => {
        $crate::stdout::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` to stdout without a panic on a closed pipe (the module comment).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*))
    };
}
