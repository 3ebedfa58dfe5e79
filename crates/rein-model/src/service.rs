//! Service times: the distributions a device draws from, the job they are drawn for, the one rounding
//! rule, and the draw itself (`Draw`: model, current speed and random stream), shared by every
//! discipline of [`crate::device`] and by the disks of [`crate::array`].
//!
//! The *disk* service model is position dependent: an access farther than `sequential_bytes` from where
//! the previous one ended pays a seek (growing with the square root of the distance, normalised to
//! 100 GiB) and a uniform rotational delay, then the transfer; closer accesses pay only the transfer.
//! Whose head "the previous one" is depends on the caller: the device's one head (FIFO, processor
//! sharing) or each disk's own (an array).

use rand::Rng;
use rand_pcg::Pcg64Mcg;

/// Service-time distribution of a device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ServiceModel {
    /// Exponential with mean 1/C (a memoryless device).
    Exponential,
    /// Uniform in `[(1 - spread)/C, (1 + spread)/C]`.
    Uniform {
        /// Half-width relative to the mean, in [0, 1].
        spread: f64,
    },
    /// Always 1/C.
    Deterministic,
    /// A disk: seek and rotation by position, then transfer (module comment).
    Disk(DiskModel),
}

/// The position-dependent disk model's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskModel {
    /// Average seek of a random access (ns), scaled by the distance (module comment).
    pub seek_ns: f64,
    /// A full rotation (ns); a random access waits a uniform fraction of it.
    pub rotation_ns: f64,
    /// Media transfer rate, bytes per ns.
    pub transfer_bytes_per_ns: f64,
    /// Accesses closer than this to the previous one are sequential (no seek, no rotation).
    pub sequential_bytes: u64,
}

impl ServiceModel {
    /// A service time (ns) with mean `mean_ns` for a request whose position does not matter: drawn for
    /// the exponential and uniform models, the mean itself for the deterministic model and for the disk
    /// model (whose position-dependent time [`crate::device::Device`] computes from request offsets).
    #[inline]
    pub fn positionless_ns(&self, mean_ns: f64, rng: &mut impl Rng) -> f64 {
        match *self {
            ServiceModel::Exponential => exponential(mean_ns, rng),
            ServiceModel::Uniform { spread } => mean_ns * (1.0 - spread + 2.0 * spread * rng.gen::<f64>()),
            ServiceModel::Deterministic | ServiceModel::Disk(_) => mean_ns,
        }
    }

    /// The model's name as configuration files write it.
    pub fn name(&self) -> &'static str {
        match self {
            ServiceModel::Exponential => "exponential",
            ServiceModel::Uniform { .. } => "uniform",
            ServiceModel::Deterministic => "deterministic",
            ServiceModel::Disk(_) => "disk",
        }
    }
}

/// An exponential draw with mean `mean` (inverse transform; `1 - u` keeps the logarithm finite).
#[inline]
pub(crate) fn exponential(mean: f64, rng: &mut impl Rng) -> f64 {
    -(1.0 - rng.gen::<f64>()).ln() * mean
}

/// `x.round() as u64` for a service time `x >= 1` ns: the one rounding rule of FIFO service times (round
/// half away from zero). Below 2^52, `x + 0.5` is exact or lands on the next power of two, so truncating
/// it rounds exactly as `round` does, without the libm call `round` is on baseline x86-64. (Larger values
/// are integers already.)
#[inline]
pub fn round_ns(x: f64) -> u64 {
    if (1.0..4_503_599_627_370_496.0).contains(&x) {
        (x + 0.5) as u64
    } else {
        x.round() as u64
    }
}

/// A request as the device sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// The caller's handle, returned when the job finishes.
    pub id: u32,
    /// Bytes transferred (the transfer term and the disk's transfer).
    pub size: u64,
    /// Byte offset (the disk's position).
    pub offset: u64,
    /// Multiplier on this job's service time (placement skew; 1 for none).
    pub scale: f64,
    /// A write (an array's RAID-5 writes cost more; other devices ignore it).
    pub write: bool,
}

/// Service-time draws: the model, the current speed and the device's random stream.
#[derive(Debug)]
pub(crate) struct Draw {
    pub(crate) service: ServiceModel,
    /// Mean service time of an access at the nominal capacity (ns).
    pub(crate) mean_ns: f64,
    pub(crate) ns_per_byte: f64,
    /// Service-time multiplier C0 / C(t).
    pub(crate) slow: f64,
    pub(crate) rng: Pcg64Mcg,
}

impl Draw {
    /// An access's service time (ns, at least 1): `size` bytes at `offset` by a head that is at `*head`
    /// and moves to the access's end.
    #[inline]
    pub(crate) fn ns(&mut self, head: &mut u64, offset: u64, size: u64, scale: f64) -> f64 {
        let base = match self.service {
            ServiceModel::Disk(d) => {
                let dist = offset.abs_diff(*head);
                let position = if dist <= d.sequential_bytes {
                    0.0
                } else {
                    // Seek time grows with the square root of the distance (normalised to 100 GiB), plus a
                    // uniform rotational delay.
                    let frac = (dist as f64 / (100u64 << 30) as f64).min(1.0);
                    d.seek_ns * (0.3 + 0.7 * frac.sqrt()) * 1.5 + d.rotation_ns * self.rng.gen::<f64>()
                };
                position + size as f64 / d.transfer_bytes_per_ns
            }
            s => s.positionless_ns(self.mean_ns, &mut self.rng),
        };
        *head = offset.saturating_add(size);
        self.scaled(base, size, scale)
    }

    /// The write half of a read-modify-write at the place just read (ns): a full rotation and the
    /// transfer for the disk model, another draw for the others.
    #[inline]
    pub(crate) fn rewrite_ns(&mut self, size: u64, scale: f64) -> f64 {
        let base = match self.service {
            ServiceModel::Disk(d) => d.rotation_ns + size as f64 / d.transfer_bytes_per_ns,
            s => s.positionless_ns(self.mean_ns, &mut self.rng),
        };
        self.scaled(base, size, scale)
    }

    /// A drawn `base` time with the transfer term, the capacity's slowdown and the job's scale (ns, at
    /// least 1).
    #[inline]
    fn scaled(&self, base: f64, size: u64, scale: f64) -> f64 {
        ((base + size as f64 * self.ns_per_byte) * self.slow * scale).max(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn round_ns_is_round() {
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        let edges = [
            1.0,
            1.5,
            2.5,
            2.4999999999999996,
            3.9999999999999996,
            4.5,
            1e15 + 0.5,
            4503599627370495.5,
            4503599627370497.0,
            1e300,
        ];
        for &x in &edges {
            assert_eq!(round_ns(x), x.round() as u64, "{x}");
        }
        for _ in 0..1_000_000 {
            let x = 1.0 + rng.gen::<f64>() * 10f64.powi(rng.gen_range(0..16));
            assert_eq!(round_ns(x), x.round() as u64, "{x}");
            let y = x.floor() + 0.5;
            assert_eq!(round_ns(y), y.round() as u64, "{y}");
            let z = f64::from_bits(y.to_bits() - 1);
            assert_eq!(round_ns(z), z.round() as u64, "{z}");
        }
    }
}
