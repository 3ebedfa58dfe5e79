//! Routing a tenant's requests over its servers: what a gateway in front of striped storage nodes does.
//!
//! - **Stripe** (default 1 MiB): the request's offset picks the server, `(offset / stripe) mod n`, as a
//!   volume striped over the nodes (mclock-dmclock.txt §4.2: "one storage device was constructed by
//!   striping across all the storage nodes").
//! - **Shares**: each request goes to server k with probability `share_k / sum(shares)` (a skewed or
//!   hot-spot placement, rbfq-repair.txt Fig. 11), drawn from the tenant's stream.
//! - **Device**: a trace record's device number picks the server, from a map of devices to servers
//!   (rbfq-repair.txt §4.2 maps a trace's devices to storage servers: "Flow 1 consists of IOs on first two
//!   devices mapped to (s_1, s_2) respectively"). Only trace records carry a device; the caller asks
//!   [`Router::device_server`] for them and falls back to [`Router::route`] (server 0) otherwise.
//!
//! Divisions are slow and stripes and server counts are usually powers of two: those take a shift and a
//! mask.

/// How requests pick a server of the tenant's list.
#[derive(Debug, Clone, PartialEq)]
pub enum Routing {
    /// By offset, in stripes of this many bytes.
    Stripe {
        /// Bytes per stripe (at least 1).
        stripe_bytes: u64,
    },
    /// At random, in proportion to these shares (one per server of the list; not all zero).
    Shares(Vec<f64>),
    /// By a trace record's device number: `(device, server index in the list)` pairs, each device once.
    Device(Vec<(u32, usize)>),
}

impl Default for Routing {
    /// 1 MiB stripes.
    fn default() -> Self {
        Routing::Stripe { stripe_bytes: 1 << 20 }
    }
}

/// A tenant's router over `n` servers.
#[derive(Debug, Clone, PartialEq)]
pub struct Router {
    /// Stripe size; 0 for routing by shares.
    stripe_bytes: u64,
    n: u32,
    /// Cumulative normalised shares (routing by shares).
    cumulative: Box<[f64]>,
    /// (device, server index) sorted by device (routing by device; empty otherwise).
    devices: Box<[(u32, u32)]>,
}

impl Router {
    /// A router for `routing` over `n` servers (`n >= 1`).
    pub fn new(routing: &Routing, n: usize) -> Router {
        assert!(n >= 1, "a tenant has at least one server");
        match routing {
            Routing::Stripe { stripe_bytes } => Router {
                stripe_bytes: (*stripe_bytes).max(1),
                n: n as u32,
                cumulative: Box::new([]),
                devices: Box::new([]),
            },
            Routing::Shares(v) => {
                // Scaled by the largest share first, so the sum is finite whatever the shares (1e308 twice
                // summed to inf, every share became 0 and every request went to the last server) and
                // tiny ones keep their precision.
                let largest = v.iter().copied().fold(0.0, f64::max);
                let scaled: Vec<f64> = v.iter().map(|x| x / largest).collect();
                let total: f64 = scaled.iter().sum();
                let mut acc = 0.0;
                let cumulative = scaled
                    .iter()
                    .map(|x| {
                        acc += x / total;
                        acc
                    })
                    .collect();
                Router { stripe_bytes: 0, n: n as u32, cumulative, devices: Box::new([]) }
            }
            Routing::Device(map) => {
                assert!(!map.is_empty() && map.iter().all(|&(_, k)| k < n), "routing by device: servers in the list");
                let mut devices: Vec<(u32, u32)> = map.iter().map(|&(d, k)| (d, k as u32)).collect();
                devices.sort_unstable();
                assert!(devices.windows(2).all(|w| w[0].0 != w[1].0), "routing by device: each device once");
                // Records of an unmapped device (none after validation) go to server 0.
                Router { stripe_bytes: 1, n: n as u32, cumulative: Box::new([]), devices: devices.into() }
            }
        }
    }

    /// Number of servers.
    pub fn servers(&self) -> usize {
        self.n as usize
    }

    /// The server (index in the tenant's list) for a trace record of device `device` when routing by
    /// device; `None` for the other routings (use [`Router::route`]) and for an unlisted device.
    #[inline]
    pub fn device_server(&self, device: u32) -> Option<usize> {
        self.devices.binary_search_by_key(&device, |&(d, _)| d).ok().map(|i| self.devices[i].1 as usize)
    }

    /// The server (index in the tenant's list) for a request at `offset`; `uniform` is called for a
    /// draw in [0, 1) when routing by shares (and only then).
    #[inline]
    pub fn route(&self, offset: u64, uniform: impl FnOnce() -> f64) -> usize {
        let n = self.n as u64;
        if n == 1 {
            return 0;
        }
        if !self.devices.is_empty() {
            return 0;
        }
        if self.stripe_bytes != 0 {
            let s = self.stripe_bytes;
            let stripe = if s.is_power_of_two() { offset >> s.trailing_zeros() } else { offset / s };
            return (if n.is_power_of_two() { stripe & (n - 1) } else { stripe % n }) as usize;
        }
        let u = uniform();
        self.cumulative.iter().position(|&c| u < c).unwrap_or(self.n as usize - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_rotate_and_shares_split() {
        let r = Router::new(&Routing::Stripe { stripe_bytes: 1 << 20 }, 3);
        let got: Vec<usize> = (0..6).map(|k| r.route(k << 20, || unreachable!())).collect();
        assert_eq!(got, vec![0, 1, 2, 0, 1, 2]);
        let r = Router::new(&Routing::Stripe { stripe_bytes: 3000 }, 4);
        assert_eq!(r.route(9000, || unreachable!()), 3);
        let r = Router::new(&Routing::Shares(vec![1.0, 3.0]), 2);
        assert_eq!(r.route(0, || 0.2), 0);
        assert_eq!(r.route(0, || 0.3), 1);
        assert_eq!(r.route(0, || 0.999_999), 1);
        assert_eq!(Router::new(&Routing::default(), 1).route(123, || unreachable!()), 0);
    }

    /// Shares whose sum overflows (1e308 twice) or that are tiny (subnormal) split as their ratios say:
    /// the overflowing sum made every share 0, and every request went to the last server.
    #[test]
    fn shares_split_whatever_their_scale() {
        for share in [1e308, 1e-320, 1.0] {
            let r = Router::new(&Routing::Shares(vec![share, share]), 2);
            assert_eq!((r.route(0, || 0.25), r.route(0, || 0.75)), (0, 1), "shares of {share}");
        }
    }

    #[test]
    fn devices_pick_their_server() {
        let r = Router::new(&Routing::Device(vec![(4, 1), (0, 0), (2, 1)]), 2);
        assert_eq!(r.device_server(0), Some(0));
        assert_eq!(r.device_server(2), Some(1));
        assert_eq!(r.device_server(4), Some(1));
        assert_eq!(r.device_server(1), None);
        assert_eq!(r.route(5 << 20, || unreachable!()), 0);
        assert_eq!(Router::new(&Routing::default(), 2).device_server(0), None);
    }
}
