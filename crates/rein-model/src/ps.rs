//! Processor sharing: the discipline of a storage array that serves many requests at once.
//!
//! # Model
//! All requests at the device are in service together, each at `1/n` of its speed when `n` are present
//! (egalitarian processor sharing). A request needing `s` of service (drawn from the server's service
//! model, times its host's `service_scale`) completes after about `n * s` when `n` stays constant. So
//! unlike the FIFO device, where every request waits behind the same queue and latencies hardly depend on
//! the request itself, a request's latency here scales with its own service demand. That is what an array
//! with internal parallelism and placement effects shows (parda.txt §4.1, Table 3: with equal queue
//! depths, hosts whose disks sit better see lower latency *and* higher throughput, `X_h = N_h / L_h`).
//! Little's law still holds for the whole device (mean latency = requests present / throughput), so
//! PARDA's aggregated signal and eq. (3) apply unchanged.
//!
//! # Implementation
//! Virtual work time `v` advances at rate `1/n` per unit of real time; a request admitted at `v0` with
//! work `s` finishes when `v` reaches `v0 + s`. Finish tags sit in a min-heap; the next completion is
//! `now + (min_finish - v) * n`. Arrivals and departures change `n`, so the engine reschedules the
//! next-completion event with a fresh generation number (the device's) and ignores stale ones. Work is integer
//! nanoseconds times 2^20 (`u128`): each advance rounds down by at most 2^-20 ns, and the completion time
//! is rounded up, so when the event fires the request is done (`v >= finish`) with no slack needed.
//!
//! Invariants: `v` never decreases (1); the heap holds exactly the requests at the device (2).

use rein_core::Nanos;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const FRAC: u32 = 20;

/// A processor-sharing queue (module comment).
#[derive(Debug, Default)]
pub struct Ps {
    v: u128,
    last: Nanos,
    jobs: BinaryHeap<Reverse<(u128, u32)>>,
}

impl Ps {
    fn advance(&mut self, now: Nanos) {
        let n = self.jobs.len() as u128;
        if n > 0 && now > self.last {
            self.v += (((now.0 - self.last.0) as u128) << FRAC) / n;
        }
        self.last = self.last.max(now);
    }

    /// A request `id` needing `work_ns` of service arrives at `now`.
    #[inline]
    pub fn admit(&mut self, now: Nanos, id: u32, work_ns: f64) {
        self.advance(now);
        let work = ((work_ns.max(1.0)) * (1u64 << FRAC) as f64) as u128;
        self.jobs.push(Reverse((self.v + work, id)));
    }

    /// When the next request completes if nothing arrives before.
    pub fn next_completion(&self) -> Option<Nanos> {
        let &Reverse((f, _)) = self.jobs.peek()?;
        let n = self.jobs.len() as u128;
        let dt = (f.saturating_sub(self.v) * n).div_ceil(1 << FRAC);
        Some(self.last.saturating_add(Nanos(dt.min(u64::MAX as u128) as u64)))
    }

    /// Removes the requests finished by `now`, in finish order.
    pub fn pop_done(&mut self, now: Nanos, out: &mut Vec<u32>) {
        self.advance(now);
        while let Some(&Reverse((f, id))) = self.jobs.peek() {
            if f > self.v {
                break;
            }
            self.jobs.pop();
            out.push(id);
        }
    }

    /// Requests at the device (all of them are in service).
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// True when no request is at the device.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_jobs_share_the_device() {
        let mut p = Ps::default();
        p.admit(Nanos(0), 1, 100.0);
        p.admit(Nanos(0), 2, 300.0);
        // Both at half speed: job 1 done at 200; then job 2 alone: 300 - 100 = 200 more, done at 400.
        assert_eq!(p.next_completion(), Some(Nanos(200)));
        let mut out = Vec::new();
        p.pop_done(Nanos(200), &mut out);
        assert_eq!(out, vec![1]);
        assert_eq!(p.next_completion(), Some(Nanos(400)));
        p.pop_done(Nanos(399), &mut out);
        assert_eq!(out, vec![1]);
        p.pop_done(Nanos(400), &mut out);
        assert_eq!(out, vec![1, 2]);
        assert_eq!(p.len(), 0);
        assert_eq!(p.next_completion(), None);
    }

    #[test]
    fn latency_scales_with_own_demand() {
        // n = 10 jobs always present (closed loop); jobs of type A need 1 us, type B 2 us. B's latency is
        // twice A's and A completes twice as many.
        let mut p = Ps::default();
        let mut now = Nanos(0);
        let mut admitted = std::collections::BTreeMap::new();
        for i in 0..10u32 {
            p.admit(now, i, if i % 2 == 0 { 1000.0 } else { 2000.0 });
            admitted.insert(i, now);
        }
        let (mut lat, mut done) = ([0u64; 2], [0u64; 2]);
        let mut out = Vec::new();
        while now < Nanos(100_000_000) {
            now = p.next_completion().unwrap();
            out.clear();
            p.pop_done(now, &mut out);
            for &id in &out {
                let k = (id % 2) as usize;
                lat[k] += now.0 - admitted.remove(&id).unwrap().0;
                done[k] += 1;
                // Replace with a job of the same type (ids keep their parity).
                let nid = id + 10;
                p.admit(now, nid, if k == 0 { 1000.0 } else { 2000.0 });
                admitted.insert(nid, now);
            }
        }
        let (la, lb) = (lat[0] as f64 / done[0] as f64, lat[1] as f64 / done[1] as f64);
        assert!((lb / la - 2.0).abs() < 0.01, "{la} {lb}");
        assert!((done[0] as f64 / done[1] as f64 - 2.0).abs() < 0.01, "{done:?}");
        // Little's law: 10 present, throughput done/time.
        let x = (done[0] + done[1]) as f64 / now.0 as f64;
        let mean = (lat[0] + lat[1]) as f64 / (done[0] + done[1]) as f64;
        assert!((mean * x - 10.0).abs() < 0.05, "{}", mean * x);
    }
}
