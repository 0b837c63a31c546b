//! The daemon's log: `tracing` events written to stderr, one line each, with a timestamp, the
//! level and the module. Colours only when stderr is a terminal, so journald (which reads a
//! pipe) gets plain lines. The level comes from `--log-level`, else `RUST_LOG`, else `info`;
//! both take `tracing-subscriber` filter directives (`debug`, `vqosd::audit=info,warn`, ...).
//!
//! What is logged at `info`: the start (engine, capacity, listeners), every port brought up or
//! removed, controller decisions, and one audit line per request that changes something
//! (target `vqosd::audit`, accepted or refused) with its caller: `uid=N` from `SO_PEERCRED` on
//! the unix socket, `token` on the TCP port. Nothing per frame is logged above `debug`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::http::{Request, Response};

/// Level used when neither `--log-level` nor `RUST_LOG` says.
pub const DEFAULT_LEVEL: &str = "info";

/// Most bytes of a request body quoted in an audit line.
const AUDIT_BODY_BYTES: usize = 256;

/// Installs the global subscriber. `level` (from `--log-level`) wins over `RUST_LOG`. A bad
/// directive is an error naming it.
pub fn init(level: Option<&str>) -> Result<(), String> {
    let directives = match level {
        Some(l) => l.to_string(),
        None => std::env::var("RUST_LOG").unwrap_or_else(|_| DEFAULT_LEVEL.to_string()),
    };
    let filter = EnvFilter::builder()
        .parse(&directives)
        .map_err(|e| format!("Invalid log level {directives:?}: {e}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init()
        .map_err(|e| format!("Cannot set up logging: {e}"))
}

/// True for a request that changes something (every method but `GET` and `HEAD`).
pub fn changes(req: &Request) -> bool {
    !matches!(req.method.as_str(), "GET" | "HEAD")
}

/// Logs the audit line of a changing request once it is answered: caller, method, path, status,
/// the body (its first 256 bytes, escaped) and, for a refusal, the error.
pub fn audit(caller: &str, req: &Request, resp: &Response) {
    if !changes(req) {
        return;
    }
    let body = String::from_utf8_lossy(&req.body[..req.body.len().min(AUDIT_BODY_BYTES)]);
    let cut = if req.body.len() > AUDIT_BODY_BYTES {
        "..."
    } else {
        ""
    };
    if resp.status < 400 {
        tracing::info!(
            target: "vqosd::audit",
            caller,
            status = resp.status,
            "{} {} {body:?}{cut}",
            req.method,
            req.path
        );
    } else {
        // The error answer is `{"error": "..."}`; anything else is quoted as it is.
        let error = serde_json::from_slice::<serde_json::Value>(&resp.body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{:?}", String::from_utf8_lossy(&resp.body)));
        tracing::info!(
            target: "vqosd::audit",
            caller,
            status = resp.status,
            "{} {} {body:?}{cut} refused: {error}",
            req.method,
            req.path
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_are_audited() {
        let req = |method: &str| Request {
            method: method.into(),
            path: "/v1/policies/vm1".into(),
            headers: Vec::new(),
            body: Vec::new(),
        };
        assert!(!changes(&req("GET")));
        assert!(changes(&req("PUT")) && changes(&req("POST")) && changes(&req("DELETE")));
    }

    #[test]
    fn a_bad_level_is_named() {
        let e = init(Some("vqosd=loud")).unwrap_err();
        assert!(e.contains("vqosd=loud"), "{e}");
    }
}
