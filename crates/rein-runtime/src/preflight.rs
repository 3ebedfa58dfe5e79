//! Checks of the exports as a whole, before any of them is opened or allocated (issue 12): what one
//! export's storage cannot see by itself.
//!
//! - **RAM**: the memory exports together must fit the machine's RAM (`MemTotal` in `/proc/meminfo`).
//!   Their pages are allocated on first write, so a larger export starts fine and is OOM-killed later,
//!   with every other tenant's connections; and at 1 PiB even its page table (one slot per MiB, 16 GiB)
//!   aborts the start. MemTotal rather than MemAvailable: what is free changes from minute to minute, what
//!   can never fit does not. Without `/proc/meminfo` (not Linux) the check is skipped with a warning.
//! - **One file, one export**: two exports backed by the same file (the same device and inode, or for
//!   files still to be created the same canonical path; for a block device the same device number,
//!   whichever of its device nodes each path names) would let two tenants read and overwrite each
//!   other's disk, each under its own QoS. Refused, naming both exports, unless both are `read_only`
//!   (a golden image served to many tenants: nobody can change it, and sharing it is the point).
//!
//! Per-file checks (a missing file without `size_mb`, a directory, a FIFO, a socket, a character device,
//! a size that differs from `size_mb`) are [`crate::storage::FileStorage::open_with`]'s, so that every
//! caller of the storage gets them.

use crate::config::{BackendKind, ExportConfig};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where the machine's RAM is read from.
pub const MEMINFO: &str = "/proc/meminfo";

/// Why the exports cannot be served together.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// The memory exports add up to more than the machine's RAM.
    #[error(
        "memory exports ({exports}) need {need_mib} MiB, more than this machine's {total_mib} MiB of RAM \
         (MemTotal in {MEMINFO}): make them smaller or use backend = \"file\""
    )]
    MemoryAboveRam {
        /// The memory exports with their sizes (`name = N MiB`, comma-separated).
        exports: String,
        /// Their total, in MiB.
        need_mib: u64,
        /// The machine's RAM, in MiB.
        total_mib: u64,
    },
    /// Two exports are backed by one file.
    #[error(
        "exports {first:?} and {second:?} are backed by the same file {}; each export needs its own (or both \
         read_only = true)",
        path.display()
    )]
    SharedFile {
        /// The first export (in file order).
        first: String,
        /// The second export.
        second: String,
        /// The second export's path.
        path: PathBuf,
    },
    /// Two exports are backed by one block device, through two device nodes of it (or one node named
    /// twice): what [`PreflightError::SharedFile`] refuses for a file, found by the nodes' device number.
    /// Also an export added at run time on a block device that a running export has open, found by the
    /// device number of the device that export's storage holds: one deleted but still open by its
    /// connections, whose path is no longer in the configuration (or one of the configuration's, reached
    /// through another node); its path is then not said.
    #[error(
        "exports {first:?} and {second:?} are backed by the same block device {major}:{minor} ({}{second}: {}); \
         each export needs its own (or both read_only = true)",
        first_path.as_ref().map(|p| format!("{first}: {}, ", p.display())).unwrap_or_default(),
        path.display()
    )]
    SharedDevice {
        /// The first export (in file order), or the running one.
        first: String,
        /// Its path, when it is one of the configuration's.
        first_path: Option<PathBuf>,
        /// The second export, or the one added.
        second: String,
        /// Its path.
        path: PathBuf,
        /// The device's major number.
        major: u32,
        /// The device's minor number.
        minor: u32,
    },
}

/// What [`crate::state::server_holding`] finds of the running `rein serve` of a data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The server whose pid its lock file names has the lock file and the device open.
    Holds(u32),
    /// A lock file, or its server's descriptors, that this user may not read (a server running as
    /// another user, such as the unit's dynamic user): whether it holds the device cannot be seen. The
    /// pid, when the lock file could be read.
    Unseen(Option<u32>),
}

/// A running export as [`check_added`] sees it: its name, whether it is read-only, and what its storage
/// has open.
#[derive(Debug, Clone, Copy)]
pub struct RunningFile<'a> {
    /// The export's name (as it is to be said in an error).
    pub name: &'a str,
    /// Whether it is read-only.
    pub read_only: bool,
    /// The device and inode of the file its storage has open ([`crate::storage::Storage::file_id`]).
    pub file: Option<(u64, u64)>,
    /// The device number of the block device its storage has open
    /// ([`crate::storage::Storage::device_number`]).
    pub device: Option<u64>,
}

impl PreflightError {
    /// The error for exports `first` and `second` (in file order), whose files have `key`.
    fn shared(key: &FileKey, first: &ExportConfig, second: &ExportConfig) -> PreflightError {
        let path = |e: &ExportConfig| match &e.backend {
            BackendKind::File { path } => path.clone(),
            BackendKind::Memory => PathBuf::new(),
        };
        match *key {
            FileKey::Device(rdev) => PreflightError::SharedDevice {
                first: first.name.clone(),
                first_path: Some(path(first)),
                second: second.name.clone(),
                path: path(second),
                major: libc::major(rdev as libc::dev_t),
                minor: libc::minor(rdev as libc::dev_t),
            },
            _ => PreflightError::SharedFile {
                first: first.name.clone(),
                second: second.name.clone(),
                path: path(second),
            },
        }
    }
}

/// Runs every check on `exports` (module comment), with the machine's RAM read from [`MEMINFO`].
pub fn check_exports(exports: &[ExportConfig]) -> Result<(), PreflightError> {
    check_ram(exports.iter())?;
    check_shared_files(exports)
}

/// [`check_memory`] against this machine's RAM (`MemTotal`; unread: a warning, nothing checked).
fn check_ram<'a>(exports: impl Iterator<Item = &'a ExportConfig>) -> Result<(), PreflightError> {
    match mem_total_bytes(Path::new(MEMINFO)) {
        Some(total) => memory_fits(exports, total),
        None => {
            tracing::warn!("cannot read MemTotal from {MEMINFO}: memory exports are not checked against RAM");
            Ok(())
        }
    }
}

/// `MemTotal` from a `/proc/meminfo`-style file, in bytes.
pub fn mem_total_bytes(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses memory exports whose sizes add up to more than `ram_bytes`.
pub fn check_memory(exports: &[ExportConfig], ram_bytes: u64) -> Result<(), PreflightError> {
    memory_fits(exports.iter(), ram_bytes)
}

fn memory_fits<'a>(exports: impl Iterator<Item = &'a ExportConfig>, ram_bytes: u64) -> Result<(), PreflightError> {
    let memory: Vec<(&str, u64)> =
        exports.filter(|e| e.backend == BackendKind::Memory).map(|e| (e.name.as_str(), e.size.unwrap_or(0))).collect();
    // Each size is at most 2^50 and there are at most 4096 exports: the sum fits a u64.
    let need: u64 = memory.iter().map(|(_, s)| s).sum();
    if need <= ram_bytes {
        return Ok(());
    }
    let exports = memory.iter().map(|(n, s)| format!("{n} = {} MiB", s >> 20)).collect::<Vec<_>>().join(", ");
    Err(PreflightError::MemoryAboveRam { exports, need_mib: need >> 20, total_mib: ram_bytes >> 20 })
}

/// What identifies a file: a block device's device number (every node of it, `/dev/sdb` and a node made
/// with mknod in a container's `/dev`, is the one device), another file's device and inode once it
/// exists, else the canonical path it will have. Until 2026-12-06 a device's node was keyed by its
/// inode, and two exports through two nodes of one device passed: a writable and a read-only one were
/// both served, and of two writable ones the start refused the second as `in use by the system`.
#[derive(Debug, PartialEq, Eq, Hash)]
enum FileKey {
    Device(u64),
    Inode(u64, u64),
    Path(PathBuf),
}

fn file_key(path: &Path) -> Option<FileKey> {
    if let Ok(m) = std::fs::metadata(path) {
        if std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()) {
            return Some(FileKey::Device(m.rdev()));
        }
        return Some(FileKey::Inode(m.dev(), m.ino()));
    }
    // Not there yet: the canonical directory and the name (the directory may not exist either, when the
    // data directory is still to be created; then the path as written).
    let name = path.file_name()?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    Some(FileKey::Path(dir.join(name)))
}

/// [`check_exports`] for one export `new` added to running ones (`exports`: the exports it joins, as
/// configured; `running`: what each running export has open, [`RunningFile`]): one `stat`, of `new`'s
/// file, instead of one per export. A file is the one a running export has open, not what its path names
/// now (a file renamed over it is another). A block device is found by its device number (a node's inode
/// is not the device): that of the device `new`'s path names, compared with those of the block devices
/// that `exports`' paths name (the error then names both paths), then with those that the running
/// exports' storages hold, which counts a deleted export still open by its connections. Until 2026-12-07
/// only the paths were compared: an export of another tenant added on the device of such a deleted export
/// was served beside it through the same node (two tenants wrote one disk), and through another node
/// refused as a device `in use by the system`, this server's own claim.
pub fn check_added<'a>(
    exports: &[ExportConfig],
    running: impl Iterator<Item = RunningFile<'a>>,
    new: &ExportConfig,
) -> Result<(), PreflightError> {
    check_ram(exports.iter().chain([new]))?;
    let BackendKind::File { path } = &new.backend else { return Ok(()) };
    // A file not there yet is no running export's.
    let (dev, ino) = match file_key(path) {
        Some(FileKey::Inode(dev, ino)) => (dev, ino),
        // A block device: against the paths of the exports it joins (a node's inode is not the device's;
        // one `stat` per file export, for a device only).
        Some(FileKey::Device(rdev)) => {
            let key = FileKey::Device(rdev);
            let clash = exports.iter().find(|e| {
                e.name != new.name
                    && !(e.read_only && new.read_only)
                    && matches!(&e.backend, BackendKind::File { path } if file_key(path).as_ref() == Some(&key))
            });
            if let Some(e) = clash {
                return Err(PreflightError::shared(&key, e, new));
            }
            for r in running {
                if r.device == Some(rdev) && !(r.read_only && new.read_only) {
                    return Err(PreflightError::SharedDevice {
                        first: r.name.to_string(),
                        first_path: None,
                        second: new.name.clone(),
                        path: path.clone(),
                        major: libc::major(rdev as libc::dev_t),
                        minor: libc::minor(rdev as libc::dev_t),
                    });
                }
            }
            return Ok(());
        }
        _ => return Ok(()),
    };
    for r in running {
        if r.file == Some((dev, ino)) && !(r.read_only && new.read_only) {
            return Err(PreflightError::SharedFile {
                first: r.name.to_string(),
                second: new.name.clone(),
                path: path.clone(),
            });
        }
    }
    Ok(())
}

/// Refuses two file exports on one file, unless both are read-only. Files by key, not a scan per export:
/// every export added at run time checks the whole list (a scan made adding E exports one by one cost
/// E^3 / 6 comparisons).
pub fn check_shared_files(exports: &[ExportConfig]) -> Result<(), PreflightError> {
    // Per file: the first export on it, and the first writable one (what a read-only export clashes with).
    let mut seen: std::collections::HashMap<FileKey, (&ExportConfig, Option<&ExportConfig>)> =
        std::collections::HashMap::new();
    for e in exports {
        let BackendKind::File { path } = &e.backend else { continue };
        let Some(key) = file_key(path) else { continue };
        let writable = (!e.read_only).then_some(e);
        let Some(&(first, first_writable)) = seen.get(&key) else {
            seen.insert(key, (e, writable));
            continue;
        };
        // A writable export clashes with any before it; the ones let through after the first are all
        // read-only, so the first writable one never changes.
        let clash = if e.read_only { first_writable } else { Some(first) };
        if let Some(first) = clash {
            return Err(PreflightError::shared(&key, first, e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;

    fn exports(toml: &str) -> Vec<ExportConfig> {
        ServerConfig::parse(toml, Path::new("x.toml")).unwrap().exports
    }

    /// Under systemd, an open that the unit's sandboxing failed says which setting the unit needs
    /// (scripts/systemd-check.sh sees each in the journal); elsewhere, and for other errors, nothing.
    #[test]
    fn under_systemd_a_sandboxed_open_names_what_the_unit_needs() {
        use crate::storage::StorageError;
        let open = |n| StorageError::Io { op: "open", source: std::io::Error::from_raw_os_error(n) };
        let (img, dev) = (Path::new("/srv/images/vm.img"), Path::new("/dev/loop0"));
        for (path, e, want) in [
            (img, open(libc::EROFS), "ReadWritePaths="),
            (img, open(libc::EACCES), "SupplementaryGroups="),
            (dev, StorageError::MissingDevice, "(run by systemd"),
            (dev, open(libc::EPERM), "DeviceAllow="),
            (dev, open(libc::EACCES), "SupplementaryGroups="),
        ] {
            let hint = systemd_hint(path, &e, true);
            assert!(hint.contains(want) && hint.contains("docs/operations.md"), "{path:?} {e}: {hint}");
            assert_eq!(systemd_hint(path, &e, false), "", "not under systemd");
        }
        // A missing device: as /dev is here (a_missing_device_with_the_hosts_dev_is_not_blamed_on_private_devices).
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let want = missing_device_hint(dev_is_devtmpfs(&mountinfo));
        assert_eq!(systemd_hint(dev, &StorageError::MissingDevice, true), want);
        for (path, e) in [(img, StorageError::Missing), (img, open(libc::ENOENT)), (dev, open(libc::EIO))] {
            assert_eq!(systemd_hint(path, &e, true), "", "{path:?} {e}");
        }
        let e =
            OpenError::Export { name: "x".into(), path: dev.into(), source: open(libc::EPERM), hint: " (h)".into() };
        assert_eq!(e.to_string(), "export x: /dev/loop0: open failed: Operation not permitted (os error 1) (h)");
    }

    /// An image the service is to create outside its StateDirectory: the directory's group, setgid, and
    /// UMask=0007 (else the next run's dynamic uid cannot open it); an existing file its group may not
    /// write is named with its owner and mode (scripts/systemd-check.sh sees both in the journal).
    #[test]
    fn under_systemd_a_created_image_names_its_directory_and_umask() {
        use crate::storage::StorageError;
        use std::os::unix::fs::PermissionsExt;
        let io = |op, n| StorageError::Io { op, source: std::io::Error::from_raw_os_error(n) };
        let img = Path::new("/srv/images/new.img");
        let hint = systemd_hint(img, &io("create", libc::EACCES), true);
        for want in ["directory", "SupplementaryGroups=", "setgid", "chmod 2775", "UMask=0007", "ReadWritePaths="] {
            assert!(hint.contains(want), "{want}: {hint}");
        }
        assert!(systemd_hint(img, &io("create", libc::EROFS), true).contains("ReadWritePaths="));
        assert_eq!(systemd_hint(img, &io("create", libc::ENOSPC), true), "");
        let dir = tempfile::Builder::new().prefix("rein-preflight-hint-").tempdir().unwrap();
        let file = dir.path().join("vm.img");
        std::fs::write(&file, b"x").unwrap();
        let gid = std::fs::metadata(&file).unwrap().gid();
        assert!(own_groups().contains(&gid), "a file this process made has one of its groups: {:?}", own_groups());
        let not_ours = "its group is not one of the service's: chgrp it to the one in SupplementaryGroups=";
        let no_write = "its group may not write it: chmod g+w it (and UMask=0007";
        for (mode, groups, said) in [
            (0o640, vec![gid], vec![no_write]),
            (0o644, vec![gid], vec![no_write]),
            (0o660, vec![gid], vec![]),
            (0o660, vec![gid + 1], vec![not_ours]),
            (0o640, vec![gid + 1], vec![not_ours, no_write]),
            (0o640, vec![], vec![no_write]),
        ] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let clause = file_group_clause(&file, &groups);
            let m = std::fs::metadata(&file).unwrap();
            let head = format!("; the file is uid {}, gid {gid}, mode {mode:04o}: ", m.uid());
            assert_eq!(clause.starts_with(&head), !said.is_empty(), "{mode:o} {groups:?}: {clause}");
            for part in [not_ours, no_write] {
                assert_eq!(clause.contains(part), said.contains(&part), "{mode:o} {groups:?}: {clause}");
            }
        }
        let hint = systemd_hint(&file, &io("open", libc::EACCES), true);
        assert!(
            hint.contains("SupplementaryGroups=") && hint.contains("ReadWritePaths=") && hint.contains(no_write),
            "{hint}"
        );
        assert!(file_group_clause(dir.path(), &[gid + 1]).is_empty(), "a directory is not a file");
    }

    /// A missing device with the host's /dev (devtmpfs, PrivateDevices=no) is not blamed on
    /// PrivateDevices=: it is not there yet (an LVM volume before its volume group's activation) or
    /// misnamed. Seen from /proc/self/mountinfo.
    #[test]
    fn a_missing_device_with_the_hosts_dev_is_not_blamed_on_private_devices() {
        let host = "24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=123k,mode=755\n\
                    25 24 0:23 / /dev/pts rw - devpts devpts rw\n";
        let private = format!("{host}301 300 0:61 / /dev rw,nosuid - tmpfs tmpfs rw,mode=755\n");
        assert!(dev_is_devtmpfs(host));
        assert!(!dev_is_devtmpfs(&private), "the last mount on /dev is the one seen");
        assert!(!dev_is_devtmpfs(""), "unknown: a private /dev");
        let (h, p) = (missing_device_hint(true), missing_device_hint(false));
        assert!(
            h.contains("no such device now") && h.contains("Requires= and After=") && !h.contains("PrivateDevices"),
            "{h}"
        );
        assert!(p.contains("PrivateDevices=no") && p.contains("DeviceAllow="), "{p}");
    }

    #[test]
    fn memory_exports_must_fit_ram_together() {
        let two = exports(
            "[[exports]]\nname = \"a\"\nbackend = \"memory\"\nsize_mb = 600\n\
             [[exports]]\nname = \"b\"\nbackend = \"memory\"\nsize_mb = 500\n",
        );
        assert!(check_memory(&two, 1100 << 20).is_ok(), "at the bound");
        let e = check_memory(&two, 1000 << 20).unwrap_err().to_string();
        assert_eq!(
            e,
            "memory exports (a = 600 MiB, b = 500 MiB) need 1100 MiB, more than this machine's 1000 MiB of RAM \
             (MemTotal in /proc/meminfo): make them smaller or use backend = \"file\""
        );
        let huge = exports("[[exports]]\nname = \"p\"\nbackend = \"memory\"\nsize_mb = 1073741824\n");
        assert!(check_memory(&huge, 64 << 30).is_err(), "1 PiB");
        assert!(mem_total_bytes(Path::new(MEMINFO)).is_some_and(|b| b > 0));
    }

    /// `--check-config` says a start creates a missing image only where the start can: in `data_dir`,
    /// which a start creates too, or in a directory that exists; in a missing one it says what the start
    /// says (`create failed`).
    #[test]
    fn a_missing_image_in_a_missing_directory_is_refused_as_its_creation_is() {
        let dir = tempfile::Builder::new().prefix("rein-preflight-").tempdir().unwrap();
        let data = dir.path().join("data");
        let d = data.display();
        let inspect = |path: &str| {
            let cfg = ServerConfig::parse(
                &format!("data_dir = \"{d}\"\n[[exports]]\nname = \"g\"\npath = \"{path}\"\nsize_mb = 1\n"),
                Path::new("x.toml"),
            )
            .unwrap();
            inspect_export(&cfg.exports[0], &cfg.data_dir, |_| None).map_err(|e| e.to_string())
        };
        let creates = |path: &str| Ok(format!("export g: {d}/{path} (missing: a start creates it, 1 MiB)"));
        assert_eq!(inspect("g.img"), creates("g.img"), "data_dir is missing: a start creates it");
        assert_eq!(
            inspect("sub/g.img"),
            Err(format!("export g: {d}/sub/g.img: create failed: No such file or directory (os error 2)"))
        );
        std::fs::create_dir_all(data.join("sub")).unwrap();
        assert_eq!(inspect("sub/g.img"), creates("sub/g.img"));
    }

    #[test]
    fn two_exports_on_one_file_are_refused() {
        let dir = tempfile::Builder::new().prefix("rein-preflight-").tempdir().unwrap();
        let d = dir.path().display();
        std::fs::write(dir.path().join("a.img"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("a.img"), dir.path().join("link.img")).unwrap();
        // An existing file through a symlink, and a new file through `..`.
        for (first, second) in [("a.img", "link.img"), ("new.img", "sub/../new.img")] {
            std::fs::create_dir_all(dir.path().join("sub")).unwrap();
            let ex = exports(&format!(
                "data_dir = \"{d}\"\n[[exports]]\nname = \"x\"\npath = \"{first}\"\nsize_mb = 1\n\
                 [[exports]]\nname = \"y\"\npath = \"{second}\"\nsize_mb = 1\n"
            ));
            let e = check_shared_files(&ex).unwrap_err().to_string();
            assert!(e.starts_with("exports \"x\" and \"y\" are backed by the same file"), "{e}");
            assert!(e.contains(second), "{e}");
        }
        // Read-only exports may share an image (and only they).
        let shared = |ro_x: bool, ro_y: bool| {
            exports(&format!(
                "data_dir = \"{d}\"\n[[exports]]\nname = \"x\"\npath = \"a.img\"\nread_only = {ro_x}\n\
                 [[exports]]\nname = \"y\"\npath = \"a.img\"\nread_only = {ro_y}\n"
            ))
        };
        assert!(check_shared_files(&shared(true, true)).is_ok());
        assert!(check_shared_files(&shared(true, false)).is_err());
        assert!(check_shared_files(&shared(false, true)).is_err());
        let ok = exports(&format!(
            "data_dir = \"{d}\"\n[[exports]]\nname = \"x\"\npath = \"a.img\"\n[[exports]]\nname = \"y\"\npath = \"b.img\"\nsize_mb = 1\n"
        ));
        assert!(check_shared_files(&ok).is_ok());
    }

    /// Two device nodes of one block device are one file to the checks (mknod'ed nodes of a device
    /// number; the device need not exist): two exports through them are refused by the start's check and
    /// by an export added at run time beside a running one, naming both exports and paths, unless both
    /// are read-only. Needs root (mknod); elsewhere skipped.
    #[test]
    fn two_nodes_of_one_block_device_are_one_file() {
        let dir = tempfile::Builder::new().prefix("rein-preflight-nodes-").tempdir().unwrap();
        let rdev = libc::makedev(7, 250);
        for name in ["n1", "n2"] {
            let c = std::ffi::CString::new(dir.path().join(name).as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: mknod reads the NUL-terminated path and integer arguments only.
            #[allow(unsafe_code)]
            let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o600, rdev) };
            if r != 0 {
                eprintln!("skipped: mknod: {} (needs root)", std::io::Error::last_os_error());
                return;
            }
        }
        let d = dir.path().display();
        let two = |ro_a: bool, ro_b: bool| {
            exports(&format!(
                "[[exports]]\nname = \"a\"\npath = \"{d}/n1\"\nread_only = {ro_a}\n\
                 [[exports]]\nname = \"b\"\npath = \"{d}/n2\"\nread_only = {ro_b}\n"
            ))
        };
        let want = format!(
            "exports \"a\" and \"b\" are backed by the same block device 7:250 (a: {d}/n1, b: {d}/n2); each \
             export needs its own (or both read_only = true)"
        );
        for (ro_a, ro_b) in [(false, false), (true, false), (false, true)] {
            let ex = two(ro_a, ro_b);
            assert_eq!(check_shared_files(&ex).unwrap_err().to_string(), want, "read_only {ro_a}, {ro_b}");
            // b added at run time beside a running a (its file id: n1's device and inode).
            let running = [RunningFile { name: "a", read_only: ro_a, file: Some((1, 1)), device: Some(rdev) }];
            let e = check_added(&ex[..1], running.into_iter(), &ex[1]).expect_err("b beside a");
            assert_eq!(e.to_string(), want, "added, read_only {ro_a}, {ro_b}");
        }
        let ex = two(true, true);
        assert!(check_shared_files(&ex).is_ok(), "read-only exports may share a device");
        let running = [RunningFile { name: "a", read_only: true, file: Some((1, 1)), device: Some(rdev) }];
        assert!(check_added(&ex[..1], running.into_iter(), &ex[1]).is_ok());
        // A deleted export still open by its connections: not among the exports b joins, found by the
        // device its storage holds (it used to pass).
        let gone = "a (deleted, still open by its connections)";
        for (ro_a, ro_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let ex = two(ro_a, ro_b);
            let running = [RunningFile { name: gone, read_only: ro_a, file: Some((1, 1)), device: Some(rdev) }];
            let got = check_added(&[], running.into_iter(), &ex[1]).map_err(|e| e.to_string());
            let want = format!(
                "exports \"{gone}\" and \"b\" are backed by the same block device 7:250 (b: {d}/n2); each export \
                 needs its own (or both read_only = true)"
            );
            assert_eq!(got, if ro_a && ro_b { Ok(()) } else { Err(want) }, "read_only {ro_a}, {ro_b}");
        }
        let other = [RunningFile { name: gone, read_only: false, file: Some((1, 1)), device: Some(rdev + 1) }];
        assert!(check_added(&[], other.into_iter(), &two(false, false)[1]).is_ok(), "another device");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// The check by key names the same pair as the scan it replaced (the oracle: each export against
        /// every one before it, the first clash in order), over lists whose files recur, read-only or not.
        #[test]
        fn shared_files_by_key_match_the_scan(list in proptest::collection::vec((0u8..3, proptest::bool::ANY), 1..8)) {
            let dir = tempfile::tempdir().unwrap();
            let mut toml = format!("data_dir = \"{}\"\n", dir.path().display());
            for (i, (f, ro)) in list.iter().enumerate() {
                toml.push_str(&format!("[[exports]]\nname = \"e{i}\"\npath = \"f{f}.img\"\nsize_mb = 1\nread_only = {ro}\n"));
            }
            let ex = exports(&toml);
            let mut want = None;
            'scan: for (i, (f, ro)) in list.iter().enumerate() {
                for (j, (g, other_ro)) in list[..i].iter().enumerate() {
                    if f == g && !(*ro && *other_ro) {
                        want = Some((format!("e{j}"), format!("e{i}")));
                        break 'scan;
                    }
                }
            }
            let got = match check_shared_files(&ex) {
                Ok(()) => None,
                Err(PreflightError::SharedFile { first, second, .. }) => Some((first, second)),
                Err(e) => panic!("{e}"),
            };
            proptest::prop_assert_eq!(got, want);
        }
    }
}

/// Why an export's storage could not be opened ([`open_export`]).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The export does not fit the machine's RAM.
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    /// The storage could not be opened or created.
    #[error("export {name}: {}: {source}{hint}", path.display())]
    Export {
        /// The export.
        name: String,
        /// Its file.
        path: std::path::PathBuf,
        /// The storage's error.
        source: crate::storage::StorageError,
        /// What the systemd unit needs, if that is the likely cause ([`systemd_hint`]), else empty.
        hint: String,
    },
}

impl OpenError {
    /// An export's storage error, with [`systemd_hint`]'s hint when systemd runs the daemon (it sets
    /// `$INVOCATION_ID` for every unit's processes).
    fn export(name: &str, path: &Path, source: crate::storage::StorageError) -> Self {
        let hint = systemd_hint(path, &source, std::env::var_os("INVOCATION_ID").is_some());
        OpenError::Export { name: name.to_owned(), path: path.to_path_buf(), source, hint }
    }
}

/// What the unit needs when an export's open fails as the sandboxing of contrib/systemd's
/// rein-serve.service makes it fail (run under systemd by scripts/systemd-check.sh): `ProtectSystem=strict`
/// leaves files outside its StateDirectory read-only (EROFS), its dynamic user may not open root's files
/// (EACCES, found before EROFS), `PrivateDevices=yes` hides devices (missing) and a device policy
/// refuses a device it does not list (EPERM). An image it is to create (`create failed`) needs its
/// directory writable by the service's group, setgid so that the image gets that group, and
/// `UMask=0007` so that the group may write the image: the dynamic user's uid changes between runs, and
/// the next run opens the image through its group. An existing file that its group may not write (an
/// image the service made under the default `UMask=0022`, then the file of a uid gone) is named with its
/// owner and mode. Empty when not `under_systemd` or for any other error.
pub fn systemd_hint(path: &Path, e: &crate::storage::StorageError, under_systemd: bool) -> String {
    use crate::storage::StorageError::{Io, Missing, MissingDevice, MissingReadOnly};
    const SEE: &str = "docs/operations.md, \"Exports outside /var/lib/rein\"";
    if !under_systemd {
        return String::new();
    }
    let (op, errno) = match e {
        Io { op, source } => (*op, source.raw_os_error()),
        _ => ("", None),
    };
    if path.starts_with("/dev") {
        match (e, op, errno) {
            (Missing | MissingReadOnly | MissingDevice, _, _) => {
                let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
                missing_device_hint(dev_is_devtmpfs(&mountinfo))
            }
            (_, "open", Some(libc::EPERM)) => format!(" (run by systemd: the unit needs DeviceAllow= for it: {SEE})"),
            (_, "open", Some(libc::EACCES)) => format!(
                " (run by systemd: the unit needs SupplementaryGroups= of its group, disk for most disks: {SEE})"
            ),
            _ => String::new(),
        }
    } else {
        match (op, errno) {
            ("open" | "create", Some(libc::EROFS)) => {
                format!(
                    " (run by systemd: ProtectSystem=strict; the unit needs ReadWritePaths= for its directory: {SEE})"
                )
            }
            ("create", Some(libc::EACCES)) => format!(
                " (run by systemd: to create it, its dynamic user needs a group that may write the directory, in \
                 SupplementaryGroups=, the directory setgid so that the image gets that group (chgrp, chmod 2775), \
                 UMask=0007 so that the group may write it (the next run's uid is another), and ReadWritePaths= \
                 for the directory: {SEE})"
            ),
            ("open", Some(libc::EACCES)) => {
                format!(
                    " (run by systemd: its dynamic user needs a group that may write the file, in \
                     SupplementaryGroups=, and ReadWritePaths= for its directory{}: {SEE})",
                    file_group_clause(path, &own_groups())
                )
            }
            _ => String::new(),
        }
    }
}

/// For [`systemd_hint`]: a device that does not exist. With the host's `/dev` (`host_dev`: the
/// kernel's devtmpfs, as under `PrivateDevices=no`) it is not there yet, or misnamed: an LVM volume's
/// node appears when its volume group is activated, which a start at boot must wait for. Else (a
/// private tmpfs) `PrivateDevices=yes` hides it.
fn missing_device_hint(host_dev: bool) -> String {
    const SEE: &str = "docs/operations.md, \"Exports outside /var/lib/rein\"";
    if host_dev {
        format!(
            " (run by systemd, with the host's /dev: no such device now; an LVM volume's appears when its volume \
             group is activated: order the unit after it, Requires= and After= of its .device unit: {SEE})"
        )
    } else {
        format!(
            " (run by systemd: PrivateDevices=yes hides devices; the unit needs PrivateDevices=no, DeviceAllow= for \
             it and SupplementaryGroups= of its group: {SEE})"
        )
    }
}

/// Whether `/dev` is the kernel's devtmpfs by `mountinfo` (the text of /proc/self/mountinfo; the last
/// mount on `/dev` is the one seen): the host's device nodes, not a private `/dev`.
fn dev_is_devtmpfs(mountinfo: &str) -> bool {
    mountinfo
        .lines()
        .rev()
        .find_map(|l| {
            let (fields, fs) = l.split_once(" - ")?;
            (fields.split_whitespace().nth(4)? == "/dev").then(|| fs.split_whitespace().next() == Some("devtmpfs"))
        })
        .unwrap_or(false)
}

/// For [`systemd_hint`]: what keeps the service's group from writing the file at `path`, with the file's
/// owner and mode: a group that is not one of `groups` (the process's, [`own_groups`]; not said when
/// empty), a mode without g+w. Empty if neither, or if the file cannot be read.
fn file_group_clause(path: &Path, groups: &[u32]) -> String {
    use std::os::unix::fs::PermissionsExt;
    let Ok(m) = std::fs::metadata(path) else { return String::new() };
    let mode = m.permissions().mode();
    let mut why = Vec::new();
    if !groups.is_empty() && !groups.contains(&m.gid()) {
        why.push(
            "its group is not one of the service's: chgrp it to the one in SupplementaryGroups= (a file made in a \
             directory that is not setgid has the group of the dynamic user that made it, gone with its run)",
        );
    }
    if mode & 0o020 == 0 {
        why.push("its group may not write it: chmod g+w it (and UMask=0007 for the images the service creates)");
    }
    if !m.is_file() || why.is_empty() {
        return String::new();
    }
    format!("; the file is uid {}, gid {}, mode {:04o}: {}", m.uid(), m.gid(), mode & 0o7777, why.join("; "))
}

/// This process's groups as permission checks see them: its file-system group and its supplementary
/// groups (`Gid:` and `Groups:` of /proc/self/status); empty where that cannot be read.
fn own_groups() -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut groups = Vec::new();
    for line in status.lines() {
        if let Some(ids) = line.strip_prefix("Gid:") {
            groups.extend(ids.split_whitespace().nth(3).and_then(|g| g.parse::<u32>().ok()));
        } else if let Some(ids) = line.strip_prefix("Groups:") {
            groups.extend(ids.split_whitespace().filter_map(|g| g.parse::<u32>().ok()));
        }
    }
    groups
}

/// [`open_export`]'s checks without opening anything for writing or creating anything (`rein serve
/// --check-config`, [`crate::storage::FileStorage::inspect`]): one line saying what the export serves.
/// A writable block device that the kernel will not let be claimed is refused as at start, unless
/// `holder` names the process whose claim it is as the running `rein serve` about to be reloaded (the
/// check runs beside it, and it holds the devices it serves; [`crate::state::server_holding`]). A
/// missing image in a directory that does not exist either is refused as its creation at start fails
/// (`create failed: No such file or directory`): a start creates `data_dir`, no other directory (until
/// 2026-12-07 the check said `missing: a start creates it`, and the start failed).
pub fn inspect_export(
    e: &crate::config::ExportConfig,
    data_dir: &Path,
    holder: impl Fn(&Path) -> Option<Holder>,
) -> Result<String, OpenError> {
    use crate::storage::{FileStorage, StorageError};
    let mib = |bytes: u64| bytes as f64 / (1u64 << 20) as f64;
    match &e.backend {
        crate::config::BackendKind::File { path } => {
            let mut note = String::new();
            let found = match FileStorage::inspect(path, e.size, e.read_only) {
                Err(StorageError::DeviceBusy(busy)) if !e.read_only => match holder(path) {
                    Some(Holder::Holds(pid)) => {
                        note = format!(
                            "; claimed by the running rein serve of this data_dir, pid {pid}, which has it open"
                        );
                        // Its size, as a read-only export's check reads it (no claim).
                        FileStorage::inspect(path, e.size, true)
                    }
                    Some(Holder::Unseen(pid)) => {
                        let server = match pid {
                            Some(pid) => format!("the rein serve of this data_dir (pid {pid})"),
                            None => "the rein serve of this data_dir".to_string(),
                        };
                        return Err(OpenError::Export {
                            name: e.name.clone(),
                            path: path.clone(),
                            source: StorageError::DeviceBusy(busy),
                            hint: format!(
                                "; {server} runs as another user, whose lock file or descriptors this user may \
                                 not read, so whether that claim is its own cannot be seen: run --check-config \
                                 as the server's user (or as root)"
                            ),
                        });
                    }
                    None => Err(StorageError::DeviceBusy(busy)),
                },
                found => found,
            }
            .map_err(|source| OpenError::export(&e.name, path, source))?;
            let ro = if e.read_only { ", read-only" } else { "" };
            Ok(match found {
                crate::storage::Inspected::Present(n) => {
                    format!("export {}: {} ({:.0} MiB{ro}{note})", e.name, path.display(), mib(n))
                }
                crate::storage::Inspected::WouldCreate(n) => {
                    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && *d != data_dir) {
                        if let Err(source) = std::fs::metadata(dir) {
                            if source.kind() == std::io::ErrorKind::NotFound {
                                let source = StorageError::Io { op: "create", source };
                                return Err(OpenError::export(&e.name, path, source));
                            }
                        }
                    }
                    format!("export {}: {} (missing: a start creates it, {:.0} MiB)", e.name, path.display(), mib(n))
                }
            })
        }
        crate::config::BackendKind::Memory => {
            if let Some(ram) = mem_total_bytes(std::path::Path::new(MEMINFO)) {
                check_memory(std::slice::from_ref(e), ram)?;
            }
            Ok(format!("export {}: memory ({:.0} MiB, lost at a stop)", e.name, mib(e.size.unwrap_or(0))))
        }
    }
}

/// Opens an export's storage (creating a missing file only when the export has a size; see
/// [`crate::storage::FileStorage::open_with`]; a memory export only if it fits the machine's RAM). Errors name the export
/// and its path.
pub fn open_export(e: &crate::config::ExportConfig) -> Result<std::sync::Arc<dyn crate::storage::Storage>, OpenError> {
    // Only a memory export needs the machine's RAM (one read of /proc/meminfo, not one per file export).
    if e.backend == crate::config::BackendKind::Memory {
        if let Some(ram) = mem_total_bytes(std::path::Path::new(MEMINFO)) {
            check_memory(std::slice::from_ref(e), ram)?;
        }
    }
    Ok(match &e.backend {
        crate::config::BackendKind::File { path } => std::sync::Arc::new(
            crate::storage::FileStorage::open_with(
                path,
                e.size,
                crate::storage::FileMode { read_only: e.read_only, direct: e.direct, readahead: e.readahead },
            )
            .map_err(|source| OpenError::export(&e.name, path, source))?,
        ),
        crate::config::BackendKind::Memory => {
            let size = e.size.expect("a memory export has a size");
            std::sync::Arc::new(crate::storage::MemStorage::new(size).with_read_only(e.read_only))
        }
    })
}
