//! Storage-node protocol tests (`rein_proto::nbd::node`): byte layouts from node-spec v1, a node client
//! and server handshake talking in memory (whole and in random pieces), every malformed hello field named,
//! the limits at their bounds, tags in transmission (refused ones keep the stream in sync), trailers.
use proptest::prelude::*;
use rein_proto::harness;
use rein_proto::nbd::*;

fn exports() -> Vec<ExportInfo> {
    vec![ExportInfo {
        name: "v".into(),
        description: String::new(),
        size: 1 << 20,
        read_only: false,
        volatile: false,
        min_block: 1,
    }]
}

fn tenant(name: &str) -> NodeTenant {
    NodeTenant {
        name: name.into(),
        reservation: 250.0,
        limit: Some(1000.0),
        weight: 4.0,
        local_reservation: 50.0,
        idle_credit: 1,
        split: NodeSplit::Spread,
    }
}

fn hello_bytes(h: &NodeHello) -> Vec<u8> {
    let mut d = Vec::new();
    h.encode(&mut d);
    d
}

/// A server (node option on if `node`) fed `opts` after the client flags; returns the progress of the
/// first non-NeedMore step (or the error), and the replies.
fn server(node: bool, opts: &[(u32, Vec<u8>)]) -> (ServerHandshake, Result<ServerProgress, ProtoError>, Vec<u8>) {
    let mut out = Vec::new();
    let mut s = ServerHandshake::new(exports(), &mut out);
    s.set_node(node);
    out.clear();
    let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    for (o, d) in opts {
        option_request(&mut input, *o, d);
    }
    let r = s.feed(&input, &mut out).map(|(_, p)| p);
    (s, r, out)
}

fn only_reply(out: &[u8]) -> (u32, u32, Vec<u8>) {
    let (r, n) = decode_option_reply(out).unwrap().expect("a whole option reply");
    assert_eq!(n, out.len(), "one reply");
    (r.option, r.reply, r.data.to_vec())
}

#[test]
fn disabled_node_option_is_an_unknown_option() {
    let hello = hello_bytes(&NodeHello::new(vec![tenant("c1")]));
    let (_, r, node_out) = server(false, &[(OPT_REIN_NODE, hello)]);
    assert_eq!(r.unwrap(), ServerProgress::NeedMore);
    let (_, _, unknown_out) = server(false, &[(0x1234, vec![])]);
    let (opt, reply, msg) = only_reply(&node_out);
    assert_eq!((opt, reply), (OPT_REIN_NODE, REP_ERR_UNSUP));
    assert_eq!(msg, only_reply(&unknown_out).2, "the same message as any unknown option");
}

#[test]
fn hello_and_welcome_layouts_are_byte_exact() {
    let h = NodeHello::new(vec![NodeTenant { split: NodeSplit::Rho, limit: None, ..tenant("c") }]);
    let bytes = hello_bytes(&h);
    assert_eq!(&bytes[..8], &[0, 4, 0, 0, 0, 1, 0, 1], "version 4 (the layout is v2's)");
    assert_eq!(bytes[8], b'c');
    assert_eq!(&bytes[9..17], &250f64.to_be_bytes());
    assert_eq!(&bytes[17..25], &f64::INFINITY.to_be_bytes());
    assert_eq!(&bytes[25..33], &4f64.to_be_bytes());
    assert_eq!(&bytes[33..41], &50f64.to_be_bytes());
    assert_eq!(&bytes[41..], &[0, 0, 0, 1, 1, 0]);
    let w = harness::welcome_for(&h);
    let mut wb = Vec::new();
    w.encode(&mut wb);
    assert_eq!(wb.len(), 6 + 40 + 8, "v2 to v4: the entry, then the boot identity");
    assert_eq!(&wb[..2], &[0, 4]);
    assert_eq!(&wb[6..14], &[0, 0, 0, 0, 1, 0, 0, 0], "slot 0, source 1 (gateway), reserved");
    assert_eq!(&wb[46..], &w.boot.expect("a v2 welcome states its boot").to_be_bytes());
    assert_eq!(NodeWelcome::decode(&wb).unwrap(), w);
    let tag = NodeTag { slot: 3, share: 65536, delta: 0x10_0000, rho: 7, pool_busy: false };
    let mut tb = Vec::new();
    tag.encode(&mut tb);
    assert_eq!(tb.len(), NODE_TAG_LEN);
    assert_eq!(
        tb,
        [&3u32.to_be_bytes()[..], &65536u32.to_be_bytes(), &0x10_0000u64.to_be_bytes(), &7u64.to_be_bytes()].concat()
    );
    // v3's pool flag: bit 31 of the share word.
    let busy = NodeTag { pool_busy: true, ..tag };
    let mut bb = Vec::new();
    busy.encode(&mut bb);
    assert_eq!(&bb[4..8], &(65536u32 | 1 << 31).to_be_bytes());
    assert_eq!(NodeTag::decode(&bb).unwrap(), busy);
    assert!(busy.piggyback().pool_busy);
    let t = NodeReplyTrailer { phase: Some(rein_core::Phase::OverLimit), cost: 65536 };
    let mut rb = Vec::new();
    t.encode(&mut rb);
    assert_eq!(rb, [&[3u8, 0, 0, 0, 0, 0, 0, 0][..], &65536u64.to_be_bytes()].concat());
}

#[test]
fn accepted_hello_asks_the_caller_then_go_opens_a_node_session() {
    let h = NodeHello::new(vec![tenant("c1"), tenant("c2")]);
    let go = {
        let mut d = 1u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"v");
        d.extend_from_slice(&0u16.to_be_bytes());
        d
    };
    let (mut s, r, out) = server(true, &[(OPT_REIN_NODE, hello_bytes(&h)), (OPT_GO, go.clone())]);
    assert_eq!(r.unwrap(), ServerProgress::NodeHello(h.clone()));
    assert!(out.is_empty(), "nothing written before the verdict");
    let mut out = Vec::new();
    let w = harness::welcome_for(&h);
    assert_eq!(s.node_verdict(Ok(w.clone()), &mut out), ServerProgress::NeedMore);
    let (opt, reply, data) = only_reply(&out);
    assert_eq!((opt, reply), (OPT_REIN_NODE, REP_REIN_NODE));
    assert_eq!(NodeWelcome::decode(&data).unwrap(), w);
    let mut input = Vec::new();
    option_request(&mut input, OPT_GO, &go);
    let (_, p) = s.feed(&input, &mut out).unwrap();
    let ServerProgress::Done(n) = p else { panic!("{p:?}") };
    assert_eq!(n.node, Some(w.clone()));
    let config = TransmissionConfig::new(&exports()[0], &n, 4096);
    assert!(config.node);
    assert_eq!(config.node_slots, 2);
}

/// v4: a node session on an export that answers block status has `base:allocation` implied (no
/// metadata-context option: the session has no structured replies), and a BLOCK_STATUS is answered with
/// the simple reply, the trailer and the descriptors' payload; a v3 session (or an export without block
/// status) has none, and a BLOCK_STATUS there is EINVAL, as before.
#[test]
fn a_v4_node_session_answers_block_status_and_a_v3_one_refuses_it() {
    let go = {
        let mut d = 1u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"v");
        d.extend_from_slice(&0u16.to_be_bytes());
        d
    };
    for (version, offered, answered) in [(4, true, true), (3, true, false), (4, false, false)] {
        let h = NodeHello { version, ..NodeHello::new(vec![tenant("c1")]) };
        let mut out = Vec::new();
        let mut s = ServerHandshake::new(exports(), &mut out);
        s.set_node(true);
        s.set_block_status(vec![offered]);
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        option_request(&mut input, OPT_REIN_NODE, &hello_bytes(&h));
        let (_, p) = s.feed(&input, &mut out).unwrap();
        assert!(matches!(p, ServerProgress::NodeHello(_)));
        let w = harness::welcome_for(&h);
        assert_eq!(w.version, version);
        s.node_verdict(Ok(w), &mut out);
        let mut input = Vec::new();
        option_request(&mut input, OPT_GO, &go);
        let (_, p) = s.feed(&input, &mut out).unwrap();
        let ServerProgress::Done(n) = p else { panic!("{p:?}") };
        assert_eq!(n.base_allocation, answered, "v{version}, offered {offered}");
        let config = TransmissionConfig::new(&exports()[0], &n, 4096);
        assert_eq!(config.base_allocation, answered);
        let mut m = ServerTransmission::new(config);
        let mut req = Vec::new();
        let header = RequestHeader { flags: 0, command: Command::BlockStatus, handle: 9, offset: 4096, length: 8192 };
        encode_node_request(&header, &NodeTag { slot: 0, share: 1, delta: 0, rho: 0, pool_busy: false }, &mut req);
        let (used, event) = m.feed(&req).unwrap();
        assert_eq!(used, req.len());
        match event {
            Event::Request { request, .. } => {
                assert!(answered, "v{version}, offered {offered}: a BLOCK_STATUS ran");
                let mut extents = Extents::new(&request);
                extents.push(4096, STATE_HOLE | STATE_ZERO);
                extents.push(1000, 0);
                let mut reply = Vec::new();
                m.replies().block_status(&extents, request.handle, &mut reply);
                let (r, t, used) = decode_node_reply(&reply).unwrap().unwrap();
                assert_eq!((r.handle, r.error, t), (9, 0, NodeReplyTrailer::default()));
                assert_eq!(node_extents_len(&reply[used..]), Ok(Some(reply.len() - used)));
                assert_eq!(decode_node_extents(&reply[used..], 8192), Ok(vec![(4096, 3), (1000, 0)]));
                // The default reply (a backend that cannot tell): the whole range as data.
                let mut reply = Vec::new();
                m.replies().success(&request, &mut reply);
                assert_eq!(decode_node_extents(&reply[used..], 8192), Ok(vec![(8192, 0)]));
            }
            Event::Reject(r) => {
                assert!(!answered, "v{version}, offered {offered}: refused");
                assert_eq!(r.reason, Reason::NoMetaContext);
                let mut reply = Vec::new();
                m.replies().rejection(&mut reply, &r);
                let (r, _, used) = decode_node_reply(&reply).unwrap().unwrap();
                assert_eq!((r.error, used), (EINVAL, reply.len()), "an error reply carries no payload");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn refused_hello_leaves_no_session_and_a_second_hello_replaces_the_first() {
    let h = NodeHello::new(vec![tenant("c1")]);
    let (mut s, r, _) = server(true, &[(OPT_REIN_NODE, hello_bytes(&h))]);
    assert!(matches!(r.unwrap(), ServerProgress::NodeHello(_)));
    let mut out = Vec::new();
    s.node_verdict(Ok(harness::welcome_for(&h)), &mut out);
    // A second hello, refused: no node session remains, so structured replies are allowed again.
    let mut input = Vec::new();
    option_request(&mut input, OPT_REIN_NODE, &hello_bytes(&NodeHello::new(vec![tenant("zz")])));
    let (_, p) = s.feed(&input, &mut out).unwrap();
    assert!(matches!(p, ServerProgress::NodeHello(_)));
    out.clear();
    s.node_verdict(Err((REP_ERR_POLICY, "tenant \"zz\" is not known here".into())), &mut out);
    let (_, reply, msg) = only_reply(&out);
    assert_eq!((reply, String::from_utf8(msg).unwrap()), (REP_ERR_POLICY, "tenant \"zz\" is not known here".into()));
    out.clear();
    let mut input = Vec::new();
    option_request(&mut input, OPT_STRUCTURED_REPLY, &[]);
    s.feed(&input, &mut out).unwrap();
    assert_eq!(only_reply(&out).1, REP_ACK);
}

#[test]
fn structured_replies_and_the_node_protocol_exclude_each_other() {
    let hello = hello_bytes(&NodeHello::new(vec![tenant("c1")]));
    // Structured first: the hello is refused INVALID.
    let (_, r, out) = server(true, &[(OPT_STRUCTURED_REPLY, vec![]), (OPT_REIN_NODE, hello.clone())]);
    assert_eq!(r.unwrap(), ServerProgress::NeedMore);
    let (first, n) = decode_option_reply(&out).unwrap().unwrap();
    assert_eq!(first.reply, REP_ACK);
    let (_, reply, msg) = only_reply(&out[n..]);
    assert_eq!(reply, REP_ERR_INVALID);
    assert!(String::from_utf8(msg).unwrap().contains("structured"));
    // Node first: STRUCTURED_REPLY is refused INVALID.
    let (mut s, r, _) = server(true, &[(OPT_REIN_NODE, hello)]);
    let ServerProgress::NodeHello(h) = r.unwrap() else { panic!() };
    let mut out = Vec::new();
    s.node_verdict(Ok(harness::welcome_for(&h)), &mut out);
    out.clear();
    let mut input = Vec::new();
    option_request(&mut input, OPT_STRUCTURED_REPLY, &[]);
    s.feed(&input, &mut out).unwrap();
    let (_, reply, msg) = only_reply(&out);
    assert_eq!(reply, REP_ERR_INVALID);
    assert!(String::from_utf8(msg).unwrap().contains("storage-node"));
}

/// Each malformed field of a hello: the reply is INVALID, and its message names the field.
#[test]
fn every_malformed_hello_field_is_named() {
    let good = hello_bytes(&NodeHello::new(vec![tenant("ab")]));
    // Offsets in `good`: version 0, flags 2, count 4, name_len 6, name 8, reservation 10, limit 18,
    // weight 26, local_reservation 34, idle_credit 42, split 46, reserved 47.
    let set = |at: usize, bytes: &[u8]| {
        let mut v = good.clone();
        v[at..at + bytes.len()].copy_from_slice(bytes);
        v
    };
    let f = |x: f64| x.to_be_bytes();
    let dup = hello_bytes(&NodeHello::new(vec![tenant("ab"), tenant("ab")]));
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (set(0, &[0, 0]), "version 0"),
        (set(2, &[0, 1]), "flags 0x1"),
        (set(4, &[0, 0]), "tenant count 0"),
        (set(4, &[0, 65]), "tenant count 65"),
        (set(4, &[0, 2]), "ends inside name_len"),
        (set(6, &[0, 0]), "name length 0"),
        (set(6, &[1, 0]), "name length 256"),
        (set(8, &[0xff, 0xfe]), "not UTF-8"),
        (set(8, &[b'a', 0]), "NUL"),
        (set(10, &f(-1.0)), "reservation -1"),
        (set(10, &f(f64::NAN)), "reservation NaN"),
        (set(18, &f(0.0)), "limit 0"),
        (set(18, &f(f64::NEG_INFINITY)), "limit -inf"),
        (set(26, &f(0.0)), "weight 0"),
        (set(26, &f(f64::INFINITY)), "weight inf"),
        (set(34, &f(-0.5)), "local_reservation -0.5"),
        (set(46, &[2]), "split 2"),
        (set(47, &[1]), "reserved bytes"),
        (good[..good.len() - 1].to_vec(), "ends inside reserved"),
        (good[..20].to_vec(), "ends inside limit"),
        // Trailing bytes are refused in a v1 hello (a v2 hello's are later versions' fields).
        ([&set(0, &[0, 1])[..], &[0]].concat(), "1 trailing bytes"),
        (dup, "duplicate name \"ab\""),
    ];
    for (data, named) in cases {
        let (_, r, out) = server(true, &[(OPT_REIN_NODE, data.clone())]);
        assert_eq!(r.unwrap(), ServerProgress::NeedMore, "{named}: the caller is not asked");
        let (opt, reply, msg) = only_reply(&out);
        let msg = String::from_utf8(msg).unwrap();
        assert_eq!((opt, reply), (OPT_REIN_NODE, REP_ERR_INVALID), "{named}");
        assert!(msg.contains(named), "{named:?} not in {msg:?}");
    }
}

#[test]
fn limits_at_their_bounds() {
    // 64 tenants with short names: accepted; 65: refused.
    let names: Vec<String> = (0..65).map(|i| format!("t{i}")).collect();
    let many = |n: usize| NodeHello::new(names[..n].iter().map(|s| tenant(s)).collect());
    assert!(many(MAX_NODE_TENANTS).check().is_ok());
    assert_eq!(NodeHello::decode(&hello_bytes(&many(64))).unwrap(), many(64));
    let err = NodeError::TenantCount { count: 65, max: 64 };
    assert_eq!(many(65).check(), Err(err.clone()));
    assert_eq!(NodeHello::decode(&hello_bytes(&many(65))), Err(err));
    // Names of 255 bytes: accepted, 256: refused.
    let long = |n: usize| NodeHello::new(vec![tenant(&"x".repeat(n))]);
    assert_eq!(NodeHello::decode(&hello_bytes(&long(MAX_NODE_NAME_LEN))).unwrap(), long(255));
    assert_eq!(long(256).check(), Err(NodeError::NameLen { tenant: 0, len: 256 }));
    // The option limit: 64 names of 87 bytes fit 8192 bytes (6 + 64 * 127 = 8134), of 88 do not (8198).
    let wide = |n: usize| NodeHello::new((0..64).map(|i| tenant(&format!("{i:0n$}"))).collect());
    assert_eq!(wide(87).encoded_len(), 6 + 64 * (2 + 87 + 38));
    assert!(wide(87).encoded_len() <= MAX_OPTION_LEN as usize);
    assert!(wide(87).check().is_ok());
    assert_eq!(wide(88).check(), Err(NodeError::TooLong { len: 6 + 64 * (2 + 88 + 38), max: MAX_OPTION_LEN }));
    assert!(ClientHandshake::with_node("v", wide(88)).is_err(), "a client refuses to send a hello too long");
    // Sent anyway: the option is too long, and the server hangs up (the usual NBD handling).
    let (_, r, _) = server(true, &[(OPT_REIN_NODE, hello_bytes(&wide(88)))]);
    assert!(matches!(r, Err(ProtoError::OptionTooLong { option: OPT_REIN_NODE, .. })), "{r:?}");
}

/// A node client and server in memory, moving `chunk()` bytes at a time; the server accepts every hello.
fn node_handshake(hello: NodeHello, node: bool, mut chunk: impl FnMut() -> usize) -> (ClientProgress, Negotiated) {
    let mut to_client = Vec::new();
    let mut server = ServerHandshake::new(exports(), &mut to_client);
    server.set_node(node);
    let mut client = ClientHandshake::with_node("v", hello).unwrap();
    let (mut to_server, mut c_in, mut s_in) = (Vec::new(), Vec::new(), Vec::new());
    let (mut server_done, mut client_done, mut refused) = (None, None, None);
    for _ in 0..100_000 {
        let n = chunk().min(to_client.len());
        c_in.extend(to_client.drain(..n));
        let n = chunk().min(to_server.len());
        s_in.extend(to_server.drain(..n));
        if server_done.is_none() {
            let (used, p) = server.feed(&s_in, &mut to_client).unwrap();
            s_in.drain(..used);
            match p {
                ServerProgress::NeedMore => {}
                ServerProgress::NodeHello(h) => {
                    server.node_verdict(Ok(harness::welcome_for(&h)), &mut to_client);
                }
                ServerProgress::Done(n) => server_done = Some(n),
                p => panic!("{p:?}"),
            }
        }
        if client_done.is_none() {
            let (used, p) = client.feed(&c_in, &mut to_server).unwrap();
            c_in.drain(..used);
            match p {
                ClientProgress::NeedMore => {}
                ClientProgress::NodeRefused(code, _) => refused = Some(code),
                p => client_done = Some(p),
            }
        }
        if let (Some(c), Some(s)) = (&client_done, &server_done) {
            if !node {
                assert_eq!(refused, Some(REP_ERR_UNSUP), "a plain server refuses UNSUP, and GO goes on");
            }
            return (c.clone(), s.clone());
        }
    }
    panic!("the handshake did not finish");
}

proptest! {
    #[test]
    fn node_handshake_survives_any_chunking(sizes in proptest::collection::vec(1usize..40, 1..32), n in 1usize..5) {
        let hello = NodeHello::new((0..n).map(|i| tenant(&format!("c{i}"))).collect());
        let mut i = 0;
        let (c, s) = node_handshake(hello.clone(), true, || { i += 1; sizes[i % sizes.len()] });
        let want = harness::welcome_for(&hello);
        prop_assert_eq!(c, ClientProgress::NodeReady { size: 1 << 20, flags: exports()[0].transmission_flags(), welcome: want.clone() });
        prop_assert_eq!(s.node, Some(want));
        // Against a server without the option: UNSUP, then a plain session.
        let mut i = 0;
        let (c, s) = node_handshake(hello, false, || { i += 1; sizes[i % sizes.len()] });
        prop_assert!(matches!(c, ClientProgress::Ready { structured: false, .. }), "{:?}", c);
        prop_assert_eq!(s.node, None);
    }

    #[test]
    fn valid_hellos_round_trip(
        tenants in proptest::collection::vec(
            ("[a-z]{1,12}", 0f64..1e9, proptest::option::of(1e-3f64..1e9), 1e-3f64..1e6, 0f64..1e6, any::<u32>(), any::<bool>()),
            1..=MAX_NODE_TENANTS,
        ),
    ) {
        let mut seen = std::collections::HashSet::new();
        let tenants: Vec<NodeTenant> = tenants
            .into_iter()
            .filter(|t| seen.insert(t.0.clone()))
            .map(|(name, reservation, limit, weight, local_reservation, idle_credit, rho)| NodeTenant {
                name, reservation, limit, weight, local_reservation, idle_credit,
                split: if rho { NodeSplit::Rho } else { NodeSplit::Spread },
            })
            .collect();
        let h = NodeHello::new(tenants);
        prop_assert!(h.check().is_ok());
        prop_assert_eq!(NodeHello::decode(&hello_bytes(&h)), Ok(h.clone()));
        harness::node_hello(&hello_bytes(&h));
    }

    #[test]
    fn node_decoders_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        harness::node_hello(&data);
    }

    #[test]
    fn mutated_hellos_are_accepted_valid_or_refused_named(at in 0usize..48, byte in any::<u8>()) {
        let mut data = hello_bytes(&NodeHello::new(vec![tenant("ab")]));
        data[at] = byte;
        match NodeHello::decode(&data) {
            Ok(h) => prop_assert!(h.check().is_ok()),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        harness::node_hello(&data);
    }

    #[test]
    fn node_streams_are_split_independent(
        reqs in proptest::collection::vec((
            0u16..8, any::<u64>(), 0u64..70_000, 0u32..8,
            // The share word: half of them with the pool flag (bit 31) set.
            (0u32..140_000).prop_map(|s| if s >= 70_000 { (s - 70_000) | 1 << 31 } else { s }),
            0u64..100, 0u64..120,
        ), 0..24),
        seed in any::<u8>(),
    ) {
        let config = TransmissionConfig {
            size: 1 << 16, read_only: false, structured: false, max_payload: 4096, volatile: false,
            node: true, node_slots: 4, base_allocation: false,
        };
        let mut stream = Vec::new();
        for (command, handle, offset, slot, share, delta, rho) in &reqs {
            let length = (*offset % 5000) as u32;
            let command = Command::from_u16(*command);
            let header = RequestHeader { flags: 0, command, handle: *handle, offset: *offset, length };
            encode_node_request(&header, &NodeTag::from_words(*slot, *share, *delta, *rho), &mut stream);
            if command == Command::Write {
                stream.extend(std::iter::repeat_n(0x5a, length as usize));
            }
        }
        let out = harness::transmission_with(config, &stream, &harness::chunk_sizes(seed));
        // Invariant 1 on a node session: one outcome per request up to a disconnect.
        let until_disc = reqs.iter().position(|r| r.0 == CMD_DISC).map_or(reqs.len(), |i| i + 1);
        prop_assert_eq!(out.len(), until_disc);
        for (o, (_, _, _, slot, share, delta, rho)) in out.iter().zip(&reqs) {
            // Bit 31 of the share word is the pool flag (v3); the share is the rest.
            let s = *share & 0x7fff_ffff;
            let bad_tag = *slot >= 4 || s == 0 || s > 65536 || rho > delta;
            if let harness::Outcome::Request(r, _) = o {
                prop_assert!(!bad_tag, "a bad tag accepted: {:?}", r.tag);
                let want = NodeTag { slot: *slot, share: s, delta: *delta, rho: *rho, pool_busy: *share >> 31 == 1 };
                prop_assert_eq!(r.tag, Some(want));
            }
        }
    }
}

#[test]
fn bad_tags_are_rejected_einval_and_the_stream_stays_in_sync() {
    let config = TransmissionConfig {
        size: 1 << 20,
        read_only: false,
        structured: false,
        max_payload: 4096,
        volatile: false,
        node: true,
        node_slots: 2,
        base_allocation: false,
    };
    let good = NodeTag { slot: 1, share: 65536, delta: 10, rho: 5, pool_busy: true };
    let cases = [
        (NodeTag { slot: 2, ..good }, TagFault::Slot { slot: 2, slots: 2 }),
        (NodeTag { share: 0, ..good }, TagFault::Share(0)),
        (NodeTag { share: 65537, ..good }, TagFault::Share(65537)),
        (NodeTag { rho: 11, ..good }, TagFault::RhoAboveDelta { rho: 11, delta: 10 }),
    ];
    for (bad, fault) in cases {
        let mut m = ServerTransmission::new(config);
        let mut input = Vec::new();
        let write = RequestHeader { flags: 0, command: Command::Write, handle: 1, offset: 0, length: 8 };
        encode_node_request(&write, &bad, &mut input);
        input.extend_from_slice(b"12345678");
        let read = RequestHeader { flags: 0, command: Command::Read, handle: 2, offset: 0, length: 4 };
        encode_node_request(&read, &good, &mut input);
        let (used, e) = m.feed(&input).unwrap();
        assert_eq!(used, REQUEST_LEN + NODE_TAG_LEN, "header and tag consumed");
        let Event::Reject(r) = e else { panic!("{e:?}") };
        assert_eq!((r.reason, r.kind()), (Reason::Tag(fault), rein_proto::ErrorKind::InvalidRequest));
        let mut reply = Vec::new();
        m.replies().rejection(&mut reply, &r);
        let (sr, trailer, n) = decode_node_reply(&reply).unwrap().unwrap();
        assert_eq!((sr.handle, sr.error, trailer, n), (1, EINVAL, NodeReplyTrailer::default(), reply.len()));
        // The WRITE's payload is skipped, then the READ comes with its tag.
        let (used2, e) = m.feed(&input[used..]).unwrap();
        assert_eq!(used + used2, input.len());
        let Event::Request { request, .. } = e else { panic!("{e:?}") };
        assert_eq!((request.handle, request.tag), (2, Some(good)));
        let enc = m.replies();
        let mut reply = vec![0u8; enc.headroom(&request)];
        reply.extend_from_slice(b"data");
        let trailer = NodeReplyTrailer { phase: Some(rein_core::Phase::Reservation), cost: 65536 };
        enc.success_node(&request, trailer, &mut reply);
        let (sr, t, n) = decode_node_reply(&reply).unwrap().unwrap();
        assert_eq!((sr.handle, sr.error, t), (2, 0, trailer));
        assert_eq!(&reply[n..], b"data");
    }
}

#[test]
fn a_node_request_waits_for_its_tag_and_disc_carries_one() {
    let config = TransmissionConfig {
        size: 1 << 20,
        read_only: false,
        structured: false,
        max_payload: 4096,
        volatile: false,
        node: true,
        node_slots: 1,
        base_allocation: false,
    };
    let mut m = ServerTransmission::new(config);
    let mut input = Vec::new();
    let flush = RequestHeader { flags: 0, command: Command::Flush, handle: 5, offset: 0, length: 0 };
    encode_node_request(&flush, &NodeTag { slot: 0, share: 1, delta: 0, rho: 0, pool_busy: false }, &mut input);
    assert_eq!(m.feed(&input[..REQUEST_LEN + 3]).unwrap(), (0, Event::NeedMore { wanted: REQUEST_LEN + NODE_TAG_LEN }));
    assert!(matches!(m.feed(&input).unwrap(), (52, Event::Request { .. })));
    let disc = RequestHeader { flags: 0, command: Command::Disc, handle: 6, offset: 0, length: 0 };
    let mut input = Vec::new();
    // DISC's tag is ignored, even an invalid one.
    encode_node_request(&disc, &NodeTag { slot: 9, share: 0, delta: 0, rho: 1, pool_busy: false }, &mut input);
    assert_eq!(m.feed(&input).unwrap(), (52, Event::Disconnect));
}

#[test]
fn trailers_reject_bad_phases_reserved_bytes_and_cost_without_phase() {
    let mut t = [0u8; 16];
    t[0] = 4;
    assert!(matches!(NodeReplyTrailer::decode(&t), Err(NodeError::Enum { field: "phase", value: 4, .. })));
    t[0] = 1;
    t[3] = 1;
    assert_eq!(NodeReplyTrailer::decode(&t), Err(NodeError::Reserved("a reply trailer")));
    let mut t = [0u8; 16];
    t[15] = 1;
    assert_eq!(NodeReplyTrailer::decode(&t), Err(NodeError::CostWithoutPhase(1)));
    let mut reply = Vec::new();
    simple_reply(&mut reply, 1, 0);
    reply.extend_from_slice(&t);
    assert!(matches!(decode_node_reply(&reply), Err(ProtoError::Node(e)) if *e == NodeError::CostWithoutPhase(1)));
    assert_eq!(decode_node_reply(&reply[..31]), Ok(None));
}

/// One handshake takes at most `MAX_NODE_HELLOS` hellos: each of the first 8 is asked of the caller (each
/// may change and persist the node's specs) and granted; the 9th is refused with NBD_REP_ERR_POLICY naming
/// the bound, without asking the caller, and the session the 8th agreed stands (GO opens it). Before, a
/// client could send hellos until the handshake timed out, each one a change of the node's specs.
#[test]
fn a_handshake_takes_at_most_max_node_hellos() {
    let go = {
        let mut d = 1u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"v");
        d.extend_from_slice(&0u16.to_be_bytes());
        d
    };
    let mut out = Vec::new();
    let mut s = ServerHandshake::new(exports(), &mut out);
    s.set_node(true);
    out.clear();
    let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    let hellos: Vec<NodeHello> =
        (0..=MAX_NODE_HELLOS).map(|i| NodeHello::new(vec![tenant(&format!("c{i}"))])).collect();
    for h in &hellos {
        option_request(&mut input, OPT_REIN_NODE, &hello_bytes(h));
    }
    option_request(&mut input, OPT_GO, &go);
    let mut welcomes = Vec::new();
    let mut rest = &input[..];
    let done = loop {
        let (used, p) = s.feed(rest, &mut out).unwrap();
        rest = &rest[used..];
        match p {
            ServerProgress::NodeHello(h) => {
                assert_eq!(h, hellos[welcomes.len()], "hellos asked in order");
                let w = harness::welcome_for(&h);
                assert_eq!(s.node_verdict(Ok(w.clone()), &mut out), ServerProgress::NeedMore);
                welcomes.push(w);
            }
            ServerProgress::Done(n) => break n,
            p => panic!("{p:?}"),
        }
    };
    assert_eq!(welcomes.len(), MAX_NODE_HELLOS as usize, "only the first {MAX_NODE_HELLOS} asked");
    let mut replies = Vec::new();
    let mut at = &out[..];
    while let Some((r, n)) = decode_option_reply(at).unwrap() {
        replies.push((r.option, r.reply, String::from_utf8_lossy(r.data).into_owned()));
        at = &at[n..];
    }
    let refused = &replies[MAX_NODE_HELLOS as usize];
    assert_eq!((refused.0, refused.1), (OPT_REIN_NODE, REP_ERR_POLICY));
    assert_eq!(refused.2, format!("at most {MAX_NODE_HELLOS} storage-node hellos on one connection"));
    assert_eq!(done.node, welcomes.last().cloned(), "the last granted session stands");
}
