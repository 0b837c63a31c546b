//! A small HTTP/1.1 client for the control API, over the unix socket or loopback TCP. The `vqos`
//! CLI and the tests use it.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use thiserror::Error;

use crate::http::{read_response, ClientResponse, HttpError};
use crate::wire::ErrorBody;

/// Largest response body the client accepts.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Why a call failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The daemon could not be reached.
    #[error("Cannot connect to {endpoint}")]
    Connect {
        /// Where we tried.
        endpoint: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Sending or reading failed.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The daemon answered with an error (its message).
    #[error("{message}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The daemon's `error` message.
        message: String,
    },
    /// The answer was not the JSON expected.
    #[error("Unexpected answer from vqosd: {0}")]
    Decode(String),
    /// A `--url` that is not `http://HOST:PORT`.
    #[error("Invalid URL '{0}': expected http://127.0.0.1:PORT")]
    BadUrl(String),
    /// The TCP server is not one the token may go to ([`crate::peer`]): its socket belongs to
    /// another user, or it is not on this host.
    #[error("Refusing to send the token to {endpoint}: {}", match owner {
        Some(uid) => format!("its socket belongs to uid {uid}, neither root nor this user \
                              (another program holds the port while vqosd is down?)"),
        None => "it is no socket of this host (vqosd's TCP API is loopback only)".to_string(),
    })]
    Untrusted {
        /// Where we connected.
        endpoint: String,
        /// The server socket's owner, if it is on this host.
        owner: Option<u32>,
    },
}

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The unix socket.
    Unix(PathBuf),
    /// TCP `host:port`, with the bearer token to present.
    Tcp {
        /// `host:port`.
        addr: String,
        /// The token, if any.
        token: Option<String>,
    },
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp { addr, .. } => write!(f, "http://{addr}"),
        }
    }
}

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    timeout: Duration,
}

impl Client {
    /// A client of the daemon at `endpoint`.
    pub fn new(endpoint: Endpoint) -> Client {
        Client {
            endpoint,
            timeout: Duration::from_secs(10),
        }
    }

    /// A TCP client from `http://HOST:PORT` (a trailing `/` is allowed): HOST an IPv4 address,
    /// a bracketed IPv6 one or a host name, PORT 1 to 65535. Nothing is resolved or connected
    /// here.
    pub fn from_url(url: &str, token: Option<String>) -> Result<Client, ClientError> {
        let addr = url
            .strip_prefix("http://")
            .map(|a| a.trim_end_matches('/'))
            .filter(|a| valid_host_port(a))
            .ok_or_else(|| ClientError::BadUrl(url.to_string()))?;
        Ok(Client::new(Endpoint::Tcp {
            addr: addr.to_string(),
            token,
        }))
    }

    /// Where this client connects.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Sends raw bytes and reads the response (tests use it to send what the client never would).
    pub fn raw(&self, bytes: &[u8]) -> Result<ClientResponse, ClientError> {
        let connect_err = |source| ClientError::Connect {
            endpoint: self.endpoint.to_string(),
            source,
        };
        match &self.endpoint {
            Endpoint::Unix(path) => {
                let s = UnixStream::connect(path).map_err(connect_err)?;
                s.set_read_timeout(Some(self.timeout))
                    .map_err(connect_err)?;
                s.set_write_timeout(Some(self.timeout))
                    .map_err(connect_err)?;
                exchange(s, bytes)
            }
            Endpoint::Tcp { addr, token } => {
                let s = TcpStream::connect(addr.as_str()).map_err(connect_err)?;
                if token.is_some() {
                    self.check_server(&s)?;
                }
                s.set_read_timeout(Some(self.timeout))
                    .map_err(connect_err)?;
                s.set_write_timeout(Some(self.timeout))
                    .map_err(connect_err)?;
                exchange(s, bytes)
            }
        }
    }

    /// Before a token is sent: is the server's socket owned by root or by this user
    /// ([`crate::peer`])?
    fn check_server(&self, s: &TcpStream) -> Result<(), ClientError> {
        let io_err = |source| ClientError::Connect {
            endpoint: self.endpoint.to_string(),
            source,
        };
        let (client, server) = (
            s.local_addr().map_err(io_err)?,
            s.peer_addr().map_err(io_err)?,
        );
        let owner = crate::peer::server_owner(&client, &server).map_err(io_err)?;
        let me = crate::peer::own_uid().map_err(io_err)?;
        match owner {
            Some(uid) if uid == 0 || uid == me => Ok(()),
            owner => Err(ClientError::Untrusted {
                endpoint: self.endpoint.to_string(),
                owner,
            }),
        }
    }

    /// Sends one request with an optional JSON body and returns the raw response.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<ClientResponse, ClientError> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: vqosd\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        if !body.is_empty() {
            head.push_str("Content-Type: application/json\r\n");
        }
        if let Endpoint::Tcp {
            token: Some(token), ..
        } = &self.endpoint
        {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(&body);
        self.raw(head.as_bytes())
    }

    /// Sends one request and decodes a 2xx JSON answer; an error answer becomes
    /// [`ClientError::Api`] with the daemon's message.
    pub fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<T, ClientError> {
        let resp = self.request(method, path, body)?;
        check(&resp)?;
        serde_json::from_slice(&resp.body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// `GET` of a text endpoint (`/metrics`).
    pub fn text(&self, path: &str) -> Result<String, ClientError> {
        let resp = self.request("GET", path, None)?;
        check(&resp)?;
        String::from_utf8(resp.body).map_err(|e| ClientError::Decode(e.to_string()))
    }
}

/// `HOST:PORT` as [`Client::from_url`] takes it.
fn valid_host_port(addr: &str) -> bool {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return false;
    };
    let port_ok =
        port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok_and(|p| p > 0);
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        }
    };
    port_ok && host_ok
}

/// Turns a non-2xx response into [`ClientError::Api`].
pub fn check(resp: &ClientResponse) -> Result<(), ClientError> {
    if (200..300).contains(&resp.status) {
        return Ok(());
    }
    let message = serde_json::from_slice::<ErrorBody>(&resp.body)
        .map(|b| b.error)
        .unwrap_or_else(|_| format!("HTTP {}", resp.status));
    Err(ClientError::Api {
        status: resp.status,
        message,
    })
}

fn exchange(mut s: impl Read + Write, bytes: &[u8]) -> Result<ClientResponse, ClientError> {
    // The daemon may answer (413, 401) and close before reading everything we send: a broken
    // pipe here still leaves its answer to read.
    if let Err(e) = s.write_all(bytes).and_then(|_| s.flush()) {
        if e.kind() != io::ErrorKind::BrokenPipe && e.kind() != io::ErrorKind::ConnectionReset {
            return Err(ClientError::Http(HttpError::Io(e)));
        }
    }
    Ok(read_response(&mut s, MAX_RESPONSE_BYTES)?)
}
