//! An indexed 4-ary min-heap over tenant slots, keyed by [`Tag`].
//!
//! Each scheduler keeps a few of these (mClock: reservation, ready and limited heaps). A slot is in a
//! heap at most once; `pos[slot]` records where, so a key can be changed or removed in O(log n) without
//! a search. Ties break on the slot number, which makes every order deterministic. The heap never
//! allocates once its vectors have grown to the number of slots.
//!
//! Invariants (checked by `check` in tests and debug builds):
//! 1. `items[i].key >= items[parent(i)].key` (heap order, ties by slot);
//! 2. `pos[items[i].slot] == i` for every item, and `pos[s] == NONE` for slots not in the heap.

use crate::units::Tag;

const ARITY: usize = 4;
const NONE: u32 = u32::MAX;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Item {
    key: Tag,
    slot: u32,
}

impl Item {
    #[inline]
    fn less(&self, o: &Item) -> bool {
        (self.key, self.slot) < (o.key, o.slot)
    }
}

#[derive(Debug, Default, Clone)]
pub(crate) struct IndexedHeap {
    items: Vec<Item>,
    pos: Vec<u32>,
}

impl IndexedHeap {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Makes room for slots `0..n` (idempotent).
    pub(crate) fn grow_slots(&mut self, n: usize) {
        if self.pos.len() < n {
            self.pos.resize(n, NONE);
        }
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, slot: u32) -> bool {
        self.pos.get(slot as usize).is_some_and(|&p| p != NONE)
    }

    #[inline]
    pub(crate) fn peek(&self) -> Option<(Tag, u32)> {
        self.items.first().map(|it| (it.key, it.slot))
    }

    /// Inserts `slot` with `key`, or changes its key if present.
    #[inline]
    pub(crate) fn set(&mut self, slot: u32, key: Tag) {
        let s = slot as usize;
        debug_assert!(s < self.pos.len(), "slot {slot} beyond grow_slots");
        let p = self.pos[s];
        if p == NONE {
            let i = self.items.len();
            self.items.push(Item { key, slot });
            self.pos[s] = i as u32;
            self.sift_up(i);
        } else {
            let i = p as usize;
            let old = self.items[i].key;
            self.items[i].key = key;
            if key < old {
                self.sift_up(i);
            } else if key > old {
                self.sift_down(i);
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
        let last = self.items.pop().expect("pos says present");
        if i < self.items.len() {
            self.items[i] = last;
            self.pos[last.slot as usize] = i as u32;
            // The moved item may need to go either way.
            self.sift_up(i);
            let j = self.pos[last.slot as usize] as usize;
            self.sift_down(j);
        }
    }

    /// Removes and returns the minimum.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(Tag, u32)> {
        let top = *self.items.first()?;
        self.remove(top.slot);
        Some((top.key, top.slot))
    }

    #[inline]
    fn sift_up(&mut self, mut i: usize) {
        let it = self.items[i];
        while i > 0 {
            let parent = (i - 1) / ARITY;
            let p = self.items[parent];
            if !it.less(&p) {
                break;
            }
            self.items[i] = p;
            self.pos[p.slot as usize] = i as u32;
            i = parent;
        }
        self.items[i] = it;
        self.pos[it.slot as usize] = i as u32;
    }

    #[inline]
    fn sift_down(&mut self, mut i: usize) {
        let n = self.items.len();
        let it = self.items[i];
        loop {
            let first = i * ARITY + 1;
            if first >= n {
                break;
            }
            let end = (first + ARITY).min(n);
            let mut best = first;
            for c in first + 1..end {
                if self.items[c].less(&self.items[best]) {
                    best = c;
                }
            }
            if !self.items[best].less(&it) {
                break;
            }
            self.items[i] = self.items[best];
            self.pos[self.items[i].slot as usize] = i as u32;
            i = best;
        }
        self.items[i] = it;
        self.pos[it.slot as usize] = i as u32;
    }

    /// Verifies invariants 1-2 (tests and debug checks).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        for (i, it) in self.items.iter().enumerate() {
            assert_eq!(self.pos[it.slot as usize] as usize, i, "invariant 2");
            if i > 0 {
                assert!(!it.less(&self.items[(i - 1) / ARITY]), "invariant 1");
            }
        }
        let present = self.pos.iter().filter(|&&p| p != NONE).count();
        assert_eq!(present, self.items.len(), "invariant 2");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn behaves_like_a_sorted_set(ops in proptest::collection::vec((0u32..40, 0u64..1000, 0u8..3), 1..400)) {
            let mut h = IndexedHeap::new();
            h.grow_slots(40);
            let mut model: std::collections::BTreeMap<u32, u64> = Default::default();
            for (slot, key, op) in ops {
                match op {
                    0 | 1 => { h.set(slot, Tag(key as u128)); model.insert(slot, key); }
                    _ => { h.remove(slot); model.remove(&slot); }
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
