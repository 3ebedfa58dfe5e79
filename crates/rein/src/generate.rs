//! `rein completions SHELL` and `rein manpages --out DIR`: the shell completions and man pages of this
//! binary, generated from its own command-line definition (clap's), so they list exactly the commands and
//! options this build takes and cannot drift from it. Nothing here is Rein's logic.

use anyhow::{Context, Result};
use std::path::PathBuf;

/// `rein completions`.
#[derive(Debug, clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell, e.g. `rein completions bash > /etc/bash_completion.d/rein`, or for zsh a file
    /// `_rein` in a directory of `$fpath`
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// `rein manpages`.
#[derive(Debug, clap::Args)]
pub(crate) struct ManpagesArgs {
    /// Directory for the pages (made if missing): rein.1 and one per subcommand (rein-serve.1,
    /// rein-cluster-run.1, ...); read one with `man -l DIR/rein-serve.1`, or copy them into a man1
    /// directory of `manpath` (e.g. /usr/local/share/man/man1)
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// Prints the completion script for `a.shell` on stdout.
pub(crate) fn completions(a: CompletionsArgs, mut cli: clap::Command) -> Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cli, "rein", &mut script);
    out!("{}", String::from_utf8_lossy(&script));
    Ok(())
}

/// Writes the man pages of `cli` and every subcommand into `a.out`, and says how many.
pub(crate) fn manpages(a: ManpagesArgs, cli: clap::Command) -> Result<()> {
    crate::sim::check_out(&a.out)?;
    let before = pages(&a.out)?;
    clap_mangen::generate_to(cli, &a.out)
        .with_context(|| format!("--out {}: writing the man pages", a.out.display()))?;
    let after = pages(&a.out)?;
    outln!(
        "wrote {} man pages into {} ({} new): man -l {}",
        after.len(),
        a.out.display(),
        after.len() - before.len(),
        a.out.join("rein.1").display()
    );
    Ok(())
}

/// The `rein*.1` files in `dir`.
fn pages(dir: &std::path::Path) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("--out {}: cannot list it", dir.display()))? {
        let p = e.with_context(|| format!("--out {}: cannot list it", dir.display()))?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("rein") && name.ends_with(".1") {
            v.push(p);
        }
    }
    Ok(v)
}
