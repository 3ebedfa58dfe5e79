//! PARDA's latency-aggregation record (parda.txt §4.2) as a fixed-size block, encode/decode without IO.
//!
//! Every transport carries the same 64-byte record: a UDP datagram is exactly one record; in the shared
//! file each host owns one [`SLOT_BYTES`]-byte slot (sector aligned, so one host's write can never tear
//! another's) whose first 64 bytes are its record and the rest zero.
//!
//! # Layout (little endian)
//! ```text
//! offset size field
//!      0    4 magic       "RPDA" (0x41445052 as u32 LE)
//!      4    2 version     1
//!      6    2 length      64 (the record's size: later versions may grow it)
//!      8    4 host        host id, < rein_core::parda::MAX_HOSTS
//!     12    4 reserved    0
//!     16    8 epoch       the host's incarnation
//!     24    8 seq         report sequence number (>= 1)
//!     32    8 timestamp   sender's clock, ns (diagnostics only)
//!     40    8 latency_ns  the host's eq. (1) estimate
//!     48    8 ios         IOs completed in the period
//!     56    4 reserved    0
//!     60    4 crc32       CRC-32 (IEEE) of bytes 0..60
//! ```
//!
//! # Signed records (beyond the paper)
//! With a key shared by the hosts (`[parda_host] key_file`), every record carries an authentication tag:
//! a datagram is the record followed by [`TAG_BYTES`] bytes of tag ([`SIGNED_BYTES`] in all), and in the
//! shared file the tag follows the record in its slot (bytes 64..96, the rest zero). The tag is computed
//! by a [`RecordAuth`] (rein-runtime's HMAC-SHA-256 under the key): this crate places and compares tags
//! (in constant time) and stays free of cryptography. Without a tag a UDP record is believed on its
//! sender's address alone, which anyone on the path can forge. A host with a key refuses unsigned
//! records and records whose tag does not match; a host without one refuses signed records (a
//! misconfigured cluster is named, not half-working).
//!
//! # What decoding guarantees
//! Every byte is covered: the CRC covers bytes 0..60 and reserved fields must be zero, so any single-bit
//! flip anywhere in the record (checksum included) is reported as an error, and so is any burst of up to
//! 32 flipped bits (CRC-32 detects those). A torn write (part old, part new record) fails the CRC. A
//! never-written slot (all zero) decodes as [`Slot::Empty`], not an error. Input of the wrong size is an
//! error naming the size. Decoding never panics (a proptest feeds it random bytes).

use rein_core::parda::{HostReport, MAX_HOSTS};
use rein_core::Nanos;

/// Bytes in one record.
pub const RECORD_BYTES: usize = 64;
/// Bytes per host in the shared file (one sector).
pub const SLOT_BYTES: usize = 512;
/// The record's magic, "RPDA" in little-endian byte order.
pub const MAGIC: u32 = u32::from_le_bytes(*b"RPDA");
/// The record format this build writes and reads.
pub const VERSION: u16 = 1;

/// Why bytes are not a valid record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The input is not one record (or one slot) long.
    #[error("record is {got} bytes, expected {want}")]
    Size {
        /// Bytes given.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
    /// The first four bytes are not [`MAGIC`].
    #[error("bad magic {0:#010x} (not a PARDA record)")]
    Magic(u32),
    /// A version other than [`VERSION`] (with a valid checksum).
    #[error("unsupported record version {0} (this build reads version {VERSION})")]
    Version(u16),
    /// A length field other than [`RECORD_BYTES`].
    #[error("record length field {0}, expected {RECORD_BYTES}")]
    Length(u16),
    /// The CRC does not match: a torn write or corruption.
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): torn or corrupt record")]
    Checksum {
        /// The CRC in the record.
        stored: u32,
        /// The CRC of its bytes.
        computed: u32,
    },
    /// Reserved bytes are not zero.
    #[error("reserved bytes are not zero")]
    Reserved,
    /// A host id at or above `MAX_HOSTS`.
    #[error("host id {0} out of range (at most {MAX_HOSTS} hosts)")]
    Host(u32),
    /// Sequence number 0, which senders never use.
    #[error("sequence number 0 is never sent")]
    Seq,
    /// Non-zero bytes after the record (and its tag) in a slot.
    #[error("slot padding after the record is not zero")]
    Padding,
    /// A record without a tag where the host requires signed records.
    #[error("a record without an authentication tag, but this host requires signed records (key_file)")]
    Unsigned,
    /// A signed record where the host has no key.
    #[error("a signed record, but this host has no key to check it (key_file)")]
    Signed,
    /// The tag does not match the record under this host's key.
    #[error("authentication tag mismatch: signed with another key, or forged")]
    Tag,
}

/// Bytes of a record's authentication tag (HMAC-SHA-256 in rein-runtime).
pub const TAG_BYTES: usize = 32;
/// Bytes of a signed record as a datagram: the record, then its tag.
pub const SIGNED_BYTES: usize = RECORD_BYTES + TAG_BYTES;

/// Computes a record's authentication tag under the hosts' shared key (module comment, "Signed
/// records"). rein-runtime's implementation is HMAC-SHA-256.
pub trait RecordAuth {
    /// The tag of `record` (its 64 bytes as encoded).
    fn tag(&self, record: &[u8; RECORD_BYTES]) -> [u8; TAG_BYTES];
}

/// Whether `tag` is `record`'s under `auth`, compared in constant time (no early exit on the first
/// differing byte, which would tell a forger how much of a guess is right).
fn tag_matches(auth: &dyn RecordAuth, record: &[u8], tag: &[u8]) -> bool {
    let record: &[u8; RECORD_BYTES] = record.try_into().expect("callers pass one record");
    let want = auth.tag(record);
    let diff = want.iter().zip(tag).fold(0u8, |acc, (a, b)| std::hint::black_box(acc | (a ^ b)));
    tag.len() == TAG_BYTES && diff == 0
}

/// Encodes a report as a signed record: the record, then its tag.
pub fn encode_signed(r: &HostReport, auth: &dyn RecordAuth) -> [u8; SIGNED_BYTES] {
    let rec = encode(r);
    let mut b = [0u8; SIGNED_BYTES];
    b[..RECORD_BYTES].copy_from_slice(&rec);
    b[RECORD_BYTES..].copy_from_slice(&auth.tag(&rec));
    b
}

/// Encodes a report as one datagram: with `auth`, a signed record ([`SIGNED_BYTES`]); without, a plain
/// one ([`RECORD_BYTES`]). What [`decode_datagram`] reads with the same `auth`.
pub fn encode_datagram(r: &HostReport, auth: Option<&dyn RecordAuth>) -> Vec<u8> {
    match auth {
        Some(auth) => encode_signed(r, auth).to_vec(),
        None => encode(r).to_vec(),
    }
}

/// Decodes one datagram: with `auth`, a signed record whose tag matches (checked before any field is
/// read); without, a plain record.
pub fn decode_datagram(b: &[u8], auth: Option<&dyn RecordAuth>) -> Result<HostReport, RecordError> {
    match auth {
        Some(auth) => {
            if b.len() == RECORD_BYTES && decode(b).is_ok() {
                return Err(RecordError::Unsigned);
            }
            if b.len() != SIGNED_BYTES {
                return Err(RecordError::Size { got: b.len(), want: SIGNED_BYTES });
            }
            if !tag_matches(auth, &b[..RECORD_BYTES], &b[RECORD_BYTES..]) {
                return Err(RecordError::Tag);
            }
            decode(&b[..RECORD_BYTES])
        }
        None => {
            if b.len() == SIGNED_BYTES && decode(&b[..RECORD_BYTES]).is_ok() {
                return Err(RecordError::Signed);
            }
            decode(b)
        }
    }
}

/// Encodes a report as a record.
pub fn encode(r: &HostReport) -> [u8; RECORD_BYTES] {
    assert!(r.host < MAX_HOSTS, "host ids are validated by rein-core (HostConfig::validate)");
    let mut b = [0u8; RECORD_BYTES];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..6].copy_from_slice(&VERSION.to_le_bytes());
    b[6..8].copy_from_slice(&(RECORD_BYTES as u16).to_le_bytes());
    b[8..12].copy_from_slice(&r.host.to_le_bytes());
    b[16..24].copy_from_slice(&r.epoch.to_le_bytes());
    b[24..32].copy_from_slice(&r.seq.to_le_bytes());
    b[32..40].copy_from_slice(&r.timestamp.0.to_le_bytes());
    b[40..48].copy_from_slice(&r.latency_ns.to_le_bytes());
    b[48..56].copy_from_slice(&r.ios.to_le_bytes());
    let crc = crc32fast::hash(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// Decodes exactly one record (a datagram).
pub fn decode(b: &[u8]) -> Result<HostReport, RecordError> {
    if b.len() != RECORD_BYTES {
        return Err(RecordError::Size { got: b.len(), want: RECORD_BYTES });
    }
    let magic = u32_at(b, 0);
    if magic != MAGIC {
        return Err(RecordError::Magic(magic));
    }
    // The checksum first: a flipped bit in the version or length is corruption, not a future format.
    let stored = u32_at(b, 60);
    let computed = crc32fast::hash(&b[..60]);
    if stored != computed {
        return Err(RecordError::Checksum { stored, computed });
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != VERSION {
        return Err(RecordError::Version(version));
    }
    let len = u16::from_le_bytes([b[6], b[7]]);
    if len as usize != RECORD_BYTES {
        return Err(RecordError::Length(len));
    }
    if u32_at(b, 12) != 0 || u32_at(b, 56) != 0 {
        return Err(RecordError::Reserved);
    }
    let host = u32_at(b, 8);
    if host >= MAX_HOSTS {
        return Err(RecordError::Host(host));
    }
    let seq = u64_at(b, 24);
    if seq == 0 {
        return Err(RecordError::Seq);
    }
    Ok(HostReport {
        host,
        epoch: u64_at(b, 16),
        seq,
        timestamp: Nanos(u64_at(b, 32)),
        latency_ns: u64_at(b, 40),
        ios: u64_at(b, 48),
    })
}

/// A slot of the shared file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// Never written (all zero).
    Empty,
    /// A host's latest report.
    Record(HostReport),
}

/// Encodes a report into a whole slot (record, then zero padding).
pub fn encode_slot(r: &HostReport) -> [u8; SLOT_BYTES] {
    encode_slot_with(r, None)
}

/// Encodes a report into a whole slot: the record, with `auth` its tag, then zero padding.
pub fn encode_slot_with(r: &HostReport, auth: Option<&dyn RecordAuth>) -> [u8; SLOT_BYTES] {
    let mut s = [0u8; SLOT_BYTES];
    match auth {
        Some(auth) => s[..SIGNED_BYTES].copy_from_slice(&encode_signed(r, auth)),
        None => s[..RECORD_BYTES].copy_from_slice(&encode(r)),
    }
    s
}

/// Decodes one slot of the shared file.
pub fn decode_slot(s: &[u8]) -> Result<Slot, RecordError> {
    decode_slot_with(s, None)
}

/// Decodes one slot of the shared file: with `auth`, a signed record whose tag matches; without, a
/// plain one.
pub fn decode_slot_with(s: &[u8], auth: Option<&dyn RecordAuth>) -> Result<Slot, RecordError> {
    if s.len() != SLOT_BYTES {
        return Err(RecordError::Size { got: s.len(), want: SLOT_BYTES });
    }
    if s.iter().all(|&x| x == 0) {
        return Ok(Slot::Empty);
    }
    let tagged = s[RECORD_BYTES..SIGNED_BYTES].iter().any(|&x| x != 0);
    let r = match auth {
        Some(auth) => {
            if !tagged && decode(&s[..RECORD_BYTES]).is_ok() {
                return Err(RecordError::Unsigned);
            }
            if !tag_matches(auth, &s[..RECORD_BYTES], &s[RECORD_BYTES..SIGNED_BYTES]) {
                return Err(RecordError::Tag);
            }
            decode(&s[..RECORD_BYTES])?
        }
        None => {
            let r = decode(&s[..RECORD_BYTES])?;
            if tagged && s[SIGNED_BYTES..].iter().all(|&x| x == 0) {
                return Err(RecordError::Signed);
            }
            r
        }
    };
    let end = if auth.is_some() { SIGNED_BYTES } else { RECORD_BYTES };
    if s[end..].iter().any(|&x| x != 0) {
        return Err(RecordError::Padding);
    }
    Ok(Slot::Record(r))
}

/// Byte offset of `host`'s slot in the shared file.
pub fn slot_offset(host: u32) -> u64 {
    host as u64 * SLOT_BYTES as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HostReport {
        HostReport {
            host: 3,
            epoch: 0xDEAD_BEEF,
            seq: 42,
            timestamp: Nanos(123_456_789),
            latency_ns: 31_000_000,
            ios: 6_700,
        }
    }

    #[test]
    fn round_trip() {
        let r = sample();
        assert_eq!(decode(&encode(&r)).unwrap(), r);
        assert_eq!(decode_slot(&encode_slot(&r)).unwrap(), Slot::Record(r));
        assert_eq!(decode_slot(&[0u8; SLOT_BYTES]).unwrap(), Slot::Empty);
        let max = HostReport {
            host: MAX_HOSTS - 1,
            epoch: u64::MAX,
            seq: u64::MAX,
            timestamp: Nanos::MAX,
            latency_ns: u64::MAX,
            ios: u64::MAX,
        };
        assert_eq!(decode(&encode(&max)).unwrap(), max);
        assert_eq!(&encode(&r)[0..4], b"RPDA");
        assert_eq!(slot_offset(3), 1536);
    }

    #[test]
    fn clear_errors() {
        let r = sample();
        let e = decode(&encode(&r)[..63]).unwrap_err();
        assert_eq!(e, RecordError::Size { got: 63, want: 64 });
        assert!(e.to_string().contains("63 bytes, expected 64"));
        let mut long = encode(&r).to_vec();
        long.push(0);
        assert!(matches!(decode(&long), Err(RecordError::Size { got: 65, .. })));
        assert!(matches!(decode(&[0u8; 64]), Err(RecordError::Magic(0))));
        let mut b = encode(&r);
        b[45] ^= 0x10;
        assert!(decode(&b).unwrap_err().to_string().contains("torn or corrupt"));
        // Valid checksum over bad fields: still refused, naming the field.
        let reseal = |mut b: [u8; 64]| {
            let crc = crc32fast::hash(&b[..60]);
            b[60..64].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut b = encode(&r);
        b[4] = 9;
        assert_eq!(decode(&reseal(b)), Err(RecordError::Version(9)));
        let mut b = encode(&r);
        b[6] = 128;
        assert_eq!(decode(&reseal(b)), Err(RecordError::Length(128)));
        let mut b = encode(&r);
        b[13] = 1;
        assert_eq!(decode(&reseal(b)), Err(RecordError::Reserved));
        let mut b = encode(&r);
        b[8..12].copy_from_slice(&MAX_HOSTS.to_le_bytes());
        assert_eq!(decode(&reseal(b)), Err(RecordError::Host(MAX_HOSTS)));
        let mut b = encode(&r);
        b[24..32].fill(0);
        assert_eq!(decode(&reseal(b)), Err(RecordError::Seq));
        let mut s = encode_slot(&r);
        s[300] = 1;
        assert_eq!(decode_slot(&s), Err(RecordError::Padding));
        assert!(matches!(decode_slot(&s[..511]), Err(RecordError::Size { got: 511, want: 512 })));
    }

    #[test]
    fn a_torn_write_is_detected() {
        // First half of a new record over the second half of an old one.
        let old = encode(&sample());
        let new = encode(&HostReport { seq: 43, latency_ns: 29_000_000, ios: 7_000, ..sample() });
        let mut torn = old;
        torn[..32].copy_from_slice(&new[..32]);
        assert!(matches!(decode(&torn), Err(RecordError::Checksum { .. })));
        let mut torn = new;
        torn[..32].copy_from_slice(&old[..32]);
        assert!(matches!(decode(&torn), Err(RecordError::Checksum { .. })));
    }
    /// A stand-in for the runtime's HMAC: SipHash keyed by the test's byte, enough to place and compare
    /// tags (a CRC would not do: it is linear, so a record with its checksum fixed keeps its tag).
    struct TestAuth(u8);
    impl RecordAuth for TestAuth {
        fn tag(&self, record: &[u8; RECORD_BYTES]) -> [u8; TAG_BYTES] {
            use std::hash::{Hash, Hasher};
            let mut t = [0u8; TAG_BYTES];
            for (i, c) in t.chunks_exact_mut(8).enumerate() {
                let mut h = std::hash::DefaultHasher::new();
                (self.0, i as u8, record).hash(&mut h);
                c.copy_from_slice(&h.finish().to_le_bytes());
            }
            t
        }
    }

    #[test]
    fn signed_records_round_trip_and_every_mismatch_is_named() {
        let r = sample();
        let (k, other) = (TestAuth(1), TestAuth(2));
        let d = encode_signed(&r, &k);
        assert_eq!(d.len(), SIGNED_BYTES);
        assert_eq!(decode_datagram(&d, Some(&k)), Ok(r));
        assert_eq!(encode_datagram(&r, Some(&k)), d.to_vec());
        assert_eq!(encode_datagram(&r, None), encode(&r).to_vec());
        assert_eq!(decode_datagram(&encode(&r), None), Ok(r));
        // Another key, no key, no tag.
        assert_eq!(decode_datagram(&d, Some(&other)), Err(RecordError::Tag));
        assert_eq!(decode_datagram(&d, None), Err(RecordError::Signed));
        assert_eq!(decode_datagram(&encode(&r), Some(&k)), Err(RecordError::Unsigned));
        assert!(RecordError::Unsigned.to_string().contains("key_file"));
        // Any flipped bit of the record or its tag is refused.
        for i in 0..SIGNED_BYTES {
            let mut b = d;
            b[i] ^= 0x01;
            assert!(decode_datagram(&b, Some(&k)).is_err(), "byte {i}");
        }
        // A signed record with its checksum fixed after a change (a forger's first try) fails the tag.
        let mut b = d;
        b[40] ^= 0x80;
        let crc = crc32fast::hash(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_datagram(&b, Some(&k)), Err(RecordError::Tag));
        assert!(matches!(decode_datagram(&d[..95], Some(&k)), Err(RecordError::Size { got: 95, want: 96 })));
        // Slots: the tag follows the record.
        let s = encode_slot_with(&r, Some(&k));
        assert_eq!(s[..SIGNED_BYTES], d[..]);
        assert_eq!(decode_slot_with(&s, Some(&k)), Ok(Slot::Record(r)));
        assert_eq!(decode_slot_with(&s, Some(&other)), Err(RecordError::Tag));
        assert_eq!(decode_slot_with(&s, None), Err(RecordError::Signed));
        assert_eq!(decode_slot_with(&encode_slot(&r), Some(&k)), Err(RecordError::Unsigned));
        assert_eq!(decode_slot_with(&[0u8; SLOT_BYTES], Some(&k)), Ok(Slot::Empty));
        let mut p = s;
        p[SIGNED_BYTES] = 1;
        assert_eq!(decode_slot_with(&p, Some(&k)), Err(RecordError::Padding));
        let mut t = s;
        t[70] ^= 4;
        assert_eq!(decode_slot_with(&t, Some(&k)), Err(RecordError::Tag));
    }
}
