//! QEMU guests for the real-VM tests (`qemu.rs`, `migration.rs`): TCG, a Debian kernel and a
//! busybox initramfs built by `scripts/guest-image.sh` into `target/guest-image` (cached),
//! the serial console on stdin/stdout, killed by PID on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vqos_testkit::poll;

/// Which side of vhost-user's socket vqosd is on for a guest.
#[derive(Clone, Copy, PartialEq)]
pub enum Role {
    /// vqosd listens; QEMU connects (and reconnects every second when the socket goes away).
    Server,
    /// QEMU listens; vqosd connects.
    Client,
}

/// A QEMU guest, its serial console on stdin/stdout; killed by its PID on drop.
pub struct Guest {
    pub name: String,
    pub child: Option<Child>,
    pub stdin: ChildStdin,
    /// Everything it printed on its console (and QEMU on stderr).
    pub out: Arc<Mutex<String>>,
    /// Commands sent so far: numbers their end markers.
    pub sent: u32,
}

impl Guest {
    /// A guest on `socket` with `queues` queue pairs (virtio-net `mq=on` when more than one).
    pub fn start(image: &Path, name: &str, port: (&Path, Role, u16), mac: &str, ip: &str) -> Guest {
        Self::start_with(image, name, port, mac, ip, &[])
    }

    /// As [`Guest::start`], with more QEMU arguments (`-qmp ...`, `-incoming ...`).
    pub fn start_with(
        image: &Path,
        name: &str,
        (socket, role, queues): (&Path, Role, u16),
        mac: &str,
        ip: &str,
        extra: &[String],
    ) -> Guest {
        let chardev = match role {
            Role::Server => format!("socket,id=c,path={},reconnect=1", socket.display()),
            Role::Client => format!("socket,id=c,path={},server=on,wait=off", socket.display()),
        };
        let net = [
            "-chardev".to_string(),
            chardev,
            "-netdev".to_string(),
            format!("vhost-user,id=n,chardev=c,queues={queues}"),
        ];
        let mq = if queues > 1 { ",mq=on" } else { "" };
        Self::launch(image, name, &net, mac, mq, ip, extra)
    }

    /// A guest on QEMU's built-in user network (slirp: the guest is 10.0.2.15/24, QEMU
    /// answers as 10.0.2.2): the reference the migration benchmark measures vhost-user
    /// against. `extra` as in [`Guest::start_with`].
    pub fn start_user_net(image: &Path, name: &str, mac: &str, extra: &[String]) -> Guest {
        let net = ["-netdev".to_string(), "user,id=n".to_string()];
        Self::launch(image, name, &net, mac, "", "10.0.2.15/24", extra)
    }

    /// QEMU with the netdev arguments `net` (netdev id `n`) behind a virtio-net device.
    fn launch(
        image: &Path,
        name: &str,
        net: &[String],
        mac: &str,
        device_extra: &str,
        ip: &str,
        extra: &[String],
    ) -> Guest {
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args([
            "-machine",
            "pc,accel=tcg",
            "-cpu",
            "max",
            "-smp",
            "1",
            "-m",
            "256",
        ])
        .args(["-object", "memory-backend-memfd,id=mem,size=256M,share=on"])
        .args(["-numa", "node,memdev=mem"])
        .args(net)
        // vectors=0: MSI-X under TCG crashes QEMU 7.2 when vhost starts (docs/vhost-user.md).
        .args([
            "-device",
            &format!("virtio-net-pci,netdev=n,mac={mac},romfile=,vectors=0{device_extra}"),
        ])
        .arg("-kernel")
        .arg(image.join("vmlinuz"))
        .arg("-initrd")
        .arg(image.join("initrd.gz"))
        .args([
            "-append",
            &format!("console=ttyS0 quiet panic=-1 vqos.name={name} vqos.ip={ip}"),
        ])
        .args([
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
            "-serial",
            "stdio",
        ])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe; it only sets this child's parent-death signal,
        // so a guest dies with the test even when the test process is killed outright.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("qemu-system-x86_64: {e}"));
        let out = Arc::new(Mutex::new(String::new()));
        let mut stdout = child.stdout.take().unwrap();
        let o = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                o.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]).replace('\r', ""));
            }
        });
        let stderr = child.stderr.take().unwrap();
        let o = out.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                o.lock().unwrap().push_str(&format!("[qemu] {line}\n"));
            }
        });
        Guest {
            name: name.into(),
            stdin: child.stdin.take().unwrap(),
            child: Some(child),
            out,
            sent: 0,
        }
    }

    pub fn console(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Waits until the console shows `what`.
    pub fn wait_for(&self, what: &str, limit: Duration) -> bool {
        poll_gently(limit, || self.console().contains(what).then_some(())).is_some()
    }

    /// Types `cmd` on the console; returns the marker its end prints. The marker is computed
    /// by the guest's shell (`$((...))`), so the echo of the typed line never matches it.
    pub fn send(&mut self, cmd: &str) -> String {
        let (line, marker) = shell_line(&mut self.sent, cmd);
        if let Err(e) = self.stdin.write_all(line.as_bytes()) {
            panic!("{}: console: {e}; it said:\n{}", self.name, self.console());
        }
        marker
    }

    /// The console output between the command's line and its end marker, and its exit status;
    /// panics past `limit`.
    pub fn finish(&self, marker: &str, limit: Duration) -> (String, i32) {
        finish_on(&self.name, || self.console(), marker, limit)
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Why the test cannot run here, if it cannot.
pub fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root".into());
    }
    for tool in ["qemu-system-x86_64", "iperf3"] {
        let ok = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Some(format!("{tool} not installed"));
        }
    }
    None
}

/// `target/guest-image`, built (or found cached) by `scripts/guest-image.sh`; `Err` with the
/// script's words when a tool it needs is missing (its exit status 2).
pub fn guest_image() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let dir = target.join("guest-image");
    let t = Instant::now();
    let out = Command::new("bash")
        .arg(root.join("scripts/guest-image.sh"))
        .arg(&dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match out.status.code() {
        Some(0) => {
            println!("{} ({:.1} s)", text.trim(), t.elapsed().as_secs_f64());
            Ok(dir)
        }
        Some(2) => Err(text.trim().to_string()),
        _ => panic!("scripts/guest-image.sh failed ({}): {text}", out.status),
    }
}

/// [`poll`] at a pace that leaves the CPU to the guests: `f` every 20 ms.
pub fn poll_gently<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    poll(limit, || {
        let v = f();
        if v.is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
        v
    })
}

/// The line to type on a guest's shell for `cmd` (the `sent`-th command) and the marker its
/// end prints. The marker is computed by the guest's shell (`$((...))`), so the echo of the
/// typed line never matches it.
pub fn shell_line(sent: &mut u32, cmd: &str) -> (String, String) {
    *sent += 1;
    let n = 1000 + *sent;
    (
        format!("{cmd}; rc=$?; echo \"VQOS-END-$(({n}+0)) rc=$rc\"\n"),
        format!("VQOS-END-{n} rc="),
    )
}

/// The output of `name`'s console (`text`) between a command's line and its end `marker`,
/// and the command's exit status; panics past `limit`.
pub fn finish_on(
    name: &str,
    text: impl Fn() -> String,
    marker: &str,
    limit: Duration,
) -> (String, i32) {
    let found = poll_gently(limit, || {
        let out = text();
        let end = out.find(marker)?;
        let rest = &out[end + marker.len()..];
        let rc: String = rest.chars().take_while(char::is_ascii_digit).collect();
        (!rc.is_empty() && rest.len() > rc.len()).then(|| {
            let start = out[..end].rfind("VQOS-END-$((").unwrap_or(0);
            (out[start..end].to_string(), rc.parse().unwrap())
        })
    });
    found.unwrap_or_else(|| panic!("{name}: no {marker} within {limit:?}; console:\n{}", text()))
}
