//! # vqos-testkit
//!
//! What the real-traffic tests of `vqos-dataplane` and `vqosd` share: network namespaces and
//! child processes that are removed by `Drop` guards (also when a test fails or panics), the
//! check that a test can run at all (root, iperf3) with the lock that runs such tests one at a
//! time, and small timing helpers.
//!
//! ```no_run
//! use std::time::Duration;
//! use vqos_testkit::{can_run, Netns};
//!
//! let Some(_serial) = can_run("my_test") else { return };
//! let ns = Netns::new("vqt-demo".into());
//! let server = ns.spawn(&["iperf3", "-s", "-1"]);
//! // ... traffic ...
//! let report = server.output_within(Duration::from_secs(30));
//! # let _ = report;
//! ```
//!
//! ## Behavior
//! - [`can_run`] prints `SKIP <test>: <why>` and returns `None` when the process is not root or
//!   iperf3 is missing; otherwise it returns the guard of a lock shared by every test of the
//!   test binary (two cores cannot run two traffic tests side by side without each measuring
//!   the other). A test that failed while holding it poisons it; the next one still runs.
//! - [`Netns`] deletes its namespace on drop (which also removes the links inside);
//!   [`Netns::new`] deletes a leftover of the same name first.
//! - [`Proc`] kills its process by PID and reaps it on drop; nothing is ever killed by name.
//!
//! ## Limitations
//! Linux only; needs `ip` (iproute2). Names must be unique per test and process (callers put
//! their PID in them); this crate does not choose them.
#![deny(missing_docs)]

mod ca;
mod etcd;
pub mod frames;
mod packet;
mod testpmd;

pub use ca::{openssl_missing, TestCa};
pub use etcd::{etcd_missing, Etcd, EtcdCluster};
pub use packet::PacketSocket;
pub use testpmd::{testpmd_missing, Testpmd};

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One real-traffic test at a time within a test binary.
static SERIAL: Mutex<()> = Mutex::new(());

/// The machine-wide lock file: real-traffic tests of every process (two checkouts, a test run
/// beside a benchmark) take it, so they never share the two cores with each other.
pub const MACHINE_LOCK: &str = "/run/lock/vqos-real-traffic.lock";

/// Held while a real-traffic test runs: the in-process lock, then the machine-wide `flock`
/// (released when the file closes, also when the process dies).
pub struct SerialGuard {
    _thread: MutexGuard<'static, ()>,
    _machine: File,
}

/// Takes the machine-wide real-traffic lock, waiting for it (blocking `flock`).
pub fn machine_lock() -> File {
    let f = File::options()
        .create(true)
        .append(true)
        .open(MACHINE_LOCK)
        .unwrap_or_else(|e| panic!("open {MACHINE_LOCK}: {e}"));
    // SAFETY: flock on a descriptor this function owns; it blocks until the lock is ours.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(
        rc,
        0,
        "flock {MACHINE_LOCK}: {}",
        std::io::Error::last_os_error()
    );
    f
}

/// True when running as root; otherwise prints that the test is skipped.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("SKIP {test}: needs root");
    }
    root
}

/// The serial lock when a real-traffic test can run (root, iperf3 installed); `None` after
/// printing why not.
pub fn can_run(test: &str) -> Option<SerialGuard> {
    if !root_or_skip(test) {
        return None;
    }
    let iperf = Command::new("iperf3")
        .arg("--version")
        .stdout(Stdio::null())
        .status();
    if !iperf.is_ok_and(|s| s.success()) {
        println!("SKIP {test}: iperf3 not installed (apt-get install -y iperf3)");
        return None;
    }
    let thread = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    Some(SerialGuard {
        _thread: thread,
        _machine: machine_lock(),
    })
}

/// Runs a command and panics with its stderr if it fails.
pub fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls `f` every millisecond until it returns `Some`, for at most `limit`.
pub fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sleeps until `t0 + secs` (returns at once if that has passed).
pub fn sleep_until(t0: Instant, secs: f64) {
    let at = t0 + Duration::from_secs_f64(secs);
    if let Some(d) = at.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

/// A process we started; killed by its PID and reaped on drop.
pub struct Proc(Option<Child>);

impl Proc {
    /// Wraps a started child.
    pub fn new(child: Child) -> Proc {
        Proc(Some(child))
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.0
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Its stdout once it exits; killed if it runs past `limit`, so a broken switch fails the
    /// test instead of hanging it. Stdout is read while it runs (a child that writes more than
    /// a pipe holds would otherwise block until killed).
    pub fn output_within(mut self, limit: Duration) -> String {
        use std::io::Read;
        let deadline = Instant::now() + limit;
        let Some(mut child) = self.0.take() else {
            return String::new();
        };
        let reader = child.stdout.take().map(|mut out| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = out.read_to_end(&mut buf);
                buf
            })
        });
        while matches!(child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.wait();
        let out = reader
            .map(|r| r.join().unwrap_or_default())
            .unwrap_or_default();
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A network namespace, deleted on drop.
pub struct Netns(String);

impl Netns {
    /// Creates namespace `name` (deleting a leftover of that name) with `lo` up.
    pub fn new(name: String) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns(name);
        sh(&["ip", "-n", &ns.0, "link", "set", "lo", "up"]);
        ns
    }

    /// Turns IPv6 off for interfaces moved in later: no router or neighbour solicitations, so
    /// a namespace sends only what the test makes it send.
    pub fn without_ipv6(self) -> Netns {
        sh(&[
            "ip",
            "netns",
            "exec",
            &self.0,
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6",
        ]);
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// Moves `link` in, gives it `addr` and brings it up.
    pub fn take_link(&self, link: &str, addr: &str) {
        sh(&["ip", "link", "set", link, "netns", &self.0]);
        sh(&["ip", "-n", &self.0, "addr", "add", addr, "dev", link]);
        sh(&["ip", "-n", &self.0, "link", "set", link, "up"]);
    }

    /// Whether `link` exists in it.
    pub fn has_link(&self, link: &str) -> bool {
        Command::new("ip")
            .args(["-n", &self.0, "link", "show", link])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// Starts `args` inside it, stdout captured (for [`Proc::output_within`]), stderr dropped.
    pub fn spawn(&self, args: &[&str]) -> Proc {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("ip netns exec {} {args:?}: {e}", self.0));
        Proc::new(child)
    }

    /// Runs `f` on a thread that has entered this namespace (sockets it opens live there).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open(&path).unwrap();
                // SAFETY: setns on a namespace file we hold open; it affects this thread only.
                let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Network links (TAPs, veths) outside any test namespace, deleted on drop so a failing test
/// leaves none behind. Deleting a link that is already gone is not an error.
pub struct Links(pub Vec<String>);

impl Drop for Links {
    fn drop(&mut self) {
        for link in &self.0 {
            let _ = Command::new("ip").args(["link", "del", link]).output();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_returns_the_first_value_or_gives_up() {
        let mut n = 0;
        assert_eq!(
            poll(Duration::from_secs(1), || {
                n += 1;
                (n == 3).then_some(n)
            }),
            Some(3)
        );
        assert_eq!(poll(Duration::from_millis(5), || None::<()>), None);
    }

    #[test]
    fn a_proc_is_killed_on_drop_and_its_output_read() {
        let mut p = Proc::new(
            Command::new("sleep")
                .arg("30")
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        assert!(p.running());
        let t = Instant::now();
        let out = p.output_within(Duration::from_millis(100));
        assert!(out.is_empty() && t.elapsed() < Duration::from_secs(10));
        let echo = Proc::new(
            Command::new("echo")
                .arg("hi")
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        assert_eq!(echo.output_within(Duration::from_secs(5)), "hi\n");
        // More than a pipe holds (64 KiB): read while it runs, not only after.
        let big = Proc::new(
            Command::new("head")
                .args(["-c", "1000000", "/dev/zero"])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        assert_eq!(big.output_within(Duration::from_secs(10)).len(), 1_000_000);
    }

    #[test]
    fn a_namespace_is_gone_after_drop() {
        let Some(_g) = can_run("a_namespace_is_gone_after_drop") else {
            return;
        };
        let name = format!("vqtk{}", std::process::id() % 100_000);
        {
            let ns = Netns::new(name.clone()).without_ipv6();
            assert!(ns.has_link("lo"));
            assert_eq!(ns.name(), name);
        }
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        assert!(!String::from_utf8_lossy(&list.stdout).contains(&name));
    }
}
