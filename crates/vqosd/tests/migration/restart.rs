//! vqosd killed (SIGKILL) and started again while QEMU migrates the guest (issue 26): the
//! copy is slowed to 1 MiB/s so that it is under way, with vqosd logging, when vqosd dies.

use super::*;

#[test]
fn vqosd_killed_and_restarted_mid_migration_the_guest_arrives_whole() {
    let _machine = machine_lock();
    // A stream long enough to end on the destination after the slowed copy, the restart and
    // the reconnections (about 10 s here, 12 s beside two busy loops).
    let Some(rig) = Rig::start("vqosd_killed_and_restarted_mid_migration", 40) else {
        return;
    };
    let Rig {
        mut d,
        src,
        dst,
        stream,
        md5: md5_before,
        incoming,
        sink_ip,
        keep: (_server, _sink, dir),
        ..
    } = rig;
    let p = |f: &str| dir.path().join(f);
    let logs = |d: &Daemon, name: &str| {
        port(&d.get("/v1/stats"), name)["vhost_user"]["counters"]["dirty_logs"].clone()
    };
    qmp(
        &p("qmp-a"),
        "migrate-set-parameters",
        Some(json!({ "max-bandwidth": 1_048_576 })),
    );
    qmp(&p("qmp-a"), "migrate", Some(json!({ "uri": incoming })));
    let copying = poll_gently(Duration::from_secs(60), || {
        let st = qmp(&p("qmp-a"), "query-migrate", None);
        (st["status"] == "active" && logs(&d, "vma") == 1).then_some(())
    });
    assert!(copying.is_some(), "{}", d.get("/v1/stats"));

    // SIGKILL mid-copy; the same config and state file; QEMUs reconnect (reconnect=1).
    d.kill9();
    d = Daemon::start(&p("vqosd.toml"), &p("vqosd.sock"));
    for name in ["vma", "vmb"] {
        let back = poll_gently(Duration::from_secs(30), || {
            connected(&d.get("/v1/stats"), name).then_some(())
        });
        assert!(back.is_some(), "{name}: {}", d.get("/v1/stats"));
    }
    // The hand-over came back from the state file, and QEMU handed the log over again.
    let s = d.get("/v1/stats");
    assert_eq!(port(&s, "vma")["handover"]["complete"], false, "{s}");
    let relogged = poll_gently(Duration::from_secs(30), || {
        (logs(&d, "vma") == 1).then_some(())
    });
    println!(
        "after the restart: dirty log handed over again: {}; migration {}",
        relogged.is_some(),
        qmp(&p("qmp-a"), "query-migrate", None)["status"]
    );
    assert!(
        relogged.is_some(),
        "no dirty log after the restart: {}",
        d.get("/v1/stats")
    );

    // The copy runs at full speed to its end.
    qmp(
        &p("qmp-a"),
        "migrate-set-parameters",
        Some(json!({ "max-bandwidth": 1_u64 << 32 })),
    );
    let done = poll_gently(Duration::from_secs(180), || {
        let st = qmp(&p("qmp-a"), "query-migrate", None);
        matches!(
            st["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        )
        .then_some(st)
    });
    let st = done.unwrap_or_else(|| panic!("did not end:\n{}", src.console()));
    assert_eq!(st["status"], "completed", "{st}\n{}", src.console());
    let complete = poll_gently(Duration::from_secs(30), || {
        let s = d.get("/v1/stats");
        (port(&s, "vma")["handover"]["complete"] == true).then_some(())
    });
    assert!(complete.is_some(), "no hand-over: {}", d.get("/v1/stats"));
    d.call("DELETE", "/v1/ports/vma", json!(null));
    drop(src);

    // On the destination: the stream ends well, the memory is whole, the guest pings.
    let mut dst = dst;
    let what = "the migration and the restart";
    goes_on_whole(&mut dst, &stream, &md5_before, &sink_ip, what);
    assert_clean(&d.get("/v1/stats"), "vmb");
}
