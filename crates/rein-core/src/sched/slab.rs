//! A generational slab of tenants: dense slots for the heaps, generations so stale ids are detected.
//!
//! Invariants: a slot is either free (on `free`, `val == None`) or live; `live` counts live slots; a slot's
//! generation increases every time it is freed, so an id from before the free never matches again.

use super::{SchedError, TenantId};

#[derive(Debug, Clone)]
struct Entry<T> {
    gen: u32,
    val: Option<T>,
}

#[derive(Debug, Clone)]
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { entries: Vec::new(), free: Vec::new(), live: 0 }
    }
}

impl<T> Slab<T> {
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Number of slots ever allocated (the heaps size their index arrays by this).
    pub(crate) fn slots(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn insert(&mut self, max: usize, val: T) -> Result<TenantId, SchedError> {
        if self.live >= max {
            return Err(SchedError::TooManyTenants { max });
        }
        self.live += 1;
        if let Some(slot) = self.free.pop() {
            let e = &mut self.entries[slot as usize];
            debug_assert!(e.val.is_none());
            e.val = Some(val);
            Ok(TenantId { slot, gen: e.gen })
        } else {
            let slot = u32::try_from(self.entries.len()).map_err(|_| SchedError::TooManyTenants { max })?;
            self.entries.push(Entry { gen: 0, val: Some(val) });
            Ok(TenantId { slot, gen: 0 })
        }
    }

    pub(crate) fn get(&self, id: TenantId) -> Result<&T, SchedError> {
        match self.entries.get(id.slot as usize) {
            Some(Entry { gen, val: Some(v) }) if *gen == id.gen => Ok(v),
            _ => Err(SchedError::UnknownTenant(id)),
        }
    }

    pub(crate) fn get_mut(&mut self, id: TenantId) -> Result<&mut T, SchedError> {
        match self.entries.get_mut(id.slot as usize) {
            Some(Entry { gen, val: Some(v) }) if *gen == id.gen => Ok(v),
            _ => Err(SchedError::UnknownTenant(id)),
        }
    }

    pub(crate) fn remove(&mut self, id: TenantId) -> Result<T, SchedError> {
        self.get(id)?;
        let e = &mut self.entries[id.slot as usize];
        let v = e.val.take().expect("checked live");
        e.gen = e.gen.wrapping_add(1);
        self.free.push(id.slot);
        self.live -= 1;
        Ok(v)
    }

    /// The live value in `slot` (internal: slots come from the heaps, which only hold live tenants).
    #[inline]
    pub(crate) fn at(&self, slot: u32) -> &T {
        self.entries[slot as usize].val.as_ref().expect("heap slot is live")
    }

    #[inline]
    pub(crate) fn at_mut(&mut self, slot: u32) -> &mut T {
        self.entries[slot as usize].val.as_mut().expect("heap slot is live")
    }

    #[inline]
    pub(crate) fn id_of(&self, slot: u32) -> TenantId {
        TenantId { slot, gen: self.entries[slot as usize].gen }
    }

    /// Live (id, value) pairs in slot order (deterministic).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TenantId, &T)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.val.as_ref().map(|v| (TenantId { slot: i as u32, gen: e.gen }, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_ids_are_unknown_and_bound_holds() {
        let mut s: Slab<u32> = Slab::default();
        let a = s.insert(2, 1).unwrap();
        let b = s.insert(2, 2).unwrap();
        assert_eq!(s.insert(2, 3), Err(SchedError::TooManyTenants { max: 2 }));
        assert_eq!(s.remove(a), Ok(1));
        assert_eq!(s.get(a), Err(SchedError::UnknownTenant(a)));
        let c = s.insert(2, 4).unwrap();
        assert_eq!(c.slot, a.slot);
        assert_ne!(c, a);
        assert_eq!(*s.get(c).unwrap(), 4);
        assert_eq!(*s.get(b).unwrap(), 2);
        assert_eq!(s.len(), 2);
        assert_eq!(s.iter().map(|(_, v)| *v).collect::<Vec<_>>(), vec![4, 2]);
    }
}
