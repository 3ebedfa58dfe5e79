//! An `--out` directory's files: the names the run writers own, and writing them.
//!
//! `rein sim`, `rein cluster run`, `rein load` and `rein demo` write a run's files ([`crate::sim::write_run`])
//! under fixed names: the data files of [`DATA_FILES`] and the plots of [`PLOTS`], each `.png` and `.svg`.
//! A run opens the directory with the names it will write ([`OutDir::open`]), which removes the files of
//! owned names it will not write (a previous run's `check.json`, or its PARDA `hosts.csv` and host plots),
//! so that the directory holds this run's outputs and no other run's. Nothing else in the directory is
//! touched: other files, subdirectories, and a directory of an owned name stay.
//!
//! Each file is written whole by rein-runtime's one writer ([`rein_runtime::durable`]: a temporary file in
//! the same directory, synced and renamed over its name, the directory synced), so a failed write (a full
//! disk) leaves no truncated file: the temporary is removed and the error names the file and the step. A
//! failed run also removes the owned files it did not get to write, so what it leaves is its own, if
//! incomplete.

use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The data files a run writer may write.
pub(crate) const DATA_FILES: [&str; 6] =
    ["summary.json", "timeseries.csv", "check.json", "hosts.csv", "rounds.csv", "periods.csv"];

/// The plots a run writer may draw, each as `<name>.png` and `<name>.svg`.
pub(crate) const PLOTS: [&str; 11] = [
    "iops",
    "latency",
    "phases",
    "host-window",
    "host-latency",
    "host-iops",
    "host-beta",
    "intervals",
    "periods",
    "rounds",
    "period-verdicts",
];

/// A plot's two files.
pub(crate) const PLOT_EXTENSIONS: [&str; 2] = ["svg", "png"];

/// Whether `name` is a file name the run writers own.
pub(crate) fn owned(name: &str) -> bool {
    DATA_FILES.contains(&name)
        || name.rsplit_once('.').is_some_and(|(stem, ext)| PLOTS.contains(&stem) && PLOT_EXTENSIONS.contains(&ext))
}

/// Every owned name.
fn all_owned() -> impl Iterator<Item = String> {
    let plots = PLOTS.iter().flat_map(|p| PLOT_EXTENSIONS.iter().map(move |e| format!("{p}.{e}")));
    DATA_FILES.iter().map(|f| f.to_string()).chain(plots)
}

/// A plot's file names, `<stem>.svg` and `<stem>.png`.
pub(crate) fn plot_files(stem: &str) -> [String; 2] {
    PLOT_EXTENSIONS.map(|e| format!("{stem}.{e}"))
}

/// An `--out` directory being written by one run (the module comment).
pub(crate) struct OutDir {
    dir: PathBuf,
    written: BTreeSet<String>,
    finished: bool,
}

impl OutDir {
    /// Creates `dir` if need be and removes its files of owned names not in `planned`.
    pub(crate) fn open(dir: &Path, planned: &BTreeSet<String>) -> Result<OutDir> {
        debug_assert!(planned.iter().all(|n| owned(n)), "{planned:?}");
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let out = OutDir { dir: dir.to_path_buf(), written: BTreeSet::new(), finished: false };
        out.remove_owned_except(planned)?;
        Ok(out)
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes `bytes` as the file `name` (an owned name) whole ([`rein_runtime::durable`]).
    pub(crate) fn write(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        self.write_with(name, |f| f.write_all(bytes))
    }

    /// Writes the file `name` with `fill`, which writes its contents into the temporary file.
    fn write_with(&mut self, name: &str, fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> Result<()> {
        debug_assert!(owned(name), "{name}");
        rein_runtime::durable::write_with(&self.dir.join(name), fill)?;
        self.written.insert(name.to_string());
        Ok(())
    }

    /// Ends a run's writing: removes any owned file it did not write (none, when its plan was right).
    pub(crate) fn finish(mut self) -> Result<()> {
        self.finished = true;
        let written = std::mem::take(&mut self.written);
        self.remove_owned_except(&written)
    }

    /// Removes the regular files (and symbolic links) of owned names in the directory, but those in `keep`.
    fn remove_owned_except(&self, keep: &BTreeSet<String>) -> Result<()> {
        for name in all_owned().filter(|n| !keep.contains(n)) {
            let path = self.dir.join(&name);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if !m.is_dir() => {
                    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Drop for OutDir {
    /// A run that failed part-way removes the owned files it did not write: it leaves only its own.
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.remove_owned_except(&self.written);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn owned_names_are_the_writers_and_nothing_else() {
        for n in ["summary.json", "check.json", "hosts.csv", "iops.png", "host-beta.svg", "period-verdicts.png"] {
            assert!(owned(n), "{n}");
        }
        for n in ["notes.txt", "iops.jpg", "summary.json.bak", "data", "iops", "my-iops.png", ".rein-out-x.tmp"] {
            assert!(!owned(n), "{n}");
        }
        assert_eq!(all_owned().count(), DATA_FILES.len() + 2 * PLOTS.len());
    }

    /// Opening removes the owned files this run will not write, and only those: another file, a
    /// subdirectory, and a directory of an owned name stay.
    #[test]
    fn open_removes_only_owned_files_not_planned() {
        let d = tempfile::tempdir().unwrap();
        for f in ["summary.json", "check.json", "hosts.csv", "host-iops.png", "host-iops.svg", "notes.txt"] {
            std::fs::write(d.path().join(f), "old").unwrap();
        }
        std::fs::create_dir(d.path().join("data")).unwrap();
        std::fs::create_dir(d.path().join("rounds.csv")).unwrap();
        let plan: BTreeSet<String> = ["summary.json".to_string()].into();
        let mut out = OutDir::open(d.path(), &plan).unwrap();
        assert_eq!(names(d.path()), ["data", "notes.txt", "rounds.csv", "summary.json"]);
        out.write("summary.json", b"new").unwrap();
        out.finish().unwrap();
        assert_eq!(std::fs::read_to_string(d.path().join("summary.json")).unwrap(), "new");
        assert_eq!(names(d.path()), ["data", "notes.txt", "rounds.csv", "summary.json"]);
        // The file has the mode a plain write gives (the umask's), not a temporary file's 0600.
        use std::os::unix::fs::PermissionsExt;
        let mode = |f: &str| std::fs::metadata(d.path().join(f)).unwrap().permissions().mode();
        assert_eq!(mode("summary.json"), mode("notes.txt"));
    }

    /// A plot that cannot be written fails in words, naming the file (plotters' own file backends
    /// printed `BackendError(DrawingError(Os { code: 28, .. }))`).
    #[test]
    fn a_plot_write_error_names_the_file() {
        if crate::plot::need_font().is_err() {
            errln!("skipped: no font for plots");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("iops.svg")).unwrap();
        let mut out = OutDir::open(d.path(), &plot_files("iops").into()).unwrap();
        let s = crate::plot::Series { name: "a".into(), points: vec![(0.0, 1.0), (1.0, 2.0)] };
        let e = crate::plot::line_chart(&mut out, "iops", "t", "x", "y", &[s], &[]).unwrap_err();
        let path = d.path().join("iops.svg");
        assert_eq!(
            crate::report(&e),
            format!(
                "writing {}: checking what the path names: it is a directory, not a regular file, so it is left alone",
                path.display()
            )
        );
        drop(out);
        assert_eq!(names(d.path()), ["iops.svg"], "no temporary left");
    }

    /// A write that fails part-way (a full disk, injected) leaves neither a truncated file nor its
    /// temporary, and its error names the file; the failed run leaves only what it wrote.
    #[test]
    fn a_failed_write_leaves_no_partial_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("timeseries.csv"), "an older run's\n").unwrap();
        let plan: BTreeSet<String> = ["summary.json", "timeseries.csv"].map(String::from).into();
        let mut out = OutDir::open(d.path(), &plan).unwrap();
        out.write("summary.json", b"{}\n").unwrap();
        let e = out
            .write_with("timeseries.csv", |f| {
                f.write_all(b"t,tenant,io")?;
                Err(std::io::Error::from_raw_os_error(28))
            })
            .unwrap_err();
        let path = d.path().join("timeseries.csv");
        assert_eq!(
            crate::report(&e),
            format!("writing {}: writing the temporary file: No space left on device (os error 28)", path.display())
        );
        // Not cut short (the rename never happened), and no temporary.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "an older run's\n");
        assert_eq!(names(d.path()), ["summary.json", "timeseries.csv"]);
        // The failed run ends: it leaves only what it wrote, no older run's file beside it.
        drop(out);
        assert_eq!(names(d.path()), ["summary.json"]);
    }
}
