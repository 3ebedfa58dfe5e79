//! Loop devices over files ([`LoopDev`]) and file systems on them ([`LoopFs`]).
//!
//! Release order, when a guard is dropped (the test ended, or panicked): a [`LoopFs`] is unmounted first
//! (tried again for a while if busy, then lazily, so that the device can go), then its device is detached
//! (`losetup -d`; a device still open is detached by the kernel once its last opener closes it), then the
//! backing file the guard made is removed. A failure in that is said on stderr, never a panic (a drop may
//! run while the test is already panicking).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long an unmount is tried again while the file system is busy: a loop device over a file on it,
/// just detached, lets its backing file go only once its last opener (udev's probe) has closed it, and an
/// unmount meanwhile fails with EBUSY.
const UNMOUNT_WITHIN: Duration = Duration::from_secs(10);

/// A loop device over a file, detached when dropped (also on a panic). The file is removed after the
/// detach if the guard made it ([`LoopDev::over_new_file`]); one the caller made ([`LoopDev::attach`]) is
/// left to the caller.
#[derive(Debug)]
pub struct LoopDev {
    /// The device's node, `/dev/loopN`.
    dev: String,
    /// The backing file.
    file: PathBuf,
    /// Whether the drop removes `file` (the guard made it).
    remove_file: bool,
}

impl LoopDev {
    /// Attaches the existing `file` (`losetup -f --show`, `args` before the file: `-P` to read its
    /// partition table, `--sector-size 8192`); the file stays when the device goes. `None`, said, where
    /// no loop device can be attached (it needs root).
    pub fn attach(file: &Path, args: &[&str]) -> Option<LoopDev> {
        let out = Command::new("losetup").args(["-f", "--show"]).args(args).arg(file).output();
        let why = match out {
            Ok(o) if o.status.success() => {
                let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
                return Some(LoopDev { dev, file: file.to_path_buf(), remove_file: false });
            }
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => e.to_string(),
        };
        eprintln!("skipped: no loop device (losetup {}) can be attached here (needs root): {why}", args.join(" "));
        None
    }

    /// A new sparse file `file` of `len` bytes (replacing one there), attached as [`LoopDev::attach`]
    /// does; the file is removed when the device goes (or at once where none can be attached).
    pub fn over_new_file(file: &Path, len: u64, args: &[&str]) -> Option<LoopDev> {
        std::fs::File::create(file)
            .and_then(|f| f.set_len(len))
            .unwrap_or_else(|e| panic!("a {len}-byte file {}: {e}", file.display()));
        let Some(mut lo) = LoopDev::attach(file, args) else {
            let _ = std::fs::remove_file(file);
            return None;
        };
        lo.remove_file = true;
        Some(lo)
    }

    /// The device's node, `/dev/loopN`.
    pub fn dev(&self) -> &str {
        &self.dev
    }

    /// The backing file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The device's major and minor numbers.
    pub fn number(&self) -> (u32, u32) {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(&self.dev).unwrap_or_else(|e| panic!("{}: {e}", self.dev)).rdev();
        (libc::major(rdev), libc::minor(rdev))
    }

    /// Another node of the device at `path` (`mknod`, as a container's `/dev` has its own); the caller
    /// removes it (it is in the test's temporary directory).
    pub fn node(&self, path: &Path) {
        let (major, minor) = self.number();
        let st = Command::new("mknod").arg(path).args(["b", &major.to_string(), &minor.to_string()]).status();
        assert!(st.as_ref().is_ok_and(|s| s.success()), "mknod {} b {major} {minor}: {st:?}", path.display());
    }

    /// Whether another claimer (an `O_EXCL` open, as `mount` or a server's exclusive open takes) is
    /// refused now (EBUSY).
    pub fn claimed(&self) -> bool {
        use std::os::unix::fs::OpenOptionsExt;
        let open = std::fs::File::options().read(true).custom_flags(libc::O_EXCL).open(&self.dev);
        matches!(open, Err(e) if e.raw_os_error() == Some(libc::EBUSY))
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        match Command::new("losetup").args(["-d", &self.dev]).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("losetup -d {}: {}", self.dev, String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => eprintln!("losetup -d {}: {e}", self.dev),
        }
        if self.remove_file {
            if let Err(e) = std::fs::remove_file(&self.file) {
                eprintln!("removing {}: {e}", self.file.display());
            }
        }
    }
}

/// A file system on a loop device over a sparse file the guard makes, with its mount point; when dropped
/// (also on a panic) it is unmounted, the device detached and the file removed.
#[derive(Debug)]
pub struct LoopFs {
    /// The mount point (made by [`LoopFs::make`]; left to the caller's temporary directory).
    mnt: PathBuf,
    /// Dropped after [`LoopFs`]'s own drop has unmounted it.
    lo: LoopDev,
}

impl LoopFs {
    /// A file system made by `mkfs` (`mkfs.ext4`, `mkfs.ext2`, run with `-q -F`) on a loop device over a
    /// new sparse file `img` of `len` bytes, and the directory `mnt` made to mount it at; not mounted
    /// ([`LoopFs::mount`]). `None`, said, where it cannot be made (it needs root, loop devices and the
    /// file system's tools).
    pub fn make(img: &Path, len: u64, mkfs: &str, mnt: &Path) -> Option<LoopFs> {
        let lo = LoopDev::over_new_file(img, len, &[])?;
        let out = Command::new(mkfs).args(["-q", "-F", &lo.dev]).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            let why = out.map_or_else(|e| e.to_string(), |o| String::from_utf8_lossy(&o.stderr).trim().to_string());
            eprintln!("skipped: {mkfs} {} failed: {why}", lo.dev);
            return None;
        }
        std::fs::create_dir(mnt).unwrap_or_else(|e| panic!("mount point {}: {e}", mnt.display()));
        Some(LoopFs { mnt: mnt.to_path_buf(), lo })
    }

    /// [`LoopFs::make`], then mounted; `None`, said, where it cannot be made or mounted.
    pub fn make_mounted(img: &Path, len: u64, mkfs: &str, mnt: &Path) -> Option<LoopFs> {
        let fs = LoopFs::make(img, len, mkfs, mnt)?;
        if let Err(why) = fs.try_mount() {
            eprintln!("skipped: {} cannot be mounted at {} here: {why}", fs.lo.dev, mnt.display());
            return None;
        }
        Some(fs)
    }

    /// The loop device's node.
    pub fn dev(&self) -> &str {
        &self.lo.dev
    }

    /// The loop device under the file system.
    pub fn loop_dev(&self) -> &LoopDev {
        &self.lo
    }

    /// The image file (the loop device's backing file).
    pub fn img(&self) -> &Path {
        &self.lo.file
    }

    /// The mount point.
    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    /// Mounts the file system at [`LoopFs::mnt`]; whether that succeeded (what `mount` said is not
    /// shown: tests also check that a mount is refused).
    pub fn mount(&self) -> bool {
        self.try_mount().is_ok()
    }

    fn try_mount(&self) -> Result<(), String> {
        match Command::new("mount").arg(&self.lo.dev).arg(&self.mnt).output() {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Unmounts it if it is mounted, trying again for up to 10 s while it is busy (a loop device over a
    /// file on it, just detached, holds it until its last opener has closed it).
    pub fn umount(&self) {
        let deadline = Instant::now() + UNMOUNT_WITHIN;
        while !Command::new("umount").arg(&self.mnt).output().is_ok_and(|o| o.status.success())
            && mounted(&self.mnt)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Unmounts it and detaches the device, leaving the image file (in the caller's temporary directory)
    /// for what the test does with it next; returns its path.
    pub fn detach_keeping_image(mut self) -> PathBuf {
        self.lo.remove_file = false;
        self.lo.file.clone()
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        self.umount();
        if mounted(&self.mnt) {
            // Still busy: detached from the tree now, and from the device once its last user lets go.
            eprintln!("{} still busy after {UNMOUNT_WITHIN:?}: unmounted lazily", self.mnt.display());
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
        }
    }
}

/// Whether something is mounted at `mnt`, per this process's mountinfo.
fn mounted(mnt: &Path) -> bool {
    let want = mountinfo_escaped(mnt);
    std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(want.as_str())))
}

/// `path` as mountinfo writes a mount point: space, tab, newline and backslash as octal escapes.
fn mountinfo_escaped(path: &Path) -> String {
    path.to_string_lossy()
        .chars()
        .map(|c| match c {
            ' ' | '\t' | '\n' | '\\' => format!("\\{:03o}", c as u32),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mount points are matched as mountinfo writes them (a space is `\040`): one with a space would
    /// never be seen mounted, and the drop's unmount not tried again while busy.
    #[test]
    fn mount_points_are_escaped_as_mountinfo_writes_them() {
        assert_eq!(mountinfo_escaped(Path::new("/tmp/mount point")), "/tmp/mount\\040point");
        assert_eq!(mountinfo_escaped(Path::new("/a\\b\tc\nd")), "/a\\134b\\011c\\012d");
        assert!(mounted(Path::new("/")), "the root is mounted");
        assert!(!mounted(Path::new("/no such mount point")));
    }

    /// A loop device and the file the guard made go when the guard does, also when the test panics
    /// (here a panic caught in this test); a file the caller attached stays. Needs root; elsewhere
    /// skipped.
    #[test]
    fn a_loop_device_and_its_file_are_released_on_a_panic() {
        let tmp = tempfile::Builder::new().prefix("rein-testkit-").tempdir().unwrap();
        let dir = tmp.path();
        let img = dir.join("made.img");
        let outcome = std::panic::catch_unwind(|| {
            let Some(lo) = LoopDev::over_new_file(&img, 1 << 20, &[]) else { return };
            assert_eq!(std::fs::metadata(&img).unwrap().len(), 1 << 20);
            assert!(attached(lo.dev(), &img), "{lo:?}");
            std::panic::panic_any(lo.dev().to_string())
        });
        let Err(payload) = outcome else {
            // Skipped: no loop device here.
            assert!(!img.exists(), "the file is removed where no device could be attached");
            return;
        };
        let dev = *payload.downcast::<String>().unwrap();
        assert!(!img.exists(), "the file the guard made is removed");
        assert!(!attached(&dev, &img), "{dev} is detached");
        // The caller's own file stays.
        let own = dir.join("own.img");
        std::fs::File::create(&own).unwrap().set_len(1 << 20).unwrap();
        let lo = LoopDev::attach(&own, &[]).expect("attached as before");
        let dev = lo.dev().to_string();
        drop(lo);
        assert!(own.exists() && !attached(&dev, &own), "{dev}");
    }

    /// Whether `dev` is attached over `file` (`losetup -a` lists it).
    fn attached(dev: &str, file: &Path) -> bool {
        let out = Command::new("losetup").arg("-a").output().unwrap();
        let file = file.display().to_string();
        String::from_utf8_lossy(&out.stdout).lines().any(|l| l.starts_with(&format!("{dev}:")) && l.contains(&file))
    }
}
