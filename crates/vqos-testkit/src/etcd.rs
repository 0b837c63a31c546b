//! A private single-node etcd for a test: loopback ports derived from the PID, a data
//! directory of its own, killed by PID and removed on drop; optionally serving its clients
//! over TLS with a certificate of a CA made for the test ([`Etcd::start_tls`], `openssl`), or
//! also asking its clients for a certificate of that CA, with authentication on
//! ([`Etcd::start_mtls`]: each client is the etcd user its certificate's CN names).

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

/// How a test's etcd talks to its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Security {
    /// `http://`.
    Plain,
    /// `https://`, a server certificate only.
    Tls,
    /// `https://`, and every client shows a certificate of the test's CA
    /// (`--client-cert-auth`); authentication is on, `etcdctl` is user `root` by its
    /// certificate.
    Mutual,
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
    /// How clients connect (certificate files are in `dir`).
    security: Security,
    /// `--initial-cluster`: `NAME=PEER_URL`, one per member.
    initial_cluster: String,
}

fn free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

impl Etcd {
    /// Starts etcd number `index` of this process and waits until it answers (panics after
    /// 30 s, with its log).
    pub fn start(index: u16) -> Etcd {
        Etcd::start_with(index, Security::Plain)
    }

    /// [`Etcd::start`] serving its clients over TLS only (`https://`): a CA and a server
    /// certificate for 127.0.0.1 are made for it (see [`Etcd::ca_file`]; needs `openssl`).
    pub fn start_tls(index: u16) -> Etcd {
        Etcd::start_with(index, Security::Tls)
    }

    /// [`Etcd::start_tls`] that also asks every client for a certificate of its CA
    /// (`--client-cert-auth`; [`Etcd::client_cert`] makes one), with authentication enabled:
    /// user `root` (passwordless, by certificate: what [`Etcd::ctl`] uses) holds role `root`,
    /// and a client is the user its certificate's CN names. Needs `openssl`.
    pub fn start_mtls(index: u16) -> Etcd {
        let e = Etcd::start_with(index, Security::Mutual);
        e.ctl(&["user", "add", "root", "--no-password"]);
        e.ctl(&["user", "grant-role", "root", "root"]);
        e.ctl(&["auth", "enable"]);
        e
    }

    /// A client certificate and its key for CN `name`, signed by the CA of a TLS etcd.
    pub fn client_cert(&self, name: &str) -> (PathBuf, PathBuf) {
        assert!(self.security != Security::Plain, "a plain etcd has no CA");
        crate::ca::make_client_certificate(&self.dir, name)
    }

    fn start_with(index: u16, security: Security) -> Etcd {
        let mut e = Etcd::make(index, security);
        e.initial_cluster = format!("{}=http://127.0.0.1:{}", e.name, e.peer_port);
        if security != Security::Plain {
            crate::ca::make_certificates(&e.dir);
        }
        if security == Security::Mutual {
            crate::ca::make_client_certificate(&e.dir, "root");
        }
        e.spawn();
        e
    }

    /// A member not started yet: its ports, name and empty data directory.
    fn make(index: u16, security: Security) -> Etcd {
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
        Etcd {
            child: None,
            dir,
            name,
            client_port: base,
            peer_port: base + 1,
            security,
            initial_cluster: String::new(),
        }
    }

    /// The client URL, `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn url(&self) -> String {
        let scheme = match self.security {
            Security::Plain => "http",
            Security::Tls | Security::Mutual => "https",
        };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The CA certificate (PEM) of a TLS etcd's server certificate.
    pub fn ca_file(&self) -> Option<PathBuf> {
        (self.security != Security::Plain).then(|| self.dir.join("ca.pem"))
    }

    /// `etcdctl`'s TLS arguments (user `root` by its certificate with mutual TLS).
    fn ctl_tls(&self) -> Vec<String> {
        let mut args: Vec<String> = self
            .ca_file()
            .map(|ca| format!("--cacert={}", ca.display()))
            .into_iter()
            .collect();
        if self.security == Security::Mutual {
            args.push(format!("--cert={}", self.dir.join("root.pem").display()));
            args.push(format!("--key={}", self.dir.join("root.key").display()));
        }
        args
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    fn spawn(&mut self) {
        self.launch();
        self.wait_ready();
    }

    /// Starts the process (a member of a cluster answers only once a quorum runs).
    fn launch(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let client = self.url();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .unwrap();
        let mut tls = Vec::new();
        if self.security != Security::Plain {
            tls.push("--cert-file".to_string());
            tls.push(self.dir.join("server.pem").display().to_string());
            tls.push("--key-file".to_string());
            tls.push(self.dir.join("server.key").display().to_string());
        }
        if self.security == Security::Mutual {
            tls.push("--client-cert-auth".to_string());
            tls.push("--trusted-ca-file".to_string());
            tls.push(self.dir.join("ca.pem").display().to_string());
        }
        let child = Command::new("etcd")
            .args(["--name", &self.name])
            .args(&tls)
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("etcd: {e}"));
        self.child = Some(child);
    }

    /// Waits until it answers `endpoint health` (panics after 30 s, with its log).
    fn wait_ready(&mut self) {
        let client = self.url();
        let ready = poll(Duration::from_secs(30), || {
            let ok = Command::new("etcdctl")
                .args([
                    "--endpoints",
                    &client,
                    "--command-timeout=1s",
                    "endpoint",
                    "health",
                ])
                .args(self.ctl_tls())
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

    /// Whether its process runs (not killed).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts it again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs `etcdctl` against a mutual-TLS etcd as the user of client certificate `cert`
    /// (and its key): its stdout, or its stderr when it fails.
    pub fn ctl_as(
        &self,
        (cert, key): &(PathBuf, PathBuf),
        args: &[&str],
    ) -> Result<String, String> {
        let ca = self.ca_file().expect("a TLS etcd");
        let out = Command::new("etcdctl")
            .args(["--endpoints", &self.url()])
            .arg(format!("--cacert={}", ca.display()))
            .arg(format!("--cert={}", cert.display()))
            .arg(format!("--key={}", key.display()))
            .args(args)
            .env("ETCDCTL_API", "3")
            .output()
            .unwrap_or_else(|e| panic!("etcdctl: {e}"));
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Runs `etcdctl` against it with `args`; its stdout, panicking if it fails.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new("etcdctl")
            .args(["--endpoints", &self.url()])
            .args(self.ctl_tls())
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

/// A cluster of plain (`http://`) etcd members on loopback, each an [`Etcd`] of this process
/// (numbers `first`, `first + 1`, …: they must not be used by another [`Etcd`] at once).
pub struct EtcdCluster {
    /// The members; kill and restart them one by one.
    pub members: Vec<Etcd>,
}

impl EtcdCluster {
    /// Starts `n` members and waits until every one answers.
    pub fn start(first: u16, n: u16) -> EtcdCluster {
        let mut members: Vec<Etcd> = (first..first + n)
            .map(|i| Etcd::make(i, Security::Plain))
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        for m in &mut members {
            m.initial_cluster = initial.clone();
            m.launch();
        }
        for m in &mut members {
            m.wait_ready();
        }
        EtcdCluster { members }
    }

    /// Every member's client URL, comma-separated (what `EtcdSettings::from_list` takes).
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.members.iter().map(Etcd::url).collect();
        urls.join(",")
    }
}
