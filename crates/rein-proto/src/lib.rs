//! # rein-proto: wire formats without IO
//!
//! Encoders and decoders for the protocols Rein's daemons speak, as pure functions and state machines over
//! byte buffers: no sockets, no tokio. The daemons (rein-runtime) and the load generator move the bytes.
//!
//! - [`nbd`]: the Network Block Device protocol, server and client sides.
//! - [`parda`]: PARDA's latency-aggregation record (shared-file block or UDP datagram).

pub mod nbd;
pub mod parda;
