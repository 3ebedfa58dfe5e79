//! `rein sim`: run a scenario file in the simulator, print a summary, write outputs, check expectations.

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rein_model::report::hosts::HostsSummary;
use rein_sim::check::{CheckResult, Sabotage};
use rein_sim::model::NamedScheduler;
use rein_sim::{RunTotals, Scenario};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    /// Scenario file (TOML); see docs/scenarios.md and scenarios/.
    pub(crate) scenario: PathBuf,
    /// Override the scenario's seed.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Run every server on this scheduler instead (mclock, dmclock, rbfq, sfq, fifo, lfq, dtfq).
    #[arg(long)]
    pub(crate) scheduler: Option<NamedScheduler>,
    /// Run with a deliberately wrong scheduler, to see the checks fail: fifo, no-delta-rho, fixed-window,
    /// no-controller, no-shift (docs/scenarios.md).
    #[arg(long)]
    pub(crate) sabotage: Option<Sabotage>,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

/// What to do with a run's totals, for `rein sim` and `rein cluster run` alike ([`report`]).
#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// Write summary.json, timeseries.csv and plots (PNG and SVG) here.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Print the summary as JSON on stdout (and nothing else there).
    #[arg(long)]
    pub(crate) json: bool,
    /// Check the scenario's expectations; exit 1 naming each miss.
    #[arg(long)]
    pub(crate) check: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

/// Loads the scenario with the command line's overrides applied.
pub(crate) fn load(args: &SimArgs) -> Result<Scenario> {
    let mut sc = Scenario::load(&args.scenario)?;
    if let Some(seed) = args.seed {
        sc = sc.with_seed(seed)?;
    }
    if let Some(s) = &args.scheduler {
        if sc.pshift().is_some() {
            bail!(
                "scenario {}: --scheduler: pShift scenarios run token schedulers; set controller = false in [pshift] \
                 for plain round robin",
                sc.label()
            );
        }
        // A name that is no scheduler is the command line's error (clap's, from the parse), not the
        // scenario's. Held to what the file may say: `scheduler = "token"` outside [pshift] is refused, so
        // is this.
        sc = sc.with_scheduler_named(s).map_err(|e| anyhow::anyhow!("{e} (from --scheduler {})", s.name()))?;
    }
    if let Some(sabotage) = args.sabotage {
        // A name that is none is the command line's error (clap's, from the parse), before the file is read.
        let Some(s) = sabotage.apply(&sc) else {
            bail!("scenario {}: --sabotage {sabotage} changes nothing in this scenario", sc.label());
        };
        sc = s;
    }
    Ok(sc)
}

/// Runs a scenario with a progress bar on stderr (when it is a terminal and not quiet); with `check`,
/// also checks its expectations (running the baseline they ask for).
pub(crate) fn run_with_progress(
    sc: &Scenario,
    quiet: bool,
    check: bool,
) -> Result<(RunTotals, Option<Vec<CheckResult>>)> {
    let total = sc.duration().0;
    let bar = if quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("{prefix} [{bar:40}] {msg} simulated, {elapsed} elapsed, ETA {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_prefix(sc.name().to_string());
        b
    };
    let mut progress = |t: rein_core::Nanos| {
        bar.set_position(t.0);
        bar.set_message(format!("{:.1}/{:.1} s", t.as_secs_f64(), sc.duration().as_secs_f64()));
    };
    let r = if check {
        let (r, results) = rein_sim::run_and_check(sc, &mut progress)?;
        (r, Some(results))
    } else {
        (rein_sim::run(sc, &mut progress)?, None)
    };
    bar.finish_and_clear();
    Ok(r)
}

/// One-screen text summary.
pub(crate) fn summary_text(r: &RunTotals) -> String {
    let s = &r.summary;
    let mut out = format!(
        "{}: {} s simulated ({} s warm-up excluded), scheduler {}{}, seed {}\n",
        s.name,
        s.duration_s,
        s.warmup_s,
        s.scheduler,
        s.sabotage.as_ref().map_or(String::new(), |x| format!(" (sabotage {x})")),
        s.seed
    );
    let oracle = r.oracle_iops(s.warmup_s, s.duration_s);
    let shown = &s.tenants[..s.tenants.len().min(MAX_ROWS)];
    let nw = name_width(shown.iter().map(|t| t.name.as_str()), 14);
    out.push_str(&format!(
        "{:<nw$} {:>8} {:>8} {:>6} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6}\n",
        "tenant", "r", "l", "w", "IOPS", "oracle", "MB/s", "mean ms", "p99 ms", "max ms", "resv%"
    ));
    for (i, t) in shown.iter().enumerate() {
        let resv = t.phase.as_ref().map(|p| format!("{:>5.0}%", 100.0 * p.reservation_fraction()));
        let lat = latency_cells(t);
        out.push_str(&format!(
            "{:<nw$} {:>8} {:>8} {:>6} {:>9.1} {:>9.1} {:>8.2} {:>8} {:>8} {:>8} {:>6}\n",
            cut(&t.name, nw),
            match t.reservation {
                Some(r) if r > 0.0 => rate(r),
                Some(_) => "-".into(),
                None => "?".into(),
            },
            t.limit.map_or("-".into(), rate),
            t.weight.map_or("?".into(), rate),
            t.iops,
            oracle[i],
            t.mb_s,
            lat[0],
            lat[1],
            lat[2],
            resv.unwrap_or_else(|| "    ?".into())
        ));
    }
    if s.tenants.len() > MAX_ROWS {
        out.push_str(&format!("... and {} more tenants (see summary.json)\n", s.tenants.len() - MAX_ROWS));
    }
    let servers = &s.servers[..s.servers.len().min(16)];
    let sw = name_width(servers.iter().map(|sv| sv.name.as_str()), 10);
    for sv in servers {
        out.push_str(&format!(
            "server {:<sw$} {:>9.1} IOPS, utilisation {:>6}, {}{}\n",
            cut(&sv.name, sw),
            sv.iops,
            sv.utilisation.map_or("?".into(), |u| format!("{:.1}%", u * 100.0)),
            sv.scheduler,
            if sv.distributed { " (distributed)" } else { "" }
        ));
    }
    if let Some(h) = &s.hosts {
        out.push_str(&host_text(h));
    }
    out.push_str(&rein_model::report::rounds::periods_text(&r.periods, 8));
    let rejected: u64 = s.tenants.iter().map(|t| t.rejected).sum();
    if rejected > 0 {
        out.push_str(&format!("warning: {rejected} requests were rejected at full scheduler queues\n"));
    }
    out
}

/// PARDA hosts: one line each, then the cluster.
fn host_text(h: &HostsSummary) -> String {
    let shown = &h.hosts[..h.hosts.len().min(MAX_ROWS)];
    let nw = name_width(shown.iter().map(|x| x.name.as_str()), 14);
    let mut out = format!(
        "PARDA {} (script-L {} ms, {} aggregation)\n{:<nw$} {:>6} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>8}\n",
        if h.enabled { "on" } else { "off (baseline)" },
        h.latency_threshold_ms,
        h.aggregation,
        "host",
        "ctl",
        "beta",
        "window",
        "eq.(3)",
        "IOPS",
        "lat ms",
        "signal ms",
        "conv s"
    );
    for x in shown {
        out.push_str(&format!(
            "{:<nw$} {:>6} {:>8.2} {:>8.2} {:>8} {:>9.1} {:>8.2} {:>9} {:>8}\n",
            cut(&x.name, nw),
            if x.controlled { "parda" } else { "fixed" },
            x.beta_mean,
            x.window_mean,
            x.equilibrium_window.map_or("-".into(), |w| format!("{w:.2}")),
            x.iops,
            x.latency_mean_ms,
            if x.controlled { format!("{:.2}", x.signal_mean_ms) } else { "-".into() },
            if x.controlled { x.convergence_s.map_or("-".into(), |c| format!("{c:.0}")) } else { "-".into() }
        ));
    }
    out.push_str(&format!(
        "cluster: {:.1} IOPS, mean latency {:.2} ms{}\n",
        h.iops,
        h.latency_mean_ms,
        h.equilibrium_latency_ms.map_or(String::new(), |l| format!(" (eq. (3) equilibrium {l:.2} ms)"))
    ));
    out
}

/// A spec value for the table: at most two decimals, without trailing zeros (a rate derived as 1.5 x 9.6
/// prints as 14.4, not 14.399999999999999).
fn rate(x: f64) -> String {
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// Rows of tenants (and of PARDA hosts) the text summary shows; summary.json has them all.
const MAX_ROWS: usize = 40;

/// The widest name column of the text summary: a longer name is cut, ending in `…`.
const MAX_NAME_WIDTH: usize = 64;

/// The width of a name column: the longest of `names`, at least `min` (the column's title and the
/// numbers' alignment), at most [`MAX_NAME_WIDTH`]. Names up to that long are printed whole, so names that
/// differ stay different in the table.
pub(crate) fn name_width<'a>(names: impl Iterator<Item = &'a str>, min: usize) -> usize {
    names.map(|n| n.chars().count()).max().unwrap_or(0).clamp(min, MAX_NAME_WIDTH)
}

/// `s` if it fits in `n` characters, else its first `n - 1` and `…`.
pub(crate) fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n.saturating_sub(1)).collect::<String>() + "…"
    }
}

/// Creates `--out`'s directory `dir` and checks that a file can be created in it (one made and removed at
/// once), before a run whose files go there: an unwritable `--out` fails at once, not after the run.
pub(crate) fn check_out(dir: &Path) -> Result<()> {
    // `create_dir_all` on a file's name says only "File exists".
    if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
        anyhow::bail!("--out {}: it is a file, not a directory", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("--out {}: cannot create the directory", dir.display()))?;
    tempfile::Builder::new()
        .prefix(".rein-out-check-")
        .tempfile_in(dir)
        .with_context(|| format!("--out {}: cannot create a file in it", dir.display()))?;
    Ok(())
}

/// Writes summary.json, timeseries.csv and the plots into `dir`; returns the plots drawn ([`write_files`]).
pub(crate) fn write_outputs(
    dir: &Path,
    sc: &Scenario,
    r: &RunTotals,
    checks: Option<&[CheckResult]>,
) -> Result<Vec<&'static str>> {
    let measured = (sc.duration().saturating_sub(sc.warmup())).as_secs_f64().max(1e-9);
    write_files(dir, sc.name(), measured, r, checks, Some(sc))
}

/// Writes a run's files (simulated or measured by `rein load`) into `dir`; returns the plots drawn.
pub(crate) fn write_run(
    dir: &Path,
    name: &str,
    measured: f64,
    r: &RunTotals,
    checks: Option<&[CheckResult]>,
) -> Result<Vec<&'static str>> {
    write_files(dir, name, measured, r, checks, None)
}

/// Writes a run's files into `dir`, with a scenario's own plots (pShift's) when `sc` is given. The
/// directory is left holding exactly this run's files of the names the writers own (crate::out): those of
/// another run that this one does not write are removed first, and each file is written whole or not at
/// all. Each error names the file, with its directory. Returns the stems of the plots drawn (each a PNG and
/// an SVG): none without a font, `phases` only when some tenant has IOs by phase, so that what the commands
/// say they wrote is what they wrote.
fn write_files(
    dir: &Path,
    name: &str,
    measured: f64,
    r: &RunTotals,
    checks: Option<&[CheckResult]>,
    sc: Option<&Scenario>,
) -> Result<Vec<&'static str>> {
    use crate::plot;
    let title = format!("{} ({})", name, r.summary.scheduler);
    let rows: Vec<(String, [f64; 3])> = r
        .summary
        .tenants
        .iter()
        .take(30)
        .map(|t| {
            (
                t.name.clone(),
                [
                    t.phase.as_ref().map_or(0.0, |p| p.reservation as f64 / measured),
                    t.phase.as_ref().map_or(0.0, |p| p.weight as f64 / measured),
                    t.phase.as_ref().map_or(0.0, |p| p.over_limit as f64 / measured),
                ],
            )
        })
        .collect();
    // What this run writes: the plan, before anything is written.
    let mut files = vec!["summary.json", "timeseries.csv"];
    if checks.is_some() {
        files.push("check.json");
    }
    if r.hosts.is_some() {
        files.push("hosts.csv");
    }
    if !r.rounds.is_empty() {
        files.push("rounds.csv");
    }
    if !r.period_log.records.is_empty() {
        files.push("periods.csv");
    }
    let fonts = plot::need_font();
    let mut plots: Vec<&'static str> = Vec::new();
    if fonts.is_ok() {
        if r.hosts.is_some() {
            plots.extend(plot::HOST_PLOTS);
        }
        if !r.rounds.is_empty() {
            plots.push("rounds");
        }
        if plot::draws_period_verdicts(&r.period_log) {
            plots.push("period-verdicts");
        }
        plots.extend(plot::run_plot_names(&rows));
        if let Some(sc) = sc {
            plots.extend(plot::pshift_plot_names(sc));
        }
    }
    let plan =
        files.iter().map(|f| f.to_string()).chain(plots.iter().flat_map(|p| crate::out::plot_files(p))).collect();
    let mut out = crate::out::OutDir::open(dir, &plan)?;
    out.write("summary.json", r.summary.to_json().as_bytes())?;
    out.write("timeseries.csv", r.timeseries.to_csv().as_bytes())?;
    if let Some(c) = checks {
        out.write("check.json", (serde_json::to_string_pretty(c)? + "\n").as_bytes())?;
    }
    if let Some(h) = &r.hosts {
        out.write("hosts.csv", h.to_csv().as_bytes())?;
    }
    if !r.rounds.is_empty() {
        out.write("rounds.csv", rein_model::report::rounds::to_csv(&r.rounds).as_bytes())?;
    }
    if !r.period_log.records.is_empty() {
        out.write("periods.csv", r.period_log.to_csv().as_bytes())?;
    }
    match fonts {
        Ok(()) => {
            if let Some(h) = &r.hosts {
                plot::host_plots(&mut out, &title, h)?;
            }
            if !r.rounds.is_empty() {
                plot::rounds_plot(&mut out, &title, &r.rounds)?;
            }
            plot::period_verdicts_plot(&mut out, &title, &r.period_log)?;
            let open_loop: Vec<bool> = r.summary.tenants.iter().map(|t| t.open_loop).collect();
            plot::run_plots(&mut out, &title, &r.timeseries, &open_loop, &rows)?;
            if let Some(sc) = sc {
                plot::pshift_plots(&mut out, &title, sc, &r.timeseries)?;
            }
        }
        Err(e) => errln!("warning: {e}; summary.json and timeseries.csv were written"),
    }
    out.finish()?;
    Ok(plots)
}

/// `wrote DIR/{a.csv, b.json, p, q (.png, .svg)}`: files, then the plots of `among` that were drawn.
fn wrote_line(dir: &Path, files: &[&str], drawn: &[&str], among: impl Fn(&str) -> bool) -> String {
    let mut parts: Vec<String> = files.iter().map(|f| f.to_string()).collect();
    let plots: Vec<&str> = drawn.iter().copied().filter(|p| among(p)).collect();
    if !plots.is_empty() {
        parts.push(format!("{} (.png, .svg)", plots.join(", ")));
    }
    format!("wrote {}/{{{}}}", dir.display(), parts.join(", "))
}

/// Prints check results; returns the number of misses.
pub(crate) fn print_checks(results: &[CheckResult], to_stderr: bool) -> usize {
    let mut misses = 0;
    for c in results {
        let line = format!(
            "{} {}{}",
            if c.ok { "ok  " } else { "MISS" },
            c.description,
            c.note.as_ref().map_or(String::new(), |n| format!("  ({n})"))
        );
        if to_stderr {
            errln!("{line}");
        } else {
            outln!("{line}");
        }
        misses += (!c.ok) as usize;
    }
    misses
}

/// `rein sim`: runs the scenario, prints its summary (or `--json`), writes `--out`, and with `--check`
/// fails naming the missed expectations.
pub(crate) fn run(args: SimArgs) -> Result<()> {
    let sc = load(&args)?;
    let a = &args.report;
    if a.check {
        require_expectations(&sc)?;
    }
    if let Some(dir) = &a.out {
        check_out(dir)?;
    }
    let (r, results) = run_with_progress(&sc, a.quiet || a.json, a.check)?;
    report(a, &sc, &r, results, |r| out!("{}", summary_text(r)))
}

/// `--check` of a scenario without `[[expect]]` entries is refused before the run, which would check
/// nothing.
pub(crate) fn require_expectations(sc: &Scenario) -> Result<()> {
    if sc.expect().is_empty() {
        bail!("scenario {}: --check: it has no [[expect]] entries, nothing to check", sc.label());
    }
    Ok(())
}

/// A tenant's mean, p99 and max latency (ms, two decimals), or `-` for each when it completed nothing
/// after the warm-up: its latency summary is then zeros, which would read as instant service.
pub(crate) fn latency_cells(t: &rein_model::report::TenantSummary) -> [String; 3] {
    if t.completed == 0 {
        return ["-".into(), "-".into(), "-".into()];
    }
    [t.latency_ms.mean, t.latency_ms.p99, t.latency_ms.max].map(|v| format!("{v:.2}"))
}

/// A run's report, for `rein sim` and `rein cluster run`: prints `--json` or the summary (`summary`),
/// writes `--out` and says what it wrote, and with `--check` fails naming the missed expectations. The
/// summary comes first: a failure to write `--out` (checked before the run, [`check_out`], but a disk can
/// fill) does not cost the run's results; it fails the command afterwards, naming the file.
pub(crate) fn report(
    a: &ReportArgs,
    sc: &Scenario,
    r: &RunTotals,
    results: Option<Vec<CheckResult>>,
    summary: impl FnOnce(&RunTotals),
) -> Result<()> {
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r.summary)?);
    } else {
        summary(r);
    }
    let written = a.out.as_ref().map(|dir| write_outputs(dir, sc, r, results.as_deref())).transpose();
    if let (false, Ok(Some(drawn)), Some(dir)) = (a.json, &written, &a.out) {
        let own = |p: &str| p == "rounds" || p == "period-verdicts" || crate::plot::HOST_PLOTS.contains(&p);
        let mut files = vec!["summary.json", "timeseries.csv"];
        if results.is_some() {
            files.push("check.json");
        }
        outln!("{}", wrote_line(dir, &files, drawn, |p| !own(p)));
        if !r.rounds.is_empty() {
            outln!("{}", wrote_line(dir, &["rounds.csv"], drawn, |p| p == "rounds"));
        }
        if !r.period_log.records.is_empty() {
            outln!(
                "{} (each bucket's IOs in each closed period)",
                wrote_line(dir, &["periods.csv"], drawn, |p| p == "period-verdicts")
            );
        }
        if r.hosts.is_some() {
            outln!("{}", wrote_line(dir, &["hosts.csv"], drawn, |p| crate::plot::HOST_PLOTS.contains(&p)));
        }
    }
    let mut misses = 0;
    if let Some(results) = &results {
        misses = print_checks(results, a.json);
    }
    written?;
    if misses > 0 {
        bail!("scenario {}: {misses} of {} expectations missed", sc.label(), results.map_or(0, |r| r.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// `--scheduler NAME` is parsed once, by clap, into the typed scheduler `load` hands on: a name that
    /// is none is the command line's error, naming the value and the known names; one that is keeps its
    /// name as given (the reports').
    #[test]
    fn the_scheduler_is_parsed_once_on_the_command_line() {
        use clap::Parser;
        let parse = |name: &str| crate::Cli::try_parse_from(["rein", "sim", "s.toml", "--scheduler", name]);
        let e = parse("wfq").unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        let e = e.to_string();
        assert!(e.contains("invalid value 'wfq' for '--scheduler <SCHEDULER>'"), "{e}");
        assert!(
            e.contains(
                "unknown scheduler \"wfq\" (expected one of mclock, dmclock, rbfq, sfq, token, fifo, lfq, dtfq)"
            ),
            "{e}"
        );
        let crate::Cmd::Sim(args) = parse("LFQ").unwrap().cmd else { panic!("not rein sim") };
        let s = args.scheduler.expect("--scheduler given");
        assert_eq!((s.name(), s.kind(), s.distributed()), ("LFQ", rein_core::SchedulerKind::Sfq, false));
    }

    #[test]
    fn spec_values_print_without_float_noise() {
        assert_eq!(super::rate(9.6 * 1.5), "14.4");
        assert_eq!(super::rate(30000.0), "30000");
        assert_eq!(super::rate(10.0), "10");
        assert_eq!(super::rate(0.126), "0.13");
        assert_eq!(super::rate(0.0), "0");
    }

    /// The text summary's name column is as wide as the longest name (up to 64 characters): two tenants
    /// whose names share their first 13 characters stay apart (both were `database-prim~`), and the
    /// columns line up; a name beyond 64 is cut with `…`.
    #[test]
    fn long_names_are_printed_whole_and_the_columns_line_up() {
        let summary = super::summary_text(&super::long_names::run());
        let table: Vec<&str> = summary.lines().skip(1).take(5).collect();
        super::long_names::check(&summary, &table);
        assert!(table.iter().all(|l| l.chars().nth(64) == Some(' ')), "{summary}");
    }

    /// A tenant that completed nothing after the warm-up (it stops before its end) shows `-` for
    /// its latencies, not 0.00 (instant service); the one that ran shows numbers.
    #[test]
    fn a_tenant_without_completions_has_no_latency_to_show() {
        let text = "name = \"early\"\nduration_s = 1.0\nwarmup_s = 0.5\n[[servers]]\nname = \"s1\"\n\
                    capacity_iops = 1000\n[[tenants]]\nname = \"on\"\n[tenants.workload]\nkind = \"closed\"\n\
                    [[tenants]]\nname = \"gone\"\n[tenants.workload]\nkind = \"closed\"\nstop_s = 0.4\n";
        let sc = rein_sim::Scenario::from_toml(text, None).unwrap();
        let r = rein_sim::run(&sc, &mut |_| {}).unwrap();
        let summary = super::summary_text(&r);
        let cells = |name: &str| -> Vec<String> {
            let row = summary.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{summary}"));
            row.split_whitespace().skip(7).take(3).map(String::from).collect()
        };
        assert_eq!(cells("gone "), ["-", "-", "-"], "{summary}");
        assert!(cells("on ").iter().all(|c| c.parse::<f64>().is_ok_and(|v| v > 0.0)), "{summary}");
    }
}

/// The run and the check behind the tests of the name columns, here and in `load`'s summary.
#[cfg(test)]
pub(crate) mod long_names {
    /// A second of four closed-loop tenants: two whose names share their first 25 characters, a short
    /// one and one of 70 characters.
    pub(crate) fn run() -> rein_model::report::RunTotals {
        let long = "x".repeat(70);
        let mut text =
            String::from("name = \"names\"\nduration_s = 1.0\n[[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n");
        for name in ["database-primary-eu-west-1", "database-primary-eu-west-2", "a", &long] {
            text.push_str(&format!(
                "[[tenants]]\nname = \"{name}\"\n[tenants.workload]\nkind = \"closed\"\noutstanding = 1\n"
            ));
        }
        let sc = rein_sim::Scenario::from_toml(&text, None).unwrap();
        rein_sim::run(&sc, &mut |_| {}).unwrap()
    }

    /// `table` (the title row and the four tenants' rows of `summary`) lines up, and its name column
    /// reads each name whole but the long one, cut at 64 characters with `…`.
    pub(crate) fn check(summary: &str, table: &[&str]) {
        let width = |l: &str| l.chars().count();
        assert!(table.iter().all(|l| width(l) == width(table[0])), "{summary}");
        let names: Vec<String> =
            table.iter().map(|l| l.chars().take(64).collect::<String>().trim_end().into()).collect();
        let cut = format!("{}…", "x".repeat(63));
        assert_eq!(
            names,
            ["tenant", "database-primary-eu-west-1", "database-primary-eu-west-2", "a", &cut],
            "{summary}"
        );
    }
}
