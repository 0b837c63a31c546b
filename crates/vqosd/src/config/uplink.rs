//! The `[uplink]` section: its kind and what each kind may take (`create` for TAPs, `queues`
//! for TAP uplinks, `to` and `frame_len` for a null uplink that sends).

use serde::Deserialize;
use vqos_sched::PolicyError;

use super::ConfigError;
use crate::backend::Port;
use crate::wire::{check_port_name, PortConfig, PortKind, PortState};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUplink {
    name: String,
    /// Default true (TAPs only).
    create: Option<bool>,
    /// `tap` (default), `af-packet` or `null`.
    #[serde(default)]
    kind: PortKind,
    /// A TAP uplink's queues (default 1): with several forwarding threads, each reads one
    /// (the kernel spreads the host's flows over them), so downloads use every thread.
    queues: Option<u16>,
    /// A null uplink: the null vifs it sends to in turn (none: it only discards).
    #[serde(default)]
    to: Vec<String>,
    /// A null uplink with `to`: its frames' length on the wire (default 64).
    frame_len: Option<u32>,
}

/// The uplink of the section `u` (none without one), refused where a vif of `vifs` has its
/// name; and the null vifs a null uplink sends to (`to`).
pub(super) fn parse(
    u: Option<RawUplink>,
    vifs: &[&str],
) -> Result<(Option<Port>, Vec<String>), ConfigError> {
    let Some(u) = u else {
        return Ok((None, Vec::new()));
    };
    check_port_name(&u.name)?;
    if vifs.contains(&u.name.as_str()) {
        return Err(ConfigError::Policy(PolicyError::DuplicateVif(u.name)));
    }
    match (u.kind, u.create) {
        (PortKind::Tap, _) => {}
        (PortKind::AfPacket | PortKind::Null, _) if u.queues.is_some() => {
            return Err(ConfigError::Port(format!(
                "Uplink '{}': queues is for TAP uplinks (an af-packet uplink is \
                 read by every thread through fanout; a null one has no queues)",
                u.name
            )));
        }
        (PortKind::AfPacket | PortKind::Null, None) => {}
        (PortKind::AfPacket | PortKind::Null, Some(_)) => {
            return Err(ConfigError::Port(format!(
                "Uplink '{}': create is for TAPs (kind = \"af-packet\" attaches to \
                 an existing interface, kind = \"null\" has none)",
                u.name
            )));
        }
        (PortKind::VhostUser, _) => {
            return Err(ConfigError::Port(format!(
                "Uplink '{}': kind must be \"tap\", \"af-packet\" or \"null\"",
                u.name
            )));
        }
    }
    let frame_len = null_uplink(&u)?;
    let config = PortConfig {
        kind: u.kind,
        create: u.create.unwrap_or(u.kind != PortKind::AfPacket),
        port_security: false,
        queues: u.queues,
        frame_len,
        ..PortConfig::tap(&u.name)
    };
    crate::backend::check_queues(&config, "queues of the uplink TAP")
        .map_err(|e| ConfigError::Port(e.replacen("Port", "Uplink", 1)))?;
    let to = u.to;
    Ok((
        Some(Port {
            config,
            state: PortState::default(),
        }),
        to,
    ))
}

/// A null uplink's `frame_len` (64 by default when it sends, `to`), after checking `to` and
/// `frame_len` are given only where they mean something.
fn null_uplink(u: &RawUplink) -> Result<Option<u32>, ConfigError> {
    let bad = |m: String| Err(ConfigError::Port(format!("Uplink '{}': {m}", u.name)));
    if u.kind != PortKind::Null {
        if !u.to.is_empty() || u.frame_len.is_some() {
            return bad("to and frame_len are for kind = \"null\"".into());
        }
        return Ok(None);
    }
    if u.to.is_empty() {
        if u.frame_len.is_some() {
            return bad("frame_len without to (a null uplink sends only to the vifs in to)".into());
        }
        return Ok(None);
    }
    for vif in &u.to {
        check_port_name(vif)?;
    }
    if u.frame_len == Some(0) {
        return bad("frame_len 0 is for a null vif that only receives".into());
    }
    crate::backend::check_frame_len(&u.name, PortKind::Null, u.frame_len)
        .map_err(|e| ConfigError::Port(e.replacen("Port", "Uplink", 1)))
}
