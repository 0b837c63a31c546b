//! Real libvirt on vqosd's vhost-user ports: a libvirtd of the test's own (Debian's, QEMU run as
//! `libvirt-qemu`, private directories: `virt.rs`) `virsh define`s and `start`s two small TCG
//! guests (the kernel and initramfs of `scripts/guest-image.sh`) on two vhost-user ports of
//! vqosd, as docs/vhost-user.md's recipe says:
//! - vm1: `<source mode='client'>` with `<reconnect enabled='yes' timeout='1'/>` (QEMU
//!   connects), vqosd in the server role; its socket is given to `socket_owner =
//!   "libvirt-qemu"` with `socket_mode = "0600"`, so only that ownership lets QEMU connect;
//! - vm2: `<source mode='server'>` (QEMU listens, in a directory of its user), vqosd in the
//!   client role.
//!
//! Checked: both guests ping the sink behind the uplink and each other; both send to the sink
//! with iperf3 under a maximum on vm1 set through the API, and the switch's counters show the
//! reference allocation within 5 %; vqosd is stopped (SIGTERM, as `systemctl restart` does:
//! vm1's socket is removed) and started again under the running transfers: vm2's port
//! reconnects to its QEMU, vm1's QEMU to the new socket (given to libvirt-qemu again), the
//! same TCP streams resume under the restored policy; libvirt still reports both domains
//! running, and no guest booted twice.
//!
//! Needs root, `qemu-system-x86_64`, iperf3, libvirt (`libvirt-daemon-system`,
//! `libvirt-clients`: scripts/deps.sh) and what the image script needs; prints SKIP otherwise,
//! except under CI (`CI=true`), where a missing piece fails the test. Takes the machine-wide
//! real-traffic lock. Everything it starts is stopped by its PID, every domain destroyed and
//! undefined, the namespace, TAP and files removed, also when it fails.

#[path = "../common/mod.rs"]
mod common;
mod migrate;
mod virt;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::qemu::guest_image;
use common::{connected, port, rx_rates, Daemon};
use serde_json::json;
use virt::{poll_gently, secs, Console, Libvirtd};
use vqos_sched::{allocate, Claim, VifPolicy};
use vqos_testkit::{machine_lock, poll, Links, Netns, Proc};

/// The link the vifs share: far below what a TCG guest sends (about 1.5 Gbit/s of TCP here).
const CAPACITY_BPS: u64 = 40_000_000;
/// vm1's maximum, set through the API while it sends.
const VM1_MAX_BPS: u64 = 12_000_000;
/// Measured shares must be within this of the reference allocation.
const TOL: f64 = 0.05;

/// Why the test cannot run here, if it cannot: what the QEMU tests need, and libvirt.
fn missing() -> Option<String> {
    common::qemu::missing().or_else(virt::missing)
}

/// Skips `test` with `why`, or fails under CI, where scripts/deps.sh installed everything.
fn skip(test: &str, why: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test} cannot run under CI: {why}"
    );
    println!("SKIP {test}: {why}");
}

/// A guest's domain: TCG, its memory shared with vqosd (memfd), direct kernel boot, one
/// vhost-user interface (`source`: libvirt's `<source>` element with its mode), the serial
/// console on a unix socket and logged to a file. `pci=nomsi`: QEMU 7.2 under TCG crashes when
/// vhost starts with MSI-X (docs/vhost-user.md).
fn domain_xml(name: &str, guest: &Path, vm: &str, mac: &str, ip: &str, source: &str) -> String {
    let g = guest.display();
    format!(
        "<domain type='qemu'>\n  <name>{name}</name>\n  <memory unit='MiB'>256</memory>\n  \
         <vcpu>1</vcpu>\n  <memoryBacking>\n    <source type='memfd'/>\n    \
         <access mode='shared'/>\n  </memoryBacking>\n  <os>\n    \
         <type arch='x86_64' machine='pc'>hvm</type>\n    <kernel>{g}/vmlinuz</kernel>\n    \
         <initrd>{g}/initrd.gz</initrd>\n    <cmdline>console=ttyS0 quiet panic=-1 pci=nomsi \
         vqos.name={vm} vqos.ip={ip}</cmdline>\n  </os>\n  <on_reboot>destroy</on_reboot>\n  \
         <devices>\n    <interface type='vhostuser'>\n      <mac address='{mac}'/>\n      \
         {source}\n      <model type='virtio'/>\n    </interface>\n    <serial type='unix'>\n      \
         <source mode='bind' path='{g}/{vm}.console'/>\n      \
         <log file='{g}/{vm}.console.log' append='off'/>\n      <target port='0'/>\n    \
         </serial>\n    <controller type='usb' model='none'/>\n    \
         <memballoon model='none'/>\n  </devices>\n</domain>\n"
    )
}

/// Each console pings each of its targets (3 echoes), all at once.
fn pings(jobs: &mut [(&mut Console, &[&str])]) {
    let markers: Vec<Vec<String>> = jobs
        .iter_mut()
        .map(|(c, to)| {
            to.iter()
                .map(|to| c.send(&format!("ping -c 3 -W 5 {to}")))
                .collect()
        })
        .collect();
    for ((c, to), markers) in jobs.iter().zip(markers) {
        for (to, marker) in to.iter().zip(markers) {
            let (out, rc) = c.finish(&marker, Duration::from_secs(60));
            assert!(
                rc == 0 && out.contains("3 packets received"),
                "ping {to}: {out}"
            );
        }
    }
}

#[test]
fn libvirt_guests_on_vhost_user_ports() {
    let test = "libvirt_guests_on_vhost_user_ports";
    if let Some(why) = missing() {
        return skip(test, &why);
    }
    let _machine = machine_lock();
    let t0 = Instant::now();
    let image = match guest_image() {
        Ok(dir) => dir,
        Err(why) => return skip(test, &why),
    };
    let pid = std::process::id() % 100_000;
    let prefix = format!("lv{pid}");
    let net = format!("10.{}.78", 200 + pid % 50);
    let sink_ip = format!("{net}.254");
    let (dir, guest) = test_dir(&image);
    let qemu_uid = uid_of("libvirt-qemu");
    let (s1, s2) = (dir.path().join("vm1.sock"), guest.join("vm2.sock"));
    let socket = dir.path().join("vqosd.sock");
    let uplink = format!("{prefix}u");
    // The uplink TAP stays across vqosd's restart (re-attached in the sink namespace); gone
    // with the namespace, or by name if the test fails before it moves there.
    let _links = Links(vec![uplink.clone()]);
    let config = dir.path().join("vqosd.toml");
    fs::write(
        &config,
        format!(
            "capacity = \"{}Mbit\"\nstate_file = \"{}\"\n[api]\nsocket = \"{}\"\n\
             [uplink]\nname = \"{uplink}\"\n\
             [[port]]\nname = \"vm1\"\nkind = \"vhost-user\"\nsocket = \"{}\"\n\
             socket_owner = \"libvirt-qemu\"\nsocket_mode = \"0600\"\n\
             [[port]]\nname = \"vm2\"\nkind = \"vhost-user\"\nsocket = \"{}\"\nmode = \"client\"\n",
            CAPACITY_BPS / 1_000_000,
            dir.path().join("state.json").display(),
            socket.display(),
            s1.display(),
            s2.display()
        ),
    )
    .unwrap();
    let mut d = Daemon::start(&config, &socket);
    let m = fs::metadata(&s1).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (qemu_uid, 0o600), "vm1.sock");
    let sink = Netns::new(format!("{prefix}-sink")).without_ipv6();
    sink.take_link(&uplink, &format!("{sink_ip}/24"));

    let libvirtd = Libvirtd::start(dir.path());
    println!("libvirtd answering {:.1} s into the test", secs(t0));
    let vm1_source = format!(
        "<source type='unix' path='{}' mode='client'>\n        \
         <reconnect enabled='yes' timeout='1'/>\n      </source>",
        s1.display()
    );
    let vm2_source = format!(
        "<source type='unix' path='{}' mode='server'/>",
        s2.display()
    );
    let (vm1_ip, vm2_ip) = (format!("{net}.1"), format!("{net}.2"));
    let doms = [
        ("vm1", "52:54:00:78:00:01", &vm1_ip, &vm1_source),
        ("vm2", "52:54:00:78:00:02", &vm2_ip, &vm2_source),
    ];
    let mut domains = Vec::new();
    let mut consoles = Vec::new();
    for (vm, mac, ip, source) in doms {
        let name = format!("{prefix}-{vm}");
        let xml = domain_xml(&name, &guest, vm, mac, &format!("{ip}/24"), source);
        domains.push(libvirtd.start_domain(&name, &xml));
        consoles.push(Console::new(
            vm,
            guest.join(format!("{vm}.console")),
            guest.join(format!("{vm}.console.log")),
        ));
    }
    for c in &consoles {
        let up = c.wait_for("VQOS-GUEST-UP", Duration::from_secs(90));
        assert!(up, "did not boot:\n{}\n{}", c.text(), libvirtd.log());
    }
    let both_up = |d: &Daemon| {
        poll_gently(Duration::from_secs(30), || {
            let s = d.get("/v1/stats");
            (connected(&s, "vm1") && connected(&s, "vm2")).then_some(())
        })
    };
    assert!(
        both_up(&d).is_some(),
        "not connected: {}",
        d.get("/v1/stats")
    );
    println!(
        "both guests up and attached {:.1} s into the test",
        secs(t0)
    );
    let [c1, c2] = &mut consoles[..] else {
        unreachable!()
    };
    pings(&mut [(c1, &[&sink_ip, &vm2_ip]), (c2, &[&sink_ip, &vm1_ip])]);

    // Both send to the sink; vm1 under a maximum set through the API; long enough to span
    // the restart below.
    d.call("PUT", "/v1/policies/vm1", json!({"max": "12Mbit"}));
    let policies = [
        VifPolicy {
            max_bps: Some(VM1_MAX_BPS),
            ..Default::default()
        },
        VifPolicy::default(),
    ];
    let claims: Vec<Claim> = policies.iter().map(|p| Claim::new(p, None)).collect();
    let want: Vec<f64> = allocate(CAPACITY_BPS, &claims)
        .unwrap()
        .into_iter()
        .map(|r| r as f64 / 1e6)
        .collect();
    let servers: Vec<Proc> = [5201, 5202]
        .iter()
        .map(|p| sink.spawn(&["iperf3", "-s", "-1", "-p", &p.to_string(), "-B", &sink_ip]))
        .collect();
    // Each server is ready once its port listens (a test connection would be its one client).
    for p in [5201, 5202] {
        let listening = poll_gently(Duration::from_secs(10), || {
            let ss = Command::new("ip")
                .args(["netns", "exec", sink.name(), "ss", "-Hltn"])
                .arg(format!("sport = :{p}"))
                .output()
                .unwrap();
            (!ss.stdout.is_empty()).then_some(())
        });
        assert!(listening.is_some(), "iperf3 -s on port {p} did not start");
    }
    let send =
        |c: &mut Console, p: u16| c.send(&format!("iperf3 -c {sink_ip} -p {p} -t 20 -i 0 -f m"));
    let (m1, m2) = (send(c1, 5201), send(c2, 5202));
    let check = |what: &str, d: &Daemon| {
        // Both streams at their shares first (TCP's start, or its resumption after the restart).
        let flowing = poll(Duration::from_secs(20), || {
            let r = rx_rates(d, &["vm1", "vm2"], 0.5);
            (r.iter().zip(&want).all(|(r, w)| *r > 0.7 * w * 1e6)).then_some(())
        });
        assert!(
            flowing.is_some(),
            "{what}: not flowing: {}",
            d.get("/v1/stats")
        );
        let got: Vec<f64> = rx_rates(d, &["vm1", "vm2"], 3.0)
            .into_iter()
            .map(|r| r / 1e6)
            .collect();
        println!(
            "{what}: vm1 max 12 Mbit/s, capacity {} Mbit/s: measured {got:.1?} Mbit/s, \
             reference {want:.1?}",
            CAPACITY_BPS / 1_000_000
        );
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= TOL * w,
                "{what}: measured {got:.1?} vs reference {want:.1?} Mbit/s"
            );
        }
    };
    check("before the restart", &d);

    // Stopped as systemd stops it (SIGTERM: vm1's socket removed), started again.
    drop(d);
    assert!(!s1.exists(), "vm1's socket outlived vqosd");
    let t = Instant::now();
    d = Daemon::start(&config, &socket);
    let m = fs::metadata(&s1).unwrap();
    assert_eq!(
        (m.uid(), m.mode() & 0o777),
        (qemu_uid, 0o600),
        "vm1.sock again"
    );
    let back = |name: &str| {
        poll_gently(Duration::from_secs(20), || {
            connected(&d.get("/v1/stats"), name).then(|| secs(t))
        })
        .unwrap_or_else(|| panic!("{name} did not reconnect: {}", d.get("/v1/stats")))
    };
    let (b2, b1) = (back("vm2"), back("vm1"));
    println!(
        "after the restart: vm2 (client role) reconnected in {b2:.2} s, vm1 (server role, \
         libvirt's reconnect) in {b1:.2} s"
    );
    assert_eq!(d.get("/v1/policies/vm1")["max"], "12Mbit");
    check("after the restart, the same streams", &d);
    for (c, marker) in [(&*c1, &m1), (&*c2, &m2)] {
        let (out, rc) = c.finish(marker, Duration::from_secs(60));
        assert_eq!(rc, 0, "iperf3: {out}");
    }
    drop(servers);
    pings(&mut [(c1, &[&sink_ip]), (c2, &[&vm1_ip])]);
    for (dom, c) in domains.iter().zip([&*c1, &*c2]) {
        assert_eq!(dom.state(), "running", "{}", dom.name);
        assert_eq!(c.text().matches("VQOS-GUEST-UP").count(), 1, "rebooted");
    }
    let stats = d.get("/v1/stats");
    for vm in ["vm1", "vm2"] {
        let v = &port(&stats, vm)["vhost_user"];
        assert_eq!(v["last_error"], serde_json::Value::Null, "{vm}: {v}");
        assert_eq!(v["counters"]["quarantines"], 0, "{vm}: {v}");
    }
    println!("done {:.1} s into the test", secs(t0));
}

/// The uid of user `name`.
/// The test's directory and its `guest/`. QEMU runs as libvirt-qemu: it must reach the
/// sockets and the console files (the directory is 0755); the guest directory is its own
/// (QEMU creates client-role sockets and the console logs there; libvirt gives it the kernel
/// and initramfs, copies of the cached `image`).
fn test_dir(image: &Path) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let guest = dir.path().join("guest");
    fs::create_dir(&guest).unwrap();
    for f in ["vmlinuz", "initrd.gz"] {
        fs::copy(image.join(f), guest.join(f)).unwrap();
    }
    let qemu_uid = uid_of("libvirt-qemu");
    std::os::unix::fs::chown(&guest, Some(qemu_uid), None).unwrap();
    (dir, guest)
}

fn uid_of(name: &str) -> u32 {
    let out = Command::new("id").args(["-u", name]).output().unwrap();
    assert!(out.status.success(), "id -u {name}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}
