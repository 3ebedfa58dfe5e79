//! `rein demo`: Rein's main job on a built-in default. Runs the mClock paper's §2.1 example (RD, OLTP and
//! DM sharing one device whose capacity halves half-way) in the simulator, prints each tenant's service
//! next to the fluid oracle, writes the plots, and says whether reservations and limits held.

use crate::sim;
use anyhow::{bail, Result};
use clap::Args;
use rein_sim::check::check;
use rein_sim::Scenario;
use std::path::{Path, PathBuf};

/// The built-in scenario (also at scenarios/demo.toml).
pub const DEMO_TOML: &str = include_str!("../../../scenarios/demo.toml");

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Scheduler to demonstrate (try fifo or sfq to see what goes wrong without mClock).
    #[arg(long, default_value = "mclock")]
    pub scheduler: String,
    /// Where to write summary.json, timeseries.csv and the plots.
    #[arg(long, default_value = "rein-demo")]
    pub out: PathBuf,
    /// Print the summary as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: DemoArgs) -> Result<()> {
    let mut sc = Scenario::from_toml(DEMO_TOML, None)?;
    let (kind, distributed) = rein_sim::scenario::parse_scheduler(&args.scheduler).map_err(anyhow::Error::msg)?;
    sc = sc.with_scheduler(kind, distributed);
    let r = sim::run_with_progress(&sc, args.json)?;
    let results = check(&sc, &r);
    sim::write_outputs(&args.out, &sc, &r, Some(&results))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r.summary)?);
        return Ok(());
    }
    println!("{}\n", sc.description.trim());
    for (label, a, b) in [("capacity 2,400 IOPS (5-60 s)", 5.0, 60.0), ("capacity 1,200 IOPS (65-120 s)", 65.0, 120.0)] {
        let oracle = r.oracle_iops(&sc, a, b);
        println!("{label}:");
        println!("  {:<6} {:>10} {:>10} {:>8}", "tenant", "IOPS", "oracle", "diff");
        for (i, t) in sc.tenants.iter().enumerate() {
            let got = r.timeseries.iops(i, a, b);
            println!("  {:<6} {:>10.1} {:>10.1} {:>+7.1}%", t.name, got, oracle[i], 100.0 * (got - oracle[i]) / oracle[i].max(1e-9));
        }
    }
    println!();
    let misses = sim::print_checks(&results, false);
    let held = |word: &str| results.iter().zip(&sc.expect).filter(|(_, e)| e.note.as_deref().is_some_and(|n| n.contains(word))).all(|(c, _)| c.ok);
    let (resv_ok, limit_ok) = (held("reservation"), held("limit"));
    println!(
        "\nwith {}: reservations held: {}; limit held: {}",
        args.scheduler,
        if resv_ok { "yes" } else { "NO" },
        if limit_ok { "yes" } else { "NO" }
    );
    println!("plots: {}", show(&args.out));
    if misses > 0 && kind == rein_core::SchedulerKind::Mclock {
        bail!("{misses} expectations missed");
    }
    Ok(())
}

fn show(p: &Path) -> String {
    format!("{0}/iops.png, {0}/latency.png, {0}/phases.png (and .svg)", p.display())
}
