//! Downloads on zero-cost ports (issue 21: the download path measured on one and two
//! threads, `scripts/bench-cores.sh`): a null uplink with `to` sends to two null vifs that
//! only receive (`frame_len = 0`). Each vif is reached by unicast (its station is pinned, so
//! nothing is flooded), the downlink's weights act on what they get, and with two threads
//! both read the uplink. Before, a null uplink only discarded, and a vif that never sent was
//! unknown to the switch. No root needed: null ports only.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

/// vqosd on `threads` threads: null uplink `dlup` sending 1518-byte frames to `dl1` and
/// `dl2` (weights 1 and 3, receiving only) under a 1 Gbit/s downlink.
fn start(dir: &std::path::Path, threads: usize) -> Daemon {
    let socket = dir.join("vqosd.sock");
    let config = dir.join("vqosd.toml");
    std::fs::write(
        &config,
        format!(
            "capacity = \"1Gbit\"\nengine = \"vqos\"\nthreads = {threads}\n\
             state_file = \"{}\"\n[api]\nsocket = \"{}\"\n\
             [uplink]\nname = \"dlup\"\nkind = \"null\"\nto = [\"dl1\", \"dl2\"]\n\
             frame_len = 1518\n\
             [[port]]\nname = \"dl1\"\nkind = \"null\"\nframe_len = 0\npolicy = {{ weight = 1 }}\n\
             [[port]]\nname = \"dl2\"\nkind = \"null\"\nframe_len = 0\npolicy = {{ weight = 3 }}\n",
            dir.join("state.json").display(),
            socket.display()
        ),
    )
    .unwrap();
    Daemon::start(&config, &socket)
}

/// The bytes each vif was sent, and the uplink's storm drops, while the switch served `enough`
/// frames to the two; the last stats.
fn served(d: &Daemon, enough: u64) -> ([u64; 4], Value) {
    let bytes = |s: &Value| {
        [
            counter(s, "dl1", "tx_bytes"),
            counter(s, "dl2", "tx_bytes"),
            counter(s, "dl1", "tx_frames") + counter(s, "dl2", "tx_frames"),
            port(s, "dlup")["drops"]["storm"].as_u64().unwrap(),
        ]
    };
    // The uplink sends from its start; the vifs are added after it (until then their frames
    // are unknown unicast, flooded and cut by storm control). Measured once both receive.
    let mut first = d.get("/v1/stats");
    for _ in 0..600 {
        if ["dl1", "dl2"]
            .iter()
            .all(|v| counter(&first, v, "tx_frames") > 0)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        first = d.get("/v1/stats");
    }
    let before = bytes(&first);
    // Service, not time, is compared: wait for enough of it, however long that takes.
    let mut last = d.get("/v1/stats");
    for _ in 0..600 {
        std::thread::sleep(Duration::from_millis(50));
        last = d.get("/v1/stats");
        if bytes(&last)[2] - before[2] >= enough {
            break;
        }
    }
    let after = bytes(&last);
    assert!(after[2] - before[2] >= enough, "served: {last}");
    (std::array::from_fn(|i| after[i] - before[i]), last)
}

#[test]
fn a_null_uplink_sends_downloads_that_the_weights_share_on_one_and_two_threads() {
    for threads in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let d = start(dir.path(), threads);
        // The first window takes the start-up in (the stats of the two shards are published
        // apart); the second is the one checked.
        served(&d, 20_000);
        let ([b1, b2, _, storm], stats) = served(&d, 20_000);
        let ratio = b2 as f64 / b1 as f64;
        println!("{threads} thread(s): dl2/dl1 bytes {ratio:.2}");
        assert!(
            (2.5..3.5).contains(&ratio),
            "weights 3:1, got {ratio:.2}: {stats}"
        );
        // Unicast to a pinned station: nothing flooded (an unknown destination would be,
        // and storm control would drop most of it; it does until the vifs are added).
        let up = port(&stats, "dlup");
        assert_eq!(storm, 0, "{up}");
        assert!(counter(&stats, "dlup", "rx_frames") > 0, "{up}");
        assert_eq!(counter(&stats, "dl1", "rx_frames"), 0, "dl1 sends nothing");
        if threads == 2 {
            assert_eq!(up["readers"], serde_json::json!([0, 1]), "{up}");
        }
    }
}
