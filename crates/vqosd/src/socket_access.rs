//! Who may connect to a vhost-user server socket: its owner, group and mode (`socket_owner`,
//! `socket_group`, `socket_mode` of a port), so that a QEMU running as another user (libvirt's
//! `libvirt-qemu`) can connect to the socket vqosd, running as root, creates.
//!
//! ## Behavior
//! - [`SocketAccess::check`] refuses the settings where no socket is vqosd's: a port other
//!   than vhost-user, or one in the client role (the frontend, QEMU, creates and owns that
//!   socket); and it looks the names up, so an unknown user or group is refused when the
//!   config is read (`vqosd --check` too) or the API request arrives, not later.
//! - The data plane binds the socket and sets its mode; [`SocketAccess::apply`] then gives it
//!   to its owner and group (`lchown`, which needs `CAP_CHOWN`), resolving the names again: a
//!   restart re-creates the socket with the same owner. Until then the socket is the daemon's,
//!   so a frontend never meets a socket more open than configured.
//!
//! ## Limitations
//! Names are resolved through the C library (NSS: `/etc/passwd`, `/etc/group`, or whatever
//! the host's `nsswitch.conf` says); a user renumbered while vqosd runs keeps the socket until
//! the port is added again.

use std::path::Path;

use nix::unistd::{Gid, Group, Uid, User};
use serde::{Deserialize, Serialize};
use vqos_api::wire::{Account, FileMode, PortConfig, PortKind, VhostUserRole};

/// A vhost-user server socket's owner, group and mode, as configured (names unresolved).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketAccess {
    /// The socket's owner; `None`: the daemon's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Account>,
    /// The socket's group; `None`: the daemon's group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<Account>,
    /// Its permission bits; `None`: what the daemon's umask leaves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<FileMode>,
}

/// The uid of `a`: its number, or the user of that name on this host.
pub fn uid(a: &Account) -> Result<u32, String> {
    match a {
        Account::Id(id) => Ok(*id),
        Account::Name(name) => match User::from_name(name) {
            Ok(Some(u)) => Ok(u.uid.as_raw()),
            Ok(None) => Err(format!("no user '{name}' on this host")),
            Err(e) => Err(format!("cannot look up user '{name}': {e}")),
        },
    }
}

/// The gid of `a`: its number, or the group of that name on this host.
pub fn gid(a: &Account) -> Result<u32, String> {
    match a {
        Account::Id(id) => Ok(*id),
        Account::Name(name) => match Group::from_name(name) {
            Ok(Some(g)) => Ok(g.gid.as_raw()),
            Ok(None) => Err(format!("no group '{name}' on this host")),
            Err(e) => Err(format!("cannot look up group '{name}': {e}")),
        },
    }
}

impl SocketAccess {
    /// The socket settings of `port`.
    pub fn of<P>(port: &PortConfig<P>) -> SocketAccess {
        SocketAccess {
            owner: port.socket_owner.clone(),
            group: port.socket_group.clone(),
            mode: port.socket_mode,
        }
    }

    /// True when nothing is set (the socket keeps the daemon's owner and umask).
    pub fn is_empty(&self) -> bool {
        self.owner.is_none() && self.group.is_none() && self.mode.is_none()
    }

    /// Checks the settings of port `name` of `kind` in role `role` (see the module docs); the
    /// error names the port.
    pub fn check(
        &self,
        name: &str,
        kind: PortKind,
        role: Option<VhostUserRole>,
    ) -> Result<(), String> {
        if self.is_empty() {
            return Ok(());
        }
        if kind != PortKind::VhostUser {
            return Err(format!(
                "Port '{name}': socket_owner, socket_group and socket_mode are for kind = \
                 \"vhost-user\""
            ));
        }
        if role == Some(VhostUserRole::Client) {
            return Err(format!(
                "Port '{name}': socket_owner, socket_group and socket_mode are for the server \
                 role: in the client role the VM's frontend (QEMU, libvirt's <source \
                 mode='server'>) creates the socket and vqosd only connects to it"
            ));
        }
        self.resolve()
            .map(|_| ())
            .map_err(|e| format!("Port '{name}': {e}"))
    }

    /// The uid and gid to give the socket (`None`: unchanged).
    fn resolve(&self) -> Result<(Option<u32>, Option<u32>), String> {
        let owner = self.owner.as_ref().map(uid).transpose();
        let owner = owner.map_err(|e| format!("socket_owner: {e}"))?;
        let group = self.group.as_ref().map(gid).transpose();
        let group = group.map_err(|e| format!("socket_group: {e}"))?;
        Ok((owner, group))
    }

    /// Gives the socket at `path`, just bound by the data plane, to its owner and group (the
    /// link itself, never what it might point to). The mode is the data plane's to set, at
    /// bind time.
    pub fn apply(&self, path: &Path) -> Result<(), String> {
        let (owner, group) = self.resolve()?;
        if owner.is_none() && group.is_none() {
            return Ok(());
        }
        std::os::unix::fs::lchown(path, owner, group).map_err(|e| {
            let who = format!(
                "{}:{}",
                owner.map_or_else(|| Uid::current().to_string(), |u| u.to_string()),
                group.map_or_else(|| Gid::current().to_string(), |g| g.to_string())
            );
            format!("cannot give socket {} to {who}: {e}", path.display())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(owner: Option<Account>, group: Option<Account>, mode: Option<&str>) -> SocketAccess {
        SocketAccess {
            owner,
            group,
            mode: mode.map(|m| m.parse().unwrap()),
        }
    }

    #[test]
    fn names_and_numbers_resolve_and_unknown_ones_are_refused() {
        assert_eq!(uid(&Account::Name("root".into())), Ok(0));
        assert_eq!(gid(&Account::Name("root".into())), Ok(0));
        assert_eq!(uid(&Account::Id(64_055)), Ok(64_055));
        let e = uid(&Account::Name("no-such-user-vq".into())).unwrap_err();
        assert_eq!(e, "no user 'no-such-user-vq' on this host");
        let a = access(None, Some(Account::Name("no-such-group-vq".into())), None);
        let e = a.check("vm1", PortKind::VhostUser, None).unwrap_err();
        assert_eq!(
            e,
            "Port 'vm1': socket_group: no group 'no-such-group-vq' on this host"
        );
    }

    #[test]
    fn only_a_server_role_vhost_user_port_takes_them() {
        let a = access(Some(Account::Id(0)), None, Some("0660"));
        assert!(a.check("vm1", PortKind::VhostUser, None).is_ok());
        let server = Some(VhostUserRole::Server);
        assert!(a.check("vm1", PortKind::VhostUser, server).is_ok());
        let e = a
            .check("vm1", PortKind::VhostUser, Some(VhostUserRole::Client))
            .unwrap_err();
        assert!(e.contains("for the server role"), "{e}");
        let e = a.check("tap1", PortKind::Tap, None).unwrap_err();
        assert!(e.contains("for kind = \"vhost-user\""), "{e}");
        assert!(SocketAccess::default()
            .check("tap1", PortKind::Tap, None)
            .is_ok());
    }

    #[test]
    fn apply_gives_the_socket_to_its_owner_and_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // Ids of the current user always work (root may give it to anyone, others to
        // themselves and their groups).
        let (me, my_group) = (Uid::current().as_raw(), Gid::current().as_raw());
        let a = access(Some(Account::Id(me)), Some(Account::Id(my_group)), None);
        a.apply(&path).unwrap();
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!((m.uid(), m.gid()), (me, my_group));
        let gone = dir.path().join("gone.sock");
        let e = a.apply(&gone).unwrap_err();
        assert!(e.starts_with("cannot give socket "), "{e}");
    }
}
