//! The NBD transmission state machine: generated request streams against the documented validation rules
//! (every request answered or rejected exactly once, in order), fed whole and in random pieces; random
//! garbage; and the memory bound of a rejected WRITE's payload, at the discard limit and past it. The
//! contracts themselves are `rein_proto::harness`'s, which the fuzz target checks too.
use proptest::prelude::*;
use rein_proto::harness::{self, Outcome};
use rein_proto::nbd::*;
use rein_proto::ErrorKind;

/// A generated request.
#[derive(Debug, Clone)]
struct Op {
    command: u16,
    flags: u16,
    handle: u64,
    offset: u64,
    length: u32,
}

/// What the module comment's rules say a request gets: the request's kind, or the rejection's error.
fn expected(c: &TransmissionConfig, op: &Op) -> Result<RequestKind, ErrorKind> {
    let kind = match op.command {
        CMD_READ => RequestKind::Read,
        CMD_WRITE => RequestKind::Write,
        CMD_FLUSH => RequestKind::Flush,
        CMD_TRIM => RequestKind::Trim,
        CMD_WRITE_ZEROES => RequestKind::WriteZeroes,
        CMD_BLOCK_STATUS => RequestKind::BlockStatus { one: op.flags & CMD_FLAG_REQ_ONE != 0 },
        _ => return Err(ErrorKind::InvalidRequest),
    };
    let mut allowed = if c.volatile { 0 } else { CMD_FLAG_FUA };
    if kind == RequestKind::WriteZeroes {
        allowed |= CMD_FLAG_NO_HOLE;
    }
    if kind == RequestKind::Read && c.structured {
        allowed |= CMD_FLAG_DF;
    }
    let block_status = matches!(kind, RequestKind::BlockStatus { .. });
    if block_status {
        allowed |= CMD_FLAG_REQ_ONE;
    }
    let writes = matches!(kind, RequestKind::Write | RequestKind::Trim | RequestKind::WriteZeroes);
    // Steps 3 and 4: flags that do not apply; a FLUSH on a volatile export or with non-zero reserved fields.
    let bad_flush = kind == RequestKind::Flush && (c.volatile || op.offset != 0 || op.length != 0);
    if op.flags & !allowed != 0 || bad_flush {
        Err(ErrorKind::InvalidRequest)
    } else if writes && c.read_only {
        Err(ErrorKind::ReadOnly)
    } else if matches!(kind, RequestKind::Read | RequestKind::Write) && op.length > c.max_payload {
        Err(ErrorKind::InvalidRequest)
    } else if block_status && (!c.base_allocation || op.length == 0) {
        // Step 7: no context negotiated, or nothing to describe.
        Err(ErrorKind::InvalidRequest)
    } else if kind != RequestKind::Flush && op.offset.checked_add(op.length as u64).is_none_or(|e| e > c.size) {
        Err(if matches!(kind, RequestKind::Write | RequestKind::WriteZeroes) {
            ErrorKind::NoSpace
        } else {
            ErrorKind::InvalidRequest
        })
    } else {
        Ok(kind)
    }
}

fn payload_of(op: &Op) -> Vec<u8> {
    (0..op.length).map(|i| (op.handle as u32).wrapping_mul(31).wrapping_add(i) as u8).collect()
}

fn encode(ops: &[Op], disc: bool) -> Vec<u8> {
    let mut v = Vec::new();
    for op in ops {
        let command = Command::from_u16(op.command);
        RequestHeader { flags: op.flags, command, handle: op.handle, offset: op.offset, length: op.length }
            .encode(&mut v);
        if op.command == CMD_WRITE {
            v.extend(payload_of(op));
        }
    }
    if disc {
        RequestHeader { flags: 0, command: Command::Disc, handle: 0, offset: 0, length: 0 }.encode(&mut v);
    }
    v
}

fn config() -> impl Strategy<Value = TransmissionConfig> {
    (any::<bool>(), any::<bool>(), 1u32..=8192, 0u64..=2048, any::<bool>(), any::<bool>()).prop_map(
        |(read_only, structured, max_payload, sectors, volatile, meta)| TransmissionConfig {
            size: sectors * 512,
            read_only,
            structured,
            max_payload,
            volatile,
            node: false,
            node_slots: 0,
            base_allocation: structured && meta,
        },
    )
}

fn op(c: TransmissionConfig) -> impl Strategy<Value = Op> {
    let command = prop_oneof![
        4 => Just(CMD_READ),
        4 => Just(CMD_WRITE),
        1 => Just(CMD_FLUSH),
        1 => Just(CMD_TRIM),
        1 => Just(CMD_WRITE_ZEROES),
        2 => Just(CMD_BLOCK_STATUS),
        1 => (5u16..64).prop_filter("not DISC", |c| *c != CMD_DISC && *c != CMD_WRITE_ZEROES && *c != CMD_BLOCK_STATUS),
    ];
    let flags = prop_oneof![
        6 => Just(0u16),
        2 => Just(CMD_FLAG_FUA),
        1 => Just(CMD_FLAG_NO_HOLE),
        1 => Just(CMD_FLAG_DF),
        1 => Just(CMD_FLAG_REQ_ONE),
        1 => any::<u16>(),
    ];
    let size = c.size;
    let offset = prop_oneof![
        4 => 0..=size,
        2 => size.saturating_sub(4096)..=size + 4096,
        1 => any::<u64>(),
    ];
    let max = c.max_payload;
    let length = prop_oneof![4 => 0u32..=64, 2 => 0..=max + 16, 1 => Just(max), 1 => Just(max + 1), 1 => Just(2 * max)];
    (command, flags, any::<u64>(), offset, length).prop_map(move |(command, flags, handle, offset, length)| Op {
        command,
        flags,
        handle,
        offset,
        // Keep write payloads (part of the stream) small; other lengths may be anything.
        length: if command == CMD_WRITE { length.min(3 * max) } else { length },
    })
}

fn scenario() -> impl Strategy<Value = (TransmissionConfig, Vec<Op>, bool, u8)> {
    config().prop_flat_map(|c| (Just(c), proptest::collection::vec(op(c), 0..40), any::<bool>(), any::<u8>()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A server shutting down after `k` requests: the first `k` get what the rules say, every later one
    /// ESHUTDOWN (an unknown command EINVAL), each exactly once and in order, whatever the split; the
    /// stream stays in sync across skipped WRITE payloads, and DISC still ends it.
    #[test]
    fn after_a_shutdown_every_request_gets_eshutdown((c, ops, disc, seed) in scenario(), k in 0usize..45) {
        let stream = encode(&ops, disc);
        let outcomes = harness::transmission_shutdown(c, &stream, &harness::chunk_sizes(seed), k);
        prop_assert_eq!(outcomes.len(), ops.len() + disc as usize);
        for (i, (op, outcome)) in ops.iter().zip(&outcomes).enumerate() {
            let known =
                matches!(op.command, CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_WRITE_ZEROES | CMD_BLOCK_STATUS);
            let want = if i < k {
                expected(&c, op)
            } else if known {
                Err(ErrorKind::Shutdown)
            } else {
                Err(ErrorKind::InvalidRequest)
            };
            match (want, outcome) {
                (Ok(kind), Outcome::Request(r, _)) => prop_assert_eq!((r.handle, r.kind), (op.handle, kind)),
                (Err(kind), Outcome::Reject(r)) => prop_assert_eq!((r.handle, r.kind()), (op.handle, kind), "{}", r),
                (want, got) => prop_assert!(false, "request {i} {op:?}: expected {want:?}, got {got:?}"),
            }
        }
        if disc {
            prop_assert_eq!(outcomes.last(), Some(&Outcome::Disconnect));
        }
    }

    /// Every request is answered (a request event) or rejected exactly once, in order, as the rules say,
    /// whatever the split of the stream (the harness feeds it whole and in pieces, and checks the replies).
    #[test]
    fn every_request_is_answered_or_rejected_exactly_once((c, ops, disc, seed) in scenario()) {
        let stream = encode(&ops, disc);
        let outcomes = harness::transmission_with(c, &stream, &harness::chunk_sizes(seed));
        prop_assert_eq!(outcomes.len(), ops.len() + disc as usize);
        for (op, outcome) in ops.iter().zip(&outcomes) {
            match (expected(&c, op), outcome) {
                (Ok(kind), Outcome::Request(r, payload)) => {
                    prop_assert_eq!((r.handle, r.kind, r.offset, r.length), (op.handle, kind, op.offset, op.length));
                    prop_assert_eq!(r.fua, op.flags & CMD_FLAG_FUA != 0);
                    prop_assert_eq!(r.no_hole, op.flags & CMD_FLAG_NO_HOLE != 0);
                    let want = if kind == RequestKind::Write { payload_of(op) } else { Vec::new() };
                    prop_assert_eq!(payload, &want);
                }
                (Err(kind), Outcome::Reject(r)) => {
                    prop_assert_eq!((r.handle, r.kind()), (op.handle, kind), "{}", r);
                }
                (want, got) => prop_assert!(false, "{op:?}: expected {want:?}, got {got:?}"),
            }
        }
        if disc {
            prop_assert_eq!(outcomes.last(), Some(&Outcome::Disconnect));
        }
    }

    /// A stream cut anywhere gives a prefix of the uncut stream's outcomes (no event needs bytes it was
    /// not given, and none is lost to a split).
    #[test]
    fn a_truncated_stream_gives_a_prefix_of_the_events((c, ops, disc, seed) in scenario(), cut in any::<prop::sample::Index>()) {
        let stream = encode(&ops, disc);
        let all = harness::transmission_with(c, &stream, &[stream.len().max(1)]);
        let part = harness::transmission_with(c, &stream[..cut.index(stream.len() + 1)], &harness::chunk_sizes(seed));
        prop_assert!(part.len() <= all.len());
        prop_assert_eq!(&all[..part.len()], &part[..]);
    }

    /// Random bytes (and random bytes after valid requests) never panic and keep every contract.
    #[test]
    fn random_garbage_never_breaks_a_contract(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        harness::transmission(&data);
    }

    #[test]
    fn garbage_after_valid_requests((c, ops, _disc, seed) in scenario(), tail in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut stream = encode(&ops, false);
        stream.extend_from_slice(&tail);
        let outcomes = harness::transmission_with(c, &stream, &harness::chunk_sizes(seed));
        prop_assert!(outcomes.len() >= ops.len());
    }
}

/// Feeds a rejected WRITE's `length`-byte payload in 64 KiB reads without holding more than one read.
fn skip_payload(m: &mut ServerTransmission, length: u32) {
    let read = vec![0u8; 64 << 10];
    let mut left = length as usize;
    while left > 0 {
        let n = left.min(read.len());
        let (used, e) = m.feed(&read[..n]).unwrap();
        assert_eq!(used, n, "a discarded payload is consumed as it comes");
        left -= n;
        if left > 0 {
            assert_eq!(e, Event::NeedMore { wanted: 1 });
        }
    }
}

#[test]
fn a_rejected_write_at_the_discard_limit_is_skipped_in_bounded_memory() {
    let c = TransmissionConfig {
        size: 1 << 40,
        read_only: false,
        structured: false,
        max_payload: 4096,
        volatile: false,
        node: false,
        node_slots: 0,
        base_allocation: false,
    };
    let mut m = ServerTransmission::new(c);
    let mut input = Vec::new();
    RequestHeader { flags: 0, command: Command::Write, handle: 1, offset: 0, length: MAX_DISCARD }.encode(&mut input);
    let (used, e) = m.feed(&input).unwrap();
    assert_eq!(used, REQUEST_LEN);
    assert!(matches!(e, Event::Reject(r) if r.reason == Reason::TooLarge { length: MAX_DISCARD, max: 4096 }));
    skip_payload(&mut m, MAX_DISCARD);
    // In sync again: the next request is read normally.
    let mut next = Vec::new();
    RequestHeader { flags: 0, command: Command::Read, handle: 2, offset: 0, length: 4096 }.encode(&mut next);
    assert!(matches!(m.feed(&next).unwrap(), (REQUEST_LEN, Event::Request { request: Request { handle: 2, .. }, .. })));
    // One byte more than the limit: close at the header, without reading the payload.
    let mut big = Vec::new();
    RequestHeader { flags: 0, command: Command::Write, handle: 3, offset: 0, length: MAX_DISCARD + 1 }.encode(&mut big);
    assert_eq!(m.feed(&big).unwrap_err(), ProtoError::Unrecoverable(MAX_DISCARD + 1));
}

#[test]
fn the_discard_limit_grows_with_the_maximum_payload() {
    // A read-only export with a 100 MiB maximum payload skips a 100 MiB write (EPERM), never closes.
    let max = 100 << 20;
    let c = TransmissionConfig {
        size: 1 << 40,
        read_only: true,
        structured: true,
        max_payload: max,
        volatile: false,
        node: false,
        node_slots: 0,
        base_allocation: false,
    };
    let mut m = ServerTransmission::new(c);
    let mut input = Vec::new();
    RequestHeader { flags: 0, command: Command::Write, handle: 1, offset: 0, length: max }.encode(&mut input);
    let (_, e) = m.feed(&input).unwrap();
    assert!(matches!(e, Event::Reject(r) if r.kind() == ErrorKind::ReadOnly));
    skip_payload(&mut m, max);
    assert!(!m.is_closed());
}

#[test]
fn a_write_at_the_maximum_payload_is_accepted_and_one_byte_more_is_not() {
    let c = TransmissionConfig {
        size: 1 << 20,
        read_only: false,
        structured: false,
        max_payload: 4096,
        volatile: false,
        node: false,
        node_slots: 0,
        base_allocation: false,
    };
    let ops = [
        Op { command: CMD_WRITE, flags: 0, handle: 1, offset: 0, length: 4096 },
        Op { command: CMD_WRITE, flags: 0, handle: 2, offset: 0, length: 4097 },
        Op { command: CMD_READ, flags: 0, handle: 3, offset: (1 << 20) - 4096, length: 4096 },
        Op { command: CMD_READ, flags: 0, handle: 4, offset: (1 << 20) - 4095, length: 4096 },
    ];
    let out = harness::transmission_with(c, &encode(&ops, true), &[1]);
    let kinds: Vec<_> = out
        .iter()
        .map(|o| match o {
            Outcome::Request(r, _) => Ok(r.handle),
            Outcome::Reject(r) => Err(r.kind()),
            other => panic!("{other:?}"),
        })
        .take(4)
        .collect();
    assert_eq!(kinds, vec![Ok(1), Err(ErrorKind::InvalidRequest), Ok(3), Err(ErrorKind::InvalidRequest)]);
    assert_eq!(out.last(), Some(&Outcome::Disconnect));
}

#[test]
fn the_maximum_payload_is_clamped_so_a_read_fits_one_chunk() {
    let c = TransmissionConfig {
        size: u64::MAX,
        read_only: false,
        structured: true,
        max_payload: u32::MAX,
        volatile: false,
        node: false,
        node_slots: 0,
        base_allocation: false,
    };
    let m = ServerTransmission::new(c);
    assert_eq!(m.config().max_payload, transmission::MAX_PAYLOAD_LIMIT);
    let zero = ServerTransmission::new(TransmissionConfig { max_payload: 0, ..c });
    assert_eq!(zero.config().max_payload, 1);
}

/// Server shutdown: requests after `shut_down` are answered with NBD_ESHUTDOWN and not run (a WRITE's
/// payload skipped, the stream in sync), a request decoded before it runs, and DISC still disconnects.
#[test]
fn after_shut_down_requests_get_eshutdown_and_disc_still_disconnects() {
    let c = TransmissionConfig {
        size: 1 << 20,
        read_only: false,
        structured: true,
        max_payload: 65536,
        volatile: false,
        node: false,
        node_slots: 0,
        base_allocation: false,
    };
    let mut m = ServerTransmission::new(c);
    let head = |command: Command, handle: u64, length: u32| {
        let mut v = Vec::new();
        RequestHeader { flags: 0, command, handle, offset: 0, length }.encode(&mut v);
        v
    };
    assert!(matches!(m.feed(&head(Command::Read, 1, 4096)).unwrap(), (REQUEST_LEN, Event::Request { .. })));
    m.shut_down();
    for (command, handle, length) in [(Command::Read, 2, 4096), (Command::Flush, 3, 0), (Command::Trim, 4, 512)] {
        let bytes = head(command, handle, length);
        let (used, e) = m.feed(&bytes).unwrap();
        assert_eq!(used, REQUEST_LEN);
        let Event::Reject(r) = e else { panic!("{command}: {e:?}") };
        assert_eq!((r.handle, r.reason, r.kind()), (handle, Reason::ShuttingDown, ErrorKind::Shutdown));
    }
    // A WRITE with its payload: rejected at the header, its payload skipped, the next header read.
    let mut w = head(Command::Write, 5, 8192);
    w.extend(std::iter::repeat_n(0xab, 8192));
    w.extend(head(Command::Disc, 6, 0));
    let (used, e) = m.feed(&w).unwrap();
    assert_eq!(used, REQUEST_LEN);
    assert!(matches!(e, Event::Reject(Rejection { handle: 5, reason: Reason::ShuttingDown, .. })));
    assert_eq!(m.feed(&w[used..]).unwrap(), (8192 + REQUEST_LEN, Event::Disconnect));
    // The reply carries NBD_ESHUTDOWN (108).
    let mut out = Vec::new();
    let r = Rejection { handle: 2, command: Command::Read, reason: Reason::ShuttingDown };
    ReplyEncoder::new(false).rejection(&mut out, &r);
    assert_eq!(u32::from_be_bytes(out[4..8].try_into().unwrap()), ESHUTDOWN);
}
