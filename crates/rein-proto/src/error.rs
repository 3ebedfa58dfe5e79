//! Why a request failed, in words every protocol can answer in.
//!
//! Storage, the dispatcher and protocol validation all report failures as an [`ErrorKind`]; each wire
//! format maps kinds to its own numbers in one place ([`crate::nbd::errno`] for NBD, next to the NBD
//! error constants). Nothing else in Rein knows an NBD errno value, so a backend never has to pick a
//! number for a protocol it does not speak.

use std::fmt;

/// The kind of a failed request (protocol-neutral; see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is invalid as asked: a range outside the export (other than a write), a size above the
    /// limit, an unknown command or flag, an unknown tenant.
    InvalidRequest,
    /// A write, trim or zeroing of a read-only export.
    ReadOnly,
    /// No space: a write beyond the end of the export, or a backend that is full (including a quota or a
    /// file-size limit).
    NoSpace,
    /// The server lacks a resource to take the request now (a full scheduler queue, memory).
    Exhausted,
    /// The backend failed the IO.
    Io,
    /// The server is shutting down.
    Shutdown,
}

impl ErrorKind {
    /// Every kind, for tests and exhaustive tables.
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::InvalidRequest,
        ErrorKind::ReadOnly,
        ErrorKind::NoSpace,
        ErrorKind::Exhausted,
        ErrorKind::Io,
        ErrorKind::Shutdown,
    ];

    /// A short description (the message of protocol replies that can carry one).
    pub fn description(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid request",
            ErrorKind::ReadOnly => "export is read-only",
            ErrorKind::NoSpace => "no space left",
            ErrorKind::Exhausted => "server is out of resources",
            ErrorKind::Io => "input/output error",
            ErrorKind::Shutdown => "server is shutting down",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}
