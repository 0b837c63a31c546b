//! [`Testpmd`]: DPDK's `dpdk-testpmd` as the stand-in VM of the vhost-user tests — one instance
//! with two `virtio_user` ports (DPDK's virtio PMD over a vhost-user socket each) in `mac`
//! forwarding on CPU 0, interactive, without hugepages.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::Proc;

/// Why a testpmd test cannot run here, if it cannot (not root, testpmd missing).
pub fn testpmd_missing() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root");
    }
    let found = Command::new("sh")
        .args(["-c", "command -v dpdk-testpmd"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!found).then_some("dpdk-testpmd not installed (apt-get install -y dpdk-dev)")
}

/// A running testpmd; killed (by its PID) and its DPDK runtime directory removed on drop.
pub struct Testpmd {
    /// Its commands.
    stdin: Option<ChildStdin>,
    /// Everything it printed so far.
    out: Arc<Mutex<String>>,
    /// Drains its stdout.
    reader: Option<JoinHandle<()>>,
    /// The process.
    proc: Option<Proc>,
    /// `/var/run/dpdk/<file prefix>`.
    runtime_dir: String,
}

impl Testpmd {
    /// Starts testpmd with ports 0 and 1 on `sockets` (`server`: testpmd listens, the switch
    /// connects — the switch's client mode), MACs `02:00:00:00:00:a1`/`a2`, each port sending
    /// what it receives to the other's MAC, with `queue_size` descriptors per ring.
    pub fn start(sockets: [&Path; 2], server: bool, queue_size: u32) -> Testpmd {
        Self::start_queues(sockets, server, queue_size, 1)
    }

    /// As [`Testpmd::start`], each port with `queues` queue pairs (virtio `MQ`), all polled
    /// by testpmd's one forwarding core (a stream per port and queue).
    pub fn start_queues(
        sockets: [&Path; 2],
        server: bool,
        queue_size: u32,
        queues: u16,
    ) -> Testpmd {
        let prefix = format!(
            "vqos-tp-{}-{}-{queues}",
            std::process::id(),
            u8::from(server)
        );
        let vdev = |i: usize| {
            format!(
                "net_virtio_user{i},path={},queues={queues},queue_size={queue_size},mac=02:00:00:00:00:a{}{}",
                sockets[i].display(),
                i + 1,
                if server { ",server=1" } else { "" }
            )
        };
        // Line-buffered stdout (stdbuf): the statistics printed by `stop` must arrive while
        // testpmd still runs.
        let mut child = Command::new("stdbuf")
            .args(["-oL", "dpdk-testpmd"])
            .args(["--lcores", "0@0,1@0", "--no-pci", "--no-huge", "-m", "512"])
            .args(["--file-prefix", &prefix, "--log-level", "lib.eal:error"])
            .args(["--vdev", &vdev(0), "--vdev", &vdev(1)])
            .args(["--", "-i", "--forward-mode=mac", "--txpkts=64"])
            .args(["--total-num-mbufs=32768", "--nb-cores=1"])
            .arg(format!("--rxq={queues}"))
            .arg(format!("--txq={queues}"))
            .args([
                "--eth-peer=0,02:00:00:00:00:a2",
                "--eth-peer=1,02:00:00:00:00:a1",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dpdk-testpmd");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let out = Arc::new(Mutex::new(String::new()));
        let reader = {
            let out = out.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                    o.push_str(&line);
                    o.push('\n');
                }
            })
        };
        Testpmd {
            stdin,
            out,
            reader: Some(reader),
            proc: Some(Proc::new(child)),
            runtime_dir: format!("/var/run/dpdk/{prefix}"),
        }
    }

    /// Sends one interactive command (`start tx_first 16`, `stop`, ...).
    pub fn command(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            writeln!(stdin, "{line}").expect("testpmd's stdin");
        }
    }

    /// What it printed so far.
    pub fn output(&self) -> String {
        self.out.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `RX-packets` and `TX-packets` of the last "Accumulated forward statistics" block
    /// (printed by `stop`).
    pub fn accumulated(&self) -> Option<(u64, u64)> {
        let out = self.output();
        let block = &out[out.rfind("Accumulated forward statistics")?..];
        let value = |key: &str| -> Option<u64> {
            let at = block.find(key)? + key.len();
            block[at..].split_whitespace().next()?.parse().ok()
        };
        Some((value("RX-packets:")?, value("TX-packets:")?))
    }

    /// `quit`, then waits (at most 30 s) for it to exit.
    pub fn quit(mut self) {
        self.command("quit");
        self.stdin = None;
        if let Some(p) = self.proc.take() {
            p.output_within(std::time::Duration::from_secs(30));
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        self.stdin = None;
        drop(self.proc.take());
        let _ = std::fs::remove_dir_all(&self.runtime_dir);
    }
}
