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
#[derive(Debug)]
pub struct Epoll {
    /// The epoll descriptor.
    fd: OwnedFd,
    /// Events returned by the last wait.
    events: Vec<libc::epoll_event>,
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
        })
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
    pub fn wait(&mut self, timeout_ns: Option<u64>) -> impl Iterator<Item = u64> + '_ {
        let ts = timeout_ns.map(|ns| libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: the event buffer and timespec are live for the call; the length matches.
        let n = unsafe {
            libc::epoll_pwait2(
                self.fd.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                ts_ptr,
                std::ptr::null(),
            )
        };
        let n = usize::try_from(n).unwrap_or(0);
        self.events[..n].iter().map(|e| e.u64)
    }
}
