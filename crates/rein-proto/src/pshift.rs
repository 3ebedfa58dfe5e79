//! pShift's messages between the servers and the controller (pshift.txt §III-D), as frames over a byte
//! stream (TCP), encode/decode without IO.
//!
//! A server connects to the controller and says [`Message::Hello`] with its name; the controller answers
//! [`Message::Welcome`] (the server's index and the bucket names in the controller's order, which the
//! other messages' bucket numbers index) or [`Message::Refuse`] and closes. Then, at every redistribution
//! boundary and for every early round, the controller sends [`Message::ReportRequest`]; the server answers
//! [`Message::Report`] (rein-core's [`ServerReport`]); the controller's answer is [`Message::Tokens`]
//! (rein-core's [`TokenMessage`]). A server sends [`Message::Stray`] when a bucket arrives that the latest
//! tokens did not plan for (rein-core's early rounds). A server also sends [`Message::Ping`] now and
//! then; the controller's [`Message::Pong`] carries its clock and its next boundary, from which the server
//! learns the boundary on its own clock (the exchange with the shortest round trip bounds the error by
//! half of it) and cuts its next report there rather than when the request arrives.
//!
//! # Frame (little endian)
//! ```text
//! offset size field
//!      0    4 magic    "RPSH"
//!      4    2 version  2 (1 had no ping and pong)
//!      6    1 type     1 hello, 2 welcome, 3 refuse, 4 report request, 5 report, 6 stray, 7 tokens,
//!                      8 ping, 9 pong
//!      7    1 reserved 0
//!      8    4 length   body bytes, at most MAX_BODY (a welcome: MAX_WELCOME_BODY)
//!     12    . body     per type, below
//! ```
//! Bodies (`str` is a u16 length and that many UTF-8 bytes, at most [`MAX_NAME_LEN`], not empty):
//! - hello: `name: str`;
//! - welcome: `server: u32`, `flags: u32` (bit 0: note stray arrivals; bit 1: a limit byte follows each
//!   name; others 0), `count: u32`, then `count` x `bucket: str` (at most [`MAX_BUCKETS`]), each followed,
//!   with bit 1, by `limited: u8` (1: the controller limits the bucket, so a server leaves it no L-tokens
//!   when an answer does not list it; 0: not). Without bit 1 no bucket is limited (a server then knows a
//!   limit only from its own tenant's spec, which let a bucket an answer did not list be served without
//!   bound until the next answer);
//! - refuse: `reason: str` (up to 4,096 bytes);
//! - report request: `round: u64`, `early: u32`;
//! - report: `server: u32`, `round: u64`, `early: u32`, `elapsed_ns, completed, busy_ns: u64`, `count: u32`,
//!   then `count` x (`bucket: u32`, `arrivals, dispatched, queued, idle_ns, in_flight, held: u64`);
//! - stray: `server: u32`, `bucket: u32`, `heard_round: u64`, `heard_early: u32`;
//! - tokens: `server: u32`, `round: u64`, `early: u32`, `count: u32`, then `count` x (`bucket: u32`,
//!   `r: u64`, `l: u64`), with `l` = `u64::MAX` for unlimited;
//! - ping: `t0: u64` (the server's clock, ns);
//! - pong: `t0: u64` (the ping's), `t1: u64` (the controller's clock when it answered, ns),
//!   `next_round: u64`, `next_ns: u64` (the next boundary's number and time on the controller's clock;
//!   `next_ns` 0: no schedule yet), `interval_ns: u64` (the time between boundaries).
//!
//! # What decoding guarantees
//! A frame is taken only whole: its body length is checked against [`MAX_BODY`] ([`MAX_WELCOME_BODY`] for
//! a welcome) from the header, before
//! any byte of the body is buffered, so a peer cannot make the decoder hold more than one frame's bound.
//! Every body is checked to be exactly as long as its fields (no trailing bytes), counts against the
//! body's length before anything is allocated, token and counter values against rein-core's bounds (a
//! token count at most [`MAX_TOKENS`], bucket numbers below [`MAX_BUCKETS`], the bucket lines of a report
//! and of a token message strictly increasing: one line per bucket). A bad frame is an error naming the field; the stream is then out of
//! step and the connection should close. Decoding never panics (a proptest and a fuzz target feed it
//! random bytes); what decodes re-encodes to the same bytes.

use rein_core::pshift::{
    BucketReport, ServerReport, StrayArrival, TokenMessage, Tokens, MAX_BUCKETS, MAX_NAME_LEN, MAX_TOKENS,
};

/// The frame's magic, "RPSH" in little-endian byte order.
pub const MAGIC: u32 = u32::from_le_bytes(*b"RPSH");
/// The format this build writes and reads.
pub const VERSION: u16 = 2;
/// Bytes in a frame header.
pub const HEADER_BYTES: usize = 12;
/// The largest body accepted (64 MiB: a report or a token message for about a million buckets).
pub const MAX_BODY: usize = 64 << 20;
/// The largest welcome body accepted: 16 MiB. What a welcome can need: it lists the controller's buckets,
/// 12 bytes and then 3 bytes and the name per bucket (the name's length, the name, its limit flag); the
/// count alone (at most [`MAX_BUCKETS`] names of up to [`MAX_NAME_LEN`] bytes, 259 MB) does not bound it
/// below [`MAX_BODY`], but the controller's configuration does: `rein pshift controller` reads ctl.toml
/// up to 16 MiB, where a bucket takes its name and at least 10 bytes more (`{name=""},` in its shortest
/// form, an inline table), so its welcome is always shorter than its file ([`welcome_body_len`] says how
/// long a welcome is; [`encode`] refuses a longer one). A refusal, the other frame a server reads before
/// its welcome, is far smaller.
pub const MAX_WELCOME_BODY: usize = 16 << 20;
/// The longest refusal reason.
pub const MAX_REASON_LEN: usize = 4096;
/// Bytes per bucket line in a report.
const REPORT_LINE: usize = 4 + 6 * 8;
/// Bytes per bucket line in a token message.
const TOKEN_LINE: usize = 4 + 8 + 8;
/// What [`server_body_max`] and [`controller_body_max`] allow for a body's fields besides its bucket
/// lines: more than any message after the welcome has (a report's 40 bytes, a pong's 40, a token
/// message's 20, a stray note's 20, a report request's 12, a ping's 8).
const FIELDS_MAX: usize = 64;

/// The largest body a welcomed server sends with `buckets` buckets: a report with a line for each (pings
/// and stray notes are smaller). What the controller reads at most from a welcomed server.
pub fn server_body_max(buckets: usize) -> usize {
    FIELDS_MAX + REPORT_LINE * buckets
}

/// The largest body a controller sends a server it welcomed with `buckets` buckets: a token message with
/// a line for each (pongs and report requests are smaller). What a welcomed server reads at most.
pub fn controller_body_max(buckets: usize) -> usize {
    FIELDS_MAX + TOKEN_LINE * buckets
}

/// One message; see the module comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Server -> controller, first: the server's name.
    Hello {
        /// The server's name in the controller's configuration.
        name: String,
    },
    /// Controller -> server: the server's index and the buckets (names, in index order).
    Welcome {
        /// The server's index.
        server: u32,
        /// Whether the server notes stray arrivals (the controller runs early rounds).
        strays: bool,
        /// Bucket names; a bucket number in later messages indexes this list.
        buckets: Vec<String>,
        /// Per bucket (the same order): whether the controller limits it. Empty: none is (the form that
        /// decodes when none is; a list of `false` encodes the same).
        limited: Vec<bool>,
    },
    /// Controller -> server: the hello is refused (the reason), and the connection closes.
    Refuse {
        /// Why.
        reason: String,
    },
    /// Controller -> server: report the interval for `(round, early)` now.
    ReportRequest {
        /// The boundary.
        round: u64,
        /// 0, or the early round after it.
        early: u32,
    },
    /// Server -> controller: the report asked for.
    Report(ServerReport),
    /// Server -> controller: a bucket arrived that the latest tokens did not plan for here.
    Stray(StrayArrival),
    /// Controller -> server: its tokens for the rest of the period.
    Tokens(TokenMessage),
    /// Server -> controller: its clock now, for [`Message::Pong`].
    Ping {
        /// The server's clock (ns).
        t0: u64,
    },
    /// Controller -> server: the answer to a ping, with the controller's clock and schedule.
    Pong {
        /// The ping's `t0`.
        t0: u64,
        /// The controller's clock when it answered (ns).
        t1: u64,
        /// The next boundary's round number.
        next_round: u64,
        /// The next boundary on the controller's clock (ns); 0: the schedule has not started.
        next_ns: u64,
        /// The time between boundaries (ns).
        interval_ns: u64,
    },
}

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Message::Hello { .. } => 1,
            Message::Welcome { .. } => 2,
            Message::Refuse { .. } => 3,
            Message::ReportRequest { .. } => 4,
            Message::Report(_) => 5,
            Message::Stray(_) => 6,
            Message::Tokens(_) => 7,
            Message::Ping { .. } => 8,
            Message::Pong { .. } => 9,
        }
    }

    /// The message's name in errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Welcome { .. } => "welcome",
            Message::Refuse { .. } => "refuse",
            Message::ReportRequest { .. } => "report request",
            Message::Report(_) => "report",
            Message::Stray(_) => "stray",
            Message::Tokens(_) => "tokens",
            Message::Ping { .. } => "ping",
            Message::Pong { .. } => "pong",
        }
    }
}

/// Why bytes are not a valid frame, or a message cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The first four bytes are not [`MAGIC`].
    #[error("bad magic {0:#010x} (not a pShift frame)")]
    Magic(u32),
    /// A version other than [`VERSION`].
    #[error("unsupported pShift frame version {0} (this build speaks version {VERSION})")]
    Version(u16),
    /// An unknown message type.
    #[error("unknown pShift message type {0}")]
    Type(u8),
    /// The reserved header byte is not zero.
    #[error("reserved header byte is {0}, not 0")]
    Reserved(u8),
    /// A body longer than [`MAX_BODY`] (a welcome's: [`MAX_WELCOME_BODY`]).
    #[error("{what} body of {len} bytes exceeds the bound of {max}")]
    TooLong {
        /// The message.
        what: &'static str,
        /// Its length.
        len: u64,
        /// The bound.
        max: usize,
    },
    /// A body that ends before its fields, or has bytes after them.
    #[error("{what}: body of {len} bytes, {why}")]
    Length {
        /// The message.
        what: &'static str,
        /// The body's length.
        len: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// A field out of its range.
    #[error("{what}: {field} {value} is out of range ({why})")]
    Field {
        /// The message.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The rule.
        why: &'static str,
    },
    /// A name that is empty, too long or not UTF-8.
    #[error("{what}: {field} is {why}")]
    Name {
        /// The message.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn check_name(what: &'static str, field: &'static str, s: &str, max: usize) -> Result<(), WireError> {
    if s.is_empty() {
        return Err(WireError::Name { what, field, why: "empty" });
    }
    if s.len() > max {
        return Err(WireError::Name { what, field, why: "too long" });
    }
    Ok(())
}

fn check_tokens(what: &'static str, field: &'static str, v: u64) -> Result<(), WireError> {
    if v > MAX_TOKENS {
        return Err(WireError::Field { what, field, value: v, why: "at most 10^12 tokens" });
    }
    Ok(())
}

fn check_bucket(what: &'static str, b: u32) -> Result<(), WireError> {
    if b as usize >= MAX_BUCKETS {
        return Err(WireError::Field { what, field: "bucket", value: b.into(), why: "below 1,000,000" });
    }
    Ok(())
}

/// The body length of a welcome listing `buckets` with `limited` flags (as [`encode`] writes it), to be
/// checked against [`MAX_WELCOME_BODY`] before any is sent.
pub fn welcome_body_len(buckets: &[String], limited: &[bool]) -> usize {
    let flags = if limited.iter().any(|&l| l) { buckets.len() } else { 0 };
    12 + buckets.iter().map(|b| 2 + b.len()).sum::<usize>() + flags
}

/// The bound on a body of message type `kind`: [`MAX_WELCOME_BODY`] for a welcome, [`MAX_BODY`] else.
fn max_body(kind: u8) -> usize {
    if kind == 2 {
        MAX_WELCOME_BODY
    } else {
        MAX_BODY
    }
}

/// Appends `m`'s frame to `out`. Errors: a field out of the ranges decoding checks (so whatever encodes
/// decodes), or a body over [`MAX_BODY`] (a welcome's over [`MAX_WELCOME_BODY`]); `out` is then unchanged.
pub fn encode(m: &Message, out: &mut Vec<u8>) -> Result<(), WireError> {
    let what = m.name();
    let start = out.len();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(m.kind());
    out.push(0);
    out.extend_from_slice(&[0; 4]);
    let body = out.len();
    let r = encode_body(m, what, out);
    if let Err(e) = r {
        out.truncate(start);
        return Err(e);
    }
    let len = out.len() - body;
    let max = max_body(m.kind());
    if len > max {
        out.truncate(start);
        return Err(WireError::TooLong { what, len: len as u64, max });
    }
    out[body - 4..body].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(())
}

fn encode_body(m: &Message, what: &'static str, out: &mut Vec<u8>) -> Result<(), WireError> {
    match m {
        Message::Hello { name } => {
            check_name(what, "name", name, MAX_NAME_LEN)?;
            put_str(out, name);
        }
        Message::Welcome { server, strays, buckets, limited } => {
            if buckets.len() > MAX_BUCKETS {
                let value = buckets.len() as u64;
                return Err(WireError::Field { what, field: "bucket count", value, why: "at most 1,000,000" });
            }
            if !limited.is_empty() && limited.len() != buckets.len() {
                let value = limited.len() as u64;
                return Err(WireError::Field { what, field: "limit flags", value, why: "one per bucket, or none" });
            }
            let with_limits = limited.iter().any(|&l| l);
            out.extend_from_slice(&server.to_le_bytes());
            out.extend_from_slice(&(u32::from(*strays) | u32::from(with_limits) << 1).to_le_bytes());
            out.extend_from_slice(&(buckets.len() as u32).to_le_bytes());
            for (i, b) in buckets.iter().enumerate() {
                check_name(what, "bucket name", b, MAX_NAME_LEN)?;
                put_str(out, b);
                if with_limits {
                    out.push(u8::from(limited[i]));
                }
            }
        }
        Message::Refuse { reason } => {
            check_name(what, "reason", reason, MAX_REASON_LEN)?;
            put_str(out, reason);
        }
        Message::ReportRequest { round, early } => {
            out.extend_from_slice(&round.to_le_bytes());
            out.extend_from_slice(&early.to_le_bytes());
        }
        Message::Ping { t0 } => out.extend_from_slice(&t0.to_le_bytes()),
        Message::Pong { t0, t1, next_round, next_ns, interval_ns } => {
            for v in [t0, t1, next_round, next_ns, interval_ns] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Message::Report(r) => {
            if r.buckets.len() > MAX_BUCKETS {
                let value = r.buckets.len() as u64;
                return Err(WireError::Field { what, field: "bucket count", value, why: "at most 1,000,000" });
            }
            out.extend_from_slice(&r.server.to_le_bytes());
            out.extend_from_slice(&r.round.to_le_bytes());
            out.extend_from_slice(&r.early.to_le_bytes());
            for v in [r.elapsed_ns, r.completed, r.busy_ns] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&(r.buckets.len() as u32).to_le_bytes());
            let mut last: Option<u32> = None;
            for b in &r.buckets {
                check_bucket(what, b.bucket)?;
                if last.is_some_and(|l| b.bucket <= l) {
                    let value = b.bucket.into();
                    return Err(WireError::Field { what, field: "bucket", value, why: "lines strictly increasing" });
                }
                last = Some(b.bucket);
                out.extend_from_slice(&b.bucket.to_le_bytes());
                for v in [b.arrivals, b.dispatched, b.queued, b.idle_ns, b.in_flight, b.held] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        Message::Stray(s) => {
            check_bucket(what, s.bucket)?;
            out.extend_from_slice(&s.server.to_le_bytes());
            out.extend_from_slice(&s.bucket.to_le_bytes());
            out.extend_from_slice(&s.heard.0.to_le_bytes());
            out.extend_from_slice(&s.heard.1.to_le_bytes());
        }
        Message::Tokens(t) => {
            if t.tokens.len() > MAX_BUCKETS {
                let value = t.tokens.len() as u64;
                return Err(WireError::Field { what, field: "bucket count", value, why: "at most 1,000,000" });
            }
            out.extend_from_slice(&t.server.to_le_bytes());
            out.extend_from_slice(&t.round.to_le_bytes());
            out.extend_from_slice(&t.early.to_le_bytes());
            out.extend_from_slice(&(t.tokens.len() as u32).to_le_bytes());
            let mut last: Option<u32> = None;
            for &(b, r, l) in &t.tokens {
                check_bucket(what, b)?;
                if last.is_some_and(|l| b <= l) {
                    return Err(WireError::Field {
                        what,
                        field: "bucket",
                        value: b.into(),
                        why: "lines strictly increasing",
                    });
                }
                last = Some(b);
                check_tokens(what, "r", r)?;
                let l = match l {
                    Tokens::Unlimited => u64::MAX,
                    Tokens::Count(n) => {
                        check_tokens(what, "l", n)?;
                        n
                    }
                };
                out.extend_from_slice(&b.to_le_bytes());
                out.extend_from_slice(&r.to_le_bytes());
                out.extend_from_slice(&l.to_le_bytes());
            }
        }
    }
    Ok(())
}

/// A cursor over a body.
struct Body<'a> {
    what: &'static str,
    b: &'a [u8],
    at: usize,
}

impl<'a> Body<'a> {
    fn short(&self) -> WireError {
        WireError::Length { what: self.what, len: self.b.len(), why: "ends before its fields" }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or_else(|| self.short())?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn str(&mut self, field: &'static str, max: usize) -> Result<String, WireError> {
        let n = self.u16()? as usize;
        let s = self.take(n)?;
        let s = std::str::from_utf8(s).map_err(|_| WireError::Name { what: self.what, field, why: "not UTF-8" })?;
        check_name(self.what, field, s, max)?;
        Ok(s.to_string())
    }
    /// A count of `line`-byte lines, checked against what is left before anything is allocated.
    fn count(&mut self, line: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n > MAX_BUCKETS {
            let what = self.what;
            return Err(WireError::Field { what, field: "bucket count", value: n as u64, why: "at most 1,000,000" });
        }
        if n.saturating_mul(line) > self.b.len() - self.at {
            return Err(self.short());
        }
        Ok(n)
    }
    fn end(&self) -> Result<(), WireError> {
        if self.at != self.b.len() {
            return Err(WireError::Length { what: self.what, len: self.b.len(), why: "has bytes after its fields" });
        }
        Ok(())
    }
}

/// Decodes one body of type `kind`.
fn decode_body(kind: u8, body: &[u8]) -> Result<Message, WireError> {
    let what = match kind {
        1 => "hello",
        2 => "welcome",
        3 => "refuse",
        4 => "report request",
        5 => "report",
        6 => "stray",
        7 => "tokens",
        8 => "ping",
        9 => "pong",
        k => return Err(WireError::Type(k)),
    };
    let mut c = Body { what, b: body, at: 0 };
    let m = match kind {
        1 => Message::Hello { name: c.str("name", MAX_NAME_LEN)? },
        2 => {
            let server = c.u32()?;
            let flags = c.u32()?;
            if flags > 3 {
                return Err(WireError::Field {
                    what,
                    field: "flags",
                    value: flags.into(),
                    why: "only bits 0 and 1 are defined",
                });
            }
            let with_limits = flags & 2 != 0;
            // Each name is at least 3 bytes (length and one byte), and its limit byte.
            let n = c.count(3 + usize::from(with_limits))?;
            let mut buckets = Vec::with_capacity(n);
            let mut limited = Vec::with_capacity(if with_limits { n } else { 0 });
            for _ in 0..n {
                buckets.push(c.str("bucket name", MAX_NAME_LEN)?);
                if with_limits {
                    match c.u8()? {
                        0 => limited.push(false),
                        1 => limited.push(true),
                        v => return Err(WireError::Field { what, field: "limited", value: v.into(), why: "0 or 1" }),
                    }
                }
            }
            if with_limits && !limited.contains(&true) {
                // What decodes re-encodes to the same bytes: bit 1 only when a bucket is limited.
                return Err(WireError::Field {
                    what,
                    field: "flags",
                    value: flags.into(),
                    why: "bit 1 with no limited bucket",
                });
            }
            Message::Welcome { server, strays: flags & 1 == 1, buckets, limited }
        }
        3 => Message::Refuse { reason: c.str("reason", MAX_REASON_LEN)? },
        4 => Message::ReportRequest { round: c.u64()?, early: c.u32()? },
        8 => Message::Ping { t0: c.u64()? },
        9 => {
            Message::Pong { t0: c.u64()?, t1: c.u64()?, next_round: c.u64()?, next_ns: c.u64()?, interval_ns: c.u64()? }
        }
        5 => {
            let server = c.u32()?;
            let round = c.u64()?;
            let early = c.u32()?;
            let (elapsed_ns, completed, busy_ns) = (c.u64()?, c.u64()?, c.u64()?);
            let n = c.count(REPORT_LINE)?;
            let mut buckets: Vec<BucketReport> = Vec::with_capacity(n);
            for _ in 0..n {
                let bucket = c.u32()?;
                check_bucket(what, bucket)?;
                if buckets.last().is_some_and(|l| bucket <= l.bucket) {
                    let value = bucket.into();
                    return Err(WireError::Field { what, field: "bucket", value, why: "lines strictly increasing" });
                }
                buckets.push(BucketReport {
                    bucket,
                    arrivals: c.u64()?,
                    dispatched: c.u64()?,
                    queued: c.u64()?,
                    idle_ns: c.u64()?,
                    in_flight: c.u64()?,
                    held: c.u64()?,
                });
            }
            Message::Report(ServerReport { server, round, early, elapsed_ns, completed, busy_ns, buckets })
        }
        6 => {
            let server = c.u32()?;
            let bucket = c.u32()?;
            check_bucket(what, bucket)?;
            Message::Stray(StrayArrival { server, bucket, heard: (c.u64()?, c.u32()?) })
        }
        _ => {
            let server = c.u32()?;
            let round = c.u64()?;
            let early = c.u32()?;
            let n = c.count(TOKEN_LINE)?;
            let mut tokens: Vec<(u32, u64, Tokens)> = Vec::with_capacity(n);
            for _ in 0..n {
                let b = c.u32()?;
                check_bucket(what, b)?;
                // One line per bucket, as in a report: a server sets a bucket's tokens from its line, so a
                // second line for it would silently replace the first.
                if tokens.last().is_some_and(|l| b <= l.0) {
                    return Err(WireError::Field {
                        what,
                        field: "bucket",
                        value: b.into(),
                        why: "lines strictly increasing",
                    });
                }
                let r = c.u64()?;
                check_tokens(what, "r", r)?;
                let l = match c.u64()? {
                    u64::MAX => Tokens::Unlimited,
                    n => {
                        check_tokens(what, "l", n)?;
                        Tokens::Count(n)
                    }
                };
                tokens.push((b, r, l));
            }
            Message::Tokens(TokenMessage { server, round, early, tokens })
        }
    };
    c.end()?;
    Ok(m)
}

/// A frame's header: `(type, body length)`, checked. Errors name the field.
fn header(h: &[u8]) -> Result<(u8, usize), WireError> {
    let magic = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes"));
    if magic != MAGIC {
        return Err(WireError::Magic(magic));
    }
    let version = u16::from_le_bytes(h[4..6].try_into().expect("2 bytes"));
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    let kind = h[6];
    if !(1..=9).contains(&kind) {
        return Err(WireError::Type(kind));
    }
    if h[7] != 0 {
        return Err(WireError::Reserved(h[7]));
    }
    let len = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")) as usize;
    let max = max_body(kind);
    if len > max {
        let what = decode_name(kind);
        return Err(WireError::TooLong { what, len: len as u64, max });
    }
    Ok((kind, len))
}

fn decode_name(kind: u8) -> &'static str {
    ["", "hello", "welcome", "refuse", "report request", "report", "stray", "tokens", "ping", "pong"]
        .get(kind as usize)
        .copied()
        .unwrap_or("")
}

/// Decodes one frame from the front of `b`: `Ok(Some((message, bytes used)))`, `Ok(None)` if `b` holds
/// less than a whole frame (read more), or the error of a bad header or body.
pub fn decode(b: &[u8]) -> Result<Option<(Message, usize)>, WireError> {
    if b.len() < HEADER_BYTES {
        return Ok(None);
    }
    let (kind, len) = header(&b[..HEADER_BYTES])?;
    let end = HEADER_BYTES + len;
    if b.len() < end {
        return Ok(None);
    }
    Ok(Some((decode_body(kind, &b[HEADER_BYTES..end])?, end)))
}

/// How many bytes the frame at the front of `b` needs in all, once its header is there (to read exactly
/// that much); `None` before. Errors: a bad header.
pub fn frame_len(b: &[u8]) -> Result<Option<usize>, WireError> {
    if b.len() < HEADER_BYTES {
        return Ok(None);
    }
    Ok(Some(HEADER_BYTES + header(&b[..HEADER_BYTES])?.1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn report() -> ServerReport {
        ServerReport {
            server: 2,
            round: 9,
            early: 1,
            elapsed_ns: 1_000_000,
            completed: 50,
            busy_ns: 900_000,
            buckets: vec![
                BucketReport { bucket: 0, arrivals: 5, dispatched: 4, queued: 1, idle_ns: 7, in_flight: 2, held: 3 },
                BucketReport { bucket: 7, arrivals: 1, ..Default::default() },
            ],
        }
    }

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello { name: "s1".into() },
            Message::Welcome { server: 3, strays: true, buckets: vec!["a".into(), "bucket-b".into()], limited: vec![] },
            Message::Welcome {
                server: 1,
                strays: false,
                buckets: vec!["a".into(), "bucket-b".into(), "c".into()],
                limited: vec![false, true, false],
            },
            Message::Refuse { reason: "no server named x".into() },
            Message::ReportRequest { round: 4, early: 0 },
            Message::Ping { t0: 123_456_789 },
            Message::Pong {
                t0: 123_456_789,
                t1: 987_654_321,
                next_round: 6,
                next_ns: 1_200_000_000,
                interval_ns: 200_000_000,
            },
            Message::Report(report()),
            Message::Stray(StrayArrival { server: 1, bucket: 5, heard: (3, 2) }),
            Message::Tokens(TokenMessage {
                server: 0,
                round: 3,
                early: 0,
                tokens: vec![(0, 10, Tokens::Unlimited), (4, 0, Tokens::Count(20))],
            }),
        ]
    }

    #[test]
    fn every_message_round_trips_and_split_input_waits() {
        for m in samples() {
            let mut out = Vec::new();
            encode(&m, &mut out).unwrap();
            assert_eq!(frame_len(&out).unwrap(), Some(out.len()));
            for cut in 0..out.len() {
                assert_eq!(decode(&out[..cut]).unwrap(), None, "{} cut at {cut}", m.name());
            }
            let (back, used) = decode(&out).unwrap().unwrap();
            assert_eq!((back, used), (m, out.len()));
        }
    }

    #[test]
    fn bad_frames_name_what_is_wrong() {
        let mut out = Vec::new();
        encode(&Message::Report(report()), &mut out).unwrap();
        let err = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = out.clone();
            f(&mut b);
            decode(&b).unwrap_err().to_string()
        };
        assert!(err(&|b| b[0] = b'X').contains("bad magic"));
        assert!(err(&|b| b[4] = 1).contains("version 1"));
        assert!(err(&|b| b[6] = 10).contains("unknown pShift message type 10"));
        assert!(err(&|b| b[8..12].copy_from_slice(&u32::MAX.to_le_bytes())).contains("exceeds the bound"));
        // The second line's bucket (7) made equal to the first's (0): one line per bucket.
        let second = HEADER_BYTES + 4 + 8 + 4 + 24 + 4 + REPORT_LINE;
        assert!(err(&|b| b[second..second + 4].copy_from_slice(&0u32.to_le_bytes())).contains("strictly increasing"));
        // A count claiming more lines than the body holds is refused before allocating.
        let count = HEADER_BYTES + 4 + 8 + 4 + 24;
        assert!(err(&|b| b[count..count + 4].copy_from_slice(&1000u32.to_le_bytes())).contains("ends before"));
        // Trailing bytes.
        let mut b = out.clone();
        b.push(0);
        let len = (b.len() - HEADER_BYTES) as u32;
        b[8..12].copy_from_slice(&len.to_le_bytes());
        assert!(decode(&b).unwrap_err().to_string().contains("bytes after its fields"));
        // A welcome's limit byte is 0 or 1, and bit 1 comes only with a limited bucket.
        let mut w = Vec::new();
        let welcome =
            |limited: Vec<bool>| Message::Welcome { server: 0, strays: false, buckets: vec!["a".into()], limited };
        encode(&welcome(vec![true]), &mut w).unwrap();
        let last = w.len() - 1;
        w[last] = 2;
        assert!(decode(&w).unwrap_err().to_string().contains("0 or 1"), "{:?}", decode(&w));
        w[last] = 0;
        assert!(decode(&w).unwrap_err().to_string().contains("bit 1 with no limited bucket"));
        let e = encode(&welcome(vec![true, false]), &mut Vec::new());
        assert!(e.unwrap_err().to_string().contains("one per bucket"));
        // A token message's lines are one per bucket too, in either direction: a second line for bucket 4
        // would silently replace the first at the server.
        let twice = TokenMessage {
            server: 0,
            round: 0,
            early: 0,
            tokens: vec![(4, 1, Tokens::Unlimited), (4, 2, Tokens::Unlimited)],
        };
        let e = encode(&Message::Tokens(twice), &mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("bucket 4") && e.contains("strictly increasing"), "{e}");
        let mut t = Vec::new();
        encode(&samples().pop().unwrap(), &mut t).unwrap();
        // The second line's bucket (4) made equal to the first's (0).
        let second = HEADER_BYTES + 4 + 8 + 4 + 4 + TOKEN_LINE;
        t[second..second + 4].copy_from_slice(&0u32.to_le_bytes());
        let e = decode(&t).unwrap_err().to_string();
        assert!(e.contains("bucket 0") && e.contains("strictly increasing"), "{e}");
        // Values beyond rein-core's bounds do not encode (so what encodes decodes).
        let t = TokenMessage { server: 0, round: 0, early: 0, tokens: vec![(0, MAX_TOKENS + 1, Tokens::Unlimited)] };
        assert!(encode(&Message::Tokens(t), &mut Vec::new()).unwrap_err().to_string().contains("r 1000000000001"));
        assert!(encode(&Message::Hello { name: String::new() }, &mut Vec::new()).is_err());
    }

    /// The bodies after the welcome stay within [`server_body_max`] and [`controller_body_max`]: a report
    /// and a token message with a line for each of `n` buckets, and every fixed-size message with none.
    #[test]
    fn bodies_after_the_welcome_fit_their_bounds() {
        let body = |m: &Message| {
            let mut out = Vec::new();
            encode(m, &mut out).unwrap();
            out.len() - HEADER_BYTES
        };
        for n in [0usize, 1, 7] {
            let report = ServerReport {
                server: 0,
                round: u64::MAX,
                early: 0,
                elapsed_ns: 1,
                completed: 1,
                busy_ns: 1,
                buckets: (0..n as u32).map(|bucket| BucketReport { bucket, ..Default::default() }).collect(),
            };
            assert!(body(&Message::Report(report)) <= server_body_max(n));
            let tokens = TokenMessage {
                server: 0,
                round: 1,
                early: 0,
                tokens: (0..n as u32).map(|b| (b, 1, Tokens::Unlimited)).collect(),
            };
            assert!(body(&Message::Tokens(tokens)) <= controller_body_max(n));
        }
        let pong = Message::Pong { t0: 1, t1: 2, next_round: 3, next_ns: 4, interval_ns: 5 };
        assert!(body(&pong) <= controller_body_max(0));
        assert!(body(&Message::ReportRequest { round: 1, early: 2 }) <= controller_body_max(0));
        assert!(body(&Message::Ping { t0: 1 }) <= server_body_max(0));
        let stray = Message::Stray(StrayArrival { server: 0, bucket: 0, heard: (1, 2) });
        assert!(body(&stray) <= server_body_max(0));
        assert_eq!((server_body_max(1), controller_body_max(1)), (116, 84), "the daemons' tests' figures");
    }

    /// A welcome at its bound: a body of exactly [`MAX_WELCOME_BODY`] bytes (64,777 names, all but the last
    /// of 256 bytes, with limit flags) encodes and decodes whole; one byte more does not encode, and a header
    /// announcing it is refused before any of its body is read, naming the welcome and the bound (other
    /// frames keep [`MAX_BODY`]).
    #[test]
    fn a_welcome_at_its_bound() {
        let line = 2 + MAX_NAME_LEN + 1;
        let full = (MAX_WELCOME_BODY - 12) / line;
        let last = MAX_WELCOME_BODY - 12 - full * line - 3;
        let mut buckets: Vec<String> = (0..full).map(|k| format!("{k:0>256}")).collect();
        buckets.push("x".repeat(last));
        let limited: Vec<bool> = (0..buckets.len()).map(|k| k % 2 == 0).collect();
        assert_eq!(welcome_body_len(&buckets, &limited), MAX_WELCOME_BODY);
        let m = Message::Welcome { server: 3, strays: true, buckets, limited };
        let mut out = Vec::new();
        encode(&m, &mut out).unwrap();
        assert_eq!(out.len(), HEADER_BYTES + MAX_WELCOME_BODY);
        assert_eq!(frame_len(&out[..HEADER_BYTES]).unwrap(), Some(out.len()));
        assert_eq!(decode(&out).unwrap().unwrap(), (m.clone(), out.len()));
        let Message::Welcome { server, strays, mut buckets, mut limited } = m else { unreachable!() };
        buckets.last_mut().unwrap().push('y');
        assert_eq!(welcome_body_len(&buckets, &limited), MAX_WELCOME_BODY + 1);
        let e =
            encode(&Message::Welcome { server, strays, buckets: buckets.clone(), limited: limited.clone() }, &mut out);
        let want = format!("welcome body of {} bytes exceeds the bound of {MAX_WELCOME_BODY}", MAX_WELCOME_BODY + 1);
        assert_eq!(e.unwrap_err().to_string(), want);
        assert_eq!(out.len(), HEADER_BYTES + MAX_WELCOME_BODY, "out unchanged");
        out[8..12].copy_from_slice(&(MAX_WELCOME_BODY as u32 + 1).to_le_bytes());
        assert_eq!(frame_len(&out[..HEADER_BYTES]).unwrap_err().to_string(), want);
        // Without flags the lines are a byte shorter; a token message may be longer than a welcome.
        limited.clear();
        assert_eq!(welcome_body_len(&buckets, &limited), MAX_WELCOME_BODY + 1 - buckets.len());
        out[6] = 7;
        assert_eq!(frame_len(&out[..HEADER_BYTES]).unwrap(), Some(HEADER_BYTES + MAX_WELCOME_BODY + 1));
    }

    proptest! {
        /// Random bytes never panic the decoder; what decodes re-encodes to the same bytes.
        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256), kind in 1u8..10) {
            crate::harness::pshift(&data);
            // The same bytes behind a valid header of each type.
            let mut b = MAGIC.to_le_bytes().to_vec();
            b.extend_from_slice(&VERSION.to_le_bytes());
            b.extend_from_slice(&[kind, 0]);
            b.extend_from_slice(&(data.len() as u32).to_le_bytes());
            b.extend_from_slice(&data);
            crate::harness::pshift(&b);
        }
    }
}
