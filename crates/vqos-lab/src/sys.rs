//! The system side of the lab: running `ip`/`tc`, network namespaces, child processes killed by
//! PID, the guard that tears a run down, the interrupt flag, and CPU counters from `/proc`.
//!
//! ## Behavior
//! Everything a run creates is registered in a [`Cleanup`] guard as it is created: processes
//! (killed by their PID with SIGTERM, then SIGKILL after a grace period, and reaped) and
//! namespaces (deleted after every process is gone, which also destroys the links in them).
//! The guard runs on drop, so an error (`?`), a panic or an interrupt all tear down the same way.
//! Children are started in their own process group so a Ctrl-C on the terminal reaches only the
//! lab, which then stops them in order.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::LabError;

/// Set by the SIGINT/SIGTERM handler; polled by the runner.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Installs a SIGINT and SIGTERM handler that asks a running lab to stop and tear down.
pub fn install_interrupt_handler() {
    // SAFETY: `on_signal` only stores to an atomic, which is async-signal-safe; the sigaction
    // struct is zeroed and then filled with valid values.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

/// Asks a running lab to stop, as Ctrl-C does (tests use it).
pub fn request_interrupt() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Whether a stop was asked for.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Clears the interrupt flag (at the start of a run).
pub(crate) fn clear_interrupt() {
    INTERRUPTED.store(false, Ordering::SeqCst);
}

/// Runs a command to completion; a non-zero exit is an error quoting its stderr.
pub fn run(args: &[&str]) -> Result<String, LabError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            program: args[0].to_string(),
            source,
        })?;
    if !out.status.success() {
        return Err(LabError::Command {
            command: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command and ignores its outcome (teardown steps).
pub fn run_quiet(args: &[&str]) {
    let _ = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A child process the lab started.
#[derive(Debug)]
pub struct Proc {
    /// What it is, for messages.
    pub label: String,
    /// The child handle (None once reaped).
    child: Option<Child>,
    /// Whether [`Proc::stop`] signals its whole process group (the child and what it forked:
    /// a server's workers), not only the child. Every child is the leader of a group of its
    /// own ([`spawn`]), so the group is this run's processes alone.
    group: bool,
}

impl Proc {
    /// Its PID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether it has exited (reaps it if so).
    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            None => true,
            Some(c) => !matches!(c.try_wait(), Ok(None)),
        }
    }

    /// From now on [`Proc::stop`] signals the child's whole process group (a server that
    /// forks workers).
    pub fn stop_group(mut self) -> Proc {
        self.group = true;
        self
    }

    /// Sends `sig` to the child (its group, with [`Proc::stop_group`]) unless it was reaped.
    pub fn signal(&mut self, sig: libc::c_int) {
        let Some(c) = &mut self.child else {
            return;
        };
        if let Ok(pid) = libc::pid_t::try_from(c.id()) {
            let target = if self.group { -pid } else { pid };
            // SAFETY: kill(2) on our own unreaped child, or on the process group it leads
            // (made by `spawn`); neither can have been reused while the child is unreaped.
            unsafe { libc::kill(target, sig) };
        }
    }

    /// Stops it: SIGTERM, up to `grace`, then SIGKILL; always reaped. By PID only (or the
    /// child's own process group, [`Proc::stop_group`]).
    pub fn stop(&mut self, grace: Duration) {
        let Some(c) = &mut self.child else {
            return;
        };
        if let Ok(Some(_)) = c.try_wait() {
            if self.group {
                // The leader is gone; what it forked may not be.
                self.signal(libc::SIGKILL);
            }
            self.child = None;
            return;
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        let mut reaped = false;
        while !reaped && Instant::now() < deadline {
            reaped = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if !reaped {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // A reaped child's PID may be reused: only its group (kept alive by what it forked,
        // if anything) is signalled then.
        if !reaped || self.group {
            self.signal(libc::SIGKILL);
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_millis(500));
    }
}

/// Spawns `args` (in namespace `netns` when given) in its own process group, with stdout and
/// stderr sent to `log` (or discarded).
pub fn spawn(
    label: &str,
    netns: Option<&str>,
    args: &[&str],
    log: Option<&Path>,
) -> Result<Proc, LabError> {
    use std::os::unix::process::CommandExt;
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).args(args);
            c
        }
        None => {
            let mut c = Command::new(args[0]);
            c.args(&args[1..]);
            c
        }
    };
    cmd.stdin(Stdio::null()).process_group(0);
    match log {
        Some(p) => {
            let f = File::create(p).map_err(|source| LabError::Io {
                what: p.display().to_string(),
                source,
            })?;
            let f2 = f.try_clone().map_err(|source| LabError::Io {
                what: p.display().to_string(),
                source,
            })?;
            cmd.stdout(f).stderr(f2);
        }
        None => {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    let child = cmd.spawn().map_err(|source| LabError::Spawn {
        program: args[0].to_string(),
        source,
    })?;
    Ok(Proc {
        label: label.to_string(),
        child: Some(child),
        group: false,
    })
}

/// Everything a run created, torn down on drop: processes first (by PID), then namespaces.
#[derive(Debug, Default)]
pub struct Cleanup {
    /// Long-lived processes (servers, the switch), stopped last among processes.
    pub services: Vec<Proc>,
    /// Namespaces to delete, in creation order.
    pub namespaces: Vec<String>,
    /// Scratch directories to remove (the switch's socket, state and config).
    pub dirs: Vec<std::path::PathBuf>,
}

impl Cleanup {
    /// Creates a namespace with `lo` up and registers it.
    pub fn netns(&mut self, name: &str) -> Result<(), LabError> {
        run_quiet(&["ip", "netns", "del", name]);
        run(&["ip", "netns", "add", name])?;
        self.namespaces.push(name.to_string());
        run(&["ip", "-n", name, "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// Tears everything down now (idempotent).
    pub fn teardown(&mut self) {
        // Stop the newest first: clients and servers before the switch.
        while let Some(mut p) = self.services.pop() {
            p.stop(Duration::from_secs(3));
        }
        while let Some(ns) = self.namespaces.pop() {
            run_quiet(&["ip", "netns", "del", &ns]);
        }
        while let Some(d) = self.dirs.pop() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Clock ticks per second of `/proc` times.
fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a process, seconds.
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')' the fields are numbered from 3 (state); utime is 14, stime 15.
    let ut: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    Some((ut + st) / clk_tck())
}

/// System-wide softirq time (all CPUs), seconds.
pub fn softirq_s() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    // cpu user nice system idle iowait irq softirq ...
    let v: f64 = line.split_whitespace().nth(7)?.parse().ok()?;
    Some(v / clk_tck())
}

/// Reads one namespace's interface byte counters from a thread that entered it.
pub struct NetnsCounters {
    /// Sends a request (interface names) and receives the counters.
    tx: std::sync::mpsc::Sender<std::sync::mpsc::Sender<Vec<(String, u64, u64)>>>,
}

impl NetnsCounters {
    /// Starts a reader thread inside namespace `ns`.
    pub fn start(ns: &str) -> Result<NetnsCounters, LabError> {
        let path = format!("/run/netns/{ns}");
        let f = File::open(&path).map_err(|source| LabError::Io {
            what: path.clone(),
            source,
        })?;
        let (tx, rx) =
            std::sync::mpsc::channel::<std::sync::mpsc::Sender<Vec<(String, u64, u64)>>>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            // SAFETY: setns on an open namespace file; it only changes this thread's netns.
            let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                let _ = ready_tx.send(Err(std::io::Error::last_os_error().to_string()));
                return;
            }
            drop(f);
            let _ = ready_tx.send(Ok(()));
            while let Ok(reply) = rx.recv() {
                let text = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap_or_default();
                let _ = reply.send(parse_net_dev(&text));
            }
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(NetnsCounters { tx }),
            Ok(Err(e)) => Err(LabError::Setup(format!("Cannot enter namespace {ns}: {e}"))),
            Err(_) => Err(LabError::Setup(format!("Cannot enter namespace {ns}"))),
        }
    }

    /// `(interface, rx_bytes, tx_bytes)` of every interface of the namespace.
    pub fn read(&self) -> Vec<(String, u64, u64)> {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(tx).is_err() {
            return Vec::new();
        }
        rx.recv().unwrap_or_default()
    }
}

/// Parses `/proc/net/dev` into `(interface, rx_bytes, tx_bytes)`.
pub fn parse_net_dev(text: &str) -> Vec<(String, u64, u64)> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let f: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            Some((name.trim().to_string(), *f.first()?, *f.get(8)?))
        })
        .collect()
}

/// Runs `f` on a new thread inside network namespace `ns` (its own threads inherit it).
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<Result<T, String>>, LabError> {
    let path = format!("/run/netns/{ns}");
    let file = std::fs::File::open(&path).map_err(|source| LabError::Io {
        what: path.clone(),
        source,
    })?;
    Ok(std::thread::spawn(move || {
        // SAFETY: setns on an open namespace file; it changes only this thread's namespace.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(format!(
                "cannot enter the namespace: {}",
                std::io::Error::last_os_error()
            ));
        }
        drop(file);
        Ok(f())
    }))
}

/// Makes the calling thread SCHED_FIFO at `priority` (threads it starts later inherit it);
/// false if the kernel refused (no CAP_SYS_NICE), which leaves the thread as it was and says
/// so once on stderr.
pub fn realtime_priority(priority: i32) -> bool {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: a valid sched_param for the calling thread (0).
    let ok = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 };
    if !ok && !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "vqos lab: warning: cannot run the latency probes at real-time priority ({}); \
             their RTT includes the host's scheduling",
            std::io::Error::last_os_error()
        );
    }
    ok
}

/// CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: a valid set of `size` bytes for the calling thread.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET reads the set for indexes below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

fn set_affinity(tid: libc::pid_t, cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it for indexes below
    // CPU_SETSIZE, which `cpus` (from allowed_cpus) are.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: a valid set for thread `tid`.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Pins every thread of process `pid` to `cpus` (threads it starts later inherit it).
pub fn pin_process(pid: u32, cpus: &[usize]) -> Result<(), LabError> {
    let dir = format!("/proc/{pid}/task");
    let mut pinned = std::collections::HashSet::new();
    // Until a listing shows no thread not yet pinned: a thread started meanwhile by one not yet
    // pinned would otherwise escape. A thread that exits between the listing and the call
    // (ESRCH: vqosd ends a thread per API connection) is skipped.
    loop {
        let tasks = std::fs::read_dir(&dir).map_err(|source| LabError::Io {
            what: dir.clone(),
            source,
        })?;
        let mut new = 0;
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if !pinned.insert(tid) {
                continue;
            }
            new += 1;
            match set_affinity(tid, cpus) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => {
                    return Err(LabError::Io {
                        what: format!("pinning thread {tid} of {pid} to CPUs {cpus:?}"),
                        source,
                    })
                }
            }
        }
        if new == 0 {
            return Ok(());
        }
    }
}

/// The calling thread pinned to some CPUs until dropped; the threads and processes it starts
/// meanwhile inherit the pinning (and keep it).
pub struct ThreadPin {
    old: Vec<usize>,
}

impl ThreadPin {
    /// Pins the calling thread to `cpus`.
    pub fn new(cpus: &[usize]) -> Result<ThreadPin, LabError> {
        let old = allowed_cpus();
        if old.is_empty() {
            return Err(LabError::Invalid(
                "cannot read this thread's CPU affinity (sched_getaffinity)".into(),
            ));
        }
        set_affinity(0, cpus).map_err(|source| LabError::Io {
            what: format!("pinning the lab to CPUs {cpus:?}"),
            source,
        })?;
        Ok(ThreadPin { old })
    }
}

impl Drop for ThreadPin {
    fn drop(&mut self) {
        if !self.old.is_empty() {
            let _ = set_affinity(0, &self.old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_is_parsed() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo:     100       2    0    0    0     0          0         0      200       2    0    0    0     0       0          0\n  \
v1: 123456789  1000    0    0    0     0          0         0    4242      10    0    0    0     0       0          0\n";
        let v = parse_net_dev(text);
        assert_eq!(
            v,
            vec![
                ("lo".to_string(), 100, 200),
                ("v1".to_string(), 123_456_789, 4242)
            ]
        );
    }

    #[test]
    fn a_thread_pin_holds_and_is_undone() {
        let before = allowed_cpus();
        assert!(!before.is_empty());
        std::thread::spawn(move || {
            let first = before[0];
            {
                let _pin = ThreadPin::new(&[first]).unwrap();
                assert_eq!(allowed_cpus(), vec![first]);
                // A thread started meanwhile inherits it.
                let child = std::thread::spawn(allowed_cpus).join().unwrap();
                assert_eq!(child, vec![first]);
            }
            assert_eq!(allowed_cpus(), before);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn own_cpu_time_is_read() {
        let t = process_cpu_s(std::process::id()).expect("own /proc/PID/stat");
        assert!(t >= 0.0);
        assert!(softirq_s().is_some());
    }
}
