//! Metadata contexts and block status (the spec's "Metadata querying"): the one context Rein offers,
//! `base:allocation`, how a query selects it, and the descriptors a BLOCK_STATUS reply carries.
//!
//! # Negotiation ([`super::handshake`])
//! - NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT carry an export name and a list of queries
//!   ([`MetaOption::decode`]). Both need structured replies negotiated first (else NBD_REP_ERR_INVALID,
//!   the spec's SHOULD); a malformed option gets NBD_REP_ERR_INVALID, a query longer than
//!   [`MAX_NAME_LEN`] NBD_REP_ERR_TOO_BIG, an export that does not exist or is hidden NBD_REP_ERR_UNKNOWN
//!   (as INFO answers it).
//! - A query selects `base:allocation` if it is that name; in a LIST, `base:` (the namespace alone) lists
//!   every context of the namespace, and an empty list of queries lists every context. In a SET an empty
//!   list selects nothing, and so does a namespace alone (the spec lets a server treat a leaf-less query
//!   as LIST-only). Queries of other namespaces select nothing; that is no error.
//! - The caller says which exports can answer `base:allocation`
//!   ([`super::ServerHandshake::set_block_status`]): for the others both options answer with no context
//!   (only NBD_REP_ACK), which the spec allows ("It is not an error if a `NBD_OPT_SET_META_CONTEXT` option
//!   does not select any metadata context"). `rein serve` and `rein gateway` offer it on every export.
//! - On a storage-node session of version 4 or later (no structured replies, so no option can select it)
//!   `base:allocation` is implied on the exports that answer it, and the reply takes the node protocol's
//!   form ([`Extents::encode_node`]; [`super::node`], "Versioning").
//! - The selection belongs to the export named in the last SET (the spec: "the final time it was sent,
//!   it referred to the same export name that was ultimately selected for transmission phase with no
//!   intervening `NBD_OPT_STARTTLS`"): a later SET replaces it (also one that fails), STARTTLS forgets it,
//!   and a GO or EXPORT_NAME keeps it only if it opens that export (the name resolving to the same
//!   export; the empty name to the default). An INFO, or a GO that fails, in between changes nothing (a
//!   client may GO after an INFO of the same export without a second SET: libnbd from 1.16 on lets its
//!   user skip it, `nbd_set_request_meta_context`). Otherwise the session has no context, and a
//!   BLOCK_STATUS gets EINVAL.
//!
//! # Replies ([`Extents`])
//! One context, so a successful BLOCK_STATUS is one NBD_REPLY_TYPE_BLOCK_STATUS chunk with DONE:
//! [`BASE_ALLOCATION_ID`], then descriptors (a length, the [`STATE_HOLE`] / [`STATE_ZERO`] flags) that
//! start at the request's offset, follow one another, each at least one byte, together at most the
//! request's length (the bound both versions of the spec accept: the newer one lets the last descriptor
//! run past it, the older one does not), at most [`MAX_EXTENTS`] of them, one with REQ_ONE. Neighbours
//! with the same flags are merged. Flags 0 ("allocated, or not known") are always true: a backend that
//! cannot tell reports its range as data, and one that stops early leaves the rest out (the client asks
//! again from where the reply ended).

use super::*;
use crate::nbd::transmission::Request;

/// The one metadata context Rein offers.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Its context id in NBD_REP_META_CONTEXT and BLOCK_STATUS chunks (any value the server picks; not 0, so a
/// reply with a zeroed id is visibly not Rein's).
pub const BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation` flag: the range is not allocated in the backend (a hole).
pub const STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` flag: the range reads as zeroes.
pub const STATE_ZERO: u32 = 1 << 1;
/// Most descriptors in one BLOCK_STATUS reply (8 KiB of them): bounds the reply's size and the backend's
/// work per request (two `lseek`s per descriptor for a file). nbdkit and qemu-nbd cap theirs too; a
/// client asks again from where the reply ended.
pub const MAX_EXTENTS: usize = 1024;
/// Bytes of a BLOCK_STATUS reply with `n` descriptors: chunk header, context id, 8 bytes each.
pub const fn block_status_reply_len(n: usize) -> usize {
    CHUNK_HEADER_LEN + 4 + 8 * n
}

/// The data of NBD_OPT_LIST_META_CONTEXT or NBD_OPT_SET_META_CONTEXT, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaOption<'a> {
    /// The export the contexts are for (lossy UTF-8, as INFO reads names).
    pub export: String,
    /// The queries, as sent.
    pub queries: Vec<&'a [u8]>,
}

/// Why a meta-context option is refused (its error reply and message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaFault {
    /// Lengths that do not add up, or an export name above [`MAX_NAME_LEN`]: NBD_REP_ERR_INVALID.
    Malformed(&'static str),
    /// A query above [`MAX_NAME_LEN`] bytes: NBD_REP_ERR_TOO_BIG.
    QueryTooLong,
}

impl MetaFault {
    /// The option error reply and its message.
    pub fn reply(self) -> (u32, &'static str) {
        match self {
            MetaFault::Malformed(m) => (REP_ERR_INVALID, m),
            MetaFault::QueryTooLong => (REP_ERR_TOO_BIG, "a metadata context query longer than 4096 bytes"),
        }
    }
}

impl<'a> MetaOption<'a> {
    /// Decodes u32 name length, name, u32 query count, then u32 length and query for each; every byte
    /// must be used.
    pub fn decode(data: &'a [u8]) -> Result<MetaOption<'a>, MetaFault> {
        let short = MetaFault::Malformed("meta context option shorter than its lengths say");
        if data.len() < 4 {
            return Err(short);
        }
        let nlen = u32_at(data, 0) as usize;
        if nlen > MAX_NAME_LEN {
            return Err(MetaFault::Malformed("export name longer than 4096 bytes"));
        }
        if data.len() < 4 + nlen + 4 {
            return Err(short);
        }
        let export = String::from_utf8_lossy(&data[4..4 + nlen]).into_owned();
        let count = u32_at(data, 4 + nlen) as usize;
        let mut at = 4 + nlen + 4;
        // Each query takes at least 4 bytes: a count beyond that is malformed before anything is reserved.
        if count > (data.len() - at) / 4 {
            return Err(short);
        }
        let mut queries = Vec::with_capacity(count);
        for _ in 0..count {
            if data.len() < at + 4 {
                return Err(short);
            }
            let qlen = u32_at(data, at) as usize;
            at += 4;
            if qlen > MAX_NAME_LEN {
                return Err(MetaFault::QueryTooLong);
            }
            if data.len() < at + qlen {
                return Err(short);
            }
            queries.push(&data[at..at + qlen]);
            at += qlen;
        }
        if at != data.len() {
            return Err(MetaFault::Malformed("bytes after the last meta context query"));
        }
        Ok(MetaOption { export, queries })
    }

    /// Whether the queries select `base:allocation`: for a LIST (`list`) also by the namespace alone
    /// (`base:`) or an empty list (module comment).
    pub fn selects_base_allocation(&self, list: bool) -> bool {
        if self.queries.is_empty() {
            return list;
        }
        self.queries.iter().any(|q| *q == BASE_ALLOCATION.as_bytes() || (list && *q == b"base:"))
    }

    /// Appends the option: the encoding [`MetaOption::decode`] reads.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.export.len() as u32).to_be_bytes());
        out.extend_from_slice(self.export.as_bytes());
        out.extend_from_slice(&(self.queries.len() as u32).to_be_bytes());
        for q in &self.queries {
            out.extend_from_slice(&(q.len() as u32).to_be_bytes());
            out.extend_from_slice(q);
        }
    }
}

/// The descriptors of one BLOCK_STATUS reply, built as the backend walks the range (module comment):
/// [`Extents::push`] what lies at [`Extents::next_offset`] until it returns false.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extents {
    offset: u64,
    length: u32,
    max: usize,
    covered: u64,
    /// (length, flags), consecutive from `offset`.
    descriptors: Vec<(u32, u32)>,
}

impl Extents {
    /// Descriptors for a BLOCK_STATUS `request` (its offset and length; one descriptor at most with
    /// REQ_ONE, else [`MAX_EXTENTS`]).
    pub fn new(request: &Request) -> Extents {
        let one = matches!(request.kind, transmission::RequestKind::BlockStatus { one: true });
        Extents {
            offset: request.offset,
            length: request.length,
            max: if one { 1 } else { MAX_EXTENTS },
            covered: 0,
            descriptors: Vec::new(),
        }
    }

    /// Where the next range pushed starts.
    pub fn next_offset(&self) -> u64 {
        self.offset + self.covered
    }

    /// Bytes of the request not described yet.
    pub fn remaining(&self) -> u64 {
        self.length as u64 - self.covered
    }

    /// Describes the next `len` bytes (from [`Extents::next_offset`]) with `flags`: cut to what remains,
    /// merged into the last descriptor if it has the same flags. Returns whether more may be pushed: false
    /// once the request is covered, or once a range with other flags than the last came when the
    /// descriptors were [`MAX_EXTENTS`] already (one with REQ_ONE), that range left out. A zero `len`
    /// changes nothing.
    pub fn push(&mut self, len: u64, flags: u32) -> bool {
        let len = len.min(self.remaining());
        if len > 0 {
            let merge = self.descriptors.last().is_some_and(|&(_, f)| f == flags);
            if merge {
                // Within the request's u32 length, so the sum fits.
                self.descriptors.last_mut().expect("a last descriptor").0 += len as u32;
            } else if self.descriptors.len() < self.max {
                self.descriptors.push((len as u32, flags));
            } else {
                return false;
            }
            self.covered += len;
        }
        self.wants_more()
    }

    /// Whether part of the request is not described yet.
    pub fn wants_more(&self) -> bool {
        self.remaining() > 0
    }

    /// The descriptors so far: (length, flags), consecutive from the request's offset.
    pub fn descriptors(&self) -> &[(u32, u32)] {
        &self.descriptors
    }

    /// Appends the reply: one NBD_REPLY_TYPE_BLOCK_STATUS chunk with DONE for request `handle`. With no
    /// descriptor pushed (a zero-length request cannot get here: it is rejected), the whole range as data,
    /// flags 0, which is always true.
    pub fn encode(&self, handle: u64, out: &mut Vec<u8>) {
        let whole = [(self.length, 0)];
        let descriptors = self.wire(&whole);
        let len = 4 + 8 * descriptors.len() as u32;
        let mut h = [0u8; CHUNK_HEADER_LEN];
        write_chunk_header(&mut h, handle, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, len);
        out.extend_from_slice(&h);
        out.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
        for (l, f) in descriptors {
            out.extend_from_slice(&l.to_be_bytes());
            out.extend_from_slice(&f.to_be_bytes());
        }
    }

    /// Appends the reply on a storage-node session of version 4 or later ([`super::node`], "Versioning"):
    /// the simple reply header, a trailer with no phase (not scheduled), then the descriptors as
    /// [`super::encode_node_extents`] writes them; with none pushed, the whole range as data.
    pub fn encode_node(&self, handle: u64, out: &mut Vec<u8>) {
        let mut h = [0u8; SIMPLE_REPLY_LEN];
        write_simple_reply(&mut h, handle, 0);
        out.extend_from_slice(&h);
        NodeReplyTrailer::default().encode(out);
        let whole = [(self.length, 0)];
        super::encode_node_extents(self.wire(&whole), out);
    }

    /// The descriptors a reply carries: those pushed, or `whole` if none was.
    fn wire<'a>(&'a self, whole: &'a [(u32, u32)]) -> &'a [(u32, u32)] {
        if self.descriptors.is_empty() {
            whole
        } else {
            &self.descriptors
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbd::transmission::RequestKind;

    fn request(offset: u64, length: u32, one: bool) -> Request {
        Request {
            handle: 5,
            kind: RequestKind::BlockStatus { one },
            offset,
            length,
            fua: false,
            no_hole: false,
            tag: None,
        }
    }

    fn option(export: &str, queries: &[&[u8]]) -> Vec<u8> {
        let mut d = Vec::new();
        MetaOption { export: export.into(), queries: queries.to_vec() }.encode(&mut d);
        d
    }

    #[test]
    fn options_decode_and_select() {
        let d = option("a", &[b"base:allocation", b"qemu:dirty-bitmap:x"]);
        let o = MetaOption::decode(&d).unwrap();
        assert_eq!(o.export, "a");
        assert_eq!(o.queries.len(), 2);
        assert!(o.selects_base_allocation(false) && o.selects_base_allocation(true));
        let ns = option("a", &[b"base:"]);
        let o = MetaOption::decode(&ns).unwrap();
        assert!(o.selects_base_allocation(true), "LIST base: lists the base contexts");
        assert!(!o.selects_base_allocation(false), "SET base: selects nothing");
        let none = option("", &[]);
        let o = MetaOption::decode(&none).unwrap();
        assert!(o.selects_base_allocation(true), "an empty LIST lists everything");
        assert!(!o.selects_base_allocation(false), "an empty SET selects nothing");
        let other = option("a", &[b"base:allocation2", b"BASE:allocation", b"qemu:"]);
        assert!(!MetaOption::decode(&other).unwrap().selects_base_allocation(true));
    }

    #[test]
    fn malformed_options_are_named() {
        let good = option("a", &[b"base:allocation"]);
        for cut in 0..good.len() {
            assert!(matches!(MetaOption::decode(&good[..cut]), Err(MetaFault::Malformed(_))), "cut at {cut}");
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(MetaOption::decode(&long), Err(MetaFault::Malformed("bytes after the last meta context query")));
        let q = vec![b'x'; MAX_NAME_LEN + 1];
        assert_eq!(MetaOption::decode(&option("a", &[&q])), Err(MetaFault::QueryTooLong));
        assert_eq!(MetaFault::QueryTooLong.reply().0, REP_ERR_TOO_BIG);
        // A huge query count with no queries behind it is refused before anything is reserved.
        let mut d = 0u32.to_be_bytes().to_vec();
        d.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(MetaOption::decode(&d), Err(MetaFault::Malformed(_))));
    }

    #[test]
    fn extents_cover_from_the_offset_merge_and_stop_at_the_bounds() {
        let mut e = Extents::new(&request(4096, 10_000, false));
        assert_eq!(e.next_offset(), 4096);
        assert!(e.push(1000, 0));
        assert!(e.push(1000, 0), "same flags merge");
        assert!(e.push(0, STATE_HOLE), "nothing pushed");
        assert!(e.push(3000, STATE_HOLE | STATE_ZERO));
        assert_eq!(e.next_offset(), 4096 + 5000);
        assert!(!e.push(1 << 40, 0), "cut at the request's end");
        assert_eq!(e.descriptors(), &[(2000, 0), (3000, 3), (5000, 0)]);
        let mut out = Vec::new();
        e.encode(5, &mut out);
        let mut want = Vec::new();
        let mut payload = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
        for (l, f) in [(2000u32, 0u32), (3000, 3), (5000, 0)] {
            payload.extend_from_slice(&l.to_be_bytes());
            payload.extend_from_slice(&f.to_be_bytes());
        }
        structured_chunk(&mut want, 5, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, &[&payload]);
        assert_eq!(out, want);
        assert_eq!(out.len(), block_status_reply_len(3));
    }

    #[test]
    fn req_one_gives_one_descriptor_and_the_cap_holds() {
        let mut e = Extents::new(&request(0, 10_000, true));
        assert!(e.push(100, 0));
        assert!(e.push(100, 0), "the same flags extend the one descriptor");
        assert!(!e.push(100, STATE_HOLE), "a second descriptor is refused");
        assert_eq!(e.descriptors(), &[(200, 0)]);
        assert_eq!(e.next_offset(), 200);
        let mut e = Extents::new(&request(0, u32::MAX, false));
        let mut n = 0;
        while e.push(1, (n % 2) as u32) {
            n += 1;
        }
        assert_eq!(e.descriptors().len(), MAX_EXTENTS);
        assert_eq!(e.next_offset(), MAX_EXTENTS as u64);
        // Nothing pushed: the whole range as data.
        let mut out = Vec::new();
        Extents::new(&request(0, 77, false)).encode(1, &mut out);
        assert_eq!(&out[CHUNK_HEADER_LEN + 4..], &[0, 0, 0, 77, 0, 0, 0, 0]);
    }
}
