//! # rein-runtime: Rein's IO runtime
//!
//! The tokio layer between the sans-IO core and real storage: storage backends ([`storage`]), a modelled
//! device for repeatable experiments ([`devmodel`]), and the QoS dispatcher ([`dispatch`]) that drives a
//! rein-core scheduler on a monotonic clock. The NBD server and the admin endpoint build on these.
//! [`aggregate`] carries PARDA's cluster latency between hosts (a shared file, or UDP).

pub mod admin;
pub mod aggregate;
pub mod client;
pub mod config;
pub mod devmodel;
pub mod dispatch;
pub mod load;
pub mod nbd;
pub mod server;
pub mod storage;

pub use devmodel::{DeviceModel, ServiceDist};
pub use dispatch::{Clock, DispatchConfig, Dispatcher, IoError, IoRequest, IoResult, Op, Snapshot};
pub use storage::{FileStorage, MemStorage, Storage, StorageError};
