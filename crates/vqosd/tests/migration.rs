//! A live migration of a real guest between two vqosd vhost-user ports (issue 26): a TCG QEMU
//! guest on port `vma` sends an iperf3 stream to a sink under a 8 Mbit/s max; a second QEMU
//! started with `-incoming` on port `vmb` (created bare by the "orchestrator", this test, as it
//! starts the destination, then given the guest's identity by `port migrate vma vmb`)
//! receives it through QMP `migrate`. During the
//! migration QEMU asks vqosd to log every write into guest memory (`LOG_ALL`, `SET_LOG_BASE`),
//! and copies the pages vqosd marked again. Checked: the migration completes and the guest
//! runs on the destination; its memory is what it was (a 16 MiB file in its RAM has the same
//! MD5); the same iperf3 stream ends well on the destination (rc 0); the guest pings the sink
//! from `vmb`; the max holds on `vmb` (its rate on the switch's counters); and no vhost-user
//! misbehaviour or quarantine was counted; the source port was handed the dirty log.
//!
//! The guest's identity moves by the recipe docs/vhost-user.md gives: `POST
//! /v1/ports/vma/migrate {"to": "vmb"}` before the migration (vmb takes the max and co-owns
//! the guest's locked MAC and IP); at the end the destination QEMU's `SEND_RARP` announces the
//! guest from vmb, which completes the hand-over, so none of the guest's frames on vmb is
//! ever refused (no `spoofed`, no `ip_spoofed`); when QEMU reports the migration completed,
//! the orchestrator removes the source port and its counters continue on vmb.
//!
//! `a_cancelled_migration_leaves_the_guest_running_on_its_port` and
//! `a_destination_that_dies_leaves_the_guest_running_on_its_port`: the same start, the copy
//! slowed down and then cancelled (`migrate_cancel`) or its destination QEMU killed, the
//! destination port deleted: the guest runs on at its source port, its stream ends well, none
//! of its frames is refused.
//!
//! `restart.rs`: vqosd killed and started again mid-copy; the migration completes whole.
//! `bench.rs`: the downtime benchmark (scripts/bench-migration.sh; ignored by `cargo test`).
//!
//! Needs root, `qemu-system-x86_64` and iperf3 (SKIP otherwise); takes the real-traffic lock.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::qemu::{guest_image, missing, poll_gently, Guest, Role};
use common::*;
use serde_json::{json, Value};
use vqos_testkit::{machine_lock, Netns};

/// The vif's max, bit/s (far below what a TCG guest sends).
const MAX_BPS: f64 = 8_000_000.0;

/// One QMP command on the monitor at `path`: its `return` (panics on `error`).
fn qmp(path: &Path, cmd: &str, args: Option<Value>) -> Value {
    try_qmp(path, cmd, args).unwrap_or_else(|e| panic!("QMP {}: {e}", path.display()))
}

/// As [`qmp`]; `Err` when the monitor is not there (yet).
fn try_qmp(path: &Path, cmd: &str, args: Option<Value>) -> std::io::Result<Value> {
    let s = UnixStream::connect(path)?;
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut line = String::new();
    let mut next = |r: &mut BufReader<UnixStream>| -> Value {
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            // Events come between answers; the greeting has "QMP".
            if v.get("return").is_some() || v.get("error").is_some() || v.get("QMP").is_some() {
                return v;
            }
        }
    };
    next(&mut r);
    writeln!(w, "{}", json!({"execute": "qmp_capabilities"})).unwrap();
    next(&mut r);
    let mut msg = json!({ "execute": cmd });
    if let Some(a) = args {
        msg["arguments"] = a;
    }
    writeln!(w, "{msg}").unwrap();
    let v = next(&mut r);
    assert!(v.get("error").is_none(), "QMP {cmd}: {v}");
    Ok(v["return"].clone())
}

/// The MD5 sum in `md5sum`'s output.
fn md5_of(out: &str) -> Option<String> {
    out.split_whitespace()
        .find(|w| w.len() == 32)
        .map(str::to_string)
}

/// The guest on `g` goes on, whole: the stream started before the migration (`stream`, its
/// marker) ends well within `limit`, its file has the MD5 it had (`md5`), and it pings the
/// sink. `what` names the migration in the output.
fn goes_on_whole(g: &mut Guest, stream: &str, md5: &Option<String>, sink_ip: &str, what: &str) {
    let (out, rc) = g.finish(stream, Duration::from_secs(90));
    println!("iperf3 across {what}:\n{out}");
    assert_eq!(rc, 0, "{}", g.console());
    let m = g.send("md5sum /blob");
    let (out, _) = g.finish(&m, Duration::from_secs(30));
    assert_eq!(&md5_of(&out), md5, "{out}");
    let m = g.send(&format!("ping -c 3 -W 5 {sink_ip}"));
    let (out, rc) = g.finish(&m, Duration::from_secs(30));
    assert_eq!(rc, 0, "{out}");
}

/// None of the guest's frames on port `name` was refused as another's (no spoofing drop of
/// any kind) and its vhost-user session counted no misbehaviour, in stats `s`.
fn assert_clean(s: &Value, name: &str) {
    for reason in ["spoofed", "ip_spoofed", "arp_spoofed", "nd_spoofed"] {
        assert_eq!(port(s, name)["drops"][reason], 0, "{name}: {reason}: {s}");
    }
    let c = &port(s, name)["vhost_user"]["counters"];
    for k in [
        "quarantines",
        "bad_avail_index",
        "bad_ring_address",
        "chain_loop",
    ] {
        assert_eq!(c[k], 0, "{name}: {k}: {c}");
    }
}

/// A running source guest on vqosd port `vma` (8 Mbit/s max) that has written a 16 MiB file
/// and reached the sink, an iperf3 stream of 20 s to the sink started 4 s ago, and the
/// orchestrator's half of a migration: port `vmb` given the guest's identity (`port migrate`)
/// and a destination QEMU on it waiting with `-incoming`.
struct Rig {
    /// vqosd.
    d: Daemon,
    /// The source guest.
    src: Guest,
    /// The destination QEMU (`inmigrate`).
    dst: Guest,
    /// The stream's command (its marker) in the source guest.
    stream: String,
    /// The file's MD5 in the source guest.
    md5: Option<String>,
    /// Where the destination listens for the migration.
    incoming: String,
    /// The sink's address.
    sink_ip: String,
    /// The guest's MAC.
    mac: &'static str,
    /// Held to the end: the iperf3 server, the sink, the files.
    keep: (vqos_testkit::Proc, Netns, tempfile::TempDir),
    /// The test's clock.
    t0: Instant,
}

impl Rig {
    /// The rig (see the type), `None` (SKIP printed) without QEMU, iperf3 or a guest image.
    /// The stream runs `stream_secs`; with 0 the guest neither writes the file nor starts a
    /// stream (`md5` is `None`, `stream` empty) and its port has no max: the downtime
    /// benchmark's guest.
    fn start(test: &str, stream_secs: u32) -> Option<Rig> {
        let load = stream_secs > 0;
        if let Some(why) = missing() {
            println!("SKIP {test}: {why}");
            return None;
        }
        let image = match guest_image() {
            Ok(dir) => dir,
            Err(why) => {
                println!("SKIP {test}: {why}");
                return None;
            }
        };
        let t0 = Instant::now();
        let pid = std::process::id() % 100_000;
        let prefix = format!("m{pid}m");
        let net = format!("10.{}.78", 200 + pid % 50);
        let (guest_ip, sink_ip) = (format!("{net}.1"), format!("{net}.254"));
        let mac = "52:54:00:78:00:01";
        let dir = tempfile::tempdir().unwrap();
        let p = |f: &str| dir.path().join(f);
        let socket = p("vqosd.sock");
        let uplink = format!("{prefix}u");
        fs::write(
            p("vqosd.toml"),
            format!(
                "capacity = \"40Mbit\"\nremove_taps_on_exit = true\nstate_file = \"{}\"\n\
                 [api]\nsocket = \"{}\"\n[uplink]\nname = \"{uplink}\"\n\
                 [[port]]\nname = \"vma\"\nkind = \"vhost-user\"\nsocket = \"{}\"\n\
                 {}\n",
                p("state.json").display(),
                socket.display(),
                p("a.sock").display(),
                if load {
                    "policy = { max = \"8Mbit\" }"
                } else {
                    ""
                }
            ),
        )
        .unwrap();
        let d = Daemon::start(&p("vqosd.toml"), &socket);
        let sink = Netns::new(format!("{prefix}-sink")).without_ipv6();
        sink.take_link(&uplink, &format!("{sink_ip}/24"));
        let qmp_arg = |f: &str| {
            vec![
                "-qmp".to_string(),
                format!("unix:{},server=on,wait=off", p(f).display()),
            ]
        };
        let mut src = Guest::start_with(
            &image,
            "src",
            (&p("a.sock"), Role::Server, 1),
            mac,
            &format!("{guest_ip}/24"),
            &qmp_arg("qmp-a"),
        );
        assert!(
            src.wait_for("VQOS-GUEST-UP", Duration::from_secs(90)),
            "the guest did not boot:\n{}",
            src.console()
        );
        // What its memory holds before the migration.
        let md5 = load.then(|| {
            let m =
                src.send("dd if=/dev/urandom of=/blob bs=1M count=16 2>/dev/null; md5sum /blob");
            let (out, rc) = src.finish(&m, Duration::from_secs(60));
            let md5 = md5_of(&out);
            assert!(rc == 0 && md5.is_some(), "{out}");
            md5.unwrap()
        });
        let m = src.send(&format!("ping -c 2 -W 5 {sink_ip}"));
        assert_eq!(
            src.finish(&m, Duration::from_secs(30)).1,
            0,
            "{}",
            src.console()
        );

        // A 20 s stream to the sink under the max, migrated in the middle.
        let server = sink.spawn(&["iperf3", "-s", "-1", "-p", "5301", "-B", &sink_ip]);
        let mut stream = String::new();
        if load {
            std::thread::sleep(Duration::from_millis(500));
            stream = src.send(&format!(
                "iperf3 -c {sink_ip} -p 5301 -t {stream_secs} -i 0 -f m"
            ));
            std::thread::sleep(Duration::from_secs(4));
        }

        // The orchestrator: the destination port, bare, given the guest's identity, and the
        // destination QEMU waiting for the migration.
        d.call(
            "POST",
            "/v1/ports",
            json!({"name": "vmb", "kind": "vhost-user", "socket": p("b.sock")}),
        );
        let moved = d.call("POST", "/v1/ports/vma/migrate", json!({"to": "vmb"}));
        let max = &moved["port"]["policy"]["max_bps"];
        assert!(
            if load {
                max == 8_000_000
            } else {
                max.is_null()
            },
            "{moved}"
        );
        let vmb = d.get("/v1/ports/vmb");
        assert!(vmb["locked"]["macs"].to_string().contains(mac), "{vmb}");
        let mut extra = qmp_arg("qmp-b");
        // Below Linux's ephemeral ports (32768 up): no outgoing connection holds it.
        let incoming = format!("tcp:127.0.0.1:{}", 27_000 + pid % 1_000);
        extra.extend(["-incoming".to_string(), incoming.clone()]);
        let dst = Guest::start_with(
            &image,
            "dst",
            (&p("b.sock"), Role::Server, 1),
            mac,
            &format!("{guest_ip}/24"),
            &extra,
        );
        let connected_b = poll_gently(Duration::from_secs(30), || {
            connected(&d.get("/v1/stats"), "vmb").then_some(())
        });
        assert!(connected_b.is_some(), "{}", dst.console());
        // The destination listens for the migration once its monitor says `inmigrate`.
        let waiting = poll_gently(Duration::from_secs(30), || {
            let st = try_qmp(&p("qmp-b"), "query-status", None).ok()?;
            (st["status"] == "inmigrate").then_some(())
        });
        assert!(waiting.is_some(), "{}", dst.console());
        Some(Rig {
            d,
            src,
            dst,
            stream,
            md5,
            incoming,
            sink_ip,
            mac,
            keep: (server, sink, dir),
            t0,
        })
    }
}

#[test]
fn a_guest_migrates_between_two_ports_and_keeps_its_memory_stream_and_max() {
    let _machine = machine_lock();
    let Some(rig) = Rig::start("a_guest_migrates_between_two_ports", 20) else {
        return;
    };
    let Rig {
        d,
        src,
        dst,
        stream,
        md5: md5_before,
        incoming,
        sink_ip,
        t0,
        keep: (_server, sink, dir),
        ..
    } = rig;
    let p = |f: &str| dir.path().join(f);
    qmp(&p("qmp-a"), "migrate", Some(json!({ "uri": incoming })));
    let done = poll_gently(Duration::from_secs(120), || {
        let st = qmp(&p("qmp-a"), "query-migrate", None);
        match st["status"].as_str() {
            Some("completed") => Some(Ok(st)),
            Some("failed") | Some("cancelled") => Some(Err(st)),
            _ => None,
        }
    });
    let st = match done {
        Some(Ok(st)) => st,
        other => panic!("migration: {other:?}\nsource:\n{}", src.console()),
    };
    // vqosd was given the dirty log on the source port.
    let s = d.get("/v1/stats");
    let logs = &port(&s, "vma")["vhost_user"]["counters"]["dirty_logs"];
    assert_eq!(logs, 1, "no dirty log reached the source port: {s}");
    // The destination QEMU announces the guest (SEND_RARP): vmb's first frame, which hands
    // the addresses over for good.
    let complete = poll_gently(Duration::from_secs(30), || {
        let s = d.get("/v1/stats");
        (port(&s, "vma")["handover"]["complete"] == true).then_some(s)
    });
    let s = complete.unwrap_or_else(|| panic!("no hand-over: {}", d.get("/v1/stats")));
    let announces = &port(&s, "vmb")["vhost_user"]["counters"]["rarp_announces"];
    assert!(announces.as_u64() >= Some(1), "no SEND_RARP: {s}");
    // The switchover: the source port goes; its counters continue on the destination.
    let rx = |s: &Value, n: &str| counter(s, n, "rx_frames");
    let before = rx(&s, "vma") + rx(&s, "vmb");
    d.call("DELETE", "/v1/ports/vma", json!(null));
    let summed = poll_gently(Duration::from_secs(10), || {
        (rx(&d.get("/v1/stats"), "vmb") >= before).then_some(())
    });
    assert!(summed.is_some(), "{before} frames: {}", d.get("/v1/stats"));
    println!(
        "migrated in {} ms (downtime {} ms, {} dirty syncs) {:.1} s into the test",
        st["total-time"],
        st["downtime"],
        st["ram"]["dirty-sync-count"],
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(qmp(&p("qmp-b"), "query-status", None)["status"], "running");
    drop(src);

    // The same iperf3 process ends on the destination, well; its memory is the same.
    let mut dst = dst;
    goes_on_whole(&mut dst, &stream, &md5_before, &sink_ip, "the migration");
    // The max holds on the destination port: a fresh stream, measured on the switch.
    let _server = sink.spawn(&["iperf3", "-s", "-1", "-p", "5302", "-B", &sink_ip]);
    std::thread::sleep(Duration::from_millis(500));
    let again = dst.send(&format!("iperf3 -c {sink_ip} -p 5302 -t 8 -i 0 -f m"));
    std::thread::sleep(Duration::from_secs(3));
    let rate = rx_rates(&d, &["vmb"], 4.0)[0];
    println!(
        "vmb: {:.2} Mbit/s under a {:.0} Mbit/s max",
        rate / 1e6,
        MAX_BPS / 1e6
    );
    assert!((MAX_BPS * 0.8..=MAX_BPS * 1.05).contains(&rate), "{rate}");
    assert_eq!(dst.finish(&again, Duration::from_secs(60)).1, 0);
    // The guest's frames on vmb were never refused: no window.
    assert_clean(&d.get("/v1/stats"), "vmb");
    println!("done {:.1} s into the test", t0.elapsed().as_secs_f64());
}

/// A migration cancelled half-way: the source QEMU's migration is slowed to 1 MiB/s so that
/// it is still copying memory (vqosd logging every write into it), then cancelled
/// (`migrate_cancel`), and the orchestrator deletes the destination port, which cancels the
/// hand-over. The guest runs on where it was: no hand-over is pending and the source port
/// still holds the guest's MAC; the stream started before the migration ends well; the guest
/// pings the sink; none of its frames was refused; the port counted no misbehaviour and was
/// handed the dirty log; its memory is unchanged.
#[test]
fn a_cancelled_migration_leaves_the_guest_running_on_its_port() {
    half_way(Ends::Cancelled);
}

/// The same, the destination QEMU killed half-way instead: the source's migration fails, the
/// orchestrator deletes the destination port, and the guest runs on at its source port.
#[test]
fn a_destination_that_dies_leaves_the_guest_running_on_its_port() {
    half_way(Ends::DestinationDies);
}

/// How a migration that does not complete ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ends {
    /// `migrate_cancel` on the source.
    Cancelled,
    /// The destination QEMU killed.
    DestinationDies,
}

/// A migration that ends `how` half-way; see the two tests.
fn half_way(how: Ends) {
    let _machine = machine_lock();
    let Some(rig) = Rig::start(&format!("half_way({how:?})"), 20) else {
        return;
    };
    let Rig {
        d,
        mut src,
        dst,
        stream,
        md5,
        incoming,
        sink_ip,
        mac,
        keep: (_server, _sink, dir),
        ..
    } = rig;
    let p = |f: &str| dir.path().join(f);
    qmp(
        &p("qmp-a"),
        "migrate-set-parameters",
        Some(json!({ "max-bandwidth": 1_048_576 })),
    );
    qmp(&p("qmp-a"), "migrate", Some(json!({ "uri": incoming })));
    let copying = poll_gently(Duration::from_secs(60), || {
        let st = qmp(&p("qmp-a"), "query-migrate", None);
        let logging = port(&d.get("/v1/stats"), "vma")["vhost_user"]["counters"]["dirty_logs"] == 1;
        (st["status"] == "active" && st["ram"]["transferred"].as_u64() > Some(0) && logging)
            .then_some(())
    });
    assert!(
        copying.is_some(),
        "not copying with the dirty log: {} / {}",
        qmp(&p("qmp-a"), "query-migrate", None),
        d.get("/v1/stats")
    );
    let (dst, want) = match how {
        Ends::Cancelled => {
            qmp(&p("qmp-a"), "migrate_cancel", None);
            (Some(dst), "cancelled")
        }
        Ends::DestinationDies => {
            drop(dst);
            (None, "failed")
        }
    };
    let ended = poll_gently(Duration::from_secs(60), || {
        let st = qmp(&p("qmp-a"), "query-migrate", None);
        (st["status"] == want).then_some(())
    });
    assert!(
        ended.is_some(),
        "{}",
        qmp(&p("qmp-a"), "query-migrate", None)
    );
    // The orchestrator gives up the destination: its port goes, and the hand-over with it.
    d.call("DELETE", "/v1/ports/vmb", json!(null));
    drop(dst);
    assert_eq!(qmp(&p("qmp-a"), "query-status", None)["status"], "running");
    let vma = d.get("/v1/ports/vma");
    assert!(vma["locked"]["macs"].to_string().contains(mac), "{vma}");
    let s = d.get("/v1/stats");
    assert!(port(&s, "vma")["handover"].is_null(), "{s}");

    // The guest goes on: the stream ends well, it pings, its memory is what it was.
    let what = format!("the migration that ended {want}");
    goes_on_whole(&mut src, &stream, &md5, &sink_ip, &what);
    assert_clean(&d.get("/v1/stats"), "vma");
}

/// The downtime benchmark (scripts/bench-migration.sh).
#[path = "migration/bench.rs"]
mod bench;

/// vqosd restarted while a migration copies memory.
#[path = "migration/restart.rs"]
mod restart;
