//! `cpu_fair` (issue 27, CPU isolation by default) through the daemon: two null vifs, one of
//! 64-byte frames and one of 1518-byte frames, on a core every frame of which costs 40,000
//! cycles (`[emulate]`): the core, not the 10 Gbit/s link, is what they share. With the
//! default `cpu_fair = true` they get the same frames (each half the core); with `false` the
//! same bytes, so the 64-byte vif takes 24 frames of the core for each of the other's. The
//! first failed before the flag reached the switch (vqosd's ports were added with a policy
//! set that did not carry it). No root needed: null ports only.

mod common;

use std::time::Duration;

use common::*;

/// Frames the `small` vif was served per frame of the `big` one, over a second of service.
fn frame_ratio(cpu_fair: bool) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vqosd.sock");
    let config = dir.path().join("vqosd.toml");
    std::fs::write(
        &config,
        format!(
            "capacity = \"10Gbit\"\nengine = \"vqos\"\ncpu_fair = {cpu_fair}\n\
             state_file = \"{}\"\n[api]\nsocket = \"{}\"\n\
             [uplink]\nname = \"cfup\"\nkind = \"null\"\n\
             [emulate]\nframe_cycles = 40000\nbatch = 1\n\
             [[port]]\nname = \"small\"\nkind = \"null\"\nframe_len = 64\n\
             [[port]]\nname = \"big\"\nkind = \"null\"\nframe_len = 1518\n",
            dir.path().join("state.json").display(),
            socket.display()
        ),
    )
    .unwrap();
    let d = Daemon::start(&config, &socket);
    let frames = |d: &Daemon| {
        let s = d.get("/v1/stats");
        [
            counter(&s, "small", "rx_frames"),
            counter(&s, "big", "rx_frames"),
        ]
    };
    let before = frames(&d);
    // Service, not time, is compared: wait for enough of it, however long that takes.
    let mut after = before;
    for _ in 0..600 {
        std::thread::sleep(Duration::from_millis(50));
        after = frames(&d);
        if after[1] - before[1] >= 2_000 {
            break;
        }
    }
    let (small, big) = (after[0] - before[0], after[1] - before[1]);
    assert!(big >= 2_000, "the big vif got {big} frames");
    small as f64 / big as f64
}

#[test]
fn with_cpu_fair_small_frames_get_the_same_share_of_the_core_not_of_the_bytes() {
    let fair = frame_ratio(true);
    let bytes = frame_ratio(false);
    println!("small/big frames: cpu_fair {fair:.2}, bytes alone {bytes:.2}");
    assert!((0.8..1.25).contains(&fair), "cpu_fair: {fair}");
    assert!(bytes > 15.0, "bytes alone: {bytes}");
}
