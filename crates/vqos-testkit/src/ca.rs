//! Certificates for tests, made with `openssl`: a CA of the test's own, a server certificate
//! for 127.0.0.1, client certificates, and host certificates that serve and connect (the
//! aggregators' sessions: a host is a client of one leader and may be the server of another).
//! Keys are P-256, certificates last two days.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why TLS etcd tests cannot run here (`None`: they can).
pub fn openssl_missing() -> Option<String> {
    let ok = Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!ok).then(|| "openssl not installed (apt-get install -y openssl)".to_string())
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("openssl: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes `ca.pem` (a CA of its own) and `server.pem` / `server.key` (a certificate it signed
/// for IP 127.0.0.1, server use only) in `dir`.
pub(crate) fn make_certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-nodes",
            "-days",
            "2",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=vqos test CA",
        ],
    );
    issue(
        dir,
        "server",
        "/CN=127.0.0.1",
        "basicConstraints = CA:FALSE\nkeyUsage = digitalSignature, keyEncipherment\n\
         extendedKeyUsage = serverAuth\nsubjectAltName = IP:127.0.0.1\n",
    );
}

/// Makes `NAME.pem` / `NAME.key` in `dir`: a client certificate for CN `name`, signed by the
/// CA of [`make_certificates`] (client use only).
pub(crate) fn make_client_certificate(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    issue(
        dir,
        name,
        &format!("/CN={name}"),
        "basicConstraints = CA:FALSE\nkeyUsage = digitalSignature\n\
         extendedKeyUsage = clientAuth\n",
    )
}

/// Makes `NAME.key`, and `NAME.pem` for `subject` with the extensions `ext`, signed for two
/// days by the CA in `dir` (`ca.pem`, `ca.key`): the certificate and key files.
fn issue(dir: &Path, name: &str, subject: &str, ext: &str) -> (PathBuf, PathBuf) {
    let file = |suffix: &str| format!("{name}.{suffix}");
    let (key, csr, pem, extfile) = (file("key"), file("csr"), file("pem"), file("ext"));
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ],
    );
    std::fs::write(dir.join(&extfile), ext).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &pem,
            "-extfile",
            &extfile,
        ],
    );
    (dir.join(pem), dir.join(key))
}

/// A CA of a test's own in a directory the test owns (it is not removed here): `ca.pem`, and
/// `server.pem` / `server.key` for IP 127.0.0.1. Needs `openssl` ([`openssl_missing`]).
#[derive(Debug, Clone)]
pub struct TestCa {
    dir: PathBuf,
}

impl TestCa {
    /// Makes the CA and its server certificate in `dir` (created if missing).
    pub fn new(dir: &Path) -> TestCa {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        make_certificates(dir);
        TestCa {
            dir: dir.to_path_buf(),
        }
    }

    /// The CA's certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A client certificate and key for CN `name` (client use only).
    pub fn client(&self, name: &str) -> (PathBuf, PathBuf) {
        make_client_certificate(&self.dir, name)
    }

    /// A host's certificate and key for CN `name`: it serves on 127.0.0.1 and connects as a
    /// client, with the one certificate (both extended key usages).
    pub fn host(&self, name: &str) -> (PathBuf, PathBuf) {
        issue(
            &self.dir,
            name,
            &format!("/CN={name}"),
            "basicConstraints = CA:FALSE\nkeyUsage = digitalSignature, keyEncipherment\n\
             extendedKeyUsage = serverAuth, clientAuth\nsubjectAltName = IP:127.0.0.1\n",
        )
    }
}
