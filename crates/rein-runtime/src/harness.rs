//! rein-runtime's decoders of outside input as functions of arbitrary bytes, with their contracts.
//!
//! The fuzz targets `server_config`, `admin_body` and `admin_response` (`fuzz/` at the repository root,
//! cargo-fuzz on a nightly toolchain) are one line each: they call these functions; `tests/corpus.rs`
//! replays the committed corpus through them on stable. Each function panics exactly when a contract is
//! broken. rein-proto's `harness` covers the wire decoders (NBD, the PARDA record and slot that
//! [`crate::aggregate`] reads from its shared file and datagrams).
//!
//! Contracts checked:
//! - [`server_config`]: [`ServerConfig::parse`] (an operator's rein.toml) never panics; a configuration it
//!   accepts keeps every documented bound (exports, names, sizes, queue depth, request size, tenants);
//!   a refusal has a message.
//! - [`admin_bodies`]: the bodies of `PUT /api/tenants/{name}` and `PUT /api/capacity` decode and
//!   validate as the admin endpoint does them, without panicking; an accepted spec keeps the fields the
//!   body gave and the current values of the others; an accepted capacity is positive and finite.
//! - [`admin_response`]: the admin client's parse of an HTTP response (status, chunked body) never
//!   panics and never returns a body longer than its input.

use crate::admin::{CapacityBody, SpecUpdate};
use crate::admin_client::parse_response;
use crate::config::{ServerConfig, MAX_EXPORTS, MAX_EXPORT_BYTES};
use rein_core::spec::MAX_IDLE_CREDIT;
use rein_core::units::{MAX_WEIGHT, MIN_RATE};
use rein_core::QosSpec;
use std::path::Path;

/// Parses `data` (if UTF-8: a file that is not is refused before parsing) as a server configuration;
/// panics if a contract is broken (module comment).
pub fn server_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let cfg = match ServerConfig::parse(text, Path::new("fuzz.toml")) {
        Ok(cfg) => cfg,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "a refusal without a message");
            return;
        }
    };
    assert!((1..=MAX_EXPORTS).contains(&cfg.exports.len()), "export count out of bounds");
    assert!((1..=4096).contains(&cfg.queue_depth), "queue_depth out of bounds");
    assert!((1024..=128 << 20).contains(&cfg.max_request), "max_request out of bounds");
    assert!(cfg.probe_capacity_s.is_finite() && (0.0..=60.0).contains(&cfg.probe_capacity_s));
    if let Some(c) = cfg.capacity_iops {
        assert!(c.is_finite() && c > 0.0, "capacity_iops {c} accepted");
    }
    for (i, t) in cfg.tenants.iter().enumerate() {
        assert!(!t.name.is_empty(), "an empty tenant name accepted");
        assert!(cfg.tenants[..i].iter().all(|o| o.name != t.name), "a repeated tenant name accepted");
    }
    for (i, e) in cfg.exports.iter().enumerate() {
        assert!(e.name.len() <= 4096, "an export name above 4096 bytes accepted");
        assert!(cfg.exports[..i].iter().all(|o| o.name != e.name), "a repeated export name accepted");
        if let Some(size) = e.size {
            assert!((1..=MAX_EXPORT_BYTES).contains(&size), "export size {size} accepted");
        }
        assert!(
            e.size.is_some() || e.backend != crate::config::BackendKind::Memory,
            "a memory export without a size accepted"
        );
        assert!(e.tenant < cfg.tenants.len(), "an export's tenant index out of range");
    }
    if let Some(d) = cfg.default_export {
        assert!(d < cfg.exports.len(), "default_export index out of range");
    }
    let caps = cfg.caps;
    assert!(caps.total >= 1 && caps.per_client >= 1 && caps.per_tenant >= 1, "a connection cap of 0 accepted");
}

/// Tenant specs a body is applied to: the default, a limited one, and the extremes of each field.
fn current_specs() -> [QosSpec; 3] {
    [
        QosSpec::default(),
        QosSpec::new(250.0, Some(1000.0), 2.0, 4).expect("a valid spec"),
        QosSpec::new(MIN_RATE, Some(MIN_RATE), MAX_WEIGHT, MAX_IDLE_CREDIT).expect("a valid spec"),
    ]
}

/// Decodes `data` as the body of a tenant change (applied to a few current specs) and of a capacity
/// change, as the admin endpoint does; panics if a contract is broken (module comment).
pub fn admin_bodies(data: &[u8]) {
    if let Ok(update) = serde_json::from_slice::<SpecUpdate>(data) {
        for current in current_specs() {
            let Ok(spec) = update.apply(current) else { continue };
            // What the endpoint answers and what admission sums must be numbers.
            assert!(spec.reservation().is_finite() && spec.weight().is_finite());
            assert!(spec.limit().is_none_or(f64::is_finite));
            let again = update.apply(spec).expect("an update applied twice is the same spec");
            assert_eq!(again, spec, "an update is idempotent");
        }
    }
    if let Ok(body) = serde_json::from_slice::<CapacityBody>(data) {
        if let Ok(iops) = rein_model::device::check_capacity("iops", body.iops) {
            assert!(iops.is_finite() && iops > 0.0, "capacity {iops} accepted");
        }
    }
}

/// Parses `data` as a whole HTTP response, as the admin client does; panics if a contract is broken
/// (module comment).
pub fn admin_response(data: &[u8]) {
    if let Ok((_, body)) = parse_response(data) {
        assert!(body.len() <= data.len(), "a body longer than the response");
    }
}
