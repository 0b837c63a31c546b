//! `vqos`'s exit statuses (docs/api.md, "CLI"): what went wrong, told by the status alone.

use vqos_api::client::ClientError;
use vqos_api::http::HttpError;

/// Something else failed (a file could not be read, a lab run broke, ...).
pub const FAILURE: i32 = 1;
/// The command line is wrong: unknown option, bad rate, MAC or name (clap's own status too).
pub const USAGE: i32 = 2;
/// vqosd (or, for `vqos cluster`, etcd) could not be reached (no socket, connection refused,
/// no answer in time).
pub const UNREACHABLE: i32 = 3;
/// vqosd answered and refused the request (unknown vif, invalid policy, ...).
pub const REFUSED: i32 = 4;
/// `--check`: the run worked but an expectation of the scenario failed.
pub const CHECK_FAILED: i32 = 5;
/// Stdout was closed before everything was written (`vqos ... | head -1`): nothing is printed
/// on stderr and the status is the shell's for a command killed by SIGPIPE (128 + 13), as
/// coreutils would have it, so that a `pipefail` pipeline still tells a cut-short run.
pub const CLOSED_PIPE: i32 = 141;

/// A command line the daemon is not even asked about.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The exit status of an error: the first cause that says.
pub fn status(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if cause.is::<UsageError>() {
            return USAGE;
        }
        if let Some(c) = cause.downcast_ref::<ClientError>() {
            return match c {
                ClientError::Connect { .. }
                | ClientError::Http(HttpError::Io(_))
                | ClientError::Untrusted { .. } => UNREACHABLE,
                ClientError::Api { .. } => REFUSED,
                ClientError::BadUrl(_) => USAGE,
                ClientError::Http(_) | ClientError::Decode(_) => FAILURE,
            };
        }
        if cause.is::<vqos_api::wire::WireError>() {
            return USAGE;
        }
        if let Some(e) = cause.downcast_ref::<vqos_cluster::EtcdError>() {
            return match e {
                vqos_cluster::EtcdError::Settings(_) => USAGE,
                vqos_cluster::EtcdError::Read { .. } | vqos_cluster::EtcdError::Lead(_) => FAILURE,
                vqos_cluster::EtcdError::Client(_) | vqos_cluster::EtcdError::Timeout { .. } => {
                    UNREACHABLE
                }
            };
        }
    }
    FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn each_kind_of_error_has_its_status() {
        let api: anyhow::Error = ClientError::Api {
            status: 404,
            message: "Unknown vif 'x'".into(),
        }
        .into();
        assert_eq!(status(&api), REFUSED);
        let connect: anyhow::Error = ClientError::Connect {
            endpoint: "/x".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        }
        .into();
        assert_eq!(status(&connect.context("Listing ports")), UNREACHABLE);
        let usage: anyhow::Error = UsageError("--priority 9 is out of range".into()).into();
        assert_eq!(status(&usage), USAGE);
        assert_eq!(status(&anyhow::anyhow!("disk full")), FAILURE);
        let r: anyhow::Result<()> = Err(anyhow::anyhow!("x")).context("y");
        assert_eq!(status(&r.unwrap_err()), FAILURE);
    }
}
