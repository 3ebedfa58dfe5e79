//! The client's side of transmission (`rein_proto::nbd::client`): replies as rein serve, qemu-nbd and
//! nbdkit send them (simple; one OFFSET_DATA chunk; data and holes in any order then NONE; errors), the
//! bounds a hostile server runs into (a chunk longer than its request, judged from its header alone; an
//! error message past the limit; overlap; a reply that does not cover its read; unknown handles), and
//! generated structured replies split at random, against the data they were cut from. The contracts are
//! `rein_proto::harness::client_replies`', which the fuzz target checks too.
use proptest::prelude::*;
use rein_proto::harness::{self, SentRequest};
use rein_proto::nbd::*;

fn chunk(out: &mut Vec<u8>, handle: u64, flags: u16, kind: u16, payload: &[u8]) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

fn data(out: &mut Vec<u8>, handle: u64, done: bool, offset: u64, bytes: &[u8]) {
    let mut p = offset.to_be_bytes().to_vec();
    p.extend_from_slice(bytes);
    chunk(out, handle, if done { REPLY_FLAG_DONE } else { 0 }, REPLY_TYPE_OFFSET_DATA, &p);
}

fn hole(out: &mut Vec<u8>, handle: u64, done: bool, offset: u64, len: u32) {
    let mut p = offset.to_be_bytes().to_vec();
    p.extend_from_slice(&len.to_be_bytes());
    chunk(out, handle, if done { REPLY_FLAG_DONE } else { 0 }, REPLY_TYPE_OFFSET_HOLE, &p);
}

fn error(out: &mut Vec<u8>, handle: u64, errno: u32, msg: &str) {
    let mut p = errno.to_be_bytes().to_vec();
    p.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    p.extend_from_slice(msg.as_bytes());
    chunk(out, handle, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, &p);
}

fn read(offset: u64, length: u32) -> SentRequest {
    SentRequest { read: true, status: false, offset, length }
}

fn write(length: u32) -> SentRequest {
    SentRequest { read: false, status: false, offset: 0, length }
}

/// Runs the stream whole and byte by byte (the harness checks they agree with other splits too).
fn run(structured: bool, reqs: &[SentRequest], stream: &[u8]) -> (Vec<(u64, ClientReply)>, Option<String>) {
    let whole = harness::replies_run(structured, reqs, stream, &[stream.len().max(1)]);
    let bytes = harness::replies_run(structured, reqs, stream, &[1]);
    assert_eq!(whole, bytes, "whole and byte by byte");
    whole
}

#[test]
fn simple_replies_answer_reads_with_their_data_and_writes_with_none() {
    let mut s = Vec::new();
    simple_reply(&mut s, 2, 0);
    simple_reply(&mut s, 1, 0);
    s.extend_from_slice(&[7; 5]);
    simple_reply(&mut s, 3, EIO);
    let (replies, end) = run(false, &[read(0, 5), write(9), read(0, 100)], &s);
    assert_eq!(replies, vec![(2, Ok(vec![])), (1, Ok(vec![7; 5])), (3, Err(EIO))]);
    assert_eq!(end, None);
}

#[test]
fn a_read_assembles_from_data_and_holes_in_any_order_then_none() {
    // qemu-nbd and nbdkit send data chunks, holes, then a NONE chunk with DONE.
    let mut s = Vec::new();
    data(&mut s, 1, false, 4096 + 6, b"world");
    hole(&mut s, 1, false, 4096 + 11, 4);
    data(&mut s, 1, false, 4096, b"hello ");
    chunk(&mut s, 1, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[]);
    let (replies, end) = run(true, &[read(4096, 15)], &s);
    assert_eq!(replies, vec![(1, Ok(b"hello world\0\0\0\0".to_vec()))]);
    assert_eq!(end, None);
    // A single data chunk with DONE, as rein serve sends it.
    let mut s = Vec::new();
    data(&mut s, 1, true, 0, b"abc");
    assert_eq!(run(true, &[read(0, 3)], &s).0, vec![(1, Ok(b"abc".to_vec()))]);
    // A write answered with NONE, and a read that is all hole.
    let mut s = Vec::new();
    chunk(&mut s, 1, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[]);
    hole(&mut s, 2, true, 0, 8);
    assert_eq!(run(true, &[write(1), read(0, 8)], &s).0, vec![(1, Ok(vec![])), (2, Ok(vec![0; 8]))]);
}

#[test]
fn an_error_chunk_fails_the_request_and_the_stream_goes_on() {
    let mut s = Vec::new();
    data(&mut s, 1, false, 0, b"ab");
    error(&mut s, 1, EIO, "disk on fire");
    error(&mut s, 2, ENOSPC, "");
    data(&mut s, 3, true, 0, b"z");
    let (replies, end) = run(true, &[read(0, 4), write(1), read(0, 1)], &s);
    assert_eq!(replies, vec![(1, Err(EIO)), (2, Err(ENOSPC)), (3, Ok(b"z".to_vec()))]);
    assert_eq!(end, None);
}

/// A chunk is judged by its header: the decoder neither waits for nor buffers a payload its request
/// does not allow.
#[test]
fn a_chunk_longer_than_its_request_is_refused_from_its_header() {
    let mut c = ClientTransmission::new(true, 4);
    c.sent(&RequestHeader { flags: 0, command: Command::Read, handle: 9, offset: 0, length: 4096 }).unwrap();
    // 4 GiB - 1 of "data" announced; only the header is there.
    let mut h = Vec::new();
    h.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    h.extend_from_slice(&REPLY_TYPE_OFFSET_DATA.to_be_bytes());
    h.extend_from_slice(&9u64.to_be_bytes());
    h.extend_from_slice(&u32::MAX.to_be_bytes());
    let e = c.decode(&h).unwrap_err();
    assert!(e.to_string().contains("length"), "{e}");
    // One byte more than the request, too.
    let mut c = ClientTransmission::new(true, 4);
    c.sent(&RequestHeader { flags: 0, command: Command::Read, handle: 9, offset: 0, length: 4096 }).unwrap();
    h[16..20].copy_from_slice(&(8 + 4097u32).to_be_bytes());
    assert!(c.decode(&h).is_err());
    h[16..20].copy_from_slice(&(8 + 4096u32).to_be_bytes());
    assert_eq!(c.decode(&h).unwrap(), ClientEvent::NeedMore { wanted: 20 + 8 + 4096 });
}

/// What a case is, what the error must say, structured replies, the requests sent, the server's bytes.
type Case = (&'static str, &'static str, bool, Vec<SentRequest>, Vec<u8>);

#[test]
fn what_a_hostile_server_sends_is_a_protocol_error() {
    let cases: Vec<Case> = vec![
        ("simple reply for a handle not sent", "handle not sent", false, vec![write(1)], {
            let mut s = Vec::new();
            simple_reply(&mut s, 7, 0);
            s
        }),
        ("chunk without structured replies", "without structured", false, vec![read(0, 1)], {
            let mut s = Vec::new();
            data(&mut s, 1, true, 0, b"x");
            s
        }),
        ("data before the request's offset", "before the request", true, vec![read(100, 4)], {
            let mut s = Vec::new();
            data(&mut s, 1, true, 99, b"xxxx");
            s
        }),
        ("data past the request's end", "beyond the request", true, vec![read(0, 4)], {
            let mut s = Vec::new();
            data(&mut s, 1, true, 2, b"xxx");
            s
        }),
        ("overlapping chunks", "overlap", true, vec![read(0, 4)], {
            let mut s = Vec::new();
            // They add up to the request's length: only the overlap is wrong.
            data(&mut s, 1, false, 0, b"xx");
            data(&mut s, 1, true, 1, b"yy");
            s
        }),
        ("a read not covered", "does not cover", true, vec![read(0, 4)], {
            let mut s = Vec::new();
            data(&mut s, 1, true, 0, b"xxx");
            s
        }),
        ("data for a write", "do not allow", true, vec![write(4)], {
            let mut s = Vec::new();
            data(&mut s, 1, true, 0, b"xxxx");
            s
        }),
        ("an error message past the limit", "do not allow", true, vec![write(1)], {
            let mut s = Vec::new();
            error(&mut s, 1, EIO, &"x".repeat(MAX_ERROR_MESSAGE + 1));
            s
        }),
        ("an error chunk with errno 0", "error number 0", true, vec![write(1)], {
            let mut s = Vec::new();
            error(&mut s, 1, 0, "fine");
            s
        }),
        ("a NONE chunk with a payload", "do not allow", true, vec![write(1)], {
            let mut s = Vec::new();
            chunk(&mut s, 1, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[0]);
            s
        }),
        ("an unknown chunk type", "unknown type", true, vec![write(1)], {
            let mut s = Vec::new();
            chunk(&mut s, 1, REPLY_FLAG_DONE, 77, &[]);
            s
        }),
        ("a second reply to one request", "a second reply for handle 1, already answered", false, vec![write(1)], {
            let mut s = Vec::new();
            simple_reply(&mut s, 1, 0);
            simple_reply(&mut s, 1, 0);
            s
        }),
        ("a chunk after a request's last", "a second reply for handle 1, already answered", true, vec![write(1)], {
            let mut s = Vec::new();
            chunk(&mut s, 1, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[]);
            chunk(&mut s, 1, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[]);
            s
        }),
        (
            "a reply for a handle above those sent",
            "a reply for handle 3, a handle not sent",
            false,
            vec![write(1), write(1)],
            {
                let mut s = Vec::new();
                simple_reply(&mut s, 3, 0);
                s
            },
        ),
    ];
    for (what, says, structured, reqs, stream) in cases {
        let (_, end) = run(structured, &reqs, &stream);
        let end = end.unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(end.contains(says), "{what}: {end}");
    }
}

#[test]
fn sent_requests_are_bounded_and_distinct() {
    let mut c = ClientTransmission::new(false, 2);
    let h = |handle| RequestHeader { flags: 0, command: Command::Flush, handle, offset: 0, length: 0 };
    c.sent(&h(1)).unwrap();
    assert!(c.sent(&h(1)).is_err(), "a handle twice");
    c.sent(&h(2)).unwrap();
    assert!(c.sent(&h(3)).is_err(), "beyond the bound");
    c.forget(2);
    c.sent(&h(3)).unwrap();
    assert_eq!(c.outstanding(), 2);
    let mut s = Vec::new();
    simple_reply(&mut s, 2, 0);
    let e = c.decode(&s).unwrap_err().to_string();
    assert!(!e.contains("already answered"), "a forgotten request was never answered: {e}");
}

/// A reply for a handle with no request outstanding is named by what the decoder can know: with handles
/// sent one after another (n, n + 1, ...), one among those sent was answered already (a second reply, as
/// a server that repeats its replies sends it: it was "a handle not sent"), one outside them was never
/// sent; with handles sent otherwise (out of order, or with gaps) it cannot tell which.
#[test]
fn a_stray_reply_is_named_a_second_reply_when_handles_follow_each_other() {
    let h = |handle| RequestHeader { flags: 0, command: Command::Flush, handle, offset: 0, length: 0 };
    let reply = |handle| {
        let mut s = Vec::new();
        simple_reply(&mut s, handle, 0);
        s
    };
    let mut c = ClientTransmission::new(false, 4);
    for handle in [5, 6, 7] {
        c.sent(&h(handle)).unwrap();
    }
    assert!(matches!(c.decode(&reply(6)), Ok(ClientEvent::Reply { handle: 6, .. })));
    assert_eq!(c.decode(&reply(6)).unwrap_err().to_string(), "a second reply for handle 6, already answered");
    // Above the highest handle sent, or below the first: never sent.
    assert_eq!(c.decode(&reply(8)).unwrap_err().to_string(), "a reply for handle 8, a handle not sent");
    assert_eq!(c.decode(&reply(4)).unwrap_err().to_string(), "a reply for handle 4, a handle not sent");
    // With a gap (or out of order): no claim either way.
    for order in [[5, 6, 9], [7, 6, 5]] {
        let mut c = ClientTransmission::new(false, 4);
        for handle in order {
            c.sent(&h(handle)).unwrap();
        }
        assert!(matches!(c.decode(&reply(6)), Ok(ClientEvent::Reply { handle: 6, .. })));
        assert_eq!(
            c.decode(&reply(6)).unwrap_err().to_string(),
            "a reply for handle 6, which has no request outstanding (never sent, or answered already)",
            "{order:?}"
        );
    }
}

/// A read cut into pieces at random points, each piece sent as data or (if it is all zero) as a hole,
/// in a random order, the last one with DONE or followed by NONE.
fn cut_read() -> impl Strategy<Value = (Vec<u8>, Vec<usize>, Vec<bool>, u64, bool)> {
    (1usize..600, any::<u64>(), any::<bool>()).prop_flat_map(|(len, seed, trailing_none)| {
        (
            proptest::collection::vec(prop_oneof![Just(0u8), any::<u8>()], len),
            proptest::collection::vec(1usize..len.max(2), 0..6),
            proptest::collection::vec(any::<bool>(), 8),
            Just(seed),
            Just(trailing_none),
        )
    })
}

proptest! {
    #[test]
    fn generated_structured_reads_come_back_whole_however_split(
        (bytes, cuts, holes, seed, trailing_none) in cut_read(),
        sizes in proptest::collection::vec(1usize..64, 1..6),
    ) {
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < bytes.len()).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort();
        cuts.dedup();
        let mut pieces: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
        // A seeded shuffle.
        let mut x = seed | 1;
        for i in (1..pieces.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            pieces.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let base = 1 << 20;
        let mut s = Vec::new();
        for (k, &(a, b)) in pieces.iter().enumerate() {
            let done = !trailing_none && k + 1 == pieces.len();
            if holes[k % holes.len()] && bytes[a..b].iter().all(|&v| v == 0) {
                hole(&mut s, 1, done, base + a as u64, (b - a) as u32);
            } else {
                data(&mut s, 1, done, base + a as u64, &bytes[a..b]);
            }
        }
        if trailing_none {
            chunk(&mut s, 1, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[]);
        }
        let reqs = [read(base, bytes.len() as u32)];
        let (replies, end) = harness::replies_run(true, &reqs, &s, &sizes);
        prop_assert_eq!(end, None);
        prop_assert_eq!(replies, vec![(1, Ok(bytes))]);
    }

    #[test]
    fn random_input_keeps_the_contracts(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        harness::client_replies(&data);
    }
}

/// Disjoint pieces are bounded over all outstanding reads: a server that answers every other byte of
/// many reads runs into the bound (a protocol error), in-order chunks merge and never do.
#[test]
fn the_pieces_of_scattered_chunks_are_bounded() {
    let len = 4096u32;
    let reads = MAX_READ_PIECES / (len as usize / 2) + 1;
    let mut c = ClientTransmission::new(true, reads);
    let mut s = Vec::new();
    for h in 0..reads as u64 {
        c.sent(&RequestHeader { flags: 0, command: Command::Read, handle: h, offset: 0, length: len }).unwrap();
        for at in (0..len as u64).step_by(2) {
            data(&mut s, h, false, at, b"x");
        }
    }
    let mut at = 0;
    let end = loop {
        match c.decode(&s[at..]) {
            Ok(ClientEvent::Chunk { used }) => at += used,
            Ok(other) => panic!("{other:?}"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(end.contains("too many separate pieces"), "{end}");
    // In order, one piece per read however many chunks: 4,096 one-byte chunks complete the read.
    let mut c = ClientTransmission::new(true, 1);
    c.sent(&RequestHeader { flags: 0, command: Command::Read, handle: 1, offset: 0, length: len }).unwrap();
    let mut s = Vec::new();
    for at in 0..len as u64 {
        data(&mut s, 1, at + 1 == len as u64, at, b"y");
    }
    let (mut at, mut done) = (0, None);
    while done.is_none() {
        match c.decode(&s[at..]).unwrap() {
            ClientEvent::Chunk { used } => at += used,
            ClientEvent::Reply { reply, .. } => done = Some(reply),
            ClientEvent::NeedMore { .. } => panic!("all there"),
        }
    }
    assert_eq!(done, Some(Ok(vec![b'y'; len as usize])));
}

fn status(offset: u64, length: u32) -> SentRequest {
    SentRequest { read: false, status: true, offset, length }
}

/// An NBD_REPLY_TYPE_BLOCK_STATUS chunk: the context id, then (length, flags) descriptors.
fn status_chunk(out: &mut Vec<u8>, handle: u64, done: bool, context: u32, descriptors: &[(u32, u32)]) {
    let mut p = context.to_be_bytes().to_vec();
    for (l, f) in descriptors {
        p.extend_from_slice(&l.to_be_bytes());
        p.extend_from_slice(&f.to_be_bytes());
    }
    chunk(out, handle, if done { REPLY_FLAG_DONE } else { 0 }, REPLY_TYPE_BLOCK_STATUS, &p);
}

fn wire(descriptors: &[(u32, u32)]) -> Vec<u8> {
    descriptors.iter().flat_map(|(l, f)| [l.to_be_bytes(), f.to_be_bytes()].concat()).collect()
}

/// BLOCK_STATUS answers as qemu-nbd and nbdkit send them: the selected context's chunk with DONE (its
/// descriptors the reply, byte-exact), or that chunk then NONE with DONE; another context's chunk skipped;
/// the last descriptor running past the request cut at its end; an error chunk failing the request. The
/// harness feeds every stream whole, byte by byte and in seeded pieces (`run`). Seen failing without the
/// block status decoding (a BLOCK_STATUS chunk was "a reply chunk of an unknown type").
#[test]
fn block_status_chunks_answer_with_the_contexts_descriptors() {
    let id = BASE_ALLOCATION_ID;
    let mut s = Vec::new();
    status_chunk(&mut s, 1, true, id, &[(4096, 0), (8192, STATE_HOLE | STATE_ZERO)]);
    status_chunk(&mut s, 2, false, id + 1, &[(1, 0)]);
    status_chunk(&mut s, 2, false, id, &[(100, 3)]);
    chunk(&mut s, 2, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[]);
    status_chunk(&mut s, 3, true, id, &[(10, 0), (1 << 30, 3)]);
    error(&mut s, 4, EIO, "no map");
    let reqs = [status(0, 12_288), status(0, 200), status(4096, 20), status(0, 4096)];
    let (replies, end) = run(true, &reqs, &s);
    assert_eq!(end, None);
    assert_eq!(
        replies,
        vec![
            (1, Ok(wire(&[(4096, 0), (8192, 3)]))),
            (2, Ok(wire(&[(100, 3)]))),
            (3, Ok(wire(&[(10, 0), (10, 3)]))),
            (4, Err(EIO)),
        ]
    );
    assert_eq!(status_descriptors(&wire(&[(5, 1), (6, 2)])).collect::<Vec<_>>(), vec![(5, 1), (6, 2)]);
}

/// A chunk of more descriptors than MAX_EXTENTS (within the wire bound) is read; its first MAX_EXTENTS
/// are kept. A chunk above the wire bound is refused from its header alone.
#[test]
fn block_status_keeps_max_extents_and_refuses_a_huge_chunk_from_its_header() {
    let n = MAX_EXTENTS + 5;
    let descriptors: Vec<(u32, u32)> = (0..n).map(|i| (1, (i % 2) as u32)).collect();
    let mut s = Vec::new();
    status_chunk(&mut s, 1, true, BASE_ALLOCATION_ID, &descriptors);
    let (replies, end) = run(true, &[status(0, n as u32)], &s);
    assert_eq!(end, None);
    assert_eq!(replies, vec![(1, Ok(wire(&descriptors[..MAX_EXTENTS])))]);
    let mut c = ClientTransmission::new(true, 1);
    c.set_meta_context(Some(BASE_ALLOCATION_ID));
    c.sent(&RequestHeader { flags: 0, command: Command::BlockStatus, handle: 1, offset: 0, length: u32::MAX }).unwrap();
    let mut h = Vec::new();
    chunk(&mut h, 1, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, &[]);
    h[16..20].copy_from_slice(&(4 + 8 * (MAX_STATUS_CHUNK_DESCRIPTORS as u32 + 1)).to_be_bytes());
    let e = c.decode(&h).unwrap_err().to_string();
    assert!(e.contains("more descriptors than a client takes"), "{e}");
    h[16..20].copy_from_slice(&(4 + 8 * MAX_STATUS_CHUNK_DESCRIPTORS as u32).to_be_bytes());
    assert_eq!(c.decode(&h).unwrap(), ClientEvent::NeedMore { wanted: 20 + 4 + 8 * MAX_STATUS_CHUNK_DESCRIPTORS });
}

/// Block status replies that break the protocol, each named.
#[test]
fn malformed_block_status_replies_are_named() {
    let id = BASE_ALLOCATION_ID;
    let cases: Vec<Case> = vec![
        ("a chunk for a READ", "not a block status", true, vec![read(0, 10)], {
            let mut s = Vec::new();
            status_chunk(&mut s, 1, true, id, &[(10, 0)]);
            s
        }),
        ("no descriptor", "not a context id and whole descriptors", true, vec![status(0, 10)], {
            let mut s = Vec::new();
            status_chunk(&mut s, 1, true, id, &[]);
            s
        }),
        ("half a descriptor", "not a context id and whole descriptors", true, vec![status(0, 10)], {
            let mut s = Vec::new();
            chunk(&mut s, 1, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, &[0, 0, 0, 1, 0, 0, 0, 10, 0, 0, 0, 0, 0]);
            s
        }),
        ("an empty descriptor", "descriptor of length 0", true, vec![status(0, 10)], {
            let mut s = Vec::new();
            status_chunk(&mut s, 1, true, id, &[(5, 0), (0, 3)]);
            s
        }),
        ("beyond the request", "beyond the request's length", true, vec![status(0, 10)], {
            let mut s = Vec::new();
            status_chunk(&mut s, 1, true, id, &[(10, 0), (1, 3)]);
            s
        }),
        ("two chunks of the context", "a second block status chunk", true, vec![status(0, 10)], {
            let mut s = Vec::new();
            status_chunk(&mut s, 1, false, id, &[(5, 0)]);
            status_chunk(&mut s, 1, true, id, &[(5, 0)]);
            s
        }),
        ("only another context", "without the context's chunk", true, vec![status(0, 10)], {
            let mut s = Vec::new();
            status_chunk(&mut s, 1, true, id + 1, &[(10, 0)]);
            s
        }),
        ("a simple reply without error", "answered with a simple reply", true, vec![status(0, 10)], {
            let mut s = Vec::new();
            simple_reply(&mut s, 1, 0);
            s
        }),
        // A BLOCK_STATUS of length 0 (which no chunk can answer) is a block status all the same: a simple
        // reply without error to it is named (it was taken for another command's: an empty success; the
        // fuzz target nbd_client found it, fuzz/corpus/nbd_client/status-zero-length).
        ("a zero-length block status answered simply", "answered with a simple reply", true, vec![status(0, 0)], {
            let mut s = Vec::new();
            simple_reply(&mut s, 1, 0);
            s
        }),
    ];
    for (what, want, structured, reqs, stream) in cases {
        let (replies, end) = run(structured, &reqs, &stream);
        assert!(replies.is_empty(), "{what}: {replies:?}");
        let end = end.unwrap_or_else(|| panic!("{what}: no error"));
        assert!(end.contains(want), "{what}: {end}");
    }
}

proptest! {
    /// Generated block status answers (descriptors within the request, the selected context's chunk among
    /// others', then NONE or not) come back as their descriptors (the first MAX_EXTENTS) however split.
    #[test]
    fn generated_block_status_comes_back_however_split(
        lens in proptest::collection::vec(1u32..5000, 1..40),
        others in 0usize..3,
        trailing_none in any::<bool>(),
        sizes in proptest::collection::vec(1usize..64, 1..8),
    ) {
        let descriptors: Vec<(u32, u32)> = lens.iter().enumerate().map(|(i, &l)| (l, (i % 4) as u32)).collect();
        let length: u32 = lens.iter().sum();
        let mut s = Vec::new();
        for k in 0..others {
            status_chunk(&mut s, 1, false, BASE_ALLOCATION_ID + 1 + k as u32, &[(1, 0)]);
        }
        status_chunk(&mut s, 1, !trailing_none, BASE_ALLOCATION_ID, &descriptors);
        if trailing_none {
            chunk(&mut s, 1, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[]);
        }
        let (replies, end) = harness::replies_run(true, &[status(1 << 20, length)], &s, &sizes);
        prop_assert_eq!(end, None);
        prop_assert_eq!(replies, vec![(1, Ok(wire(&descriptors)))]);
    }
}
