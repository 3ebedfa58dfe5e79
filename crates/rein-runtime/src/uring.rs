//! The io_uring engine: file reads, writes and flushes submitted by the dispatcher task itself.
//!
//! # Model
//! The dispatcher owns one ring with at least D entries (D = requests outstanding at the backend, so the
//! submission queue can never be full). Starting an IO pushes one submission entry; after each round of
//! dispatching the dispatcher calls [`Uring::submit`] (one `io_uring_enter`, no waiting) and then
//! [`Uring::reap`]. Data in the page cache is copied during that very call, so its completion is already
//! there when the dispatcher reaps: no thread hand-off at all, which is what makes this cheaper than
//! tokio's blocking pool by several microseconds per IO. IO that must wait for the device is carried on by
//! the kernel's own workers, which signal an eventfd registered with the ring; the dispatcher's select loop
//! awaits it ([`Uring::eventfd`]) next to its other inputs.
//!
//! The ring works on any storage that offers a descriptor ([`Storage::kernel_io`], which also checks the
//! range and read-only-ness before anything is submitted); it never asks what type the storage is.
//! FLUSH is `fsync` with `IORING_FSYNC_DATASYNC`; a FUA write is a write and then, once it has completed
//! whole, that same sync of its descriptor, both in its one slot (invariant 4), as the `threads` engine
//! runs it (`pwrite`, then `fdatasync`). Not `RWF_DSYNC`, the write and its sync in one operation, which
//! this engine used before: its result does not say which half failed. ENOSPC from it was an allocation
//! failure of the write itself, or the sync's report of an earlier write's failed writeback (a
//! thin-provisioned device, a network file system): the sync's report is made once, so the storage had
//! to keep it ("A failed sync stays failed" in [`crate::storage`]), but could not tell it from the write's
//! own. Kept, a write refused on a full disk would fail every later FLUSH; not kept, a later FLUSH
//! succeeded while the writes acknowledged before it were lost (a loop device over a full file system:
//! 4 MiB written, the FUA write's ENOSPC, then two FLUSHes succeeded and the 4 MiB read back as zeroes).
//! Apart, the write's error is the write's and the sync's the sync's.
//!
//! The syncs of one storage (FLUSHes, FUA writes', and the syncs the dispatcher asks after a FUA trim or
//! write-zeroes) go to the kernel one at a time, the ones that come meanwhile merged into the next
//! (invariant 5), as a disk merges cache flushes. Linux reports a writeback error to one sync of an open
//! file only: `fdatasync` checks the file's error sequence (errseq) against what that open file
//! description last saw and advances it, under the description's lock, so of two syncs at once the
//! first to check takes the error and the other returns 0 (kernel `file_check_and_advance_wb_err`;
//! vfs.rst, "Handling errors during writeback": after an error is reported, later syncs on the same
//! descriptor return 0; three `fdatasync`s at once of a loop device over a full file system: one EIO,
//! two 0). The kernel runs each `IORING_OP_FSYNC` on a worker of its own (an fsync needs a blocking
//! context), so several of one descriptor ran at once, and which completed first was the kernel's
//! choice: until 2026-12-06 a FLUSH whose sync returned 0 in one batch of completions could be
//! acknowledged while the sync that had taken the error of the writes it covers was still to be reaped;
//! and the sync of a FUA trim or write-zeroes, run by the blocking pool beside the ring's, was answered
//! 0 whenever a ring's sync took the error first (`a_sync_beside_a_failing_one_fails_too` in
//! crates/rein/tests/serve_config.rs). Holding a successful answer until the syncs submitted before it
//! had completed would not do: the error goes to whichever checks first, a later sync too, so the hold
//! would have to wait for every sync in flight beside it, which a steady stream of FLUSHes postpones for
//! ever. One at a time, a sync waits behind one at most.
//!
//! A read is done into a buffer with `headroom` spare bytes in front, which the
//! caller fills later (the NBD reply header), so the data is never copied after the kernel wrote it; with
//! `O_DIRECT` (`KernelIo::direct`) the kernel reads into an [`AlignedBuf`] instead and the data is copied
//! once into such a buffer. Trim and write-zeroes are rare and stay on the blocking pool (a FUA one's sync
//! comes to the ring afterwards, as a sync of its own: invariant 5).
//!
//! If the kernel refuses io_uring (old kernel, seccomp, `io_uring_disabled`), [`Uring::new`] fails and the
//! dispatcher falls back to its thread pool, saying so in the log.
//!
//! # Invariants
//! 1. A submitted entry's buffer, and the storage whose descriptor it names, stay in `slots` until its
//!    completion is reaped, so the kernel never reads or writes freed memory or a closed descriptor;
//!    dropping the engine first waits for every entry in flight.
//! 2. A short read or write (the kernel may return fewer bytes) is resubmitted for the rest; zero bytes
//!    before the end is an error (unexpected end of file), never a silent short reply. An operation the
//!    kernel ends with EAGAIN or EINTR (nothing done, try again) is resubmitted as it is, up to
//!    [`MAX_RETRIES`] times, rather than failed with an IO error the storage never had.
//! 3. `inflight` equals the number of occupied slots and never exceeds the ring's size.
//! 4. A FUA write is answered only after its sync: when its write has completed whole, its slot is
//!    submitted again as that sync (`Slot::then_sync`), and its answer is the sync's. A failed write is
//!    answered at once, unsynced; only a failed sync is kept by the storage.
//! 5. At most one sync of a storage is at the kernel (`lines`, one `SyncLine` per storage with a sync
//!    in the ring, so at most as many as slots): a sync that comes while one of its storage runs waits.
//!    When the running one completes, it and the syncs merged into it are answered with its result (a
//!    failure kept by the storage first, "A failed sync stays failed" in [`crate::storage`]); the ones
//!    waiting then go to the kernel as one sync, the first's, the others merged into it. Merging is
//!    sound because each of them arrived before that sync was submitted, so it covers every write any
//!    of them must cover; the descriptors of one storage are of one file, whose data any of them syncs.
//!    A success is the storage's kept error if a sync of it failed before.

// The ring shares buffers and descriptors with the kernel: unsafe by nature (the workspace denies it
// elsewhere). Every block says why it is sound (invariants 1-3 above).
#![allow(unsafe_code)]

use crate::storage::{AlignedBuf, KernelIo, Storage, StorageError};
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// What to do (the dispatcher's [`crate::dispatch::Op`], restricted to what the ring runs).
#[derive(Debug)]
pub enum UringOp {
    /// Read `len` bytes into a new buffer after `headroom` zero bytes.
    Read {
        /// Bytes to read from the operation's offset.
        len: u32,
        /// Zero bytes in front of the data in the completion's buffer, for the caller to fill.
        headroom: usize,
    },
    /// Write `data`; with `fua`, durably (the write, then `fdatasync`: invariant 4).
    Write {
        /// The bytes to write at the operation's offset (copied into an aligned buffer for `O_DIRECT`).
        data: Vec<u8>,
        /// Force unit access: the write completes only once its data is on stable storage.
        fua: bool,
    },
    /// Make completed writes durable (`fdatasync`).
    Flush,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Fsync,
}

enum Buf {
    /// The kernel's bytes start at `at` (a read's headroom comes first).
    Plain {
        vec: Vec<u8>,
        at: usize,
    },
    /// `O_DIRECT`: a read's data is copied after `headroom` bytes when it completes.
    Aligned {
        buf: AlignedBuf,
        headroom: usize,
    },
    Empty,
}

impl Buf {
    /// Where the kernel's bytes start.
    fn ptr(&mut self) -> *mut u8 {
        match self {
            Buf::Plain { vec, at } => vec[*at..].as_mut_ptr(),
            Buf::Aligned { buf, .. } => buf.as_mut_slice().as_mut_ptr(),
            Buf::Empty => std::ptr::null_mut(),
        }
    }

    /// What a completed read returns: the headroom, then the data.
    fn into_read(self) -> Vec<u8> {
        match self {
            Buf::Plain { vec, .. } => vec,
            Buf::Aligned { buf, headroom } => {
                let mut v = vec![0u8; headroom + buf.len()];
                v[headroom..].copy_from_slice(buf.as_slice());
                v
            }
            Buf::Empty => Vec::new(),
        }
    }
}

struct Slot<T> {
    /// Keeps the descriptor open while the kernel uses it (invariant 1).
    _storage: Arc<dyn Storage>,
    fd: RawFd,
    kind: Kind,
    buf: Buf,
    offset: u64,
    len: usize,
    done: usize,
    /// A FUA write: once written whole, the slot is submitted again as a sync (invariant 4).
    then_sync: bool,
    token: T,
    /// Resubmissions after EAGAIN or EINTR (invariant 2).
    retries: u8,
}

/// How many times an operation ended with EAGAIN or EINTR is resubmitted before the error is returned.
pub const MAX_RETRIES: u8 = 16;

/// The syncs of one storage in the ring (invariant 5).
#[derive(Debug)]
struct SyncLine {
    /// The slot whose sync is at the kernel.
    running: usize,
    /// Slots merged into it (they came before it was submitted): answered with its result.
    merged: Vec<usize>,
    /// Slots that came while it ran: their sync is the next one, submitted when it completes.
    waiting: Vec<usize>,
}

/// What identifies a storage in [`Uring::lines`]: the address of the value its `Arc` shares. It stays
/// the storage's while any slot holds the `Arc` (invariant 1), which every slot of a line does.
fn storage_key(storage: &Arc<dyn Storage>) -> usize {
    Arc::as_ptr(storage) as *const () as usize
}

/// What a completion leaves a slot to do.
enum Next {
    /// Submit its entry again (EAGAIN or EINTR, or the rest of a short transfer).
    Again,
    /// Its FUA write is written whole: now its sync (invariant 4), behind any of its storage (invariant 5).
    Sync,
    /// Its sync completed with this result (invariant 5).
    Synced(i32),
    /// Answer it.
    Done(Result<(), StorageError>),
}

/// A completed operation: the caller's token and the read's buffer (its headroom, then the data; empty
/// for writes and flushes) or the error.
pub type Completion<T> = (T, Result<Vec<u8>, StorageError>);

/// The engine (see the module comment). `T` is the caller's token, handed back with the completion.
pub struct Uring<T> {
    ring: IoUring,
    eventfd: Arc<AsyncFd<OwnedFd>>,
    slots: Vec<Option<Slot<T>>>,
    free: Vec<usize>,
    inflight: usize,
    queued: bool,
    cqes: Vec<(u64, i32)>,
    /// Invariant 5: the syncs of each storage that has one in the ring, by [`storage_key`].
    lines: HashMap<usize, SyncLine>,
    /// Syncs asked for (flushes, and FUA writes' syncs), and those handed to the kernel (resubmissions
    /// after EAGAIN or EINTR not counted): fewer when some were merged (invariant 5).
    syncs_asked: u64,
    syncs_started: u64,
}

impl<T> Uring<T> {
    /// A ring for up to `depth` operations in flight.
    pub fn new(depth: usize) -> io::Result<Uring<T>> {
        let entries = depth.clamp(8, 4096).next_power_of_two() as u32;
        let ring = IoUring::new(entries)?;
        // SAFETY: eventfd(2) with constant flags; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        ring.submitter().register_eventfd(fd.as_raw_fd())?;
        // SAFETY: the AsyncFd owns `fd` (an OwnedFd), which stays open and the same until it is dropped.
        let eventfd =
            Arc::new(unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(io::Error::from)?);
        Ok(Uring {
            ring,
            eventfd,
            slots: Vec::new(),
            free: Vec::new(),
            inflight: 0,
            queued: false,
            cqes: Vec::new(),
            lines: HashMap::new(),
            syncs_asked: 0,
            syncs_started: 0,
        })
    }

    /// Operations submitted and not yet reaped (syncs waiting behind another of their storage included).
    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// Syncs handed to the kernel so far: fewer than the syncs asked for ([`Uring::syncs_asked`]) when
    /// some were merged (invariant 5). `rein_backend_syncs_started_total` in `/metrics`.
    pub fn syncs_started(&self) -> u64 {
        self.syncs_started
    }

    /// Syncs asked for so far: each flush, and each FUA write's sync. `rein_backend_syncs_total`.
    pub fn syncs_asked(&self) -> u64 {
        self.syncs_asked
    }

    /// The eventfd the kernel signals on completions (await its readability, then [`Uring::reap`]).
    pub fn eventfd(&self) -> Arc<AsyncFd<OwnedFd>> {
        self.eventfd.clone()
    }

    /// Queues an operation on `storage` through `target`, the descriptor its [`Storage::kernel_io`] gave
    /// for this very range (which has checked it); [`Uring::submit`] hands it to the kernel.
    pub fn push(&mut self, storage: Arc<dyn Storage>, target: KernelIo, offset: u64, op: UringOp, token: T) {
        let KernelIo { fd, direct } = target;
        let (kind, buf, len, then_sync) = match op {
            UringOp::Read { len, headroom } => {
                let len = len as usize;
                let buf = if direct {
                    Buf::Aligned { buf: AlignedBuf::zeroed(len), headroom }
                } else {
                    Buf::Plain { vec: vec![0u8; headroom + len], at: headroom }
                };
                (Kind::Read, buf, len, false)
            }
            UringOp::Write { data, fua } => {
                let len = data.len();
                let buf = if direct {
                    Buf::Aligned { buf: AlignedBuf::from_slice(&data), headroom: 0 }
                } else {
                    Buf::Plain { vec: data, at: 0 }
                };
                (Kind::Write, buf, len, fua)
            }
            UringOp::Flush => (Kind::Fsync, Buf::Empty, 0, false),
        };
        let slot = Slot { _storage: storage, fd, kind, buf, offset, len, done: 0, then_sync, token, retries: 0 };
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.inflight += 1;
        assert!(
            self.inflight <= self.ring.params().sq_entries() as usize,
            "invariant 3: more in flight than the ring holds"
        );
        if kind == Kind::Fsync {
            self.sync(idx);
        } else {
            self.push_entry(idx);
        }
    }

    /// The storage key of the occupied slot `idx`.
    fn key_of(&self, idx: usize) -> usize {
        storage_key(&self.slots[idx].as_ref().expect("an occupied slot")._storage)
    }

    /// Invariant 5: `idx`'s sync goes to the kernel now if none of its storage is there, else it waits for
    /// the next one.
    fn sync(&mut self, idx: usize) {
        self.syncs_asked += 1;
        match self.lines.entry(self.key_of(idx)) {
            std::collections::hash_map::Entry::Occupied(mut line) => line.get_mut().waiting.push(idx),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(SyncLine { running: idx, merged: Vec::new(), waiting: Vec::new() });
                self.syncs_started += 1;
                self.push_entry(idx);
            }
        }
    }

    /// Invariant 5: the sync of `idx` completed with `res`. It and the syncs merged into it are answered;
    /// the ones that waited go to the kernel as one. Returns how many were answered.
    fn synced(&mut self, idx: usize, res: i32, out: &mut Vec<Completion<T>>) -> usize {
        let key = self.key_of(idx);
        let line = self.lines.remove(&key).expect("invariant 5: a sync at the kernel has its line");
        assert_eq!(line.running, idx, "invariant 5: the sync at the kernel is its storage's running one");
        let storage = self.slots[idx].as_ref().expect("an occupied slot")._storage.clone();
        // EAGAIN or EINTR after every retry (invariant 2): the sync did not run, so it reported no
        // writeback error to keep.
        let not_run = res == -libc::EAGAIN || res == -libc::EINTR;
        if res < 0 && !not_run {
            storage.sync_failed(-res);
        }
        let answer = || {
            if res < 0 {
                Err(StorageError::Io { op: "fdatasync", source: io::Error::from_raw_os_error(-res) })
            } else {
                // A sync fails when one failed before (rein-runtime's storage, "A failed sync stays failed").
                storage.sync_error().map_or(Ok(()), Err)
            }
        };
        let mut answered = 0;
        for i in std::iter::once(idx).chain(line.merged) {
            self.finish(i, answer(), out);
            answered += 1;
        }
        let mut waiting = line.waiting.into_iter();
        if let Some(next) = waiting.next() {
            self.lines.insert(key, SyncLine { running: next, merged: waiting.collect(), waiting: Vec::new() });
            self.syncs_started += 1;
            self.push_entry(next);
        }
        answered
    }

    /// Frees the slot `idx` and hands its token back with `r` (a read's buffer if it succeeded).
    fn finish(&mut self, idx: usize, r: Result<(), StorageError>, out: &mut Vec<Completion<T>>) {
        let s = self.slots[idx].take().expect("finishing an occupied slot");
        self.free.push(idx);
        self.inflight -= 1;
        let data = match (r, s.kind) {
            (Err(e), _) => Err(e),
            (Ok(()), Kind::Read) => Ok(s.buf.into_read()),
            (Ok(()), _) => Ok(Vec::new()),
        };
        out.push((s.token, data));
    }

    fn push_entry(&mut self, idx: usize) {
        if self.slots[idx].as_ref().is_some_and(|s| s.kind == Kind::Fsync) {
            let key = self.key_of(idx);
            assert!(
                self.lines.get(&key).is_some_and(|l| l.running == idx),
                "invariant 5: a sync goes to the kernel only as its storage's running one"
            );
        }
        let s = self.slots[idx].as_mut().expect("pushing an occupied slot");
        let remaining = (s.len - s.done) as u32;
        let at = s.offset + s.done as u64;
        // SAFETY (pointer arithmetic): the kernel's part of the buffer is `len` bytes from `ptr()`, and
        // `done < len` for reads and writes, so the pointer stays inside it; for fsync no buffer is used.
        let entry: squeue::Entry = match s.kind {
            Kind::Read => {
                opcode::Read::new(types::Fd(s.fd), unsafe { s.buf.ptr().add(s.done) }, remaining).offset(at).build()
            }
            Kind::Write => {
                opcode::Write::new(types::Fd(s.fd), unsafe { s.buf.ptr().add(s.done) }, remaining).offset(at).build()
            }
            Kind::Fsync => opcode::Fsync::new(types::Fd(s.fd)).flags(types::FsyncFlags::DATASYNC).build(),
        }
        .user_data(idx as u64);
        // SAFETY: the entry's buffer and descriptor live in `slots[idx]` until its completion is reaped
        // (invariant 1). The queue cannot be full: at most `inflight <= sq_entries` entries exist and each
        // is in the queue at most once.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        assert!(pushed.is_ok(), "invariant 3: submission queue full");
        self.queued = true;
    }

    /// Hands queued entries to the kernel (without waiting for any).
    pub fn submit(&mut self) -> io::Result<()> {
        if !self.queued {
            return Ok(());
        }
        loop {
            match self.ring.submit() {
                Ok(_) => {
                    // The kernel may take fewer than were queued (it stops at an entry it cannot set up):
                    // the rest stay queued for the next submit, not forgotten until another request came.
                    self.queued = !self.ring.submission().is_empty();
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // EAGAIN / EBUSY: the kernel is short of resources or the completion queue is full; the
                // entries stay queued and go with the next submit (the caller reaps first).
                Err(e) => return Err(e),
            }
        }
    }

    /// Collects finished operations into `out` (resubmitting short transfers, invariant 2). Returns how
    /// many finished.
    pub fn reap(&mut self, out: &mut Vec<Completion<T>>) -> usize {
        self.cqes.clear();
        for cqe in self.ring.completion() {
            self.cqes.push((cqe.user_data(), cqe.result()));
        }
        let mut finished = 0;
        let mut resubmit = false;
        for i in 0..self.cqes.len() {
            let (ud, res) = self.cqes[i];
            let idx = ud as usize;
            let s = self.slots[idx].as_mut().expect("completion for an occupied slot");
            let op = match s.kind {
                Kind::Read => "read",
                Kind::Write => "write",
                Kind::Fsync => "fdatasync",
            };
            let again = res == -libc::EAGAIN || res == -libc::EINTR;
            let next = if again && s.retries < MAX_RETRIES {
                s.retries += 1;
                Next::Again // nothing done: submitted again as it is
            } else if s.kind == Kind::Fsync {
                Next::Synced(res)
            } else if res < 0 {
                Next::Done(Err(StorageError::Io { op, source: io::Error::from_raw_os_error(-res) }))
            } else {
                s.done += res as usize;
                if s.done >= s.len && s.then_sync {
                    // Invariant 4: written whole, now its sync, in the same slot; the answer is the sync's.
                    s.kind = Kind::Fsync;
                    s.then_sync = false;
                    s.retries = 0;
                    s.buf = Buf::Empty;
                    Next::Sync
                } else if s.done >= s.len {
                    Next::Done(Ok(()))
                } else if res == 0 {
                    let kind =
                        if s.kind == Kind::Read { io::ErrorKind::UnexpectedEof } else { io::ErrorKind::WriteZero };
                    Next::Done(Err(StorageError::Io {
                        op,
                        source: io::Error::new(kind, format!("{op} stopped after {} of {} bytes", s.done, s.len)),
                    }))
                } else {
                    Next::Again // short transfer: go on from where it stopped
                }
            };
            match next {
                Next::Again => {
                    self.push_entry(idx);
                    resubmit = true;
                }
                Next::Sync => {
                    self.sync(idx);
                    resubmit = true;
                }
                Next::Synced(res) => {
                    finished += self.synced(idx, res, out);
                    resubmit = true;
                }
                Next::Done(r) => {
                    self.finish(idx, r, out);
                    finished += 1;
                }
            }
        }
        if resubmit {
            if let Err(e) = self.submit() {
                tracing::warn!("io_uring resubmission deferred: {e}");
            }
        }
        finished
    }
}

impl<T> Drop for Uring<T> {
    fn drop(&mut self) {
        // Invariant 1: wait for everything in flight before the buffers go.
        while self.inflight > 0 {
            if let Err(e) = self.ring.submit_and_wait(1) {
                if e.raw_os_error() != Some(libc::EINTR) {
                    // The ring is unusable; leak the buffers rather than free memory the kernel may use.
                    tracing::error!("io_uring wait failed while shutting down: {e}; leaking {} buffers", self.inflight);
                    std::mem::forget(std::mem::take(&mut self.slots));
                    return;
                }
            }
            let mut sink = Vec::new();
            self.reap(&mut sink);
        }
    }
}

/// Clears the eventfd's counter after a wake-up (non-blocking; nothing to read is fine).
pub fn drain_eventfd(fd: &AsyncFd<OwnedFd>) {
    let mut b = [0u8; 8];
    // SAFETY: reading 8 bytes into an 8-byte stack buffer from a non-blocking eventfd we own.
    let _ = unsafe { libc::read(fd.get_ref().as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{FileMode, FileStorage};

    /// A fresh directory under the temp dir, removed with its files when dropped (also on a panic or an early
    /// return).
    fn tmp(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(&format!("rein-uring-{name}-")).tempdir().expect("temp dir")
    }

    /// Asks the storage for its descriptor (checking the range) and pushes, as the dispatcher does.
    fn push(
        u: &mut Uring<u32>,
        storage: &Arc<dyn Storage>,
        offset: u64,
        op: UringOp,
        token: u32,
    ) -> Result<(), StorageError> {
        let (len, write) = match &op {
            UringOp::Read { len, .. } => (*len as u64, false),
            UringOp::Write { data, .. } => (data.len() as u64, true),
            UringOp::Flush => (0, false),
        };
        let target = storage.kernel_io(if len == 0 { 0 } else { offset }, len, write)?.expect("a file has descriptors");
        u.push(storage.clone(), target, offset, op, token);
        Ok(())
    }

    fn wait_all(u: &mut Uring<u32>, want: usize) -> Vec<Completion<u32>> {
        let mut out = Vec::new();
        u.submit().unwrap();
        while out.len() < want {
            u.reap(&mut out);
            if out.len() < want {
                u.ring.submit_and_wait(1).unwrap();
            }
        }
        out
    }

    fn round_trip(direct: bool) {
        let dir = tmp(if direct { "direct" } else { "buffered" });
        let path = dir.path().join("disk.img");
        let storage: Arc<dyn Storage> =
            match FileStorage::open_with(&path, Some(1 << 20), FileMode { direct, ..FileMode::default() }) {
                Ok(s) => Arc::new(s),
                Err(e) if direct => {
                    // Some file systems (tmpfs) refuse O_DIRECT; that is a clear error, not a failure of ours.
                    eprintln!("skipping O_DIRECT round trip: {e}");
                    return;
                }
                Err(e) => panic!("{e}"),
            };
        let Ok(mut u) = Uring::<u32>::new(32) else {
            eprintln!("io_uring unavailable here; the dispatcher falls back to threads");
            return;
        };
        // Aligned (direct when enabled) and unaligned writes, one with FUA.
        let a: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        let b: Vec<u8> = (0..1000u32).map(|i| (i * 13 % 241) as u8).collect();
        push(&mut u, &storage, 4096, UringOp::Write { data: a.clone(), fua: true }, 1).unwrap();
        push(&mut u, &storage, 100_001, UringOp::Write { data: b.clone(), fua: false }, 2).unwrap();
        let done = wait_all(&mut u, 2);
        assert!(done.iter().all(|(_, r)| r.is_ok()), "writes failed");
        push(&mut u, &storage, 0, UringOp::Flush, 3).unwrap();
        push(&mut u, &storage, 4096, UringOp::Read { len: 8192, headroom: 0 }, 4).unwrap();
        push(&mut u, &storage, 100_001, UringOp::Read { len: 1000, headroom: 16 }, 5).unwrap();
        let mut done = wait_all(&mut u, 3);
        done.sort_by_key(|(t, _)| *t);
        assert!(done[0].1.as_ref().is_ok_and(|d| d.is_empty()));
        assert_eq!(done[1].1.as_ref().unwrap(), &a);
        // The headroom comes first, untouched; the data after it.
        let with_room = done[2].1.as_ref().unwrap();
        assert_eq!((&with_room[..16], &with_room[16..]), (&[0u8; 16][..], &b[..]));
        // Out of range: refused by the storage before anything is submitted.
        let e = push(&mut u, &storage, (1 << 20) - 10, UringOp::Read { len: 4096, headroom: 0 }, 9).unwrap_err();
        assert_eq!(e.kind(), rein_proto::ErrorKind::InvalidRequest);
        assert_eq!(u.inflight(), 0);
        // The blocking path reads what the ring wrote.
        let mut back = vec![0u8; 8192];
        storage.read_at(&mut back, 4096).unwrap();
        assert_eq!(back, a);
        drop(u);
    }

    #[tokio::test]
    async fn buffered_round_trip() {
        round_trip(false);
    }

    #[tokio::test]
    async fn direct_round_trip() {
        round_trip(true);
    }

    #[tokio::test]
    async fn read_only_exports_refuse_writes_on_the_ring() {
        let dir = tmp("ro");
        let path = dir.path().join("disk.img");
        drop(FileStorage::open(&path, Some(65536), false).unwrap());
        let storage: Arc<dyn Storage> = Arc::new(FileStorage::open(&path, None, true).unwrap());
        let Ok(mut u) = Uring::<u32>::new(8) else { return };
        let e = push(&mut u, &storage, 0, UringOp::Write { data: vec![1; 512], fua: false }, 7).unwrap_err();
        assert_eq!(e.kind(), rein_proto::ErrorKind::ReadOnly);
    }

    /// Invariant 5: of three FLUSHes of one storage pushed at once, one goes to the kernel and the other
    /// two wait behind it, then share the next sync; a FLUSH of another storage goes at once. All succeed.
    #[tokio::test]
    async fn the_syncs_of_one_storage_go_one_at_a_time_and_merge() {
        let dir = tmp("merge");
        let open = |name: &str| -> Arc<dyn Storage> {
            Arc::new(FileStorage::open(&dir.path().join(name), Some(1 << 20), false).unwrap())
        };
        let (storage, other) = (open("a.img"), open("b.img"));
        let Ok(mut u) = Uring::<u32>::new(16) else { return };
        push(&mut u, &storage, 0, UringOp::Write { data: vec![7; 4096], fua: false }, 1).unwrap();
        for token in 2..5 {
            push(&mut u, &storage, 0, UringOp::Flush, token).unwrap();
        }
        push(&mut u, &other, 0, UringOp::Flush, 5).unwrap();
        assert_eq!(u.syncs_started(), 2, "one sync of each storage at the kernel");
        let line = &u.lines[&storage_key(&storage)];
        assert_eq!(u.slots[line.running].as_ref().map(|s| s.token), Some(2), "the first FLUSH runs");
        assert_eq!((line.merged.len(), line.waiting.len()), (0, 2), "the two others wait");
        assert_eq!(u.inflight(), 5, "a waiting sync is in flight for the caller");
        let mut done = wait_all(&mut u, 5);
        done.sort_by_key(|(t, _)| *t);
        for (t, r) in &done {
            assert!(r.as_ref().is_ok_and(|d| d.is_empty()), "{t}: {r:?}");
        }
        assert_eq!(u.syncs_started(), 3, "the two that waited shared one sync");
        assert!(u.lines.is_empty() && u.inflight() == 0);
    }

    /// Invariant 5 with a failure: the sync at the kernel fails (an fdatasync of a socket, EINVAL, stands
    /// in for a writeback error: Linux would report that to one sync only), and the syncs that waited
    /// behind it, a FLUSH's and a FUA write's, fail with the error the storage keeps although their own
    /// sync of the file succeeds. Side by side, they were answered as their own syncs were.
    #[tokio::test]
    async fn the_syncs_behind_a_failed_one_fail_with_it() {
        let dir = tmp("failed");
        let file = Arc::new(FileStorage::open(&dir.path().join("a.img"), Some(1 << 20), false).unwrap());
        let storage: Arc<dyn Storage> = file.clone();
        let Ok(mut u) = Uring::<u32>::new(16) else { return };
        let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let unsyncable = KernelIo { fd: socket.as_raw_fd(), direct: false };
        u.push(storage.clone(), unsyncable, 0, UringOp::Flush, 1);
        push(&mut u, &storage, 0, UringOp::Flush, 2).unwrap();
        push(&mut u, &storage, 4096, UringOp::Write { data: vec![1; 4096], fua: true }, 3).unwrap();
        let mut done = wait_all(&mut u, 3);
        done.sort_by_key(|(t, _)| *t);
        let errno = |r: &Result<Vec<u8>, StorageError>| match r {
            Err(StorageError::Io { op: "fdatasync", source }) => ("fdatasync", source.raw_os_error()),
            Err(StorageError::SyncFailedBefore(source)) => ("kept", source.raw_os_error()),
            other => panic!("a failed sync expected: {other:?}"),
        };
        assert_eq!(errno(&done[0].1), ("fdatasync", Some(libc::EINVAL)), "the sync at the kernel");
        assert_eq!(errno(&done[1].1), ("kept", Some(libc::EINVAL)), "the FLUSH behind it");
        assert_eq!(errno(&done[2].1), ("kept", Some(libc::EINVAL)), "the FUA write behind it");
        assert!(file.sync_error().is_some(), "the storage keeps the failure");
        assert!(u.lines.is_empty() && u.inflight() == 0);
    }

    #[tokio::test]
    async fn a_full_ring_of_operations_completes() {
        let dir = tmp("full");
        let path = dir.path().join("disk.img");
        let storage: Arc<dyn Storage> = Arc::new(FileStorage::open(&path, Some(1 << 20), false).unwrap());
        let Ok(mut u) = Uring::<u32>::new(8) else { return };
        for i in 0..8u32 {
            push(&mut u, &storage, i as u64 * 4096, UringOp::Write { data: vec![i as u8; 4096], fua: false }, i)
                .unwrap();
        }
        assert_eq!(u.inflight(), 8);
        let done = wait_all(&mut u, 8);
        assert_eq!(done.len(), 8);
        for i in 0..8u32 {
            push(&mut u, &storage, i as u64 * 4096, UringOp::Read { len: 4096, headroom: 0 }, i).unwrap();
        }
        for (t, r) in wait_all(&mut u, 8) {
            assert_eq!(r.unwrap(), vec![t as u8; 4096]);
        }
    }
}
