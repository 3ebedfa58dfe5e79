//! The bounded histories the daemons keep (a PARDA host's period records, a pShift controller's rounds,
//! a PARDA board's inbox, the pShift link's clock samples): each keeps the newest entries up to its
//! bound, dropping the oldest, so what a peer or a long run adds costs bounded memory.

use std::collections::VecDeque;

/// Appends `item` to `q`, first dropping the oldest entries so that `q` holds at most `max` (at least
/// one); returns how many were dropped.
pub fn push<T>(q: &mut VecDeque<T>, item: T, max: usize) -> usize {
    let keep = max.max(1) - 1;
    let dropped = q.len().saturating_sub(keep);
    q.drain(..dropped);
    q.push_back(item);
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_are_kept_up_to_the_bound() {
        let mut q = VecDeque::new();
        for i in 0..3 {
            assert_eq!(push(&mut q, i, 3), 0);
        }
        assert_eq!(push(&mut q, 3, 3), 1);
        assert_eq!(q, [1, 2, 3]);
        // A bound lowered under a fuller queue drops down to it at once.
        assert_eq!(push(&mut q, 4, 2), 2);
        assert_eq!(q, [3, 4]);
        assert_eq!(push(&mut q, 5, 0), 2, "a bound of 0 keeps the newest");
        assert_eq!(q, [5]);
    }
}
