//! `vqosd`: the vqos switch daemon.

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use vqos_api::wire::{PortConfig, PortKind};
use vqos_sched::units::format_rate;
use vqosd::api::{Api, StartPlan};
use vqosd::backend::{Backend, LoopHealth, MockBackend, MOCK_STATS_INTERVAL_NS};
use vqosd::config::Config;
use vqosd::server::{Server, ServerConfig, ServerError};
use vqosd::switch::SwitchBackend;
use vqosd::watchdog::CHECK_PERIOD;

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
/// SIGINT stops it cleanly; SIGHUP (or `vqos reload`) re-reads the config and applies what
/// changed in it without a restart. See docs/api.md for the endpoints and the config keys.
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
    #[arg(long, short = 'c', value_name = "FILE", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    /// Run the start's checks (config, the uplink the switch needs, state file, policies,
    /// interfaces to attach) and exit without starting or changing anything.
    #[arg(long)]
    check: bool,
    /// Log filter: a level (error, warn, info, debug, trace) or tracing directives such as
    /// `info,vqosd::audit=warn`; overrides RUST_LOG (default info). Logs go to stderr.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Which switch to drive.
    #[arg(long, value_enum, default_value_t = BackendKind::Switch)]
    backend: BackendKind,
    /// Tests only: the mock's forwarding loop dies this many ms after the start.
    #[arg(long, hide = true, value_name = "MS")]
    mock_loop_dies_after_ms: Option<u64>,
    /// Packaging: print the vqosd(8) man page (roff) and exit (scripts/install.sh).
    #[arg(long, hide = true)]
    man: bool,
}

/// The config read when `--config` is not given.
const DEFAULT_CONFIG: &str = "/etc/vqos/vqosd.toml";

/// Exit status when the forwarding loop died (1 is a startup or runtime error).
const EXIT_LOOP_DEAD: i32 = 2;
/// Exit status when a TCP address vqosd must listen on (api.tcp, metrics.listen) is held by
/// another program: told apart from other start-up errors, since restarting will not help.
const EXIT_PORT_TAKEN: i32 = 3;

/// What ends the daemon.
enum Stop {
    /// SIGTERM or SIGINT.
    Signal(i32),
    /// The watchdog found the forwarding loop dead.
    LoopDead(String),
    /// Waiting for signals failed.
    Failed(vqosd::signals::SignalError),
}

fn build_backend(args: &Args, config: &Config) -> Result<Arc<dyn Backend>> {
    Ok(match args.backend {
        BackendKind::Mock => {
            let mock = Arc::new(MockBackend::new());
            if let Some(ms) = args.mock_loop_dies_after_ms {
                let m = mock.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(ms));
                    m.set_loop_health(LoopHealth {
                        running: false,
                        ..LoopHealth::alive(MOCK_STATS_INTERVAL_NS)
                    });
                });
            }
            mock
        }
        BackendKind::Switch => Arc::new(SwitchBackend::start(config)?),
    })
}

/// Everything the start refuses that can be known without side effects: the options and
/// the config for the chosen switch (the real one needs an `[uplink]`), the state file and the
/// merged policies ([`Api::plan`]), and the interfaces that must already exist (an AF_PACKET
/// uplink, TAPs attached with `create = false`). `--check` runs only this (`dry`: the state
/// file is read, never touched); the start runs it first, so the two cannot disagree.
fn preflight(args: &Args, config: &Config, dry: bool) -> Result<StartPlan> {
    let switch = args.backend == BackendKind::Switch;
    if switch && args.mock_loop_dies_after_ms.is_some() {
        anyhow::bail!("--mock-loop-dies-after-ms needs --backend mock");
    }
    if switch && config.uplink.is_none() {
        anyhow::bail!("Cannot start the switch: the config has no [uplink] (name = \"...\")");
    }
    let plan = Api::plan(config, dry)?;
    if switch {
        let attached = |p: &&PortConfig| p.kind == PortKind::AfPacket || !p.create;
        let ports = config.uplink.iter().chain(&plan.ports).map(|p| &p.config);
        for p in ports.filter(attached) {
            let name = std::ffi::CString::new(p.name.as_str())?;
            // SAFETY: if_nametoindex reads the NUL-terminated name and nothing else.
            if unsafe { libc::if_nametoindex(name.as_ptr()) } == 0 {
                anyhow::bail!(
                    "Cannot start the switch: interface '{}' does not exist (the port attaches \
                     to an existing interface: create = false, or kind = \"af-packet\")",
                    p.name
                );
            }
        }
    }
    Ok(plan)
}

/// Runs the daemon; `Ok(Some(reason))` when it stopped because the forwarding loop died.
fn run(args: Args) -> Result<Option<String>> {
    vqosd::logging::init(args.log_level.as_deref()).map_err(anyhow::Error::msg)?;
    let config = Config::load(&args.config)?;
    let plan = preflight(&args, &config, args.check)?;
    if args.check {
        for w in &plan.warnings {
            tracing::warn!("{w}");
        }
        println!(
            "vqosd: config {} is valid: {} port(s), engine {}, capacity {}",
            args.config.display(),
            plan.ports.len(),
            config.engine,
            format_rate(config.capacity_bps)
        );
        return Ok(None);
    }
    // Installed first, so a signal during startup is not lost: it is read after startup.
    let signals = vqosd::signals::install()?;
    let backend = build_backend(&args, &config).context("Cannot start the switch")?;
    let api = match Api::start_planned(&config, plan, backend.clone()) {
        Ok(api) => Arc::new(api),
        Err(e) => {
            backend.stop();
            return Err(e.into());
        }
    };
    // SIGHUP and POST /v1/reload re-read this file.
    api.set_config_path(args.config.clone());
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
    // The etcd agent (docs/cluster.md): fail-static, so etcd being down does not stop the start.
    let mut cluster = match config.cluster.clone() {
        None => None,
        Some(c) => match vqosd::cluster::spawn(c, api.clone()) {
            Ok(a) => Some(a),
            Err(e) => {
                if let Some(c) = controllers.as_mut() {
                    c.stop();
                }
                server.shutdown();
                backend.stop();
                return Err(anyhow::Error::from(e).context("Cannot start the cluster agent"));
            }
        },
    };
    let mut listening = format!("unix:{}", config.socket_path.display());
    if let Some(addr) = server.tcp_addr() {
        listening.push_str(&format!(" tcp:{addr}"));
    }
    if let Some(addr) = server.metrics_addr() {
        listening.push_str(&format!(" metrics:{addr}"));
    }
    let mut names = Vec::new();
    if config.controllers.fairness.is_some() {
        names.push("fairness");
    }
    if config.controllers.pid_ecn.is_some() {
        names.push("pid-ecn");
    }
    if let Some(c) = &config.cluster {
        listening.push_str(&format!(
            " etcd:{} as host {}",
            c.etcd.endpoints.join(","),
            c.host
        ));
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
    // Ports are up and the API answers: tell systemd (Type=notify), if it started us.
    if let Err(e) = vqosd::notify::notify("READY=1") {
        tracing::warn!("{:#}", anyhow::Error::from(e));
    }
    // Signals and the watchdog both end the wait below.
    let (tx, rx) = mpsc::channel();
    let signal_tx = tx.clone();
    let reloader = api.clone();
    std::thread::spawn(move || loop {
        match signals.wait() {
            Ok(libc::SIGHUP) => match reloader.reload_file("signal SIGHUP") {
                Ok(r) if r.is_empty() => tracing::info!("SIGHUP: config reloaded, no change"),
                Ok(r) => tracing::info!(
                    "SIGHUP: config reloaded: {} added, {} removed, {} policies set{}{}",
                    r.added.len(),
                    r.removed.len(),
                    r.policies.len(),
                    r.capacity
                        .map(|c| format!(", capacity {c}"))
                        .unwrap_or_default(),
                    r.max_ports
                        .map(|m| format!(", max_ports {m}"))
                        .unwrap_or_default()
                ),
                Err(e) => tracing::error!("SIGHUP: {e}"),
            },
            Ok(sig) => {
                let _ = signal_tx.send(Stop::Signal(sig));
                return;
            }
            Err(e) => {
                let _ = signal_tx.send(Stop::Failed(e));
                return;
            }
        }
    });
    // Every second, the addresses port security locked go into the state file.
    let locks_api = api.clone();
    let mut locks_failing = false;
    let persist_locks = move || match locks_api.sync_locks() {
        Ok(_) => locks_failing = false,
        Err(e) if !locks_failing => {
            locks_failing = true;
            tracing::warn!("Locked addresses not saved (retried every second): {e}");
        }
        Err(_) => {}
    };
    let watchdog =
        vqosd::watchdog::spawn(backend.clone(), CHECK_PERIOD, persist_locks, move |why| {
            let _ = tx.send(Stop::LoopDead(why));
        });
    let mut watchdog = match watchdog {
        Ok(w) => w,
        Err(e) => {
            server.shutdown();
            backend.stop();
            return Err(anyhow::Error::from(e).context("Cannot start the watchdog"));
        }
    };
    let stop = rx.recv().unwrap_or(Stop::Signal(0));
    watchdog.stop();
    let outcome = match stop {
        Stop::Signal(sig) => {
            tracing::info!("Signal {sig}, stopping");
            Ok(None)
        }
        Stop::LoopDead(why) => {
            tracing::error!("{why}; exiting so that the supervisor restarts the switch");
            Ok(Some(why))
        }
        Stop::Failed(e) => Err(e.into()),
    };
    let _ = vqosd::notify::notify("STOPPING=1");
    if let Some(a) = cluster.as_mut() {
        a.stop();
    }
    if let Some(c) = controllers.as_mut() {
        c.stop();
    }
    server.shutdown();
    backend.stop();
    outcome
}

/// The sections of vqosd(8) clap knows nothing of (roff).
const MAN_TAIL: &str = r#".SH SIGNALS
.TP
\fBSIGTERM\fR, \fBSIGINT\fR
Stop cleanly (the TAPs persist unless \fBremove_taps_on_exit\fR is set).
.TP
\fBSIGHUP\fR
Re\-read the config file and apply what changed in it (ports, policies, \fBcapacity\fR,
\fBmax_ports\fR), as \fBvqos reload\fR does; a change of any other key is refused as a whole
and needs a restart.
.SH EXIT STATUS
.TP
\fB0\fR
Stopped by a signal, or \fB\-\-check\fR found the config valid.
.TP
\fB1\fR
A start\-up or runtime error (printed as \fBvqosd: \fR\fImessage\fR on stderr).
.TP
\fB2\fR
The forwarding loop died (the watchdog stopped the daemon so that its supervisor restarts it).
.TP
\fB3\fR
A TCP address vqosd must listen on (\fBapi.tcp\fR, \fBmetrics.listen\fR) is held by another
program.
.SH FILES
.TP
\fI/etc/vqos/vqosd.toml\fR
The config file read when \fB\-\-config\fR is not given; see \fBvqosd.toml\fR(5).
.TP
\fI/run/vqos/vqosd.sock\fR
The control API's unix socket (\fBapi.socket\fR), root's only.
.TP
\fI/var/lib/vqos/state.json\fR
The state file (\fBstate_file\fR): ports and policies made through the API, restored at start.
.TP
\fI/etc/systemd/system/vqosd.service\fR
The systemd unit installed by \fBscripts/install.sh\fR (\fBType=notify\fR).
.SH SEE ALSO
\fBvqos\fR(1), \fBvqosd.toml\fR(5), \fBsystemctl\fR(1);
docs/api.md in the source tree (the endpoints, the config keys, the service).
"#;

/// Writes the vqosd(8) man page: clap's sections, the `after_help` example as EXAMPLE, and
/// [`MAN_TAIL`]; ASCII only (groff without preconv warns on UTF-8).
fn man_page(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    use clap::CommandFactory;
    let cmd = Args::command().about("the vqos virtual switch daemon");
    let example = cmd
        .get_after_help()
        .map(|h| h.to_string())
        .unwrap_or_default();
    let page = clap_mangen::Man::new(cmd)
        .section("8")
        .manual("System Manager's Manual");
    let mut roff = Vec::new();
    page.render_title(&mut roff)?;
    page.render_name_section(&mut roff)?;
    page.render_synopsis_section(&mut roff)?;
    page.render_description_section(&mut roff)?;
    page.render_options_section(&mut roff)?;
    // Verbatim (.EX), each line escaped: the config is to be copied as it is.
    roff.extend_from_slice(b".SH EXAMPLE\n.EX\n");
    for line in example.lines() {
        let line = line.replace('\\', "\\e").replace('-', "\\-");
        if line.starts_with(['.', '\'']) {
            roff.extend_from_slice(b"\\&");
        }
        roff.extend_from_slice(line.as_bytes());
        roff.push(b'\n');
    }
    roff.extend_from_slice(b".EE\n");
    roff.extend_from_slice(MAN_TAIL.as_bytes());
    page.render_version_section(&mut roff)?;
    let roff = String::from_utf8_lossy(&roff).replace('\u{2014}', "\\(em");
    out.write_all(roff.as_bytes())
}

fn main() {
    let args = Args::parse();
    if args.man {
        // Rendered whole before the write: a closed pipe (`vqosd --man | head`) ends it quietly.
        let mut buf = Vec::new();
        man_page(&mut buf).expect("rendering into memory");
        let mut out = std::io::stdout().lock();
        match std::io::Write::write_all(&mut out, &buf)
            .and_then(|()| std::io::Write::flush(&mut out))
        {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return,
            Err(e) => {
                eprintln!("vqosd: cannot write the man page: {e}");
                std::process::exit(1);
            }
        }
    }
    match run(args) {
        Ok(None) => {}
        Ok(Some(_)) => std::process::exit(EXIT_LOOP_DEAD),
        Err(e) => {
            eprintln!("vqosd: {e:#}");
            let taken = e
                .chain()
                .any(|c| matches!(c.downcast_ref(), Some(ServerError::TcpTaken { .. })));
            std::process::exit(if taken { EXIT_PORT_TAKEN } else { 1 });
        }
    }
}
