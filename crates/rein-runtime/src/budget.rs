//! The byte budget: how many bytes of request payloads and replies the NBD server holds at once, in
//! total and per tenant.
//!
//! # Model
//! Two levels of byte pools: one global ([`Budget`], `max_inflight_mb`) and one per tenant
//! (`max_inflight_mb_per_tenant`), shared by all the connections of that tenant's exports. Before a
//! connection holds bytes on behalf of a request it takes a [`Charge`] for them from its tenant's pool,
//! then from the global one (always in that order); the charge travels with the request and is dropped
//! (the bytes given back) when the reply has been written to the socket or the connection is gone. A
//! connection that cannot get its charge waits, and while it waits it does not read from its socket: the
//! client's own TCP window then holds it back (backpressure). Other tenants keep their own share, so an
//! attacker sitting at its tenant's budget does not stop them; the global budget bounds the server as a
//! whole.
//!
//! # A pool: free on the fast path, FIFO when full
//! The budget sits on every request's path, so a charge that fits must cost next to nothing. A pool
//! (`Pool`) is an atomic count of bytes charged (`used`), an atomic count of charges waiting
//! (`queued`), and, for the waiters only, an async mutex (the queue) and a [`Notify`] (room was made).
//! - Fast path (nobody waiting and the charge fits): one load of `queued` and one compare-and-swap on
//!   `used`; giving bytes back is one `fetch_sub` and one load of `queued`. Per request: two
//!   read-modify-writes per level and one reference count (the charge's handle on its tenant's pools),
//!   no lock, no waker. The tokio semaphore it replaces took its waiters' mutex on every release, on both
//!   levels, and counted two references; [`fast_path_cost_ns`] (`rein bench budget`) measures the fast
//!   path (figures for both in docs/serve.md).
//! - Slow path (the charge does not fit, or others already wait): count itself in `queued` (which turns
//!   the fast path off for newcomers, so a large charge is not starved by a stream of small ones), queue
//!   on the mutex (tokio's mutex is FIFO), and as the queue's head retry until the bytes fit, sleeping on
//!   the `Notify` in between. Waiters are served in arrival order, as the semaphore did.
//! - No lost wakeup: the waiter increments `queued` before it looks at `used`, and a release decrements
//!   `used` before it looks at `queued` (all sequentially consistent), so either the waiter sees the
//!   bytes given back or the release sees the waiter and calls [`Notify::notify_one`], which keeps a
//!   permit when the head is between its check and its sleep.
//! - Cancellation (a connection closing while it waits) drops the waiter's place: the queue's guard and
//!   the `queued` count go with it, and bytes already taken from the tenant's pool are given back.
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
//! 1. A charge never asks a pool for more than that pool's total: a request larger than the budget takes
//!    the whole budget and is served alone, instead of waiting forever.
//! 2. Bytes are only ever taken tenant first, then global, and a connection waits for one charge at a
//!    time while holding none of its input buffer's (so two waiters never hold what the other wants).
//!    Waiting holds no lock a release needs: releases never wait.
//! 3. Bytes charged now = the sum of the live [`Charge`]s ([`Budget::in_use`]), never above the budget
//!    (`used` only grows by a compare-and-swap that checks the total).

use rein_core::TenantId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Default global budget (`max_inflight_mb`), in MiB.
pub const DEFAULT_INFLIGHT_MB: u64 = 1024;
/// Default per-tenant budget (`max_inflight_mb_per_tenant`), in MiB.
pub const DEFAULT_INFLIGHT_MB_PER_TENANT: u64 = 256;
/// Largest budget accepted (either key), in MiB: 1 TiB.
pub const MAX_INFLIGHT_MB: u64 = 1 << 20;

/// Largest pool, in bytes: half the address space, so `used + bytes` (both at most this) never overflows.
const MAX_POOL_BYTES: usize = usize::MAX / 2;

/// The server's byte budget: the global pool and one per tenant, made on first use.
pub struct Budget {
    global: Arc<Pool>,
    per_tenant_bytes: usize,
    tenants: Mutex<HashMap<TenantId, Arc<Pools>>>,
}

impl Budget {
    /// A budget of `global_bytes` in all and `per_tenant_bytes` per tenant (both at least 1; a tenant's
    /// share above the global budget is never reachable).
    pub fn new(global_bytes: u64, per_tenant_bytes: u64) -> Budget {
        assert!(global_bytes > 0 && per_tenant_bytes > 0, "a budget is positive (config checks it)");
        let global_bytes = usize::try_from(global_bytes).unwrap_or(usize::MAX).min(MAX_POOL_BYTES);
        let per_tenant_bytes = usize::try_from(per_tenant_bytes).unwrap_or(usize::MAX).min(global_bytes);
        Budget { global: Arc::new(Pool::new(global_bytes)), per_tenant_bytes, tenants: Mutex::new(HashMap::new()) }
    }

    /// The defaults: [`DEFAULT_INFLIGHT_MB`] in all, [`DEFAULT_INFLIGHT_MB_PER_TENANT`] per tenant.
    pub fn default_sizes() -> Budget {
        Budget::new(DEFAULT_INFLIGHT_MB << 20, DEFAULT_INFLIGHT_MB_PER_TENANT << 20)
    }

    /// The handle a connection of `tenant` charges through (one lookup per connection, none per request).
    pub fn tenant(&self, tenant: TenantId) -> TenantBudget {
        let mut map = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let pools = map
            .entry(tenant)
            .or_insert_with(|| {
                Arc::new(Pools { tenant: Pool::new(self.per_tenant_bytes), global: self.global.clone() })
            })
            .clone();
        TenantBudget { pools }
    }

    /// Bytes charged now, all tenants together (invariant 3).
    pub fn in_use(&self) -> usize {
        self.global.used.load(SeqCst)
    }

    /// The global budget, in bytes.
    pub fn global_bytes(&self) -> usize {
        self.global.total
    }

    /// Each tenant's budget, in bytes (at most the global one).
    pub fn per_tenant_bytes(&self) -> usize {
        self.per_tenant_bytes
    }
}

/// One level of the budget: bytes charged against a total (see the module's design comment).
struct Pool {
    /// The budget, in bytes.
    total: usize,
    /// Bytes charged now; at most `total` (invariant 3).
    used: AtomicUsize,
    /// Charges on the slow path (queued or at the head); while nonzero the fast path is off.
    queued: AtomicUsize,
    /// The waiters' queue, in arrival order; its holder is the head, the only one that retries.
    queue: tokio::sync::Mutex<()>,
    /// Room was made (a release while someone was queued).
    room: Notify,
}

impl Pool {
    fn new(total: usize) -> Pool {
        assert!(total > 0 && total <= MAX_POOL_BYTES);
        Pool {
            total,
            used: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            queue: Default::default(),
            room: Notify::new(),
        }
    }

    /// The fast path: takes `bytes` if nobody waits and they fit.
    fn take_now(&self, bytes: usize) -> bool {
        self.queued.load(SeqCst) == 0 && self.try_take(bytes)
    }

    /// Takes `bytes` if they fit now (waiters or not).
    fn try_take(&self, bytes: usize) -> bool {
        assert!(bytes <= self.total, "invariant 1: a charge is clamped to the pool");
        let mut used = self.used.load(SeqCst);
        loop {
            if used + bytes > self.total {
                return false;
            }
            match self.used.compare_exchange_weak(used, used + bytes, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    /// The slow path: waits in line until `bytes` fit, and takes them. Cancel-safe (dropping the future
    /// leaves the line and takes nothing).
    async fn take_in_line(&self, bytes: usize) {
        let _queued = Queued::enter(self);
        let _head = self.queue.lock().await;
        while !self.try_take(bytes) {
            self.room.notified().await;
        }
    }

    /// Gives `bytes` back, waking the head of the line if there is one.
    fn give(&self, bytes: usize) {
        let before = self.used.fetch_sub(bytes, SeqCst);
        assert!(before >= bytes, "invariant 3: only charged bytes are given back");
        if self.queued.load(SeqCst) > 0 {
            self.room.notify_one();
        }
    }
}

/// A place on a pool's slow path, counted in `queued` while it lives.
struct Queued<'a>(&'a Pool);

impl<'a> Queued<'a> {
    fn enter(pool: &'a Pool) -> Queued<'a> {
        pool.queued.fetch_add(1, SeqCst);
        Queued(pool)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        // The next in line (if any) takes the queue's mutex next and looks at `used` before it sleeps.
        self.0.queued.fetch_sub(1, SeqCst);
    }
}

/// A tenant's pool and the global one: what a [`Charge`] gives back to.
struct Pools {
    tenant: Pool,
    global: Arc<Pool>,
}

/// One tenant's share of a [`Budget`], as a connection holds it.
#[derive(Clone)]
pub struct TenantBudget {
    pools: Arc<Pools>,
}

impl TenantBudget {
    /// Waits until `bytes` can be charged to the tenant and to the server, and charges them (at most each
    /// budget's total: invariant 1). Zero bytes charge nothing and never wait.
    pub async fn charge(&self, bytes: usize) -> Charge {
        if bytes == 0 {
            return Charge::default();
        }
        let pools = &*self.pools;
        let (tenant, global) = (bytes.min(pools.tenant.total), bytes.min(pools.global.total));
        // Fast path: both fit and nobody waits; nothing is awaited.
        if pools.tenant.take_now(tenant) {
            if pools.global.take_now(global) {
                return Charge { pools: Some(self.pools.clone()), tenant, global, bytes };
            }
        } else {
            // Invariant 2: the tenant's share first, then the server's.
            pools.tenant.take_in_line(tenant).await;
        }
        // Holds the tenant's bytes while it waits for the server's, and gives them back if cancelled.
        let mut charge = Charge { pools: Some(self.pools.clone()), tenant, global: 0, bytes };
        if !pools.global.take_now(global) {
            pools.global.take_in_line(global).await;
        }
        charge.global = global;
        charge
    }

    /// [`TenantBudget::charge`]'s fast path alone: the charge if both budgets have room and nobody waits
    /// in either, now; `None` (nothing taken) where `charge` would wait.
    pub fn try_charge(&self, bytes: usize) -> Option<Charge> {
        if bytes == 0 {
            return Some(Charge::default());
        }
        let pools = &*self.pools;
        let (tenant, global) = (bytes.min(pools.tenant.total), bytes.min(pools.global.total));
        if !pools.tenant.take_now(tenant) {
            return None;
        }
        if !pools.global.take_now(global) {
            pools.tenant.give(tenant);
            return None;
        }
        Some(Charge { pools: Some(self.pools.clone()), tenant, global, bytes })
    }

    /// Bytes charged to this tenant now (all its connections).
    pub fn in_use(&self) -> usize {
        self.pools.tenant.used.load(SeqCst)
    }
}

/// Bytes charged to a tenant and to the server; given back when dropped.
#[derive(Default)]
pub struct Charge {
    pools: Option<Arc<Pools>>,
    /// Bytes taken from the tenant's pool and from the global one (each at most its total: invariant 1).
    tenant: usize,
    global: usize,
    bytes: usize,
}

impl Charge {
    /// The bytes this charge stands for (what was asked; the bytes held may be fewer, invariant 1).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(pools) = &self.pools {
            if self.global > 0 {
                pools.global.give(self.global);
            }
            pools.tenant.give(self.tenant);
        }
    }
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Charge({} bytes)", self.bytes)
    }
}

/// Two tenant ids (of a throw-away scheduler) for the budget's measurement and tests.
fn two_tenants() -> (TenantId, TenantId) {
    let mut s = rein_core::SchedulerKind::Fifo.build(Default::default());
    let mut add = || s.add_tenant(rein_core::QosSpec::default()).expect("two tenants fit");
    (add(), add())
}

/// What the fast path costs, for `rein bench budget`: nanoseconds per charge that fits (`bytes`) and its
/// release, as every request takes them, `charges` times on one thread, then on two threads charging two
/// tenants at once (sharing the global level). Returns (one thread, first of two, second of two).
pub fn fast_path_cost_ns(charges: u32, bytes: usize) -> (f64, f64, f64) {
    let (a, b) = two_tenants();
    let budget = Arc::new(Budget::default_sizes());
    let run = |tenant: TenantId, budget: Arc<Budget>| {
        move || {
            let rt = tokio::runtime::Builder::new_current_thread().build().expect("a current-thread runtime");
            let tb = budget.tenant(tenant);
            rt.block_on(async {
                let start = std::time::Instant::now();
                for _ in 0..charges {
                    let charge = tb.charge(std::hint::black_box(bytes)).await;
                    drop(std::hint::black_box(charge));
                }
                start.elapsed().as_nanos() as f64 / f64::from(charges.max(1))
            })
        }
    };
    let alone = run(a, budget.clone())();
    let (one, two) = (std::thread::spawn(run(a, budget.clone())), std::thread::spawn(run(b, budget)));
    (alone, one.join().expect("the first thread"), two.join().expect("the second thread"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_core::{QosSpec, SchedulerKind};

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
        // Both get through, in line order: `over` has waited for the server's budget since before `more`
        // got there (polled first, `more` would queue behind it).
        assert!(futures_poll(&mut over).is_some() && futures_poll(&mut more).is_some());
    }

    #[tokio::test]
    async fn try_charge_takes_only_what_charge_would_take_at_once() {
        let (a, b) = two_tenants();
        let budget = Budget::new(300, 200);
        let (ta, tb) = (budget.tenant(a), budget.tenant(b));
        let held = ta.try_charge(150).expect("room in both budgets");
        assert_eq!((held.bytes(), ta.in_use(), budget.in_use()), (150, 150, 150));
        assert_eq!(ta.try_charge(0).map(|c| c.bytes()), Some(0), "zero bytes never wait");
        // Over the tenant's share: nothing taken.
        assert!(ta.try_charge(51).is_none());
        assert_eq!((ta.in_use(), budget.in_use()), (150, 150));
        // The tenant's share has room, the server's not: the tenant's part goes back.
        let other = tb.try_charge(150).expect("b's share and the rest of the server's");
        assert!(tb.try_charge(1).is_none() && ta.try_charge(1).is_none());
        assert_eq!((ta.in_use(), tb.in_use(), budget.in_use()), (150, 150, 300));
        drop(other);
        // Someone waiting in line: the fast path is off for later charges, as in `charge`.
        let mut waiter = Box::pin(ta.charge(100));
        assert!(futures_poll(&mut waiter).is_none());
        assert!(ta.try_charge(10).is_none(), "no overtaking a waiter");
        drop(held);
        assert!(futures_poll(&mut waiter).is_some());
        assert_eq!(tb.try_charge(10).map(|c| c.bytes()), Some(10), "another tenant with room goes on");
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

    #[tokio::test]
    async fn a_waiter_is_not_overtaken_by_later_charges_that_would_fit() {
        let (a, _) = two_tenants();
        let budget = Budget::new(1000, 100);
        let ta = budget.tenant(a);
        let held = ta.charge(60).await;
        let mut big = Box::pin(ta.charge(100));
        assert!(futures_poll(&mut big).is_none(), "100 bytes do not fit beside 60");
        // 10 bytes would fit, but the big charge came first: the fast path is off while it waits.
        let mut small = Box::pin(ta.charge(10));
        assert!(futures_poll(&mut small).is_none(), "a later charge queues behind a waiter");
        drop(held);
        let big = futures_poll(&mut big).expect("the head of the line gets the room");
        assert_eq!(ta.in_use(), 100);
        assert!(futures_poll(&mut small).is_none());
        drop(big);
        assert_eq!(futures_poll(&mut small).map(|c| c.bytes()), Some(10));
        assert_eq!((ta.in_use(), budget.in_use()), (0, 0), "all of it came back");
    }

    #[tokio::test]
    async fn a_charge_cancelled_while_waiting_for_the_server_gives_its_tenant_share_back() {
        let (a, b) = two_tenants();
        let budget = Budget::new(100, 100);
        let (ta, tb) = (budget.tenant(a), budget.tenant(b));
        let other = tb.charge(100).await;
        let mut waiting = Box::pin(ta.charge(50));
        assert!(futures_poll(&mut waiting).is_none(), "the server's budget is full");
        assert_eq!(ta.in_use(), 50, "invariant 2: the tenant's share is taken first");
        drop(waiting);
        assert_eq!(ta.in_use(), 0, "cancelling gives it back");
        assert_eq!(ta.pools.global.queued.load(SeqCst), 0, "and leaves the line");
        drop(other);
        assert_eq!(ta.charge(100).await.bytes(), 100, "the fast path is on again");
    }

    /// Many tasks on several threads charge and give back random sizes (some larger than the whole
    /// budget, some given up while they wait): the bytes held never exceed either budget (except as
    /// invariant 1 clamps an oversized charge, which is then alone), everyone finishes, and every byte
    /// comes back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_tasks_charging_random_sizes_stay_within_the_budget_and_all_finish() {
        use std::sync::atomic::AtomicUsize;
        const GLOBAL_BYTES: usize = 1000;
        const TENANT_BYTES: usize = 400;
        const TASKS: u64 = 24;
        const CHARGES_PER_TASK: usize = 400;
        let mut sched = SchedulerKind::Fifo.build(Default::default());
        let tenants: Vec<TenantId> = (0..3).map(|_| sched.add_tenant(QosSpec::default()).unwrap()).collect();
        let budget = Arc::new(Budget::new(GLOBAL_BYTES as u64, TENANT_BYTES as u64));
        // A ledger kept apart from the pools: bytes held by the live charges, in all and per tenant.
        let held_global = Arc::new(AtomicUsize::new(0));
        let held_tenant: Arc<Vec<AtomicUsize>> = Arc::new(tenants.iter().map(|_| AtomicUsize::new(0)).collect());
        let mut tasks = Vec::new();
        for task in 0..TASKS {
            let which = (task % 3) as usize;
            let tb = budget.tenant(tenants[which]);
            let (budget, held_global, held_tenant) = (budget.clone(), held_global.clone(), held_tenant.clone());
            tasks.push(tokio::spawn(async move {
                let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ (task + 1); // xorshift64, one seed per task
                let mut next = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as usize
                };
                for _ in 0..CHARGES_PER_TASK {
                    let r = next();
                    let bytes = match r % 16 {
                        0 => 0,
                        1 => GLOBAL_BYTES + r % 500, // larger than the whole budget
                        2 => TENANT_BYTES + r % 100, // larger than the tenant's
                        _ => 1 + (r >> 8) % 150,
                    };
                    if r % 5 == 0 {
                        // Give up the wait after one yield (cancellation, on either level).
                        tokio::select! {
                            biased;
                            c = tb.charge(bytes) => drop(c),
                            _ = tokio::task::yield_now() => {}
                        }
                    }
                    let charge = tb.charge(bytes).await;
                    let (tenant_part, global_part) = (bytes.min(TENANT_BYTES), bytes.min(GLOBAL_BYTES));
                    let global_now = held_global.fetch_add(global_part, SeqCst) + global_part;
                    let tenant_now = held_tenant[which].fetch_add(tenant_part, SeqCst) + tenant_part;
                    assert!(global_now <= GLOBAL_BYTES, "global budget exceeded: {global_now}");
                    assert!(tenant_now <= TENANT_BYTES, "tenant budget exceeded: {tenant_now}");
                    assert!(budget.in_use() <= GLOBAL_BYTES && tb.in_use() <= TENANT_BYTES);
                    for _ in 0..(r >> 20) % 3 {
                        tokio::task::yield_now().await;
                    }
                    held_tenant[which].fetch_sub(tenant_part, SeqCst);
                    held_global.fetch_sub(global_part, SeqCst);
                    drop(charge);
                }
            }));
        }
        // A guard against a lost wakeup (a hang), not a timing assertion.
        let all = async {
            for t in tasks {
                t.await.expect("no task panics");
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(120), all).await.expect("every task finishes");
        assert_eq!(budget.in_use(), 0, "every byte came back");
        for &tenant in &tenants {
            let tb = budget.tenant(tenant);
            assert_eq!((tb.in_use(), tb.pools.tenant.queued.load(SeqCst)), (0, 0));
        }
        assert_eq!(budget.global.queued.load(SeqCst), 0, "nobody is left in line");
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
