//! Test support shared by the tests of several crates: loop devices ([`LoopDev`]) and file systems on
//! them ([`LoopFs`]), each a guard that releases what it made when dropped, also when the test panics;
//! and test certificates, keys and CRLs made with the `openssl` command ([`pki`]; the crate
//! `rein-test-pki` until 2026-12-07: one test-support crate, not two, for the same two users).
//!
//! Before, each crate had its own: rein-runtime's storage unit tests and its `live` integration tests
//! (`LoopFs`, `LoopNodes`) and rein's integration tests (`common::LoopDev`, a `LoopFs` in `check_config`,
//! `SmallFs` and `Ext2Over` in `serve_config`), each running `losetup -f --show`, `mkfs`, `mount` and
//! the tear-down its own way; some left the backing file to the test's temporary directory, one relied
//! on `mount -o loop` to detach its device.
//!
//! Why a crate: the users are in two crates, and rein-runtime's unit tests cannot reach rein's test files
//! (rein depends on rein-runtime, not the reverse). It is a dev-dependency only (the `layers` test of
//! rein checks that no crate depends on it otherwise) and depends on no crate of the workspace, so it
//! sits below all of them. (rein-runtime's own `testkit` module is something else: fake NBD servers for
//! its unit tests.)
//!
//! Also [`Logs`]: a daemon's log lines captured from `tracing`, for the tests that check what it says
//! (four tests had each written their own writer and subscriber).
//!
//! What needs root (attaching a loop device, `mkfs`, `mount`, `mknod`) is tried, and where it cannot be
//! done here the constructor says `skipped: ...` on stderr and returns `None`: the test returns early.
#![forbid(unsafe_code)]

mod logs;
mod loop_device;
pub mod pki;

pub use logs::Logs;
pub use loop_device::{LoopDev, LoopFs};
