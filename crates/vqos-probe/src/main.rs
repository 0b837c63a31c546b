//! `vqos-probe`: the command-line front end of the latency probe (see the library's docs).

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use vqos_probe::flood::{MAX_BATCH, MAX_FRAME, MIN_FRAME};
use vqos_probe::parse::{parse_duration, parse_rate};
use vqos_probe::wire::{MAX_SIZE, MIN_SIZE};
use vqos_probe::{
    run_client, run_flood, spawn_server, ClientConfig, FloodConfig, Protocol, ServerConfig, Summary,
};

const AFTER_HELP: &str = "\
Examples:
  vqos-probe server --bind 0.0.0.0:7000
  vqos-probe client --to 10.0.0.2:7000 --rate 1000/s --duration 10s --json
  vqos-probe server --bind 0.0.0.0:7001 --tcp
  vqos-probe client --to 10.0.0.2:7001 --tcp --interval 500us --duration 5s
  vqos-probe flood --to 10.0.0.2:9 --frame 64 --rate 100Mbit --duration 10s --json

The client sends timestamped requests (sequence number and send time in the payload) at a fixed
rate and measures each response's round-trip time on its monotonic clock. Percentiles are exact,
nearest rank over all samples. A UDP response not back within --timeout is lost.
`flood` is a load generator, not a probe: paced 64-byte (or larger) UDP frames, many per
sendmmsg(2) call, for rates iperf3 cannot reach; nobody needs to listen at the far end.
Exit status: 0 when a run completed (even with losses), 1 on errors, 2 on bad arguments.";

#[derive(Parser)]
#[command(
    name = "vqos-probe",
    version,
    about = "Round-trip latency probe: UDP/TCP request/response echo server and client",
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Echo probe requests until killed; prints `listening PROTO ADDR` on stdout once bound.
    Server {
        /// Address to listen on (port 0 picks a free one).
        #[arg(long, value_name = "ADDR:PORT")]
        bind: SocketAddr,
        /// Serve TCP (length-prefixed messages, TCP_NODELAY) instead of UDP.
        #[arg(long)]
        tcp: bool,
    },
    /// Measure round-trip times against a server and print a summary.
    Client {
        /// The server's address.
        #[arg(long, value_name = "ADDR:PORT")]
        to: SocketAddr,
        /// Use TCP (one connection) instead of UDP.
        #[arg(long)]
        tcp: bool,
        /// Message size in bytes (header included).
        #[arg(long, default_value_t = 64, value_name = "BYTES",
              value_parser = clap::value_parser!(u32).range(MIN_SIZE as i64..=MAX_SIZE as i64))]
        size: u32,
        /// Requests per second, e.g. 1000/s [default: 1000/s].
        #[arg(long, value_name = "N/s", value_parser = parse_rate, conflicts_with = "interval")]
        rate: Option<Duration>,
        /// Time between requests instead of a rate, e.g. 1ms, 250us.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        interval: Option<Duration>,
        /// How long to send, e.g. 10s, 500ms, 2m.
        #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
        duration: Duration,
        /// A response later than this counts as lost.
        #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = parse_duration)]
        timeout: Duration,
        /// Print the summary as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Send paced UDP frames of one size (a load generator) and print what the kernel took.
    Flood {
        /// Destination (nobody needs to listen there).
        #[arg(long, value_name = "ADDR:PORT")]
        to: SocketAddr,
        /// On-wire frame size in bytes (Ethernet + IPv4 + UDP headers included, FCS not).
        #[arg(long = "frame", default_value_t = 64, value_name = "BYTES",
              value_parser = clap::value_parser!(u32).range(MIN_FRAME as i64..=MAX_FRAME as i64))]
        frame: u32,
        /// On-wire rate, e.g. 100Mbit, 1.5Gbit; leave out to send as fast as possible.
        #[arg(long, value_name = "RATE", value_parser = parse_bps)]
        rate: Option<u64>,
        /// How long to send, e.g. 10s.
        #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
        duration: Duration,
        /// Datagrams per sendmmsg call.
        #[arg(long, default_value_t = 32, value_name = "N",
              value_parser = clap::value_parser!(u32).range(1..=MAX_BATCH as i64))]
        batch: u32,
        /// Print the summary as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// A bit rate with a unit (`100Mbit`); "unlimited" is refused: leave `--rate` out instead.
fn parse_bps(s: &str) -> Result<u64, String> {
    match vqos_sched::units::parse_rate(s) {
        Ok(Some(0)) => Err("rate 0: leave --rate out to send unpaced".into()),
        Ok(Some(bps)) => Ok(bps),
        Ok(None) => Err("leave --rate out to send unpaced".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn protocol(tcp: bool) -> Protocol {
    if tcp {
        Protocol::Tcp
    } else {
        Protocol::Udp
    }
}

fn fmt_us(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
}

fn print_human(to: SocketAddr, s: &Summary) {
    println!(
        "{} {to}: {} B every {} us for {:.1} s",
        s.protocol, s.size, s.interval_us, s.elapsed_s
    );
    println!(
        "sent {}  samples {}  lost {} (late {}, send failures {})  reordered {}  duplicates {}  foreign {}",
        s.sent, s.samples, s.lost, s.late, s.send_failures, s.reordered, s.duplicates, s.foreign
    );
    println!(
        "rtt us: min {}  mean {}  p50 {}  p99 {}  p99.9 {}  max {}",
        fmt_us(s.min_us),
        fmt_us(s.mean_us),
        fmt_us(s.p50_us),
        fmt_us(s.p99_us),
        fmt_us(s.p999_us),
        fmt_us(s.max_us)
    );
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vqos-probe: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Server { bind, tcp } => {
            let server = spawn_server(ServerConfig::new(bind, protocol(tcp)))?;
            let mut out = std::io::stdout();
            writeln!(out, "listening {} {}", protocol(tcp), server.local_addr())?;
            out.flush()?;
            loop {
                std::thread::park();
            }
        }
        Command::Client {
            to,
            tcp,
            size,
            rate,
            interval,
            duration,
            timeout,
            json,
        } => {
            let mut cfg = ClientConfig::new(to, protocol(tcp));
            cfg.size = size as usize;
            if let Some(i) = rate.or(interval) {
                cfg.interval = i;
            }
            cfg.duration = duration;
            cfg.timeout = timeout;
            let summary =
                run_client(cfg).with_context(|| format!("probing {} {to}", protocol(tcp)))?;
            if json {
                println!("{}", serde_json::to_string(&summary)?);
            } else {
                print_human(to, &summary);
            }
            if summary.samples == 0 {
                eprintln!("vqos-probe: no response at all: is a server listening on {to}?");
            }
            Ok(())
        }
        Command::Flood {
            to,
            frame,
            rate,
            duration,
            batch,
            json,
        } => {
            let mut cfg = FloodConfig::new(to);
            cfg.frame_bytes = frame as usize;
            cfg.rate_bps = rate;
            cfg.duration = duration;
            cfg.batch = batch as usize;
            let s = run_flood(&cfg, None).with_context(|| format!("flooding {to}"))?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "udp {to}: {frame} B frames for {:.1} s: sent {} ({:.1} Mbit/s on the wire, {:.0} frames/s), refused {}, skipped {}, {} calls",
                    s.elapsed_s,
                    s.sent_frames,
                    s.sent_bps / 1e6,
                    s.sent_frames as f64 / s.elapsed_s.max(1e-9),
                    s.send_failures,
                    s.skipped,
                    s.calls
                );
            }
            Ok(())
        }
    }
}
