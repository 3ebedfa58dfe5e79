//! Block-IO trace readers for trace-replay workloads.
//!
//! Formats (the samples in `scenarios/traces/` and their README):
//! - **disksim** ASCII: `arrival_ns devno start_lba(512 B sectors) size_sectors type(1 = read, 0 = write)`
//!   (the MQSim traces; the wsrch sample is very probably UMass/SPC WebSearch1);
//! - **csv**: libCacheSim cloudPhysics `version,time,op,size,lbn`, time in whole seconds, op a SCSI opcode
//!   in hex (`28` READ(10), `2a` WRITE(10)), size in bytes, lbn in 512 B blocks;
//! - **vscsi**: `ts_us,op(R/W),size_bytes,lbn`.
//!
//! Records come back sorted by time, with times relative to the first record. Malformed lines are errors
//! naming the line: a field that is not a number, a type or opcode that is neither a read nor a write, a
//! request above [`MAX_SIZE_BYTES`] (1 GiB), an offset whose end overflows 64 bits. A trace is bounded to
//! [`MAX_RECORDS`] records.

use std::path::Path;

/// Most records one trace may hold (counted after the device filter); ten million [`TraceRecord`]s
/// take 320 MB.
pub const MAX_RECORDS: usize = 10_000_000;

/// Largest request (bytes): 1 GiB, for trace records and generated requests alike
/// (`crate::workload::MAX_SIZE_BYTES` is this one).
pub const MAX_SIZE_BYTES: u64 = 1 << 30;

/// Largest trace file (1 GiB: [`MAX_RECORDS`] lines of about 50 bytes take 500 MB).
pub const MAX_TRACE_BYTES: u64 = 1 << 30;

/// One request of a trace, in common units whatever the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// Nanoseconds since the first record.
    pub t_ns: u64,
    /// Byte offset on the device (the format's 512 B block number times 512).
    pub offset: u64,
    /// Bytes, at least 512 (smaller and zero sizes are raised to one sector).
    pub size: u64,
    /// A read (else a write).
    pub read: bool,
    /// The device number (disksim's `devno`; 0 for formats without one).
    pub device: u32,
}

/// A trace file's format (module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// disksim ASCII: `arrival_ns devno start_lba size_sectors type`, whitespace-separated.
    DiskSim,
    /// cloudPhysics CSV as libCacheSim writes it: `version,time,op,size,lbn`, time in whole seconds.
    Csv,
    /// vscsi CSV: `ts_us,op,size_bytes,lbn`, time in microseconds, op `R` or `W`.
    Vscsi,
}

/// A trace could not be loaded; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A malformed line: too few fields, or a field that is not a number of the right kind.
    #[error("trace {path} line {line}: {message}")]
    Line {
        /// The file.
        path: String,
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// A format name other than disksim, csv or vscsi.
    #[error("trace format {0:?}: expected disksim, csv or vscsi")]
    Format(String),
    /// More than [`MAX_RECORDS`] records.
    #[error("trace {path} has more than {MAX_RECORDS} records")]
    TooLarge {
        /// The file.
        path: String,
    },
}

impl TraceFormat {
    /// The format named `name` (disksim, csv, vscsi) or, without a name, the one `path`'s extension
    /// implies: `*.vscsi-us.csv` is vscsi, other `*.csv` csv, anything else disksim. An unknown name is
    /// [`TraceError::Format`].
    pub fn resolve(name: Option<&str>, path: &Path) -> Result<TraceFormat, TraceError> {
        match name {
            Some("disksim") => Ok(TraceFormat::DiskSim),
            Some("csv") => Ok(TraceFormat::Csv),
            Some("vscsi") => Ok(TraceFormat::Vscsi),
            Some(o) => Err(TraceError::Format(o.to_string())),
            None => {
                let s = path.to_string_lossy();
                Ok(if s.ends_with(".vscsi-us.csv") {
                    TraceFormat::Vscsi
                } else if s.ends_with(".csv") {
                    TraceFormat::Csv
                } else {
                    TraceFormat::DiskSim
                })
            }
        }
    }
}

/// Loads a trace; a non-empty `devices` keeps only those device numbers (disksim's `devno`; the other
/// formats have device 0).
pub fn load(path: &Path, format: TraceFormat, devices: &[u32]) -> Result<Vec<TraceRecord>, TraceError> {
    let p = path.display().to_string();
    let text = crate::input::read_text_regular(path, MAX_TRACE_BYTES)
        .map_err(|source| TraceError::Read { path: p.clone(), source })?;
    parse(&text, format, devices, &p)
}

/// A 512 B block number as a byte offset; a block number of 2^55 or more is an error.
fn sectors_to_bytes(n: u64, bad: &dyn Fn(&str) -> TraceError) -> Result<u64, TraceError> {
    n.checked_mul(512).ok_or_else(|| bad("block number overflows a byte offset"))
}

/// Parses trace text (see [`load`]).
pub fn parse(text: &str, format: TraceFormat, devices: &[u32], name: &str) -> Result<Vec<TraceRecord>, TraceError> {
    let mut out: Vec<(u64, TraceRecord)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |m: &str| TraceError::Line { path: name.to_string(), line: i + 1, message: m.to_string() };
        let rec = match format {
            TraceFormat::DiskSim => {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 5 {
                    return Err(bad("expected 5 fields: arrival_ns devno lba sectors type"));
                }
                let t: f64 = f[0].parse().map_err(|_| bad("arrival time is not a number"))?;
                let dev: u32 = f[1].parse().map_err(|_| bad("device is not an integer"))?;
                let lba: u64 = f[2].parse().map_err(|_| bad("lba is not an integer"))?;
                let sectors: u64 = f[3].parse().map_err(|_| bad("size is not an integer"))?;
                let read = match f[4] {
                    "1" => true,
                    "0" => false,
                    _ => return Err(bad("type must be 1 (read) or 0 (write)")),
                };
                if !(t.is_finite() && t >= 0.0) {
                    return Err(bad("arrival time must be non-negative"));
                }
                let size = sectors.checked_mul(512).ok_or_else(|| bad("size in sectors overflows a byte count"))?;
                (t as u64, TraceRecord { t_ns: 0, offset: sectors_to_bytes(lba, &bad)?, size, read, device: dev })
            }
            TraceFormat::Csv => {
                if line.starts_with("version") {
                    continue;
                }
                let f: Vec<&str> = line.split(',').collect();
                if f.len() < 5 {
                    return Err(bad("expected version,time,op,size,lbn"));
                }
                let t: u64 = f[1].trim().parse().map_err(|_| bad("time is not an integer"))?;
                let op = u32::from_str_radix(f[2].trim(), 16).map_err(|_| bad("op is not a hex opcode"))?;
                let size: u64 = f[3].trim().parse().map_err(|_| bad("size is not an integer"))?;
                let lbn: u64 = f[4].trim().parse().map_err(|_| bad("lbn is not an integer"))?;
                let read = match op {
                    0x08 | 0x28 | 0x88 | 0xa8 => true,
                    0x0a | 0x2a | 0x8a | 0xaa => false,
                    _ => {
                        return Err(bad(&format!(
                            "op {op:02x} is neither a SCSI read (08, 28, 88, a8) nor a write (0a, 2a, 8a, aa)"
                        )))
                    }
                };
                (
                    t.saturating_mul(1_000_000_000),
                    TraceRecord { t_ns: 0, offset: sectors_to_bytes(lbn, &bad)?, size, read, device: 0 },
                )
            }
            TraceFormat::Vscsi => {
                if line.starts_with("ts_us") {
                    continue;
                }
                let f: Vec<&str> = line.split(',').collect();
                if f.len() < 4 {
                    return Err(bad("expected ts_us,op,size_bytes,lbn"));
                }
                let t: u64 = f[0].trim().parse().map_err(|_| bad("ts_us is not an integer"))?;
                let read = match f[1].trim() {
                    "R" | "r" => true,
                    "W" | "w" => false,
                    _ => return Err(bad("op must be R or W")),
                };
                let size: u64 = f[2].trim().parse().map_err(|_| bad("size is not an integer"))?;
                let lbn: u64 = f[3].trim().parse().map_err(|_| bad("lbn is not an integer"))?;
                (
                    t.saturating_mul(1000),
                    TraceRecord { t_ns: 0, offset: sectors_to_bytes(lbn, &bad)?, size, read, device: 0 },
                )
            }
        };
        if rec.1.size > MAX_SIZE_BYTES {
            return Err(bad(&format!("size {} bytes is above the {MAX_SIZE_BYTES}-byte request bound", rec.1.size)));
        }
        if rec.1.offset.checked_add(rec.1.size.max(512)).is_none() {
            return Err(bad("offset plus size overflows 64 bits"));
        }
        if !devices.is_empty() && !devices.contains(&rec.1.device) {
            continue;
        }
        if out.len() >= MAX_RECORDS {
            return Err(TraceError::TooLarge { path: name.to_string() });
        }
        out.push(rec);
    }
    out.sort_by_key(|r| r.0); // stable: equal times keep file order
    let t0 = out.first().map_or(0, |r| r.0);
    Ok(out
        .into_iter()
        .map(|(t, mut r)| {
            r.t_ns = t - t0;
            r.size = r.size.max(512);
            r
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_format() {
        let d = parse("11413000 0 657728 16 1\n11565000 1 31244784 64 0\n", TraceFormat::DiskSim, &[], "t").unwrap();
        assert_eq!(d[1], TraceRecord { t_ns: 152_000, offset: 31244784 * 512, size: 64 * 512, read: false, device: 1 });
        let f = parse("11413000 0 657728 16 1\n11565000 1 31244784 64 0\n", TraceFormat::DiskSim, &[1], "t").unwrap();
        assert_eq!(f.len(), 1);
        let two = "1 0 0 8 1\n2 1 0 8 1\n3 2 0 8 1\n4 1 0 8 1\n";
        let f = parse(two, TraceFormat::DiskSim, &[2, 1], "t").unwrap();
        assert_eq!(f.iter().map(|r| r.device).collect::<Vec<_>>(), vec![1, 2, 1]);
        assert_eq!(f[0].t_ns, 0, "times are relative to the first record kept");
        let c = parse("version,time,op,size,lbn\n1,5,2a,512,42\n1,7,28,4096,43\n", TraceFormat::Csv, &[], "t").unwrap();
        assert_eq!(c[1], TraceRecord { t_ns: 2_000_000_000, offset: 43 * 512, size: 4096, read: true, device: 0 });
        assert!(!c[0].read);
        let v = parse("ts_us,op,size_bytes,lbn\n100,W,512,1\n250,R,1024,2\n", TraceFormat::Vscsi, &[], "t").unwrap();
        assert_eq!(v[1].t_ns, 150_000);
        assert!(v[1].read);
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let e = parse("1 0 0 8 1\nbad line\n", TraceFormat::DiskSim, &[], "x.trace").unwrap_err();
        assert!(e.to_string().contains("x.trace line 2"), "{e}");
        assert!(parse("ts_us,op,size_bytes,lbn\n1,Q,5,5\n", TraceFormat::Vscsi, &[], "t").is_err());
    }

    #[test]
    fn sizes_offsets_and_types_out_of_bounds_are_refused() {
        let err = |text: &str, f| parse(text, f, &[], "x.trace").unwrap_err().to_string();
        // 2^64-1 sectors: the array model once walked 2.8e14 stripe pieces for it.
        let e = err("1 0 0 18446744073709551615 1\n", TraceFormat::DiskSim);
        assert!(e.contains("x.trace line 1") && e.contains("overflows"), "{e}");
        let e = err("1 0 0 2097153 1\n", TraceFormat::DiskSim); // 1 GiB + 512 B
        assert!(e.contains("above the 1073741824-byte request bound"), "{e}");
        assert_eq!(parse("1 0 0 2097152 1\n", TraceFormat::DiskSim, &[], "t").unwrap()[0].size, 1 << 30);
        let e = err("1 0 36028797018963967 8 1\n", TraceFormat::DiskSim); // offset fits, offset + size does not
        assert!(e.contains("offset plus size overflows"), "{e}");
        let e = err("1 0 36028797018963968 8 1\n", TraceFormat::DiskSim);
        assert!(e.contains("block number overflows"), "{e}");
        let e = err("1 0 0 8 7\n", TraceFormat::DiskSim);
        assert!(e.contains("type must be 1 (read) or 0 (write)"), "{e}");
        let e = err("version,time,op,size,lbn\n1,5,35,512,42\n", TraceFormat::Csv);
        assert!(e.contains("line 2") && e.contains("op 35"), "{e}");
        let e = err("ts_us,op,size_bytes,lbn\n1,R,2147483648,1\n", TraceFormat::Vscsi);
        assert!(e.contains("request bound"), "{e}");
    }
}
