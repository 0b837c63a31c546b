//! The kick worker of a session: waits on the guest's kick eventfds and turns a guest TX kick
//! into a signal on the port's readiness eventfd.
//!
//! It polls its own duplicates of the kick eventfds (re-read after every change the protocol
//! thread announces through [`Rearm`]), so the protocol thread may replace or close a kick
//! eventfd at any time without the worker polling a closed or reused descriptor. A kick of a
//! ring that is not started and enabled is consumed and ignored.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::QueueT;

use super::backend::{is_guest_tx, Shared};
use super::counters::bump;
use crate::sys::EventFd;

/// Wakes the worker so that it re-reads the kick eventfds (cloneable handle).
#[derive(Debug, Clone)]
pub(crate) struct Rearm(Arc<Control>);

/// What the worker and its owner share.
#[derive(Debug)]
struct Control {
    /// Signalled on every change (and to stop).
    event: EventFd,
    /// Set to end the worker.
    stop: AtomicBool,
}

impl Rearm {
    /// Asks the worker to re-read the kick eventfds.
    pub(crate) fn signal(&self) {
        self.0.event.signal();
    }
}

/// The running worker; stopped and joined on drop.
pub(crate) struct KickWorker {
    /// Control shared with the thread.
    rearm: Rearm,
    /// The thread.
    thread: Option<JoinHandle<()>>,
}

impl KickWorker {
    /// Starts the worker over the session's vrings `[rx0, tx0, rx1, tx1, ...]`.
    pub(crate) fn start(shared: Arc<Shared>, vrings: Vec<VringRwLock>) -> std::io::Result<Self> {
        let control = Arc::new(Control {
            event: EventFd::new().map_err(|crate::sys::SysError::Call(_, e)| e)?,
            stop: AtomicBool::new(false),
        });
        let rearm = Rearm(control.clone());
        let thread = std::thread::Builder::new()
            .name(format!("vhk-{}", shared.name))
            .spawn(move || run(&shared, &vrings, &control))?;
        Ok(KickWorker {
            rearm,
            thread: Some(thread),
        })
    }

    /// A handle for the protocol thread.
    pub(crate) fn rearm(&self) -> Rearm {
        self.rearm.clone()
    }
}

impl Drop for KickWorker {
    fn drop(&mut self) {
        self.rearm.0.stop.store(true, Ordering::Release);
        self.rearm.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A duplicate of vring `v`'s kick eventfd, if it has one.
fn dup_kick(v: &VringRwLock) -> Option<OwnedFd> {
    let st = v.get_ref();
    let fd = st.get_kick().as_ref()?.as_raw_fd();
    // SAFETY: dup of a descriptor that stays open while we hold the vring's lock.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    // SAFETY: a fresh descriptor we own (when non-negative).
    (d >= 0).then(|| unsafe { OwnedFd::from_raw_fd(d) })
}

/// Reads (resets) an eventfd.
fn consume(fd: i32) {
    let mut buf = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live buffer.
    unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 8) };
}

fn run(shared: &Shared, vrings: &[VringRwLock], control: &Control) {
    loop {
        if control.stop.load(Ordering::Acquire) {
            return;
        }
        let kicks: Vec<Option<OwnedFd>> = vrings.iter().map(dup_kick).collect();
        let mut fds: Vec<libc::pollfd> = std::iter::once(control.event.raw())
            .chain(
                kicks
                    .iter()
                    .map(|k| k.as_ref().map_or(-1, |k| k.as_raw_fd())),
            )
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        loop {
            // SAFETY: fds is a live array of fds.len() pollfd; negative fds are ignored.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if r < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            if fds[0].revents != 0 {
                control.event.clear();
                break; // re-read the kick eventfds (or stop)
            }
            for (q, p) in fds.iter_mut().enumerate().skip(1) {
                if p.revents == 0 {
                    continue;
                }
                p.revents = 0;
                consume(p.fd);
                let v = &vrings[q - 1];
                let live = {
                    let st = v.get_ref();
                    st.is_enabled() && st.get_queue().ready()
                };
                if live && is_guest_tx(q - 1) {
                    bump(&shared.counters.kicks, 1);
                    // The shard that reads this pair's TX queue (`super::VhostUserRxQueue`).
                    shared.ready_of((q - 1) / 2).signal();
                }
            }
        }
    }
}
