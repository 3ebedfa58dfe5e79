//! Standard error for the commands' own lines (`errln!`), in place of `eprintln!`, which panics when a
//! write to stderr fails: a pipe whose reader has gone (`rein sim x --json --check 2>&1 >/dev/null | true`),
//! a full disk under `2> file`. A line that cannot be written is dropped: there is nowhere else to say
//! it, and the command's exit status still tells how it went. Log lines (and `main`'s `error: ...`) go
//! through crates/rein/src/logging.rs, which drops them the same way; clap ignores a failure to print
//! its own errors.

use std::io::Write;

/// Writes to stderr, ignoring a failure (see the module comment).
pub(crate) fn write(args: std::fmt::Arguments) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `eprintln!` without a panic on a failing stderr (the module comment).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::stderr::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}
