//! Units: integer time, fixed-point tags and costs, and rate-to-step conversion.
//!
//! # Model
//! Every scheduler in this crate is driven by time passed in from outside as [`Nanos`]: nanoseconds from
//! an arbitrary monotonic origin chosen by the caller (the simulator starts at zero, the daemons use a
//! monotonic clock). Nothing here reads a clock.
//!
//! Tags (mClock's R/L/P, RBFQ's local/global/upper-bound tags) are [`Tag`]s: nanoseconds in 96.32
//! fixed point held in a `u128`. A tag step is `cost / rate` seconds; we precompute, per tenant and
//! per clock, the step for one unit of cost, [`step_for_rate`], rounded to the nearest 2^-32 ns.
//!
//! # Precision (why 32 fractional bits)
//! Tags of a backlogged tenant advance by exact integer additions, so they never drift; the only error
//! is the rounding of the step, at most 2^-33 ns per IO. A tenant at r = 1,000,000 IOPS for one hour
//! issues 3.6e9 IOs, so its tags are off by at most 3.6e9 * 2^-33 ns = 0.42 ns against a 1,000 ns
//! spacing: well within one IO. (With whole-nanosecond steps, r = 999,999 IOPS would drift by 3,600 IOs
//! over the same hour.) A `u128` holds 2^96 ns, about 2.5e12 years: tags that follow real time (R and
//! L tags, which a tenant's own requests can push ahead of it by at most one bounded increment each)
//! cannot overflow in any run. Virtual time (P tags, SFQ's tags) does not follow real time and can reach
//! the end of a `u128` in days under the per-byte cost model; the schedulers renormalise it (the engine's
//! module comment, "Virtual time's range").
//!
//! Costs are [`Cost`]s: fixed point with 16 fractional bits, so one unit-cost IO is `Cost::ONE`
//! and §3.1's fractional `1 + S/(Tm*Bpeak)` costs are represented to 1/65536 of an IO.
//!
//! # Bounds
//! - Rates are in [`MIN_RATE`, `MAX_RATE`] cost units per second; a reservation may be 0 (none), a limit
//!   may be absent (unlimited) but not 0.
//! - Weights are in [`MIN_WEIGHT`, `MAX_WEIGHT`].
//! - A cost is at most [`Cost::MAX_UNITS`] units; with these bounds `cost * step` fits in a `u128`.

use std::fmt;

/// Nanoseconds since an arbitrary monotonic origin chosen by the caller.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub u64);

/// The latest `now` a state machine has seen. Every input carries a `now`; one earlier than the latest
/// (a caller with several clock sources can race by a few nanoseconds) is treated as the latest and
/// counted, so time never goes backwards inside the machine and the caller can see that it happened.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LatestTime {
    now: Nanos,
    regressions: u64,
}

impl LatestTime {
    /// A clock whose latest time is `now`, with no regressions counted ([`Default`] starts at zero).
    pub const fn starting_at(now: Nanos) -> LatestTime {
        LatestTime { now, regressions: 0 }
    }
    /// Takes the caller's `now` and returns the time to use: `now`, or the latest seen if `now` is earlier.
    #[inline]
    pub fn advance(&mut self, now: Nanos) -> Nanos {
        if now < self.now {
            self.regressions += 1;
        } else {
            self.now = now;
        }
        self.now
    }
    /// The latest time seen (what [`LatestTime::advance`] last returned).
    #[inline]
    pub fn now(&self) -> Nanos {
        self.now
    }
    /// How many times a `now` earlier than the latest was clamped.
    pub fn regressions(&self) -> u64 {
        self.regressions
    }
}

impl Nanos {
    /// The caller's origin.
    pub const ZERO: Nanos = Nanos(0);
    /// The latest representable time, about 584 years after the origin; saturating arithmetic stops here.
    pub const MAX: Nanos = Nanos(u64::MAX);
    /// Nanoseconds per second.
    pub const PER_SEC: u64 = 1_000_000_000;

    /// `s` whole seconds. The product must fit in a `u64` (up to about 584 years): overflow panics when
    /// overflow checks are on.
    pub const fn from_secs(s: u64) -> Nanos {
        Nanos(s * Self::PER_SEC)
    }
    /// `ms` whole milliseconds (the product must fit, as for [`Nanos::from_secs`]).
    pub const fn from_millis(ms: u64) -> Nanos {
        Nanos(ms * 1_000_000)
    }
    /// `us` whole microseconds (the product must fit, as for [`Nanos::from_secs`]).
    pub const fn from_micros(us: u64) -> Nanos {
        Nanos(us * 1_000)
    }
    /// Seconds as `f64` (for reports only; never for tag arithmetic).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    /// Rounds a non-negative finite number of seconds to the nearest nanosecond (saturating).
    pub fn from_secs_f64(s: f64) -> Nanos {
        if s.is_nan() || s <= 0.0 {
            return Nanos::ZERO;
        }
        let ns = s * 1e9;
        if ns >= u64::MAX as f64 {
            Nanos::MAX
        } else {
            Nanos(ns.round() as u64)
        }
    }
    /// A duration, saturating at [`Nanos::MAX`] (about 584 years).
    pub fn from_duration(d: std::time::Duration) -> Nanos {
        Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
    /// `self + d`, at most [`Nanos::MAX`].
    pub fn saturating_add(self, d: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(d.0))
    }
    /// `self - d`, at least [`Nanos::ZERO`] (so an elapsed time, never negative).
    pub fn saturating_sub(self, d: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(d.0))
    }
}

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.9}s", self.as_secs_f64())
    }
}

/// Number of fractional bits in a [`Tag`].
pub const TAG_FRAC_BITS: u32 = 32;

/// A scheduling tag: nanoseconds in 96.32 fixed point. See the module comment for precision.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag(pub u128);

impl Tag {
    /// Tag 0: the origin, and the value of a clock a tenant does not use.
    pub const ZERO: Tag = Tag(0);

    /// The tag at the whole nanosecond `t` (exact: every `Nanos` is a tag).
    pub const fn from_nanos(t: Nanos) -> Tag {
        Tag((t.0 as u128) << TAG_FRAC_BITS)
    }
    /// The first whole nanosecond at or after this tag (saturating at `Nanos::MAX`).
    pub fn ceil_nanos(self) -> Nanos {
        let whole = self.0.saturating_add((1u128 << TAG_FRAC_BITS) - 1) >> TAG_FRAC_BITS;
        Nanos(u64::try_from(whole).unwrap_or(u64::MAX))
    }
    /// Tag as seconds (for reports and tests only).
    pub fn as_secs_f64(self) -> f64 {
        (self.0 as f64) / ((1u128 << TAG_FRAC_BITS) as f64) / 1e9
    }
    /// Earlier by `d` tag units (2^-32 ns), at least [`Tag::ZERO`].
    pub fn saturating_sub(self, d: u128) -> Tag {
        Tag(self.0.saturating_sub(d))
    }
    /// Later by `d` tag units (2^-32 ns), saturating at `u128::MAX` (a guard only: the bounds in the
    /// module comment, and the schedulers' renormalisation of virtual time, keep tags below it).
    pub fn saturating_add(self, d: u128) -> Tag {
        Tag(self.0.saturating_add(d))
    }
}

/// Smallest non-zero rate (cost units per second) a spec may carry: one IO per ~17 minutes.
pub const MIN_RATE: f64 = 1e-3;
/// Largest rate (cost units per second): 1e12, i.e. 1 TB/s under the per-byte cost model.
pub const MAX_RATE: f64 = 1e12;
/// Smallest weight.
pub const MIN_WEIGHT: f64 = 1e-3;
/// Largest weight.
pub const MAX_WEIGHT: f64 = 1e6;

/// Tag advance, in tag units (2^-32 ns), for one unit of cost at `rate` units per second, rounded to
/// the nearest unit. `rate` must be in `[MIN_RATE, MAX_RATE]` (or a weight in its range); callers
/// validate through [`crate::QosSpec`].
pub fn step_for_rate(rate: f64) -> u128 {
    debug_assert!(rate.is_finite() && rate > 0.0, "step_for_rate({rate})");
    // 2^32 * 1e9 / rate, computed in f64 then rounded: f64 has 53 bits of mantissa and the largest step
    // (rate = 1e-3) is 4.3e21 < 2^72, so the relative rounding error is 2^-53, far below one tag unit
    // for any step under 2^53 units (about 2 ms) and below 2^-53 of the step above that.
    let s = (((1u128 << TAG_FRAC_BITS) as f64) * 1e9 / rate).round();
    if s < 1.0 {
        1
    } else {
        s as u128
    }
}

/// The cost of a request in fixed point: `Cost::ONE` is one unit (one IO under the per-IO model, one byte
/// under the per-byte model with unit 1).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cost(pub u64);

impl Cost {
    /// Fractional bits: one unit is `1 << 16`.
    pub const FRAC_BITS: u32 = 16;
    /// One unit of cost: one IO under the per-IO model, `unit_bytes` bytes under the per-byte model.
    pub const ONE: Cost = Cost(1 << Self::FRAC_BITS);
    /// The smallest cost a request is charged: 1/65536 of a unit. Zero-cost requests are charged this, so
    /// that a stream of free requests still advances its tenant's tags and cannot monopolise a server.
    pub const MIN: Cost = Cost(1);
    /// Largest number of whole units one request may cost (2^40, e.g. a 1 TiB request per byte).
    pub const MAX_UNITS: u64 = 1 << 40;
    /// The largest cost a request is charged: [`Cost::MAX_UNITS`] units.
    pub const MAX: Cost = Cost(Self::MAX_UNITS << Self::FRAC_BITS);

    /// `n` whole units, unclamped (`n` up to [`Cost::MAX_UNITS`] stays within [`Cost::MAX`]).
    pub const fn units(n: u64) -> Cost {
        Cost(n << Self::FRAC_BITS)
    }
    /// Converts a non-negative number of units, clamped to `[MIN, MAX]`.
    pub fn from_f64(units: f64) -> Cost {
        if units.is_nan() || units <= 0.0 {
            return Cost::MIN;
        }
        let v = units * (1u64 << Self::FRAC_BITS) as f64;
        if v >= Self::MAX.0 as f64 {
            Cost::MAX
        } else {
            Cost((v.round() as u64).max(1))
        }
    }
    /// The cost in units, as `f64` (for reports; never for tag arithmetic).
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / (1u64 << Self::FRAC_BITS) as f64
    }
    /// Clamps into `[MIN, MAX]`.
    pub fn clamped(self) -> Cost {
        Cost(self.0.clamp(Self::MIN.0, Self::MAX.0))
    }
    /// Tag advance for this cost at a per-unit step (see [`step_for_rate`]).
    #[inline]
    pub fn times_step(self, step: u128) -> u128 {
        if self == Cost::ONE {
            step
        } else {
            // whole units <= 2^48 (a u64 of fixed point) and step < 2^72, so whole * step < 2^120 and
            // frac * step < 2^88: both fit a u128 (saturating only as a guard).
            let whole = (self.0 >> Self::FRAC_BITS) as u128;
            let frac = (self.0 & ((1 << Self::FRAC_BITS) - 1)) as u128;
            whole.saturating_mul(step).saturating_add((frac * step) >> Self::FRAC_BITS)
        }
    }
    /// The sum, saturating at `u64::MAX` fixed-point units (not clamped to [`Cost::MAX`]: a request's cost
    /// plus a distributed delta may exceed it).
    pub fn saturating_add(self, o: Cost) -> Cost {
        Cost(self.0.saturating_add(o.0))
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Error messages print numbers as given, short: huge and tiny ones in exponent form.
    #[test]
    fn num_prints_short() {
        let p = |x: f64| Num(x).to_string();
        assert_eq!(p(1e308), "1e308");
        assert_eq!(p(-2.5e20), "-2.5e20");
        assert_eq!(p(1.5e-7), "1.5e-7");
        // As `{}` prints them in between (the messages' tests compare these).
        assert_eq!(p(-2.0), "-2");
        assert_eq!(p(0.0), "0");
        assert_eq!(p(0.5), "0.5");
        assert_eq!(p(604_800.0), "604800");
        assert_eq!(p(9e15), "9000000000000000");
        assert_eq!(p(f64::INFINITY), "inf");
        assert_eq!(p(f64::NAN), "NaN");
    }

    #[test]
    fn one_million_iops_hour_is_exact() {
        // 3.6e9 steps of the rounded step land within one IO spacing of one hour.
        let step = step_for_rate(1e6);
        let n: u128 = 3_600_000_000;
        let hour = Tag::from_nanos(Nanos::from_secs(3600)).0;
        let err = (n * step).abs_diff(hour);
        assert!(err < step, "error {err} tag units vs step {step}");
        // An awkward rate too.
        let step = step_for_rate(999_999.0);
        let n: u128 = 3_599_996_400; // 999,999 * 3600
        let err = (n * step).abs_diff(hour);
        assert!(err < step / 1000, "error {err} vs step {step}");
    }

    #[test]
    fn cost_times_step_matches_whole_and_fraction() {
        let step = step_for_rate(1000.0);
        assert_eq!(Cost::ONE.times_step(step), step);
        assert_eq!(Cost::units(3).times_step(step), 3 * step);
        let half = Cost(Cost::ONE.0 / 2);
        assert_eq!(half.times_step(step), step / 2);
        // The largest cost at the largest step saturates instead of overflowing.
        let big = Cost::MAX.times_step(step_for_rate(MIN_RATE));
        assert!(big > 0);
    }

    #[test]
    fn cost_from_f64_clamps() {
        assert_eq!(Cost::from_f64(0.0), Cost::MIN);
        assert_eq!(Cost::from_f64(-5.0), Cost::MIN);
        assert_eq!(Cost::from_f64(f64::NAN), Cost::MIN);
        assert_eq!(Cost::from_f64(1e30), Cost::MAX);
        assert_eq!(Cost::from_f64(1.0), Cost::ONE);
    }

    #[test]
    fn a_count_says_its_noun_in_the_singular_only_for_one() {
        assert_eq!(Count(1, "tenant").to_string(), "1 tenant");
        assert_eq!(Count(0, "tenant").to_string(), "0 tenants");
        assert_eq!(Count(2, "node connection").to_string(), "2 node connections");
        assert_eq!(Count(1, "entry").to_string(), "1 entry");
        assert_eq!(Count(3, "entry").to_string(), "3 entries");
        assert_eq!(Count(2, "key").to_string(), "2 keys");
    }

    /// The bounds the engine's "Virtual time's range" rests on: the largest step is under 2^72, and a
    /// request's largest P increment (its cost plus a delta, each at most `Cost::MAX`) under 2^113.
    #[test]
    fn the_largest_step_and_increment_fit_their_bounds() {
        let step = step_for_rate(MIN_WEIGHT);
        assert_eq!(step, step_for_rate(MIN_RATE));
        assert!(step < 1 << 72, "{step}");
        assert!(Cost::MAX.saturating_add(Cost::MAX).times_step(step) < 1 << 113);
        assert!(Cost(u64::MAX).times_step(step) < 1 << 120);
    }

    #[test]
    fn tag_ceil() {
        assert_eq!(Tag::from_nanos(Nanos(5)).ceil_nanos(), Nanos(5));
        assert_eq!(Tag(Tag::from_nanos(Nanos(5)).0 + 1).ceil_nanos(), Nanos(6));
        assert_eq!(Tag(u128::MAX).ceil_nanos(), Nanos::MAX);
    }
}

/// A count and its noun as Rein's messages print them: `1 tenant`, `2 tenants`, `0 tenants`; a noun
/// ending in a consonant and `y` takes `ies` (`1 entry`, `3 entries`). The noun is given in the singular;
/// only the last word is made plural (`2 node connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count<'a>(pub usize, pub &'a str);

impl fmt::Display for Count<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Count(n, noun) = *self;
        if n == 1 {
            return write!(f, "1 {noun}");
        }
        match noun.strip_suffix('y') {
            Some(stem) if !stem.ends_with(['a', 'e', 'i', 'o', 'u']) => write!(f, "{n} {stem}ies"),
            _ => write!(f, "{n} {noun}s"),
        }
    }
}

/// A number as Rein's error messages print it: as `{}` prints an `f64` while that stays short, in
/// exponent form when `{}` would print a long run of zeros (from 1e16 up, below 1e-5), so a value
/// given as `1e308` reads back as `1e308` rather than as 309 digits. Infinities and NaN print as `{}`
/// prints them (`inf`, `NaN`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Num(pub f64);

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let x = self.0;
        if x != 0.0 && x.is_finite() && !(1e-5..1e16).contains(&x.abs()) {
            write!(f, "{x:e}")
        } else {
            write!(f, "{x}")
        }
    }
}
