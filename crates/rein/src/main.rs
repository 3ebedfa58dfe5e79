//! `rein`: the command-line face of Rein. Thin: parsing, formatting, files and exit codes; the algorithms
//! live in rein-core and the simulator in rein-sim.

mod plot;
mod sim;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "rein", version, about = "Rein: storage IO quality of service (reservations, limits, weights)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run a scenario in the deterministic simulator.
    Sim(sim::SimArgs),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Sim(a) => sim::run(a),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
