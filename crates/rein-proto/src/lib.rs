//! # rein-proto: wire formats without IO
//!
//! Encoders and decoders for the protocols Rein's daemons speak, as pure functions and state machines over
//! byte buffers: no sockets, no tokio, no clocks. The daemons (rein-runtime) and the load generator move
//! the bytes.
//!
//! - [`nbd`]: the Network Block Device protocol: the handshake (server and client) and the server's
//!   transmission phase as state machines, request and reply codecs.
//! - [`https`]: the admin endpoint's HTTPS port: a TLS client told from a plain HTTP one by its first
//!   byte, and the answer the plain one gets.
//! - [`parda`]: PARDA's latency-aggregation record (shared-file block or UDP datagram).
//! - [`pshift`]: pShift's messages between servers and the controller (reports, tokens), framed.
//! - [`ErrorKind`]: why a request failed, protocol-neutral; each protocol maps it to its own numbers
//!   ([`nbd::errno`]).
//! - [`harness`]: the decoders' contracts as functions of arbitrary bytes, shared by the fuzz targets and
//!   the property tests.
#![forbid(unsafe_code)]

pub mod error;
pub mod harness;
pub mod https;
pub mod nbd;
pub mod parda;
pub mod pshift;

pub use error::ErrorKind;
