//! `rein load`: multi-tenant load over NBD with a live per-tenant table, and the same summary.json,
//! timeseries.csv and plots as `rein sim`, so simulated and real runs compare directly. The workloads are
//! the simulator's (rein-model's generator); `--admin` adds the server's tenant specs and scheduling
//! phases to the report.

use anyhow::{bail, Context, Result};
use clap::Args;
use rein_model::workload::{TraceParams, WorkloadParams};
use rein_model::RunTotals;
use rein_runtime::load::{Job, LoadConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
pub(crate) struct LoadArgs {
    /// NBD server address.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub(crate) addr: SocketAddr,
    /// The server's admin endpoint (`rein serve`'s, default 127.0.0.1:9180), as ADDR or http://ADDR, or
    /// https://ADDR when it is served with admin_tls: the report then carries the tenants' specs and
    /// completions by scheduling phase. Without it they are unknown (null).
    #[arg(long)]
    pub(crate) admin: Option<String>,
    /// For an https:// admin endpoint: the CA certificates (PEM) its certificate must chain to (default:
    /// the system's).
    #[arg(long, requires = "admin")]
    pub(crate) admin_ca: Option<PathBuf>,
    /// For an https:// admin endpoint that asks for client certificates (`[tls] ca`): this certificate
    /// (PEM), with --admin-key.
    #[arg(long, requires_all = ["admin", "admin_key"])]
    pub(crate) admin_cert: Option<PathBuf>,
    /// The private key (PEM) of --admin-cert.
    #[arg(long, requires = "admin_cert")]
    pub(crate) admin_key: Option<PathBuf>,
    /// The admin endpoint's bearer token file (`rein serve`'s `admin_token_file`), sent with every admin
    /// request.
    #[arg(long, requires = "admin")]
    pub(crate) admin_token_file: Option<PathBuf>,
    /// TLS to the NBD server (STARTTLS, never plain), x509: the CA certificates (PEM) the server's
    /// certificate must chain to (only these); it must name --tls-name, or the --addr IP.
    #[arg(long, conflicts_with = "tls_psk_file")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// With --tls-ca: a client certificate (PEM) for servers that ask for one (their `[tls] ca`), with
    /// --tls-key.
    #[arg(long, requires_all = ["tls_ca", "tls_key"])]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// TLS to the NBD server with a pre-shared key: a psktool file (`identity:hexkey` lines).
    #[arg(long)]
    pub(crate) tls_psk_file: Option<PathBuf>,
    /// Which identity of --tls-psk-file (default: its only one).
    #[arg(long, requires = "tls_psk_file")]
    pub(crate) tls_psk_identity: Option<String>,
    /// The name the server's certificate must carry, when it is not the --addr IP.
    #[arg(long, requires = "tls_ca")]
    pub(crate) tls_name: Option<String>,
    /// A tenant's workload, repeatable: name=NAME[,export=E][,tenant=T][,conns=N]
    /// [,kind=closed|open|on_off|burst|trace][,depth=N][,rate=IOPS][,think=MS][,on=S,off=S]
    /// [,burst=N,period=MS][,trace=PATH[,format=disksim|csv|vscsi][,time_scale=X][,repeat=1]][,size=4k]
    /// [,read=PCT][,random=PCT][,span=GIB][,start=S][,stop=S]. export and tenant default to the name;
    /// depth (closed loop, per connection) to 16; format to the trace file's extension's; span (the GiB of
    /// the export the offsets range over) to the whole export. Without kind=, trace= makes a replay,
    /// burst= bursts, on=/off= an on/off workload, rate= an open loop (Poisson arrivals), else a closed
    /// loop. Errors name the job's key. See docs/serve.md.
    // This doc comment is `rein load --help` text, where `[,key=V]` means optional: clap prints it
    // verbatim, so escaping the brackets for rustdoc would put backslashes in the help.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long = "job", required = true)]
    pub(crate) jobs: Vec<String>,
    /// Seconds to run.
    #[arg(long, default_value_t = 30.0)]
    pub(crate) seconds: f64,
    /// Seconds excluded from the summary.
    #[arg(long, default_value_t = 2.0)]
    pub(crate) warmup: f64,
    /// Where to write summary.json, timeseries.csv and plots.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Seed of the workloads' offsets, sizes, read mix and arrivals.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
}

fn parse_size(v: &str) -> Result<u64> {
    let v = v.trim().to_ascii_lowercase();
    let (num, mul) = if let Some(n) = v.strip_suffix('k') {
        (n, 1024)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 1 << 20)
    } else {
        (v.as_str(), 1)
    };
    let n: u64 = num.parse().with_context(|| format!("size {v:?}: expected bytes, or a number with k or m"))?;
    n.checked_mul(mul).context("size too large")
}

/// Parses one `--job` value into a job whose workload is validated by the simulator's rules; `duration`
/// is the run's length (the default stop).
pub(crate) fn parse_job(spec: &str, duration: Duration) -> Result<Job> {
    let (mut name, mut export, mut tenant) = (String::new(), String::new(), String::new());
    let mut conns = 1usize;
    let mut depth = 16u32;
    let mut kind: Option<String> = None;
    let mut size = 4096u64;
    let mut p = WorkloadParams { span_gb: 1024.0, ..WorkloadParams::default() };
    let (mut trace, mut trace_format, mut time_scale, mut repeat) = (None::<String>, None::<String>, 1.0, false);
    // Every error names the job as written, once.
    let mut seen = std::collections::BTreeSet::new();
    let mut keys = || -> Result<()> {
        for kv in spec.split(',') {
            let (k, v) = kv.split_once('=').with_context(|| format!("{kv:?} is not key=value"))?;
            if !seen.insert(k.trim()) {
                bail!("{} is given twice", k.trim());
            }
            let num = |v: &str| -> Result<f64> { v.parse::<f64>().with_context(|| format!("{k}={v}: not a number")) };
            match k.trim() {
                "name" => name = v.to_string(),
                "export" => export = v.to_string(),
                "tenant" => tenant = v.to_string(),
                "kind" => kind = Some(v.to_string()),
                "depth" => depth = v.parse().with_context(|| format!("depth={v}: not a whole number"))?,
                "conns" => conns = v.parse().with_context(|| format!("conns={v}: not a whole number"))?,
                "rate" => p.iops = Some(num(v)?),
                "think" => p.think_ms = Some(num(v)?),
                "on" => p.on_s = Some(num(v)?),
                "off" => p.off_s = Some(num(v)?),
                "burst" => p.burst_count = Some(v.parse().with_context(|| format!("burst={v}: not a whole number"))?),
                "period" => p.burst_period_ms = Some(num(v)?),
                "trace" => trace = Some(v.to_string()),
                "format" => trace_format = Some(v.to_string()),
                "time_scale" => time_scale = num(v)?,
                "repeat" => {
                    repeat = match v {
                        "1" | "true" | "yes" => true,
                        "0" | "false" | "no" => false,
                        _ => bail!("repeat={v}: expected true or false"),
                    }
                }
                "size" => size = parse_size(v)?,
                "read" => p.read_pct = num(v)?,
                "random" => p.random_pct = num(v)?,
                "span" => p.span_gb = num(v)?,
                "start" => p.start_s = num(v)?,
                "stop" => p.stop_s = Some(num(v)?),
                other => bail!(
                    "unknown key {other:?} (name, export, tenant, conns, kind, depth, rate, think, on, off, \
                     burst, period, trace, format, time_scale, repeat, size, read, random, span, start, stop)"
                ),
            }
        }
        Ok(())
    };
    keys().with_context(|| format!("job {spec:?}"))?;
    if name.is_empty() {
        bail!("job {spec:?}: name= is required");
    }
    if export.is_empty() {
        export = name.clone();
    }
    if tenant.is_empty() {
        tenant = export.clone();
    }
    if !(1..=1024).contains(&conns) {
        bail!("job {name}: conns must be in 1..=1024");
    }
    // The kind follows from the keys given unless named.
    let kind = kind.unwrap_or_else(|| {
        if trace.is_some() {
            "trace".into()
        } else if p.burst_count.is_some() {
            "burst".into()
        } else if p.on_s.is_some() || p.off_s.is_some() {
            "on_off".into()
        } else if p.iops.is_some() {
            "open".into()
        } else {
            "closed".into()
        }
    });
    let run = rein_core::Nanos::from_duration(duration);
    let given = Given { kind: &kind, depth, conns, size, trace: trace.is_some(), time_scale };
    check_values(&given, &p, run).with_context(|| format!("job {spec:?}"))?;
    // A closed loop keeps `depth` requests outstanding per connection.
    p.outstanding = depth.saturating_mul(conns as u32);
    p.size_kb = size as f64 / 1024.0;
    p.kind = kind;
    p.trace =
        trace.map(|path| TraceParams { path, format: trace_format, device: None, devices: None, time_scale, repeat });
    // The simulator's rules once more (and what needs the trace read: its records, a repeat's rate).
    let workload = p.validate(run, None, &[]).with_context(|| format!("job {spec:?}"))?;
    Ok(Job { name, export, tenant, connections: conns, workload, route: None, stream: None })
}

/// A job's values as written that [`WorkloadParams`] holds otherwise (or not at all).
struct Given<'a> {
    kind: &'a str,
    depth: u32,
    conns: usize,
    /// Bytes.
    size: u64,
    trace: bool,
    time_scale: f64,
}

/// Checks a job's values by the simulator's rules (`WorkloadParams::validate`, which [`parse_job`] applies
/// after) in the job's own terms: each error names the job key as written (`depth`, `rate`, `period`, ...)
/// and its value, not the scenario field it fills (`outstanding`, `workload.iops`, `burst_period_ms`).
/// `p` holds the keys that map one to one; `run` is the run's length (the default stop).
fn check_values(g: &Given, p: &WorkloadParams, run: rein_core::Nanos) -> Result<()> {
    use rein_core::{Nanos, Num};
    use rein_model::workload::{MAX_OUTSTANDING, MAX_RATE_IOPS, MAX_SECONDS, MAX_SIZE_BYTES, MIN_CYCLE_S};
    let secs = |key: &str, v: f64| -> Result<Nanos> {
        if !(v.is_finite() && (0.0..=MAX_SECONDS).contains(&v)) {
            bail!("{key} must be between 0 and {} s, got {}", Num(MAX_SECONDS), Num(v));
        }
        Ok(Nanos::from_secs_f64(v))
    };
    let millis = |key: &str, v: f64| -> Result<Nanos> {
        if !(v.is_finite() && (0.0..=MAX_SECONDS * 1e3).contains(&v)) {
            bail!("{key} must be between 0 and {} ms, got {}", Num(MAX_SECONDS * 1e3), Num(v));
        }
        Ok(Nanos::from_secs_f64(v / 1e3))
    };
    let positive = |key: &str, v: f64| -> Result<f64> {
        if !(v.is_finite() && v > 0.0) {
            bail!("{key} must be a positive number, got {}", Num(v));
        }
        Ok(v)
    };
    let within_rate = |what: &str, iops: f64| -> Result<()> {
        if iops <= MAX_RATE_IOPS {
            return Ok(());
        }
        bail!("{what} {} is above the bound of {} IOPS", Num(iops), Num(MAX_RATE_IOPS))
    };
    let needs = |key: &str| anyhow::anyhow!("kind={} needs {key}=", g.kind);
    let closed = || -> Result<()> {
        if g.depth == 0 || g.depth > MAX_OUTSTANDING {
            bail!("depth must be in 1..={MAX_OUTSTANDING}, got {}", g.depth);
        }
        if u64::from(g.depth) * g.conns as u64 > u64::from(MAX_OUTSTANDING) {
            bail!(
                "depth x conns (the job's requests outstanding) must be at most {MAX_OUTSTANDING}, got {} x {}",
                g.depth,
                g.conns
            );
        }
        millis("think", p.think_ms.unwrap_or(0.0))?;
        Ok(())
    };
    let open = || -> Result<()> {
        let rate = positive("rate", p.iops.ok_or_else(|| needs("rate"))?)?;
        within_rate("rate", rate)
    };
    match g.kind {
        "closed" => closed()?,
        "open" => open()?,
        "on_off" => {
            let on = secs("on", p.on_s.ok_or_else(|| needs("on"))?)?;
            let off = secs("off", p.off_s.ok_or_else(|| needs("off"))?)?;
            if on == Nanos::ZERO {
                bail!("on must be positive");
            }
            if on.saturating_add(off) < Nanos::from_secs_f64(MIN_CYCLE_S) {
                bail!(
                    "on + off must be at least {MIN_CYCLE_S} s (one on/off cycle), got {} s",
                    Num(on.saturating_add(off).as_secs_f64())
                );
            }
            if p.iops.is_some() {
                open()?
            } else {
                closed()?
            }
        }
        "burst" => {
            let count = p.burst_count.ok_or_else(|| needs("burst"))?;
            if count == 0 || count > MAX_OUTSTANDING {
                bail!("burst must be in 1..={MAX_OUTSTANDING}, got {count}");
            }
            let period = millis("period", positive("period", p.burst_period_ms.ok_or_else(|| needs("period"))?)?)?;
            within_rate("the rate burst / period", count as f64 / period.as_secs_f64())?;
        }
        "trace" => {
            if !g.trace {
                return Err(needs("trace"));
            }
            positive("time_scale", g.time_scale)?;
        }
        other => bail!("kind={other}: expected closed, open, on_off, burst or trace"),
    }
    if g.size == 0 {
        bail!("size must be a positive number of bytes, got 0");
    }
    if g.size > MAX_SIZE_BYTES {
        bail!("size must be at most 1 GiB ({MAX_SIZE_BYTES} bytes), got {}", g.size);
    }
    for (key, v) in [("read", p.read_pct), ("random", p.random_pct)] {
        if !(0.0..=100.0).contains(&v) {
            bail!("{key} must be in [0, 100], got {}", Num(v));
        }
    }
    positive("span", p.span_gb)?;
    let start = secs("start", p.start_s)?;
    match p.stop_s {
        Some(s) if secs("stop", s)? <= start => bail!("stop must be after start"),
        None if run <= start => {
            bail!("start must be before the run's end ({} s), got {}", Num(run.as_secs_f64()), Num(p.start_s))
        }
        _ => {}
    }
    Ok(())
}

/// One line of the live table on stderr: elapsed time, then each tenant's IOPS and mean latency (ms).
pub(crate) fn print_live(t: Duration, rows: &rein_runtime::load::Live) {
    let mut line = format!("{:>6.1}s", t.as_secs_f64());
    for (name, iops, lat) in rows {
        line.push_str(&format!("  | {name:<8} {iops:>8.1} IOPS {lat:>7.2} ms"));
    }
    eprintln!("{line}");
}

/// The per-tenant summary table on stdout (`?` where the spec or phases are unknown).
pub(crate) fn print_summary(totals: &RunTotals) {
    println!(
        "{:<12} {:>7} {:>7} {:>5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6} {:>7}",
        "tenant", "r", "l", "w", "IOPS", "MB/s", "lat ms", "p99 ms", "max ms", "resv%", "errors"
    );
    for t in &totals.summary.tenants {
        let opt = |v: Option<f64>, none: &str| v.map_or(none.to_string(), |x| format!("{x}"));
        let resv = t.phase.as_ref().map_or("?".into(), |p| format!("{:.0}%", 100.0 * p.reservation_fraction()));
        println!(
            "{:<12} {:>7} {:>7} {:>5} {:>10.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>6} {:>7}",
            t.name,
            opt(t.reservation, "?"),
            if t.weight.is_none() { "?".into() } else { opt(t.limit, "-") },
            opt(t.weight, "?"),
            t.iops,
            t.mb_s,
            t.latency_ms.mean,
            t.latency_ms.p99,
            t.latency_ms.max,
            resv,
            t.rejected
        );
    }
    if totals.summary.tenants.iter().any(|t| t.weight.is_none()) {
        println!("(? = unknown: pass --admin to read the tenants' specs and phases from the server)");
    }
    // `rein cluster run` of a pShift scenario: the controller's closed periods, as `rein sim` prints them.
    print!("{}", rein_model::report::rounds::periods_text(&totals.periods, 8));
}

/// The `--tls-*` flags: a client context if any is given (errors name the flag and the file).
fn load_tls(args: &LoadArgs) -> Result<Option<rein_runtime::load::LoadTls>> {
    use rein_runtime::tls::{Naming, TlsClient, TlsClientFiles};
    if args.tls_ca.is_none() && args.tls_psk_file.is_none() {
        return Ok(None);
    }
    let files = TlsClientFiles {
        ca: args.tls_ca.clone(),
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        psk_file: args.tls_psk_file.clone(),
        psk_identity: args.tls_psk_identity.clone(),
    };
    let client = TlsClient::build(Naming::Flags("tls"), files).map_err(anyhow::Error::msg)?;
    Ok(Some(rein_runtime::load::LoadTls { client, name: args.tls_name.clone() }))
}

/// `rein load`: checks that `--out` can be written, runs the jobs against the server for `--seconds`,
/// then prints the summary (or `--json`) and writes `--out`.
pub(crate) fn run(args: LoadArgs) -> Result<()> {
    if !(args.seconds > 0.0 && args.seconds <= 86_400.0 && args.warmup >= 0.0 && args.warmup < args.seconds) {
        bail!("need 0 <= --warmup < --seconds <= 86400");
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let warmup = Duration::from_secs_f64(args.warmup);
    let jobs = args.jobs.iter().map(|j| parse_job(j, duration)).collect::<Result<Vec<_>>>()?;
    if let Some(dir) = &args.out {
        crate::sim::check_out(dir)?;
    }
    let interval = Duration::from_secs(1);
    let cfg = LoadConfig {
        addr: args.addr,
        admin: args
            .admin
            .as_deref()
            .map(|a| {
                let cert = args.admin_cert.as_deref().zip(args.admin_key.as_deref());
                rein_runtime::admin_client::AdminEndpoint::parse_with(a, args.admin_ca.as_deref(), cert)
            })
            .transpose()
            .map_err(anyhow::Error::msg)?,
        admin_token: args.admin_token_file.as_deref().map(rein_runtime::admin_guard::AdminToken::load).transpose()?,
        jobs,
        duration,
        warmup,
        interval,
        seed: args.seed,
        name: "rein-load".into(),
        max_pending: rein_runtime::load::MAX_PENDING,
        servers: Vec::new(),
        server_admins: Vec::new(),
        tls: load_tls(&args)?,
        // The admin API does not say the server's cost model: the report's oracle assumes IOPS.
        cost_model: rein_core::CostModel::PerIo,
        start_gate: None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let quiet = args.json;
    // On a worker, not on `block_on`'s thread: the connections' reader tasks then wake the load on a
    // worker, not this thread once per request (docs/serve.md, `rein load`).
    let totals = rt
        .block_on(rt.spawn(rein_runtime::load::run(cfg, move |t, rows| {
            if !quiet {
                print_live(t, rows)
            }
        })))
        .map_err(|e| anyhow::anyhow!("the load's task failed: {e}"))??;
    // The summary first: a failure to write --out then fails the command without costing the results.
    if args.json {
        println!("{}", totals.summary.to_json().trim_end());
    } else {
        print_summary(&totals);
    }
    if let Some(dir) = &args.out {
        crate::sim::write_run(dir, "rein load", (duration - warmup).as_secs_f64(), &totals, None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_err(spec: &str) -> String {
        crate::report(&parse_job(spec, Duration::from_secs(10)).expect_err("should be refused"))
    }

    /// Every error names the job once; a key given twice is an error, not the last one winning.
    #[test]
    fn job_errors_name_the_job_and_refuse_repeated_keys() {
        assert_eq!(
            job_err("name=a,depth=x"),
            "job \"name=a,depth=x\": depth=x: not a whole number: invalid digit found in string"
        );
        assert_eq!(job_err("name=a,rate=5,rate=9"), "job \"name=a,rate=5,rate=9\": rate is given twice");
        assert!(job_err("name=a,bogus=1").starts_with("job \"name=a,bogus=1\": unknown key \"bogus\""));
        assert_eq!(job_err("name=a,rate"), "job \"name=a,rate\": \"rate\" is not key=value");
        assert!(job_err("name=a,trace=x.trace,repeat=maybe").ends_with("repeat=maybe: expected true or false"));
        assert_eq!(
            job_err("name=a,rate=1e9"),
            "job \"name=a,rate=1e9\": rate 1000000000 is above the bound of 10000000 IOPS"
        );
        let ok = parse_job("name=a,rate=100,read=50", Duration::from_secs(10)).unwrap();
        assert_eq!((ok.name.as_str(), ok.export.as_str()), ("a", "a"));
        // A value out of range is named by its job key and value as written, not by the scenario field it
        // fills (docs/serve.md, `rein load`): each message after the job's name.
        for (keys, want) in [
            ("depth=0", "depth must be in 1..=65536, got 0"),
            ("depth=70000", "depth must be in 1..=65536, got 70000"),
            (
                "depth=100,conns=1000",
                "depth x conns (the job's requests outstanding) must be at most 65536, got 100 x 1000",
            ),
            ("rate=0", "rate must be a positive number, got 0"),
            ("kind=open", "kind=open needs rate="),
            ("burst=0,period=10", "burst must be in 1..=65536, got 0"),
            ("burst=4", "kind=burst needs period="),
            ("burst=4,period=0", "period must be a positive number, got 0"),
            ("burst=65536,period=0.001", "the rate burst / period 65536000000 is above the bound of 10000000 IOPS"),
            ("read=150", "read must be in [0, 100], got 150"),
            ("random=-1", "random must be in [0, 100], got -1"),
            ("on=0,off=1", "on must be positive"),
            ("on=1", "kind=on_off needs off="),
            ("on=1,off=-1", "off must be between 0 and 604800 s, got -1"),
            ("on=0.0001,off=0.0001", "on + off must be at least 0.001 s (one on/off cycle), got 0.0002 s"),
            ("span=0", "span must be a positive number, got 0"),
            ("think=-1", "think must be between 0 and 604800000 ms, got -1"),
            ("size=0", "size must be a positive number of bytes, got 0"),
            ("size=2048m", "size must be at most 1 GiB (1073741824 bytes), got 2147483648"),
            ("start=-1", "start must be between 0 and 604800 s, got -1"),
            ("start=20", "start must be before the run's end (10 s), got 20"),
            ("start=5,stop=2", "stop must be after start"),
            ("stop=1e9", "stop must be between 0 and 604800 s, got 1000000000"),
            ("trace=x.trace,time_scale=0", "time_scale must be a positive number, got 0"),
            ("kind=trace", "kind=trace needs trace="),
            ("kind=zigzag", "kind=zigzag: expected closed, open, on_off, burst or trace"),
        ] {
            let spec = format!("name=a,{keys}");
            assert_eq!(job_err(&spec), format!("job {spec:?}: {want}"));
        }
    }
}
