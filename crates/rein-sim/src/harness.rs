//! The decoders of the files the simulator and `rein pshift` read (an operator's scenario file, a trace
//! file, a pShift instance file) as functions of arbitrary bytes, with their contracts.
//!
//! The fuzz targets `scenario`, `trace` and `pshift_instance` (`fuzz/` at the repository root, cargo-fuzz
//! on a nightly toolchain) are one line each: they call these functions; `tests/corpus.rs` replays the
//! committed corpus through them on stable. Each function panics exactly when a contract is broken.
//!
//! Contracts checked:
//! - [`scenario`]: [`Scenario::from_toml`] never panics; a refusal has a message; a scenario it accepts
//!   has a non-empty name, a positive duration within [`MAX_DURATION_S`], a warm-up shorter than it, an
//!   interval of at least 1 ms and at most [`MAX_INTERVALS`] of them, 1..=[`MAX_SERVERS`] servers and at
//!   most [`MAX_TENANTS`] tenants with distinct names; an array device has 1..=`MAX_DISKS` disks (3 or
//!   more for RAID-5) and a stripe unit of whole KiB from 4 KiB.
//! - [`trace`]: [`rein_model::trace::parse`] in each format never panics; a refusal names the trace (and
//!   the line, for a bad line); what it accepts is at most [`MAX_RECORDS`] records, in time order from 0,
//!   none smaller than one 512-byte sector, only of the devices asked for.
//! - [`pshift_instance`]: [`rein_model::pshift_instance::parse`] never panics; a refusal has a message;
//!   an instance it accepts has 1..=`MAX_SERVERS` servers, 1..=`MAX_BUCKETS` buckets, at most
//!   `MAX_ENTRIES` demand entries, every number within `MAX_TOKENS` and no limit below its reservation;
//!   and [`rein_model::pshift_instance::to_json`] writes it as a file that parses to an equal instance and
//!   writes back the same text.

use crate::model::{MAX_DURATION_S, MAX_INTERVALS, MAX_SERVERS, MAX_TENANTS};
use crate::Scenario;
use rein_core::Nanos;
use rein_model::array::MAX_DISKS;
use rein_model::device::Raid;
use rein_model::trace::{parse, TraceError, TraceFormat, MAX_RECORDS};
use rein_model::Discipline;

/// Parses and validates `data` (if UTF-8) as a scenario file; panics if a contract is broken (module
/// comment).
pub fn scenario(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let sc = match Scenario::from_toml(text, None) {
        Ok(sc) => sc,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "a refusal without a message");
            return;
        }
    };
    assert!(!sc.name.trim().is_empty(), "an empty name accepted");
    assert!(sc.duration > Nanos::ZERO && sc.duration <= Nanos::from_secs_f64(MAX_DURATION_S), "duration out of range");
    assert!(sc.warmup < sc.duration, "a warm-up as long as the run accepted");
    assert!(sc.interval >= Nanos::from_millis(1), "an interval below 1 ms accepted");
    assert!((sc.duration.0 / sc.interval.0) as usize <= MAX_INTERVALS, "too many intervals accepted");
    assert!((1..=MAX_SERVERS).contains(&sc.servers.len()), "server count out of range");
    assert!(sc.tenants.len() <= MAX_TENANTS, "tenant count out of range");
    let names: std::collections::HashSet<&str> = sc.tenants.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), sc.tenants.len(), "a repeated tenant name accepted");
    for srv in &sc.servers {
        if let Discipline::Array(a) = srv.device.discipline {
            let min = if a.raid == Raid::Five { 3 } else { 1 };
            assert!((min..=MAX_DISKS).contains(&a.disks), "an array of {} disks accepted", a.disks);
            assert!(a.stripe_bytes >= 4096 && a.stripe_bytes % 1024 == 0, "a stripe unit of {} B", a.stripe_bytes);
        }
    }
}

/// Parses `data` as a trace in each format, twice (all devices; device 1 only); panics if a contract is
/// broken (module comment).
pub fn trace(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for format in [TraceFormat::DiskSim, TraceFormat::Csv, TraceFormat::Vscsi] {
        for devices in [&[][..], &[1][..]] {
            match parse(text, format, devices, "fuzz.trace") {
                Err(e) => {
                    let m = e.to_string();
                    assert!(m.contains("fuzz.trace"), "a refusal that does not name the trace: {m}");
                    if let TraceError::Line { line, .. } = e {
                        assert!(line >= 1 && line <= text.lines().count(), "a refusal naming line {line}");
                    }
                }
                Ok(records) => {
                    assert!(records.len() <= MAX_RECORDS, "more than {MAX_RECORDS} records");
                    assert!(records.first().is_none_or(|r| r.t_ns == 0), "a trace not starting at 0");
                    assert!(records.windows(2).all(|w| w[0].t_ns <= w[1].t_ns), "records out of time order");
                    assert!(records.iter().all(|r| r.size >= 512), "a record below one sector");
                    assert!(devices.is_empty() || records.iter().all(|r| devices.contains(&r.device)));
                }
            }
        }
    }
}

/// Parses `data` (if UTF-8) as a pShift instance file and, if it is accepted, writes it and reads it back;
/// panics if a contract is broken (module comment).
pub fn pshift_instance(data: &[u8]) {
    use rein_core::pshift::{MAX_BUCKETS, MAX_ENTRIES, MAX_SERVERS, MAX_TOKENS};
    use rein_model::pshift_instance::{parse, to_json};
    let Ok(text) = std::str::from_utf8(data) else { return };
    let inst = match parse(text) {
        Ok(inst) => inst,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "a refusal without a message");
            return;
        }
    };
    assert!((1..=MAX_SERVERS).contains(&inst.servers()), "{} servers accepted", inst.servers());
    assert!((1..=MAX_BUCKETS).contains(&inst.buckets()), "{} buckets accepted", inst.buckets());
    assert!(inst.entries() <= MAX_ENTRIES, "{} entries accepted", inst.entries());
    for j in 0..inst.servers() {
        assert!(inst.capacity(j) <= MAX_TOKENS, "a capacity of {} accepted", inst.capacity(j));
    }
    for i in 0..inst.buckets() {
        let r = inst.reservation(i);
        assert!(r <= MAX_TOKENS, "a reservation of {r} accepted");
        assert!(
            inst.limit(i).is_none_or(|l| (r..=MAX_TOKENS).contains(&l)),
            "limit {:?} with reservation {r}",
            inst.limit(i)
        );
        for e in inst.bucket_entries(i) {
            assert!(inst.entry_demand(e) <= MAX_TOKENS, "a demand of {} accepted", inst.entry_demand(e));
        }
    }
    let json = to_json(&inst);
    let again = parse(&json).unwrap_or_else(|e| panic!("what to_json wrote is refused: {e}\n{json}"));
    assert!(again == inst, "written and read back, the instance differs:\n{json}");
    assert_eq!(to_json(&again), json, "written twice, the text differs");
}
