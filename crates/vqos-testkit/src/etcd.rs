//! A private single-node etcd for a test: loopback ports derived from the PID, a data
//! directory of its own, killed by PID and removed on drop.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::poll;

/// Why etcd tests cannot run here (`None`: they can).
pub fn etcd_missing() -> Option<String> {
    let ok = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!ok).then(|| "etcd not installed (apt-get install -y etcd-server)".to_string())
}

/// A running etcd; see the module doc.
pub struct Etcd {
    /// The process (`None` while killed).
    child: Option<Child>,
    /// Its data directory (removed on drop).
    dir: PathBuf,
    /// Member name.
    name: String,
    /// Client port on 127.0.0.1.
    client_port: u16,
    /// Peer port on 127.0.0.1.
    peer_port: u16,
}

fn free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

impl Etcd {
    /// Starts etcd number `index` of this process and waits until it answers (panics after
    /// 30 s, with its log).
    pub fn start(index: u16) -> Etcd {
        let pid = std::process::id();
        // 8 etcds per process (16 ports) before the next PID's range; a port in use is skipped.
        let slot = (pid % 2500) as u16 * 16 + (index % 8) * 2;
        let mut base = 21000 + slot % 40000;
        for _ in 0..100 {
            if free(base) && free(base + 1) {
                break;
            }
            base = 21000 + (base - 21000 + 37) % 40000;
        }
        let name = format!("vqt-etcd-{pid}-{index}");
        let dir = std::env::temp_dir().join(&name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut e = Etcd {
            child: None,
            dir,
            name,
            client_port: base,
            peer_port: base + 1,
        };
        e.spawn();
        e
    }

    /// The client URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let client = self.url();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("{}={peer}", self.name)])
            .args(["--initial-cluster-state", "new"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("etcd: {e}"));
        self.child = Some(child);
        let ready = poll(Duration::from_secs(30), || {
            let ok = Command::new("etcdctl")
                .args([
                    "--endpoints",
                    &client,
                    "--command-timeout=1s",
                    "endpoint",
                    "health",
                ])
                .env("ETCDCTL_API", "3")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                std::thread::sleep(Duration::from_millis(100));
            }
            ok.then_some(())
        });
        assert!(ready.is_some(), "etcd did not start:\n{}", self.log());
    }

    /// Kills it (SIGKILL by PID) and reaps it; the data stays for [`Etcd::restart`].
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs `etcdctl` against it with `args`; its stdout, panicking if it fails.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new("etcdctl")
            .args(["--endpoints", &self.url()])
            .args(args)
            .env("ETCDCTL_API", "3")
            .output()
            .unwrap_or_else(|e| panic!("etcdctl: {e}"));
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
