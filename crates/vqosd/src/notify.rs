//! systemd's readiness protocol (`sd_notify`): one datagram such as `READY=1` to the unix socket
//! named by `$NOTIFY_SOCKET` (a path, or an abstract name written with a leading `@`). Without
//! the variable (not started by systemd with `Type=notify`) nothing is sent.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

use thiserror::Error;

/// Why a notification could not be sent.
#[derive(Debug, Error)]
pub enum NotifyError {
    /// `$NOTIFY_SOCKET` is neither an absolute path nor an `@` abstract name.
    #[error("Invalid NOTIFY_SOCKET {0:?}: expected an absolute path or @name")]
    BadAddress(String),
    /// Creating the socket or sending failed.
    #[error("Cannot notify systemd at {addr}")]
    Send {
        /// The socket named by `$NOTIFY_SOCKET`.
        addr: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Sends `state` (newline-separated `KEY=value` assignments) to `$NOTIFY_SOCKET`; `Ok(false)`
/// when the variable is not set.
pub fn notify(state: &str) -> Result<bool, NotifyError> {
    match std::env::var("NOTIFY_SOCKET") {
        Ok(addr) if !addr.is_empty() => send_to(&addr, state).map(|()| true),
        _ => Ok(false),
    }
}

/// Sends `state` to the notification socket `addr` (`/path` or `@abstract`).
pub fn send_to(addr: &str, state: &str) -> Result<(), NotifyError> {
    let target = if let Some(name) = addr.strip_prefix('@') {
        SocketAddr::from_abstract_name(name.as_bytes())
    } else if addr.starts_with('/') {
        SocketAddr::from_pathname(addr)
    } else {
        return Err(NotifyError::BadAddress(addr.to_string()));
    };
    let send = |source| NotifyError::Send {
        addr: addr.to_string(),
        source,
    };
    let target = target.map_err(send)?;
    let sock = UnixDatagram::unbound().map_err(send)?;
    sock.send_to_addr(state.as_bytes(), &target).map_err(send)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        send_to(path.to_str().unwrap(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        let name = format!("vqosd-notify-test-{}", std::process::id());
        let abs = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&abs).unwrap();
        send_to(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn a_relative_address_is_refused() {
        assert!(matches!(
            send_to("relative/sock", "READY=1"),
            Err(NotifyError::BadAddress(_))
        ));
    }
}
