//! The event queue and the kinds of events the engine runs.
//!
//! Events run in (time, sequence) order: equal times run in the order they were scheduled, so a run is a
//! pure function of its scenario and seed. The sequence number is unique, so the payload (`kind`, `a`,
//! `b`, see [`Kind`]) never decides the order. The key packs time and sequence into
//! one integer, complemented so the standard max-heap pops the earliest first: one comparison per heap
//! step instead of a field-by-field one.

use rein_core::Nanos;
use std::collections::BinaryHeap;

/// What an event does; `a` and `b` are its payload.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// FIFO device of server `a` completes the request in service.
    Complete,
    /// Server `a`'s scheduler may release a request held by a limit.
    Wake,
    /// Request `a` reaches its server (after the network delay).
    Deliver,
    /// Request `a`'s completion reaches its tenant's gateway.
    Notify,
    /// Tenant `a`'s next open, burst or trace arrival.
    Arrive,
    /// Tenant `a`'s on/off workload toggles.
    Toggle,
    /// Tenant `a`'s think time ends: issue a request (to server `b` of its list, unless `b` is `u32::MAX`).
    Think,
    /// Server `a`'s capacity changes to step `b` of its schedule.
    Capacity,
    /// Tenant `a` starts.
    Start,
    /// Tenant `a` stops.
    Stop,
    /// PARDA host `a`'s control period ends.
    HostPeriod,
    /// PARDA host `a` may release a request held by its local scheduler's limits.
    HostWake,
    /// Uncontrolled host `a`'s fixed issue queue changes to step `b` of its `window_schedule`.
    HostWindow,
    /// Processor-sharing device of server `a`: the completion armed as generation `b` is due.
    PsDone,
    /// pShift: token messages reach the servers.
    Tokens,
    /// pShift: the servers' reports reach the controller.
    Reports,
    /// pShift: redistribution boundary `a`.
    Boundary,
    /// pShift: bucket `a` enters demand phase `b`.
    Change,
    /// pShift: open arrival streams to server `a` are due.
    StreamArrive,
    /// pShift: a server's note of a stray arrival reaches the controller.
    Stray,
    /// pShift: the controller's request for an early round's reports reaches the servers.
    EarlyReport,
}

/// An event taken from the queue.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Event<K> {
    pub t: Nanos,
    pub kind: K,
    pub a: u32,
    pub b: u32,
}

#[derive(Copy, Clone, Debug)]
struct Entry<K> {
    key: u128,
    kind: K,
    a: u32,
    b: u32,
}

impl<K> PartialEq for Entry<K> {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl<K> Eq for Entry<K> {}
impl<K> PartialOrd for Entry<K> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<K> Ord for Entry<K> {
    #[inline]
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}

#[derive(Debug)]
pub(crate) struct Events<K> {
    heap: BinaryHeap<Entry<K>>,
    seq: u64,
}

impl<K: Copy> Events<K> {
    pub(crate) fn new() -> Self {
        Events { heap: BinaryHeap::new(), seq: 0 }
    }

    /// Schedules `kind` (with its arguments) at `t`, after everything already scheduled at `t`.
    #[inline]
    pub(crate) fn push(&mut self, t: Nanos, kind: K, a: u32, b: u32) {
        self.seq += 1;
        self.heap.push(Entry { key: !((t.0 as u128) << 64 | self.seq as u128), kind, a, b });
    }

    /// Removes and returns the next event if it comes before `end`.
    #[inline]
    pub(crate) fn pop_before(&mut self, end: Nanos) -> Option<Event<K>> {
        let top = self.heap.peek()?;
        let t = Nanos(((!top.key) >> 64) as u64);
        if t >= end {
            return None;
        }
        let e = self.heap.pop().expect("peeked");
        Some(Event { t, kind: e.kind, a: e.a, b: e.b })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_then_scheduling_order_and_the_end_bound() {
        let mut q = Events::new();
        q.push(Nanos(5), 'a', 0, 0);
        q.push(Nanos(3), 'b', 0, 0);
        q.push(Nanos(5), 'c', 0, 0);
        q.push(Nanos(3), 'd', 1, 2);
        q.push(Nanos(9), 'e', 0, 0);
        let mut got = Vec::new();
        while let Some(e) = q.pop_before(Nanos(9)) {
            got.push((e.t.0, e.kind));
        }
        assert_eq!(got, vec![(3, 'b'), (3, 'd'), (5, 'a'), (5, 'c')]);
        assert!(q.pop_before(Nanos(9)).is_none(), "the event at the end stays");
        assert_eq!(q.pop_before(Nanos(10)).map(|e| e.kind), Some('e'));
    }
}
