//! The cost of the dirty log on the forwarding path (issue 26's aim; run by
//! `scripts/bench-dirty-log.sh`, results in docs/benchmarks.md). Not a test: `cargo test`
//! skips it (`#[ignore]`).
//!
//! One port's data path over in-process guest memory (the guest of `tests_regions`, no
//! socket, no switch), forwarding as a switch core does for one guest: every round the guest
//! makes 16 frames available on its TX queue and 16 buffers on its RX queue, the port reads
//! the 16 frames (`recv`) and writes them back into the RX buffers (`send`). Timed with the
//! log on (every buffer written and both used rings marked, as while QEMU migrates) and off,
//! alternating, at 64 and 1518 bytes. The log is marked, never scanned: QEMU's migration
//! thread reads and clears it once per pass, which costs the port a cache miss on a marked
//! byte per pass, not per frame.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::time::Instant;

use super::dirty::DirtyLog;
use super::features::F_VERSION_1;
use super::tests_regions::{frame, ring, Guest, SIZE, WRITE};
use crate::port::Batch;

/// Guest-physical base of the TX buffers (first region, after the rings).
const TX_BUFS: u64 = 0x4000;
/// Guest-physical base of the RX buffers (the second region).
const RX_BUFS: u64 = 0x1_0000;
/// Bytes per buffer.
const BUF: u64 = 0x800;

/// A guest with 16 TX frames of `len` bytes written once, and a log over its memory when
/// `log`.
fn guest(len: usize, log: bool) -> Guest {
    let mut g = Guest::with_rings(F_VERSION_1, &[ring(0), ring(1)]);
    for i in 0..SIZE {
        let f = frame(i as u8, len);
        g.write(TX_BUFS + u64::from(i) * BUF, &f);
        g.set_desc(1, i, TX_BUFS + u64::from(i) * BUF, f.len() as u32, 0, 0);
        g.set_desc(0, i, RX_BUFS + u64::from(i) * BUF, BUF as u32, WRITE, 0);
    }
    // The ring slots, once: slot i holds head i, on both queues, forever after; the indexes
    // go back to 0 so that `run` moves them on.
    for i in 0..SIZE {
        g.publish(1, i);
        g.publish(0, i);
    }
    for q in [0, 1] {
        // SAFETY: as in `run`.
        unsafe { g.host_ptr(ring(q).1 + 2).cast::<u16>().write_volatile(0) };
    }
    if log {
        let name = std::ffi::CString::new("vqos-bench-log").unwrap();
        // SAFETY: name is NUL-terminated; the result is checked.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(4096).unwrap();
        // 256 KiB of guest memory: 64 pages, 8 bytes of log.
        g.log = Some(DirtyLog::map(&f, 8, 0).unwrap());
    }
    g
}

/// Frames forwarded over `rounds` rounds, and per second. The guest's side costs two stores
/// a round: every round makes the same 16 heads available in the same ring slots (the ring has
/// 16, and [`guest`] published them once), so only the avail indexes move.
fn run(g: &mut Guest, rounds: u32) -> (u64, f64) {
    let mut batch = Batch::new();
    let all: Vec<u8> = (0..SIZE as u8).collect();
    // The avail indexes, 2 bytes into each avail ring (aligned: the rings are).
    let idx = |q: u64| g.host_ptr(ring(q).1 + 2).cast::<u16>();
    let (tx, rx) = (idx(1), idx(0));
    let mut frames = 0;
    let t = Instant::now();
    for _ in 0..rounds {
        // SAFETY: both point into the guest's mapped memory, aligned; the data path reads
        // them through vm-memory's volatile accessors, on this thread.
        unsafe {
            tx.write_volatile(tx.read_volatile().wrapping_add(SIZE));
            rx.write_volatile(rx.read_volatile().wrapping_add(SIZE));
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        let n = g.recv(&mut batch);
        frames += g.send(&batch, &all[..n]) as u64;
    }
    (frames, frames as f64 / t.elapsed().as_secs_f64())
}

#[test]
#[ignore = "a benchmark: scripts/bench-dirty-log.sh runs it"]
fn bench_dirty_log() {
    let rounds: u32 = std::env::var("VQOS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    for len in [64usize, 1518] {
        // The frame with its Ethernet header is `len` bytes.
        let payload = len - 14;
        let mut off = guest(payload, false);
        let mut on = guest(payload, true);
        // Warm both, and check that they forward: every frame of every round comes back.
        for g in [&mut off, &mut on] {
            assert_eq!(run(g, 1000).0, 1000 * u64::from(SIZE));
        }
        for round in 0..rounds {
            for (mode, g) in [("off", &mut off), ("on", &mut on)] {
                let (_, pps) = run(g, 200_000);
                println!(
                    "DIRTYLOG len={len} round={round} log={mode} mpps={:.3}",
                    pps / 1e6
                );
            }
        }
    }
}
