//! The byte budget: how many bytes of request payloads and replies the NBD server holds at once, in
//! total and per tenant.
//!
//! # Model
//! Two levels of counting semaphores whose permits are bytes: one global ([`Budget`], `max_inflight_mb`)
//! and one per tenant (`max_inflight_mb_per_tenant`), shared by all the connections of that tenant's
//! exports. Before a connection holds bytes on behalf of a request it takes a [`Charge`] for them from
//! its tenant's semaphore, then from the global one (always in that order); the charge travels with the
//! request and is dropped (the permits released) when the reply has been written to the socket or the
//! connection is gone. A connection that cannot get its charge waits, and while it waits it does not read
//! from its socket: the client's own TCP window then holds it back (backpressure). Other tenants keep
//! their own share, so an attacker sitting at its tenant's budget does not stop them; the global budget
//! bounds the server as a whole.
//!
//! # What is charged (crate::nbd)
//! - A READ: its length plus the reply header's headroom, before it goes to the dispatcher. That covers the
//!   reply buffer the storage reads into and the reply while it waits in the writer's queue for a client
//!   that does not read.
//! - A WRITE: its payload. A large payload is received into an input buffer charged in full before the
//!   bytes are read, and that buffer (with its charge) becomes the request's data; a small one is copied
//!   out of the connection's uncharged input buffer and charged as it is.
//! - Not charged: the first `INPUT_FREE_BYTES` of each connection's input buffer (and the copy of a small
//!   payload out of it while its charge is awaited), error replies and zero-length requests (FLUSH, TRIM,
//!   WRITE_ZEROES carry no payload). Those are bounded by the per-connection request bound and the
//!   connection limit instead.
//!
//! # Invariants
//! 1. A charge never asks a semaphore for more than that semaphore's total: a request larger than the
//!    budget takes the whole budget and is served alone, instead of waiting forever.
//! 2. Permits are only ever acquired tenant first, then global, and a connection waits for one charge at a
//!    time while holding none of its input buffer's (so two waiters never hold what the other wants).
//! 3. Bytes charged now = the sum of the live [`Charge`]s ([`Budget::in_use`]), never above the budget.

use rein_core::TenantId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default global budget (`max_inflight_mb`), in MiB.
pub const DEFAULT_INFLIGHT_MB: u64 = 1024;
/// Default per-tenant budget (`max_inflight_mb_per_tenant`), in MiB.
pub const DEFAULT_INFLIGHT_MB_PER_TENANT: u64 = 256;
/// Largest budget accepted (either key), in MiB: 1 TiB.
pub const MAX_INFLIGHT_MB: u64 = 1 << 20;

/// The server's byte budget: the global semaphore and one per tenant, made on first use.
pub struct Budget {
    global: Arc<Semaphore>,
    global_bytes: usize,
    per_tenant_bytes: usize,
    tenants: Mutex<HashMap<TenantId, Arc<Semaphore>>>,
}

impl Budget {
    /// A budget of `global_bytes` in all and `per_tenant_bytes` per tenant (both at least 1; a tenant's
    /// share above the global budget is never reachable).
    pub fn new(global_bytes: u64, per_tenant_bytes: u64) -> Budget {
        assert!(global_bytes > 0 && per_tenant_bytes > 0, "a budget is positive (config checks it)");
        let global_bytes = usize::try_from(global_bytes).unwrap_or(usize::MAX).min(Semaphore::MAX_PERMITS);
        let per_tenant_bytes = usize::try_from(per_tenant_bytes).unwrap_or(usize::MAX).min(global_bytes);
        Budget {
            global: Arc::new(Semaphore::new(global_bytes)),
            global_bytes,
            per_tenant_bytes,
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// The defaults: [`DEFAULT_INFLIGHT_MB`] in all, [`DEFAULT_INFLIGHT_MB_PER_TENANT`] per tenant.
    pub fn default_sizes() -> Budget {
        Budget::new(DEFAULT_INFLIGHT_MB << 20, DEFAULT_INFLIGHT_MB_PER_TENANT << 20)
    }

    /// The handle a connection of `tenant` charges through (one lookup per connection, none per request).
    pub fn tenant(&self, tenant: TenantId) -> TenantBudget {
        let mut map = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let sem = map.entry(tenant).or_insert_with(|| Arc::new(Semaphore::new(self.per_tenant_bytes))).clone();
        TenantBudget {
            tenant: sem,
            tenant_bytes: self.per_tenant_bytes,
            global: self.global.clone(),
            global_bytes: self.global_bytes,
        }
    }

    /// Bytes charged now, all tenants together (invariant 3).
    pub fn in_use(&self) -> usize {
        self.global_bytes - self.global.available_permits()
    }

    /// The global budget, in bytes.
    pub fn global_bytes(&self) -> usize {
        self.global_bytes
    }

    /// Each tenant's budget, in bytes (at most the global one).
    pub fn per_tenant_bytes(&self) -> usize {
        self.per_tenant_bytes
    }
}

/// One tenant's share of a [`Budget`], as a connection holds it.
#[derive(Clone)]
pub struct TenantBudget {
    tenant: Arc<Semaphore>,
    tenant_bytes: usize,
    global: Arc<Semaphore>,
    global_bytes: usize,
}

impl TenantBudget {
    /// Waits until `bytes` can be charged to the tenant and to the server, and charges them (at most each
    /// budget's total: invariant 1). Zero bytes charge nothing and never wait.
    pub async fn charge(&self, bytes: usize) -> Charge {
        if bytes == 0 {
            return Charge::default();
        }
        let (t, g) = (permits(bytes, self.tenant_bytes), permits(bytes, self.global_bytes));
        // Fast path: no future, no waiting, when both have room.
        if let Ok(tp) = self.tenant.clone().try_acquire_many_owned(t) {
            if let Ok(gp) = self.global.clone().try_acquire_many_owned(g) {
                return Charge { _tenant: Some(tp), _global: Some(gp), bytes };
            }
            let gp = self.global.clone().acquire_many_owned(g).await.expect("the budget is never closed");
            return Charge { _tenant: Some(tp), _global: Some(gp), bytes };
        }
        // Invariant 2: the tenant's share first, then the server's.
        let tp = self.tenant.clone().acquire_many_owned(t).await.expect("the budget is never closed");
        let gp = self.global.clone().acquire_many_owned(g).await.expect("the budget is never closed");
        Charge { _tenant: Some(tp), _global: Some(gp), bytes }
    }

    /// Bytes charged to this tenant now (all its connections).
    pub fn in_use(&self) -> usize {
        self.tenant_bytes - self.tenant.available_permits()
    }
}

/// Permits for a charge of `bytes` against a semaphore of `total`: clamped to the total (invariant 1).
/// A single charge is at most one request plus its header (`max_request_kb` is at most 128 MiB), so it
/// fits a `u32`.
fn permits(bytes: usize, total: usize) -> u32 {
    u32::try_from(bytes.min(total)).expect("one charge is at most one request and its header")
}

/// Bytes charged to a tenant and to the server; released when dropped.
#[derive(Default)]
pub struct Charge {
    _tenant: Option<OwnedSemaphorePermit>,
    _global: Option<OwnedSemaphorePermit>,
    bytes: usize,
}

impl Charge {
    /// The bytes this charge stands for (what was asked; the permits held may be fewer, invariant 1).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Charge({} bytes)", self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_core::{QosSpec, SchedulerKind};

    fn two_tenants() -> (TenantId, TenantId) {
        let mut s = SchedulerKind::Fifo.build(Default::default());
        (s.add_tenant(QosSpec::default()).unwrap(), s.add_tenant(QosSpec::default()).unwrap())
    }

    #[tokio::test]
    async fn a_tenant_at_its_budget_waits_and_others_do_not() {
        let (a, b) = two_tenants();
        let budget = Budget::new(300, 200);
        let (ta, tb) = (budget.tenant(a), budget.tenant(b));
        let held = ta.charge(200).await;
        assert_eq!((budget.in_use(), ta.in_use()), (200, 200));
        // At the bound: tenant a's next byte waits...
        let mut more = Box::pin(ta.charge(1));
        assert!(futures_poll(&mut more).is_none(), "a tenant at its budget waits");
        // ...while tenant b gets the rest of the global budget, and no more.
        let other = tb.charge(100).await;
        assert_eq!(budget.in_use(), 300);
        let mut over = Box::pin(tb.charge(1));
        assert!(futures_poll(&mut over).is_none(), "the global budget holds");
        drop(other);
        drop(held);
        assert!(futures_poll(&mut more).is_some() && futures_poll(&mut over).is_some());
    }

    #[tokio::test]
    async fn a_charge_larger_than_the_budget_takes_all_of_it() {
        let (a, _) = two_tenants();
        let budget = Budget::new(100, 1000);
        assert_eq!(budget.per_tenant_bytes(), 100, "a tenant's share is at most the global budget");
        let ta = budget.tenant(a);
        let big = ta.charge(5000).await;
        assert_eq!((big.bytes(), budget.in_use()), (5000, 100));
        let mut next = Box::pin(ta.charge(1));
        assert!(futures_poll(&mut next).is_none());
        drop(big);
        assert!(futures_poll(&mut next).is_some());
        assert_eq!(ta.charge(0).await.bytes(), 0);
    }

    /// Polls a future once, with a no-op waker.
    fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
