//! `vqos port`, `vqos policy`, `vqos stats`: the control commands, talking to a running `vqosd`
//! over its API (unix socket by default, or `--url http://127.0.0.1:PORT --token-file F`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::json;
use vqos_api::client::Client;
use vqos_api::migrate::MigratedView;
use vqos_api::wire::{
    Account, FileMode, PolicyPatch, PolicyView, PortKind, PortRequest, PortView, Rate, RemovedView,
    Size, StatsView, VhostUserRole, MAX_PRIORITY,
};
use vqos_api::DEFAULT_SOCKET;
use vqos_sched::policy::MAX_BURST_BYTES;
use vqos_sched::units::{format_bytes, parse_bytes, parse_rate};

use crate::exit::UsageError;

mod status;
mod table;

pub use status::{status, StatusArgs};
use table::{describe, write_ports, write_stats};

/// How to reach vqosd (global options).
#[derive(Args, Debug, Clone, Default)]
pub struct ConnArgs {
    /// Path of vqosd's API socket [env: VQOS_SOCKET; default: /run/vqos/vqosd.sock].
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Talk to vqosd over TCP instead, e.g. http://127.0.0.1:7451.
    #[arg(long, global = true, value_name = "URL")]
    url: Option<String>,
    /// File holding the bearer token for --url.
    #[arg(long, global = true, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

impl ConnArgs {
    /// The client these options describe.
    pub(crate) fn client(&self) -> Result<Client> {
        if self.token_file.is_some() && self.url.is_none() {
            return Err(UsageError("--token-file needs --url".into()).into());
        }
        if let Some(url) = &self.url {
            // The URL first: a bad one is a usage error whatever the token file.
            Client::from_url(url, None)?;
            let token = match &self.token_file {
                Some(f) => Some(
                    std::fs::read_to_string(f)
                        .with_context(|| format!("Cannot read token file {}", f.display()))?
                        .trim()
                        .to_string(),
                ),
                None => None,
            };
            return Ok(Client::from_url(url, token)?);
        }
        let socket = self
            .socket
            .clone()
            .or_else(|| std::env::var_os("VQOS_SOCKET").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        Ok(Client::new(vqos_api::client::Endpoint::Unix(socket)))
    }
}

/// Policy options shared by `port add` and `policy set`.
#[derive(Args, Debug, Clone, Default)]
pub struct PolicyOpts {
    /// Proportional share (> 0).
    #[arg(long)]
    weight: Option<u32>,
    /// Guaranteed minimum, e.g. 200Mbit (0 = none).
    #[arg(long, value_name = "RATE")]
    min: Option<String>,
    /// Hard maximum of what the vif sends, e.g. 500Mbit, or "unlimited"; 0 (which blocks the
    /// vif) only with --block.
    #[arg(long, value_name = "RATE", visible_alias = "max-out")]
    max: Option<String>,
    /// Latency priority, 0 (most urgent) to 7.
    #[arg(long, value_name = "P")]
    priority: Option<u8>,
    /// Hard maximum of what the vif receives, e.g. 100Mbit; "unlimited": none whatever
    /// --max is; "max": the same as --max (the default); 0 only with --block.
    #[arg(long, value_name = "RATE")]
    max_in: Option<String>,
    /// Bytes the vif may send above --max after idling, e.g. 64KiB (1B to 1GiB); "default":
    /// the engine's own.
    #[arg(long, value_name = "SIZE")]
    burst: Option<String>,
    /// Confirms a --max or --max-in of 0: the vif's traffic that way is blocked.
    #[arg(long)]
    block: bool,
}

/// `Some(rate)` (`None`: unlimited) of a rate option, or a usage error naming the option.
fn rate(flag: &str, text: &str) -> Result<Option<u64>> {
    Ok(parse_rate(text).map_err(|e| UsageError(format!("--{flag}: {e}")))?)
}

/// A `--max` or `--max-in` of 0 blocks the vif that way: refused unless confirmed by
/// `--block`, and `--block` refused without one (`vqos policy set`, `port add`, `cluster vif
/// set`).
pub(crate) fn check_block(max: Option<&str>, max_in: Option<&str>, block: bool) -> Result<()> {
    let mut zero = None;
    for (flag, text, way) in [("max", max, "sends"), ("max-in", max_in, "receives")] {
        let Some(t) = text.filter(|t| *t != "max") else {
            continue;
        };
        if rate(flag, t)? == Some(0) && zero.is_none() {
            zero = Some((flag, t, way));
        }
    }
    let msg = match (zero, block) {
        (Some((flag, text, way)), false) => format!(
            "--{flag} {text} blocks everything the vif {way}; add --block if that is what you \
             mean"
        ),
        (None, true) => "--block confirms a --max or --max-in of 0; give one".into(),
        _ => return Ok(()),
    };
    Err(UsageError(msg).into())
}

impl PolicyOpts {
    /// Refuses what the daemon would refuse or what is most likely a slip: weight 0, an
    /// unlimited minimum, a minimum above the maximum, a burst out of range, a zero maximum
    /// without --block.
    fn check(&self) -> Result<()> {
        let usage = |msg: String| -> Result<()> { Err(UsageError(msg).into()) };
        if self.weight == Some(0) {
            return usage("--weight must be greater than 0".into());
        }
        let min = match &self.min {
            Some(m) => match rate("min", m)? {
                Some(bps) => Some((m, bps)),
                None => return usage("--min cannot be unlimited (0 = none)".into()),
            },
            None => None,
        };
        let max = match self.max.as_deref() {
            Some(m) => rate("max", m)?.map(|bps| (m, bps)),
            None => None,
        };
        if let (Some((lo, lo_bps)), Some((hi, hi_bps))) = (min, max) {
            if lo_bps > hi_bps {
                return usage(format!("--min {lo} is above --max {hi}"));
            }
        }
        check_block(self.max.as_deref(), self.max_in.as_deref(), self.block)?;
        if let Some(b) = self.burst.as_deref().filter(|b| *b != "default") {
            let bytes = parse_bytes(b).map_err(|e| UsageError(format!("--burst: {e}")))?;
            if bytes == 0 || bytes > MAX_BURST_BYTES {
                let range = format!("1B..={}", format_bytes(MAX_BURST_BYTES));
                return usage(format!(
                    "--burst {} is out of range {range}",
                    format_bytes(bytes)
                ));
            }
        }
        if let Some(p) = self.priority.filter(|p| *p > MAX_PRIORITY) {
            return usage(format!("--priority {p} is out of range 0..={MAX_PRIORITY}"));
        }
        Ok(())
    }

    /// The patch of the options given, checked first (see [`PolicyOpts::check`]).
    fn patch(&self) -> Result<PolicyPatch> {
        self.check()?;
        let rate_of = |flag: &str, text: Option<&str>| -> Result<Option<Rate>> {
            text.map(|t| rate(flag, t).map(Rate)).transpose()
        };
        // `--max-in max` and `--burst default` reset them (null).
        let max_in = match self.max_in.as_deref() {
            Some("max") => Some(None),
            other => rate_of("max-in", other)?.map(Some),
        };
        let burst = match self.burst.as_deref() {
            Some("default") => Some(None),
            Some(b) => {
                let bytes = parse_bytes(b).map_err(|e| UsageError(format!("--burst: {e}")))?;
                Some(Some(Size(bytes)))
            }
            None => None,
        };
        Ok(PolicyPatch {
            weight: self.weight,
            min: rate_of("min", self.min.as_deref())?,
            max: rate_of("max", self.max.as_deref())?.map(Some),
            priority: self.priority,
            max_in,
            burst,
        })
    }
}

/// Arguments of `vqos port`.
#[derive(Args, Debug)]
pub struct PortArgs {
    #[command(subcommand)]
    command: PortCommand,
}

// One value parsed once per run: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum PortCommand {
    /// List the vif ports with their policies.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add a vif port: a TAP vqosd creates (default), an existing TAP (--attach), or a
    /// vhost-user socket for a VM (--vhost-user).
    Add {
        /// Interface name.
        name: String,
        /// Attach to an existing TAP instead of creating one.
        #[arg(long, conflicts_with = "vhost_user")]
        attach: bool,
        /// A vhost-user port on this unix socket (QEMU `-chardev socket,path=...`); vqosd
        /// listens on it unless --client.
        #[arg(long, value_name = "SOCKET")]
        vhost_user: Option<PathBuf>,
        /// With --vhost-user: connect to the socket the VM's frontend listens on, and reconnect
        /// (QEMU `server=on`): vqosd can restart under running guests.
        #[arg(long, requires = "vhost_user")]
        client: bool,
        /// Queues, 1 to 16 (default 1). With --vhost-user: queue pairs offered to the guest
        /// (QEMU `-netdev vhost-user,queues=N`); a TAP: IFF_MULTI_QUEUE queues, over which
        /// the guest's side spreads its flows.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=16))]
        queues: Option<u16>,
        /// The forwarding thread that reads the port, 0 to threads - 1 (as loops[] in
        /// `vqos stats --json`); default the one with the fewest ports.
        #[arg(long, value_name = "K")]
        thread: Option<usize>,
        /// With --vhost-user, server role: give the socket to this user (a name or a uid, e.g.
        /// libvirt-qemu) so that a QEMU running as that user can connect.
        #[arg(
            long,
            value_name = "USER",
            requires = "vhost_user",
            conflicts_with = "client"
        )]
        socket_owner: Option<Account>,
        /// With --vhost-user, server role: the socket's group (a name or a gid, e.g. kvm).
        #[arg(
            long,
            value_name = "GROUP",
            requires = "vhost_user",
            conflicts_with = "client"
        )]
        socket_group: Option<Account>,
        /// With --vhost-user, server role: the socket's permission bits in octal, e.g. 0660
        /// (default: what vqosd's umask leaves, 0700 under the shipped unit).
        #[arg(
            long,
            value_name = "MODE",
            requires = "vhost_user",
            conflicts_with = "client"
        )]
        socket_mode: Option<FileMode>,
        /// Source MAC the vif may send from, its own from now on (repeat). Without --mac the
        /// vif locks to the first 4 MACs it sends from.
        #[arg(long = "mac", value_name = "MAC")]
        macs: Vec<String>,
        /// Port security off: without --mac, the vif may send from any MAC no other port
        /// owns (a router or a nested bridge behind the port).
        #[arg(long, conflicts_with = "macs")]
        no_port_security: bool,
        /// An IP address the vif may claim (source, ARP sender, neighbour advertisement),
        /// its own from now on (repeat). Without --ip the vif locks to the first 2 IPv4 and
        /// 8 IPv6 addresses it uses.
        #[arg(long = "ip", value_name = "ADDR", conflicts_with = "no_port_security")]
        ips: Vec<std::net::IpAddr>,
        /// What the vif may serve its neighbours (repeat): `router` (IPv6 router
        /// advertisements) or `dhcp-server`; refused from every other vif.
        #[arg(long = "serve", value_name = "SERVICE", value_parser = ["router", "dhcp-server"],
              conflicts_with = "no_port_security")]
        serves: Vec<String>,
        #[command(flatten)]
        policy: PolicyOpts,
        /// Print the daemon's JSON answer (the port as listed).
        #[arg(long)]
        json: bool,
    },
    /// Remove a vif port.
    Del {
        /// Interface name.
        name: String,
        /// Print the daemon's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Hand a live-migrating guest's identity from its port to the destination's port.
    ///
    /// DST (added beforehand, without --mac/--ip, owning no address) takes SRC's policy and
    /// port security with its locks, and co-owns SRC's MAC and IP addresses until its first
    /// frame from one of them (QEMU's announce when the migration completes): from the call
    /// on no other port can claim them. SRC keeps forwarding the guest until then; delete it
    /// (vqos port del SRC) when QEMU says the migration completed: its counters continue on
    /// DST. If the migration fails, delete DST: SRC keeps everything.
    Migrate {
        /// The port the guest runs on now.
        src: String,
        /// The port of the destination QEMU (`-incoming`).
        dst: String,
        /// Print the daemon's JSON answer.
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `vqos policy`.
#[derive(Args, Debug)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// Show a vif's policy.
    Get {
        /// The vif.
        vif: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change a vif's policy live; options left out keep their value.
    #[command(
        after_help = "Example:\n  vqos policy set vm1 --weight 3 --min 200Mbit --max 500Mbit --priority 1"
    )]
    Set {
        /// The vif.
        vif: String,
        #[command(flatten)]
        policy: PolicyOpts,
        /// Print the daemon's JSON answer (the new policy).
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `vqos stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Refresh the table until interrupted: in place on a terminal, else one table after
    /// another; a daemon that goes away (a restart) is waited for, said on stderr.
    #[arg(long)]
    watch: bool,
    /// Print the daemon's JSON (one document per refresh with --watch).
    #[arg(long)]
    json: bool,
    /// Seconds between refreshes with --watch.
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    interval: f64,
}

/// Percent-free path segment check: port names never need escaping, anything else is refused.
fn segment(name: &str) -> Result<&str> {
    vqos_api::wire::check_port_name(name)?;
    Ok(name)
}

/// Runs `vqos port ...`.
pub fn port(conn: &ConnArgs, args: PortArgs) -> Result<()> {
    port_to(&conn.client()?, args, &mut crate::out::stdout())
}

fn port_to(c: &Client, args: PortArgs, out: &mut impl Write) -> Result<()> {
    match args.command {
        PortCommand::List { json } => {
            let ports: Vec<PortView> = c.call("GET", "/v1/ports", None)?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&ports)?)?;
            } else {
                // The vhost-user ports' connection state lives in the stats.
                let stats: Option<StatsView> = c.call("GET", "/v1/stats", None).ok();
                write_ports(out, &ports, stats.as_ref())?;
            }
        }
        PortCommand::Add {
            name,
            attach,
            vhost_user,
            client,
            queues,
            thread,
            socket_owner,
            socket_group,
            socket_mode,
            macs,
            no_port_security,
            ips,
            serves,
            policy,
            json,
        } => {
            let mut req = PortRequest {
                name: segment(&name)?.to_string(),
                create: !attach,
                macs: macs.iter().map(|m| m.parse()).collect::<Result<_, _>>()?,
                // The names clap accepted are the services' own.
                serves: serde_json::from_value(json!(serves))?,
                port_security: !no_port_security,
                ips,
                policy: policy.patch()?,
                queues,
                thread,
                ..PortRequest::tap("")
            };
            if let Some(socket) = &vhost_user {
                let socket = std::path::absolute(socket)
                    .with_context(|| format!("Socket path {}", socket.display()))?;
                req.kind = PortKind::VhostUser;
                req.socket = Some(socket.to_string_lossy().into_owned());
                req.mode = Some(match client {
                    true => VhostUserRole::Client,
                    false => VhostUserRole::Server,
                });
                (req.socket_owner, req.socket_group) = (socket_owner, socket_group);
                req.socket_mode = socket_mode;
            }
            let body = serde_json::to_value(&req)?;
            let p: PortView = c.call("POST", "/v1/ports", Some(&body))?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&p)?)?;
                return Ok(());
            }
            writeln!(
                out,
                "{} port {}: {}",
                match (&vhost_user, attach) {
                    (Some(_), _) => "Added vhost-user",
                    (None, true) => "Attached",
                    (None, false) => "Created",
                },
                p.port.name,
                describe(&p.port.policy)
            )?;
        }
        PortCommand::Del { name, json } => {
            let r: RemovedView =
                c.call("DELETE", &format!("/v1/ports/{}", segment(&name)?), None)?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
            } else {
                writeln!(out, "Removed port {}", r.removed)?;
            }
        }
        PortCommand::Migrate { src, dst, json } => {
            let body = json!({ "to": dst });
            let path = format!("/v1/ports/{}/migrate", segment(&src)?);
            let r: MigratedView = c.call("POST", &path, Some(&body))?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
            } else {
                writeln!(
                    out,
                    "Migrating {} to {}: {} (it takes the addresses at its first frame; \
                     delete {} once the migration completed)",
                    r.from,
                    r.port.port.name,
                    describe(&r.port.port.policy),
                    r.from
                )?;
            }
        }
    }
    Ok(())
}

/// Runs `vqos policy ...`.
pub fn policy(conn: &ConnArgs, args: PolicyArgs) -> Result<()> {
    policy_to(&conn.client()?, args, &mut crate::out::stdout())
}

fn policy_to(c: &Client, args: PolicyArgs, out: &mut impl Write) -> Result<()> {
    match args.command {
        PolicyCommand::Get { vif, json } => {
            let p: PolicyView = c.call("GET", &format!("/v1/policies/{}", segment(&vif)?), None)?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&p)?)?;
            } else {
                writeln!(out, "{vif}: {}", describe(&p))?;
            }
        }
        PolicyCommand::Set { vif, policy, json } => {
            let patch = policy.patch()?;
            if patch.is_empty() {
                let msg = "Nothing to set: give --weight, --min, --max, --max-in, --burst or \
                           --priority";
                return Err(UsageError(msg.into()).into());
            }
            let path = format!("/v1/policies/{}", segment(&vif)?);
            let p: PolicyView = c.call("PUT", &path, Some(&serde_json::to_value(&patch)?))?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&p)?)?;
            } else {
                writeln!(out, "{vif}: {}", describe(&p))?;
            }
        }
    }
    Ok(())
}

/// Runs `vqos stats ...`.
pub fn stats(conn: &ConnArgs, args: StatsArgs) -> Result<()> {
    let c = conn.client()?;
    if !(args.interval > 0.0 && args.interval.is_finite()) {
        let msg = "--interval must be a positive number of seconds";
        return Err(UsageError(msg.into()).into());
    }
    let interval = Duration::from_secs_f64(args.interval);
    // Clear-screen codes only for a terminal: into a file or a pipe, plain snapshots.
    let clear = args.watch && crate::out::is_terminal();
    let mut stdout = crate::out::stdout();
    let mut shown = 0u64;
    let mut outage = false;
    loop {
        let s: StatsView = match c.call("GET", "/v1/stats", None) {
            Ok(s) => s,
            // Watching a daemon seen once: it may be restarting; wait for it.
            Err(e) if args.watch && shown > 0 && gone(&e) => {
                if !outage {
                    eprintln!(
                        "vqos: vqosd unreachable ({:#}), retrying every {}s until it is back",
                        anyhow::Error::from(e),
                        args.interval
                    );
                    outage = true;
                }
                std::thread::sleep(interval);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if std::mem::take(&mut outage) {
            eprintln!("vqos: vqosd is back");
        }
        write_snapshot(&mut stdout, &s, &args, clear, shown)?;
        shown += 1;
        if !args.watch {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

/// Whether a failed call means the daemon is not there (now): stopped, restarting, or gone
/// in the middle of an answer. Its refusals are not.
fn gone(e: &vqos_api::client::ClientError) -> bool {
    use vqos_api::client::ClientError;
    matches!(e, ClientError::Connect { .. } | ClientError::Http(_))
}

/// One snapshot of `vqos stats`; `shown` is how many came before it.
fn write_snapshot(
    out: &mut impl Write,
    s: &StatsView,
    args: &StatsArgs,
    clear: bool,
    shown: u64,
) -> Result<()> {
    if args.json {
        // One compact document per line when watching, pretty otherwise.
        let text = if args.watch {
            serde_json::to_string(s)?
        } else {
            serde_json::to_string_pretty(s)?
        };
        writeln!(out, "{text}")?;
    } else {
        if clear {
            // Clear the screen and go home, like watch(1).
            write!(out, "\x1b[H\x1b[2J")?;
        } else if shown > 0 {
            // Off a terminal, successive tables separated by a blank line.
            writeln!(out)?;
        }
        write_stats(out, s)?;
    }
    Ok(out.flush()?)
}

#[cfg(test)]
mod tests;
