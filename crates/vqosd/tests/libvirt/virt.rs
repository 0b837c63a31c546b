//! A private libvirtd for the test, the domains it runs, and their serial consoles.
//!
//! The libvirtd is the distribution's (Debian's `libvirt-daemon-system`: QEMU runs as
//! `libvirt-qemu`), started by the test in a mount namespace of its own where the test's
//! directories stand in for `/etc/libvirt`, `/run/libvirt`, `/var/lib/libvirt`,
//! `/var/log/libvirt` and `/var/cache/libvirt`: it reads only the test's config, defines no
//! domain of the host's, and leaves no file behind; its API socket is in the test's directory
//! (`unix_sock_dir`), where `virsh -c 'qemu:///system?socket=...'` finds it. A system libvirtd,
//! running or not, is not touched. QEMU inherits the namespace: the test's paths outside those
//! five directories are the host's.

use std::fs;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use crate::common::qemu::poll_gently;
use crate::common::qemu::{finish_on, shell_line};
use vqos_testkit::poll;

/// The five directories a privileged libvirtd uses, and the test's stand-ins (under its dir).
const DIRS: [(&str, &str); 5] = [
    ("/etc/libvirt", "etc"),
    ("/run/libvirt", "run"),
    ("/var/lib/libvirt", "lib"),
    ("/var/log/libvirt", "log"),
    ("/var/cache/libvirt", "cache"),
];

/// The test's libvirtd config (`-f`): the API socket in the test's directory, root only, no
/// authentication (the socket's mode is the access control, as for the system's).
const LIBVIRTD_CONF: &str = "unix_sock_rw_perms = \"0700\"\nauth_unix_rw = \"none\"\n\
                             auth_unix_ro = \"none\"\n";

/// The QEMU driver's config. `cgroup_controllers` and `namespaces` empty: in a container
/// libvirtd may find no cgroup it can manage and no room for a private `/dev` per guest;
/// `security_driver = "none"`: no AppArmor or SELinux profile (the DAC driver still runs QEMU
/// as `libvirt-qemu`, which is the point); QEMU's output in files (no virtlogd);
/// `remember_owner = 0`: no extended attributes on the test's files.
const QEMU_CONF: &str = "cgroup_controllers = [ ]\nnamespaces = [ ]\nsecurity_driver = \"none\"\n\
                         stdio_handler = \"file\"\nremember_owner = 0\n";

/// What the test needs of the host for a libvirtd of its own; `None` when all is there.
pub fn missing() -> Option<String> {
    for tool in ["libvirtd", "virsh", "unshare"] {
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
    // Debian's libvirtd runs QEMU as libvirt-qemu and refuses to start without that user,
    // which libvirt-daemon-system creates (with the directories below).
    let user = Command::new("id").arg("libvirt-qemu").output();
    if !user.is_ok_and(|o| o.status.success()) {
        return Some("no user libvirt-qemu (libvirt-daemon-system not installed)".into());
    }
    DIRS.iter()
        .find(|(d, _)| *d != "/run/libvirt" && !Path::new(d).is_dir())
        .map(|(d, _)| format!("no {d} (libvirt-daemon-system not installed)"))
}

/// A libvirtd of the test's own; stopped by its PID on drop (domains first: see [`Domain`]).
pub struct Libvirtd {
    child: Option<Child>,
    /// `qemu:///system?socket=...`: its API socket.
    pub uri: String,
    /// The test's directory holding the stand-ins.
    dir: PathBuf,
}

impl Libvirtd {
    /// Starts it with its directories under `dir/libvirt`; waits until `virsh` gets an answer
    /// (the first probes QEMU's capabilities: several seconds under TCG).
    pub fn start(dir: &Path) -> Libvirtd {
        let root = dir.join("libvirt");
        for (_, name) in DIRS {
            fs::create_dir_all(root.join(name)).unwrap();
        }
        fs::create_dir_all(root.join("sock")).unwrap();
        let conf = root.join("libvirtd.conf");
        // A host UUID of its own: two of the test's libvirtds are two hosts to a migration
        // (libvirt refuses to migrate a guest to the host it runs on, by this UUID).
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let host_uuid = format!("7e57da7a-{seq:04x}-4000-8000-{:012x}", std::process::id());
        fs::write(
            &conf,
            format!(
                "{LIBVIRTD_CONF}unix_sock_dir = \"{}\"\nlog_outputs = \"3:file:{}\"\n\
                 host_uuid = \"{host_uuid}\"\n",
                root.join("sock").display(),
                root.join("libvirtd.log").display()
            ),
        )
        .unwrap();
        fs::write(root.join("etc/qemu.conf"), QEMU_CONF).unwrap();
        // In the new mount namespace: nothing propagates back to the host; /run/libvirt
        // needs a place to be mounted (a tmpfs on /run, the host's /run unseen there).
        let mut script = String::from(
            "set -e\nmount --make-rprivate /\nmount -t tmpfs -o mode=0755 vqos-test /run\n\
             mkdir /run/libvirt\n",
        );
        for (path, name) in DIRS {
            script.push_str(&format!(
                "mount --bind '{}' {path}\n",
                root.join(name).display()
            ));
        }
        script.push_str("exec libvirtd -f \"$1\"\n");
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--", "sh", "-c", &script, "sh"])
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(root.join("stderr")).unwrap());
        // SAFETY: prctl is async-signal-safe; it only sets this child's parent-death signal,
        // so the libvirtd dies with the test even when the test process is killed outright.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("unshare libvirtd: {e}"));
        let mut d = Libvirtd {
            child: Some(child),
            uri: format!(
                "qemu:///system?socket={}",
                root.join("sock/libvirt-sock").display()
            ),
            dir: root,
        };
        let up = poll(Duration::from_secs(60), || {
            if let Some(status) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("libvirtd exited ({status}): {}", d.log());
            }
            let v = d.virsh_output(&["version"]);
            if v.is_none() {
                std::thread::sleep(Duration::from_millis(100));
            }
            v
        });
        let version = up.unwrap_or_else(|| panic!("libvirtd did not answer: {}", d.log()));
        let line = version.lines().find(|l| l.contains("hypervisor"));
        println!("libvirtd up: {}", line.unwrap_or("?").trim());
        d
    }

    /// `virsh` against it; its stdout, or `None` when it failed.
    fn virsh_output(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("virsh")
            .args(["-q", "-c", &self.uri])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `virsh` against it; panics with its stderr and the daemon's log if it fails.
    pub fn virsh(&self, args: &[&str]) -> String {
        let out = Command::new("virsh")
            .args(["-q", "-c", &self.uri])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "virsh {args:?}: {}\nlibvirtd: {}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What libvirtd logged, and the QEMU logs of its domains.
    pub fn log(&self) -> String {
        let mut text = fs::read_to_string(self.dir.join("libvirtd.log")).unwrap_or_default();
        text += &fs::read_to_string(self.dir.join("stderr")).unwrap_or_default();
        for e in fs::read_dir(self.dir.join("log/qemu"))
            .into_iter()
            .flatten()
        {
            let path = e.unwrap().path();
            let log = fs::read_to_string(&path).unwrap_or_default();
            text += &format!("\n{}:\n{log}", path.display());
        }
        text
    }

    /// The domain `name` this libvirtd runs without having defined it (one migrated in):
    /// destroyed (and undefined) on drop like the others.
    pub fn adopt(&self, name: &str) -> Domain<'_> {
        Domain {
            libvirtd: self,
            name: name.to_string(),
        }
    }

    /// Defines domain `xml` (named `name`) and starts it.
    pub fn start_domain(&self, name: &str, xml: &str) -> Domain<'_> {
        let path = self.dir.join(format!("{name}.xml"));
        fs::write(&path, xml).unwrap();
        self.virsh(&["define", path.to_str().unwrap()]);
        let domain = Domain {
            libvirtd: self,
            name: name.to_string(),
        };
        self.virsh(&["start", name]);
        domain
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // SAFETY: kill on the PID of our own, not yet reaped, child (libvirtd: unshare and sh
        // exec'd it).
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let stopped = poll(Duration::from_secs(10), || {
            let done = c.try_wait().ok().flatten().is_some();
            if !done {
                std::thread::sleep(Duration::from_millis(20));
            }
            done.then_some(())
        });
        if stopped.is_none() {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

/// A domain the test defined: destroyed and undefined on drop; if libvirtd cannot, its QEMU
/// is killed by the PID libvirtd recorded.
pub struct Domain<'a> {
    libvirtd: &'a Libvirtd,
    /// The domain's name.
    pub name: String,
}

impl Domain<'_> {
    /// `virsh domstate`.
    pub fn state(&self) -> String {
        self.libvirtd.virsh(&["domstate", &self.name]).trim().into()
    }
}

impl Drop for Domain<'_> {
    fn drop(&mut self) {
        let pid_file = self
            .libvirtd
            .dir
            .join(format!("run/qemu/{}.pid", self.name));
        let pid = fs::read_to_string(&pid_file).ok();
        let destroyed = self
            .libvirtd
            .virsh_output(&["destroy", &self.name])
            .is_some();
        let _ = self.libvirtd.virsh_output(&["undefine", &self.name]);
        match pid.and_then(|p| p.trim().parse::<i32>().ok()) {
            // SAFETY: kill on the PID of the QEMU this test's libvirtd started for the domain
            // (its pid file), which libvirtd could not stop.
            Some(pid) if !destroyed && pid > 1 => unsafe {
                libc::kill(pid, libc::SIGKILL);
            },
            _ => {}
        }
    }
}

/// A guest's serial console: libvirt's unix socket to type on, and its log file (QEMU writes
/// everything the guest prints there, also while no one is connected).
pub struct Console {
    name: String,
    socket: PathBuf,
    log: PathBuf,
    input: Option<UnixStream>,
    /// Commands sent so far: numbers their end markers.
    sent: u32,
}

impl Console {
    /// The console of guest `name` at `socket`, logged to `log` (the domain's `<serial>`).
    pub fn new(name: &str, socket: PathBuf, log: PathBuf) -> Console {
        Console {
            name: name.into(),
            socket,
            log,
            input: None,
            sent: 0,
        }
    }

    /// The same guest's console after a migration: the destination's `socket` and `log`; its
    /// commands go on numbering where the source's stopped.
    pub fn moved_to(self, socket: PathBuf, log: PathBuf) -> Console {
        Console {
            socket,
            log,
            input: None,
            ..self
        }
    }

    /// Everything the guest printed.
    pub fn text(&self) -> String {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .replace('\r', "")
    }

    /// Waits until the console shows `what`.
    pub fn wait_for(&self, what: &str, limit: Duration) -> bool {
        poll_gently(limit, || self.text().contains(what).then_some(())).is_some()
    }

    /// Types `cmd`; returns the marker its end prints. The marker is computed by the guest's
    /// shell (`$((...))`), so the echo of the typed line never matches it.
    pub fn send(&mut self, cmd: &str) -> String {
        let (line, marker) = shell_line(&mut self.sent, cmd);
        if self.input.is_none() {
            let s = UnixStream::connect(&self.socket);
            let s = s.unwrap_or_else(|e| panic!("{}: console socket: {e}", self.name));
            // What the guest prints is read from the log; the socket is drained all the same,
            // or QEMU would stop writing (to both) once its buffer is full.
            let mut drain = s.try_clone().unwrap();
            std::thread::spawn(move || std::io::copy(&mut drain, &mut std::io::sink()));
            self.input = Some(s);
        }
        if let Err(e) = self.input.as_mut().unwrap().write_all(line.as_bytes()) {
            panic!("{}: console: {e}; it said:\n{}", self.name, self.text());
        }
        marker
    }

    /// The output between the command's line and its end marker, and its exit status; panics
    /// past `limit`.
    pub fn finish(&self, marker: &str, limit: Duration) -> (String, i32) {
        finish_on(&self.name, || self.text(), marker, limit)
    }
}

/// Seconds since `t0`, for the progress lines.
pub fn secs(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64()
}
