//! `rein`: the command-line face of Rein. Thin: parsing, formatting, files and exit codes; the algorithms
//! live in rein-core and the simulator in rein-sim.

#![forbid(unsafe_code)]
// Output goes through `outln!`/`out!` and `errln!`, which never panic on a closed or failing stream.
#![deny(clippy::print_stdout, clippy::print_stderr)]

#[macro_use]
mod stdout;
#[macro_use]
mod stderr;

mod admin;
mod bench;
mod cluster;
mod demo;
mod gateway;
mod generate;
mod load;
mod logging;
mod out;
mod plot;
mod probe;
mod pshift;
mod serve;
mod signals;
mod sim;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "rein", version, about = "Rein: storage IO quality of service (reservations, limits, weights)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log lines on stderr as text, or as one JSON object per line (for a log collector: `timestamp`,
    /// `level`, `fields` with `message` and the line's values, `target`). `REIN_LOG` picks what is
    /// logged.
    #[arg(long, global = true, env = "REIN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Rein's main job on a built-in default: the mClock §2.1 example, capacity halving half-way.
    Demo(demo::DemoArgs),
    /// Run a scenario in the deterministic simulator.
    Sim(sim::SimArgs),
    /// Serve NBD exports with per-tenant QoS (default 127.0.0.1:10809, admin on 127.0.0.1:9180).
    Serve(serve::ServeArgs),
    /// Serve NBD volumes striped over storage nodes (rein serve instances or plain NBD servers).
    Gateway(gateway::GatewayArgs),
    /// Multi-tenant load over NBD with a live table; writes the same outputs as `rein sim`.
    Load(Box<load::LoadArgs>),
    /// Ask a running daemon through its admin endpoint: rein serve's tenants, exports and capacity, a
    /// gateway's node links and PARDA host, a pShift controller's buckets, any one's health (status).
    Admin(admin::AdminArgs),
    /// Measure an export's backend the way `rein serve` uses it (capacity for admission control).
    Probe(probe::ProbeArgs),
    /// Speed measurements.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// A scenario on real daemons: `up` starts its nodes and gateways, `run` also drives its workloads.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// pShift token allocation: solve instance files, generate the paper's synthetic instances.
    #[command(subcommand)]
    Pshift(pshift::PshiftCmd),
    /// Print the shell completion script for bash, zsh, fish, elvish or PowerShell.
    Completions(generate::CompletionsArgs),
    /// Write the man pages (rein.1 and one per subcommand) into a directory.
    Manpages(generate::ManpagesArgs),
}

fn main() {
    let cli = Cli::parse();
    // Log lines go through a bounded queue to a thread of their own: a stderr that is not read or fails
    // costs dropped lines, never a stuck or crashed daemon (logging.rs).
    let (sink, log) = logging::start(std::io::stderr());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("REIN_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(sink)
        .log_internal_errors(false);
    let cli_format = cli.log_format;
    match cli_format {
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
    let res = match cli.cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Sim(a) => sim::run(a),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Gateway(a) => gateway::run(a),
        Cmd::Load(a) => load::run(*a),
        Cmd::Admin(a) => admin::run(a),
        Cmd::Probe(a) => probe::run(a),
        Cmd::Bench(c) => bench::run(c),
        Cmd::Pshift(c) => pshift::run(c),
        Cmd::Cluster(c) => cluster::run(c),
        Cmd::Completions(a) => generate::completions(a, <Cli as clap::CommandFactory>::command()),
        Cmd::Manpages(a) => generate::manpages(a, <Cli as clap::CommandFactory>::command()),
    };
    // A write to stdout that failed other than on a closed pipe fails the command (stdout.rs).
    let flushed = stdout::finish();
    let res = res.and(flushed);
    // The last words go after the log lines, through the same queue; the exit waits for them a while.
    let code = match res {
        Ok(()) => 0,
        Err(e) => {
            match cli_format {
                LogFormat::Text => log.sink().line(&format!("error: {}\n", report(&e))),
                // A collector reads every line as an object, the last words too.
                LogFormat::Json => tracing::error!(target: "rein", "{}", report(&e)),
            }
            1
        }
    };
    log.finish(LOG_FLUSH);
    std::process::exit(code);
}

/// How long an exit waits for the log lines still queued (a stderr nobody reads would hold it for ever).
const LOG_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// The error and its causes on one line, each said once: a cause whose text the message already holds
/// is left out. (The library errors put their cause in their own message, so that a log line of one
/// error is complete; printed as a chain, as `{:#}` would, each cause would appear twice or three times.)
pub(crate) fn report(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// The admin endpoint's client options are one set (`admin::AdminClientArgs`) in `rein admin` and
    /// `rein load`: `rein load` takes them only beside its `--admin`, `rein admin` beside `--config` too.
    #[test]
    fn the_admin_client_options_need_an_endpoint_only_in_rein_load() {
        let parse = |args: &[&str]| super::Cli::try_parse_from(args.iter().copied()).map(|_| ());
        let job = "--job=a=export=x,tenant=t";
        for opts in [&["--admin-token-file", "t"][..], &["--admin-ca", "c"], &["--admin-cert", "c", "--admin-key", "k"]]
        {
            let without: Vec<&str> = ["rein", "load", job].iter().copied().chain(opts.iter().copied()).collect();
            let e = parse(&without).unwrap_err();
            assert!(e.to_string().contains("--admin <ADMIN>"), "{without:?}: {e}");
            let with: Vec<&str> = without.iter().copied().chain(["--admin", "127.0.0.1:9180"]).collect();
            parse(&with).unwrap_or_else(|e| panic!("{with:?}: {e}"));
            let admin: Vec<&str> = ["rein", "admin", "--config", "f.toml"]
                .iter()
                .copied()
                .chain(opts.iter().copied())
                .chain(["status"])
                .collect();
            parse(&admin).unwrap_or_else(|e| panic!("{admin:?}: {e}"));
        }
        assert!(parse(&["rein", "admin", "--admin-cert", "c", "status"]).is_err(), "a certificate without its key");
    }

    /// Issue 12: a library error whose message holds its cause, printed with its chain, says the cause
    /// once (before: `export rd: open failed: X: open failed: X: X`).
    #[test]
    fn each_cause_is_reported_once() {
        let os = std::io::Error::from_raw_os_error(2);
        let storage = rein_runtime::storage::StorageError::Io { op: "open", source: os };
        let e = rein_runtime::server::ServeError::Open(rein_runtime::preflight::OpenError::Export {
            name: "rd".into(),
            path: "d/rd.img".into(),
            source: storage,
            hint: String::new(),
        });
        let e = anyhow::Error::from(e);
        assert_eq!(format!("{e:#}").matches("os error 2").count(), 3, "the chain as anyhow prints it");
        assert_eq!(super::report(&e), "export rd: d/rd.img: open failed: No such file or directory (os error 2)");
        // A context without the cause keeps it once, after the context.
        let ctx = anyhow::Error::from(std::io::Error::from_raw_os_error(2)).context("reading x");
        assert_eq!(super::report(&ctx), "reading x: No such file or directory (os error 2)");
    }

    /// A refused `--job` (rein-runtime's typed `JobError`, its key's error and the parser's as sources)
    /// is the one line its String error was: each cause once.
    #[test]
    fn a_refused_job_is_reported_once() {
        let d = std::time::Duration::from_secs(10);
        let e = crate::load::parse_job("name=a,depth=x", d).unwrap_err();
        assert_eq!(e.chain().count(), 3, "job, key, parser");
        assert_eq!(
            super::report(&e),
            "job \"name=a,depth=x\": depth=x: not a whole number: invalid digit found in string"
        );
    }
}
