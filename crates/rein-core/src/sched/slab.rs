//! A generational slab of tenants: dense slots for the heaps, generations so stale ids are detected.
//!
//! Invariants: a slot is either free (on `free`, `FREE` set in its generation, its value a default
//! placeholder) or live; `live` counts live slots; a slot's generation increases every time it is freed,
//! so an id from before the free never matches again. Liveness lives in the generations, apart from the
//! values, so reaching a live value by slot (`at`, `at_mut`) reads nothing but the value: an `Option`
//! around a cache-line-aligned value would put its discriminant wherever the compiler finds a niche, a
//! line the hot path otherwise never touches.

use super::{SchedError, TenantId};

/// Set in a slot's generation while the slot is free; generations count in the other 31 bits.
const FREE: u32 = 1 << 31;

#[derive(Debug, Clone)]
pub(crate) struct Slab<T> {
    vals: Vec<T>,
    gens: Vec<u32>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { vals: Vec::new(), gens: Vec::new(), free: Vec::new(), live: 0 }
    }
}

impl<T: Default> Slab<T> {
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
        let slot = match self.free.pop() {
            Some(slot) => {
                let s = slot as usize;
                debug_assert!(self.gens[s] & FREE != 0);
                self.vals[s] = val;
                self.gens[s] &= !FREE;
                slot
            }
            None => {
                let slot = u32::try_from(self.vals.len()).map_err(|_| SchedError::TooManyTenants { max })?;
                self.vals.push(val);
                self.gens.push(0);
                slot
            }
        };
        self.live += 1;
        Ok(TenantId { slot, gen: self.gens[slot as usize] })
    }

    #[inline]
    fn is_live(&self, id: TenantId) -> bool {
        // A free slot's generation has FREE set, which no id we issue carries (a forged one is refused).
        id.gen & FREE == 0 && self.gens.get(id.slot as usize) == Some(&id.gen)
    }

    pub(crate) fn get(&self, id: TenantId) -> Result<&T, SchedError> {
        if self.is_live(id) {
            Ok(&self.vals[id.slot as usize])
        } else {
            Err(SchedError::UnknownTenant(id))
        }
    }

    pub(crate) fn get_mut(&mut self, id: TenantId) -> Result<&mut T, SchedError> {
        if self.is_live(id) {
            Ok(&mut self.vals[id.slot as usize])
        } else {
            Err(SchedError::UnknownTenant(id))
        }
    }

    pub(crate) fn remove(&mut self, id: TenantId) -> Result<T, SchedError> {
        if !self.is_live(id) {
            return Err(SchedError::UnknownTenant(id));
        }
        let s = id.slot as usize;
        let v = std::mem::take(&mut self.vals[s]);
        self.gens[s] = (self.gens[s].wrapping_add(1) & !FREE) | FREE;
        self.free.push(id.slot);
        self.live -= 1;
        Ok(v)
    }

    /// The live value in `slot` (internal: slots come from the heaps, which only hold live tenants).
    #[inline]
    pub(crate) fn at(&self, slot: u32) -> &T {
        debug_assert!(self.gens[slot as usize] & FREE == 0, "slot {slot} is live");
        &self.vals[slot as usize]
    }

    #[inline]
    pub(crate) fn at_mut(&mut self, slot: u32) -> &mut T {
        debug_assert!(self.gens[slot as usize] & FREE == 0, "slot {slot} is live");
        &mut self.vals[slot as usize]
    }

    #[inline]
    pub(crate) fn id_of(&self, slot: u32) -> TenantId {
        TenantId { slot, gen: self.gens[slot as usize] }
    }

    /// Live values in slot order, to change them all (virtual time's renormalisation).
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.vals.iter_mut().zip(&self.gens).filter(|(_, &gen)| gen & FREE == 0).map(|(v, _)| v)
    }

    /// Live (id, value) pairs in slot order (deterministic).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TenantId, &T)> {
        self.vals
            .iter()
            .zip(&self.gens)
            .enumerate()
            .filter(|(_, (_, &gen))| gen & FREE == 0)
            .map(|(i, (v, &gen))| (TenantId { slot: i as u32, gen }, v))
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

    #[test]
    fn generations_wrap_and_free_slots_are_never_live() {
        let mut s: Slab<u32> = Slab::default();
        let a = s.insert(4, 7).unwrap();
        s.gens[a.slot as usize] = FREE - 1;
        let old = TenantId { slot: a.slot, gen: FREE - 1 };
        assert_eq!(s.remove(old), Ok(7));
        // A forged id naming the free slot's generation (with the FREE bit) is not live.
        let forged = TenantId { slot: a.slot, gen: s.gens[a.slot as usize] };
        assert_eq!(s.get(forged), Err(SchedError::UnknownTenant(forged)));
        assert_eq!(s.remove(forged), Err(SchedError::UnknownTenant(forged)));
        let b = s.insert(4, 8).unwrap();
        assert_eq!((b.slot, b.gen), (a.slot, 0), "the generation wrapped to 0");
        assert_eq!(s.get(old), Err(SchedError::UnknownTenant(old)));
        assert_eq!(*s.get(b).unwrap(), 8);
        assert_eq!(s.len(), 1);
    }
}
