//! # vqos-api
//!
//! The vqos control API as its clients see it, in the manner of Cloud Hypervisor's
//! `api_client`: the request and answer types ([`wire`]), the statistics the daemon reports
//! ([`stats`], which the data plane fills itself), the HTTP/1.1 subset both ends speak
//! ([`http`]) and a small [`client`] over the unix socket or loopback TCP. The daemon (`vqosd`)
//! serves these types; the `vqos` CLI and the lab use them without linking the daemon or the
//! data plane.
//!
//! ## API
//! - [`client::Client`]`::new(`[`client::Endpoint`]`)` / `from_url`, then `call::<T>(method,
//!   path, body)` (2xx JSON decoded, an error answer becomes `ClientError::Api` with the
//!   daemon's message), `request` (raw status and body), `text` (`/metrics`).
//! - [`port`]: `PortConfig` (how a port is made: the one description the config, the
//!   requests, the state file and the views embed), `PortState` (what it acquired),
//!   `PortRequest` (a port and its policy), `PortView`; re-exported by [`wire`].
//! - [`wire`]: `PolicyPatch` (a partial policy in a request), `PolicyView`, `StatsView`,
//!   `HealthView`, `ReloadView`, `ErrorBody`, `MacAddr`, `Rate`, `Size`, `check_port_name`.
//! - [`cost`]: `CostModelView`, `CalibrateRequest`, `CalibrationView` (the cost model and
//!   `POST /v1/calibrate`).
//! - [`access`]: `Account`, `FileMode` (a vhost-user server socket's owner, group and mode).
//! - [`migrate`]: `MigrateRequest`, `MigratedView`, `HandoverView` (`vqos port migrate`).
//! - [`stats`]: `SwitchStats` (`PortStats` with its `PortCounters`, `DropCounters` by
//!   `DropReason`, and `PortStatus`: `VhostUserStatus`, `AfPacketStatus`, `TapStatus`;
//!   `LoopStats`): the one definition of the statistics, which the data plane fills and the
//!   daemon serves as they are.
//! - [`DEFAULT_SOCKET`]: where the daemon listens by default.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod access;
pub mod client;
pub mod cost;
pub mod http;
pub mod migrate;
pub mod peer;
pub mod port;
pub mod stats;
pub mod wire;

/// Default path of the daemon's API socket.
pub const DEFAULT_SOCKET: &str = "/run/vqos/vqosd.sock";

/// An error and its sources on one line, `a: b: c` (for answers and logs that cannot carry a
/// chain).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
