//! `virsh migrate --live` between two vqosd vhost-user ports (issue 26), by the recipe of
//! docs/vhost-user.md ("Live migration with libvirt"): two libvirtds of the test's own stand in
//! for two hosts (each its own host UUID, directories and API socket; one vqosd serves both,
//! as one host's switch would serve a migration between two of its ports). The guest boots on
//! the source libvirtd on port `vma` (vqosd in the server role, the socket given to
//! libvirt-qemu) and pings the sink; the orchestrator (this test) adds `vmb`, hands the
//! guest's identity over (`port migrate vma vmb`), and runs `virsh migrate --live` with
//! `--xml`: the destination's domain XML, the same but for its vhost-user socket (`vmb`'s) and
//! its console's paths. Checked: the domain runs on the destination and is shut off on the
//! source; QEMU's announce completed the hand-over; a stream started before the migration
//! ends well on the destination; the guest pings the sink from `vmb`; none of its frames on
//! `vmb` was refused.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use crate::common::qemu::guest_image;
use crate::common::{connected, port, Daemon};
use crate::virt::{poll_gently, secs, Console, Libvirtd};
use crate::{domain_xml, missing, skip, test_dir};
use serde_json::json;
use vqos_testkit::{machine_lock, Links, Netns};

#[test]
fn virsh_migrate_live_moves_a_guest_between_two_vqosd_ports() {
    let test = "virsh_migrate_live_moves_a_guest_between_two_vqosd_ports";
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
    let prefix = format!("lm{pid}");
    let net = format!("10.{}.79", 200 + pid % 50);
    let (guest_ip, sink_ip) = (format!("{net}.1"), format!("{net}.254"));
    let (dir, guest) = test_dir(&image);
    let p = |f: &str| dir.path().join(f);
    let uplink = format!("{prefix}u");
    let _links = Links(vec![uplink.clone()]);
    fs::write(
        p("vqosd.toml"),
        format!(
            "capacity = \"40Mbit\"\nstate_file = \"{}\"\n[api]\nsocket = \"{}\"\n\
             [uplink]\nname = \"{uplink}\"\n\
             [[port]]\nname = \"vma\"\nkind = \"vhost-user\"\nsocket = \"{}\"\n\
             socket_owner = \"libvirt-qemu\"\npolicy = {{ max = \"8Mbit\" }}\n",
            p("state.json").display(),
            p("vqosd.sock").display(),
            p("vma.sock").display()
        ),
    )
    .unwrap();
    let d = Daemon::start(&p("vqosd.toml"), &p("vqosd.sock"));
    let sink = Netns::new(format!("{prefix}-sink")).without_ipv6();
    sink.take_link(&uplink, &format!("{sink_ip}/24"));

    // Two "hosts".
    for h in ["a", "b"] {
        fs::create_dir(p(h)).unwrap();
        fs::set_permissions(p(h), fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (a, b) = (Libvirtd::start(&p("a")), Libvirtd::start(&p("b")));
    println!("two libvirtds answering {:.1} s into the test", secs(t0));
    let source = |sock: &str| {
        format!(
            "<source type='unix' path='{}' mode='client'>\n        \
             <reconnect enabled='yes' timeout='1'/>\n      </source>",
            p(sock).display()
        )
    };
    let name = format!("{prefix}-vm");
    let mac = "52:54:00:79:00:01";
    let xml = domain_xml(
        &name,
        &guest,
        "vm",
        mac,
        &format!("{guest_ip}/24"),
        &source("vma.sock"),
    );
    let _src_domain = a.start_domain(&name, &xml);
    let mut console = Console::new("vm", guest.join("vm.console"), guest.join("vm.console.log"));
    let up = console.wait_for("VQOS-GUEST-UP", Duration::from_secs(90));
    assert!(up, "did not boot:\n{}\n{}", console.text(), a.log());
    let m = console.send(&format!("ping -c 2 -W 5 {sink_ip}"));
    assert_eq!(
        console.finish(&m, Duration::from_secs(30)).1,
        0,
        "{}",
        console.text()
    );
    let server = sink.spawn(&["iperf3", "-s", "-1", "-p", "5303", "-B", &sink_ip]);
    std::thread::sleep(Duration::from_millis(500));
    let stream = console.send(&format!("iperf3 -c {sink_ip} -p 5303 -t 15 -i 0 -f m"));
    std::thread::sleep(Duration::from_secs(3));

    // The orchestrator: the destination port, the identity, then libvirt's migration.
    d.call(
        "POST",
        "/v1/ports",
        json!({"name": "vmb", "kind": "vhost-user", "socket": p("vmb.sock"),
               "socket_owner": "libvirt-qemu"}),
    );
    d.call("POST", "/v1/ports/vma/migrate", json!({"to": "vmb"}));
    // The destination's domain: the source's as libvirt gives it for a migration, but for
    // vmb's socket and a console of its own (the source's is still bound).
    let dst_xml = a
        .virsh(&["dumpxml", "--migratable", &name])
        .replace(
            p("vma.sock").to_str().unwrap(),
            p("vmb.sock").to_str().unwrap(),
        )
        .replace("/vm.console", "/vm-dst.console");
    let dst_path = p("vm-dst.xml");
    fs::write(&dst_path, &dst_xml).unwrap();
    let migrate_uri = format!("tcp://127.0.0.1:{}", 29_000 + pid % 1_000);
    // Adopted first: whatever virsh leaves on the destination is destroyed when the test
    // ends, also when the migration fails.
    let _dst_domain = b.adopt(&name);
    let t = Instant::now();
    a.virsh(&[
        "migrate",
        "--live",
        &name,
        &b.uri,
        "--migrateuri",
        &migrate_uri,
        "--xml",
        dst_path.to_str().unwrap(),
    ]);
    println!("virsh migrate --live: {:.2} s", t.elapsed().as_secs_f64());
    assert_eq!(b.virsh(&["domstate", &name]).trim(), "running");
    assert_eq!(a.virsh(&["domstate", &name]).trim(), "shut off");
    let complete = poll_gently(Duration::from_secs(30), || {
        let s = d.get("/v1/stats");
        (port(&s, "vma")["handover"]["complete"] == true && connected(&s, "vmb")).then_some(())
    });
    assert!(complete.is_some(), "no hand-over: {}", d.get("/v1/stats"));
    d.call("DELETE", "/v1/ports/vma", json!(null));

    // The guest, on the destination's console now.
    let mut console = console.moved_to(
        guest.join("vm-dst.console"),
        guest.join("vm-dst.console.log"),
    );
    // Connected at once: QEMU stops writing the console once no one drains it.
    let m = console.send("true");
    assert_eq!(
        console.finish(&m, Duration::from_secs(30)).1,
        0,
        "{}",
        console.text()
    );
    let (out, rc) = console.finish(&stream, Duration::from_secs(60));
    println!("iperf3 across virsh migrate:\n{out}");
    assert_eq!(rc, 0, "{}", console.text());
    drop(server);
    let m = console.send(&format!("ping -c 3 -W 5 {sink_ip}"));
    let (out, rc) = console.finish(&m, Duration::from_secs(30));
    assert_eq!(rc, 0, "{out}");
    let s = d.get("/v1/stats");
    for reason in ["spoofed", "ip_spoofed", "arp_spoofed", "nd_spoofed"] {
        assert_eq!(port(&s, "vmb")["drops"][reason], 0, "vmb: {reason}: {s}");
    }
    println!("done {:.1} s into the test", secs(t0));
}
