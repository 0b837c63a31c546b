//! `vqos reload`: vqosd re-reads its config file and applies what changed in it (as SIGHUP).

use std::io::Write;

use anyhow::Result;
use clap::Args;
use vqos_api::client::Client;
use vqos_api::wire::ReloadView;

use crate::ctl::ConnArgs;

/// Arguments of `vqos reload`.
#[derive(Args, Debug)]
#[command(
    after_help = "Ports added to or removed from the file are added or removed, changed policies \
                  are set; ports and policies not changed in the file keep what the API set. \
                  A file that is invalid or changes a key that needs a restart is refused as a \
                  whole (exit 4) and nothing changes."
)]
pub struct ReloadArgs {
    /// Print the daemon's JSON answer.
    #[arg(long)]
    json: bool,
}

/// Runs `vqos reload`.
pub fn run(conn: &ConnArgs, args: ReloadArgs) -> Result<()> {
    reload_to(&conn.client()?, &args, &mut crate::out::stdout())
}

fn reload_to(c: &Client, args: &ReloadArgs, out: &mut impl Write) -> Result<()> {
    let r: ReloadView = c.call("POST", "/v1/reload", None)?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
        return Ok(());
    }
    if r.is_empty() {
        writeln!(out, "Reloaded: no change")?;
        return Ok(());
    }
    let mut parts = Vec::new();
    for (what, names) in [
        ("added", &r.added),
        ("removed", &r.removed),
        ("policy set", &r.policies),
    ] {
        if !names.is_empty() {
            parts.push(format!("{what} {}", names.join(", ")));
        }
    }
    if let Some(c) = &r.capacity {
        parts.push(format!("capacity {c}"));
    }
    if let Some(m) = r.max_ports {
        parts.push(format!("max_ports {m}"));
    }
    writeln!(out, "Reloaded: {}", parts.join("; "))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use vqosd::api::Api;
    use vqosd::backend::MockBackend;
    use vqosd::config::Config;
    use vqosd::server::{Server, ServerConfig};

    #[test]
    fn reload_prints_what_changed_and_refusals_exit_4() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vqosd.toml");
        let head = format!(
            "capacity = \"1Gbit\"\nstate_file = \"{0}/state.json\"\n[api]\nsocket = \
             \"{0}/s.sock\"\n[[port]]\nname = \"vm1\"\n",
            dir.path().display()
        );
        std::fs::write(&path, &head).unwrap();
        let config = Config::load(&path).unwrap();
        let api = Arc::new(Api::start(&config, Arc::new(MockBackend::new())).unwrap());
        api.set_config_path(path.clone());
        let _server = Server::start(&ServerConfig::from_config(&config), api).unwrap();
        let c = Client::new(vqos_api::client::Endpoint::Unix(config.socket_path));
        let run = |json| {
            let mut out = Vec::new();
            reload_to(&c, &ReloadArgs { json }, &mut out).map(|_| String::from_utf8(out).unwrap())
        };
        assert_eq!(run(false).unwrap(), "Reloaded: no change\n");
        std::fs::write(
            &path,
            format!("{head}policy = {{ max_in = \"5Mbit\" }}\n[[port]]\nname = \"vm2\"\n"),
        )
        .unwrap();
        assert_eq!(run(false).unwrap(), "Reloaded: added vm2; policy set vm1\n");
        let json: serde_json::Value = serde_json::from_str(&run(true).unwrap()).unwrap();
        assert_eq!(json["added"], serde_json::json!([]));
        std::fs::write(&path, format!("engine = \"rr\"\n{head}")).unwrap();
        let e = run(false).unwrap_err();
        assert_eq!(crate::exit::status(&e), crate::exit::REFUSED);
        assert_eq!(
            e.to_string(),
            "Reload refused, nothing changed: engine cannot change without a restart"
        );
    }
}
