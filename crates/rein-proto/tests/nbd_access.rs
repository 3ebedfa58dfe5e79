//! The server handshake's TLS modes, per-export visibility, default export, refusal and confirmed
//! opening (issue 12): byte-level answers, and a property test that a hidden export is answered exactly
//! like a missing one.
use proptest::prelude::*;
use rein_proto::nbd::*;

fn exports() -> Vec<ExportInfo> {
    vec![
        ExportInfo {
            name: "rd".into(),
            description: "tenant rd".into(),
            size: 1 << 30,
            read_only: false,
            volatile: false,
            min_block: 1,
        },
        ExportInfo {
            name: "secret".into(),
            description: "tenant s".into(),
            size: 4096,
            read_only: true,
            volatile: false,
            min_block: 1,
        },
    ]
}

fn flags_and(opts: &[(u32, &[u8])]) -> Vec<u8> {
    let mut v = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    for (o, d) in opts {
        option_request(&mut v, *o, d);
    }
    v
}

fn go(name: &str) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    d
}

/// All option replies in `out`: (option, reply type, data).
fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut v = Vec::new();
    while let Some((r, n)) = decode_option_reply(out).unwrap() {
        v.push((r.option, r.reply, r.data.to_vec()));
        out = &out[n..];
    }
    assert!(out.is_empty(), "trailing bytes after the option replies");
    v
}

fn server(setup: impl FnOnce(&mut ServerHandshake)) -> ServerHandshake {
    let mut greeting = Vec::new();
    let mut s = ServerHandshake::new(exports(), &mut greeting);
    setup(&mut s);
    s
}

fn listed(out: &[u8]) -> Vec<String> {
    replies(out)
        .into_iter()
        .filter(|r| r.1 == REP_SERVER)
        .map(|(_, _, d)| {
            let l = u32::from_be_bytes(d[..4].try_into().unwrap()) as usize;
            String::from_utf8(d[4..4 + l].to_vec()).unwrap()
        })
        .collect()
}

#[test]
fn starttls_on_is_acknowledged_and_negotiation_goes_on_over_tls() {
    let mut s = server(|s| s.set_tls(TlsMode::On));
    let mut out = Vec::new();
    // Structured replies asked before TLS are forgotten after it.
    let input = flags_and(&[(OPT_STRUCTURED_REPLY, &[]), (OPT_STARTTLS, &[])]);
    let (used, p) = s.feed(&input, &mut out).unwrap();
    assert_eq!((used, p), (input.len(), ServerProgress::StartTls));
    assert_eq!(replies(&out).last().unwrap(), &(OPT_STARTTLS, REP_ACK, vec![]));
    // Nothing may be fed before the TLS handshake.
    assert!(s.clone().feed(&[0], &mut out).is_err());
    s.tls_established();
    assert!(s.tls_active());
    out.clear();
    // A second STARTTLS is invalid; then GO opens the export without structured replies.
    let mut input = Vec::new();
    option_request(&mut input, OPT_STARTTLS, &[]);
    option_request(&mut input, OPT_GO, &go("rd"));
    let (_, p) = s.feed(&input, &mut out).unwrap();
    assert_eq!(
        p,
        ServerProgress::Done(Negotiated { export: 0, structured: false, node: None, base_allocation: false })
    );
    assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);
}

#[test]
fn starttls_with_data_is_invalid_and_off_is_policy() {
    let mut out = Vec::new();
    let (_, p) = server(|s| s.set_tls(TlsMode::On)).feed(&flags_and(&[(OPT_STARTTLS, b"x")]), &mut out).unwrap();
    assert_eq!(p, ServerProgress::NeedMore);
    assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);
    out.clear();
    let (_, p) = server(|_| {}).feed(&flags_and(&[(OPT_STARTTLS, &[])]), &mut out).unwrap();
    assert_eq!(p, ServerProgress::NeedMore);
    assert_eq!(replies(&out)[0].1, REP_ERR_POLICY);
}

#[test]
fn tls_on_serves_plain_clients_too() {
    let mut out = Vec::new();
    let (_, p) = server(|s| s.set_tls(TlsMode::On)).feed(&flags_and(&[(OPT_GO, &go("rd"))]), &mut out).unwrap();
    assert_eq!(
        p,
        ServerProgress::Done(Negotiated { export: 0, structured: false, node: None, base_allocation: false })
    );
}

#[test]
fn tls_require_refuses_every_option_but_starttls_and_abort() {
    let mut s = server(|s| s.set_tls(TlsMode::Require));
    let mut out = Vec::new();
    let input = flags_and(&[
        (OPT_LIST, &[]),
        (OPT_STRUCTURED_REPLY, &[]),
        (OPT_INFO, &go("rd")),
        (OPT_GO, &go("rd")),
        (99, &[]),
    ]);
    let (_, p) = s.feed(&input, &mut out).unwrap();
    assert_eq!(p, ServerProgress::NeedMore);
    let r = replies(&out);
    assert_eq!(r.len(), 5);
    for (_, reply, message) in &r {
        assert_eq!(*reply, REP_ERR_TLS_REQD);
        assert!(String::from_utf8_lossy(message).contains("TLS is required"));
    }
    // EXPORT_NAME has no error reply: close, saying why.
    let e =
        s.clone().feed(&flags_and(&[])[4..].iter().copied().chain(go_export_name("rd")).collect::<Vec<_>>(), &mut out);
    assert!(matches!(e, Err(ProtoError::Refused(m)) if m.contains("TLS is required")));
    // ABORT is acknowledged.
    out.clear();
    assert_eq!(s.clone().feed(&opt(OPT_ABORT, &[]), &mut out).unwrap().1, ServerProgress::Aborted);
    // After TLS, all is allowed.
    out.clear();
    assert_eq!(s.feed(&opt(OPT_STARTTLS, &[]), &mut out).unwrap().1, ServerProgress::StartTls);
    s.tls_established();
    out.clear();
    let (_, p) = s.feed(&opt(OPT_GO, &go("rd")), &mut out).unwrap();
    assert_eq!(
        p,
        ServerProgress::Done(Negotiated { export: 0, structured: false, node: None, base_allocation: false })
    );
}

/// TLS turned off (a reload) after the connection came in and before its STARTTLS: the STARTTLS gets
/// NBD_REP_ERR_POLICY, as from a server without TLS, and the handshake goes on in plain (a client with
/// optional TLS opens its export; `Require` no longer answers NBD_REP_ERR_TLS_REQD). Before, the mode was
/// the connection's first: the STARTTLS was acknowledged, and the caller, with no TLS to run, could only
/// close the connection after the ACK. TLS turned on again is offered to the next STARTTLS; once TLS is
/// up, turning it off leaves the session as it is (a second STARTTLS is still NBD_REP_ERR_INVALID).
#[test]
fn starttls_after_tls_was_turned_off_is_refused_and_the_handshake_goes_on_in_plain() {
    for mode in [TlsMode::On, TlsMode::Require] {
        let mut s = server(|s| s.set_tls(mode));
        let mut out = Vec::new();
        assert_eq!(s.feed(&flags_and(&[]), &mut out).unwrap(), (4, ServerProgress::NeedMore));
        s.set_tls(TlsMode::Off);
        let (_, p) = s.feed(&opt(OPT_STARTTLS, &[]), &mut out).unwrap();
        assert_eq!(p, ServerProgress::NeedMore, "{mode:?}");
        assert_eq!(replies(&out), [(OPT_STARTTLS, REP_ERR_POLICY, b"TLS is not offered".to_vec())], "{mode:?}");
        out.clear();
        let (_, p) = s.feed(&opt(OPT_GO, &go("rd")), &mut out).unwrap();
        assert_eq!(
            p,
            ServerProgress::Done(Negotiated { export: 0, structured: false, node: None, base_allocation: false }),
            "{mode:?}"
        );
        assert!(!s.tls_active());
    }
    // Off at the connection, required by the time of its first option: TLS_REQD, then STARTTLS is taken.
    let mut s = server(|_| {});
    let mut out = Vec::new();
    s.set_tls(TlsMode::Require);
    let (_, p) = s.feed(&flags_and(&[(OPT_GO, &go("rd")), (OPT_STARTTLS, &[])]), &mut out).unwrap();
    assert_eq!(p, ServerProgress::StartTls);
    assert_eq!(replies(&out).iter().map(|r| r.1).collect::<Vec<_>>(), [REP_ERR_TLS_REQD, REP_ACK]);
    s.tls_established();
    s.set_tls(TlsMode::Off);
    out.clear();
    let (_, p) = s.feed(&opt(OPT_STARTTLS, &[]), &mut out).unwrap();
    assert_eq!((p, replies(&out)[0].1), (ServerProgress::NeedMore, REP_ERR_INVALID));
    assert!(s.tls_active(), "the session stays under TLS");
}

fn opt(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    option_request(&mut v, option, data);
    v
}

fn go_export_name(name: &str) -> Vec<u8> {
    opt(OPT_EXPORT_NAME, name.as_bytes())
}

#[test]
fn hidden_exports_are_not_listed_and_not_opened() {
    let hide = |s: &mut ServerHandshake| s.set_visible(vec![true, false]);
    let mut out = Vec::new();
    server(hide).feed(&flags_and(&[(OPT_LIST, &[])]), &mut out).unwrap();
    assert_eq!(listed(&out), ["rd"]);
    for option in [OPT_INFO, OPT_GO] {
        out.clear();
        let (_, p) = server(hide).feed(&flags_and(&[(option, &go("secret"))]), &mut out).unwrap();
        assert_eq!(p, ServerProgress::NeedMore);
        assert_eq!(replies(&out)[0].1, REP_ERR_UNKNOWN);
    }
    let e = server(hide).feed(&flags_and(&[(OPT_EXPORT_NAME, b"secret")]), &mut out);
    assert_eq!(e.unwrap_err(), ProtoError::Malformed("unknown export in NBD_OPT_EXPORT_NAME"));
}

#[test]
fn the_empty_name_opens_only_a_visible_default_export() {
    let mut out = Vec::new();
    // No default: unknown, and EXPORT_NAME "" closes (issue 12: "" opened the first export).
    let (_, p) = server(|_| {}).feed(&flags_and(&[(OPT_GO, &go(""))]), &mut out).unwrap();
    assert_eq!(p, ServerProgress::NeedMore);
    assert_eq!(replies(&out)[0].1, REP_ERR_UNKNOWN);
    assert!(server(|_| {}).feed(&flags_and(&[(OPT_EXPORT_NAME, b"")]), &mut out).is_err());
    // A default export opens.
    out.clear();
    let (_, p) = server(|s| s.set_default_export(Some(1))).feed(&flags_and(&[(OPT_GO, &go(""))]), &mut out).unwrap();
    assert_eq!(
        p,
        ServerProgress::Done(Negotiated { export: 1, structured: false, node: None, base_allocation: false })
    );
    // A hidden default export does not.
    out.clear();
    let both = |s: &mut ServerHandshake| {
        s.set_default_export(Some(1));
        s.set_visible(vec![true, false]);
    };
    let (_, p) = server(both).feed(&flags_and(&[(OPT_GO, &go(""))]), &mut out).unwrap();
    assert_eq!(p, ServerProgress::NeedMore);
    assert_eq!(replies(&out)[0].1, REP_ERR_UNKNOWN);
}

#[test]
fn a_refused_connection_gets_policy_errors_with_the_message() {
    let refuse = |s: &mut ServerHandshake| s.refuse_all("too many connections from 127.0.0.2".into());
    let mut out = Vec::new();
    let (_, p) = server(refuse)
        .feed(
            &flags_and(&[(OPT_STRUCTURED_REPLY, &[]), (OPT_LIST, &[]), (OPT_GO, &go("rd")), (OPT_STARTTLS, &[])]),
            &mut out,
        )
        .unwrap();
    assert_eq!(p, ServerProgress::NeedMore);
    let r = replies(&out);
    assert_eq!(r.len(), 4);
    for (_, reply, message) in r {
        assert_eq!(reply, REP_ERR_POLICY);
        assert_eq!(message, b"too many connections from 127.0.0.2");
    }
    let e = server(refuse).feed(&flags_and(&[(OPT_EXPORT_NAME, b"rd")]), &mut out);
    assert!(matches!(e, Err(ProtoError::Refused(m)) if m.contains("too many")));
    out.clear();
    assert_eq!(server(refuse).feed(&flags_and(&[(OPT_ABORT, &[])]), &mut out).unwrap().1, ServerProgress::Aborted);
}

#[test]
fn confirmed_opening_can_be_refused_and_retried() {
    let mut s = server(|s| s.set_confirm_open(true));
    let mut out = Vec::new();
    let (_, p) = s.feed(&flags_and(&[(OPT_GO, &go("rd"))]), &mut out).unwrap();
    assert_eq!(p, ServerProgress::Opening(0));
    assert!(out.is_empty(), "nothing is written before the verdict");
    assert_eq!(s.open(Err("tenant rd is at its cap".into()), &mut out).unwrap(), ServerProgress::NeedMore);
    assert_eq!(replies(&out), [(OPT_GO, REP_ERR_POLICY, b"tenant rd is at its cap".to_vec())]);
    out.clear();
    let (_, p) = s.feed(&opt(OPT_GO, &go("rd")), &mut out).unwrap();
    assert_eq!(p, ServerProgress::Opening(0));
    assert_eq!(
        s.open(Ok(()), &mut out).unwrap(),
        ServerProgress::Done(Negotiated { export: 0, structured: false, node: None, base_allocation: false })
    );
    assert_eq!(replies(&out).last().unwrap().1, REP_ACK);
    // EXPORT_NAME refused: close.
    let mut s = server(|s| s.set_confirm_open(true));
    let (_, p) = s.feed(&flags_and(&[(OPT_EXPORT_NAME, b"rd")]), &mut out).unwrap();
    assert_eq!(p, ServerProgress::Opening(0));
    assert!(matches!(s.open(Err("cap".into()), &mut out), Err(ProtoError::Refused(_))));
}

proptest! {
    /// Whatever options come, a hidden export gets byte for byte the answers a server without it would
    /// give to the name of an export that does not exist.
    #[test]
    fn a_hidden_export_answers_like_a_missing_one(ops in proptest::collection::vec((0usize..4, any::<bool>()), 0..8)) {
        let mut hidden = Vec::new();
        let mut missing = Vec::new();
        let mut a = Vec::new();
        let mut b = Vec::new();
        for (op, secret) in ops {
            let option = [OPT_INFO, OPT_GO, OPT_LIST, OPT_STRUCTURED_REPLY][op];
            let data = if option == OPT_LIST || option == OPT_STRUCTURED_REPLY { vec![] } else if secret { go("secret") } else { go("absent") };
            option_request(&mut hidden, option, &data);
            // The same stream with the hidden name where the missing one stands: answers must match.
            let data_b = if option == OPT_LIST || option == OPT_STRUCTURED_REPLY { vec![] } else { go("absent") };
            option_request(&mut missing, option, &data_b);
        }
        let mut s1 = server(|s| s.set_visible(vec![true, false]));
        let mut with_flags = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        with_flags.extend_from_slice(&hidden);
        let r1 = s1.feed(&with_flags, &mut a);
        let mut s2 = ServerHandshake::new(vec![exports()[0].clone()], &mut Vec::new());
        let mut with_flags = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        with_flags.extend_from_slice(&missing);
        let r2 = s2.feed(&with_flags, &mut b);
        prop_assert_eq!(r1, r2);
        // The messages name what the client asked for ("absent" is as long as "secret"); apart from the
        // name, the bytes are the same.
        let a = String::from_utf8_lossy(&a).replace("\"secret\"", "\"absent\"");
        prop_assert_eq!(a, String::from_utf8_lossy(&b).into_owned());
    }
}

/// Runs a TLS-requiring client against `server` in memory, moving `step` bytes at a time each way; at
/// StartTls both sides are told TLS is up (the bytes go on unencrypted: only the NBD side is under test).
/// Returns the client's end and whether the server saw STARTTLS.
fn client_against(
    mut server: ServerHandshake,
    mut greeting: Vec<u8>,
    mut client: ClientHandshake,
    step: usize,
) -> (Result<ClientProgress, ProtoError>, bool) {
    let (mut to_server, mut c_in, mut s_in) = (Vec::new(), Vec::new(), Vec::new());
    let mut to_client = std::mem::take(&mut greeting);
    let (mut server_tls, mut client_tls, mut server_done) = (false, false, false);
    for _ in 0..100_000 {
        let n = step.min(to_client.len());
        c_in.extend(to_client.drain(..n));
        let n = step.min(to_server.len());
        s_in.extend(to_server.drain(..n));
        if !server_done && !s_in.is_empty() {
            match server.feed(&s_in, &mut to_client) {
                Ok((used, p)) => {
                    s_in.drain(..used);
                    match p {
                        ServerProgress::NeedMore => {}
                        ServerProgress::StartTls => server_tls = true,
                        _ => server_done = true,
                    }
                }
                Err(_) => server_done = true,
            }
        }
        // TLS comes up when the client has read the acknowledgement and the server has answered it.
        if server_tls && client_tls {
            server.tls_established();
            client.tls_established().unwrap();
            (server_tls, client_tls) = (false, false);
        }
        match client.feed(&c_in, &mut to_server) {
            Ok((used, ClientProgress::NeedMore)) => {
                c_in.drain(..used);
            }
            Ok((used, ClientProgress::StartTls)) => {
                c_in.drain(..used);
                client_tls = true;
            }
            Ok((_, p)) => return (Ok(p), server_tls),
            Err(e) => return (Err(e), server_tls),
        }
    }
    panic!("the handshake did not finish");
}

#[test]
fn a_client_that_requires_tls_starts_it_first_and_then_opens_the_export() {
    for mode in [TlsMode::On, TlsMode::Require] {
        for step in [usize::MAX, 1, 7] {
            let mut greeting = Vec::new();
            let mut s = ServerHandshake::new(exports(), &mut greeting);
            s.set_tls(mode);
            let c = ClientHandshake::new("rd", true).require_tls();
            let (end, _) = client_against(s, greeting, c, step);
            match end.unwrap() {
                ClientProgress::Ready { size, structured, .. } => {
                    assert_eq!(size, 1 << 30);
                    // Structured replies are asked for after TLS, so they hold.
                    assert!(structured, "mode {mode:?}, step {step}");
                }
                p => panic!("{p:?}"),
            }
        }
    }
}

#[test]
fn a_client_that_requires_tls_never_falls_back_to_plain() {
    let mut greeting = Vec::new();
    let s = ServerHandshake::new(exports(), &mut greeting); // TLS off: STARTTLS gets NBD_REP_ERR_POLICY
    let (end, _) = client_against(s, greeting, ClientHandshake::new("rd", false).require_tls(), usize::MAX);
    match end.unwrap_err() {
        ProtoError::OptionRefused { option, reply, message } => {
            assert_eq!((option, reply), (OPT_STARTTLS, REP_ERR_POLICY));
            assert_eq!(message, "TLS is not offered");
        }
        e => panic!("{e}"),
    }
    // Without require_tls the same server is fine.
    let mut greeting = Vec::new();
    let s = ServerHandshake::new(exports(), &mut greeting);
    let (end, _) = client_against(s, greeting, ClientHandshake::new("rd", false), usize::MAX);
    assert!(matches!(end.unwrap(), ClientProgress::Ready { .. }));
}

#[test]
fn the_client_sends_starttls_before_anything_and_refuses_bytes_after_its_ack() {
    let mut greeting = Vec::new();
    let _ = ServerHandshake::new(exports(), &mut greeting);
    let mut c = ClientHandshake::new("rd", true).require_tls();
    let mut out = Vec::new();
    let (used, p) = c.feed(&greeting, &mut out).unwrap();
    assert_eq!((used, p), (greeting.len(), ClientProgress::NeedMore));
    // Client flags, then STARTTLS with no data, and nothing else (not STRUCTURED_REPLY, not GO).
    let mut want = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    option_request(&mut want, OPT_STARTTLS, &[]);
    assert_eq!(out, want);
    let mut ack = Vec::new();
    option_reply(&mut ack, OPT_STARTTLS, REP_ACK, &[]);
    // An injected reply after the ACK, in the clear: refused.
    let mut injected = ack.clone();
    option_reply(&mut injected, OPT_GO, REP_ACK, &[]);
    let e = c.clone().feed(&injected, &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("data after the NBD_OPT_STARTTLS reply before TLS"), "{e}");
    // An ACK with data, or a reply to another option: refused.
    let mut bad = Vec::new();
    option_reply(&mut bad, OPT_STARTTLS, REP_ACK, b"x");
    assert!(c.clone().feed(&bad, &mut Vec::new()).is_err());
    let mut other = Vec::new();
    option_reply(&mut other, OPT_GO, REP_ACK, &[]);
    assert!(c.clone().feed(&other, &mut Vec::new()).is_err());
    // The ACK alone: StartTls; feeding before tls_established with data is an error, with none StartTls.
    let mut out = Vec::new();
    assert_eq!(c.feed(&ack, &mut out).unwrap(), (ack.len(), ClientProgress::StartTls));
    assert!(out.is_empty());
    assert_eq!(c.feed(&[], &mut out).unwrap(), (0, ClientProgress::StartTls));
    assert!(c.clone().feed(&[0], &mut out).is_err());
    // After TLS: STRUCTURED_REPLY is the next thing sent.
    c.tls_established().unwrap();
    assert!(c.clone().tls_established().is_err(), "TLS comes up once");
    let (used, p) = c.feed(&[], &mut out).unwrap();
    assert_eq!((used, p), (0, ClientProgress::NeedMore));
    let mut want = Vec::new();
    option_request(&mut want, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(out, want);
}

#[test]
fn after_shut_down_options_get_err_shutdown_and_abort_still_ends() {
    let mut s = server(|_| {});
    let mut out = Vec::new();
    let (_, p) = s.feed(&flags_and(&[(OPT_LIST, &[])]), &mut out).unwrap();
    assert_eq!(p, ServerProgress::NeedMore);
    assert!(replies(&out).iter().any(|r| r.1 == REP_SERVER), "listed before the shutdown");
    s.shut_down();
    for option in [OPT_LIST, OPT_GO, OPT_INFO, OPT_STRUCTURED_REPLY, OPT_STARTTLS] {
        let data = if option == OPT_GO || option == OPT_INFO { go("rd") } else { Vec::new() };
        let mut out = Vec::new();
        let (_, p) = s.feed(&opt(option, &data), &mut out).unwrap();
        assert_eq!(p, ServerProgress::NeedMore, "option {option}");
        assert_eq!(replies(&out), vec![(option, REP_ERR_SHUTDOWN, b"the server is shutting down".to_vec())]);
    }
    // EXPORT_NAME has no error reply: the handshake ends.
    let e = s.clone().feed(&go_export_name("rd"), &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("the server is shutting down"), "{e}");
    // ABORT, the client's soft disconnect, is still acknowledged.
    let mut out = Vec::new();
    assert_eq!(s.feed(&opt(OPT_ABORT, &[]), &mut out).unwrap().1, ServerProgress::Aborted);
    assert_eq!(replies(&out), vec![(OPT_ABORT, REP_ACK, vec![])]);
}
