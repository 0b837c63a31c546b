//! The bearer token never goes to a squatter (issue 27): with vqosd down, any local user can
//! bind its loopback TCP port first; `vqos --url ... --token-file ...` must then refuse to talk
//! (exit 3, a message naming the socket's owner) and the squatter must receive no token. The
//! same listener run by root gets the token, so the check tells the two apart. Needs root (to
//! run the squatter as another user) and python3 (the test command's own dependency).

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "squatter-test-token-0123456789";

/// A listener on 127.0.0.1 (a free port) that records what one client sends, run as `uid`;
/// its port.
fn squatter(uid: u32) -> (Child, u16) {
    use std::os::unix::process::CommandExt;
    let code = "import socket,sys\n\
        s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1)\n\
        print(s.getsockname()[1], flush=True)\n\
        s.settimeout(5)\n\
        try:\n  c,_=s.accept(); c.settimeout(2); d=c.recv(65536)\n\
        \x20 c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\n{}'); print(d)\n\
        except Exception as e: print('no request', e)\n";
    let mut child = Command::new("python3")
        .args(["-c", code])
        .uid(uid)
        .gid(uid)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut out = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    child.stdout = Some(out);
    let port = String::from_utf8(line).unwrap().trim().parse().unwrap();
    (child, port)
}

/// What the squatter received (it exits after one client, or after 5 s).
fn received(mut child: Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let mut s = String::new();
    child.stdout.take().unwrap().read_to_string(&mut s).unwrap();
    let _ = child.wait();
    s
}

#[test]
fn the_token_goes_only_to_a_server_of_root_or_this_user() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP the_token_goes_only_to_a_server_of_root_or_this_user: needs root");
        return;
    }
    if Command::new("python3").arg("-V").output().is_err() {
        println!("SKIP the_token_goes_only_to_a_server_of_root_or_this_user: no python3");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let run = |port: u16| {
        Command::new(env!("CARGO_BIN_EXE_vqos"))
            .args(["--url", &format!("http://127.0.0.1:{port}"), "--token-file"])
            .arg(&token_file)
            .arg("stats")
            .output()
            .unwrap()
    };
    // Another user's server: refused before a byte is sent.
    let (child, port) = squatter(65534);
    let out = run(port);
    let heard = received(child);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("Refusing to send the token") && stderr.contains("uid 65534"),
        "{stderr}"
    );
    assert!(
        !heard.contains(TOKEN),
        "the squatter got the token: {heard}"
    );
    // Root's (vqosd's) server: the token is sent.
    let (child, port) = squatter(0);
    let _ = run(port);
    let heard = received(child);
    assert!(heard.contains(TOKEN), "root's server got no token: {heard}");
}
