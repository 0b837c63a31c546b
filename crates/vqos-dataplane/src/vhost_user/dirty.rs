//! [`DirtyLog`]: the dirty-page log of a live migration (`VHOST_F_LOG_ALL`,
//! `VHOST_USER_PROTOCOL_F_LOG_SHMFD`). The frontend (QEMU) hands over a shared memory file
//! with `SET_LOG_BASE`: one bit per 4 KiB page of guest-physical memory, bit `p % 8` of byte
//! `p / 8` for page `p`. While the frontend has `LOG_ALL` acknowledged, every write the port
//! makes into guest memory (received frames, used ring entries and index, the ring's event
//! index) sets the bits of the pages it touched, after the write and with release ordering,
//! so that a page QEMU finds marked holds what the port wrote; QEMU copies marked pages again
//! before the guest runs on the destination. Written here (not with `vm-memory`'s bitmap
//! feature): that bitmap tracks writes through `vm-memory`'s own accessors into a bitmap the
//! process owns, while this log is the frontend's memory with the layout the vhost-user
//! protocol fixes.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU8, Ordering};

/// Bytes of guest memory per log bit (`VHOST_LOG_PAGE`).
pub(crate) const LOG_PAGE: u64 = 4096;

/// Largest log accepted: 256 MiB of bits covers 8 TiB of guest memory.
pub(crate) const MAX_LOG_BYTES: u64 = 256 << 20;

/// The frontend's dirty-page bitmap, mapped shared and writable.
#[derive(Debug)]
pub(crate) struct DirtyLog {
    /// Start of the mapping.
    map: *mut u8,
    /// Bytes mapped (`offset + size`, from the start of the file).
    map_len: usize,
    /// Where the bitmap starts in the mapping.
    offset: usize,
    /// Bytes of bitmap.
    size: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics; it lives until drop.
unsafe impl Send for DirtyLog {}
// SAFETY: as above.
unsafe impl Sync for DirtyLog {}

impl DirtyLog {
    /// Maps `size` bytes of `file` from `offset`; an error for an empty or oversized log or
    /// a failed mapping.
    pub(crate) fn map(file: &File, size: u64, offset: u64) -> std::io::Result<DirtyLog> {
        let bad = |what| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
        if size == 0 || size > MAX_LOG_BYTES {
            return Err(bad("dirty log size"));
        }
        let map_len = offset
            .checked_add(size)
            .filter(|&l| l <= MAX_LOG_BYTES + LOG_PAGE)
            .ok_or_else(|| bad("dirty log offset"))?;
        // A mapping past the file's end would fault (SIGBUS) on the first mark there: a
        // frontend's file shorter than the log it announces is refused.
        if file.metadata()?.len() < map_len {
            return Err(bad("dirty log beyond its file"));
        }
        let map_len = map_len as usize;
        // SAFETY: a fresh shared mapping of a file we hold; checked below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(DirtyLog {
            map: map.cast(),
            map_len,
            offset: offset as usize,
            size: size as usize,
        })
    }

    /// Marks the pages of guest-physical `gpa .. gpa + len` dirty (pages beyond the log are
    /// not marked: the frontend sized the log to its memory, a write there is to memory it
    /// does not migrate).
    pub(crate) fn mark(&self, gpa: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(len - 1) / LOG_PAGE;
        for page in first..=last {
            let byte = (page / 8) as usize;
            if byte >= self.size {
                return;
            }
            // SAFETY: `offset + byte < map_len`; an AtomicU8 has the alignment of a byte.
            let cell = unsafe { &*self.map.add(self.offset + byte).cast::<AtomicU8>() };
            cell.fetch_or(1 << (page % 8), Ordering::Release);
        }
    }
}

impl Drop for DirtyLog {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd(bytes: u64) -> File {
        use std::os::fd::FromRawFd;
        let name = std::ffi::CString::new("vqos-log-test").unwrap();
        // SAFETY: name is NUL-terminated; the result is checked.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(bytes).unwrap();
        f
    }

    fn bits(f: &File, offset: u64, bytes: usize) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let mut v = vec![0u8; bytes];
        f.read_exact_at(&mut v, offset).unwrap();
        v
    }

    #[test]
    fn marks_every_page_a_write_touches_and_nothing_beyond_the_log() {
        let f = memfd(2 * LOG_PAGE);
        let log = DirtyLog::map(&f, 4, LOG_PAGE).unwrap();
        // Page 0; pages 9 and 10 (a write across their boundary); page 31, the last.
        log.mark(100, 10);
        log.mark(10 * LOG_PAGE - 2, 4);
        log.mark(31 * LOG_PAGE, 1);
        // Beyond the 32 pages the log covers: ignored.
        log.mark(32 * LOG_PAGE, LOG_PAGE);
        assert_eq!(bits(&f, LOG_PAGE, 5), [0b1, 0b110, 0, 0b1000_0000, 0]);
        assert_eq!(
            bits(&f, 0, 4),
            [0; 4],
            "before the offset nothing is written"
        );
    }

    #[test]
    fn an_empty_huge_or_short_log_is_refused() {
        let f = memfd(LOG_PAGE);
        assert!(DirtyLog::map(&f, 0, 0).is_err());
        assert!(DirtyLog::map(&f, MAX_LOG_BYTES + 1, 0).is_err());
        // Longer than its file: refused, not a fault at the first mark.
        assert!(DirtyLog::map(&f, 8, LOG_PAGE - 4).is_err());
        assert!(DirtyLog::map(&f, 8, LOG_PAGE - 8).is_ok());
    }
}
