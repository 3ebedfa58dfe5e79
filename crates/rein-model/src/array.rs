//! Disk arrays: a RAID group of disks behind one device, the discipline of `discipline = "array"`.
//!
//! # Model
//! The device is `disks` disks, each a FIFO queue with its own head position, and a stripe layout that
//! maps a request to the disks it touches (Chen et al., "RAID: High-performance, reliable secondary
//! storage", the survey parda.txt and flow-control-position.txt cite as \[5\] and \[4\]):
//! - **RAID-0**: stripe unit `k` (bytes `[k u, (k + 1) u)` of the device, `u` = `stripe_bytes`) is on disk
//!   `k mod D` at disk offset `(k div D) u`.
//! - **RAID-5** (left-symmetric): row `r` holds `D - 1` data units and one parity unit; the parity is on
//!   disk `p = D - 1 - (r mod D)`, data unit `j` of the row on disk `(p + 1 + j) mod D`, all at disk offset
//!   `r u`. A read touches the data disks only. A write that covers whole rows writes every unit of
//!   them and their parity; a partial-row write is a read-modify-write of each data piece and of the
//!   parity beside it: four disk accesses for a small write, the RAID-5 penalty the papers quote ("writes
//!   may take four times longer than reads due to parity reads and updates").
//!
//! A request is split into one access per stripe unit it touches (plus parity for RAID-5 writes), and
//! the pieces that continue each other on one disk are one access (a large RAID-0 request is at most one
//! access per disk); each access waits in its disk's queue and is served alone. The request completes
//! when its last access does. An access's service time is the device's service model ([`crate::device::ServiceModel`]): the
//! *disk* model by the distance from that disk's head; the other models with mean `D / capacity_iops`,
//! so that `D` disks busy at once serve the nominal capacity in single-access requests. A
//! read-modify-write access is a read and then, for the disk model, a full rotation and the transfer
//! (the sector comes round again), for the other models a second draw.
//!
//! Unlike processor sharing (full throughput from one request on), an array's throughput grows with the
//! requests at it until every disk is busy: with `Q` single-access requests spread uniformly over `D`
//! disks of exponential service (a closed product-form network of identical FIFO stations), the disks
//! are busy `Q / (Q + D - 1)` of the time. That is what makes parda.txt §5.2's "latency vs queue length"
//! (Fig. 6) and the position paper's Fig. 3(a)(b) reproducible: the array's throughput levels off with
//! the queue while its latency keeps growing.
//!
//! The device's busy time (a report's `utilisation`, `rein serve`'s device busy seconds) counts the time any
//! request is at the array, as for the other disciplines; the disks themselves are busy less (in the
//! closed network above, `Q / (Q + D - 1)` each).
//!
//! # Deviations from a real array
//! No controller cache, read-ahead or write-back (reads and writes go to the disks), no per-disk
//! reordering (each disk is FIFO), and a partial-row write updates the parity once per data piece rather
//! than once per row.
//!
//! # Invariants
//! 1. A disk has an access in service iff it has a completion time; its queue is empty when it is idle.
//! 2. `left` holds exactly the requests at the array, each with the number of its accesses not yet done
//!    (at least 1).
//! 3. A disk starts its next access when the previous one completes (at that completion's time).

use crate::service::{round_ns, Draw, Job};
use rein_core::Nanos;
use serde::Deserialize;
use std::collections::{HashMap, VecDeque};

/// Most disks an array may have.
pub const MAX_DISKS: u32 = 1024;
/// Smallest stripe unit (KiB): keeps the accesses per request bounded (a 32 MiB request touches at most
/// 8,192 units).
pub const MIN_STRIPE_KB: f64 = 4.0;
/// Largest stripe unit (KiB).
pub const MAX_STRIPE_KB: f64 = 1024.0 * 1024.0;

/// The RAID level of an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raid {
    /// Striping without redundancy.
    Zero,
    /// Striping with rotating parity (module comment).
    Five,
}

/// A validated array layout (module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArraySpec {
    /// Disks D.
    pub disks: u32,
    /// Stripe unit (bytes).
    pub stripe_bytes: u64,
    /// RAID level.
    pub raid: Raid,
}

/// `array = { disks = 10, stripe_kb = 64, raid = 5 }`: an array's layout as configuration files write it
/// (a scenario's `[[servers]]`, rein.toml's `[device_model]`), with `discipline = "array"`. Every field is
/// optional, defaulting to [`ArrayParams::default`]'s.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArrayParams {
    /// Disks (1 to [`MAX_DISKS`]; at least 3 for RAID-5).
    pub disks: u32,
    /// Stripe unit (KiB, a whole number of KiB from [`MIN_STRIPE_KB`] to [`MAX_STRIPE_KB`]).
    pub stripe_kb: f64,
    /// RAID level: 0 or 5.
    pub raid: u32,
}

impl Default for ArrayParams {
    /// Ten disks (parda.txt §5: "a 10-disk RAID-5 disk group"; here RAID-0 unless `raid = 5`), 64 KiB
    /// units.
    fn default() -> Self {
        ArrayParams { disks: 10, stripe_kb: 64.0, raid: 0 }
    }
}

/// An array layout that is refused ([`ArrayParams::validate`]): the field, the value and the bound.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArrayError {
    /// `raid` is neither 0 nor 5.
    #[error("raid must be 0 or 5, got {got}")]
    Raid {
        /// The level given.
        got: u32,
    },
    /// `disks` outside `min..=max` (RAID-5 needs three).
    #[error("disks must be in {min}..={max}{}, got {got}", if *.raid == Raid::Five { " for RAID-5" } else { "" })]
    Disks {
        /// The RAID level.
        raid: Raid,
        /// The fewest disks the level takes.
        min: u32,
        /// [`MAX_DISKS`].
        max: u32,
        /// The value given.
        got: u32,
    },
    /// `stripe_kb` is not a whole number of KiB in `min..=max`.
    #[error("stripe_kb must be a whole number of KiB in {min}..={max}, got {got}")]
    StripeKb {
        /// [`MIN_STRIPE_KB`].
        min: f64,
        /// [`MAX_STRIPE_KB`].
        max: f64,
        /// The value given.
        got: f64,
    },
}

impl ArrayParams {
    /// Validates the layout; the error names the field (the device's `array: ...` error wraps it).
    pub fn validate(&self) -> Result<ArraySpec, ArrayError> {
        let raid = match self.raid {
            0 => Raid::Zero,
            5 => Raid::Five,
            got => return Err(ArrayError::Raid { got }),
        };
        let min = if raid == Raid::Five { 3 } else { 1 };
        if !(min..=MAX_DISKS).contains(&self.disks) {
            return Err(ArrayError::Disks { raid, min, max: MAX_DISKS, got: self.disks });
        }
        let kb = self.stripe_kb;
        if !(kb.is_finite() && kb.fract() == 0.0 && (MIN_STRIPE_KB..=MAX_STRIPE_KB).contains(&kb)) {
            return Err(ArrayError::StripeKb { min: MIN_STRIPE_KB, max: MAX_STRIPE_KB, got: kb });
        }
        Ok(ArraySpec { disks: self.disks, stripe_bytes: kb as u64 * 1024, raid })
    }
}

impl ArraySpec {
    /// The layout as a configuration file writes it ([`ArrayParams::validate`] reads it back).
    pub fn params(&self) -> ArrayParams {
        let raid = match self.raid {
            Raid::Zero => 0,
            Raid::Five => 5,
        };
        ArrayParams { disks: self.disks, stripe_kb: (self.stripe_bytes / 1024) as f64, raid }
    }
}

/// One disk access of a request.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Access {
    job: u32,
    /// Byte offset on the disk.
    offset: u64,
    size: u64,
    /// A read-modify-write (module comment).
    rmw: bool,
    scale: f64,
}

#[derive(Debug, Default)]
struct Disk {
    queue: VecDeque<Access>,
    /// The access in service and when it completes (invariant 1).
    current: Option<(Access, Nanos)>,
    /// Where the last access ended.
    head: u64,
}

/// An array in operation (module comment).
#[derive(Debug)]
pub(crate) struct Array {
    spec: ArraySpec,
    disks: Vec<Disk>,
    /// Accesses not yet done per request at the array (invariant 2).
    left: HashMap<u32, u32>,
    pieces: Vec<(usize, Access)>,
    /// While splitting a request: each disk's last access of it (an index into `pieces`), `u32::MAX` for
    /// none; all `u32::MAX` between requests.
    open: Vec<u32>,
}

impl Array {
    pub(crate) fn new(spec: ArraySpec) -> Array {
        Array {
            spec,
            disks: (0..spec.disks).map(|_| Disk::default()).collect(),
            left: HashMap::new(),
            pieces: Vec::new(),
            open: vec![u32::MAX; spec.disks as usize],
        }
    }

    /// Its layout.
    pub(crate) fn spec(&self) -> ArraySpec {
        self.spec
    }

    /// Requests at the array.
    pub(crate) fn len(&self) -> usize {
        self.left.len()
    }

    /// Request `job` arrives at `now`: its accesses join their disks' queues, and idle disks start.
    pub(crate) fn admit(&mut self, now: Nanos, job: Job, draw: &mut Draw) {
        let mut pieces = std::mem::take(&mut self.pieces);
        pieces.clear();
        split(&self.spec, &job, &mut Pieces { out: &mut pieces, open: &mut self.open });
        let prev = self.left.insert(job.id, pieces.len() as u32);
        debug_assert!(prev.is_none(), "a job id admitted twice");
        for &(d, a) in &pieces {
            self.disks[d].queue.push_back(a);
            if self.disks[d].current.is_none() {
                self.start(d, now, draw);
            }
        }
        self.pieces = pieces;
    }

    /// Disk `d` starts its next access at `at`, if it has one.
    fn start(&mut self, d: usize, at: Nanos, draw: &mut Draw) {
        let disk = &mut self.disks[d];
        if let Some(a) = disk.queue.pop_front() {
            let mut ns = draw.ns(&mut disk.head, a.offset, a.size, a.scale);
            if a.rmw {
                ns += draw.rewrite_ns(a.size, a.scale);
            }
            disk.current = Some((a, at.saturating_add(Nanos(round_ns(ns)))));
        }
    }

    /// The earliest completion of an access in service (disk index, time); ties go to the lower index.
    fn earliest(&self) -> Option<(usize, Nanos)> {
        let mut best: Option<(usize, Nanos)> = None;
        for (d, disk) in self.disks.iter().enumerate() {
            if let Some((_, t)) = disk.current {
                if best.is_none_or(|(_, b)| t < b) {
                    best = Some((d, t));
                }
            }
        }
        best
    }

    /// When the next access completes if nothing arrives before.
    pub(crate) fn next_completion(&self) -> Option<Nanos> {
        self.earliest().map(|(_, t)| t)
    }

    /// Completes every access due by `now`, in time order, each disk starting its next one when the
    /// previous completes (invariant 3); appends the requests whose last access completed to `out`.
    pub(crate) fn pop_done(&mut self, now: Nanos, out: &mut Vec<u32>, draw: &mut Draw) {
        while let Some((d, t)) = self.earliest() {
            if t > now {
                break;
            }
            let (a, _) = self.disks[d].current.take().expect("earliest names a disk in service");
            self.start(d, t, draw);
            let left = self.left.get_mut(&a.job).expect("invariant 2: an access of a request at the array");
            *left -= 1;
            if *left == 0 {
                self.left.remove(&a.job);
                out.push(a.job);
            }
        }
    }
}

/// A request's accesses as [`split`] builds them.
struct Pieces<'a> {
    out: &'a mut Vec<(usize, Access)>,
    /// [`Array::open`].
    open: &'a mut Vec<u32>,
}

impl Pieces<'_> {
    /// Adds an access on disk `d`, as part of the disk's previous access of this request if it continues
    /// it (same kind, starting where that one ends).
    fn push(&mut self, d: usize, a: Access) {
        if let Some((_, prev)) = self.out.get_mut(self.open[d] as usize) {
            if prev.rmw == a.rmw && prev.offset.saturating_add(prev.size) == a.offset {
                prev.size += a.size;
                return;
            }
        }
        self.open[d] = self.out.len() as u32;
        self.out.push((d, a));
    }
}

impl Drop for Pieces<'_> {
    /// Leaves `open` all `u32::MAX` for the next request.
    fn drop(&mut self) {
        for &(d, _) in self.out.iter() {
            self.open[d] = u32::MAX;
        }
    }
}

/// Adds the accesses of `job` to `out` (module comment: the layout).
fn split(spec: &ArraySpec, job: &Job, out: &mut Pieces<'_>) {
    let (u, d) = (spec.stripe_bytes, spec.disks as u64);
    let access = |offset, size, rmw| Access { job: job.id, offset, size, rmw, scale: job.scale };
    let end = job.offset.saturating_add(job.size);
    let mut off = job.offset;
    loop {
        let k = off / u;
        let within = off % u;
        let len = (end - off).min(u - within);
        match spec.raid {
            Raid::Zero => out.push((k % d) as usize, access((k / d) * u + within, len, false)),
            Raid::Five => {
                let n = d - 1;
                let row = k / n;
                let parity = d - 1 - row % d;
                let data_disk = |j: u64| ((parity + 1 + j) % d) as usize;
                let row_start = row.saturating_mul(n).saturating_mul(u);
                let row_end = row_start.saturating_add(n.saturating_mul(u));
                if job.write && within == 0 && off == row_start && row_end <= end {
                    // A whole row: every unit and the parity written, nothing read.
                    for j in 0..n {
                        out.push(data_disk(j), access(row * u, u, false));
                    }
                    out.push(parity as usize, access(row * u, u, false));
                    off = row_end;
                    if off >= end {
                        break;
                    }
                    continue;
                }
                out.push(data_disk(k % n), access(row * u + within, len, job.write));
                if job.write {
                    out.push(parity as usize, access(row * u + within, len, true));
                }
            }
        }
        off += len;
        if off >= end {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{DeviceSpec, ServiceModel};

    fn spec(disks: u32, raid: Raid) -> ArraySpec {
        ArraySpec { disks, stripe_bytes: 64 << 10, raid }
    }

    fn job(id: u32, offset: u64, size: u64, write: bool) -> Job {
        Job { id, size, offset, scale: 1.0, write }
    }

    fn accesses(s: ArraySpec, j: Job) -> Vec<(usize, u64, u64, bool)> {
        let (mut out, mut open) = (Vec::new(), vec![u32::MAX; s.disks as usize]);
        split(&s, &j, &mut Pieces { out: &mut out, open: &mut open });
        assert!(open.iter().all(|&o| o == u32::MAX), "open is reset");
        out.into_iter().map(|(d, a)| (d, a.offset, a.size, a.rmw)).collect()
    }

    #[test]
    fn a_large_request_is_one_access_per_disk() {
        let k = 64 << 10;
        // RAID-0, 4 disks, 9 units' worth from 4 KiB into unit 1: disk 1 gets units 1 (from 4 KiB in), 5
        // and 9, contiguous on the disk; disk 2 units 2, 6 and 4 KiB of 10; disks 3 and 0 two whole units.
        let got = accesses(spec(4, Raid::Zero), job(0, k + 4096, 9 * k, false));
        assert_eq!(
            got,
            vec![
                (1, 4096, 3 * k - 4096, false),
                (2, 0, 2 * k + 4096, false),
                (3, 0, 2 * k, false),
                (0, k, 2 * k, false)
            ]
        );
        let bytes: u64 = got.iter().map(|a| a.2).sum();
        assert_eq!(bytes, 9 * k);
        // RAID-5, 4 disks (3 data units a row), three whole rows written: each disk one access of 3 units.
        let got = accesses(spec(4, Raid::Five), job(0, 0, 9 * k, true));
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(got.iter().all(|a| a.1 == 0 && a.2 == 3 * k && !a.3), "{got:?}");
        // A 1 GiB read at 4 KiB units stays bounded: disks x (rows / disks + 1) accesses at most.
        let s = ArraySpec { disks: 10, stripe_bytes: 4096, raid: Raid::Five };
        let got = accesses(s, job(0, 0, 1 << 30, false));
        let rows = (1u64 << 30) / 4096 / 9 + 1;
        assert!(got.len() as u64 <= 10 * (rows / 10 + 2), "{}", got.len());
        assert_eq!(got.iter().map(|a| a.2).sum::<u64>(), 1 << 30);
    }

    #[test]
    fn raid0_units_go_round_the_disks() {
        let s = spec(4, Raid::Zero);
        let k = 64 << 10;
        // Unit 5 is on disk 1, second row; a 16 KiB read inside it is one access.
        assert_eq!(accesses(s, job(0, 5 * k + 4096, 16384, false)), vec![(1, k + 4096, 16384, false)]);
        // A request across a unit boundary is two accesses on neighbouring disks.
        assert_eq!(
            accesses(s, job(0, 3 * k + k - 4096, 8192, true)),
            vec![(3, k - 4096, 4096, false), (0, k, 4096, false)]
        );
        // Zero bytes: one access (a command still visits a disk).
        assert_eq!(accesses(s, job(0, 2 * k, 0, false)), vec![(2, 0, 0, false)]);
    }

    #[test]
    fn raid5_parity_rotates_and_small_writes_cost_four_accesses() {
        let s = spec(4, Raid::Five);
        let k = 64 << 10;
        // Row 0: parity on disk 3, data units 0, 1, 2 on disks 0, 1, 2.
        assert_eq!(accesses(s, job(0, 0, 4096, false)), vec![(0, 0, 4096, false)]);
        assert_eq!(accesses(s, job(0, 2 * k, 4096, false)), vec![(2, 0, 4096, false)]);
        // Row 1: parity on disk 2, data units 3, 4, 5 on disks 3, 0, 1.
        assert_eq!(accesses(s, job(0, 3 * k + 512, 4096, false)), vec![(3, k + 512, 4096, false)]);
        assert_eq!(accesses(s, job(0, 5 * k, 4096, false)), vec![(1, k, 4096, false)]);
        // A small write: read-modify-write of the data and of the parity beside it (2 accesses of 2 each).
        assert_eq!(accesses(s, job(0, 4 * k, 4096, true)), vec![(0, k, 4096, true), (2, k, 4096, true)]);
        // A whole row written: three data units and the parity, no reads.
        assert_eq!(
            accesses(s, job(0, 3 * k, 3 * k, true)),
            vec![(3, k, k, false), (0, k, k, false), (1, k, k, false), (2, k, k, false)]
        );
        // Every disk holds parity once in D rows.
        let parity: Vec<u64> = (0..4).map(|row| 3 - row % 4).collect();
        assert_eq!(parity, vec![3, 2, 1, 0]);
    }

    fn array_device(capacity: f64, disks: u32, service: ServiceModel) -> crate::device::Device {
        let mut spec = DeviceSpec::new(capacity, service).unwrap();
        spec.discipline = crate::device::Discipline::Array(ArraySpec { disks, stripe_bytes: 4096, raid: Raid::Zero });
        crate::device::Device::new(&spec, 3)
    }

    #[test]
    fn accesses_on_one_disk_queue_and_on_different_disks_overlap() {
        // 4 disks, 1,000 IOPS in all: 4 ms per access.
        let mut d = array_device(1000.0, 4, ServiceModel::Deterministic);
        let unit = 4096;
        d.concurrent_admit(Nanos(0), job(0, 0, 4096, false)); // disk 0
        d.concurrent_admit(Nanos(0), job(1, 4 * unit, 4096, false)); // disk 0 again: waits
        d.concurrent_admit(Nanos(0), job(2, unit, 2 * unit, false)); // disks 1 and 2
        let mut done = Vec::new();
        let mut times = Vec::new();
        while let Some((t, g)) = d.concurrent_rearm() {
            assert!(d.concurrent_take_done(t, g, &mut done));
            times.push((t, done.clone()));
        }
        assert_eq!(
            times,
            vec![(Nanos::from_millis(4), vec![0, 2]), (Nanos::from_millis(8), vec![0, 2, 1])],
            "job 2's two accesses run side by side"
        );
        assert!(d.is_empty());
        assert_eq!(d.end_busy_if_idle(), Some(Nanos(0)), "busy from the first arrival");
    }

    /// The closed-network oracle of the module comment: Q requests kept at an array of D disks with
    /// exponential service and uniformly random units keep the disks busy Q / (Q + D - 1) of the time.
    #[test]
    fn throughput_grows_with_the_queue_as_the_closed_network_says() {
        use rand::{Rng, SeedableRng};
        let (disks, capacity) = (10u32, 1000.0);
        for q in [1u32, 4, 10, 32, 64] {
            let mut d = array_device(capacity, disks, ServiceModel::Exponential);
            let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(q as u64);
            let mut next = 0u32;
            let mut new_job = |rng: &mut rand_pcg::Pcg64Mcg| {
                next += 1;
                job(next, rng.gen_range(0..100_000u64) * 4096, 4096, false)
            };
            for _ in 0..q {
                let j = new_job(&mut rng);
                d.concurrent_admit(Nanos(0), j);
            }
            let (mut completed, mut now, mut done) = (0u64, Nanos(0), Vec::new());
            while completed < 200_000 {
                let (t, g) = d.concurrent_rearm().unwrap();
                now = t;
                done.clear();
                d.concurrent_take_done(t, g, &mut done);
                for _ in 0..done.len() {
                    let j = new_job(&mut rng);
                    d.concurrent_admit(now, j);
                }
                completed += done.len() as u64;
            }
            let x = completed as f64 / now.as_secs_f64();
            let want = capacity * q as f64 / (q + disks - 1) as f64;
            assert!((x / want - 1.0).abs() < 0.02, "Q = {q}: {x:.1} IOPS, the closed network says {want:.1}");
        }
    }

    proptest::proptest! {
        /// The layout against its definition, for any request: the accesses carry exactly the request's
        /// bytes on data disks (a RAID-5 write the same again on parity disks), each where the stripe
        /// equation puts it, and a disk never gets two accesses of one request that continue each other.
        #[test]
        fn the_layout_conserves_bytes_and_follows_the_stripe_equation(
            disks in 3u32..12, unit_kb in 4u64..65, raid5 in proptest::bool::ANY, write in proptest::bool::ANY,
            offset in 0u64..(1 << 30), size in 1u64..(4 << 20),
        ) {
            let s = ArraySpec { disks, stripe_bytes: unit_kb * 1024, raid: if raid5 { Raid::Five } else { Raid::Zero } };
            let j = job(0, offset, size, write);
            let got = accesses(s, j);
            // Walk the request byte by byte in unit pieces: where each byte's data must be.
            let (u, d) = (s.stripe_bytes, disks as u64);
            let n = if raid5 { d - 1 } else { d };
            let mut want_data: Vec<(usize, u64, u64)> = Vec::new(); // (disk, start, end) per piece
            let mut off = offset;
            while off < offset + size {
                let k = off / u;
                let len = (offset + size - off).min(u - off % u);
                let (disk, row) = if raid5 {
                    let row = k / n;
                    let p = d - 1 - row % d;
                    (((p + 1 + k % n) % d) as usize, row)
                } else {
                    ((k % d) as usize, k / d)
                };
                want_data.push((disk, row * u + off % u, row * u + off % u + len));
                off += len;
            }
            // Every data byte is inside an access on its disk.
            for &(disk, a, b) in &want_data {
                proptest::prop_assert!(
                    got.iter().any(|g| g.0 == disk && g.1 <= a && b <= g.1 + g.2),
                    "piece {disk}:{a}..{b} not covered by {got:?}"
                );
            }
            let total: u64 = got.iter().map(|g| g.2).sum();
            if raid5 && write {
                // Data and parity: the request's bytes twice, except whole rows whose parity is one unit for
                // n data units.
                proptest::prop_assert!(total >= size && total <= 2 * size, "{total} for {size}");
            } else {
                proptest::prop_assert_eq!(total, size);
            }
            // Merged: no two accesses of the request on one disk continue each other with the same kind.
            for (i, x) in got.iter().enumerate() {
                for y in &got[i + 1..] {
                    proptest::prop_assert!(!(x.0 == y.0 && x.3 == y.3 && x.1 + x.2 == y.1), "{x:?} then {y:?}");
                }
            }
        }

        /// Whatever arrives, every request completes exactly once, never before it arrived, and the array
        /// empties (invariants 1-3).
        #[test]
        fn every_request_completes_once(
            jobs in proptest::collection::vec((0u64..5_000_000, 0u64..(1 << 26), 1u64..(1 << 20), proptest::bool::ANY), 1..60),
            raid5 in proptest::bool::ANY, disk_model in proptest::bool::ANY,
        ) {
            let service = if disk_model {
                ServiceModel::Disk(crate::service::DiskModel { seek_ns: 4e6, rotation_ns: 4e6, transfer_bytes_per_ns: 0.1, sequential_bytes: 65536 })
            } else {
                ServiceModel::Exponential
            };
            let mut spec = DeviceSpec::new(1000.0, service).unwrap();
            spec.discipline = crate::device::Discipline::Array(ArraySpec { disks: 5, stripe_bytes: 16384, raid: if raid5 { Raid::Five } else { Raid::Zero } });
            let mut dev = crate::device::Device::new(&spec, 9);
            let mut arrivals: Vec<(u64, u64, u64, bool)> = jobs;
            arrivals.sort_by_key(|a| a.0);
            let mut done = Vec::new();
            let mut wake: Option<(Nanos, u32)> = None;
            let mut next = 0;
            let mut arrived_at = std::collections::HashMap::new();
            let mut finished = std::collections::HashMap::new();
            loop {
                let arrival = arrivals.get(next).map(|a| Nanos(a.0));
                let fire = match (arrival, wake) {
                    (Some(a), Some(w)) if w.0 < a => Some(w),
                    (Some(_), _) => None,
                    (None, Some(w)) => Some(w),
                    (None, None) => break,
                };
                match fire {
                    Some((t, g)) => {
                        done.clear();
                        dev.concurrent_take_done(t, g, &mut done);
                        for &id in &done {
                            proptest::prop_assert!(finished.insert(id, t).is_none(), "{id} finished twice");
                            proptest::prop_assert!(t >= arrived_at[&id]);
                        }
                        dev.end_busy_if_idle();
                    }
                    None => {
                        let (at, off, size, write) = arrivals[next];
                        arrived_at.insert(next as u32, Nanos(at));
                        dev.concurrent_admit(Nanos(at), job(next as u32, off, size, write));
                        next += 1;
                    }
                }
                wake = dev.concurrent_rearm();
            }
            proptest::prop_assert_eq!(finished.len(), arrivals.len());
            proptest::prop_assert!(dev.is_empty() && dev.busy_since().is_none());
        }
    }

    #[test]
    fn bad_layouts_name_the_field() {
        let typed = |p: ArrayParams| p.validate().unwrap_err();
        assert_eq!(typed(ArrayParams { raid: 6, ..Default::default() }), ArrayError::Raid { got: 6 });
        assert_eq!(
            typed(ArrayParams { disks: 2, raid: 5, ..Default::default() }),
            ArrayError::Disks { raid: Raid::Five, min: 3, max: MAX_DISKS, got: 2 }
        );
        assert_eq!(
            typed(ArrayParams { stripe_kb: 6.5, ..Default::default() }),
            ArrayError::StripeKb { min: MIN_STRIPE_KB, max: MAX_STRIPE_KB, got: 6.5 }
        );
        let e = |p: ArrayParams| typed(p).to_string();
        assert!(e(ArrayParams { raid: 6, ..Default::default() }).contains("raid must be 0 or 5, got 6"));
        assert!(e(ArrayParams { disks: 0, ..Default::default() }).contains("disks must be in 1..=1024"));
        assert!(e(ArrayParams { disks: 2, raid: 5, ..Default::default() }).contains("for RAID-5"));
        assert!(e(ArrayParams { stripe_kb: 2.0, ..Default::default() }).contains("stripe_kb"));
        assert!(e(ArrayParams { stripe_kb: 6.5, ..Default::default() }).contains("whole number"));
        assert!(e(ArrayParams { stripe_kb: f64::NAN, ..Default::default() }).contains("stripe_kb"));
        assert_eq!(
            ArrayParams { disks: 5, stripe_kb: 128.0, raid: 5 }.validate().unwrap(),
            ArraySpec { disks: 5, stripe_bytes: 128 << 10, raid: Raid::Five }
        );
        let five = ArraySpec { disks: 5, stripe_bytes: 128 << 10, raid: Raid::Five };
        assert_eq!(five.params().validate().unwrap(), five, "params reads back");
        let p: ArrayParams = toml::from_str("disks = 5").unwrap();
        assert_eq!(p, ArrayParams { disks: 5, ..Default::default() });
        assert!(toml::from_str::<ArrayParams>("spindles = 5").unwrap_err().to_string().contains("spindles"));
    }
}
