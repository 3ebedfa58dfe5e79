//! The server side of the transmission phase as a sans-IO state machine: bytes in; requests, rejections
//! and disconnects out; every reply encoded here.
//!
//! # Model
//! The caller owns the socket and a buffer of received bytes. [`ServerTransmission::feed`] looks at the
//! unconsumed bytes and returns how many it used and one [`Event`]:
//! - [`Event::NeedMore`]`{ wanted }`: no progress until at least `wanted` unconsumed bytes are there;
//! - [`Event::Request`]: a valid request to run; a WRITE comes with its whole payload, borrowed from the
//!   input;
//! - [`Event::Reject`]: a request to answer at once with an error ([`Rejection::kind`]); the connection
//!   stays usable;
//! - [`Event::Disconnect`]: NBD_CMD_DISC: answer what is in flight, then close (no reply to the DISC).
//!
//! An `Err(`[`ProtoError`]`)` (a bad request magic; a rejected WRITE whose payload is too long to skip)
//! means close now: the stream cannot be resynchronised. Replies are encoded by a [`ReplyEncoder`] (a
//! `Copy` value, so completions running elsewhere can encode without the state machine).
//!
//! # States
//! ```text
//!            Request, Reject, NeedMore
//!               +------+
//!               v      |
//! new() ---> Header ---+
//!             |   ^
//!             |   | last payload byte consumed
//!             |   |
//!             +---|-- Reject (invalid WRITE with a payload) --> Discard{remaining} --+
//!             |   +------------------------------------------------------------------+
//!             |
//!             +-- Disconnect (DISC); Err (bad magic; invalid WRITE too long to skip) --> Closed
//! ```
//! In `Discard` every byte offered is consumed at once (`NeedMore { wanted: 1 }` until the payload is
//! done), so a rejected WRITE's payload is never buffered. In `Closed` any input is an error.
//!
//! # Validation, in this order (the first failing check names the error)
//! 1. The magic: anything else is a protocol error.
//! 2. The command: DISC disconnects (its offset, length and flags are ignored: refusing to disconnect
//!    gains nothing); an unknown command gets EINVAL.
//! 3. The flags: FUA on any command (as qemu-nbd accepts it) unless the export is volatile, NO_HOLE on
//!    WRITE_ZEROES, DF on READ with structured replies (a READ is always one chunk here), REQ_ONE on
//!    BLOCK_STATUS; any other bit
//!    gets EINVAL. The spec: "The server SHOULD return `NBD_EINVAL` if it receives an unknown command
//!    flag. It also SHOULD return `NBD_EINVAL` if it receives a request with a flag not explicitly
//!    documented as applicable to the given request", and FUA "is valid for all commands, provided
//!    `NBD_FLAG_SEND_FUA` has been negotiated", which a volatile export does not advertise.
//! 4. FLUSH: on a volatile export (FLUSH not advertised: "A client MUST NOT send a flush request unless
//!    `NBD_FLAG_SEND_FLUSH` was set") EINVAL, since a success would claim stable storage there is not;
//!    with a non-zero offset or length EINVAL ("*length* and *offset* are reserved, and MUST be set to
//!    all-zero"; the spec leaves the error to the server, and EINVAL is what nbdkit answers).
//! 5. A WRITE, TRIM or WRITE_ZEROES on a read-only export gets EPERM.
//! 6. A READ or WRITE longer than the maximum payload gets EINVAL.
//! 7. BLOCK_STATUS without `base:allocation` negotiated ([`TransmissionConfig::base_allocation`]) gets
//!    EINVAL (the spec: "Servers SHOULD reply to clients doing so anyway with `EINVAL`"), and so does one
//!    of length 0 (a reply needs at least one descriptor of at least one byte). Its length is not bound by
//!    the maximum payload: it reads no data, and its reply is bounded by [`super::MAX_EXTENTS`].
//! 8. A range past the end of the export gets ENOSPC for WRITE and WRITE_ZEROES (the spec's SHOULD), EINVAL
//!    for READ, TRIM and BLOCK_STATUS (FLUSH has no range).
//!
//! A zero-length READ or WRITE is valid (and answered with success and no data).
//!
//! # Server shutdown
//! After [`ServerTransmission::shut_down`], every request but DISC is rejected with NBD_ESHUTDOWN
//! ([`Reason::ShuttingDown`], before the other checks once the command is known: an unknown command still
//! gets EINVAL; a WRITE's payload is skipped as for any rejection).
//! The spec: "On a server shutdown, the server SHOULD wait for inflight requests to be serviced prior to
//! initiating a hard disconnect. [...] The error value issued in respect of these requests and any
//! subsequently received requests SHOULD be `NBD_ESHUTDOWN`. If the client receives an `NBD_ESHUTDOWN`
//! error it MUST initiate a soft disconnect." So a caller that shuts down keeps reading: requests sent
//! meanwhile are answered (not run), and the client's DISC ends the connection cleanly.
//!
//! # Storage-node sessions ([`super::node`])
//! With [`TransmissionConfig::node`], every request header (DISC's too) is followed by a
//! [`NODE_TAG_LEN`]-byte [`NodeTag`]: a request is consumed only once header and tag are there, and the
//! tag is consumed with its header whatever happens to the request. The tag is checked right after the
//! command (step 2): a slot at or above [`TransmissionConfig::node_slots`], a share outside 1..=65536 or
//! rho above delta gets EINVAL ([`Reason::Tag`]); DISC's tag is ignored. A valid request carries its tag
//! ([`Request::tag`]). Replies are simple, each followed by a [`NodeReplyTrailer`] (phase and cost of the
//! dispatch, [`ReplyEncoder::success_node`]; none on errors).
//!
//! # Invariants (checked by the property tests in `tests/nbd_transmission.rs` and by the fuzz target)
//! 1. Every request header yields exactly one [`Event::Request`] or [`Event::Reject`], except DISC, which
//!    yields [`Event::Disconnect`]; nothing else yields either.
//! 2. The events do not depend on how the input is split: fed whole, byte by byte or in any chunks, a
//!    stream gives the same requests, rejections, disconnect and error.
//! 3. Bounded memory: `wanted` is at most [`REQUEST_LEN`] (+ [`NODE_TAG_LEN`] on a node session) + the
//!    maximum payload, and a payload being
//!    discarded is consumed as it arrives, so a caller's buffer never needs to be larger (asserted).
//! 4. `consumed <= input.len()`; after a disconnect or an error the machine is closed and any further
//!    input is an error.
//!
//! # Replies
//! Simple replies unless structured replies were negotiated; then a successful READ is one OFFSET_DATA
//! chunk with DONE (NONE for a zero-length READ), other successes a NONE chunk, and errors an ERROR chunk
//! with a message (the spec lets servers answer non-READ requests either way; one style is simpler to
//! check); a BLOCK_STATUS's success is one BLOCK_STATUS chunk ([`super::Extents`]). A READ's reply header goes into headroom the caller leaves in front of the buffer the read
//! fills ([`ReplyEncoder::headroom`], [`ReplyEncoder::success`]), so read data is never copied to put a
//! header in front of it.

use super::*;
use std::io::Write as _;

/// Largest maximum payload: a READ's data and its 8-byte offset must fit one structured chunk's 32-bit
/// length. Larger configured maxima are clamped to it.
pub const MAX_PAYLOAD_LIMIT: u32 = u32::MAX - 8;

/// What the transmission phase needs to know about the connection: the negotiated export and the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransmissionConfig {
    /// Export size in bytes.
    pub size: u64,
    /// Whether the export refuses writes.
    pub read_only: bool,
    /// Whether structured replies were negotiated.
    pub structured: bool,
    /// Largest READ or WRITE accepted, in bytes (clamped to 1..=[`MAX_PAYLOAD_LIMIT`]).
    pub max_payload: u32,
    /// Whether the export is volatile ([`ExportInfo::volatile`]): FLUSH and FUA are then rejected.
    pub volatile: bool,
    /// Whether this is a storage-node session (a tag after each header, a trailer after each reply).
    pub node: bool,
    /// Slots of the node session (the welcome's tenants); a tag's slot must be below it.
    pub node_slots: u32,
    /// Whether the `base:allocation` context was negotiated (with structured replies): BLOCK_STATUS is
    /// accepted.
    pub base_allocation: bool,
}

impl TransmissionConfig {
    /// The configuration for a finished handshake on `export`.
    pub fn new(export: &ExportInfo, negotiated: &Negotiated, max_payload: u32) -> TransmissionConfig {
        TransmissionConfig {
            size: export.size,
            read_only: export.read_only,
            structured: negotiated.structured,
            max_payload,
            volatile: export.volatile,
            node: negotiated.node.is_some(),
            node_slots: negotiated.node.as_ref().map_or(0, |w| w.tenants.len() as u32),
            // With structured replies, or implied on a storage-node session of v4 or later (the handshake
            // says which, `Negotiated::base_allocation`).
            base_allocation: negotiated.base_allocation && (negotiated.structured || negotiated.node.is_some()),
        }
    }

    /// Bytes of a request before its payload: the header, and the tag on a node session.
    pub fn request_head_len(&self) -> usize {
        if self.node {
            REQUEST_LEN + NODE_TAG_LEN
        } else {
            REQUEST_LEN
        }
    }
}

/// What a valid request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// Read `length` bytes.
    Read,
    /// Write the payload.
    Write,
    /// Make completed writes durable.
    Flush,
    /// Discard `length` bytes (they read as zeroes afterwards here).
    Trim,
    /// Write `length` zero bytes.
    WriteZeroes,
    /// The allocation status of `length` bytes (`base:allocation`; the reply: [`super::Extents`]).
    BlockStatus {
        /// NBD_CMD_FLAG_REQ_ONE: one descriptor only.
        one: bool,
    },
}

impl RequestKind {
    /// Whether the request changes the export (refused on read-only exports).
    pub fn writes(self) -> bool {
        matches!(self, RequestKind::Write | RequestKind::Trim | RequestKind::WriteZeroes)
    }

    /// The wire command.
    pub fn command(self) -> Command {
        match self {
            RequestKind::Read => Command::Read,
            RequestKind::Write => Command::Write,
            RequestKind::Flush => Command::Flush,
            RequestKind::Trim => Command::Trim,
            RequestKind::WriteZeroes => Command::WriteZeroes,
            RequestKind::BlockStatus { .. } => Command::BlockStatus,
        }
    }
}

/// A validated request: in range, within the limits, allowed on the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The client's handle, echoed in the reply.
    pub handle: u64,
    /// What to do.
    pub kind: RequestKind,
    /// Byte offset (`offset + length <= size`; 0 for FLUSH, whose offset and length are reserved and zero).
    pub offset: u64,
    /// Length in bytes (a READ's or WRITE's is at most the maximum payload).
    pub length: u32,
    /// Force unit access: durable before the reply.
    pub fua: bool,
    /// A WRITE_ZEROES with NBD_CMD_FLAG_NO_HOLE: the range must stay allocated. Without it the server may
    /// punch a hole (the spec's choice; it also succeeds on a full disk, where allocating fails).
    pub no_hole: bool,
    /// On a storage-node session, the request's validated tag.
    pub tag: Option<NodeTag>,
}

/// Why a request is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A command this server does not implement.
    UnknownCommand(u16),
    /// Flags unknown or not applicable to the command.
    BadFlags(u16),
    /// A change to a read-only export.
    ReadOnly,
    /// A FLUSH on a volatile export, which does not advertise FLUSH.
    FlushNotOffered,
    /// A FLUSH whose reserved offset or length is not zero.
    FlushNotZero {
        /// The request's offset.
        offset: u64,
        /// The request's length.
        length: u32,
    },
    /// A BLOCK_STATUS without a metadata context negotiated.
    NoMetaContext,
    /// A BLOCK_STATUS of length 0.
    EmptyBlockStatus,
    /// A READ or WRITE above the maximum payload.
    TooLarge {
        /// The request's length.
        length: u32,
        /// The maximum payload.
        max: u32,
    },
    /// A storage-node tag the session refuses.
    Tag(TagFault),
    /// A range past the end of the export.
    OutOfRange {
        /// The request's offset.
        offset: u64,
        /// The request's length.
        length: u32,
        /// The export's size.
        size: u64,
    },
    /// The server is shutting down ([`ServerTransmission::shut_down`]): not run.
    ShuttingDown,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Reason::UnknownCommand(c) => write!(f, "unknown command {c}"),
            Reason::BadFlags(flags) => write!(f, "unsupported flags {flags:#x}"),
            Reason::ReadOnly => f.write_str("the export is read-only"),
            Reason::FlushNotOffered => f.write_str("FLUSH is not offered: the export is volatile (RAM)"),
            Reason::FlushNotZero { offset, length } => {
                write!(f, "offset {offset} and length {length} are reserved and must be zero")
            }
            Reason::TooLarge { length, max } => write!(f, "{length} bytes is above the {max}-byte limit"),
            Reason::NoMetaContext => f.write_str("no metadata context was negotiated (NBD_OPT_SET_META_CONTEXT)"),
            Reason::EmptyBlockStatus => f.write_str("a block status query of length 0"),
            Reason::Tag(fault) => write!(f, "{fault}"),
            Reason::OutOfRange { offset, length, size } => {
                write!(f, "range {offset}+{length} is beyond the end of the export ({size} bytes)")
            }
            Reason::ShuttingDown => f.write_str("the server is shutting down"),
        }
    }
}

/// A request answered at once with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    /// The client's handle.
    pub handle: u64,
    /// The command as sent.
    pub command: Command,
    /// Why.
    pub reason: Reason,
}

impl Rejection {
    /// The error the reply carries.
    pub fn kind(&self) -> ErrorKind {
        match self.reason {
            Reason::ReadOnly => ErrorKind::ReadOnly,
            Reason::OutOfRange { .. } if matches!(self.command, Command::Write | Command::WriteZeroes) => {
                ErrorKind::NoSpace
            }
            Reason::ShuttingDown => ErrorKind::Shutdown,
            _ => ErrorKind::InvalidRequest,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.command, self.reason)
    }
}

/// What [`ServerTransmission::feed`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// No progress until at least `wanted` unconsumed bytes are available.
    NeedMore {
        /// Unconsumed bytes needed (a hint for the read buffer; at most [`REQUEST_LEN`] + max payload).
        wanted: usize,
    },
    /// A valid request.
    Request {
        /// The request.
        request: Request,
        /// A WRITE's payload (`request.length` bytes of the input); empty for other requests.
        payload: &'a [u8],
    },
    /// An invalid request, to be answered with its error; the connection goes on. A rejected WRITE's
    /// payload has not been read yet: the next calls consume it as it arrives (asking for one byte at a
    /// time at least), then go on with the next request.
    Reject(Rejection),
    /// The client sent NBD_CMD_DISC: answer the requests in flight, then close.
    Disconnect,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Header,
    /// Skipping a rejected WRITE's payload.
    Discard {
        remaining: u32,
    },
    Closed,
}

/// The server side of the transmission phase (module comment).
#[derive(Debug, Clone)]
pub struct ServerTransmission {
    config: TransmissionConfig,
    /// Longest rejected WRITE payload skipped rather than closing: max(MAX_DISCARD, max payload).
    discard_limit: u32,
    state: State,
    /// Set by [`ServerTransmission::shut_down`].
    shutting_down: bool,
}

impl ServerTransmission {
    /// Starts the transmission phase (the maximum payload is clamped to 1..=[`MAX_PAYLOAD_LIMIT`]).
    pub fn new(config: TransmissionConfig) -> ServerTransmission {
        let max_payload = config.max_payload.clamp(1, MAX_PAYLOAD_LIMIT);
        ServerTransmission {
            config: TransmissionConfig { max_payload, ..config },
            discard_limit: MAX_DISCARD.max(max_payload),
            state: State::Header,
            shutting_down: false,
        }
    }

    /// The server is shutting down: from now on every request but DISC is rejected with NBD_ESHUTDOWN
    /// (module comment, "Server shutdown").
    pub fn shut_down(&mut self) {
        self.shutting_down = true;
    }

    /// Whether [`ServerTransmission::shut_down`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.shutting_down
    }

    /// The configuration in force (after clamping).
    pub fn config(&self) -> &TransmissionConfig {
        &self.config
    }

    /// The encoder for this connection's replies.
    pub fn replies(&self) -> ReplyEncoder {
        if self.config.node {
            ReplyEncoder::node()
        } else {
            ReplyEncoder::new(self.config.structured)
        }
    }

    /// Whether the transmission has ended (after a disconnect or a protocol error).
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// The most unconsumed input [`ServerTransmission::feed`] ever needs at once (invariant 3).
    pub fn max_wanted(&self) -> usize {
        self.config.request_head_len() + self.config.max_payload as usize
    }

    /// Consumes at most one request (and a rejected WRITE's payload before it) from `input`; returns the
    /// bytes consumed and what they were (module comment).
    pub fn feed<'a>(&mut self, input: &'a [u8]) -> Result<(usize, Event<'a>), ProtoError> {
        let r = self.step(input);
        match &r {
            Ok((used, event)) => {
                assert!(*used <= input.len(), "invariant 4: consumed more than the input");
                if let Event::NeedMore { wanted } = event {
                    assert!(*wanted <= self.max_wanted(), "invariant 3: buffer bound");
                }
            }
            Err(_) => self.state = State::Closed,
        }
        r
    }

    fn step<'a>(&mut self, input: &'a [u8]) -> Result<(usize, Event<'a>), ProtoError> {
        let mut used = 0;
        if let State::Discard { remaining } = self.state {
            let n = (remaining as usize).min(input.len());
            used = n;
            let left = remaining - n as u32;
            if left > 0 {
                self.state = State::Discard { remaining: left };
                return Ok((used, Event::NeedMore { wanted: 1 }));
            }
            self.state = State::Header;
        }
        if self.state == State::Closed {
            return Err(ProtoError::Malformed("input after the transmission ended"));
        }
        let rest = &input[used..];
        let head = self.config.request_head_len();
        let Some(header) = RequestHeader::decode(rest)? else {
            return Ok((used, Event::NeedMore { wanted: head }));
        };
        if rest.len() < head {
            return Ok((used, Event::NeedMore { wanted: head }));
        }
        let tag = self.config.node.then(|| {
            NodeTag::from_words(
                u32_at(rest, REQUEST_LEN),
                u32_at(rest, REQUEST_LEN + 4),
                u64_at(rest, REQUEST_LEN + 8),
                u64_at(rest, REQUEST_LEN + 16),
            )
        });
        let kind = match header.command {
            Command::Disc => {
                self.state = State::Closed;
                return Ok((used + head, Event::Disconnect));
            }
            Command::Read => RequestKind::Read,
            Command::Write => RequestKind::Write,
            Command::Flush => RequestKind::Flush,
            Command::Trim => RequestKind::Trim,
            Command::WriteZeroes => RequestKind::WriteZeroes,
            Command::BlockStatus => RequestKind::BlockStatus { one: header.flags & CMD_FLAG_REQ_ONE != 0 },
            Command::Other(c) => {
                let rejection =
                    Rejection { handle: header.handle, command: header.command, reason: Reason::UnknownCommand(c) };
                return Ok((used + head, Event::Reject(rejection)));
            }
        };
        let tag_fault = tag.and_then(|t| t.check_slot(self.config.node_slots).and(t.check_values()).err());
        let shutdown = self.shutting_down.then_some(Reason::ShuttingDown);
        if let Some(reason) = shutdown.or(tag_fault.map(Reason::Tag)).or_else(|| self.check(&header, kind)) {
            if kind == RequestKind::Write && header.length > 0 {
                if header.length > self.discard_limit {
                    return Err(ProtoError::Unrecoverable(header.length));
                }
                self.state = State::Discard { remaining: header.length };
            }
            let rejection = Rejection { handle: header.handle, command: header.command, reason };
            return Ok((used + head, Event::Reject(rejection)));
        }
        // A FLUSH's reserved offset and length are zero (checked).
        let request = Request {
            handle: header.handle,
            kind,
            offset: header.offset,
            length: header.length,
            fua: header.fua(),
            no_hole: header.flags & CMD_FLAG_NO_HOLE != 0,
            tag,
        };
        if kind != RequestKind::Write {
            return Ok((used + head, Event::Request { request, payload: &[] }));
        }
        let whole = head + header.length as usize;
        if rest.len() < whole {
            return Ok((used, Event::NeedMore { wanted: whole }));
        }
        Ok((used + whole, Event::Request { request, payload: &rest[head..whole] }))
    }

    /// Steps 3-8 of the validation (module comment).
    fn check(&self, h: &RequestHeader, kind: RequestKind) -> Option<Reason> {
        let c = &self.config;
        let fua = if c.volatile { 0 } else { CMD_FLAG_FUA };
        let allowed = fua
            | match kind {
                RequestKind::WriteZeroes => CMD_FLAG_NO_HOLE,
                RequestKind::Read if c.structured => CMD_FLAG_DF,
                RequestKind::BlockStatus { .. } => CMD_FLAG_REQ_ONE,
                _ => 0,
            };
        if h.flags & !allowed != 0 {
            return Some(Reason::BadFlags(h.flags & !allowed));
        }
        if kind == RequestKind::Flush {
            if c.volatile {
                return Some(Reason::FlushNotOffered);
            }
            if h.offset != 0 || h.length != 0 {
                return Some(Reason::FlushNotZero { offset: h.offset, length: h.length });
            }
        }
        if kind.writes() && c.read_only {
            return Some(Reason::ReadOnly);
        }
        if matches!(kind, RequestKind::Read | RequestKind::Write) && h.length > c.max_payload {
            return Some(Reason::TooLarge { length: h.length, max: c.max_payload });
        }
        if let RequestKind::BlockStatus { .. } = kind {
            if !c.base_allocation {
                return Some(Reason::NoMetaContext);
            }
            if h.length == 0 {
                return Some(Reason::EmptyBlockStatus);
            }
        }
        let in_range = h.offset.checked_add(h.length as u64).is_some_and(|end| end <= c.size);
        if kind != RequestKind::Flush && !in_range {
            return Some(Reason::OutOfRange { offset: h.offset, length: h.length, size: c.size });
        }
        None
    }
}

/// Encodes the replies of one connection (simple, or structured when negotiated, or simple with a
/// trailer on a storage-node session; module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyEncoder {
    structured: bool,
    node: bool,
}

impl ReplyEncoder {
    /// An encoder for simple replies, or structured ones.
    pub fn new(structured: bool) -> ReplyEncoder {
        ReplyEncoder { structured, node: false }
    }

    /// An encoder for a storage-node session: simple replies, each followed by a [`NodeReplyTrailer`].
    pub fn node() -> ReplyEncoder {
        ReplyEncoder { structured: false, node: true }
    }

    /// Whether replies carry the storage-node trailer.
    pub fn is_node(self) -> bool {
        self.node
    }

    /// Whether replies are structured.
    pub fn structured(self) -> bool {
        self.structured
    }

    /// Bytes a successful reply to `request` has in front of its data: the headroom to leave in the buffer
    /// a READ fills (0 for other requests, whose replies carry no data).
    pub fn headroom(self, request: &Request) -> usize {
        match request.kind {
            RequestKind::Read if self.node => SIMPLE_REPLY_LEN + NODE_REPLY_TRAILER_LEN,
            RequestKind::Read if !self.structured => SIMPLE_REPLY_LEN,
            RequestKind::Read if request.length == 0 => CHUNK_HEADER_LEN,
            RequestKind::Read => CHUNK_HEADER_LEN + 8,
            _ => 0,
        }
    }

    /// Completes the successful reply to `request` in `reply`. For a READ, `reply` must hold
    /// [`ReplyEncoder::headroom`] bytes followed by exactly `request.length` bytes of data: the header is
    /// written into the headroom and the data stays where it is. For other requests the reply is appended
    /// to `reply` (usually empty). On a node session the trailer says "not charged" (phase 0): use
    /// [`ReplyEncoder::success_node`] for what the scheduler dispatched. For a BLOCK_STATUS, the whole
    /// range as data (flags 0, always true): the backend's answer is [`super::Extents::encode`].
    pub fn success(self, request: &Request, reply: &mut Vec<u8>) {
        self.success_node(request, NodeReplyTrailer::default(), reply)
    }

    /// Appends a BLOCK_STATUS's successful reply carrying `extents` for request `handle`: one
    /// BLOCK_STATUS chunk ([`super::Extents::encode`]), or on a storage-node session the simple reply,
    /// trailer and payload of protocol v4 ([`super::Extents::encode_node`]).
    pub fn block_status(self, extents: &super::Extents, handle: u64, reply: &mut Vec<u8>) {
        if self.node {
            extents.encode_node(handle, reply)
        } else {
            extents.encode(handle, reply)
        }
    }

    /// [`ReplyEncoder::success`] with the trailer a node session's reply carries (ignored on other
    /// sessions): the phase and cost of the request's dispatch.
    pub fn success_node(self, request: &Request, trailer: NodeReplyTrailer, reply: &mut Vec<u8>) {
        let handle = request.handle;
        if self.node && matches!(request.kind, RequestKind::BlockStatus { .. }) {
            // Only in a v4 session (the context is implied there): the whole range as data.
            return super::Extents::new(request).encode_node(handle, reply);
        }
        if self.node {
            let mut h = [0u8; SIMPLE_REPLY_LEN];
            write_simple_reply(&mut h, handle, 0);
            let mut t = [0u8; NODE_REPLY_TRAILER_LEN];
            trailer.write(&mut t);
            if request.kind == RequestKind::Read {
                let head = self.headroom(request);
                assert_eq!(reply.len(), head + request.length as usize, "a READ reply is its headroom, then the data");
                reply[..SIMPLE_REPLY_LEN].copy_from_slice(&h);
                reply[SIMPLE_REPLY_LEN..head].copy_from_slice(&t);
            } else {
                reply.extend_from_slice(&h);
                reply.extend_from_slice(&t);
            }
            return;
        }
        match request.kind {
            RequestKind::Read => {
                let head = self.headroom(request);
                assert_eq!(reply.len(), head + request.length as usize, "a READ reply is its headroom, then the data");
                if !self.structured {
                    let h: &mut [u8; SIMPLE_REPLY_LEN] = (&mut reply[..head]).try_into().expect("headroom");
                    write_simple_reply(h, handle, 0);
                } else if request.length == 0 {
                    let h: &mut [u8; CHUNK_HEADER_LEN] = (&mut reply[..head]).try_into().expect("headroom");
                    write_chunk_header(h, handle, REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0);
                } else {
                    let (h, offset) = reply[..head].split_at_mut(CHUNK_HEADER_LEN);
                    let h: &mut [u8; CHUNK_HEADER_LEN] = h.try_into().expect("chunk header");
                    // `length <= MAX_PAYLOAD_LIMIT` (the state machine's check), so this cannot overflow.
                    write_chunk_header(h, handle, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 8 + request.length);
                    offset.copy_from_slice(&request.offset.to_be_bytes());
                }
            }
            // Only with a context, so only with structured replies: the whole range as data (flags 0, always
            // true). The backend's answer goes through `Extents::encode` instead.
            RequestKind::BlockStatus { .. } if self.structured => super::Extents::new(request).encode(handle, reply),
            _ if !self.structured => simple_reply(reply, handle, 0),
            _ => {
                let mut h = [0u8; CHUNK_HEADER_LEN];
                write_chunk_header(&mut h, handle, REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0);
                reply.extend_from_slice(&h);
            }
        }
    }

    /// Appends the error reply to request `handle`: the NBD error of `kind` ([`errno`]), and with
    /// structured replies `message` (cut to [`MAX_ERROR_MESSAGE`] bytes at a character boundary).
    pub fn failure(self, out: &mut Vec<u8>, handle: u64, kind: ErrorKind, message: impl fmt::Display) {
        let error = errno(kind);
        if !self.structured {
            simple_reply(out, handle, error);
            if self.node {
                NodeReplyTrailer::default().encode(out);
            }
            return;
        }
        // Format the message in place, then fill in the lengths: no temporary string.
        let start = out.len();
        let text = start + CHUNK_HEADER_LEN + 6;
        out.resize(text, 0);
        write!(out, "{message}").expect("writing to a Vec cannot fail");
        let mut len = (out.len() - text).min(MAX_ERROR_MESSAGE);
        // The message is UTF-8: cut before a continuation byte never splits a character.
        while len > 0 && text + len < out.len() && out[text + len] & 0xC0 == 0x80 {
            len -= 1;
        }
        out.truncate(text + len);
        let h: &mut [u8; CHUNK_HEADER_LEN] =
            (&mut out[start..start + CHUNK_HEADER_LEN]).try_into().expect("chunk header");
        write_chunk_header(h, handle, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 6 + len as u32);
        out[start + CHUNK_HEADER_LEN..start + CHUNK_HEADER_LEN + 4].copy_from_slice(&error.to_be_bytes());
        out[start + CHUNK_HEADER_LEN + 4..text].copy_from_slice(&(len as u16).to_be_bytes());
    }

    /// Appends the error reply to a rejected request (its reason as the message).
    pub fn rejection(self, out: &mut Vec<u8>, rejection: &Rejection) {
        self.failure(out, rejection.handle, rejection.kind(), rejection);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> TransmissionConfig {
        TransmissionConfig {
            size: 1 << 20,
            read_only: false,
            structured: true,
            max_payload: 4096,
            volatile: false,
            node: false,
            node_slots: 0,
            base_allocation: false,
        }
    }

    fn header(command: Command, flags: u16, handle: u64, offset: u64, length: u32) -> Vec<u8> {
        let mut v = Vec::new();
        RequestHeader { flags, command, handle, offset, length }.encode(&mut v);
        v
    }

    #[test]
    fn a_write_waits_for_its_whole_payload() {
        let mut m = ServerTransmission::new(config());
        let mut input = header(Command::Write, CMD_FLAG_FUA, 7, 512, 8);
        input.extend_from_slice(b"abcd");
        assert_eq!(m.feed(&input).unwrap(), (0, Event::NeedMore { wanted: REQUEST_LEN + 8 }));
        input.extend_from_slice(b"efgh");
        let (used, e) = m.feed(&input).unwrap();
        assert_eq!(used, REQUEST_LEN + 8);
        let want = Request {
            handle: 7,
            kind: RequestKind::Write,
            offset: 512,
            length: 8,
            fua: true,
            no_hole: false,
            tag: None,
        };
        assert_eq!(e, Event::Request { request: want, payload: b"abcdefgh" });
    }

    #[test]
    fn an_oversize_write_is_rejected_then_skipped_as_it_arrives() {
        let mut m = ServerTransmission::new(config());
        let input = header(Command::Write, 0, 1, 0, 10_000);
        let (used, e) = m.feed(&input).unwrap();
        assert_eq!(used, REQUEST_LEN);
        let Event::Reject(r) = e else { panic!("{e:?}") };
        assert_eq!(r.reason, Reason::TooLarge { length: 10_000, max: 4096 });
        assert_eq!(r.kind(), ErrorKind::InvalidRequest);
        // The payload is consumed as it comes, in pieces smaller than the payload.
        for _ in 0..9 {
            assert_eq!(m.feed(&[0u8; 1000]).unwrap(), (1000, Event::NeedMore { wanted: 1 }));
        }
        let mut tail = vec![0u8; 1000];
        tail.extend(header(Command::Flush, 0, 2, 0, 0));
        let (used, e) = m.feed(&tail).unwrap();
        assert_eq!(used, tail.len());
        assert!(matches!(e, Event::Request { request: Request { handle: 2, kind: RequestKind::Flush, .. }, .. }));
    }

    #[test]
    fn a_write_too_long_to_skip_closes() {
        let mut m = ServerTransmission::new(config());
        let e = m.feed(&header(Command::Write, 0, 1, 0, MAX_DISCARD + 1)).unwrap_err();
        assert_eq!(e, ProtoError::Unrecoverable(MAX_DISCARD + 1));
        assert!(m.is_closed());
        assert!(m.feed(&header(Command::Flush, 0, 2, 0, 0)).is_err());
    }

    #[test]
    fn validation_order_and_errors() {
        let ro = TransmissionConfig { read_only: true, ..config() };
        let cases: [(TransmissionConfig, Vec<u8>, Reason, ErrorKind); 7] = [
            (config(), header(Command::Other(42), 0, 1, 0, 0), Reason::UnknownCommand(42), ErrorKind::InvalidRequest),
            (config(), header(Command::Read, 1 << 5, 1, 0, 1), Reason::BadFlags(1 << 5), ErrorKind::InvalidRequest),
            (
                config(),
                header(Command::Read, CMD_FLAG_NO_HOLE, 1, 0, 1),
                Reason::BadFlags(2),
                ErrorKind::InvalidRequest,
            ),
            (ro, header(Command::Trim, 0, 1, 1 << 30, 1), Reason::ReadOnly, ErrorKind::ReadOnly),
            (
                config(),
                header(Command::Read, 0, 1, u64::MAX, 1),
                Reason::OutOfRange { offset: u64::MAX, length: 1, size: 1 << 20 },
                ErrorKind::InvalidRequest,
            ),
            (
                config(),
                header(Command::WriteZeroes, 0, 1, 1 << 20, 1),
                Reason::OutOfRange { offset: 1 << 20, length: 1, size: 1 << 20 },
                ErrorKind::NoSpace,
            ),
            (
                config(),
                header(Command::Read, 0, 1, 0, 4097),
                Reason::TooLarge { length: 4097, max: 4096 },
                ErrorKind::InvalidRequest,
            ),
        ];
        for (cfg, input, reason, kind) in cases {
            let mut m = ServerTransmission::new(cfg);
            match m.feed(&input).unwrap() {
                (REQUEST_LEN, Event::Reject(r)) => {
                    assert_eq!((r.reason, r.kind()), (reason, kind));
                }
                other => panic!("{other:?}"),
            }
        }
        // FUA is accepted everywhere, DF on structured READs, NO_HOLE on zeroing.
        let mut m = ServerTransmission::new(config());
        for input in [
            header(Command::Flush, CMD_FLAG_FUA, 1, 0, 0),
            header(Command::Read, CMD_FLAG_DF | CMD_FLAG_FUA, 2, 0, 4096),
            header(Command::WriteZeroes, CMD_FLAG_NO_HOLE, 3, 0, 1 << 20),
            header(Command::Trim, 0, 4, 0, 1 << 20),
        ] {
            assert!(matches!(m.feed(&input).unwrap(), (REQUEST_LEN, Event::Request { .. })));
        }
        let mut simple = ServerTransmission::new(TransmissionConfig { structured: false, ..config() });
        assert!(matches!(
            simple.feed(&header(Command::Read, CMD_FLAG_DF, 1, 0, 1)).unwrap().1,
            Event::Reject(Rejection { reason: Reason::BadFlags(CMD_FLAG_DF), .. })
        ));
    }

    /// Issue 12: a FLUSH's reserved fields must be zero, and a volatile export (no FLUSH or FUA advertised)
    /// rejects both rather than claim durability.
    #[test]
    fn flush_fields_and_volatile_exports() {
        let mut m = ServerTransmission::new(config());
        for (offset, length) in [(1, 0), (0, 1), (u64::MAX, u32::MAX)] {
            let input = header(Command::Flush, 0, 1, offset, length);
            let (used, e) = m.feed(&input).unwrap();
            assert_eq!(used, REQUEST_LEN);
            let Event::Reject(r) = e else { panic!("{e:?}") };
            assert_eq!((r.reason, r.kind()), (Reason::FlushNotZero { offset, length }, ErrorKind::InvalidRequest));
        }
        let volatile = TransmissionConfig { volatile: true, ..config() };
        let mut m = ServerTransmission::new(volatile);
        let cases = [
            (header(Command::Flush, 0, 1, 0, 0), Reason::FlushNotOffered),
            (header(Command::Write, CMD_FLAG_FUA, 2, 0, 0), Reason::BadFlags(CMD_FLAG_FUA)),
            (header(Command::Trim, CMD_FLAG_FUA, 3, 0, 512), Reason::BadFlags(CMD_FLAG_FUA)),
        ];
        for (input, reason) in cases {
            match m.feed(&input).unwrap() {
                (REQUEST_LEN, Event::Reject(r)) => {
                    assert_eq!((r.reason, r.kind()), (reason, ErrorKind::InvalidRequest))
                }
                other => panic!("{other:?}"),
            }
        }
        let trim = header(Command::Trim, 0, 4, 0, 512);
        let (_, e) = m.feed(&trim).unwrap();
        assert!(matches!(e, Event::Request { .. }), "{e:?}");
        let info = |volatile| ExportInfo {
            name: "m".into(),
            description: String::new(),
            size: 1,
            read_only: false,
            volatile,
            min_block: 1,
        };
        assert_eq!(info(true).transmission_flags() & (TFLAG_SEND_FLUSH | TFLAG_SEND_FUA), 0);
        assert_eq!(
            info(false).transmission_flags() & (TFLAG_SEND_FLUSH | TFLAG_SEND_FUA),
            TFLAG_SEND_FLUSH | TFLAG_SEND_FUA
        );
    }

    /// BLOCK_STATUS: EINVAL without a context (the connection goes on), and with one for length 0 and past
    /// the end; REQ_ONE taken; not bound by the maximum payload; the default success one descriptor of
    /// the whole range as data.
    #[test]
    fn block_status_needs_a_context_and_a_range() {
        let mut m = ServerTransmission::new(config());
        let input = header(Command::BlockStatus, 0, 1, 0, 4096);
        let (used, e) = m.feed(&input).unwrap();
        let Event::Reject(r) = e else { panic!("{e:?}") };
        assert_eq!((used, r.reason, r.kind()), (REQUEST_LEN, Reason::NoMetaContext, ErrorKind::InvalidRequest));
        assert!(matches!(m.feed(&header(Command::Read, 0, 2, 0, 1)).unwrap().1, Event::Request { .. }));
        let mut m = ServerTransmission::new(TransmissionConfig { base_allocation: true, ..config() });
        let cases = [
            (header(Command::BlockStatus, 0, 1, 0, 0), Some(Reason::EmptyBlockStatus)),
            (
                header(Command::BlockStatus, 0, 1, 1 << 20, 1),
                Some(Reason::OutOfRange { offset: 1 << 20, length: 1, size: 1 << 20 }),
            ),
            (header(Command::BlockStatus, CMD_FLAG_DF, 1, 0, 1), Some(Reason::BadFlags(CMD_FLAG_DF))),
            (header(Command::BlockStatus, CMD_FLAG_REQ_ONE | CMD_FLAG_FUA, 1, 0, 1 << 20), None),
        ];
        for (input, reason) in cases {
            match (m.feed(&input).unwrap(), reason) {
                ((REQUEST_LEN, Event::Reject(r)), Some(reason)) => {
                    assert_eq!((r.reason, r.kind()), (reason, ErrorKind::InvalidRequest))
                }
                ((REQUEST_LEN, Event::Request { request, payload }), None) => {
                    assert_eq!(request.kind, RequestKind::BlockStatus { one: true });
                    assert!(payload.is_empty());
                    let mut r = Vec::new();
                    m.replies().success(&request, &mut r);
                    let mut want = Vec::new();
                    let mut p = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
                    p.extend_from_slice(&(1u32 << 20).to_be_bytes());
                    p.extend_from_slice(&0u32.to_be_bytes());
                    structured_chunk(&mut want, 1, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, &[&p]);
                    assert_eq!(r, want);
                }
                (other, _) => panic!("{other:?}"),
            }
        }
        let negotiated = Negotiated { export: 0, structured: false, node: None, base_allocation: true };
        let info = ExportInfo {
            name: "a".into(),
            description: String::new(),
            size: 1,
            read_only: false,
            volatile: false,
            min_block: 1,
        };
        assert!(!TransmissionConfig::new(&info, &negotiated, 1).base_allocation, "only with structured replies");
    }

    #[test]
    fn disconnect_ends_the_transmission() {
        let mut m = ServerTransmission::new(config());
        let mut input = header(Command::Disc, 0, 0, 0, 0);
        input.extend(header(Command::Flush, 0, 1, 0, 0));
        assert_eq!(m.feed(&input).unwrap(), (REQUEST_LEN, Event::Disconnect));
        assert!(m.is_closed());
        assert!(m.feed(&input[REQUEST_LEN..]).is_err());
    }

    #[test]
    fn replies_are_byte_exact() {
        let read = Request {
            handle: 9,
            kind: RequestKind::Read,
            offset: 4096,
            length: 4,
            fua: false,
            no_hole: false,
            tag: None,
        };
        // Simple: 16-byte header, then the data, which stays in place.
        let enc = ReplyEncoder::new(false);
        let mut r = vec![0u8; enc.headroom(&read)];
        r.extend_from_slice(b"data");
        enc.success(&read, &mut r);
        assert_eq!(&r[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&r[4..8], &[0; 4]);
        assert_eq!(&r[8..16], &9u64.to_be_bytes());
        assert_eq!(&r[16..], b"data");
        // Structured: one OFFSET_DATA chunk with DONE: length 8 + 4, the offset, the data.
        let enc = ReplyEncoder::new(true);
        let mut r = vec![0u8; enc.headroom(&read)];
        r.extend_from_slice(b"data");
        enc.success(&read, &mut r);
        let mut want = Vec::new();
        structured_chunk(&mut want, 9, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, &[&4096u64.to_be_bytes(), b"data"]);
        assert_eq!(r, want);
        // A zero-length structured READ and any other success: a NONE chunk.
        let empty = Request { length: 0, ..read };
        let mut r = vec![0u8; enc.headroom(&empty)];
        enc.success(&empty, &mut r);
        let mut want = Vec::new();
        structured_chunk(&mut want, 9, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[]);
        assert_eq!(r, want);
        let mut r = Vec::new();
        enc.success(&Request { kind: RequestKind::Flush, ..read }, &mut r);
        assert_eq!(r, want);
        // Errors: the errno and the message, the same bytes as `structured_error`.
        let mut r = Vec::new();
        enc.failure(&mut r, 9, ErrorKind::NoSpace, "disk full");
        let mut want = Vec::new();
        structured_error(&mut want, 9, ENOSPC, "disk full");
        assert_eq!(r, want);
        let mut r = Vec::new();
        ReplyEncoder::new(false).failure(&mut r, 9, ErrorKind::ReadOnly, "ignored");
        let mut want = Vec::new();
        simple_reply(&mut want, 9, EPERM);
        assert_eq!(r, want);
    }

    #[test]
    fn long_error_messages_are_cut_at_a_character_boundary() {
        let enc = ReplyEncoder::new(true);
        let msg = "é".repeat(MAX_ERROR_MESSAGE); // two bytes each
        let mut r = b"before".to_vec();
        enc.failure(&mut r, 1, ErrorKind::Io, &msg);
        let (h, n) = ReplyHeader::decode(&r[6..]).unwrap().unwrap();
        let ReplyHeader::Chunk { length, kind, .. } = h else { panic!("{h:?}") };
        assert_eq!(kind, REPLY_TYPE_ERROR);
        assert_eq!(r.len(), 6 + n + length as usize);
        let len = u16::from_be_bytes([r[6 + n + 4], r[6 + n + 5]]) as usize;
        assert_eq!(len, MAX_ERROR_MESSAGE);
        assert!(std::str::from_utf8(&r[6 + n + 6..]).is_ok());
        let odd = format!("x{msg}");
        let mut r = Vec::new();
        enc.failure(&mut r, 1, ErrorKind::Io, &odd);
        assert_eq!(r.len(), CHUNK_HEADER_LEN + 6 + MAX_ERROR_MESSAGE - 1, "the split character is dropped");
        assert!(std::str::from_utf8(&r[CHUNK_HEADER_LEN + 6..]).is_ok());
    }

    #[test]
    fn every_error_kind_has_its_errno() {
        let table: Vec<u32> = ErrorKind::ALL.iter().map(|&k| errno(k)).collect();
        assert_eq!(table, vec![EINVAL, EPERM, ENOSPC, ENOMEM, EIO, ESHUTDOWN]);
    }
}
