//! The fixed newstyle handshake, server and client, as state machines over byte buffers.
//!
//! # Server states
//! ```text
//! new() --greeting--> ClientFlags --flags ok--> Options --+-- EXPORT_NAME (visible) --> [Opening] --> Finished: Done
//!                                                  ^      +-- GO (visible) ----------> [Opening] --> Finished: Done
//!                                                  |      +-- ABORT --------------> Finished: Aborted
//!                                                  |      +-- STARTTLS (offered) ---> AwaitTls: StartTls
//!                                                  |      +-- LIST / INFO / STRUCTURED_REPLY / META_CONTEXT / other -> Options
//!                                                  +------ tls_established() <-- AwaitTls
//! ```
//! [`ServerHandshake::feed`] consumes whole messages from `input` (returning how many bytes it used, so
//! partial reads work) and appends replies to `out`. A bad magic, unsupported client flags, an option
//! longer than [`MAX_OPTION_LEN`] or an unknown export in EXPORT_NAME is a [`ProtoError`]: close.
//!
//! # What the caller decides, and what the handshake decides with it
//! The handshake makes every protocol decision; the caller only supplies facts about the connection:
//! - **TLS** ([`TlsMode`], [`ServerHandshake::set_tls`]). `Off`: STARTTLS gets NBD_REP_ERR_POLICY. `On`
//!   and `Require`: STARTTLS (with no data) is acknowledged and `feed` returns
//!   [`ServerProgress::StartTls`]; the caller runs the TLS handshake on the socket (the client sends
//!   nothing else before it), calls [`ServerHandshake::tls_established`] and feeds the bytes that arrive
//!   over TLS. Options negotiated before TLS (structured replies) are forgotten, as the spec requires.
//!   `Require`: before TLS, every option but STARTTLS and ABORT gets NBD_REP_ERR_TLS_REQD, and
//!   EXPORT_NAME (which has no error reply) closes. STARTTLS once TLS is up gets NBD_REP_ERR_INVALID.
//!
//!   The mode is TLS as it stands when an option arrives: the caller may call `set_tls` again before
//!   any `feed` (a reload may turn TLS on or off while a client negotiates), and each option is answered
//!   under the mode set last. So a STARTTLS that comes after TLS was turned off gets NBD_REP_ERR_POLICY
//!   and the handshake goes on in plain, as with a server that never had TLS (the spec's NOTLS mode):
//!   a client with optional TLS carries on without it, one that requires TLS gives up with its own
//!   error. Before, the mode was set once per connection, so such a STARTTLS was acknowledged and the
//!   caller, with no TLS to start, could only drop the connection after the ACK. Deviation: the spec
//!   asks a server to keep one mode for a TCP connection's lifespan; a reload during option haggling is
//!   the one thing that changes it, since promising TLS the server no longer has, or serving an export
//!   in plain after the operator required TLS, would be worse than a change the client sees once.
//! - **Visibility** ([`ServerHandshake::set_visible`], one flag per export; all visible by default): a
//!   hidden export is left out of LIST, and INFO, GO and EXPORT_NAME answer it exactly as an export that
//!   does not exist (NBD_REP_ERR_UNKNOWN with the same message; EXPORT_NAME closes), so its existence does
//!   not leak. The caller sets it again when TLS reveals the client's identity.
//! - **The default export** ([`ServerHandshake::set_default_export`]): the empty name opens it, if it is
//!   set and visible; without one the empty name is an unknown export (it used to open the first export).
//! - **Refusal** ([`ServerHandshake::refuse_all`]): a connection over a cap gets the greeting, then every
//!   option but ABORT is answered NBD_REP_ERR_POLICY with the caller's message (so clients print it), and
//!   EXPORT_NAME closes.
//! - **Shutdown** ([`ServerHandshake::shut_down`]): from then on every option but ABORT is answered
//!   NBD_REP_ERR_SHUTDOWN (EXPORT_NAME, which has no error reply, closes), as the spec asks: "If the server
//!   is in the process of being shut down it [...] SHOULD error further options received (other than an
//!   `NBD_OPT_ABORT`) with `NBD_REP_ERR_SHUTDOWN`. If the client receives `NBD_REP_ERR_SHUTDOWN` it MUST
//!   initiate a soft disconnect."
//! - **Opening** ([`ServerHandshake::set_confirm_open`]): if asked, a GO or EXPORT_NAME of a visible export
//!   returns [`ServerProgress::Opening`] before anything is written; the caller takes what the connection
//!   needs (a per-tenant connection slot) and answers with [`ServerHandshake::open`]: accepted, the
//!   export's information and ACK (then `Done`); refused, NBD_REP_ERR_POLICY with the message (GO: the
//!   client may try again) or a close (EXPORT_NAME).
//!
//! - **The storage-node protocol** ([`ServerHandshake::set_node`], off by default: then
//!   [`OPT_REIN_NODE`] is answered exactly like any unknown option, NBD_REP_ERR_UNSUP). On, a valid
//!   [`NodeHello`] makes `feed` return [`ServerProgress::NodeHello`] before anything is written; the caller
//!   decides (its `[node]` configuration, the peer, the tenants) and answers with
//!   [`ServerHandshake::node_verdict`]: the [`NodeWelcome`] (REP_REIN_NODE) or a refusal (its error reply
//!   and message). A malformed hello gets NBD_REP_ERR_INVALID naming the field, without asking the caller.
//!   The node protocol and STRUCTURED_REPLY exclude each other: whichever comes second gets
//!   NBD_REP_ERR_INVALID. A second REIN_NODE replaces the first (a refused one leaves none); STARTTLS
//!   forgets it, like structured replies. One handshake takes at most [`MAX_NODE_HELLOS`] hellos (each
//!   may change and persist the node's specs): past that, NBD_REP_ERR_POLICY without asking the caller,
//!   and the session agreed so far stands.
//!
//! - **Metadata contexts** ([`ServerHandshake::set_block_status`], one flag per export; none by default):
//!   LIST_META_CONTEXT and SET_META_CONTEXT offer `base:allocation` on the exports flagged, and answer
//!   with no context on the others; what a SET selected holds for the GO of the same export only
//!   ([`Negotiated::base_allocation`]; the rules in [`super::meta`]).
//!
//! # Client states

//! ```text
//! new() --greeting--> [STRUCTURED_REPLY sent --reply-->] [SET_META_CONTEXT sent --META_CONTEXT*, ACK-->]
//!                     GO sent --INFO*, ACK--> Ready
//! with_node() --greeting--> REIN_NODE sent --REP_REIN_NODE--> GO sent --INFO*, ACK--> NodeReady
//!                                           --error reply--> GO sent (NodeRefused) --INFO*, ACK--> Ready
//! probe() --greeting--> INFO sent --INFO*, ACK or error--> INFO sent (next export) ... --> ABORT sent (Info)
//! ```
//! [`ClientHandshake`] asks for structured replies if wanted, then for the export with NBD_OPT_GO.
//! With [`ClientHandshake::with_meta_context`] (and structured replies agreed) it asks for one metadata
//! context (`base:allocation`) for the export with NBD_OPT_SET_META_CONTEXT in between: of the
//! NBD_REP_META_CONTEXT replies it keeps the id of the one named as asked (a second such reply, or one
//! shorter than its id, is a [`ProtoError`]; others are skipped, so what it holds is one id whatever the
//! server sends, each reply within [`decode_option_reply`]'s bound) and goes on to GO at the ACK; an
//! error reply selects nothing ([`ClientHandshake::meta_context`]: `None`) and GO follows all the same.
//! The id holds for the GO of the same export (the spec's rule), which is the one this client opens. With
//! [`ClientHandshake::with_node`] it sends [`OPT_REIN_NODE`] first; a refusal is reported
//! ([`ClientProgress::NodeRefused`]) with GO already sent, so a caller that can do without the node
//! protocol goes on feeding (plain NBD) and one that cannot closes.
//!
//! [`ClientHandshake::probe`] opens nothing: it asks for each of its exports' information with
//! NBD_OPT_INFO (the same request as GO's), one export after another on the one connection, and once the
//! server has given the last its final reply ends the negotiation with NBD_OPT_ABORT (in `out` with
//! [`ClientProgress::Info`]; the caller writes it and closes, without waiting for the server's answer,
//! which the spec lets a server leave out). A client reads exports' transmission flags so, as they are
//! now, without a session (a gateway's check of its node exports' read-only flag: one connection for
//! every export it uses on a node, not one each). Each export gets its own answer ([`Probed`]): an error
//! reply (`NBD_REP_ERR_*`: an unknown export, a policy) is that export's, and the next export is asked
//! all the same; only NBD_REP_ERR_SHUTDOWN, after which the spec has a client leave, answers every export
//! not yet asked with the same error and ends the probe. A reply that breaks the protocol (another
//! option's, an unknown non-error type, an ACK without NBD_INFO_EXPORT) is a [`ProtoError`] for the whole
//! connection; [`ClientHandshake::probed`] keeps the answers that came before it.
//!
//! The options go one at a time: the spec has a client send no option before the final reply to the one
//! before (so a probe of `n` exports is `n` round trips). How many one connection may carry is the
//! caller's to bound by what the server takes: nbdkit ends a handshake after 32 options, NBD_OPT_STARTTLS
//! and NBD_OPT_ABORT included ([`PROBE_EXPORTS_ANY_SERVER`]); `rein serve` counts none (its handshake is
//! bounded in time only).
//!
//! With [`ClientHandshake::require_tls`] the client sends NBD_OPT_STARTTLS right after the greeting,
//! before any other option (the spec's "forced TLS" from the client's side):
//! ```text
//! --greeting--> STARTTLS sent --ACK--> StartTls: caller runs TLS, tls_established() --> (as above)
//!                             --error reply--> ProtoError::OptionRefused (never plain)
//! ```
//! The ACK must be the last byte before TLS: bytes after it in the same input are a protocol error (a
//! server must send nothing more in the clear, and a man in the middle could otherwise inject replies
//! that the client would take as coming over TLS). A refusal is an error, never a fall-back to plain NBD.

use super::*;
use crate::nbd::meta::MetaOption;
use crate::nbd::node::{
    NodeError, NodeHello, NodeWelcome, MAX_NODE_HELLOS, NODE_VERSION_BLOCK_STATUS, OPT_REIN_NODE, REP_REIN_NODE,
};
use crate::nbd::transmission::MAX_PAYLOAD_LIMIT;

/// What a finished handshake agreed.
#[derive(Debug, Clone, PartialEq)]
pub struct Negotiated {
    /// Index into the exports given to the server handshake.
    pub export: usize,
    /// Whether the client asked for structured replies.
    pub structured: bool,
    /// The storage-node session, if one was agreed (what the node answered).
    pub node: Option<NodeWelcome>,
    /// Whether `base:allocation` was selected for this export (or is implied: a storage-node session of
    /// version 4 or later on an export that answers it, [`super::node`]): BLOCK_STATUS is then answered
    /// ([`super::meta`]).
    pub base_allocation: bool,
}

/// Result of feeding the server handshake.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerProgress {
    /// Needs more input.
    NeedMore,
    /// The client chose an export: transmission starts with the next byte.
    Done(Negotiated),
    /// The client sent NBD_OPT_ABORT (already acknowledged in `out`): close the connection.
    Aborted,
    /// NBD_OPT_STARTTLS was acknowledged (in `out`): write `out`, run the TLS handshake as the server,
    /// then call [`ServerHandshake::tls_established`] and go on feeding what arrives over TLS. Bytes
    /// received before the TLS handshake and not consumed are a protocol violation (close).
    StartTls,
    /// With [`ServerHandshake::set_confirm_open`]: the client asks to open this visible export (an index
    /// into the exports); nothing is written yet. Answer with [`ServerHandshake::open`].
    Opening(usize),
    /// With [`ServerHandshake::set_node`]: a valid storage-node hello; nothing is written yet. Answer with
    /// [`ServerHandshake::node_verdict`].
    NodeHello(NodeHello),
}

/// Whether the server offers TLS (NBD_OPT_STARTTLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// No TLS: STARTTLS gets NBD_REP_ERR_POLICY (the default).
    #[default]
    Off,
    /// STARTTLS is offered; clients may also go on without it.
    On,
    /// STARTTLS is required before any option but ABORT (the spec's "forced TLS").
    Require,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SState {
    ClientFlags,
    Options,
    /// STARTTLS acknowledged; waiting for [`ServerHandshake::tls_established`].
    AwaitTls,
    /// [`ServerProgress::Opening`] returned; waiting for [`ServerHandshake::open`].
    AwaitOpen,
    /// [`ServerProgress::NodeHello`] returned; waiting for [`ServerHandshake::node_verdict`].
    AwaitNode,
    Finished,
}

/// A GO or EXPORT_NAME waiting for the caller's verdict.
#[derive(Debug, Clone)]
struct PendingOpen {
    option: u32,
    export: usize,
    /// The information types a GO asked for.
    wanted: Vec<u16>,
}

/// The server side of the fixed newstyle handshake.
#[derive(Debug, Clone)]
pub struct ServerHandshake {
    exports: Vec<ExportInfo>,
    max_payload: u32,
    state: SState,
    no_zeroes: bool,
    structured: bool,
    tls: TlsMode,
    tls_active: bool,
    /// One flag per export: whether this client may see it.
    visible: Vec<bool>,
    default_export: Option<usize>,
    /// Every option but ABORT refused with this error reply and message ([`ServerHandshake::refuse_all`],
    /// [`ServerHandshake::shut_down`]).
    refusal: Option<(u32, String)>,
    confirm_open: bool,
    pending: Option<PendingOpen>,
    /// Whether the storage-node option is offered.
    node_enabled: bool,
    /// The storage-node session agreed so far.
    node: Option<NodeWelcome>,
    /// Tenants of the hello waiting for its verdict.
    node_pending: Option<usize>,
    /// Storage-node hellos received so far (at most [`MAX_NODE_HELLOS`] are taken).
    node_hellos: u32,
    /// One flag per export: whether it answers `base:allocation` ([`ServerHandshake::set_block_status`]).
    block_status: Vec<bool>,
    /// The export a SET_META_CONTEXT selected `base:allocation` for ([`super::meta`]), if any.
    meta: Option<usize>,
}

impl ServerHandshake {
    /// Starts a handshake that advertises [`DEFAULT_MAX_PAYLOAD`]; appends the greeting to `out`.
    pub fn new(exports: Vec<ExportInfo>, out: &mut Vec<u8>) -> ServerHandshake {
        Self::with_max_payload(exports, DEFAULT_MAX_PAYLOAD, out)
    }

    /// Starts a handshake whose block-size information advertises `max_payload` (the limit the
    /// transmission phase enforces, [`TransmissionConfig::max_payload`]); appends the greeting to `out`.
    /// TLS off, every export visible, no default export, nothing refused (module comment).
    pub fn with_max_payload(exports: Vec<ExportInfo>, max_payload: u32, out: &mut Vec<u8>) -> ServerHandshake {
        out.extend_from_slice(&NBDMAGIC.to_be_bytes());
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        let visible = vec![true; exports.len()];
        let block_status = vec![false; exports.len()];
        ServerHandshake {
            exports,
            max_payload: max_payload.clamp(1, MAX_PAYLOAD_LIMIT),
            state: SState::ClientFlags,
            no_zeroes: false,
            structured: false,
            tls: TlsMode::Off,
            tls_active: false,
            visible,
            default_export: None,
            refusal: None,
            confirm_open: false,
            pending: None,
            node_enabled: false,
            node: None,
            node_pending: None,
            node_hellos: 0,
            block_status,
            meta: None,
        }
    }

    /// The server is shutting down: every further option but ABORT gets NBD_REP_ERR_SHUTDOWN (module
    /// comment).
    pub fn shut_down(&mut self) {
        self.refusal = Some((REP_ERR_SHUTDOWN, "the server is shutting down".into()));
    }

    /// Whether [`ServerHandshake::shut_down`] was called.
    pub fn is_shut_down(&self) -> bool {
        matches!(self.refusal, Some((REP_ERR_SHUTDOWN, _)))
    }

    /// Sets whether STARTTLS is offered or required, as TLS stands now (module comment): set it before
    /// the first `feed`, and again before any later one whenever it may have changed; each option is
    /// answered under the mode set last.
    pub fn set_tls(&mut self, mode: TlsMode) {
        self.tls = mode;
    }

    /// Whether TLS has been established ([`ServerHandshake::tls_established`] called).
    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// Sets which exports this client may see, one flag per export in order (module comment).
    ///
    /// # Panics
    /// If `visible` does not have one flag per export (a programmer error).
    pub fn set_visible(&mut self, visible: Vec<bool>) {
        assert_eq!(visible.len(), self.exports.len(), "one visibility flag per export");
        self.visible = visible;
    }

    /// Sets which exports answer the `base:allocation` metadata context, one flag per export in order
    /// (none by default): for the others LIST_META_CONTEXT and SET_META_CONTEXT answer with no context
    /// ([`super::meta`]).
    ///
    /// # Panics
    /// If `flags` does not have one flag per export (a programmer error).
    pub fn set_block_status(&mut self, flags: Vec<bool>) {
        assert_eq!(flags.len(), self.exports.len(), "one block-status flag per export");
        self.block_status = flags;
    }

    /// Sets the export the empty name opens (an index into the exports), or none.
    ///
    /// # Panics
    /// If the index is not an export's (a programmer error).
    pub fn set_default_export(&mut self, export: Option<usize>) {
        assert!(export.is_none_or(|i| i < self.exports.len()), "the default export is one of the exports");
        self.default_export = export;
    }

    /// Refuses the whole connection: every option but ABORT gets NBD_REP_ERR_POLICY with `message`, and
    /// EXPORT_NAME closes with [`ProtoError::Refused`].
    pub fn refuse_all(&mut self, message: String) {
        if !self.is_shut_down() {
            self.refusal = Some((REP_ERR_POLICY, message));
        }
    }

    /// Asks `feed` to return [`ServerProgress::Opening`] before it opens an export, so the caller can
    /// refuse it ([`ServerHandshake::open`]).
    pub fn set_confirm_open(&mut self, confirm: bool) {
        self.confirm_open = confirm;
    }

    /// Offers the storage-node option ([`OPT_REIN_NODE`]; module comment). Off by default.
    pub fn set_node(&mut self, enabled: bool) {
        self.node_enabled = enabled;
    }

    /// Answers the [`ServerProgress::NodeHello`] that `feed` returned: `Ok` sends the welcome
    /// (REP_REIN_NODE) and the session is a node session from GO on; `Err((reply, message))` sends that
    /// error reply (an `NBD_REP_ERR_*`) and the message, and no node session remains. Negotiation goes on
    /// either way (`NeedMore`).
    ///
    /// # Panics
    /// If `feed` did not just return `NodeHello`, if `reply` is not an error reply, or if the welcome does
    /// not answer every tenant of the hello (programmer errors).
    pub fn node_verdict(&mut self, verdict: Result<NodeWelcome, (u32, String)>, out: &mut Vec<u8>) -> ServerProgress {
        assert_eq!(self.state, SState::AwaitNode, "node_verdict follows ServerProgress::NodeHello");
        let asked = self.node_pending.take().expect("a pending hello in AwaitNode");
        self.state = SState::Options;
        match verdict {
            Ok(welcome) => {
                assert_eq!(welcome.tenants.len(), asked, "the welcome answers every tenant of the hello");
                let mut d = Vec::new();
                welcome.encode(&mut d);
                option_reply(out, OPT_REIN_NODE, REP_REIN_NODE, &d);
                self.node = Some(welcome);
            }
            Err((reply, message)) => {
                assert!(reply & (1 << 31) != 0, "a refusal is an error reply");
                option_reply(out, OPT_REIN_NODE, reply, message.as_bytes());
                self.node = None;
            }
        }
        ServerProgress::NeedMore
    }

    /// The TLS handshake that [`ServerProgress::StartTls`] asked for succeeded: option negotiation goes on
    /// over TLS, with what was negotiated before forgotten.
    ///
    /// # Panics
    /// If `feed` did not just return `StartTls` (a programmer error).
    pub fn tls_established(&mut self) {
        assert_eq!(self.state, SState::AwaitTls, "tls_established follows ServerProgress::StartTls");
        self.state = SState::Options;
        self.tls_active = true;
        self.structured = false;
        self.node = None;
        self.meta = None;
    }

    /// Answers the [`ServerProgress::Opening`] that `feed` returned: `Ok` opens the export (its
    /// information and ACK, or EXPORT_NAME's reply, go to `out`; then `Done`); `Err(message)` refuses it
    /// with NBD_REP_ERR_POLICY and `message` (GO and INFO-like: negotiation goes on, `NeedMore`), or, for
    /// EXPORT_NAME, with [`ProtoError::Refused`] (close).
    ///
    /// # Panics
    /// If `feed` did not just return `Opening` (a programmer error).
    pub fn open(&mut self, verdict: Result<(), String>, out: &mut Vec<u8>) -> Result<ServerProgress, ProtoError> {
        assert_eq!(self.state, SState::AwaitOpen, "open follows ServerProgress::Opening");
        let pending = self.pending.take().expect("a pending open in AwaitOpen");
        self.state = SState::Options;
        match verdict {
            Ok(()) => {
                self.state = SState::Finished;
                Ok(self.send_open(&pending, out))
            }
            Err(message) if pending.option == OPT_EXPORT_NAME => {
                self.state = SState::Finished;
                Err(ProtoError::Refused(message))
            }
            Err(message) => {
                option_reply(out, pending.option, REP_ERR_POLICY, message.as_bytes());
                Ok(ServerProgress::NeedMore)
            }
        }
    }

    /// The export `name` stands for, if it exists and this client may see it.
    fn find(&self, name: &str) -> Option<usize> {
        let i =
            if name.is_empty() { self.default_export? } else { self.exports.iter().position(|e| e.name == name)? };
        self.visible[i].then_some(i)
    }

    /// Consumes complete messages from `input`; returns (bytes consumed, progress). Replies go to `out`.
    /// It stops after [`MAX_REPLY_BATCH`] bytes of replies with `NeedMore`, complete options possibly left
    /// in `input`: while it consumes something and input remains, write `out` and call it again.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(usize, ServerProgress), ProtoError> {
        let mut used = 0;
        let start = out.len();
        loop {
            if out.len() - start >= MAX_REPLY_BATCH {
                return Ok((used, ServerProgress::NeedMore));
            }
            let rest = &input[used..];
            match self.state {
                SState::Finished => return Err(ProtoError::Malformed("data after the handshake finished")),
                SState::AwaitTls => return Err(ProtoError::Malformed("data after NBD_OPT_STARTTLS before TLS")),
                SState::AwaitOpen => return Err(ProtoError::Malformed("data before the export was opened")),
                SState::AwaitNode => return Err(ProtoError::Malformed("data before the node hello was answered")),
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
                    let progress = self.gate(option, data, out)?;
                    if progress != ServerProgress::NeedMore {
                        return Ok((used, progress));
                    }
                }
            }
        }
    }

    /// The connection-wide rules (refusal or shutdown, TLS required) before an option's own handling.
    fn gate(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> Result<ServerProgress, ProtoError> {
        if option == OPT_ABORT {
            option_reply(out, option, REP_ACK, &[]);
            self.state = SState::Finished;
            return Ok(ServerProgress::Aborted);
        }
        if let Some((reply, message)) = &self.refusal {
            if option == OPT_EXPORT_NAME {
                self.state = SState::Finished;
                return Err(ProtoError::Refused(message.clone()));
            }
            option_reply(out, option, *reply, message.as_bytes());
            return Ok(ServerProgress::NeedMore);
        }
        if option == OPT_STARTTLS {
            return Ok(self.starttls(data, out));
        }
        if self.tls == TlsMode::Require && !self.tls_active {
            if option == OPT_EXPORT_NAME {
                self.state = SState::Finished;
                return Err(ProtoError::Refused(
                    "TLS is required (NBD_OPT_STARTTLS) before NBD_OPT_EXPORT_NAME".into(),
                ));
            }
            option_reply(out, option, REP_ERR_TLS_REQD, b"TLS is required: use NBD_OPT_STARTTLS first");
            return Ok(ServerProgress::NeedMore);
        }
        self.option(option, data, out)
    }

    fn starttls(&mut self, data: &[u8], out: &mut Vec<u8>) -> ServerProgress {
        // Established first: TLS turned off since then still leaves this session under TLS.
        if self.tls_active {
            option_reply(out, OPT_STARTTLS, REP_ERR_INVALID, b"TLS is already established");
        } else if self.tls == TlsMode::Off {
            option_reply(out, OPT_STARTTLS, REP_ERR_POLICY, b"TLS is not offered");
        } else if !data.is_empty() {
            option_reply(out, OPT_STARTTLS, REP_ERR_INVALID, b"NBD_OPT_STARTTLS takes no data");
        } else {
            option_reply(out, OPT_STARTTLS, REP_ACK, &[]);
            self.state = SState::AwaitTls;
            return ServerProgress::StartTls;
        }
        ServerProgress::NeedMore
    }

    /// Opens `export` for a GO or EXPORT_NAME now, or (with `confirm_open`) asks the caller first.
    fn opening(&mut self, pending: PendingOpen, out: &mut Vec<u8>) -> ServerProgress {
        if self.confirm_open {
            let export = pending.export;
            self.pending = Some(pending);
            self.state = SState::AwaitOpen;
            return ServerProgress::Opening(export);
        }
        self.state = SState::Finished;
        self.send_open(&pending, out)
    }

    /// Writes the replies that open an export and returns `Done`.
    fn send_open(&self, pending: &PendingOpen, out: &mut Vec<u8>) -> ServerProgress {
        let e = &self.exports[pending.export];
        if pending.option == OPT_EXPORT_NAME {
            out.extend_from_slice(&e.size.to_be_bytes());
            out.extend_from_slice(&e.flags_for(self.structured).to_be_bytes());
            if !self.no_zeroes {
                out.extend_from_slice(&[0u8; 124]);
            }
        } else {
            self.send_info(OPT_GO, pending.export, &pending.wanted, out);
        }
        ServerProgress::Done(Negotiated {
            export: pending.export,
            structured: self.structured,
            node: self.node.clone(),
            // Only for the export the contexts were selected for (module comment of `meta`), or, on a
            // storage-node session of v4 or later, implied for an export that answers it (`node`).
            base_allocation: (self.structured && self.meta == Some(pending.export))
                || (self.block_status[pending.export]
                    && self.node.as_ref().is_some_and(|w| w.version >= NODE_VERSION_BLOCK_STATUS)),
        })
    }

    /// The INFO replies for `export` (NBD_INFO_EXPORT and those in `wanted` that the server knows), then
    /// ACK. NBD_INFO_BLOCK_SIZE also unasked when the largest payload is below the protocol's default of
    /// 32 MiB or the export's minimum block is above 1: the spec has a server with other constraints
    /// advertise them (it may, asked or not), and a client that did not ask would send 32 MiB requests,
    /// or unaligned ones, and have them refused.
    fn send_info(&self, option: u32, export: usize, wanted: &[u16], out: &mut Vec<u8>) {
        let e = &self.exports[export];
        let other = self.max_payload < DEFAULT_MAX_PAYLOAD || e.min_block > 1;
        let unasked = (other && !wanted.contains(&INFO_BLOCK_SIZE)).then_some(INFO_BLOCK_SIZE);
        let mut d = Vec::with_capacity(12);
        d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        d.extend_from_slice(&e.size.to_be_bytes());
        d.extend_from_slice(&e.flags_for(self.structured).to_be_bytes());
        option_reply(out, option, REP_INFO, &d);
        for &w in wanted.iter().chain(&unasked) {
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
                    // Minimum the export's, preferred 4 KiB (or the minimum, if larger) or, below it, the
                    // largest power of two within the maximum (the spec: a power of two), maximum the
                    // payload limit.
                    let preferred: u32 = if self.max_payload >= 4096 { 4096 } else { 1 << self.max_payload.ilog2() };
                    let (min, max) = (e.min_block.max(1), self.max_payload);
                    let preferred = preferred.max(min).min(max);
                    d.extend_from_slice(&min.to_be_bytes());
                    d.extend_from_slice(&preferred.to_be_bytes());
                    d.extend_from_slice(&self.max_payload.to_be_bytes());
                }
                _ => continue, // unknown information types are ignored (spec)
            }
            option_reply(out, option, REP_INFO, &d);
        }
        option_reply(out, option, REP_ACK, &[]);
    }

    fn option(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> Result<ServerProgress, ProtoError> {
        match option {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(data);
                match self.find(&name) {
                    Some(export) => Ok(self.opening(PendingOpen { option, export, wanted: Vec::new() }, out)),
                    // The spec: on an unknown EXPORT_NAME the server must close the connection. A hidden
                    // export is answered the same way.
                    None => Err(ProtoError::Malformed("unknown export in NBD_OPT_EXPORT_NAME")),
                }
            }
            OPT_LIST => {
                if !data.is_empty() {
                    option_reply(out, option, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data");
                    return Ok(ServerProgress::NeedMore);
                }
                for (e, _) in self.exports.iter().zip(&self.visible).filter(|(_, &v)| v) {
                    let mut d = Vec::with_capacity(4 + e.name.len());
                    d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                    d.extend_from_slice(e.name.as_bytes());
                    d.extend_from_slice(e.description.as_bytes());
                    option_reply(out, option, REP_SERVER, &d);
                }
                option_reply(out, option, REP_ACK, &[]);
                Ok(ServerProgress::NeedMore)
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    option_reply(out, option, REP_ERR_INVALID, b"NBD_OPT_STRUCTURED_REPLY takes no data");
                } else if self.node.is_some() {
                    option_reply(
                        out,
                        option,
                        REP_ERR_INVALID,
                        b"structured replies and the storage-node protocol exclude each other",
                    );
                } else {
                    self.structured = true;
                    option_reply(out, option, REP_ACK, &[]);
                }
                Ok(ServerProgress::NeedMore)
            }
            OPT_INFO | OPT_GO => {
                // u32 name length, name, u16 number of info requests, u16 each. Neither an INFO nor a GO
                // that fails changes the contexts selected (module comment of `meta`).
                if data.len() < 6 {
                    option_reply(out, option, REP_ERR_INVALID, b"short NBD_OPT_INFO/GO");
                    return Ok(ServerProgress::NeedMore);
                }
                let nlen = u32_at(data, 0) as usize;
                if nlen > MAX_NAME_LEN || data.len() < 4 + nlen + 2 {
                    option_reply(out, option, REP_ERR_INVALID, b"bad name length");
                    return Ok(ServerProgress::NeedMore);
                }
                let name = String::from_utf8_lossy(&data[4..4 + nlen]).into_owned();
                let nreq = u16_at(data, 4 + nlen) as usize;
                if data.len() != 4 + nlen + 2 + 2 * nreq {
                    option_reply(out, option, REP_ERR_INVALID, b"bad information request count");
                    return Ok(ServerProgress::NeedMore);
                }
                let wanted: Vec<u16> = (0..nreq).map(|k| u16_at(data, 4 + nlen + 2 + 2 * k)).collect();
                let Some(export) = self.find(&name) else {
                    option_reply(out, option, REP_ERR_UNKNOWN, format!("no export named {name:?}").as_bytes());
                    return Ok(ServerProgress::NeedMore);
                };
                if option == OPT_GO {
                    return Ok(self.opening(PendingOpen { option, export, wanted }, out));
                }
                self.send_info(option, export, &wanted, out);
                Ok(ServerProgress::NeedMore)
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => Ok(self.meta_context(option, data, out)),
            OPT_REIN_NODE if self.node_enabled => {
                self.node_hellos = self.node_hellos.saturating_add(1);
                if self.node_hellos > MAX_NODE_HELLOS {
                    // Not asked of the caller; the session agreed so far stands.
                    let msg = format!("at most {MAX_NODE_HELLOS} storage-node hellos on one connection");
                    option_reply(out, option, REP_ERR_POLICY, msg.as_bytes());
                    return Ok(ServerProgress::NeedMore);
                }
                // A second hello replaces the first: whatever comes of it, the first is gone.
                self.node = None;
                if self.structured {
                    let msg = b"the storage-node protocol and structured replies exclude each other";
                    option_reply(out, option, REP_ERR_INVALID, msg);
                    return Ok(ServerProgress::NeedMore);
                }
                match NodeHello::decode(data) {
                    Ok(hello) => {
                        self.node_pending = Some(hello.tenants.len());
                        self.state = SState::AwaitNode;
                        Ok(ServerProgress::NodeHello(hello))
                    }
                    Err(e) => {
                        option_reply(out, option, REP_ERR_INVALID, format!("bad node hello: {e}").as_bytes());
                        Ok(ServerProgress::NeedMore)
                    }
                }
            }
            _ => {
                option_reply(out, option, REP_ERR_UNSUP, b"option not supported");
                Ok(ServerProgress::NeedMore)
            }
        }
    }
}

impl ServerHandshake {
    /// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT (module comment of [`super::meta`]).
    fn meta_context(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> ServerProgress {
        use super::meta::{MetaOption, BASE_ALLOCATION, BASE_ALLOCATION_ID};
        let set = option == OPT_SET_META_CONTEXT;
        if set {
            // A SET replaces the selection, whatever becomes of it.
            self.meta = None;
        }
        if !self.structured {
            option_reply(out, option, REP_ERR_INVALID, b"metadata contexts need structured replies first");
            return ServerProgress::NeedMore;
        }
        let request = match MetaOption::decode(data) {
            Ok(r) => r,
            Err(fault) => {
                let (reply, message) = fault.reply();
                option_reply(out, option, reply, message.as_bytes());
                return ServerProgress::NeedMore;
            }
        };
        let Some(export) = self.find(&request.export) else {
            let name = &request.export;
            option_reply(out, option, REP_ERR_UNKNOWN, format!("no export named {name:?}").as_bytes());
            return ServerProgress::NeedMore;
        };
        if self.block_status[export] && request.selects_base_allocation(!set) {
            let mut d = Vec::with_capacity(4 + BASE_ALLOCATION.len());
            // A LIST's context id is reserved (the spec: zero); a SET's is the one BLOCK_STATUS uses.
            let id = if set { BASE_ALLOCATION_ID } else { 0 };
            d.extend_from_slice(&id.to_be_bytes());
            d.extend_from_slice(BASE_ALLOCATION.as_bytes());
            option_reply(out, option, REP_META_CONTEXT, &d);
            if set {
                self.meta = Some(export);
            }
        }
        option_reply(out, option, REP_ACK, &[]);
        ServerProgress::NeedMore
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
#[derive(Debug, Clone, PartialEq)]
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
    /// With [`ClientHandshake::with_node`]: the export is open on a storage-node session.
    NodeReady {
        /// Export size in bytes.
        size: u64,
        /// Transmission flags (`TFLAG_*`).
        flags: u16,
        /// What the node answered to the hello.
        welcome: NodeWelcome,
    },
    /// With [`ClientHandshake::with_node`]: the server refused the storage-node option with this error
    /// reply and message (NBD_REP_ERR_UNSUP: a plain NBD server). GO is already in `out`: feed on for a
    /// plain session ([`ClientProgress::Ready`]), or close.
    NodeRefused(u32, String),
    /// With [`ClientHandshake::require_tls`]: the server acknowledged NBD_OPT_STARTTLS. Write `out`, run
    /// the TLS handshake as the client on the socket, call [`ClientHandshake::tls_established`], and go
    /// on feeding what arrives over TLS.
    StartTls,
    /// With [`ClientHandshake::probe`]: what the server said of each export, in the probe's order;
    /// NBD_OPT_ABORT is in `out`. Write it and close: no export is open.
    Info(Vec<Probed>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CState {
    Greeting,
    StartTlsReply,
    AwaitTls,
    TlsUp,
    NodeReply,
    StructuredReply,
    /// NBD_OPT_SET_META_CONTEXT sent ([`ClientHandshake::with_meta_context`]).
    MetaReplies,
    GoReplies,
    Ready,
    /// [`ClientHandshake::probe`]'s answers came and NBD_OPT_ABORT went.
    Probed,
}

/// A server's size constraints (NBD_INFO_BLOCK_SIZE): what a client that asked for them, as
/// [`ClientHandshake`] does, must abide by (the spec's "Size constraints").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSize {
    /// Offsets and lengths are multiples of it (a power of two, at most 64 KiB).
    pub min: u32,
    /// Aligned requests of at least this size are efficient (a power of two).
    pub preferred: u32,
    /// The largest READ or WRITE payload (0xffffffff: no fixed limit). TRIM and WRITE_ZEROES, which carry
    /// none, may ask more.
    pub max: u32,
}

impl BlockSize {
    /// What holds when the server advertised nothing: minimum 1, preferred 4 KiB, and the largest payload
    /// every server takes ([`DEFAULT_MAX_PAYLOAD`], 32 MiB: the spec's interoperable maximum).
    pub const DEFAULT: BlockSize = BlockSize { min: 1, preferred: 4096, max: DEFAULT_MAX_PAYLOAD };

    /// Decodes an NBD_INFO_BLOCK_SIZE reply's data (its type included); `None` if it is malformed: not 14
    /// bytes, a minimum block size not a power of two to 64 KiB, or a maximum payload below it.
    fn decode(data: &[u8]) -> Option<BlockSize> {
        if data.len() != 14 {
            return None;
        }
        let b = BlockSize { min: u32_at(data, 2), preferred: u32_at(data, 6), max: u32_at(data, 10) };
        (b.min.is_power_of_two() && b.min <= 1 << 16 && b.max >= b.min).then_some(b)
    }

    /// The largest READ or WRITE a client sends: the maximum payload, down to a multiple of the minimum
    /// block size (the maximum need not be a power of two).
    pub fn max_aligned(&self) -> u32 {
        self.max - self.max % self.min
    }

    /// Whether `request` keeps to these constraints, as a client that asked for them must: its offset
    /// and length multiples of the minimum block size (FLUSH and DISC, which address nothing, aside) and
    /// a READ or WRITE no longer than the maximum payload. The error says what does not.
    pub fn check(&self, request: &RequestHeader) -> Result<(), BlockSizeError> {
        let (command, offset, length, min) = (request.command, request.offset, request.length, self.min);
        let addresses = !matches!(command, Command::Flush | Command::Disc);
        if addresses && (offset % u64::from(min) != 0 || length % min != 0) {
            return Err(BlockSizeError::Unaligned { command, length, offset, min });
        }
        if matches!(command, Command::Read | Command::Write) && length > self.max {
            return Err(BlockSizeError::TooLong { command, length, max: self.max });
        }
        Ok(())
    }
}

/// Why a request breaks the block size constraints a server advertised ([`BlockSize::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockSizeError {
    /// Its offset or length is not a multiple of the minimum block size.
    #[error("a {command} of {length} bytes at {offset} is not aligned to the minimum block size {min}")]
    Unaligned {
        /// The request's command.
        command: Command,
        /// Its length (bytes).
        length: u32,
        /// Its offset (bytes).
        offset: u64,
        /// The minimum block size (bytes).
        min: u32,
    },
    /// A READ or WRITE longer than the maximum payload.
    #[error("a {command} of {length} bytes is longer than the largest the server takes ({max})")]
    TooLong {
        /// The request's command.
        command: Command,
        /// Its length (bytes).
        length: u32,
        /// The maximum payload (bytes).
        max: u32,
    },
}

/// Exports one [`ClientHandshake::probe`] asks about that every server known takes on one connection
/// (module comment): nbdkit ends a handshake after 32 options (its `MAX_NR_OPTIONS`, which counts
/// NBD_OPT_STARTTLS and NBD_OPT_ABORT; the spec lets a server cut a client it takes for a denial of
/// service), so 32 less those two. qemu's server (qemu-nbd, qemu-storage-daemon) counts none: it ends a
/// handshake not done within 10 s instead (docs/gateway.md, "qemu as a node").
pub const PROBE_EXPORTS_ANY_SERVER: usize = 30;

/// What a [`ClientHandshake::probe`] learnt of one export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    /// The server's information on it.
    Info {
        /// Export size in bytes.
        size: u64,
        /// Transmission flags (`TFLAG_*`) as the server would give a session opened now.
        flags: u16,
    },
    /// The server answered NBD_OPT_INFO for it with this error reply (`NBD_REP_ERR_*`) and message.
    Refused {
        /// The error reply.
        reply: u32,
        /// Its message.
        message: String,
    },
}

/// A probe's exports and the answers so far (in the exports' order).
#[derive(Debug, Clone)]
struct Probing {
    exports: Vec<String>,
    answers: Vec<Probed>,
}

/// The client side of the fixed newstyle handshake: optional NBD_OPT_STRUCTURED_REPLY, then NBD_OPT_GO.
/// It asks for NBD_INFO_BLOCK_SIZE: [`ClientHandshake::block_size`] says what the server advertised (a
/// malformed NBD_INFO_BLOCK_SIZE counts as none).
#[derive(Debug, Clone)]
pub struct ClientHandshake {
    export: String,
    want_structured: bool,
    structured: bool,
    state: CState,
    size: Option<u64>,
    flags: u16,
    /// The server's NBD_INFO_BLOCK_SIZE, if it sent one.
    block: Option<BlockSize>,
    node_hello: Option<NodeHello>,
    welcome: Option<NodeWelcome>,
    tls: bool,
    /// [`ClientHandshake::probe`]: NBD_OPT_INFO instead of GO for each export, then NBD_OPT_ABORT.
    probe: Option<Probing>,
    /// [`ClientHandshake::with_meta_context`]: the context asked for, and the id the server gave it.
    meta_query: Option<String>,
    meta_id: Option<u32>,
}

impl ClientHandshake {
    /// A client for `export` on a storage-node session: it sends `hello` ([`OPT_REIN_NODE`]) before GO,
    /// and no structured replies. A hello a node would refuse as malformed is an error here.
    pub fn with_node(export: &str, hello: NodeHello) -> Result<ClientHandshake, NodeError> {
        hello.check()?;
        let mut hs = ClientHandshake::new(export, false);
        hs.node_hello = Some(hello);
        Ok(hs)
    }

    /// What the node answered, once it did.
    pub fn node_welcome(&self) -> Option<&NodeWelcome> {
        self.welcome.as_ref()
    }

    /// The server's size constraints once the handshake is done: what it advertised, or
    /// [`BlockSize::DEFAULT`] if it advertised none.
    pub fn block_size(&self) -> BlockSize {
        self.block.unwrap_or(BlockSize::DEFAULT)
    }

    /// A client for `export`, asking for structured replies if `want_structured`.
    pub fn new(export: &str, want_structured: bool) -> ClientHandshake {
        ClientHandshake {
            export: export.to_string(),
            want_structured,
            structured: false,
            state: CState::Greeting,
            size: None,
            flags: 0,
            block: None,
            node_hello: None,
            welcome: None,
            tls: false,
            probe: None,
            meta_query: None,
            meta_id: None,
        }
    }

    /// Asks for the metadata context `query` (`base:allocation`) with NBD_OPT_SET_META_CONTEXT for the
    /// export, after structured replies and before GO (module comment); only if structured replies are
    /// wanted (the option needs them) and the server agreed to them. Set it before the first `feed`.
    /// Longer than [`MAX_NAME_LEN`], the query is not sent.
    pub fn with_meta_context(mut self, query: &str) -> ClientHandshake {
        self.meta_query = (query.len() <= MAX_NAME_LEN).then(|| query.to_string());
        self
    }

    /// The id the server gave the context of [`ClientHandshake::with_meta_context`] (its
    /// NBD_REP_META_CONTEXT), once it did; `None` if it selected none (or refused the option, or
    /// structured replies).
    pub fn meta_context(&self) -> Option<u32> {
        self.meta_id
    }

    /// A client that only reads each of `exports`' information (size and transmission flags) with
    /// NBD_OPT_INFO, one after another, then aborts the negotiation (module comment):
    /// [`ClientProgress::Info`], one answer per export in their order. Plain NBD (no node hello, no
    /// structured replies); [`ClientHandshake::require_tls`] applies as to any client. How many exports
    /// one probe may ask about is the caller's to bound by what the server takes
    /// ([`PROBE_EXPORTS_ANY_SERVER`]).
    pub fn probe<S: AsRef<str>>(exports: &[S]) -> ClientHandshake {
        let exports: Vec<String> = exports.iter().map(|e| e.as_ref().to_string()).collect();
        let first = exports.first().cloned().unwrap_or_default();
        let probe = Some(Probing { answers: Vec::with_capacity(exports.len()), exports });
        ClientHandshake { probe, ..ClientHandshake::new(&first, false) }
    }

    /// A probe's answers so far, in its exports' order (all of them once it returned
    /// [`ClientProgress::Info`]; those that came before a [`ProtoError`] otherwise).
    pub fn probed(&self) -> &[Probed] {
        self.probe.as_ref().map_or(&[], |p| &p.answers)
    }

    /// The option that asks for the export: GO, or INFO for a probe.
    fn export_option(&self) -> u32 {
        if self.probe.is_some() {
            OPT_INFO
        } else {
            OPT_GO
        }
    }

    /// A probe's export had its final reply (`answer`): asks for the next export's information, or, after
    /// the last, sends NBD_OPT_ABORT. NBD_REP_ERR_SHUTDOWN answers the exports not yet asked too (the spec
    /// has the client leave).
    fn probed_one(&mut self, answer: Probed, out: &mut Vec<u8>) {
        let p = self.probe.as_mut().expect("a probe");
        let shutdown = matches!(&answer, Probed::Refused { reply: REP_ERR_SHUTDOWN, .. });
        p.answers.push(answer);
        if shutdown {
            while p.answers.len() < p.exports.len() {
                let message = "not asked: the server is shutting down (NBD_REP_ERR_SHUTDOWN)".to_string();
                p.answers.push(Probed::Refused { reply: REP_ERR_SHUTDOWN, message });
            }
        }
        // What the server said of this export is not the next one's.
        (self.size, self.flags, self.block) = (None, 0, None);
        match p.exports.get(p.answers.len()) {
            Some(next) => {
                self.export = next.clone();
                self.send_go(out);
            }
            None => {
                option_request(out, OPT_ABORT, &[]);
                self.state = CState::Probed;
            }
        }
    }

    /// Asks for TLS (NBD_OPT_STARTTLS) before any other option, and refuses to go on without it (module
    /// comment). Set it before the first `feed`.
    pub fn require_tls(mut self) -> ClientHandshake {
        self.tls = true;
        self
    }

    /// The caller's TLS handshake succeeded after [`ClientProgress::StartTls`]: the next `feed` (with
    /// what arrives over TLS, or nothing) sends the options that follow.
    pub fn tls_established(&mut self) -> Result<(), ProtoError> {
        if self.state != CState::AwaitTls {
            return Err(ProtoError::Malformed("tls_established without an acknowledged NBD_OPT_STARTTLS"));
        }
        self.state = CState::TlsUp;
        Ok(())
    }

    /// The first options after the greeting (and after TLS, if asked): the node hello, structured replies
    /// or GO.
    fn send_options(&mut self, out: &mut Vec<u8>) {
        if let Some(hello) = &self.node_hello {
            let mut d = Vec::with_capacity(hello.encoded_len());
            hello.encode(&mut d);
            option_request(out, OPT_REIN_NODE, &d);
            self.state = CState::NodeReply;
        } else if self.probe.as_ref().is_some_and(|p| p.exports.is_empty()) {
            // Nothing to ask.
            option_request(out, OPT_ABORT, &[]);
            self.state = CState::Probed;
        } else if self.want_structured {
            option_request(out, OPT_STRUCTURED_REPLY, &[]);
            self.state = CState::StructuredReply;
        } else {
            self.send_go(out);
            self.state = CState::GoReplies;
        }
    }

    fn send_go(&self, out: &mut Vec<u8>) {
        let name = self.export.as_bytes();
        let mut d = Vec::with_capacity(8 + name.len());
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name);
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        option_request(out, self.export_option(), &d);
    }

    /// Consumes complete messages from `input`; returns (bytes consumed, progress). Requests go to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(usize, ClientProgress), ProtoError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.state {
                CState::Ready => {
                    let size = self.size.unwrap_or(0);
                    let progress = match &self.welcome {
                        Some(welcome) => {
                            ClientProgress::NodeReady { size, flags: self.flags, welcome: welcome.clone() }
                        }
                        None => ClientProgress::Ready { size, flags: self.flags, structured: self.structured },
                    };
                    return Ok((used, progress));
                }
                CState::Probed => {
                    let answers = self.probe.as_ref().map_or_else(Vec::new, |p| p.answers.clone());
                    return Ok((used, ClientProgress::Info(answers)));
                }
                CState::NodeReply => {
                    let Some((OptionReply { option, reply, data }, n)) = decode_option_reply(rest)? else {
                        return Ok((used, ClientProgress::NeedMore));
                    };
                    used += n;
                    if option != OPT_REIN_NODE {
                        return Err(ProtoError::Malformed("a reply to another option than NBD_OPT_REIN_NODE"));
                    }
                    self.send_go(out);
                    self.state = CState::GoReplies;
                    if reply != REP_REIN_NODE {
                        if reply & (1 << 31) == 0 {
                            return Err(ProtoError::Malformed("a non-error reply to NBD_OPT_REIN_NODE"));
                        }
                        let message = String::from_utf8_lossy(data).into_owned();
                        return Ok((used, ClientProgress::NodeRefused(reply, message)));
                    }
                    let hello = self.node_hello.as_ref().expect("a hello was sent");
                    let welcome = NodeWelcome::decode(data)?;
                    if welcome.version > hello.version {
                        return Err(NodeError::Version(welcome.version).into());
                    }
                    if welcome.tenants.len() != hello.tenants.len() {
                        let count = welcome.tenants.len();
                        return Err(NodeError::TenantCount { count, max: hello.tenants.len() }.into());
                    }
                    self.welcome = Some(welcome);
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
                    if self.tls {
                        option_request(out, OPT_STARTTLS, &[]);
                        self.state = CState::StartTlsReply;
                    } else {
                        self.send_options(out);
                    }
                }
                CState::StartTlsReply => {
                    let Some((OptionReply { option, reply, data }, n)) = decode_option_reply(rest)? else {
                        return Ok((used, ClientProgress::NeedMore));
                    };
                    used += n;
                    if option != OPT_STARTTLS {
                        return Err(ProtoError::Malformed("a reply to another option than NBD_OPT_STARTTLS"));
                    }
                    if reply != REP_ACK {
                        return Err(refused(option, reply, data));
                    }
                    if !data.is_empty() {
                        return Err(ProtoError::Malformed("NBD_OPT_STARTTLS acknowledged with data"));
                    }
                    if input.len() > used {
                        return Err(ProtoError::Malformed("data after the NBD_OPT_STARTTLS reply before TLS"));
                    }
                    self.state = CState::AwaitTls;
                    return Ok((used, ClientProgress::StartTls));
                }
                CState::TlsUp => self.send_options(out),
                CState::AwaitTls => {
                    if rest.is_empty() {
                        return Ok((used, ClientProgress::StartTls));
                    }
                    return Err(ProtoError::Malformed("data after the NBD_OPT_STARTTLS reply before TLS"));
                }
                CState::MetaReplies => {
                    let Some((OptionReply { option, reply, data }, n)) = decode_option_reply(rest)? else {
                        return Ok((used, ClientProgress::NeedMore));
                    };
                    used += n;
                    if option != OPT_SET_META_CONTEXT {
                        return Err(ProtoError::Malformed("a reply to another option than NBD_OPT_SET_META_CONTEXT"));
                    }
                    match reply {
                        REP_META_CONTEXT => {
                            if data.len() < 4 {
                                return Err(ProtoError::Malformed("NBD_REP_META_CONTEXT shorter than its context id"));
                            }
                            // Only the context asked for is kept (one id: what the replies hold is bounded).
                            if self.meta_query.as_deref().map(str::as_bytes) == Some(&data[4..]) {
                                if self.meta_id.is_some() {
                                    return Err(ProtoError::Malformed("a second NBD_REP_META_CONTEXT for the context"));
                                }
                                self.meta_id = Some(u32_at(data, 0));
                            }
                        }
                        // The end of the list; or a refusal, which selects nothing (the export opens without
                        // a context all the same).
                        r if r == REP_ACK || r & (1 << 31) != 0 => {
                            if r != REP_ACK {
                                self.meta_id = None;
                            }
                            self.send_go(out);
                            self.state = CState::GoReplies;
                        }
                        _ => return Err(ProtoError::Malformed("an unknown reply to NBD_OPT_SET_META_CONTEXT")),
                    }
                }
                CState::StructuredReply | CState::GoReplies => {
                    let Some((OptionReply { option: opt, reply, data }, n)) = decode_option_reply(rest)? else {
                        return Ok((used, ClientProgress::NeedMore));
                    };
                    used += n;
                    // Replies come in the order of the options (the client sends one at a time), so a reply
                    // naming another option is a server out of step; taken, its NBD_INFO_EXPORT or ACK
                    // would stand for the export's.
                    let (want, what) = match self.state {
                        CState::StructuredReply => {
                            (OPT_STRUCTURED_REPLY, "a reply to another option than NBD_OPT_STRUCTURED_REPLY")
                        }
                        _ if self.probe.is_some() => (OPT_INFO, "a reply to another option than NBD_OPT_INFO"),
                        _ => (OPT_GO, "a reply to another option than NBD_OPT_GO"),
                    };
                    if opt != want {
                        return Err(ProtoError::Malformed(what));
                    }
                    if self.state == CState::StructuredReply {
                        self.structured = reply == REP_ACK;
                        match &self.meta_query {
                            Some(query) if self.structured => {
                                let queries = vec![query.as_bytes()];
                                let mut d = Vec::new();
                                MetaOption { export: self.export.clone(), queries }.encode(&mut d);
                                option_request(out, OPT_SET_META_CONTEXT, &d);
                                self.state = CState::MetaReplies;
                            }
                            _ => {
                                self.send_go(out);
                                self.state = CState::GoReplies;
                            }
                        }
                        continue;
                    }
                    match reply {
                        REP_INFO if data.len() >= 12 && u16_at(data, 0) == INFO_EXPORT => {
                            self.size = Some(u64_at(data, 2));
                            self.flags = u16_at(data, 10);
                        }
                        // A malformed one is taken as none (the protocol's defaults, which such a server took
                        // before this client read the information), not as a refusal to talk.
                        REP_INFO if data.len() >= 2 && u16_at(data, 0) == INFO_BLOCK_SIZE => {
                            self.block = BlockSize::decode(data);
                        }
                        REP_INFO => {}
                        REP_ACK => {
                            let Some(size) = self.size else {
                                return Err(ProtoError::Malformed(if self.probe.is_some() {
                                    "NBD_OPT_INFO acknowledged without NBD_INFO_EXPORT"
                                } else {
                                    "NBD_OPT_GO acknowledged without NBD_INFO_EXPORT"
                                }));
                            };
                            if self.probe.is_some() {
                                self.probed_one(Probed::Info { size, flags: self.flags }, out);
                                continue;
                            }
                            self.state = CState::Ready;
                        }
                        // A probe: the error is this export's, and the next is asked (module comment).
                        r if self.probe.is_some() && r & (1 << 31) != 0 => {
                            let message = String::from_utf8_lossy(data).into_owned();
                            self.probed_one(Probed::Refused { reply: r, message }, out);
                        }
                        r => {
                            return Err(refused(opt, r, data));
                        }
                    }
                }
            }
        }
    }
}

/// The client's error for a server's refusal of `option` with the error `reply` and its message `data`.
fn refused(option: u32, reply: u32, data: &[u8]) -> ProtoError {
    ProtoError::OptionRefused { option, reply, message: String::from_utf8_lossy(data).into_owned() }
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
