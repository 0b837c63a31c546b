//! # vqosd
//!
//! The vqos daemon as a library: its TOML [`config`], the control API ([`api`]) served over
//! HTTP/1.1 ([`http`], [`server`]) on a root-only unix socket and optionally on a
//! token-protected loopback TCP port, Prometheus [`metrics`], the persisted policy [`state`],
//! and the [`backend`] boundary to the switch (the real data plane through [`switch`], or an
//! in-memory mock that ships with the crate for tests), and the [`controllers`] (fairness
//! adjuster, PID-ECN) that run beside the switch when the config enables them. The wire types,
//! the HTTP subset and the [`client`] live in the `vqos-api` crate (re-exported here), which the
//! `vqos` CLI and the lab use without linking the daemon or the data plane.
//!
//! The `switch` feature (default) brings the real data plane and the `vqosd` binary; without it
//! the crate is the API, the server, the state and the mock switch (the CLI's and the lab's
//! tests run a daemon in-process that way).
//!
//! ## Behavior
//! - Every change (add or remove a port, set a policy, reload the config) is validated as a
//!   whole policy set first;
//!   an invalid request is answered with a 4xx and a JSON `{"error": ...}` and changes nothing,
//!   neither in the switch nor on disk.
//! - An accepted change is applied to the switch, then the whole state is written atomically
//!   (temporary file in the same directory, fsync, rename, fsync of the directory). If the write
//!   fails the switch is put back as it was and the client gets a 500. A port removal is saved
//!   first and applied after, so a failed save changes nothing.
//! - On start the ports of the config are created (except those deleted through the API, kept
//!   as tombstones in the state file), the ports added through the API are restored from the
//!   state file, and the state file's policies win over the config's.
//! - Requests are served one thread per connection, with separate connection limits for the unix
//!   socket and TCP, bounded header and body sizes, and one deadline for each whole request
//!   (408 beyond); every response closes the connection. Readers (GETs, stats, metrics) use a
//!   snapshot of the committed state and never wait behind a change.
//!
//! - A [`watchdog`] checks the forwarding loop every second; `/v1/health` answers 503 with the
//!   reason while the loop is dead, and the daemon exits with status 2 when it finds it dead, so
//!   systemd restarts it.
//!
//! ## Limitations
//! - HTTP/1.1 subset: `Content-Length` bodies only (no chunked requests), no keep-alive, no TLS
//!   (TCP listens on loopback only).
//! - Engine, cost (bytes or cycles), `[cost_model]` and the other switch settings come from the
//!   config only; changing them needs a restart (a model fitted by `POST /v1/calibrate` can be
//!   installed live, until the restart). Ports, policies, capacity and `max_ports` follow a reload of the config
//!   file (SIGHUP, `POST /v1/reload`; see [`api`]'s `reload` module and docs/api.md).
#![deny(missing_docs)]

// The wire types, the HTTP subset and the client live in `vqos-api`, which the CLI and the lab
// use without the daemon; they are re-exported here under their old paths.
pub use vqos_api::{client, http, wire};

pub mod api;
pub mod backend;
pub mod cluster;
pub mod config;
pub mod controllers;
pub mod gate;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod server;
pub mod signals;
pub mod socket_access;
pub mod state;
#[cfg(feature = "switch")]
pub mod switch;
pub mod watchdog;
