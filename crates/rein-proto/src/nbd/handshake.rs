//! The fixed newstyle handshake, server and client, as state machines over byte buffers.
//!
//! # Server states
//! ```text
//! new() --greeting--> ClientFlags --flags ok--> Options --+-- EXPORT_NAME (known) --> Finished: Done
//!                                                         +-- GO (known) ----------> Finished: Done
//!                                                         +-- ABORT --------------> Finished: Aborted
//!                                                         +-- LIST / INFO / STRUCTURED_REPLY / other -> Options
//! ```
//! [`ServerHandshake::feed`] consumes whole messages from `input` (returning how many bytes it used, so
//! partial reads work) and appends replies to `out`. A bad magic, unsupported client flags, an option
//! longer than [`MAX_OPTION_LEN`] or an unknown export in EXPORT_NAME is a [`ProtoError`]: close.
//!
//! # Client states
//! ```text
//! new() --greeting--> [STRUCTURED_REPLY sent --reply-->] GO sent --INFO*, ACK--> Ready
//! ```
//! [`ClientHandshake`] asks for structured replies if wanted, then for the export with NBD_OPT_GO.

use super::*;
use crate::nbd::transmission::MAX_PAYLOAD_LIMIT;

/// What a finished handshake agreed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Index into the exports given to the server handshake.
    pub export: usize,
    /// Whether the client asked for structured replies.
    pub structured: bool,
}

/// Result of feeding the server handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerProgress {
    /// Needs more input.
    NeedMore,
    /// The client chose an export: transmission starts with the next byte.
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
    max_payload: u32,
    state: SState,
    no_zeroes: bool,
    structured: bool,
}

impl ServerHandshake {
    /// Starts a handshake that advertises [`DEFAULT_MAX_PAYLOAD`]; appends the greeting to `out`.
    pub fn new(exports: Vec<ExportInfo>, out: &mut Vec<u8>) -> ServerHandshake {
        Self::with_max_payload(exports, DEFAULT_MAX_PAYLOAD, out)
    }

    /// Starts a handshake whose block-size information advertises `max_payload` (the limit the
    /// transmission phase enforces, [`TransmissionConfig::max_payload`]); appends the greeting to `out`.
    pub fn with_max_payload(exports: Vec<ExportInfo>, max_payload: u32, out: &mut Vec<u8>) -> ServerHandshake {
        out.extend_from_slice(&NBDMAGIC.to_be_bytes());
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        ServerHandshake {
            exports,
            max_payload: max_payload.clamp(1, MAX_PAYLOAD_LIMIT),
            state: SState::ClientFlags,
            no_zeroes: false,
            structured: false,
        }
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
                            // Minimum 1, preferred 4 KiB (never above the maximum), maximum the payload limit.
                            d.extend_from_slice(&1u32.to_be_bytes());
                            d.extend_from_slice(&4096u32.min(self.max_payload).to_be_bytes());
                            d.extend_from_slice(&self.max_payload.to_be_bytes());
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

/// Result of feeding the client handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientProgress {
    /// Needs more input.
    NeedMore,
    /// The export is open: size and transmission flags.
    Ready {
        /// Export size in bytes.
        size: u64,
        /// Transmission flags (`TFLAG_*`).
        flags: u16,
        /// Whether the server agreed to structured replies.
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
    /// A client for `export`, asking for structured replies if `want_structured`.
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

    /// Consumes complete messages from `input`; returns (bytes consumed, progress). Requests go to `out`.
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
                    let Some((OptionReply { option: opt, reply, data }, n)) = decode_option_reply(rest)? else {
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
                        REP_INFO if data.len() >= 12 && u16_at(data, 0) == INFO_EXPORT => {
                            self.size = Some(u64_at(data, 2));
                            self.flags = u16_at(data, 10);
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
                                message: String::from_utf8_lossy(data).into_owned(),
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

/// An option reply as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReply<'a> {
    /// The option answered.
    pub option: u32,
    /// The reply type (`REP_*`).
    pub reply: u32,
    /// The reply's data.
    pub data: &'a [u8],
}

/// Decodes an option reply and its length in bytes, or `None` if incomplete.
pub fn decode_option_reply(buf: &[u8]) -> Result<Option<(OptionReply<'_>, usize)>, ProtoError> {
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
    let end = 20 + len as usize;
    Ok(Some((OptionReply { option: u32_at(buf, 8), reply: u32_at(buf, 12), data: &buf[20..end] }, end)))
}
