//! Writing a file whole: the one writer of rein serve's state file ([`crate::state::Store`]; its journal is appended to) and of the
//! run writers' `--out` files (`rein sim`, `rein cluster run`, `rein load`, `rein demo`); and [`read()`],
//! the reader of the files a daemon writes so and reads back at its start.
//!
//! [`write()`] fills a new temporary file in the file's own directory (`.<name>.<pid>-<n>.tmp`, so that
//! the rename stays on one file system), syncs it, renames it over the file's name, and syncs the
//! directory, which makes the rename itself durable. A reader sees the old file or the new one, never a
//! part; after a crash the file is the old one or the new one too. On any failure the temporary file is
//! removed and the file is as it was, but for the last step: a failure to sync the directory comes after
//! the rename, so the file is the new one then (its rename perhaps not yet durable). The error names the
//! file and the step that failed ([`Step`]).
//!
//! The temporary is created as a plain file is (mode 0666 less the umask), so a new file has the mode a
//! plain write would have given it; a file that is replaced keeps its mode (the temporary takes it before
//! the rename, as a plain write would have kept it).
//!
//! What the path names is checked first ([`Step::Check`]): a symbolic link is followed, and the file it
//! names is the one written (the link stays a link); a path that names something other than a regular
//! file (a device such as `/dev/full`, a FIFO, a directory) is refused and left alone: a rename over it
//! would replace the device node with a regular file, where a plain write would have written to the
//! device.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A step of [`write()`], as its error names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Finding what the path names (following a link; it must be a regular file, or nothing yet).
    Check,
    /// Creating the temporary file in the file's directory.
    Create,
    /// Writing the contents into the temporary file.
    Write,
    /// Syncing the temporary file to its device.
    Sync,
    /// Renaming the temporary file over the file.
    Rename,
    /// Syncing the directory (the rename) to its device.
    SyncDirectory,
}

impl Step {
    /// The step in words, as errors name it.
    pub fn words(self) -> &'static str {
        match self {
            Step::Check => "checking what the path names",
            Step::Create => "creating a temporary file beside it",
            Step::Write => "writing the temporary file",
            Step::Sync => "syncing the temporary file",
            Step::Rename => "renaming the temporary file over it",
            Step::SyncDirectory => "syncing its directory",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.words())
    }
}

/// Why [`write()`] failed: the file, the step, and the operating system's error.
#[derive(Debug, thiserror::Error)]
#[error("writing {}: {step}: {source}", path.display())]
pub struct WriteError {
    /// The file being written.
    pub path: PathBuf,
    /// The step that failed.
    pub step: Step,
    /// The operating system's error.
    pub source: std::io::Error,
}

/// Writes `bytes` as the file `path`, whole (module comment).
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    write_with(path, |f| f.write_all(bytes))
}

/// Writes the file `path` whole (module comment), its contents written into the temporary file by `fill`.
pub fn write_with(path: &Path, fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> Result<(), WriteError> {
    let fail = |step| move |source| WriteError { path: path.to_path_buf(), step, source };
    let (target, mode) = check(path).map_err(fail(Step::Check))?;
    let path = target.as_path();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        fail(Step::Create)(std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file"))
    })?;
    let (mut file, tmp) = temporary(dir, &name.to_string_lossy()).map_err(fail(Step::Create))?;
    if let Some(mode) = mode {
        file.set_permissions(mode).map_err(fail(Step::Create))?;
    }
    fill(&mut file).map_err(fail(Step::Write))?;
    file.sync_all().map_err(fail(Step::Sync))?;
    drop(file);
    std::fs::rename(&tmp.0, path).map_err(fail(Step::Rename))?;
    tmp.keep();
    sync_directory(dir).map_err(fail(Step::SyncDirectory))
}

/// The file `path` names (a link followed) and, if it exists, its permissions; an error if it names
/// something other than a regular file (module comment).
fn check(path: &Path) -> std::io::Result<(PathBuf, Option<std::fs::Permissions>)> {
    let target = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path)?,
        _ => path.to_path_buf(),
    };
    match std::fs::metadata(&target) {
        Ok(m) if m.is_file() => Ok((target, Some(m.permissions()))),
        Ok(m) => Err(rein_model::input::not_a_file(m.file_type(), "so it is left alone")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((target, None)),
        Err(e) => Err(e),
    }
}

/// Reads a file that [`write()`] writes (the state file, its journal, the gateway's `layout_file`), whole,
/// if it holds at most `max` bytes (a longer one is an error of kind `FileTooLarge`). A path that names
/// something other than a regular file is refused, of kind `InvalidInput`, before a byte is read: it is
/// opened without blocking and checked on the open file, so a FIFO (whose open would wait for a writer
/// for ever, and hold a start with it) or a device is named, not waited on or read.
pub fn read(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    rein_model::input::read_regular_from(open_nonblocking(path)?, max)
}

/// `path` opened to read without blocking: a FIFO's open does not wait for a writer ([`read()`],
/// [`read_config`]).
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)
}

/// A daemon's configuration file's text (`rein serve`, `rein gateway`, `rein pshift controller`), at most
/// `max` bytes ([`rein_model::input::read_bounded_from`]), read at start, by `--check-config` and at each
/// reload. Unlike [`read()`] it takes a pipe, `--config <(generate)`, but it is opened without blocking: a
/// FIFO at the path that no process writes to (or a pipe whose writer wrote nothing: the two read alike)
/// is an error of kind `InvalidInput`, where a blocking open
/// waited for a writer for ever (a start, `--check-config`, or a reload's task, hung). Once open the
/// descriptor blocks again, so the text of a pipe with a writer is read to its end.
pub fn read_config(path: &Path, max: u64) -> std::io::Result<String> {
    use std::os::unix::fs::FileTypeExt;
    let file = open_to_read(path)?;
    let fifo = file.metadata()?.file_type().is_fifo();
    let bytes = rein_model::input::read_bounded_from(&file, max)?;
    // A FIFO read without a writer ends at once, empty ("end of file": none has it open for writing).
    if fifo && bytes.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "is a FIFO or pipe that gave nothing: no process writes to it, or its writer wrote nothing (a \
             configuration is a regular file, or a pipe with a writer)",
        ));
    }
    rein_model::input::text(bytes)
}

/// `path` opened to read without waiting for a writer: a FIFO that no process writes to then reads as empty
/// at once, where a blocking open waited for one for ever. Once open the descriptor blocks again, so a pipe
/// with a writer is read to its end ([`read_config`], the TLS credential files).
pub fn open_to_read(path: &Path) -> std::io::Result<std::fs::File> {
    let file = open_nonblocking(path)?;
    blocking(&file)?;
    Ok(file)
}

/// Clears `O_NONBLOCK` on `file` (opened with it by [`open_to_read`]).
#[allow(unsafe_code)]
fn blocking(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is open for the call (`file` holds it); F_GETFL and F_SETFL read and set its status
    // flags only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Syncs directory `dir` to its device: its entries' creations, renames and removals are durable.
pub fn sync_directory(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// A temporary file, removed when dropped unless kept ([`Temporary::keep`]: renamed into place).
struct Temporary(PathBuf);

impl Temporary {
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A new temporary file for `name` in `dir`: `.<name>.<pid>-<n>.tmp`, `n` counting this process's
/// temporaries (two writers in one process never share one).
fn temporary(dir: &Path, name: &str) -> std::io::Result<(std::fs::File, Temporary)> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!(".{name}.{}-{n}.tmp", std::process::id()));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => return Ok((f, Temporary(path))),
            // One left by a killed process of the same process id.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::dir_names as names;
    use std::os::unix::fs::FileTypeExt;

    /// A device, a FIFO or a directory at the path is refused and left as it was (a rename over
    /// `/dev/full` once replaced the device node with a JSON file); a link is followed and stays a link;
    /// a replaced file keeps its mode.
    /// `read` refuses what is not a regular file without waiting on it: a FIFO with no writer (whose plain
    /// open blocks for ever), a directory, a device; it reads a file and a link to one, up to its bound.
    #[test]
    fn read_names_what_is_not_a_file_and_never_waits_on_a_fifo() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let e = read(&fifo, 10).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(e.to_string(), "it is a FIFO, not a regular file, so it is not read");
        assert!(read(d.path(), 10).unwrap_err().to_string().contains("it is a directory"));
        assert!(read(Path::new("/dev/zero"), 10).unwrap_err().to_string().contains("it is a device"));
        assert_eq!(read(&d.path().join("none"), 10).unwrap_err().kind(), std::io::ErrorKind::NotFound);
        let file = d.path().join("state.json");
        std::fs::write(&file, "0123456789").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read(&link, 10).unwrap(), b"0123456789");
        assert_eq!(read(&file, 9).unwrap_err().kind(), std::io::ErrorKind::FileTooLarge);
    }

    #[test]
    fn only_a_regular_file_is_replaced_a_link_is_followed_and_the_mode_kept() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let e = write(&fifo, b"x").unwrap_err();
        assert_eq!(e.step, Step::Check);
        assert!(e.to_string().contains("it is a FIFO, not a regular file, so it is left alone"), "{e}");
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        let e = write(d.path(), b"x").unwrap_err();
        assert!(e.to_string().contains("it is a directory"), "{e}");
        let e = write(Path::new("/dev/null"), b"x").unwrap_err();
        assert!(e.to_string().contains("writing /dev/null: checking what the path names: it is a device"), "{e}");
        assert_eq!(names(d.path()), ["fifo"], "no temporary left");

        let file = d.path().join("state.json");
        std::fs::write(&file, "old").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.path().join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        write(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays");
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    }

    /// A new file and a replaced one hold what was written, with a plain file's mode, and no temporary
    /// is left beside them.
    #[test]
    fn a_file_is_written_whole_and_replaced_whole() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("a.json");
        write(&path, b"one").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        write(&path, b"two, longer").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two, longer");
        std::fs::write(d.path().join("plain"), "x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |f: &str| std::fs::metadata(d.path().join(f)).unwrap().permissions().mode();
        assert_eq!(mode("a.json"), mode("plain"));
        assert_eq!(names(d.path()), ["a.json", "plain"]);
    }

    /// A path whose parent is a regular file (which fails for root too): the error names the file and
    /// the step, and nothing is created.
    #[test]
    fn a_path_under_a_file_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("file"), "x").unwrap();
        let path = d.path().join("file").join("a.json");
        let e = write(&path, b"one").unwrap_err();
        assert_eq!(e.step, Step::Check);
        assert_eq!(
            e.to_string(),
            format!("writing {}: checking what the path names: Not a directory (os error 20)", path.display())
        );
        assert_eq!(names(d.path()), ["file"]);
    }

    /// A directory in the file's place (refused before anything is created) and a failed write (a full
    /// disk, injected) leave the file as it was and no temporary; each error names the file and its step.
    #[test]
    fn a_failed_step_leaves_the_file_as_it_was_and_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("a.json");
        std::fs::create_dir(&dir).unwrap();
        let e = write(&dir, b"one").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "writing {}: checking what the path names: it is a directory, not a regular file, so it is left alone",
                dir.display()
            )
        );
        assert_eq!(names(d.path()), ["a.json"]);
        let path = d.path().join("b.csv");
        std::fs::write(&path, "an older run's\n").unwrap();
        let e = write_with(&path, |f| {
            f.write_all(b"t,tenant,io")?;
            Err(std::io::Error::from_raw_os_error(28))
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("writing {}: writing the temporary file: No space left on device (os error 28)", path.display())
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "an older run's\n");
        assert_eq!(names(d.path()), ["a.json", "b.csv"]);
    }

    /// A directory this process may not write to: refused at the temporary's creation, naming the file.
    /// Root may write anywhere, so the check is skipped for it.
    #[test]
    fn a_directory_that_is_not_writable_is_an_error_naming_the_file() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let ro = d.path().join("ro");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        let path = ro.join("a.json");
        match write(&path, b"one") {
            Ok(()) => eprintln!("skipped: this process writes into a read-only directory (root)"),
            Err(e) => {
                assert_eq!(e.step, Step::Create);
                assert!(e.to_string().starts_with(&format!("writing {}: creating", path.display())), "{e}");
                assert!(names(&ro).is_empty());
            }
        }
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}
