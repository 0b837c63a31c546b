//! The dirty log of a live migration: while it is on, every page the port writes into guest
//! memory is marked (received frames' buffers, in any region; the used rings), and no page it
//! only reads (transmitted frames, descriptors); the frontend hands the log over with
//! `SET_LOG_BASE` once `LOG_SHMFD` is negotiated, and `LOG_ALL` turns the marking on.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserDirtyLogRegion};

use super::dirty::{DirtyLog, LOG_PAGE};
use super::features::{F_LOG_ALL, F_VERSION_1, OFFERED_FEATURES};
use super::test_frontend::{socket_path, wait_until};
use super::tests_regions::{frame, ring, Guest, WRITE};
use super::VhostUserPort;
use crate::port::Batch;

/// Bytes of log for the test guest's 256 KiB (64 pages): 8.
const LOG_BYTES: u64 = 8;

fn memfd(bytes: u64) -> File {
    let name = std::ffi::CString::new("vqos-dirty-log").unwrap();
    // SAFETY: name is NUL-terminated; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(bytes).unwrap();
    f
}

/// The pages marked in the log file.
fn marked(f: &File) -> Vec<u64> {
    let mut bits = [0u8; LOG_BYTES as usize];
    f.read_exact_at(&mut bits, 0).unwrap();
    (0..LOG_BYTES * 8)
        .filter(|p| bits[(p / 8) as usize] & (1 << (p % 8)) != 0)
        .collect()
}

#[test]
fn every_page_the_port_writes_is_marked_and_no_page_it_only_reads() {
    let f = memfd(LOG_PAGE);
    let mut g = Guest::with_rings(F_VERSION_1, &[ring(0), ring(1)]);
    g.log = Some(DirtyLog::map(&f, LOG_BYTES, 0).unwrap());
    // Receive buffers in page 12 and, after the hole, page 48 (the third region).
    g.set_desc(0, 0, 0xC000, 0x400, WRITE, 0);
    g.publish(0, 0);
    g.set_desc(0, 1, 0x3_0000, 0x400, WRITE, 0);
    g.publish(0, 1);
    let mut out = Batch::new();
    out.push(&frame(5, 100));
    out.push(&frame(6, 100));
    assert_eq!(g.send(&out, &[0, 1]), 2);
    // The buffers and the RX used ring (queue 0's rings are all in page 1).
    assert_eq!(marked(&f), [1, 12, 48]);
    // A transmitted frame in page 9 is only read: its page is not marked, its ring's used
    // ring (page 2) is.
    let tx = frame(7, 60);
    g.write(0x9000, &tx);
    g.set_desc(1, 0, 0x9000, tx.len() as u32, 0, 0);
    g.publish(1, 0);
    let mut b = Batch::new();
    assert_eq!(g.recv(&mut b), 1);
    assert_eq!(marked(&f), [1, 2, 12, 48]);
}

/// A frontend at `path` that negotiated every offered feature and `LOG_SHMFD`.
fn log_frontend(path: &std::path::Path) -> Frontend {
    let mut fe = Frontend::connect(path, 2).unwrap();
    fe.set_owner().unwrap();
    assert_ne!(fe.get_features().unwrap() & F_LOG_ALL, 0, "LOG_ALL offered");
    fe.set_features(OFFERED_FEATURES).unwrap();
    let p = fe.get_protocol_features().unwrap();
    assert!(p.contains(VhostUserProtocolFeatures::LOG_SHMFD));
    fe.set_protocol_features(p & VhostUserProtocolFeatures::LOG_SHMFD)
        .unwrap();
    fe
}

/// Gives `fe`'s backend 1 MiB of memory (the file, kept by the caller while it is used).
fn memory_table(fe: &mut Frontend) -> File {
    let m = memfd(1 << 20);
    let region = vhost::VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: 1 << 20,
        userspace_addr: 0x7000_0000,
        mmap_offset: 0,
        mmap_handle: m.as_raw_fd(),
    };
    fe.set_mem_table(&[region]).unwrap();
    m
}

#[test]
fn the_frontend_hands_over_the_log_and_log_all_turns_marking_on() {
    let (_dir, path) = socket_path();
    let port = VhostUserPort::server("mig", &path).unwrap();
    let mut fe = log_frontend(&path);
    let _mem = memory_table(&mut fe);
    let log = memfd(LOG_PAGE);
    let region = VhostUserDirtyLogRegion {
        mmap_size: LOG_BYTES,
        mmap_offset: 0,
        mmap_handle: log.as_raw_fd(),
    };
    // SET_LOG_BASE is answered once the log is mapped.
    fe.set_log_base(0, Some(region)).unwrap();
    let shared = &port.shared;
    wait_until("the log mapped", || {
        super::backend::lock(&shared.log).is_some()
    });
    assert_eq!(port.vhost_counters().dirty_logs, 1);
    // The data path takes it only while LOG_ALL is acknowledged.
    assert!(super::queue::dirty_log(shared, F_VERSION_1).is_none());
    assert!(super::queue::dirty_log(shared, F_VERSION_1 | F_LOG_ALL).is_some());
    // The session ends: its log goes with it.
    drop(fe);
    wait_until("the session ended", || {
        super::backend::lock(&shared.log).is_none()
    });
}

/// A hostile frontend's `SET_LOG_BASE`: before any memory table, of size zero, or running
/// past its file. Each is refused and counted (`dirty_logs_refused`), the session ends with
/// the reason as its last error, no log is kept, and the port serves the next frontend.
#[test]
fn hostile_dirty_logs_are_refused_counted_and_the_port_serves_on() {
    let (_dir, path) = socket_path();
    let mut port = VhostUserPort::server("hostile-log", &path).unwrap();
    let h = port.handle();
    let short = memfd(LOG_PAGE);
    // (what, the log's size and offset, a memory table first, the reason given)
    let cases: [(&str, u64, u64, bool, &str); 3] = [
        (
            "before the memory table",
            LOG_BYTES,
            0,
            false,
            "before the memory table",
        ),
        // Refused by the `vhost` crate itself, before the handler.
        ("of size zero", 0, 0, true, "dirty log refused"),
        ("past its file", 8, LOG_PAGE - 4, true, "beyond its file"),
    ];
    for (n, (what, size, offset, with_mem, reason)) in cases.into_iter().enumerate() {
        let mut fe = log_frontend(&path);
        let _mem = with_mem.then(|| memory_table(&mut fe));
        let region = VhostUserDirtyLogRegion {
            mmap_size: size,
            mmap_offset: offset,
            mmap_handle: short.as_raw_fd(),
        };
        assert!(
            fe.set_log_base(0, Some(region)).is_err(),
            "a log {what} was answered as taken"
        );
        wait_until(&format!("the refusal of a log {what} counted"), || {
            port.vhost_counters().dirty_logs_refused == n as u64 + 1
        });
        wait_until("the session ended", || !h.is_connected());
        assert_eq!(port.vhost_counters().dirty_logs, 0, "{what}");
        assert!(super::backend::lock(&port.shared.log).is_none(), "{what}");
        let err = h.status().last_error.unwrap_or_default();
        assert!(err.contains(reason), "{what}: last error {err:?}");
    }
    // A well-behaved frontend is served as before.
    let mut fe = super::test_frontend::TestFrontend::connect(&path, OFFERED_FEATURES);
    super::test_frontend::wait_ready(&h);
    fe.send(&frame(3, 60));
    let mut b = Batch::new();
    assert_eq!(super::test_frontend::recv_n(&mut port, &mut b, 1), 1);
}
