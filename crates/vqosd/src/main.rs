//! `vqosd`: the vqos switch daemon.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use vqos_sched::units::format_rate;
use vqosd::api::Api;
use vqosd::backend::{Backend, MockBackend};
use vqosd::config::Config;
use vqosd::server::{Server, ServerConfig};
use vqosd::switch::SwitchBackend;

/// Which switch the daemon drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// The real data plane: TAP ports, the poll loop, the engine.
    Switch,
    /// An in-memory switch that forwards nothing: try the API and the CLI without root
    /// network privileges or TAP devices.
    Mock,
}

/// vqosd — the vqos virtual switch daemon.
///
/// Reads a TOML config (capacity, engine, ports and their policies), starts the switch, restores
/// the policies saved in the state file, and serves the control API (HTTP/JSON) on a unix socket
/// only root can open, optionally also on a loopback TCP port with a bearer token. SIGTERM or
/// SIGINT stops it cleanly. See docs/api.md for the endpoints and the config keys.
#[derive(Parser, Debug)]
#[command(
    name = "vqosd",
    version,
    after_help = "Example config:\n  \
capacity = \"940Mbit\"\n  \
engine = \"vqos\"\n  \
[api]\n  \
socket = \"/run/vqos/vqosd.sock\"\n  \
[uplink]\n  \
name = \"vqos-up\"\n  \
[[port]]\n  \
name = \"vm1\"\n  \
policy = { weight = 3, min = \"200Mbit\", max = \"500Mbit\", priority = 1 }\n\n\
Then: vqos port list; vqos policy set vm1 --max 300Mbit; vqos stats --watch"
)]
struct Args {
    /// The config file (TOML).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: PathBuf,
    /// Check the config and exit without starting anything.
    #[arg(long)]
    check: bool,
    /// Which switch to drive.
    #[arg(long, value_enum, default_value_t = BackendKind::Switch)]
    backend: BackendKind,
}

fn build_backend(kind: BackendKind, config: &Config) -> Result<Arc<dyn Backend>> {
    Ok(match kind {
        BackendKind::Mock => Arc::new(MockBackend::new()),
        BackendKind::Switch => Arc::new(SwitchBackend::start(config)?),
    })
}

fn run(args: Args) -> Result<()> {
    let config = Config::load(&args.config)?;
    if args.check {
        println!(
            "vqosd: config {} is valid: {} port(s), engine {}, capacity {}",
            args.config.display(),
            config.ports.len(),
            config.engine,
            format_rate(config.capacity_bps)
        );
        return Ok(());
    }
    // Installed first, so a signal during startup is not lost: it is read after startup.
    let signals = vqosd::signals::install()?;
    let backend = build_backend(args.backend, &config).context("Cannot start the switch")?;
    let api = match Api::start(&config, backend.clone()) {
        Ok(api) => Arc::new(api),
        Err(e) => {
            backend.stop();
            return Err(e.into());
        }
    };
    let mut server = match Server::start(&ServerConfig::from_config(&config), api.clone()) {
        Ok(s) => s,
        Err(e) => {
            backend.stop();
            return Err(e.into());
        }
    };
    let mut controllers = if config.controllers.is_empty() {
        None
    } else {
        match vqosd::controllers::spawn(config.controllers.clone(), api.clone()) {
            Ok(t) => Some(t),
            Err(e) => {
                server.shutdown();
                backend.stop();
                return Err(anyhow::Error::from(e).context("Cannot start the controllers"));
            }
        }
    };
    let mut listening = format!("unix:{}", config.socket_path.display());
    if let Some(addr) = server.tcp_addr() {
        listening.push_str(&format!(" tcp:{addr}"));
    }
    let mut names = Vec::new();
    if config.controllers.fairness.is_some() {
        names.push("fairness");
    }
    if config.controllers.pid_ecn.is_some() {
        names.push("pid-ecn");
    }
    println!(
        "vqosd: listening on {listening}; engine {}, capacity {}, {} port(s), controllers: {}",
        config.engine,
        format_rate(config.capacity_bps),
        api.policies().len(),
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    );
    let sig = signals.wait()?;
    eprintln!("vqosd: signal {sig}, stopping");
    if let Some(c) = controllers.as_mut() {
        c.stop();
    }
    server.shutdown();
    backend.stop();
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("vqosd: {e:#}");
        std::process::exit(1);
    }
}
