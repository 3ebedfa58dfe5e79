//! # rein-model: the models the simulator and the daemons share
//!
//! One copy of everything that describes a run rather than schedules it, below both `rein-sim` and
//! `rein-runtime` (see ARCHITECTURE.md for why a crate of its own):
//!
//! - [`device`]: a storage device of a given capacity: FIFO, processor-sharing and disk-array
//!   ([`array`](mod@array)) disciplines, capacity schedules; [`service`]: the service-time
//!   distributions, the one rounding rule and the draws every discipline uses;
//! - [`workload`]: the workload generator (closed, open, on/off, burst, trace replay; offsets, sizes,
//!   read mix) and [`trace`], the block-trace readers;
//! - [`routing`]: how a gateway spreads a tenant's requests over servers (stripes or shares);
//! - [`stripe`]: the stripe layout of a `rein gateway` volume over its storage nodes;
//! - [`recorder`] and [`report`]: what a run measures and reports (summary.json, timeseries.csv,
//!   hosts.csv), simulated or real;
//! - [`meter`]: the reservation meter, for the simulator's checks and `rein serve`'s `/metrics`;
//! - [`seed`]: one seeded random stream per entity;
//! - [`parda_settings`]: the `[parda]` table (PARDA's control law) of scenarios and of `rein gateway` as a
//!   PARDA host, one parser for both;
//! - [`pshift_instance`]: the pShift instance file (`rein pshift solve` reads it, `gen` writes it);
//! - [`sched_settings`]: the `[mclock]` table (scheduler settings) of scenarios and rein.toml, one parser
//!   for both.
//!
//! Like `rein-core`, everything here is sans-IO: no clock reads, no sleeping, no threads; time comes in as
//! [`rein_core::Nanos`]. Unlike `rein-core`, it may use seeded randomness, HdrHistogram and serde.

#![forbid(unsafe_code)]

pub mod array;
pub mod device;
pub mod input;
pub mod meter;
pub mod parda_settings;
mod ps;
pub mod pshift_instance;
pub mod pshift_settings;
pub mod recorder;
pub mod report;
pub mod routing;
pub mod sched_settings;
pub mod seed;
pub mod service;
pub mod stripe;
pub mod trace;
pub mod workload;

pub use device::{Device, DeviceSpec, Discipline, ServiceModel};
pub use meter::ReservationMeter;
pub use recorder::{Recorder, RunMeta, ServerMeta, TenantMeta};
pub use report::{RunTotals, Summary, Timeseries};
pub use routing::{Router, Routing};
pub use sched_settings::{SchedSettingsFile, SettingsError};
pub use workload::{Generator, WorkloadKind, WorkloadSpec};
