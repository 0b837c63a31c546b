//! Who is at the other end of a loopback TCP connection: the user owning the server's socket,
//! read from the kernel's socket tables (`/proc/net/tcp`, `/proc/net/tcp6`).
//!
//! vqosd's optional TCP API listens on loopback, where any local user can bind the port first
//! if vqosd is not running; a client that sent its bearer token to whatever answers would hand
//! it to that user. A unix socket tells its peer's credentials (`SO_PEERCRED`); TCP does not,
//! but the kernel lists every socket with the user that created it, and a connection accepted
//! from a listener keeps the listener's user. So before the token is sent, the client finds
//! the server's end of its own connection (local and remote address swapped) and refuses any
//! owner but root (vqosd as a service) or the client's own user (a daemon it started itself,
//! or an `ssh -L` forward it opened). No certificate to provision, no change to the protocol.
//!
//! ## Limitations
//! Linux only, and only for a server on this host in this network namespace (vqosd's TCP API
//! is loopback-only, so a server found nowhere in the tables is not vqosd and is refused).

use std::io;
use std::net::SocketAddr;

/// The form `/proc/net/tcp{,6}` gives `addr` in: the address as 32-bit words in host order,
/// in hex, a colon, the port in hex.
fn proc_form(addr: &SocketAddr) -> String {
    let words: Vec<[u8; 4]> = match addr {
        SocketAddr::V4(a) => vec![a.ip().octets()],
        SocketAddr::V6(a) => a
            .ip()
            .octets()
            .chunks(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect(),
    };
    let hex: String = words
        .iter()
        .map(|w| format!("{:08X}", u32::from_ne_bytes(*w)))
        .collect();
    format!("{hex}:{:04X}", addr.port())
}

/// The uid owning the socket whose local address is `local` and remote address `remote`, in
/// the socket table `table` (the text of `/proc/net/tcp` or `tcp6`).
pub fn owner_in(table: &str, local: &SocketAddr, remote: &SocketAddr) -> Option<u32> {
    let (l, r) = (proc_form(local), proc_form(remote));
    table.lines().skip(1).find_map(|line| {
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 7 && f[1].eq_ignore_ascii_case(&l) && f[2].eq_ignore_ascii_case(&r))
            .then(|| f[7].parse().ok())
            .flatten()
    })
}

/// The uid owning the server's end of the connection from `client` to `server` (this host,
/// this network namespace), or `None` if no socket of this host is that end.
pub fn server_owner(client: &SocketAddr, server: &SocketAddr) -> io::Result<Option<u32>> {
    let file = match server {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    Ok(owner_in(&std::fs::read_to_string(file)?, server, client))
}

/// This process's effective uid (the owner of `/proc/self`).
pub fn own_uid() -> io::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/self")?.uid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn the_server_end_of_a_loopback_connection_belongs_to_its_listeners_user() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (client, server) = (c.local_addr().unwrap(), c.peer_addr().unwrap());
        // Before and after the accept: the kernel lists the queued connection already.
        assert_eq!(
            server_owner(&client, &server).unwrap(),
            Some(own_uid().unwrap())
        );
        let _accepted = listener.accept().unwrap();
        assert_eq!(
            server_owner(&client, &server).unwrap(),
            Some(own_uid().unwrap())
        );
        // Our own end is another socket; a port nobody uses has no owner.
        let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(server_owner(&client, &nobody).unwrap(), None);
    }

    #[test]
    fn the_tables_are_read_in_the_kernels_form() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
             0: 0100007F:1D1B 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000  1000        0 4242 1\n";
        let server: SocketAddr = "127.0.0.1:7451".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:41668".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(owner_in(table, &server, &client), Some(1000));
            assert_eq!(owner_in(table, &client, &server), None, "the other end");
        }
        let v6: SocketAddr = "[::1]:7451".parse().unwrap();
        assert_eq!(
            proc_form(&v6),
            format!(
                "{}{:08X}:1D1B",
                "0".repeat(24),
                u32::from_ne_bytes([0, 0, 0, 1])
            )
        );
    }
}
