//! The storage-node protocol (v2): an NBD option of Rein's own by which a gateway tells a storage node its
//! tenants' QoS specs, then tags every request with the tenant and what the gateway's dmClock/RBFQ tracker
//! computed, and gets back the phase and cost of each dispatch (docs/node-protocol.md is the public form).
//!
//! # Model
//! dmClock (mclock-dmclock.txt §3.2.1) and RBFQ (rbfq-repair.txt §3.2) run one scheduler per storage
//! server; the client (here the gateway) piggybacks on each request what its tenant received elsewhere
//! (delta, rho) and learns from each reply the phase the server served it in. Plain NBD has no room for
//! either, so a session that negotiated [`OPT_REIN_NODE`] adds:
//! - in the handshake, [`NodeHello`] (the gateway's tenants and their specs) answered by [`NodeWelcome`]
//!   (a slot per tenant and the spec in effect at the node, [`SpecSource`]);
//! - after every request header, a [`NODE_TAG_LEN`]-byte [`NodeTag`] (slot, share, delta, rho);
//! - after every simple reply header, a [`NODE_REPLY_TRAILER_LEN`]-byte [`NodeReplyTrailer`] (phase,
//!   cost).
//!
//! All integers are big-endian, as in NBD; numbers are IEEE 754 binary64, big-endian.
//!
//! # Invariants
//! 1. Every decoder here takes arbitrary bytes and returns a value or one [`NodeError`] naming the field
//!    (and the tenant) that is wrong; none panics, none allocates more than a small multiple of its
//!    input.
//! 2. What a decoder accepts re-encodes to the same bytes (the fuzz target `node_hello` checks it), and
//!    what an encoder writes from a value that passes [`NodeHello::check`] decodes to that value.
//! 3. A hello holds 1..=[`MAX_NODE_TENANTS`] tenants with distinct names of 1..=[`MAX_NODE_NAME_LEN`]
//!    bytes, and encodes to at most [`MAX_OPTION_LEN`] bytes (the NBD option limit, which binds first for
//!    long names: 64 tenants fit when their names average at most 87 bytes).
//!
//! # Versioning
//! The hello carries the highest version the gateway speaks; the node answers the highest version it
//! speaks that is not above it ([`NODE_VERSION`]). Version 0 is invalid. The layout of a version N > 1
//! begins with v1's; fields it adds come after the last tenant, and a v1 node ignores them when the
//! hello's version is above 1 (with version 1, trailing bytes are invalid).
//! - v2 adds, after the welcome's last entry, the node's boot identity ([`NodeWelcome::boot`]: 8 bytes,
//!   not 0, drawn once per node process): a gateway whose session to a node ends and starts again can
//!   tell a node that restarted (a fresh scheduler, which must not be handed the outage's service
//!   elsewhere at once) from a connection that broke (the node still holds the tenant's tags, so that
//!   service is its delta, as dmClock's rule says). The hello is v1's.
//! - v3 adds the pool flag ([`NodeTag::pool_busy`]): bit 31 of the tag's share word says the tenant had
//!   requests in flight at every moment since its previous request to this node (`rein_core::Piggyback::
//!   pool_busy`), so the node can tell a pool that moved from a tenant that went idle (`SchedConfig::
//!   pool_return`). A gateway sets it only on a session whose welcome is v3 or later (a v2 node refuses
//!   the bit as a share above 65,536); a node reads it in any session (a v2 gateway never sets it). The
//!   hello and welcome are v2's.
//! - v4 adds block status ([`NODE_VERSION_BLOCK_STATUS`]): in a session whose welcome is v4 or later a
//!   node answers NBD_CMD_BLOCK_STATUS for `base:allocation` (implied: a node session negotiates no
//!   metadata context, since it has no structured replies) with the simple reply header and the trailer
//!   (phase 0: not scheduled), and, when the error is 0, a u32 byte count followed by that many bytes of
//!   descriptors (length u32, flags u32, as `base:allocation`'s: [`STATE_HOLE`], [`STATE_ZERO`]), 1..=
//!   [`MAX_EXTENTS`] of them, each at least one byte, together covering a prefix of the requested range
//!   ([`encode_node_extents`], [`node_extents_len`], [`decode_node_extents`]). A gateway sends it only on
//!   such a session (a v3 node answers it EINVAL, as it answers any BLOCK_STATUS without a context); the
//!   reader must know the request was a BLOCK_STATUS to read the payload. The hello and welcome are v3's.
//!
//! # Symbol map
//! | paper | here |
//! |---|---|
//! | delta_i, rho_i (dmClock §3.2.1) | [`NodeTag::delta`], [`NodeTag::rho`] (`rein_core::Piggyback`) |
//! | s_ij, the share of the reservation owed here (Rein's spread) | [`NodeTag::share`] |
//! | M_ij, RBFQ's local minimum (§3.2) | [`NodeTenant::local_reservation`] |
//! | phase of a completion (dmClock's reply) | [`NodeReplyTrailer::phase`] |
//!
//! # Deviations
//! - dmClock's server replies carry only the phase; the trailer also carries the cost the node charged,
//!   so a gateway whose cost model differs from the node's still counts delta in the node's units.
//! - Structured replies and the node protocol exclude each other (simple replies with a trailer are
//!   enough: a READ is one piece here), whichever is asked second gets NBD_REP_ERR_INVALID.

use super::*;
use rein_core::sched::{Phase, ReservationShare};

/// The option number ("REIN").
pub const OPT_REIN_NODE: u32 = 0x5245_494E;
/// The success reply to [`OPT_REIN_NODE`] (bit 31 clear: not an error).
pub const REP_REIN_NODE: u32 = 0x5245_494E;
/// The highest protocol version this code speaks.
pub const NODE_VERSION: u16 = 4;
/// The first version whose sessions answer NBD_CMD_BLOCK_STATUS (module comment, "Versioning").
pub const NODE_VERSION_BLOCK_STATUS: u16 = 4;
/// Bytes of a block-status payload at most: the count, then [`MAX_EXTENTS`] descriptors.
pub const NODE_EXTENTS_MAX_LEN: usize = 4 + 8 * MAX_EXTENTS;
/// The first version whose tags may carry [`NodeTag::pool_busy`].
pub const NODE_VERSION_POOL_FLAG: u16 = 3;
/// The pool flag's bit in the tag's share word.
const POOL_BUSY_BIT: u32 = 1 << 31;
/// Most tenants in one hello.
pub const MAX_NODE_TENANTS: usize = 64;
/// Longest tenant name in a hello, in bytes.
pub const MAX_NODE_NAME_LEN: usize = 255;
/// Most storage-node hellos one handshake takes (a gateway sends one per connection). Each may change the
/// node's specs (`[node] specs = "gateway"`, persisted); past this one is refused with
/// NBD_REP_ERR_POLICY without being asked of the node, and the session agreed so far stands.
pub const MAX_NODE_HELLOS: u32 = 8;
/// Length of the tag after each request header.
pub const NODE_TAG_LEN: usize = 24;
/// Length of the trailer after each simple reply header.
pub const NODE_REPLY_TRAILER_LEN: usize = 16;
/// Bytes of a hello or welcome before the first tenant (version, flags, count).
const PREAMBLE_LEN: usize = 6;
/// Bytes of a hello tenant entry after its name.
const TENANT_FIXED_LEN: usize = 4 * 8 + 4 + 2;
/// Bytes of one welcome entry.
const GRANTED_LEN: usize = 8 + 4 * 8;
/// Largest share ([`ReservationShare::ONE`]'s raw value).
const SHARE_ONE: u32 = 1 << ReservationShare::FRAC_BITS;

/// Why a node-protocol message was refused (invariant 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// The message ends inside a field.
    #[error("short {message}: ends inside {field}")]
    Short {
        /// Which message.
        message: &'static str,
        /// The field it ends in.
        field: &'static str,
    },
    /// Bytes after the last field.
    #[error("{bytes} trailing bytes after the {message}")]
    Trailing {
        /// Which message.
        message: &'static str,
        /// How many.
        bytes: usize,
    },
    /// Version 0 (or a welcome above what was asked).
    #[error("unsupported node protocol version {0}")]
    Version(u16),
    /// Reserved flags set.
    #[error("flags {0:#x} are reserved and must be 0")]
    Flags(u16),
    /// A tenant count outside 1..=[`MAX_NODE_TENANTS`] (or a welcome count unlike the hello's).
    #[error("tenant count {count} outside 1..={max}")]
    TenantCount {
        /// The count sent.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A name length outside 1..=[`MAX_NODE_NAME_LEN`].
    #[error("tenant {tenant}: name length {len} outside 1..={MAX_NODE_NAME_LEN}")]
    NameLen {
        /// Position of the tenant.
        tenant: usize,
        /// The length sent.
        len: usize,
    },
    /// A name that is not UTF-8 or holds a NUL.
    #[error("tenant {tenant}: name is not UTF-8 text without NUL")]
    NameText {
        /// Position of the tenant.
        tenant: usize,
    },
    /// A name given twice.
    #[error("tenant {tenant}: duplicate name {name:?}")]
    Duplicate {
        /// Position of the second one.
        tenant: usize,
        /// The name.
        name: String,
    },
    /// A number outside its range.
    #[error("tenant {tenant}: {field} {} is not {rule}", f64::from_bits(*bits))]
    Number {
        /// Position of the tenant.
        tenant: usize,
        /// The field.
        field: &'static str,
        /// The value's bits (so the error stays `Eq`).
        bits: u64,
        /// What it must be.
        rule: &'static str,
    },
    /// A byte-sized enumeration with an unknown value (split, source, phase).
    #[error("{field} {value} is not one of {allowed}")]
    Enum {
        /// The field.
        field: &'static str,
        /// The value sent.
        value: u8,
        /// The values allowed.
        allowed: &'static str,
    },
    /// Reserved bytes not zero.
    #[error("reserved bytes of {0} must be 0")]
    Reserved(&'static str),
    /// A v2 welcome's boot identity is 0.
    #[error("the welcome's boot identity is 0 (from version 2 it must not be)")]
    BootZero,
    /// A welcome's slot outside the session's table or given twice.
    #[error("tenant {tenant}: slot {slot} is not a distinct index below {count}")]
    Slot {
        /// Position of the tenant.
        tenant: usize,
        /// The slot sent.
        slot: u32,
        /// Tenants in the session.
        count: usize,
    },
    /// A hello whose encoding exceeds [`MAX_OPTION_LEN`].
    #[error("the hello takes {len} bytes, above the {max}-byte option limit (fewer tenants or shorter names)")]
    TooLong {
        /// Its encoded length.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// A reply trailer with no phase but a cost.
    #[error("a reply trailer with phase 0 (not served) carries cost {0}")]
    CostWithoutPhase(u64),
    /// A request tag the session refuses.
    #[error("{0}")]
    Tag(TagFault),
    /// A block-status payload whose byte count is not a multiple of 8 in 8..=8 x [`MAX_EXTENTS`].
    #[error("block status payload of {0} bytes (a multiple of 8 from 8 to {max})", max = 8 * MAX_EXTENTS)]
    ExtentsLen(u32),
    /// A block-status descriptor of length 0.
    #[error("block status descriptor {0} has length 0")]
    ExtentEmpty(usize),
    /// A block-status descriptor with flags other than hole and zero.
    #[error("block status descriptor {index} has flags {flags:#x} (only 1, hole, and 2, zero, are defined)")]
    ExtentFlags {
        /// Position of the descriptor.
        index: usize,
        /// The flags sent.
        flags: u32,
    },
    /// Block-status descriptors that describe more than the request's range.
    #[error("block status descriptors cover {covered} bytes, more than the {length} asked")]
    ExtentsBeyond {
        /// Bytes the descriptors add up to.
        covered: u64,
        /// The request's length.
        length: u32,
    },
}

/// Why a request's tag is refused (the request is answered EINVAL; the stream goes on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum TagFault {
    /// A slot the welcome did not give.
    #[error("tag slot {slot} is not one of this session's {slots} slots")]
    Slot {
        /// The slot sent.
        slot: u32,
        /// Slots in the session.
        slots: u32,
    },
    /// A share outside 1..=65536.
    #[error("tag share {0} outside 1..=65536")]
    Share(u32),
    /// rho above delta.
    #[error("tag rho {rho} is above delta {delta}")]
    RhoAboveDelta {
        /// rho sent.
        rho: u64,
        /// delta sent.
        delta: u64,
    },
}

/// How the gateway splits a tenant's reservation among nodes (`rein_core::ReservationSplit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeSplit {
    /// Rein's default: each request carries the share owed here.
    Spread,
    /// dmClock §3.2.1: each request carries rho.
    Rho,
}

/// One tenant as the gateway states it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTenant {
    /// The tenant's name (1..=[`MAX_NODE_NAME_LEN`] bytes of UTF-8, no NUL).
    pub name: String,
    /// Reservation (>= 0, finite; 0 = none), in IOPS or cost units/s as the node's cost model.
    pub reservation: f64,
    /// Limit (> 0, finite), or none (+inf on the wire).
    pub limit: Option<f64>,
    /// Weight (> 0, finite).
    pub weight: f64,
    /// RBFQ's local minimum M_ij at this node (>= 0, finite; 0 = none).
    pub local_reservation: f64,
    /// Idle credit (as rein.toml's `idle_credit`).
    pub idle_credit: u32,
    /// How the reservation is split.
    pub split: NodeSplit,
}

/// The gateway's [`OPT_REIN_NODE`] option data.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeHello {
    /// The highest version the gateway speaks (>= 1).
    pub version: u16,
    /// The tenants, 1..=[`MAX_NODE_TENANTS`], distinct names.
    pub tenants: Vec<NodeTenant>,
}

/// Whose spec is in effect for a tenant at the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecSource {
    /// The node's own configuration (`[node] specs = "node"`).
    Node,
    /// The gateway's, adopted (`[node] specs = "gateway"`).
    Gateway,
}

/// One tenant of the node's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeGranted {
    /// The slot to put in requests' tags.
    pub slot: u32,
    /// Whose spec is in effect.
    pub source: SpecSource,
    /// Reservation in effect.
    pub reservation: f64,
    /// Limit in effect (none: +inf on the wire).
    pub limit: Option<f64>,
    /// Weight in effect.
    pub weight: f64,
    /// Local reservation in effect.
    pub local_reservation: f64,
}

/// The node's [`REP_REIN_NODE`] reply data: one entry per hello tenant, in the hello's order.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeWelcome {
    /// The version the session speaks.
    pub version: u16,
    /// One entry per tenant of the hello, same order.
    pub tenants: Vec<NodeGranted>,
    /// The node's boot identity (from version 2; `None` exactly when `version` is 1): not 0, the same for
    /// every session of one node process, another after a restart.
    pub boot: Option<u64>,
}

/// What follows each request header on a node session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NodeTag {
    /// The tenant's slot from the welcome.
    pub slot: u32,
    /// `ReservationShare` raw value, 1..=65536.
    pub share: u32,
    /// `Cost` raw (48.16 fixed point): completed cost elsewhere since the previous request here.
    pub delta: u64,
    /// `Cost` raw: the reservation-phase part of `delta` (<= `delta`).
    pub rho: u64,
    /// From v3, bit 31 of the share word: the tenant's pool of requests never emptied since its previous
    /// request here (module comment, "Versioning").
    pub pool_busy: bool,
}

/// What follows each simple reply header on a node session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NodeReplyTrailer {
    /// The phase the scheduler served the request in; `None`: not charged (an error, or a request served
    /// without the scheduler).
    pub phase: Option<Phase>,
    /// `Cost` raw that the node charged (without delta); 0 without a phase.
    pub cost: u64,
}

/// A simple reply header as a node-protocol client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    /// The request's handle.
    pub handle: u64,
    /// NBD error (0: success).
    pub error: u32,
}

/// A cursor over a message that turns a short read into [`NodeError::Short`].
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
    message: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], NodeError> {
        if self.buf.len() - self.at < n {
            return Err(NodeError::Short { message: self.message, field });
        }
        self.at += n;
        Ok(&self.buf[self.at - n..self.at])
    }
    fn u8(&mut self, field: &'static str) -> Result<u8, NodeError> {
        Ok(self.take(1, field)?[0])
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, NodeError> {
        Ok(u16_at(self.take(2, field)?, 0))
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, NodeError> {
        Ok(u32_at(self.take(4, field)?, 0))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, NodeError> {
        Ok(u64_at(self.take(8, field)?, 0))
    }
    fn f64(&mut self, field: &'static str) -> Result<f64, NodeError> {
        Ok(f64::from_bits(self.u64(field)?))
    }
    fn rest(&self) -> usize {
        self.buf.len() - self.at
    }
}

/// The rules of the spec's numbers (the hello's and the welcome's).
#[derive(Clone, Copy)]
enum Rule {
    /// >= 0 and finite.
    NonNegative,
    /// > 0 and finite.
    Positive,
    /// > 0 and finite, or +inf.
    PositiveOrInf,
}

fn check_number(tenant: usize, field: &'static str, value: f64, rule: Rule) -> Result<(), NodeError> {
    let (ok, text) = match rule {
        Rule::NonNegative => (value.is_finite() && value >= 0.0, ">= 0 and finite"),
        Rule::Positive => (value.is_finite() && value > 0.0, "> 0 and finite"),
        Rule::PositiveOrInf => (value > 0.0 && !value.is_nan(), "> 0 (finite, or +inf for none)"),
    };
    if ok {
        Ok(())
    } else {
        Err(NodeError::Number { tenant, field, bits: value.to_bits(), rule: text })
    }
}

fn limit_bits(limit: Option<f64>) -> u64 {
    limit.unwrap_or(f64::INFINITY).to_bits()
}

fn limit_from(value: f64) -> Option<f64> {
    (value != f64::INFINITY).then_some(value)
}

fn check_count(count: usize) -> Result<(), NodeError> {
    if count == 0 || count > MAX_NODE_TENANTS {
        return Err(NodeError::TenantCount { count, max: MAX_NODE_TENANTS });
    }
    Ok(())
}

impl NodeTenant {
    fn check(&self, tenant: usize) -> Result<(), NodeError> {
        let len = self.name.len();
        if len == 0 || len > MAX_NODE_NAME_LEN {
            return Err(NodeError::NameLen { tenant, len });
        }
        if self.name.contains('\0') {
            return Err(NodeError::NameText { tenant });
        }
        check_number(tenant, "reservation", self.reservation, Rule::NonNegative)?;
        if let Some(limit) = self.limit {
            check_number(tenant, "limit", limit, Rule::Positive)?;
        }
        check_number(tenant, "weight", self.weight, Rule::Positive)?;
        check_number(tenant, "local_reservation", self.local_reservation, Rule::NonNegative)
    }
}

impl NodeHello {
    /// A version-[`NODE_VERSION`] hello.
    pub fn new(tenants: Vec<NodeTenant>) -> NodeHello {
        NodeHello { version: NODE_VERSION, tenants }
    }

    /// Bytes [`NodeHello::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        PREAMBLE_LEN + self.tenants.iter().map(|t| 2 + t.name.len() + TENANT_FIXED_LEN).sum::<usize>()
    }

    /// Whether the hello is one a node accepts (invariant 3; the same checks as [`NodeHello::decode`]).
    pub fn check(&self) -> Result<(), NodeError> {
        if self.version == 0 {
            return Err(NodeError::Version(0));
        }
        check_count(self.tenants.len())?;
        for (i, t) in self.tenants.iter().enumerate() {
            t.check(i)?;
            if self.tenants[..i].iter().any(|o| o.name == t.name) {
                return Err(NodeError::Duplicate { tenant: i, name: t.name.clone() });
            }
        }
        let len = self.encoded_len();
        if len > MAX_OPTION_LEN as usize {
            return Err(NodeError::TooLong { len, max: MAX_OPTION_LEN });
        }
        Ok(())
    }

    /// Appends the option data (names longer than 65,535 bytes are cut; [`NodeHello::check`] first).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&(self.tenants.len().min(u16::MAX as usize) as u16).to_be_bytes());
        for t in self.tenants.iter().take(u16::MAX as usize) {
            let name = &t.name.as_bytes()[..t.name.len().min(u16::MAX as usize)];
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&t.reservation.to_bits().to_be_bytes());
            out.extend_from_slice(&limit_bits(t.limit).to_be_bytes());
            out.extend_from_slice(&t.weight.to_bits().to_be_bytes());
            out.extend_from_slice(&t.local_reservation.to_bits().to_be_bytes());
            out.extend_from_slice(&t.idle_credit.to_be_bytes());
            out.push(match t.split {
                NodeSplit::Spread => 0,
                NodeSplit::Rho => 1,
            });
            out.push(0);
        }
    }

    /// Decodes and validates option data (module comment: invariants 1 and 3, versioning).
    pub fn decode(buf: &[u8]) -> Result<NodeHello, NodeError> {
        let mut r = Reader { buf, at: 0, message: "hello" };
        let version = r.u16("version")?;
        if version == 0 {
            return Err(NodeError::Version(0));
        }
        let flags = r.u16("flags")?;
        if flags != 0 {
            return Err(NodeError::Flags(flags));
        }
        let count = r.u16("tenant_count")? as usize;
        check_count(count)?;
        let mut tenants: Vec<NodeTenant> = Vec::with_capacity(count.min(r.rest() / (3 + TENANT_FIXED_LEN) + 1));
        for i in 0..count {
            let len = r.u16("name_len")? as usize;
            if len == 0 || len > MAX_NODE_NAME_LEN {
                return Err(NodeError::NameLen { tenant: i, len });
            }
            let name = r.take(len, "name")?;
            let name = match std::str::from_utf8(name) {
                Ok(n) if !n.contains('\0') => n,
                _ => return Err(NodeError::NameText { tenant: i }),
            };
            let reservation = r.f64("reservation")?;
            let limit = r.f64("limit")?;
            let weight = r.f64("weight")?;
            let local_reservation = r.f64("local_reservation")?;
            let idle_credit = r.u32("idle_credit")?;
            let split = match r.u8("split")? {
                0 => NodeSplit::Spread,
                1 => NodeSplit::Rho,
                value => return Err(NodeError::Enum { field: "split", value, allowed: "0 (spread), 1 (rho)" }),
            };
            if r.u8("reserved")? != 0 {
                return Err(NodeError::Reserved("a hello tenant"));
            }
            check_number(i, "limit", limit, Rule::PositiveOrInf)?;
            let t = NodeTenant {
                name: name.to_string(),
                reservation,
                limit: limit_from(limit),
                weight,
                local_reservation,
                idle_credit,
                split,
            };
            t.check(i)?;
            if tenants.iter().any(|o| o.name == t.name) {
                return Err(NodeError::Duplicate { tenant: i, name: t.name });
            }
            tenants.push(t);
        }
        if version == 1 && r.rest() > 0 {
            return Err(NodeError::Trailing { message: "hello", bytes: r.rest() });
        }
        Ok(NodeHello { version, tenants })
    }
}

impl NodeWelcome {
    /// Appends the reply data.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&(self.tenants.len().min(u16::MAX as usize) as u16).to_be_bytes());
        for g in self.tenants.iter().take(u16::MAX as usize) {
            out.extend_from_slice(&g.slot.to_be_bytes());
            out.push(match g.source {
                SpecSource::Node => 0,
                SpecSource::Gateway => 1,
            });
            out.extend_from_slice(&[0; 3]);
            out.extend_from_slice(&g.reservation.to_bits().to_be_bytes());
            out.extend_from_slice(&limit_bits(g.limit).to_be_bytes());
            out.extend_from_slice(&g.weight.to_bits().to_be_bytes());
            out.extend_from_slice(&g.local_reservation.to_bits().to_be_bytes());
        }
        if self.version >= 2 {
            out.extend_from_slice(&self.boot.unwrap_or(0).to_be_bytes());
        }
    }

    /// Decodes and validates reply data: version 1..=[`NODE_VERSION`], flags 0, 1..=[`MAX_NODE_TENANTS`]
    /// entries with distinct slots below their count, known sources, zero reserved bytes, valid numbers,
    /// from version 2 a boot identity other than 0, nothing trailing.
    pub fn decode(buf: &[u8]) -> Result<NodeWelcome, NodeError> {
        let mut r = Reader { buf, at: 0, message: "welcome" };
        let version = r.u16("version")?;
        if version == 0 || version > NODE_VERSION {
            return Err(NodeError::Version(version));
        }
        let flags = r.u16("flags")?;
        if flags != 0 {
            return Err(NodeError::Flags(flags));
        }
        let count = r.u16("tenant_count")? as usize;
        check_count(count)?;
        let mut tenants: Vec<NodeGranted> = Vec::with_capacity(count.min(r.rest() / GRANTED_LEN + 1));
        for i in 0..count {
            let slot = r.u32("slot")?;
            if slot as usize >= count || tenants.iter().any(|g| g.slot == slot) {
                return Err(NodeError::Slot { tenant: i, slot, count });
            }
            let source = match r.u8("source")? {
                0 => SpecSource::Node,
                1 => SpecSource::Gateway,
                value => return Err(NodeError::Enum { field: "source", value, allowed: "0 (node), 1 (gateway)" }),
            };
            if r.take(3, "reserved")? != [0; 3] {
                return Err(NodeError::Reserved("a welcome entry"));
            }
            let reservation = r.f64("reservation")?;
            let limit = r.f64("limit")?;
            let weight = r.f64("weight")?;
            let local_reservation = r.f64("local_reservation")?;
            check_number(i, "reservation", reservation, Rule::NonNegative)?;
            check_number(i, "limit", limit, Rule::PositiveOrInf)?;
            check_number(i, "weight", weight, Rule::Positive)?;
            check_number(i, "local_reservation", local_reservation, Rule::NonNegative)?;
            tenants.push(NodeGranted {
                slot,
                source,
                reservation,
                limit: limit_from(limit),
                weight,
                local_reservation,
            });
        }
        let boot = if version >= 2 {
            match r.u64("boot")? {
                0 => return Err(NodeError::BootZero),
                b => Some(b),
            }
        } else {
            None
        };
        if r.rest() > 0 {
            return Err(NodeError::Trailing { message: "welcome", bytes: r.rest() });
        }
        Ok(NodeWelcome { version, tenants, boot })
    }
}

impl NodeTag {
    /// The tag carrying `piggyback` for `slot`.
    pub fn new(slot: u32, piggyback: rein_core::Piggyback) -> NodeTag {
        NodeTag {
            slot,
            share: piggyback.share.raw(),
            delta: piggyback.delta.0,
            rho: piggyback.rho.0,
            pool_busy: piggyback.pool_busy,
        }
    }

    /// The tag from its four wire words (the pool flag taken out of the share word), unchecked.
    pub fn from_words(slot: u32, share_word: u32, delta: u64, rho: u64) -> NodeTag {
        NodeTag { slot, share: share_word & !POOL_BUSY_BIT, delta, rho, pool_busy: share_word & POOL_BUSY_BIT != 0 }
    }

    /// The share word on the wire: the share, with the pool flag in bit 31.
    pub fn share_word(&self) -> u32 {
        self.share | if self.pool_busy { POOL_BUSY_BIT } else { 0 }
    }

    /// Appends the tag.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.slot.to_be_bytes());
        out.extend_from_slice(&self.share_word().to_be_bytes());
        out.extend_from_slice(&self.delta.to_be_bytes());
        out.extend_from_slice(&self.rho.to_be_bytes());
    }

    /// Decodes a tag from the first [`NODE_TAG_LEN`] bytes and checks what it can alone (share, rho; the
    /// slot is the session's to check, [`NodeTag::check_slot`]).
    pub fn decode(buf: &[u8]) -> Result<NodeTag, NodeError> {
        if buf.len() < NODE_TAG_LEN {
            return Err(NodeError::Short { message: "tag", field: "the tag" });
        }
        let tag = NodeTag::from_words(u32_at(buf, 0), u32_at(buf, 4), u64_at(buf, 8), u64_at(buf, 16));
        tag.check_values().map_err(NodeError::Tag)?;
        Ok(tag)
    }

    /// The share and rho rules.
    pub fn check_values(&self) -> Result<(), TagFault> {
        if self.share == 0 || self.share > SHARE_ONE {
            return Err(TagFault::Share(self.share));
        }
        if self.rho > self.delta {
            return Err(TagFault::RhoAboveDelta { rho: self.rho, delta: self.delta });
        }
        Ok(())
    }

    /// The slot rule: below the session's `slots`.
    pub fn check_slot(&self, slots: u32) -> Result<(), TagFault> {
        if self.slot >= slots {
            return Err(TagFault::Slot { slot: self.slot, slots });
        }
        Ok(())
    }

    /// The scheduler's piggyback (`rein_core::Request::piggyback`); the tag must have passed
    /// [`NodeTag::check_values`].
    pub fn piggyback(&self) -> rein_core::Piggyback {
        debug_assert!(self.check_values().is_ok(), "a validated tag");
        let share = ReservationShare::from_ratio(self.share as u64, SHARE_ONE as u64);
        rein_core::Piggyback {
            delta: rein_core::Cost(self.delta),
            rho: rein_core::Cost(self.rho),
            share,
            pool_busy: self.pool_busy,
        }
    }
}

impl NodeReplyTrailer {
    /// The wire value of the phase (0 = none).
    fn phase_byte(&self) -> u8 {
        match self.phase {
            None => 0,
            Some(p) => p.index() as u8 + 1,
        }
    }

    /// Writes the trailer into 16 bytes.
    pub fn write(&self, out: &mut [u8; NODE_REPLY_TRAILER_LEN]) {
        *out = [0; NODE_REPLY_TRAILER_LEN];
        out[0] = self.phase_byte();
        out[8..].copy_from_slice(&self.cost.to_be_bytes());
    }

    /// Appends the trailer.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut t = [0u8; NODE_REPLY_TRAILER_LEN];
        self.write(&mut t);
        out.extend_from_slice(&t);
    }

    /// Decodes a trailer from the first [`NODE_REPLY_TRAILER_LEN`] bytes: a known phase, zero reserved
    /// bytes, no cost without a phase.
    pub fn decode(buf: &[u8]) -> Result<NodeReplyTrailer, NodeError> {
        if buf.len() < NODE_REPLY_TRAILER_LEN {
            return Err(NodeError::Short { message: "reply trailer", field: "the trailer" });
        }
        let phase = match buf[0] {
            0 => None,
            v @ 1..=3 => Some(Phase::ALL[v as usize - 1]),
            value => {
                return Err(NodeError::Enum {
                    field: "phase",
                    value,
                    allowed: "0 (none), 1 (reservation), 2 (weight), 3 (over_limit)",
                })
            }
        };
        if buf[1..8] != [0; 7] {
            return Err(NodeError::Reserved("a reply trailer"));
        }
        let cost = u64_at(buf, 8);
        if phase.is_none() && cost != 0 {
            return Err(NodeError::CostWithoutPhase(cost));
        }
        Ok(NodeReplyTrailer { phase, cost })
    }
}

/// Appends a request on a node session: the header, the tag, then (WRITE) the caller appends the payload.
pub fn encode_node_request(header: &RequestHeader, tag: &NodeTag, out: &mut Vec<u8>) {
    header.encode(out);
    tag.encode(out);
}

/// Decodes a reply on a node session: the simple reply header and the trailer, and the bytes they took
/// (a successful READ's data follows); `None` if more bytes are needed. A structured reply magic is a
/// protocol error here (the session excludes structured replies).
pub fn decode_node_reply(buf: &[u8]) -> Result<Option<(SimpleReply, NodeReplyTrailer, usize)>, ProtoError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let magic = u32_at(buf, 0);
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(ProtoError::BadMagic { expected: SIMPLE_REPLY_MAGIC as u64, found: magic as u64 });
    }
    let len = SIMPLE_REPLY_LEN + NODE_REPLY_TRAILER_LEN;
    if buf.len() < len {
        return Ok(None);
    }
    let reply = SimpleReply { error: u32_at(buf, 4), handle: u64_at(buf, 8) };
    let trailer = NodeReplyTrailer::decode(&buf[SIMPLE_REPLY_LEN..])?;
    Ok(Some((reply, trailer, len)))
}

/// Appends a block-status payload (module comment, "Versioning"): the byte count, then `descriptors`
/// (length, flags), at most [`MAX_EXTENTS`] of them (more are left out).
pub fn encode_node_extents(descriptors: &[(u32, u32)], out: &mut Vec<u8>) {
    let descriptors = &descriptors[..descriptors.len().min(MAX_EXTENTS)];
    out.extend_from_slice(&(8 * descriptors.len() as u32).to_be_bytes());
    for (len, flags) in descriptors {
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    }
}

/// The bytes of the block-status payload at the start of `buf` (what follows a successful BLOCK_STATUS
/// reply's trailer on a v4 session): `None` until its count is there; the count is judged before its
/// bytes are awaited, so a node cannot make the gateway wait for or buffer more than
/// [`NODE_EXTENTS_MAX_LEN`] bytes.
pub fn node_extents_len(buf: &[u8]) -> Result<Option<usize>, NodeError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let count = u32_at(buf, 0);
    if count == 0 || !count.is_multiple_of(8) || count as usize > 8 * MAX_EXTENTS {
        return Err(NodeError::ExtentsLen(count));
    }
    Ok(Some(4 + count as usize))
}

/// Decodes a whole block-status payload (count, descriptors, nothing after) for a request of `length`
/// bytes: 1..=[`MAX_EXTENTS`] descriptors, each at least one byte, only the hole and zero flags, together
/// at most `length` bytes.
pub fn decode_node_extents(payload: &[u8], length: u32) -> Result<Vec<(u32, u32)>, NodeError> {
    let Some(n) = node_extents_len(payload)? else {
        return Err(NodeError::Short { message: "block status payload", field: "the byte count" });
    };
    if payload.len() < n {
        return Err(NodeError::Short { message: "block status payload", field: "a descriptor" });
    }
    if payload.len() > n {
        return Err(NodeError::Trailing { message: "block status payload", bytes: payload.len() - n });
    }
    let mut out = Vec::with_capacity((n - 4) / 8);
    let mut covered = 0u64;
    for (index, d) in payload[4..n].chunks_exact(8).enumerate() {
        let (len, flags) = (u32_at(d, 0), u32_at(d, 4));
        if len == 0 {
            return Err(NodeError::ExtentEmpty(index));
        }
        if flags & !(STATE_HOLE | STATE_ZERO) != 0 {
            return Err(NodeError::ExtentFlags { index, flags });
        }
        covered += u64::from(len);
        if covered > u64::from(length) {
            return Err(NodeError::ExtentsBeyond { covered, length });
        }
        out.push((len, flags));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// v4's block-status payload: byte-exact, round-trips, and every malformed one is named.
    #[test]
    fn block_status_payload_round_trips_and_is_bounded() {
        let mut out = Vec::new();
        encode_node_extents(&[(4096, STATE_HOLE | STATE_ZERO), (512, 0)], &mut out);
        assert_eq!(out, [0, 0, 0, 16, 0, 0, 16, 0, 0, 0, 0, 3, 0, 0, 2, 0, 0, 0, 0, 0]);
        assert_eq!(node_extents_len(&out[..3]), Ok(None));
        assert_eq!(node_extents_len(&out), Ok(Some(20)));
        assert_eq!(decode_node_extents(&out, 4608), Ok(vec![(4096, 3), (512, 0)]));
        assert_eq!(decode_node_extents(&out, 4607), Err(NodeError::ExtentsBeyond { covered: 4608, length: 4607 }));
        assert!(matches!(decode_node_extents(&out[..19], 5000), Err(NodeError::Short { .. })));
        let mut long = out.clone();
        long.push(0);
        assert!(matches!(decode_node_extents(&long, 5000), Err(NodeError::Trailing { bytes: 1, .. })));
        for bad in [0u32, 12, 8 * MAX_EXTENTS as u32 + 8, u32::MAX] {
            assert_eq!(node_extents_len(&bad.to_be_bytes()), Err(NodeError::ExtentsLen(bad)), "count {bad}");
        }
        let mut zero = Vec::new();
        encode_node_extents(&[(0, 0)], &mut zero);
        assert_eq!(decode_node_extents(&zero, 10), Err(NodeError::ExtentEmpty(0)));
        let mut flags = Vec::new();
        encode_node_extents(&[(1, 0), (1, 4)], &mut flags);
        assert_eq!(decode_node_extents(&flags, 10), Err(NodeError::ExtentFlags { index: 1, flags: 4 }));
        // The most an encoder writes is the most a decoder takes.
        let many = vec![(1u32, 0u32); MAX_EXTENTS + 5];
        let mut most = Vec::new();
        encode_node_extents(&many, &mut most);
        assert_eq!(most.len(), NODE_EXTENTS_MAX_LEN);
        assert_eq!(decode_node_extents(&most, u32::MAX).map(|d| d.len()), Ok(MAX_EXTENTS));
    }

    fn tenant(name: &str) -> NodeTenant {
        NodeTenant {
            name: name.into(),
            reservation: 100.0,
            limit: Some(500.0),
            weight: 2.0,
            local_reservation: 10.0,
            idle_credit: 3,
            split: NodeSplit::Rho,
        }
    }

    #[test]
    fn hello_is_byte_exact() {
        let mut out = Vec::new();
        NodeHello::new(vec![NodeTenant { limit: None, ..tenant("ab") }]).encode(&mut out);
        let mut want = vec![0, 4, 0, 0, 0, 1, 0, 2, b'a', b'b'];
        for v in [100.0f64, f64::INFINITY, 2.0, 10.0] {
            want.extend_from_slice(&v.to_bits().to_be_bytes());
        }
        want.extend_from_slice(&[0, 0, 0, 3, 1, 0]);
        assert_eq!(out, want);
        assert_eq!(out.len(), NodeHello::new(vec![tenant("ab")]).encoded_len());
    }

    /// v2 appends the boot identity after the last entry; v1 has none and refuses trailing bytes; a v2
    /// welcome without one (or with 0) is refused.
    #[test]
    fn welcome_v2_carries_the_boot_identity() {
        let entry = NodeGranted {
            slot: 0,
            source: SpecSource::Gateway,
            reservation: 1.0,
            limit: None,
            weight: 1.0,
            local_reservation: 0.0,
        };
        let v1 = NodeWelcome { version: 1, tenants: vec![entry.clone()], boot: None };
        let v2 = NodeWelcome { version: 2, tenants: vec![entry], boot: Some(0x0102_0304_0506_0708) };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        v1.encode(&mut a);
        v2.encode(&mut b);
        assert_eq!(b.len(), a.len() + 8);
        assert_eq!(b[a.len()..], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b[2..a.len()], a[2..], "v2 begins with v1's layout");
        assert_eq!(NodeWelcome::decode(&a), Ok(v1));
        assert_eq!(NodeWelcome::decode(&b), Ok(v2));
        let mut v1_trailing = a.clone();
        v1_trailing.extend_from_slice(&[1; 8]);
        assert!(matches!(NodeWelcome::decode(&v1_trailing), Err(NodeError::Trailing { .. })));
        assert!(NodeWelcome::decode(&b[..b.len() - 1]).is_err(), "a v2 welcome cut short");
        let mut zero = b.clone();
        let n = zero.len();
        zero[n - 8..].fill(0);
        assert_eq!(NodeWelcome::decode(&zero), Err(NodeError::BootZero));
    }

    #[test]
    fn share_bounds() {
        let tag = |share| NodeTag { slot: 0, share, delta: 5, rho: 5, pool_busy: false };
        assert_eq!(tag(0).check_values(), Err(TagFault::Share(0)));
        assert_eq!(tag(1).check_values(), Ok(()));
        assert_eq!(tag(65536).check_values(), Ok(()));
        assert_eq!(tag(65537).check_values(), Err(TagFault::Share(65537)));
        assert_eq!(tag(65536).piggyback().share, ReservationShare::ONE);
        assert_eq!(tag(1).piggyback().share, ReservationShare::MIN);
        let over = NodeTag { rho: 6, ..tag(1) };
        assert_eq!(over.check_values(), Err(TagFault::RhoAboveDelta { rho: 6, delta: 5 }));
    }
}
