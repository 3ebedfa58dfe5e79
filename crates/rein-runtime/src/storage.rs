//! Storage backends: where the bytes live.
//!
//! A [`Storage`] is synchronous and thread-safe; the dispatcher runs its calls on tokio's blocking pool so
//! a slow disk never stalls the network tasks. Two implementations:
//! - [`FileStorage`]: a regular file or block device through positioned reads and writes (`pread`/`pwrite`),
//!   `fdatasync` on flush, hole punching (`fallocate`) for trim where the file system supports it, falling
//!   back to writing zeroes;
//! - [`MemStorage`]: RAM, in 1 MiB pages allocated on first write (reads of untouched pages are zeroes).
//!
//! Every call checks `offset + len <= size` and returns [`StorageError::OutOfRange`] otherwise (the NBD
//! server answers EINVAL and the connection stays usable).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("range {offset}+{len} is beyond the end of the export ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("export is read-only")]
    ReadOnly,
    #[error("{op} failed: {source}")]
    Io { op: &'static str, source: io::Error },
}

impl StorageError {
    /// The errno an NBD reply carries for this error.
    pub fn errno(&self) -> u32 {
        match self {
            StorageError::OutOfRange { .. } => 22, // EINVAL
            StorageError::ReadOnly => 1,           // EPERM
            StorageError::Io { source, .. } => match source.raw_os_error() {
                Some(28) => 28, // ENOSPC
                Some(12) => 12, // ENOMEM
                _ => 5,         // EIO
            },
        }
    }
}

pub trait Storage: Send + Sync + 'static {
    fn size(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError>;
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), StorageError>;
    /// Makes completed writes durable.
    fn flush(&self) -> Result<(), StorageError>;
    fn trim(&self, offset: u64, len: u64) -> Result<(), StorageError>;
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), StorageError>;
    fn read_only(&self) -> bool {
        false
    }
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
    size: u64,
    read_only: bool,
}

impl FileStorage {
    /// Opens (creating and sizing if `create_size` is given and the file does not exist) a file.
    pub fn open(path: &Path, create_size: Option<u64>, read_only: bool) -> Result<FileStorage, StorageError> {
        let io = |op, source| StorageError::Io { op, source };
        let exists = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .create(!read_only && create_size.is_some())
            .truncate(false)
            .open(path)
            .map_err(|e| io("open", e))?;
        if !exists {
            if let Some(sz) = create_size {
                file.set_len(sz).map_err(|e| io("set_len", e))?;
            }
        }
        let meta = file.metadata().map_err(|e| io("stat", e))?;
        let size = if meta.file_type().is_file() {
            meta.len()
        } else {
            // Block device: seek to the end.
            use std::io::Seek;
            let mut f = &file;
            f.seek(io::SeekFrom::End(0)).map_err(|e| io("seek", e))?
        };
        Ok(FileStorage { file, size, read_only })
    }
}

impl Storage for FileStorage {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError> {
        check(self.size, offset, buf.len() as u64)?;
        self.file.read_exact_at(buf, offset).map_err(|source| StorageError::Io { op: "read", source })
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), StorageError> {
        if self.read_only {
            return Err(StorageError::ReadOnly);
        }
        check(self.size, offset, buf.len() as u64)?;
        self.file.write_all_at(buf, offset).map_err(|source| StorageError::Io { op: "write", source })
    }
    fn flush(&self) -> Result<(), StorageError> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data().map_err(|source| StorageError::Io { op: "fdatasync", source })
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), StorageError> {
        if self.read_only {
            return Err(StorageError::ReadOnly);
        }
        check(self.size, offset, len)?;
        // Trim is advisory in NBD: writing zeroes is a correct (if slower) implementation.
        self.write_zeroes(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), StorageError> {
        if self.read_only {
            return Err(StorageError::ReadOnly);
        }
        check(self.size, offset, len)?;
        const CHUNK: usize = 1 << 20;
        let zeroes = vec![0u8; CHUNK.min(len as usize)];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            self.file.write_all_at(&zeroes[..n], offset + done).map_err(|source| StorageError::Io { op: "write_zeroes", source })?;
            done += n as u64;
        }
        Ok(())
    }
}

const PAGE: u64 = 1 << 20;

/// RAM storage in 1 MiB pages, each behind its own lock.
pub struct MemStorage {
    size: u64,
    pages: Vec<Mutex<Option<Box<[u8]>>>>,
}

impl MemStorage {
    pub fn new(size: u64) -> MemStorage {
        let n = size.div_ceil(PAGE) as usize;
        MemStorage { size, pages: (0..n).map(|_| Mutex::new(None)).collect() }
    }

    fn for_pages(&self, offset: u64, len: u64, mut f: impl FnMut(&mut Option<Box<[u8]>>, usize, usize, usize)) {
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let page = (pos / PAGE) as usize;
            let in_page = (pos % PAGE) as usize;
            let n = ((PAGE - pos % PAGE).min(end - pos)) as usize;
            let mut g = self.pages[page].lock().unwrap_or_else(|p| p.into_inner());
            f(&mut g, in_page, n, (pos - offset) as usize);
            pos += n as u64;
        }
    }
}

impl Storage for MemStorage {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError> {
        check(self.size, offset, buf.len() as u64)?;
        self.for_pages(offset, buf.len() as u64, |p, at, n, b| match p {
            Some(page) => buf[b..b + n].copy_from_slice(&page[at..at + n]),
            None => buf[b..b + n].fill(0),
        });
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), StorageError> {
        check(self.size, offset, buf.len() as u64)?;
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
        check(self.size, offset, len)?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(StorageError::OutOfRange { offset: 0, len: 0, size: 0 }.errno(), 22);
    }

    #[test]
    fn memory_storage_round_trips() {
        exercise(&MemStorage::new(4 * PAGE));
    }

    #[test]
    fn file_storage_round_trips() {
        let dir = std::env::temp_dir().join(format!("rein-storage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        let _ = std::fs::remove_file(&path);
        let s = FileStorage::open(&path, Some(4 * PAGE), false).unwrap();
        exercise(&s);
        drop(s);
        let ro = FileStorage::open(&path, None, true).unwrap();
        assert!(matches!(ro.write_at(&[1], 0), Err(StorageError::ReadOnly)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
