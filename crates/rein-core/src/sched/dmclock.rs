//! The client side of dmClock (mclock-dmclock.txt §3.2.1) and of RBFQ's distributed Delta
//! (rbfq-repair.txt §3.2): a per-tenant tracker of service received across servers.
//!
//! # Model
//! A tenant's requests go to many servers, each running [`super::Mclock`] (or [`super::Rbfq`]) on its own.
//! For the servers to give the tenant its *global* reservation, limit and weight, each request to server
//! s_j carries how much service the tenant received elsewhere since its previous request to s_j:
//! - `delta`: completions at the other servers (dmClock's delta_i, RBFQ's Delta less the request itself);
//! - `rho`: the part of `delta` served in reservation phase (dmClock's rho_i).
//!
//! The server then advances the tenant's tags by `(cost + delta)/w` etc. (see [`super::mclock`]).
//!
//! # State and invariants
//! Running totals of completed cost over all servers (`total`, `total_resv`), and per server: the cost
//! completed there (`own`, `own_resv`) and the value of `total - own` when the tenant last sent a request
//! there (`seen`, `seen_resv`). Then `delta = (total - own) - seen`. All counters are fixed-point cost
//! units in wrapping `u64` arithmetic, so differences stay right across wrap-around.
//! 1. `delta` and `rho` never count a completion at the server being addressed.
//! 2. Every completion elsewhere is counted in exactly one later request to each server (none lost, none
//!    counted twice), so over a long run each server sees the tenant's whole service.
//!
//! Servers are dense indices `0..max_servers`; an index beyond the bound is an error.

use super::Phase;
use crate::units::Cost;

/// Why a tracker call was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrackerError {
    /// A server index at or beyond the number of servers the tracker was built for.
    #[error("server index {index} out of range (tracker holds {max} servers)")]
    ServerOutOfRange {
        /// The index given.
        index: usize,
        /// Servers the tracker holds; valid indices are below it.
        max: usize,
    },
}

#[derive(Debug, Clone, Copy, Default)]
struct PerServer {
    own: u64,
    own_resv: u64,
    seen: u64,
    seen_resv: u64,
}

/// A tenant's service tracker (one per tenant per client/gateway).
#[derive(Debug, Clone)]
pub struct ServiceTracker {
    total: u64,
    total_resv: u64,
    servers: Vec<PerServer>,
}

impl ServiceTracker {
    /// A tracker for servers `0..servers`.
    pub fn new(servers: usize) -> Self {
        ServiceTracker { total: 0, total_resv: 0, servers: vec![PerServer::default(); servers] }
    }

    /// Servers tracked; valid indices are `0..servers()`.
    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    fn server(&mut self, index: usize) -> Result<&mut PerServer, TrackerError> {
        let max = self.servers.len();
        self.servers.get_mut(index).ok_or(TrackerError::ServerOutOfRange { index, max })
    }

    /// Call when sending a request to `server`: returns `(delta, rho)` to piggyback on it.
    pub fn prepare(&mut self, server: usize) -> Result<(Cost, Cost), TrackerError> {
        let (total, total_resv) = (self.total, self.total_resv);
        let s = self.server(server)?;
        let elsewhere = total.wrapping_sub(s.own);
        let elsewhere_resv = total_resv.wrapping_sub(s.own_resv);
        let delta = elsewhere.wrapping_sub(s.seen);
        let rho = elsewhere_resv.wrapping_sub(s.seen_resv);
        s.seen = elsewhere;
        s.seen_resv = elsewhere_resv;
        Ok((Cost(delta), Cost(rho)))
    }

    /// Call when `server` reports a completion of cost `cost` served in `phase`.
    pub fn complete(&mut self, server: usize, phase: Phase, cost: Cost) -> Result<(), TrackerError> {
        let resv = phase == Phase::Reservation;
        let s = self.server(server)?;
        s.own = s.own.wrapping_add(cost.0);
        if resv {
            s.own_resv = s.own_resv.wrapping_add(cost.0);
        }
        self.total = self.total.wrapping_add(cost.0);
        if resv {
            self.total_resv = self.total_resv.wrapping_add(cost.0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_other_servers_once() {
        let mut t = ServiceTracker::new(2);
        assert_eq!(t.prepare(0).unwrap(), (Cost(0), Cost(0)));
        // Three completions at server 1 (one in reservation phase), one at server 0.
        t.complete(1, Phase::Weight, Cost::ONE).unwrap();
        t.complete(1, Phase::Reservation, Cost::ONE).unwrap();
        t.complete(1, Phase::Weight, Cost::ONE).unwrap();
        t.complete(0, Phase::Weight, Cost::ONE).unwrap();
        assert_eq!(t.prepare(0).unwrap(), (Cost::units(3), Cost::units(1)));
        assert_eq!(t.prepare(0).unwrap(), (Cost(0), Cost(0)), "nothing counted twice");
        // Server 1 sees only server 0's completion.
        assert_eq!(t.prepare(1).unwrap(), (Cost::units(1), Cost(0)));
        assert!(matches!(t.prepare(2), Err(TrackerError::ServerOutOfRange { index: 2, max: 2 })));
        assert!(t.complete(5, Phase::Weight, Cost::ONE).is_err());
    }

    #[test]
    fn single_server_delta_is_zero() {
        let mut t = ServiceTracker::new(1);
        for _ in 0..100 {
            assert_eq!(t.prepare(0).unwrap(), (Cost(0), Cost(0)));
            t.complete(0, Phase::Reservation, Cost::ONE).unwrap();
        }
    }

    #[test]
    fn survives_counter_wrap() {
        let mut t = ServiceTracker::new(2);
        t.total = u64::MAX - 1;
        t.servers[0].seen = u64::MAX - 1;
        t.complete(1, Phase::Weight, Cost::units(2)).unwrap();
        assert_eq!(t.prepare(0).unwrap().0, Cost::units(2));
    }
}
