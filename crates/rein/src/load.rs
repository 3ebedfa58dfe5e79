//! `rein load`: multi-tenant load over NBD with a live per-tenant table, and the same summary.json,
//! timeseries.csv and plots as `rein sim`, so simulated and real runs compare directly. The workloads are
//! the simulator's (rein-model's generator); `--admin` adds the server's tenant specs and scheduling
//! phases to the report.

use anyhow::{bail, Result};
use clap::Args;
use rein_model::RunTotals;
use rein_runtime::load::{Job, LoadConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("admin_options").args(crate::admin::AdminClientArgs::IDS).multiple(true).requires("admin")
))]
pub(crate) struct LoadArgs {
    /// NBD server: `HOST[:PORT]`, HOST an IP address or a name resolved once at the start (its first IPv4
    /// address if it has one; with TLS the name is what the server's certificate must carry unless
    /// --tls-name says otherwise); PORT 10809, NBD's, when left out.
    #[arg(long, value_name = "HOST[:PORT]", default_value = "127.0.0.1:10809", value_parser = parse_nbd_addr)]
    pub(crate) addr: NbdAddr,
    /// The server's admin endpoint (`rein serve`'s, default 127.0.0.1:9180), as ADDR or http://ADDR, or
    /// https://ADDR when it is served with admin_tls: the report then carries the tenants' specs and
    /// completions by scheduling phase. Without it they are unknown (null).
    #[arg(long)]
    pub(crate) admin: Option<String>,
    #[command(flatten)]
    pub(crate) admin_client: crate::admin::AdminClientArgs,
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
    /// With --tls-ca: revoked server certificates (PEM CRLs, each signed by a CA of --tls-ca, as a
    /// server's `[tls] crl`): a server whose certificate one lists is refused.
    #[arg(long, requires = "tls_ca")]
    pub(crate) tls_crl: Option<PathBuf>,
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
    /// Stop a job once this many of its requests have failed (answered with an error or lost with a
    /// connection; 1 stops at the first, as fio does without continue_on_error). Default: no limit, a
    /// closed loop replacing a failed request as it would a completion. The run ends when every job has
    /// stopped.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_errors: Option<u64>,
}

/// Parses one `--job` value (rein-runtime's `job_spec`); `duration` is the run's length (the default stop).
pub(crate) fn parse_job(spec: &str, duration: Duration) -> Result<Job> {
    Ok(rein_runtime::job_spec::parse(spec, rein_core::Nanos::from_duration(duration))?)
}

/// One line of the live table on stderr: elapsed time, then each tenant's IOPS and mean latency (ms).
pub(crate) fn print_live(t: Duration, rows: &rein_runtime::load::Live) {
    let mut line = format!("{:>6.1}s", t.as_secs_f64());
    for (name, iops, lat) in rows {
        line.push_str(&format!("  | {name:<8} {iops:>8.1} IOPS {lat:>7.2} ms"));
    }
    errln!("{line}");
}

/// The per-tenant summary table on stdout ([`summary_text`]).
pub(crate) fn print_summary(totals: &RunTotals) {
    out!("{}", summary_text(totals));
}

/// The per-tenant summary table (`?` where the spec or phases are unknown), then a pShift controller's
/// closed periods. The name column is as wide as the longest name, as `rein sim`'s
/// ([`crate::sim::name_width`]).
fn summary_text(totals: &RunTotals) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let nw = crate::sim::name_width(totals.summary.tenants.iter().map(|t| t.name.as_str()), 12);
    let _ = writeln!(
        s,
        "{:<nw$} {:>7} {:>7} {:>5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6} {:>7}",
        "tenant", "r", "l", "w", "IOPS", "MB/s", "mean ms", "p99 ms", "max ms", "resv%", "errors"
    );
    for t in &totals.summary.tenants {
        let opt = |v: Option<f64>, none: &str| v.map_or(none.to_string(), |x| format!("{x}"));
        let resv = t.phase.as_ref().map_or("?".into(), |p| format!("{:.0}%", 100.0 * p.reservation_fraction()));
        let lat = crate::sim::latency_cells(t);
        let _ = writeln!(
            s,
            "{:<nw$} {:>7} {:>7} {:>5} {:>10.1} {:>9.2} {:>9} {:>9} {:>9} {:>6} {:>7}",
            crate::sim::cut(&t.name, nw),
            opt(t.reservation, "?"),
            if t.weight.is_none() { "?".into() } else { opt(t.limit, "-") },
            opt(t.weight, "?"),
            t.iops,
            t.mb_s,
            lat[0],
            lat[1],
            lat[2],
            resv,
            t.rejected
        );
    }
    if totals.summary.tenants.iter().any(|t| t.weight.is_none()) {
        s.push_str("(? = unknown: pass --admin to read the tenants' specs and phases from the server)\n");
    }
    // `rein cluster run` of a pShift scenario: the controller's closed periods, as `rein sim` prints them.
    s.push_str(&rein_model::report::rounds::periods_text(&totals.periods, 8));
    s
}

/// `--addr`: where the server is, and the host name it was given by, if a name.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NbdAddr {
    pub(crate) addr: SocketAddr,
    pub(crate) name: Option<String>,
}

/// NBD's port (IANA), when `--addr` gives none.
const NBD_PORT: u16 = 10809;

/// Parses `--addr`: `IP:PORT`, `[IPv6]:PORT`, an IP alone, or a host name with or without a port (it
/// took only `IP:PORT`, and `localhost:10809` or a bare IP got clap's "invalid socket address syntax").
/// An NBD URI is refused with where its parts go.
fn parse_nbd_addr(s: &str) -> Result<NbdAddr, String> {
    use std::net::{IpAddr, ToSocketAddrs};
    if s.contains("://") {
        return Err(format!(
            "{s:?} is a URI: --addr takes HOST[:PORT] (the export goes in --job export=NAME, TLS in the --tls-* flags)"
        ));
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(NbdAddr { addr, name: None });
    }
    let bare = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')).unwrap_or(s);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(NbdAddr { addr: SocketAddr::new(ip, NBD_PORT), name: None });
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((host, port)) => {
            let port =
                port.parse::<u16>().map_err(|_| format!("port {port:?} of {s:?} is not a number in 0..=65535"))?;
            (host, port)
        }
        None => (s, NBD_PORT),
    };
    if host.is_empty() {
        return Err(format!("{s:?} names no host"));
    }
    let found: Vec<SocketAddr> =
        (host, port).to_socket_addrs().map_err(|e| format!("cannot resolve host {host:?}: {e}"))?.collect();
    let addr = found.iter().find(|a| a.is_ipv4()).or(found.first()).copied();
    let addr = addr.ok_or_else(|| format!("host {host:?} has no address"))?;
    Ok(NbdAddr { addr, name: Some(host.to_string()) })
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
        crl: args.tls_crl.clone(),
    };
    let client = TlsClient::build(Naming::Flags("tls"), files).map_err(anyhow::Error::msg)?;
    // A host name in --addr is the name the certificate must carry, as for any TLS client; --tls-name
    // says otherwise.
    let name = args.tls_name.clone().or_else(|| args.addr.name.clone());
    Ok(Some(rein_runtime::load::LoadTls { client, name }))
}

/// `--seconds` in (0, 86400] and `--warmup` in [0, --seconds), each error naming the value given: a bare
/// `need 0 <= --warmup < --seconds <= 86400` left `rein load --seconds 2` (with the default warm-up of
/// 2 s, which the command line did not show) without a clue which was wrong.
fn check_times(seconds: f64, warmup: f64) -> Result<()> {
    if !(seconds > 0.0 && seconds <= 86_400.0) {
        bail!("--seconds {seconds} is out of range: a run lasts more than 0 and at most 86400 s (a day)");
    }
    if !(warmup >= 0.0 && warmup < seconds) {
        bail!(
            "--warmup {warmup} must be at least 0 and below --seconds {seconds}: the warm-up (2 s unless \
             --warmup says otherwise) is left out of the summary, so the run must last longer"
        );
    }
    Ok(())
}

/// `rein load`: checks that `--out` can be written, runs the jobs against the server for `--seconds`,
/// then prints the summary (or `--json`) and writes `--out`.
pub(crate) fn run(args: LoadArgs) -> Result<()> {
    check_times(args.seconds, args.warmup)?;
    let duration = Duration::from_secs_f64(args.seconds);
    let warmup = Duration::from_secs_f64(args.warmup);
    let jobs = args.jobs.iter().map(|j| parse_job(j, duration)).collect::<Result<Vec<_>>>()?;
    if let Some(dir) = &args.out {
        crate::sim::check_out(dir)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (stop, signal) = stop_on_signals(&rt)?;
    // Intervals of 1 s, and specs in IOPS: the admin API does not say the server's cost model, so the
    // report's oracle assumes IOPS (LoadConfig::new's defaults).
    let cfg = LoadConfig {
        admin: args.admin.as_deref().map(|a| args.admin_client.endpoint(a)).transpose()?,
        admin_token: args.admin_client.token(None)?,
        warmup,
        seed: args.seed,
        tls: load_tls(&args)?,
        max_errors: args.max_errors,
        stop: Some(stop.clone()),
        ..LoadConfig::new(args.addr.addr, jobs, duration)
    };
    let quiet = args.json;
    // On a worker, not on `block_on`'s thread: the connections' reader tasks then wake the load on a
    // worker, not this thread once per request (docs/serve.md, `rein load`).
    let outcome = rt
        .block_on(rt.spawn(rein_runtime::load::run_checked(cfg, move |t, rows| {
            if !quiet {
                print_live(t, rows)
            }
        })))
        .map_err(|e| anyhow::anyhow!("the load's task failed: {e}"))??;
    let totals = outcome.totals;
    // The summary first: a failure to write --out then fails the command without costing the results.
    if args.json {
        outln!("{}", totals.summary.to_json().trim_end());
    } else {
        print_summary(&totals);
    }
    if let Some(dir) = &args.out {
        crate::sim::write_run(dir, "rein load", (duration - warmup).as_secs_f64(), &totals, None)?;
    }
    if let (Some(at), Some(signal)) = (outcome.failures.interrupted_at, signal.get()) {
        let also = failed(&outcome.failures).err().map_or(String::new(), |e| format!("; {e}"));
        bail!(
            "interrupted by {signal} at {:.1} s of {:.1} s: the summary covers the time it ran{also}",
            at.as_secs_f64(),
            duration.as_secs_f64()
        );
    }
    failed(&outcome.failures)
}

/// SIGINT and SIGTERM stop the run (the load's [`LoadConfig::stop`]), which then reports and writes what
/// ran, naming the signal (it died without a summary, its `--out` left empty); a second signal ends the
/// process at once (exit status 128 + the signal's number), for a drain that takes too long.
fn stop_on_signals(
    rt: &tokio::runtime::Runtime,
) -> Result<(std::sync::Arc<tokio::sync::Notify>, std::sync::Arc<std::sync::OnceLock<&'static str>>)> {
    let (mut term, mut int) = crate::signals::signals(rt)?;
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let which = std::sync::Arc::new(std::sync::OnceLock::new());
    let (s, w) = (stop.clone(), which.clone());
    rt.spawn(async move {
        let first = tokio::select! { _ = term.recv() => "SIGTERM", _ = int.recv() => "SIGINT" };
        let _ = w.set(first);
        s.notify_one();
        let (name, status) = tokio::select! { _ = term.recv() => ("SIGTERM", 143), _ = int.recv() => ("SIGINT", 130) };
        errln!("error: {name} after {first}: stopping at once, without a summary");
        std::process::exit(status);
    });
    Ok((stop, which))
}

/// An error when requests failed, a connection broke or a job stopped (the results above stand; the exit
/// status says they are not clean): when the run ended if before its end, the count, the first failure,
/// the broken connections and the stopped jobs (the first few of each).
pub(crate) fn failed(f: &rein_runtime::load::Failures) -> Result<()> {
    if !f.any() {
        return Ok(());
    }
    let mut msg = String::new();
    if let Some(at) = f.ended_at {
        msg.push_str(&format!(
            "the run ended early, at {:.1} s: every job stopped (the summary covers the time it ran); ",
            at.as_secs_f64()
        ));
    }
    if f.failed > 0 {
        msg.push_str(&format!(
            "{} request{} failed (the first: {})",
            f.failed,
            if f.failed == 1 { "" } else { "s" },
            f.first.as_deref().unwrap_or("?")
        ));
    }
    if f.unanswered > 0 {
        if !msg.is_empty() {
            msg.push_str("; ");
        }
        msg.push_str(&format!(
            "{} request{} still unanswered {} s after the end",
            f.unanswered,
            if f.unanswered == 1 { "" } else { "s" },
            rein_runtime::load::DRAIN_TIMEOUT.as_secs()
        ));
    }
    const SHOWN: usize = 4;
    for b in f.broken.iter().take(SHOWN) {
        msg.push_str(&format!("; {b}"));
    }
    if f.broken.len() > SHOWN {
        msg.push_str(&format!("; and {} more broken connections", f.broken.len() - SHOWN));
    }
    for s in f.stopped.iter().take(SHOWN) {
        msg.push_str(&format!("; {s}"));
    }
    if f.stopped.len() > SHOWN {
        msg.push_str(&format!("; and {} more jobs stopped", f.stopped.len() - SHOWN));
    }
    bail!("{msg}")
}

#[cfg(test)]
mod tests {
    /// `--addr` as an operator writes it: IP:PORT, an IP alone (NBD's port), IPv6 with and without
    /// brackets, `localhost` with and without a port (resolved from the hosts file; its IPv4 address
    /// first), and what it refuses, named.
    #[test]
    fn addr_takes_host_and_port_as_written() {
        use super::{parse_nbd_addr, NbdAddr};
        let at = |s: &str| parse_nbd_addr(s).map(|NbdAddr { addr, name }| (addr.to_string(), name));
        assert_eq!(at("127.0.0.5:1234"), Ok(("127.0.0.5:1234".into(), None)));
        assert_eq!(at("127.0.0.5"), Ok(("127.0.0.5:10809".into(), None)));
        assert_eq!(at("[::1]:99"), Ok(("[::1]:99".into(), None)));
        assert_eq!(at("::1"), Ok(("[::1]:10809".into(), None)));
        assert_eq!(at("[::1]"), Ok(("[::1]:10809".into(), None)));
        assert_eq!(at("localhost:99"), Ok(("127.0.0.1:99".into(), Some("localhost".into()))));
        assert_eq!(at("localhost"), Ok(("127.0.0.1:10809".into(), Some("localhost".into()))));
        let e = at("nbd://127.0.0.1:10809/a").unwrap_err();
        assert!(e.contains("is a URI") && e.contains("--job export=NAME"), "{e}");
        assert_eq!(at("localhost:nbd").unwrap_err(), "port \"nbd\" of \"localhost:nbd\" is not a number in 0..=65535");
        assert_eq!(at(":99").unwrap_err(), "\":99\" names no host");
    }

    /// A host name in `--addr` is the name a TLS client checks the server's certificate for, unless
    /// `--tls-name` says otherwise; an IP address leaves it to the runtime (the IP).
    #[test]
    fn a_host_name_in_addr_is_the_tls_name() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            load: super::LoadArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let psk = dir.path().join("keys.psk");
        std::fs::write(&psk, "alice:00112233445566778899aabbccddeeff\n").unwrap();
        let name = |addr: &str| {
            let argv = ["rein-load", "--addr", addr, "--job", "name=a", "--tls-psk-file", psk.to_str().unwrap()];
            let args = Cli::try_parse_from(argv).unwrap().load;
            super::load_tls(&args).unwrap().expect("TLS asked for").name
        };
        assert_eq!(name("localhost:99"), Some("localhost".to_string()));
        assert_eq!(name("127.0.0.5:99"), None);
    }

    /// A run shorter than the default warm-up, and the other out-of-range times, name the value at fault.
    #[test]
    fn out_of_range_times_name_the_value_at_fault() {
        let e = |s, w| super::check_times(s, w).unwrap_err().to_string();
        assert_eq!(
            e(2.0, 2.0),
            "--warmup 2 must be at least 0 and below --seconds 2: the warm-up (2 s unless --warmup says otherwise) \
             is left out of the summary, so the run must last longer"
        );
        assert!(e(1.0, -1.0).starts_with("--warmup -1 must be at least 0 and below --seconds 1"));
        assert!(e(1.0, f64::NAN).starts_with("--warmup NaN must be"));
        for s in [0.0, -1.0, 100_000.0, f64::NAN, f64::INFINITY] {
            assert_eq!(
                e(s, 0.0),
                format!("--seconds {s} is out of range: a run lasts more than 0 and at most 86400 s (a day)")
            );
        }
        assert!(super::check_times(3.0, 2.0).is_ok() && super::check_times(86_400.0, 0.0).is_ok());
    }

    /// The summary's name column is as wide as the longest name, as `rein sim`'s: names that share their
    /// first 12 characters stay apart and the columns line up (a 26-character name pushed its row's
    /// columns out of line; at most 64 characters, then cut with `…`).
    #[test]
    fn long_names_keep_the_columns_in_line() {
        let summary = super::summary_text(&crate::sim::long_names::run());
        let table: Vec<&str> = summary.lines().take(5).collect();
        crate::sim::long_names::check(&summary, &table);
    }
}
