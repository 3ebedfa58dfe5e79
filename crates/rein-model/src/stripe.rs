//! The stripe layout of a gateway volume over storage nodes: which node byte holds each volume byte.
//!
//! # Model
//! A volume is cut into units of `U` bytes. A round holds `W = w_0 + ... + w_{n-1}` consecutive units:
//! the first `w_0` go to node 0, the next `w_1` to node 1, and so on (nodes in config order; a node of
//! width 0 is not used). On each node the units of successive rounds follow one another, so node `j`
//! holds `w_j` units per round, contiguously.
//!
//! For a volume offset `o`: unit `u = o / U`, round `r = u / W`, position `p = u % W`; node `j` is the
//! one whose cumulative width range `[c_j, c_j + w_j)` holds `p`; its offset is
//! `(r * w_j + (p - c_j)) * U + o % U`. A volume of `size` bytes needs
//! `ceil(size / (W U)) * w_j * U` bytes on node `j` ([`Stripe::node_bytes`]).
//!
//! Worked example: `U` = 64 KiB, widths `[1, 2]` (W = 3). Volume bytes 0..64K go to node 0 at 0,
//! 64K..192K to node 1 at 0..128K, 192K..256K to node 0 at 64K..128K.
//!
//! # Invariants (proptested below)
//! 1. Every byte of `map(offset, len)` lands on exactly one node byte, and distinct volume bytes on
//!    distinct node bytes (the map is a bijection onto the node pieces).
//! 2. Pieces come in volume order, each within one unit, with no gap: their lengths sum to `len`.
//! 3. Each piece lies within [`Stripe::node_bytes`] of its node when the request lies within the volume.
//! 4. A request's bytes on one node are one contiguous node range (node `j`'s units follow one another
//!    in volume order), so [`Stripe::node_ranges`] gives at most one range per node: the merge of that
//!    node's pieces. For commands without a payload (TRIM, WRITE_ZEROES) a request of any size is then one
//!    node request per node, not one per unit.
//!
//! 5. [`Stripe::volume_extents`] (block status through a gateway) describes a volume byte with the
//!    flags its node byte has in its node's answer, and describes exactly the volume bytes from the
//!    request's offset up to the first whose node byte the node's answer does not cover: a node that
//!    answered less than its range (or nothing) cuts the answer there, and a hole is reported only where
//!    the node reported one.
//! 6. The map does not depend on the volume's size (none enters [`Stripe::locate`] or [`Stripe::map`]):
//!    a volume grown keeps every byte where it was, [`Stripe::node_bytes`] grows with the size, and on
//!    each node the bytes past the old end land after the old bytes there (node `j`'s units follow one
//!    another in volume order). A gateway reload grows a volume in place by it (gateway.rs, "Reload").
//!
//! # Symbol map
//! `U` -> `unit`, `w_j` -> `widths[j]`, `W` -> `round_units`, `c_j` -> `starts[j]`.
//!
//! # Deviations
//! None from the node-protocol contract. [`Stripe::map`]'s pieces are not merged across units even when
//! consecutive units land on the same node (width > 1): a READ or WRITE is split at every unit boundary,
//! so a piece (and its payload copy) is at most `U` bytes. Payload-free commands use
//! [`Stripe::node_ranges`] (invariant 4).

/// A validated stripe layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stripe {
    unit: u64,
    widths: Vec<u32>,
    /// `starts[j]` = sum of `widths[..j]`.
    starts: Vec<u64>,
    /// For each position in a round, the node holding it.
    owner: Vec<u32>,
    round_units: u64,
}

/// Most stripe units in one round (the sum of the widths): bounds the layout's lookup table.
pub const MAX_ROUND_UNITS: u64 = 4096;

/// Why a layout is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StripeError {
    /// The unit is zero.
    #[error("stripe unit must be at least 1 byte")]
    ZeroUnit,
    /// No node has a positive width.
    #[error("widths must include at least one node with width >= 1")]
    NoWidth,
    /// The widths sum past [`MAX_ROUND_UNITS`].
    #[error("widths sum to {0}, more than the maximum {MAX_ROUND_UNITS} units per round")]
    TooWide(u64),
}

/// One node's part of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The node's index (config order).
    pub node: usize,
    /// Byte offset on the node.
    pub node_offset: u64,
    /// Byte offset of the piece's first byte within the request (0 for the first piece).
    pub request_offset: u64,
    /// Bytes.
    pub len: u32,
}

impl Stripe {
    /// A layout of `unit`-byte units with `widths[j]` units per round on node `j`.
    pub fn new(unit: u64, widths: &[u32]) -> Result<Stripe, StripeError> {
        if unit == 0 {
            return Err(StripeError::ZeroUnit);
        }
        let round_units: u64 = widths.iter().map(|&w| u64::from(w)).sum();
        if round_units == 0 {
            return Err(StripeError::NoWidth);
        }
        if round_units > MAX_ROUND_UNITS {
            return Err(StripeError::TooWide(round_units));
        }
        let mut starts = Vec::with_capacity(widths.len());
        let mut owner = Vec::with_capacity(round_units as usize);
        let mut c = 0;
        for (j, &w) in widths.iter().enumerate() {
            starts.push(c);
            c += u64::from(w);
            owner.extend(std::iter::repeat_n(j as u32, w as usize));
        }
        Ok(Stripe { unit, widths: widths.to_vec(), starts, owner, round_units })
    }

    /// Bytes per unit.
    pub fn unit(&self) -> u64 {
        self.unit
    }

    /// The nodes (including those of width 0).
    pub fn nodes(&self) -> usize {
        self.widths.len()
    }

    /// The widths, one per node (width 0 for a node not used).
    pub fn widths(&self) -> &[u32] {
        &self.widths
    }

    /// Whether `other` lays volume bytes out where this one does: the same unit and widths, but for nodes
    /// of width 0 at the end (a list of nodes that grew).
    pub fn same_layout(&self, other: &Stripe) -> bool {
        let used = |s: &Stripe| {
            let n = s.widths.iter().rposition(|&w| w > 0).map_or(0, |j| j + 1);
            (s.unit, s.widths[..n].to_vec())
        };
        used(self) == used(other)
    }

    /// This layout over a list of `nodes` nodes in which node `j` of this one is at `place[j]` (a
    /// gateway's reload: the nodes of gw.toml in the places the gateway runs them). The layout is the
    /// same (node `j`'s bytes are `place[j]`'s) exactly when the nodes used keep their order; `None` when
    /// they do not (the units of a round would go to them in another order: another layout).
    pub fn placed(&self, place: &[usize], nodes: usize) -> Option<Stripe> {
        assert_eq!(place.len(), self.widths.len(), "a place for every node");
        let mut widths = vec![0; nodes];
        let mut last = None;
        for (j, &w) in self.widths.iter().enumerate().filter(|&(_, &w)| w > 0) {
            if last.is_some_and(|l| place[j] <= l) {
                return None;
            }
            last = Some(place[j]);
            widths[place[j]] = w;
        }
        Some(Stripe::new(self.unit, &widths).expect("the same widths"))
    }

    /// Whether node `j` holds any unit.
    pub fn uses(&self, node: usize) -> bool {
        self.widths.get(node).is_some_and(|&w| w > 0)
    }

    /// Bytes node `node` must hold for a volume of `size` bytes: `ceil(size / (W U)) * w_j * U`.
    pub fn node_bytes(&self, node: usize, size: u64) -> u64 {
        let round_bytes = self.round_units * self.unit;
        size.div_ceil(round_bytes) * u64::from(self.widths[node]) * self.unit
    }

    /// Where volume byte `offset` lives: (node, node offset).
    pub fn locate(&self, offset: u64) -> (usize, u64) {
        let u = offset / self.unit;
        let (r, p) = (u / self.round_units, u % self.round_units);
        let j = self.owner[p as usize] as usize;
        let node_unit = r * u64::from(self.widths[j]) + (p - self.starts[j]);
        (j, node_unit * self.unit + offset % self.unit)
    }

    /// Calls `f` with each piece of the request `[offset, offset + len)`, in volume order (invariant 2).
    /// No allocation.
    pub fn for_each_piece(&self, offset: u64, len: u32, mut f: impl FnMut(Piece)) {
        let mut done: u64 = 0;
        while done < u64::from(len) {
            let at = offset + done;
            let (node, node_offset) = self.locate(at);
            let in_unit = self.unit - at % self.unit;
            let n = in_unit.min(u64::from(len) - done);
            f(Piece { node, node_offset, request_offset: done, len: n as u32 });
            done += n;
        }
    }

    /// Bytes of node `j` that lie in volume bytes `[0, x)`: the node offset where volume byte `x` (or the
    /// first of node `j`'s bytes after it) would be.
    fn node_prefix(&self, j: usize, x: u64) -> u64 {
        let (u, within) = (x / self.unit, x % self.unit);
        let (r, p) = (u / self.round_units, u % self.round_units);
        let (start, w) = (self.starts[j], u64::from(self.widths[j]));
        let in_round = if p < start {
            0
        } else if p < start + w {
            (p - start) * self.unit + within
        } else {
            w * self.unit
        };
        r * w * self.unit + in_round
    }

    /// Each node's part of the request `[offset, offset + len)` as one contiguous node range (invariant
    /// 4): `(node, node_offset, len)` for every node with a byte in it, in node order.
    pub fn node_ranges(&self, offset: u64, len: u32) -> Vec<(usize, u64, u32)> {
        let end = offset + u64::from(len);
        (0..self.widths.len())
            .filter_map(|j| {
                let (a, b) = (self.node_prefix(j, offset), self.node_prefix(j, end));
                (b > a).then(|| (j, a, (b - a) as u32))
            })
            .collect()
    }

    /// The pieces of the request `[offset, offset + len)`, in volume order.
    pub fn map(&self, offset: u64, len: u32) -> Vec<Piece> {
        let mut v = Vec::new();
        self.for_each_piece(offset, len, |p| v.push(p));
        v
    }

    /// Maps the nodes' block status back to the volume (invariant 5). `answers[j]` is node `j`'s
    /// descriptors (length, flags) from the start of its range in [`Stripe::node_ranges`]`(offset, len)`,
    /// consecutive, covering a prefix of it (empty: nothing known). Calls `push(len, flags)` with
    /// consecutive volume ranges from `offset`, neighbours with equal flags merged, up to the first volume
    /// byte its node's descriptors do not cover (or `offset + len`); stops once `push` returns false. The
    /// work is one step per unit of the request and per descriptor.
    pub fn volume_extents(
        &self,
        offset: u64,
        len: u32,
        answers: &[Vec<(u32, u32)>],
        mut push: impl FnMut(u64, u32) -> bool,
    ) {
        // Per node: the next descriptor, the bytes of it used, and the node offset it is at.
        let mut cursor: Vec<(usize, u64, u64)> =
            (0..self.widths.len()).map(|j| (0, 0, self.node_prefix(j, offset))).collect();
        let mut run: Option<(u64, u32)> = None;
        let mut done = 0u64;
        'pieces: while done < u64::from(len) {
            let at = offset + done;
            let (node, node_offset) = self.locate(at);
            let piece = (self.unit - at % self.unit).min(u64::from(len) - done);
            let (idx, used, pos) = &mut cursor[node];
            // Invariant 4: a node's pieces follow one another in its range.
            debug_assert_eq!(*pos, node_offset, "a node's pieces are contiguous");
            let mut left = piece;
            while left > 0 {
                let Some(&(dlen, flags)) = answers.get(node).and_then(|a| a.get(*idx)) else { break 'pieces };
                let take = (u64::from(dlen) - *used).min(left);
                match &mut run {
                    Some((l, f)) if *f == flags => *l += take,
                    _ => {
                        if let Some((l, f)) = run.take() {
                            if !push(l, f) {
                                return;
                            }
                        }
                        run = Some((take, flags));
                    }
                }
                *used += take;
                *pos += take;
                left -= take;
                done += take;
                if *used == u64::from(dlen) {
                    *idx += 1;
                    *used = 0;
                }
            }
        }
        if let Some((l, f)) = run {
            push(l, f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn worked_example() {
        let s = Stripe::new(64 << 10, &[1, 2]).unwrap();
        assert_eq!(s.locate(0), (0, 0));
        assert_eq!(s.locate(64 << 10), (1, 0));
        assert_eq!(s.locate((128 << 10) + 5), (1, (64 << 10) + 5));
        assert_eq!(s.locate(192 << 10), (0, 64 << 10));
        // 256 KiB + 1 byte is two rounds: node 0 holds 2 units, node 1 holds 4.
        assert_eq!(s.node_bytes(0, (192 << 10) + 1), 2 * (64 << 10));
        assert_eq!(s.node_bytes(1, (192 << 10) + 1), 4 * (64 << 10));
        let pieces = s.map((64 << 10) - 10, 20);
        assert_eq!(
            pieces,
            vec![
                Piece { node: 0, node_offset: (64 << 10) - 10, request_offset: 0, len: 10 },
                Piece { node: 1, node_offset: 0, request_offset: 10, len: 10 },
            ]
        );
    }

    #[test]
    fn bad_layouts() {
        assert_eq!(Stripe::new(0, &[1]), Err(StripeError::ZeroUnit));
        assert_eq!(Stripe::new(512, &[0, 0]), Err(StripeError::NoWidth));
        assert_eq!(Stripe::new(512, &[]), Err(StripeError::NoWidth));
        assert!(Stripe::new(512, &[MAX_ROUND_UNITS as u32]).is_ok());
        assert_eq!(Stripe::new(512, &[MAX_ROUND_UNITS as u32, 1]), Err(StripeError::TooWide(MAX_ROUND_UNITS + 1)));
    }

    #[test]
    fn zero_width_node_is_unused() {
        let s = Stripe::new(4096, &[1, 0, 1]).unwrap();
        assert!(!s.uses(1));
        assert_eq!(s.node_bytes(1, 1 << 20), 0);
        assert!(s.map(0, 1 << 20).iter().all(|p| p.node != 1));
    }

    #[test]
    fn same_layout_ignores_unused_nodes_at_the_end_only() {
        let s = |w: &[u32]| Stripe::new(4096, w).unwrap();
        assert!(s(&[1, 2]).same_layout(&s(&[1, 2, 0, 0])));
        assert!(s(&[1, 2, 0]).same_layout(&s(&[1, 2])));
        assert!(!s(&[1, 2]).same_layout(&s(&[0, 1, 2])), "moved a place on: another node holds the first unit");
        assert!(!s(&[1, 2]).same_layout(&s(&[1, 2, 1])));
        assert!(!s(&[1, 2]).same_layout(&Stripe::new(8192, &[1, 2]).unwrap()));
    }

    #[test]
    fn placed_keeps_the_order_or_refuses() {
        let s = Stripe::new(4096, &[1, 0, 2]).unwrap();
        // Node 1 (unused) may go anywhere; 0 and 2 must keep their order.
        assert_eq!(s.placed(&[0, 9, 3], 4).unwrap().widths(), &[1, 0, 0, 2]);
        assert_eq!(s.placed(&[2, 0, 1], 3), None, "node 2 before node 0: another layout");
        assert_eq!(s.placed(&[1, 0, 1], 2), None, "two nodes in one place");
    }

    proptest! {
        /// Invariant 6: growing a volume from `old` to `new` bytes moves no byte, needs no less of any
        /// node, and puts each new byte on its node after every old byte there.
        #[test]
        fn growing_moves_no_byte(
            unit in 1u64..300,
            widths in proptest::collection::vec(0u32..4, 1..5),
            old in 1u64..20_000,
            more in 1u64..20_000,
            a in 0u64..20_000,
            b in 0u64..20_000,
        ) {
            prop_assume!(widths.iter().any(|&w| w > 0));
            let s = Stripe::new(unit, &widths).unwrap();
            let new = old + more;
            for j in 0..widths.len() {
                prop_assert!(s.node_bytes(j, old) <= s.node_bytes(j, new));
            }
            // An old byte and a new one: on one node, the new one lies after.
            let (o, n) = (a % old, old + b % more);
            let ((jo, at_o), (jn, at_n)) = (s.locate(o), s.locate(n));
            prop_assert!(at_n < s.node_bytes(jn, new));
            if jo == jn {
                prop_assert!(at_o < at_n);
            }
        }

        /// `placed` keeps every byte on the same node (at its new place) and the same node offset,
        /// whatever nodes are inserted between the ones used.
        #[test]
        fn placed_is_the_same_layout(
            widths in proptest::collection::vec(0u32..4, 1..6),
            gaps in proptest::collection::vec(0usize..3, 6),
            offset in 0u64..50_000,
        ) {
            prop_assume!(widths.iter().any(|&w| w > 0));
            let s = Stripe::new(512, &widths).unwrap();
            let mut place = Vec::new();
            let mut at = 0;
            for g in gaps.iter().take(widths.len()) {
                at += g;
                place.push(at);
                at += 1;
            }
            let p = s.placed(&place, at + 2).unwrap();
            let (j, o) = s.locate(offset);
            prop_assert_eq!(p.locate(offset), (place[j], o));
            prop_assert_eq!(p.node_bytes(place[j], 50_000), s.node_bytes(j, 50_000));
        }

        #[test]
        fn bijection_and_order(
            unit in 1u64..300,
            widths in proptest::collection::vec(0u32..4, 1..5),
            size in 1u64..20_000,
            req in (0u64..20_000, 0u32..3000),
        ) {
            prop_assume!(widths.iter().any(|&w| w > 0));
            let s = Stripe::new(unit, &widths).unwrap();
            let (offset, len) = (req.0 % size, req.1);
            let len = len.min((size - offset) as u32);
            let pieces = s.map(offset, len);
            // Invariant 2: ordered, contiguous in the request, each inside one unit.
            let mut at = 0u64;
            let mut seen = HashSet::new();
            for p in &pieces {
                prop_assert_eq!(p.request_offset, at);
                prop_assert!(p.len > 0);
                prop_assert!((p.node_offset % unit) + u64::from(p.len) <= unit);
                // Invariant 3: within the node's piece.
                prop_assert!(p.node_offset + u64::from(p.len) <= s.node_bytes(p.node, size));
                for k in 0..u64::from(p.len) {
                    // Invariant 1: each byte's own locate agrees, and no node byte is hit twice.
                    prop_assert_eq!(s.locate(offset + at + k), (p.node, p.node_offset + k));
                    prop_assert!(seen.insert((p.node, p.node_offset + k)));
                }
                at += u64::from(p.len);
            }
            prop_assert_eq!(at, u64::from(len));
        }

        /// Invariant 4: `node_ranges` is, per node, the merge of `map`'s pieces, and those merge into one
        /// contiguous range.
        #[test]
        fn node_ranges_merge_the_pieces(
            unit in 1u64..300,
            widths in proptest::collection::vec(0u32..4, 1..5),
            offset in 0u64..50_000,
            len in 0u32..20_000,
        ) {
            prop_assume!(widths.iter().any(|&w| w > 0));
            let s = Stripe::new(unit, &widths).unwrap();
            let mut merged: Vec<Option<(u64, u64)>> = vec![None; widths.len()];
            for p in s.map(offset, len) {
                let m = &mut merged[p.node];
                match m {
                    None => *m = Some((p.node_offset, p.node_offset + u64::from(p.len))),
                    Some((_, end)) => {
                        prop_assert_eq!(*end, p.node_offset, "a node's pieces are contiguous");
                        *end += u64::from(p.len);
                    }
                }
            }
            let want: Vec<(usize, u64, u32)> = merged
                .iter()
                .enumerate()
                .filter_map(|(j, m)| m.map(|(a, b)| (j, a, (b - a) as u32)))
                .collect();
            prop_assert_eq!(s.node_ranges(offset, len), want);
        }

        /// Invariant 5 against a per-byte oracle: every node byte has flags; each node answers a prefix of
        /// its range (its runs, some cut in two, the last ones left out); the volume extents describe each
        /// byte with its node byte's flags (a hole only where the node said hole) and stop exactly at the
        /// first byte no answer covers.
        #[test]
        fn volume_extents_match_the_node_bytes(
            unit in 1u64..40,
            widths in proptest::collection::vec(0u32..4, 1..4),
            flags in proptest::collection::vec(0u32..4, 1..64),
            run_len in 1usize..20,
            req in (0u64..2_000, 1u32..1_500),
            keep in proptest::collection::vec(0usize..50, 4),
            split in any::<u64>(),
        ) {
            prop_assume!(widths.iter().any(|&w| w > 0));
            let s = Stripe::new(unit, &widths).unwrap();
            let size = 2_000u64;
            let (offset, len) = (req.0 % size, req.1.min((size - req.0 % size) as u32));
            // Node j's byte b has flags[(j * 7 + b / run_len) % flags.len()]: runs of run_len bytes.
            let byte = |j: usize, b: u64| flags[(j * 7 + b as usize / run_len) % flags.len()];
            let mut answers = vec![Vec::new(); widths.len()];
            for (j, start, n) in s.node_ranges(offset, len) {
                let mut d: Vec<(u32, u32)> = Vec::new();
                for b in start..start + u64::from(n) {
                    match d.last_mut() {
                        Some((l, f)) if *f == byte(j, b) && (split >> (b % 64)) & 1 == 0 => *l += 1,
                        _ => d.push((1, byte(j, b))),
                    }
                }
                d.truncate(keep[j % keep.len()]);
                answers[j] = d;
            }
            let mut got: Vec<(u64, u32)> = Vec::new();
            s.volume_extents(offset, len, &answers, |l, f| {
                got.push((l, f));
                true
            });
            prop_assert!(got.iter().all(|&(l, _)| l > 0));
            prop_assert!(got.windows(2).all(|w| w[0].1 != w[1].1), "neighbours merged");
            // The oracle: the first volume byte whose node byte no answer covers.
            let covered = |o: u64| {
                let (j, nb) = s.locate(o);
                let start = s.node_ranges(offset, len).iter().find(|r| r.0 == j).unwrap().1;
                let sum: u64 = answers[j].iter().map(|&(l, _)| u64::from(l)).sum();
                nb < start + sum
            };
            let want = (offset..offset + u64::from(len)).find(|&o| !covered(o)).unwrap_or(offset + u64::from(len));
            let mut at = offset;
            for (l, f) in got {
                for o in at..at + l {
                    let (j, nb) = s.locate(o);
                    prop_assert_eq!(f, byte(j, nb), "volume byte {} (node {} byte {})", o, j, nb);
                }
                at += l;
            }
            prop_assert_eq!(at, want, "the answer stops at the first byte not covered");
        }

        /// The whole volume maps onto the node pieces with nothing left over beyond the last round's
        /// padding: per node, the bytes hit are exactly `0..node_bytes` minus the tail of an incomplete round.
        #[test]
        fn whole_volume_is_onto(unit in 1u64..50, widths in proptest::collection::vec(0u32..4, 1..4), rounds in 1u64..5) {
            prop_assume!(widths.iter().any(|&w| w > 0));
            let s = Stripe::new(unit, &widths).unwrap();
            let w: u64 = widths.iter().map(|&w| u64::from(w)).sum();
            let size = rounds * w * unit; // whole rounds: the map is onto every node piece
            let mut hit: Vec<Vec<bool>> = (0..widths.len()).map(|j| vec![false; s.node_bytes(j, size) as usize]).collect();
            for o in 0..size {
                let (j, off) = s.locate(o);
                prop_assert!(!hit[j][off as usize]);
                hit[j][off as usize] = true;
            }
            prop_assert!(hit.iter().all(|h| h.iter().all(|&b| b)));
            for (j, &wj) in widths.iter().enumerate() {
                prop_assert_eq!(s.node_bytes(j, size), rounds * u64::from(wj) * unit);
            }
        }
    }
}
