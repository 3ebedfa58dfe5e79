//! What holds a block device that the kernel will not let be claimed: the holders named in a
//! [`crate::storage::StorageError::DeviceBusy`].
//!
//! A writable block device export is claimed from the kernel with an `O_EXCL` open
//! ([`crate::storage`], "One writer per file"), which fails with EBUSY while something else holds the
//! device. The error used to list every possible cause ("mounted, swap, part of a RAID, LVM or
//! device-mapper device, or opened exclusively by another process"), and the operator had to find out
//! which one. This module finds it, best effort, in the kernel's own tables, for the device and for its
//! relatives whose claims also keep it from being claimed (the kernel's `bd_may_claim`: a claimed
//! partition marks its whole disk claimed, and a claimed disk keeps its partitions from being claimed):
//! - **its partitions** (subdirectories of the disk's sysfs directory with a `partition` file), when the
//!   device is a whole disk, and **its disk** (the parent directory in sysfs), when it is a partition;
//! - **mounted**: the lines of `/proc/self/mountinfo` whose `major:minor` (third field) is one of those
//!   devices, with their mount points (octal escapes such as `\040` for a space undone);
//! - **swap**: the lines of `/proc/swaps` naming one of them (by the listed file's device number, or by
//!   its `/dev` name where the file cannot be stat'ed);
//! - **mounted in another mount namespace** (a container's, one made with `unshare -m`, a systemd
//!   unit's `PrivateMounts`), for the devices of the family that this process's mountinfo does not show
//!   mounted: the mountinfo of each other mount namespace that a process is in (`/proc/PID/mountinfo`
//!   of the first process seen in it, in pid order; namespaces told apart by the text of their
//!   `/proc/PID/ns/mnt` link, `mnt:[INODE]`, and each read once), named with that process's pid and
//!   command ([`namespace_mounts`]; at most [`MAX_NAMESPACES_READ`] namespaces and
//!   [`MAX_MOUNTINFO_BYTES`] bytes of their mountinfo read, the rest not seen). The kernel writes a
//!   mountinfo from its own tables, as it does this process's: no file system is asked, so a network
//!   file system whose server is gone does not hang the read. A mount point there is as the namespace's
//!   process sees it (relative to its root: a container's `/data`, not the host's path to it);
//! - **stacked devices**: the entries of `/sys/dev/block/MAJ:MIN/holders/`, each a device built on this
//!   one: a device-mapper device (`/sys/block/dm-N/dm/name`; an LVM logical volume when its
//!   `dm/uuid` starts with `LVM-`), an md RAID (`/sys/block/mdN/md`), or another kernel device.
//!
//! When none of those is seen the claim is a process's (an `O_EXCL` open: another `rein serve`,
//! through another node of the device, a `mkfs`, a virtual machine), or a mount in a mount namespace
//! not seen (one of another user's processes, whose namespace this user may not read; one that no
//! process is in, kept by a bind mount of its `nsfs` file; one past the bounds). The processes that have the device (or a
//! relative) open are then named, as `fuser` would list them: each `/proc/PID/fd/*` whose file is a
//! block device of the family ([`openers`]; at most [`MAX_DESCRIPTORS_EXAMINED`] descriptors looked at
//! and [`OPENERS_SHOWN`] processes named, the rest counted; this process left out: it has the device
//! open itself, to claim it). Which of them holds the exclusive claim the kernel does not tell. Where
//! none is seen (another user's processes, whose descriptors this user may not read), the message
//! names `fuser -v` and `lsof`, to be run as root. Recognising the claim of the running
//! `rein serve` about to be reloaded is [`crate::preflight::inspect_export`]'s (with
//! [`crate::state::server_holding`]), not this module's.
//!
//! The parsing is pure ([`mount_points`], [`swap_files`], [`find`]) and tested on sample texts; the
//! sysfs reader ([`read_sysfs`]) takes the sysfs root, and the /proc readers ([`openers`],
//! [`namespace_mounts`]) the proc root, and are tested on trees made in a temporary directory. Nothing here fails: what cannot be read is not seen.

use std::fmt;
use std::path::{Path, PathBuf};

/// At most this many mount points of one device are named (bind mounts can make many); the rest are
/// counted.
pub const MOUNT_POINTS_SHOWN: usize = 3;

/// At most this many processes that have the device open are named ([`Busy::openers`]); the rest are
/// counted.
pub const OPENERS_SHOWN: usize = 4;

/// At most this many open descriptors (`/proc/PID/fd/*`, over all processes) are looked at in search of
/// the processes that have the device open: a bound on the time an error message may take on a host of
/// many processes (each is one `readlink`, and a `stat` for a file under /dev, [`may_stat`]).
pub const MAX_DESCRIPTORS_EXAMINED: usize = 1 << 16;

/// At most this many mount namespaces other than this process's have their mountinfo read in search
/// of a mount of the device that this namespace does not show ([`namespace_mounts`]): a host of
/// containers has one or a few per container, and a few hundred covers all but the largest hosts,
/// while each read costs what reading this process's mountinfo costs (the kernel writes one line per
/// mount). The rest are not seen.
pub const MAX_NAMESPACES_READ: usize = 256;

/// At most this many bytes of mountinfo, over all the namespaces read, are read ([`namespace_mounts`]):
/// the bound on the time and memory the search takes where namespaces have thousands of mounts each
/// (a line is about 100 to 200 bytes: some 100,000 mounts). A line the bound cuts is not read.
pub const MAX_MOUNTINFO_BYTES: u64 = 16 << 20;

/// A process that has a device of the family open (from `/proc/PID/fd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opener {
    /// Its pid.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`), empty if unread.
    pub name: String,
    /// Which device of the family it has open.
    pub of: Relation,
}

/// How a device of [`read_sysfs`]'s list is related to the device asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relation {
    /// The device itself, with its `/dev` path by its kernel name where sysfs tells it (`/dev/dm-3` for
    /// `/dev/mapper/vg-lv`): how `/proc/swaps` names it.
    Itself(Option<String>),
    /// A partition of it (its `/dev` path).
    Partition(String),
    /// The whole disk it is a partition of (its `/dev` path).
    Disk(String),
}

/// A device built on a block device, from its sysfs `holders` directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stacked {
    /// An LVM logical volume (a device-mapper device whose uuid starts with `LVM-`): its device-mapper
    /// name (`vg-lv`) and kernel name (`dm-N`).
    Lvm {
        /// The device-mapper name, `/dev/mapper/<name>`.
        name: String,
        /// The kernel's name, `dm-N`.
        kernel: String,
    },
    /// Another device-mapper device (dm-crypt, multipath, one made with dmsetup).
    DeviceMapper {
        /// The device-mapper name, `/dev/mapper/<name>`.
        name: String,
        /// The kernel's name, `dm-N`.
        kernel: String,
    },
    /// An md RAID (its kernel name, `mdN`).
    Raid(String),
    /// Another kernel device (bcache, for one): its kernel name.
    Other(String),
}

/// One block device as sysfs shows it, for [`find`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysDevice {
    /// How it is related to the device asked about.
    pub relation: Relation,
    /// Its major and minor numbers.
    pub dev: (u32, u32),
    /// The devices built on it (its `holders` directory).
    pub holders: Vec<Stacked>,
}

/// What holds a device, as [`find`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// Mounted: its mount points (at most [`MOUNT_POINTS_SHOWN`]) and how many more there are.
    Mounted(Vec<String>, usize),
    /// Mounted in another mount namespace only ([`namespace_mounts`]).
    MountedElsewhere(NamespaceMount),
    /// Swap.
    Swap,
    /// A device built on it.
    Stacked(Stacked),
}

/// A device's mounts in another mount namespace than this process's: in the first namespace seen to
/// mount it (in pid order), with a process in it, and how many more namespaces mount it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceMount {
    /// Its mount points there (at most [`MOUNT_POINTS_SHOWN`]), as that namespace's process sees them.
    pub points: Vec<String>,
    /// How many more mount points it has there.
    pub more: usize,
    /// The first process seen in that namespace (the lowest pid).
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`), empty if unread.
    pub name: String,
    /// How many more of the namespaces read mount it.
    pub namespaces: usize,
}

/// One holder: which device of the family ([`Relation`]) is held, and by what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHolder {
    /// The device held.
    pub of: Relation,
    /// What holds it.
    pub what: What,
}

/// What holds a block device that the kernel refused to let be claimed (EBUSY): the device's node, for
/// the commands named when no holder is seen, and the holders found (empty: a process's claim, or a
/// mount in another namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// The node named in the commands that list the processes that have the device open: its kernel
    /// name's, `/dev/loop3`, where sysfs tells it, else the path it was opened by. `fuser` and `lsof`
    /// find a process by the node it opened: given another node of the device (one made with mknod),
    /// they list nobody.
    pub device: PathBuf,
    /// What holds it, in the order found: the device's own holders first, then its partitions' or its
    /// disk's.
    pub holders: Vec<DeviceHolder>,
    /// Where there is no holder: the processes seen to have the device or a relative open (at most
    /// [`OPENERS_SHOWN`]), and how many more were seen.
    pub openers: (Vec<Opener>, usize),
}

impl fmt::Display for Relation {
    /// The subject of a holder's sentence.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A disk's name is an apposition: closed by a comma before the verb.
        let comma = if matches!(self, Relation::Disk(_)) { "," } else { "" };
        write!(f, "{}{comma}", relative(self))
    }
}

impl fmt::Display for DeviceHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let of = &self.of;
        match &self.what {
            What::Mounted(points, more) => {
                write!(f, "{of} is mounted at {}", points.join(", "))?;
                if *more > 0 {
                    write!(f, " and {more} more")?;
                }
                Ok(())
            }
            What::MountedElsewhere(m) => {
                write!(f, "{of} is mounted at {}", m.points.join(", "))?;
                if m.more > 0 {
                    write!(f, " and {} more", m.more)?;
                }
                write!(f, " in the mount namespace of pid {}", m.pid)?;
                if !m.name.is_empty() {
                    write!(f, " ({})", m.name)?;
                }
                match m.namespaces {
                    0 => Ok(()),
                    1 => f.write_str(", and in 1 more mount namespace"),
                    n => write!(f, ", and in {n} more mount namespaces"),
                }
            }
            What::Swap => write!(f, "{of} is swap (/proc/swaps lists it)"),
            What::Stacked(Stacked::Lvm { name, kernel }) => {
                write!(f, "{of} is under the active LVM logical volume {name} (/dev/mapper/{name}, {kernel})")
            }
            What::Stacked(Stacked::DeviceMapper { name, kernel }) => {
                write!(f, "{of} is under the device-mapper device {name} (/dev/mapper/{name}, {kernel})")
            }
            What::Stacked(Stacked::Raid(md)) => write!(f, "{of} is a member of the md RAID /dev/{md}"),
            What::Stacked(Stacked::Other(name)) => write!(f, "{of} is under the kernel's block device {name}"),
        }
    }
}

impl fmt::Display for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (openers, more) = &self.openers;
        if self.holders.is_empty() && !openers.is_empty() {
            f.write_str("no mount, swap, RAID or device-mapper device holds it; open in ")?;
            for (i, o) in openers.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                let name = if o.name.is_empty() { "a process" } else { &o.name };
                match &o.of {
                    Relation::Itself(_) => write!(f, "{name} (pid {})", o.pid)?,
                    other => write!(f, "{name} (pid {}, {})", o.pid, relative(other))?,
                }
            }
            if *more > 0 {
                write!(f, " and {more} more processes")?;
            }
            return f.write_str(
                ", of which one claimed it exclusively (another rein serve through another node of the device, a \
                 mkfs, a virtual machine)",
            );
        }
        if self.holders.is_empty() {
            let d = self.device.display();
            return write!(
                f,
                "no mount, swap, RAID or device-mapper device holds it, so a process opened it exclusively (fuser \
                 -v {d} or lsof {d} lists those that have it open; another rein serve through another node of \
                 the device is one), or it is mounted in another mount namespace"
            );
        }
        for (i, h) in self.holders.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{h}")?;
        }
        Ok(())
    }
}

/// A relative of the device, for an opener's sentence: `its partition /dev/loop0p1`.
fn relative(r: &Relation) -> String {
    match r {
        Relation::Itself(_) => "it".into(),
        Relation::Partition(p) => format!("its partition {p}"),
        Relation::Disk(d) => format!("the disk it is a partition of, {d}"),
    }
}

/// What holds the block device `rdev` that `path` names, from this machine's tables (`/sys`,
/// `/proc/self/mountinfo`, `/proc/swaps`, the other mount namespaces' `/proc/PID/mountinfo` for the
/// devices this one does not mount, and where none holds it `/proc/PID/fd`; module comment). Best
/// effort: what cannot be read is not seen.
pub fn busy(path: &Path, rdev: u64) -> Busy {
    let devices = read_sysfs(Path::new("/sys"), numbers(rdev));
    let node = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    // A swap file (not a partition) is on a file system, which `may_stat` keeps from being stat'ed.
    let swaps: Vec<(String, Option<(u32, u32)>)> =
        swap_files(&swaps).into_iter().map(|file| (file.clone(), block_device(Path::new(&file), &node))).collect();
    let device = match devices.first().map(|d| &d.relation) {
        Some(Relation::Itself(Some(node))) if Path::new(node).exists() => PathBuf::from(node),
        _ => path.to_path_buf(),
    };
    let mut holders = find(&devices, &mountinfo, &swaps);
    let unmounted: Vec<SysDevice> = devices
        .iter()
        .filter(|d| !holders.iter().any(|h| h.of == d.relation && matches!(h.what, What::Mounted(..))))
        .cloned()
        .collect();
    holders.extend(namespace_mounts(Path::new("/proc"), &unmounted, std::process::id()));
    let openers = match holders.is_empty() {
        true => openers(Path::new("/proc"), &devices, std::process::id(), &node),
        false => (Vec::new(), 0),
    };
    Busy { device, holders, openers }
}

/// A device number's major and minor.
fn numbers(rdev: u64) -> (u32, u32) {
    (libc::major(rdev as libc::dev_t), libc::minor(rdev as libc::dev_t))
}

/// The numbers of the block device that `path` leads to (a device node, or a descriptor's
/// `/proc/PID/fd/N`) whose own path is `target` (the descriptor's link text), if [`may_stat`] lets it be
/// stat'ed beside `node` and it is a block device.
pub fn block_device_behind(path: &Path, target: &Path, node: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if !may_stat(target, node) {
        return None;
    }
    let m = std::fs::metadata(path).ok().filter(|m| m.file_type().is_block_device())?;
    Some(numbers(m.rdev()))
}

/// [`block_device_behind`] for a path that is its own target (a device node named in `/proc/swaps`).
fn block_device(path: &Path, node: &Path) -> Option<(u32, u32)> {
    block_device_behind(path, path, node)
}

/// The processes under `proc` (normally `/proc`) that have one of `devices` open: each numbered directory's
/// `fd/*` whose file is a block device with one of their numbers, under `/dev` or `node` (the path asked
/// about, absolute; [`may_stat`]: another node made elsewhere with mknod is not seen), in pid order, at most
/// [`OPENERS_SHOWN`] (and the count of the rest), looking at no more than [`MAX_DESCRIPTORS_EXAMINED`]
/// descriptors. A process whose descriptors cannot be read (another user's) is not seen, nor `this` (the
/// asking process: it has the device open itself, to claim it).
pub fn openers(proc: &Path, devices: &[SysDevice], this: u32, node: &Path) -> (Vec<Opener>, usize) {
    openers_within(proc, devices, (this, node), MAX_DESCRIPTORS_EXAMINED)
}

/// Whether the file that a descriptor's link names (`target`, the link's text: the file's absolute path)
/// may be stat'ed in search of a block device: one under /dev, or `node`, the device node asked about.
/// Nothing else is: a stat of a file on a network file system whose server is gone hangs, and an error
/// message (or a check) must not (the link's text is read without touching the file).
pub fn may_stat(target: &Path, node: &Path) -> bool {
    target.starts_with("/dev/") || target == node
}

/// [`openers`] (`asker`: the process left out, and the node asked about), looking at no more than
/// `max_examined` descriptors.
fn openers_within(
    proc: &Path,
    devices: &[SysDevice],
    (this, node): (u32, &Path),
    max_examined: usize,
) -> (Vec<Opener>, usize) {
    let mut pids: Vec<u32> = std::fs::read_dir(proc)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| pid != this)
        .collect();
    pids.sort_unstable();
    let (mut shown, mut more, mut examined) = (Vec::new(), 0, 0);
    for pid in pids {
        if examined >= max_examined {
            break;
        }
        let Ok(fds) = std::fs::read_dir(proc.join(format!("{pid}/fd"))) else { continue };
        let mut of = None;
        for fd in fds.flatten() {
            examined += 1;
            if examined > max_examined {
                break;
            }
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            let Some(number) = block_device_behind(&fd.path(), &target, node) else { continue };
            if let Some(d) = devices.iter().find(|d| d.dev == number) {
                of = Some(d.relation.clone());
                break;
            }
        }
        let Some(of) = of else { continue };
        if shown.len() < OPENERS_SHOWN {
            let name = std::fs::read_to_string(proc.join(format!("{pid}/comm"))).unwrap_or_default();
            shown.push(Opener { pid, name: name.trim_end().to_string(), of });
        } else {
            more += 1;
        }
    }
    (shown, more)
}

/// The mounts of `devices` in the mount namespaces of the processes under `proc` (normally `/proc`)
/// other than that of `this` (the asking process, whose mountinfo [`find`] read): per device in order,
/// its mount points in the first namespace that mounts it (namespaces met in pid order, each read once,
/// from the first process seen in it: `/proc/PID/mountinfo`), named with that process, and the count
/// of the other namespaces that mount it. At most [`MAX_NAMESPACES_READ`] namespaces and
/// [`MAX_MOUNTINFO_BYTES`] bytes of mountinfo are read. A process whose namespace cannot be read
/// (another user's, a zombie) is not seen; nothing is stat'ed.
pub fn namespace_mounts(proc: &Path, devices: &[SysDevice], this: u32) -> Vec<DeviceHolder> {
    namespace_mounts_within(proc, devices, this, (MAX_NAMESPACES_READ, MAX_MOUNTINFO_BYTES))
}

/// [`namespace_mounts`], reading at most `max_namespaces` namespaces and `max_bytes` bytes of mountinfo.
fn namespace_mounts_within(
    proc: &Path,
    devices: &[SysDevice],
    this: u32,
    (max_namespaces, max_bytes): (usize, u64),
) -> Vec<DeviceHolder> {
    use std::io::Read;
    if devices.is_empty() {
        return Vec::new();
    }
    let namespace = |pid: u32| std::fs::read_link(proc.join(format!("{pid}/ns/mnt"))).ok();
    let mut pids: Vec<u32> = std::fs::read_dir(proc)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    // This process's namespace is not read again (and where its link cannot be read, every one is).
    let mut seen: std::collections::HashSet<PathBuf> = namespace(this).into_iter().collect();
    let mut found: Vec<Option<NamespaceMount>> = vec![None; devices.len()];
    let (mut read, mut budget) = (0, max_bytes);
    for pid in pids {
        if read >= max_namespaces || budget == 0 {
            break;
        }
        let Some(ns) = namespace(pid) else { continue };
        if !seen.insert(ns) {
            continue;
        }
        let Ok(file) = std::fs::File::open(proc.join(format!("{pid}/mountinfo"))) else { continue };
        read += 1;
        let mut text = Vec::new();
        if file.take(budget).read_to_end(&mut text).is_err() {
            continue;
        }
        budget -= text.len() as u64;
        // A line the budget cut is not read (its mount point could be cut short).
        let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |end| end + 1);
        let text = String::from_utf8_lossy(&text[..whole]);
        for (d, slot) in devices.iter().zip(&mut found) {
            let mut points = mount_points(&text, d.dev);
            if points.is_empty() {
                continue;
            }
            match slot {
                Some(m) => m.namespaces += 1,
                None => {
                    let more = points.len().saturating_sub(MOUNT_POINTS_SHOWN);
                    points.truncate(MOUNT_POINTS_SHOWN);
                    let name = std::fs::read_to_string(proc.join(format!("{pid}/comm"))).unwrap_or_default();
                    let name = name.trim_end().to_string();
                    *slot = Some(NamespaceMount { points, more, pid, name, namespaces: 0 });
                }
            }
        }
    }
    devices
        .iter()
        .zip(found)
        .filter_map(|(d, m)| Some(DeviceHolder { of: d.relation.clone(), what: What::MountedElsewhere(m?) }))
        .collect()
}

/// The holders of `devices` (from [`read_sysfs`]) in `mountinfo` (the text of `/proc/self/mountinfo`)
/// and `swaps` (the files of [`swap_files`], each with its device number where it is a block device),
/// and their stacked devices: per device in order, its mounts, then swap, then what is built on it.
pub fn find(devices: &[SysDevice], mountinfo: &str, swaps: &[(String, Option<(u32, u32)>)]) -> Vec<DeviceHolder> {
    let mut found = Vec::new();
    for d in devices {
        let mut points = mount_points(mountinfo, d.dev);
        if !points.is_empty() {
            let more = points.len().saturating_sub(MOUNT_POINTS_SHOWN);
            points.truncate(MOUNT_POINTS_SHOWN);
            found.push(DeviceHolder { of: d.relation.clone(), what: What::Mounted(points, more) });
        }
        let node = match &d.relation {
            Relation::Partition(p) | Relation::Disk(p) => Some(p.as_str()),
            Relation::Itself(p) => p.as_deref(),
        };
        let swap = swaps.iter().any(|(file, dev)| match dev {
            Some(dev) => *dev == d.dev,
            None => node == Some(file.as_str()),
        });
        if swap {
            found.push(DeviceHolder { of: d.relation.clone(), what: What::Swap });
        }
        found.extend(d.holders.iter().map(|h| DeviceHolder { of: d.relation.clone(), what: What::Stacked(h.clone()) }));
    }
    found
}

/// The mount points, unescaped and each once, of the mounts of device `dev` in `mountinfo` (the text of
/// `/proc/self/mountinfo`: `id parent major:minor root mount-point options [optional...] - type source
/// super-options`), in its order.
pub fn mount_points(mountinfo: &str, dev: (u32, u32)) -> Vec<String> {
    let want = format!("{}:{}", dev.0, dev.1);
    // A set besides the list: a host of containers can have thousands of bind mounts of one device.
    let mut seen = std::collections::HashSet::new();
    let mut points: Vec<String> = Vec::new();
    for line in mountinfo.lines() {
        let mut fields = line.split(' ');
        let (Some(_id), Some(_parent), Some(number), Some(_root), Some(point)) =
            (fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if number != want {
            continue;
        }
        let point = unescape(point);
        if seen.insert(point.clone()) {
            points.push(point);
        }
    }
    points
}

/// The files of `swaps` (the text of `/proc/swaps`: a header line, then `file type size used priority`
/// per swap area), unescaped.
pub fn swap_files(swaps: &str) -> Vec<String> {
    swaps.lines().skip(1).filter_map(|line| line.split([' ', '\t']).find(|f| !f.is_empty())).map(unescape).collect()
}

/// A path as the kernel writes it in `/proc/self/mountinfo` and `/proc/swaps` with its octal escapes
/// (`\040` a space, `\011` a tab, `\012` a newline, `\134` a backslash) undone; anything else kept.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                // Three octal digits are at most 0o777; only bytes are escaped.
                match u8::try_from(v) {
                    Ok(byte) => out.push(byte),
                    Err(_) => out.extend_from_slice(&b[i..i + 4]),
                }
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The device `dev` and its relatives ([`Relation`]) as the sysfs at `sys` (normally `/sys`) shows
/// them: `dev/block/MAJ:MIN` (a link to the device's directory), its `holders` and its partitions'
/// (subdirectories with a `partition` file and a `dev` file), or, for a partition, its disk's (the
/// parent directory). Where sysfs cannot be read, the device alone, with no holders.
pub fn read_sysfs(sys: &Path, dev: (u32, u32)) -> Vec<SysDevice> {
    let Ok(dir) = std::fs::canonicalize(sys.join(format!("dev/block/{}:{}", dev.0, dev.1))) else {
        return vec![SysDevice { relation: Relation::Itself(None), dev, holders: Vec::new() }];
    };
    let mut devices =
        vec![SysDevice { relation: Relation::Itself(Some(node(&dir))), dev, holders: stacked(sys, &dir) }];
    if dir.join("partition").exists() {
        if let (Some(disk), Some(number)) = (dir.parent(), dir.parent().and_then(|d| dev_number(&d.join("dev")))) {
            devices.push(SysDevice { relation: Relation::Disk(node(disk)), dev: number, holders: stacked(sys, disk) });
        }
        return devices;
    }
    let mut parts: Vec<(String, SysDevice)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("partition").exists())
        .filter_map(|e| {
            let path = e.path();
            let number = dev_number(&path.join("dev"))?;
            let name = node(&path);
            Some((
                name.clone(),
                SysDevice { relation: Relation::Partition(name), dev: number, holders: stacked(sys, &path) },
            ))
        })
        .collect();
    // Directory order is the file system's: in name order, p2 before p10 as long as names are as long.
    parts.sort_by(|(a, _), (b, _)| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
    devices.extend(parts.into_iter().map(|(_, d)| d));
    devices
}

/// The `/dev` path of the device whose sysfs directory is `dir` (its kernel name; a `!` in it stands for
/// a `/`, as in `cciss!c0d0`).
fn node(dir: &Path) -> String {
    let name = dir.file_name().map(|n| n.to_string_lossy().replace('!', "/")).unwrap_or_default();
    format!("/dev/{name}")
}

/// The `MAJ:MIN` in a sysfs `dev` file.
fn dev_number(file: &Path) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(file).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The devices built on the device whose sysfs directory is `dir` (its `holders`), each classified by
/// its own directory under `sys/block`, in name order.
fn stacked(sys: &Path, dir: &Path) -> Vec<Stacked> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("holders"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|kernel| {
            let holder = sys.join("block").join(&kernel);
            let read = |f: &str| std::fs::read_to_string(holder.join(f)).ok().map(|s| s.trim_end().to_string());
            match read("dm/name") {
                Some(name) if read("dm/uuid").is_some_and(|u| u.starts_with("LVM-")) => Stacked::Lvm { name, kernel },
                Some(name) => Stacked::DeviceMapper { name, kernel },
                None if holder.join("md").is_dir() => Stacked::Raid(kernel),
                None => Stacked::Other(kernel),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mountinfo lines of a loop device (7:3) and its partition (259:1): a mount point with a space
    /// (`\040`), a bind mount of the same device, optional fields before the separator, other devices.
    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
61 22 7:3 / /mnt/my\\040disk rw,relatime shared:30 - ext4 /dev/loop3 rw
62 22 7:3 /sub /srv/bind rw,relatime shared:30 master:2 - ext4 /dev/loop3 rw
63 22 7:3 / /mnt/my\\040disk rw,relatime - ext4 /dev/loop3 rw
64 22 259:1 / /boot\\011tab\\134x rw - vfat /dev/loop3p1 rw
65 22 7:30 / /elsewhere rw - ext4 /dev/loop30 rw
";

    const SWAPS: &str = "\
Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority
/dev/loop5                              partition\t8188\t\t0\t\t-2
/var/my\\040swap                        file\t\t1024\t\t0\t\t-3
";

    #[test]
    fn mount_points_are_unescaped_once_each_for_their_device_only() {
        assert_eq!(mount_points(MOUNTINFO, (7, 3)), ["/mnt/my disk", "/srv/bind"]);
        assert_eq!(mount_points(MOUNTINFO, (259, 1)), ["/boot\ttab\\x"]);
        assert_eq!(mount_points(MOUNTINFO, (7, 30)), ["/elsewhere"], "7:30 is not 7:3");
        assert!(mount_points(MOUNTINFO, (7, 4)).is_empty());
        assert!(mount_points("garbage\n\n7:3\n", (7, 3)).is_empty(), "short lines are skipped");
    }

    #[test]
    fn swap_files_skip_the_header_and_are_unescaped() {
        assert_eq!(swap_files(SWAPS), ["/dev/loop5", "/var/my swap"]);
        assert!(swap_files("Filename Type Size Used Priority\n").is_empty());
        assert!(swap_files("").is_empty());
    }

    #[test]
    fn escapes_that_are_not_three_octal_digits_are_kept() {
        assert_eq!(unescape("a\\040b"), "a b");
        assert_eq!(unescape("a\\04"), "a\\04");
        assert_eq!(unescape("a\\089"), "a\\089");
        assert_eq!(unescape("\\777"), "\\777");
        assert_eq!(unescape("tail\\"), "tail\\");
    }

    fn device(relation: Relation, dev: (u32, u32), holders: Vec<Stacked>) -> SysDevice {
        SysDevice { relation, dev, holders }
    }

    /// Each holder of each device of the family, named with the device it holds, in the message's
    /// order; a swap file on a file system is no device's swap.
    #[test]
    fn holders_of_the_device_and_its_partitions_are_named() {
        let lv = Stacked::Lvm { name: "vg-lv".into(), kernel: "dm-0".into() };
        let devices = [
            device(Relation::Itself(None), (7, 3), vec![]),
            device(Relation::Partition("/dev/loop3p1".into()), (259, 1), vec![]),
            device(Relation::Partition("/dev/loop3p2".into()), (259, 2), vec![lv.clone()]),
            device(Relation::Partition("/dev/loop3p3".into()), (259, 3), vec![]),
        ];
        let swaps = [("/dev/loop3p3".to_string(), None), ("/var/my swap".to_string(), None)];
        let busy =
            Busy { device: "/dev/loop3".into(), holders: find(&devices, MOUNTINFO, &swaps), openers: (Vec::new(), 0) };
        assert_eq!(
            busy.to_string(),
            "it is mounted at /mnt/my disk, /srv/bind; its partition /dev/loop3p1 is mounted at /boot\ttab\\x; its \
             partition /dev/loop3p2 is under the active LVM logical volume vg-lv (/dev/mapper/vg-lv, dm-0); its \
             partition /dev/loop3p3 is swap (/proc/swaps lists it)"
        );
        // Swap found by device number (a file that stat says is the device), a RAID, a dm-crypt.
        let devices = [
            device(Relation::Itself(Some("/dev/sdb2".into())), (259, 2), vec![Stacked::Raid("md0".into())]),
            device(
                Relation::Disk("/dev/sdb".into()),
                (8, 16),
                vec![Stacked::DeviceMapper { name: "crypt".into(), kernel: "dm-4".into() }],
            ),
        ];
        let swaps = [("/dev/other-name".to_string(), Some((259, 2)))];
        assert_eq!(
            Busy { device: "/dev/sdb2".into(), holders: find(&devices, "", &swaps), openers: (Vec::new(), 0) }
                .to_string(),
            "it is swap (/proc/swaps lists it); it is a member of the md RAID /dev/md0; the disk it is a partition \
             of, /dev/sdb, is under the device-mapper device crypt (/dev/mapper/crypt, dm-4)"
        );
    }

    /// A swap file that cannot be stat'ed (its `/dev` is not this process's) is the device's by its
    /// kernel name, when sysfs tells it.
    #[test]
    fn swap_is_found_by_the_kernel_name_where_it_cannot_be_stated() {
        let swaps = [("/dev/dm-3".to_string(), None)];
        let named = [device(Relation::Itself(Some("/dev/dm-3".into())), (253, 3), vec![])];
        let what: Vec<What> = find(&named, "", &swaps).into_iter().map(|h| h.what).collect();
        assert_eq!(what, [What::Swap]);
        assert!(find(&[device(Relation::Itself(None), (253, 3), vec![])], "", &swaps).is_empty());
        assert!(find(&[device(Relation::Itself(Some("/dev/dm-4".into())), (253, 4), vec![])], "", &swaps).is_empty());
    }

    #[test]
    fn many_mount_points_are_counted_and_no_holder_names_the_tools() {
        let mountinfo: String = (0..5).map(|i| format!("{i} 1 7:3 / /m{i} rw - ext4 /dev/loop3 rw\n")).collect();
        let holders = find(&[device(Relation::Itself(None), (7, 3), vec![])], &mountinfo, &[]);
        assert_eq!(holders[0].to_string(), "it is mounted at /m0, /m1, /m2 and 2 more");
        let none = Busy { device: "/dev/loop3".into(), holders: Vec::new(), openers: (Vec::new(), 0) };
        assert_eq!(
            none.to_string(),
            "no mount, swap, RAID or device-mapper device holds it, so a process opened it exclusively (fuser -v \
             /dev/loop3 or lsof /dev/loop3 lists those that have it open; another rein serve through another node \
             of the device is one), or it is mounted in another mount namespace"
        );
    }

    /// Where no holder is seen, the processes that have the device open are named, with the relative
    /// they have open and the count past [`OPENERS_SHOWN`].
    #[test]
    fn processes_with_the_device_open_are_named_where_nothing_else_holds_it() {
        let opener = |pid, name: &str, of| Opener { pid, name: name.into(), of };
        let busy = Busy {
            device: "/dev/sdb".into(),
            holders: Vec::new(),
            openers: (
                vec![
                    opener(41, "qemu-system-x86", Relation::Itself(None)),
                    opener(97, "", Relation::Partition("/dev/sdb1".into())),
                ],
                3,
            ),
        };
        assert_eq!(
            busy.to_string(),
            "no mount, swap, RAID or device-mapper device holds it; open in qemu-system-x86 (pid 41), a process (pid 97, its \
             partition /dev/sdb1) and 3 more processes, of which one claimed it exclusively (another rein serve \
             through another node of the device, a mkfs, a virtual machine)"
        );
    }

    /// [`openers`] on a /proc tree made in a temporary directory: descriptors that are links to a block
    /// device of this machine (any in /dev; stat'ed through the link, never opened), to /dev/null (a
    /// character device), to nothing, and to a path outside /dev that leads to the device (not stat'ed);
    /// directories that are not pids; more openers than are shown.
    #[test]
    fn openers_are_found_by_their_descriptors_device_number() {
        use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt};
        let Some((block, rdev)) = std::fs::read_dir("/dev").into_iter().flatten().flatten().find_map(|e| {
            let m = std::fs::metadata(e.path()).ok()?;
            m.file_type().is_block_device().then(|| (e.path(), m.rdev()))
        }) else {
            eprintln!("skipped: no block device in /dev");
            return;
        };
        let number = numbers(rdev);
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path();
        let process = |pid: &str, comm: &str, fds: &[&Path]| {
            let fd = proc.join(pid).join("fd");
            std::fs::create_dir_all(&fd).unwrap();
            std::fs::write(proc.join(pid).join("comm"), format!("{comm}\n")).unwrap();
            for (i, target) in fds.iter().enumerate() {
                symlink(target, fd.join(i.to_string())).unwrap();
            }
        };
        let (null, gone) = (Path::new("/dev/null"), Path::new("/nonexistent/device"));
        process("7", "bash", &[null, gone]);
        process("12", "mkfs.ext4", &[null, &block]);
        process("self", "not-a-pid", &[&block]);
        let alias = proc.join("alias");
        symlink(&block, &alias).unwrap();
        process("13", "elsewhere", &[&alias]);
        for pid in 100..106 {
            process(&pid.to_string(), "rein", &[&block]);
        }
        let family = [SysDevice { relation: Relation::Partition("/dev/x1".into()), dev: number, holders: vec![] }];
        let none = Path::new("/");
        let (shown, more) = openers(proc, &family, 0, none);
        let pids: Vec<u32> = shown.iter().map(|o| o.pid).collect();
        assert_eq!(pids, [12, 100, 101, 102], "in pid order, at most OPENERS_SHOWN");
        assert_eq!(more, 3);
        assert_eq!((shown[0].name.as_str(), &shown[0].of), ("mkfs.ext4", &Relation::Partition("/dev/x1".into())));
        let other = [SysDevice { relation: Relation::Itself(None), dev: (number.0, number.1 + 1), holders: vec![] }];
        assert_eq!(openers(proc, &other, 0, none), (Vec::new(), 0), "another device number");
        assert_eq!(openers(&proc.join("missing"), &family, 0, none), (Vec::new(), 0));
        let (shown, more) = openers(proc, &family, 12, none);
        assert_eq!((shown[0].pid, more), (100, 2), "the asking process is left out");
        // At the bound on descriptors looked at: pid 7's two leave pid 12 unseen; pid 12's two more (in
        // the directory's order) reach its device.
        assert_eq!(openers_within(proc, &family, (0, none), 2), (Vec::new(), 0));
        let (shown, more) = openers_within(proc, &family, (0, none), 4);
        assert_eq!((shown.len(), shown[0].pid, more), (1, 12, 0));
        // The node asked about is stat'ed wherever it is: pid 13 has the device open through it.
        let (shown, _) = openers(proc, &family, 0, &alias);
        assert_eq!(shown.iter().map(|o| o.pid).collect::<Vec<_>>(), [12, 13, 100, 101]);
    }

    /// [`namespace_mounts`] on a /proc tree made in a temporary directory: processes in this process's
    /// mount namespace (not read), in two others (one with two processes, read once, from the lower
    /// pid), one whose namespace cannot be read, and a directory that is not a pid; then at the bounds on
    /// namespaces and on bytes read.
    #[test]
    fn mounts_in_other_mount_namespaces_are_named_with_a_process_in_each() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path();
        let made = |proc: &Path, pid: &str, comm: &str, ns: Option<&str>, mountinfo: &str| {
            let dir = proc.join(pid);
            std::fs::create_dir_all(dir.join("ns")).unwrap();
            std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(dir.join("mountinfo"), mountinfo).unwrap();
            if let Some(ns) = ns {
                // The kernel's link names no file: its text tells namespaces apart.
                symlink(ns, dir.join("ns/mnt")).unwrap();
            }
        };
        let process = |pid: &str, comm: &str, ns: Option<&str>, mountinfo: &str| made(proc, pid, comm, ns, mountinfo);
        let root = "1 0 254:0 / / rw - ext4 /dev/vda rw\n";
        let mounts = |lines: &[&str]| -> String {
            std::iter::once(root.to_string()).chain(lines.iter().map(|l| format!("{l}\n"))).collect()
        };
        let ours = "mnt:[4026531841]";
        process("50", "rein", Some(ours), &mounts(&["2 1 7:3 / /ours rw - ext4 /dev/loop3 rw"]));
        process("7", "systemd", Some(ours), &mounts(&["2 1 7:3 / /ours\\040too rw - ext4 /dev/loop3 rw"]));
        let pg = "mnt:[4026532500]";
        let pg_mounts = mounts(&[
            "2 1 7:3 / /var/lib/pg rw - ext4 /dev/loop3 rw",
            "3 1 7:3 /sub /srv/a\\040b rw - ext4 /dev/loop3 rw",
        ]);
        process("12", "postgres", Some(pg), &pg_mounts);
        process("13", "psql", Some(pg), &mounts(&["2 1 7:3 / /not-read rw - ext4 /dev/loop3 rw"]));
        process("9", "zombie", None, &mounts(&["2 1 7:3 / /zombie rw - ext4 /dev/loop3 rw"]));
        process("self", "not-a-pid", Some("mnt:[1]"), &mounts(&["2 1 7:3 / /self rw - ext4 /dev/loop3 rw"]));
        process("20", "sleep", Some("mnt:[4026532600]"), &mounts(&["2 1 259:1 / /boot rw - vfat /dev/loop3p1 rw"]));
        process(
            "21",
            "",
            Some("mnt:[4026532700]"),
            &mounts(&["2 1 7:3 / /x rw - ext4 /dev/loop3 rw", "3 1 259:1 / /b rw - vfat /dev/loop3p1 rw"]),
        );
        let family = [
            device(Relation::Itself(None), (7, 3), vec![]),
            device(Relation::Partition("/dev/loop3p1".into()), (259, 1), vec![]),
            device(Relation::Partition("/dev/loop3p2".into()), (259, 2), vec![]),
        ];
        let named = |holders: Vec<DeviceHolder>| holders.iter().map(|h| h.to_string()).collect::<Vec<_>>();
        assert_eq!(
            named(namespace_mounts(proc, &family, 50)),
            [
                "it is mounted at /var/lib/pg, /srv/a b in the mount namespace of pid 12 (postgres), and in 1 more \
                 mount namespace",
                "its partition /dev/loop3p1 is mounted at /boot in the mount namespace of pid 20 (sleep), and in 1 \
                 more mount namespace",
            ]
        );
        assert!(namespace_mounts(proc, &family[2..], 50).is_empty(), "mounted in no namespace");
        assert!(namespace_mounts(&proc.join("missing"), &family, 50).is_empty());
        // Asked from pid 12's namespace, ours is another: pid 7 is the first process in it.
        let from_pg = named(namespace_mounts(proc, &family[..1], 13));
        assert_eq!(
            from_pg,
            ["it is mounted at /ours too in the mount namespace of pid 7 (systemd), and in 1 more mount namespace"]
        );
        // At the bound on namespaces: pid 12's alone is read.
        assert_eq!(
            named(namespace_mounts_within(proc, &family, 50, (1, MAX_MOUNTINFO_BYTES))),
            ["it is mounted at /var/lib/pg, /srv/a b in the mount namespace of pid 12 (postgres)"]
        );
        // At the bound on bytes: pid 12's mountinfo cut within its third line's mount point (that line
        // not read: read, it named `/srv/a`), then nothing more.
        let cut = pg_mounts.lines().take(2).map(|l| l.len() + 1).sum::<usize>() + "3 1 7:3 /sub /srv/a".len();
        let cut = cut as u64;
        assert_eq!(
            named(namespace_mounts_within(proc, &family, 50, (MAX_NAMESPACES_READ, cut))),
            ["it is mounted at /var/lib/pg in the mount namespace of pid 12 (postgres)"]
        );
        // Many mount points in a namespace are counted; a process without a name is named by its pid.
        let many: Vec<String> = (0..5).map(|i| format!("{} 1 7:3 / /m{i} rw - ext4 /dev/loop3 rw", i + 2)).collect();
        let tmp2 = tempfile::tempdir().unwrap();
        let lines: Vec<&str> = many.iter().map(String::as_str).collect();
        made(tmp2.path(), "30", "", Some("mnt:[4026532800]"), &mounts(&lines));
        let only = [device(Relation::Itself(None), (7, 3), vec![])];
        assert_eq!(
            named(namespace_mounts(tmp2.path(), &only, 50)),
            ["it is mounted at /m0, /m1, /m2 and 2 more in the mount namespace of pid 30"]
        );
    }

    /// A sysfs tree as the kernel lays it out, made in a temporary directory: `dev/block/MAJ:MIN` links to
    /// the devices' directories, a disk with partitions (one under an LVM volume, one a RAID member), a
    /// disk under a dm-crypt device and a bcache, and holders' directories under `block/`.
    #[test]
    fn the_sysfs_reader_finds_partitions_disks_and_holders() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let sys = tmp.path();
        let write = |p: &str, text: &str| {
            let p = sys.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        let dir = |p: &str| std::fs::create_dir_all(sys.join(p)).unwrap();
        let link = |number: &str, to: &str| {
            std::fs::create_dir_all(sys.join("dev/block")).unwrap();
            symlink(sys.join(to), sys.join("dev/block").join(number)).unwrap();
        };
        let disk = "devices/virtual/block/loop3";
        write(&format!("{disk}/dev"), "7:3\n");
        for (n, number) in [(1, "259:1"), (2, "259:2"), (10, "259:10")] {
            write(&format!("{disk}/loop3p{n}/dev"), &format!("{number}\n"));
            write(&format!("{disk}/loop3p{n}/partition"), &format!("{n}\n"));
            dir(&format!("{disk}/loop3p{n}/holders"));
            link(number, &format!("{disk}/loop3p{n}"));
        }
        dir(&format!("{disk}/holders"));
        dir(&format!("{disk}/mq")); // not a partition
        link("7:3", disk);
        dir(&format!("{disk}/loop3p2/holders/dm-0"));
        write("block/dm-0/dm/name", "vg-lv\n");
        write("block/dm-0/dm/uuid", "LVM-abcdef\n");
        dir(&format!("{disk}/loop3p10/holders/md0"));
        dir("block/md0/md");
        let whole = "devices/pci/block/sdb";
        write(&format!("{whole}/dev"), "8:16\n");
        write(&format!("{whole}/sdb1/dev"), "8:17\n");
        write(&format!("{whole}/sdb1/partition"), "1\n");
        link("8:17", &format!("{whole}/sdb1"));
        dir(&format!("{whole}/holders/dm-4"));
        dir(&format!("{whole}/holders/bcache0"));
        write("block/dm-4/dm/name", "crypt\n");
        write("block/dm-4/dm/uuid", "CRYPT-LUKS2-x\n");
        dir("block/bcache0");

        let part = |n: &str| Relation::Partition(n.to_string());
        assert_eq!(
            read_sysfs(sys, (7, 3)),
            [
                device(Relation::Itself(Some("/dev/loop3".into())), (7, 3), vec![]),
                device(part("/dev/loop3p1"), (259, 1), vec![]),
                device(
                    part("/dev/loop3p2"),
                    (259, 2),
                    vec![Stacked::Lvm { name: "vg-lv".into(), kernel: "dm-0".into() }]
                ),
                device(part("/dev/loop3p10"), (259, 10), vec![Stacked::Raid("md0".into())]),
            ]
        );
        assert_eq!(
            read_sysfs(sys, (8, 17)),
            [
                device(Relation::Itself(Some("/dev/sdb1".into())), (8, 17), vec![]),
                device(
                    Relation::Disk("/dev/sdb".into()),
                    (8, 16),
                    vec![
                        Stacked::Other("bcache0".into()),
                        Stacked::DeviceMapper { name: "crypt".into(), kernel: "dm-4".into() }
                    ]
                ),
            ]
        );
        assert_eq!(read_sysfs(sys, (9, 9)), [device(Relation::Itself(None), (9, 9), vec![])], "not in sysfs");
    }
}
