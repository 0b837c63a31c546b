//! The migration downtime benchmark (issue 26's aim; `scripts/bench-migration.sh`, results in
//! docs/benchmarks.md). Not a test: `cargo test` skips it (`#[ignore]`), the script runs it.
//!
//! A guest that pings its peer at 100/s for 10 s migrates 3 s into its pings: on vqosd's
//! vhost-user ports by the recipe of `a_guest_migrates_between_two_ports...` (the rig without
//! its file and stream; the sink also pings the guest at 100/s), and, as the reference, on
//! QEMU's built-in user network (slirp, the guest pings QEMU's 10.0.2.2). Per migration one
//! `DOWNTIME` line: QEMU's total time and pause, the guest's pings sent and answered, the
//! longest run of unanswered ones and the longest round trip, and the sink's longest wait
//! between two answers before the migration (TCG's own pace) and overall.

use super::*;

/// One migration of a pinging guest, as measured.
#[derive(Debug)]
struct Downtime {
    /// What QEMU reports: the whole migration and the guest's pause, ms.
    total_ms: u64,
    paused_ms: u64,
    /// The guest's pings: sent, answered, the longest run of unanswered ones, the longest
    /// round trip (ms).
    sent: u64,
    answered: u64,
    longest_gap: u64,
    longest_rtt_ms: f64,
    /// The longest time between two answers to the sink's pings of the guest, ms: in the
    /// 2.5 s before the migration, and in all (vhost-user only: slirp's guest cannot be
    /// pinged from outside).
    sink_gaps_ms: Option<(f64, f64)>,
}

/// The guest's command: `count` pings of `to` at 100/s, summed up by the guest's awk as
/// `PINGSUM sent answered longest-unanswered-run longest-rtt` (the console carries one line,
/// not one per ping).
fn pings(to: &str, count: u32) -> String {
    format!(
        "ping -i 0.01 -c {count} -W 2 {to} | awk 'BEGIN {{ l = -1; g = 0; m = 0 }} \
         /seq=/ {{ sub(/.*seq=/, \"\"); s = $1 + 0; if (s - l - 1 > g) g = s - l - 1; l = s }} \
         /transmitted/ {{ t = $1; r = $4 }} /round-trip/ {{ split($4, a, \"/\"); m = a[3] }} \
         END {{ print \"PINGSUM\", t, r, g, m }}'"
    )
}

/// `(sent, answered, longest unanswered run, longest round trip in ms)` from a [`pings`]
/// command's output.
fn pingsum(out: &str) -> Option<(u64, u64, u64, f64)> {
    let line = out.lines().find(|l| l.starts_with("PINGSUM "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    (v.len() == 4).then(|| (v[0] as u64, v[1] as u64, v[2] as u64, v[3]))
}

/// The longest time between two answers in iputils `ping -D` output, ms: among the answers
/// of the first `before` seconds, and among all.
fn longest_answer_gaps(out: &str, before: f64) -> Option<(f64, f64)> {
    let stamps: Vec<f64> = out
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
        .collect();
    let longest = |s: &[f64]| s.windows(2).map(|w| (w[1] - w[0]) * 1e3).reduce(f64::max);
    let first = *stamps.first()?;
    let early = stamps.partition_point(|t| *t < first + before);
    Some((longest(&stamps[..early])?, longest(&stamps)?))
}

/// Both QEMUs on the user network, the destination waiting with `-incoming`; the monitors in
/// `dir` (`qmp-a`, `qmp-b`). `(source, destination, incoming URI)`.
fn user_net_pair(dir: &Path) -> Option<(Guest, Guest, String)> {
    let image = guest_image().ok()?;
    let p = |f: &str| dir.join(f);
    let qmp_arg = |f: &str| {
        vec![
            "-qmp".to_string(),
            format!("unix:{},server=on,wait=off", p(f).display()),
        ]
    };
    let mac = "52:54:00:78:00:02";
    let src = Guest::start_user_net(&image, "src", mac, &qmp_arg("qmp-a"));
    assert!(
        src.wait_for("VQOS-GUEST-UP", Duration::from_secs(90)),
        "{}",
        src.console()
    );
    let incoming = format!("tcp:127.0.0.1:{}", 28_000 + std::process::id() % 1_000);
    let mut extra = qmp_arg("qmp-b");
    extra.extend(["-incoming".to_string(), incoming.clone()]);
    let dst = Guest::start_user_net(&image, "dst", mac, &extra);
    let waiting = poll_gently(Duration::from_secs(30), || {
        let st = try_qmp(&p("qmp-b"), "query-status", None).ok()?;
        (st["status"] == "inmigrate").then_some(())
    });
    assert!(waiting.is_some(), "{}", dst.console());
    Some((src, dst, incoming))
}

/// Migrates a guest pinging its peer (see the module), on vqosd's vhost-user ports or,
/// `user_net`, on QEMU's user network; `None` without QEMU or a guest image.
fn migrate_pinging(user_net: bool) -> Option<Downtime> {
    // What each network leaves alive to the end: vqosd, the sink, the files.
    let (daemon, sink, dir, src, dst, incoming, peer, guest_ip);
    if user_net {
        let tmp = tempfile::tempdir().unwrap();
        (src, dst, incoming) = user_net_pair(tmp.path())?;
        (daemon, sink, dir) = (None, None, tmp);
        (peer, guest_ip) = ("10.0.2.2".to_string(), None);
    } else {
        let rig = Rig::start("bench_migration_downtime", 0)?;
        guest_ip = Some(rig.sink_ip.replace(".254", ".1"));
        (src, dst, incoming, peer) = (rig.src, rig.dst, rig.incoming, rig.sink_ip);
        (daemon, sink, dir) = (Some(rig.d), Some(rig.keep.1), rig.keep.2);
    }
    let p = |f: &str| dir.path().join(f);
    let from_sink = sink
        .as_ref()
        .zip(guest_ip.as_ref())
        .map(|(ns, ip)| ns.spawn(&["ping", "-D", "-i", "0.01", "-c", "1000", "-W", "1", ip]));
    let mut src = src;
    let m = src.send(&pings(&peer, 1000));
    std::thread::sleep(Duration::from_secs(3));
    qmp(&p("qmp-a"), "migrate", Some(json!({ "uri": incoming })));
    let st = poll_gently(Duration::from_secs(120), || {
        let st = qmp(&p("qmp-a"), "query-migrate", None);
        let ended = matches!(
            st["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        );
        ended.then_some(st)
    });
    let st = st.unwrap_or_else(|| panic!("the migration did not end:\n{}", src.console()));
    assert_eq!(st["status"], "completed", "{st}");
    if let Some(d) = &daemon {
        // The orchestrator's last step: the source port goes.
        d.call("DELETE", "/v1/ports/vma", json!(null));
    }
    let (out, rc) = dst.finish(&m, Duration::from_secs(60));
    drop(src);
    let (sent, answered, longest_gap, longest_rtt_ms) =
        pingsum(&out).unwrap_or_else(|| panic!("rc {rc}: {out}"));
    let sink_gaps_ms =
        from_sink.and_then(|p| longest_answer_gaps(&p.output_within(Duration::from_secs(30)), 2.5));
    Some(Downtime {
        total_ms: st["total-time"].as_u64().unwrap_or(0),
        paused_ms: st["downtime"].as_u64().unwrap_or(0),
        sent,
        answered,
        longest_gap,
        longest_rtt_ms,
        sink_gaps_ms,
    })
}

/// `VQOS_BENCH_ROUNDS` (default 2) pairs of migrations, vhost-user then the user network;
/// one `DOWNTIME` line each.
#[test]
#[ignore = "a benchmark: scripts/bench-migration.sh runs it"]
fn bench_migration_downtime() {
    let _machine = machine_lock();
    if let Some(why) = missing() {
        println!("SKIP bench_migration_downtime: {why}");
        return;
    }
    let rounds: u32 = std::env::var("VQOS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    for round in 0..rounds {
        for (net, user_net) in [("vhost-user", false), ("user-net", true)] {
            let Some(m) = migrate_pinging(user_net) else {
                println!("SKIP bench_migration_downtime: no guest image");
                return;
            };
            let (calm, all) = m.sink_gaps_ms.map_or(("-".into(), "-".into()), |(c, a)| {
                (format!("{c:.1}"), format!("{a:.1}"))
            });
            println!(
                "DOWNTIME net={net} round={round} total_ms={} paused_ms={} sent={} \
                 answered={} longest_gap={} longest_rtt_ms={} sink_gap_before_ms={calm} \
                 sink_gap_ms={all}",
                m.total_ms, m.paused_ms, m.sent, m.answered, m.longest_gap, m.longest_rtt_ms
            );
        }
    }
}

#[test]
fn the_benchmarks_parsers_read_busybox_and_iputils_output() {
    let out = "PINGSUM 1000 997 2 41.5\n";
    assert_eq!(pingsum(out), Some((1000, 997, 2, 41.5)));
    assert_eq!(pingsum("PINGSUM 1000 997\n"), None);
    let iputils = "PING 10.0.0.1 (10.0.0.1) 56(84) bytes of data.\n\
        [100.000] 64 bytes from 10.0.0.1: icmp_seq=1 ttl=64 time=0.1 ms\n\
        [100.010] 64 bytes from 10.0.0.1: icmp_seq=2 ttl=64 time=0.1 ms\n\
        [103.000] 64 bytes from 10.0.0.1: icmp_seq=3 ttl=64 time=0.1 ms\n\
        [103.200] 64 bytes from 10.0.0.1: icmp_seq=4 ttl=64 time=0.1 ms\n";
    let (before, all) = longest_answer_gaps(iputils, 2.5).unwrap();
    assert!((before - 10.0).abs() < 1e-6, "{before}");
    assert!((all - 2990.0).abs() < 1e-6, "{all}");
}
