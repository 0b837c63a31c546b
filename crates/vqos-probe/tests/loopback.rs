//! Loopback tests of the probe: real sockets on 127.0.0.1 with ephemeral ports.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vqos_probe::wire::{answer_in_place, Header, Kind};
use vqos_probe::{
    run_client, spawn_server, ClientConfig, ProbeError, Protocol, ServerConfig, ServerHandle,
    Summary,
};

fn server(protocol: Protocol) -> ServerHandle {
    spawn_server(ServerConfig::new("127.0.0.1:0".parse().unwrap(), protocol)).unwrap()
}

fn config(target: SocketAddr, protocol: Protocol, rate: u64, duration_ms: u64) -> ClientConfig {
    let mut cfg = ClientConfig::new(target, protocol);
    cfg.interval = Duration::from_nanos(1_000_000_000 / rate);
    cfg.duration = Duration::from_millis(duration_ms);
    cfg
}

/// Sanity of a loss-free loopback run: counts and ordered, plausible percentiles.
fn assert_sane(s: &Summary, expected: u64) {
    assert_eq!(s.sent, expected, "{s:?}");
    assert_eq!((s.samples, s.lost, s.late), (expected, 0, 0), "{s:?}");
    assert_eq!(
        (s.duplicates, s.foreign, s.send_failures),
        (0, 0, 0),
        "{s:?}"
    );
    let (min, p50, p99, p999, max) = (
        s.min_us.unwrap(),
        s.p50_us.unwrap(),
        s.p99_us.unwrap(),
        s.p999_us.unwrap(),
        s.max_us.unwrap(),
    );
    assert!(min > 0.0 && min <= p50, "{s:?}");
    assert!(p50 < p99 && p99 <= p999 && p999 <= max, "{s:?}");
    assert!(p50 < 50_000.0, "p50 {p50} us on loopback");
    let mean = s.mean_us.unwrap();
    assert!(min <= mean && mean <= max, "{s:?}");
    assert_eq!(s.rtts_ns.len() as u64, s.samples);
    assert!(s.rtts_ns.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn udp_round_trip() {
    let srv = server(Protocol::Udp);
    let s = run_client(config(srv.local_addr(), Protocol::Udp, 1000, 1000)).unwrap();
    // 1000/s × 1 s: exactly ⌈1 s / 1 ms⌉ requests, sent over about a second.
    assert_sane(&s, 1000);
    assert!(s.elapsed_s > 0.99 && s.elapsed_s < 5.0, "{}", s.elapsed_s);
    assert_eq!(s.protocol, Protocol::Udp);
    assert_eq!(s.interval_us, 1000.0);
    let st = srv.stop();
    assert_eq!((st.echoed, st.ignored, st.connections), (1000, 0, 0));
}

#[test]
fn tcp_round_trip() {
    let srv = server(Protocol::Tcp);
    let mut cfg = config(srv.local_addr(), Protocol::Tcp, 2000, 1000);
    cfg.size = 200;
    let s = run_client(cfg).unwrap();
    assert_sane(&s, 2000);
    assert_eq!((s.protocol, s.size), (Protocol::Tcp, 200));
    // A second run on a new connection.
    let s = run_client(config(srv.local_addr(), Protocol::Tcp, 1000, 300)).unwrap();
    assert_sane(&s, 300);
    let t = Instant::now();
    let st = srv.stop();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "stop took {:?}",
        t.elapsed()
    );
    assert_eq!((st.echoed, st.ignored, st.connections), (2300, 0, 2));
}

#[test]
fn json_has_the_keys_the_lab_reads() {
    let srv = server(Protocol::Udp);
    let s = run_client(config(srv.local_addr(), Protocol::Udp, 500, 200)).unwrap();
    let j = serde_json::to_value(&s).unwrap();
    for k in ["min_us", "p50_us", "p99_us", "p999_us", "max_us", "mean_us"] {
        assert!(j[k].as_f64().unwrap() > 0.0, "{k}: {j}");
    }
    assert_eq!(j["samples"], 100);
    assert_eq!(j["lost"], 0);
}

fn request(seq: u64, size: usize) -> Vec<u8> {
    let mut m = vec![0u8; size];
    let h = Header {
        kind: Kind::Request,
        session: 7,
        seq,
        send_ns: 1,
    };
    assert!(h.encode_into(&mut m));
    m
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "timed out waiting for {what}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn udp_server_ignores_garbage() {
    let srv = server(Protocol::Udp);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(srv.local_addr()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut response = request(3, 64);
    assert!(answer_in_place(&mut response));
    let mut bad_magic = request(4, 64);
    bad_magic[0] = b'x';
    let garbage: Vec<Vec<u8>> = vec![
        vec![],
        b"hello".to_vec(),
        vec![0u8; 64],
        vec![0xff; 1500],
        request(1, 64)[..23].to_vec(), // one byte short of a header
        response,                      // a response is never answered (no ping-pong)
        bad_magic,
        vec![0u8; 65_507],
    ];
    for g in &garbage {
        sock.send(g).unwrap();
    }
    wait_for("garbage to be counted", || {
        srv.stats().ignored == garbage.len() as u64
    });
    // A valid request from the same socket is still answered, byte for byte but the kind.
    let req = request(9, 100);
    sock.send(&req).unwrap();
    let mut buf = [0u8; 2048];
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(n, 100);
    let h = Header::parse(&buf[..n]).unwrap();
    assert_eq!((h.kind, h.session, h.seq), (Kind::Response, 7, 9));
    assert_eq!(buf[4..n], req[4..]);
    // And a real client run is unaffected.
    let s = run_client(config(srv.local_addr(), Protocol::Udp, 1000, 200)).unwrap();
    assert_sane(&s, 200);
    let st = srv.stop();
    assert_eq!((st.echoed, st.ignored), (201, garbage.len() as u64));
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

#[test]
fn tcp_server_ignores_garbage() {
    let srv = server(Protocol::Tcp);
    let mut c = TcpStream::connect(srv.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    // A well-framed body that is not a request is skipped; the connection stays usable.
    c.write_all(&frame(&[0xaa; 40])).unwrap();
    let req = request(5, 64);
    c.write_all(&frame(&req)).unwrap();
    let mut buf = [0u8; 68];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), 64);
    let h = Header::parse(&buf[4..]).unwrap();
    assert_eq!((h.kind, h.seq), (Kind::Response, 5));
    // A length outside 24..=65507 cannot be resynchronised: that connection is closed.
    c.write_all(&3u32.to_le_bytes()).unwrap();
    c.write_all(b"abc").unwrap();
    let mut rest = Vec::new();
    assert_eq!(c.read_to_end(&mut rest).map(|_| rest.len()).unwrap_or(0), 0);
    wait_for("the bad frames to be counted", || srv.stats().ignored == 2);
    // Other connections are served as before.
    let s = run_client(config(srv.local_addr(), Protocol::Tcp, 1000, 200)).unwrap();
    assert_sane(&s, 200);
    let st = srv.stop();
    assert_eq!((st.echoed, st.ignored, st.connections), (201, 2, 2));
}

/// A misbehaving UDP "server": for every request it sends garbage, an echo of another session,
/// then the echo twice; with `swap` it answers requests in pairs, the second one first.
fn rogue_server(swap: bool) -> (SocketAddr, Arc<AtomicBool>, thread::JoinHandle<()>) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let addr = sock.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let h = thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut held: Option<Vec<u8>> = None;
        while !stop2.load(Ordering::Relaxed) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                continue;
            };
            let mut m = buf[..n].to_vec();
            assert!(answer_in_place(&mut m));
            if swap {
                match held.take() {
                    None => held = Some(m),
                    Some(first) => {
                        sock.send_to(&m, from).unwrap();
                        sock.send_to(&first, from).unwrap();
                    }
                }
                continue;
            }
            sock.send_to(b"garbage", from).unwrap();
            let mut other = m.clone();
            other[4] ^= 0xff; // another session id
            sock.send_to(&other, from).unwrap();
            sock.send_to(&m, from).unwrap();
            sock.send_to(&m, from).unwrap();
        }
    });
    (addr, stop, h)
}

#[test]
fn client_ignores_foreign_and_duplicate_responses() {
    let (addr, stop, h) = rogue_server(false);
    let s = run_client(config(addr, Protocol::Udp, 1000, 200)).unwrap();
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    assert_eq!((s.sent, s.samples, s.lost), (200, 200, 0), "{s:?}");
    // The duplicate of the last response may arrive after the run ended.
    assert!(s.duplicates >= 199 && s.duplicates <= 200, "{s:?}");
    assert!(s.foreign >= 2 * 200 - 2, "{s:?}");
}

#[test]
fn client_handles_reordering() {
    let (addr, stop, h) = rogue_server(true);
    let s = run_client(config(addr, Protocol::Udp, 1000, 100)).unwrap();
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    assert_eq!((s.sent, s.samples, s.lost), (100, 100, 0), "{s:?}");
    assert_eq!((s.reordered, s.duplicates, s.foreign), (50, 0, 0), "{s:?}");
}

#[test]
fn udp_without_server_loses_everything() {
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut cfg = config(port, Protocol::Udp, 1000, 100);
    cfg.timeout = Duration::from_millis(200);
    let t = Instant::now();
    let s = run_client(cfg).unwrap();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!((s.sent, s.samples, s.lost), (100, 0, 100));
    assert!(s.p50_us.is_none() && s.max_us.is_none() && s.mean_us.is_none());
}

#[test]
fn tcp_errors_are_clear() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e = run_client(config(port, Protocol::Tcp, 1000, 100)).unwrap_err();
    assert!(matches!(e, ProbeError::Connect { .. }), "{e}");
    assert!(e.to_string().contains("cannot connect tcp"), "{e}");

    // The server going away mid-run ends the run with ConnectionClosed.
    let srv = server(Protocol::Tcp);
    let cfg = config(srv.local_addr(), Protocol::Tcp, 1000, 5000);
    let client = thread::spawn(move || run_client(cfg));
    wait_for("the connection", || srv.stats().echoed > 10);
    srv.stop();
    let t = Instant::now();
    let e = client.join().unwrap().unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(matches!(e, ProbeError::ConnectionClosed(_)), "{e}");
}

#[test]
fn bad_configuration_and_busy_port() {
    let srv = server(Protocol::Udp);
    let e = spawn_server(ServerConfig::new(srv.local_addr(), Protocol::Udp)).unwrap_err();
    assert!(matches!(e, ProbeError::Bind { .. }), "{e}");
    assert!(e.to_string().contains("cannot bind udp"), "{e}");

    let base = ClientConfig::new(srv.local_addr(), Protocol::Udp);
    let cases: Vec<(ClientConfig, &str)> = vec![
        (ClientConfig { size: 23, ..base }, "size"),
        (
            ClientConfig {
                size: 70_000,
                ..base
            },
            "size",
        ),
        (
            ClientConfig {
                interval: Duration::ZERO,
                ..base
            },
            "interval",
        ),
        (
            ClientConfig {
                duration: Duration::ZERO,
                ..base
            },
            "duration",
        ),
        (
            ClientConfig {
                timeout: Duration::ZERO,
                ..base
            },
            "timeout",
        ),
        (
            ClientConfig {
                target: "127.0.0.1:0".parse().unwrap(),
                ..base
            },
            "port 0",
        ),
    ];
    for (cfg, word) in cases {
        let e = run_client(cfg).unwrap_err();
        assert!(matches!(e, ProbeError::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains(word), "{word}: {e}");
    }
    assert_eq!(srv.stop().echoed, 0);
}
