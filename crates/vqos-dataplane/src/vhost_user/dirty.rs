//! [`DirtyLog`]: the dirty-page log of a live migration (`VHOST_F_LOG_ALL`,
//! `VHOST_USER_PROTOCOL_F_LOG_SHMFD`). The frontend (QEMU) hands over a shared memory file
//! with `SET_LOG_BASE`: one bit per 4 KiB page of guest-physical memory, bit `p % 8` of byte
//! `p / 8` for page `p`. While the frontend has `LOG_ALL` acknowledged, every write the port
//! makes into guest memory (received frames, used ring entries and index, the ring's event
//! index) sets the bits of the pages it touched, after the write and with release ordering
//! (gathered per batch in a [`LogCache`], written out when the batch ends), so that a page
//! QEMU finds marked holds what the port wrote; QEMU copies marked pages again
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
    ///
    /// The data path marks through a [`LogCache`]; this direct form is the reference the
    /// cache is tested against.
    #[cfg(test)]
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
            self.or_byte(byte, 1 << (page % 8));
        }
    }

    /// Sets `bits` in log byte `byte` (ignored beyond the log), atomically, with release
    /// ordering: a page QEMU finds marked holds what the port wrote before.
    fn or_byte(&self, byte: usize, bits: u8) {
        if byte >= self.size {
            return;
        }
        // SAFETY: `offset + byte < map_len`; an AtomicU8 has the alignment of a byte.
        let cell = unsafe { &*self.map.add(self.offset + byte).cast::<AtomicU8>() };
        cell.fetch_or(bits, Ordering::Release);
    }
}

// A log byte's index fits the cache's u32.
const _: () = assert!(MAX_LOG_BYTES <= u32::MAX as u64);

/// Log bytes a [`LogCache`] holds before it writes them out.
const CACHE_BYTES: usize = 16;

/// The marks of one burst, gathered before they reach the shared log: the pages a burst
/// writes are mostly neighbours (a Linux guest carves its receive buffers out of 32 KiB page
/// fragments, eight pages, one log byte), so one atomic OR per distinct log byte replaces one
/// per buffer and page. DPDK's vhost library keeps a log cache per queue for the same reason.
/// Marks reach the log ([`LogCache::flush`]) before the burst publishes its used index (so a
/// guest never sees a filled buffer whose page is unmarked, even if vqosd dies at once), the
/// used ring's own mark right after (QEMU marks the used rings itself when it stops them), or
/// when the cache is full: later than the write, never lost. A log replaced by `SET_LOG_BASE`
/// is answered only after the batches that hold it ended (`protocol.rs`), so no mark lands in
/// a log QEMU already synced. Written here: the rust-vmm crates have no vhost-user dirty log.
#[derive(Debug, Default)]
pub(crate) struct LogCache {
    /// (log byte, bits to set), `len` of them in use.
    bytes: [(u32, u8); CACHE_BYTES],
    len: usize,
}

impl LogCache {
    /// Notes the pages of `gpa .. gpa + len` for `log` (writing out the cache first when it is
    /// full). Pages beyond the log are ignored, as [`DirtyLog::mark`] does.
    pub(crate) fn mark(&mut self, log: &DirtyLog, gpa: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(len - 1) / LOG_PAGE;
        for page in first..=last {
            let byte = page / 8;
            if byte >= log.size as u64 {
                return;
            }
            let (byte, bit) = (byte as u32, 1u8 << (page % 8));
            // The newest entries first: a burst moves forward through its buffers.
            if let Some(e) = self.bytes[..self.len]
                .iter_mut()
                .rev()
                .find(|e| e.0 == byte)
            {
                e.1 |= bit;
                continue;
            }
            if self.len == CACHE_BYTES {
                self.flush(log);
            }
            self.bytes[self.len] = (byte, bit);
            self.len += 1;
        }
    }

    /// Whether no mark waits (as at the start and end of every batch).
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes the noted marks into `log` (one atomic OR per log byte) and empties the cache.
    pub(crate) fn flush(&mut self, log: &DirtyLog) {
        for &(byte, bits) in &self.bytes[..self.len] {
            log.or_byte(byte as usize, bits);
        }
        self.len = 0;
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
    fn the_cache_marks_exactly_what_direct_marking_marks() {
        // Fixed seed (xorshift): bursts of writes, mostly neighbours, some far, some past the
        // end of the log, some across pages; more distinct bytes than the cache holds.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (direct_f, cached_f) = (memfd(LOG_PAGE), memfd(LOG_PAGE));
        let direct = DirtyLog::map(&direct_f, 64, 0).unwrap();
        let cached = DirtyLog::map(&cached_f, 64, 0).unwrap();
        let mut cache = LogCache::default();
        for burst in 0..200 {
            let base = next() % (600 * LOG_PAGE);
            for _ in 0..(next() % 40) {
                let gpa = if next() % 8 == 0 {
                    next() % (600 * LOG_PAGE)
                } else {
                    base + next() % (32 << 10)
                };
                let len = next() % 9000;
                direct.mark(gpa, len);
                cache.mark(&cached, gpa, len);
            }
            cache.flush(&cached);
            assert_eq!(
                bits(&direct_f, 0, 64),
                bits(&cached_f, 0, 64),
                "burst {burst}"
            );
        }
        assert!(bits(&cached_f, 0, 64).iter().any(|&b| b != 0));
    }

    #[test]
    fn a_full_cache_writes_out_and_nothing_reaches_the_log_before_it_must() {
        let f = memfd(LOG_PAGE);
        let log = DirtyLog::map(&f, 64, 0).unwrap();
        let mut cache = LogCache::default();
        // One page in each of CACHE_BYTES log bytes: cached, not yet in the log.
        for b in 0..CACHE_BYTES as u64 {
            cache.mark(&log, b * 8 * LOG_PAGE, 1);
        }
        assert_eq!(bits(&f, 0, 64), [0; 64]);
        // One more byte: the cache writes out the first CACHE_BYTES.
        cache.mark(&log, CACHE_BYTES as u64 * 8 * LOG_PAGE, 1);
        let out = bits(&f, 0, 64);
        assert_eq!(out[..CACHE_BYTES], [1; CACHE_BYTES]);
        assert_eq!(out[CACHE_BYTES], 0);
        cache.flush(&log);
        assert_eq!(bits(&f, 0, 64)[CACHE_BYTES], 1);
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
