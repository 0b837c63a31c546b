//! What sends each VM's traffic: iperf3 clients for TCP, `vqos-probe` floods for UDP, and the
//! sockets the floods end in.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use vqos_probe::flood::{self, run_flood, FloodConfig, FloodSummary};
use vqos_sim::scenario::{Traffic, VmSettings};

use crate::app::{self, AppSpec};
use crate::sys::{self, Proc};
use crate::LabError;

/// Nice value of a flood thread while it is greedy (see [`start_flood`]).
pub(super) const FLOOD_GREEDY_NICE: i32 = 19;

/// How long an app's client may take past the VM's stop to end and print its summary.
pub(super) const APP_GRACE: Duration = Duration::from_secs(3);

/// What one VM's iperf3 client does; a change restarts it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Load {
    pub(super) traffic: Traffic,
    pub(super) flows: u32,
    pub(super) packet_size: u32,
    pub(super) rate_bps: Option<u64>,
}

impl Load {
    pub(super) fn of(s: &VmSettings) -> Load {
        Load {
            traffic: s.traffic,
            flows: s.flows.max(1),
            packet_size: s.packet_size,
            rate_bps: s.rate_bps,
        }
    }
}

/// One VM's running client.
pub(super) struct Client {
    pub(super) load: Load,
    pub(super) generator: Generator,
}

/// What sends a VM's traffic.
///
/// TCP is iperf3 (real TCP stacks with the scenario's connection count and congestion
/// control). UDP is [`vqos_probe::flood`] on a thread of this process inside the sender's
/// namespace: paced at the scenario's on-wire rate (iperf3's `-b` counts payload), and fast
/// enough for 64-byte frames — iperf3 sends one datagram per system call and reached only
/// ~15–50 kpps per VM on the lab's 2-core machine, too few to load the switch's core as the
/// C2QoS experiment needs. The far end has a bound socket that never reads (the frames are
/// dropped there, without ICMP replies).
pub(super) enum Generator {
    Iperf(Proc),
    /// An app's client (`[[app]]`): it ends by itself at the VM's stop and prints its summary
    /// then, so it is given [`APP_GRACE`] to finish before it is stopped.
    App(Proc),
    Flood {
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<Result<Result<FloodSummary, String>, String>>>,
        /// Where its summary (or error) is written when it stops.
        log: PathBuf,
    },
}

impl Generator {
    /// Stops it. A flood that failed (it could not enter its namespace, or `sendmmsg` failed
    /// other than for a full queue) returns its error: the VM sent nothing, or stopped early,
    /// and a report computed on that would be about traffic that never ran.
    pub(super) fn stop(&mut self) -> Result<(), String> {
        match self {
            Generator::Iperf(p) => {
                p.stop(Duration::from_secs(2));
                Ok(())
            }
            Generator::App(p) => {
                let deadline = std::time::Instant::now() + APP_GRACE;
                while !p.exited() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Self::interrupt(p);
                Ok(())
            }
            Generator::Flood { stop, thread, log } => {
                stop.store(true, Ordering::Relaxed);
                let Some(h) = thread.take() else {
                    return Ok(());
                };
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err("flood thread panicked".into()))
                    .and_then(|r| r);
                let text = match &r {
                    Ok(sum) => serde_json::to_string_pretty(sum).unwrap_or_default(),
                    Err(e) => serde_json::json!({ "error": e }).to_string(),
                };
                let _ = std::fs::write(log, text + "\n");
                r.map(|_| ())
            }
        }
    }
}

impl Generator {
    /// Ends an app's client now: SIGINT first (wrk prints its summary on it), then SIGTERM.
    fn interrupt(p: &mut Proc) {
        if !p.exited() {
            p.signal(libc::SIGINT);
            let deadline = std::time::Instant::now() + Duration::from_secs(1);
            while !p.exited() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        p.stop(Duration::from_millis(500));
    }
}

impl Drop for Generator {
    fn drop(&mut self) {
        match self {
            // An error path or an interrupt: no grace for a client that runs for minutes.
            Generator::App(p) => Self::interrupt(p),
            // On an error path the run already fails; the flood's own error is in its log.
            _ => {
                let _ = self.stop();
            }
        }
    }
}

/// An app's client (`[[app]]`) in the sink namespace `ns`, against its server at `ip`, for
/// `secs`; its output goes to `log`.
pub(super) fn start_app(
    a: &AppSpec,
    (ns, ip): (&str, &str),
    secs: f64,
    scratch: &Path,
    log: &Path,
) -> Result<Generator, LabError> {
    let args = app::client_args(a, ip, secs, scratch);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Ok(Generator::App(sys::spawn(
        &format!("{} client {}", args[0], a.vm),
        Some(ns),
        &args,
        Some(log),
    )?))
}

pub(super) fn flood_failed(vm: &str, e: String) -> LabError {
    LabError::Setup(format!("The UDP flood of {vm} failed: {e}"))
}

/// A flood of `load` from namespace `ns` to `to` for `secs`; its summary goes to `log`.
pub(super) fn start_flood(
    ns: &str,
    to: SocketAddr,
    secs: f64,
    load: &Load,
    log: PathBuf,
) -> Result<Generator, LabError> {
    let mut cfg = FloodConfig::new(to);
    cfg.frame_bytes = (load.packet_size as usize).clamp(flood::MIN_FRAME, flood::MAX_FRAME);
    if cfg.frame_bytes != load.packet_size as usize {
        eprintln!(
            "vqos lab: warning: UDP packet_size {} sent as {}-byte frames (the flood's range is \
             {}..={}); the simulator counts {}-byte packets",
            load.packet_size,
            cfg.frame_bytes,
            flood::MIN_FRAME,
            flood::MAX_FRAME,
            load.packet_size
        );
    }
    cfg.rate_bps = load.rate_bps.filter(|&r| r > 0);
    cfg.duration = Duration::from_secs_f64(secs.max(0.1));
    // A greedy flood (one that asks for more than it gets) yields the CPU: in the papers'
    // testbeds every VM had cores of its own; here a spinning generator would otherwise take
    // the switch's core and the well-behaved senders' CPU, and the experiment would measure
    // the host's scheduler instead of the switch.
    cfg.greedy_nice = Some(FLOOD_GREEDY_NICE);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = sys::in_netns(ns, move || {
        run_flood(&cfg, Some(&flag)).map_err(|e| format!("{e:#}"))
    })?;
    Ok(Generator::Flood {
        stop,
        thread: Some(thread),
        log,
    })
}

/// A UDP socket bound to `ip:port` inside namespace `ns` that is never read: a flood's
/// datagrams are dropped there (receive buffer full) instead of drawing ICMP "port
/// unreachable" answers back through the switch.
pub(super) fn discard_socket(ns: &str, ip: &str, port: u16) -> Result<UdpSocket, LabError> {
    let addr: SocketAddr = format!("{ip}:{port}")
        .parse()
        .map_err(|e| LabError::Invalid(format!("address {ip}:{port}: {e}")))?;
    let h = sys::in_netns(ns, move || UdpSocket::bind(addr))?;
    let bound = h
        .join()
        .map_err(|_| LabError::Invalid("discard socket thread panicked".into()))?
        .map_err(LabError::Invalid)?;
    bound.map_err(|source| LabError::Io {
        what: format!("UDP discard socket {addr} in {ns}"),
        source,
    })
}

/// The iperf3 client arguments for the TCP `load` for `secs` seconds.
pub(super) fn iperf_args(
    title: &str,
    dst: &str,
    port: u16,
    secs: f64,
    load: &Load,
    download: bool,
) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "iperf3".into(),
        "-c".into(),
        dst.into(),
        "-p".into(),
        port.to_string(),
        "-t".into(),
        format!("{:.1}", secs.max(1.0)),
        "-P".into(),
        load.flows.to_string(),
        "-J".into(),
        "-T".into(),
        title.into(),
    ];
    if download {
        a.push("-R".into());
    }
    // UDP loads are floods ([`Generator`]), never iperf3.
    debug_assert_eq!(load.traffic, Traffic::Tcp);
    if load.packet_size != 1500 {
        // MSS = wire bytes minus Ethernet, IPv4 and TCP headers.
        a.extend([
            "-M".into(),
            load.packet_size.saturating_sub(54).max(88).to_string(),
        ]);
    }
    if let Some(r) = load.rate_bps {
        a.extend(["-b".into(), r.to_string()]);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf_arguments_follow_the_load() {
        let tcp = Load {
            traffic: Traffic::Tcp,
            flows: 10,
            packet_size: 1500,
            rate_bps: None,
        };
        let a = iperf_args("t", "10.0.0.1", 5201, 5.0, &tcp, true).join(" ");
        assert!(
            a.contains("-P 10") && a.contains("-R") && !a.contains("-M"),
            "{a}"
        );
    }
}
