//! pShift in the simulator (pshift.txt §IV): a cluster of token-scheduled servers and a controller
//! ([`engine`]), the `[pshift]` scenario section ([`section`]) and the paper's synthetic instances
//! ([`gen`]). A scenario with a `[pshift]` section runs on [`engine::run`] instead of the tenant/gateway
//! engine, and produces the same outputs (buckets are the tenants), so `rein sim`'s summary, `--json`,
//! `--out` and `--check` work unchanged.

pub mod engine;
pub mod gen;
pub mod section;
