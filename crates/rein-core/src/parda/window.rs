//! eq. (2): the window controller, with bounds and a fractional window issued exactly.
//!
//! `w(t+1) = (1 - gamma) w(t) + gamma (script_L / L(t) * w(t) + beta)`, clamped to `[w_min, w_max]`
//! (invariant 1 of the `parda` module), once per control period.
//!
//! # Issuing a fractional window (invariant 2)
//! The window is a real number; the array sees an integer count of outstanding IOs. [`issue_limit`]
//! is `floor(w)` or `floor(w) + 1`, chosen by error diffusion: each time a slot frees (a completion)
//! the fractional part of `w`, in 2^-32 fixed point, is added to an accumulator; when it carries, the
//! limit is `floor(w) + 1` until the next completion. Over k completions at a constant `w` the carries
//! number `floor(k * frac(w) + acc0)`, so the mean limit is `w` within `1/k`: no drift, no truncation.
//!
//! [`issue_limit`]: WindowController::issue_limit

use super::{PardaConfig, MAX_WINDOW};

const FRAC_ONE: u64 = 1 << 32;

/// eq. (2); see the module comment.
#[derive(Clone, Debug)]
pub struct WindowController {
    threshold_ns: f64,
    gamma: f64,
    w_min: f64,
    w_max: f64,
    window: f64,
    /// Fixed-window (uncontrolled) hosts never update.
    fixed: bool,
    /// Error-diffusion accumulator, in [0, 2^32).
    acc: u64,
    /// The current limit: floor(w) or floor(w) + 1.
    limit: u32,
}

impl WindowController {
    /// A controller starting at the config's initial window (default `w_max`). The config is assumed
    /// validated.
    pub fn new(config: &PardaConfig) -> Self {
        let w = config.initial_window.unwrap_or(config.w_max);
        let mut c = WindowController {
            threshold_ns: config.threshold_ns(),
            gamma: config.gamma,
            w_min: config.w_min,
            w_max: config.w_max,
            window: w,
            fixed: false,
            acc: FRAC_ONE / 2,
            limit: 0,
        };
        c.check();
        c.limit = c.next_limit();
        c
    }

    /// A controller that never changes its window (an uncontrolled host with a fixed issue queue).
    pub fn fixed(window: f64) -> Self {
        let window = window.clamp(1.0, MAX_WINDOW);
        let mut c = WindowController {
            threshold_ns: 1.0,
            gamma: 0.0,
            w_min: window,
            w_max: window,
            window,
            fixed: true,
            acc: FRAC_ONE / 2,
            limit: 0,
        };
        c.limit = c.next_limit();
        c
    }

    #[inline]
    fn check(&self) {
        assert!(
            self.window >= self.w_min && self.window <= self.w_max,
            "invariant 1: window {} outside [{}, {}]",
            self.window,
            self.w_min,
            self.w_max
        );
    }

    /// w(t).
    pub fn window(&self) -> f64 {
        self.window
    }

    /// Whether this is an uncontrolled host's controller ([`WindowController::fixed`]), which never updates.
    pub fn is_fixed(&self) -> bool {
        self.fixed
    }

    /// One period's update with the latency signal `latency_ns` (L(t)) and the host's `beta`; returns
    /// the new window. A fixed controller, or no signal (`None`: no IO anywhere), keeps the window.
    pub fn update(&mut self, latency_ns: Option<f64>, beta: f64) -> f64 {
        let Some(l) = latency_ns.filter(|l| l.is_finite() && *l > 0.0) else { return self.window };
        if self.fixed {
            return self.window;
        }
        let target = self.threshold_ns / l * self.window + beta.max(0.0);
        let w = (1.0 - self.gamma) * self.window + self.gamma * target;
        // NaN cannot occur (l > 0, finite inputs); clamp keeps invariant 1.
        self.window = w.clamp(self.w_min, self.w_max);
        self.check();
        self.window
    }

    /// The number of IOs the host may have outstanding now (invariant 2).
    #[inline]
    pub fn issue_limit(&self) -> u32 {
        self.limit
    }

    /// A slot freed: pick the limit until the next completion by error diffusion (module comment).
    #[inline]
    pub fn on_slot_freed(&mut self) {
        self.limit = self.next_limit();
    }

    fn next_limit(&mut self) -> u32 {
        let whole = self.window.floor();
        let frac = ((self.window - whole) * FRAC_ONE as f64) as u64;
        self.acc += frac;
        let carry = self.acc >= FRAC_ONE;
        if carry {
            self.acc -= FRAC_ONE;
        }
        let limit = whole as u32 + carry as u32;
        debug_assert!(limit as f64 >= whole && limit as f64 <= whole + 1.0, "invariant 2");
        limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::Nanos;

    fn config(w_min: f64, w_max: f64, gamma: f64) -> PardaConfig {
        PardaConfig::new(Nanos::from_millis(30), 0.5, gamma, w_min, w_max).unwrap()
    }

    #[test]
    fn eq2_step_and_bounds() {
        let mut c = WindowController::new(&PardaConfig { initial_window: Some(20.0), ..config(1.0, 64.0, 0.5) });
        // L = 2 script-L: target = 10 + beta 2 = 12; w = 0.5*20 + 0.5*12 = 16.
        assert_eq!(c.update(Some(60e6), 2.0), 16.0);
        // L = script-L: target = w + beta; the window grows by gamma * beta.
        assert_eq!(c.update(Some(30e6), 2.0), 17.0);
        // Far below the threshold: clamped at w_max; far above: at w_min.
        assert_eq!(c.update(Some(1.0), 2.0), 64.0);
        for _ in 0..50 {
            c.update(Some(1e15), 0.0);
        }
        assert_eq!(c.window(), 1.0);
        // No signal: unchanged.
        assert_eq!(c.update(None, 5.0), 1.0);
        assert_eq!(c.update(Some(f64::NAN), 5.0), 1.0);
    }

    #[test]
    fn fixed_point_is_beta_l_over_l_minus_threshold() {
        // With L held at 40 ms (script-L 30 ms) and beta 3, w* = 3 * 40 / 10 = 12.
        let mut c = WindowController::new(&config(1.0, 64.0, 0.8));
        for _ in 0..200 {
            c.update(Some(40e6), 3.0);
        }
        assert!((c.window() - 12.0).abs() < 1e-9, "{}", c.window());
        assert!((crate::parda::fixed_point_window(3.0, 0.040, 0.030) - c.window()).abs() < 1e-9);
        assert!(crate::parda::fixed_point_window(3.0, 0.030, 0.030).is_nan(), "no fixed point at script-L");
    }

    #[test]
    fn fractional_windows_are_issued_exactly() {
        for w in [1.0, 4.25, 4.3, 7.999, 12.5, 63.01] {
            let mut c = WindowController::new(&PardaConfig { initial_window: Some(w), ..config(1.0, 64.0, 0.5) });
            let n = 100_000u64;
            let mut sum = 0u64;
            for _ in 0..n {
                let l = c.issue_limit();
                assert!(l as f64 == w.floor() || l as f64 == w.floor() + 1.0, "invariant 2: {l} for {w}");
                sum += l as u64;
                c.on_slot_freed();
            }
            let mean = sum as f64 / n as f64;
            assert!((mean - w).abs() <= 1.0 / n as f64 + 1e-9, "w {w}: mean limit {mean}");
        }
    }

    #[test]
    fn fixed_controller_never_moves() {
        let mut c = WindowController::fixed(32.0);
        assert!(c.is_fixed());
        assert_eq!(c.update(Some(1e12), 1.0), 32.0);
        assert_eq!(c.issue_limit(), 32);
    }
}
