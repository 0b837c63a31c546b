//! `vqos port migrate SRC DST` (`POST /v1/ports/SRC/migrate`): a vif's identity handed over
//! to another vif for a live-migrating guest (docs/vhost-user.md, "Live migration").

use serde::{Deserialize, Serialize};

use crate::wire::PortView;

/// A port's identity handed over to another port, as the source shows it (in its port,
/// its stats and the state file) until it is deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandoverView {
    /// The port the identity goes to.
    pub to: String,
    /// The destination carried its first frame from the guest's addresses: they are its own,
    /// and this port may claim none (`false`: both own them).
    #[serde(default)]
    pub complete: bool,
}

/// The body of `POST /v1/ports/NAME/migrate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    /// The destination port (it exists, owns no address, takes part in no other migration).
    pub to: String,
}

/// The answer of `POST /v1/ports/NAME/migrate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigratedView {
    /// The source port.
    pub from: String,
    /// The destination port as it is now: the source's policy and port security.
    pub port: PortView,
}
