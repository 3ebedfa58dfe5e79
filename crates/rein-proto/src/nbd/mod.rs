//! The NBD protocol (NetworkBlockDevice/nbd doc/proto.md) as encode/decode without IO.
//!
//! # Subset
//! - Handshake ([`handshake`]): fixed newstyle only (the oldstyle and plain newstyle handshakes are
//!   obsolete and refused). Server flags FIXED_NEWSTYLE | NO_ZEROES. Options: EXPORT_NAME, ABORT, LIST,
//!   INFO, GO, STRUCTURED_REPLY (acknowledged; reads are then answered with structured OFFSET_DATA
//!   chunks), STARTTLS (when the server's [`TlsMode`] offers it; the caller runs TLS), LIST_META_CONTEXT
//!   and SET_META_CONTEXT (the one context `base:allocation`, on the exports the caller says can answer it:
//!   [`meta`]); anything else (extended headers) gets NBD_REP_ERR_UNSUP, which the spec lets clients
//!   handle by carrying on without it. REIN_NODE ([`node`]), Rein's storage-node protocol, when the server enables it. Per connection, the caller tells the handshake which exports the client may see
//!   ([`ServerHandshake::set_visible`]), the default export for the empty name, and whether the whole
//!   connection is refused ([`ServerHandshake::refuse_all`]).
//! - Transmission ([`transmission`]): READ, WRITE, DISC, FLUSH, TRIM, WRITE_ZEROES, BLOCK_STATUS (with a
//!   context selected) with the FUA, NO_HOLE, DF and REQ_ONE flags; simple replies, and structured replies
//!   (OFFSET_DATA, NONE, ERROR, BLOCK_STATUS) when negotiated. The
//!   server side is a state machine ([`ServerTransmission`]) that turns bytes into requests, rejections
//!   and disconnects, and encodes every reply ([`ReplyEncoder`]). The client side ([`client`]) tracks the
//!   requests sent and assembles their replies, structured ones from OFFSET_DATA, OFFSET_HOLE, ERROR,
//!   ERROR_OFFSET and NONE chunks ([`ClientTransmission`]).
//!
//! # Errors
//! Failures travel through Rein as a protocol-neutral [`ErrorKind`]; [`errno`] is the one place a kind
//! becomes an NBD error number, next to the constants ([`EPERM`], [`EIO`], ...) it uses.
//!
//! # Bounds
//! - Option data at most [`MAX_OPTION_LEN`] (4 KiB + headroom for INFO/GO): larger is a protocol error and
//!   the server hangs up (the spec allows a server to drop a client that sends absurd lengths).
//! - Export names at most [`MAX_NAME_LEN`] bytes (the spec's limit).
//! - A READ or WRITE at most the configured maximum payload (default [`DEFAULT_MAX_PAYLOAD`]); larger is
//!   rejected with EINVAL. A rejected WRITE's payload is read and discarded (without buffering it) if it
//!   is at most [`MAX_DISCARD`] (or the maximum payload, if larger); a longer one closes the connection,
//!   since the stream cannot be resynchronised cheaply.
//! - Error messages in structured replies at most [`MAX_ERROR_MESSAGE`] bytes.

use crate::ErrorKind;
use std::fmt;

pub mod client;
pub mod handshake;
pub mod meta;
pub mod node;
pub mod transmission;

pub use client::{
    status_descriptors, ClientEvent, ClientReply, ClientTransmission, MAX_READ_PIECES, MAX_STATUS_CHUNK_DESCRIPTORS,
};
pub use handshake::{
    decode_option_reply, option_reply, option_request, BlockSize, BlockSizeError, ClientHandshake, ClientProgress,
    Negotiated, OptionReply, Probed, ServerHandshake, ServerProgress, TlsMode, PROBE_EXPORTS_ANY_SERVER,
};
pub use meta::{Extents, BASE_ALLOCATION, BASE_ALLOCATION_ID, MAX_EXTENTS, STATE_HOLE, STATE_ZERO};
pub use node::{
    decode_node_extents, decode_node_reply, encode_node_extents, encode_node_request, node_extents_len, NodeError,
    NodeGranted, NodeHello, NodeReplyTrailer, NodeSplit, NodeTag, NodeTenant, NodeWelcome, SimpleReply, SpecSource,
    TagFault, MAX_NODE_HELLOS, MAX_NODE_NAME_LEN, MAX_NODE_TENANTS, NODE_EXTENTS_MAX_LEN, NODE_REPLY_TRAILER_LEN,
    NODE_TAG_LEN, NODE_VERSION, NODE_VERSION_BLOCK_STATUS, OPT_REIN_NODE, REP_REIN_NODE,
};
pub use transmission::{
    Event, Reason, Rejection, ReplyEncoder, Request, RequestKind, ServerTransmission, TransmissionConfig,
};

/// First magic of the server's greeting ("NBDMAGIC").
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// Second magic of the greeting, and the magic of every option request ("IHAVEOPT").
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Magic of an option reply.
pub const REPLY_MAGIC_OPT: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag (server): fixed newstyle negotiation.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag (server): the 124 zero bytes after NBD_OPT_EXPORT_NAME may be omitted.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client does fixed newstyle negotiation.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: omit the 124 zero bytes after NBD_OPT_EXPORT_NAME.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Option: enter transmission on the named export (no reply on failure: the server closes).
pub const OPT_EXPORT_NAME: u32 = 1;
/// Option: end the handshake without entering transmission.
pub const OPT_ABORT: u32 = 2;
/// Option: list the exports.
pub const OPT_LIST: u32 = 3;
/// Option: start TLS (offered when the server's [`TlsMode`] is not `Off`).
pub const OPT_STARTTLS: u32 = 5;
/// Option: describe an export.
pub const OPT_INFO: u32 = 6;
/// Option: describe an export and enter transmission on it.
pub const OPT_GO: u32 = 7;
/// Option: use structured replies in transmission.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// Option: list the metadata contexts an export offers ([`meta`]).
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// Option: select the metadata contexts BLOCK_STATUS answers ([`meta`]).
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply: done.
pub const REP_ACK: u32 = 1;
/// Option reply: one export of a LIST.
pub const REP_SERVER: u32 = 2;
/// Option reply: one piece of information of an INFO or GO.
pub const REP_INFO: u32 = 3;
/// Option reply: one metadata context of a LIST_META_CONTEXT or SET_META_CONTEXT (its id, its name).
pub const REP_META_CONTEXT: u32 = 4;
/// Option error: option not supported.
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
/// Option error: refused by policy.
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
/// Option error: malformed option.
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
/// Option error: TLS is required before this option.
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
/// Option error: no such export.
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
/// Option error: the server is shutting down (the client must disconnect).
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
/// Option error: request too big.
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

/// Information type: export size and transmission flags.
pub const INFO_EXPORT: u16 = 0;
/// Information type: the export's name.
pub const INFO_NAME: u16 = 1;
/// Information type: the export's description.
pub const INFO_DESCRIPTION: u16 = 2;
/// Information type: block size constraints.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flag: the flags field is valid (always set).
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export is read-only.
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: the server supports FLUSH.
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: the server supports the FUA request flag.
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: the server supports TRIM.
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: the server supports WRITE_ZEROES.
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: the server honours the DF (do not fragment) flag on READ. The NBD spec: a server
/// that supports DF must set it, and must leave it clear unless structured replies were negotiated.
pub const TFLAG_SEND_DF: u16 = 1 << 7;
/// Transmission flag: several connections to the export see each other's writes and flushes.
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// Command: read.
pub const CMD_READ: u16 = 0;
/// Command: write (the payload follows the header).
pub const CMD_WRITE: u16 = 1;
/// Command: disconnect (no reply).
pub const CMD_DISC: u16 = 2;
/// Command: make completed writes durable.
pub const CMD_FLUSH: u16 = 3;
/// Command: discard a range (reads as zeroes afterwards here).
pub const CMD_TRIM: u16 = 4;
/// Command: write zeroes to a range.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// Command: the status of a range in the metadata contexts selected ([`meta`]).
pub const CMD_BLOCK_STATUS: u16 = 7;
/// Request flag: force unit access (durable before the reply).
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Request flag (WRITE_ZEROES): do not punch a hole.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Request flag (READ, structured replies): do not fragment the reply.
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// Request flag (BLOCK_STATUS): one descriptor only.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Request flag (WRITE_ZEROES): fail unless the zeroing is fast. Not advertised, so not accepted.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flag: the last chunk of the reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Structured reply chunk: nothing (success).
pub const REPLY_TYPE_NONE: u16 = 0;
/// Structured reply chunk: read data at an offset.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Structured reply chunk: an error with a message.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
/// Structured reply chunk: a hole (zeroes) at an offset of a read.
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Structured reply chunk: the status of a range in one metadata context (its id, then descriptors of a
/// length and flags each).
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Structured reply chunk: an error at an offset, with a message.
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

/// NBD error: operation not permitted.
pub const EPERM: u32 = 1;
/// NBD error: input/output error.
pub const EIO: u32 = 5;
/// NBD error: cannot allocate memory.
pub const ENOMEM: u32 = 12;
/// NBD error: invalid argument.
pub const EINVAL: u32 = 22;
/// NBD error: no space left on device.
pub const ENOSPC: u32 = 28;
/// NBD error: value too large.
pub const EOVERFLOW: u32 = 75;
/// NBD error: operation not supported.
pub const ENOTSUP: u32 = 95;
/// NBD error: server is shutting down.
pub const ESHUTDOWN: u32 = 108;

/// The name of an NBD error number (`EIO`, ...; `unknown` for one the spec does not define).
pub const fn errno_name(n: u32) -> &'static str {
    match n {
        EPERM => "EPERM",
        EIO => "EIO",
        ENOMEM => "ENOMEM",
        EINVAL => "EINVAL",
        ENOSPC => "ENOSPC",
        EOVERFLOW => "EOVERFLOW",
        ENOTSUP => "ENOTSUP",
        ESHUTDOWN => "ESHUTDOWN",
        _ => "unknown",
    }
}

/// The NBD error number a reply carries for a failure of `kind`: the only mapping in Rein.
///
/// The spec's guidance, followed here: EPERM for a write or trim on a read-only export, ENOSPC for a write
/// beyond the end (and for a full, over-quota or too-large file), EINVAL for unknown commands and flags
/// and other invalid requests, ESHUTDOWN while the server shuts down. ENOMEM (which the spec asks servers
/// to avoid) is what a full scheduler queue gets: the client may retry later.
pub const fn errno(kind: ErrorKind) -> u32 {
    match kind {
        ErrorKind::InvalidRequest => EINVAL,
        ErrorKind::ReadOnly => EPERM,
        ErrorKind::NoSpace => ENOSPC,
        ErrorKind::Exhausted => ENOMEM,
        ErrorKind::Io => EIO,
        ErrorKind::Shutdown => ESHUTDOWN,
    }
}

/// Largest option payload accepted.
pub const MAX_OPTION_LEN: u32 = 8192;
/// The server handshake answers no further option in one [`ServerHandshake::feed`] once that call has put
/// this many reply bytes in `out`: the caller writes them and feeds the rest again. Pipelined options
/// cannot make a reply buffer larger than this plus one option's replies (an 8 KiB `NBD_OPT_INFO` asking
/// 4,090 times for the description answers about 15 times its size).
pub const MAX_REPLY_BATCH: usize = 64 << 10;
/// Longest export name (spec: 4096 bytes).
pub const MAX_NAME_LEN: usize = 4096;
/// Default largest request payload.
pub const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;
/// Largest rejected WRITE payload the server reads and discards to keep the connection in sync (or the
/// maximum payload, if that is larger).
pub const MAX_DISCARD: u32 = 64 << 20;
/// Request header size.
pub const REQUEST_LEN: usize = 28;
/// Longest error message in a structured reply (the spec's limit for strings).
pub const MAX_ERROR_MESSAGE: usize = 4096;

/// A violation of the protocol: the connection cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// A message did not start with the magic it must.
    #[error("bad magic {found:#x} (expected {expected:#x}): not an NBD peer or a desynchronised stream")]
    BadMagic {
        /// The magic the message must start with.
        expected: u64,
        /// What it started with.
        found: u64,
    },
    /// The client's flags lack fixed newstyle, or carry unknown bits.
    #[error("client flags {0:#x} not supported (the fixed newstyle handshake is required)")]
    ClientFlags(u32),
    /// An option (request or reply) longer than the limit.
    #[error("option {option} carries {len} bytes, above the {max}-byte limit")]
    OptionTooLong {
        /// The option.
        option: u32,
        /// Its length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The server does not offer fixed newstyle negotiation.
    #[error("server does not do the fixed newstyle handshake (flags {0:#x})")]
    NotFixedNewstyle(u16),
    /// The server refused an option the client needs.
    #[error("server refused option {option}: reply {reply:#x} ({message})")]
    OptionRefused {
        /// The option.
        option: u32,
        /// The error reply.
        reply: u32,
        /// The server's message.
        message: String,
    },
    /// A message that breaks the protocol's rules.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// The server refused the client where the protocol has no error reply (NBD_OPT_EXPORT_NAME): the
    /// connection closes; the message says why (TLS required, a connection cap).
    #[error("refused: {0}")]
    Refused(String),
    /// A rejected WRITE whose payload is too long to read and discard.
    #[error("write payload of {0} bytes is too large to skip; closing")]
    Unrecoverable(u32),
    /// The client aborted the handshake.
    #[error("client aborted the handshake")]
    Aborted,
    /// A reply (or a chunk of one) names a handle with no request outstanding: what the client can tell
    /// of it ([`StrayReply`]).
    #[error("{}", .why.say(*.handle))]
    StrayReply {
        /// The handle the reply names.
        handle: u64,
        /// What the client's record of its handles says of it.
        why: StrayReply,
    },
    /// A storage-node message that breaks its rules ([`node`]); boxed to keep this error small.
    #[error("storage-node protocol: {0}")]
    Node(Box<NodeError>),
}

/// Why a reply's handle has no request outstanding, as far as the client's record of the handles it
/// sent tells ([`client::ClientTransmission`]: the lowest and the highest, and whether each followed the
/// one before).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrayReply {
    /// Outside the handles sent (below the lowest, above the highest).
    NotSent,
    /// Among handles sent one after another and none forgotten: answered already (a second reply).
    Answered,
    /// Handles were sent out of order, with gaps, or one was forgotten: either.
    Unknown,
}

impl StrayReply {
    fn say(self, handle: u64) -> String {
        match self {
            StrayReply::NotSent => format!("a reply for handle {handle}, a handle not sent"),
            StrayReply::Answered => format!("a second reply for handle {handle}, already answered"),
            StrayReply::Unknown => format!(
                "a reply for handle {handle}, which has no request outstanding (never sent, or answered already)"
            ),
        }
    }
}

impl From<NodeError> for ProtoError {
    fn from(e: NodeError) -> ProtoError {
        ProtoError::Node(Box::new(e))
    }
}

pub(crate) fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}
pub(crate) fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}
pub(crate) fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// An export as the handshake advertises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The name clients ask for.
    pub name: String,
    /// Free text shown by LIST and INFO.
    pub description: String,
    /// Size in bytes.
    pub size: u64,
    /// Whether writes are refused.
    pub read_only: bool,
    /// Whether the data is lost when the server stops (RAM): such an export has no stable storage, so
    /// it advertises neither FLUSH nor FUA (a client then sends neither; the transmission phase rejects
    /// both if one comes anyway).
    pub volatile: bool,
    /// The smallest addressable length and alignment the export asks of clients (NBD_INFO_BLOCK_SIZE's
    /// minimum: a power of two, 1 to 64 KiB; 1 asks nothing). Advertised asked or not when above 1.
    pub min_block: u32,
}

impl ExportInfo {
    /// The transmission flags advertised for this export on a connection with structured replies
    /// negotiated or not: FLUSH and FUA only when it is not volatile, DF only with structured replies (a
    /// READ's reply is always one chunk, so DF is always honoured then).
    pub fn flags_for(&self, structured: bool) -> u16 {
        let f = self.transmission_flags();
        if structured {
            f | TFLAG_SEND_DF
        } else {
            f
        }
    }

    /// The transmission flags advertised for this export without structured replies: FLUSH and FUA only
    /// when it is not volatile.
    pub fn transmission_flags(&self) -> u16 {
        let mut f = TFLAG_HAS_FLAGS | TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES | TFLAG_CAN_MULTI_CONN;
        if !self.volatile {
            f |= TFLAG_SEND_FLUSH | TFLAG_SEND_FUA;
        }
        if self.read_only {
            f |= TFLAG_READ_ONLY;
        }
        f
    }
}

/// A transmission-phase command as it appears on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// NBD_CMD_READ.
    Read,
    /// NBD_CMD_WRITE.
    Write,
    /// NBD_CMD_DISC.
    Disc,
    /// NBD_CMD_FLUSH.
    Flush,
    /// NBD_CMD_TRIM.
    Trim,
    /// NBD_CMD_WRITE_ZEROES.
    WriteZeroes,
    /// NBD_CMD_BLOCK_STATUS.
    BlockStatus,
    /// A command this server does not implement (rejected with EINVAL).
    Other(u16),
}

impl Command {
    /// The command with this wire number.
    pub fn from_u16(t: u16) -> Command {
        match t {
            CMD_READ => Command::Read,
            CMD_WRITE => Command::Write,
            CMD_DISC => Command::Disc,
            CMD_FLUSH => Command::Flush,
            CMD_TRIM => Command::Trim,
            CMD_WRITE_ZEROES => Command::WriteZeroes,
            CMD_BLOCK_STATUS => Command::BlockStatus,
            o => Command::Other(o),
        }
    }

    /// The command's wire number.
    pub fn to_u16(self) -> u16 {
        match self {
            Command::Read => CMD_READ,
            Command::Write => CMD_WRITE,
            Command::Disc => CMD_DISC,
            Command::Flush => CMD_FLUSH,
            Command::Trim => CMD_TRIM,
            Command::WriteZeroes => CMD_WRITE_ZEROES,
            Command::BlockStatus => CMD_BLOCK_STATUS,
            Command::Other(o) => o,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Read => f.write_str("READ"),
            Command::Write => f.write_str("WRITE"),
            Command::Disc => f.write_str("DISC"),
            Command::Flush => f.write_str("FLUSH"),
            Command::Trim => f.write_str("TRIM"),
            Command::WriteZeroes => f.write_str("WRITE_ZEROES"),
            Command::BlockStatus => f.write_str("BLOCK_STATUS"),
            Command::Other(o) => write!(f, "command {o}"),
        }
    }
}

/// A request header as it appears on the wire (a WRITE's payload follows it). The server validates
/// headers through [`ServerTransmission`]; clients encode them with [`RequestHeader::encode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Request flags (`CMD_FLAG_*`).
    pub flags: u16,
    /// The command.
    pub command: Command,
    /// The client's handle, echoed in the reply.
    pub handle: u64,
    /// Byte offset in the export.
    pub offset: u64,
    /// Length in bytes (of the payload, for a WRITE).
    pub length: u32,
}

impl RequestHeader {
    /// Whether the FUA flag is set.
    pub fn fua(&self) -> bool {
        self.flags & CMD_FLAG_FUA != 0
    }

    /// Decodes a header from the first [`REQUEST_LEN`] bytes (`None`: need more).
    pub fn decode(buf: &[u8]) -> Result<Option<RequestHeader>, ProtoError> {
        if buf.len() < REQUEST_LEN {
            return Ok(None);
        }
        let magic = u32_at(buf, 0);
        if magic != REQUEST_MAGIC {
            return Err(ProtoError::BadMagic { expected: REQUEST_MAGIC as u64, found: magic as u64 });
        }
        Ok(Some(RequestHeader {
            flags: u16_at(buf, 4),
            command: Command::from_u16(u16_at(buf, 6)),
            handle: u64_at(buf, 8),
            offset: u64_at(buf, 16),
            length: u32_at(buf, 24),
        }))
    }

    /// Appends the header.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.command.to_u16().to_be_bytes());
        out.extend_from_slice(&self.handle.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.length.to_be_bytes());
    }
}

/// Length of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Length of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;

/// Appends a simple reply header (read data, if any, follows).
pub fn simple_reply(out: &mut Vec<u8>, handle: u64, error: u32) {
    let mut h = [0u8; SIMPLE_REPLY_LEN];
    write_simple_reply(&mut h, handle, error);
    out.extend_from_slice(&h);
}

pub(crate) fn write_simple_reply(h: &mut [u8; SIMPLE_REPLY_LEN], handle: u64, error: u32) {
    h[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&error.to_be_bytes());
    h[8..16].copy_from_slice(&handle.to_be_bytes());
}

pub(crate) fn write_chunk_header(h: &mut [u8; CHUNK_HEADER_LEN], handle: u64, flags: u16, kind: u16, len: u32) {
    h[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&handle.to_be_bytes());
    h[16..20].copy_from_slice(&len.to_be_bytes());
}

/// Appends a structured reply chunk header and payload (the pieces of `payload` concatenated).
pub fn structured_chunk(out: &mut Vec<u8>, handle: u64, flags: u16, kind: u16, payload: &[&[u8]]) {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    let len = u32::try_from(len).expect("a chunk payload fits the 32-bit length field");
    let mut h = [0u8; CHUNK_HEADER_LEN];
    write_chunk_header(&mut h, handle, flags, kind, len);
    out.extend_from_slice(&h);
    for p in payload {
        out.extend_from_slice(p);
    }
}

/// Appends a structured error chunk (with DONE); the message is cut to [`MAX_ERROR_MESSAGE`] bytes (at a
/// character boundary).
pub fn structured_error(out: &mut Vec<u8>, handle: u64, error: u32, message: &str) {
    let mut end = message.len().min(MAX_ERROR_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let msg = &message.as_bytes()[..end];
    structured_chunk(
        out,
        handle,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        &[&error.to_be_bytes(), &(msg.len() as u16).to_be_bytes(), msg],
    );
}

/// A reply as the client sees it (simple replies; structured chunks decoded one at a time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyHeader {
    /// Simple reply: error and handle; for a successful READ, the request's length in data follows.
    Simple {
        /// NBD error number (0: success).
        error: u32,
        /// The request's handle.
        handle: u64,
    },
    /// Structured chunk: its payload (`length` bytes) follows.
    Chunk {
        /// Chunk flags (`REPLY_FLAG_*`).
        flags: u16,
        /// Chunk type (`REPLY_TYPE_*`).
        kind: u16,
        /// The request's handle.
        handle: u64,
        /// Payload length.
        length: u32,
    },
}

impl ReplyHeader {
    /// Decodes a reply header: the header and its length, or `None` if more bytes are needed.
    pub fn decode(buf: &[u8]) -> Result<Option<(ReplyHeader, usize)>, ProtoError> {
        if buf.len() < 4 {
            return Ok(None);
        }
        match u32_at(buf, 0) {
            SIMPLE_REPLY_MAGIC => {
                if buf.len() < SIMPLE_REPLY_LEN {
                    return Ok(None);
                }
                Ok(Some((ReplyHeader::Simple { error: u32_at(buf, 4), handle: u64_at(buf, 8) }, SIMPLE_REPLY_LEN)))
            }
            STRUCTURED_REPLY_MAGIC => {
                if buf.len() < CHUNK_HEADER_LEN {
                    return Ok(None);
                }
                Ok(Some((
                    ReplyHeader::Chunk {
                        flags: u16_at(buf, 4),
                        kind: u16_at(buf, 6),
                        handle: u64_at(buf, 8),
                        length: u32_at(buf, 16),
                    },
                    CHUNK_HEADER_LEN,
                )))
            }
            m => Err(ProtoError::BadMagic { expected: SIMPLE_REPLY_MAGIC as u64, found: m as u64 }),
        }
    }
}
