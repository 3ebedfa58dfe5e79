//! The NBD protocol (NetworkBlockDevice/nbd doc/proto.md) as encode/decode without IO.
//!
//! # Subset
//! - Handshake: fixed newstyle only (the oldstyle and plain newstyle handshakes are obsolete and refused).
//!   Server flags FIXED_NEWSTYLE | NO_ZEROES. Options: EXPORT_NAME, ABORT, LIST, INFO, GO,
//!   STRUCTURED_REPLY (acknowledged; reads are then answered with structured OFFSET_DATA chunks);
//!   anything else (STARTTLS, meta contexts, extended headers) gets NBD_REP_ERR_UNSUP, which the spec lets
//!   clients handle by carrying on without it.
//! - Transmission: READ, WRITE, DISC, FLUSH, TRIM, WRITE_ZEROES with FUA and NO_HOLE flags; simple replies,
//!   and structured replies (OFFSET_DATA, NONE, ERROR) when negotiated.
//!
//! # Server handshake states
//! ```text
//! new() --greeting--> AwaitClientFlags --flags ok--> Options --+-- EXPORT_NAME (known) --> Done
//!                                                              +-- GO (known) ----------> Done
//!                                                              +-- ABORT --------------> Aborted
//!                                                              +-- LIST / INFO / STRUCTURED_REPLY / other -> Options
//! ```
//! `ServerHandshake::feed(input, out)` consumes whole messages from `input` (returning how many bytes it
//! used, so partial reads work) and appends replies to `out`.
//!
//! # Bounds
//! - Option data at most [`MAX_OPTION_LEN`] (4 KiB + headroom for INFO/GO): larger is a protocol error and
//!   the server hangs up (the spec allows a server to drop a client that sends absurd lengths).
//! - Export names at most 4,096 bytes (the spec's limit).
//! - A request's length at most the configured maximum payload (default 32 MiB); a larger READ/WRITE
//!   is answered with EINVAL (WRITE: the payload is still read and discarded if it is under
//!   [`MAX_DISCARD`], else the connection is dropped, since the stream cannot be resynchronised cheaply).

use std::fmt;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
pub const REPLY_MAGIC_OPT: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Largest option payload accepted.
pub const MAX_OPTION_LEN: u32 = 8192;
/// Longest export name (spec: 4096 bytes).
pub const MAX_NAME_LEN: usize = 4096;
/// Default largest request payload.
pub const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;
/// Largest oversize WRITE payload the server reads and discards to keep the connection in sync.
pub const MAX_DISCARD: u32 = 64 << 20;
/// Request header size.
pub const REQUEST_LEN: usize = 28;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("bad magic {found:#x} (expected {expected:#x}): not an NBD peer or a desynchronised stream")]
    BadMagic { expected: u64, found: u64 },
    #[error("client flags {0:#x} not supported (the fixed newstyle handshake is required)")]
    ClientFlags(u32),
    #[error("option {option} carries {len} bytes, above the {max}-byte limit")]
    OptionTooLong { option: u32, len: u32, max: u32 },
    #[error("server does not do the fixed newstyle handshake (flags {0:#x})")]
    NotFixedNewstyle(u16),
    #[error("server refused option {option}: reply {reply:#x} ({message})")]
    OptionRefused { option: u32, reply: u32, message: String },
    #[error("malformed {0}")]
    Malformed(&'static str),
    #[error("write payload of {0} bytes is too large to skip; closing")]
    Unrecoverable(u32),
    #[error("client aborted the handshake")]
    Aborted,
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// An export as the handshake advertises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
    pub size: u64,
    pub read_only: bool,
}

impl ExportInfo {
    pub fn transmission_flags(&self) -> u16 {
        let mut f = TFLAG_HAS_FLAGS
            | TFLAG_SEND_FLUSH
            | TFLAG_SEND_FUA
            | TFLAG_SEND_TRIM
            | TFLAG_SEND_WRITE_ZEROES
            | TFLAG_CAN_MULTI_CONN;
        if self.read_only {
            f |= TFLAG_READ_ONLY;
        }
        f
    }
}

/// What a finished handshake agreed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Index into the exports given to the server handshake.
    pub export: usize,
    pub structured: bool,
}

/// Result of feeding the server handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerProgress {
    /// Consumed `n` bytes; needs more input.
    NeedMore,
    Done(Negotiated),
    /// The client sent NBD_OPT_ABORT (already acknowledged in `out`): close the connection.
    Aborted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SState {
    ClientFlags,
    Options,
    Finished,
}

/// The server side of the fixed newstyle handshake.
#[derive(Debug, Clone)]
pub struct ServerHandshake {
    exports: Vec<ExportInfo>,
    state: SState,
    no_zeroes: bool,
    structured: bool,
}

impl ServerHandshake {
    /// Starts a handshake; appends the greeting to `out`.
    pub fn new(exports: Vec<ExportInfo>, out: &mut Vec<u8>) -> ServerHandshake {
        out.extend_from_slice(&NBDMAGIC.to_be_bytes());
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        ServerHandshake { exports, state: SState::ClientFlags, no_zeroes: false, structured: false }
    }

    fn find(&self, name: &str) -> Option<usize> {
        // The empty name is the default export: the first one.
        if name.is_empty() {
            return (!self.exports.is_empty()).then_some(0);
        }
        self.exports.iter().position(|e| e.name == name)
    }

    /// Consumes complete messages from `input`; returns (bytes consumed, progress). Replies go to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(usize, ServerProgress), ProtoError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.state {
                SState::Finished => return Err(ProtoError::Malformed("data after the handshake finished")),
                SState::ClientFlags => {
                    if rest.len() < 4 {
                        return Ok((used, ServerProgress::NeedMore));
                    }
                    let flags = u32_at(rest, 0);
                    used += 4;
                    if flags & FLAG_C_FIXED_NEWSTYLE == 0 || flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                        return Err(ProtoError::ClientFlags(flags));
                    }
                    self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
                    self.state = SState::Options;
                }
                SState::Options => {
                    if rest.len() < 16 {
                        return Ok((used, ServerProgress::NeedMore));
                    }
                    let magic = u64_at(rest, 0);
                    if magic != IHAVEOPT {
                        return Err(ProtoError::BadMagic { expected: IHAVEOPT, found: magic });
                    }
                    let option = u32_at(rest, 8);
                    let len = u32_at(rest, 12);
                    if len > MAX_OPTION_LEN {
                        return Err(ProtoError::OptionTooLong { option, len, max: MAX_OPTION_LEN });
                    }
                    if rest.len() < 16 + len as usize {
                        return Ok((used, ServerProgress::NeedMore));
                    }
                    let data = &rest[16..16 + len as usize];
                    used += 16 + len as usize;
                    if let Some(p) = self.option(option, data, out)? {
                        self.state = SState::Finished;
                        return Ok((used, p));
                    }
                }
            }
        }
    }

    fn option(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> Result<Option<ServerProgress>, ProtoError> {
        match option {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(data);
                match self.find(&name) {
                    Some(i) => {
                        let e = &self.exports[i];
                        out.extend_from_slice(&e.size.to_be_bytes());
                        out.extend_from_slice(&e.transmission_flags().to_be_bytes());
                        if !self.no_zeroes {
                            out.extend_from_slice(&[0u8; 124]);
                        }
                        Ok(Some(ServerProgress::Done(Negotiated { export: i, structured: self.structured })))
                    }
                    // The spec: on an unknown EXPORT_NAME the server must close the connection.
                    None => Err(ProtoError::Malformed("unknown export in NBD_OPT_EXPORT_NAME")),
                }
            }
            OPT_ABORT => {
                option_reply(out, option, REP_ACK, &[]);
                Ok(Some(ServerProgress::Aborted))
            }
            OPT_LIST => {
                if !data.is_empty() {
                    option_reply(out, option, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data");
                    return Ok(None);
                }
                for e in &self.exports {
                    let mut d = Vec::with_capacity(4 + e.name.len());
                    d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                    d.extend_from_slice(e.name.as_bytes());
                    d.extend_from_slice(e.description.as_bytes());
                    option_reply(out, option, REP_SERVER, &d);
                }
                option_reply(out, option, REP_ACK, &[]);
                Ok(None)
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    option_reply(out, option, REP_ERR_INVALID, b"NBD_OPT_STRUCTURED_REPLY takes no data");
                } else {
                    self.structured = true;
                    option_reply(out, option, REP_ACK, &[]);
                }
                Ok(None)
            }
            OPT_INFO | OPT_GO => {
                // u32 name length, name, u16 number of info requests, u16 each.
                if data.len() < 6 {
                    option_reply(out, option, REP_ERR_INVALID, b"short NBD_OPT_INFO/GO");
                    return Ok(None);
                }
                let nlen = u32_at(data, 0) as usize;
                if nlen > MAX_NAME_LEN || data.len() < 4 + nlen + 2 {
                    option_reply(out, option, REP_ERR_INVALID, b"bad name length");
                    return Ok(None);
                }
                let name = String::from_utf8_lossy(&data[4..4 + nlen]).into_owned();
                let nreq = u16_at(data, 4 + nlen) as usize;
                if data.len() != 4 + nlen + 2 + 2 * nreq {
                    option_reply(out, option, REP_ERR_INVALID, b"bad information request count");
                    return Ok(None);
                }
                let wanted: Vec<u16> = (0..nreq).map(|k| u16_at(data, 4 + nlen + 2 + 2 * k)).collect();
                let Some(i) = self.find(&name) else {
                    option_reply(out, option, REP_ERR_UNKNOWN, format!("no export named {name:?}").as_bytes());
                    return Ok(None);
                };
                let e = self.exports[i].clone();
                let mut d = Vec::with_capacity(12);
                d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                d.extend_from_slice(&e.size.to_be_bytes());
                d.extend_from_slice(&e.transmission_flags().to_be_bytes());
                option_reply(out, option, REP_INFO, &d);
                for w in wanted {
                    let mut d = Vec::new();
                    match w {
                        INFO_NAME => {
                            d.extend_from_slice(&INFO_NAME.to_be_bytes());
                            d.extend_from_slice(e.name.as_bytes());
                        }
                        INFO_DESCRIPTION => {
                            d.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
                            d.extend_from_slice(e.description.as_bytes());
                        }
                        INFO_BLOCK_SIZE => {
                            d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                            d.extend_from_slice(&1u32.to_be_bytes());
                            d.extend_from_slice(&4096u32.to_be_bytes());
                            d.extend_from_slice(&DEFAULT_MAX_PAYLOAD.to_be_bytes());
                        }
                        _ => continue, // unknown information types are ignored (spec)
                    }
                    option_reply(out, option, REP_INFO, &d);
                }
                option_reply(out, option, REP_ACK, &[]);
                if option == OPT_GO {
                    return Ok(Some(ServerProgress::Done(Negotiated { export: i, structured: self.structured })));
                }
                Ok(None)
            }
            OPT_STARTTLS => {
                option_reply(out, option, REP_ERR_POLICY, b"TLS is not offered");
                Ok(None)
            }
            _ => {
                option_reply(out, option, REP_ERR_UNSUP, b"option not supported");
                Ok(None)
            }
        }
    }
}

/// Appends an option reply.
pub fn option_reply(out: &mut Vec<u8>, option: u32, reply: u32, data: &[u8]) {
    out.extend_from_slice(&REPLY_MAGIC_OPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// A transmission-phase command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    WriteZeroes,
    /// A command we do not implement (answered with ENOTSUP / EINVAL).
    Other(u16),
}

impl Command {
    fn from_u16(t: u16) -> Command {
        match t {
            CMD_READ => Command::Read,
            CMD_WRITE => Command::Write,
            CMD_DISC => Command::Disc,
            CMD_FLUSH => Command::Flush,
            CMD_TRIM => Command::Trim,
            CMD_WRITE_ZEROES => Command::WriteZeroes,
            o => Command::Other(o),
        }
    }
    fn to_u16(self) -> u16 {
        match self {
            Command::Read => CMD_READ,
            Command::Write => CMD_WRITE,
            Command::Disc => CMD_DISC,
            Command::Flush => CMD_FLUSH,
            Command::Trim => CMD_TRIM,
            Command::WriteZeroes => CMD_WRITE_ZEROES,
            Command::Other(o) => o,
        }
    }
}

/// A request header (the WRITE payload follows it on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: Command,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

impl RequestHeader {
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

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.command.to_u16().to_be_bytes());
        out.extend_from_slice(&self.handle.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.length.to_be_bytes());
    }
}

/// Appends a simple reply header (read data, if any, follows).
pub fn simple_reply(out: &mut Vec<u8>, handle: u64, error: u32) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
}

/// Appends a structured reply chunk header and payload.
pub fn structured_chunk(out: &mut Vec<u8>, handle: u64, flags: u16, kind: u16, payload: &[&[u8]]) {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
    out.extend_from_slice(&(len as u32).to_be_bytes());
    for p in payload {
        out.extend_from_slice(p);
    }
}

/// Appends a structured error chunk (with DONE).
pub fn structured_error(out: &mut Vec<u8>, handle: u64, error: u32, message: &str) {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    structured_chunk(
        out,
        handle,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        &[&error.to_be_bytes(), &(msg.len() as u16).to_be_bytes(), msg],
    );
}

// -------------------------------------------------------------------------------------------------
// Client side
// -------------------------------------------------------------------------------------------------

/// Result of feeding the client handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientProgress {
    NeedMore,
    /// The export is open: size and transmission flags.
    Ready {
        size: u64,
        flags: u16,
        structured: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CState {
    Greeting,
    StructuredReply,
    GoReplies,
    Ready,
}

/// The client side of the fixed newstyle handshake: optional NBD_OPT_STRUCTURED_REPLY, then NBD_OPT_GO.
#[derive(Debug, Clone)]
pub struct ClientHandshake {
    export: String,
    want_structured: bool,
    structured: bool,
    state: CState,
    size: Option<u64>,
    flags: u16,
}

impl ClientHandshake {
    pub fn new(export: &str, want_structured: bool) -> ClientHandshake {
        ClientHandshake {
            export: export.to_string(),
            want_structured,
            structured: false,
            state: CState::Greeting,
            size: None,
            flags: 0,
        }
    }

    fn send_go(&self, out: &mut Vec<u8>) {
        let name = self.export.as_bytes();
        let mut d = Vec::with_capacity(8 + name.len());
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name);
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        option_request(out, OPT_GO, &d);
    }

    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(usize, ClientProgress), ProtoError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.state {
                CState::Ready => {
                    return Ok((
                        used,
                        ClientProgress::Ready {
                            size: self.size.unwrap_or(0),
                            flags: self.flags,
                            structured: self.structured,
                        },
                    ))
                }
                CState::Greeting => {
                    if rest.len() < 18 {
                        return Ok((used, ClientProgress::NeedMore));
                    }
                    let m = u64_at(rest, 0);
                    if m != NBDMAGIC {
                        return Err(ProtoError::BadMagic { expected: NBDMAGIC, found: m });
                    }
                    let m = u64_at(rest, 8);
                    if m != IHAVEOPT {
                        return Err(ProtoError::BadMagic { expected: IHAVEOPT, found: m });
                    }
                    let sflags = u16_at(rest, 16);
                    if sflags & FLAG_FIXED_NEWSTYLE == 0 {
                        return Err(ProtoError::NotFixedNewstyle(sflags));
                    }
                    used += 18;
                    let mut cflags = FLAG_C_FIXED_NEWSTYLE;
                    if sflags & FLAG_NO_ZEROES != 0 {
                        cflags |= FLAG_C_NO_ZEROES;
                    }
                    out.extend_from_slice(&cflags.to_be_bytes());
                    if self.want_structured {
                        option_request(out, OPT_STRUCTURED_REPLY, &[]);
                        self.state = CState::StructuredReply;
                    } else {
                        self.send_go(out);
                        self.state = CState::GoReplies;
                    }
                }
                CState::StructuredReply | CState::GoReplies => {
                    let Some((opt, reply, data, n)) = decode_option_reply(rest)? else {
                        return Ok((used, ClientProgress::NeedMore));
                    };
                    used += n;
                    if self.state == CState::StructuredReply {
                        self.structured = reply == REP_ACK && opt == OPT_STRUCTURED_REPLY;
                        self.send_go(out);
                        self.state = CState::GoReplies;
                        continue;
                    }
                    match reply {
                        REP_INFO if data.len() >= 12 && u16_at(&data, 0) == INFO_EXPORT => {
                            self.size = Some(u64_at(&data, 2));
                            self.flags = u16_at(&data, 10);
                        }
                        REP_INFO => {}
                        REP_ACK => {
                            if self.size.is_none() {
                                return Err(ProtoError::Malformed("NBD_OPT_GO acknowledged without NBD_INFO_EXPORT"));
                            }
                            self.state = CState::Ready;
                        }
                        r => {
                            return Err(ProtoError::OptionRefused {
                                option: opt,
                                reply: r,
                                message: String::from_utf8_lossy(&data).into_owned(),
                            });
                        }
                    }
                }
            }
        }
    }
}

/// Appends an option request.
pub fn option_request(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// Decodes an option reply: (option, reply type, data, bytes used), or `None` if incomplete.
pub fn decode_option_reply(buf: &[u8]) -> Result<Option<(u32, u32, Vec<u8>, usize)>, ProtoError> {
    if buf.len() < 20 {
        return Ok(None);
    }
    let m = u64_at(buf, 0);
    if m != REPLY_MAGIC_OPT {
        return Err(ProtoError::BadMagic { expected: REPLY_MAGIC_OPT, found: m });
    }
    let len = u32_at(buf, 16);
    if len > MAX_OPTION_LEN * 8 {
        return Err(ProtoError::OptionTooLong { option: u32_at(buf, 8), len, max: MAX_OPTION_LEN * 8 });
    }
    if buf.len() < 20 + len as usize {
        return Ok(None);
    }
    Ok(Some((u32_at(buf, 8), u32_at(buf, 12), buf[20..20 + len as usize].to_vec(), 20 + len as usize)))
}

/// A reply as the client sees it (simple replies; structured chunks decoded one at a time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyHeader {
    /// Simple reply: error and handle; for a successful READ, `length` bytes of data follow.
    Simple { error: u32, handle: u64 },
    /// Structured chunk: its payload (`length` bytes) follows.
    Chunk { flags: u16, kind: u16, handle: u64, length: u32 },
}

impl ReplyHeader {
    /// Decodes a reply header; `None`: need more.
    pub fn decode(buf: &[u8]) -> Result<Option<(ReplyHeader, usize)>, ProtoError> {
        if buf.len() < 4 {
            return Ok(None);
        }
        match u32_at(buf, 0) {
            SIMPLE_REPLY_MAGIC => {
                if buf.len() < 16 {
                    return Ok(None);
                }
                Ok(Some((ReplyHeader::Simple { error: u32_at(buf, 4), handle: u64_at(buf, 8) }, 16)))
            }
            STRUCTURED_REPLY_MAGIC => {
                if buf.len() < 20 {
                    return Ok(None);
                }
                Ok(Some((
                    ReplyHeader::Chunk {
                        flags: u16_at(buf, 4),
                        kind: u16_at(buf, 6),
                        handle: u64_at(buf, 8),
                        length: u32_at(buf, 16),
                    },
                    20,
                )))
            }
            m => Err(ProtoError::BadMagic { expected: SIMPLE_REPLY_MAGIC as u64, found: m as u64 }),
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
            Command::Other(o) => write!(f, "command {o}"),
        }
    }
}
