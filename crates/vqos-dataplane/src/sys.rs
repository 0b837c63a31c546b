//! Thin wrappers over the system calls the loop uses: epoll, eventfd, the cycle counter.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use thiserror::Error;

/// Why a loop-level system call failed.
#[derive(Debug, Error)]
pub enum SysError {
    /// The named call failed.
    #[error("{0} failed")]
    Call(&'static str, #[source] io::Error),
}

fn last(op: &'static str) -> SysError {
    SysError::Call(op, io::Error::last_os_error())
}

/// The CPUs this process may run on (its affinity mask), ascending.
pub fn allowed_cpus() -> Result<Vec<usize>, SysError> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size is the set's.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(last("sched_getaffinity"));
    }
    // SAFETY: CPU_ISSET reads the set within its size.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Pins the calling thread to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> Result<(), SysError> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes within the set (cpu < CPU_SETSIZE is checked by the caller's
    // validation against allowed_cpus); pid 0 is this thread.
    let rc = unsafe {
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(last("sched_setaffinity"));
    }
    Ok(())
}

/// Reads the cycle counter: `rdtsc` on x86_64, monotonic nanoseconds elsewhere.
#[inline]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        use std::time::Instant;
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// The unit [`cycles`] counts in: `"tsc"` or `"ns"`.
pub const CYCLES_UNIT: &str = if cfg!(target_arch = "x86_64") {
    "tsc"
} else {
    "ns"
};

/// An eventfd used to wake the loop.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A non-blocking eventfd.
    pub fn new() -> Result<Self, SysError> {
        // SAFETY: no memory arguments; checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(last("eventfd"));
        }
        // SAFETY: fresh descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Signals it.
    pub fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// Clears it.
    pub fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer.
        unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
    }

    /// Its descriptor.
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// An epoll instance with a fixed event buffer.
///
/// Waits with `epoll_pwait2` (nanosecond timeout), called through `syscall(2)` so that the
/// binary does not need glibc ≥ 2.35; where the kernel (< 5.11) or a seccomp filter refuses it
/// (`ENOSYS`, `EPERM`), it falls back to `epoll_wait` for good, the timeout rounded up to the
/// next millisecond (never early, so the loop does not spin before a deadline).
#[derive(Debug)]
pub struct Epoll {
    /// The epoll descriptor.
    fd: OwnedFd,
    /// Events returned by the last wait.
    events: Vec<libc::epoll_event>,
    /// `epoll_pwait2` is usable (cleared for good on the first `ENOSYS`/`EPERM`).
    pwait2: bool,
    /// Waits that failed with an error other than `EINTR` (and a missing `epoll_pwait2`).
    errors: u64,
}

/// `struct __kernel_timespec`: 64-bit seconds and nanoseconds on every architecture (what
/// `epoll_pwait2` takes, unlike `libc::timespec` on 32-bit targets).
#[repr(C)]
struct KernelTimespec {
    /// Seconds.
    tv_sec: i64,
    /// Nanoseconds, below 10^9.
    tv_nsec: i64,
}

/// `epoll_wait`'s timeout for `timeout_ns`: milliseconds rounded up, capped at `i32::MAX`;
/// -1 (forever) for `None`.
pub fn timeout_ms(timeout_ns: Option<u64>) -> libc::c_int {
    match timeout_ns {
        None => -1,
        Some(ns) => ns.div_ceil(1_000_000).min(i32::MAX as u64) as libc::c_int,
    }
}

impl Epoll {
    /// An epoll instance returning up to `max_events` per wait.
    pub fn new(max_events: usize) -> Result<Self, SysError> {
        // SAFETY: no memory arguments; checked below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(last("epoll_create1"));
        }
        Ok(Epoll {
            // SAFETY: fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            events: vec![libc::epoll_event { events: 0, u64: 0 }; max_events.max(1)],
            pwait2: true,
            errors: 0,
        })
    }

    /// Waits that failed (other than interrupted); each returned no event.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// True once `epoll_pwait2` was found missing and `epoll_wait` is used instead.
    pub fn uses_fallback(&self) -> bool {
        !self.pwait2
    }

    /// Watches `fd` for input, edge-triggered if `edge`, tagging its events with `token`.
    pub fn add(&self, fd: RawFd, token: u64, edge: bool) -> Result<(), SysError> {
        let mut flags = libc::EPOLLIN as u32;
        if edge {
            flags |= libc::EPOLLET as u32;
        }
        let mut ev = libc::epoll_event {
            events: flags,
            u64: token,
        };
        // SAFETY: ev is live for the call.
        if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(last("epoll_ctl(ADD)"));
        }
        Ok(())
    }

    /// Stops watching `fd`.
    pub fn remove(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: ev is live for the call; failure (fd already closed) is harmless.
        unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    /// Waits up to `timeout_ns` (`None` = forever) and returns the tokens of ready descriptors.
    /// An interrupted wait returns nothing; a failed one returns nothing and is counted
    /// ([`Epoll::errors`]).
    pub fn wait(&mut self, timeout_ns: Option<u64>) -> impl Iterator<Item = u64> + '_ {
        let n = loop {
            let r = if self.pwait2 {
                self.pwait2_once(timeout_ns)
            } else {
                // SAFETY: the event buffer is live for the call; the length matches.
                unsafe {
                    libc::epoll_wait(
                        self.fd.as_raw_fd(),
                        self.events.as_mut_ptr(),
                        self.events.len() as libc::c_int,
                        timeout_ms(timeout_ns),
                    )
                }
            };
            if r >= 0 {
                break r as usize;
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::ENOSYS | libc::EPERM) if self.pwait2 => self.pwait2 = false,
                Some(libc::EINTR) => break 0,
                _ => {
                    self.errors += 1;
                    break 0;
                }
            }
        };
        self.events[..n.min(self.events.len())]
            .iter()
            .map(|e| e.u64)
    }

    /// One `epoll_pwait2` system call; its raw result.
    fn pwait2_once(&mut self, timeout_ns: Option<u64>) -> libc::c_int {
        let ts = timeout_ns.map(|ns| KernelTimespec {
            tv_sec: (ns / 1_000_000_000).min(i64::MAX as u64) as i64,
            tv_nsec: (ns % 1_000_000_000) as i64,
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const KernelTimespec);
        // SAFETY: the event buffer and timespec are live for the call; the length matches; a
        // null signal mask leaves the mask alone (its size argument is then not read).
        let r = unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait2,
                self.fd.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                ts_ptr,
                std::ptr::null::<libc::sigset_t>(),
                0usize,
            )
        };
        r as libc::c_int
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_rounds_up_to_milliseconds() {
        assert_eq!(timeout_ms(None), -1);
        assert_eq!(timeout_ms(Some(0)), 0);
        assert_eq!(timeout_ms(Some(1)), 1);
        assert_eq!(timeout_ms(Some(1_000_000)), 1);
        assert_eq!(timeout_ms(Some(1_000_001)), 2);
        assert_eq!(timeout_ms(Some(u64::MAX)), i32::MAX);
    }

    fn wait_tokens(ep: &mut Epoll, timeout_ns: u64) -> Vec<u64> {
        ep.wait(Some(timeout_ns)).collect()
    }

    #[test]
    fn both_wait_calls_deliver_events() {
        let ev = EventFd::new().unwrap();
        let mut ep = Epoll::new(4).unwrap();
        ep.add(ev.raw(), 7, false).unwrap();
        assert!(wait_tokens(&mut ep, 0).is_empty());
        ev.signal();
        assert_eq!(wait_tokens(&mut ep, 1_000_000_000), vec![7]);
        ev.clear();
        // As after ENOSYS on a kernel < 5.11.
        ep.pwait2 = false;
        assert!(wait_tokens(&mut ep, 1).is_empty());
        ev.signal();
        assert_eq!(wait_tokens(&mut ep, 1_000_000_000), vec![7]);
        assert_eq!(ep.errors(), 0);
    }

    #[test]
    fn failed_waits_are_counted_not_swallowed() {
        let mut ep = Epoll::new(4).unwrap();
        // Not an epoll descriptor: EINVAL.
        let ev = EventFd::new().unwrap();
        // SAFETY: dup of a live descriptor; the result is owned by `ep` from here on.
        ep.fd = unsafe { OwnedFd::from_raw_fd(libc::dup(ev.raw())) };
        assert!(wait_tokens(&mut ep, 0).is_empty());
        ep.pwait2 = false;
        assert!(wait_tokens(&mut ep, 0).is_empty());
        assert_eq!(ep.errors(), 2);
    }
}

/// The network namespace a thread is in: its `/proc/thread-self/ns/net`, held open, and
/// that file's identity (device, inode), which two threads share exactly when they are in
/// the same namespace.
#[derive(Debug)]
pub struct NetNs {
    /// The namespace file.
    file: std::fs::File,
    /// `(st_dev, st_ino)` of the file.
    id: (u64, u64),
}

impl NetNs {
    /// The calling thread's namespace.
    pub fn current() -> io::Result<NetNs> {
        Self::open(std::path::Path::new("/proc/thread-self/ns/net"))
    }

    /// The namespace of the file at `path` (`/run/netns/NAME`, `/proc/PID/ns/net`).
    pub fn open(path: &std::path::Path) -> io::Result<NetNs> {
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::File::open(path)?;
        let meta = file.metadata()?;
        Ok(NetNs {
            id: (meta.dev(), meta.ino()),
            file,
        })
    }

    /// Runs `f` in this namespace: on the calling thread when it is already there (no
    /// capability needed), else on a thread that enters it (`setns`, CAP_SYS_ADMIN) and ends
    /// with `f`. An error when it cannot be entered.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        if Self::current().is_ok_and(|here| here.id == self.id) {
            return Ok(f());
        }
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: setns on a namespace file we hold open; it affects this thread
                    // only, which ends with `f`.
                    if unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(f())
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the thread that entered it panicked")))
        })
    }
}
