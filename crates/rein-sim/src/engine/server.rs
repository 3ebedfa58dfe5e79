//! The one server model of the engine: a rein-core scheduler in front of a rein-model device.
//!
//! The scheduler releases a request whenever fewer than `depth` (D) are outstanding at the device; the
//! device serves them by its discipline (FIFO or processor sharing). mClock-family, SFQ and FIFO
//! servers and pShift's token-scheduled servers are the same model; only the scheduler differs, and the
//! pShift layer reaches the token scheduler's own operations (reports, grants) through
//! [`Sched::token`].

use rein_core::pshift::TokenScheduler;
use rein_core::Scheduler;
use rein_model::Device;

/// A server's scheduler.
pub(crate) enum Sched {
    /// Any scheduler, through the common trait.
    Plain(Box<dyn Scheduler>),
    /// pShift's token scheduler (Algorithm 1), whose reports and grants the pShift layer drives.
    Token(Box<TokenScheduler>),
}

impl Sched {
    /// The scheduler through the common trait.
    #[inline]
    pub(crate) fn get(&mut self) -> &mut dyn Scheduler {
        match self {
            Sched::Plain(s) => s.as_mut(),
            Sched::Token(s) => s.as_mut(),
        }
    }

    /// The token scheduler (pShift servers only).
    pub(crate) fn token(&mut self) -> &mut TokenScheduler {
        match self {
            Sched::Token(s) => s,
            Sched::Plain(_) => unreachable!("pShift layer calls on a server without a token scheduler"),
        }
    }

    /// Times a caller's clock went backwards (clamped).
    pub(crate) fn time_regressions(&self) -> u64 {
        match self {
            Sched::Plain(s) => s.time_regressions(),
            Sched::Token(s) => s.time_regressions(),
        }
    }
}

/// A server in a running simulation.
pub(crate) struct Server {
    pub(crate) sched: Sched,
    /// Requests released to the device and not yet completed (invariant: at most `depth`).
    pub(crate) outstanding: u32,
    /// D.
    pub(crate) depth: u32,
    pub(crate) device: Device,
    /// The pending limit wake-up, if any.
    pub(crate) wake_at: Option<u64>,
    /// Per tenant index: its requests at this server's device (dispatched, not completed).
    pub(crate) pending: Vec<u32>,
}

impl Server {
    pub(crate) fn new(sched: Sched, depth: u32, device: Device, tenants: usize) -> Server {
        Server { sched, outstanding: 0, depth, device, wake_at: None, pending: vec![0; tenants] }
    }
}
