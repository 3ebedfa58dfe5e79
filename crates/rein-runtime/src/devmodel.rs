//! A modelled device in front of real storage, for repeatable QoS experiments.
//!
//! The model is the simulator's device (rein-sim's engine): a single FIFO server of rate C whose service
//! times follow a distribution with mean 1/C (plus, optionally, size / transfer rate). A request admitted
//! at `now` completes at `max(now, next_free) + service`, and `next_free` moves there. The dispatcher makes
//! each request wait until that time (in addition to the real IO), so a fast SSD can stand in for "a
//! 1,200 IOPS array" and the capacity can be halved at run time ([`DeviceModel::set_capacity`]).
//!
//! Randomness is a seeded PCG stream: the sequence of service times is repeatable run to run.

use rand::Rng;
use rand_pcg::Pcg64Mcg;
use rein_core::Nanos;
use std::sync::Mutex;

/// Service-time distribution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ServiceDist {
    Exponential,
    Deterministic,
    /// Uniform in [(1-spread)/C, (1+spread)/C].
    Uniform {
        spread: f64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceModelError {
    #[error("device model capacity must be a positive IOPS figure below 1e9, got {0}")]
    Capacity(f64),
    #[error("uniform spread must be in [0, 1], got {0}")]
    Spread(f64),
    #[error("transfer rate must be positive, got {0} MB/s")]
    Transfer(f64),
}

struct State {
    capacity: f64,
    next_free: Nanos,
    rng: Pcg64Mcg,
}

pub struct DeviceModel {
    dist: ServiceDist,
    ns_per_byte: f64,
    state: Mutex<State>,
}

fn check_capacity(iops: f64) -> Result<f64, DeviceModelError> {
    if iops.is_finite() && iops > 0.0 && iops < 1e9 {
        Ok(iops)
    } else {
        Err(DeviceModelError::Capacity(iops))
    }
}

impl DeviceModel {
    pub fn new(
        capacity_iops: f64,
        dist: ServiceDist,
        transfer_mb_s: Option<f64>,
        seed: u64,
    ) -> Result<DeviceModel, DeviceModelError> {
        let capacity = check_capacity(capacity_iops)?;
        if let ServiceDist::Uniform { spread } = dist {
            if !(0.0..=1.0).contains(&spread) {
                return Err(DeviceModelError::Spread(spread));
            }
        }
        let ns_per_byte = match transfer_mb_s {
            None => 0.0,
            Some(t) if t.is_finite() && t > 0.0 => 1e9 / (t * 1e6),
            Some(t) => return Err(DeviceModelError::Transfer(t)),
        };
        Ok(DeviceModel {
            dist,
            ns_per_byte,
            state: Mutex::new(State {
                capacity,
                next_free: Nanos::ZERO,
                rng: Pcg64Mcg::new(0xcafe_f00d_d15e_a5e5 ^ seed as u128),
            }),
        })
    }

    pub fn capacity(&self) -> f64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).capacity
    }

    /// Sets a new capacity (IOPS); returns false (and changes nothing) for an invalid value.
    pub fn set_capacity(&self, iops: f64) -> bool {
        match check_capacity(iops) {
            Ok(c) => {
                self.state.lock().unwrap_or_else(|p| p.into_inner()).capacity = c;
                true
            }
            Err(_) => false,
        }
    }

    /// Admits a request of `bytes` at `now`; returns when the modelled device completes it.
    pub fn admit(&self, now: Nanos, bytes: u64) -> Nanos {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mean = 1e9 / s.capacity;
        let base = match self.dist {
            ServiceDist::Exponential => -(1.0 - s.rng.gen::<f64>()).ln() * mean,
            ServiceDist::Deterministic => mean,
            ServiceDist::Uniform { spread } => mean * (1.0 - spread + 2.0 * spread * s.rng.gen::<f64>()),
        };
        let service = Nanos((base + bytes as f64 * self.ns_per_byte).max(1.0) as u64);
        let start = now.max(s.next_free);
        s.next_free = start.saturating_add(service);
        s.next_free
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_device_at_its_rate() {
        let d = DeviceModel::new(1000.0, ServiceDist::Deterministic, None, 1).unwrap();
        // Ten requests at t = 0 complete 1 ms apart.
        let done: Vec<Nanos> = (0..10).map(|_| d.admit(Nanos(0), 4096)).collect();
        assert_eq!(done[0], Nanos::from_millis(1));
        assert_eq!(done[9], Nanos::from_millis(10));
        // Halving the capacity doubles the service time.
        assert!(d.set_capacity(500.0));
        assert_eq!(d.admit(Nanos(0), 0), Nanos::from_millis(12));
        assert!(!d.set_capacity(-1.0) && !d.set_capacity(f64::NAN));
        assert_eq!(d.capacity(), 500.0);
        assert!(DeviceModel::new(0.0, ServiceDist::Exponential, None, 1).is_err());
        assert!(DeviceModel::new(10.0, ServiceDist::Uniform { spread: 2.0 }, None, 1).is_err());
    }

    #[test]
    fn exponential_mean_is_one_over_capacity() {
        let d = DeviceModel::new(2000.0, ServiceDist::Exponential, None, 7).unwrap();
        let mut last = Nanos(0);
        for _ in 0..100_000 {
            last = d.admit(Nanos(0), 0);
        }
        let per = last.0 as f64 / 100_000.0;
        assert!((per - 500_000.0).abs() < 10_000.0, "{per} ns");
    }
}
