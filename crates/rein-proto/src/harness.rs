//! The decoders' contracts as functions of arbitrary bytes.
//!
//! The fuzz targets (`fuzz/` at the repository root, run with cargo-fuzz on a nightly toolchain) are one
//! line each: they call these functions. The property tests (`tests/nbd.rs`, `tests/nbd_transmission.rs`,
//! `tests/parda.rs`) call them too, with random and with structured input, and `tests/corpus.rs` replays
//! the committed fuzz corpus through them, so CI checks the same entry points and the same contracts
//! without nightly. Each function panics exactly when a contract is broken;
//! none of them allocates more than a small multiple of its input.
//!
//! Contracts checked:
//! - [`handshake`]: the server and client handshakes never panic, never consume more than they are
//!   given, and give the same replies and the same outcome whether the input comes whole or in pieces;
//!   also with TLS offered or required (the state machine before and after a simulated TLS switch), a
//!   hidden export, opening confirmed by the caller, and a refused connection; export "a" offers
//!   `base:allocation` and "ro" does not, and a finished handshake has it negotiated only with structured
//!   replies and on "a".
//! - [`transmission`] / [`transmission_with`]: the invariants of [`crate::nbd::transmission`]: one event
//!   per request header, decoded from that very header; the same events however the input is split;
//!   `NeedMore { wanted }` only when fewer than `wanted` bytes are unconsumed, and `wanted` within the
//!   buffer bound; and every reply encodes to something a client decodes back to the request's handle,
//!   error and length; a BLOCK_STATUS runs only with `base:allocation` negotiated and a nonzero length,
//!   and its replies (the default, and [`crate::nbd::Extents`] filled in a pattern) are one BLOCK_STATUS
//!   chunk of nonzero descriptors that differ from their neighbours, at most `MAX_EXTENTS` (one with
//!   REQ_ONE), within the request's length. [`transmission_shutdown`]: the same, the server shutting
//!   down after some events; after that no request runs (NBD_ESHUTDOWN).
//! - [`node_hello`]: the storage-node decoders ([`crate::nbd::node`]: hello, welcome, tag, reply trailer,
//!   node reply) never panic, and what they accept passes the same checks as the encoders' side and
//!   re-encodes to the same bytes. [`handshake`] and [`transmission`] also run node sessions (a bit of
//!   their first byte turns the option on).
//! - [`parda`]: the record and slot decoders never panic, and what they accept re-encodes to the same
//!   bytes.
//! - [`pshift`]: the pShift frame decoder never panics, uses no more than it is given, asks for more only
//!   when the frame is incomplete, and what it accepts re-encodes to the same bytes; and the reports and
//!   notes it accepts, handed to rein-core's controller as a server's would be (time moving a third of
//!   an interval per frame), never panic it, and its answers stay within the token bound.
//! - [`replies`]: the client's decoders of what a server sends ([`ReplyHeader::decode`] in transmission,
//!   [`nbd::decode_option_reply`] in the handshake) never panic, never report more bytes than they were
//!   given, ask for more only when the header (or the option reply's data) is incomplete, and what they
//!   accept re-encodes to the same bytes.
//! - [`client_replies`]: the client's side of transmission ([`ClientTransmission`]) never panics, never
//!   consumes more than it is given, asks for more only beyond what it has, completes only requests that
//!   were sent and each at most once, answers a READ with exactly its length of data, a BLOCK_STATUS with
//!   one to [`nbd::MAX_EXTENTS`] non-empty descriptors within its length, and other commands with none, and gives the same replies and the same end however the server's bytes are split.

use crate::nbd::client::{ClientEvent, ClientReply, ClientTransmission};
use crate::nbd::node::{
    decode_node_reply, NodeGranted, NodeHello, NodeReplyTrailer, NodeSplit, NodeTag, NodeTenant, NodeWelcome,
    SpecSource, NODE_REPLY_TRAILER_LEN, NODE_TAG_LEN, NODE_VERSION_BLOCK_STATUS,
};
use crate::nbd::{
    self, ClientHandshake, ClientProgress, Command, Event, ExportInfo, ProtoError, Rejection, ReplyHeader, Request,
    RequestHeader, RequestKind, ServerHandshake, ServerProgress, ServerTransmission, TlsMode, TransmissionConfig,
    CHUNK_HEADER_LEN, REPLY_FLAG_DONE, REPLY_MAGIC_OPT, REPLY_TYPE_ERROR, REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA,
    REQUEST_LEN, SIMPLE_REPLY_LEN, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC,
};
use crate::parda as record;

/// Chunk sizes (1..=97 bytes) derived from a seed, for splitting input into pieces.
pub fn chunk_sizes(seed: u8) -> Vec<usize> {
    (1..=8usize).map(|i| 1 + (seed as usize * i * 7919 + i * 31) % 97).collect()
}

/// Splits `input` into consecutive pieces whose sizes cycle through `sizes` (all at least 1).
fn pieces<'a>(input: &'a [u8], sizes: &'a [usize]) -> impl Iterator<Item = &'a [u8]> + 'a {
    assert!(!sizes.is_empty() && sizes.iter().all(|&s| s > 0), "piece sizes are positive");
    let mut at = 0;
    let mut i = 0;
    std::iter::from_fn(move || {
        if at >= input.len() {
            return None;
        }
        let n = sizes[i % sizes.len()].min(input.len() - at);
        i += 1;
        at += n;
        Some(&input[at - n..at])
    })
}

/// The exports the handshake harness serves.
fn exports() -> Vec<ExportInfo> {
    vec![
        ExportInfo {
            name: "a".into(),
            description: "first".into(),
            size: 1 << 20,
            read_only: false,
            volatile: false,
            min_block: 1,
        },
        ExportInfo {
            name: "ro".into(),
            description: String::new(),
            size: 4096,
            read_only: true,
            volatile: true,
            min_block: 1,
        },
    ]
}

/// How a handshake run ended: the replies it wrote and its outcome.
type ServerRun = (Vec<u8>, Result<ServerProgress, ProtoError>);

/// The server setups the handshake harness runs (bits 1-2 of the input's first byte pick one): the
/// states a connection can be in, TLS and access control included; bit 3 offers the storage-node option.
fn server_setup(setup: u8, out: &mut Vec<u8>) -> ServerHandshake {
    let mut hs = ServerHandshake::new(exports(), out);
    hs.set_node(setup & 4 != 0);
    // "a" answers `base:allocation`, "ro" does not (a gateway's export).
    hs.set_block_status(vec![true, false]);
    match setup & 3 {
        0 => {}
        1 => {
            // TLS offered; opening asks the caller; "a" is the default export.
            hs.set_tls(TlsMode::On);
            hs.set_confirm_open(true);
            hs.set_default_export(Some(0));
        }
        2 => {
            // TLS required; "ro" hidden (until TLS, see `server_run`); "ro" is the default export.
            hs.set_tls(TlsMode::Require);
            hs.set_visible(vec![true, false]);
            hs.set_default_export(Some(1));
        }
        _ => hs.refuse_all("connection cap".into()),
    }
    hs
}

/// Feeds `input` to a server handshake set up by `setup`, as a connection would: after `StartTls` the
/// TLS handshake "succeeds" (every export becomes visible) and the rest of the input is what came over
/// TLS; `Opening` is accepted for the first export and refused for the others.
fn server_run(input: &[u8], sizes: Option<&[usize]>, setup: u8) -> ServerRun {
    let mut out = Vec::new();
    let mut hs = server_setup(setup, &mut out);
    let mut buf = Vec::new();
    let whole = [input.len().max(1)];
    for piece in pieces(input, sizes.unwrap_or(&whole)) {
        buf.extend_from_slice(piece);
        loop {
            let (used, mut progress) = match hs.feed(&buf, &mut out) {
                Ok(r) => r,
                Err(e) => return (out, Err(e)),
            };
            assert!(used <= buf.len(), "the server handshake consumed more than its input");
            buf.drain(..used);
            if let ServerProgress::NodeHello(hello) = &progress {
                // A valid hello (the handshake decoded it); accepted if its first tenant's name starts
                // with 'a' (the gateway's specs adopted), refused by policy otherwise.
                assert!(hello.check().is_ok(), "the server handshake passed on a hello the encoder refuses");
                let verdict = if hello.tenants[0].name.starts_with('a') {
                    Ok(welcome_for(hello))
                } else {
                    Err((nbd::REP_ERR_POLICY, format!("tenant {:?} unknown", hello.tenants[0].name)))
                };
                assert_eq!(hs.node_verdict(verdict, &mut out), ServerProgress::NeedMore);
                continue;
            }
            if let ServerProgress::Opening(export) = progress {
                let verdict = if export == 0 { Ok(()) } else { Err("tenant cap".to_string()) };
                progress = match hs.open(verdict, &mut out) {
                    Ok(ServerProgress::NeedMore) => continue, // refused: the next option may be there
                    Ok(p) => p,
                    Err(e) => return (out, Err(e)),
                };
            }
            match progress {
                // More options already received (a reply batch ended the call): go on.
                ServerProgress::NeedMore if used > 0 && !buf.is_empty() => continue,
                ServerProgress::NeedMore => break,
                ServerProgress::StartTls => {
                    assert!(!hs.tls_active(), "STARTTLS is acknowledged once");
                    hs.tls_established();
                    hs.set_visible(vec![true; 2]);
                }
                p => {
                    if let ServerProgress::Done(n) = &p {
                        assert!(
                            !n.base_allocation
                                || (n.export == 0
                                    && (n.structured
                                        || n.node.as_ref().is_some_and(|w| w.version >= NODE_VERSION_BLOCK_STATUS))),
                            "base:allocation negotiated without structured replies or a v4 node session, or on an \
                             export without it"
                        );
                    }
                    return (out, Ok(p));
                }
            }
        }
    }
    (out, Ok(ServerProgress::NeedMore))
}

/// The welcome a node that adopts every spec of `hello` answers.
pub fn welcome_for(hello: &NodeHello) -> NodeWelcome {
    let tenants = hello
        .tenants
        .iter()
        .enumerate()
        .map(|(i, t)| NodeGranted {
            slot: i as u32,
            source: SpecSource::Gateway,
            reservation: t.reservation,
            limit: t.limit,
            weight: t.weight,
            local_reservation: t.local_reservation,
        })
        .collect();
    let version = hello.version.min(nbd::NODE_VERSION);
    NodeWelcome { version, tenants, boot: (version >= 2).then_some(0x5245_494e_b007) }
}

/// The hello the client side of the handshake harness sends on a node session.
pub fn sample_hello() -> NodeHello {
    NodeHello::new(vec![
        NodeTenant {
            name: "a1".into(),
            reservation: 100.0,
            limit: None,
            weight: 1.0,
            local_reservation: 0.0,
            idle_credit: 0,
            split: NodeSplit::Spread,
        },
        NodeTenant {
            name: "b2".into(),
            reservation: 0.0,
            limit: Some(50.0),
            weight: 3.0,
            local_reservation: 5.0,
            idle_credit: 2,
            split: NodeSplit::Rho,
        },
    ])
}

/// Feeds `input` to a client handshake of kind `kind` (bits 0-1: plain, structured replies, a storage
/// node's client, a probe of two exports; bit 2: TLS required), in pieces of `sizes`.
fn client_run(kind: u8, input: &[u8], sizes: &[usize]) -> (Vec<u8>, Result<ClientProgress, ProtoError>) {
    let mut hs = match kind & 3 {
        0 => ClientHandshake::new("a", false),
        1 => ClientHandshake::new("a", true),
        2 => ClientHandshake::with_node("a", sample_hello()).expect("a valid hello"),
        _ => ClientHandshake::probe(&["a", "b"]),
    };
    let tls = kind & 4 == 4;
    if tls {
        hs = hs.require_tls();
    }
    // With TLS, the stream up to the end of the first option reply (the STARTTLS answer after the 18-byte
    // greeting) arrives in the clear and the rest over TLS: each part is split into pieces on its own, as
    // a server cannot send the two in one segment (a client must refuse bytes after the ACK in the clear).
    let cut = tls
        .then(|| input.get(18..).and_then(|r| nbd::decode_option_reply(r).ok().flatten()).map(|(_, n)| 18 + n))
        .flatten();
    let parts = match cut {
        Some(c) => [&input[..c], &input[c..]],
        None => [input, &[][..]],
    };
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut last = Ok(ClientProgress::NeedMore);
    for piece in parts.into_iter().flat_map(|part| pieces(part, sizes)) {
        buf.extend_from_slice(piece);
        match hs.feed(&buf, &mut out) {
            Ok((used, progress)) => {
                assert!(used <= buf.len(), "the client handshake consumed more than its input");
                buf.drain(..used);
                if progress == ClientProgress::StartTls {
                    // TLS "comes up" here; what follows is read as if it arrived over TLS.
                    hs.tls_established().expect("StartTls is followed by tls_established");
                    continue;
                }
                if progress != ClientProgress::NeedMore {
                    return (out, Ok(progress));
                }
                last = Ok(progress);
            }
            Err(e) => return (out, Err(e)),
        }
    }
    (out, last)
}

/// Feeds `data` to a server handshake (after valid client flags if `data[0]` is odd; set up by bits 1-2
/// of `data[0]`: plain, TLS offered, TLS required with a hidden export, refused; the storage-node option
/// offered if bit 3 is set) and to a client handshake of the kind bits 4-6 of `data[0]` say (bits 4-5:
/// plain, structured replies, a storage node's client, a probe; bit 6: TLS required), whole and in
/// pieces (sizes from `data[1]`); panics if a contract is broken (module comment). Until 2026-12-07 the
/// client's kind came from the first byte of the server's stream, `data[2]`, which a valid greeting
/// fixes ('N': a node client requiring TLS), so the fuzzer reached the other clients only past invalid
/// greetings.
pub fn handshake(data: &[u8]) {
    let (Some(&mode), Some(&seed)) = (data.first(), data.get(1)) else { return };
    let sizes = chunk_sizes(seed);
    let mut input = Vec::with_capacity(data.len() + 4);
    if mode & 1 == 1 {
        input.extend_from_slice(&nbd::FLAG_C_FIXED_NEWSTYLE.to_be_bytes());
    }
    input.extend_from_slice(&data[2..]);
    let setup = mode >> 1;
    let whole = server_run(&input, None, setup);
    let split = server_run(&input, Some(&sizes), setup);
    assert_eq!(whole, split, "the server handshake depends on how its input is split");
    let whole = client_run(mode >> 4, &data[2..], &[data.len().max(1)]);
    let split = client_run(mode >> 4, &data[2..], &sizes);
    assert_eq!(whole, split, "the client handshake depends on how its input is split");
}

/// One thing the transmission state machine produced, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A valid request and its payload.
    Request(Request, Vec<u8>),
    /// A rejected request.
    Reject(Rejection),
    /// NBD_CMD_DISC.
    Disconnect,
    /// A protocol error (the connection closes).
    Error(ProtoError),
}

/// A transmission configuration and piece sizes from the first 6 bytes of `data` (flags: bit 0 read-only,
/// 1 structured, 2 volatile, 3 a storage-node session with `data[0] >> 4` slots; maximum payload, export
/// size in 512-byte sectors, split seed, whose bit 7 also negotiates `base:allocation` on a structured
/// plain session), and the rest of `data` as the stream; then
/// [`transmission_with`].
pub fn transmission(data: &[u8]) {
    if data.len() < 6 {
        return;
    }
    let config = TransmissionConfig {
        read_only: data[0] & 1 == 1,
        structured: data[0] & 2 == 2,
        max_payload: u16::from_be_bytes([data[1], data[2]]) as u32 + 1,
        size: u16::from_be_bytes([data[3], data[4]]) as u64 * 512,
        volatile: data[0] & 4 == 4,
        node: data[0] & 8 == 8,
        node_slots: (data[0] >> 4) as u32,
        // `base:allocation` negotiated: bit 7 of the split seed, with structured replies on a plain session,
        // or implied on a node session (v4).
        base_allocation: (data[0] & 2 == 2 || data[0] & 8 == 8) && data[5] & 0x80 != 0,
    };
    transmission_with(config, &data[6..], &chunk_sizes(data[5]));
    transmission_shutdown(config, &data[6..], &chunk_sizes(data[5]), (data[5] % 8) as usize);
}

/// [`transmission_with`] with the server shutting down after `after` events
/// ([`ServerTransmission::shut_down`]): the same events however the input is split, and after the
/// shutdown no request runs: each is rejected with NBD_ESHUTDOWN (an unknown command with its own
/// EINVAL), DISC still disconnects, and a WRITE's payload is skipped.
pub fn transmission_shutdown(config: TransmissionConfig, stream: &[u8], sizes: &[usize], after: usize) -> Vec<Outcome> {
    let whole = transmission_run_with(config, stream, &[stream.len().max(1)], Some(after));
    let split = transmission_run_with(config, stream, sizes, Some(after));
    assert_eq!(whole, split, "transmission events depend on how the input is split (invariant 2)");
    for outcome in whole.iter().skip(after) {
        match outcome {
            Outcome::Request(r, _) => panic!("request {} ran after the shutdown", r.handle),
            Outcome::Reject(r) => assert!(
                matches!(r.reason, nbd::Reason::ShuttingDown | nbd::Reason::UnknownCommand(_)),
                "a request after the shutdown rejected for {}, not ESHUTDOWN",
                r.reason
            ),
            Outcome::Disconnect | Outcome::Error(_) => {}
        }
    }
    whole
}

/// Runs `stream` through [`ServerTransmission`] whole and in pieces of `sizes`, checks the contracts
/// (module comment) and returns the outcomes.
pub fn transmission_with(config: TransmissionConfig, stream: &[u8], sizes: &[usize]) -> Vec<Outcome> {
    let whole = transmission_run(config, stream, &[stream.len().max(1)]);
    let split = transmission_run(config, stream, sizes);
    assert_eq!(whole, split, "transmission events depend on how the input is split (invariant 2)");
    let encoder = ServerTransmission::new(config).replies();
    for outcome in &whole {
        check_reply(encoder, outcome);
    }
    whole
}

/// Feeds `stream` in pieces like a connection would: read a piece, feed until `NeedMore`.
fn transmission_run(config: TransmissionConfig, stream: &[u8], sizes: &[usize]) -> Vec<Outcome> {
    transmission_run_with(config, stream, sizes, None)
}

/// [`transmission_run`], the server shutting down once `shutdown_after` events were produced.
fn transmission_run_with(
    config: TransmissionConfig,
    stream: &[u8],
    sizes: &[usize],
    shutdown_after: Option<usize>,
) -> Vec<Outcome> {
    let mut machine = ServerTransmission::new(config);
    let head = machine.config().request_head_len();
    let mut outcomes = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut start = 0; // consumed prefix of `buf`
    let mut offered = 0; // stream bytes appended to `buf` so far
    for piece in pieces(stream, sizes) {
        buf.drain(..start);
        start = 0;
        buf.extend_from_slice(piece);
        offered += piece.len();
        loop {
            if shutdown_after == Some(outcomes.len()) {
                machine.shut_down();
            }
            let unconsumed = &buf[start..];
            let (used, event) = match machine.feed(unconsumed) {
                Ok(r) => r,
                Err(e) => {
                    outcomes.push(Outcome::Error(e));
                    return outcomes;
                }
            };
            assert!(used <= unconsumed.len(), "invariant 4");
            // Where the stream position of the consumed end is: the event's header sits just before it.
            let end = offered - (unconsumed.len() - used);
            let outcome = match event {
                Event::NeedMore { wanted } => {
                    assert!(unconsumed.len() - used < wanted, "NeedMore while {wanted} bytes were there");
                    assert!(wanted <= machine.max_wanted(), "invariant 3");
                    start += used;
                    break;
                }
                Event::Request { request, payload } => {
                    let at = end - head - payload.len();
                    let h = RequestHeader::decode(&stream[at..]).expect("a valid header").expect("whole");
                    assert_eq!((h.handle, h.command), (request.handle, request.kind.command()), "invariant 1");
                    match request.tag {
                        Some(tag) => {
                            assert!(config.node, "a tag on a plain session");
                            let wire = NodeTag::decode(&stream[at + REQUEST_LEN..]).expect("an accepted tag");
                            assert_eq!(wire, tag, "the tag is the one after the header");
                            assert!(tag.slot < config.node_slots, "a tag's slot is the session's");
                        }
                        None => assert!(!config.node, "a request without its tag on a node session"),
                    }
                    assert_eq!((request.offset, request.length), (h.offset, h.length));
                    assert_eq!(
                        (request.fua, request.no_hole),
                        (h.flags & crate::nbd::CMD_FLAG_FUA != 0, h.flags & crate::nbd::CMD_FLAG_NO_HOLE != 0),
                        "the flags are the header's"
                    );
                    if request.kind == RequestKind::Flush {
                        assert_eq!((request.offset, request.length), (0, 0), "a FLUSH's reserved fields are zero");
                    }
                    if let RequestKind::BlockStatus { one } = request.kind {
                        assert!(config.base_allocation, "a BLOCK_STATUS ran without a context negotiated");
                        assert!(request.length > 0, "a BLOCK_STATUS of length 0 ran");
                        assert_eq!(one, h.flags & crate::nbd::CMD_FLAG_REQ_ONE != 0, "REQ_ONE is the header's");
                    }
                    let want_payload = if request.kind == RequestKind::Write { request.length as usize } else { 0 };
                    assert_eq!(payload.len(), want_payload, "a WRITE comes with its whole payload");
                    assert_eq!(payload, &stream[at + head..end]);
                    Outcome::Request(request, payload.to_vec())
                }
                Event::Reject(r) => {
                    let h = RequestHeader::decode(&stream[end - head..]).expect("valid").expect("whole");
                    assert_eq!((h.handle, h.command), (r.handle, r.command), "invariant 1");
                    if let nbd::Reason::Tag(_) = r.reason {
                        assert!(config.node, "a tag fault on a plain session");
                    }
                    Outcome::Reject(r)
                }
                Event::Disconnect => {
                    let h = RequestHeader::decode(&stream[end - head..]).expect("valid").expect("whole");
                    assert_eq!(h.command, Command::Disc, "invariant 1");
                    assert!(machine.is_closed(), "invariant 4");
                    outcomes.push(Outcome::Disconnect);
                    return outcomes;
                }
            };
            outcomes.push(outcome);
            start += used;
        }
    }
    outcomes
}

/// Encodes the reply to `outcome` and decodes it as a client would.
fn check_reply(encoder: nbd::ReplyEncoder, outcome: &Outcome) {
    let (handle, error, data_len) = match outcome {
        Outcome::Request(request, _) if matches!(request.kind, RequestKind::BlockStatus { .. }) => {
            check_block_status(encoder, request);
            return;
        }
        Outcome::Request(request, _) => {
            let head = encoder.headroom(request);
            let data_len = if request.kind == RequestKind::Read { request.length as usize } else { 0 };
            let mut reply = vec![0xA5; head + data_len];
            let trailer = NodeReplyTrailer {
                phase: Some(rein_core::Phase::ALL[(request.handle % 3) as usize]),
                cost: request.length as u64 + 1,
            };
            encoder.success_node(request, trailer, &mut reply);
            if request.kind == RequestKind::Read {
                assert!(reply[head..].iter().all(|&b| b == 0xA5), "the data is left in place");
            }
            if encoder.is_node() {
                check_node_decoded(&reply, request.handle, 0, data_len, trailer);
            } else {
                check_decoded(&reply, request.handle, 0, data_len, encoder.structured(), request.offset);
            }
            return;
        }
        Outcome::Reject(r) => (r.handle, nbd::errno(r.kind()), 0),
        Outcome::Disconnect | Outcome::Error(_) => return,
    };
    let mut reply = Vec::new();
    if let Outcome::Reject(r) = outcome {
        encoder.rejection(&mut reply, r);
    }
    if encoder.is_node() {
        check_node_decoded(&reply, handle, error, data_len, NodeReplyTrailer::default());
    } else {
        check_decoded(&reply, handle, error, data_len, encoder.structured(), 0);
    }
}

/// A BLOCK_STATUS's replies (the encoder's default, and extents pushed in a pattern drawn from the
/// handle, runs of one to 2^k bytes, as a backend would push them) decode as a client would: one
/// BLOCK_STATUS chunk with DONE and the context's id, descriptors each at least one byte, together at most
/// the request's length, at most `MAX_EXTENTS` (one with REQ_ONE), neighbours with different flags.
fn check_block_status(encoder: nbd::ReplyEncoder, request: &Request) {
    assert!(encoder.structured() || encoder.is_node(), "BLOCK_STATUS ran without structured replies");
    let mut reply = Vec::new();
    encoder.success(request, &mut reply);
    check_extents(&reply, request, encoder.is_node());
    let mut extents = nbd::Extents::new(request);
    let mut x = request.handle | 1;
    let mut pushes = 0;
    loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x >> 8) & ((1 << (x % 24)) - 1);
        pushes += 1;
        if !extents.push(len, (x & 3) as u32) || pushes > 4 * nbd::MAX_EXTENTS {
            break;
        }
    }
    let mut reply = Vec::new();
    encoder.block_status(&extents, request.handle, &mut reply);
    check_extents(&reply, request, encoder.is_node());
}

fn check_extents(reply: &[u8], request: &Request, node: bool) {
    if node {
        // Protocol v4: simple reply, trailer with no phase, then the payload, which decodes.
        let (r, t, n) = decode_node_reply(reply).expect("a node reply").expect("a whole node reply");
        assert_eq!((r.handle, r.error, t), (request.handle, 0, NodeReplyTrailer::default()));
        let len = nbd::node_extents_len(&reply[n..]).expect("a valid count").expect("a whole count");
        assert_eq!(reply.len(), n + len);
        let descriptors = nbd::decode_node_extents(&reply[n..], request.length).expect("a valid payload");
        if let RequestKind::BlockStatus { one: true } = request.kind {
            assert_eq!(descriptors.len(), 1, "REQ_ONE: one descriptor");
        }
        assert!(descriptors.windows(2).all(|w| w[0].1 != w[1].1), "neighbours with the same flags");
        return;
    }
    let (header, n) = ReplyHeader::decode(reply).expect("a reply magic").expect("a whole header");
    let ReplyHeader::Chunk { flags, kind, handle, length } = header else { panic!("a simple BLOCK_STATUS reply") };
    assert_eq!((handle, kind, flags), (request.handle, nbd::REPLY_TYPE_BLOCK_STATUS, REPLY_FLAG_DONE));
    assert_eq!(reply.len(), n + length as usize);
    assert!(length >= 12 && (length - 4) % 8 == 0, "a BLOCK_STATUS chunk of {length} bytes");
    let payload = &reply[n..];
    assert_eq!(payload[..4], nbd::BASE_ALLOCATION_ID.to_be_bytes());
    let descriptors: Vec<(u32, u32)> =
        payload[4..].chunks(8).map(|d| (crate::nbd::u32_at(d, 0), crate::nbd::u32_at(d, 4))).collect();
    assert!(descriptors.len() <= nbd::MAX_EXTENTS);
    if let RequestKind::BlockStatus { one: true } = request.kind {
        assert_eq!(descriptors.len(), 1, "REQ_ONE: one descriptor");
    }
    assert!(descriptors.iter().all(|&(l, _)| l > 0), "a descriptor of length 0");
    assert!(descriptors.windows(2).all(|w| w[0].1 != w[1].1), "neighbours with the same flags");
    let total: u64 = descriptors.iter().map(|&(l, _)| l as u64).sum();
    assert!(total <= request.length as u64, "descriptors past the request's length");
}

fn check_node_decoded(reply: &[u8], handle: u64, error: u32, data_len: usize, trailer: NodeReplyTrailer) {
    let (r, t, n) = decode_node_reply(reply).expect("a node reply").expect("a whole node reply");
    assert_eq!((r.handle, r.error), (handle, error));
    assert_eq!(t, trailer, "the trailer decodes to what was encoded");
    assert_eq!(reply.len(), n + data_len);
}

/// Decodes `data` as each storage-node message (hello, welcome, tag, reply trailer, node reply); panics if
/// a contract is broken (module comment).
pub fn node_hello(data: &[u8]) {
    if let Ok(hello) = NodeHello::decode(data) {
        assert!(hello.check().is_ok(), "a decoded hello fails the encoder's checks: {:?}", hello.check());
        let mut again = Vec::new();
        hello.encode(&mut again);
        assert_eq!(again.len(), hello.encoded_len());
        // A version above 1 may carry fields after the last tenant, which a v1 node ignores.
        assert_eq!(again[..], data[..again.len()], "an accepted hello re-encodes to its bytes");
        assert!(hello.version > 1 || again.len() == data.len(), "trailing bytes accepted in a v1 hello");
        let welcome = welcome_for(&hello);
        let mut w = Vec::new();
        welcome.encode(&mut w);
        assert_eq!(NodeWelcome::decode(&w).as_ref(), Ok(&welcome), "a welcome round-trips");
    }
    if let Ok(welcome) = NodeWelcome::decode(data) {
        let mut again = Vec::new();
        welcome.encode(&mut again);
        assert_eq!(again[..], data[..], "an accepted welcome re-encodes to its bytes");
    }
    if let Ok(tag) = NodeTag::decode(data) {
        assert!(tag.check_values().is_ok());
        let mut again = Vec::new();
        tag.encode(&mut again);
        assert_eq!(again[..], data[..NODE_TAG_LEN], "an accepted tag re-encodes to its bytes");
        let p = tag.piggyback();
        let got = (p.delta.0, p.rho.0, p.share.raw(), p.pool_busy);
        assert_eq!(got, (tag.delta, tag.rho, tag.share, tag.pool_busy), "the piggyback is exact");
    }
    if let Ok(trailer) = NodeReplyTrailer::decode(data) {
        let mut again = Vec::new();
        trailer.encode(&mut again);
        assert_eq!(again[..], data[..NODE_REPLY_TRAILER_LEN], "an accepted trailer re-encodes to its bytes");
    }
    // A v4 block-status payload: bounded from its count, and what decodes re-encodes to its bytes.
    match nbd::node_extents_len(data) {
        Ok(Some(n)) => assert!(n <= nbd::NODE_EXTENTS_MAX_LEN, "a payload longer than the bound"),
        Ok(None) => assert!(data.len() < 4, "NeedMore with a whole count"),
        Err(_) => {}
    }
    if let Ok(descriptors) = nbd::decode_node_extents(data, u32::MAX) {
        assert!(!descriptors.is_empty() && descriptors.len() <= nbd::MAX_EXTENTS);
        let mut again = Vec::new();
        nbd::encode_node_extents(&descriptors, &mut again);
        assert_eq!(again[..], data[..], "an accepted block-status payload re-encodes to its bytes");
    }
    match decode_node_reply(data) {
        Ok(Some((_, _, n))) => assert!(n <= data.len(), "a node reply longer than its input"),
        Ok(None) => assert!(data.len() < SIMPLE_REPLY_LEN + NODE_REPLY_TRAILER_LEN, "NeedMore with a whole reply"),
        Err(_) => {}
    }
}

fn check_decoded(reply: &[u8], handle: u64, error: u32, data_len: usize, structured: bool, offset: u64) {
    let (header, n) = ReplyHeader::decode(reply).expect("a reply magic").expect("a whole header");
    match header {
        ReplyHeader::Simple { error: e, handle: h } => {
            assert!(!structured, "a simple reply after structured replies were negotiated");
            assert_eq!((h, e), (handle, error));
            assert_eq!(reply.len(), n + data_len);
        }
        ReplyHeader::Chunk { flags, kind, handle: h, length } => {
            assert!(structured, "a structured reply that was not negotiated");
            assert_eq!((h, flags & REPLY_FLAG_DONE), (handle, REPLY_FLAG_DONE));
            assert_eq!(reply.len(), n + length as usize);
            let payload = &reply[n..];
            match kind {
                REPLY_TYPE_NONE => assert_eq!((error, data_len, length), (0, 0, 0)),
                REPLY_TYPE_OFFSET_DATA => {
                    assert_eq!(error, 0);
                    assert_eq!(length as usize, 8 + data_len);
                    assert!(data_len > 0, "OFFSET_DATA carries at least one byte");
                    assert_eq!(payload[..8], offset.to_be_bytes());
                }
                REPLY_TYPE_ERROR => {
                    assert_eq!(payload[..4], error.to_be_bytes());
                    let msg = u16::from_be_bytes([payload[4], payload[5]]) as usize;
                    assert_eq!(6 + msg, payload.len());
                    assert!(std::str::from_utf8(&payload[6..]).is_ok(), "error messages are UTF-8");
                }
                other => panic!("unexpected chunk type {other}"),
            }
        }
    }
}

/// Decodes `data` as a PARDA record and as a slot (whole, and its first record- and slot-sized windows,
/// the record also with its checksum made valid); whatever decodes must re-encode to the same bytes.
pub fn parda(data: &[u8]) {
    if let Ok(r) = record::decode(data) {
        assert_eq!(record::encode(&r)[..], data[..], "an accepted record re-encodes to its bytes");
    }
    if let Ok(s) = record::decode_slot(data) {
        match s {
            record::Slot::Empty => assert!(data.iter().all(|&b| b == 0)),
            record::Slot::Record(r) => assert_eq!(record::encode_slot(&r)[..], data[..]),
        }
    }
    if data.len() >= record::RECORD_BYTES {
        let _ = record::decode(&data[..record::RECORD_BYTES]);
        // The same bytes with a valid checksum, so that the field checks behind it are reached too.
        let mut sealed = [0u8; record::RECORD_BYTES];
        sealed.copy_from_slice(&data[..record::RECORD_BYTES]);
        let crc = crc32fast::hash(&sealed[..60]);
        sealed[60..].copy_from_slice(&crc.to_le_bytes());
        if let Ok(r) = record::decode(&sealed) {
            assert_eq!(record::encode(&r), sealed, "an accepted record re-encodes to its bytes");
        }
    }
    if data.len() >= record::SLOT_BYTES {
        let _ = record::decode_slot(&data[..record::SLOT_BYTES]);
    }
    // Signed records: under a key, what decodes re-encodes signed to its bytes; the same bytes with a
    // valid checksum and tag reach the field checks.
    let auth = HarnessAuth;
    for a in [Some(&auth as &dyn record::RecordAuth), None] {
        if let Ok(r) = record::decode_datagram(data, a) {
            assert_eq!(record::encode_datagram(&r, a)[..], data[..], "an accepted datagram re-encodes");
        }
        if let Ok(record::Slot::Record(r)) = record::decode_slot_with(data, a) {
            assert_eq!(record::encode_slot_with(&r, a)[..], data[..], "an accepted slot re-encodes");
        }
    }
    if data.len() >= record::RECORD_BYTES {
        let mut signed = [0u8; record::SIGNED_BYTES];
        signed[..record::RECORD_BYTES].copy_from_slice(&data[..record::RECORD_BYTES]);
        let crc = crc32fast::hash(&signed[..60]);
        signed[60..64].copy_from_slice(&crc.to_le_bytes());
        let rec: [u8; record::RECORD_BYTES] = signed[..record::RECORD_BYTES].try_into().expect("64 bytes");
        signed[record::RECORD_BYTES..].copy_from_slice(&record::RecordAuth::tag(&auth, &rec));
        if let Ok(r) = record::decode_datagram(&signed, Some(&auth)) {
            assert_eq!(record::encode_signed(&r, &auth), signed, "a signed record re-encodes");
        }
    }
}

/// The parda harness's key: SipHash with fixed keys stands in for rein-runtime's HMAC (the decoder only
/// places and compares tags).
struct HarnessAuth;

impl crate::parda::RecordAuth for HarnessAuth {
    fn tag(&self, rec: &[u8; crate::parda::RECORD_BYTES]) -> [u8; crate::parda::TAG_BYTES] {
        use std::hash::{Hash, Hasher};
        let mut t = [0u8; crate::parda::TAG_BYTES];
        for (i, c) in t.chunks_exact_mut(8).enumerate() {
            let mut h = std::hash::DefaultHasher::new();
            (i as u8, rec).hash(&mut h);
            c.copy_from_slice(&h.finish().to_le_bytes());
        }
        t
    }
}

/// Decodes `data` as a stream of pShift frames (and each frame's header announces no more than
/// [`crate::pshift::MAX_BODY`]); whatever decodes must re-encode to the bytes it came from. The reports
/// and notes reach a controller, whose answers stay within the token bound and whose closed periods come
/// out once each, in order, however late reports finish them, as its tallies count them.
pub fn pshift(data: &[u8]) {
    use crate::pshift as wire;
    use rein_core::pshift::{
        BucketQos, Controller, ControllerConfig, DemandEstimator, EarlyRounds, SolveOptions, Tokens, MAX_TOKENS,
    };
    use rein_core::Nanos;
    // A controller of 3 servers and 4 buckets (reserved, limited, both, neither), early rounds on.
    let config = ControllerConfig {
        period: Nanos::from_secs(1),
        intervals: 5,
        start: Nanos::ZERO,
        estimator: DemandEstimator::Backlog,
        backlog_idle_bp: ControllerConfig::DEFAULT_BACKLOG_IDLE_BP,
        solve: SolveOptions::default(),
        report_timeout: Nanos::from_millis(100),
        answer_delay: Nanos::from_millis(1),
        early: EarlyRounds { per_interval: EarlyRounds::DEFAULT_PER_INTERVAL, lead: Nanos::from_millis(10) },
    };
    let buckets = vec![
        BucketQos { reservation: 300, limit: None },
        BucketQos { reservation: 0, limit: Some(200) },
        BucketQos { reservation: 100, limit: Some(400) },
        BucketQos { reservation: 0, limit: None },
    ];
    let mut ctl = Controller::new(config, &[1000.0, 2000.0, 500.0], buckets).expect("a valid controller");
    let mut now = Nanos::ZERO;
    let mut at = 0;
    // Closed periods' records, however late reports finish them: each period once, in order, as tallied.
    let mut next_period = 0;
    let mut take = |records: Vec<rein_core::pshift::ClosedPeriod>, ctl: &Controller| {
        for r in records {
            assert_eq!(r.period, next_period, "closed periods come out once each, in order");
            assert_eq!(r.completed.len(), 4, "a count per bucket");
            next_period += 1;
        }
        assert!(ctl.periods().iter().all(|t| t.closed == next_period), "the tallies count the records handed out");
    };
    while at < data.len() {
        let rest = &data[at..];
        match wire::decode(rest) {
            Ok(Some((m, used))) => {
                assert!(used >= wire::HEADER_BYTES && used <= rest.len(), "used more than given");
                assert_eq!(wire::frame_len(rest), Ok(Some(used)));
                let mut out = Vec::new();
                wire::encode(&m, &mut out).expect("a decoded message encodes");
                assert_eq!(out[..], rest[..used], "an accepted frame re-encodes to its bytes");
                at += used;
                // What a server may send reaches the controller; the rest (its own frames) is refused there.
                now = Nanos(now.0 + 200_000_000 / 3);
                match m {
                    wire::Message::Report(r) => {
                        let _ = ctl.handle_report(r);
                        take(ctl.take_closed(), &ctl);
                    }
                    wire::Message::Stray(s) => {
                        let _ = ctl.handle_stray(now, s);
                    }
                    _ => {}
                }
                while let Some((msgs, summary)) = ctl.poll(now) {
                    take(summary.closed, &ctl);
                    for (_, r, l) in msgs.iter().flat_map(|m| &m.tokens) {
                        assert!(*r <= MAX_TOKENS, "R-tokens within the bound");
                        assert!(
                            matches!(l, Tokens::Unlimited) || matches!(l, Tokens::Count(c) if *c <= 2 * MAX_TOKENS)
                        );
                    }
                }
            }
            Ok(None) => {
                // Incomplete: either the header, or a body the header says is longer than what is left.
                if let Ok(Some(n)) = wire::frame_len(rest) {
                    assert!(n > rest.len() && n <= wire::HEADER_BYTES + wire::MAX_BODY);
                } else {
                    assert!(rest.len() < wire::HEADER_BYTES);
                }
                return;
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                return;
            }
        }
    }
}

/// Decodes `data` as a stream of transmission replies (each header, then a chunk's payload skipped) and as
/// a stream of option replies, as a client reads them; panics if a contract is broken (module comment).
pub fn replies(data: &[u8]) {
    let mut rest = data;
    loop {
        let magic = (rest.len() >= 4).then(|| u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]));
        match ReplyHeader::decode(rest) {
            Ok(None) => {
                let need = match magic {
                    None => 4,
                    Some(SIMPLE_REPLY_MAGIC) => SIMPLE_REPLY_LEN,
                    Some(m) => {
                        assert_eq!(m, STRUCTURED_REPLY_MAGIC, "NeedMore on a bad reply magic");
                        CHUNK_HEADER_LEN
                    }
                };
                assert!(rest.len() < need, "NeedMore with a whole reply header there");
                break;
            }
            Err(ProtoError::BadMagic { found, .. }) => {
                assert!(
                    magic.is_some_and(|m| m as u64 == found && m != SIMPLE_REPLY_MAGIC && m != STRUCTURED_REPLY_MAGIC)
                );
                break;
            }
            Err(e) => panic!("unexpected reply error {e}"),
            Ok(Some((header, n))) => {
                assert!(n <= rest.len(), "a reply header longer than its input");
                let mut again = Vec::new();
                let skip = match header {
                    ReplyHeader::Simple { error, handle } => {
                        nbd::simple_reply(&mut again, handle, error);
                        0
                    }
                    ReplyHeader::Chunk { flags, kind, handle, length } => {
                        let mut h = [0u8; CHUNK_HEADER_LEN];
                        nbd::write_chunk_header(&mut h, handle, flags, kind, length);
                        again.extend_from_slice(&h);
                        length as usize
                    }
                };
                assert_eq!(again[..], rest[..n], "a reply header re-encodes to its bytes");
                rest = &rest[n..];
                rest = &rest[skip.min(rest.len())..];
            }
        }
    }
    let mut rest = data;
    loop {
        match nbd::decode_option_reply(rest) {
            Ok(None) => {
                let declared = rest.get(16..20).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
                assert!(declared.is_none_or(|len| rest.len() < 20 + len), "NeedMore with a whole option reply there");
                break;
            }
            Err(ProtoError::BadMagic { found, .. }) => {
                assert_ne!(found, REPLY_MAGIC_OPT);
                break;
            }
            Err(ProtoError::OptionTooLong { len, max, .. }) => {
                assert!(len > max, "a reply within the bound refused as too long");
                break;
            }
            Err(e) => panic!("unexpected option reply error {e}"),
            Ok(Some((reply, n))) => {
                assert!(n <= rest.len(), "an option reply longer than its input");
                let mut again = Vec::new();
                nbd::option_reply(&mut again, reply.option, reply.reply, reply.data);
                assert_eq!(again[..], rest[..n], "an option reply re-encodes to its bytes");
                rest = &rest[n..];
            }
        }
    }
}

/// One request of the [`client_replies`] harness: a READ of `length` bytes, a BLOCK_STATUS of `length`
/// bytes, or a WRITE of `length` bytes, at `offset`.
#[derive(Debug, Clone, Copy)]
pub struct SentRequest {
    /// READ (else BLOCK_STATUS or WRITE).
    pub read: bool,
    /// BLOCK_STATUS (if not READ; else WRITE), for the context [`nbd::BASE_ALLOCATION_ID`].
    pub status: bool,
    /// The request's offset.
    pub offset: u64,
    /// Its length.
    pub length: u32,
}

/// Feeds `stream` to a client that sent `requests` (handles 1, 2, ...), in pieces of `sizes`: the replies
/// in order, and the protocol error that ended it, if any; panics if a contract is broken (module comment).
pub fn replies_run(
    structured: bool,
    requests: &[SentRequest],
    stream: &[u8],
    sizes: &[usize],
) -> (Vec<(u64, ClientReply)>, Option<String>) {
    let mut c = ClientTransmission::new(structured, requests.len().max(1));
    c.set_meta_context(Some(nbd::BASE_ALLOCATION_ID));
    for (i, r) in requests.iter().enumerate() {
        let command = match (r.read, r.status) {
            (true, _) => Command::Read,
            (false, true) => Command::BlockStatus,
            (false, false) => Command::Write,
        };
        c.sent(&RequestHeader { flags: 0, command, handle: i as u64 + 1, offset: r.offset, length: r.length })
            .expect("distinct handles within the bound");
    }
    let mut replies = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut start = 0;
    let mut input = pieces(stream, sizes);
    loop {
        match c.decode(&buf[start..]) {
            Err(e) => return (replies, Some(e.to_string())),
            Ok(ClientEvent::NeedMore { wanted }) => {
                assert!(wanted > buf.len() - start, "NeedMore for {wanted} with {} bytes there", buf.len() - start);
                match input.next() {
                    Some(p) => buf.extend_from_slice(p),
                    None => return (replies, None),
                }
            }
            Ok(ClientEvent::Chunk { used }) => {
                assert!(used > 0 && used <= buf.len() - start, "a chunk of {used} bytes");
                start += used;
            }
            Ok(ClientEvent::Reply { used, handle, reply }) => {
                assert!(used > 0 && used <= buf.len() - start, "a reply of {used} bytes");
                start += used;
                let r =
                    handle.checked_sub(1).and_then(|i| requests.get(i as usize)).expect("a reply to a request sent");
                assert!(replies.iter().all(|(h, _)| *h != handle), "request {handle} answered twice");
                match &reply {
                    Ok(data) if !r.read && r.status => {
                        // Descriptors: at least one, at most MAX_EXTENTS, each non-empty, within the request.
                        assert!(
                            data.len().is_multiple_of(8) && (8..=8 * nbd::MAX_EXTENTS).contains(&data.len()),
                            "{handle}"
                        );
                        let total: u64 = nbd::status_descriptors(data)
                            .inspect(|&(len, _)| assert!(len > 0, "an empty descriptor for {handle}"))
                            .map(|(len, _)| u64::from(len))
                            .sum();
                        assert!(total <= u64::from(r.length), "descriptors beyond request {handle}");
                    }
                    Ok(data) => {
                        assert_eq!(data.len(), if r.read { r.length as usize } else { 0 }, "reply length of {handle}")
                    }
                    Err(_) => {}
                }
                replies.push((handle, reply));
            }
        }
    }
}

/// Decodes `data` as this harness lays it out: byte 0 (bit 0 structured replies, bits
/// 1-3 one to eight requests, bits 4-7 how to split), three bytes per request (bit 0 of the first: a
/// READ, else bit 1: a BLOCK_STATUS, else a WRITE; then its length, big-endian u16; request i is at offset i * 65,536), then what the server sends.
/// Panics if a contract is broken (module comment).
pub fn client_replies(data: &[u8]) {
    let Some((&head, rest)) = data.split_first() else { return };
    let n = 1 + ((head >> 1) & 7) as usize;
    if rest.len() < 3 * n {
        return;
    }
    let requests: Vec<SentRequest> = rest[..3 * n]
        .chunks(3)
        .enumerate()
        .map(|(i, b)| SentRequest {
            read: b[0] & 1 == 1,
            status: b[0] & 2 == 2,
            offset: i as u64 * 65_536,
            length: u16::from_be_bytes([b[1], b[2]]) as u32,
        })
        .collect();
    let stream = &rest[3 * n..];
    let whole = replies_run(head & 1 == 1, &requests, stream, &[stream.len().max(1)]);
    let split = replies_run(head & 1 == 1, &requests, stream, &chunk_sizes(head >> 4));
    assert_eq!(whole, split, "the same replies whole and split");
}
