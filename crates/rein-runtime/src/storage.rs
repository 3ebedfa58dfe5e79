//! Storage backends: where the bytes live.
//!
//! A [`Storage`] is synchronous and thread-safe; the dispatcher runs its calls on tokio's blocking pool so
//! a slow disk never stalls the network tasks. Two implementations:
//! - [`FileStorage`]: a regular file or block device through positioned reads and writes (`pread`/`pwrite`),
//!   `fdatasync` on flush, hole punching and zero ranges (`fallocate`) for trim and write-zeroes where the
//!   file system supports them, falling back to writing zeroes. Optionally with `O_DIRECT` (bypassing the
//!   page cache): requests aligned to [`DIRECT_ALIGN`] go through a second, direct descriptor with an
//!   aligned bounce buffer; unaligned ones through the buffered descriptor (the kernel keeps the two
//!   coherent: direct IO writes back and invalidates the cached range it touches). The dispatcher's
//!   io_uring engine ([`crate::uring`]) uses the same descriptors ([`FileStorage::fd_for`]);
//! - [`MemStorage`]: RAM, in 1 MiB pages allocated on first write (reads of untouched pages are zeroes).
//!
//! # Allocation (NBD block status)
//! [`Storage::allocation`] describes a range as NBD's `base:allocation` does ([`Extents`]): a hole (not
//! allocated, reads as zeroes) is `STATE_HOLE | STATE_ZERO`, anything else 0 ("allocated, or not known").
//! A file asks the file system (`lseek` with `SEEK_DATA` and `SEEK_HOLE`; a file system without them
//! reports the whole file as data, and so does a block device, whose `lseek` knows no holes); RAM reports
//! its pages never written (or zeroed whole) as holes, at its 1 MiB granularity; any other storage
//! reports nothing, which the reply turns into "all data". Nothing is claimed a hole or zero that is not.
//!
//! Every call checks `offset + len <= size` and returns [`StorageError::OutOfRange`] otherwise (the NBD
//! server has already rejected such requests; the check keeps every other caller honest).
//!
//! # What the dispatcher may do with a storage
//! The dispatcher never asks what type a storage is; it asks what the storage can do, through two
//! methods with conservative defaults, so a new backend is driven correctly (on the blocking pool) without
//! the dispatcher knowing it exists:
//! - [`Storage::kernel_io`]: a descriptor the kernel can read and write directly for a given range, after
//!   the same checks as `read_at`/`write_at` (the io_uring engine submits to it). Files answer with their
//!   buffered or `O_DIRECT` descriptor; RAM has none.
//! - [`Storage::inline_max_bytes`]: IO up to this size is cheaper to run in place than to hand to another
//!   thread (it never blocks and is a memory copy of microseconds). RAM answers [`MEMORY_INLINE_MAX`];
//!   files 0, since any file IO may wait for a device.
//!
//! # One writer per file
//! A [`FileStorage`] holds an advisory lock (`flock`) on its file for as long as any storage of that file
//! in this process lives: exclusive when writable, shared when read-only. A second process that opens the
//! same file (another `rein serve`, a `rein probe --destructive`, a `rein serve` given another's data)
//! is refused with [`StorageError::InUse`] instead of both writing the one image (each one's writes lost
//! under the other's, silently). Within one process the lock is shared by every storage of the file
//! (found by device and inode: a reload opens a changed export again while connections hold the old
//! storage; a block device by its device number, whichever node of it each open names), and a writable
//! open upgrades a read-only one's lock. So a reload that points a block device export at another node
//! of its device takes over the claim the old storage holds (below) instead of being refused by it:
//! until 2026-12-07 the second node's open was a second claim, which the kernel refused (EBUSY) while
//! the old storage lived, and the reload failed with the device `in use by the system`, its own claim.
//! Two exports on one device are [`crate::preflight`]'s to refuse, not the lock's. The lock is advisory: tools that do
//! not take it (dd, cp, a qemu without locking) are not kept out. A writable block device is also
//! claimed from the kernel (an `O_EXCL` open, held with the lock; [`StorageError::DeviceBusy`]): that
//! refuses a device that is mounted, swap, a RAID, LVM or device-mapper member, or claimed by another
//! process through any device node of it (or a partition of it, or the disk it is a partition of), and
//! keeps those away while it is served (`mount` and `mkfs` fail with EBUSY). The refusal names what holds
//! the device, as far as the kernel's tables tell ([`crate::device_holders`]: the mount point, swap, the
//! LVM volume, ...; until 2026-12-07 it listed every possible cause). Until 2026-12-06 only the
//! `flock` was taken: the device of a mounted file system was served, and a client's writes overwrote
//! the file system under the mount; a second server through another device node was not kept out.
//! An image file that a loop device is attached to (its backing file) is refused for writing too
//! ([`StorageError::LoopBacking`]): the device writes it behind the lock's back, and a file system
//! mounted from the device would be overwritten under its mount.
//!
//! # A failed sync stays failed
//! Linux reports a file's writeback error once: an `fdatasync` after a failed one succeeds, although the
//! writes acknowledged before it never reached the disk (and a sync of one range, such as an
//! `RWF_DSYNC` write's, is handed an older write's error; the io_uring engine syncs a FUA write with an
//! `fdatasync` of its own for that reason, [`crate::uring`]). A storage whose sync failed therefore keeps the error
//! ([`Storage::sync_failed`]): every later flush, and with it every FUA request, fails with it under
//! either engine, as QEMU's file driver does, until the export is opened again once the device is dealt
//! with: a restart, or any reload (which opens every export whose sync failed again, for the connections
//! opened from then on; those open keep the error, since their writes before it may be lost). Before, a FLUSH after a failed one succeeded while
//! 4 MiB acknowledged before it were lost. Of two syncs at once Linux reports the error to one only (the
//! first to check the open file's error sequence takes it; the other returns 0), so the syncs of one
//! storage run one at a time: under the `threads` engine `flush` holds a lock while it syncs, and under
//! the io_uring engine every sync of a storage with a descriptor is the ring's (a FUA trim's or
//! write-zeroes' too), which has one of each storage at the kernel at a time ([`crate::uring`],
//! invariant 5). Until 2026-12-06 the ring ran them side by side, and a sync that returned 0 could be
//! answered before the one that had taken the error was seen.
//!
//! # A new image
//! [`FileStorage::open_with`] creates a missing image that has a size (`create_new`, mode
//! [`NEW_IMAGE_MODE`] under the umask, then `set_len`; a failure is `create failed: ...`, not `open`) and
//! makes it durable before it serves it: an `fsync` of the new file (its size) and one of its directory
//! (its name). Without the second, a power loss could take the image away with everything written to
//! it and flushed since: the FLUSHes' `fdatasync`s are of the file, and "calling fsync() does not
//! necessarily ensure that the entry in the directory containing the file has also reached disk. For
//! that an explicit fsync() on a file descriptor for the directory is also needed" (fsync(2); POSIX
//! promises no more). Linux's ext4 happens to sync a new file's entry with it (in its journal, or
//! without one by syncing the parent), but a server cannot count on its file system. A failure of either
//! sync (or of `set_len`) fails the open, naming the step (`fsync of the new image's directory failed:
//! ...`), and removes the file it created, which a later open would otherwise take as it is, its name
//! perhaps never synced: the next one creates it anew. Until 2026-12-06 neither was synced. A start
//! killed between the creation and the directory's sync (or a file made by hand, `truncate -s`, just
//! before) left a name that may not be on disk, which the next open took as it was: every writable open
//! of an image file it finds syncs the image's directory too (a clean directory's sync costs little;
//! a failure fails the open, naming it).
//!
//! # Errors
//! A [`StorageError`] says what failed; [`StorageError::kind`] says what kind of failure it is for a
//! client (rein-proto's protocol-neutral [`ErrorKind`]): out of range is an invalid request, a write to a
//! read-only export is read-only, ENOSPC / EDQUOT / EFBIG from the OS are no space, ENOMEM is a lack of
//! resources, any other OS error is an IO error. The protocol maps kinds to its own numbers.

use rein_proto::nbd::{Extents, STATE_HOLE, STATE_ZERO};
use rein_proto::ErrorKind;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

/// Offset, length and buffer alignment for `O_DIRECT` IO (4 KiB covers 512-byte and 4 KiB sectors).
pub const DIRECT_ALIGN: usize = 4096;

/// RAM storage runs requests up to this size on the dispatcher itself ([`Storage::inline_max_bytes`]):
/// copying 256 KiB takes tens of microseconds, about what a hand-off to another thread costs.
pub const MEMORY_INLINE_MAX: u64 = 256 * 1024;

/// Why a storage call failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The range is not inside the storage.
    #[error("range {offset}+{len} is beyond the end of the export ({size} bytes)")]
    OutOfRange {
        /// The range's first byte.
        offset: u64,
        /// The range's length in bytes.
        len: u64,
        /// The storage's size in bytes.
        size: u64,
    },
    /// A change to read-only storage.
    #[error("export is read-only")]
    ReadOnly,
    /// The path is neither a regular file nor a block device (a directory, a FIFO, a character device or a
    /// socket): nothing with a fixed size to serve.
    #[error("is {0}, not a regular file or a block device")]
    NotAFile(&'static str),
    /// Another process holds the file (module comment, "One writer per file").
    #[error(
        "is in use by another process (a rein serve or rein probe that has it open{0}); two writers of one \
         image overwrite each other's data"
    )]
    InUse(&'static str),
    /// A block device the kernel refused to open exclusively (EBUSY), with what holds it as far as the
    /// kernel's tables tell ([`crate::device_holders`]): a mount, swap, an md RAID, an LVM or other
    /// device-mapper device built on it (or on a partition of it, or on the disk it is a partition of),
    /// else another process that claimed it (a `rein serve` through another device node, `mkfs`).
    /// Module comment, "One writer per file".
    #[error(
        "is a block device in use: {0}. The kernel refused an exclusive open (EBUSY); served, the clients' \
         writes would overwrite what holds it (check the device's name, and release it first if it is the one \
         meant)"
    )]
    DeviceBusy(Box<crate::device_holders::Busy>),
    /// A regular file that a loop device is attached to (its backing file), refused for writing: writes
    /// through the file and through the device overwrite each other, and a file system mounted from the
    /// device is corrupted under its mount.
    #[error(
        "is the backing file of loop device {0} (losetup -a lists it): the clients' writes would overwrite \
         what is written through the device, and any file system mounted from it (unmount it and detach \
         it first, losetup -d {0}, or serve the device instead)"
    )]
    LoopBacking(String),
    /// The file does not exist and no size to create it with was given.
    #[error("does not exist (add size_mb to the export to create it)")]
    Missing,
    /// The file of a read-only export does not exist: it is not created, with or without a size (a
    /// read-only export of a missing file is most likely a mistyped path, and an empty image of zeroes
    /// would serve nothing).
    #[error("does not exist (a read-only export is not created)")]
    MissingReadOnly,
    /// A path under `/dev` does not exist: it is not created, with or without a size. A device's name
    /// mistyped beside `size_mb` would otherwise become a regular file in `/dev` (a tmpfs: the data gone
    /// at the next boot) in place of the disk.
    #[error("does not exist (a path under /dev names a device, which is not created: check its name)")]
    MissingDevice,
    /// An existing image's size differs from the configured one (an image is never resized).
    #[error("is {actual} bytes, but size_mb asks for {configured} bytes (an existing image is never resized: set size_mb to its size or remove size_mb)")]
    SizeMismatch {
        /// The file's or device's size.
        actual: u64,
        /// The configured size.
        configured: u64,
    },
    /// `O_DIRECT` was asked for a block device whose logical blocks are larger than [`DIRECT_ALIGN`]:
    /// its aligned requests would fail (EINVAL) while unaligned ones went through the page cache.
    #[error(
        "has {0}-byte logical blocks, above the {DIRECT_ALIGN} bytes direct IO is aligned to here (remove \
         direct from the export)"
    )]
    DirectBlocks(u64),
    /// A sync failed before (module comment, "A failed sync stays failed"): this flush fails with its
    /// error.
    #[error(
        "an earlier fdatasync failed ({0}): writes acknowledged before it may not be on stable storage; every \
         FLUSH fails until the export is opened again (a restart or a reload: new connections)"
    )]
    SyncFailedBefore(io::Error),
    /// The operating system failed the call.
    #[error("{op} failed: {source}")]
    Io {
        /// The call that failed (`read`, `write`, `fdatasync`, `fallocate(punch hole)`, ...).
        op: &'static str,
        /// The operating system's error; its errno decides [`StorageError::kind`].
        source: io::Error,
    },
}

impl StorageError {
    /// What kind of failure this is for a client (module comment).
    pub fn kind(&self) -> ErrorKind {
        match self {
            StorageError::OutOfRange { .. } => ErrorKind::InvalidRequest,
            StorageError::ReadOnly => ErrorKind::ReadOnly,
            StorageError::NotAFile(_)
            | StorageError::Missing
            | StorageError::MissingReadOnly
            | StorageError::MissingDevice
            | StorageError::SizeMismatch { .. }
            | StorageError::DirectBlocks(_)
            | StorageError::InUse(_)
            | StorageError::DeviceBusy(_)
            | StorageError::LoopBacking(_) => ErrorKind::Io,
            StorageError::Io { source, .. } | StorageError::SyncFailedBefore(source) => match source.raw_os_error() {
                Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => ErrorKind::NoSpace,
                Some(libc::ENOMEM) => ErrorKind::Exhausted,
                _ => ErrorKind::Io,
            },
        }
    }
}

/// How the kernel can run one IO on a storage directly (io_uring): the descriptor, and whether it was
/// opened with `O_DIRECT` (then the buffer must be an [`AlignedBuf`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelIo {
    /// The descriptor to read or write at the IO's offset.
    pub fd: RawFd,
    /// Whether `fd` bypasses the page cache (aligned buffer required).
    pub direct: bool,
}

/// Where the bytes of an export live. Synchronous and thread-safe; the dispatcher decides where each call
/// runs from what the storage says it can do (module comment).
pub trait Storage: Send + Sync + 'static {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError>;
    /// Writes `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), StorageError>;
    /// Makes completed writes durable.
    fn flush(&self) -> Result<(), StorageError>;
    /// Discards a range (it reads as zeroes afterwards).
    fn trim(&self, offset: u64, len: u64) -> Result<(), StorageError>;
    /// Writes zeroes to a range.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), StorageError>;
    /// Whether changes are refused.
    fn read_only(&self) -> bool {
        false
    }
    /// Refuses every change from now on ([`StorageError::ReadOnly`]), as a read-only storage does, while
    /// flushes still sync the writes made before: a reload made its export `read_only`, and this storage
    /// is the one the connections opened before still use (they were told at their handshake that it is
    /// writable). The default, for a storage that cannot stop: nothing.
    fn stop_writes(&self) {}
    /// A new storage over the same bytes, with a write gate of its own: read-only if `read_only`, and
    /// writable otherwise whether or not this one's writes were stopped ([`Storage::stop_writes`] stops
    /// this handle's, not the other's). A reload's changed memory export takes its RAM over this way, the
    /// only copy of its data ([`MemStorage`]). `None`, the default: the bytes live elsewhere (a file,
    /// which the reload opens again).
    fn share_bytes(&self, read_only: bool) -> Option<std::sync::Arc<dyn Storage>> {
        let _ = read_only;
        None
    }
    /// The device and inode of the file it has open (`None`: not a file), which two exports must not
    /// both write ([`crate::preflight`]).
    fn file_id(&self) -> Option<(u64, u64)> {
        None
    }
    /// The device number of the block device it has open (`None`: not a block device), which two
    /// exports must not both write, whichever node of it each opened ([`crate::preflight`]).
    fn device_number(&self) -> Option<u64> {
        None
    }
    /// The size of the file or block device it has open, read now (`fstat`; a device's end, `lseek`),
    /// where the open size is [`size`]: an image grown or shrunk by hand (`qemu-img resize`, an
    /// `lvextend`) under a running export. `None`, the default: no file open, or its size unreadable.
    /// Blocks as a `stat` does (a hung mount).
    ///
    /// [`size`]: Storage::size
    fn file_size_now(&self) -> Option<u64> {
        None
    }
    /// The descriptor through which the kernel can run a read (or, with `write`, a write) of `len` bytes
    /// at `offset`, after the checks `read_at` / `write_at` make (a flush asks for a zero-length read at
    /// 0). `Ok(None)`, the default: no descriptor; IO goes through the methods above. Under the
    /// io_uring engine every sync of a storage with a descriptor is an `fdatasync` of it on the ring, one
    /// at a time ([`crate::uring`], invariant 5): its [`flush`](Storage::flush) is not called then.
    fn kernel_io(&self, offset: u64, len: u64, write: bool) -> Result<Option<KernelIo>, StorageError> {
        let _ = (offset, len, write);
        Ok(None)
    }
    /// IO of at most this many bytes never blocks and is cheaper to run in place than to hand to another
    /// thread (a memory copy). 0, the default: any call may block.
    fn inline_max_bytes(&self) -> u64 {
        0
    }
    /// A sync of this storage run elsewhere (the io_uring engine's fdatasync: a FLUSH's or a FUA
    /// request's) failed with `errno`: the storage keeps it (module comment, "A failed sync stays
    /// failed"). The default, for a storage with nothing to make durable: nothing.
    fn sync_failed(&self, errno: i32) {
        let _ = errno;
    }
    /// The error of a sync that failed before, which every later flush fails with; `None`, the default:
    /// none failed.
    fn sync_error(&self) -> Option<StorageError> {
        None
    }
    /// Describes the range `extents` asks about (module comment, "Allocation"): [`Extents::push`] what
    /// lies at its next offset until it wants no more or takes no more. The default, for a storage that
    /// cannot tell: nothing pushed, which the reply reports as data (always true). Blocks as an `lseek`
    /// does.
    fn allocation(&self, extents: &mut Extents) -> Result<(), StorageError> {
        let _ = extents;
        Ok(())
    }
}

/// A `len`-byte buffer whose data starts at a [`DIRECT_ALIGN`]-aligned address (safe code: over-allocate
/// and skip to the first aligned byte).
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes (allocates `len + DIRECT_ALIGN`).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + DIRECT_ALIGN];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { raw, start, len }
    }
    /// An aligned copy of `data`.
    pub fn from_slice(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(data.len());
        b.as_mut_slice().copy_from_slice(data);
        b
    }
    /// The `len` data bytes; the first is at a [`DIRECT_ALIGN`]-aligned address.
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
    /// The `len` data bytes, writable; the first is at a [`DIRECT_ALIGN`]-aligned address.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
    /// Data bytes (the over-allocation for alignment not counted).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds no data bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The data as a plain `Vec` (one copy).
    pub fn into_vec(self) -> Vec<u8> {
        self.as_slice().to_vec()
    }
}

/// Whether `offset` and `len` suit `O_DIRECT`.
pub fn direct_aligned(offset: u64, len: u64) -> bool {
    len > 0 && offset.is_multiple_of(DIRECT_ALIGN as u64) && len.is_multiple_of(DIRECT_ALIGN as u64)
}

fn check(size: u64, offset: u64, len: u64) -> Result<(), StorageError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(StorageError::OutOfRange { offset, len, size }),
    }
}

/// A file or block device.
pub struct FileStorage {
    file: File,
    /// The same file opened with `O_DIRECT`, when asked for.
    direct: Option<File>,
    size: u64,
    read_only: bool,
    /// The file's device and inode, as opened.
    id: FileKey,
    /// The errno of the first sync that failed (0: none; module comment, "A failed sync stays failed").
    sync_errno: std::sync::atomic::AtomicI32,
    /// Changes are refused from now on ([`Storage::stop_writes`]).
    writes_stopped: std::sync::atomic::AtomicBool,
    /// Held while `flush` syncs (module comment, "A failed sync stays failed").
    syncing: Mutex<()>,
    /// Held while the storage lives (module comment, "One writer per file").
    _lock: std::sync::Arc<ExportLock>,
}

/// A block device's logical block size (sysfs `queue/logical_block_size`, a partition's its disk's);
/// `None` for other files, or where sysfs does not say.
fn logical_block_size(meta: &std::fs::Metadata) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if !meta.file_type().is_block_device() {
        return None;
    }
    let dev = format!("/sys/dev/block/{}:{}", libc::major(meta.rdev()), libc::minor(meta.rdev()));
    ["queue", "../queue"]
        .iter()
        .find_map(|q| std::fs::read_to_string(format!("{dev}/{q}/logical_block_size")).ok())?
        .trim()
        .parse()
        .ok()
}

/// What kind of file `meta` describes, when it is one that cannot be served (a directory, a FIFO, a
/// character device, a socket); `None` for regular files and block devices.
fn unservable(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_file() || t.is_block_device() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a file")
    }
}

/// How [`FileStorage::open_with`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMode {
    /// Refuse writes (the file is opened read-only).
    pub read_only: bool,
    /// Aligned IO bypasses the page cache through a second, `O_DIRECT` descriptor.
    pub direct: bool,
    /// The kernel's readahead on the buffered descriptor (default on). Off (`POSIX_FADV_RANDOM`), a read
    /// brings into the page cache only the pages it asks for. Why that matters to a QoS server: the
    /// kernel runs readahead in the thread that submits the read, which for io_uring is the dispatcher's.
    /// On a device with `read_ahead_kb = 8192`, a sequential reader of a sparse file made it zero-fill
    /// 8 MiB of page cache there every 8 MiB read, stalling every tenant's dispatches for about 24 ms
    /// each time (a 1,000 IOPS limit then delivered 947; docs/serve.md, "Readahead and the dispatcher").
    pub readahead: bool,
}

impl Default for FileMode {
    fn default() -> Self {
        FileMode { read_only: false, direct: false, readahead: true }
    }
}

/// The lock on one file, shared by its storages in this process (module comment, "One writer per file").
#[derive(Debug)]
struct ExportLock {
    /// What it locks.
    key: HeldKey,
    /// A duplicate of the first storage's descriptor: the lock is on that open file description, which
    /// lives as long as this does.
    fd: File,
    /// The lock is exclusive (else shared).
    exclusive: std::sync::atomic::AtomicBool,
    /// For a block device written here: the device opened with `O_EXCL`, the kernel's claim on it, held
    /// as long as the lock (module comment, "One writer per file").
    claim: Mutex<Option<File>>,
}

/// A file's device and inode.
type FileKey = (u64, u64);

/// What one [`ExportLock`] is for: a block device by its device number, whichever node of it was opened
/// (`/dev/loop0` and a node made with mknod are one device, and the kernel lets one claim of it be
/// taken), another file by its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeldKey {
    Device(u64),
    Inode(FileKey),
}

impl HeldKey {
    fn of(meta: &std::fs::Metadata) -> HeldKey {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        if meta.file_type().is_block_device() {
            HeldKey::Device(meta.rdev())
        } else {
            HeldKey::Inode((meta.dev(), meta.ino()))
        }
    }
}

/// The files this process holds. An entry goes once its lock is dropped (with the last storage of the
/// file): dead entries are dropped at every open.
static HELD: Mutex<Vec<(HeldKey, std::sync::Weak<ExportLock>)>> = Mutex::new(Vec::new());

impl ExportLock {
    /// The lock on `file` (whose metadata is `meta`), exclusive if `write`: this process's, if it holds
    /// the file already (a block device through any node of it; upgraded if `write` asks more), else a
    /// new one; [`StorageError::InUse`] if another
    /// process holds it so that it cannot be had.
    /// A writable block device is also claimed from the kernel (an `O_EXCL` open of `path`), once per lock.
    fn take(
        file: &File,
        path: &Path,
        meta: &std::fs::Metadata,
        write: bool,
    ) -> Result<std::sync::Arc<ExportLock>, StorageError> {
        use std::sync::atomic::Ordering;
        let key = HeldKey::of(meta);
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|(_, w)| w.strong_count() > 0);
        if let Some(lock) = held.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade()) {
            if write && !lock.exclusive.load(Ordering::Relaxed) {
                flock(&lock.fd, true)?;
                if let Err(e) = lock.claim(path, meta) {
                    // Back to the shared lock the read-only storages of the file hold.
                    let _ = flock(&lock.fd, false);
                    return Err(e);
                }
                lock.exclusive.store(true, Ordering::Relaxed);
            }
            return Ok(lock);
        }
        let fd = file.try_clone().map_err(|source| StorageError::Io { op: "dup", source })?;
        flock(&fd, write)?;
        let lock = std::sync::Arc::new(ExportLock { key, fd, exclusive: write.into(), claim: Mutex::new(None) });
        if write {
            lock.claim(path, meta)?;
        }
        held.push((key, std::sync::Arc::downgrade(&lock)));
        Ok(lock)
    }

    /// Claims the block device `path` (whose metadata is `meta`) from the kernel, if it is one and not
    /// claimed by this lock yet: an `O_EXCL` open, which fails with EBUSY while the device is mounted,
    /// swap, a RAID, LVM or device-mapper member, or claimed by another process (through any of its
    /// device nodes, or a partition of it or the disk it is a partition of), and keeps all of those
    /// away while it is held ([`StorageError::DeviceBusy`]). The `flock` alone did not: a mounted file
    /// system's device was served, and its clients' writes overwrote the file system under the mount.
    fn claim(&self, path: &Path, meta: &std::fs::Metadata) -> Result<(), StorageError> {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_block_device() {
            return Ok(());
        }
        let mut claim = self.claim.lock().unwrap_or_else(|e| e.into_inner());
        if claim.is_some() {
            return Ok(());
        }
        *claim = Some(exclusive_open(path, meta)?);
        Ok(())
    }
}

/// The block device `path` (whose metadata is `meta`) opened read-only with `O_EXCL`: the kernel's claim
/// on it, held as long as the file is open ([`ExportLock::claim`]; [`FileStorage::inspect`] closes it at
/// once). [`StorageError::DeviceBusy`] when the kernel refuses it (EBUSY).
fn exclusive_open(path: &Path, meta: &std::fs::Metadata) -> Result<File, StorageError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let f =
        OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => StorageError::DeviceBusy(Box::new(crate::device_holders::busy(path, meta.rdev()))),
            _ => StorageError::Io { op: "exclusive open (O_EXCL) of the block device", source: e },
        })?;
    // The path may have been pointed at another device since it was opened.
    let same = f.metadata().is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == meta.rdev());
    if !same {
        return Err(StorageError::Io {
            op: "exclusive open (O_EXCL) of the block device",
            source: io::Error::other("the path names another device than the one opened (changed meanwhile)"),
        });
    }
    Ok(f)
}

/// `flock(LOCK_EX or LOCK_SH | LOCK_NB)` on `file`: [`StorageError::InUse`] if another holder is in the way.
#[allow(unsafe_code)] // flock(2) has no safe wrapper in std; see the SAFETY comment.
fn flock(file: &File, exclusive: bool) -> Result<(), StorageError> {
    let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH } | libc::LOCK_NB;
    loop {
        // SAFETY: flock only reads its integer arguments; the descriptor is owned by `file`, which outlives
        // the call.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Err(StorageError::InUse(if exclusive { "" } else { " for writing" })),
            _ => return Err(StorageError::Io { op: "flock", source: e }),
        }
    }
}

/// Turns off the kernel's readahead on `file`'s open file description (`POSIX_FADV_RANDOM`).
#[allow(unsafe_code)] // posix_fadvise(2) has no safe wrapper in std; see the SAFETY comment.
fn no_readahead(file: &File) -> io::Result<()> {
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is owned by `file`, which
    // outlives the call.
    let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    // posix_fadvise returns the error number instead of setting errno.
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

/// The mode a new image is created with, before the umask: its owner's and its group's, no one else's.
/// A tenant's disk is nobody else's to read; the group is how a service whose uid changes between runs
/// (systemd's `DynamicUser=`) opens it again (docs/operations.md, "Exports outside /var/lib/rein").
/// Until 2026-12-06 it was 0666: under the usual umask 0022 every local user could read the images
/// made outside a private directory.
pub const NEW_IMAGE_MODE: u32 = 0o660;

/// Whether `path` is there to serve: its metadata if it is a regular file or a block device, `None` if it
/// is missing and may be created (with `size`); the refusals of [`FileStorage::open_with`] before it
/// opens anything.
fn present(path: &Path, size: Option<u64>, read_only: bool) -> Result<Option<std::fs::Metadata>, StorageError> {
    match std::fs::metadata(path) {
        Ok(meta) => match unservable(&meta) {
            Some(kind) => Err(StorageError::NotAFile(kind)),
            None => Ok(Some(meta)),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => match (read_only, size) {
            _ if path.starts_with("/dev") => Err(StorageError::MissingDevice),
            (true, _) => Err(StorageError::MissingReadOnly),
            (false, None) => Err(StorageError::Missing),
            (false, Some(_)) => Ok(None),
        },
        Err(e) => Err(StorageError::Io { op: "stat", source: e }),
    }
}

/// The size of the open `file` (a block device's by seeking to its end), which must be `size` if given
/// ([`StorageError::SizeMismatch`]).
fn sized(file: &File, meta: &std::fs::Metadata, size: Option<u64>) -> Result<u64, StorageError> {
    let actual = size_now(file, meta).map_err(|e| StorageError::Io { op: "seek", source: e })?;
    match size.filter(|&c| c != actual) {
        Some(configured) => Err(StorageError::SizeMismatch { actual, configured }),
        None => Ok(actual),
    }
}

/// Sizes the image `file` just created at `path` (`set_len` to `size`) and makes it durable (module
/// comment, "A new image"): an `fsync` of the file, then `sync_dir` of its directory (`.` for a bare
/// name). `sync_dir` is [`crate::durable::sync_directory`]; a test's stand-in sees which directory is
/// synced, or fails.
fn settle_new(
    file: &File,
    path: &Path,
    size: Option<u64>,
    sync_dir: impl FnOnce(&Path) -> io::Result<()>,
) -> Result<(), StorageError> {
    let io = |op, source| StorageError::Io { op, source };
    if let Some(sz) = size {
        file.set_len(sz).map_err(|e| io("set_len", e))?;
    }
    file.sync_all().map_err(|e| io("fsync of the new image", e))?;
    sync_dir(parent_dir(path)).map_err(|e| io("fsync of the new image's directory", e))
}

/// The directory that holds `path`'s entry (`.` for a bare name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// The size of open `file` (whose metadata is `meta`) now: a regular file's length, a block device's end
/// (`lseek`; its inode's size is not the device's). Only those two are ever opened.
fn size_now(file: &File, meta: &std::fs::Metadata) -> io::Result<u64> {
    if meta.file_type().is_file() {
        Ok(meta.len())
    } else {
        use std::io::Seek;
        let mut f = file;
        f.seek(io::SeekFrom::End(0))
    }
}

/// [`StorageError::LoopBacking`] for a writable export (`read_only` false) of an image file that a loop
/// device is attached to ([`loop_device_over`]): the refusal of [`FileStorage::open_with`] and of its
/// inspection ([`FileStorage::inspect`]) alike.
fn not_a_loop_backing_file(meta: &std::fs::Metadata, read_only: bool) -> Result<(), StorageError> {
    if read_only || !meta.file_type().is_file() {
        return Ok(());
    }
    loop_device_over(meta).map_or(Ok(()), |dev| Err(StorageError::LoopBacking(dev)))
}

/// The loop device (`/dev/loopN`) whose backing file is the file `meta` describes (the same device and
/// inode), if any: each attached loop device's `loop/backing_file` in sysfs, stat'ed. `None` also where
/// sysfs does not say (no loop devices, not Linux). Until 2026-12-06 an image attached to a loop device
/// (a VM's disk loop-mounted on the host to look into it, left mounted) was served writable, and a
/// client's writes overwrote the file system under its mount.
fn loop_device_over(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let key = (meta.dev(), meta.ino());
    std::fs::read_dir("/sys/block").ok()?.flatten().find_map(|d| {
        let name = d.file_name().into_string().ok()?;
        if !name.starts_with("loop") {
            return None;
        }
        let backing = std::fs::read_to_string(d.path().join("loop/backing_file")).ok()?;
        let m = std::fs::metadata(backing.trim_end_matches('\n')).ok()?;
        ((m.dev(), m.ino()) == key).then(|| format!("/dev/{name}"))
    })
}

/// What [`FileStorage::inspect`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inspected {
    /// The file or device is there, of this many bytes.
    Present(u64),
    /// It is missing, and a start would create it with this many bytes.
    WouldCreate(u64),
}

impl FileStorage {
    /// The checks [`FileStorage::open_with`] makes (what the path is, a missing file, the size), without
    /// creating, locking or writing anything: `rein serve --check-config`. The file is opened read-only
    /// for its size. For a writable export, what the system holds is refused as the open refuses it: an
    /// image file that a loop device is attached to ([`StorageError::LoopBacking`], the same sysfs
    /// check), and a block device that the kernel will not let be claimed ([`StorageError::DeviceBusy`]:
    /// mounted, swap, a RAID, LVM or device-mapper member, or claimed by a process, which may be a
    /// running server serving it): an `O_EXCL` open, read-only, closed at once (a `mount` at that very
    /// moment would fail, busy). Until 2026-12-06 neither was checked, and a check said OK where the
    /// start then failed. What only an open for writing can tell (permissions to write, another process
    /// holding an image's `flock`, `O_DIRECT` support) is not checked.
    pub fn inspect(path: &Path, size: Option<u64>, read_only: bool) -> Result<Inspected, StorageError> {
        use std::os::unix::fs::FileTypeExt;
        let Some(_) = present(path, size, read_only)? else {
            return Ok(Inspected::WouldCreate(size.expect("present: a missing file has a size")));
        };
        let file = File::open(path).map_err(|e| StorageError::Io { op: "open", source: e })?;
        let meta = file.metadata().map_err(|e| StorageError::Io { op: "stat", source: e })?;
        // In the open's order: the loop device, the claim, then the size.
        not_a_loop_backing_file(&meta, read_only)?;
        if !read_only && meta.file_type().is_block_device() {
            drop(exclusive_open(path, &meta)?);
        }
        sized(&file, &meta, size).map(Inspected::Present)
    }

    /// Opens a file or block device. A missing file is created with `size` if given, and synced with its
    /// directory before the open returns (module comment, "A new image"), else an error
    /// ([`StorageError::Missing`]); a missing file of a read-only export is an error whatever the size
    /// ([`StorageError::MissingReadOnly`]: it used to fail as `open failed: No such file or directory`); an existing one must have `size` if given
    /// ([`StorageError::SizeMismatch`]); directories, FIFOs, character devices and sockets are refused
    /// before they are opened ([`StorageError::NotAFile`]; opening a FIFO would block).
    pub fn open(path: &Path, size: Option<u64>, read_only: bool) -> Result<FileStorage, StorageError> {
        Self::open_with(path, size, FileMode { read_only, ..FileMode::default() })
    }

    /// As [`FileStorage::open`], with the [`FileMode`]'s settings. A file system that refuses `O_DIRECT`
    /// (tmpfs, for one) is an error naming the cause.
    pub fn open_with(path: &Path, size: Option<u64>, mode: FileMode) -> Result<FileStorage, StorageError> {
        Self::open_in(path, size, mode, &crate::durable::sync_directory)
    }

    /// [`FileStorage::open_with`], with `sync_dir` syncing the directories (a test's stand-in sees which).
    fn open_in(
        path: &Path,
        size: Option<u64>,
        mode: FileMode,
        sync_dir: &dyn Fn(&Path) -> io::Result<()>,
    ) -> Result<FileStorage, StorageError> {
        let FileMode { read_only, direct, readahead } = mode;
        let io = |op, source| StorageError::Io { op, source };
        let found = present(path, size, read_only)?;
        let exists = found.is_some();
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .read(true)
                .write(!read_only)
                .create_new(!exists)
                .mode(NEW_IMAGE_MODE)
                .open(path)
                .map_err(|e| io(if exists { "open" } else { "create" }, e))?
        };
        if found.is_some_and(|m| m.file_type().is_file()) && !read_only {
            sync_dir(parent_dir(path)).map_err(|e| io("fsync of the image's directory", e))?;
        }
        if !exists {
            if let Err(e) = settle_new(&file, path, size, sync_dir) {
                // Not left behind: a later open would take it as it is, its name perhaps never synced.
                drop(file);
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
            // Said with the whole path: a relative `data_dir` follows the working directory, and a start
            // from another one (a unit without WorkingDirectory, cron) gave a VM a blank disk in silence.
            let shown = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            tracing::info!(path = %shown.display(), bytes = size.unwrap_or(0), "created a new, empty image");
        }
        let meta = file.metadata().map_err(|e| io("stat", e))?;
        not_a_loop_backing_file(&meta, read_only)?;
        let lock = ExportLock::take(&file, path, &meta, !read_only)?;
        let actual = sized(&file, &meta, size)?;
        if !readahead {
            no_readahead(&file).map_err(|e| io("posix_fadvise(POSIX_FADV_RANDOM)", e))?;
        }
        let direct = if direct {
            let f = OpenOptions::new()
                .read(true)
                .write(!read_only)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .map_err(|e| io("open with O_DIRECT (does the file system support direct IO?)", e))?;
            // A device's own alignment above ours failed every aligned request (EINVAL on a device of
            // 8 KiB sectors) and served the unaligned ones through the page cache.
            match logical_block_size(&meta) {
                Some(block) if block > DIRECT_ALIGN as u64 => return Err(StorageError::DirectBlocks(block)),
                _ => {}
            }
            Some(f)
        } else {
            None
        };
        let id = {
            use std::os::unix::fs::MetadataExt;
            (meta.dev(), meta.ino())
        };
        Ok(FileStorage {
            file,
            direct,
            size: actual,
            read_only,
            id,
            sync_errno: Default::default(),
            writes_stopped: Default::default(),
            syncing: Mutex::new(()),
            _lock: lock,
        })
    }

    /// The descriptor an IO of `len` bytes at `offset` should use: the direct one (then its buffer must be
    /// an [`AlignedBuf`]) for aligned IO when `O_DIRECT` was asked for, else the buffered one.
    pub fn fd_for(&self, offset: u64, len: u64) -> KernelIo {
        match &self.direct {
            Some(d) if direct_aligned(offset, len) => KernelIo { fd: d.as_raw_fd(), direct: true },
            _ => KernelIo { fd: self.file.as_raw_fd(), direct: false },
        }
    }

    /// Checks a range (and, for writes, that the export is writable) before IO is submitted elsewhere.
    pub fn check_io(&self, offset: u64, len: u64, write: bool) -> Result<(), StorageError> {
        if write && (self.read_only || self.writes_stopped.load(std::sync::atomic::Ordering::Acquire)) {
            return Err(StorageError::ReadOnly);
        }
        check(self.size, offset, len)
    }

    /// Zeroes a range with `fallocate(mode | KEEP_SIZE)` (`op` names it in errors), or by writing zeroes
    /// where the file system lacks that mode.
    #[allow(unsafe_code)] // fallocate(2) has no safe wrapper in std; see the SAFETY comment.
    fn zero_range(&self, mode: libc::c_int, op: &'static str, offset: u64, len: u64) -> Result<(), StorageError> {
        self.check_io(offset, len, true)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: fallocate on a descriptor we own, with plain integer arguments.
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            return Ok(());
        }
        match io::Error::last_os_error() {
            e if unsupported(&e) => self.write_zero_bytes(offset, len),
            source => Err(StorageError::Io { op, source }),
        }
    }

    fn write_zero_bytes(&self, offset: u64, len: u64) -> Result<(), StorageError> {
        const CHUNK: usize = 1 << 20;
        let zeroes = vec![0u8; CHUNK.min(len as usize)];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            self.file
                .write_all_at(&zeroes[..n], offset + done)
                .map_err(|source| StorageError::Io { op: "write_zeroes", source })?;
            done += n as u64;
        }
        Ok(())
    }
}

/// Errors after which a `fallocate` mode is simply not available here (fall back to writing zeroes).
fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) | Some(libc::ENODEV))
}

impl Storage for FileStorage {
    fn size(&self) -> u64 {
        self.size
    }
    fn allocation(&self, extents: &mut Extents) -> Result<(), StorageError> {
        use rustix::fs::{seek, SeekFrom};
        use rustix::io::Errno;
        let end = extents.next_offset() + extents.remaining();
        check(self.size, extents.next_offset(), extents.remaining())?;
        let err = |op, e: Errno| StorageError::Io { op, source: io::Error::from_raw_os_error(e.raw_os_error()) };
        // Errors after which the file system cannot tell (the rest is reported as data).
        let unknown = |e: Errno| matches!(e, Errno::INVAL | Errno::OPNOTSUPP | Errno::NOSYS);
        while extents.wants_more() {
            let pos = extents.next_offset();
            let data = match seek(&self.file, SeekFrom::Data(pos)) {
                Ok(d) => d.max(pos),
                // No data from `pos` to the end of the file: a hole (reads as zeroes) up to `end`.
                Err(Errno::NXIO) => end,
                Err(e) if unknown(e) => {
                    extents.push(end - pos, 0);
                    return Ok(());
                }
                Err(e) => return Err(err("lseek(SEEK_DATA)", e)),
            };
            if data > pos {
                let more = extents.push(data.min(end) - pos, STATE_HOLE | STATE_ZERO);
                if !more || data >= end {
                    return Ok(());
                }
            }
            let hole = match seek(&self.file, SeekFrom::Hole(data)) {
                Ok(h) => h,
                Err(Errno::NXIO) => end,
                Err(e) if unknown(e) => end,
                Err(e) => return Err(err("lseek(SEEK_HOLE)", e)),
            };
            // Data up to the next hole; a file system that answers no further than `data` (none does)
            // gets the rest reported as data rather than a loop.
            let to = if hole > data { hole.min(end) } else { end };
            if !extents.push(to - data, 0) {
                return Ok(());
            }
        }
        Ok(())
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn file_id(&self) -> Option<(u64, u64)> {
        Some(self.id)
    }
    fn device_number(&self) -> Option<u64> {
        match self._lock.key {
            HeldKey::Device(rdev) => Some(rdev),
            HeldKey::Inode(_) => None,
        }
    }
    fn stop_writes(&self) {
        self.writes_stopped.store(true, std::sync::atomic::Ordering::Release);
    }
    fn file_size_now(&self) -> Option<u64> {
        // A block device's end too (an LV extended under the export): before, only a regular file's
        // length was read, and a reload kept a resized device at its old size.
        size_now(&self.file, &self.file.metadata().ok()?).ok()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError> {
        check(self.size, offset, buf.len() as u64)?;
        let err = |source| StorageError::Io { op: "read", source };
        match &self.direct {
            Some(d) if direct_aligned(offset, buf.len() as u64) => {
                let mut a = AlignedBuf::zeroed(buf.len());
                d.read_exact_at(a.as_mut_slice(), offset).map_err(err)?;
                buf.copy_from_slice(a.as_slice());
                Ok(())
            }
            _ => self.file.read_exact_at(buf, offset).map_err(err),
        }
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), StorageError> {
        self.check_io(offset, buf.len() as u64, true)?;
        let err = |source| StorageError::Io { op: "write", source };
        match &self.direct {
            Some(d) if direct_aligned(offset, buf.len() as u64) => {
                d.write_all_at(AlignedBuf::from_slice(buf).as_slice(), offset).map_err(err)
            }
            _ => self.file.write_all_at(buf, offset).map_err(err),
        }
    }
    fn kernel_io(&self, offset: u64, len: u64, write: bool) -> Result<Option<KernelIo>, StorageError> {
        self.check_io(offset, len, write)?;
        Ok(Some(self.fd_for(offset, len)))
    }
    fn flush(&self) -> Result<(), StorageError> {
        if self.read_only {
            return Ok(());
        }
        // One at a time: of two syncs at once, Linux reports a writeback error to one only, and the
        // other, which began before the error was kept, would succeed. (Under the io_uring engine the
        // ring runs this file's syncs instead, one at a time too: this is not called beside them.)
        let _one = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = self.sync_error() {
            return Err(e);
        }
        self.file.sync_data().map_err(|source| {
            self.sync_failed(source.raw_os_error().unwrap_or(libc::EIO));
            StorageError::Io { op: "fdatasync", source }
        })
    }
    fn sync_failed(&self, errno: i32) {
        use std::sync::atomic::Ordering;
        let _ = self.sync_errno.compare_exchange(0, errno.max(1), Ordering::AcqRel, Ordering::Acquire);
    }
    fn sync_error(&self) -> Option<StorageError> {
        match self.sync_errno.load(std::sync::atomic::Ordering::Acquire) {
            0 => None,
            e => Some(StorageError::SyncFailedBefore(io::Error::from_raw_os_error(e))),
        }
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), StorageError> {
        // Punch a hole (reads return zeroes, space is freed). Trim is advisory in NBD, but we promise
        // zeroes afterwards either way, so the fallback writes them.
        self.zero_range(libc::FALLOC_FL_PUNCH_HOLE, "fallocate(punch hole)", offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), StorageError> {
        self.zero_range(libc::FALLOC_FL_ZERO_RANGE, "fallocate(zero range)", offset, len)
    }
}

const PAGE: u64 = 1 << 20;

/// RAM storage in 1 MiB pages, each behind its own lock: a handle on the RAM (its pages, shared) with a write
/// gate of its own (`read_only`, [`Storage::stop_writes`]). The RAM is the export's only copy of its
/// data, so a reload that replaces a memory export hands the new one the same RAM through a new handle
/// ([`Storage::share_bytes`]): stopping one handle's writes (the old export's, made read-only) leaves
/// the other's gate as it is, so that the export made writable again by a later reload writes the same
/// bytes while the connections of the stopped handle stay refused. Until 2026-12-06 the gate was the
/// RAM's: an export made read-only could only be given a new, empty RAM when made writable again.
pub struct MemStorage {
    ram: std::sync::Arc<MemPages>,
    read_only: bool,
    /// Changes are refused from now on ([`Storage::stop_writes`]).
    writes_stopped: std::sync::atomic::AtomicBool,
}

/// The bytes of a [`MemStorage`], shared by its handles.
struct MemPages {
    size: u64,
    pages: Vec<Mutex<Option<Box<[u8]>>>>,
}

impl MemStorage {
    /// `size` bytes of zeroes. Pages are allocated on first write, so this costs one empty slot per MiB.
    pub fn new(size: u64) -> MemStorage {
        let n = size.div_ceil(PAGE) as usize;
        MemStorage {
            ram: std::sync::Arc::new(MemPages { size, pages: (0..n).map(|_| Mutex::new(None)).collect() }),
            read_only: false,
            writes_stopped: Default::default(),
        }
    }

    /// The same, refusing changes ([`StorageError::ReadOnly`]) when `read_only`, as a read-only file
    /// export does: the protocol layer refuses a client's writes, and this refuses everyone else's (the
    /// probe's).
    pub fn with_read_only(mut self, read_only: bool) -> MemStorage {
        self.read_only = read_only;
        self
    }

    fn writable(&self) -> Result<(), StorageError> {
        if self.read_only || self.writes_stopped.load(std::sync::atomic::Ordering::Acquire) {
            return Err(StorageError::ReadOnly);
        }
        Ok(())
    }

    fn for_pages(&self, offset: u64, len: u64, mut f: impl FnMut(&mut Option<Box<[u8]>>, usize, usize, usize)) {
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let page = (pos / PAGE) as usize;
            let in_page = (pos % PAGE) as usize;
            let n = ((PAGE - pos % PAGE).min(end - pos)) as usize;
            let mut g = self.ram.pages[page].lock().unwrap_or_else(|p| p.into_inner());
            f(&mut g, in_page, n, (pos - offset) as usize);
            pos += n as u64;
        }
    }
}

impl Storage for MemStorage {
    fn size(&self) -> u64 {
        self.ram.size
    }
    fn allocation(&self, extents: &mut Extents) -> Result<(), StorageError> {
        check(self.ram.size, extents.next_offset(), extents.remaining())?;
        while extents.wants_more() {
            let pos = extents.next_offset();
            let page = (pos / PAGE) as usize;
            let in_page = PAGE - pos % PAGE;
            // A page never written (or zeroed whole) is not allocated and reads as zeroes.
            let allocated = self.ram.pages[page].lock().unwrap_or_else(|p| p.into_inner()).is_some();
            let flags = if allocated { 0 } else { STATE_HOLE | STATE_ZERO };
            if !extents.push(in_page, flags) {
                break;
            }
        }
        Ok(())
    }
    fn inline_max_bytes(&self) -> u64 {
        MEMORY_INLINE_MAX
    }
    fn stop_writes(&self) {
        self.writes_stopped.store(true, std::sync::atomic::Ordering::Release);
    }
    fn share_bytes(&self, read_only: bool) -> Option<std::sync::Arc<dyn Storage>> {
        Some(std::sync::Arc::new(MemStorage {
            ram: std::sync::Arc::clone(&self.ram),
            read_only,
            writes_stopped: Default::default(),
        }))
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError> {
        check(self.ram.size, offset, buf.len() as u64)?;
        self.for_pages(offset, buf.len() as u64, |p, at, n, b| match p {
            Some(page) => buf[b..b + n].copy_from_slice(&page[at..at + n]),
            None => buf[b..b + n].fill(0),
        });
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), StorageError> {
        self.writable()?;
        check(self.ram.size, offset, buf.len() as u64)?;
        self.for_pages(offset, buf.len() as u64, |p, at, n, b| {
            let page = p.get_or_insert_with(|| vec![0u8; PAGE as usize].into_boxed_slice());
            page[at..at + n].copy_from_slice(&buf[b..b + n]);
        });
        Ok(())
    }
    fn flush(&self) -> Result<(), StorageError> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), StorageError> {
        self.write_zeroes(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), StorageError> {
        self.writable()?;
        check(self.ram.size, offset, len)?;
        self.for_pages(offset, len, |p, at, n, _| {
            if let Some(page) = p {
                if at == 0 && n == PAGE as usize {
                    *p = None;
                } else {
                    page[at..at + n].fill(0);
                }
            }
        });
        Ok(())
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_testkit::LoopFs;

    fn exercise(s: &dyn Storage) {
        let size = s.size();
        let data: Vec<u8> = (0..3 * PAGE as usize / 2).map(|i| (i * 7 % 251) as u8).collect();
        s.write_at(&data, PAGE / 2).unwrap();
        let mut back = vec![0u8; data.len()];
        s.read_at(&mut back, PAGE / 2).unwrap();
        assert_eq!(back, data);
        s.write_zeroes(PAGE / 2 + 10, 100).unwrap();
        s.read_at(&mut back[..200], PAGE / 2).unwrap();
        assert!(back[10..110].iter().all(|&b| b == 0) && back[110] == data[110]);
        s.flush().unwrap();
        let mut one = [0u8; 1];
        assert!(matches!(s.read_at(&mut one, size), Err(StorageError::OutOfRange { .. })));
        assert!(matches!(s.write_at(&one, u64::MAX), Err(StorageError::OutOfRange { .. })));
        assert_eq!(StorageError::OutOfRange { offset: 0, len: 0, size: 0 }.kind(), ErrorKind::InvalidRequest);
    }

    #[test]
    fn os_errors_map_to_kinds() {
        let os = |code| StorageError::Io { op: "write", source: io::Error::from_raw_os_error(code) };
        for (code, kind) in [
            (libc::ENOSPC, ErrorKind::NoSpace),
            (libc::EDQUOT, ErrorKind::NoSpace),
            (libc::EFBIG, ErrorKind::NoSpace),
            (libc::ENOMEM, ErrorKind::Exhausted),
            (libc::EIO, ErrorKind::Io),
            (libc::EBADF, ErrorKind::Io),
        ] {
            assert_eq!(os(code).kind(), kind, "os error {code}");
        }
        assert_eq!(StorageError::ReadOnly.kind(), ErrorKind::ReadOnly);
        let other = StorageError::Io { op: "read", source: io::Error::other("no code") };
        assert_eq!(other.kind(), ErrorKind::Io);
    }

    /// The extents `storage` reports for `length` bytes at `offset` (REQ_ONE if `one`).
    fn allocation_of(storage: &dyn Storage, offset: u64, length: u32, one: bool) -> Vec<(u32, u32)> {
        use rein_proto::nbd::{Request, RequestKind};
        let kind = RequestKind::BlockStatus { one };
        let request = Request { handle: 1, kind, offset, length, fua: false, no_hole: false, tag: None };
        let mut extents = Extents::new(&request);
        storage.allocation(&mut extents).unwrap();
        extents.descriptors().to_vec()
    }

    /// A sparse file: its holes (`lseek`'s, aligned here to 64 KiB, a multiple of any file system's block)
    /// as HOLE|ZERO, its data as 0, from any offset; REQ_ONE one run; a range past the end refused.
    #[test]
    fn a_sparse_file_reports_its_holes_and_data() {
        const K64: u64 = 64 << 10;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse.img");
        let f = File::create(&path).unwrap();
        f.set_len(4 * PAGE).unwrap();
        f.write_all_at(&vec![7u8; K64 as usize], 0).unwrap();
        f.write_all_at(&vec![9u8; 2 * K64 as usize], PAGE).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let s = FileStorage::open(&path, None, true).unwrap();
        let hole = STATE_HOLE | STATE_ZERO;
        let (a, b) = (K64 as u32, PAGE as u32);
        assert_eq!(allocation_of(&s, 0, 4 * b, false), [(a, 0), (b - a, hole), (2 * a, 0), (3 * b - 2 * a, hole)]);
        assert_eq!(allocation_of(&s, K64 / 2, b, false), [(a / 2, 0), (b - a, hole), (a / 2, 0)]);
        assert_eq!(allocation_of(&s, 2 * PAGE, 100, false), [(100, hole)]);
        assert_eq!(allocation_of(&s, K64, 4 * b - a, true), [(b - a, hole)]);
        let mut e = Extents::new(&rein_proto::nbd::Request {
            handle: 1,
            kind: rein_proto::nbd::RequestKind::BlockStatus { one: false },
            offset: 4 * PAGE - 1,
            length: 2,
            fua: false,
            no_hole: false,
            tag: None,
        });
        assert!(matches!(s.allocation(&mut e), Err(StorageError::OutOfRange { .. })));
    }

    /// A block device (a loop device over a sparse file, whose holes the device does not show): all data,
    /// never a hole. Needs root (a loop device); elsewhere skipped.
    #[test]
    fn a_block_device_reports_all_data() {
        let dir = tempfile::Builder::new().prefix("rein-storage-alloc-").tempdir().unwrap();
        let Some(fs) = loop_fs(dir.path()) else { return };
        let s = FileStorage::open(Path::new(fs.dev()), None, true).expect("the device");
        let len = s.size().min(64 * PAGE) as u32;
        assert_eq!(allocation_of(&s, 0, len, false), [(len, 0)]);
    }

    /// RAM: pages never written (or zeroed whole) are holes, written ones data.
    #[test]
    fn memory_reports_unwritten_pages_as_holes() {
        let m = MemStorage::new(4 * PAGE);
        let hole = STATE_HOLE | STATE_ZERO;
        let p = PAGE as u32;
        assert_eq!(allocation_of(&m, 0, 4 * p, false), [(4 * p, hole)]);
        m.write_at(b"x", PAGE + 10).unwrap();
        assert_eq!(allocation_of(&m, 0, 4 * p, false), [(p, hole), (p, 0), (2 * p, hole)]);
        assert_eq!(allocation_of(&m, PAGE + 5, 10, false), [(10, 0)]);
        assert_eq!(allocation_of(&m, 0, 4 * p, true), [(p, hole)]);
        m.write_zeroes(PAGE, PAGE).unwrap();
        assert_eq!(allocation_of(&m, 0, 4 * p, false), [(4 * p, hole)]);
    }

    #[test]
    fn memory_storage_round_trips() {
        let m = MemStorage::new(4 * PAGE);
        exercise(&m);
        assert!(m.kernel_io(0, 1, false).unwrap().is_none(), "RAM has no descriptor");
        assert_eq!(m.inline_max_bytes(), MEMORY_INLINE_MAX);
        let ro = MemStorage::new(4 * PAGE).with_read_only(true);
        assert!(ro.read_only());
        assert!(matches!(ro.write_at(&[1], 0), Err(StorageError::ReadOnly)));
        assert!(matches!(ro.write_zeroes(0, 1), Err(StorageError::ReadOnly)));
        assert!(matches!(ro.trim(0, 1), Err(StorageError::ReadOnly)));
        let mut b = [7u8; 1];
        ro.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [0]);
    }

    /// A handle shared from a memory storage ([`Storage::share_bytes`]) serves the same bytes behind a
    /// write gate of its own: writable though the first one's writes were stopped, read-only if asked,
    /// and stopping it leaves the first one's gate alone. A file shares nothing (it is opened again).
    #[test]
    fn a_shared_memory_handle_has_its_own_write_gate() {
        let m = MemStorage::new(2 * PAGE);
        m.write_at(b"keep", 0).unwrap();
        m.stop_writes();
        assert!(matches!(m.write_at(b"late", 0), Err(StorageError::ReadOnly)));
        let ro = m.share_bytes(true).expect("RAM is shared");
        assert!(ro.read_only() && matches!(ro.write_at(b"x", 0), Err(StorageError::ReadOnly)));
        let rw = ro.share_bytes(false).expect("RAM is shared");
        let mut b = [0u8; 4];
        rw.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"keep");
        rw.write_at(b"more", PAGE).unwrap();
        rw.stop_writes();
        let again = rw.share_bytes(false).unwrap();
        again.write_at(b"last", 4).unwrap();
        m.read_at(&mut b, PAGE).unwrap();
        assert_eq!(&b, b"more", "one RAM");
        m.read_at(&mut b, 4).unwrap();
        assert_eq!(&b, b"last");
        assert!(matches!(m.write_at(b"late", 0), Err(StorageError::ReadOnly)), "the first stays stopped");
        let dir = tempfile::Builder::new().prefix("rein-storage-share-").tempdir().unwrap();
        let f = FileStorage::open(&dir.path().join("f.img"), Some(PAGE), false).unwrap();
        assert!(f.share_bytes(false).is_none());
    }

    /// Issue 12: a missing file without a size is not created; a directory, a FIFO or a character device
    /// is refused before it is opened (a FIFO's open would block); a block device would be served.
    #[test]
    fn only_regular_files_and_block_devices_are_served() {
        let dir = tempfile::Builder::new().prefix("rein-storage-").tempdir().unwrap();
        let missing = dir.path().join("typo.img");
        assert!(matches!(FileStorage::open(&missing, None, false), Err(StorageError::Missing)));
        assert!(!missing.exists(), "nothing created without a size");
        let e = FileStorage::open(&missing, Some(1 << 20), true).map(|_| ()).unwrap_err();
        assert_eq!(e.to_string(), "does not exist (a read-only export is not created)");
        assert!(!missing.exists(), "nothing created for a read-only export");
        // A device's name mistyped beside a size is not made a regular file in /dev (a tmpfs).
        let typo = Path::new("/dev/rein-no-such-disk");
        for (size, read_only) in [(Some(1 << 20), false), (None, false), (Some(1 << 20), true)] {
            let e = FileStorage::open(typo, size, read_only).map(|_| ()).unwrap_err();
            assert!(matches!(e, StorageError::MissingDevice), "{e}");
            assert!(!typo.exists(), "nothing created in /dev");
        }
        assert!(matches!(FileStorage::open(dir.path(), None, false), Err(StorageError::NotAFile("a directory"))));
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success(), "mkfifo");
        assert!(matches!(FileStorage::open(&fifo, Some(PAGE), false), Err(StorageError::NotAFile("a FIFO"))));
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(matches!(FileStorage::open(&sock, None, false), Err(StorageError::NotAFile("a socket"))));
        assert!(matches!(
            FileStorage::open(Path::new("/dev/null"), None, false),
            Err(StorageError::NotAFile("a character device"))
        ));
        let e = StorageError::NotAFile("a directory").to_string();
        assert_eq!(e, "is a directory, not a regular file or a block device");
    }

    /// One writer per file (module comment): within this process the storages of one file share its
    /// lock (a reload's second open works, also after the first is gone); a holder elsewhere (here a
    /// descriptor of its own, as another process's would be) keeps a writer out while it holds the file
    /// at all, and a reader out while it holds it for writing.
    #[test]
    fn a_file_held_elsewhere_is_refused() {
        // A lock just released here can still be held for a moment: a child that another test of this
        // process is starting (losetup, mkfs) has a copy of every descriptor from its fork to its exec,
        // and a flock belongs to the open file, not to the descriptor. So what must succeed once a holder
        // is gone is tried again for a while (this test failed once so, at the exclusive flock below).
        fn eventually<T>(mut f: impl FnMut() -> Result<T, StorageError>) -> T {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                match f() {
                    Err(StorageError::InUse(_)) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(5))
                    }
                    r => return r.unwrap_or_else(|e| panic!("{e}")),
                }
            }
        }
        let dir = tempfile::Builder::new().prefix("rein-storage-lock-").tempdir().unwrap();
        let path = dir.path().join("a.img");
        let first = FileStorage::open(&path, Some(4 * PAGE), false).unwrap();
        let second = FileStorage::open(&path, None, false).unwrap();
        drop(first);
        let ro = FileStorage::open(&path, None, true).unwrap();
        drop((second, ro));
        // Another holder, for reading: readers share it, a writer is refused.
        let other = File::open(&path).unwrap();
        eventually(|| flock(&other, false));
        let ro = FileStorage::open(&path, None, true).unwrap();
        let e = FileStorage::open(&path, None, false).err().expect("a writer beside a reader elsewhere");
        assert!(matches!(e, StorageError::InUse("")), "{e}");
        assert_eq!(e.kind(), ErrorKind::Io);
        // ... and a reader here cannot become a writer while it holds on.
        assert!(matches!(FileStorage::open(&path, None, false), Err(StorageError::InUse(_))));
        drop((ro, other));
        // Another holder for writing keeps even a reader out.
        let other = File::open(&path).unwrap();
        eventually(|| flock(&other, true));
        let e = FileStorage::open(&path, None, true).err().expect("a reader beside a writer elsewhere");
        assert!(
            e.to_string()
                .starts_with("is in use by another process (a rein serve or rein probe that has it open for writing)"),
            "{e}"
        );
        drop(other);
        eventually(|| FileStorage::open(&path, None, false)); // free again once the other is gone
    }

    /// An ext4 of 16 MiB on a loop device over `dir/dev.img`, mount point `dir/mount point` (a space, as
    /// the kernel's mountinfo escapes it); unmounted, detached and removed when dropped. `None`, said,
    /// where it cannot be made (needs root, loop devices and ext4).
    fn loop_fs(dir: &Path) -> Option<LoopFs> {
        LoopFs::make(&dir.join("dev.img"), 16 << 20, "mkfs.ext4", &dir.join("mount point"))
    }

    /// A writable block device is claimed from the kernel (module comment, "One writer per file"): the
    /// device of a mounted file system is refused for writing (it used to be served, and a client's
    /// writes overwrote the file system under the mount), a read-only export of it is not; once served,
    /// it cannot be mounted, nor opened for writing through another device node of it (the `flock`s of
    /// two nodes are two locks: a second server through another node was let in). Needs root (a loop
    /// device, mount, mknod); elsewhere skipped.
    #[test]
    fn a_block_device_in_use_by_the_system_is_not_written() {
        let dir = tempfile::Builder::new().prefix("rein-storage-claim-").tempdir().unwrap();
        let Some(fs) = loop_fs(dir.path()) else { return };
        let dev = Path::new(fs.dev());
        assert!(fs.mount(), "mount {}", fs.dev());
        let e = FileStorage::open(dev, None, false).err().expect("the device of a mounted file system, writable");
        // Named by where it is mounted (the mount point has a space: `\040` in the kernel's mountinfo).
        let mounted = format!("is a block device in use: it is mounted at {}. The kernel refused", fs.mnt().display());
        assert!(matches!(e, StorageError::DeviceBusy(_)) && e.to_string().starts_with(&mounted), "{e}");
        let ro = FileStorage::open(dev, None, true).expect("read-only beside the mount");
        drop(ro);
        // --check-config's inspection says the same, and leaves no claim behind.
        let e = FileStorage::inspect(dev, None, false).expect_err("the device of a mounted file system, inspected");
        assert!(matches!(e, StorageError::DeviceBusy(_)) && e.to_string().starts_with(&mounted), "{e}");
        assert!(matches!(FileStorage::inspect(dev, None, true), Ok(Inspected::Present(n)) if n == 16 << 20));
        fs.umount();
        assert!(matches!(FileStorage::inspect(dev, None, false), Ok(Inspected::Present(_))));
        let served = FileStorage::open(dev, None, false).expect("the device once unmounted");
        assert!(!fs.mount(), "mounted while it is served for writing");
        // A second device node of the same device (as a container's /dev, or a mknod): another
        // process's claim through it (here an O_EXCL open of this one's own, as another process's is;
        // this process's storages share one claim, `a_block_device_is_one_claim_through_any_node_of_it`).
        let other = dir.path().join("node");
        fs.loop_dev().node(&other);
        let e = exclusive_open(&other, &std::fs::metadata(&other).unwrap()).expect_err("a claim through another node");
        // No mount, swap or stacked device: a process's claim, here this one's (`served`), which is left out
        // of the processes named (the asker has the device open itself), so the tools that list them are
        // named, with the device's own node (`fuser` and `lsof` of the other node do not list a process that
        // opened this one).
        let claimed = format!("fuser -v {0} or lsof {0} lists those that have it open", fs.dev());
        assert!(matches!(e, StorageError::DeviceBusy(_)) && e.to_string().contains(&claimed), "{e}");
        // A reload's second open through the same path shares the claim.
        let again = FileStorage::open(dev, None, false).expect("the same device again, same path");
        drop((served, again));
        assert!(FileStorage::open(&other, None, false).is_ok(), "free again once released");
        assert!(fs.mount(), "mountable again once released");
    }

    /// Within this process a block device is one lock and one claim through any node of it (module
    /// comment, "One writer per file"): a reload that points a writable export at another node of its
    /// device (`/dev/loop0` to a node made with mknod) opens it while the old storage, still held by its
    /// connections, has the claim, and used to be refused as a device `in use by the system` (its own
    /// claim, EBUSY). The claim lasts while either storage lives, keeps other claimers out through any
    /// node, and goes with the last. Needs root (a loop device, mount, mknod); elsewhere skipped.
    #[test]
    fn a_block_device_is_one_claim_through_any_node_of_it() {
        let dir = tempfile::Builder::new().prefix("rein-storage-nodes-").tempdir().unwrap();
        let Some(fs) = loop_fs(dir.path()) else { return };
        let dev = Path::new(fs.dev());
        let other = dir.path().join("other");
        fs.loop_dev().node(&other);
        let first = FileStorage::open(dev, None, false).expect("the device");
        let second = FileStorage::open(&other, None, false).expect("the device again, through another node");
        let ro = FileStorage::open(&other, None, true).expect("read-only, through the other node");
        drop(first);
        assert!(!fs.mount(), "mounted while the second storage is open");
        let claimer = |p: &Path| OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(p);
        for p in [dev, &other] {
            let e = claimer(p).expect_err("another claimer while served");
            assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "{}: {e}", p.display());
        }
        drop((second, ro));
        assert!(fs.mount(), "mountable once the last storage is gone");
    }

    /// An image that a loop device is attached to is refused for writing (it was served, and a client's
    /// writes overwrote a file system mounted from the device), whether or not the device is mounted; a
    /// read-only export of it is not, and once the device is detached the image is served. Needs root
    /// (a loop device); elsewhere skipped.
    #[test]
    fn the_backing_file_of_a_loop_device_is_not_written() {
        let dir = tempfile::Builder::new().prefix("rein-storage-loop-").tempdir().unwrap();
        let Some(fs) = loop_fs(dir.path()) else { return };
        let img = dir.path().join("dev.img");
        assert!(fs.mount(), "mount {}", fs.dev());
        let e = FileStorage::open(&img, None, false).err().expect("the image under a mounted loop device");
        assert!(matches!(&e, StorageError::LoopBacking(d) if d == fs.dev()), "{e}");
        let e = FileStorage::inspect(&img, None, false).expect_err("--check-config's inspection");
        assert!(matches!(&e, StorageError::LoopBacking(d) if d == fs.dev()), "{e}");
        assert!(FileStorage::inspect(&img, None, true).is_ok());
        fs.umount();
        let e = FileStorage::open(&img, None, false).err().expect("the image of an attached loop device");
        assert!(e.to_string().starts_with(&format!("is the backing file of loop device {}", fs.dev())), "{e}");
        assert!(FileStorage::open(&img, None, true).is_ok(), "read-only beside the loop device");
        fs.detach_keeping_image();
        assert!(FileStorage::open(&img, None, false).is_ok(), "served once the device is detached");
    }

    /// A new image (module comment, "A new image"): the open creates it at its size, syncs it, then
    /// syncs its directory (`.` for a bare name), and a failure of that sync fails the open, naming the
    /// step. The directory's sync is seen through a stand-in for `durable::sync_directory`.
    #[test]
    fn a_new_image_is_synced_then_its_directory() {
        use std::path::PathBuf;
        let dir = tempfile::Builder::new().prefix("rein-storage-new-").tempdir().unwrap();
        let path = dir.path().join("new.img");
        let s = FileStorage::open(&path, Some(2 * PAGE), false).unwrap();
        assert_eq!((s.size(), std::fs::metadata(&path).unwrap().len()), (2 * PAGE, 2 * PAGE));
        let create = |name: &str| OpenOptions::new().write(true).create_new(true).open(dir.path().join(name)).unwrap();
        let cases: [(PathBuf, PathBuf); 2] = [(path.clone(), dir.path().into()), ("bare.img".into(), ".".into())];
        for (i, (path, parent)) in cases.into_iter().enumerate() {
            let file = create(&format!("settled-{i}.img"));
            let mut synced = Vec::new();
            settle_new(&file, &path, Some(PAGE), |d: &Path| {
                synced.push(d.to_path_buf());
                Ok(())
            })
            .unwrap();
            assert_eq!(synced, [parent], "{}: its directory synced once", path.display());
            assert_eq!(file.metadata().unwrap().len(), PAGE, "sized to its size");
        }
        let file = create("failing.img");
        let e =
            settle_new(&file, &path, Some(PAGE), |_: &Path| Err(io::Error::from_raw_os_error(libc::EIO))).unwrap_err();
        assert_eq!(e.to_string(), "fsync of the new image's directory failed: Input/output error (os error 5)");
        assert_eq!(e.kind(), ErrorKind::Io);
    }

    /// A new image is its owner's and its group's only ([`NEW_IMAGE_MODE`] under the umask; before, 0666:
    /// 0644 under the usual umask, every local user could read a tenant's disk), and a creation that fails
    /// says `create failed`, not `open failed` (the directory, not a file, refused it).
    #[test]
    fn a_new_image_is_not_readable_by_others_and_its_failure_says_create() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new().prefix("rein-storage-mode-").tempdir().unwrap();
        let path = dir.path().join("new.img");
        FileStorage::open(&path, Some(PAGE), false).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o007, 0, "{mode:o}: nothing for others");
        assert_eq!(mode & 0o600, 0o600, "{mode:o}: its owner reads and writes it");
        let e = FileStorage::open(&dir.path().join("no-dir/new.img"), Some(PAGE), false).err().unwrap();
        assert_eq!(e.to_string(), "create failed: No such file or directory (os error 2)");
        let e = FileStorage::open(&dir.path().join("gone.img"), None, false).err().unwrap();
        assert!(matches!(e, StorageError::Missing), "{e}");
    }

    /// Every writable open of an image file it finds syncs the image's directory (module comment, "A new
    /// image": a start killed before the new image's directory was synced); a read-only open does not,
    /// nor does an open that creates the image sync it twice. A failure fails the open, naming it.
    #[test]
    fn an_image_found_is_served_after_its_directory_is_synced() {
        let dir = tempfile::Builder::new().prefix("rein-storage-found-").tempdir().unwrap();
        let path = dir.path().join("found.img");
        let synced = std::cell::RefCell::new(Vec::new());
        let record = |d: &Path| {
            synced.borrow_mut().push(d.to_path_buf());
            Ok(())
        };
        let rw = FileMode { read_only: false, ..FileMode::default() };
        drop(FileStorage::open_in(&path, Some(PAGE), rw, &record).unwrap());
        assert_eq!(synced.take(), [dir.path()], "created: its directory synced once");
        drop(FileStorage::open_in(&path, Some(PAGE), rw, &record).unwrap());
        assert_eq!(synced.take(), [dir.path()], "found: its directory synced");
        let ro = FileMode { read_only: true, ..FileMode::default() };
        drop(FileStorage::open_in(&path, None, ro, &record).unwrap());
        assert!(synced.take().is_empty(), "read only: nothing to make durable");
        let failing = |_: &Path| Err(io::Error::from_raw_os_error(libc::EIO));
        let Err(e) = FileStorage::open_in(&path, None, rw, &failing) else { panic!("a failed sync was ignored") };
        assert_eq!(e.to_string(), "fsync of the image's directory failed: Input/output error (os error 5)");
        assert!(path.exists(), "an image found is never removed");
    }

    #[test]
    fn file_storage_round_trips() {
        // Removed with its files when dropped, also when an assertion fails.
        let dir = tempfile::Builder::new().prefix("rein-storage-").tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let s = FileStorage::open(&path, Some(4 * PAGE), false).unwrap();
        exercise(&s);
        drop(s);
        assert!(matches!(
            FileStorage::open(&path, Some(2 * PAGE), false),
            Err(StorageError::SizeMismatch { actual, configured }) if actual == 4 * PAGE && configured == 2 * PAGE
        ));
        let ro = FileStorage::open(&path, None, true).unwrap();
        assert!(matches!(ro.write_at(&[1], 0), Err(StorageError::ReadOnly)));
        assert_eq!(ro.kernel_io(0, 1, true).unwrap_err().kind(), ErrorKind::ReadOnly);
        assert!(ro.kernel_io(0, 1, false).unwrap().is_some_and(|k| !k.direct));
        assert!(matches!(ro.kernel_io(4 * PAGE, 1, false), Err(StorageError::OutOfRange { .. })));
    }

    /// How many of the first `len` bytes' pages of `file` are in the page cache (mincore(2) on a shared
    /// read-only mapping, which faults nothing in).
    #[allow(unsafe_code)] // mmap(2), mincore(2) and munmap(2) have no safe wrapper in std; see SAFETY.
    fn resident_pages(file: &File, len: usize) -> usize {
        let page = 4096usize;
        let mut vec = vec![0u8; len.div_ceil(page)];
        // SAFETY: a fresh read-only mapping of `len` bytes of an open file; `vec` has one byte per page
        // of it (the system's page size is 4 KiB here, checked by mincore's EINVAL otherwise); the
        // mapping is never read through and is unmapped before returning.
        unsafe {
            let m = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
            assert_ne!(m, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
            let r = libc::mincore(m, len, vec.as_mut_ptr());
            let err = io::Error::last_os_error();
            libc::munmap(m, len);
            assert_eq!(r, 0, "mincore: {err}");
        }
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    /// `readahead = false` (the dispatcher's stall, [`FileMode::readahead`]): 32 sequential reads of
    /// 32 KiB from a sparse file bring exactly their own 256 pages into the page cache. With the kernel's
    /// readahead the same reads bring more wherever the file system reads ahead (ext4 on this VM:
    /// `read_ahead_kb` 8,192), which shows the check can fail; tmpfs caches no holes, so there it only
    /// checks the bound.
    #[test]
    fn without_readahead_a_read_caches_only_its_own_pages() {
        let dir = tempfile::Builder::new().prefix("rein-storage-").tempdir().unwrap();
        let (read, len) = (32usize << 10, 64usize << 20);
        let mut cached = [0usize; 2];
        for readahead in [true, false] {
            let path = dir.path().join(format!("readahead-{readahead}.img"));
            let mode = FileMode { readahead, ..FileMode::default() };
            let s = FileStorage::open_with(&path, Some(len as u64), mode).unwrap();
            let mut buf = vec![1u8; read];
            for i in 0..32u64 {
                s.read_at(&mut buf, i * read as u64).unwrap();
                assert!(buf.iter().all(|&b| b == 0), "a hole reads as zeroes");
            }
            cached[readahead as usize] = resident_pages(&s.file, len);
        }
        let own = 32 * read / 4096;
        assert!(cached[0] <= own, "without readahead {} pages cached, at most {own} were read", cached[0]);
        if cached[1] > own {
            eprintln!("with readahead: {} pages cached for {own} read", cached[1]);
        } else {
            eprintln!("this file system reads no holes ahead ({} pages cached for {own} read)", cached[1]);
        }
    }
}
