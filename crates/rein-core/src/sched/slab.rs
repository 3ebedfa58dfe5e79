//! A generational slab of tenants: dense slots for the heaps, generations so stale ids are detected.
//!
//! Invariants: a slot is either free (on `free`, `vals[slot] == None`) or live; `live` counts live slots; a
//! slot's generation increases every time it is freed, so an id from before the free never matches again.
//! Generations are kept apart from the values so a cache-line-aligned value is not padded by them.

use super::{SchedError, TenantId};

#[derive(Debug, Clone)]
pub(crate) struct Slab<T> {
    vals: Vec<Option<T>>,
    gens: Vec<u32>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { vals: Vec::new(), gens: Vec::new(), free: Vec::new(), live: 0 }
    }
}

impl<T> Slab<T> {
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Number of slots ever allocated (the heaps size their index arrays by this).
    pub(crate) fn slots(&self) -> usize {
        self.vals.len()
    }

    pub(crate) fn insert(&mut self, max: usize, val: T) -> Result<TenantId, SchedError> {
        if self.live >= max {
            return Err(SchedError::TooManyTenants { max });
        }
        self.live += 1;
        if let Some(slot) = self.free.pop() {
            let v = &mut self.vals[slot as usize];
            debug_assert!(v.is_none());
            *v = Some(val);
            Ok(TenantId { slot, gen: self.gens[slot as usize] })
        } else {
            let slot = match u32::try_from(self.vals.len()) {
                Ok(s) => s,
                Err(_) => {
                    self.live -= 1;
                    return Err(SchedError::TooManyTenants { max });
                }
            };
            self.vals.push(Some(val));
            self.gens.push(0);
            Ok(TenantId { slot, gen: 0 })
        }
    }

    pub(crate) fn get(&self, id: TenantId) -> Result<&T, SchedError> {
        match self.vals.get(id.slot as usize) {
            Some(Some(v)) if self.gens[id.slot as usize] == id.gen => Ok(v),
            _ => Err(SchedError::UnknownTenant(id)),
        }
    }

    pub(crate) fn get_mut(&mut self, id: TenantId) -> Result<&mut T, SchedError> {
        match self.vals.get_mut(id.slot as usize) {
            Some(Some(v)) if self.gens[id.slot as usize] == id.gen => Ok(v),
            _ => Err(SchedError::UnknownTenant(id)),
        }
    }

    pub(crate) fn remove(&mut self, id: TenantId) -> Result<T, SchedError> {
        self.get(id)?;
        let v = self.vals[id.slot as usize].take().expect("checked live");
        let g = &mut self.gens[id.slot as usize];
        *g = g.wrapping_add(1);
        self.free.push(id.slot);
        self.live -= 1;
        Ok(v)
    }

    /// The live value in `slot` (internal: slots come from the heaps, which only hold live tenants).
    #[inline]
    pub(crate) fn at(&self, slot: u32) -> &T {
        self.vals[slot as usize].as_ref().expect("heap slot is live")
    }

    #[inline]
    pub(crate) fn at_mut(&mut self, slot: u32) -> &mut T {
        self.vals[slot as usize].as_mut().expect("heap slot is live")
    }

    #[inline]
    pub(crate) fn id_of(&self, slot: u32) -> TenantId {
        TenantId { slot, gen: self.gens[slot as usize] }
    }

    /// Live (id, value) pairs in slot order (deterministic).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TenantId, &T)> {
        self.vals
            .iter()
            .zip(&self.gens)
            .enumerate()
            .filter_map(|(i, (v, &gen))| v.as_ref().map(|v| (TenantId { slot: i as u32, gen }, v)))
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
