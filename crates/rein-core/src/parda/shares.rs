//! beta from VM shares, with §3.4's scaling of VMs that do not use their part of the window (eq. (4)).
//!
//! A host's beta is proportional to the sum of its VMs' shares: `beta_h = K * sum_i s_i` (§3.4). Per
//! period, each VM k's share of the host window is `w_k = s_k / sum_i s_i * w(t)` (eq. (4)) and `n_k` is
//! its average number of outstanding IOs (queued at the host or issued to the array, integrated over the
//! period). If `n_k < w_k` the VM's shares count as `s'_k = n_k * s_k / w_k` when computing beta, so an
//! idle or lightly loaded VM lowers its host's beta rather than handing its part of the window to its
//! neighbours on the same host (§3.4: "so other VMs on the same host do not benefit disproportionately").
//! The host's beta is then `beta_base * sum_k s'_k / sum_k s_k`, where `beta_base` is the configured beta
//! (or `K * sum s`): invariant 4, `0 <= beta <= beta_base`.

use crate::units::Nanos;

/// One VM's accounting for the period just ended.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct VmUsage {
    /// s_k.
    pub share: f64,
    /// n_k: outstanding IOs (at the host or the array), time-averaged over the period.
    pub mean_outstanding: f64,
    /// w_k of eq. (4).
    pub window_share: f64,
    /// s'_k (equal to `share` when the VM used its part of the window).
    pub scaled_share: f64,
}

#[derive(Clone, Debug, Default)]
struct Vm {
    share: f64,
    outstanding: u32,
    /// Outstanding IOs integrated over time since the period began (IO-nanoseconds).
    area: u128,
    since: Nanos,
    live: bool,
}

/// Tracks VMs' outstanding IOs over a period and computes beta (module comment).
#[derive(Clone, Debug)]
pub struct ShareTracker {
    vms: Vec<Vm>,
    period_start: Nanos,
}

impl ShareTracker {
    /// A tracker without VMs whose first period starts at `now`.
    pub fn new(now: Nanos) -> Self {
        ShareTracker { vms: Vec::new(), period_start: now }
    }

    /// Adds (or replaces) VM `slot` with `share`.
    pub fn add(&mut self, now: Nanos, slot: usize, share: f64) {
        if self.vms.len() <= slot {
            self.vms.resize(slot + 1, Vm::default());
        }
        self.vms[slot] = Vm { share, outstanding: 0, area: 0, since: now, live: true };
    }

    /// Forgets VM `slot` (nothing happens for an unknown slot): its share and its IOs stop counting.
    pub fn remove(&mut self, slot: usize) {
        if let Some(v) = self.vms.get_mut(slot) {
            *v = Vm::default();
        }
    }

    /// Changes VM `slot`'s share s_k (nothing happens for an unknown slot).
    pub fn set_share(&mut self, slot: usize, share: f64) {
        if let Some(v) = self.vms.get_mut(slot) {
            v.share = share;
        }
    }

    /// Sum of the live VMs' configured shares.
    pub fn total_share(&self) -> f64 {
        self.vms.iter().filter(|v| v.live).map(|v| v.share).sum()
    }

    /// Adds the area under the VM's outstanding count up to `now`.
    #[inline]
    fn settle(v: &mut Vm, now: Nanos) {
        let dt = now.0.saturating_sub(v.since.0);
        v.area += v.outstanding as u128 * dt as u128;
        v.since = now;
    }

    /// One more IO of VM `slot` outstanding.
    #[inline]
    pub fn arrived(&mut self, now: Nanos, slot: usize) {
        if let Some(v) = self.vms.get_mut(slot).filter(|v| v.live) {
            Self::settle(v, now);
            v.outstanding += 1;
        }
    }

    /// One IO of VM `slot` completed (or was dropped).
    #[inline]
    pub fn departed(&mut self, now: Nanos, slot: usize) {
        if let Some(v) = self.vms.get_mut(slot).filter(|v| v.live) {
            Self::settle(v, now);
            v.outstanding = v.outstanding.saturating_sub(1);
        }
    }

    /// Current outstanding IOs of VM `slot`.
    pub fn outstanding(&self, slot: usize) -> u32 {
        self.vms.get(slot).map_or(0, |v| v.outstanding)
    }

    /// Ends the period at `now` with the host window `window` that was in effect during it; returns the
    /// scaled beta (eq. (4) when `adjust`, else `beta_base`) and each live VM's usage (by slot order).
    pub fn end_period(
        &mut self,
        now: Nanos,
        window: f64,
        beta_base: f64,
        adjust: bool,
    ) -> (f64, Vec<(usize, VmUsage)>) {
        let len = now.0.saturating_sub(self.period_start.0);
        let total = self.total_share();
        let mut usage = Vec::new();
        let mut scaled_total = 0.0;
        for (slot, v) in self.vms.iter_mut().enumerate().filter(|(_, v)| v.live) {
            Self::settle(v, now);
            let n = if len > 0 { v.area as f64 / len as f64 } else { v.outstanding as f64 };
            let wk = if total > 0.0 { v.share / total * window } else { 0.0 };
            let s = if adjust && n < wk { n * v.share / wk } else { v.share };
            debug_assert!(s <= v.share + 1e-12, "invariant 4");
            scaled_total += s;
            usage.push((slot, VmUsage { share: v.share, mean_outstanding: n, window_share: wk, scaled_share: s }));
            v.area = 0;
        }
        self.period_start = now;
        let beta = if total > 0.0 { beta_base * (scaled_total / total).clamp(0.0, 1.0) } else { beta_base };
        debug_assert!((0.0..=beta_base).contains(&beta), "invariant 4");
        (beta, usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn backlogged_vms_keep_their_shares() {
        // §5.4 host 1: shares 20 + 10, K = 1/5 so beta = 6; both VMs keep 32 IOs outstanding and the
        // window is 40, so w_k = 26.7 and 13.3 are below n_k = 32: beta stays 6.
        let mut t = ShareTracker::new(Nanos(0));
        t.add(Nanos(0), 0, 20.0);
        t.add(Nanos(0), 1, 10.0);
        for _ in 0..32 {
            t.arrived(Nanos(0), 0);
            t.arrived(Nanos(0), 1);
        }
        let (beta, u) = t.end_period(Nanos(2 * S), 40.0, 6.0, true);
        assert_eq!(beta, 6.0);
        assert_eq!(u[0].1.mean_outstanding, 32.0);
        assert!((u[0].1.window_share - 40.0 * 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn an_idle_vm_lowers_beta_by_its_share() {
        // §5.5: host 1's VM with shares 10 idles: beta drops from 6 to 4.
        let mut t = ShareTracker::new(Nanos(0));
        t.add(Nanos(0), 0, 20.0);
        t.add(Nanos(0), 1, 10.0);
        for _ in 0..32 {
            t.arrived(Nanos(0), 0);
        }
        let (beta, u) = t.end_period(Nanos(2 * S), 40.0, 6.0, true);
        assert!((beta - 4.0).abs() < 1e-12, "{beta}");
        assert_eq!(u[1].1.scaled_share, 0.0);
        // Without adjustment beta stays.
        let (beta, _) = t.end_period(Nanos(4 * S), 40.0, 6.0, false);
        assert_eq!(beta, 6.0);
    }

    #[test]
    fn partial_use_scales_shares_by_time_average() {
        // VM with 10 shares of 10 (whole window 8): w_k = 8. It has 8 outstanding for half the period
        // and 0 for the other half: n_k = 4, s' = 4 * 10 / 8 = 5: beta halves.
        let mut t = ShareTracker::new(Nanos(0));
        t.add(Nanos(0), 0, 10.0);
        for _ in 0..8 {
            t.arrived(Nanos(0), 0);
        }
        for _ in 0..8 {
            t.departed(Nanos(S), 0);
        }
        let (beta, u) = t.end_period(Nanos(2 * S), 8.0, 2.0, true);
        assert_eq!(u[0].1.mean_outstanding, 4.0);
        assert!((beta - 1.0).abs() < 1e-12, "{beta}");
        // The next period starts from the current count (0), not from the history.
        let (beta, _) = t.end_period(Nanos(4 * S), 8.0, 2.0, true);
        assert_eq!(beta, 0.0);
        assert_eq!(t.outstanding(0), 0);
    }
}
