//! The port driven over a real unix socket by the test frontend: frames both ways, mergeable
//! buffers, legacy headers, EVENT_IDX and notification suppression, back-pressure, a guest
//! that stops consuming, sessions (reconnect in both roles, memory unmapped).

use std::os::unix::net::UnixListener;

use super::features::*;
use super::test_frontend::*;
use super::*;
use crate::frame::{build_frame, VnetHdr};

/// Every offered feature.
const ALL: u64 = OFFERED_FEATURES;

/// A frame of `payload` bytes tagged `tag` (12-byte header).
fn frame(tag: u8, payload: usize) -> Vec<u8> {
    build_frame(
        VnetHdr::default(),
        0x02_00_00_00_00_0b,
        0x02_00_00_00_00_0a,
        0x0800,
        &vec![tag; payload],
    )
}

/// The frame as a guest with a `hdr_len`-byte header sees it (num_buffers as given).
fn as_guest(f: &[u8], hdr_len: usize, num_buffers: u16) -> Vec<u8> {
    let mut g = f.to_vec();
    g[10..12].copy_from_slice(&num_buffers.to_le_bytes());
    if hdr_len == 10 {
        g.drain(10..12);
    }
    g
}

/// A batch holding `frames`.
fn batch_of(frames: &[Vec<u8>]) -> Batch {
    let mut b = Batch::new();
    for f in frames {
        assert!(b.push(f));
    }
    b
}

/// A connected server-role port and its frontend.
fn connected(features: u64) -> (tempfile::TempDir, VhostUserPort, TestFrontend) {
    let (dir, path) = socket_path();
    let port = VhostUserPort::server("vm1", &path).unwrap();
    let fe = TestFrontend::connect(&path, features);
    wait_ready(&port.handle());
    (dir, port, fe)
}

#[test]
fn frames_cross_both_ways_with_every_feature_negotiated() {
    let (_d, mut port, mut fe) = connected(ALL);
    let h = port.handle();
    assert!(h.is_connected());
    assert_eq!(h.negotiated_features(), ALL);
    assert!(h.status().feature_names.iter().any(|n| n == "MRG_RXBUF"));

    let sent: Vec<_> = (0..3u8).map(|i| frame(i, 60 + usize::from(i))).collect();
    for f in &sent {
        fe.send(f);
    }
    let mut b = Batch::new();
    assert_eq!(recv_n(&mut port, &mut b, 3), 3);
    for (i, f) in sent.iter().enumerate() {
        assert_eq!(b.frame(i), &f[..]);
    }
    // Every guest TX chain is back in the used ring with length 0.
    assert_eq!(fe.tx.take_used(&fe.mem), vec![(0, 0), (1, 0), (2, 0)]);

    fe.post_rx(8, 2048);
    let out = batch_of(&sent);
    assert_eq!(port.send_batch(&out, &[2, 0, 1]).unwrap(), 3);
    let got = fe.received();
    let want: Vec<_> = [2, 0, 1]
        .iter()
        .map(|&i| as_guest(&sent[i], 12, 1))
        .collect();
    assert_eq!(got, want);
    let c = port.counters();
    assert_eq!((c.rx_frames, c.tx_frames, c.tx_errors), (3, 3, 0));
    let s = h.status();
    assert_eq!((s.rx_frames, s.tx_frames), (3, 3));
    assert_eq!(s.counters.malformed(), 0);
}

#[test]
fn mergeable_buffers_carry_a_frame_over_several_small_chains() {
    let (_d, mut port, mut fe) = connected(ALL);
    fe.post_rx(10, 256);
    let big = frame(7, 1000); // 12 + 14 + 1000 bytes: 5 buffers of 256
    let small = frame(8, 50);
    let out = batch_of(&[big.clone(), small.clone()]);
    assert_eq!(port.send_batch(&out, &[0, 1]).unwrap(), 2);
    let got = fe.received();
    assert_eq!(got, vec![as_guest(&big, 12, 5), as_guest(&small, 12, 1)]);

    // Four buffers left, taken by four small frames; then the big frame finds none: its
    // chains go back, the frames are counted; once buffers are posted it goes through.
    let out = batch_of(&[big.clone(), small.clone()]);
    assert_eq!(port.send_batch(&out, &[1, 1, 1, 1]).unwrap(), 4);
    assert_eq!(port.send_batch(&out, &[0, 1]).unwrap(), 0);
    assert_eq!(port.vhost_counters().guest_rx_no_buffers_frames, 2);
    fe.post_rx(5, 256);
    assert_eq!(port.send_batch(&out, &[0]).unwrap(), 1);
    let got = fe.received();
    assert_eq!(got.len(), 5);
    assert_eq!(got[4], as_guest(&big, 12, 5));
}

#[test]
fn without_mergeable_buffers_a_small_chain_is_kept_for_a_smaller_frame() {
    let (_d, mut port, mut fe) = connected(ALL & !F_MRG_RXBUF);
    assert_eq!(guest_hdr_len(port.negotiated_features()), 12);
    fe.post_rx(1, 256);
    let big = frame(1, 1000);
    let small = frame(2, 100);
    let out = batch_of(&[big, small.clone()]);
    assert_eq!(port.send_batch(&out, &[0, 1]).unwrap(), 0);
    assert_eq!(port.vhost_counters().guest_rx_buffer_too_small_frames, 2);
    assert_eq!(port.send_batch(&out, &[1]).unwrap(), 1);
    assert_eq!(fe.received(), vec![as_guest(&small, 12, 1)]);
}

#[test]
fn a_legacy_guest_gets_and_gives_a_10_byte_header() {
    let (_d, mut port, mut fe) = connected(ALL & !(F_VERSION_1 | F_MRG_RXBUF));
    let f = frame(3, 70);
    fe.send(&as_guest(&f, 10, 0));
    let mut b = Batch::new();
    assert_eq!(recv_n(&mut port, &mut b, 1), 1);
    assert_eq!(b.frame(0), &f[..], "widened to 12 bytes, num_buffers 0");
    fe.post_rx(2, 2048);
    assert_eq!(
        port.send_batch(&batch_of(std::slice::from_ref(&f)), &[0])
            .unwrap(),
        1
    );
    assert_eq!(fe.received(), vec![as_guest(&f, 10, 0)]);
}

#[test]
fn event_idx_sets_avail_event_and_interrupts_only_past_used_event() {
    let (_d, mut port, mut fe) = connected(ALL);
    for i in 0..3 {
        fe.send(&frame(i, 60));
    }
    let mut b = Batch::new();
    assert_eq!(recv_n(&mut port, &mut b, 3), 3);
    // Drained: the guest is asked to kick at its next frame.
    assert_eq!(fe.tx.avail_event(&fe.mem), 3);

    fe.post_rx(16, 2048);
    fe.rx.set_used_event(&fe.mem, 4); // interrupt once used passes entry 4
    let out = batch_of(&[frame(9, 60)]);
    fe.calls(0);
    assert_eq!(port.send_batch(&out, &[0, 0, 0]).unwrap(), 3);
    assert_eq!(fe.calls(0), 0, "used 0..3 does not pass used_event 4");
    assert_eq!(port.send_batch(&out, &[0, 0, 0]).unwrap(), 3);
    assert_eq!(fe.calls(0), 1, "used 3..6 passes used_event 4");
    assert!(port.vhost_counters().interrupts >= 1);
}

#[test]
fn without_event_idx_kicks_are_suppressed_while_the_loop_polls() {
    let (_d, mut port, mut fe) = connected(ALL & !F_EVENT_IDX);
    for i in 0..4 {
        fe.send(&frame(i, 60));
    }
    let mut b = Batch::new();
    wait_until("four frames available", || {
        fe.mem.get_u16(fe.tx.avail + 2) == 4
    });
    // A full batch (2 of 4): more is waiting, so kicks stay off.
    assert_eq!(port.recv_batch(&mut b, 2).unwrap(), 2);
    assert_eq!(fe.tx.used_flags(&fe.mem), 1, "VRING_USED_F_NO_NOTIFY");
    assert_eq!(recv_n(&mut port, &mut b, 2), 2);
    assert_eq!(fe.tx.used_flags(&fe.mem), 0, "drained: kicks back on");
    // Receive-queue kicks are off for the whole session.
    fe.post_rx(2, 2048);
    fe.calls(0);
    port.send_batch(&batch_of(&[frame(1, 60)]), &[0]).unwrap();
    assert_eq!(fe.rx.used_flags(&fe.mem), 1);
    assert_eq!(fe.calls(0), 1);
    // A polling guest (VRING_AVAIL_F_NO_INTERRUPT) gets no interrupt.
    fe.mem.put_u16(fe.rx.avail, 1);
    port.send_batch(&batch_of(&[frame(2, 60)]), &[0]).unwrap();
    assert_eq!(fe.calls(0), 0);
    assert_eq!(fe.received().len(), 2);
}

/// Whether `fd` is readable now.
pub(super) fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, no waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

#[test]
fn a_guest_kick_makes_the_readiness_fd_readable() {
    let (_d, mut port, mut fe) = connected(ALL);
    let fd = port.readiness_fd().unwrap();
    let mut b = Batch::new();
    assert_eq!(port.recv_batch(&mut b, 32).unwrap(), 0);
    assert!(!readable(fd), "drained and nothing pending: quiet");
    let kicks = port.vhost_counters().kicks;
    fe.send(&frame(1, 60));
    wait_until("the kick to reach the readiness fd", || readable(fd));
    assert_eq!(port.vhost_counters().kicks, kicks + 1);
    assert_eq!(port.recv_batch(&mut b, 32).unwrap(), 1);
    assert!(!readable(fd));
}

#[test]
fn back_pressure_leaves_frames_in_the_avail_ring() {
    let (_d, mut port, mut fe) = connected(ALL);
    for i in 0..10 {
        fe.send(&frame(i, 60));
    }
    let mut b = Batch::new();
    assert_eq!(recv_n(&mut port, &mut b, 4), 4);
    assert_eq!(
        fe.tx.take_used(&fe.mem).len(),
        4,
        "only what the loop took is used"
    );
    assert_eq!(port.recv_batch(&mut b, 100).unwrap(), 6);
    assert_eq!(b.frame(9)[12 + 14], 9);
}

#[test]
fn a_guest_that_stops_consuming_costs_only_counted_drops() {
    let (_d, mut port, mut fe) = connected(ALL);
    let out = batch_of(&[frame(1, 60)]);
    assert_eq!(port.send_batch(&out, &[0, 0, 0, 0]).unwrap(), 0);
    let c = port.vhost_counters();
    assert_eq!(c.guest_rx_no_buffers_frames, 4);
    assert_eq!(port.counters().tx_errors, 4);
    fe.post_rx(2, 2048);
    assert_eq!(port.send_batch(&out, &[0, 0, 0]).unwrap(), 2);
    assert_eq!(port.vhost_counters().guest_rx_no_buffers_frames, 5);
    assert_eq!(fe.received().len(), 2);
}

#[test]
fn offloads_the_guest_did_not_negotiate_are_dropped_and_counted() {
    let (_d, mut port, mut fe) = connected(ALL & !(F_GUEST_TSO4 | F_GUEST_CSUM));
    fe.post_rx(4, 2048);
    let mut tso = frame(1, 200);
    tso[0] = crate::frame::VNET_F_NEEDS_CSUM;
    tso[1] = crate::frame::VNET_GSO_TCPV4;
    let out = batch_of(&[frame(0, 60), tso]);
    assert_eq!(port.send_batch(&out, &[0, 1, 0]).unwrap(), 1);
    assert_eq!(port.vhost_counters().guest_offload_unsupported_frames, 2);
}

#[test]
fn server_reconnect_is_a_fresh_session_and_guest_memory_is_unmapped() {
    let (_d, path) = socket_path();
    let mut port = VhostUserPort::server("vm1", &path).unwrap();
    let h = port.handle();
    let mut fe = TestFrontend::connect(&path, ALL);
    wait_ready(&h);
    let name = fe.mem.name.clone();
    assert_eq!(mappings_of(&name), 2, "ours and the port's");
    fe.send(&frame(1, 60));
    let mut b = Batch::new();
    assert_eq!(recv_n(&mut port, &mut b, 1), 1);

    drop(fe.fe); // the frontend goes away
    wait_until("disconnect", || !h.is_connected());
    wait_until("unmap", || mappings_of(&name) == 1);
    assert_eq!(h.negotiated_features(), 0);
    let out = batch_of(&[frame(2, 60)]);
    assert_eq!(port.send_batch(&out, &[0]).unwrap(), 0);
    assert_eq!(h.counters().disconnected_frames, 1);

    let mut fe = TestFrontend::connect(&path, ALL & !F_EVENT_IDX);
    wait_ready(&h);
    assert_eq!(h.negotiated_features(), ALL & !F_EVENT_IDX);
    fe.send(&frame(3, 60));
    b.clear();
    assert_eq!(recv_n(&mut port, &mut b, 1), 1);
    assert_eq!(b.frame(0)[12 + 14], 3);
    let c = h.counters();
    assert_eq!((c.sessions, c.disconnects), (2, 1));
    drop(port);
    assert!(!path.exists(), "the socket file goes with the port");
}

#[test]
fn client_mode_connects_late_and_reconnects_after_the_frontend_restarts() {
    let (_d, path) = socket_path();
    let mut port = VhostUserPort::client("vm1", &path).unwrap();
    let h = port.handle();
    wait_until("failed attempts", || h.counters().connect_failures >= 2);
    assert!(!h.is_connected());
    // Why, as a server-role port tells why its last session ended.
    let why = h.status().last_error.expect("why it cannot connect");
    assert!(
        why.starts_with(&format!("cannot connect to {}: ", path.display())),
        "{why}"
    );

    let listener = UnixListener::bind(&path).unwrap();
    let mut fe = TestFrontend::accept(&listener, ALL);
    wait_ready(&h);
    fe.send(&frame(1, 60));
    let mut b = Batch::new();
    assert_eq!(recv_n(&mut port, &mut b, 1), 1);

    // The frontend restarts: the port reconnects on its own, fresh session.
    drop(fe);
    let mut fe = TestFrontend::accept(&listener, ALL);
    wait_ready(&h);
    fe.post_rx(1, 2048);
    let f = frame(5, 60);
    wait_until("the new session's ring", || {
        port.send_batch(&batch_of(std::slice::from_ref(&f)), &[0])
            .unwrap()
            == 1
    });
    assert_eq!(fe.received(), vec![as_guest(&f, 12, 1)]);
    assert!(h.counters().sessions >= 2);
}

#[test]
fn an_early_vring_enable_as_qemu_sends_it_takes_effect() {
    let (_d, path) = socket_path();
    let mut port = VhostUserPort::server("vm1", &path).unwrap();
    let h = port.handle();
    let mut fe = TestFrontend::connect_qemu_style(&path, ALL);
    wait_ready(&h);
    assert_eq!(h.counters().refused_messages, 2);
    assert!(h.is_connected() && h.status().last_error.is_none());
    fe.send(&frame(1, 60));
    let mut b = Batch::new();
    assert_eq!(recv_n(&mut port, &mut b, 1), 1);
    fe.post_rx(1, 2048);
    assert_eq!(port.send_batch(&b, &[0]).unwrap(), 1);
    assert_eq!(fe.received().len(), 1);
}

#[test]
fn a_refused_message_ends_the_session_and_says_why() {
    let (_d, path) = socket_path();
    let port = VhostUserPort::server("vm1", &path).unwrap();
    let h = port.handle();
    // A message of an unknown type.
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let mut msg = Vec::new();
    for word in [0xffffu32, 1, 0] {
        msg.extend_from_slice(&word.to_le_bytes());
    }
    std::io::Write::write_all(&mut s, &msg).unwrap();
    wait_until("the session's end", || h.counters().disconnects == 1);
    let why = h.status().last_error.expect("an error");
    assert!(!why.is_empty());
}

#[test]
fn a_request_the_port_refuses_ends_the_session_with_its_reason() {
    let (_d, path) = socket_path();
    let port = VhostUserPort::server("vm1", &path).unwrap();
    let h = port.handle();
    let fe = TestFrontend::connect(&path, ALL);
    use vhost::VhostBackend;
    assert!(fe.fe.set_vring_num(0, 3).is_err(), "not a power of two");
    wait_until("the session's end", || h.counters().disconnects == 1);
    assert!(h.status().last_error.is_some());
}

#[test]
fn dropping_the_port_ends_every_thread_in_each_state() {
    let (_d, path) = socket_path();
    drop(VhostUserPort::server("idle", &path).unwrap());
    drop(VhostUserPort::client("retrying", &path).unwrap());
    let (_d2, port, fe) = connected(ALL);
    drop(port);
    drop(fe);
}

#[test]
fn bad_configuration_is_refused() {
    let (_d, path) = socket_path();
    let mut cfg = VhostUserConfig::server(&path);
    cfg.max_queue_size = 1000;
    assert!(matches!(
        VhostUserPort::with_config("x", cfg),
        Err(VhostUserError::QueueSize(_))
    ));
    let e = VhostUserPort::server("x", "/nonexistent-dir/vhu.sock").unwrap_err();
    assert!(e.to_string().starts_with("Port 'x': cannot listen"));
    // A regular file is never replaced by the socket; a stale socket file is.
    let file = _d.path().join("precious");
    std::fs::write(&file, b"data").unwrap();
    let e = VhostUserPort::server("x", &file).unwrap_err();
    assert!(matches!(e, VhostUserError::NotASocket { .. }), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"data");
    let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
    drop(stale);
    assert!(path.exists());
    let mut cfg = VhostUserConfig::server(&path);
    cfg.socket_mode = Some(0o660);
    let port = VhostUserPort::with_config("x", cfg).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660);
    drop(port);
}

#[test]
fn chains_come_back_in_the_order_they_were_made_available() {
    // IN_ORDER is offered: heads posted out of table order, a malformed chain among them and
    // a frame that does not fit all come back (or stay) in the order the guest posted them.
    const WRITE: u16 = 2;
    let (_d, mut port, mut fe) = connected(ALL);
    assert_ne!(port.handle().negotiated_features() & F_IN_ORDER, 0);
    // Guest TX: heads 7, 3, 200 (zero length: malformed) and 5.
    let sent: Vec<Vec<u8>> = (1..=3).map(|t| frame(t, 60)).collect();
    for (head, f) in [
        (7u16, Some(&sent[0])),
        (3, Some(&sent[1])),
        (200, None),
        (5, Some(&sent[2])),
    ] {
        let addr = buf_addr(1, head);
        let len = f.map_or(0, |f| {
            fe.mem.write(addr, f);
            f.len() as u32
        });
        fe.tx.set_desc(&fe.mem, head, addr, len, 0, 0);
        fe.tx.publish(&fe.mem, head);
    }
    let mut b = Batch::new();
    assert_eq!(recv_n(&mut port, &mut b, 3), 3);
    assert_eq!(
        (0..3).map(|i| b.frame(i).to_vec()).collect::<Vec<_>>(),
        sent
    );
    assert_eq!(
        fe.tx.take_used(&fe.mem),
        vec![(7, 0), (3, 0), (200, 0), (5, 0)]
    );
    // Guest RX, mergeable: 128-byte chains at heads 9, 2, 11, 4.
    let rx_chain = |fe: &mut TestFrontend, head: u16| {
        fe.rx
            .set_desc(&fe.mem, head, buf_addr(0, head), 128, WRITE, 0);
        fe.rx.publish(&fe.mem, head);
    };
    for head in [9, 2, 11, 4] {
        rx_chain(&mut fe, head);
    }
    let (big, small) = (frame(4, 200), frame(5, 60));
    // `big` takes 9 and 2, `small` 11; a second `big` needs two chains and finds one (4).
    let b = batch_of(&[big.clone(), small.clone(), big.clone()]);
    assert_eq!(port.send_batch(&b, &[0, 1, 2]).unwrap(), 2);
    assert_eq!(port.vhost_counters().guest_rx_no_buffers_frames, 1);
    let used = fe.rx.take_used(&fe.mem);
    let heads: Vec<u16> = used.iter().map(|&(h, _)| h).collect();
    assert_eq!(heads, vec![9, 2, 11], "{used:?}");
    // Chain 4 is still the next one the port takes, before the one posted after it.
    rx_chain(&mut fe, 6);
    assert_eq!(port.send_batch(&batch_of(&[big]), &[0]).unwrap(), 1);
    let heads: Vec<u16> = fe.rx.take_used(&fe.mem).iter().map(|&(h, _)| h).collect();
    assert_eq!(heads, vec![4, 6]);
}
