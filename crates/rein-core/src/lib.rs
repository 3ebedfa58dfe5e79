//! # rein-core: storage QoS algorithms as sans-IO state machines
//!
//! Everything in this crate is a pure function of its inputs: no clock reads, no sleeping, no threads, no
//! IO. Time comes in as [`Nanos`]; decisions come out. The simulator (`rein-sim`) and the daemons drive the
//! same code.
//!
//! - [`units`]: integer time, fixed-point tags and costs (why they cannot drift).
//! - [`spec`]: validated tenant QoS specs (reservation, limit, weight, idle credit).
//! - [`cost`]: request cost models (per IO, per byte, mClock §3.1 seek/transfer).
//! - [`sched`]: the [`Scheduler`] interface and mClock, dmClock, RBFQ, SFQ(D), FIFO.
//! - [`oracle`]: the fluid allocation of mClock eq. (1)-(2) and RBFQ's critical capacities.
//! - [`parda`]: PARDA host flow control (latency estimator, window controller, beta from VM shares, the
//!   host with its local scheduler) and cluster latency aggregation; eq. (3) as the oracle.
//! - [`pshift`]: pShift token allocation (Algorithms 3-5), the token scheduler and the controller.
//! - [`vtime`]: a tiny virtual-time device for tests, demos and benchmarks.
//!
//! ```
//! use rein_core::{Mclock, Nanos, QosSpec, Request, SchedConfig, Scheduler, Poll};
//! let mut s = Mclock::new(SchedConfig::default());
//! let vm = s.add_tenant(QosSpec::new(250.0, None, 1.0, 0).unwrap()).unwrap();
//! s.enqueue(Nanos(0), Request::new(vm, 7)).unwrap();
//! match s.poll(Nanos(0), true) {
//!     Poll::Dispatch(d) => assert_eq!(d.handle, 7),
//!     other => panic!("{other:?}"),
//! }
//! ```

#![forbid(unsafe_code)]

pub mod cost;
pub mod oracle;
pub mod parda;
pub mod pshift;
pub mod sched;
pub mod spec;
pub mod units;
pub mod vtime;

pub use cost::CostModel;
pub use sched::{
    Dispatch, Fifo, LimitMode, Limits, Mclock, Phase, Piggyback, Poll, PoolReturn, Rbfq, Request, ReservationLag,
    ReservationShare, ReservationSplit, SchedConfig, SchedError, Scheduler, SchedulerKind, ServiceTracker, Sfq,
    TenantId, TenantStats, UnknownScheduler,
};
pub use spec::{QosSpec, SpecError};
pub use units::{Cost, Count, LatestTime, Nanos, Num, Tag};
