//! SIGTERM, SIGINT and SIGHUP as a blocking wait: the handler writes the signal number to a
//! self-pipe, and [`Signals::wait`] reads it, so the daemon leaves (SIGTERM, SIGINT) or reloads
//! its config (SIGHUP) outside signal context.

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

use thiserror::Error;

/// Why the handlers could not be installed or waited on.
#[derive(Debug, Error)]
pub enum SignalError {
    /// pipe2, fcntl, sigaction or read failed.
    #[error("Signal handling failed in {call}")]
    Os {
        /// The system call.
        call: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Write end of the self-pipe, read by the handler (-1: none).
static WRITE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe calls here: an atomic load and write(2); errno is preserved.
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno = unsafe { *libc::__errno_location() };
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: b is a live byte; a full pipe (EAGAIN) just loses a redundant wake-up.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn os(call: &'static str) -> SignalError {
    SignalError::Os {
        call,
        source: io::Error::last_os_error(),
    }
}

/// Installed handlers for SIGTERM, SIGINT and SIGHUP.
pub struct Signals {
    /// Read end of the self-pipe.
    read_fd: libc::c_int,
}

/// Installs the handlers (once per process; a second call replaces the pipe).
pub fn install() -> Result<Signals, SignalError> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os("pipe2"));
    }
    // SAFETY: fds[1] is the pipe's write end just created.
    if unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(os("fcntl"));
    }
    WRITE_FD.store(fds[1], Ordering::SeqCst);
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is valid; we set the handler and an empty mask.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: sa is initialised; sigemptyset and sigaction only read/write it.
        let rc = unsafe {
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(os("sigaction"));
        }
    }
    Ok(Signals { read_fd: fds[0] })
}

impl Signals {
    /// Blocks until SIGTERM, SIGINT or SIGHUP arrives (or arrived since `install`); returns its
    /// number.
    pub fn wait(&self) -> Result<i32, SignalError> {
        let mut b = 0u8;
        loop {
            // SAFETY: reads one byte into b from our pipe.
            let n = unsafe { libc::read(self.read_fd, (&mut b as *mut u8).cast(), 1) };
            if n == 1 {
                return Ok(i32::from(b));
            }
            let e = io::Error::last_os_error();
            if n < 0 && e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(SignalError::Os {
                call: "read",
                source: e,
            });
        }
    }
}
