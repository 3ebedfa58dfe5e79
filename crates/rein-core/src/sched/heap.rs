//! An indexed 4-ary min-heap over tenant slots, keyed by [`Tag`].
//!
//! Each scheduler keeps a few of these (mClock: reservation, ready and limited heaps). A slot is in a
//! heap at most once; `pos[slot]` records where, so a key can be changed or removed in O(log n) without
//! a search. Ties break on the slot number, which makes every order deterministic. The heap never
//! allocates once its vectors have grown to the number of slots.
//!
//! # Layout
//! Keys and slots are kept in separate arrays, and the keys are shifted by three places in 64-byte
//! aligned groups of four, so the four children of a node (positions `4i+1..=4i+4`, stored at
//! `4i+4..=4i+7`) are one cache line of keys: a sift visits one line of keys per level. (With 32-byte
//! key-and-slot items it visited two or three, and with thousands of tenants per server they miss.)
//!
//! Invariants (checked by `check` in tests):
//! 1. `key(i), slot(i) >= key(parent(i)), slot(parent(i))` (heap order, ties by slot);
//! 2. `pos[slot(i)] == i` for every item, and `pos[s] == NONE` for slots not in the heap.

use crate::units::Tag;

const ARITY: usize = 4;
const NONE: u32 = u32::MAX;
/// Position `i` is stored at `i + SHIFT`, which puts every group of siblings at a multiple of four.
const SHIFT: usize = ARITY - 1;

/// Four keys on one cache line.
#[derive(Copy, Clone, Debug, Default)]
#[repr(C, align(64))]
struct Line([Tag; ARITY]);

#[derive(Debug, Default, Clone)]
pub(crate) struct IndexedHeap {
    lines: Vec<Line>,
    /// `slots[i + SHIFT]` is the slot at position `i`.
    slots: Vec<u32>,
    len: usize,
    pos: Vec<u32>,
}

impl IndexedHeap {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Makes room for slots `0..n` (idempotent).
    pub(crate) fn grow_slots(&mut self, n: usize) {
        if self.pos.len() < n {
            self.pos.resize(n, NONE);
            let lines = (n + SHIFT).div_ceil(ARITY);
            self.lines.resize(lines, Line::default());
            self.slots.resize(lines * ARITY, NONE);
        }
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, slot: u32) -> bool {
        self.pos.get(slot as usize).is_some_and(|&p| p != NONE)
    }

    #[inline]
    fn key(&self, i: usize) -> Tag {
        let p = i + SHIFT;
        self.lines[p / ARITY].0[p % ARITY]
    }

    #[inline]
    fn slot(&self, i: usize) -> u32 {
        self.slots[i + SHIFT]
    }

    /// Puts (key, slot) at position `i` and records it in `pos`.
    #[inline]
    fn put(&mut self, i: usize, key: Tag, slot: u32) {
        let p = i + SHIFT;
        self.lines[p / ARITY].0[p % ARITY] = key;
        self.slots[p] = slot;
        self.pos[slot as usize] = i as u32;
    }

    #[inline]
    pub(crate) fn peek(&self) -> Option<(Tag, u32)> {
        (self.len > 0).then(|| (self.key(0), self.slot(0)))
    }

    /// Inserts `slot` with `key`, or changes its key if present.
    #[inline]
    pub(crate) fn set(&mut self, slot: u32, key: Tag) {
        let s = slot as usize;
        debug_assert!(s < self.pos.len(), "slot {slot} beyond grow_slots");
        let p = self.pos[s];
        if p == NONE {
            let i = self.len;
            self.len += 1;
            if i == 0 {
                // An empty heap (common: one tenant moving between heaps) needs no sift.
                self.put(0, key, slot);
            } else {
                self.sift_up(i, key, slot);
            }
        } else {
            let i = p as usize;
            let old = self.key(i);
            if key < old {
                self.sift_up(i, key, slot);
            } else if key > old {
                self.sift_down(i, key, slot);
            }
        }
    }

    /// Removes `slot` if present.
    #[inline]
    pub(crate) fn remove(&mut self, slot: u32) {
        let s = slot as usize;
        let Some(&p) = self.pos.get(s) else { return };
        if p == NONE {
            return;
        }
        let i = p as usize;
        self.pos[s] = NONE;
        self.len -= 1;
        let last = self.len;
        if i < last {
            let (key, moved) = (self.key(last), self.slot(last));
            // The moved item may need to go either way.
            if i > 0 && (key, moved) < (self.key((i - 1) / ARITY), self.slot((i - 1) / ARITY)) {
                self.sift_up(i, key, moved);
            } else {
                self.sift_down(i, key, moved);
            }
        }
    }

    /// Removes and returns the minimum.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(Tag, u32)> {
        let top = self.peek()?;
        self.remove(top.1);
        Some(top)
    }

    /// Lowers every key by `by`, saturating at zero (virtual time's renormalisation, engine module comment).
    /// The map is monotone, but keys it takes to zero tie and then order by slot, which can put a child
    /// before its parent: the heap is rebuilt bottom up (Floyd's heapify: O(n), no allocation).
    pub(crate) fn lower_keys(&mut self, by: u128) {
        for i in 0..self.len {
            let p = i + SHIFT;
            let key = &mut self.lines[p / ARITY].0[p % ARITY];
            *key = key.saturating_sub(by);
        }
        for i in (0..self.len).rev() {
            let (key, slot) = (self.key(i), self.slot(i));
            self.sift_down(i, key, slot);
        }
    }

    /// Places (key, slot) at or above position `i` (whose old content is free to overwrite).
    #[inline]
    fn sift_up(&mut self, mut i: usize, key: Tag, slot: u32) {
        while i > 0 {
            let parent = (i - 1) / ARITY;
            let (pk, ps) = (self.key(parent), self.slot(parent));
            if (key, slot) >= (pk, ps) {
                break;
            }
            self.put(i, pk, ps);
            i = parent;
        }
        self.put(i, key, slot);
    }

    /// Places (key, slot) at or below position `i` (whose old content is free to overwrite).
    #[inline]
    fn sift_down(&mut self, mut i: usize, key: Tag, slot: u32) {
        let n = self.len;
        loop {
            let first = i * ARITY + 1;
            if first >= n {
                break;
            }
            // The children `first..first + 4` are stored at `4i + 4..4i + 8`: line `i + 1`.
            let keys = &self.lines[i + 1].0;
            let slots = &self.slots[ARITY * (i + 1)..ARITY * (i + 2)];
            let count = (n - first).min(ARITY);
            // Which child is smallest is unpredictable, so select without branches: a tournament for a
            // full set of four, a scan otherwise.
            #[inline(always)]
            fn min2(a: (Tag, u32, usize), b: (Tag, u32, usize)) -> (Tag, u32, usize) {
                if (b.0, b.1) < (a.0, a.1) {
                    b
                } else {
                    a
                }
            }
            let child = |c: usize| (keys[c], slots[c], c);
            let (bk0, bk1, b) = if count == ARITY {
                min2(min2(child(0), child(1)), min2(child(2), child(3)))
            } else {
                let mut m = child(0);
                for c in 1..count {
                    m = min2(m, child(c));
                }
                m
            };
            let bk = (bk0, bk1);
            let best = first + b;
            if bk >= (key, slot) {
                break;
            }
            self.put(i, bk.0, bk.1);
            i = best;
        }
        self.put(i, key, slot);
    }

    /// Verifies invariants 1-2 (tests and debug checks).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        for i in 0..self.len {
            assert_eq!(self.pos[self.slot(i) as usize] as usize, i, "invariant 2");
            if i > 0 {
                let parent = (i - 1) / ARITY;
                assert!((self.key(i), self.slot(i)) >= (self.key(parent), self.slot(parent)), "invariant 1");
            }
        }
        let present = self.pos.iter().filter(|&&p| p != NONE).count();
        assert_eq!(present, self.len, "invariant 2");
        assert_eq!(self.lines.as_ptr() as usize % 64, 0, "key lines are cache-line aligned");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Also under `lower_keys` (op 3, by a quarter of the drawn key), whose zeros tie and reorder by
        /// slot.
        #[test]
        fn behaves_like_a_sorted_set(ops in proptest::collection::vec((0u32..40, 0u64..1000, 0u8..7), 1..400)) {
            let mut h = IndexedHeap::new();
            h.grow_slots(40);
            let mut model: std::collections::BTreeMap<u32, u64> = Default::default();
            for (slot, key, op) in ops {
                match op {
                    0..=3 => { h.set(slot, Tag(key as u128)); model.insert(slot, key); }
                    4 | 5 => { h.remove(slot); model.remove(&slot); }
                    _ => {
                        h.lower_keys(u128::from(key / 4));
                        model.values_mut().for_each(|k| *k = k.saturating_sub(key / 4));
                    }
                }
                h.check();
                let want = model.iter().map(|(s, k)| (*k, *s)).min();
                prop_assert_eq!(h.peek().map(|(k, s)| (k.0 as u64, s)), want);
                prop_assert_eq!(h.len(), model.len());
            }
            while let Some((k, s)) = h.pop() {
                let want = model.iter().map(|(s, k)| (*k, *s)).min().unwrap();
                prop_assert_eq!((k.0 as u64, s), want);
                model.remove(&s);
            }
        }
    }
}
