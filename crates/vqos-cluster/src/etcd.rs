//! The connection to etcd: endpoints, credentials, TLS, and a deadline on every call.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use serde::Deserialize;
use thiserror::Error;

/// Why etcd could not be used.
#[derive(Debug, Error)]
pub enum EtcdError {
    /// Settings that cannot work.
    #[error("Invalid etcd settings: {0}")]
    Settings(String),
    /// A credentials or certificate file that cannot be read.
    #[error("Cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// What the client or the server said.
    #[error("etcd: {}", client_message(.0))]
    Client(#[from] etcd_client::Error),
    /// No answer in time.
    #[error("etcd: no answer to {what} within {ms} ms")]
    Timeout {
        /// The call.
        what: &'static str,
        /// The deadline.
        ms: u128,
    },
}

/// What the etcd client said, as a sentence: a gRPC status's meaning and message, then its
/// causes (the client's own `Display` writes them as Rust debug text: `source: Some(...)`,
/// `Os { code: 111, ... }`), each said once.
fn client_message(e: &etcd_client::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut say = |s: String| {
        let s = s.trim().to_string();
        if !s.is_empty() && !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => {
            say(status.code().description().to_string());
            say(status.message().to_string());
            std::error::Error::source(status)
        }
        etcd_client::Error::TransportError(t) => Some(t),
        other => {
            say(other.to_string());
            None
        }
    };
    while let Some(c) = cause {
        say(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}

/// How to reach etcd (the `[cluster]` section of vqosd's config, the CLI's flags).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdSettings {
    /// Client URLs, `http://host:port` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// User name, when etcd has authentication enabled.
    #[serde(default)]
    pub user: Option<String>,
    /// A file holding the user's password (first line); only with `user`.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the servers' certificates; enables TLS.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; with `key_file`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM); with `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

fn read(path: &Path) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|source| EtcdError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Runs `fut` with a deadline of `limit`.
pub async fn deadline<T>(
    what: &'static str,
    limit: Duration,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(EtcdError::from),
        Err(_) => Err(EtcdError::Timeout {
            what,
            ms: limit.as_millis(),
        }),
    }
}

impl EtcdSettings {
    /// Settings with only these endpoints (a comma-separated list).
    pub fn from_list(list: &str) -> Result<EtcdSettings, EtcdError> {
        let s = EtcdSettings {
            endpoints: list
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(String::from)
                .collect(),
            ..Default::default()
        };
        s.validate()?;
        Ok(s)
    }

    /// Checks the settings on their own (files are read at connect).
    pub fn validate(&self) -> Result<(), EtcdError> {
        let bad = |m: String| Err(EtcdError::Settings(m));
        if self.endpoints.is_empty() {
            return bad("no endpoints (give URLs such as http://127.0.0.1:2379)".into());
        }
        let tls = self.ca_file.is_some() || self.cert_file.is_some();
        for e in &self.endpoints {
            let https = e.starts_with("https://");
            if !https && !e.starts_with("http://") {
                return bad(format!("endpoint '{e}' is not an http:// or https:// URL"));
            }
            if https != tls {
                return bad(format!(
                    "endpoint '{e}': https:// needs ca_file, and ca_file or cert_file needs \
                     https:// endpoints"
                ));
            }
        }
        if self.password_file.is_some() && self.user.is_none() {
            return bad("password_file without user".into());
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return bad("cert_file and key_file go together".into());
        }
        Ok(())
    }

    fn options(&self, timeout: Duration) -> Result<ConnectOptions, EtcdError> {
        let mut o = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(timeout, timeout);
        if let Some(user) = &self.user {
            let password = match &self.password_file {
                Some(p) => String::from_utf8_lossy(&read(p)?)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string(),
                None => std::env::var("VQOS_ETCD_PASSWORD").unwrap_or_default(),
            };
            o = o.with_user(user.clone(), password);
        }
        if self.ca_file.is_some() || self.cert_file.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &self.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            if let (Some(c), Some(k)) = (&self.cert_file, &self.key_file) {
                tls = tls.identity(Identity::from_pem(read(c)?, read(k)?));
            }
            o = o.with_tls(tls);
        }
        Ok(o)
    }

    /// Connects, every call of the client bounded by `timeout`.
    pub async fn connect(&self, timeout: Duration) -> Result<Client, EtcdError> {
        self.validate()?;
        let options = self.options(timeout)?;
        deadline(
            "connect",
            timeout,
            Client::connect(&self.endpoints, Some(options)),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        let s = EtcdSettings::from_list("http://127.0.0.1:2379, http://127.0.0.1:22379").unwrap();
        assert_eq!(s.endpoints.len(), 2);
        let err = |s: EtcdSettings| s.validate().unwrap_err().to_string();
        assert!(EtcdSettings::from_list(" , ")
            .unwrap_err()
            .to_string()
            .contains("no endpoints"));
        assert!(EtcdSettings::from_list("127.0.0.1:2379")
            .unwrap_err()
            .to_string()
            .contains("not an http://"));
        let https = EtcdSettings::from_list("http://a:1").map(|mut s| {
            s.endpoints = vec!["https://a:1".into()];
            s
        });
        assert!(err(https.unwrap()).contains("needs ca_file"));
        let mut s = EtcdSettings::from_list("http://a:1").unwrap();
        s.password_file = Some("/p".into());
        assert!(err(s.clone()).contains("without user"));
        s.user = Some("u".into());
        assert!(s.validate().is_ok());
        s.endpoints = vec!["https://a:1".into()];
        s.ca_file = Some("/ca".into());
        s.cert_file = Some("/c".into());
        assert!(err(s).contains("go together"));
    }
}
