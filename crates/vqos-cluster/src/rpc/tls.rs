//! Mutual TLS on the hosts' sessions with the aggregators' leaders (docs/cluster.md,
//! "Security"): who may open a session, and as which host.
//!
//! ## Behavior
//! - **One certificate per host**, from the fleet's CA, whose subject CN is the host's name
//!   (as etcd takes its user from the CN). A node serves with it and a host connects with it:
//!   the certificate needs both extended key usages, and a subject alternative name for the
//!   address the node advertises.
//! - **A leader admits only certificates of the CA** (the handshake fails without one), and a
//!   session's reports must name the host its certificate names: another name ends the session
//!   with `PermissionDenied` (`LeaderCodec::for_peer`). So a host cannot report for another,
//!   and an outsider cannot report at all.
//! - **No downgrade**: a host with TLS settings refuses a leader that advertises `http://`, and
//!   a host without them refuses one at `https://`, each with the reason; neither sends a
//!   report in the clear or to a server it cannot check.
//! - The files are read at each connection, so a renewed certificate is used from the next
//!   session on (a node's own, when it starts serving).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig,
};

/// How long a TLS handshake may take before the server drops the connection.
const HANDSHAKE: Duration = Duration::from_secs(5);

/// The aggregator sessions' TLS files (PEM): the fleet's CA, and this host's certificate and
/// key (CN = the host's name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcTls {
    /// The CA that signed every host's certificate.
    pub ca_file: PathBuf,
    /// This host's certificate.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("aggregator TLS {what} {}: {e}", path.display()))
}

impl RpcTls {
    fn identity(&self) -> Result<Identity, String> {
        let cert = read("certificate", &self.cert_file)?;
        let key = read("key", &self.key_file)?;
        Ok(Identity::from_pem(cert, key))
    }

    fn ca(&self) -> Result<Certificate, String> {
        Ok(Certificate::from_pem(read("CA", &self.ca_file)?))
    }

    /// The server's side: its certificate, and every client must show one of the CA.
    pub fn server(&self) -> Result<ServerTlsConfig, String> {
        Ok(ServerTlsConfig::new()
            .identity(self.identity()?)
            .client_ca_root(self.ca()?)
            .timeout(HANDSHAKE))
    }

    /// The client's side: the server's certificate checked against the CA, and this host's
    /// shown.
    pub fn client(&self) -> Result<ClientTlsConfig, String> {
        Ok(ClientTlsConfig::new()
            .ca_certificate(self.ca()?)
            .identity(self.identity()?))
    }
}

/// A connection to a leader at `endpoint` (as its election key gives it), over TLS when `tls`
/// is given, made within `timeout`; the reason when it cannot be made, or must not be (module
/// doc: no downgrade). Calls on it have no deadline of their own (a session lives long).
pub async fn connect(
    endpoint: &str,
    tls: Option<&RpcTls>,
    timeout: Duration,
) -> Result<Channel, String> {
    let secure = endpoint.starts_with("https://");
    let mut e = Endpoint::from_shared(endpoint.to_string())
        .map_err(|err| format!("endpoint {endpoint:?}: {err}"))?
        .connect_timeout(timeout);
    match (tls, secure) {
        (Some(t), true) => {
            e = e
                .tls_config(t.client()?)
                .map_err(|err| format!("{endpoint}: {err}"))?;
        }
        (Some(_), false) => {
            return Err(format!(
                "{endpoint} is not https://, and this host talks to the aggregators over \
                 TLS only (cluster.aggregators.ca_file)"
            ))
        }
        (None, true) => {
            return Err(format!(
                "{endpoint} is https://: this host needs cluster.aggregators.ca_file, \
                 cert_file and key_file to reach it"
            ))
        }
        (None, false) => {}
    }
    e.connect()
        .await
        .map_err(|err| format!("{endpoint}: {}", chain(&err)))
}

/// An error and its sources, `: `-joined (a TLS failure's reason is a few sources down).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        next = c.source();
    }
    s
}

/// The host a peer's certificate chain names: its first (leaf) certificate's subject CN.
pub fn peer_host(chain: &[impl AsRef<[u8]>]) -> Result<String, String> {
    let leaf = chain
        .first()
        .ok_or("the peer showed no certificate")?
        .as_ref();
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("the peer's certificate cannot be read: {e}"))?;
    let mut cns = cert.subject().iter_common_name();
    let cn = cns
        .next()
        .ok_or("the peer's certificate has no CN (it must be the host's name)")?;
    if cns.next().is_some() {
        return Err("the peer's certificate has more than one CN".into());
    }
    cn.as_str()
        .map(str::to_string)
        .map_err(|e| format!("the peer's certificate's CN is not text: {e}"))
}
