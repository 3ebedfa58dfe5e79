//! NBD codec tests: byte layouts from the spec, client and server state machines talking to each other in
//! memory (whole, byte by byte, random chunks), and malformed input.
use proptest::prelude::*;
use rein_proto::nbd::*;

fn exports() -> Vec<ExportInfo> {
    vec![
        ExportInfo {
            name: "rd".into(),
            description: "remote desktop".into(),
            size: 1 << 30,
            read_only: false,
            volatile: false,
            min_block: 1,
        },
        ExportInfo {
            name: "ro".into(),
            description: String::new(),
            size: 4096,
            read_only: true,
            volatile: false,
            min_block: 1,
        },
    ]
}

/// Runs client and server handshakes against each other, moving `chunk(i)` bytes at a time.
fn handshake(
    export: &str,
    structured: bool,
    chunk: impl FnMut() -> usize,
) -> (Result<ClientProgress, ProtoError>, Option<Result<ServerProgress, ProtoError>>) {
    drive(ClientHandshake::new(export, structured), chunk).0
}

/// Runs `client` against a server handshake, moving `chunk(i)` bytes at a time; also returns the bytes
/// the client wrote last that the server has not read.
#[allow(clippy::type_complexity)]
fn drive(
    mut client: ClientHandshake,
    mut chunk: impl FnMut() -> usize,
) -> ((Result<ClientProgress, ProtoError>, Option<Result<ServerProgress, ProtoError>>), Vec<u8>) {
    let mut to_client = Vec::new();
    let mut server = ServerHandshake::new(exports(), &mut to_client);
    let (mut to_server, mut c_in, mut s_in) = (Vec::new(), Vec::new(), Vec::new());
    let mut server_result = None;
    for _ in 0..10_000 {
        // Move some bytes each way.
        let n = chunk().min(to_client.len());
        c_in.extend(to_client.drain(..n));
        let n = chunk().min(to_server.len());
        s_in.extend(to_server.drain(..n));
        if server_result.is_none() && !s_in.is_empty() {
            match server.feed(&s_in, &mut to_client) {
                Ok((used, p)) => {
                    s_in.drain(..used);
                    if p != ServerProgress::NeedMore {
                        server_result = Some(Ok(p));
                    }
                }
                Err(e) => server_result = Some(Err(e)),
            }
        }
        match client.feed(&c_in, &mut to_server) {
            Ok((used, ClientProgress::NeedMore)) => {
                c_in.drain(..used);
            }
            Ok((_, p)) => return ((Ok(p), server_result), [s_in, to_server].concat()),
            Err(e) => return ((Err(e), server_result), [s_in, to_server].concat()),
        }
    }
    panic!("handshake did not finish");
}

/// Runs a probe of `exports` against `server` in lockstep, `step` bytes at a time each way, calling
/// `before(server, options seen)` before each feed of the server; returns the probe's end and every option
/// the client sent (code and data), in order.
#[allow(clippy::type_complexity)]
fn probe_against(
    exports: &[&str],
    mut server: ServerHandshake,
    mut to_client: Vec<u8>,
    step: usize,
    mut before: impl FnMut(&mut ServerHandshake, usize),
) -> (Result<ClientProgress, ProtoError>, Vec<(u32, Vec<u8>)>) {
    let mut client = ClientHandshake::probe(exports);
    let (mut to_server, mut c_in, mut s_in, mut sent) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut server_done = false;
    for _ in 0..1_000_000 {
        let n = step.min(to_client.len());
        c_in.extend(to_client.drain(..n));
        let n = step.min(to_server.len());
        let moved: Vec<u8> = to_server.drain(..n).collect();
        sent.extend_from_slice(&moved);
        s_in.extend(moved);
        if !server_done && !s_in.is_empty() {
            before(&mut server, options(&sent).len());
            match server.feed(&s_in, &mut to_client) {
                Ok((used, p)) => {
                    s_in.drain(..used);
                    server_done = p != ServerProgress::NeedMore;
                    assert!(matches!(p, ServerProgress::NeedMore | ServerProgress::Aborted), "{p:?}");
                }
                Err(e) => panic!("the server refused the probe's bytes: {e}"),
            }
        }
        match client.feed(&c_in, &mut to_server) {
            Ok((used, ClientProgress::NeedMore)) => {
                c_in.drain(..used);
            }
            Ok((_, p)) => {
                sent.extend_from_slice(&to_server);
                return (Ok(p), options(&sent));
            }
            Err(e) => return (Err(e), options(&sent)),
        }
    }
    panic!("the probe did not finish");
}

/// The options in a client's stream (after its 4-byte flags): code and data.
fn options(stream: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let mut at = 4;
    let mut found = Vec::new();
    while stream.len() >= at + 16 {
        let len = u32::from_be_bytes(stream[at + 12..at + 16].try_into().unwrap()) as usize;
        if stream.len() < at + 16 + len {
            break;
        }
        let code = u32::from_be_bytes(stream[at + 8..at + 12].try_into().unwrap());
        found.push((code, stream[at + 16..at + 16 + len].to_vec()));
        at += 16 + len;
    }
    found
}

/// The export an NBD_OPT_INFO's data names.
fn info_name(data: &[u8]) -> String {
    let len = u32::from_be_bytes(data[..4].try_into().unwrap()) as usize;
    String::from_utf8(data[4..4 + len].to_vec()).unwrap()
}

/// A probe of several exports asks each with its own NBD_OPT_INFO on the one connection, in order, then
/// sends NBD_OPT_ABORT (which ends the server's handshake, nothing opened), and answers each export: its
/// size and flags, or the server's error for that export alone (an unknown one between two known ones
/// fails neither). Before, a probe asked for one export and an error reply failed the whole probe.
#[test]
fn a_probe_asks_each_export_and_answers_each() {
    let [rd, ro] = [&exports()[0], &exports()[1]];
    let want = vec![
        Probed::Info { size: rd.size, flags: rd.transmission_flags() },
        Probed::Refused { reply: REP_ERR_UNKNOWN, message: "no export named \"nope\"".into() },
        Probed::Info { size: ro.size, flags: ro.transmission_flags() },
        Probed::Info { size: rd.size, flags: rd.transmission_flags() },
    ];
    assert!(ro.transmission_flags() & TFLAG_READ_ONLY != 0 && rd.transmission_flags() & TFLAG_READ_ONLY == 0);
    for step in [usize::MAX, 1, 3, 17] {
        let mut out = Vec::new();
        let server = ServerHandshake::new(exports(), &mut out);
        let (end, sent) = probe_against(&["rd", "nope", "ro", "rd"], server, out, step, |_, _| {});
        assert_eq!(end.unwrap(), ClientProgress::Info(want.clone()), "step {step}");
        let codes: Vec<u32> = sent.iter().map(|(c, _)| *c).collect();
        assert_eq!(codes, [OPT_INFO, OPT_INFO, OPT_INFO, OPT_INFO, OPT_ABORT], "step {step}");
        let names: Vec<String> = sent[..4].iter().map(|(_, d)| info_name(d)).collect();
        assert_eq!(names, ["rd", "nope", "ro", "rd"]);
    }
    // One export is the probe as it was; none sends only the ABORT.
    let mut out = Vec::new();
    let server = ServerHandshake::new(exports(), &mut out);
    let (end, sent) = probe_against(&["ro"], server, out, 5, |_, _| {});
    assert_eq!(end.unwrap(), ClientProgress::Info(vec![want[2].clone()]));
    assert_eq!(sent.len(), 2);
    let mut out = Vec::new();
    let server = ServerHandshake::new(exports(), &mut out);
    let (end, sent) = probe_against(&[], server, out, 5, |_, _| {});
    assert_eq!(end.unwrap(), ClientProgress::Info(Vec::new()));
    assert_eq!(sent, [(OPT_ABORT, Vec::new())]);
}

/// A server that starts shutting down during a probe answers the export asked then
/// NBD_REP_ERR_SHUTDOWN; the spec has the client leave: the exports not yet asked get the same error,
/// unasked, and the probe aborts. The exports answered before keep their answers.
#[test]
fn a_probe_stops_at_a_server_shutting_down() {
    let mut out = Vec::new();
    let server = ServerHandshake::new(exports(), &mut out);
    let (end, sent) = probe_against(&["rd", "ro", "rd"], server, out, usize::MAX, |s, seen| {
        if seen >= 2 {
            s.shut_down();
        }
    });
    let ClientProgress::Info(answers) = end.unwrap() else { panic!("a probe ends with Info") };
    assert!(matches!(answers[0], Probed::Info { .. }), "{answers:?}");
    assert!(answers[1..].iter().all(|a| matches!(a, Probed::Refused { reply: REP_ERR_SHUTDOWN, .. })), "{answers:?}");
    assert_eq!(sent.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [OPT_INFO, OPT_INFO, OPT_ABORT]);
}

/// `rein serve`'s handshake counts no options: one probe of 1,024 exports (past any bound a gateway
/// uses) is answered whole, and a probe of [`PROBE_EXPORTS_ANY_SERVER`] exports over TLS sends 32
/// options in all (STARTTLS, the INFOs, ABORT): nbdkit's limit, reached and not passed.
#[test]
fn a_probe_stays_within_the_options_a_server_takes() {
    let names: Vec<String> = (0..1024).map(|i| if i % 2 == 0 { "rd".into() } else { "ro".into() }).collect();
    let mut out = Vec::new();
    let server = ServerHandshake::new(exports(), &mut out);
    let names_ref: Vec<&str> = names.iter().map(String::as_str).collect();
    let (end, sent) = probe_against(&names_ref, server, out, usize::MAX, |_, _| {});
    let ClientProgress::Info(answers) = end.unwrap() else { panic!("a probe ends with Info") };
    assert_eq!(answers.len(), 1024);
    assert!(answers.iter().all(|a| matches!(a, Probed::Info { .. })));
    assert_eq!(sent.len(), 1025);
    // Over TLS: STARTTLS first.
    let exports_at_bound = &names_ref[..PROBE_EXPORTS_ANY_SERVER];
    let mut hs = ClientHandshake::probe(exports_at_bound).require_tls();
    let mut greeting = Vec::new();
    let mut server = ServerHandshake::new(exports(), &mut greeting);
    server.set_tls(TlsMode::Require);
    let (mut to_server, mut to_client, mut sent) = (Vec::new(), greeting, Vec::new());
    let mut tls_up = false;
    loop {
        let before = to_server.len();
        let (used, progress) = hs.feed(&to_client, &mut to_server).unwrap();
        sent.extend_from_slice(&to_server[before..]);
        to_client.drain(..used);
        if let ClientProgress::Info(answers) = progress {
            assert!(answers.iter().all(|a| matches!(a, Probed::Info { .. })), "{answers:?}");
            assert_eq!(answers.len(), PROBE_EXPORTS_ANY_SERVER);
            break;
        }
        if progress == ClientProgress::StartTls && !tls_up {
            hs.tls_established().unwrap();
            server.tls_established();
            tls_up = true;
            continue;
        }
        let (used, progress) = server.feed(&to_server, &mut to_client).unwrap();
        to_server.drain(..used);
        assert!(matches!(progress, ServerProgress::NeedMore | ServerProgress::StartTls), "{progress:?}");
    }
    let count = options(&sent).len();
    assert_eq!(count, 32, "STARTTLS, 30 INFOs and ABORT: nbdkit's 32 options");
}

#[test]
fn greeting_is_byte_exact() {
    let mut out = Vec::new();
    let _ = ServerHandshake::new(exports(), &mut out);
    assert_eq!(&out[..8], b"NBDMAGIC");
    assert_eq!(&out[8..16], b"IHAVEOPT");
    assert_eq!(&out[16..], &[0, 3], "FIXED_NEWSTYLE | NO_ZEROES");
}

#[test]
fn go_round_trip_whole_and_byte_by_byte() {
    for step in [usize::MAX, 1] {
        let (c, s) = handshake("rd", false, || step);
        assert_eq!(
            c.unwrap(),
            ClientProgress::Ready { size: 1 << 30, flags: exports()[0].transmission_flags(), structured: false }
        );
        assert_eq!(
            s.unwrap().unwrap(),
            ServerProgress::Done(Negotiated { export: 0, structured: false, node: None, base_allocation: false })
        );
    }
    let (c, s) = handshake("ro", true, || 3);
    match c.unwrap() {
        ClientProgress::Ready { size, flags, structured } => {
            assert_eq!(size, 4096);
            assert!(flags & TFLAG_READ_ONLY != 0 && structured);
            // With structured replies the server honours DF, and the NBD spec says it must say so.
            assert_eq!(flags, exports()[1].transmission_flags() | TFLAG_SEND_DF);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.unwrap().unwrap(),
        ServerProgress::Done(Negotiated { export: 1, structured: true, node: None, base_allocation: false })
    );
    // The empty name opens nothing unless a default export is set (issue 12: it used to open the first
    // export); tests/nbd_access.rs opens the default one.
    let (c, _) = handshake("", false, || 7);
    assert!(matches!(c.unwrap_err(), ProtoError::OptionRefused { reply: REP_ERR_UNKNOWN, .. }));
}

#[test]
fn unknown_export_is_refused_and_the_server_stays_in_options() {
    let (c, s) = handshake("nope", false, || 5);
    match c.unwrap_err() {
        ProtoError::OptionRefused { reply, message, .. } => {
            assert_eq!(reply, REP_ERR_UNKNOWN);
            assert!(message.contains("nope"));
        }
        e => panic!("{e:?}"),
    }
    assert!(s.is_none(), "server still waits for another option");
}

fn server_with(input: &[u8]) -> (Result<(usize, ServerProgress), ProtoError>, Vec<u8>) {
    let mut out = Vec::new();
    let mut s = ServerHandshake::new(exports(), &mut out);
    out.clear();
    let r = s.feed(input, &mut out);
    (r, out)
}

fn flags_and(opts: &[(u32, &[u8])]) -> Vec<u8> {
    let mut v = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    for (o, d) in opts {
        option_request(&mut v, *o, d);
    }
    v
}

#[test]
fn list_export_name_abort_and_unsupported_options() {
    // LIST: one NBD_REP_SERVER per export, then ACK.
    let (r, out) = server_with(&flags_and(&[(OPT_LIST, &[])]));
    assert_eq!(r.unwrap().1, ServerProgress::NeedMore);
    let mut rest = &out[..];
    let mut names = vec![];
    while let Some((OptionReply { option: opt, reply, data }, n)) = decode_option_reply(rest).unwrap() {
        assert_eq!(opt, OPT_LIST);
        if reply == REP_SERVER {
            let l = u32::from_be_bytes(data[..4].try_into().unwrap()) as usize;
            names.push(String::from_utf8(data[4..4 + l].to_vec()).unwrap());
        } else {
            assert_eq!(reply, REP_ACK);
        }
        rest = &rest[n..];
    }
    assert_eq!(names, vec!["rd", "ro"]);
    // EXPORT_NAME: size, flags and 124 zeroes (client did not ask for NO_ZEROES).
    let (r, out) = server_with(&flags_and(&[(OPT_EXPORT_NAME, b"ro")]));
    assert_eq!(
        r.unwrap().1,
        ServerProgress::Done(Negotiated { export: 1, structured: false, node: None, base_allocation: false })
    );
    assert_eq!(out.len(), 8 + 2 + 124);
    assert_eq!(u64::from_be_bytes(out[..8].try_into().unwrap()), 4096);
    // ... and none with NO_ZEROES.
    let mut v = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    option_request(&mut v, OPT_EXPORT_NAME, b"rd");
    assert_eq!(server_with(&v).1.len(), 10);
    // Unknown EXPORT_NAME: the spec says close.
    assert!(server_with(&flags_and(&[(OPT_EXPORT_NAME, b"zz")])).0.is_err());
    // ABORT is acknowledged.
    let (r, out) = server_with(&flags_and(&[(OPT_ABORT, &[])]));
    assert_eq!(r.unwrap().1, ServerProgress::Aborted);
    assert_eq!(decode_option_reply(&out).unwrap().unwrap().0.reply, REP_ACK);
    // Unknown option and STARTTLS: errors, and the handshake goes on.
    let (r, out) = server_with(&flags_and(&[(99, b"x"), (OPT_STARTTLS, &[])]));
    assert_eq!(r.unwrap().1, ServerProgress::NeedMore);
    let (OptionReply { reply, .. }, n) = decode_option_reply(&out).unwrap().unwrap();
    assert_eq!(reply, REP_ERR_UNSUP);
    assert_eq!(decode_option_reply(&out[n..]).unwrap().unwrap().0.reply, REP_ERR_POLICY);
}

#[test]
fn malformed_handshakes_are_errors() {
    // Old-style client flags (no fixed newstyle) and unknown flags.
    assert!(matches!(server_with(&0u32.to_be_bytes()).0, Err(ProtoError::ClientFlags(0))));
    assert!(matches!(server_with(&0x81u32.to_be_bytes()).0, Err(ProtoError::ClientFlags(_))));
    // Bad option magic.
    let mut v = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    v.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
    assert!(matches!(server_with(&v).0, Err(ProtoError::BadMagic { .. })));
    // Oversize option.
    let mut v = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&OPT_GO.to_be_bytes());
    v.extend_from_slice(&(1u32 << 30).to_be_bytes());
    assert!(matches!(server_with(&v).0, Err(ProtoError::OptionTooLong { .. })));
    // GO with a bad name length is answered (not fatal).
    let mut d = 100u32.to_be_bytes().to_vec();
    d.extend_from_slice(b"rd\0\0");
    let (r, out) = server_with(&flags_and(&[(OPT_GO, &d)]));
    assert_eq!(r.unwrap().1, ServerProgress::NeedMore);
    assert_eq!(decode_option_reply(&out).unwrap().unwrap().0.reply, REP_ERR_INVALID);
}

#[test]
fn requests_and_replies_round_trip() {
    let h =
        RequestHeader { flags: CMD_FLAG_FUA, command: Command::Write, handle: 0xdead_beef, offset: 4096, length: 512 };
    let mut b = Vec::new();
    h.encode(&mut b);
    assert_eq!(b.len(), REQUEST_LEN);
    assert_eq!(&b[..4], &[0x25, 0x60, 0x95, 0x13]);
    assert_eq!(RequestHeader::decode(&b[..27]).unwrap(), None);
    let d = RequestHeader::decode(&b).unwrap().unwrap();
    assert_eq!(d, h);
    assert!(d.fua());
    let mut bad = b.clone();
    bad[0] = 0;
    assert!(RequestHeader::decode(&bad).is_err());
    let mut o = Vec::new();
    b[7] = 42;
    assert_eq!(RequestHeader::decode(&b).unwrap().unwrap().command, Command::Other(42));
    simple_reply(&mut o, 7, EINVAL);
    assert_eq!(ReplyHeader::decode(&o).unwrap().unwrap(), (ReplyHeader::Simple { error: EINVAL, handle: 7 }, 16));
    o.clear();
    structured_chunk(&mut o, 9, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, &[&8u64.to_be_bytes(), b"abcd"]);
    assert_eq!(
        ReplyHeader::decode(&o).unwrap().unwrap().0,
        ReplyHeader::Chunk { flags: 1, kind: REPLY_TYPE_OFFSET_DATA, handle: 9, length: 12 }
    );
    o.clear();
    structured_error(&mut o, 9, EIO, "disk on fire");
    assert!(matches!(
        ReplyHeader::decode(&o).unwrap().unwrap().0,
        ReplyHeader::Chunk { kind: REPLY_TYPE_ERROR, length: 18, .. }
    ));
}

/// An option request: a known option with well-formed or random data, or an unknown one.
fn option() -> impl Strategy<Value = (u32, Vec<u8>)> {
    let name = prop_oneof![Just(b"a".to_vec()), Just(b"ro".to_vec()), Just(Vec::new()), Just(b"zz".to_vec())];
    let info = (name.clone(), proptest::collection::vec(0u16..5, 0..4)).prop_map(|(n, reqs)| {
        let mut d = (n.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(&n);
        d.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
        for r in reqs {
            d.extend_from_slice(&r.to_be_bytes());
        }
        d
    });
    let query = prop_oneof![
        Just(b"base:allocation".to_vec()),
        Just(b"base:".to_vec()),
        Just(b"qemu:dirty-bitmap:x".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..8),
    ];
    let meta = (name.clone(), proptest::collection::vec(query, 0..3)).prop_map(|(n, queries)| {
        let mut d = (n.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(&n);
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(&q);
        }
        d
    });
    prop_oneof![
        3 => (prop_oneof![Just(OPT_INFO), Just(OPT_GO)], info),
        2 => (prop_oneof![Just(OPT_LIST_META_CONTEXT), Just(OPT_SET_META_CONTEXT)], meta),
        2 => Just((OPT_LIST, Vec::new())),
        2 => Just((OPT_STRUCTURED_REPLY, Vec::new())),
        1 => name.prop_map(|n| (OPT_EXPORT_NAME, n)),
        1 => Just((OPT_ABORT, Vec::new())),
        1 => Just((OPT_STARTTLS, Vec::new())),
        1 => (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..32)),
    ]
}

proptest! {
    #[test]
    fn handshake_survives_any_chunking(sizes in proptest::collection::vec(1usize..40, 1..64), structured in any::<bool>()) {
        let mut i = 0;
        let (c, s) = handshake("rd", structured, || { i += 1; sizes[i % sizes.len()] });
        let ready = matches!(c, Ok(ClientProgress::Ready { .. }));
        prop_assert!(ready);
        let done = matches!(s, Some(Ok(ServerProgress::Done(_))));
        prop_assert!(done);
    }

    /// The fuzz target's entry point on random bytes (with and without valid client flags first).
    #[test]
    fn handshake_harness_on_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        rein_proto::harness::handshake(&data);
    }

    /// ... and on streams of well-formed options (the path a fuzzer finds last), whole and in pieces.
    #[test]
    /// Every server setup of the harness: plain, TLS offered, TLS required with a hidden export, refused.
    #[test]
    fn handshake_harness_on_option_streams(opts in proptest::collection::vec(option(), 0..12), seed in any::<u8>(), setup in 0u8..4) {
        let mut data = vec![1 | setup << 1, seed];
        for (o, d) in &opts {
            option_request(&mut data, *o, d);
        }
        rein_proto::harness::handshake(&data);
    }

    /// The `nbd_reply` fuzz target's entry point on streams of well-formed server replies (simple, chunks
    /// with their payload, option replies), cut short anywhere and with one byte changed.
    #[test]
    fn replies_harness_on_reply_streams(
        replies in proptest::collection::vec((any::<u64>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..64)), 0..8),
        cut in any::<prop::sample::Index>(), at in any::<prop::sample::Index>(), xor in any::<u8>(),
    ) {
        let mut stream = Vec::new();
        let mut options = Vec::new();
        for (handle, error, data) in &replies {
            simple_reply(&mut stream, *handle, *error);
            structured_chunk(&mut stream, *handle, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, &[data]);
            option_reply(&mut options, *error, REP_INFO, data);
        }
        for mut bytes in [stream, options] {
            rein_proto::harness::replies(&bytes);
            rein_proto::harness::replies(&bytes[..cut.index(bytes.len() + 1)]);
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] ^= xor;
                rein_proto::harness::replies(&bytes);
            }
        }
    }

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512), prefix in any::<bool>()) {
        let mut input = if prefix { FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec() } else { vec![] };
        input.extend_from_slice(&data);
        let (r, _) = server_with(&input);
        if let Ok((used, _)) = r { prop_assert!(used <= input.len()); }
        let _ = RequestHeader::decode(&data);
        let _ = ReplyHeader::decode(&data);
        let _ = decode_option_reply(&data);
        let mut c = ClientHandshake::new("x", true);
        let mut out = Vec::new();
        let _ = c.feed(&data, &mut out);
    }
}

/// A reply naming another option than the one the client waits for is a server out of step, refused
/// (the client sends one option at a time): before, NBD_OPT_GO's replies were taken whatever option they
/// named, so an NBD_INFO_EXPORT and an ACK sent for NBD_OPT_INFO opened the export.
#[test]
fn a_reply_to_another_option_is_refused() {
    let greeting = || {
        let mut input = NBDMAGIC.to_be_bytes().to_vec();
        input.extend_from_slice(&IHAVEOPT.to_be_bytes());
        input.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        input
    };
    let mut export = INFO_EXPORT.to_be_bytes().to_vec();
    export.extend_from_slice(&(1u64 << 20).to_be_bytes());
    export.extend_from_slice(&1u16.to_be_bytes());
    for (structured, option, want) in [
        (false, OPT_GO, None),
        (false, OPT_INFO, Some("NBD_OPT_GO")),
        (true, OPT_INFO, Some("NBD_OPT_STRUCTURED_REPLY")),
    ] {
        let mut input = greeting();
        if structured {
            option_reply(&mut input, option, REP_ACK, &[]);
        }
        option_reply(&mut input, option, REP_INFO, &export);
        option_reply(&mut input, option, REP_ACK, &[]);
        let r = ClientHandshake::new("rd", structured).feed(&input, &mut Vec::new()).map(|(_, p)| p);
        match want {
            None => assert!(matches!(r, Ok(ClientProgress::Ready { .. })), "{r:?}"),
            Some(w) => {
                let e = r.unwrap_err().to_string();
                assert!(e.contains(&format!("a reply to another option than {w}")), "{e}");
            }
        }
    }
}

/// NBD_INFO_BLOCK_SIZE: the payload limit as the maximum, a power of two as the preferred size (4 KiB, or
/// the largest power of two within a smaller limit: 3 KiB gave 3,072, which the spec does not allow);
/// asked or not when the limit is below the protocol's default of 32 MiB (a client that does not ask
/// would send 32 MiB requests), and only when asked at the default.
#[test]
fn block_size_information_advertises_the_payload_limit() {
    let cases = [
        (DEFAULT_MAX_PAYLOAD, true, Some(4096)),
        (DEFAULT_MAX_PAYLOAD, false, None),
        (1024, true, Some(1024)),
        (3072, true, Some(2048)),
        (3072, false, Some(2048)),
        (1 << 20, false, Some(4096)),
    ];
    for (limit, ask, preferred) in cases {
        let mut out = Vec::new();
        let mut s = ServerHandshake::with_max_payload(exports(), limit, &mut out);
        out.clear();
        let mut info = 2u32.to_be_bytes().to_vec();
        info.extend_from_slice(b"rd");
        info.extend_from_slice(&(ask as u16).to_be_bytes());
        if ask {
            info.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        }
        let (_, progress) = s.feed(&flags_and(&[(OPT_INFO, &info)]), &mut out).unwrap();
        assert_eq!(progress, ServerProgress::NeedMore);
        let mut rest = &out[..];
        let mut sizes = None;
        while let Some((reply, n)) = decode_option_reply(rest).unwrap() {
            if reply.reply == REP_INFO && reply.data[..2] == INFO_BLOCK_SIZE.to_be_bytes() {
                let at = |i: usize| u32::from_be_bytes(reply.data[i..i + 4].try_into().unwrap());
                sizes = Some((at(2), at(6), at(10)));
            }
            rest = &rest[n..];
        }
        assert_eq!(sizes, preferred.map(|p| (1, p, limit)), "limit {limit}, asked {ask}");
    }
}

/// The client learns the server's size constraints from NBD_OPT_GO's NBD_INFO_BLOCK_SIZE (which it asks
/// for): the payload limit a server advertises, the default (32 MiB) when it advertises none or a
/// malformed one (not a limit taken on trust, nor a refusal to talk to a server that worked before).
#[test]
fn the_client_learns_the_servers_block_size() {
    // The block size a client learns from a server of `exports` and payload `limit`.
    let learn = |exports: Vec<ExportInfo>, limit: u32| {
        let mut to_client = Vec::new();
        let mut server = ServerHandshake::with_max_payload(exports, limit, &mut to_client);
        let mut client = ClientHandshake::new("rd", false);
        let mut to_server = Vec::new();
        loop {
            let (used, p) = client.feed(&to_client, &mut to_server).unwrap();
            to_client.drain(..used);
            if p != ClientProgress::NeedMore {
                assert!(matches!(p, ClientProgress::Ready { .. }), "{p:?}");
                return client.block_size();
            }
            let (used, _) = server.feed(&to_server, &mut to_client).unwrap();
            to_server.drain(..used);
        }
    };
    for limit in [DEFAULT_MAX_PAYLOAD, 1 << 20, 3072] {
        let preferred = if limit >= 4096 { 4096 } else { 2048 };
        let block = learn(exports(), limit);
        assert_eq!(block, BlockSize { min: 1, preferred, max: limit });
        assert_eq!(block.max_aligned(), limit);
    }
    // An export of 64 KiB blocks (a gateway's over such a node): advertised as the minimum, with a
    // preferred size no smaller.
    let mut blocks = exports();
    blocks[0].min_block = 64 << 10;
    let block = learn(blocks, DEFAULT_MAX_PAYLOAD);
    assert_eq!(block, BlockSize { min: 64 << 10, preferred: 64 << 10, max: DEFAULT_MAX_PAYLOAD });
    // A server that says nothing (only NBD_INFO_EXPORT, then ACK): the protocol's defaults.
    let go_answer = |infos: &[Vec<u8>]| {
        let mut c = ClientHandshake::new("rd", false);
        let mut input = NBDMAGIC.to_be_bytes().to_vec();
        input.extend_from_slice(&IHAVEOPT.to_be_bytes());
        input.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        let mut export = INFO_EXPORT.to_be_bytes().to_vec();
        export.extend_from_slice(&(1u64 << 20).to_be_bytes());
        export.extend_from_slice(&1u16.to_be_bytes());
        option_reply(&mut input, OPT_GO, REP_INFO, &export);
        for info in infos {
            option_reply(&mut input, OPT_GO, REP_INFO, info);
        }
        option_reply(&mut input, OPT_GO, REP_ACK, &[]);
        let r = c.feed(&input, &mut Vec::new()).map(|(_, p)| p);
        (r, c.block_size())
    };
    let (r, block) = go_answer(&[]);
    assert!(matches!(r, Ok(ClientProgress::Ready { .. })), "{r:?}");
    assert_eq!(block, BlockSize::DEFAULT);
    let info = |min: u32, preferred: u32, max: u32| {
        let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [min, preferred, max] {
            d.extend_from_slice(&v.to_be_bytes());
        }
        d
    };
    // nbdkit's blocksize filter, say: 512-byte blocks, a 1 MiB + 512 maximum (not a power of two).
    let (r, block) = go_answer(&[info(512, 4096, (1 << 20) + 512)]);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!((block.min, block.max_aligned()), (512, (1 << 20) + 512));
    let (_, block) = go_answer(&[info(4096, 4096, (1 << 20) + 512)]);
    assert_eq!(block.max_aligned(), 1 << 20, "down to a multiple of the minimum");
    // What a request must keep to under 4 KiB blocks and 1 MiB payloads.
    let block = BlockSize { min: 4096, preferred: 4096, max: 1 << 20 };
    let request = |command, offset, length| RequestHeader { flags: 0, command, handle: 1, offset, length };
    assert_eq!(block.check(&request(Command::Read, 8192, 1 << 20)), Ok(()));
    assert_eq!(block.check(&request(Command::Trim, 0, 64 << 20)), Ok(()), "no payload: may exceed the maximum");
    assert_eq!(block.check(&request(Command::Flush, 0, 0)), Ok(()));
    let e = block.check(&request(Command::Write, 0, (1 << 20) + 4096)).unwrap_err().to_string();
    assert_eq!(e, "a WRITE of 1052672 bytes is longer than the largest the server takes (1048576)");
    let e = block.check(&request(Command::Read, 512, 4096)).unwrap_err().to_string();
    assert_eq!(e, "a READ of 4096 bytes at 512 is not aligned to the minimum block size 4096");
    assert!(block.check(&request(Command::WriteZeroes, 0, 512)).is_err());
    assert_eq!(
        block.check(&request(Command::Read, 512, 4096)),
        Err(BlockSizeError::Unaligned { command: Command::Read, length: 4096, offset: 512, min: 4096 })
    );
    assert_eq!(
        block.check(&request(Command::Write, 0, (1 << 20) + 4096)),
        Err(BlockSizeError::TooLong { command: Command::Write, length: (1 << 20) + 4096, max: 1 << 20 })
    );
    // A malformed one is taken as none: the defaults, which such a server worked with before.
    for bad in [
        info(3, 4096, 1 << 20),
        info(1 << 17, 1 << 17, 1 << 20),
        info(4096, 4096, 512),
        info(1, 4096, 1 << 20)[..10].to_vec(),
    ] {
        let (r, block) = go_answer(std::slice::from_ref(&bad));
        assert!(matches!(r, Ok(ClientProgress::Ready { .. })), "{bad:?}: {r:?}");
        assert_eq!(block, BlockSize::DEFAULT, "{bad:?}");
    }
}

/// Pipelined options cannot grow the server's reply buffer without bound: one `feed` stops answering once
/// it has put `MAX_REPLY_BATCH` bytes in `out` (each 8 KiB `NBD_OPT_INFO` here asks 4,000 times for the
/// description, about 144 KB of replies), and feeding the rest again gives, batch by batch, exactly the
/// replies of the options fed one at a time.
#[test]
fn pipelined_options_are_answered_in_bounded_batches() {
    let mut info = 2u32.to_be_bytes().to_vec();
    info.extend_from_slice(b"rd");
    info.extend_from_slice(&4000u16.to_be_bytes());
    for _ in 0..4000 {
        info.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
    }
    assert!(info.len() <= MAX_OPTION_LEN as usize);
    let options = 16;
    // The oracle: one option per call.
    let mut want = Vec::new();
    let mut s = ServerHandshake::new(exports(), &mut want);
    want.clear();
    let (used, _) = s.feed(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes(), &mut want).unwrap();
    assert_eq!(used, 4);
    let mut one = Vec::new();
    option_request(&mut one, OPT_INFO, &info);
    let mut per_option = 0;
    for _ in 0..options {
        let before = want.len();
        assert_eq!(s.feed(&one, &mut want).unwrap(), (one.len(), ServerProgress::NeedMore));
        per_option = want.len() - before;
    }
    assert!(per_option > MAX_REPLY_BATCH, "{per_option}: the test wants options larger than a batch");
    // All at once, as a client that pipelines and does not read.
    let input = flags_and(&vec![(OPT_INFO, &info[..]); options]);
    let mut out = Vec::new();
    let mut s = ServerHandshake::new(exports(), &mut out);
    out.clear();
    let (mut at, mut got, mut calls) = (0, Vec::new(), 0);
    while at < input.len() {
        let (used, progress) = s.feed(&input[at..], &mut out).unwrap();
        assert_eq!(progress, ServerProgress::NeedMore);
        assert!(used > 0, "complete options left unanswered");
        assert!(out.len() < MAX_REPLY_BATCH + per_option, "a batch of {} bytes", out.len());
        at += used;
        got.append(&mut out);
        calls += 1;
    }
    assert_eq!(got, want);
    assert!(calls >= options / 2, "{calls} calls");
}

/// The data of a LIST_META_CONTEXT or SET_META_CONTEXT for `export` with `queries`.
fn meta(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

fn go(export: &str) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    d
}

/// An option reply: (option, reply type, data).
type Replied = (u32, u32, Vec<u8>);
/// An option to send: (option, data).
type Opt<'a> = (u32, &'a [u8]);

/// The option replies at the start of `out`: (option, reply type, data) (an EXPORT_NAME's reply, which
/// is not one, ends them).
fn replies_of(out: &[u8]) -> Vec<Replied> {
    let mut rest = out;
    let mut all = Vec::new();
    while let Ok(Some((OptionReply { option, reply, data }, n))) = decode_option_reply(rest) {
        all.push((option, reply, data.to_vec()));
        rest = &rest[n..];
    }
    all
}

/// A server offering `base:allocation` on "rd" only, fed `opts` after the client flags.
fn meta_server(opts: &[Opt]) -> (Result<(usize, ServerProgress), ProtoError>, Vec<Replied>) {
    let mut out = Vec::new();
    let mut s = ServerHandshake::new(exports(), &mut out);
    s.set_block_status(vec![true, false]);
    out.clear();
    let r = s.feed(&flags_and(opts), &mut out);
    (r, replies_of(&out))
}

fn context(id: u32) -> (u32, Vec<u8>) {
    let mut d = id.to_be_bytes().to_vec();
    d.extend_from_slice(b"base:allocation");
    (REP_META_CONTEXT, d)
}

/// LIST_META_CONTEXT and SET_META_CONTEXT: structured replies first, `base:allocation` on the exports
/// flagged (a LIST's id 0, a SET's the id BLOCK_STATUS uses), the query rules, and the errors.
#[test]
fn meta_contexts_are_listed_and_selected_by_the_rules() {
    let sr: Opt = (OPT_STRUCTURED_REPLY, &[]);
    // Without structured replies: invalid.
    for (option, data) in
        [(OPT_LIST_META_CONTEXT, meta("rd", &[])), (OPT_SET_META_CONTEXT, meta("rd", &["base:allocation"]))]
    {
        let (r, replies) = meta_server(&[(option, &data)]);
        assert_eq!(r.unwrap().1, ServerProgress::NeedMore);
        let got: Vec<(u32, u32)> = replies.iter().map(|(o, r, _)| (*o, *r)).collect();
        assert_eq!(got, [(option, REP_ERR_INVALID)]);
    }
    let ok = |replies: &[Replied]| -> Vec<(u32, Vec<u8>)> {
        replies.iter().skip(1).map(|(_, r, d)| (*r, d.clone())).collect()
    };
    let ack = (REP_ACK, Vec::new());
    for (option, data, want) in [
        (OPT_LIST_META_CONTEXT, meta("rd", &[]), vec![context(0), ack.clone()]),
        (OPT_LIST_META_CONTEXT, meta("rd", &["base:"]), vec![context(0), ack.clone()]),
        (OPT_LIST_META_CONTEXT, meta("rd", &["qemu:", "base:allocation"]), vec![context(0), ack.clone()]),
        (OPT_LIST_META_CONTEXT, meta("rd", &["qemu:dirty-bitmap:a"]), vec![ack.clone()]),
        (OPT_LIST_META_CONTEXT, meta("ro", &[]), vec![ack.clone()]),
        (OPT_SET_META_CONTEXT, meta("rd", &["base:allocation"]), vec![context(BASE_ALLOCATION_ID), ack.clone()]),
        (OPT_SET_META_CONTEXT, meta("rd", &["base:"]), vec![ack.clone()]),
        (OPT_SET_META_CONTEXT, meta("rd", &[]), vec![ack.clone()]),
        (OPT_SET_META_CONTEXT, meta("ro", &["base:allocation"]), vec![ack.clone()]),
    ] {
        let (r, replies) = meta_server(&[sr, (option, &data)]);
        assert_eq!(r.unwrap().1, ServerProgress::NeedMore);
        assert!(replies.iter().all(|(o, _, _)| *o == OPT_STRUCTURED_REPLY || *o == option));
        assert_eq!(ok(&replies), want, "{option} {data:?}");
    }
    for (data, error) in [
        (meta("zz", &["base:allocation"]), REP_ERR_UNKNOWN),
        (meta("rd", &["base:allocation"])[..10].to_vec(), REP_ERR_INVALID),
        (meta("rd", &[&"x".repeat(MAX_NAME_LEN + 1)]), REP_ERR_TOO_BIG),
    ] {
        for option in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
            let (r, replies) = meta_server(&[sr, (option, &data)]);
            assert_eq!(r.unwrap().1, ServerProgress::NeedMore);
            assert_eq!(replies.last().map(|r| r.1), Some(error));
        }
    }
}

/// What the last SET selected holds for a GO of the same export only (another SET replaces it), whatever
/// INFOs or failed GOs came in between (the spec names only STARTTLS; libnbd from 1.16 on lets its user
/// GO after an INFO of the same export without a second SET: these cases gave no context before); and
/// only on an export that offers it (a gateway's: none).
#[test]
fn a_selected_context_holds_for_the_go_of_its_export_only() {
    let sr: Opt = (OPT_STRUCTURED_REPLY, &[]);
    let set = meta("rd", &["base:allocation"]);
    let set_none = meta("rd", &["qemu:x"]);
    let (rd, ro, zz) = (go("rd"), go("ro"), go("zz"));
    let cases: [(&[Opt], usize, bool); 9] = [
        (&[sr, (OPT_SET_META_CONTEXT, &set), (OPT_GO, &rd)], 0, true),
        (&[(OPT_SET_META_CONTEXT, &set), sr, (OPT_GO, &rd)], 0, false),
        (&[sr, (OPT_SET_META_CONTEXT, &set), (OPT_GO, &ro)], 1, false),
        (&[sr, (OPT_SET_META_CONTEXT, &set), (OPT_INFO, &rd), (OPT_GO, &rd)], 0, true),
        (&[sr, (OPT_SET_META_CONTEXT, &set), (OPT_INFO, &ro), (OPT_INFO, &zz), (OPT_GO, &rd)], 0, true),
        (&[sr, (OPT_SET_META_CONTEXT, &set), (OPT_SET_META_CONTEXT, &set_none), (OPT_GO, &rd)], 0, false),
        (&[sr, (OPT_SET_META_CONTEXT, &set), (OPT_GO, &zz), (OPT_GO, &rd)], 0, true),
        (&[sr, (OPT_SET_META_CONTEXT, &set), (OPT_EXPORT_NAME, b"rd")], 0, true),
        (&[sr, (OPT_LIST_META_CONTEXT, &set), (OPT_GO, &rd)], 0, false),
    ];
    for (i, (opts, export, base_allocation)) in cases.into_iter().enumerate() {
        let (r, _) = meta_server(opts);
        let want = Negotiated { export, structured: opts.contains(&sr), node: None, base_allocation };
        assert_eq!(r.unwrap().1, ServerProgress::Done(want), "case {i}");
    }
    // Without `set_block_status` (a gateway), nothing is offered or selected.
    let (r, out) = server_with(&flags_and(&[sr, (OPT_SET_META_CONTEXT, &set), (OPT_GO, &rd)]));
    let want = Negotiated { export: 0, structured: true, node: None, base_allocation: false };
    assert_eq!(r.unwrap().1, ServerProgress::Done(want));
    assert!(replies_of(&out).iter().all(|(_, reply, _)| *reply != REP_META_CONTEXT));
}

/// The server's bytes of a handshake up to NBD_OPT_GO's ACK as a plain NBD server with structured replies
/// and metadata contexts sends them: the greeting, `structured`'s reply to NBD_OPT_STRUCTURED_REPLY, then
/// `meta` (the replies to NBD_OPT_SET_META_CONTEXT, if it is asked), then GO's NBD_INFO_EXPORT and ACK.
fn meta_server_bytes(structured: u32, meta: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut input = NBDMAGIC.to_be_bytes().to_vec();
    input.extend_from_slice(&IHAVEOPT.to_be_bytes());
    input.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    option_reply(&mut input, OPT_STRUCTURED_REPLY, structured, &[]);
    for (reply, data) in meta {
        option_reply(&mut input, OPT_SET_META_CONTEXT, *reply, data);
    }
    let mut export = INFO_EXPORT.to_be_bytes().to_vec();
    export.extend_from_slice(&(1u64 << 20).to_be_bytes());
    export.extend_from_slice(&(TFLAG_HAS_FLAGS | TFLAG_SEND_DF).to_be_bytes());
    option_reply(&mut input, OPT_GO, REP_INFO, &export);
    option_reply(&mut input, OPT_GO, REP_ACK, &[]);
    input
}

/// An NBD_REP_META_CONTEXT reply's data: the id, then the name.
fn meta_context_reply(id: u32, name: &str) -> (u32, Vec<u8>) {
    let mut d = id.to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    (REP_META_CONTEXT, d)
}

/// Feeds `input` to a client asking for `base:allocation` in two pieces cut at `cut` (then the rest,
/// byte by byte from there if it still needs more): its end, the bytes it wrote, and the context id.
fn meta_client(input: &[u8], cut: usize) -> (Result<ClientProgress, ProtoError>, Vec<u8>, Option<u32>) {
    let mut c = ClientHandshake::new("rd", true).with_meta_context(BASE_ALLOCATION);
    let (mut out, mut have, mut at) = (Vec::new(), Vec::new(), 0);
    let mut next = cut.max(1);
    loop {
        match c.feed(&have, &mut out) {
            Ok((used, ClientProgress::NeedMore)) => {
                have.drain(..used);
                if at >= input.len() {
                    return (Ok(ClientProgress::NeedMore), out, c.meta_context());
                }
                let end = next.min(input.len());
                have.extend_from_slice(&input[at..end]);
                at = end;
                next = at + 1;
            }
            Ok((_, p)) => return (Ok(p), out, c.meta_context()),
            Err(e) => return (Err(e), out, c.meta_context()),
        }
    }
}

/// A client asking for `base:allocation` (`with_meta_context`): NBD_OPT_SET_META_CONTEXT for the export
/// between STRUCTURED_REPLY and GO, byte-exact; the id of the context named as asked is kept (another
/// context's reply skipped), whatever the cut of the server's bytes; none if the server selects none,
/// refuses the option, or refuses structured replies (then no SET is sent). Seen failing without
/// `with_meta_context` (it did not exist: the client sent GO right after STRUCTURED_REPLY).
#[test]
fn a_client_asks_for_base_allocation_and_keeps_its_id() {
    let input = meta_server_bytes(
        REP_ACK,
        &[meta_context_reply(7, "base:allocation"), meta_context_reply(9, "qemu:x"), (REP_ACK, vec![])],
    );
    let mut want_out = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    option_request(&mut want_out, OPT_STRUCTURED_REPLY, &[]);
    let mut set = 2u32.to_be_bytes().to_vec();
    set.extend_from_slice(b"rd");
    set.extend_from_slice(&1u32.to_be_bytes());
    set.extend_from_slice(&15u32.to_be_bytes());
    set.extend_from_slice(b"base:allocation");
    option_request(&mut want_out, OPT_SET_META_CONTEXT, &set);
    let mut go = 2u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"rd");
    go.extend_from_slice(&1u16.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    option_request(&mut want_out, OPT_GO, &go);
    for cut in 0..=input.len() {
        let (r, out, id) = meta_client(&input, cut);
        assert!(matches!(r, Ok(ClientProgress::Ready { structured: true, .. })), "cut {cut}: {r:?}");
        assert_eq!(out, want_out, "cut {cut}: the client's bytes");
        assert_eq!(id, Some(7), "cut {cut}");
    }
    // No context selected (only the ACK), the option refused, or structured replies refused: none, and the
    // export opens all the same.
    for (structured, meta, sets) in [
        (REP_ACK, vec![(REP_ACK, vec![])], true),
        (REP_ACK, vec![meta_context_reply(3, "base:allocationX"), (REP_ACK, vec![])], true),
        (REP_ACK, vec![(REP_ERR_UNSUP, b"no".to_vec())], true),
        (REP_ERR_UNSUP, vec![], false),
    ] {
        let (r, out, id) = meta_client(&meta_server_bytes(structured, &meta), 0);
        assert!(matches!(r, Ok(ClientProgress::Ready { .. })), "{meta:?}: {r:?}");
        assert_eq!(id, None, "{meta:?}");
        let sent = options(&out).iter().any(|(o, _)| *o == OPT_SET_META_CONTEXT);
        assert_eq!(sent, sets, "{meta:?}: SET_META_CONTEXT sent");
    }
}

/// Replies to NBD_OPT_SET_META_CONTEXT that break the protocol, each named: one shorter than its context
/// id, a second for the context asked for, an unknown non-error type, another option's.
#[test]
fn malformed_meta_context_replies_are_named() {
    let ok = meta_context_reply(7, "base:allocation");
    for (meta, want) in [
        (vec![(REP_META_CONTEXT, vec![0, 0, 7])], "NBD_REP_META_CONTEXT shorter than its context id"),
        (vec![ok.clone(), meta_context_reply(8, "base:allocation")], "a second NBD_REP_META_CONTEXT for the context"),
        (vec![ok.clone(), (REP_INFO, vec![0, 0])], "an unknown reply to NBD_OPT_SET_META_CONTEXT"),
    ] {
        let (r, _, _) = meta_client(&meta_server_bytes(REP_ACK, &meta), 0);
        let e = r.unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    // GO's replies where SET_META_CONTEXT's are awaited.
    let (r, _, _) = meta_client(&meta_server_bytes(REP_ACK, &[]), 0);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("a reply to another option than NBD_OPT_SET_META_CONTEXT"), "{e}");
}

/// Against Rein's own server handshake: the flagged export gets `base:allocation` with its id, an export
/// not flagged opens with none.
#[test]
fn a_client_meets_the_server_on_base_allocation() {
    for (export, id) in [("rd", Some(BASE_ALLOCATION_ID)), ("ro", None)] {
        let mut to_client = Vec::new();
        let mut server = ServerHandshake::new(exports(), &mut to_client);
        server.set_block_status(vec![true, false]);
        let mut client = ClientHandshake::new(export, true).with_meta_context(BASE_ALLOCATION);
        let (mut to_server, mut server_done) = (Vec::new(), false);
        let progress = loop {
            let (used, p) = client.feed(&to_client, &mut to_server).unwrap();
            to_client.drain(..used);
            if p != ClientProgress::NeedMore {
                break p;
            }
            assert!(!server_done, "the server finished with the client waiting");
            let (used, sp) = server.feed(&to_server, &mut to_client).unwrap();
            to_server.drain(..used);
            server_done = sp != ServerProgress::NeedMore;
        };
        assert!(matches!(progress, ClientProgress::Ready { structured: true, .. }), "{progress:?}");
        assert_eq!(client.meta_context(), id, "{export}");
    }
}
