//! The client's side of transmission: which requests are outstanding, and the replies a server sends to
//! them, decoded from bytes without IO.
//!
//! # Model
//! A client tells [`ClientTransmission`] of each request it sends ([`ClientTransmission::sent`]: its
//! handle, command, offset and length) and feeds it the bytes the server sends
//! ([`ClientTransmission::decode`]); it answers with the bytes it used and, when a request's reply is
//! complete, that request's [`ClientReply`]. With structured replies a READ's answer may come in several
//! chunks (OFFSET_DATA at offsets within the request, OFFSET_HOLE for zeroes, ERROR or ERROR_OFFSET for a
//! failure, NONE to end), as qemu-nbd and nbdkit send them; the decoder assembles them into one buffer
//! and completes the request at the chunk with NBD_REPLY_FLAG_DONE. A BLOCK_STATUS's answer is the
//! NBD_REPLY_TYPE_BLOCK_STATUS chunk of the metadata context the handshake selected (invariant 5).
//!
//! # Invariants
//! 1. Each request sent is completed at most once; a reply is never completed for a handle not sent (a
//!    reply naming one is a protocol error: the stream cannot be read on without knowing its length).
//!    The error says what the handle is, from two numbers and a flag rather than a set of answered
//!    handles (which would grow with the connection): a handle below the lowest or above the highest sent
//!    was never sent; one between them, when every handle was sent right after the one before (as
//!    `rein load`'s client allocates them) and none was forgotten, was answered already (a server that
//!    sends a reply twice); otherwise the error says it cannot tell ([`StrayReply`]).
//! 2. What a reply makes the decoder hold is bounded by the request: a READ's buffer is its length; a
//!    chunk longer than the request allows (data beyond the request's range, an error message beyond
//!    [`MAX_ERROR_MESSAGE`]) is a protocol error, found from its header before its payload is awaited, so
//!    a hostile server cannot make a client wait for or buffer 4 GiB; the pieces the reads' chunks leave
//!    apart are at most [`MAX_READ_PIECES`] in all.
//! 3. A successful structured READ covers the request exactly: chunks inside its range, not overlapping
//!    (the spec's MUST NOT), adding up to its length.
//! 4. The same replies come out however the bytes are split (the decoder is resumable: it consumes
//!    nothing until a whole header, and a whole chunk or simple reply with its data, is there).
//! 5. A BLOCK_STATUS ([`ClientTransmission::set_meta_context`]: the id the handshake's
//!    NBD_OPT_SET_META_CONTEXT got) is answered by one NBD_REPLY_TYPE_BLOCK_STATUS chunk of that context
//!    (chunks of other context ids are skipped, as the spec has a client do; a second one of that
//!    context, none by the DONE flag, or a simple reply without error is a protocol error). The chunk's
//!    length is judged from its header: a context id and whole descriptors, at least one and at most
//!    [`MAX_STATUS_CHUNK_DESCRIPTORS`] (qemu-nbd's own cap, 1 MiB), so a hostile server cannot make the
//!    client wait for or buffer more. Each descriptor is at least one byte; together they stay within the
//!    request (a descriptor starting at or past its end is an error; the last may run past it, as the
//!    newer spec allows, and is cut at the end). Of them the first [`MAX_EXTENTS`] are kept (the prefix
//!    of the range they describe), the reply being their wire bytes.
//!
//! # Deviations
//! A simple reply is accepted for any request, also a READ after structured replies were negotiated (the
//! spec forbids the server that, for READ; accepting it costs nothing, since the request says how many
//! data bytes follow).

use super::{
    u16_at, u32_at, u64_at, Command, ProtoError, ReplyHeader, RequestHeader, StrayReply, CHUNK_HEADER_LEN,
    MAX_ERROR_MESSAGE, MAX_EXTENTS, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, REPLY_TYPE_ERROR,
    REPLY_TYPE_ERROR_OFFSET, REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_OFFSET_HOLE, SIMPLE_REPLY_LEN,
};
use std::collections::{BTreeMap, HashMap};

/// Disjoint pieces the structured replies of all outstanding READs may leave at once (adjacent chunks
/// merge into one piece, so a server sending its chunks in order never nears it).
pub const MAX_READ_PIECES: usize = 65_536;

/// Most descriptors one NBD_REPLY_TYPE_BLOCK_STATUS chunk may carry on the wire (invariant 5): qemu-nbd's
/// own cap (`NBD_MAX_BLOCK_STATUS_EXTENTS`, 1 MiB of descriptors), so a fragmented image's answer from it
/// is read, not refused; of them the first [`MAX_EXTENTS`] are kept.
pub const MAX_STATUS_CHUNK_DESCRIPTORS: usize = 131_072;

/// The descriptors of a BLOCK_STATUS reply as [`ClientReply`] carries them: (length, flags) pairs,
/// consecutive from the request's offset (module comment, invariant 5).
pub fn status_descriptors(data: &[u8]) -> impl Iterator<Item = (u32, u32)> + '_ {
    data.chunks_exact(8).map(|d| (u32_at(d, 0), u32_at(d, 4)))
}

/// A request's answer: a READ's data, a BLOCK_STATUS's descriptors for the selected context (8 bytes
/// each, as on the wire: [`status_descriptors`] reads them), nothing for other commands; or the NBD error
/// number the server answered.
pub type ClientReply = Result<Vec<u8>, u32>;

/// One outstanding request.
#[derive(Debug)]
struct Outstanding {
    offset: u64,
    /// Bytes a READ asks for; 0 for other commands.
    read_len: u32,
    /// A structured READ's data so far (allocated at its first data chunk).
    data: Vec<u8>,
    /// Data bytes the structured chunks covered so far.
    covered: u64,
    /// The ranges they covered (start -> end, relative to `offset`), adjacent ones merged: to refuse
    /// overlap in O(log n) (all requests' together at most [`MAX_READ_PIECES`] entries).
    ranges: BTreeMap<u64, u64>,
    /// The first error a chunk reported.
    error: Option<u32>,
    /// A BLOCK_STATUS (one of length 0 too, which no chunk can answer: invariant 5).
    is_status: bool,
    /// Bytes a BLOCK_STATUS asks about; 0 for other commands.
    status_len: u32,
    /// A BLOCK_STATUS's descriptors for the selected context (wire bytes, at most [`MAX_EXTENTS`]), once
    /// its chunk came.
    status: Option<Vec<u8>>,
}

/// The client's transmission state (module comment).
#[derive(Debug)]
pub struct ClientTransmission {
    structured: bool,
    /// The id the server gave the metadata context asked for (NBD_REP_META_CONTEXT), if it selected one.
    meta_context: Option<u32>,
    max_outstanding: usize,
    outstanding: HashMap<u64, Outstanding>,
    /// Entries of every outstanding request's `ranges` together (invariant 2).
    pieces: usize,
    /// The lowest and the highest handle sent (`None`: none yet), and whether every handle sent was the
    /// one after the one before and none was forgotten (invariant 1's naming).
    lowest: Option<u64>,
    highest: u64,
    consecutive: bool,
}

/// What [`ClientTransmission::decode`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// Not enough bytes for the next header, or for the payload or data its header announces: read at
    /// least up to `wanted` bytes in all (counted from the start of what was given) and call again.
    NeedMore {
        /// Bytes wanted in all, at least one more than given.
        wanted: usize,
    },
    /// A chunk of a structured reply that does not end it was consumed.
    Chunk {
        /// Bytes used.
        used: usize,
    },
    /// A request's reply is complete.
    Reply {
        /// Bytes used.
        used: usize,
        /// The request's handle.
        handle: u64,
        /// Its answer.
        reply: ClientReply,
    },
}

impl ClientTransmission {
    /// A client that negotiated structured replies (`structured`) or not, with at most `max_outstanding`
    /// requests sent and not yet answered.
    pub fn new(structured: bool, max_outstanding: usize) -> ClientTransmission {
        ClientTransmission {
            structured,
            meta_context: None,
            max_outstanding: max_outstanding.max(1),
            outstanding: HashMap::new(),
            pieces: 0,
            lowest: None,
            highest: 0,
            consecutive: true,
        }
    }

    /// The metadata context the handshake selected ([`super::ClientHandshake::meta_context`]): a
    /// BLOCK_STATUS is answered with the descriptors of the chunk with this id; chunks of other ids are
    /// skipped (the spec's rule for contexts the client does not know).
    pub fn set_meta_context(&mut self, id: Option<u32>) {
        self.meta_context = id;
    }

    /// Requests sent and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Records a request about to be sent. Errors: a handle already outstanding, or the bound reached
    /// (the caller waits for a reply first).
    pub fn sent(&mut self, req: &RequestHeader) -> Result<(), ProtoError> {
        if self.outstanding.len() >= self.max_outstanding {
            return Err(ProtoError::Malformed("request beyond the client's outstanding bound"));
        }
        if self.outstanding.contains_key(&req.handle) {
            return Err(ProtoError::Malformed("request with a handle already outstanding"));
        }
        match self.lowest {
            None => {
                self.lowest = Some(req.handle);
                self.highest = req.handle;
            }
            Some(lowest) => {
                self.consecutive &= self.highest.checked_add(1) == Some(req.handle);
                self.lowest = Some(lowest.min(req.handle));
                self.highest = self.highest.max(req.handle);
            }
        }
        let read_len = if req.command == Command::Read { req.length } else { 0 };
        let status_len = if req.command == Command::BlockStatus { req.length } else { 0 };
        self.outstanding.insert(
            req.handle,
            Outstanding {
                offset: req.offset,
                read_len,
                data: Vec::new(),
                covered: 0,
                ranges: BTreeMap::new(),
                error: None,
                is_status: req.command == Command::BlockStatus,
                status_len,
                status: None,
            },
        );
        Ok(())
    }

    /// Forgets a request that was never sent whole (its write failed); a reply naming it later is a
    /// protocol error.
    pub fn forget(&mut self, handle: u64) {
        if self.complete(handle).is_some() {
            // Not answered, and no longer outstanding: a reply naming it is not a second one.
            self.consecutive = false;
        }
    }

    /// Takes `handle`'s request off the outstanding ones (with its pieces).
    fn complete(&mut self, handle: u64) -> Option<Outstanding> {
        let o = self.outstanding.remove(&handle)?;
        self.pieces -= o.ranges.len();
        Some(o)
    }

    /// The error for a reply naming `handle`, which has no request outstanding (invariant 1).
    fn stray(&self, handle: u64) -> ProtoError {
        let why = match self.lowest {
            Some(lowest) if (lowest..=self.highest).contains(&handle) => {
                if self.consecutive {
                    StrayReply::Answered
                } else {
                    StrayReply::Unknown
                }
            }
            _ => StrayReply::NotSent,
        };
        ProtoError::StrayReply { handle, why }
    }

    /// Decodes the next reply or chunk from `buf` (module comment). Errors break the stream: the caller
    /// fails every outstanding request and closes the connection.
    pub fn decode(&mut self, buf: &[u8]) -> Result<ClientEvent, ProtoError> {
        let Some((header, n)) = ReplyHeader::decode(buf)? else {
            let need = if buf.len() >= 4 && u32_at(buf, 0) == super::SIMPLE_REPLY_MAGIC {
                SIMPLE_REPLY_LEN
            } else {
                CHUNK_HEADER_LEN.max(buf.len() + 1)
            };
            return Ok(ClientEvent::NeedMore { wanted: need.max(buf.len() + 1) });
        };
        match header {
            ReplyHeader::Simple { error, handle } => {
                let o = self.outstanding.get(&handle).ok_or_else(|| self.stray(handle))?;
                if error == 0 && o.is_status {
                    // Its descriptors come only in a chunk (invariant 5).
                    return Err(ProtoError::Malformed("block status answered with a simple reply"));
                }
                let len = if error == 0 { o.read_len as usize } else { 0 };
                if buf.len() < n + len {
                    return Ok(ClientEvent::NeedMore { wanted: n + len });
                }
                self.complete(handle);
                let reply = if error == 0 { Ok(buf[n..n + len].to_vec()) } else { Err(error) };
                Ok(ClientEvent::Reply { used: n + len, handle, reply })
            }
            ReplyHeader::Chunk { flags, kind, handle, length } => {
                if !self.structured {
                    return Err(ProtoError::Malformed("structured reply chunk without structured replies"));
                }
                let stray = self.stray(handle);
                let o = self.outstanding.get_mut(&handle).ok_or(stray)?;
                let length = length as usize;
                // Invariant 2: the chunk's length is judged before its payload is awaited.
                check_length(o, kind, length)?;
                if buf.len() < n + length {
                    return Ok(ClientEvent::NeedMore { wanted: n + length });
                }
                let before = o.ranges.len();
                apply_chunk(o, kind, &buf[n..n + length], self.meta_context)?;
                // A chunk adds at most one piece, and merging may remove up to two: `pieces` counts `before`.
                self.pieces = self.pieces + o.ranges.len() - before;
                if self.pieces > MAX_READ_PIECES {
                    return Err(ProtoError::Malformed("read replies in too many separate pieces"));
                }
                let used = n + length;
                if flags & REPLY_FLAG_DONE == 0 {
                    return Ok(ClientEvent::Chunk { used });
                }
                let o = self.complete(handle).expect("looked up above");
                let reply = match o.error {
                    Some(e) => Err(e),
                    None if o.is_status => match o.status {
                        Some(descriptors) => Ok(descriptors),
                        None => return Err(ProtoError::Malformed("block status reply without the context's chunk")),
                    },
                    None if o.covered != o.read_len as u64 => {
                        return Err(ProtoError::Malformed("read reply that does not cover the request"))
                    }
                    None => Ok(o.data),
                };
                Ok(ClientEvent::Reply { used, handle, reply })
            }
        }
    }
}

/// Whether a chunk of `kind` may be `length` bytes long for request `o` (invariant 2).
fn check_length(o: &Outstanding, kind: u16, length: usize) -> Result<(), ProtoError> {
    if kind == REPLY_TYPE_BLOCK_STATUS {
        // Invariant 5: a context id and whole descriptors, at least one, within the wire bound.
        if !o.is_status {
            return Err(ProtoError::Malformed("block status chunk for a request that is not a block status"));
        }
        if length < 12 || !(length - 4).is_multiple_of(8) {
            return Err(ProtoError::Malformed("block status chunk not a context id and whole descriptors"));
        }
        if (length - 4) / 8 > MAX_STATUS_CHUNK_DESCRIPTORS {
            return Err(ProtoError::Malformed("block status chunk with more descriptors than a client takes"));
        }
        return Ok(());
    }
    let ok = match kind {
        REPLY_TYPE_NONE => length == 0,
        REPLY_TYPE_OFFSET_DATA => o.read_len > 0 && length > 8 && length - 8 <= o.read_len as usize,
        REPLY_TYPE_OFFSET_HOLE => o.read_len > 0 && length == 12,
        REPLY_TYPE_ERROR => (6..=6 + MAX_ERROR_MESSAGE).contains(&length),
        REPLY_TYPE_ERROR_OFFSET => (14..=14 + MAX_ERROR_MESSAGE).contains(&length),
        // Unknown error types (bit 15) carry an errno and a message first; unknown others cannot be read.
        k if k & 0x8000 != 0 => (6..=6 + MAX_ERROR_MESSAGE + 64).contains(&length),
        _ => return Err(ProtoError::Malformed("reply chunk of an unknown type")),
    };
    if ok {
        Ok(())
    } else {
        Err(ProtoError::Malformed("reply chunk of a length its type and request do not allow"))
    }
}

/// A BLOCK_STATUS chunk's payload (its length checked: a context id, then at least one whole descriptor)
/// for request `o`, the selected context being `context` (invariant 5).
fn apply_status(o: &mut Outstanding, payload: &[u8], context: Option<u32>) -> Result<(), ProtoError> {
    if Some(u32_at(payload, 0)) != context {
        // A context the client did not select: skipped, as the spec has a client do.
        return Ok(());
    }
    if o.status.is_some() {
        return Err(ProtoError::Malformed("a second block status chunk for the context"));
    }
    let want = o.status_len as u64;
    let mut kept = Vec::with_capacity(8 * ((payload.len() - 4) / 8).min(MAX_EXTENTS));
    let mut covered = 0u64;
    for d in payload[4..].chunks_exact(8) {
        let (len, flags) = (u32_at(d, 0), u32_at(d, 4));
        if len == 0 {
            return Err(ProtoError::Malformed("block status descriptor of length 0"));
        }
        if covered >= want {
            return Err(ProtoError::Malformed("block status descriptors beyond the request's length"));
        }
        // The newer spec lets the last descriptor run past the request: it is cut at the request's end.
        let len = (len as u64).min(want - covered) as u32;
        covered += len as u64;
        if kept.len() < 8 * MAX_EXTENTS {
            kept.extend_from_slice(&len.to_be_bytes());
            kept.extend_from_slice(&flags.to_be_bytes());
        }
    }
    o.status = Some(kept);
    Ok(())
}

/// Applies one whole chunk's payload to its request (invariants 3 and 5).
fn apply_chunk(o: &mut Outstanding, kind: u16, payload: &[u8], context: Option<u32>) -> Result<(), ProtoError> {
    if kind == REPLY_TYPE_BLOCK_STATUS {
        return apply_status(o, payload, context);
    }
    let place = |o: &mut Outstanding, at: u64, len: u64| -> Result<usize, ProtoError> {
        let start = at.checked_sub(o.offset).ok_or(ProtoError::Malformed("read chunk before the request's offset"))?;
        if len == 0 || start.saturating_add(len) > o.read_len as u64 {
            return Err(ProtoError::Malformed("read chunk beyond the request's range"));
        }
        let end = start + len;
        let before = o.ranges.range(..=start).next_back().map(|(&s, &e)| (s, e));
        let after = o.ranges.range(start..).next().map(|(&s, &e)| (s, e));
        if before.is_some_and(|(_, e)| e > start) || after.is_some_and(|(s, _)| s < end) {
            return Err(ProtoError::Malformed("read chunks that overlap"));
        }
        // Merge with the neighbours it touches.
        let mut piece = (start, end);
        if let Some((s, e)) = before.filter(|&(_, e)| e == start) {
            o.ranges.remove(&s);
            piece.0 = s;
            debug_assert_eq!(e, start);
        }
        if let Some((s, e)) = after.filter(|&(s, _)| s == end) {
            o.ranges.remove(&s);
            piece.1 = e;
        }
        o.ranges.insert(piece.0, piece.1);
        o.covered += len;
        if o.data.is_empty() {
            o.data = vec![0; o.read_len as usize];
        }
        Ok(start as usize)
    };
    match kind {
        REPLY_TYPE_NONE => {}
        REPLY_TYPE_OFFSET_DATA => {
            let data = &payload[8..];
            let at = place(o, u64_at(payload, 0), data.len() as u64)?;
            o.data[at..at + data.len()].copy_from_slice(data);
        }
        REPLY_TYPE_OFFSET_HOLE => {
            // The buffer starts zeroed; a hole only counts as covered.
            place(o, u64_at(payload, 0), u32_at(payload, 8) as u64)?;
        }
        _ => {
            // An error chunk: errno, message length, message (then, for ERROR_OFFSET, the offset).
            let errno = u32_at(payload, 0);
            let msg = u16_at(payload, 4) as usize;
            let want = 6 + msg + if kind == REPLY_TYPE_ERROR_OFFSET { 8 } else { 0 };
            if (kind == REPLY_TYPE_ERROR || kind == REPLY_TYPE_ERROR_OFFSET) && payload.len() != want {
                return Err(ProtoError::Malformed("error chunk whose message length disagrees with its length"));
            }
            if errno == 0 {
                return Err(ProtoError::Malformed("error chunk with error number 0"));
            }
            o.error.get_or_insert(errno);
        }
    }
    Ok(())
}
