//! The shipped systemd unit (packaging/vqosd.service) allows the features it ships: each is
//! run under the unit's own restrictions, read from the unit file, so this test follows it.
//!
//! Where systemd is not PID 1 (CI, containers) the restrictions are re-created around the
//! daemon: `setpriv` gives it the unit's `CapabilityBoundingSet=` and `NoNewPrivileges=`, and a
//! seccomp filter installed before the exec refuses what `RestrictAddressFamilies=` and
//! `RestrictNamespaces=` refuse (a socket of another family: `EAFNOSUPPORT`; `setns`,
//! `unshare` or `clone` into a namespace kind not allowed: `EPERM`), as systemd's filters do.
//! `SystemCallFilter=` is re-created for `bpf()` only (the uplink's steering program needs it
//! and `@system-service` lacks it: refused with `EPERM` unless the unit names it).
//! The other settings (file system, devices, other system call groups) are not re-created here;
//! `scripts/verify-unit.sh` checks the unit with `systemd-analyze verify`.
//!
//! Each test also runs the daemon with the one permission its feature needs taken away and
//! checks that it then fails, and says why: the harness enforces what it claims to. A
//! drop-in's `SupplementaryGroups=` (the one docs/vhost-user.md gives for libvirt's
//! client-role sockets) is re-created with `setpriv --groups`.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{port, Daemon, BIN};
use vqos_testkit::{can_run, poll, sh, Links, Netns};

/// The restrictions the unit states.
#[derive(Clone)]
struct Unit {
    /// `CapabilityBoundingSet=`, lower case without `CAP_` (setpriv's spelling).
    caps: Vec<String>,
    /// `RestrictAddressFamilies=`, as numbers.
    families: Vec<i32>,
    /// `RestrictNamespaces=`: the `CLONE_NEW*` flags allowed.
    namespaces: u64,
    /// `SupplementaryGroups=` (none in the shipped unit; a drop-in may add one).
    groups: Vec<String>,
    /// A `SystemCallFilter=` line names `bpf` (the uplink's steering program); the unit's
    /// groups (`@system-service`) do not have it.
    bpf: bool,
}

/// Every namespace kind's `CLONE_NEW*` flag (`CLONE_NEWTIME` is 0x80).
const ALL_NAMESPACES: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64
    | 0x80;

fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/vqosd.service")
}

impl Unit {
    /// Reads the unit file's `[Service]` restrictions.
    fn read() -> Unit {
        let text = std::fs::read_to_string(unit_path()).unwrap();
        let value = |key: &str| -> Vec<String> {
            let line = text
                .lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("the unit has no {key}="));
            line.split_whitespace().map(str::to_string).collect()
        };
        let caps = value("CapabilityBoundingSet")
            .iter()
            .map(|c| c.strip_prefix("CAP_").unwrap().to_lowercase())
            .collect();
        let families = value("RestrictAddressFamilies")
            .iter()
            .map(|f| match f.as_str() {
                "AF_UNIX" => libc::AF_UNIX,
                "AF_INET" => libc::AF_INET,
                "AF_INET6" => libc::AF_INET6,
                "AF_NETLINK" => libc::AF_NETLINK,
                "AF_PACKET" => libc::AF_PACKET,
                other => panic!("add {other} to this test's table"),
            })
            .collect();
        let namespaces = value("RestrictNamespaces")
            .iter()
            .map(|n| match n.as_str() {
                "yes" => 0,
                "no" => ALL_NAMESPACES,
                "net" => libc::CLONE_NEWNET as u64,
                "mnt" => libc::CLONE_NEWNS as u64,
                "uts" => libc::CLONE_NEWUTS as u64,
                "ipc" => libc::CLONE_NEWIPC as u64,
                "user" => libc::CLONE_NEWUSER as u64,
                "pid" => libc::CLONE_NEWPID as u64,
                "cgroup" => libc::CLONE_NEWCGROUP as u64,
                other => panic!("unknown RestrictNamespaces= value {other}"),
            })
            .fold(0, |a, b| a | b);
        assert!(text.contains("\nNoNewPrivileges=yes\n"));
        let bpf = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("SystemCallFilter="))
            .any(|v| v.split_whitespace().any(|c| c == "bpf"));
        Unit {
            caps,
            families,
            namespaces,
            groups: Vec::new(),
            bpf,
        }
    }

    /// The unit without capability `cap`.
    fn without_cap(&self, cap: &str) -> Unit {
        let mut u = self.clone();
        assert!(u.caps.iter().any(|c| c == cap), "the unit lacks {cap}");
        u.caps.retain(|c| c != cap);
        u
    }

    /// The unit with a drop-in's `SupplementaryGroups=group`.
    fn with_group(&self, group: &str) -> Unit {
        let mut u = self.clone();
        u.groups.push(group.to_string());
        u
    }

    /// The unit without `bpf` among its system calls.
    fn without_bpf(&self) -> Unit {
        let mut u = self.clone();
        assert!(u.bpf, "the unit lacks SystemCallFilter=bpf");
        u.bpf = false;
        u
    }

    /// The unit without address family `family`.
    fn without_family(&self, family: i32) -> Unit {
        let mut u = self.clone();
        u.families.retain(|&f| f != family);
        u
    }

    /// vqosd with `config`, restricted as this unit says.
    fn vqosd(&self, config: &Path) -> Command {
        let bounding: String = std::iter::once("-all".to_string())
            .chain(self.caps.iter().map(|c| format!("+{c}")))
            .collect::<Vec<_>>()
            .join(",");
        let mut cmd = Command::new("setpriv");
        if !self.groups.is_empty() {
            cmd.arg(format!("--groups={}", self.groups.join(",")));
        }
        cmd.arg(format!("--bounding-set={bounding}"))
            .arg("--no-new-privs")
            .arg("--")
            .arg(BIN)
            .arg("--config")
            .arg(config);
        let filter = seccomp_filter(&self.families, ALL_NAMESPACES & !self.namespaces, self.bpf);
        // SAFETY: the closure only makes two prctl calls on memory prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let prog = libc::sock_fprog {
                    len: filter.len() as u16,
                    filter: filter.as_ptr() as *mut libc::sock_filter,
                };
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        cmd
    }

    /// Runs vqosd with `config` as [`Unit::vqosd`] until it exits; its exit code and stderr.
    fn run(&self, config: &Path) -> (Option<i32>, String) {
        let out = self.vqosd(config).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// The audit architecture of this build (seccomp data's `arch`).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// A seccomp program: `socket()` of a family not in `families` fails with `EAFNOSUPPORT`,
/// `setns`, `unshare` or `clone` with a flag of `denied_ns` with `EPERM`, and `bpf()` with
/// `EPERM` unless `bpf`; all else is allowed.
fn seccomp_filter(families: &[i32], denied_ns: u64, bpf: bool) -> Vec<libc::sock_filter> {
    const LD_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    // struct seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (low half first).
    let arg = |i: u32| stmt(LD_ABS, 16 + 8 * i);
    let allow = stmt(RET, libc::SECCOMP_RET_ALLOW);
    let errno = |e: i32| stmt(RET, libc::SECCOMP_RET_ERRNO | e as u32);
    let mut p = vec![
        stmt(LD_ABS, 4),
        jump(JEQ, AUDIT_ARCH, 1, 0),
        stmt(RET, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(LD_ABS, 0),
    ];
    let k = families.len() as u8;
    p.push(jump(JEQ, libc::SYS_socket as u32, 0, k + 3));
    p.push(arg(0));
    for (i, &f) in families.iter().enumerate() {
        p.push(jump(JEQ, f as u32, k - i as u8, 0));
    }
    p.push(errno(libc::EAFNOSUPPORT));
    p.push(allow);
    for (nr, flags_arg) in [
        (libc::SYS_setns, 1),
        (libc::SYS_unshare, 0),
        (libc::SYS_clone, 0),
    ] {
        p.push(jump(JEQ, nr as u32, 0, 4));
        p.push(arg(flags_arg));
        p.push(jump(JSET, denied_ns as u32, 0, 1));
        p.push(errno(libc::EPERM));
        p.push(allow);
    }
    if !bpf {
        p.push(jump(JEQ, libc::SYS_bpf as u32, 0, 1));
        p.push(errno(libc::EPERM));
    }
    p.push(allow);
    p
}

/// Skips (with the reason) where the test cannot run: not root, no iperf3 (the lab's check),
/// no setpriv. The guard holds the machine-wide real-traffic lock.
fn ready(test: &str) -> Option<vqos_testkit::SerialGuard> {
    let guard = can_run(test)?;
    if Command::new("setpriv").arg("--version").output().is_err() {
        println!("SKIP {test}: setpriv not found (util-linux)");
        return None;
    }
    Some(guard)
}

/// A config for a daemon in `dir` with `body` (uplink, ports).
fn config(dir: &Path, body: &str) -> (PathBuf, PathBuf) {
    let socket = dir.join("vqosd.sock");
    let text = format!(
        "capacity = \"1Gbit\"\nstate_file = \"{}\"\n[api]\nsocket = \"{}\"\n{body}",
        dir.join("state.json").display(),
        socket.display()
    );
    let path = dir.join("vqosd.toml");
    std::fs::write(&path, text).unwrap();
    (path, socket)
}

/// Waits (up to 5 s: stderr is read by another thread) for `line` in the daemon's log.
fn logged(daemon: &Daemon, line: &str) {
    poll(Duration::from_secs(5), || {
        daemon.log().contains(line).then_some(())
    })
    .unwrap_or_else(|| panic!("no {line:?} in the log:\n{}", daemon.log()));
}

fn host_has(link: &str) -> bool {
    Path::new("/sys/class/net").join(link).exists()
}

#[test]
fn the_af_packet_uplink_opens_under_the_units_restrictions() {
    let Some(_serial) = ready("the_af_packet_uplink_opens_under_the_units_restrictions") else {
        return;
    };
    let unit = Unit::read();
    let tag = std::process::id() % 100_000;
    let (up, peer) = (format!("vqk{tag}a"), format!("vqk{tag}b"));
    // Deleting one end of a veth pair deletes both; also when the test fails.
    let _links = Links(vec![up.clone()]);
    sh(&[
        "ip", "link", "add", &up, "type", "veth", "peer", "name", &peer,
    ]);
    sh(&["ip", "link", "set", &up, "up"]);
    sh(&["ip", "link", "set", &peer, "up"]);
    let dir = tempfile::tempdir().unwrap();
    let (cfg, socket) = config(
        dir.path(),
        &format!("[uplink]\nname = \"{up}\"\nkind = \"af-packet\"\n"),
    );
    let daemon = Daemon::start_command(unit.vqosd(&cfg), &socket);
    assert_eq!(port(&daemon.get("/v1/stats"), &up)["role"], "uplink");
    drop(daemon);

    // Without CAP_NET_RAW, or without AF_PACKET among the families, it cannot open.
    for (what, u) in [
        ("CAP_NET_RAW", unit.without_cap("net_raw")),
        ("AF_PACKET", unit.without_family(libc::AF_PACKET)),
    ] {
        let (code, err) = u.run(&cfg);
        assert_eq!(code, Some(1), "started without {what}: {err}");
        assert!(
            err.contains("socket(AF_PACKET) failed"),
            "without {what}: {err}"
        );
    }
}

#[test]
fn a_tap_moved_into_a_namespace_is_reattached_after_a_restart_under_the_units_restrictions() {
    let Some(_serial) = ready("a_tap_moved_into_a_namespace_is_reattached") else {
        return;
    };
    let unit = Unit::read();
    let tag = std::process::id() % 100_000;
    let (up, vm) = (format!("vqn{tag}u"), format!("vqn{tag}v"));
    // Dropped last: the daemon first, then the namespace (and the TAP in it), then the uplink.
    let _links = Links(vec![up.clone(), vm.clone()]);
    let ns = Netns::new(format!("vqn{tag}ns"));
    let dir = tempfile::tempdir().unwrap();
    let (cfg, socket) = config(
        dir.path(),
        &format!("[uplink]\nname = \"{up}\"\n[[port]]\nname = \"{vm}\"\n"),
    );
    let daemon = Daemon::start_command(unit.vqosd(&cfg), &socket);
    assert!(host_has(&vm), "the port's TAP was not created");
    logged(&daemon, &format!("Port {vm} up (TAP created)"));
    drop(daemon);
    // The guest's side: its interface in its namespace, configured.
    ns.take_link(&vm, "10.251.0.1/24");

    // Restarted under the same restrictions, vqosd finds it there and makes no second one.
    let daemon = Daemon::start_command(unit.vqosd(&cfg), &socket);
    logged(
        &daemon,
        &format!(
            "Port {vm} up (TAP re-attached in network namespace {})",
            ns.name()
        ),
    );
    assert!(!host_has(&vm), "a second TAP {vm} was made on the host");
    assert!(ns.has_link(&vm));
    assert_eq!(port(&daemon.get("/v1/stats"), &vm)["role"], "vif");
    drop(daemon);

    // Without CAP_SYS_ADMIN (setns) it cannot look there: it refuses to start, says why, and
    // leaves the host without a twin TAP.
    let (code, err) = unit.without_cap("sys_admin").run(&cfg);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("Port '{vm}': not in the host's network namespace"))
            && err.contains("refusing to create a second TAP"),
        "{err}"
    );
    assert!(!host_has(&vm), "a second TAP {vm} was made on the host");
    assert!(ns.has_link(&vm));
}

#[test]
fn a_vhost_user_server_socket_is_given_to_its_owner_under_the_units_restrictions() {
    let Some(_serial) = ready("a_vhost_user_server_socket_is_given_to_its_owner") else {
        return;
    };
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let unit = Unit::read();
    let tag = std::process::id() % 100_000;
    let dir = tempfile::tempdir().unwrap();
    let vm = dir.path().join("vm1.sock");
    // nobody (65534) stands for libvirt-qemu: by name, its group by number.
    let (cfg, socket) = config(
        dir.path(),
        &format!(
            "[uplink]\nname = \"vqc{tag}n\"\nkind = \"null\"\n[[port]]\nname = \"vm1\"\n\
             kind = \"vhost-user\"\nsocket = \"{}\"\nsocket_owner = \"nobody\"\n\
             socket_group = 65534\nsocket_mode = \"0660\"\n",
            vm.display()
        ),
    );
    let daemon = Daemon::start_command(unit.vqosd(&cfg), &socket);
    let m = std::fs::metadata(&vm).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (65534, 65534, 0o660));
    drop(daemon);

    // Without CAP_CHOWN it cannot: it refuses to start, says why, and leaves no socket.
    let (code, err) = unit.without_cap("chown").run(&cfg);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "Port 'vm1': cannot give socket {} to 65534:65534",
            vm.display()
        )) && err.contains("Operation not permitted"),
        "{err}"
    );
    assert!(!vm.exists(), "the socket was left behind");
}

#[test]
fn a_client_role_port_reaches_a_socket_of_libvirt_qemu_with_the_drop_ins_group() {
    let Some(_serial) = ready("a_client_role_port_reaches_a_socket_of_libvirt_qemu") else {
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    let unit = Unit::read();
    let tag = std::process::id() % 100_000;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // As libvirt's QEMU (user and group libvirt-qemu, umask 002) leaves a <source
    // mode='server'> socket in a directory of its own; nobody (65534) stands for it.
    let qemu_dir = dir.path().join("qemu");
    std::fs::create_dir(&qemu_dir).unwrap();
    std::fs::set_permissions(&qemu_dir, std::fs::Permissions::from_mode(0o770)).unwrap();
    std::os::unix::fs::chown(&qemu_dir, Some(65534), Some(65534)).unwrap();
    let vm = qemu_dir.join("vm1.sock");
    let _frontend = std::os::unix::net::UnixListener::bind(&vm).unwrap();
    std::fs::set_permissions(&vm, std::fs::Permissions::from_mode(0o775)).unwrap();
    std::os::unix::fs::chown(&vm, Some(65534), Some(65534)).unwrap();
    let (cfg, socket) = config(
        dir.path(),
        &format!(
            "[uplink]\nname = \"vqg{tag}n\"\nkind = \"null\"\n[[port]]\nname = \"vm1\"\n\
             kind = \"vhost-user\"\nsocket = \"{}\"\nmode = \"client\"\n",
            vm.display()
        ),
    );
    let vhost_user = |d: &Daemon| port(&d.get("/v1/stats"), "vm1")["vhost_user"].clone();

    // The unit alone: root without CAP_DAC_OVERRIDE is "other" to that socket and directory.
    let daemon = Daemon::start_command(unit.vqosd(&cfg), &socket);
    let failing = poll(Duration::from_secs(10), || {
        let v = vhost_user(&daemon);
        (v["counters"]["connect_failures"].as_u64() >= Some(2)).then_some(v)
    });
    let v = failing.unwrap_or_else(|| panic!("no failed attempts: {}", vhost_user(&daemon)));
    assert_eq!(v["connected"], false, "{v}");
    drop(daemon);

    // With the drop-in's SupplementaryGroups= (the socket's group), it connects.
    let daemon = Daemon::start_command(unit.with_group("65534").vqosd(&cfg), &socket);
    let connected = poll(Duration::from_secs(10), || {
        (vhost_user(&daemon)["connected"] == true).then_some(())
    });
    assert!(connected.is_some(), "{}", vhost_user(&daemon));
}

#[test]
fn the_uplink_is_steered_by_destination_under_the_units_restrictions() {
    let Some(_serial) = ready("the_uplink_is_steered_by_destination") else {
        return;
    };
    let unit = Unit::read();
    let tag = std::process::id() % 100_000;
    let up = format!("vqb{tag}u");
    let _links = Links(vec![up.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let (cfg, socket) = config(dir.path(), &format!("[uplink]\nname = \"{up}\"\n"));
    let daemon = Daemon::start_command(unit.vqosd(&cfg), &socket);
    logged(
        &daemon,
        &format!("Uplink {up}: what the network sends lands in its vif's queue"),
    );
    let q = port(&daemon.get("/v1/stats"), &up)["tap"]["queue_rx_frames"].clone();
    assert_eq!(
        q.as_array().map(Vec::len),
        Some(4),
        "4 queues by default: {q}"
    );
    drop(daemon);

    // Without bpf(2) (the unit's system call groups alone) it forwards, unsteered, and says so.
    let daemon = Daemon::start_command(unit.without_bpf().vqosd(&cfg), &socket);
    logged(
        &daemon,
        &format!("Uplink {up}: arrivals not steered by destination"),
    );
    assert!(
        daemon.log().contains("Operation not permitted"),
        "{}",
        daemon.log()
    );
    assert_eq!(port(&daemon.get("/v1/stats"), &up)["role"], "uplink");
}
