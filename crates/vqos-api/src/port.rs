//! One description of a port ([`PortConfig`]): what the config's `[[port]]` and a
//! `POST /v1/ports` body ([`PortRequest`]: with a policy patch), the daemon's state file (with
//! its whole policy) and `GET /v1/ports` ([`PortView`]: with the policy as shown) say about how
//! a port is made. A new port setting is one field here; the state file and the view embed
//! (flatten) this type, so their JSON keeps the flat shape it always had.

use std::collections::BTreeMap;

use serde::de::{self, Deserializer, IgnoredAny};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::access::{Account, FileMode};
use crate::migrate::HandoverView;
use crate::wire::{MacAddr, PolicyPatch, PolicyView};

fn default_true() -> bool {
    true
}

/// What kind of port a vif (or the uplink) is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PortKind {
    /// A Linux TAP device (namespaces, containers, VMs whose TAP vqosd holds).
    #[default]
    #[serde(rename = "tap")]
    Tap,
    /// A vhost-user socket: a VM's virtio-net rings in shared memory (QEMU, libvirt, Cloud
    /// Hypervisor).
    #[serde(rename = "vhost-user")]
    VhostUser,
    /// An existing interface (a NIC, a veth) attached through an `AF_PACKET` socket: the
    /// uplink only (`[uplink] kind = "af-packet"`); a vif of this kind is refused.
    #[serde(rename = "af-packet")]
    AfPacket,
    /// A port that costs nothing, for benchmarks and load tests (DPDK's `net_null`): a vif
    /// generates `frame_len`-byte frames to the uplink as fast as the switch reads them (none
    /// with `frame_len = 0`); the uplink discards what it is sent and, with `[uplink] to`,
    /// generates frames to those null vifs in turn.
    #[serde(rename = "null")]
    Null,
}

/// Which side of a vhost-user socket vqosd is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VhostUserRole {
    /// vqosd listens, the VM's frontend connects (OVS `dpdkvhostuser`).
    #[default]
    Server,
    /// The frontend listens, vqosd connects and reconnects (OVS `dpdkvhostuserclient`): vqosd
    /// can restart under running guests.
    Client,
}

/// Addresses port security locked to a vif first come (without configured ones): reported
/// in its stats, listed with the port and persisted in the state file, so that a restart
/// gives them back to it before it forwards (docs/security.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedAddrs {
    /// Source MACs.
    #[serde(default)]
    pub macs: Vec<MacAddr>,
    /// IP addresses.
    #[serde(default)]
    pub ips: Vec<std::net::IpAddr>,
}

impl LockedAddrs {
    /// True when nothing is locked.
    pub fn is_empty(&self) -> bool {
        self.macs.is_empty() && self.ips.is_empty()
    }
}

/// What a vif may serve to its neighbours beyond its own traffic (refused by the address
/// guards otherwise: docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Service {
    /// IPv6 router advertisements and redirects.
    Router,
    /// DHCPv4 and DHCPv6 server (and relay) messages.
    DhcpServer,
}

/// How a port is made: its kind, name, socket, addresses and port security, and its policy in
/// the form `P` the user of the type needs (none, `()`, for the daemon's switch; a
/// [`PolicyPatch`] in a request; the whole policy in the state file; a [`PolicyView`] when
/// shown). Fields left out take their defaults (a TAP vqosd creates, port security on, the
/// default policy); a field it does not know is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConfig<P = ()> {
    /// Interface name.
    pub name: String,
    /// `tap` (default), `vhost-user` or `null` (`af-packet`: the uplink only).
    #[serde(default)]
    pub kind: PortKind,
    /// `true` (default): vqosd creates the TAP; `false`: it attaches to an existing one.
    /// (TAPs only.)
    #[serde(default = "default_true")]
    pub create: bool,
    /// vhost-user: the unix socket's path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// Null ports: the frames' length on the wire, FCS included (64 to 1518; default 64), or 0
    /// for a vif that sends nothing and only receives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_len: Option<u32>,
    /// vhost-user: `server` (default) or `client`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<VhostUserRole>,
    /// vhost-user: queue pairs offered to the guest, 1 to 16 (default 1; QEMU's
    /// `-netdev vhost-user,queues=N` may ask for at most this many). TAP: its queues, 1 to 16
    /// (`IFF_MULTI_QUEUE` above 1; the guest's side spreads its frames over them by flow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
    /// The forwarding thread that reads the port, 0 to `threads` − 1 (as `loops[]` in the
    /// stats; OVS's `pmd-rxq-affinity`); default the thread with the fewest ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<usize>,
    /// vhost-user, server role: the socket's owner (a user name or uid), e.g. `libvirt-qemu`;
    /// default the daemon's user. (In the client role the frontend creates the socket.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_owner: Option<Account>,
    /// vhost-user, server role: the socket's group (a group name or gid); default the
    /// daemon's group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_group: Option<Account>,
    /// vhost-user, server role: the socket's permission bits, e.g. `"0660"`; default what the
    /// daemon's umask leaves (`0700` under the shipped unit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_mode: Option<FileMode>,
    /// Source MAC addresses the vif may send from (pinned to it at once); empty = decided
    /// by `port_security`.
    #[serde(default)]
    pub macs: Vec<MacAddr>,
    /// Without `macs`: `true` (default) locks the vif to the first few source addresses it
    /// sends from; `false` lets it use any address no other port owns (routers, nested
    /// bridges). No port ever takes an address another port owns.
    #[serde(default = "default_true")]
    pub port_security: bool,
    /// With port security: the only IPv4/IPv6 addresses the vif may claim (as a source, an
    /// ARP sender, a neighbour advertisement's target), pinned to it at once; empty: it locks
    /// to the first few it uses (2 IPv4, 8 IPv6).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<std::net::IpAddr>,
    /// With port security: what it may serve (`router`, `dhcp-server`); default nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serves: Vec<Service>,
    /// The vif's policy; fields left out take the defaults (weight 1, no min, no max,
    /// priority 7).
    #[serde(default)]
    pub policy: P,
}

impl<P: Default> PortConfig<P> {
    /// A TAP named `name` that vqosd creates, with port security and the default policy.
    pub fn tap(name: &str) -> PortConfig<P> {
        PortConfig {
            name: name.to_string(),
            kind: PortKind::Tap,
            create: true,
            socket: None,
            frame_len: None,
            mode: None,
            queues: None,
            thread: None,
            socket_owner: None,
            socket_group: None,
            socket_mode: None,
            macs: Vec::new(),
            port_security: true,
            ips: Vec::new(),
            serves: Vec::new(),
            policy: P::default(),
        }
    }
}

impl<P> PortConfig<P> {
    /// The same port with `policy`.
    pub fn with_policy<Q>(self, policy: Q) -> PortConfig<Q> {
        PortConfig {
            name: self.name,
            kind: self.kind,
            create: self.create,
            socket: self.socket,
            frame_len: self.frame_len,
            mode: self.mode,
            queues: self.queues,
            thread: self.thread,
            socket_owner: self.socket_owner,
            socket_group: self.socket_group,
            socket_mode: self.socket_mode,
            macs: self.macs,
            port_security: self.port_security,
            ips: self.ips,
            serves: self.serves,
            policy,
        }
    }
}

/// A port's stable id: given by the daemon when the port is made (from the config, a
/// `POST /v1/ports` or a reload), kept in the state file across restarts, never given to
/// another port of the same state file, also not to a port made again under the same name.
/// A name says which port a user means; the id says which *incarnation* of it: the daemon's
/// controllers and per-vif state (a controller's limit, an ECN probability) are keyed by it,
/// so nothing of a deleted port passes to a new one that reuses its name. 0 is never given
/// (it reads "not yet given" in state files older than ids).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct PortId(pub u64);

impl PortId {
    /// True once the daemon gave it.
    pub fn is_given(self) -> bool {
        self.0 != 0
    }
}

impl std::fmt::Display for PortId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What a port acquired while it ran, which the daemon keeps with it (state file) and shows
/// (`GET /v1/ports`); never set by a request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortState {
    /// Its stable id ([`PortId`]); absent from state files older than ids.
    #[serde(default, skip_serializing_if = "is_not_given")]
    pub id: PortId,
    /// Addresses port security locked to it first come, as last seen (given back to it when it
    /// is added again after a restart).
    #[serde(default, skip_serializing_if = "LockedAddrs::is_empty")]
    pub locked: LockedAddrs,
    /// Its identity handed over to another port (`vqos port migrate`), until it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<HandoverView>,
}

fn is_not_given(id: &PortId) -> bool {
    !id.is_given()
}

/// Refuses the fields no other field of a struct took: serde's `deny_unknown_fields` does not
/// work with `flatten`, so a struct that flattens another has this as its last field, also
/// flattened (it adds nothing when serialised).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoOtherFields;

impl Serialize for NoOtherFields {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_map(Some(0))?.end()
    }
}

impl<'de> Deserialize<'de> for NoOtherFields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let rest = BTreeMap::<String, IgnoredAny>::deserialize(d)?;
        match rest.keys().next() {
            Some(k) => Err(de::Error::custom(format_args!("unknown field `{k}`"))),
            None => Ok(NoOtherFields),
        }
    }
}

/// `POST /v1/ports` body, and one `[[port]]` of the config: the port and a policy patch over
/// the default policy.
pub type PortRequest = PortConfig<PolicyPatch>;

/// One port as `GET /v1/ports` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortView {
    /// How it is made, and its policy.
    #[serde(flatten)]
    pub port: PortConfig<PolicyView>,
    /// What it acquired.
    #[serde(flatten)]
    pub state: PortState,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Rate;

    #[test]
    fn a_request_reads_as_it_always_did_and_refuses_unknown_fields() {
        let body = r#"{"name":"vm1","kind":"vhost-user","socket":"/run/vqos/vm1.sock",
            "mode":"client","queues":2,"socket_owner":"libvirt-qemu","socket_mode":"0660",
            "macs":["02:00:00:00:00:01"],"ips":["10.0.0.1"],"serves":["router"],
            "policy":{"weight":2,"max":"100Mbit"}}"#;
        let r: PortRequest = serde_json::from_str(body).unwrap();
        assert_eq!(r.kind, PortKind::VhostUser);
        assert_eq!((r.create, r.port_security), (true, true));
        assert_eq!(r.queues, Some(2));
        assert_eq!(r.policy.max, Some(Some(Rate(Some(100_000_000)))));
        // What the CLI sends reads back the same.
        let sent = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<PortRequest>(&sent).unwrap(), r);
        // The defaults, from the least a request says.
        let r: PortRequest = serde_json::from_str(r#"{"name":"a"}"#).unwrap();
        assert_eq!(r, PortRequest::tap("a"));
        for (bad, field) in [
            (r#"{"name":"a","weight":2}"#, "weight"),
            (r#"{"name":"a","locked":{"macs":[]}}"#, "locked"),
            (r#"{"name":"a","handover":{"to":"b"}}"#, "handover"),
        ] {
            let e = serde_json::from_str::<PortRequest>(bad).unwrap_err();
            assert!(
                e.to_string().contains(&format!("unknown field `{field}`")),
                "{bad}: {e}"
            );
        }
        let e = serde_json::from_str::<PortRequest>(r#"{"name":"a","policy":{"wieght":1}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `wieght`"), "{e}");
    }

    #[test]
    fn a_view_is_the_config_its_state_and_its_policy_side_by_side() {
        let view = PortView {
            port: PortConfig {
                macs: vec!["02:00:00:00:00:01".parse().unwrap()],
                ..PortConfig::tap("vm1")
            },
            state: PortState {
                id: PortId(7),
                locked: LockedAddrs {
                    macs: vec![],
                    ips: vec!["10.0.0.9".parse().unwrap()],
                },
                handover: None,
            },
        };
        let json = serde_json::to_value(&view).unwrap();
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "create",
                "id",
                "kind",
                "locked",
                "macs",
                "name",
                "policy",
                "port_security"
            ]
        );
        assert_eq!(serde_json::from_value::<PortView>(json).unwrap(), view);
    }

    #[test]
    fn a_patch_is_sent_as_it_is_read() {
        for body in [
            r#"{"weight":3,"min":1000,"max":null,"priority":1,"max_in":"unlimited","burst":null}"#,
            r#"{"max":"unlimited","max_in":null,"burst":65536}"#,
            r#"{}"#,
        ] {
            let p: PolicyPatch = serde_json::from_str(body).unwrap();
            let sent = serde_json::to_string(&p).unwrap();
            assert_eq!(
                serde_json::from_str::<PolicyPatch>(&sent).unwrap(),
                p,
                "{sent}"
            );
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(serde_json::to_value(&p).unwrap(), v);
        }
    }
}
